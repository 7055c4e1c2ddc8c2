"""Answer-blind selectors over one question's K candidates, and their recovery of the oracle gain.

A candidate is a mapping with at least `answer` (str | None; None = format failure), `mean_logprob`
(mean token log-prob of its text) and `length` (tokens); the channels below also read `entropy`
(mean token entropy, nats) or `hidden` (a vector, e.g. the last-token residual). Selectors never read
`correct`: only `recovery_table` does, after the pick.

Convention: every selector returns the index of the chosen candidate. Votes return the index of the first
candidate carrying the winning answer.

Pool: every selector chooses among candidates with an extracted answer (knowing that an answer could be
parsed needs no gold answer). When no candidate has one, the pool is all candidates; votes then have no
winner and return 0, whose answer is None, which is graded wrong.
"""
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from reach_lens.records import RECORD_COLUMNS
from reach_lens.stats import paired_comparison

Candidate = Mapping[str, object]
Selector = Callable[[Sequence[Candidate]], int]


def _pool(cands: Sequence[Candidate]) -> list[int]:
    if len(cands) == 0:
        raise ValueError("cannot select from 0 candidates")
    parsed = [i for i, c in enumerate(cands) if c["answer"] is not None]
    return parsed if parsed else list(range(len(cands)))


def _finite_field(cands: Sequence[Candidate], pool: list[int], key: str) -> np.ndarray:
    """Float values of `key` over the pool; a missing/None value or a non-finite one is an error."""
    lacking = [i for i in pool if cands[i].get(key) is None]
    if lacking:
        raise ValueError(f"candidates {lacking} lack {key!r}; this selector needs {key!r} on every candidate")
    values = np.array([float(cands[i][key]) for i in pool])
    bad = [pool[j] for j in np.flatnonzero(~np.isfinite(values))]
    if bad:
        raise ValueError(f"candidates {bad} have non-finite {key!r}")
    return values


def _vote(cands: Sequence[Candidate], weight: Callable[[Candidate], float], tiebreak: bool) -> int:
    """Index of the first candidate of the answer with the largest summed weight.

    Ties on the weight go, if `tiebreak`, to the answer whose candidates have the largest summed sequence
    log-prob (sum over them of mean_logprob * length), then to the answer that occurs first.
    """
    pool = _pool(cands)
    score: dict[str, float] = {}
    seq_logprob: dict[str, float] = {}
    first: dict[str, int] = {}
    for i in pool:
        c = cands[i]
        a = c["answer"]
        if a is None:
            continue
        lp = float(c["mean_logprob"]) * int(c["length"])
        if not math.isfinite(lp):
            raise ValueError(f"candidate {i} has non-finite log-prob (mean_logprob={c['mean_logprob']}, length={c['length']})")
        score[a] = score.get(a, 0.0) + weight(c)
        seq_logprob[a] = seq_logprob.get(a, 0.0) + lp
        first.setdefault(a, i)
    if not score:
        return 0
    key = (lambda a: (score[a], seq_logprob[a], -first[a])) if tiebreak else (lambda a: (score[a], -first[a]))
    return first[max(score, key=key)]


def majority_vote(cands: Sequence[Candidate]) -> int:
    """Most frequent extracted answer; ties by summed sequence log-prob of the tied answers' candidates, then first occurrence."""
    return _vote(cands, lambda c: 1.0, tiebreak=True)


def likelihood_weighted_vote(cands: Sequence[Candidate]) -> int:
    """Answer with the largest sum of exp(mean_logprob) (per-token geometric-mean probability); ties by first occurrence.

    The length-normalized weight is used rather than the sequence probability: for reasoning texts of
    hundreds of tokens sequence probabilities differ by orders of magnitude, and the vote collapses into
    picking the single most likely sequence.
    """
    return _vote(cands, lambda c: math.exp(float(c["mean_logprob"])), tiebreak=False)


def max_mean_logprob(cands: Sequence[Candidate]) -> int:
    """Candidate with the highest mean token log-prob; ties by first occurrence."""
    pool = _pool(cands)
    return pool[int(np.argmax(_finite_field(cands, pool, "mean_logprob")))]


def min_entropy(cands: Sequence[Candidate]) -> int:
    """Candidate with the lowest mean token entropy (`entropy`); ties by first occurrence."""
    pool = _pool(cands)
    return pool[int(np.argmin(_finite_field(cands, pool, "entropy")))]


