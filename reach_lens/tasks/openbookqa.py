"""OpenBookQA (elementary science, four options), question stems only (no open-book fact).

Hugging Face layout (``allenai/openbookqa``, config ``main``): ``{"id", "question_stem", "choices":
{"text": [...], "label": ["A".."D"]}, "answerKey"}``; original layout (``Main/dev.jsonl``, ``test.jsonl``,
``train.jsonl``): ``{"id", "question": {"stem", "choices": [{"text", "label"}]}, "answerKey"}``. Question
ids are AI2's (``"8-376"``). Without a source, the embedded validation split (500 questions) is used.

Recognition follows lm-evaluation-harness's ``openbookqa`` task: the context is the question stem itself
(no ``Question:``/``Answer:`` frame; stems are sentence beginnings such as "... which is why they are
known as"), the continuations are ``" option text"``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import Question
from reach_lens.tasks.mc import MCTask, choices_record, make_mc_question
from reach_lens.tasks.sources import Row

_FILES = {"validation": ("validation.jsonl", "dev.jsonl"), "test": ("test.jsonl",), "train": ("train.jsonl",)}


class OpenBookQATask(MCTask):
    name = "openbookqa"
    default_split = "validation"
    hf_config = "main"

    def default_rows(self, split: str) -> Iterator[Row]:
        return sources.embedded_rows("openbookqa", split)

    def file_in_dir(self, directory: Path, split: str) -> Path:
        return sources.first_file(directory, _FILES.get(split, (f"{split}.jsonl",)), split)


    def parse(self, data: Any, split: str, index: int) -> Question:
        qid, stem, options, gold = choices_record(data, "question_stem")
        return make_mc_question(qid, stem, options, gold)

    def recognition_items(self, q: Question) -> tuple[str, list[str]]:
        """lm-evaluation-harness's ``openbookqa``: the stem, then ``" option text"`` continuations."""
        return q.question, [f" {o}" for o in q.options]
