"""lm-evaluation-harness tasks as reach_lens tasks: lm-eval reads the task, renders its prompts and grades.

    task = lm_eval_task("my_tasks/gsm8k_local.yaml")        # a YAML file: its directory is the include path
    task = lm_eval_task("gsm8k_local", include_path="my_tasks", filter_name="flexible-extract")
    task = lm_eval_task("arc_easy")                         # a built-in task by name: only where its data is local
    questions = task.load()                                 # the evaluation docs: test split, else validation

The task is read by lm-eval's own ``TaskManager`` (``include_defaults=False`` with an include path: instant; a bare
built-in name scans lm-eval's ~15k YAMLs once, ~6 s). Its data must be local: ``dataset_path: json`` (or
``parquet``, ...) with ``dataset_kwargs: {data_files: ...}``, or a YAML that ``include:``s a built-in one by its
absolute path and overrides the data. Needs the extra: ``pip install -e ".[lm-eval]"`` (lm-eval 0.4.13).

**Questions**: one per document of the split (``"test"`` if the task has one, else ``"validation"``; ``load(split=)``
picks another of the YAML's splits), in lm-eval's order. Id: 16 hex of the sha256 of the document's canonical JSON
(sorted keys), stable across loads and machines; a document repeated verbatim gets ``-2``, ``-3``, ... .
``question`` is the document's ``doc_to_text``; ``gold`` its target (multiple choice: the gold letter, with
``options`` from ``doc_to_choice``). The documents are kept: prompts and grading read them, not the ``Question``.

**Generation tasks** (``output_type: generate_until``; kind ``short_answer``): formats

- ``fewshot``: lm-eval's default prompt, ``fewshot_context(doc, num_fewshot)`` without a chat template, as
  ``simple_evaluate`` builds it (the default format when ``num_fewshot > 0``);
- ``shared``: the same zero-shot (the default when ``num_fewshot`` is 0);
- ``native``: lm-eval's chat path, ``simple_evaluate(apply_chat_template=True)``: the tokenizer's chat template over
  the shots as turns (``fewshot_as_multiturn``, simple_evaluate's default), rendered as Hugging Face ``HFLM`` does.

Shots are drawn as lm-eval draws them: its sampler seeded with ``fewshot_seed`` (simple_evaluate's 1234) advances
document by document through the split in order, so document i gets the shots lm-eval gives document i whichever
questions are asked. Stop strings are ``generation_kwargs.until``; the budget is ``max_gen_toks`` (256 where unset,
HFLM's default). ``grade`` runs ONE filter pipeline of the task on the completion (``filter_name``; default the
first) and ``process_results``, and reads ONE metric (``metric``; default the first): ``correct`` is that metric
being 1, ``answer`` the filtered response, or None where the filter fell back (``"[invalid]"``) or left nothing.

**Multiple-choice tasks** (``output_type: multiple_choice``; kind ``mc``): ``recognition_items`` gives lm-eval's
context (with its shots) and continuations (``target_delimiter`` + each choice), with trailing whitespace of the
context moved into the continuations as HFLM's ``_encode_pair`` moves it; ``probes.recognize(..., norm="chars")``
then gives lm-eval's choice under ``acc`` (``pred_sum``) and ``acc_norm`` (``pred_norm``), the metric named
(``metric``: ``acc`` or ``acc_norm``; ``prediction_key`` says which). Generation uses a lettered zero-shot prompt
built from the same choices (the text of ``doc_to_text`` without its final ``"Answer:"``, then ``A. ...`` lines) and
the ``mc_letter`` grader (``reach_lens.tasks.mc``); where the choices are the letters themselves (MMLU's
``["A", "B", "C", "D"]``) the text already lists the options and is used as it is.

**Protocol**: ``grader`` is ``lm-eval/<task>/<filter>/<metric>/<ADAPTER_VERSION>`` (multiple choice:
``lm-eval/<task>/mc_letter/2/<ADAPTER_VERSION>``); ``spec()`` holds lm-eval's version, the task's name, version and
output type, the filter, the metric, num_fewshot, the few-shot seed, the sha256 of the task's YAML (with every YAML it
includes and every local module its ``!function`` tags name) and of each local data file; ``prompt_spec(fmt)`` the
format's source, shots and seed.

Not supported (refused with the reason): groups and tags, ``loglikelihood`` tasks, multiple-input tasks (Winogrande),
``acc_mutual_info`` / ``acc_bytes``, documents with several gold choices, and ``acc_norm`` where a continuation is not
``" " + choice`` (``recognize``'s divisor would differ from lm-eval's ``len(choice)``). A task's ``do_sample`` is not
followed: ``deploy`` is greedy and ``sample`` samples at the temperature it is given.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from abc import abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from reach_lens.errors import UserError
from reach_lens.tasks import sources
from reach_lens.tasks.base import Graded, MalformedRow, Question, Task, chat_prompt
from reach_lens.tasks.mc import GRADER as MC_GRADER
from reach_lens.tasks.mc import LETTERS, NATIVE_INSTRUCTION, MCTask, options_block
from reach_lens.tasks.short_answer import unique_aliases
from reach_lens.tasks.sources import Row

ADAPTER_VERSION = 1  # bump whenever questions, prompts or verdicts of the same lm-eval task change
DEFAULT_FEWSHOT_SEED = 1234  # simple_evaluate's fewshot_random_seed
DEFAULT_MAX_GEN_TOKS = 256  # HFLM's max_gen_toks where a task's generation_kwargs set none
INSTALL = 'pip install -e ".[lm-eval]"'
RECOGNITION_METRICS = {"acc": "pred_sum", "acc_norm": "pred_norm"}  # metric -> probes.recognize's key
SPLITS = ("test", "validation", "train")
_ANSWER_CUE = re.compile(r"\s*\bAnswer\s*:\s*$")
_FUNCTION_TAG = re.compile(r"!function\s+([\w.]+)\.\w+")


class LMEvalError(UserError, ValueError):
    """An lm-eval task that cannot be read or used as asked; the message says what to change."""


class LMEvalUnavailable(UserError, ImportError):
    """lm-evaluation-harness is not installed."""


def _lm_eval():
    try:
        import lm_eval
        import lm_eval.tasks  # TaskManager's package: the import that fails without lm-eval's dependencies
    except ImportError as error:
        raise LMEvalUnavailable(f"lm-eval tasks need lm-evaluation-harness: {INSTALL} (lm-eval==0.4.13)") from error
    return lm_eval


def lm_eval_task(name_or_yaml: str | Path, *, include_path: str | Path | Sequence[str | Path] | None = None,
                 filter_name: str | None = None, metric: str | None = None, num_fewshot: int | None = None,
                 fewshot_seed: int = DEFAULT_FEWSHOT_SEED) -> Task:
    """The lm-eval task ``name_or_yaml`` as a reach_lens ``Task`` (module docstring).

    ``name_or_yaml``: a ``.yaml``/``.yml`` file (its directory is the include path, its ``task:`` is loaded), or a
    task name, found in ``include_path`` (directories of YAMLs) or, without one, among lm-eval's built-in tasks.
    ``filter_name`` / ``metric``: the filter pipeline and metric whose verdict counts (default: the task's first
    of each; multiple choice has no filter and takes ``acc`` or ``acc_norm``). ``num_fewshot``: as
    ``simple_evaluate``'s (overrides the YAML's, except a YAML's explicit 0, which lm-eval never overrides: asking
    for shots then is refused). ``fewshot_seed``: as ``simple_evaluate``'s ``fewshot_random_seed``."""
    lm_eval = _lm_eval()
    from lm_eval.api.task import ConfigurableTask

    if isinstance(fewshot_seed, bool) or not isinstance(fewshot_seed, int):
        raise LMEvalError(f"fewshot_seed {fewshot_seed!r} must be an int (simple_evaluate's default is "
                          f"{DEFAULT_FEWSHOT_SEED})")
    manager, name, yaml_path = _locate(str(name_or_yaml), include_path)
    try:
        loaded = manager.load([name])["tasks"]
    except OSError as error:  # the hub (offline: ConnectionError), a missing data file
        raise LMEvalError(
            f"lm-eval task {name!r} could not load its data: {error}. Its data must be local: a YAML with "
            "dataset_path: json and dataset_kwargs: {data_files: {test: /path/to/file.jsonl}} (or one that "
            "includes the task's YAML and overrides those keys; docs/tasks.md)") from error
    if len(loaded) != 1 or not isinstance(next(iter(loaded.values())), ConfigurableTask):
        raise LMEvalError(f"lm-eval {name!r} is not one YAML task (it gave {sorted(loaded)}): name one task")
    lm_task = next(iter(loaded.values()))
    shots = _set_num_fewshot(lm_task, num_fewshot)
    output_type = lm_task.get_config("output_type")
    common = {"lm_task": lm_task, "lm_eval_version": lm_eval.__version__, "yaml_path": yaml_path,
              "num_fewshot": shots, "fewshot_seed": fewshot_seed}
    if output_type == "generate_until":
        return LMEvalGenerationTask(**common, filter_name=filter_name, metric=metric)
    if output_type == "multiple_choice":
        if filter_name is not None:
            raise LMEvalError(f"multiple-choice lm-eval task {name!r} has no filter to choose (got filter_name="
                              f"{filter_name!r}): its verdict is the options' likelihood (metric acc or acc_norm)")
        return LMEvalMCTask(**common, metric=metric)
    raise LMEvalError(f"lm-eval task {name!r} has output_type {output_type!r}: expected generate_until or "
                      "multiple_choice (reach_lens grades answers, not perplexities)")


