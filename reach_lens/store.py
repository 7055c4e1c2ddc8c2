"""Run directories: a protocol and append-only record tables that survive a kill at any point.

    root/protocol.json                 {"schema": "reach_lens.run/1", "fingerprint": Protocol.fingerprint(),
                                        "protocol": Protocol.to_dict()}   (commit included, for the record)
    root/<table>/part-000000.parquet   one part per append, written to a temp file then os.replace'd

A killed run loses at most the batch being written; earlier parts are never touched. Reading concatenates
the parts in order and keeps the first row per key, so a batch written twice (a crash after the write,
before the caller noticed) yields no duplicates. A part that cannot be read is renamed
``part-NNNNNN.parquet.corrupt`` (never deleted) with a warning; its keys leave ``done``, so a resumed run
recomputes its rows. Nothing is read back from directory names: what a run is lives in protocol.json.

One writer per directory, enforced: a writing ``RunStore`` holds an exclusive lock on ``root/.writer.lock``
(``fcntl.flock``, so the kernel releases it when the holder exits or is killed, and a killed run's lock is taken
over by the next one) and writes its process id there; a second process is refused at once with
``RunDirectoryBusy`` naming the directory and that process id. The lock is held until the process exits, or
until every writing ``RunStore`` of that directory in the process is closed (``store.close()``, or ``with
RunStore(root, protocol) as store:``), so a notebook can release a run for a script to resume it.
``RunStore.reader`` opens a run without the lock, to read it while its writer runs. Part names cannot collide: a
part is published with ``os.link``, which never replaces an existing file.
"""
import fcntl
import json
import os
import re
import socket
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from reach_lens.errors import UserError
from reach_lens.protocol import Protocol, canonical_json

VECTORS = "vectors"  # the directory of a run's intervention vectors, by content hash
SCHEMA = "reach_lens.run/1"
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_PART = re.compile(r"^part-(\d{6,})\.parquet$")
_NUMBERED = re.compile(r"^part-(\d{6,})\.parquet(\.corrupt(-\d+)?)?$")  # parts and set-aside parts hold a number
_SHOW = 300  # characters of a value shown in a mismatch message


class ProtocolMismatch(UserError, ValueError):
    """The run directory already holds a run under a different protocol."""


class UnreadableRunDirectory(UserError, ValueError):
    """The run directory's protocol.json cannot be read, was edited, or has another schema."""


class RunDirectoryBusy(UserError, RuntimeError):
    """Another process is writing to the run directory."""


LOCK = ".writer.lock"
# (process id, resolved root) -> [the locked descriptor, how many open writing stores of this process hold it]
_HELD: dict[tuple[int, str], list[int]] = {}


def _lock_writer(root: Path) -> tuple[int, str]:
    """Take ``root``'s writer lock for this process (again: one more holder), or raise ``RunDirectoryBusy`` naming the
    holder; returns the key ``_unlock_writer`` releases."""
    key = (os.getpid(), str(root.resolve()))
    if key in _HELD:
        _HELD[key][1] += 1
        return key
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that has not yet written its id"
        os.close(fd)
        raise RunDirectoryBusy(f"{root} is being written by another process ({holder}); one writer per run directory: "
                               "wait for it to finish, stop it (a rerun resumes its work), or pick another --out") \
            from None
    info = f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
    os.ftruncate(fd, 0)
    os.pwrite(fd, info.encode(), 0)
    _HELD[key] = [fd, 1]
    return key


def _unlock_writer(key: tuple[int, str]) -> None:
    """One holder of the lock ``key`` lets go; the last one releases it (the lock file stays, as after a kill)."""
    held = _HELD[key]
    held[1] -= 1
    if held[1] == 0:
        del _HELD[key]
        fcntl.flock(held[0], fcntl.LOCK_UN)
        os.close(held[0])


_ABSENT = object()


def _show(value: object) -> str:
    text = canonical_json(value) if value is not _ABSENT else "<absent>"
    return text if len(text) <= _SHOW else f"{text[:_SHOW]}... ({len(text)} characters)"


