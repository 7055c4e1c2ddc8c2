"""One checkpoint's audit under the study's protocol, resumable, and the check that checkpoints are comparable.

    p = sample_protocol(model, task, questions, "native", samples=8, T=0.8, seed=0, settings=settings)
    records = sample_records(model, task, questions, "native", 8, 0.8, 0, RunStore(run / "native", p), chunk=20)
    check_comparable({"base": p_base, "grpo": p_grpo})      # ProtocolMismatch naming every differing field
    at_k = records_at(records, 4)                           # the first 4 samples: the K = 4 probe, exactly

Sample k of a question is seeded by (seed, question id, k) alone (``probes.sample``), so the first K of 2K
samples are exactly what a K-sample probe draws: one set of 2K samples gives the records at K and at 2K.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from reach_lens import cli, probes
from reach_lens.protocol import Protocol, canonical_json
from reach_lens.records import make_record
from reach_lens.select import majority_vote
from reach_lens.store import ProtocolMismatch, RunStore

STUDY = "rlvr_compare"
CHECKPOINT_FIELDS = ("model", "weights")  # what may differ between the checkpoints of one comparison


def sample_protocol(model: Any, task: Any, questions: Sequence[Any], fmt: str, samples: int, T: float, seed: int,
                    settings: Mapping[str, Any], source: str | None = None, split: str | None = None) -> Protocol:
    """Greedy answer plus ``samples`` samples at temperature ``T`` per question."""
    return Protocol.of(study=STUDY, model=model, task=task, questions=questions, fmt=fmt, probe="sample",
                       K=samples, temperature=T, seed=seed, source=source, split=split, settings=dict(settings))


def deploy_protocol(model: Any, task: Any, questions: Sequence[Any], fmt: str, seed: int,
                    settings: Mapping[str, Any], source: str | None = None, split: str | None = None) -> Protocol:
    """Greedy answers only (the format control's shared-format runs)."""
    return Protocol.of(study=STUDY, model=model, task=task, questions=questions, fmt=fmt, probe="deploy", seed=seed,
                       source=source, split=split, settings=dict(settings))


def mismatches(reference: Protocol, other: Protocol) -> list[str]:
    """'field: X vs Y' for every field but the checkpoint's that differs (settings key by key)."""
    lines = []
    for name, a, b in reference.diff(other, ignore=CHECKPOINT_FIELDS):
        if name in ("settings", "libraries"):
            for key in sorted(set(a) | set(b)):
                va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
                if canonical_json(va) != canonical_json(vb):
                    lines.append(f"{name}.{key}: {canonical_json(va)[:200]} vs {canonical_json(vb)[:200]}")
        else:
            lines.append(f"{name}: {canonical_json(a)[:200]} vs {canonical_json(b)[:200]}")
    return lines


def check_comparable(protocols: Mapping[str, Protocol], reference: str | None = None) -> None:
    """Refuse to compare checkpoints whose protocols differ in anything but the checkpoint (model, weights).

    ``protocols`` maps a checkpoint label to its protocol; each is compared with ``reference`` (default: the
    first). Raises ``ProtocolMismatch`` naming the checkpoints and every differing field.
    """
    if not protocols:
        raise ValueError("no protocols to compare")
    reference = reference if reference is not None else next(iter(protocols))
    ref = protocols[reference]
    problems = []
    for label, p in protocols.items():
        lines = mismatches(ref, p)
        if lines:
            problems.append(f"{label} vs {reference}:\n" + "\n".join(f"  {line}" for line in lines))
    if problems:
        raise ProtocolMismatch("checkpoints are compared only under one protocol (everything but model and weights "
                               "must match); refusing:\n" + "\n".join(problems))


def sample_records(model: Any, task: Any, questions: Sequence[Any], fmt: str, samples: int, T: float, seed: int,
                   store: RunStore, chunk: int, batch_size: int = 16, desc: str | None = None) -> pd.DataFrame:
    """Records (``records.make_record``) of the greedy answer and ``samples`` samples, computed only for the
    questions ``store`` lacks; returned in ``questions`` order."""

    def rows_of(part: list) -> list[dict]:
        deployed = probes.deploy(model, task, part, fmt, batch_size=batch_size)
        cands = probes.sample(model, task, part, fmt, K=samples, temperature=T, seed=seed, batch_size=batch_size)
        return [make_record(q.id, q.gold, d, c, majority_vote(c)) for q, d, c in zip(part, deployed, cands)]

    table = cli.resume(store, "records", questions, chunk, rows_of, desc=desc)
    return _in_order(table, questions)


def deploy_records(model: Any, task: Any, questions: Sequence[Any], fmt: str, store: RunStore, chunk: int,
                   batch_size: int = 16, desc: str | None = None) -> pd.DataFrame:
    """Greedy answers: question_id, gold, text, answer, d (correct); computed only where ``store`` lacks them."""

    def rows_of(part: list) -> list[dict]:
        outs = probes.deploy(model, task, part, fmt, batch_size=batch_size)
        return [{"question_id": q.id, "gold": q.gold, "text": o["text"], "answer": o["answer"], "d": bool(o["correct"])}
                for q, o in zip(part, outs)]

    table = cli.resume(store, "deployed", questions, chunk, rows_of, desc=desc)
    return _in_order(table, questions)


def _in_order(table: pd.DataFrame, questions: Sequence[Any]) -> pd.DataFrame:
    ids = [q.id for q in questions]
    missing = sorted(set(ids) - set(table["question_id"]))
    if missing:
        raise RuntimeError(f"{len(missing)} questions have no stored row (e.g. {missing[:5]})")
    return table.set_index("question_id").loc[ids].reset_index()


def records_at(records: pd.DataFrame, k: int) -> pd.DataFrame:
    """The records a k-sample probe gives: each question's first ``k`` candidates (re-voted, hits and o recounted)."""
    rows = []
    for r in records.itertuples(index=False):
        cands = list(r.candidates)
        if not 1 <= k <= len(cands):
            raise ValueError(f"k {k} out of range for question {r.question_id!r} with {len(cands)} candidates "
                             f"(1..{len(cands)})")
        cands = [dict(c) for c in cands[:k]]
        deployed = {"text": r.deployed_text, "answer": r.deployed_answer, "correct": bool(r.d)}
        rows.append(make_record(r.question_id, r.gold, deployed, cands, majority_vote(cands)))
    return pd.DataFrame(rows)
