"""Multiple-choice tasks: letter prompts, letter extraction and grading, likelihood-recognition items.

Grader ``mc_letter/2`` (``GRADER``). Letter extraction, in order of precedence (the first tier that
yields a letter wins):

1. an answer-anchored letter: ``"The answer is B"``, ``"Answer: (B)"``, ``"**Answer:** B"``, then
   ``"option B"`` / ``"The correct choice is B"``; when several are anchored, the LAST one counts (the
   final commitment, as the numeric and math graders take the last answer line or box);
2. a formatted letter anywhere: ``"(B)"``, ``"**B**"``, ``"[B]"``;
3. a bare letter at the start: ``"B"``, ``"B."``, ``"b)"``, ``"B because ..."``;
4. the text of one option: equal to it, a truncated echo of it, or nearly equal (after normalization).

Only the question's own labels count as letters. A lower-case letter must be followed by punctuation
or the end (``"a)"``, not ``"a cat"``), and an upper-case ``A`` followed by a lower-case word is read as
the article (``"A cat ..."``) unless the words after it are option A's text.

Three rules say when a named letter is NOT the answer (new in version 2; version 1 lacked them):

- **negation**: a letter after ``not`` / ``n't`` / ``never`` / ``except`` (``"not B"``, ``"The answer
  isn't B"``, ``"anything except (B)"``), or followed by ``is/are not correct|right|the answer``,
  ``is/are wrong|incorrect|false`` (``"B is wrong"``, ``"B and C are incorrect"``), is never extracted;
  the other tiers still run (``"B is wrong; the answer is C"`` gives C, ``"not B"`` alone gives None).
- **ambiguity**: when the extracted letter is joined to another of the question's letters by ``or``,
  ``and``, ``and/or``, ``/``, ``&`` or a comma (``"A or B"``, ``"The answer is A or B"``, ``"(B)/(C)"``,
  ``"A, B"``), the completion commits to no single option: None.
- **self-correction**: after a correction marker (``actually``, ``wait``, ``no wait``, ``I mean``,
  ``correction``, ``on second thought``, ``scratch that``), the letter the text after the LAST such
  marker names (tiers 1-3 applied to that text) is the answer: ``"A... actually C"``,
  ``"A, no wait, C"`` and ``"The answer is A. Wait, no, the answer is C."`` all give C. A marker whose
  text names no letter (``"B. Actually, I am sure."``) changes nothing.

Note that the native format stops generation at the first ``"."`` or line break (``stop_strings``), so
a correction after a period is cut off before grading: ``"A. Actually C"`` is graded as ``"A"``.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from reach_lens.tasks.base import Graded, MalformedRow, Question, Task, chat_prompt

LETTERS = "ABCDEFGHIJ"
NATIVE_INSTRUCTION = "Answer with the letter of the correct option only."
MC_MAX_NEW_TOKENS = 8  # the letter is decided in the first tokens
GRADER = "mc_letter/2"  # version 1: no negation, ambiguity or self-correction rules; earliest anchored letter
_PUNCT_AFTER = r"\s*(?:$|\n|[.,;:!?)\]}*\"'])"
_ARTICLE_EXCEPTIONS = ("is", "because", "since", "as")
_ANSWER_PREFIX = r"^(?:the\s+)?(?:correct\s+|final\s+)?answer\s*(?:is\b|:)"
_ECHO_END = r"(?=$|[\s,.;:!?)]\s*(?:$|[^\W\d]))"  # an option's text followed by prose, not by "+ 3 = 5"


def options_block(q: Question) -> str:
    return "\n".join(f"{label}. {text}" for label, text in zip(q.labels, q.options))


def make_mc_question(qid: str, text: str, options: list[str], gold_index: int) -> Question:
    """A ``Question`` with letters ``A, B, ...`` as labels; raises ``MalformedRow`` on empty text."""
    if not isinstance(text, str) or not text.strip():
        raise MalformedRow("empty question text")
    if len(options) < 2 or len(options) > len(LETTERS):
        raise MalformedRow(f"{len(options)} options (expected 2..{len(LETTERS)})")
    for i, option in enumerate(options):
        if not isinstance(option, str) or not option.strip():
            raise MalformedRow(f"option {LETTERS[i]} is empty")
    if not 0 <= gold_index < len(options):
        raise MalformedRow(f"gold index {gold_index} out of range for {len(options)} options")
    labels = tuple(LETTERS[: len(options)])
    return Question(qid, text.strip(), labels[gold_index], tuple(o.strip() for o in options), labels)


def choices_record(data: Any, stem_field: str) -> tuple[str, str, list[str], int]:
    """(id, question, options, gold index) of a record with ``choices`` and ``answerKey``, in the Hugging Face
    layout (``{"id", stem_field: "...", "choices": {"text": [...], "label": [...]}, "answerKey"}``) or the
    AI2 original one (``{"id", "question": {"stem", "choices": [{"text", "label"}, ...]}, "answerKey"}``).
    Raises ``MalformedRow``."""
    if not isinstance(data, dict):
        raise MalformedRow(f"expected a JSON object, got {type(data).__name__}")
    if isinstance(data.get("question"), dict):  # original layout
        question = data["question"]
        choices = question.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise MalformedRow("question.choices must be a list of {text, label} objects")
        data = {**data, stem_field: question.get("stem"),
                "choices": {"text": [c.get("text") for c in choices], "label": [c.get("label") for c in choices]}}
    missing = [k for k in ("id", stem_field, "choices", "answerKey") if k not in data]
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
    key = str(data["answerKey"] or "").strip()
    if key not in labels:
        raise MalformedRow(f"answerKey {key!r} not among choices labels {labels}")
    return str(data["id"]), data[stem_field], texts, labels.index(key)


def _normalize(text: str) -> str:
    text = re.sub(r"[*_`\"'“”‘’]", "", text.lower())
    text = re.sub(r"\s+", " ", text)
    return text.strip(" .,;:!?()[]")


def _letter_ok(text: str, m: re.Match, q: Question) -> bool:
    """Is the letter captured by ``m`` a letter (not prose)? See the module docstring."""
    letter = m.group("L")
    rest = text[m.end("L"):]
    if re.match(_PUNCT_AFTER, rest):
        return True
    if letter.islower() or not re.match(r"[ \t]+\S", rest):
        return False
    if letter != "A":
        return True
    after = rest.strip()
    next_word = after.split()[0]
    if not next_word[0].islower() or next_word.lower().strip(",.") in _ARTICLE_EXCEPTIONS:
        return True
    return _normalize(after).startswith(_normalize(q.options[0]))


def _negated(text: str, m: re.Match) -> bool:
    """Is the letter of ``m`` negated (``"not B"``, ``"B is wrong"``)? See the module docstring."""
    return bool(_NEGATED_BEFORE.search(text[: m.start("L")]) or _NEGATED_AFTER.match(text[m.end("L"):]))


def _ambiguous(text: str, m: re.Match, q: Question) -> bool:
    """Is the letter of ``m`` one of two or more letters offered together (``"A or B"``, ``"A, B"``)?"""
    after = _JOINED_AFTER.match(text[m.end("L"):])
    before = _JOINED_BEFORE.search(text[: m.start("L")])
    return any(j is not None and j.group("L2") in q.labels and j.group("L2") != m.group("L").upper()
               for j in (after, before))


_NOT_FOUND, _AMBIGUOUS = None, "ambiguous"


def _find(patterns: list[re.Pattern], text: str, q: Question, last: bool = False) -> str | None:
    """Earliest (``last``: latest) match over all patterns whose letter is one of ``q.labels``, passes
    ``_letter_ok`` and is not negated; ``_AMBIGUOUS`` when that letter is joined to another letter."""
    best: tuple[int, str, re.Match] | None = None
    for pattern in patterns:
        for m in pattern.finditer(text):
            letter = m.group("L").upper()
            if letter in q.labels and _letter_ok(text, m, q) and not _negated(text, m):
                if best is None or (m.start("L") > best[0] if last else m.start("L") < best[0]):
                    best = (m.start("L"), letter, m)
                if not last:
                    break
    if best is None:
        return _NOT_FOUND
    return _AMBIGUOUS if _ambiguous(text, best[2], q) else best[1]


_ANSWER = [
    re.compile(
        r"\banswer\b(?:\s+(?:is|would\s+be|should\s+be|will\s+be))?[\s:=*\-]*"
        r"(?:(?:option|choice|letter)\b)?[\s:*]*[(\[{\"'*]*(?P<L>[A-Ja-j])(?![A-Za-z0-9])",
        re.IGNORECASE,
    )
]
_OPTION = [re.compile(r"\b(?:option|choice)\b(?:\s+is)?[\s:]*[(\[]?(?P<L>[A-Ja-j])(?![A-Za-z0-9])", re.IGNORECASE)]
_FORMATTED = [
    re.compile(r"\((?P<L>[A-J])\)"),
    re.compile(r"\*\*(?P<L>[A-J])(?:\*\*|[.)])"),
    re.compile(r"\[(?P<L>[A-J])\]"),
]
_LEADING = [re.compile(r"^[\s*\"'(\[]*(?P<L>[A-Ja-j])(?![A-Za-z0-9])")]

_LETTER_TAIL = r"[)\]}*\"'.]*"  # closing marks after a letter: "(A)", "**A**", "A."
_NEGATED_BEFORE = re.compile(
    r"(?:\bnot|n't|\bnever|\bexcept|\bexcluding)\s+(?:(?:the\s+)?(?:option|choice|answer|letter)\s+)?"
    r"[(\[{\"'*]*$",
    re.IGNORECASE,
)
_NEGATED_AFTER = re.compile(
    rf"{_LETTER_TAIL}(?:\s*(?:,|/|&|\bor\b|\band\b)\s*[(\[*]*[A-J]{_LETTER_TAIL})*"
    r"\s+(?:is|are)\s*(?:(?:not|n't)\s+(?:correct|right|true|the\s+(?:correct\s+)?answer)|wrong|incorrect|false)\b",
    re.IGNORECASE,
)
_JOIN = r"\s*(?:,|/|&|\bor\b|\band\b|\band/or\b)\s*(?:(?:or|and)\s+)?"
_JOINED_AFTER = re.compile(rf"{_LETTER_TAIL}{_JOIN}[(\[{{*\"']*(?P<L2>[A-J])(?![A-Za-z0-9])")
_JOINED_BEFORE = re.compile(rf"(?<![A-Za-z0-9])(?P<L2>[A-J]){_LETTER_TAIL}{_JOIN}[(\[{{*\"']*$")
_CORRECTION = re.compile(
    r"\b(?:actually|no,?\s+wait|wait|i\s+mean|correction|on\s+second\s+thoughts?|scratch\s+that)\b",
    re.IGNORECASE,
)


def _match_option_text(text: str, q: Question) -> str | None:
    """Letter of the one option whose text the completion's first line gives (exactly, truncated, or nearly)."""
    first = text.strip().split("\n")[0]
    first = _normalize(re.sub(_ANSWER_PREFIX, "", first, flags=re.IGNORECASE))
    if not first:
        return None
    options = [_normalize(o) for o in q.options]
    for hits in (
        [i for i, o in enumerate(options) if first == o],
        [i for i, o in enumerate(options) if len(first) >= 10 and o.startswith(first)],
        [i for i, o in enumerate(options) if re.match(re.escape(o) + _ECHO_END, first)],
    ):
        if len(hits) == 1:
            return q.labels[hits[0]]
        if hits:
            return None
    ratios = sorted(((difflib.SequenceMatcher(None, first, o).ratio(), i) for i, o in enumerate(options)), reverse=True)
    if ratios[0][0] >= 0.9 and (len(ratios) == 1 or ratios[0][0] - ratios[1][0] >= 0.05):
        return q.labels[ratios[0][1]]
    return None


