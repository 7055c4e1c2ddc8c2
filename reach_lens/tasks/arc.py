"""ARC-Easy and ARC-Challenge (AI2 Reasoning Challenge), in the Hugging Face ``ai2_arc`` layout or AI2's original.

Records: ``{"id", "question", "choices": {"text": [...], "label": [...]}, "answerKey"}`` (or AI2's
``{"id", "question": {"stem", "choices": [{"text", "label"}, ...]}, "answerKey"}``). Some questions
label their options ``1``-``5``; every question is displayed with letters ``A, B, ...`` by position and
its gold letter is the letter at the position of ``answerKey``. Question ids are AI2's.
Without a source, the embedded validation split (ARC-Easy 570, ARC-Challenge 299) is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import Question
from reach_lens.tasks.mc import MCTask, choices_record, make_mc_question
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


    def parse(self, data: Any, split: str, index: int) -> Question:
        return make_mc_question(*choices_record(data, "question"))
