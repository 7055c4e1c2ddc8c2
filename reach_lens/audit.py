"""What per-question records add up to: D, vote@K, O_K, reach@k curves, gaps, fates, intervals.

The records themselves (their columns, and the one place that builds them) are ``reach_lens.records``:
one row per question with d (deployed correct), K, hits, o (some candidate correct), format_failures,
vote_answer / vote_correct and the candidates.
"""
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
    _require(records, ("K", "hits"))
    K, n = _single_K(records), len(records)
    ks = list(range(1, K + 1)) if ks is None else sorted(set(int(k) for k in ks))
    bad = [k for k in ks if not 1 <= k <= K]
    if bad or not ks:
        raise ValueError(f"ks {bad or ks} out of range 1..{K}")
    mean, lo, hi = curve_band(pass_at_ks(records["hits"], K, ks), n_boot=n_boot, seed=seed)
    return pd.DataFrame({"k": ks, "reach": mean, "lo": lo, "hi": hi, "n": n, "K": K})


def curve_band(values: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over questions of per-question curves ``values`` [n, k] and its 95% bootstrap band: one resample
    of questions (multinomial weights) is shared by every k, so the band is that of one curve."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or len(values) == 0:
        raise ValueError(f"values must be [n questions, k points] with n >= 1, got shape {values.shape}")
    n = len(values)
    weights = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot)  # [n_boot, n]
    boot = weights @ values / n  # [n_boot, k]
    lo, hi = np.quantile(boot, [0.025, 0.975], axis=0)
    return values.mean(axis=0), lo, hi


def wilson_band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Share of questions per point of 0/1 per-question curves ``values`` [n, k] and its pointwise Wilson 95%
    interval (each point is a proportion of n questions): (mean [k], lo [k], hi [k])."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or len(values) == 0:
        raise ValueError(f"values must be [n questions, k points] with n >= 1, got shape {values.shape}")
    if not np.isin(values, (0.0, 1.0)).all():
        raise ValueError("values must be 0/1 per question (a proportion); use curve_band for other per-question values")
    n, hits = len(values), values.sum(axis=0).round().astype(int)
    lo, hi = np.array([wilson_interval(int(c), n) for c in hits]).T
    return values.mean(axis=0), lo, hi


def census_cell(screened: pd.DataFrame, min_failures: int) -> dict:
    """One census cell from its screen (columns recognized, generated, gen_format_ok; one row per question).

    n; recognition_acc and generation_acc with Wilson 95% bounds (_lo, _hi); format_failure_rate (greedy
    answers with no extractable answer); n_fail (recognized, not generated) and n_healthy (both); and
    meets_criterion (`meets_criterion`).
    """
    _require(screened, ("recognized", "generated", "gen_format_ok"), "screen")
    n = len(screened)
    recognized, generated = screened["recognized"].astype(bool), screened["generated"].astype(bool)
    rec, gen = _rate(int(recognized.sum()), n), _rate(int(generated.sum()), n)
    n_fail = int((recognized & ~generated).sum())
    return {"n": n, "recognition_acc": rec.rate, "recognition_lo": rec.lo, "recognition_hi": rec.hi,
            "generation_acc": gen.rate, "generation_lo": gen.lo, "generation_hi": gen.hi,
            "format_failure_rate": 1.0 - float(screened["gen_format_ok"].astype(bool).mean()),
            "n_fail": n_fail, "n_healthy": int((recognized & generated).sum()),
            "meets_criterion": meets_criterion(rec, gen, n_fail, min_failures)}


def meets_criterion(recognition: "Rate", generation: "Rate", n_fail: int, min_failures: int) -> bool:
    """The census criterion: recognition accuracy above generation accuracy with disjoint 95% Wilson intervals
    (recognition's lower bound above generation's upper bound), and at least ``min_failures`` questions
    recognized but not generated (a failure set large enough for the localization study)."""
    return bool(recognition.lo > generation.hi and n_fail >= min_failures)


