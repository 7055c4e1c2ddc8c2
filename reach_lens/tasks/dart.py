"""Competition and college math with final answers (the paper's ``dart`` task), graded with math_verify.

There is no default data: pass a file. Known layouts (``MATH_LAYOUTS``, recognized from a record's fields):

| layout | question field | reference answer | id |
| --- | --- | --- | --- |
| ``math`` (MATH-500, MATH) | ``problem`` | ``answer``, else the last ``\\boxed{}`` of ``solution`` | ``unique_id``, else a hash |
| ``theoremqa`` | ``Question`` | ``Answer`` (typed: int/float/bool/list/option, as text) | ``theoremqa/{id}`` |
| ``olympiadbench`` | ``context`` + ``question`` | ``final_answer`` (joined by ``", "``) | ``olympiadbench/{id}`` |
| ``college_math`` (MWPBench) | ``question`` | ``answer`` | ``college_math/{data_source}/{question_number}`` |
| ``question_answer`` (DeepMind Mathematics, ...) | ``question`` | ``answer`` | ``sha256/{hash of the question}`` |

Files are JSON lines (``.jsonl``) or one JSON array (``.json``). OlympiadBench's numeric tolerance
(``error``) and TheoremQA's float tolerance are not applied: math_verify compares floats to 6 digits.

Extraction: the last ``\\boxed{...}`` of the completion, else the last ``The answer is ...`` line, else
math_verify's own unanchored extraction. ``None`` when none of them yields anything.

Grader ``math_verify/<installed math-verify version>/2`` (``GRADER``): plain-text equality (also
True/False/Yes/No), else math_verify, except that an answer whose *shape* contradicts the reference's
is wrong whatever math_verify says (new in version 2). math_verify reads every ``(a, b)`` with a < b as
the open interval and compares an open interval with any two-element tuple, set or list, so it
matched an interval with a point and a set with either. Shapes (``answer_shape``), from the notation:

- ``interval``: brackets other than ``( )`` around two parts (``(1, 2]``, ``[0, 1]``), an infinite
  endpoint, a union ``\\cup`` (not of ``\\{...\\}`` sets), a membership in a bracket (``x \\in (1, 2)``,
  not ``x \\in \\{1, 2\\}``), or an inequality;
- ``tuple``: ``( )`` around three or more parts, ``\\langle 1, 2 \\rangle``, or an assignment to a
  tuple (``(x, y) = (1, 2)``);
- ``set``: ``\\{1, 2\\}`` (set-builder ``\\{x \\mid ...\\}`` has no shape);  ``list``: parts without
  brackets (``1, 2``);
- ``pair``: ``(a, b)``, which may be an interval or a tuple. For the reference, the question decides
  when it can: "interval", "domain" or "range" make it an interval; "ordered pair/triple", "point",
  "coordinates", "vector" or "in the form (" a tuple (both or neither: it stays a pair).

Compatible shapes: equal ones, ``pair`` with ``interval``/``tuple``/``list``, ``list`` with
``tuple``/``set``. Any other combination of two known shapes is wrong: with the reference ``(1, 2)`` of
an interval-notation question, ``(x, y) = (1, 2)`` and ``\\{1, 2\\}`` are wrong; with the reference
``(1, 2)`` of an ordered-pair question, ``x \\in (1, 2)`` is wrong; ``\\{1, 2\\}`` never equals ``(1, 2)``.
Scalars and expressions have no shape and are left to math_verify (``x = 5`` equals ``5``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from math_verify import parse, verify

from reach_lens.tasks import sources
from reach_lens.tasks.base import Graded, MalformedRow, Question, ReasoningTask
from reach_lens.tasks.sources import Row

MAX_NEW_TOKENS = 512  # competition solutions run longer than GSM8K's; 256 truncates many MATH-500 answers
NATIVE_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
SHARED_INSTRUCTION = 'End your answer with a line "The answer is: <answer>".'
GRADER = f"math_verify/{importlib.metadata.version('math-verify')}/2"  # version 1: no shape rule
MATH_TIMEOUT_S = 5  # math_verify's per-call limit; only applied in the main thread (it uses SIGALRM)


@dataclass(frozen=True)
class MathLayout:
    """How one file layout names its question, reference answer and id (see the module table)."""

    name: str
    required: tuple[str, ...]


MATH_LAYOUTS = (
    MathLayout("math", ("problem",)),
    MathLayout("theoremqa", ("Question", "Answer")),
    MathLayout("olympiadbench", ("question", "final_answer")),
    MathLayout("college_math", ("question", "answer", "data_source", "question_number")),
    MathLayout("question_answer", ("question", "answer")),
)


def math_layout(record: dict) -> MathLayout:
    """The first layout of ``MATH_LAYOUTS`` whose required fields ``record`` has."""
    for layout in MATH_LAYOUTS:
        if all(k in record for k in layout.required):
            return layout
    raise MalformedRow(
        f"fields {sorted(record)} match no known math layout: "
        + "; ".join(f"{lay.name} needs {list(lay.required)}" for lay in MATH_LAYOUTS)
    )


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (braces matched), or None."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*", text)]
    for start in reversed(starts):
        if start < len(text) and text[start] == "{":
            depth = 0
            for i in range(start, len(text)):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    return text[start + 1 : i].strip()
        else:
            m = re.match(r"[^\s$]+", text[start:])  # "\boxed 5"
            if m:
                return m.group(0)
    return None


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_as_text(v) for v in value) + "]"
    return str(value).strip()


def _record_fields(record: dict) -> tuple[str, str, str]:
    """(id, question, reference answer) of a record in any ``MATH_LAYOUTS`` layout."""
    layout = math_layout(record)
    if layout.name == "math":
        question = record["problem"]
        answer = record.get("answer")
        if answer in (None, "") and isinstance(record.get("solution"), str):
            answer = last_boxed(record["solution"])
        qid = record.get("unique_id")
    elif layout.name == "theoremqa":
        question, answer, qid = record["Question"], record["Answer"], f"theoremqa/{record.get('id')}"
    elif layout.name == "olympiadbench":
        context = record.get("context") or ""
        question = f"{context}\n{record['question']}" if context else record["question"]
        final = record["final_answer"]
        answer = ", ".join(_as_text(a) for a in final) if isinstance(final, list) else final
        qid = f"olympiadbench/{record.get('id')}"
    elif layout.name == "college_math":
        question, answer = record["question"], record["answer"]
        qid = f"college_math/{record['data_source']}/{record['question_number']}"
    else:
        question, answer, qid = record["question"], record["answer"], None
    if not isinstance(question, str) or not question.strip():
        raise MalformedRow(f"empty question ({layout.name} layout)")
    answer = _as_text(answer) if answer is not None else ""
    if not answer:
        raise MalformedRow(f"empty reference answer ({layout.name} layout)")
    if not qid:
        qid = "sha256/" + hashlib.sha256(question.strip().encode()).hexdigest()[:16]
    return str(qid), question.strip(), answer


def _timeout() -> int | None:
    return MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse(answer: str) -> list:
    """math_verify's parse of one answer (wrapped in ``\\boxed{}`` so that plain LaTeX parses whole)."""
    text = answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"
    return parse(text, parsing_timeout=_timeout())


@lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> list:
    return _parse(answer)


def _plain(text: str) -> str:
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text)
    text = re.sub(r"\\left|\\right|\\!|\\,|\$|\s", "", text)
    return text.lower().rstrip(".")


_BOOL = {"true": "true", "yes": "true", "false": "false", "no": "false"}


_INTERVAL_CONTEXT = re.compile(r"\binterval|\bdomain\b|\brange\b", re.IGNORECASE)
_TUPLE_CONTEXT = re.compile(
    r"\bordered\s+(?:pair|triple|quadruple|tuple)|\bpoints?\b|\bcoordinates\b|\bvectors?\b|"
    r"\bin\s+the\s+form\s+\$?\s*(?:\\left\s*)?\(",
    re.IGNORECASE,
)
_COMPATIBLE_SHAPES = {("pair", "interval"), ("pair", "tuple"), ("pair", "list"), ("list", "tuple"), ("list", "set")}


def _top_level_parts(text: str) -> list[str]:
    """``text`` split at the commas outside any bracket."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _encloses(text: str) -> bool:
    """Does the first bracket of ``text`` close at its last character (``(1, 2]`` yes, ``(1)(2)`` no)?"""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch in "([{") - (ch in ")]}")
        if depth == 0:
            return i == len(text) - 1
    return False


def answer_shape(text: str) -> str | None:
    """``"interval"``, ``"tuple"``, ``"set"``, ``"list"``, ``"pair"`` or None, from the notation (module docstring)."""
    spaced = re.sub(r"\\left|\\right|\\[!,;:]|\\displaystyle|\$", " ", text)
    membership = re.search(r"\\in\s*[(\[]|\\in\s*\\left\s*[(\[]", text)  # x \in (1, 2), not x \in \{1, 2\}
    union = re.search(r"\\cup|∪", text) and "\\{" not in text
    if membership or union or re.search(r"<|>|≤|≥|\\(?:le|ge|lt|gt)(?:q|slant)?(?![a-zA-Z])", spaced):
        return "interval"
    t = re.sub(r"\s", "", spaced).rstrip(".")
    if not t:
        return None
    if t.startswith("\\langle") or re.match(r"\([^()=]*,[^()=]*\)=", t):
        return "tuple"
    if t.startswith("\\{") and t.endswith("\\}"):
        return None if re.search(r"\\mid|\||:", t) else "set"  # set-builder {x | ...} may be any set
    if t[0] in "([" and t[-1] in ")]" and _encloses(t):
        parts = _top_level_parts(t[1:-1])
        if len(parts) == 2:
            if t[0] + t[-1] != "()" or re.search(r"\\infty|∞", t):
                return "interval"
            return "pair"
        if len(parts) >= 3 and t[0] + t[-1] == "()":
            return "tuple"
        return None
    return "list" if len(_top_level_parts(t)) >= 2 else None


def reference_shape(gold: str, question: str = "") -> str | None:
    """``answer_shape`` of the reference, with a ``pair`` made an interval or a tuple by the question's words."""
    shape = answer_shape(gold)
    if shape == "pair":
        interval, point = bool(_INTERVAL_CONTEXT.search(question)), bool(_TUPLE_CONTEXT.search(question))
        if interval != point:
            return "interval" if interval else "tuple"
    return shape


