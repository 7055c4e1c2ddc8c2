"""Multiple-choice tasks: letter prompts, letter extraction and grading, likelihood-recognition items.

Letter extraction, in order of precedence (the first tier that yields a letter wins):

1. an answer-anchored letter: ``"The answer is B"``, ``"Answer: (B)"``, ``"**Answer:** B"``, then
   ``"option B"`` / ``"The correct choice is B"``;
2. a formatted letter anywhere: ``"(B)"``, ``"**B**"``, ``"[B]"``;
3. a bare letter at the start: ``"B"``, ``"B."``, ``"b)"``, ``"B because ..."``;
4. the text of one option: equal to it, a truncated echo of it, or nearly equal (after normalization).

Only the question's own labels count as letters. A lower-case letter must be followed by punctuation
or the end (``"a)"``, not ``"a cat"``), and an upper-case ``A`` followed by a lower-case word is read as
the article (``"A cat ..."``) unless the words after it are option A's text.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from reach_lens.tasks.base import Graded, MalformedRow, Question, Task, chat_prompt

LETTERS = "ABCDEFGHIJ"
NATIVE_INSTRUCTION = "Answer with the letter of the correct option only."
MC_MAX_NEW_TOKENS = 8  # the letter is decided in the first tokens
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


def _find(patterns: list[re.Pattern], text: str, q: Question) -> str | None:
    """Earliest match (over all patterns) whose letter is one of ``q.labels`` and passes ``_letter_ok``."""
    best: tuple[int, str] | None = None
    for pattern in patterns:
        for m in pattern.finditer(text):
            letter = m.group("L").upper()
            if letter in q.labels and _letter_ok(text, m, q):
                if best is None or m.start("L") < best[0]:
                    best = (m.start("L"), letter)
                break
    return None if best is None else best[1]


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


def extract_letter(completion: str, q: Question) -> str | None:
    """The option letter a completion gives for ``q``, or None (precedence: module docstring)."""
    text = completion.strip()
    if not text:
        return None
    return (
        _find(_ANSWER, text, q)
        or _find(_OPTION, text, q)
        or _find(_FORMATTED, text, q)
        or _find(_LEADING, text, q)
        or _match_option_text(text, q)
    )


class MCTask(Task):
    """A multiple-choice task graded by the letter of the chosen option."""

    kind = "mc"

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
