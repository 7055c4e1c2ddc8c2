"""The one resumable run loop: compute what a run directory lacks, a chunk of questions at a time, and publish
what a study derives from its runs.

    loop = RunLoop(chunk=10, batch_size=16)                     # pool: this process, or Ray workers
    deployed = loop.deployed(model, task, questions, fmt, RunStore(run / "deployed", p_deploy))
    records = loop.records(RunStore(run / "T0.8", p_sample), questions, deployed, lambda part: probes.sample(
        model, task, part, fmt, K=8, temperature=0.8, seed=0, batch_size=loop.batch_size))
    rows = loop.resume(store, "router", questions, rows_of)     # any other table of rows keyed by question
    out = summary_dir(run, [p_deploy, p_sample], "summary-T0.8")
    publish(Path("figures"), {out / "reach.png": figure})

Every study stores its greedy answers the same way: a ``deployed`` table of ``{"question_id", **candidate}`` rows
(``records.candidate``: text, answer, correct, ...) under the greedy protocol, and each candidate probe (K samples
at a temperature, K routes) as a ``records`` table (``records.make_record``) that joins those greedy answers with
the probe's candidates and their majority vote. Every store whose rows are keyed by ``Question``s also gets a
``questions`` table (``QUESTION_COLUMNS``: what each question asked, and its prompt where the loop knows the
format, as in ``deployed``), written the first time the loop meets a question, so that a report of the run never
loads the task or the model again. This process is the one writer of every store: a killed run, or a killed
worker, loses at most the chunks in progress, and a rerun computes only what is missing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from reach_lens import probes
from reach_lens.generate import engine_for
from reach_lens.parallel import LocalPool
from reach_lens.records import make_record
from reach_lens.select import majority_vote
from reach_lens.store import RunStore
from reach_lens.tasks import Question

log = logging.getLogger(__name__)
QUESTIONS = "questions"  # the table of what each question asked
QUESTION_COLUMNS = ("question_id", "question", "context", "gold", "aliases", "options", "labels", "prompt")


def question_id(question: Any) -> str:
    return question.id


def question_rows(questions: Sequence[Question], prompt: Callable[[Question], str] | None = None) -> list[dict]:
    """``QUESTION_COLUMNS`` rows of ``questions``: id, text, context, gold, aliases, options and labels, and the
    prompt text ``prompt(q)`` gives (None without it)."""
    return [{"question_id": q.id, "question": q.question, "context": q.context, "gold": q.gold,
             "aliases": list(q.aliases), "options": list(q.options), "labels": list(q.labels),
             "prompt": None if prompt is None else prompt(q)} for q in questions]


class RunLoop:
    """How a study fills its run stores: ``chunk`` questions per stored part, computed in ``pool`` (default: this
    process; ``parallel.make_pool`` for Ray workers, whose chunk functions may close over models but not over
    stores or open files), ``batch_size`` rows per decode batch."""

    def __init__(self, chunk: int, batch_size: int = 16, pool: Any = None):
        if chunk < 1:
            raise ValueError(f"chunk {chunk} out of range: expected >= 1")
        self.chunk, self.batch_size, self.pool = chunk, batch_size, pool if pool is not None else LocalPool()

    def resume(self, store: RunStore, table: str, items: Sequence[Any], rows_of: Callable[[list], list[dict]],
               key: Callable[[Any], str] = question_id, column: str = "question_id",
               desc: str | None = None, prompt: Callable[[Question], str] | None = None) -> pd.DataFrame:
        """Compute ``rows_of(part)`` for the items whose ``key`` is not yet in ``store``'s ``table`` (its ``column``),
        appending each part as it is done; return the table's rows in ``items`` order (as an uninterrupted run in
        one process writes them, whatever order parts were resumed or finished in). Items that are ``Question``s
        the store's ``questions`` table lacks are added to it first (``question_rows``, with ``prompt``)."""
        if items and all(isinstance(item, Question) for item in items):
            known = store.done(QUESTIONS)
            store.append(QUESTIONS, question_rows([q for q in items if q.id not in known], prompt))
        done = store.done(table, key=column)
        todo = [item for item in items if key(item) not in done]
        log.debug("%s/%s: %d of %d done, %d to compute in chunks of %d", store.root, table, len(items) - len(todo),
                  len(items), len(todo), self.chunk)
        parts = [todo[start:start + self.chunk] for start in range(0, len(todo), self.chunk)]
        with tqdm(total=len(items), initial=len(items) - len(todo), desc=desc or table, unit="q") as bar:
            for index, rows in self.pool.map(rows_of, parts):
                store.append(table, rows)
                bar.update(len(parts[index]))
        rows = store.read(table, key=column)
        at = pd.Index(rows[column]).get_indexer([key(item) for item in items])
        if (at < 0).any():
            missing = [key(item) for item, i in zip(items, at) if i < 0]
            raise RuntimeError(f"{store.root}/{table}: {len(missing)} items have no stored row (e.g. {missing[:5]})")
        return rows.iloc[at].reset_index(drop=True)

    def deployed(self, model: Any, task: Any, questions: Sequence[Any], fmt: str, store: RunStore,
                 desc: str | None = None, max_new_tokens: int | None = None) -> pd.DataFrame:
        """The greedy answer of every question (``probes.deploy``; ``max_new_tokens`` None: the task's budget),
        ``{"question_id", **candidate}`` rows indexed by question id, and the questions with their prompts in ``fmt``.
        ``model``: a HookedTransformer or an engine."""
        tokenizer = engine_for(model).tokenizer
        return self.resume(store, "deployed", questions, lambda part: [
            {"question_id": q.id, **c} for q, c in zip(part, probes.deploy(
                model, task, part, fmt, batch_size=self.batch_size, max_new_tokens=max_new_tokens))],
            desc=desc or f"greedy answers ({task.name})",
            prompt=lambda q: task.prompt(q, fmt, tokenizer)).set_index("question_id")

    def records(self, store: RunStore, questions: Sequence[Any], deployed: pd.DataFrame,
                candidates_of: Callable[[list], list[list[dict]]], desc: str | None = None) -> pd.DataFrame:
        """One record per question (``records.make_record``): its greedy answer (a row of ``deployed``), the
        candidates ``candidates_of(part)`` gives for each question of a part, and their majority vote."""

        def rows_of(part: list) -> list[dict]:
            return [make_record(q.id, q.gold, deployed.loc[q.id].to_dict(), cs, majority_vote(cs))
                    for q, cs in zip(part, candidates_of(part))]

        return self.resume(store, "records", questions, rows_of, desc=desc)