def _letter_tiers(text: str, q: Question, option_text: bool) -> str | None:
    """Tiers 1-4 of the module docstring on ``text``: a letter, ``_AMBIGUOUS`` or None."""
    for patterns, last in ((_ANSWER, True), (_OPTION, True), (_FORMATTED, False), (_LEADING, False)):
        letter = _find(patterns, text, q, last)
        if letter is not _NOT_FOUND:
            return letter
    return _match_option_text(text, q) if option_text else None


def extract_letter(completion: str, q: Question) -> str | None:
    """The option letter a completion gives for ``q``, or None (rules: module docstring)."""
    text = completion.strip()
    if not text:
        return None
    for marker in reversed(list(_CORRECTION.finditer(text))):  # self-correction: the last marker naming a letter
        tail = text[marker.end():].lstrip(" \t\n,.;:!-\u2013\u2014\u2026")
        letter = _letter_tiers(tail, q, option_text=False) if tail else None
        if letter is not None:
            return None if letter == _AMBIGUOUS else letter
    letter = _letter_tiers(text, q, option_text=True)
    return None if letter == _AMBIGUOUS else letter


class MCTask(Task):
    """A multiple-choice task graded by the letter of the chosen option."""

    kind = "mc"
    grader = GRADER

    def prompt(self, q: Question, fmt: str, tokenizer: Any) -> str:
        self.check_format(fmt)
        if fmt == "native":
            return chat_prompt(tokenizer, f"{q.question}\n\n{options_block(q)}\n\n{NATIVE_INSTRUCTION}")
        return f"Question: {q.question}\n{options_block(q)}\nAnswer:"

    def max_new_tokens(self, fmt: str) -> int:
        self.check_format(fmt)
        return MC_MAX_NEW_TOKENS

    def stop_strings(self, fmt: str) -> tuple[str, ...]:
        self.check_format(fmt)
        # native answers look like "B. option text": the letter is decided before the first period or line
        # break, so generation stops there (the text is cut before the stop string; "B" still grades)
        return ("\n\n", "Question:") if fmt == "shared" else (".", "\n")

    def grade(self, q: Question, completion: str) -> Graded:
        letter = extract_letter(completion, q)
        return Graded(letter, letter == q.gold)

    def recognition_items(self, q: Question) -> tuple[str, list[str]]:
        """lm-evaluation-harness zero-shot style: ``"Question: ...\\nAnswer:"`` and ``" option text"`` continuations."""
        return f"Question: {q.question}\nAnswer:", [f" {o}" for o in q.options]
