"""SciQ (crowdsourced science exam questions, four options, most with a supporting paragraph).

Hugging Face layout (``allenai/sciq``): ``{"question", "distractor1", "distractor2", "distractor3",
"correct_answer", "support"}`` per record; the original files (``valid.json``, ``test.json``,
``train.json``) are JSON arrays of the same records. Records have no id: question ids are
``sciq-{split}-{position}`` (1-based), as PIQA's. Without a source, the embedded validation split
(1,000 questions) is used.

- **Question text**: the support paragraph, a line break, then the question (as LogiQA keeps its
  passage), so that the letter prompts and recognition see the same information; 113 of the 1,000
  validation records have no support and are the question alone. Line breaks inside the support or the
  question are collapsed to spaces.
- **Option order**: the records list the distractors and the correct answer in fixed slots (the correct
  answer last), so a fixed order would make every gold letter D. Options are ordered by
  ``sha256("sciq-order:{question}:{slot}")``: deterministic, independent of the file order, and about
  uniform over the letters. Two validation records repeat a distractor; they are kept as they are.
- **Recognition** follows lm-evaluation-harness's ``sciq`` task: ``"{support}\\nQuestion: {question}\\nAnswer:"``
  (``"Question: ...\\nAnswer:"`` without support) with ``" option text"`` continuations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import MalformedRow, Question
from reach_lens.tasks.mc import MCTask, make_mc_question
from reach_lens.tasks.sources import Row

_SLOTS = ("distractor1", "distractor2", "distractor3", "correct_answer")
_FILES = {"validation": ("validation.jsonl", "valid.json"), "test": ("test.jsonl", "test.json"),
          "train": ("train.jsonl", "train.json")}


def option_order(question: str) -> list[int]:
    """The slots (indices into ``_SLOTS``) in display order for ``question``."""
    def rank(slot: int) -> str:
        return hashlib.sha256(f"sciq-order:{question}:{slot}".encode()).hexdigest()

    return sorted(range(len(_SLOTS)), key=rank)


class SciQTask(MCTask):
    name = "sciq"
    default_split = "validation"

    def default_rows(self, split: str) -> Iterator[Row]:
        return sources.embedded_rows("sciq", split)

    def file_in_dir(self, directory: Path, split: str) -> Path:
        return sources.first_file(directory, _FILES.get(split, (f"{split}.jsonl",)), split)

    def file_rows(self, path: Path) -> Iterator[Row]:
        return sources.json_array_rows(path) if path.suffix == ".json" else sources.jsonl_rows(path)

    def parse(self, data: Any, split: str, index: int) -> Question:
        if not isinstance(data, dict):
            raise MalformedRow(f"expected a JSON object, got {type(data).__name__}")
        missing = [k for k in ("question", *_SLOTS) if k not in data]
        if missing:
            raise MalformedRow(f"missing field(s) {missing}")
        question = " ".join(str(data["question"] or "").split())
        support = " ".join(str(data.get("support") or "").split())
        order = option_order(question)
        options = [data[_SLOTS[slot]] if isinstance(data[_SLOTS[slot]], str) else "" for slot in order]
        text = f"{support}\n{question}" if support and question else question
        return make_mc_question(f"sciq-{split}-{index}", text, options, order.index(len(_SLOTS) - 1))

    def recognition_items(self, q: Question) -> tuple[str, list[str]]:
        """lm-evaluation-harness's ``sciq``: support, ``Question: ...``, ``Answer:``; option-text continuations."""
        support, _, question = q.question.rpartition("\n")
        context = f"{support}\nQuestion: {question}\nAnswer:" if support else f"Question: {question}\nAnswer:"
        return context, [f" {o}" for o in q.options]
