"""GSM8K: grade-school word problems with a numeric answer.

Original layout: ``test.jsonl`` with ``{"question", "answer"}``; the gold number follows the last
``#### `` of ``answer`` (same layout on the hub, config ``main``). Question ids are
``gsm8k-{split}-{line}`` (1-based). Golds and extracted answers are normalized numbers: no commas,
units or ``$``; ``"18.0"`` -> ``"18"``, ``"0.50"`` -> ``"0.5"``.

Extraction: the last number of the last explicit answer line (``#### 18``, ``The answer is 18``,
``Answer: 18``, ``\\boxed{18}``), else the last number anywhere in the completion.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import Graded, MalformedRow, Question, ReasoningTask
from reach_lens.tasks.sources import Row

MAX_NEW_TOKENS = 256  # room for a short chain of thought; GSM8K reference solutions average ~120 tokens
NATIVE_INSTRUCTION = 'Solve the problem step by step. End with a final line "The answer is: <number>".'
SHARED_INSTRUCTION = 'End your answer with a line "The answer is: <number>".'
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])-?\.\d+")
_ANSWER_LINE = re.compile(
    r"(?:####|\bthe (?:final )?answer is|\bfinal answer\s*:|\banswer\s*:|\\boxed\{)([^\n]*)", re.IGNORECASE
)


def normalize_number(text: str) -> str | None:
    """``"1,450,000"`` -> ``"1450000"``, ``"18.0"`` -> ``"18"``, ``"-3"`` -> ``"-3"``; None if not a number."""
    text = text.strip().replace(",", "").replace("$", "").replace("\u2212", "-")
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text.replace("\u2212", "-"))
    return normalize_number(numbers[-1]) if numbers else None


def extract_number(completion: str) -> str | None:
    """The final answer number of a completion (see the module docstring), normalized; None if there is none."""
    for m in reversed(list(_ANSWER_LINE.finditer(completion))):
        number = _last_number(m.group(1))
        if number is not None:
            return number
    return _last_number(completion)


class GSM8KTask(ReasoningTask):
    native_instruction = NATIVE_INSTRUCTION
    shared_instruction = SHARED_INSTRUCTION
    reasoning_max_new_tokens = MAX_NEW_TOKENS
    name = "gsm8k"
    kind = "numeric"
    default_split = "test"
    hf_config = "main"

    def file_in_dir(self, directory: Path, split: str) -> Path:
        path = directory / f"{split}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{directory} has no {path.name} for split {split!r}")
        return path

    def file_rows(self, path: Path) -> Iterator[Row]:
        return sources.jsonl_rows(path)

    def parse(self, data: Any, split: str, index: int) -> Question:
        if not isinstance(data, dict):
            raise MalformedRow(f"expected a JSON object, got {type(data).__name__}")
        question, answer = data.get("question"), data.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise MalformedRow("missing or empty 'question'")
        if not isinstance(answer, str) or "####" not in answer:
            raise MalformedRow("'answer' has no '####' final-answer line")
        raw = answer.split("####")[-1].strip()
        gold = normalize_number(raw)
        if gold is None:
            raise MalformedRow(f"final answer {raw!r} after '####' is not a number")
        return Question(f"gsm8k-{split}-{index}", question.strip(), gold)

    def grade(self, q: Question, completion: str) -> Graded:
        answer = extract_number(completion)
        return Graded(answer, answer is not None and Decimal(answer) == Decimal(q.gold))