def summarize(records: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> dict:
    """Aggregates of one record table, each X with X_lo, X_hi (95%).

    D (deployed), vote (vote@K), O (O_K) and deployed_format_failure_rate: Wilson intervals.
    gap = O - D and selection_gap = O - vote: paired bootstrap over questions. gap is a net share: its questions
    reached_not_said (O and not D, a count) minus said_not_reached (D and not O, a count), over n.
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


def guesser_reach(option_counts: Sequence[int] | None, k: int | Sequence[int]) -> float | np.ndarray:
    """How often a uniform guesser over each question's options names the gold one at least once in k tries,
    ``1 - (1 - 1/m)^k`` averaged over the questions (m options each), for one k or each of several; NaN for
    free-form questions (``option_counts`` None or empty: no floor)."""
    ks = np.atleast_1d(np.asarray(k, dtype=np.float64))
    if not option_counts:
        out = np.full(len(ks), np.nan)
    else:
        m = np.asarray(option_counts, dtype=np.float64)
        if (m < 2).any() or (ks < 1).any():
            raise ValueError(f"option counts {list(option_counts)[:5]}... and k={k}: expected >= 2 options and k >= 1")
        out = (1 - (1 - 1 / m[None, :]) ** ks[:, None]).mean(axis=1)
    return float(out[0]) if np.ndim(k) == 0 else out


def options_per_question(questions: Sequence[Any]) -> list[int] | None:
    """Each question's number of options, or None when they are free-form (no guessing floor)."""
    counts = [len(q.options) for q in questions]
    return counts if counts and all(counts) else None


def guessing_floor(option_counts: Sequence[int], K: int) -> tuple[float, float]:
    """What a uniform guesser over each question's options reaches: (deployed 1/m, oracle 1 - (1 - 1/m)^K), averaged
    over questions with ``option_counts`` m options each. A multiple-choice O_K is read against the second."""
    m = np.asarray(option_counts, dtype=np.float64)
    if len(m) == 0 or (m < 2).any() or K < 1:
        raise ValueError(f"option counts {list(option_counts)[:5]}... and K={K}: expected >= 2 options and K >= 1")
    return float(np.mean(1 / m)), float(np.mean(1 - (1 - 1 / m) ** K))


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
    and reported by a warning. Duplicate ids, a gold answer or a K that differs between the tables, are errors.
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
    k_differ = j.loc[j["K_base"] != j["K_trained"], "question_id"].tolist()
    if k_differ:
        raise ValueError(f"candidate budgets differ between base and trained (K {sorted(set(j['K_base']))} vs "
                         f"{sorted(set(j['K_trained']))}, e.g. for {k_differ[:5]}): reachability is only comparable "
                         "at one K")
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


# the paper's Figure 7 bins, as hit-rate edges: 0, (0, 5%], (5%, 15%], (15%, 35%], (35%, 100%] (see hit_rate_bins)
PAPER_HIT_RATE_EDGES = (0.0, 0.05, 0.15, 0.35, 1.0)


def hit_rate_bins(K: int, edges: Sequence[float] | None = None) -> list[tuple[int, int]]:
    """The propensity bins of hit rates hits/K over K samples, as inclusive ranges of hit counts [(lo, hi), ...].

    Bins follow K: every bin holds at least one achievable hit rate c/K and every c in 0..K is in exactly one bin.
    The first bin is (0, 0) (no hit: base-unreachable); the others tile 1..K in order, the lowest starting at one
    hit in K.

    ``edges=None`` (the default): doubling counts. Bins start at 1 and at each power of two below K (1, 2, 4, 8,
    ...); each runs to the next start - 1, the last one to K. In hit rates: [1/K, 2/K), [2/K, 4/K), ...,
    [2^j/K, 1] with 2^j the largest power of two below K (K = 1 and K = 2 have the one non-zero bin 1..K):
        K = 4:   0 | 1 | 2-4
        K = 16:  0 | 1 | 2-3 | 4-7 | 8-16
        K = 32:  0 | 1 | 2-3 | 4-7 | 8-15 | 16-32
        K = 200: 0 | 1 | 2-3 | 4-7 | 8-15 | 16-31 | 32-63 | 64-127 | 128-200
    At 2K the rate edges 2^i/(2K) include every edge at K, plus one finer bin at the bottom (1 of 2K).

    ``edges``: hit-rate edges 0 = e_0 < e_1 < ... < e_m = 1 instead (e.g. `PAPER_HIT_RATE_EDGES`): a bin holds the
    c with e_(i-1) < c/K <= e_i, and a bin no c/K falls in is merged into the next one (at K = 16 the paper's
    (0, 5%] holds no c/16, so 1 of 16 = 6.25% opens (0, 15%]: counts 1-2).

    Returns [(0, 0), (lo_1, hi_1), ..., (lo_b, K)]: 1 + b int pairs, lo_1 = 1, lo_i <= hi_i, lo_(i+1) = hi_i + 1.
    """
    K = int(K)
    if K < 1:
        raise ValueError(f"K={K}: a hit rate needs K >= 1 samples")
    if edges is None:
        starts = [1] + [2 ** i for i in range(1, K.bit_length()) if 2 ** i < K]
    else:
        e = _hit_rate_edges(edges)
        counts = np.arange(1, K + 1)
        rate = counts / K  # the float c/K compared with the float edges: 3/20 <= 0.15 holds
        firsts = [counts[(rate > lo) & (rate <= hi)] for lo, hi in zip(e, e[1:])]
        starts = [int(c[0]) for c in firsts if len(c)]  # an empty bin has no start: the next bin takes its rates
    return [(0, 0)] + [(lo, hi - 1) for lo, hi in zip(starts, starts[1:])] + [(starts[-1], K)]


def hit_rate_bin_labels(K: int, edges: Sequence[float] | None = None) -> list[str]:
    """``["0 of 16", "1 of 16", "2-3 of 16", ...]``: the names of the `hit_rate_bins` (K, edges), in hits of K."""
    return [f"{lo} of {K}" if lo == hi else f"{lo}-{hi} of {K}" for lo, hi in hit_rate_bins(K, edges)]


def _hit_rate_edges(bins: Sequence[float]) -> list[float]:
    edges = [float(e) for e in bins]
    if len(edges) < 2 or any(a >= b for a, b in zip(edges, edges[1:])) or edges[0] != 0 or edges[-1] != 1:
        raise ValueError(f"bins {edges} must be >= 2 strictly increasing edges from 0 to 1 "
                         "(bins: exactly 0, then (lo, hi] between consecutive edges)")
    return edges


def independence_baseline(realized: Sequence[bool], groups: Sequence[int], n_groups: int, n_perm: int = 10000,
                          seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What each group's count of realized questions would be if realization were independent of the grouping:
    the expected count (total realized x the group's share of questions) and a 95% permutation interval (the
    realized labels shuffled over the questions ``n_perm`` times). ``realized`` [n] and ``groups`` [n] (ints in
    0..n_groups-1) describe the same questions. Returns (expected, lo, hi), each [n_groups]."""
    realized, groups = np.asarray(realized, dtype=bool), np.asarray(groups, dtype=np.int64)
    if realized.shape != groups.shape or realized.ndim != 1:
        raise ValueError(f"realized {realized.shape} and groups {groups.shape} must be equal 1-d shapes")
    if len(groups) and not (0 <= groups.min() and groups.max() < n_groups):
        raise ValueError(f"groups {sorted(set(groups.tolist()))[:10]} out of range 0..{n_groups - 1}")
    sizes = np.bincount(groups, minlength=n_groups)
    if len(groups) == 0:
        empty = np.zeros(n_groups)
        return empty, empty, empty
    expected = realized.sum() * sizes / len(groups)
    rng = np.random.default_rng(seed)
    shuffled = np.stack([rng.permutation(realized) for _ in range(n_perm)])  # [n_perm, n]
    counts = np.stack([shuffled[:, groups == g].sum(axis=1) for g in range(n_groups)], axis=1)  # [n_perm, groups]
    lo, hi = np.quantile(counts, [0.025, 0.975], axis=0)
    return expected, lo, hi


def gains_under_independence(fates_df: pd.DataFrame, n_perm: int = 10000, seed: int = 0) -> dict:
    """Of the questions the base does not realize, the gains (newly realized) that would come from base-reachable
    ones if gaining were independent of base reachability: ``expected`` and its 95% permutation interval
    (``lo``, ``hi``), beside the ``observed`` count, from a `fates` table."""
    unrealized = fates_df[~fates_df["d_base"].astype(bool)]
    gained = unrealized["d_trained"].astype(bool).to_numpy()
    reachable = unrealized["o_base"].astype(bool).to_numpy().astype(np.int64)
    expected, lo, hi = independence_baseline(gained, reachable, 2, n_perm, seed)
    return {"observed": int((gained & reachable.astype(bool)).sum()), "expected": float(expected[1]),
            "lo": float(lo[1]), "hi": float(hi[1])}


def poisson_binomial_pmf(p: Sequence[float] | np.ndarray) -> np.ndarray:
    """The exact distribution of the number of successes of independent Bernoulli(p_i) trials: pmf [len(p) + 1],
    built by convolving one trial at a time (O(n^2))."""
    p = np.asarray(p, dtype=np.float64).ravel()
    if not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"probabilities must lie in [0, 1], got {p[~((p >= 0) & (p <= 1))][:5]}")
    pmf = np.ones(1)
    for q in p:
        pmf = np.append(pmf * (1 - q), 0.0) + np.insert(pmf * q, 0, 0.0)
    return pmf


def poisson_binomial_interval(p: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[int, int]:
    """The central ``level`` interval of the number of successes of independent Bernoulli(p_i) trials: its
    (1 - level)/2 and (1 + level)/2 quantiles (each the smallest count whose cumulative probability reaches the
    quantile), from the exact `poisson_binomial_pmf`."""
    if not 0 < level < 1:
        raise ValueError(f"level={level} must be in (0, 1)")
    cdf = np.cumsum(poisson_binomial_pmf(p))
    lo, hi = (int(np.searchsorted(cdf, q - 1e-12)) for q in ((1 - level) / 2, (1 + level) / 2))
    return lo, min(hi, len(cdf) - 1)


def gains_under_resampling(fates_df: pd.DataFrame, hit_rate: Mapping[Any, float] | pd.Series | None = None,
                           level: float = 0.95) -> dict:
    """Gains (newly realized questions) if the trained greedy answer were one draw from the base's own samples:
    a question the base does not realize is gained with probability p_i = its base hit rate, independently over
    questions, so the number of gains is Poisson-binomial with mean sum p_i. From a `fates` table (its reachable /
    unreachable split is the table's: base o at its K).

    ``hit_rate``: each question's base hit rate by question_id (e.g. hits / K over all of the base's 2K samples,
    of which the fates' K are the first); default: the fates table's own hits_base / K_base. With the default a
    base-unreachable question has p_i = 0, so the null's gains all come from base-reachable questions; with more
    samples than the fates' K, a question without a hit in the first K may have one later and a p_i > 0.

    Returns: observed (gains from base-reachable questions), observed_unreachable (gains from base-unreachable
    ones), expected (sum of p_i over base-unrealized, base-reachable questions), lo, hi (the ``level`` interval
    of that count: `poisson_binomial_interval`), expected_unreachable (sum of p_i over base-unrealized,
    base-unreachable questions: 0 with the default hit rates) with unreachable_lo, unreachable_hi, and n (the
    base-unrealized questions).
    """
    _require(fates_df, ("question_id", "d_base", "o_base", "hits_base", "K_base", "d_trained"), "fates")
    unrealized = fates_df[~fates_df["d_base"].astype(bool)]
    if hit_rate is None:
        p = (unrealized["hits_base"] / unrealized["K_base"]).to_numpy(dtype=np.float64)
    else:
        rates = pd.Series(hit_rate, dtype=np.float64)
        missing = sorted(set(unrealized["question_id"]) - set(rates.index))
        if missing:
            raise ValueError(f"hit_rate lacks {len(missing)} base-unrealized questions, e.g. {missing[:5]}")
        p = rates.loc[unrealized["question_id"]].to_numpy(dtype=np.float64)
    reachable = unrealized["o_base"].astype(bool).to_numpy()
    gained = unrealized["d_trained"].astype(bool).to_numpy()
    lo, hi = poisson_binomial_interval(p[reachable], level)
    u_lo, u_hi = poisson_binomial_interval(p[~reachable], level)
    return {"observed": int((gained & reachable).sum()), "observed_unreachable": int((gained & ~reachable).sum()),
            "expected": float(p[reachable].sum()), "lo": lo, "hi": hi,
            "expected_unreachable": float(p[~reachable].sum()), "unreachable_lo": u_lo, "unreachable_hi": u_hi,
            "n": int(len(unrealized))}


def crossover(base_per_question: np.ndarray, trained_per_question: np.ndarray, ks: Sequence[int],
              n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """Where a base's reach@k curve meets a trained checkpoint's, from per-question curves [n questions, len(ks)]
    of the same questions in the same order (e.g. pass_at_k per question; reach@k is their column mean).

    k_cross: the smallest k (of ``ks``, increasing) at which base reach@k >= trained reach@k (up to 1e-12), where
    the base overtakes (ks[0] when the trained checkpoint is never ahead); None when the trained one stays ahead at
    every k.
    k_min_gap: the k of the smallest gap trained - base (the first such k on ties), min_gap that gap, and lo, hi
    its paired question-bootstrap ``level`` interval at that k (questions resampled jointly for both checkpoints;
    k_min_gap is not re-chosen per resample).
    """
    b = np.asarray(base_per_question, dtype=np.float64)
    t = np.asarray(trained_per_question, dtype=np.float64)
    ks = [int(k) for k in ks]
    if b.ndim != 2 or b.shape != t.shape or b.shape[1] != len(ks) or len(b) == 0:
        raise ValueError(f"base {b.shape} and trained {t.shape} must be one [n >= 1, len(ks) = {len(ks)}] shape")
    if any(a >= c for a, c in zip(ks, ks[1:])):
        raise ValueError(f"ks {ks[:10]} must increase")
    diff = t - b  # [n, k]
    gap = diff.mean(axis=0)
    behind = np.flatnonzero(gap <= 1e-12)  # base >= trained, up to the rounding of two means of equal values
    j = int(np.argmin(gap))
    n = len(diff)
    weights = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot)  # [n_boot, n]
    lo, hi = np.quantile(weights @ diff[:, j] / n, [(1 - level) / 2, (1 + level) / 2])
    return {"k_cross": int(ks[behind[0]]) if len(behind) else None, "k_min_gap": ks[j], "min_gap": float(gap[j]),
            "lo": float(lo), "hi": float(hi)}


def realization_by_hit_rate_bin(base: pd.DataFrame, trained: pd.DataFrame,
                                bins: Sequence[float] | None = None, n_perm: int = 10000,
                                seed: int = 0) -> pd.DataFrame:
    """Propensity (the paper's Figure 7): among questions the base does NOT realize, the share the trained
    checkpoint realizes, by the base hit count (hits of the base's K samples), with Wilson 95% intervals.

    Bins: `hit_rate_bins` (K, bins) for the base's K (one K for all records): 0 hits (base-unreachable: the
    reference bin), then hit counts doubling from 1 (K = 16: 1, 2-3, 4-7, 8-16), or, with ``bins`` hit-rate
    edges, (lo, hi] between them with bins no c/K reaches merged into the next. Every bin but the first holds
    base-reachable, base-unrealized questions. Questions the base already realizes are in no bin. An empty bin is
    a row with n = 0 and realization NaN (never dropped).

    Returns one row per bin; columns: K (the samples the hit rate and the bins are over), bin (its label, e.g.
    "2-3 of 16"), hits_lo, hits_hi (the bin's hit counts, inclusive), bin_lo, bin_hi (the same as hit rates:
    hits_lo/K, hits_hi/K, inclusive), base_reachable, n, realized, realization, realization_lo,
    realization_hi, and the chance baseline: expected_realized (the bin's count if realization were
    independent of the base hit rate) with its 95% permutation interval (expected_lo, expected_hi;
    ``independence_baseline``).
    """
    _require(base, _FATE_COLUMNS, "base")
    K = _single_K(base)
    ranges = hit_rate_bins(K, bins)
    j = fates(base, trained)
    j = j[~j["d_base"].astype(bool)]
    hits = j["hits_base"].to_numpy(dtype=np.int64)
    if len(hits) and not (0 <= hits.min() and hits.max() <= K):
        raise ValueError(f"base hit counts {sorted(set(hits.tolist()))[:10]} out of range 0..{K}")
    realized = j["d_trained"].astype(bool).to_numpy()
    groups = np.searchsorted([lo for lo, _ in ranges], hits, side="right") - 1  # [n]: each question's bin
    expected, expected_lo, expected_hi = independence_baseline(realized, groups, len(ranges), n_perm, seed)
    rows = []
    for b, (label, (lo, hi)) in enumerate(zip(hit_rate_bin_labels(K, bins), ranges)):
        mask = groups == b
        n, k = int(mask.sum()), int(realized[mask].sum())
        ci = wilson_interval(k, n)
        rows.append({"K": K, "bin": label, "hits_lo": lo, "hits_hi": hi, "bin_lo": lo / K, "bin_hi": hi / K,
                     "base_reachable": hi > 0, "n": n, "realized": k, "realization": k / n if n else math.nan,
                     "realization_lo": ci[0], "realization_hi": ci[1], "expected_realized": float(expected[b]),
                     "expected_lo": float(expected_lo[b]), "expected_hi": float(expected_hi[b])})
    return pd.DataFrame(rows)


def paired_change(base: pd.DataFrame, trained: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> dict:
    """Base -> trained on the joined questions: D and O_K of each (Wilson 95%), their changes with paired
    bootstrap 95% intervals (questions resampled together on both sides), and the reachable counts.

    Keys: n, K, D_base, D_trained, O_base, O_trained (each with _lo, _hi), D_change, O_change (each with
    _lo, _hi), n_reachable_base, n_reachable_trained, delta_n_reachable (= trained - base reachable count;
    its interval is n * O_change's), n_realized_base, n_realized_trained.
    """
    j = fates(base, trained)
    n, K = len(j), int(j["K_base"].iloc[0])
    out: dict = {"n": n, "K": K}
    for m in ("d", "o"):
        for side in ("base", "trained"):
            x = j[f"{m}_{side}"].astype(bool).to_numpy()
            lo, hi = wilson_interval(int(x.sum()), n)
            out[f"{m.upper()}_{side}"], out[f"{m.upper()}_{side}_lo"], out[f"{m.upper()}_{side}_hi"] = x.mean(), lo, hi
        diff = j[f"{m}_trained"].astype(float).to_numpy() - j[f"{m}_base"].astype(float).to_numpy()
        lo, hi = bootstrap_ci(diff, n_boot=n_boot, seed=seed)
        out[f"{m.upper()}_change"], out[f"{m.upper()}_change_lo"], out[f"{m.upper()}_change_hi"] = diff.mean(), lo, hi
    out["n_reachable_base"], out["n_reachable_trained"] = int(j["o_base"].sum()), int(j["o_trained"].sum())
    out["delta_n_reachable"] = out["n_reachable_trained"] - out["n_reachable_base"]
    out["delta_n_reachable_lo"], out["delta_n_reachable_hi"] = n * out["O_change_lo"], n * out["O_change_hi"]
    out["n_realized_base"], out["n_realized_trained"] = int(j["d_base"].sum()), int(j["d_trained"].sum())
    return out


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
