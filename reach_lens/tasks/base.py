"""Shared types of every task: ``Question``, ``Graded`` and the ``Task`` interface with its loading logic.

A task loads questions from one source (a local file or directory in the dataset's original layout, a
saved ``datasets`` directory, a Hugging Face hub name, or the task's embedded default), renders prompts
in two formats, and grades completions:

- ``native``: the model's own chat template around an instruction;
- ``shared``: one plain base-model prompt, identical for every checkpoint.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from reach_lens.tasks import sources
from reach_lens.tasks.sources import Row


@dataclass(frozen=True)
class Question:
    """One question. ``gold`` is an option letter (MC), a normalized number (numeric), a reference answer (math)
    or the first gold alias (short answer). ``context`` is what the question is asked about (a reading passage,
    a Jeopardy category), ``aliases`` every accepted answer of a short-answer question."""

    id: str
    question: str
    gold: str
    options: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    context: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def gold_index(self) -> int:
        """Position of the gold option in ``options`` (multiple-choice questions only)."""
        if not self.labels:
            raise ValueError(f"question {self.id!r} has no options: gold_index is for multiple-choice questions")
        return self.labels.index(self.gold)


@dataclass(frozen=True)
class Graded:
    """A graded completion: ``answer`` is the extracted, normalized answer, or None if none could be extracted;
    ``f1`` is a partial-credit score where the grader has one (short answers: token F1), else None."""

    answer: str | None
    correct: bool
    f1: float | None = None

    @property
    def format_ok(self) -> bool:
        return self.answer is not None


class MalformedRow(ValueError):
    """A record that cannot become a ``Question``; the loader prefixes the file and line."""


class Task(ABC):
    """A benchmark: loading, prompt formats, generation limits and grading.

    Subclasses set ``name``, ``kind``, ``grader``, ``formats`` (the prompt formats; ``default_format`` is the one
    studies use unless told otherwise), ``default_split`` (used when no split is given and none can be read from
    a file name), ``hf_config`` (the hub config used when a hub source names none), and implement the methods
    below. ``grader`` names the grading rule and its version, ``"name/version"``
    (``"mc_letter/2"``, ``"number_final/2"``, ``"math_verify/0.9.0/2"``): it goes into every run's
    protocol so that records graded under different rules are never mixed. Bump its version whenever
    ``grade`` changes what it accepts. After ``load``, ``last_skipped`` holds the number of malformed rows
    skipped (``skip_malformed=True``; a warning also reports them).
    """

    name: str
    kind: Literal["mc", "numeric", "math", "short_answer"]
    grader: str
    formats: tuple[str, ...] = ("native", "shared")
    default_format: str = "native"
    default_split: str = "test"
    hf_config: str | None = None
    recognition_norm: str = "tokens"  # what probes.recognize's norm_loglik divides by: "tokens", or "chars" (acc_norm)

    def __init__(self) -> None:
        self.last_skipped = 0

    # ---- loading -------------------------------------------------------------------------------

    def load(
        self, source: str | Path | None = None, split: str | None = None, *, skip_malformed: bool = False
    ) -> list[Question]:
        """Questions of ``source`` (see the module docstring); ``split`` is ``"test"``, ``"validation"``, ... .

        A malformed row raises ``ValueError`` naming its file and line, or, with ``skip_malformed``, is
        skipped and counted in ``last_skipped``.
        """
        split = sources.canonical_split(split) if split is not None else None
        if source is None:
            split = split or self.default_split
            rows = self.default_rows(split)
        else:
            kind, value = sources.locate(source)
            if kind == "hub":
                name, _, config = str(value).partition(":")
                split = split or self.default_split
                rows = sources.hub_rows(name, config or self.hf_config, split)
            elif kind == "saved":
                split = split or sources.split_from_name(Path(value).name) or self.default_split
                rows = sources.saved_rows(Path(value), split)
            elif kind == "dir":
                split = split or self.default_split
                path = self.file_in_dir(Path(value), split)
                rows = self.file_rows(path)
            else:
                path = Path(value)
                split = split or sources.split_from_name(path.name) or self.default_split
                rows = self.file_rows(path)
        return self._parse_all(rows, split, skip_malformed, str(source))

    def _parse_all(self, rows: Iterable[Row], split: str, skip_malformed: bool, source: str) -> list[Question]:
        questions: list[Question] = []
        where_of: dict[str, str] = {}
        skipped: list[str] = []
        for row in rows:
            try:
                if row.error is not None:
                    raise MalformedRow(row.error)
                q = self.parse(row.data, split, row.index)
            except MalformedRow as err:
                message = f"{row.where}: {err}"
                if not skip_malformed:
                    raise ValueError(message) from None
                skipped.append(message)
                continue
            if q.id in where_of:
                raise ValueError(f"{row.where}: duplicate question id {q.id!r} (first seen at {where_of[q.id]})")
            where_of[q.id] = row.where
            questions.append(q)
        self.last_skipped = len(skipped)
        if skipped:
            warnings.warn(
                f"{self.name}: skipped {len(skipped)} malformed row(s) of {source}; first: {skipped[0]}",
                stacklevel=3,
            )
        return questions

    def default_rows(self, split: str) -> Iterator[Row]:
        """Rows of the embedded default data; tasks without one raise."""
        raise ValueError(
            f"task {self.name!r} has no embedded default data: pass a source (a local file in the original "
            "layout, a saved `datasets` directory, or a Hugging Face dataset name)"
        )

    def file_in_dir(self, directory: Path, split: str) -> Path:
        """The file of ``split`` inside a directory in the dataset's original layout (default ``{split}.jsonl``)."""
        return sources.first_file(directory, (f"{split}.jsonl",), split)

    def file_rows(self, path: Path) -> Iterator[Row]:
        """Rows of a local file in the dataset's original layout (default: JSON lines)."""
        return sources.jsonl_rows(path)

    @abstractmethod
    def parse(self, data: Any, split: str, index: int) -> Question:
        """One record (original layout or hub) -> ``Question``; ``index`` is its 1-based position.

        Raises ``MalformedRow`` with the reason (the loader adds file and line)."""

    # ---- prompts, generation, grading -----------------------------------------------------------

    @abstractmethod
    def prompt(self, q: Question, fmt: str, tokenizer: Any) -> str:
        """The prompt text for ``q`` in format ``fmt`` (``tokenizer`` is only used by ``native``)."""

    @abstractmethod
    def max_new_tokens(self, fmt: str) -> int:
        """Generation budget for format ``fmt``."""

    @abstractmethod
    def stop_strings(self, fmt: str) -> tuple[str, ...]:
        """Strings that end a completion (EOS is handled by the sampler)."""

    @abstractmethod
    def grade(self, q: Question, completion: str) -> Graded:
        """Extract the answer of ``completion`` and compare it with ``q.gold``."""

    def spec(self) -> dict:
        """What a protocol records of the task beyond its name and grader (``Protocol.task_spec``): for a task read
        from a user's file, the file's sha256 and the field mapping; for an lm-evaluation-harness task, its
        versions, filter and metric. Empty for the built-in tasks, whose code version fixes them."""
        return {}

    def prompt_spec(self, fmt: str) -> str | None:
        """What a protocol records of format ``fmt`` beyond its name: the few-shot block's source and hash where
        the format has one; None where the prompt is fixed by the code version alone."""
        self.check_format(fmt)
        return None

    def resolve_format(self, fmt: str, tokenizer: Any, zero_shot: bool = False) -> str:
        """``fmt``, or for ``"auto"`` the task's ``default_format``, with ``"native"`` replaced by ``"shared"`` for
        a tokenizer without a chat template (a base model). ``zero_shot``: the study pays the whole prompt again
        for every candidate (a layer route recomputes it from its first edit on; training generates and
        back-propagates every completion with its prompt), so ``auto`` picks the zero-shot ``"shared"`` text
        where the default is ``"fewshot"``."""
        if fmt != "auto":
            self.check_format(fmt)
            return fmt
        if self.default_format == "native" and getattr(tokenizer, "chat_template", None) is None:
            return "shared"
        if zero_shot and self.default_format == "fewshot":
            return "shared"
        return self.default_format

    def recognition_items(self, q: Question) -> tuple[str, list[str]]:
        """(context, continuations) for multiple-choice likelihood scoring; multiple-choice tasks only."""
        raise ValueError(f"task {self.name!r} is not multiple-choice: it has no recognition items")

    def check_format(self, fmt: str) -> None:
        if fmt not in self.formats:
            raise ValueError(f"unknown prompt format {fmt!r} for task {self.name!r}; valid: {list(self.formats)}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class ReasoningTask(Task):
    """A free-form task answered after a chain of thought: one prompt pair and one generation budget.

    Subclasses set ``native_instruction`` (appended to the question in the chat template),
    ``shared_instruction`` (in the plain prompt) and ``reasoning_max_new_tokens``.
    """

    native_instruction: str
    shared_instruction: str
    reasoning_max_new_tokens: int

    def prompt(self, q: Question, fmt: str, tokenizer: Any) -> str:
        self.check_format(fmt)
        if fmt == "native":
            return chat_prompt(tokenizer, f"{q.question}\n\n{self.native_instruction}")
        return f"Question: {q.question}\n{self.shared_instruction}\nAnswer: Let's think step by step."

    def max_new_tokens(self, fmt: str) -> int:
        self.check_format(fmt)
        return self.reasoning_max_new_tokens

    def stop_strings(self, fmt: str) -> tuple[str, ...]:
        self.check_format(fmt)
        return ("Question:", "\n\n\n") if fmt == "shared" else ()


def chat_prompt(tokenizer: Any, content: str) -> str:
    """``content`` as one user turn in the tokenizer's chat template, ready for the assistant's reply."""
    if tokenizer is None or getattr(tokenizer, "chat_template", "") is None:
        raise ValueError("the tokenizer has no chat template, so fmt='native' is unavailable: use fmt='shared'")
    try:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
    except ValueError as err:
        if "chat_template" in str(err) or "chat template" in str(err):
            raise ValueError(
                "the tokenizer has no chat template, so fmt='native' is unavailable: use fmt='shared'"
            ) from err
        raise