def mismatch_lines(stored: Protocol, given: Protocol) -> list[str]:
    """'field: stored X, given Y' for every differing matched field; settings and libraries are compared key by
    key (``libraries.torch: stored "2.13.0", given "2.14.1"``; a run stored before versions were recorded shows
    ``<absent>``)."""
    lines = []
    for name, a, b in stored.diff(given):
        if name in ("settings", "libraries", "task_spec"):
            for k in sorted(set(a) | set(b)):
                va, vb = a.get(k, _ABSENT), b.get(k, _ABSENT)
                if va is _ABSENT or vb is _ABSENT or canonical_json(va) != canonical_json(vb):
                    lines.append(f"{name}.{k}: stored {_show(va)}, given {_show(vb)}")
        else:
            lines.append(f"{name}: stored {_show(a)}, given {_show(b)}")
    return lines


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """write(tmp) in the same directory, fsync, then os.replace: readers see the old state or the whole new file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _save_npy(path: Path, values: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, values)


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    """Scalar columns keep their dtypes; strings, nulls and nested columns become Python objects (None stays None)."""
    cols = {}
    for name, col in zip(table.column_names, table.columns):
        t = col.type
        if pa.types.is_nested(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t):
            cols[name] = pd.Series(col.to_pylist(), dtype=object)
        else:
            cols[name] = col.to_pandas()
    return pd.DataFrame(cols)


class RunStore:
    """A run directory bound to one ``Protocol``: ``append`` rows to a table, ``read`` them back, ``done`` keys.

    ``RunStore(root, protocol)`` is the directory's one writer (see the module docstring) until ``close()`` (or the
    end of a ``with`` block); ``RunStore.reader(root, protocol)`` reads beside it and refuses to append."""

    def __init__(self, root: Path | str, protocol: Protocol, *, write: bool = True):
        if not isinstance(protocol, Protocol):
            raise TypeError(f"RunStore takes a reach_lens.protocol.Protocol, got {type(protocol).__name__}: build one "
                            "with Protocol.of(study=..., model=..., task=..., questions=..., ...) or Protocol(...)")
        self.root = Path(root)
        self.protocol = protocol
        self.fingerprint = protocol.fingerprint()
        self.write = write
        self._lock: tuple[int, str] | None = None
        path = self.root / "protocol.json"
        if write:
            self.root.mkdir(parents=True, exist_ok=True)
            self._lock = _lock_writer(self.root)
        elif not path.exists():
            raise UnreadableRunDirectory(f"{self.root} holds no run (no protocol.json) to read")
        try:
            self._bind(path)
        except BaseException:
            self.close()  # a refused store keeps no hold on the directory
            raise

    def _bind(self, path: Path) -> None:
        """Check the protocol against the stored one (refusing another), or store it for a new run."""
        if path.exists():
            stored = self._stored(path)
            lines = mismatch_lines(stored, self.protocol)
            if lines:
                text = "\n".join(f"  {line}" for line in lines)
                raise ProtocolMismatch(f"{self.root} holds a run under a different protocol "
                                       f"({len(lines)} field(s) differ):\n{text}\n"
                                       "Pick another directory for this protocol.")
            # a different commit alone is fine: protocol.json keeps the one that started the run
            if self.write:
                self._save_vectors(self.protocol.vectors)
        else:
            text = json.dumps({"schema": SCHEMA, "fingerprint": self.fingerprint, "protocol": self.protocol.to_dict()},
                              sort_keys=True, indent=2, ensure_ascii=False)
            _write_atomic(path, lambda p: p.write_text(text + "\n"))
            self._save_vectors(self.protocol.vectors)

    @classmethod
    def reader(cls, root: Path | str, protocol: Protocol) -> "RunStore":
        """The run at ``root`` opened to read only: no lock, no writes (not even setting unreadable parts aside)."""
        return cls(root, protocol, write=False)

    def close(self) -> None:
        """Stop writing: this store's hold on the directory's writer lock is released (the lock itself once no other
        writing store of this process holds it), and it reads only from now on. Again, or on a reader: nothing."""
        if self._lock is not None:
            _unlock_writer(self._lock)
            self._lock, self.write = None, False

    def __enter__(self) -> "RunStore":
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self.close()

    @property
    def vectors_dir(self) -> Path:
        """``<root>/vectors``: the interventions' vectors the protocol records by hash, as ``<sha256>.npy``
        (``interventions.intervention_from_dict(d, vectors=store.vectors_dir)`` rebuilds an intervention)."""
        return self.root / VECTORS

    def _save_vectors(self, vectors: dict[str, np.ndarray]) -> None:
        for sha, values in vectors.items():
            path = self.vectors_dir / f"{sha}.npy"
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                _write_atomic(path, lambda p, values=values: _save_npy(p, values))

    def _stored(self, path: Path) -> Protocol:
        """The protocol of an existing run directory; refuses other schemas and edited files."""
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise UnreadableRunDirectory(f"{path} cannot be read as JSON ({e}): move the directory aside or pick "
                                         "another one") from e
        schema = stored.get("schema") if isinstance(stored, dict) else None
        if schema != SCHEMA:
            raise UnreadableRunDirectory(f"{path} has schema {schema!r}; this reach_lens reads {SCHEMA!r}: use the "
                                         "reach_lens that wrote it, or rerun into another --out directory (or move "
                                         f"this one aside: mv {self.root} {self.root}.old)")
        try:
            protocol = Protocol.from_dict(stored["protocol"])
        except (KeyError, TypeError, ValueError) as e:
            raise UnreadableRunDirectory(f"{path}: its protocol is not valid ({e}); was the file edited?") from e
        if protocol.fingerprint() != stored.get("fingerprint"):
            raise UnreadableRunDirectory(f"{path}: fingerprint does not match its protocol (was the file edited?)")
        return protocol

    def _dir(self, table: str) -> Path:
        if not _TABLE_NAME.match(table):
            raise ValueError(f"table name {table!r} must match {_TABLE_NAME.pattern}")
        return self.root / table

    def _parts(self, table: str) -> list[tuple[int, Path]]:
        d = self._dir(table)
        if not d.is_dir():
            return []
        return sorted((int(m.group(1)), p) for p in d.iterdir() if (m := _PART.match(p.name)))

    def _tables(self, table: str) -> list[pa.Table]:
        """Every readable part of `table` in order; a part that cannot be read is set aside (see module docstring)."""
        out = []
        for _, path in self._parts(table):
            try:
                out.append(pq.read_table(path))
            except pa.ArrowException as e:
                if not self.write:
                    warnings.warn(f"{path} cannot be read ({type(e).__name__}: {e}); skipped", stacklevel=3)
                    continue
                aside = path.with_name(path.name + ".corrupt")
                i = 0
                while aside.exists():
                    i += 1
                    aside = path.with_name(f"{path.name}.corrupt-{i}")
                os.replace(path, aside)
                warnings.warn(f"{path} cannot be read ({type(e).__name__}: {e}); moved aside to {aside.name}. Its rows "
                              "are no longer part of the table and will be recomputed on resume.", stacklevel=3)
        return out

    def append(self, table: str, rows: Sequence[Mapping[str, object]] | pd.DataFrame) -> Path | None:
        """Write `rows` as one new part of `table`; returns its path (None for no rows). Every row needs the same keys."""
        if not self.write:
            raise PermissionError(f"{self.root} was opened with RunStore.reader or closed: it reads only")
        if isinstance(rows, pd.DataFrame):
            if len(rows) == 0:
                return None
            data = pa.Table.from_pandas(rows, preserve_index=False)
        else:
            if len(rows) == 0:
                return None
            keys = list(rows[0])
            for i, r in enumerate(rows):
                if set(r) != set(keys):
                    raise ValueError(f"row {i} has keys {sorted(r)}, row 0 has {sorted(keys)}")
            data = pa.table({k: pa.array([r[k] for r in rows]) for k in keys})
        d = self._dir(table)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".part.{os.getpid()}.tmp"
        pq.write_table(data, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        try:
            while True:  # the next free number; os.link fails rather than replace a part another writer published
                taken = [int(m.group(1)) for p in d.iterdir() if (m := _NUMBERED.match(p.name))]
                path = d / f"part-{max(taken) + 1 if taken else 0:06d}.parquet"
                try:
                    os.link(tmp, path)
                    return path
                except FileExistsError:
                    continue
        finally:
            tmp.unlink()

    def read(self, table: str, key: str | None = "question_id") -> pd.DataFrame:
        """All readable parts in order, first row per `key` kept (no de-duplication if key is None); empty DataFrame if none."""
        frames = [_to_pandas(t) for t in self._tables(table)]
        if not frames:
            return pd.DataFrame()
        df = pd.concat(frames, ignore_index=True)
        if key is not None:
            if key not in df.columns:
                raise ValueError(f"table {table!r} has no column {key!r} (columns: {list(df.columns)})")
            df = df.drop_duplicates(subset=key, keep="first").reset_index(drop=True)
        return df

    def done(self, table: str, key: str = "question_id") -> set:
        """Keys already stored in the readable parts of `table`."""
        keys: set = set()
        for part in self._tables(table):
            if key not in part.column_names:
                raise ValueError(f"table {table!r} has no column {key!r} (columns: {part.column_names})")
            keys.update(part.column(key).to_pylist())
        return keys