def summary_dir(root: Path, protocols: Sequence[Any], name: str = "summary") -> Path:
    """The directory of the derived outputs (tables, figures) computed from the runs of ``protocols``:
    ``root/<name>-<12 hex>``, the hex a hash of their fingerprints, so outputs of other protocols (another
    temperature, K, action space, ...) never overwrite these. It holds ``protocols.json`` (the protocols)."""
    fingerprints = sorted({p.fingerprint() for p in protocols})
    path = Path(root) / f"{name}-{hashlib.sha256(' '.join(fingerprints).encode()).hexdigest()[:12]}"
    path.mkdir(parents=True, exist_ok=True)
    listing = sorted((p.to_dict() for p in protocols), key=lambda d: json.dumps(d, sort_keys=True))
    (path / "protocols.json").write_text(json.dumps(listing, indent=1, sort_keys=True) + "\n")
    return path


def publish(figures: Path, drawn: Mapping[Path, Any]) -> list[Path]:
    """Save each figure of ``drawn`` (``{path in a run's summary directory: matplotlib Figure}``) there and copy it
    into ``figures`` under the same name; returns the saved paths."""
    # imported here, so that matplotlib loads only where a figure is saved (it was drawn with it anyway)
    from reach_lens.plots import save

    figures.mkdir(parents=True, exist_ok=True)
    for path, fig in drawn.items():
        shutil.copyfile(save(fig, path), figures / Path(path).name)
    return list(drawn)
