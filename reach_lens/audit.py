"""What per-question records add up to: D, vote@K, O_K, reach@k curves, gaps, fates, intervals.

The records themselves (their columns, and the one place that builds them) are ``reach_lens.records``:
one row per question with d (deployed correct), K, hits, o (some candidate correct), format_failures,
vote_answer / vote_correct and the candidates.
"""
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

Z95 = 1.959963984540054


def _require(records: pd.DataFrame, columns: Sequence[str], name: str = "records") -> None:
    missing = [c for c in columns if c not in records.columns]
    if missing:
        raise ValueError(f"{name} lack columns {missing}")
    if len(records) == 0:
        raise ValueError(f"{name} is empty")


def _single_K(records: pd.DataFrame) -> int:
    ks = sorted(set(int(k) for k in records["K"]))
    if len(ks) != 1:
        raise ValueError(f"records mix candidate budgets K={ks}; one table must hold one protocol's K")
    return ks[0]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased P(at least one of k draws without replacement from n candidates, c correct, is correct) = 1 - C(n-c,k)/C(n,k)."""
    if not (0 <= c <= n):
        raise ValueError(f"correct count c={c} out of range 0..{n}")
    if not (1 <= k <= n):
        raise ValueError(f"k={k} out of range 1..{n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (nan, nan) when n == 0."""
    if n < 0 or not (0 <= successes <= n):
        raise ValueError(f"successes={successes} out of range 0..n for n={n} >= 0")
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    lo = 0.0 if successes == 0 else max(0.0, center - half)  # exact endpoints, free of rounding
    hi = 1.0 if successes == n else min(1.0, center + half)
    return (lo, hi)


def bootstrap_ci(values: Sequence[float] | np.ndarray, stat: Callable[[np.ndarray], float] = np.mean,
                 n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of stat(values), resampling values with replacement."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or len(x) == 0:
        raise ValueError(f"values must be a non-empty 1-D sequence, got shape {x.shape}")
    if not (0 < level < 1) or n_boot < 1:
        raise ValueError(f"level={level} must be in (0, 1) and n_boot={n_boot} >= 1")
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
    stats = np.array([stat(x[i]) for i in idx])
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def reach_curve(records: pd.DataFrame, ks: Sequence[int] | None = None, n_boot: int = 2000,
                seed: int = 0) -> pd.DataFrame:
    """reach@k = mean over questions of pass_at_k(K, hits, k), for ks (default 1..K), with a 95% question-level bootstrap.

    Returns columns k, reach, lo, hi, n, K. reach@K equals O_K; reach@1 is the mean per-question hit rate.
    One bootstrap resample of questions is shared by all k, so the band is that of one curve.
    """
    _require(records, ("K", "hits"))
    K, n = _single_K(records), len(records)
    ks = list(range(1, K + 1)) if ks is None else sorted(set(int(k) for k in ks))
    bad = [k for k in ks if not 1 <= k <= K]
    if bad or not ks:
        raise ValueError(f"ks {bad or ks} out of range 1..{K}")
    hits = records["hits"].to_numpy(dtype=np.int64)
    rows = {c: [pass_at_k(K, int(c), k) for k in ks] for c in np.unique(hits)}
    per_q = np.array([rows[c] for c in hits])  # [n, len(ks)]
    weights = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot)  # [n_boot, n]
    boot = weights @ per_q / n  # [n_boot, len(ks)]
    lo, hi = np.quantile(boot, [0.025, 0.975], axis=0)
    return pd.DataFrame({"k": ks, "reach": per_q.mean(axis=0), "lo": lo, "hi": hi, "n": n, "K": K})