# ---- finding and loading the task ----------------------------------------------------------------


@lru_cache(maxsize=1)
def _builtin_manager():
    from lm_eval.tasks import TaskManager

    return TaskManager()


def _locate(spec: str, include_path) -> tuple[Any, str, Path]:
    """(TaskManager, task name, the task's YAML file) for a YAML path or a task name."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._index import Kind

    paths = [include_path] if isinstance(include_path, (str, Path)) else list(include_path or [])
    for p in paths:
        if not Path(p).expanduser().is_dir():
            raise LMEvalError(f"include_path {str(p)!r} is not a directory (expected a directory of task YAMLs)")
    yaml_file = Path(spec).expanduser()
    if yaml_file.suffix in (".yaml", ".yml"):
        if not yaml_file.is_file():
            raise LMEvalError(f"lm-eval task file {spec!r} does not exist")
        yaml_file = yaml_file.resolve()
        manager = TaskManager(include_defaults=False, include_path=[yaml_file.parent, *paths])
        found = [e for e in manager.task_index.values() if e.yaml_path is not None and
                 Path(e.yaml_path).resolve() == yaml_file and e.kind in (Kind.TASK, Kind.GROUP)]
        if not found:
            raise LMEvalError(f"lm-eval read no task from {spec!r} (a YAML with a 'task:' name; one with a syntax "
                              "error or a missing include is skipped by lm-eval's index)")
        name = found[0].name
    elif paths:
        manager = TaskManager(include_defaults=False, include_path=paths)
        name = spec
    else:
        manager, name = _builtin_manager(), spec
    entry = manager.task_index.get(name)
    if entry is None:
        known = manager.all_subtasks
        where = f"in {', '.join(str(p) for p in paths)}" if paths else "among lm-eval's built-in tasks"
        hint = (f"; tasks there: {', '.join(known)}" if paths and len(known) <= 40 else
                f"; closest: {', '.join(difflib.get_close_matches(name, known, n=5, cutoff=0.5)) or 'none'}")
        raise LMEvalError(f"no lm-eval task {name!r} {where}{hint}")
    if entry.kind in (Kind.GROUP, Kind.TAG):
        raise LMEvalError(f"lm-eval {name!r} is a {entry.kind.name.lower()} of tasks, not a task: name one of them")
    if entry.kind != Kind.TASK:
        raise LMEvalError(f"lm-eval task {name!r} is a Python class ({entry.kind.name}): only YAML tasks are supported")
    return manager, name, Path(entry.yaml_path)


def _set_num_fewshot(lm_task, num_fewshot: int | None) -> int:
    """Apply ``num_fewshot`` as ``simple_evaluate`` does; the number of shots each prompt gets."""
    configured = lm_task.get_config("num_fewshot")
    if num_fewshot is not None:
        if not isinstance(num_fewshot, int) or num_fewshot < 0:
            raise LMEvalError(f"num_fewshot {num_fewshot!r} must be an int >= 0")
        if configured == 0 and num_fewshot != 0:
            raise LMEvalError(f"lm-eval task {lm_task.config.task!r} sets num_fewshot: 0 in its YAML, which lm-eval "
                              f"never overrides (simple_evaluate ignores num_fewshot={num_fewshot} for it): edit the "
                              "YAML to change it")
        lm_task.set_config(key="num_fewshot", value=num_fewshot)
    elif configured is None:
        lm_task.set_config(key="num_fewshot", value=0)
    return lm_task.get_config("num_fewshot")


# ---- what a protocol pins: hashes of the YAML chain and the data -------------------------------------


class _TagLoader(yaml.SafeLoader):
    """Reads lm-eval YAMLs without resolving ``!function`` tags (kept as text)."""


_TagLoader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))


def yaml_sha256(path: Path) -> str:
    """sha256 over the YAML's bytes, then (depth first, as lm-eval resolves them) each YAML it includes and each
    local module one of its ``!function`` tags names (``utils.process_docs`` -> ``utils.py`` beside it)."""
    digest = hashlib.sha256()

    def visit(p: Path, seen: tuple[Path, ...]) -> None:
        p = p.expanduser().resolve()
        if p in seen:
            raise LMEvalError(f"include cycle at {p}")
        text = p.read_bytes()
        digest.update(text)
        for module in dict.fromkeys(_FUNCTION_TAG.findall(text.decode("utf-8", "replace"))):
            local = p.parent / f"{module.replace('.', '/')}.py"
            if local.is_file():
                digest.update(local.read_bytes())
        cfg = yaml.load(text, Loader=_TagLoader)  # a SafeLoader subclass
        includes = cfg.get("include", []) if isinstance(cfg, dict) else []
        for inc in includes if isinstance(includes, list) else [includes]:
            visit(Path(inc) if Path(inc).is_absolute() else p.parent / inc, (*seen, p))

    visit(path, ())
    return digest.hexdigest()


def data_sha256(config) -> dict[str, dict[str, str]]:
    """{split or "dataset_path": {file name: sha256}} of the task's local data files (hub data has none)."""
    out: dict[str, dict[str, str]] = {}
    files = (config.dataset_kwargs or {}).get("data_files")
    groups = files if isinstance(files, dict) else {} if files is None else {"data_files": files}
    for split, value in groups.items():
        paths = [Path(v).expanduser() for v in (value if isinstance(value, (list, tuple)) else [value])]
        local = {p.name: sources.sha256_file(p) for p in paths if p.is_file()}
        if local:
            out[str(split)] = local
    root = Path(str(config.dataset_path)).expanduser() if config.dataset_path else None
    if root is not None and root.exists():
        members = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        out["dataset_path"] = {str(p.relative_to(root)) if p != root else p.name: sources.sha256_file(p)
                               for p in members}
    return out


