"""The complete examples of docs/extending.md run as written: each section's Python blocks, in order, in a fresh
interpreter (a registration lasts for its process, so no example leaks into the other tests)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "extending.md"


def sections() -> dict[str, str]:
    """The Python code of each ``## `` section of the page, its blocks joined in order."""
    out: dict[str, str] = {}
    for part in re.split(r"^## ", PAGE.read_text(), flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        blocks = re.findall(r"^```python\n(.*?)^```", body, flags=re.M | re.S)
        if blocks:
            out[title.strip()] = "\n".join(blocks)
    return out


def test_the_page_has_the_three_examples():
    assert set(sections()) == {"Adding a task", "Adding an intervention", "Adding a model"}


@pytest.mark.parametrize("title", sorted(sections()))
def test_example_runs_as_written(title, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", sections()[title]], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"{title}:\n{result.stdout}\n{result.stderr}"
