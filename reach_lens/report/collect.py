"""What a run directory holds, read as a reader: its run stores and the tables, figures and text a study wrote
beside them. Nothing is written and no writer's lock is taken, so a report can be made while the study runs.

    run = collect(path)        # a summary-* directory, one run store, or a run root holding run stores
    run.stores                 # [Store(root, protocol, tables)], each read through RunStore.reader
    run.tables["table.csv"]    # the summary CSVs, as DataFrames

A summary directory (``runs.summary_dir``: it holds ``protocols.json``) is read with the stores of those protocols
found under its parent; a run store (``protocol.json``) with the stores nested in it (a planted control's);
any other directory with every store under it and the summary directories directly inside it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from reach_lens.errors import UserError
from reach_lens.protocol import Protocol
from reach_lens.store import VECTORS, RunStore

PROTOCOL, SUMMARY_PROTOCOLS, SUMMARY_TEXT = "protocol.json", "protocols.json", "summary.md"
SUMMARY_PREFIX = "summary-"


class NotARunDirectory(UserError, FileNotFoundError):
    """The path holds no run store, under it or named by its summary."""


@dataclass
class Store:
    """One run store: its directory, its protocol, the names of its tables, and a reader."""

    root: Path
    protocol: Protocol
    tables: tuple[str, ...]
    reader: RunStore

    def read(self, table: str, key: str | None = "question_id") -> pd.DataFrame:
        """The table's rows (``RunStore.read``); an empty DataFrame for a table the store lacks."""
        return self.reader.read(table, key=key) if table in self.tables else pd.DataFrame()


@dataclass
class Run:
    """What ``collect`` found at ``path`` (``kind``: "summary", "store" or "root")."""

    path: Path
    kind: str
    stores: list[Store]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, bytes] = field(default_factory=dict)
    text: str | None = None
    missing: list[str] = field(default_factory=list)  # protocols of the summary without a store found


def open_store(root: Path) -> Store:
    """The run store at ``root`` (its protocol.json), opened with ``RunStore.reader``."""
    try:
        stored = json.loads((root / PROTOCOL).read_text())
        protocol = Protocol.from_dict(stored["protocol"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{root / PROTOCOL} is not a run store's protocol ({type(e).__name__}: {e})") from None
    reader = RunStore.reader(root, protocol)
    tables = tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != VECTORS
                          and any(q.name.startswith("part-") for q in p.iterdir())))
    return Store(root, protocol, tables, reader)


def find_stores(top: Path) -> list[Store]:
    """Every run store at or under ``top``, in path order; summary directories and vectors are not entered."""
    found = []
    for here, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not d.startswith((SUMMARY_PREFIX, ".")) and d != VECTORS)
        if PROTOCOL in files:
            found.append(open_store(Path(here)))
    return found


def _csv(path: Path) -> pd.DataFrame:
    """A summary CSV; an empty file (a table with no rows and no columns, e.g. no structured search to compare) is an
    empty DataFrame."""
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def _summary_files(directory: Path, prefix: str = "") -> tuple[dict, dict, str | None]:
    """The CSV tables (as DataFrames), PNG figures (bytes) and summary.md text directly in ``directory``."""
    tables = {prefix + p.name: _csv(p) for p in sorted(directory.glob("*.csv"))}
    figures = {prefix + p.name: p.read_bytes() for p in sorted(directory.glob("*.png"))}
    text = (directory / SUMMARY_TEXT).read_text() if (directory / SUMMARY_TEXT).is_file() else None
    return tables, figures, text


def collect(path: Path | str) -> Run:
    """The run at ``path`` (module docstring); raises ``NotARunDirectory`` when it holds no run store."""
    path = Path(path)
    if not path.is_dir():
        raise NotARunDirectory(f"{path} is not a directory: expected a summary-* directory, a run store or a run root")
    tables, figures, text = _summary_files(path)
    missing: list[str] = []
    if (path / SUMMARY_PROTOCOLS).is_file():
        kind = "summary"
        wanted = [Protocol.from_dict(d) for d in json.loads((path / SUMMARY_PROTOCOLS).read_text())]
        by_fingerprint = {p.fingerprint(): p for p in wanted}
        stores = [s for s in find_stores(path.parent) if s.reader.fingerprint in by_fingerprint]
        have = {s.reader.fingerprint for s in stores}
        missing = [f"{p.study} {p.model} {p.task} {p.probe}" for f, p in by_fingerprint.items() if f not in have]
    elif (path / PROTOCOL).is_file():
        kind, stores = "store", find_stores(path)
    else:
        kind, stores = "root", find_stores(path)
        for child in sorted(path.glob(f"{SUMMARY_PREFIX}*")):
            more, pictures, _ = _summary_files(child, prefix=f"{child.name}/")
            tables.update(more)
            figures.update(pictures)
    if not stores:
        raise NotARunDirectory(f"{path} holds no run store (no {PROTOCOL} at or under it"
                               + (f", none of the {len(missing)} protocols its {SUMMARY_PROTOCOLS} names" if missing
                                  else "") + "): expected a study's --out directory, a summary-* directory in it, "
                               "or one run store")
    return Run(path, kind, stores, tables, figures, text, missing)
