"""LogiQA (v1, English): logical-reasoning questions over a passage, four options.

Original layout (``Test.txt``, ``Eval.txt``, ``Train.txt``): blocks of 8 lines, parsed by position:
blank, gold letter ``a``-``d``, passage, question, options A-D. Option prefixes (``A.``, ``A?``,
``A ``) are removed; a few upstream lines have a garbled prefix and keep their text. Hub layouts:
EleutherAI's (``label``, ``context``, ``question``, ``options``) and lucasmccabe's (``context``,
``query``, ``options``, ``correct_option``). The question text is ``passage + "\\n" + question``.
Question ids are ``logiqa-{split}-{block}`` with the 1-based block (or row) position.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from reach_lens.tasks.base import MalformedRow, Question
from reach_lens.tasks.mc import MCTask, make_mc_question
from reach_lens.tasks.sources import Row

_FILE_SPLIT = {"test": "Test.txt", "validation": "Eval.txt", "train": "Train.txt"}
_BLOCK = 8


def _strip_prefix(option: str, position: int) -> str:
    """``"A.text"``, ``"B?text"`` (any letter) or ``"A text"`` (the positional letter only) -> ``"text"``."""
    option = option.strip()
    stripped = re.sub(r"^[A-D][.?]\s*", "", option)
    if stripped == option:
        stripped = re.sub(rf"^{'ABCD'[position]}\s+", "", option)
    return stripped


class LogiQATask(MCTask):
    name = "logiqa"
    default_split = "test"

    def file_in_dir(self, directory: Path, split: str) -> Path:
        if split not in _FILE_SPLIT:
            raise ValueError(f"unknown LogiQA split {split!r}; valid: {sorted(_FILE_SPLIT)}")
        path = directory / _FILE_SPLIT[split]
        if not path.is_file():
            raise FileNotFoundError(f"{directory} has no {path.name} for split {split!r}")
        return path

    def file_rows(self, path: Path) -> Iterator[Row]:
        lines = path.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n")
        while lines and not lines[-1].strip() and len(lines) % _BLOCK:
            lines.pop()
        for start in range(0, len(lines), _BLOCK):
            block = lines[start : start + _BLOCK]
            number = start // _BLOCK + 1
            where = f"{path.name} lines {start + 1}-{start + len(block)} (block {number})"
            if len(block) < _BLOCK:
                yield Row(where, number, None, f"truncated block of {len(block)} lines (expected {_BLOCK})")
            elif block[0].strip():
                yield Row(where, number, None, f"line {start + 1} should be blank, got {block[0][:40]!r}")
            else:
                options = [_strip_prefix(o, i) for i, o in enumerate(block[4:8])]
                record = {"label": block[1].strip(), "context": block[2], "question": block[3], "options": options}
                yield Row(where, number, record)

    def parse(self, data: Any, split: str, index: int) -> Question:
        if not isinstance(data, dict):
            raise MalformedRow(f"expected a record, got {type(data).__name__}")
        if "correct_option" in data:  # lucasmccabe/logiqa
            data = {**data, "question": data.get("query"), "label": "abcd"[int(data["correct_option"])]}
        missing = [k for k in ("label", "context", "question", "options") if k not in data]
        if missing:
            raise MalformedRow(f"missing field(s) {missing}")
        label = str(data["label"]).strip().lower()
        if label not in ("a", "b", "c", "d"):
            raise MalformedRow(f"answer {label!r} not among a, b, c, d")
        if len(data["options"]) != 4:
            raise MalformedRow(f"{len(data['options'])} options (expected 4)")
        context, question = str(data["context"] or "").strip(), str(data["question"] or "").strip()
        if not context or not question:
            raise MalformedRow("empty passage or question")
        text = f"{context}\n{question}"
        return make_mc_question(f"logiqa-{split}-{index}", text, list(data["options"]), "abcd".index(label))

    def recognition_items(self, q: Question) -> tuple[str, list[str]]:
        """lm-evaluation-harness's LogiQA template: passage, question, lettered choices, ``"Answer:"``."""
        context, question = q.question.rsplit("\n", 1)
        text = f"Passage: {context}\nQuestion: {question}\nChoices:\n"
        text += "".join(f"{label}. {option}\n" for label, option in zip(q.labels, q.options))
        return text + "Answer:", [f" {o}" for o in q.options]
