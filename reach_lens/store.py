"""Run directories: a protocol fingerprint and append-only record tables that survive a kill at any point.

    root/protocol.json                 {"fingerprint": sha256 of the canonical protocol JSON, "protocol": {...}}
    root/<table>/part-000000.parquet   one part per append, written to a temp file then os.replace'd

A killed run loses at most the batch being written; earlier parts are never touched. Reading concatenates
the parts in order and keeps the first row per key, so a batch written twice (a crash after the write,
before the caller noticed) yields no duplicates. One writer per directory.
"""
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

_TABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_PART = re.compile(r"^part-(\d{6,})\.parquet$")


class ProtocolMismatch(ValueError):
    """The run directory already holds a run under a different protocol."""


def canonical_json(obj: object) -> str:
    """Sorted-key, compact JSON; NaN/inf and non-JSON types are errors."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"protocol is not plain JSON (dicts, lists, str, int, finite float, bool, None): {e}") from e


def fingerprint(protocol: Mapping[str, object]) -> str:
    """sha256 hex digest of the canonical JSON of `protocol`."""
    return hashlib.sha256(canonical_json(protocol).encode()).hexdigest()


def _flatten(obj: object, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict) and obj:
        out: dict[str, object] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def protocol_diff(stored: Mapping[str, object], given: Mapping[str, object]) -> list[tuple[str, str, str]]:
    """(dotted field, stored value, given value) as JSON for every field whose JSON differs (so 1 vs 1.0 vs true
    differ, as they do in the fingerprint); a side that lacks the field shows <absent>."""
    a, b = _flatten(dict(stored)), _flatten(dict(given))

    def show(flat: dict[str, object], k: str) -> str:
        return canonical_json(flat[k]) if k in flat else "<absent>"

    return [(k, show(a, k), show(b, k)) for k in sorted(set(a) | set(b)) if show(a, k) != show(b, k)]


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """write(tmp) in the same directory, fsync, then os.replace: readers see the old state or the whole new file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
    """A run directory bound to one protocol (a JSON-able dict: model, checkpoint hash, task, split, n, seed, K, probe, ...)."""

    def __init__(self, root: Path | str, protocol: Mapping[str, object]):
        self.root = Path(root)
        self.protocol = json.loads(canonical_json(protocol))  # tuples -> lists, as stored
        self.fingerprint = fingerprint(self.protocol)
        path = self.root / "protocol.json"
        if path.exists():
            stored = json.loads(path.read_text())
            if fingerprint(stored["protocol"]) != stored["fingerprint"]:
                raise ValueError(f"{path}: fingerprint does not match its protocol (was the file edited?)")
            if stored["fingerprint"] != self.fingerprint:
                lines = "\n".join(f"  {k}: stored {s}, given {g}"
                                  for k, s, g in protocol_diff(stored["protocol"], self.protocol))
                raise ProtocolMismatch(f"{self.root} holds a run under a different protocol:\n{lines}\n"
                                       f"Pick another directory for this protocol.")
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            text = json.dumps({"fingerprint": self.fingerprint, "protocol": self.protocol},
                              sort_keys=True, indent=2, ensure_ascii=False)
            _write_atomic(path, lambda p: p.write_text(text + "\n"))

    def _dir(self, table: str) -> Path:
        if not _TABLE_NAME.match(table):
            raise ValueError(f"table name {table!r} must match {_TABLE_NAME.pattern}")
        return self.root / table

    def _parts(self, table: str) -> list[tuple[int, Path]]:
        d = self._dir(table)
        if not d.is_dir():
            return []
        return sorted((int(m.group(1)), p) for p in d.iterdir() if (m := _PART.match(p.name)))

    def append(self, table: str, rows: Sequence[Mapping[str, object]] | pd.DataFrame) -> Path | None:
        """Write `rows` as one new part of `table`; returns its path (None for no rows). Every row needs the same keys."""
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
        parts = self._parts(table)
        path = d / f"part-{(parts[-1][0] + 1) if parts else 0:06d}.parquet"
        _write_atomic(path, lambda p: pq.write_table(data, p))
        return path

    def read(self, table: str, key: str | None = "question_id") -> pd.DataFrame:
        """All parts in order, first row per `key` kept (no de-duplication if key is None); empty DataFrame if none."""
        frames = [_to_pandas(pq.read_table(p)) for _, p in self._parts(table)]
        if not frames:
            return pd.DataFrame()
        df = pd.concat(frames, ignore_index=True)
        if key is not None:
            if key not in df.columns:
                raise ValueError(f"table {table!r} has no column {key!r} (columns: {list(df.columns)})")
            df = df.drop_duplicates(subset=key, keep="first").reset_index(drop=True)
        return df

    def done(self, table: str, key: str = "question_id") -> set:
        """Keys already stored in `table`."""
        keys: set = set()
        for _, p in self._parts(table):
            part = pq.read_table(p)
            if key not in part.column_names:
                raise ValueError(f"table {table!r} has no column {key!r} (columns: {part.column_names})")
            keys.update(part.column(key).to_pylist())
        return keys