def doc_hash(doc: Any) -> str:
    """16 hex of the sha256 of a document's canonical JSON (sorted keys; other types by ``str``)."""
    text = json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---- the tasks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Doc:
    qid: str
    position: int  # 0-based, in the split's documents: where lm-eval's few-shot sampler is for it
    doc: dict


def hf_chat_renderer(tokenizer) -> Callable[..., str]:
    """``HFLM.apply_chat_template`` for ``tokenizer``: what lm-eval's chat path renders messages with."""
    import jinja2

    def render(messages: list[dict], add_generation_prompt: bool = True) -> str:
        def apply(chat):
            return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                 continue_final_message=not add_generation_prompt)
        try:
            return apply(messages)
        except jinja2.exceptions.TemplateError:  # as HFLM: retry without the system turn
            return apply([m for m in messages if m["role"] != "system"])

    return render


class LMEvalTask(Task):
    """What both kinds share: the lm-eval task object, its documents by question id, loading, contexts, spec."""

    default_split: str

    def __init__(self, *, lm_task, lm_eval_version: str, yaml_path: Path, num_fewshot: int, fewshot_seed: int,
                 metric: str | None, filter_name: str | None) -> None:
        super().__init__()
        self.lm_task = lm_task
        self.task_name = lm_task.config.task
        self.name = f"lm-eval-{self.task_name}"  # a file-name-safe name for run directories and tables
        self.num_fewshot = num_fewshot
        self.fewshot_seed = fewshot_seed
        self.filter_name = filter_name
        self.metric = metric
        self.default_split = "test" if lm_task.has_test_docs() else "validation"
        self._docs: dict[str, tuple[str, _Doc]] = {}
        self._contexts: dict[tuple, list[str]] = {}
        self._spec = {
            "kind": "lm-eval", "adapter": ADAPTER_VERSION, "lm_eval": lm_eval_version, "task": self.task_name,
            "task_version": lm_task.VERSION, "output_type": lm_task.get_config("output_type"),
            "filter": filter_name, "metric": metric, "num_fewshot": num_fewshot, "fewshot_seed": fewshot_seed,
            "yaml": yaml_path.name, "yaml_sha256": yaml_sha256(yaml_path), "data_sha256": data_sha256(lm_task.config),
        }

    # ---- loading -------------------------------------------------------------------------------

    def load(self, source=None, split=None, *, skip_malformed: bool = False) -> list[Question]:
        """The documents of ``split`` (default: ``default_split``) as questions; the YAML names the data, so
        ``source`` must be None."""
        if source is not None:
            raise LMEvalError(f"{self.name} reads its documents from its YAML's dataset_path/dataset_kwargs, not from "
                              f"a source (got {str(source)!r}): point the YAML's data_files at the file instead")
        return super().load(None, split, skip_malformed=skip_malformed)

    def split_docs(self, split: str) -> list[dict]:
        """The task's documents of ``split`` (``"test"``, ``"validation"`` or ``"train"``: the YAML's splits of those
        roles), in lm-eval's order, after its ``process_docs``."""
        split = sources.canonical_split(split)
        if split not in SPLITS or not self._has_split(split):
            have = [s for s in SPLITS if self._has_split(s)]
            raise LMEvalError(f"lm-eval task {self.task_name!r} has no {split!r} split; it has {have}")
        docs = {"test": self.lm_task.test_docs, "validation": self.lm_task.validation_docs,
                "train": self.lm_task.training_docs}[split]()
        return list(docs)

    def default_rows(self, split: str) -> Iterator[Row]:
        seen: Counter[str] = Counter()
        for i, doc in enumerate(self.split_docs(split)):
            h = doc_hash(doc)
            seen[h] += 1
            qid = h if seen[h] == 1 else f"{h}-{seen[h]}"
            yield Row(f"lm-eval task {self.task_name} ({split}), document {i}", i + 1, _Doc(qid, i, dict(doc)))

    def parse(self, data: _Doc, split: str, index: int) -> Question:
        text = self.lm_task.doc_to_text(data.doc)
        if not isinstance(text, str) or not text.strip():
            raise MalformedRow(f"doc_to_text gave {text!r}: expected a non-empty text")
        q = self.make_question(data, text)
        self._docs[q.id] = (split, data)
        return q

    @abstractmethod
    def make_question(self, data: _Doc, text: str) -> Question:
        """The question of one document whose ``doc_to_text`` is ``text``; raises ``MalformedRow``."""

    def doc(self, q: Question) -> dict:
        """The lm-eval document of ``q``."""
        return self._entry(q)[1].doc

    def _entry(self, q: Question) -> tuple[str, _Doc]:
        """(split, document) of ``q``: from ``load``, else (a question loaded by another object of the task, or
        read back from records) found by id among every split's documents."""
        if q.id not in self._docs:
            for split in SPLITS:
                if q.id not in self._docs and self._has_split(split):
                    self._docs.update((row.data.qid, (split, row.data)) for row in self.default_rows(split))
        if q.id not in self._docs:
            raise ValueError(f"question {q.id!r} is not a document of {self.name} (no split of it has that id)")
        return self._docs[q.id]

    def _has_split(self, split: str) -> bool:
        return {"test": self.lm_task.has_test_docs, "validation": self.lm_task.has_validation_docs,
                "train": self.lm_task.has_training_docs}[split]()

    # ---- lm-eval's contexts --------------------------------------------------------------------

    def context(self, q: Question, num_fewshot: int, tokenizer: Any = None) -> str:
        """lm-eval's ``fewshot_context`` of ``q``'s document with ``num_fewshot`` shots: plain text, or with a
        ``tokenizer`` through its chat template (HFLM's rendering, the shots as turns)."""
        split, entry = self._entry(q)
        template = None
        if tokenizer is not None:
            template = getattr(tokenizer, "chat_template", None)
            if template is None:
                raise ValueError("the tokenizer has no chat template, so fmt='native' is unavailable: use fmt='shared'")
        chat = None if tokenizer is None else hf_chat_renderer(tokenizer)
        if num_fewshot == 0:
            return self._render(entry.doc, 0, chat)
        key = (split, num_fewshot, template)
        if key not in self._contexts:  # replay the sampler over the whole split, as build_all_requests does
            self.lm_task.set_fewshot_seed(seed=self.fewshot_seed)
            self._contexts[key] = [self._render(doc, num_fewshot, chat) for doc in self.split_docs(split)]
        return self._contexts[key][entry.position]

    def _render(self, doc: dict, num_fewshot: int, chat: Callable[..., str] | None) -> str:
        context = self.lm_task.fewshot_context(doc, num_fewshot=num_fewshot, apply_chat_template=chat is not None,
                                               fewshot_as_multiturn=True, chat_template=chat,
                                               gen_prefix=self.lm_task.doc_to_prefix(doc))
        if not isinstance(context, str):
            raise LMEvalError(f"lm-eval task {self.task_name!r} gives several contexts per document (a multiple-input "
                              "task): not supported")
        return context

    def spec(self) -> dict:
        return dict(self._spec)