def summarize(records: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> dict:
    """Aggregates of one record table, each X with X_lo, X_hi (95%).

    D (deployed), vote (vote@K), O (O_K) and deployed_format_failure_rate: Wilson intervals.
    gap = O - D and selection_gap = O - vote: paired bootstrap over questions.
    format_failure_rate (share of all n*K candidates): question-level bootstrap, since candidates of one
    question are not independent draws.
    """
    _require(records, ("d", "o", "vote_correct", "K", "format_failures", "deployed_answer"))
    K, n = _single_K(records), len(records)
    d = records["d"].to_numpy(dtype=bool)
    o = records["o"].to_numpy(dtype=bool)
    vote = records["vote_correct"].to_numpy(dtype=bool)
    out: dict = {"n": n, "K": K}

    def add(name: str, value: float, interval: tuple[float, float]) -> None:
        out[name], out[f"{name}_lo"], out[f"{name}_hi"] = float(value), interval[0], interval[1]

    for name, x in (("D", d), ("vote", vote), ("O", o)):
        add(name, x.mean(), wilson_interval(int(x.sum()), n))
    add("gap", (o.astype(float) - d).mean(), bootstrap_ci(o.astype(float) - d, n_boot=n_boot, seed=seed))
    add("selection_gap", (o.astype(float) - vote).mean(),
        bootstrap_ci(o.astype(float) - vote, n_boot=n_boot, seed=seed))
    ff = records["format_failures"].to_numpy(dtype=np.float64) / K
    add("format_failure_rate", ff.mean(), bootstrap_ci(ff, n_boot=n_boot, seed=seed))
    deployed_ff = int(records["deployed_answer"].isna().sum())
    add("deployed_format_failure_rate", deployed_ff / n, wilson_interval(deployed_ff, n))
    return out


REALIZATION_FATES = ("newly_realized_from_reachable", "newly_realized_from_unreachable", "lost",
                     "stable_realized", "stable_unrealized")
REACHABILITY_FATES = ("entered_reachable", "left_reachable", "stable_reachable", "stable_unreachable")
_FATE_COLUMNS = ("question_id", "gold", "d", "o", "hits", "K")


def fates(base: pd.DataFrame, trained: pd.DataFrame) -> pd.DataFrame:
    """Inner join of two record tables on question_id, each question classified on two axes.

    realization: newly_realized_from_reachable (base wrong, some base candidate right, trained right),
    newly_realized_from_unreachable (base wrong, no base candidate right, trained right), lost (base
    right, trained wrong), stable_realized, stable_unrealized.
    reachability: entered_reachable (o 0 -> 1), left_reachable (1 -> 0), stable_reachable, stable_unreachable.

    Ids present on one side only are left out, listed in `.attrs["only_base"]` / `.attrs["only_trained"]`,
    and reported by a warning. Duplicate ids, or a gold answer that differs between the tables, are errors.
    Columns: question_id, gold, {d,o,hits,K}_base, {d,o,hits,K}_trained, realization, reachability.
    """
    for name, t in (("base", base), ("trained", trained)):
        _require(t, _FATE_COLUMNS, name)
        dup = t["question_id"][t["question_id"].duplicated()].unique().tolist()
        if dup:
            raise ValueError(f"{name} has duplicate question_ids {dup[:10]}")
    b_ids, t_ids = set(base["question_id"]), set(trained["question_id"])
    only_base, only_trained = sorted(b_ids - t_ids), sorted(t_ids - b_ids)
    if only_base or only_trained:
        warnings.warn(f"fates: {len(only_base)} ids only in base (e.g. {only_base[:5]}), "
                      f"{len(only_trained)} only in trained (e.g. {only_trained[:5]}); they are left out")
    j = base[list(_FATE_COLUMNS)].merge(trained[list(_FATE_COLUMNS)], on="question_id", how="inner",
                                        suffixes=("_base", "_trained"))
    if len(j) == 0:
        raise ValueError("base and trained share no question_id")
    differ = j.loc[j["gold_base"] != j["gold_trained"], "question_id"].tolist()
    if differ:
        raise ValueError(f"gold answers differ between base and trained for {differ[:10]}: not the same question set")
    j = j.drop(columns="gold_trained").rename(columns={"gold_base": "gold"})
    db, dt = j["d_base"].astype(bool), j["d_trained"].astype(bool)
    ob, ot = j["o_base"].astype(bool), j["o_trained"].astype(bool)
    j["realization"] = np.select(
        [~db & dt & ob, ~db & dt & ~ob, db & ~dt, db & dt],
        ["newly_realized_from_reachable", "newly_realized_from_unreachable", "lost", "stable_realized"],
        "stable_unrealized")
    j["reachability"] = np.select([~ob & ot, ob & ~ot, ob & ot],
                                  ["entered_reachable", "left_reachable", "stable_reachable"], "stable_unreachable")
    j.attrs["only_base"], j.attrs["only_trained"] = only_base, only_trained
    return j


def fate_counts(fates_df: pd.DataFrame) -> pd.DataFrame:
    """Counts and shares of every fate on both axes (zero counts included). Columns: axis, fate, count, share."""
    _require(fates_df, ("realization", "reachability"), "fates")
    n = len(fates_df)
    rows = [{"axis": axis, "fate": f, "count": int((fates_df[axis] == f).sum())}
            for axis, names in (("realization", REALIZATION_FATES), ("reachability", REACHABILITY_FATES))
            for f in names]
    out = pd.DataFrame(rows)
    out["share"] = out["count"] / n
    return out


def realization_by_hit_rate_bin(base: pd.DataFrame, trained: pd.DataFrame, bins: Sequence[float]) -> pd.DataFrame:
    """Share of questions the trained checkpoint realizes, per bin of base hit rate hits/K, with Wilson 95% intervals.

    `bins` are increasing edges covering [0, 1]; bins are [lo, hi) except the last, [lo, hi]. To give the
    base-unreachable questions their own bin, start with a tiny edge: (0, 1e-9, 0.25, 0.5, 0.75, 1).
    Columns: bin_lo, bin_hi, n, realized, realization, realization_lo, realization_hi, base_realized.
    """
    edges = [float(e) for e in bins]
    if len(edges) < 2 or any(a >= b for a, b in zip(edges, edges[1:])) or edges[0] > 0 or edges[-1] < 1:
        raise ValueError(f"bins {edges} must be >= 2 strictly increasing edges from <= 0 to >= 1")
    j = fates(base, trained)
    rate = j["hits_base"].to_numpy(dtype=np.float64) / j["K_base"].to_numpy(dtype=np.float64)
    rows = []
    for i, (lo, hi) in enumerate(zip(edges, edges[1:])):
        last = i == len(edges) - 2
        mask = (rate >= lo) & ((rate <= hi) if last else (rate < hi))
        n, k = int(mask.sum()), int(j.loc[mask, "d_trained"].astype(bool).sum())
        ci = wilson_interval(k, n)
        rows.append({"bin_lo": lo, "bin_hi": hi, "n": n, "realized": k, "realization": k / n if n else math.nan,
                     "realization_lo": ci[0], "realization_hi": ci[1],
                     "base_realized": int(j.loc[mask, "d_base"].astype(bool).sum())})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Rate:
    """k of n, with its Wilson 95% interval."""

    k: int
    n: int
    rate: float
    lo: float
    hi: float

    def to_dict(self, name: str) -> dict:
        """{name, name_lo, name_hi, name_n, name_k}: ready to be a row of a figure's table."""
        return {name: self.rate, f"{name}_lo": self.lo, f"{name}_hi": self.hi, f"{name}_n": self.n, f"{name}_k": self.k}


def _rate(k: int, n: int) -> Rate:
    lo, hi = wilson_interval(k, n)
    return Rate(k=k, n=n, rate=k / n if n else math.nan, lo=lo, hi=hi)


def _paired(before: Sequence[bool] | np.ndarray, after: Sequence[bool] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b, a = np.asarray(before, dtype=bool), np.asarray(after, dtype=bool)
    if b.shape != a.shape or b.ndim != 1:
        raise ValueError(f"before and after must be 1-D of one length, got shapes {b.shape} and {a.shape}")
    return b, a


def repair_rate(before_correct: Sequence[bool] | np.ndarray, after_correct: Sequence[bool] | np.ndarray) -> Rate:
    """Share of a failure set (all wrong before the intervention) answered correctly after it."""
    b, a = _paired(before_correct, after_correct)
    if b.any():
        raise ValueError(f"repair is measured on a failure set, but {int(b.sum())} of {len(b)} were correct before")
    return _rate(int(a.sum()), len(a))


def breakage_rate(before_correct: Sequence[bool] | np.ndarray, after_correct: Sequence[bool] | np.ndarray) -> Rate:
    """Share of a healthy panel (all right before the intervention) answered wrongly after it."""
    b, a = _paired(before_correct, after_correct)
    if not b.all():
        raise ValueError(f"breakage is measured on a healthy panel, but {int((~b).sum())} of {len(b)} were wrong before")
    return _rate(int((~a).sum()), len(a))
