"""Statistics that know nothing of records or studies: binomial (Wilson) and bootstrap intervals, unbiased pass@k,
the uniform guesser's floor, paired repair / breakage rates, the paired comparison of two 0/1 outcomes on the same
questions (exact McNemar test, Newcombe interval), and the Poisson-binomial and permutation nulls."""
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054


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


def guessing_floor(option_counts: int | Sequence[int] | None, k: int | Sequence[int]) -> float | np.ndarray:
    """The uniform guesser's floor: how often a guesser over each question's options names the gold one at least
    once in k tries, ``1 - (1 - 1/m)^k`` averaged over the questions (m options each), for one k or each of several
    (k = 1: the deployed floor 1/m; k = K: the floor of O_K). ``option_counts``: each question's m, or one int m
    for every question; None or empty for free-form questions: NaN (no floor)."""
    counts = [option_counts] if isinstance(option_counts, int) else option_counts
    ks = np.atleast_1d(np.asarray(k, dtype=np.float64))
    if not counts:
        out = np.full(len(ks), np.nan)
    else:
        m = np.asarray(counts, dtype=np.float64)
        if (m < 2).any() or (ks < 1).any():
            raise ValueError(f"option counts {list(counts)[:5]}... and k={k}: expected >= 2 options and k >= 1")
        out = (1 - (1 - 1 / m[None, :]) ** ks[:, None]).mean(axis=1)
    return float(out[0]) if np.ndim(k) == 0 else out


@dataclass(frozen=True)
class Rate:
    """k of n, with its Wilson 95% interval (`wilson_rate` builds it)."""

    k: int
    n: int
    rate: float
    lo: float
    hi: float

    def to_dict(self, name: str) -> dict:
        """{name, name_lo, name_hi, name_n, name_k}: ready to be a row of a figure's table."""
        return {name: self.rate, f"{name}_lo": self.lo, f"{name}_hi": self.hi, f"{name}_n": self.n, f"{name}_k": self.k}


def wilson_rate(k: int, n: int) -> Rate:
    """The `Rate` k of n with its Wilson 95% interval (rate NaN when n == 0)."""
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
    return wilson_rate(int(a.sum()), len(a))


def breakage_rate(before_correct: Sequence[bool] | np.ndarray, after_correct: Sequence[bool] | np.ndarray) -> Rate:
    """Share of a healthy panel (all right before the intervention) answered wrongly after it."""
    b, a = _paired(before_correct, after_correct)
    if not b.all():
        raise ValueError(f"breakage is measured on a healthy panel, but {int((~b).sum())} of {len(b)} were wrong before")
    return wilson_rate(int((~a).sum()), len(a))


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


def mcnemar_p(a_only: int, b_only: int) -> float:
    """Exact two-sided McNemar p-value: P(a binomial(a_only + b_only, 1/2) count is at least as far from half as
    ``a_only``), i.e. twice the smaller tail, capped at 1; 1 when there is no discordant pair."""
    if a_only < 0 or b_only < 0:
        raise ValueError(f"discordant counts must be >= 0, got {a_only} and {b_only}")
    m = a_only + b_only
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(a_only, b_only) + 1))
    return min(1.0, 2 * tail / 2 ** m)


def paired_comparison(a: Sequence[bool] | np.ndarray, b: Sequence[bool] | np.ndarray, z: float = Z95) -> dict:
    """A vs B on the same questions: ``mean(a) - mean(b)`` with Newcombe's (1998, method 10) square-and-add 95%
    interval for paired proportions (Wilson intervals of the two rates, combined with the continuity-corrected
    correlation of the pairs) and the exact McNemar test. ``a``, ``b``: boolean arrays [n], n >= 1, one entry
    per question.

    Returns diff, lo, hi, p (exact two-sided McNemar; 1 with no discordant pair), n, a_only (questions a gets
    and b misses), b_only, both, neither. The interval and the test are separate methods and can disagree at
    the edge (an interval that just excludes 0 with p just above 0.05, or the reverse).
    """
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"paired outcomes must be two non-empty 1-D arrays of one length, got {a.shape} and {b.shape}")
    n = len(a)
    n11, n12, n21 = int((a & b).sum()), int((a & ~b).sum()), int((~a & b).sum())
    n22 = n - n11 - n12 - n21
    p1, p2 = (n11 + n12) / n, (n11 + n21) / n
    l1, u1 = wilson_interval(n11 + n12, n, z)
    l2, u2 = wilson_interval(n11 + n21, n, z)
    margins = (n11 + n12, n21 + n22, n11 + n21, n12 + n22)
    psi = 0.0
    if min(margins) > 0:
        cross = n11 * n22 - n12 * n21
        if cross > n / 2:
            psi = (cross - n / 2) / math.sqrt(math.prod(margins))
        elif cross < 0:
            psi = cross / math.sqrt(math.prod(margins))
    diff = p1 - p2
    lo = diff - math.sqrt(max((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2), 0.0))
    hi = diff + math.sqrt(max((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1), 0.0))
    return {"diff": diff, "lo": max(-1.0, lo), "hi": min(1.0, hi), "p": mcnemar_p(n12, n21), "n": n,
            "a_only": n12, "b_only": n21, "both": n11, "neither": n22}


def paired_direction(result: Mapping, alpha: float = 0.05) -> str:
    """The side a `paired_comparison` ``result`` favours by its exact test: ``"a"`` or ``"b"`` (the larger
    discordant count) only when p < ``alpha``, else ``"tie"``. Every study's A-vs-B verdict is this rule."""
    if result["p"] >= alpha:
        return "tie"
    return "a" if result["a_only"] > result["b_only"] else "b"


def significance_words(result: Mapping, alpha: float = 0.05, names: tuple[str, str] = ("A", "B")) -> str:
    """The test's verdict in words, the one wording every study prints: ``"A higher, significant at 0.05
    (p = 0.003)"`` or ``"not significant at 0.05 (p = 0.077)"`` (`paired_direction`)."""
    way, p = paired_direction(result, alpha), p_text(result["p"])
    if way == "tie":
        return f"not significant at {alpha:g} ({p})"
    return f"{names[0] if way == 'a' else names[1]} higher, significant at {alpha:g} ({p})"


def paired_verdict(result: Mapping, alpha: float = 0.05, names: tuple[str, str] = ("A", "B")) -> str:
    """A `paired_comparison` ``result`` in one line: e.g. ``"A − B = +8.0 pp [+0.0, +15.9] (12 vs 4 discordant):
    not significant at 0.05 (p = 0.077)"`` (the verdict from `significance_words`)."""
    a, b = names
    return (f"{a} − {b} = {100 * result['diff']:+.1f} pp [{100 * result['lo']:+.1f}, {100 * result['hi']:+.1f}] "
            f"({result['a_only']} vs {result['b_only']} discordant): {significance_words(result, alpha, names)}")


def p_text(p: float) -> str:
    """A p-value in a sentence: ``"p = 0.077"``, or ``"p < 0.001"`` below that (`format_p`)."""
    return f"p {format_p(p)}" if p < 0.001 else f"p = {format_p(p)}"


def format_p(p: float) -> str:
    """A p-value as printed beside an interval: three decimals, ``< 0.001`` below that."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"
