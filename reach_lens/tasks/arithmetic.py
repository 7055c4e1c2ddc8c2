"""allenai/basic_arithmetic as a FREE-FORM numeric task: ``"Calculate 741 * 16 ="`` -> ``11856``.

The dataset is multiple choice (four numbers, ``answerKey``); here the choices are not shown: the gold is
the correct number, computed from the question (``+``, ``-``, ``*``, exact ``/``) and checked against the
keyed choice (a disagreement is a malformed row). Layout (Hugging Face, and ``{split}.jsonl`` exports of
it): ``{"id", "question", "choices": {"text", "label"}, "answerKey", "type_tag"}``. Without a source,
the embedded validation split (3,000 questions: 1,000 each easy, medium, hard) is used.

Question ids are ``"{type_tag}/{id}"`` (``"easy/q1630_1d2d_max2d_plus"``): the difficulty tag stays with
the question (``difficulty(q)``), the dataset's id follows it.

Formats: ``native`` puts the question and ``"Give only the result, as a number."`` in the chat template
(generation stops at a blank line, 32 new tokens at most); ``shared`` is ``"Question: Calculate 741 * 16
=\\nAnswer:"`` (stops at the line break, 24 new tokens: an echoed ``741 * 16 = 11856`` fits in
digit-by-digit tokenizers). Grading is GSM8K's ``number_final`` rule (``reach_lens.tasks.gsm8k``): the
FINAL number of the completion (of its last answer line, if any), so ``"741 * 16 = 11856"`` gives 11856.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import Graded, MalformedRow, Question, Task, chat_prompt
from reach_lens.tasks.gsm8k import GRADER, extract_number, normalize_number
from reach_lens.tasks.sources import Row

NATIVE_INSTRUCTION = "Give only the result, as a number."
MAX_NEW_TOKENS = {"native": 32, "shared": 24}
STOP_STRINGS = {"native": ("\n\n",), "shared": ("\n",)}
DIFFICULTIES = ("easy", "medium", "hard")
_QUESTION = re.compile(r"^Calculate (-?\d+) ([-+*/]) (-?\d+) =$")


def evaluate(question: str) -> str:
    """The exact result of ``"Calculate a op b ="``, normalized; raises ``MalformedRow`` otherwise."""
    m = _QUESTION.match(question.strip())
    if m is None:
        raise MalformedRow(f"question {question!r} is not of the form 'Calculate <int> <+-*/> <int> ='")
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    if op == "/" and b == 0:
        raise MalformedRow(f"question {question!r} divides by zero")
    value = {"+": Fraction(a + b), "-": Fraction(a - b), "*": Fraction(a * b), "/": Fraction(a, b) if b else None}[op]
    if value.denominator != 1:
        raise MalformedRow(f"question {question!r} has no integer result ({value})")
    return str(value.numerator)


def difficulty(q: Question) -> str:
    """The dataset's difficulty tag of a basic_arithmetic question (``"easy"``, ``"medium"`` or ``"hard"``)."""
    return q.id.split("/", 1)[0]


class BasicArithmeticTask(Task):
    name = "basic_arithmetic"
    kind = "numeric"
    grader = GRADER
    default_split = "validation"

    def default_rows(self, split: str) -> Iterator[Row]:
        return sources.embedded_rows("basic_arithmetic", split)


    def parse(self, data: Any, split: str, index: int) -> Question:
        if not isinstance(data, dict):
            raise MalformedRow(f"expected a JSON object, got {type(data).__name__}")
        missing = [k for k in ("id", "question", "choices", "answerKey", "type_tag") if k not in data]
        if missing:
            raise MalformedRow(f"missing field(s) {missing}")
        tag = str(data["type_tag"]).strip()
        if tag not in DIFFICULTIES:
            raise MalformedRow(f"type_tag {tag!r} is not one of {list(DIFFICULTIES)}")
        question = str(data["question"]).strip()
        gold = evaluate(question)
        choices = data["choices"]
        if not isinstance(choices, dict) or not isinstance(choices.get("text"), list) or not isinstance(
            choices.get("label"), list
        ):
            raise MalformedRow("choices must be an object with lists 'text' and 'label'")
        labels = [str(label) for label in choices["label"]]
        key = str(data["answerKey"]).strip()
        if key not in labels or len(labels) != len(choices["text"]):
            raise MalformedRow(f"answerKey {key!r} not among choices labels {labels}")
        keyed = normalize_number(str(choices["text"][labels.index(key)]))
        if keyed != gold:
            raise MalformedRow(f"answerKey {key!r} gives {keyed!r} but {question!r} is {gold}")
        return Question(f"{tag}/{data['id']}", question, gold)

    def prompt(self, q: Question, fmt: str, tokenizer: Any) -> str:
        self.check_format(fmt)
        if fmt == "native":
            return chat_prompt(tokenizer, f"{q.question}\n\n{NATIVE_INSTRUCTION}")
        return f"Question: {q.question}\nAnswer:"

    def max_new_tokens(self, fmt: str) -> int:
        self.check_format(fmt)
        return MAX_NEW_TOKENS[fmt]

    def stop_strings(self, fmt: str) -> tuple[str, ...]:
        self.check_format(fmt)
        return STOP_STRINGS[fmt]

    def grade(self, q: Question, completion: str) -> Graded:
        answer = extract_number(completion)
        return Graded(answer, answer is not None and Decimal(answer) == Decimal(q.gold))
