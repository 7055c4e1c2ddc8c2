"""Installed wheels that cannot be imported are marked absent, here and in the Python processes started after."""
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