def hidden_medoid(cands: Sequence[Candidate]) -> int:
    """Candidate whose `hidden` vector has the smallest summed cosine distance to the other pool members; ties by first occurrence."""
    pool = _pool(cands)
    lacking = [i for i in pool if cands[i].get("hidden") is None]
    if lacking:
        raise ValueError(f"candidates {lacking} lack 'hidden'; hidden_medoid needs a vector on every candidate")
    h = np.stack([np.asarray(cands[i]["hidden"], dtype=np.float64) for i in pool])  # [pool, d]
    if h.ndim != 2:
        raise ValueError(f"'hidden' must be one 1-D vector per candidate, got stacked shape {h.shape}")
    norms = np.linalg.norm(h, axis=1)
    zero = [pool[j] for j in np.flatnonzero(~(norms > 0))]
    if zero:
        raise ValueError(f"candidates {zero} have a zero or non-finite 'hidden' vector; cosine distance is undefined")
    u = h / norms[:, None]
    dist = 1.0 - u @ u.T  # [pool, pool]
    np.fill_diagonal(dist, 0.0)
    return pool[int(np.argmin(dist.sum(axis=1)))]


SELECTORS: dict[str, Selector] = {
    "majority_vote": majority_vote,
    "likelihood_weighted_vote": likelihood_weighted_vote,
    "max_mean_logprob": max_mean_logprob,
    "min_entropy": min_entropy,
    "hidden_medoid": hidden_medoid,
}


def recovery(selector_acc: float, greedy_acc: float, oracle_acc: float) -> float:
    """(selector - greedy) / (oracle - greedy): the share of the oracle's gain over greedy a selector keeps.

    NaN when oracle <= greedy: there is no gain to recover (and a negative denominator would flip the sign).
    """
    if not oracle_acc > greedy_acc + 1e-12:
        return math.nan
    return (selector_acc - greedy_acc) / (oracle_acc - greedy_acc)


_READ = ("d", "o", "K", "candidates")  # the record columns recovery_table reads
if not set(_READ) <= set(RECORD_COLUMNS):  # a renamed record column fails here, at import, not inside a study
    raise ImportError(f"select reads record columns {sorted(set(_READ) - set(RECORD_COLUMNS))} that "
                      "reach_lens.records no longer defines")


def recovery_table(records: pd.DataFrame, selectors: Mapping[str, Selector], by: Sequence[str] = ()) -> pd.DataFrame:
    """Per cell (groups of `by`; the whole table if empty) and selector: n, K, greedy (D), oracle (O_K), selector
    accuracy, recovery, and the selector against greedy on the same questions (`stats.paired_comparison`:
    ``vs_greedy`` = selector_acc - greedy with Newcombe's ``vs_greedy_lo``/``_hi``, the exact McNemar
    ``vs_greedy_p``, ``selector_only`` / ``greedy_only`` questions only one of them answers).

    `records` are `reach_lens.records` rows (columns d, o, K, candidates are read). A selector's pick is correct
    when the chosen candidate's `correct` is true.
    """
    missing = [c for c in (*_READ, *by) if c not in records.columns]
    if missing:
        raise ValueError(f"records lack columns {missing}")
    if len(records) == 0:
        raise ValueError("records is empty")
    groups = records.groupby(list(by), sort=True) if by else [((), records)]
    rows = []
    for key, g in groups:
        cell = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        ks = sorted(set(int(k) for k in g["K"]))
        if len(ks) != 1:
            raise ValueError(f"cell {cell} mixes candidate budgets K={ks}; recovery compares one K")
        greedy, oracle = float(g["d"].mean()), float(g["o"].mean())
        for name, select in selectors.items():
            picked = np.array([bool(cands[select(cands)]["correct"]) for cands in g["candidates"]])
            acc = float(picked.mean())
            test = paired_comparison(picked, g["d"].astype(bool).to_numpy())
            rows.append({**cell, "selector": name, "n": len(g), "K": ks[0], "greedy": greedy,
                         "oracle": oracle, "selector_acc": acc, "recovery": recovery(acc, greedy, oracle),
                         "vs_greedy": test["diff"], "vs_greedy_lo": test["lo"], "vs_greedy_hi": test["hi"],
                         "vs_greedy_p": test["p"], "selector_only": test["a_only"], "greedy_only": test["b_only"]})
    return pd.DataFrame(rows)
