"""Free-form short answers (SQuAD, TriviaQA, NQ-Open, Jeopardy): extraction, SQuAD normalization, exact match
against every gold alias, token F1, and the ``ShortAnswerTask`` base with its three prompt formats.

Grader ``short_answer_em/1`` (``GRADER``):

- **extraction**: only the first line counts (generation stops at OLMES's sequences, a blank line or the next
  question's marker, not at the first line break: a zero-shot answer may begin with one). The completion is stripped, cut at its first line break, and a
  leading answer label is dropped: ``Answer:`` (which a model may repeat after a prompt ending in one) and a
  chat model's ``The answer is:`` / ``The answer to the question is``. An empty
  line is a format failure (answer None), and so is a line that normalizes to nothing (``"..."``, ``"The"``).
- **normalization** (``normalize_answer`` of the SQuAD v1.1 evaluation script, character for character): lower-case,
  punctuation (``string.punctuation``) removed, the articles ``a``/``an``/``the`` removed as whole words, whitespace
  collapsed.
- **exact match**: the normalized answer equals the normalized form of at least one gold alias. So ``"23"`` is
  correct when ``"23"`` is among the aliases, and ``"23 years old"`` is not (its token F1 is recorded instead).
- **token F1**: SQuAD's bag-of-tokens F1 of the normalized answer against each alias, the maximum over aliases;
  recorded beside the exact match (``Graded.f1``), never used for ``correct``.

Where it differs from the reference graders (docs/tasks.md has the table; tests/test_short_answer.py checks each
difference against a re-implementation of the reference rule):

- **SQuAD v1.1 script**: the same normalization and the same maximum over gold answers, but it grades the whole
  prediction as given: no first line (``"Naples\\nNaples is in Italy"`` is wrong there, correct here) and no label
  dropped (``"Answer: Naples"`` is wrong there).
- **lm-evaluation-harness 0.4.13, ``triviaqa``**: the answer ends at the first ``"\\n"``, ``"."`` or ``","`` (its
  ``until`` stop sequences), is stripped, lower-cased and stripped of punctuation; articles are kept, inner
  whitespace is not collapsed, no label is dropped. So ``"Naples, Italy"`` is correct there and wrong here
  (against the alias ``"Naples"``), and ``"The answer is: Naples"``, ``"St. Louis"``, ``"The Beatles"`` (against
  the alias ``"Beatles"``) and an answer after a leading line break are correct here and wrong there.
- **lm-evaluation-harness 0.4.13, ``nq_open``**: as ``triviaqa``, except that before lower-casing it deletes the
  regex ``\\b(?:The |the |An |A |The |a |an )`` from answer and gold: an article in those capitalizations followed
  by a space. Lower-case articles therefore drop as here, but ``"THE BEATLES"`` against the gold ``"The Beatles"``
  is wrong there and correct here.

On 1,600 real generations the verdicts equal lm-evaluation-harness's on all 800 in the default (5-shot ``fewshot``)
format and differ on 7 of 800 in the zero-shot format, all from the dropped label (``"The answer is: Naples"``,
correct here, wrong there).

Formats (``ShortAnswerTask.formats``):

- ``native``: the question (and passage) in the model's chat template with a one-line instruction;
- ``shared``: the plain zero-shot text ``...\\nAnswer:``, one prompt for every checkpoint;
- ``fewshot``: the same text after a fixed block of worked shots (OLMES's own for SQuAD, NQ-Open and Jeopardy;
  five held-out validation questions for TriviaQA). The block is identical for every question, so the engine
  computes it once per model (its prefix cache shares a common token prefix across prompts); its content hash
  enters every protocol through ``prompt_spec``.
"""

from __future__ import annotations

import hashlib
import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Any

from reach_lens.tasks.base import Graded, Question, Task, chat_prompt

GRADER = "short_answer_em/1"
MAX_NEW_TOKENS = 32  # a short answer and its line break; OLMES allows 50, exact match never needs them
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_LABEL = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?answer\b(?:\s+to\s+(?:the|this)\s+question)?\s*(?:is\b\s*:?|:)\s*",
                    re.IGNORECASE)  # "Answer:", "The answer is:", "The answer to the question is"


