"""ARC-Easy and ARC-Challenge (AI2 Reasoning Challenge), in the Hugging Face ``ai2_arc`` layout.

Records: ``{"id", "question", "choices": {"text": [...], "label": [...]}, "answerKey"}``. Some questions
label their options ``1``-``5``; every question is displayed with letters ``A, B, ...`` by position and
its gold letter is the letter at the position of ``answerKey``. Question ids are AI2's.
Without a source, the embedded validation split (ARC-Easy 570, ARC-Challenge 299) is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import MalformedRow, Question
from reach_lens.tasks.mc import MCTask, make_mc_question
from reach_lens.tasks.sources import Row


class ARCTask(MCTask):
    default_split = "validation"

    def __init__(self, name: str, subset: str) -> None:
        super().__init__()
        self.name = name
        self.subset = subset  # "ARC-Easy" or "ARC-Challenge": the hub config and the file-name prefix
        self.hf_config = subset

    def default_rows(self, split: str) -> Iterator[Row]:
        return sources.embedded_rows(self.subset, split)

    def file_in_dir(self, directory: Path, split: str) -> Path:
        path = directory / f"{self.subset}-{split}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{directory} has no {path.name} (ARC files are named {self.subset}-<split>.jsonl)")
        return path

    def file_rows(self, path: Path) -> Iterator[Row]:
        return sources.jsonl_rows(path)

    def parse(self, data: Any, split: str, index: int) -> Question:
        if not isinstance(data, dict):
            raise MalformedRow(f"expected a JSON object, got {type(data).__name__}")
        missing = [k for k in ("id", "question", "choices", "answerKey") if k not in data]
        if missing:
            raise MalformedRow(f"missing field(s) {missing}")
        choices = data["choices"]
        if not isinstance(choices, dict) or not isinstance(choices.get("text"), list) or not isinstance(
            choices.get("label"), list
        ):
            raise MalformedRow("choices must be an object with lists 'text' and 'label'")
        texts, labels = choices["text"], [str(label) for label in choices["label"]]
        if len(texts) != len(labels):
            raise MalformedRow(f"{len(texts)} choice texts but {len(labels)} labels {labels}")
        if len(set(labels)) != len(labels):
            raise MalformedRow(f"repeated choice labels {labels}")
        key = str(data["answerKey"]).strip()
        if key not in labels:
            raise MalformedRow(f"answerKey {key!r} not among choices labels {labels}")
        return make_mc_question(str(data["id"]), data["question"], texts, labels.index(key))
