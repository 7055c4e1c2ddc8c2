"""Training rows from task questions: GRPO prompts and SFT prompt/completion pairs, in the audit's own format.

The prompt text is ``task.prompt(q, fmt, tokenizer)``, exactly what the audit feeds the model (the chat
template already applied, so TRL tokenizes it as plain text, as ``reach_lens.models.encode`` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def gold_completion(task: Any, q: Any, fmt: str = "native") -> str:
    """The SFT target: ``"B. <option text>"`` for a multiple-choice question, else the gold answer itself, after
    a space where the prompt is plain text ending in ``"Answer:"`` (short answers in the shared and fewshot
    formats, as OLMES's shots write them)."""
    if task.kind == "mc":
        return f"{q.gold}. {q.options[q.gold_index]}"
    return f" {q.gold}" if task.kind == "short_answer" and fmt != "native" else str(q.gold)


def grpo_rows(task: Any, questions: Sequence[Any], tokenizer: Any, fmt: str = "native") -> list[dict]:
    """``{"prompt", "question_id"}`` per question: the reward looks the question up by id."""
    return [{"prompt": task.prompt(q, fmt, tokenizer), "question_id": str(q.id)} for q in questions]


def sft_rows(task: Any, questions: Sequence[Any], tokenizer: Any, fmt: str = "native") -> list[dict]:
    """``{"prompt", "completion", "question_id"}`` per question (loss on the completion only)."""
    return [{"prompt": task.prompt(q, fmt, tokenizer), "completion": gold_completion(task, q, fmt), "question_id": str(q.id)}
            for q in questions]


def as_dataset(rows: list[dict]):
    """A ``datasets.Dataset`` of ``rows`` (imported here: only training needs the package)."""
    from datasets import Dataset

    if not rows:
        raise ValueError("no training rows: the training split is empty")
    return Dataset.from_list(rows)
