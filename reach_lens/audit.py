"""The per-question audit of one record table: D, vote@K, O_K and their gaps with 95% intervals (`summarize`),
reach@k curves and the gap O_k - D over k, temperature sweeps and the sampling-gap table's row.

The records themselves (their columns, and the one place that builds them) are ``reach_lens.records``:
one row per question with d (deployed correct), K, hits, o (some candidate correct), format_failures,
vote_answer / vote_correct and the candidates. The statistics are ``reach_lens.stats``; base-vs-trained
comparisons are ``reach_lens.rlvr.fates``, the census criterion ``reach_lens.census``.
"""
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from reach_lens.stats import bootstrap_ci, curve_band, pass_at_k, wilson_interval


def require_columns(records: pd.DataFrame, columns: Sequence[str], name: str = "records") -> None:
    """Refuse a table that lacks any of ``columns`` or has no rows (``name`` says which table)."""
    missing = [c for c in columns if c not in records.columns]
    if missing:
        raise ValueError(f"{name} lack columns {missing}")
    if len(records) == 0:
        raise ValueError(f"{name} is empty")


def single_K(records: pd.DataFrame) -> int:
    """The one candidate budget K of a record table; refuse a table that mixes budgets."""
    ks = sorted(set(int(k) for k in records["K"]))
    if len(ks) != 1:
        raise ValueError(f"records mix candidate budgets K={ks}; one table must hold one protocol's K")
    return ks[0]


def pass_at_ks(hits: Sequence[int] | np.ndarray, K: int, ks: Sequence[int]) -> np.ndarray:
    """[n, len(ks)]: each question's unbiased pass@k (`pass_at_k`) from its hit count [n] of K samples."""
    hits = np.asarray(hits, dtype=np.int64)
    rows = {c: [pass_at_k(K, int(c), k) for k in ks] for c in np.unique(hits)}
    return np.array([rows[c] for c in hits], dtype=np.float64).reshape(len(hits), len(ks))


def reach_curve(records: pd.DataFrame, ks: Sequence[int] | None = None, n_boot: int = 2000,
                seed: int = 0) -> pd.DataFrame:
    """reach@k = mean over questions of pass_at_k(K, hits, k), for ks (default 1..K), with a 95% question-level bootstrap.

    Returns columns k, reach, lo, hi, n, K. reach@K equals O_K; reach@1 is the mean per-question hit rate.
    One bootstrap resample of questions is shared by all k, so the band is that of one curve.
    """
    require_columns(records, ("K", "hits"))
    K, n = single_K(records), len(records)
    ks = list(range(1, K + 1)) if ks is None else sorted(set(int(k) for k in ks))
    bad = [k for k in ks if not 1 <= k <= K]
    if bad or not ks:
        raise ValueError(f"ks {bad or ks} out of range 1..{K}")
    mean, lo, hi = curve_band(pass_at_ks(records["hits"], K, ks), n_boot=n_boot, seed=seed)
    return pd.DataFrame({"k": ks, "reach": mean, "lo": lo, "hi": hi, "n": n, "K": K})


def gap_curve(records: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The sampling gap as a function of the budget: reach@k - D for k = 1..K, with a 95% paired bootstrap band
    (each question's pass@k minus its own deployed correctness d, one resample of questions shared by every k).

    Returns columns k, gap, lo, hi, n, K. gap at k = K equals `summarize`'s gap (O_K - D); at k = 1 it is the mean
    hit rate minus D, negative where one sample says less than the greedy answer.
    """
    require_columns(records, ("K", "hits", "d"))
    K, n = single_K(records), len(records)
    ks = list(range(1, K + 1))
    d = records["d"].to_numpy(dtype=np.float64)[:, None]
    mean, lo, hi = curve_band(pass_at_ks(records["hits"], K, ks) - d, n_boot=n_boot, seed=seed)
    return pd.DataFrame({"k": ks, "gap": mean, "lo": lo, "hi": hi, "n": n, "K": K})


def summarize(records: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> dict:
    """Aggregates of one record table, each X with X_lo, X_hi (95%).

    D (deployed), vote (vote@K), O (O_K) and deployed_format_failure_rate: Wilson intervals.
    gap = O - D and selection_gap = O - vote: paired bootstrap over questions. gap is a net share: its questions
    reached_not_said (O and not D, a count) minus said_not_reached (D and not O, a count), over n.
    format_failure_rate (share of all n*K candidates): question-level bootstrap, since candidates of one
    question are not independent draws.
    """
    require_columns(records, ("d", "o", "vote_correct", "K", "format_failures", "deployed_answer"))
    K, n = single_K(records), len(records)
    d = records["d"].to_numpy(dtype=bool)
    o = records["o"].to_numpy(dtype=bool)
    vote = records["vote_correct"].to_numpy(dtype=bool)
    out: dict = {"n": n, "K": K}

    def add(name: str, value: float, interval: tuple[float, float]) -> None:
        out[name], out[f"{name}_lo"], out[f"{name}_hi"] = float(value), interval[0], interval[1]

    for name, x in (("D", d), ("vote", vote), ("O", o)):
        add(name, x.mean(), wilson_interval(int(x.sum()), n))
    add("gap", (o.astype(float) - d).mean(), bootstrap_ci(o.astype(float) - d, n_boot=n_boot, seed=seed))
    out["reached_not_said"], out["said_not_reached"] = int((o & ~d).sum()), int((d & ~o).sum())
    add("selection_gap", (o.astype(float) - vote).mean(),
        bootstrap_ci(o.astype(float) - vote, n_boot=n_boot, seed=seed))
    ff = records["format_failures"].to_numpy(dtype=np.float64) / K
    add("format_failure_rate", ff.mean(), bootstrap_ci(ff, n_boot=n_boot, seed=seed))
    deployed_ff = int(records["deployed_answer"].isna().sum())
    add("deployed_format_failure_rate", deployed_ff / n, wilson_interval(deployed_ff, n))
    return out


def temperature_sweep(records_at: Mapping[float, pd.DataFrame], seed: int = 0) -> pd.DataFrame:
    """One `summarize` row per temperature (column ``T``), from the record tables of one question set by T."""
    return pd.DataFrame([{"T": float(T), **summarize(records, seed=seed)} for T, records in sorted(records_at.items())])


GAP_COLUMNS = (("deployed", "D"), ("vote", "vote"), ("oracle", "O"), ("gap", "gap"), ("selection_gap", "selection_gap"))


def gap_table_row(summary: Mapping) -> dict:
    """The sampling-gap table's columns (the paper's Table 2) from a `summarize` row: n, K, deployed, vote, oracle,
    gap (O - D), selection_gap (O - vote), each with _lo and _hi, the counts behind the net gap (reached_not_said,
    said_not_reached) and format_failure_rate."""
    return {"n": int(summary["n"]), "K": int(summary["K"]),
            **{f"{name}{s}": summary[f"{key}{s}"] for name, key in GAP_COLUMNS for s in ("", "_lo", "_hi")},
            "reached_not_said": int(summary["reached_not_said"]), "said_not_reached": int(summary["said_not_reached"]),
            "format_failure_rate": summary["format_failure_rate"]}


def options_per_question(questions: Sequence[Any]) -> list[int] | None:
    """Each question's number of options, or None when they are free-form (no guessing floor)."""
    counts = [len(q.options) for q in questions]
    return counts if counts and all(counts) else None