class LMEvalGenerationTask(LMEvalTask):
    """An lm-eval ``generate_until`` task: lm-eval's prompts, stops, budget, filter and metric."""

    kind = "short_answer"

    def __init__(self, *, filter_name: str | None, metric: str | None, **common) -> None:
        lm_task = common["lm_task"]
        filters = {f.name: f for f in lm_task._filters}  # the FilterEnsembles lm-eval applies (apply_filters)
        metrics = list(lm_task.aggregation())
        filter_name = _choose("filter", filter_name, list(filters), lm_task.config.task)
        metric = _choose("metric", metric, metrics, lm_task.config.task)
        super().__init__(filter_name=filter_name, metric=metric, **common)
        self.filter_ensemble = filters[filter_name]
        self.formats = ("native", "shared", "fewshot") if self.num_fewshot > 0 else ("native", "shared")
        self.default_format = "fewshot" if self.num_fewshot > 0 else "shared"
        self.grader = f"lm-eval/{self.task_name}/{filter_name}/{metric}/{ADAPTER_VERSION}"
        from lm_eval.models.utils import normalize_gen_kwargs

        kwargs = normalize_gen_kwargs(lm_task.get_config("generation_kwargs") or {}, DEFAULT_MAX_GEN_TOKS)
        self._stops = tuple(s for s in kwargs["until"] if s)
        self._budget = int(kwargs["max_gen_toks"])

    def make_question(self, data: _Doc, text: str) -> Question:
        target = self.lm_task.doc_to_target(data.doc)
        if self.lm_task.config.doc_to_choice is not None and isinstance(target, int):
            target = self.lm_task.doc_to_choice(data.doc)[target]
        golds = unique_aliases([str(t) for t in target] if isinstance(target, list) else [str(target)])
        if not golds:
            raise MalformedRow(f"doc_to_target gave {target!r}: expected a non-empty target")
        return Question(data.qid, text, golds[0], aliases=golds)

    def prompt(self, q: Question, fmt: str, tokenizer: Any) -> str:
        self.check_format(fmt)
        if fmt == "native":
            if tokenizer is None:
                raise ValueError("fmt='native' needs the model's tokenizer (its chat template): got None")
            return self.context(q, self.num_fewshot, tokenizer)
        return self.context(q, self.num_fewshot if fmt == "fewshot" else 0)

    def prompt_spec(self, fmt: str) -> str:
        self.check_format(fmt)
        shots = 0 if fmt == "shared" else self.num_fewshot
        chat = ":chat_template:fewshot_as_multiturn" if fmt == "native" else ""
        return f"lm-eval/{ADAPTER_VERSION}:{self.task_name}:{fmt}:num_fewshot={shots}:seed={self.fewshot_seed}{chat}"

    def max_new_tokens(self, fmt: str) -> int:
        self.check_format(fmt)
        return self._budget

    def stop_strings(self, fmt: str) -> tuple[str, ...]:
        self.check_format(fmt)
        return self._stops

    def filtered(self, q: Question, completion: str) -> Any:
        """The chosen filter pipeline's output for ``completion`` (lm-eval's ``filtered_resps`` of one response)."""
        return self._filter(self.doc(q), completion)[0]

    def _filter(self, doc: dict, completion: str) -> tuple[Any, list]:
        resps, fallbacks = [[completion]], []
        for make in self.filter_ensemble.filters:  # FilterEnsemble.apply, for one instance
            step = make()
            fallbacks.append(getattr(step, "fallback", None))
            resps = list(step.apply(resps, [doc]))
        return resps[0], fallbacks

    def grade(self, q: Question, completion: str) -> Graded:
        doc = self.doc(q)
        resp, fallbacks = self._filter(doc, completion)
        value = self.lm_task.process_results(doc, [resp])[self.metric]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LMEvalError(f"metric {self.metric!r} of lm-eval task {self.task_name!r} gives {value!r} per "
                              "document, not a 0/1 score: choose another metric")
        found = isinstance(resp, str) and resp.strip() != "" and resp not in fallbacks
        return Graded(resp if found else None, float(value) == 1.0)


