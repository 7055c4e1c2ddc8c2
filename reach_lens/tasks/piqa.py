"""PIQA (physical commonsense), two solutions per goal.

Original layout: ``valid.jsonl`` (``{"goal", "sol1", "sol2"}`` per line) beside ``valid-labels.lst``
(``0`` or ``1`` per line, aligned by line number). Hub layout: the same fields plus ``label``.
Question ids are ``piqa-{split}-{line}`` (1-based line, or row position for hub/arrow rows), so the
embedded validation set and the original ``valid.jsonl`` give the same ids.
Without a source, the embedded validation split (1,838 questions) is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import MalformedRow, Question
from reach_lens.tasks.mc import MCTask, make_mc_question
from reach_lens.tasks.sources import Row

_FILE_SPLIT = {"validation": "valid"}  # PIQA's own file-name stem per split


class PIQATask(MCTask):
    name = "piqa"
    default_split = "validation"

    def default_rows(self, split: str) -> Iterator[Row]:
        return sources.embedded_rows("piqa", split)

    def file_in_dir(self, directory: Path, split: str) -> Path:
        path = directory / f"{_FILE_SPLIT.get(split, split)}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{directory} has no {path.name} for split {split!r}")
        return path

    def file_rows(self, path: Path) -> Iterator[Row]:
        labels_path = path.with_name(f"{path.name.split('.')[0]}-labels.lst")
        if not labels_path.is_file():
            raise FileNotFoundError(f"PIQA labels file {labels_path} (aligned with {path.name}) not found")
        labels = labels_path.read_text(encoding="utf-8").rstrip("\n").split("\n")
        rows = list(sources.jsonl_rows(path))
        n_lines = rows[-1].index if rows else 0
        if n_lines != len(labels):
            raise ValueError(f"{path.name} has {n_lines} lines but {labels_path.name} has {len(labels)} labels")
        for row in rows:
            label = labels[row.index - 1].strip()
            if row.error is not None or not isinstance(row.data, dict):
                yield row
            else:
                at = f"{labels_path.name} line {row.index}"
                yield Row(row.where, row.index, {**row.data, "label": label, "_labels_at": at})

    def parse(self, data: Any, split: str, index: int) -> Question:
        if not isinstance(data, dict):
            raise MalformedRow(f"expected a JSON object, got {type(data).__name__}")
        missing = [k for k in ("goal", "sol1", "sol2", "label") if k not in data]
        if missing:
            raise MalformedRow(f"missing field(s) {missing}")
        label = str(data["label"]).strip()
        if label not in ("0", "1"):
            at = f" ({data['_labels_at']})" if "_labels_at" in data else ""
            raise MalformedRow(f"label {label!r}{at} is not 0 or 1")
        return make_mc_question(f"piqa-{split}-{index}", data["goal"], [data["sol1"], data["sol2"]], int(label))