def normalize_answer(text: str) -> str:
    """The SQuAD v1.1 script's ``normalize_answer``: lower-case, no punctuation, no articles, single spaces
    (``"The Eiffel-Tower!"`` -> ``"eiffeltower"``). Not lm-evaluation-harness's: its ``triviaqa`` keeps articles, its
    ``nq_open`` drops only ``"The "``-style articles before lower-casing, and neither collapses whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def first_line(completion: str) -> str:
    """The graded part of a completion: its first non-blank line, stripped, without a leading answer label.

    Not lm-evaluation-harness's cut (at the first ``"\\n"``, ``"."`` or ``","``, so ``"Naples, Italy"`` -> ``"Naples"``
    there, and a leading line break leaves nothing), nor the SQuAD v1.1 script's (none)."""
    stripped = completion.strip()
    return _LABEL.sub("", stripped.split("\n", 1)[0]).strip()


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD's token F1 of two already normalized strings (0 when either is empty)."""
    pred, ref = prediction.split(), gold.split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if not pred or not ref or common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def grade_short_answer(completion: str, aliases: Sequence[str]) -> Graded:
    """Exact match of the completion's first line against every alias after normalization, with token F1."""
    if not aliases:
        raise ValueError("no gold aliases to grade against")
    answer = normalize_answer(first_line(completion))
    if not answer:
        return Graded(None, False, f1=0.0)
    golds = [normalize_answer(a) for a in aliases]
    return Graded(answer, answer in golds, f1=max(token_f1(answer, g) for g in golds))


def unique_aliases(values: Sequence[Any]) -> tuple[str, ...]:
    """Non-empty aliases as stripped strings, duplicates (after stripping) dropped, order kept."""
    out = [str(v).strip() for v in values if isinstance(v, str) and v.strip()]
    return tuple(dict.fromkeys(out))


class ShortAnswerTask(Task):
    """A free-form task graded by exact match against gold aliases (module docstring).

    Subclasses implement ``query`` (the zero-shot text of a question, ending in ``"Answer:"``), ``shots``
    (the fixed block placed before it in the ``fewshot`` format, with a short name of where it comes from) and
    ``native_content`` (the user turn of the chat format), plus loading.
    """

    kind = "short_answer"
    grader = GRADER
    formats = ("native", "shared", "fewshot")
    default_format = "fewshot"
    stops: tuple[str, ...] = ("Question:", "\n\n")  # OLMES's: a blank line or the next question ends an answer
    native_instruction = "Answer with a few words only."
    description = ""  # text before the first question in the shared and fewshot formats

    def query(self, q: Question) -> str:
        """``"Question: ...\\nAnswer:"`` (subclasses add a passage or category)."""
        return f"Question: {q.question}\nAnswer:"

    def native_content(self, q: Question) -> str:
        return f"{q.question}\n\n{self.native_instruction}"

    def shots(self) -> tuple[str, str]:
        """(name, text) of the fixed few-shot block: ``text`` ends with a blank line and precedes ``query``."""
        raise NotImplementedError(f"task {self.name!r} has no few-shot block")

    def prompt(self, q: Question, fmt: str, tokenizer: Any) -> str:
        self.check_format(fmt)
        if fmt == "native":
            return chat_prompt(tokenizer, self.native_content(q))
        if fmt == "shared":
            return self.description + self.query(q)
        return self.shots()[1] + self.query(q)

    def prompt_spec(self, fmt: str) -> str:
        """The few-shot block's source and content hash (``fewshot``), else the format's version."""
        self.check_format(fmt)
        if fmt != "fewshot":
            return f"{self.name}:{fmt}/1"
        name, text = self.shots()
        return f"{self.name}:fewshot/1:{name}:sha256={hashlib.sha256(text.encode()).hexdigest()[:16]}"

    def max_new_tokens(self, fmt: str) -> int:
        self.check_format(fmt)
        return MAX_NEW_TOKENS

    def stop_strings(self, fmt: str) -> tuple[str, ...]:
        """OLMES's stop sequences: not a single line break, which a zero-shot answer may start with."""
        self.check_format(fmt)
        return self.stops

    def grade(self, q: Question, completion: str) -> Graded:
        return grade_short_answer(completion, q.aliases or (q.gold,))
