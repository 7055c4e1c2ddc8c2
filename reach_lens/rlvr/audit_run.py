"""One checkpoint's audit under the study's protocol, and the check that checkpoints are comparable.

    ps = audit_protocols(engine, task, questions, "shared", "fewshot", samples=8, T=0.8, seed=0, settings=settings)
    ps = audit_protocols(..., control_fmt=None, top_p=0.95, max_new_tokens=512)   # no control run; pinned decoding
    check_comparable({"base": ps_base["sampled"], "grpo": ps["sampled"]})  # ProtocolMismatch naming every field
    questions, split, note = audit_questions(task.load(), task.name, {"grpo": path}, salt="rlvr", audit_share=0.6)
    records, control = audit_checkpoint(loop, engine, task, questions, ps, run / "grpo", "grpo")
    at_k = records_at(records, 4)                           # the first 4 samples: the K = 4 probe, exactly

Sample k of a question is seeded by (seed, question id, k) alone (``probes.sample``), so the first K of 2K
samples are exactly what a K-sample probe draws: one set of 2K samples gives the records at K and at 2K.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from reach_lens import probes
from reach_lens.generate import engine_for
from reach_lens.protocol import Protocol, canonical_json
from reach_lens.errors import UserError
from reach_lens.records import make_record
from reach_lens.rlvr.split import Split, check_disjoint, split_questions
from reach_lens.runs import RunLoop
from reach_lens.select import majority_vote
from reach_lens.store import ProtocolMismatch, RunStore

log = logging.getLogger(__name__)
STUDY = "rlvr_compare"
CHECKPOINT_FIELDS = ("model", "weights")  # what may differ between the checkpoints of one comparison


def audit_questions(questions: Sequence[Any], task: str, checkpoints: Mapping[str, str | Path], salt: str,
                    audit_share: float) -> tuple[list, Split | None, str]:
    """(the questions to audit, the split or None, a sentence saying which): the audit side of the salted id-hash
    split (``rlvr.split``) when any checkpoint carries reach_lens training metadata, since its training questions
    are on the other side; every question otherwise (checkpoints trained elsewhere: the whole benchmark)."""
    from reach_lens.rlvr.train import read_metadata

    metadata = {label: read_metadata(model) for label, model in checkpoints.items()}  # None: not trained here
    trained_here = [label for label, meta in metadata.items() if meta is not None]
    if not trained_here:
        return list(questions), None, (f"every question ({len(questions)}): no checkpoint carries reach_lens training "
                                       "metadata, so none was trained on a split of this task here")
    try:
        _, audit, split = split_questions(questions, task, salt, audit_share)
    except ValueError as e:
        raise UserError(str(e)) from e
    for label in trained_here:
        meta = metadata[label]
        if meta["split"]["audit_ids_sha256"] != split.to_dict()["audit_ids_sha256"]:
            log.warning(f"{label} was trained under another split ({meta['split']['salt']!r}, "
                        f"{meta['split']['audit_share']}); its training ids are still checked against the audit")
    return audit, split, (f"the audit side of the id-hash split ({len(audit)} of {len(questions)} questions, salt "
                          f"{salt!r}, share {audit_share:g}): {', '.join(trained_here)} carry reach_lens training "
                          "metadata")


def check_training_ids(questions: Sequence[Any], checkpoints: Mapping[str, str | Path]) -> None:
    """Refuse (``UserError``) an audit that asks any checkpoint a question it was trained on (its training ids)."""
    from reach_lens.rlvr.train import training_ids

    for label, model in checkpoints.items():
        try:
            check_disjoint([q.id for q in questions], training_ids(model), f"{label} checkpoint ({model})")
        except ValueError as e:
            raise UserError(str(e)) from e


def audit_protocols(engine: Any, task: Any, questions: Sequence[Any], fmt: str, control_fmt: str | None,
                    samples: int, T: float, seed: int, settings: Mapping[str, Any], source: str | None = None,
                    split: str | None = None, top_p: float = 1.0,
                    max_new_tokens: int | None = None) -> dict[str, Protocol]:
    """The runs of one checkpoint's audit: ``deployed`` (greedy answers in ``fmt``), ``sampled`` (``samples``
    samples at temperature ``T`` and nucleus ``top_p`` in ``fmt``) and, unless ``control_fmt`` is None, ``control``
    (greedy answers in ``control_fmt``, for the format-transfer table). ``max_new_tokens``: every run's budget (None:
    the task's). ``engine``: a HookedTransformer or an engine."""
    facts = engine_for(engine).describe()

    def greedy(fmt: str) -> Protocol:
        return Protocol.of(study=STUDY, facts=facts, task=task, questions=questions, fmt=fmt, probe="deploy", seed=seed,
                           source=source, split=split, settings=dict(settings), max_new_tokens=max_new_tokens)

    deployed = greedy(fmt)
    runs = {"deployed": deployed, "sampled": deployed.replace(probe="sample", K=samples, temperature=T, top_p=top_p)}
    return runs if control_fmt is None else {**runs, "control": greedy(control_fmt)}


def control_format(fmt: str, task: Any) -> str:
    """The default format of the format-transfer table: plain text the trained format ``fmt`` is not."""
    if fmt != "shared":
        return "shared"
    return "fewshot" if "fewshot" in task.formats else "native"


def audit_checkpoint(loop: RunLoop, engine: Any, task: Any, questions: Sequence[Any],
                     protocols: Mapping[str, Protocol], run: Path,
                     label: str) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """One checkpoint's records (greedy answer and samples in the main format) and its greedy answers in the
    control format (``question_id`` and the candidate's keys; None without a control run), computed only where the
    stores under ``run`` lack them: ``run/<fmt>/deployed``, ``run/<fmt>/T<T>[-p<top_p>]``,
    ``run/<control fmt>/deployed``."""
    main, sampled, control = protocols["deployed"], protocols["sampled"], protocols.get("control")
    deployed = loop.deployed(engine, task, questions, main.fmt, RunStore(run / main.fmt / "deployed", main),
                             desc=f"{label}: greedy ({main.fmt})", max_new_tokens=main.max_new_tokens)
    nucleus = "" if sampled.top_p == 1 else f"-p{sampled.top_p:g}"
    records = loop.records(
        RunStore(run / main.fmt / f"T{sampled.temperature:g}{nucleus}", sampled), questions, deployed,
        lambda part: probes.sample(engine, task, part, main.fmt, K=sampled.K, temperature=sampled.temperature,
                                   seed=sampled.seed, batch_size=loop.batch_size, top_p=sampled.top_p,
                                   max_new_tokens=sampled.max_new_tokens),
        desc=f"{label}: {sampled.K} samples ({main.fmt})")
    if control is None:
        return records, None
    greedy_control = loop.deployed(engine, task, questions, control.fmt, RunStore(run / control.fmt / "deployed",
                                                                                  control),
                                   desc=f"{label}: greedy ({control.fmt})", max_new_tokens=control.max_new_tokens)
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