def shapes_conflict(gold_shape: str | None, answer_shape_: str | None) -> bool:
    """Are two known shapes incompatible (module docstring)? Unknown shapes never conflict."""
    if gold_shape is None or answer_shape_ is None or gold_shape == answer_shape_:
        return False
    pairs = {(gold_shape, answer_shape_), (answer_shape_, gold_shape)}
    return not pairs & _COMPATIBLE_SHAPES


def equivalent(gold: str, answer: str, question: str = "") -> bool:
    """Is ``answer`` the reference ``gold``? Plain-text equality (also True/False/Yes/No), else math_verify,
    unless the shapes conflict (module docstring; ``question`` may make an ``(a, b)`` reference an interval or
    a tuple)."""
    g, a = _plain(gold), _plain(answer)
    if g == a:
        return True
    if g in _BOOL:
        return _BOOL.get(a) == _BOOL[g]
    if shapes_conflict(reference_shape(gold, question), answer_shape(answer)):
        return False
    gold_parsed, answer_parsed = _parse_gold(gold), _parse(answer)
    if not gold_parsed or not answer_parsed:
        return False
    return verify(gold_parsed, answer_parsed, timeout_seconds=_timeout())


def extract_answer(completion: str) -> str | None:
    """The final answer of a completion (see the module docstring), or None."""
    boxed = last_boxed(completion)
    if boxed:
        return boxed
    lines = re.findall(r"(?:the final answer is|the answer is)\s*:?\s*([^\n]+)", completion, re.IGNORECASE)
    if lines:
        answer = lines[-1].strip().rstrip(".").strip()
        if answer.startswith("$") and answer.endswith("$") and len(answer) > 1:
            answer = answer.strip("$").strip()
        if answer:
            return answer
    parsed = parse(completion, parsing_timeout=_timeout())
    return str(parsed[1]) if len(parsed) > 1 else None


class DartMathTask(ReasoningTask):
    native_instruction = NATIVE_INSTRUCTION
    shared_instruction = SHARED_INSTRUCTION
    reasoning_max_new_tokens = MAX_NEW_TOKENS
    name = "dart"
    kind = "math"
    grader = GRADER
    default_split = "test"

    def default_rows(self, split: str) -> Iterator[Row]:
        raise ValueError(
            "task 'dart' has no default data: pass a file, e.g. MATH-500's test.jsonl or one of the DART-Math "
            "evaluation files (deepmind-mathematics.json, theoremqa.json, "
            "olympiadbench/OE_TO_maths_en_COMP.json, mwpbench/college-math-test.jsonl), or a hub name such as "
            "'HuggingFaceH4/MATH-500'"
        )

    def file_in_dir(self, directory: Path, split: str) -> Path:
        candidates = sorted(p.name for p in directory.iterdir() if p.suffix in (".json", ".jsonl"))
        if (directory / f"{split}.jsonl").is_file():
            return directory / f"{split}.jsonl"
        raise ValueError(f"{directory} has no {split}.jsonl: pass one file of {candidates or 'its files'}")

    def file_rows(self, path: Path) -> Iterator[Row]:
        if path.suffix == ".json":
            return sources.json_array_rows(path)
        return sources.jsonl_rows(path)

    def parse(self, data: Any, split: str, index: int) -> Question:
        if not isinstance(data, dict):
            raise MalformedRow(f"expected a JSON object, got {type(data).__name__}")
        qid, question, answer = _record_fields(data)
        return Question(qid, question, answer)

    def grade(self, q: Question, completion: str) -> Graded:
        answer = extract_answer(completion)
        if answer is None:
            return Graded(None, False)
        answer = re.sub(r"\s+", " ", answer).strip()
        return Graded(answer, equivalent(q.gold, answer, q.question))
