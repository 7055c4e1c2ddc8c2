"""Records as plain data: the one candidate builder and the one record builder, which ``audit`` and ``select`` read.

A record is one question under one protocol (the protocol itself lives in the run store, not in the rows):

    question_id  str     gold          str       deployed_text  str    deployed_answer  str | None
    d            bool    K             int       hits           int    o                bool
    format_failures int  vote_answer   str|None  vote_correct   bool   candidates       list[dict]

Each candidate dict has `text` (str), `answer` (str | None; None = format failure), `correct` (bool),
`mean_logprob` (float, mean token log-prob) and `length` (int, tokens), plus whatever optional channels
the probe adds (`entropy`, `finish_reason`, `route`, `hidden`, ...), carried through unchanged.

    cands = [candidate(task, q, gen, keep_hidden=True) for gen in generations]
    record = make_record(q.id, q.gold, deployed, cands, vote=select.majority_vote(cands))
    records = record_table(questions, deploy(...), sample(...), select.majority_vote)   # a run, as a DataFrame
    frame = candidate_frame(questions, sample(...))                                   # one row per candidate
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Integral
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:  # records stay plain data: importing them loads no engine and no task
    from reach_lens.generate.types import Generation
    from reach_lens.tasks import Question

RECORD_COLUMNS = ("question_id", "gold", "deployed_text", "deployed_answer", "d", "K", "hits", "o",
                  "format_failures", "vote_answer", "vote_correct", "candidates")
CANDIDATE_KEYS = ("text", "answer", "correct", "mean_logprob", "length")
DEPLOYED_KEYS = ("text", "answer", "correct")
_BUILT_KEYS = (*CANDIDATE_KEYS, "f1", "entropy", "finish_reason", "route", "hidden")


def candidate(task: Any, question: Question, gen: Generation, keep_hidden: bool = False, **extra: object) -> dict:
    """The candidate dict of one generation, graded by ``task.grade(question, text)``.

    Keys: text (``gen.text`` or ""), answer, correct, mean_logprob, length (tokens), f1 (the grader's partial
    credit, e.g. token F1 of a short answer; None where it has none), entropy (mean untempered token entropy),
    finish_reason, route (a list, or None for the full path), hidden (a list of floats when
    ``keep_hidden`` and the generation carries one, else None), then ``extra`` (channels of the caller, which
    may not reuse those names).
    """
    clash = sorted(set(extra) & set(_BUILT_KEYS))
    if clash:
        raise ValueError(f"extra keys {clash} would overwrite built candidate keys {list(_BUILT_KEYS)}")
    if not gen.tokens:
        raise ValueError(f"question {question.id!r}: the generation has no tokens, so no mean log-prob or entropy")
    text = gen.text if gen.text is not None else ""
    graded = task.grade(question, text)
    hidden = None
    if keep_hidden and gen.hidden is not None:
        if gen.hidden.ndim != 1:
            raise ValueError(f"question {question.id!r}: hidden must be one [d_model] vector, got shape "
                             f"{tuple(gen.hidden.shape)}")
        hidden = [float(x) for x in gen.hidden.detach().float().cpu().tolist()]
    return {
        "text": text,
        "answer": graded.answer,
        "correct": bool(graded.correct),
        "mean_logprob": float(gen.mean_logprob),
        "length": len(gen.tokens),
        "f1": None if graded.f1 is None else float(graded.f1),
        "entropy": float(gen.entropy),
        "finish_reason": gen.finish_reason,
        "route": None if gen.route is None else [int(layer) for layer in gen.route],
        "hidden": hidden,
        **extra,
    }


def _check_answer(where: str, answer: object, correct: object) -> None:
    if answer is not None and not isinstance(answer, str):
        raise TypeError(f"{where}: answer must be str or None, got {type(answer).__name__} {answer!r}")
    if answer is None and bool(correct):
        raise ValueError(f"{where}: answer None (format failure) cannot be graded correct")


def _candidate(i: int, c: Mapping[str, object]) -> dict:
    missing = [k for k in CANDIDATE_KEYS if k not in c]
    if missing:
        raise ValueError(f"candidate {i} lacks keys {missing} (needs {list(CANDIDATE_KEYS)})")
    _check_answer(f"candidate {i}", c["answer"], c["correct"])
    mean_logprob, length = float(c["mean_logprob"]), int(c["length"])
    if not math.isfinite(mean_logprob) or length < 0:
        raise ValueError(f"candidate {i}: mean_logprob must be finite and length >= 0, got {mean_logprob}, {length}")
    return {**c, "text": str(c["text"]), "correct": bool(c["correct"]), "mean_logprob": mean_logprob, "length": length}


def make_record(question_id: object, gold: str, deployed: Mapping[str, object],
                candidates: Sequence[Mapping[str, object]], vote: int) -> dict:
    """One record from the deployed (greedy) answer {text, answer, correct}, K >= 1 graded candidates and the
    index of the candidate the vote picked (the caller's vote, e.g. ``select.majority_vote(candidates)``).

    d, K, hits, o and format_failures are derived here; vote_answer and vote_correct are the picked candidate's.
    """
    missing = [k for k in DEPLOYED_KEYS if k not in deployed]
    if missing:
        raise ValueError(f"deployed lacks keys {missing} (needs {list(DEPLOYED_KEYS)})")
    _check_answer("deployed", deployed["answer"], deployed["correct"])
    if len(candidates) == 0:
        raise ValueError("a record needs at least one candidate (K >= 1)")
    cands = [_candidate(i, c) for i, c in enumerate(candidates)]
    if isinstance(vote, bool) or not isinstance(vote, Integral) or not 0 <= vote < len(cands):
        raise ValueError(f"vote {vote!r} must be the index of a candidate (an int in 0..{len(cands) - 1})")
    winner = cands[int(vote)]
    hits = sum(c["correct"] for c in cands)
    return {
        "question_id": str(question_id),
        "gold": str(gold),
        "deployed_text": str(deployed["text"]),
        "deployed_answer": deployed["answer"],
        "d": bool(deployed["correct"]),
        "K": len(cands),
        "hits": hits,
        "o": hits > 0,
        "format_failures": sum(c["answer"] is None for c in cands),
        "vote_answer": winner["answer"],
        "vote_correct": winner["correct"],
        "candidates": cands,
    }


def record_table(questions: Sequence[Question], deployed: Sequence[Mapping[str, object]],
                 candidates: Sequence[Sequence[Mapping[str, object]]], vote) -> pd.DataFrame:
    """The records of a probe run as a table (``RECORD_COLUMNS``, one row per question): ``deployed[i]`` is question
    i's greedy candidate (``probes.deploy``), ``candidates[i]`` its K candidates (``probes.sample`` or
    ``probes.route``); ``vote(candidates) -> index`` picks one (e.g. ``select.majority_vote``).

        records = record_table(questions, deploy(...), sample(...), select.majority_vote)
        audit.summarize(records)                       # D, vote@K, O_K with their 95% intervals
    """
    if not len(questions) == len(deployed) == len(candidates):
        raise ValueError(f"{len(questions)} questions, {len(deployed)} deployed answers and {len(candidates)} candidate "
                         "lists: expected one of each per question")
    rows = [make_record(q.id, q.gold, d, cs, vote(cs)) for q, d, cs in zip(questions, deployed, candidates)]
    return pd.DataFrame(rows, columns=list(RECORD_COLUMNS))


def candidate_frame(questions: Sequence[Question],
                    results: Sequence[Mapping[str, object]] | Sequence[Sequence[Mapping[str, object]]]) -> pd.DataFrame:
    """Any generation probe's output as one DataFrame row per candidate: ``question_id``, ``k`` (the candidate's index
    within its question; 0 for ``deploy``'s one answer) and the candidate's keys (``candidate``)."""
    if len(questions) != len(results):
        raise ValueError(f"{len(questions)} questions but {len(results)} results: expected one per question")
    rows = []
    for q, result in zip(questions, results):
        for k, c in enumerate([result] if isinstance(result, Mapping) else result):
            rows.append({"question_id": q.id, "k": k, **c})
    return pd.DataFrame(rows)
