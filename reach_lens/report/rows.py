"""The report's rows: a cell's questions, and one row per question of a probe, as compact JSON-able lists.

A *cell* is the stores of one question set under one model, task and format (deployed, each temperature, routes,
...), joined by question id; a *probe* is one set of K candidates per question (a ``records`` table, a search of
the routing study) or one greedy answer (a ``deployed`` or ``screen`` table). A row::

    {"q": question index, "d": 0|1, "K": K, "hits": int, "o": 0|1, "ff": candidates without an answer,
     "dep": [text, answer, correct], "vote": [answer, correct], "c": candidate groups, "t": tags, "x": extras}

Candidate groups are ``CANDIDATE_FIELDS`` lists, identical candidates counted once (``group_candidates``); hidden
states and other per-token arrays a store may hold are never carried. Tags name the filters a question is in.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence

import pandas as pd

from reach_lens.runs import QUESTION_COLUMNS, QUESTIONS

CANDIDATE_FIELDS = ("text", "answer", "correct", "mean_logprob", "finish_reason", "count", "note", "f1")
QUESTION_FIELDS = QUESTION_COLUMNS  # a cell's question rows, in this order; prompt without the cell's prefix
RECORD_FILTERS = (("realized", "realized"), ("reached_not_realized", "reachable, not realized"),
                  ("never_reached", "never reached"), ("said_not_reached", "realized, not reached"),
                  ("greedy_format_failure", "greedy format failure"),
                  ("candidate_format_failure", "candidate format failures"))
GREEDY_FILTERS = (("realized", "realized"), ("not_realized", "not realized"),
                  ("greedy_format_failure", "greedy format failure"))
SHARED_PREFIX = 200  # characters a cell's prompts must share before the prefix is stored once


def number(x: object, digits: int = 4) -> float | None:
    """A float rounded for the page, None for a missing or non-finite value."""
    if x is None:
        return None
    x = float(x)
    return round(x, digits) if math.isfinite(x) else None


def plain(x: object) -> object:
    """A value of a stored row as plain JSON: numpy scalars and arrays as Python values, NaN as None."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


def cell_questions(frames: Sequence[pd.DataFrame], ids: Sequence[str]) -> tuple[list[list], str]:
    """The question rows (``QUESTION_FIELDS``) of ``ids`` from a cell's ``questions`` tables (the first prompt
    stored wins; an id no table holds keeps only its id), and the prefix all their prompts share when it is long
    (a few-shot block), cut from each prompt and returned once."""
    known: dict[str, dict] = {}
    for frame in frames:
        for row in frame.to_dict("records") if len(frame) else []:
            have = known.setdefault(row["question_id"], row)
            if have.get("prompt") is None and row.get("prompt") is not None:
                have["prompt"] = row["prompt"]
    rows = [[plain(known.get(i, {"question_id": i}).get(c)) for c in QUESTION_FIELDS] for i in ids]
    prompts = [r[-1] for r in rows if r[-1] is not None]
    prefix = os.path.commonprefix(prompts) if len(prompts) > 1 else ""
    if len(prefix) < SHARED_PREFIX:
        return rows, ""
    for r in rows:
        r[-1] = r[-1][len(prefix):] if r[-1] is not None else None
    return rows, prefix


def questions_frames(stores: Sequence) -> list[pd.DataFrame]:
    """The ``questions`` table of each store (``collect.Store``; empty for a store written before it existed)."""
    return [s.read(QUESTIONS) for s in stores]


def group_candidates(cands: Sequence[Mapping], note: Callable[[Mapping], str | None] = lambda c: None
                     ) -> tuple[list[list], list[int]]:
    """Identical candidates (text, answer, grade, finish reason and ``note``) as one group with a count and their
    mean log-prob; returns the groups (``CANDIDATE_FIELDS``) in first-seen order and each candidate's group."""
    groups: dict[tuple, int] = {}
    out: list[list] = []
    sums: list[float] = []
    of = []
    for c in cands:
        key = (c["text"], c["answer"], bool(c["correct"]), c.get("finish_reason"), note(c))
        if key not in groups:
            groups[key] = len(out)
            out.append([c["text"], c["answer"], int(bool(c["correct"])), 0.0, c.get("finish_reason"), 0, key[4],
                        number(c.get("f1"))])
            sums.append(0.0)
        g = groups[key]
        out[g][5] += 1
        sums[g] += float(c["mean_logprob"])
        of.append(g)
    for g, total in zip(out, sums):
        g[3] = number(total / g[5])
    return out, of


def record_tags(d: bool, o: bool, deployed_answer: object, format_failures: int) -> list[str]:
    """The ``RECORD_FILTERS`` a record is in."""
    tags = ["realized"] if d else []
    tags += ["reached_not_realized"] if o and not d else []
    tags += ["never_reached"] if not o else []
    tags += ["said_not_reached"] if d and not o else []
    tags += ["greedy_format_failure"] if deployed_answer is None else []
    tags += ["candidate_format_failure"] if format_failures > 0 else []
    return tags


def record_row(q: int, record: Mapping, note: Callable[[Mapping], str | None] = lambda c: None) -> tuple[dict, list]:
    """The row of one record (``records.make_record``) and each candidate's group index."""
    groups, of = group_candidates(list(record["candidates"]), note)
    d, o = bool(record["d"]), bool(record["o"])
    row = {"q": q, "d": int(d), "K": int(record["K"]), "hits": int(record["hits"]), "o": int(o),
           "ff": int(record["format_failures"]),
           "dep": [record["deployed_text"], plain(record["deployed_answer"]), int(d)],
           "vote": [plain(record["vote_answer"]), int(bool(record["vote_correct"]))], "c": groups,
           "t": record_tags(d, o, plain(record["deployed_answer"]), int(record["format_failures"]))}
    return row, of


def greedy_row(q: int, candidate: Mapping) -> dict:
    """The row of one greedy answer (a ``deployed`` row): no candidates."""
    d, answer = bool(candidate["correct"]), plain(candidate["answer"])
    tags = ["realized" if d else "not_realized"] + (["greedy_format_failure"] if answer is None else [])
    return {"q": q, "d": int(d), "K": 0, "hits": 0, "o": int(d), "ff": 0, "dep": [candidate["text"], answer, int(d)],
            "vote": None, "c": [], "t": tags}