class LMEvalMCTask(LMEvalTask, MCTask):
    """An lm-eval ``multiple_choice`` task: lm-eval's likelihood items, lettered generation graded by ``mc_letter``."""

    kind = "mc"
    recognition_norm = "chars"  # what probes.recognize divides by: lm-eval's acc_norm

    def __init__(self, *, metric: str | None, **common) -> None:
        lm_task = common["lm_task"]
        name = lm_task.config.task
        if lm_task.multiple_input:
            raise LMEvalError(f"lm-eval task {name!r} puts its choices in the context (a multiple-input task, as "
                              "Winogrande): recognition scores one context with several continuations")
        metrics = list(lm_task.aggregation())
        supported = [m for m in metrics if m in RECOGNITION_METRICS]
        if not supported:
            raise LMEvalError(f"lm-eval task {name!r} has the metrics {metrics}: reach_lens reproduces "
                              f"{list(RECOGNITION_METRICS)} only")
        metric = _choose("metric", metric, supported, name)
        super().__init__(filter_name=None, metric=metric, **common)
        self.prediction_key = RECOGNITION_METRICS[metric]  # the key of probes.recognize's rows lm-eval's choice is
        self.grader = f"lm-eval/{self.task_name}/{MC_GRADER}/{ADAPTER_VERSION}"

    def choices(self, q: Question) -> list[str]:
        """lm-eval's ``doc_to_choice`` of ``q``'s document (the raw choice texts)."""
        return list(self.lm_task.doc_to_choice(self.doc(q)))

    def make_question(self, data: _Doc, text: str) -> Question:
        choices = self.lm_task.doc_to_choice(data.doc)
        if not isinstance(choices, list) or not 2 <= len(choices) <= len(LETTERS):
            raise MalformedRow(f"doc_to_choice gave {choices!r}: expected a list of 2..{len(LETTERS)} choices")
        if not all(isinstance(c, str) and c.strip() for c in choices):
            raise MalformedRow(f"doc_to_choice gave {choices!r}: every choice must be a non-empty text")
        target = self.lm_task.doc_to_target(data.doc)
        if isinstance(target, str) and target in choices:
            target = choices.index(target)
        if isinstance(target, bool) or not isinstance(target, int) or not 0 <= target < len(choices):
            raise MalformedRow(f"doc_to_target gave {target!r}: expected one choice (an index 0..{len(choices) - 1} "
                               "or a choice's text)")
        labels = tuple(LETTERS[: len(choices)])
        return Question(data.qid, text, labels[target], tuple(c.strip() for c in choices), labels)

    def recognition_items(self, q: Question) -> tuple[str, list[str]]:
        """lm-eval's context (with its shots) and continuations (``target_delimiter`` + choice), the context's
        trailing whitespace moved into the continuations (HFLM's ``_encode_pair``).

        Under ``acc_norm``, a continuation must be ``" " + choice``: ``probes.recognize``'s ``norm="chars"`` divides
        by the continuation's length less one leading space, lm-eval by ``len(choice)``; other continuations (a
        ``target_delimiter`` of ``""`` or ``"\\n"``, a choice with leading whitespace) raise rather than differ."""
        context = self.context(q, self.num_fewshot)
        stripped = context.rstrip()
        moved = context[len(stripped):]
        delimiter = self.lm_task.config.target_delimiter
        choices = self.choices(q)
        continuations = [f"{moved}{delimiter}{c}" for c in choices]
        if self.metric == "acc_norm" and any(x.removeprefix(" ") != c for x, c in zip(continuations, choices)):
            raise LMEvalError(f"question {q.id!r} of {self.name}: its continuations {continuations!r} are not ' ' + "
                              "choice, so probes.recognize's chars norm would not divide by lm-eval's len(choice): "
                              "acc_norm is not reproduced for this task (metric='acc' is)")
        return stripped, continuations

    def prompt(self, q: Question, fmt: str, tokenizer: Any) -> str:
        self.check_format(fmt)
        stem = _ANSWER_CUE.sub("", q.question) or q.question
        listed = q.options == q.labels  # MMLU-style: the text lists the options, the choices are the letters
        if fmt == "native":
            body = stem if listed else f"{stem}\n\n{options_block(q)}"
            return chat_prompt(tokenizer, f"{body}\n\n{NATIVE_INSTRUCTION}")
        return q.question if listed else f"{stem}\n{options_block(q)}\nAnswer:"

    def prompt_spec(self, fmt: str) -> str:
        self.check_format(fmt)
        return f"lm-eval/{ADAPTER_VERSION}:{self.task_name}:{fmt}:lettered"


def _choose(what: str, value: str | None, valid: list[str], task: str) -> str:
    if not valid:
        raise LMEvalError(f"lm-eval task {task!r} has no {what}")
    if value is None:
        return valid[0]
    if value not in valid:
        raise LMEvalError(f"lm-eval task {task!r} has no {what} {value!r}; valid: {', '.join(valid)}")
    return value


__all__ = ["ADAPTER_VERSION", "DEFAULT_FEWSHOT_SEED", "LMEvalError", "LMEvalGenerationTask", "LMEvalMCTask",
           "LMEvalTask", "LMEvalUnavailable", "lm_eval_task"]
