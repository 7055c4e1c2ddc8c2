"""One checkpoint's audit under the study's protocol, and the check that checkpoints are comparable.

    ps = audit_protocols(engine, task, questions, "shared", "fewshot", samples=8, T=0.8, seed=0, settings=settings)
    check_comparable({"base": ps_base["sampled"], "grpo": ps["sampled"]})  # ProtocolMismatch naming every field
    records, control = audit_checkpoint(loop, engine, task, questions, ps, run / "grpo", "grpo")
    at_k = records_at(records, 4)                           # the first 4 samples: the K = 4 probe, exactly

Sample k of a question is seeded by (seed, question id, k) alone (``probes.sample``), so the first K of 2K
samples are exactly what a K-sample probe draws: one set of 2K samples gives the records at K and at 2K.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from reach_lens import probes
from reach_lens.generate import engine_for
from reach_lens.protocol import Protocol, canonical_json
from reach_lens.records import make_record
from reach_lens.runs import RunLoop
from reach_lens.select import majority_vote
from reach_lens.store import ProtocolMismatch, RunStore

STUDY = "rlvr_compare"
CHECKPOINT_FIELDS = ("model", "weights")  # what may differ between the checkpoints of one comparison


def audit_protocols(engine: Any, task: Any, questions: Sequence[Any], fmt: str, control_fmt: str, samples: int,
                    T: float, seed: int, settings: Mapping[str, Any], source: str | None = None,
                    split: str | None = None) -> dict[str, Protocol]:
    """The three runs of one checkpoint's audit: ``deployed`` (greedy answers in ``fmt``), ``sampled`` (``samples``
    samples at temperature ``T`` in ``fmt``) and ``control`` (greedy answers in ``control_fmt``, for the
    format-transfer table). ``engine``: a HookedTransformer or an engine."""
    facts = engine_for(engine).describe()

    def greedy(fmt: str) -> Protocol:
        return Protocol.of(study=STUDY, facts=facts, task=task, questions=questions, fmt=fmt, probe="deploy", seed=seed,
                           source=source, split=split, settings=dict(settings))

    deployed = greedy(fmt)
    return {"deployed": deployed, "sampled": deployed.replace(probe="sample", K=samples, temperature=T),
            "control": greedy(control_fmt)}


def control_format(fmt: str, task: Any) -> str:
    """The default format of the format-transfer table: plain text the trained format ``fmt`` is not."""
    if fmt != "shared":
        return "shared"
    return "fewshot" if "fewshot" in task.formats else "native"


def audit_checkpoint(loop: RunLoop, engine: Any, task: Any, questions: Sequence[Any],
                     protocols: Mapping[str, Protocol], run: Path, label: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One checkpoint's records (greedy answer and samples in the main format) and its greedy answers in the
    control format (``question_id`` and the candidate's keys), computed only where the stores under ``run`` lack
    them: ``run/<fmt>/deployed``, ``run/<fmt>/T<T>``, ``run/<control fmt>/deployed``."""
    main, sampled, control = protocols["deployed"], protocols["sampled"], protocols["control"]
    deployed = loop.deployed(engine, task, questions, main.fmt, RunStore(run / main.fmt / "deployed", main),
                             desc=f"{label}: greedy ({main.fmt})")
    records = loop.records(
        RunStore(run / main.fmt / f"T{sampled.temperature:g}", sampled), questions, deployed,
        lambda part: probes.sample(engine, task, part, main.fmt, K=sampled.K, temperature=sampled.temperature,
                                   seed=sampled.seed, batch_size=loop.batch_size),
        desc=f"{label}: {sampled.K} samples ({main.fmt})")
    greedy_control = loop.deployed(engine, task, questions, control.fmt,
                                   RunStore(run / control.fmt / "deployed", control), desc=f"{label}: greedy ({control.fmt})")
    return records, greedy_control.reset_index()  # question_id a column, as in the records


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
