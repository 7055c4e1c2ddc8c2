"""CommonsenseQA (five options, ConceptNet-based everyday questions).

Hugging Face layout (``tau/commonsense_qa``): ``{"id", "question", "question_concept", "choices":
{"label": ["A".."E"], "text": [...]}, "answerKey"}``; original layout (``dev_rand_split.jsonl``,
``train_rand_split.jsonl``): ``{"id", "question": {"stem", "question_concept", "choices": [{"label",
"text"}]}, "answerKey"}`` (the original test file has no answers: its rows are malformed here). Question
ids are the dataset's hashes. Without a source, the embedded validation split (1,221 questions) is used.

Recognition follows lm-evaluation-harness's ``commonsense_qa`` task, which differs from ARC's: the
context lists the lettered options (``"Question: ...\\nA. ...\\nE. ...\\nAnswer:"``, the same text as the
``shared`` prompt) and the continuations are the letters ``" A"`` ... ``" E"``, not the option texts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import Question
from reach_lens.tasks.mc import MCTask, choices_record, make_mc_question, options_block
from reach_lens.tasks.sources import Row

_FILES = {
    "validation": ("validation.jsonl", "dev_rand_split.jsonl"),
    "train": ("train.jsonl", "train_rand_split.jsonl"),
    "test": ("test.jsonl", "test_rand_split_no_answers.jsonl"),
}


class CommonsenseQATask(MCTask):
    name = "commonsense_qa"
    default_split = "validation"

    def default_rows(self, split: str) -> Iterator[Row]:
        return sources.embedded_rows("commonsense_qa", split)

    def file_in_dir(self, directory: Path, split: str) -> Path:
        return sources.first_file(directory, _FILES.get(split, (f"{split}.jsonl",)), split)


    def parse(self, data: Any, split: str, index: int) -> Question:
        qid, stem, options, gold = choices_record(data, "question")
        return make_mc_question(qid, stem, options, gold)

    def recognition_items(self, q: Question) -> tuple[str, list[str]]:
        """lm-evaluation-harness's ``commonsense_qa``: lettered options in the context, letters as continuations."""
        return f"Question: {q.question}\n{options_block(q)}\nAnswer:", [f" {label}" for label in q.labels]
