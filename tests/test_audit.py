import itertools
import math
import warnings
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reach_lens.audit import gap_curve, reach_curve, summarize
from reach_lens.rlvr.fates import (REACHABILITY_FATES, REALIZATION_FATES, fate_counts, fates,
                                   realization_by_hit_rate_bin)
from reach_lens.stats import bootstrap_ci, breakage_rate, pass_at_k, repair_rate, wilson_interval
from reach_lens.records import make_record
from reach_lens.select import majority_vote


def cand(answer, correct=False, lp=-1.0, length=10, **extra):
    return {"text": f"so {answer}", "answer": answer, "correct": correct, "mean_logprob": lp, "length": length, **extra}


def deployed(answer, correct):
    return {"text": f"the answer is {answer}", "answer": answer, "correct": correct}


# ---- intervals and pass@k


def test_wilson_known_values():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    with pytest.raises(ValueError, match="out of range"):
        wilson_interval(11, 10)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_enumeration(nck):
    n, c, k = nck
    subsets = list(itertools.combinations(range(n), k))  # candidates 0..c-1 are the correct ones
    brute = Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))
    assert pass_at_k(n, c, k) == pytest.approx(float(brute), abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_range_errors_and_large_n():
    with pytest.raises(ValueError, match=r"k=0 out of range 1..5"):
        pass_at_k(5, 1, 0)
    with pytest.raises(ValueError, match=r"c=6 out of range 0..5"):
        pass_at_k(5, 6, 1)
    # K=200 is fine as a product where the binomials would be astronomically large
    assert pass_at_k(200, 1, 1) == pytest.approx(1 / 200)
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)


def test_bootstrap_ci_properties():
    assert bootstrap_ci([0.3] * 20) == pytest.approx((0.3, 0.3))
    x = np.random.default_rng(1).normal(size=200)
    lo, hi = bootstrap_ci(x, seed=3)
    assert lo < x.mean() < hi and hi - lo < 0.5
    assert bootstrap_ci(x, seed=3) == (lo, hi)
    lo_med, hi_med = bootstrap_ci(x, stat=np.median)
    assert lo_med < np.median(x) < hi_med
    with pytest.raises(ValueError, match="non-empty"):
        bootstrap_ci([])


# ---- aggregates (records themselves: tests/test_records.py)


def _table(spec, K=4):
    """spec: list of (qid, d, hits); candidate answers are "g" for correct, "w" otherwise."""
    rows = []
    for q, d, h in spec:
        cands = [cand("g", True) for _ in range(h)] + [cand("w") for _ in range(K - h)]
        rows.append(make_record(q, "g", deployed("g" if d else "w", d), cands, majority_vote(cands)))
    return pd.DataFrame(rows)


def test_reach_curve_endpoints_and_band():
    recs = _table([("a", 0, 0), ("b", 1, 4), ("c", 0, 1), ("d", 1, 2), ("e", 0, 3)], K=4)
    c = reach_curve(recs, n_boot=500, seed=1)
    assert list(c["k"]) == [1, 2, 3, 4] and set(c["n"]) == {5} and set(c["K"]) == {4}
    assert c["reach"].iloc[0] == pytest.approx(np.mean([0, 1, 0.25, 0.5, 0.75]))  # reach@1 = mean hit rate
    assert c["reach"].iloc[-1] == pytest.approx(recs["o"].mean())  # reach@K = O_K
    assert np.all(np.diff(c["reach"]) >= 0)
    assert np.all(c["lo"] <= c["reach"]) and np.all(c["reach"] <= c["hi"])
    pd.testing.assert_frame_equal(c, reach_curve(recs, n_boot=500, seed=1))
    assert list(reach_curve(recs, ks=[4, 2, 2], n_boot=10)["k"]) == [2, 4]
    with pytest.raises(ValueError, match=r"ks \[5\] out of range 1..4"):
        reach_curve(recs, ks=[1, 5])


def test_gap_curve_by_hand_ends_at_summarize_gap():
    recs = _table([("a", 0, 0), ("b", 1, 4), ("c", 0, 1), ("d", 1, 2), ("e", 1, 0)], K=4)
    g = gap_curve(recs, n_boot=500, seed=1)
    assert list(g["k"]) == [1, 2, 3, 4] and set(g["n"]) == {5} and set(g["K"]) == {4}
    # k = 1: hit rates 0, 1, 1/4, 1/2, 0 minus d 0, 1, 0, 1, 1; k = 2 for c: 1 - C(3,2)/C(4,2) = 1/2
    assert g["gap"].iloc[0] == pytest.approx(np.mean([0, 0, 0.25, -0.5, -1]))
    assert g["gap"].iloc[1] == pytest.approx(np.mean([0, 1, 0.5, 1 - 1 / 6, 0]) - 3 / 5)
    assert g["gap"].iloc[-1] == pytest.approx(summarize(recs, n_boot=10)["gap"])  # O_K - D
    assert np.all(g["lo"] <= g["gap"]) and np.all(g["gap"] <= g["hi"])
    assert g["lo"].iloc[0] < 0  # paired: question e (said, never sampled) pulls the band below zero


def test_summarize_values_and_intervals():
    recs = _table([("a", 0, 0), ("b", 1, 4), ("c", 0, 1), ("d", 1, 2), ("e", 0, 3), ("f", 0, 0)], K=4)
    s = summarize(recs, n_boot=500)
    assert (s["n"], s["K"]) == (6, 4)
    assert s["D"] == pytest.approx(2 / 6) and s["O"] == pytest.approx(4 / 6)
    # votes: b (4 g) right, d (2-2 tie, equal log-probs -> first = "g") right, e (3 g) right
    assert s["vote"] == pytest.approx(3 / 6)
    assert s["gap"] == pytest.approx(2 / 6) and s["selection_gap"] == pytest.approx(1 / 6)
    assert (s["reached_not_said"], s["said_not_reached"]) == (2, 0)  # c and e; the net gap is their difference / n
    mixed = summarize(_table([("a", 1, 0), ("b", 0, 2), ("c", 0, 1), ("d", 1, 1)], K=4), n_boot=10)
    assert (mixed["reached_not_said"], mixed["said_not_reached"], mixed["gap"]) == (2, 1, pytest.approx(1 / 4))
    assert (s["D_lo"], s["D_hi"]) == pytest.approx(wilson_interval(2, 6))
    for m in ("D", "vote", "O", "gap", "selection_gap", "format_failure_rate"):
        assert s[f"{m}_lo"] <= s[m] <= s[f"{m}_hi"], m
    assert s["format_failure_rate"] == 0.0 and s["deployed_format_failure_rate"] == 0.0
    with pytest.raises(ValueError, match=r"mix candidate budgets K=\[2, 4\]"):
        summarize(pd.concat([recs, _table([("z", 0, 1)], K=2)]))


# ---- fates


def test_fates_classifies_every_case():
    # qid: (d, hits) in base, (d, hits) in trained, expected realization, expected reachability; K = 4
    cases = {
        "nr_reach": ((0, 2), (1, 3), "newly_realized_from_reachable", "stable_reachable"),
        "nr_unreach": ((0, 0), (1, 1), "newly_realized_from_unreachable", "entered_reachable"),
        "nr_unreach_o0": ((0, 0), (1, 0), "newly_realized_from_unreachable", "stable_unreachable"),
        "lost": ((1, 3), (0, 0), "lost", "left_reachable"),
        "stable_r": ((1, 4), (1, 4), "stable_realized", "stable_reachable"),
        "stable_u": ((0, 0), (0, 0), "stable_unrealized", "stable_unreachable"),
        "entered": ((0, 0), (0, 2), "stable_unrealized", "entered_reachable"),
        "left": ((0, 1), (0, 0), "stable_unrealized", "left_reachable"),
    }
    base = _table([(q, b[0], b[1]) for q, (b, _, _, _) in cases.items()] + [("only_b", 0, 0)])
    trained = _table([("only_t", 1, 1)] + [(q, t[0], t[1]) for q, (_, t, _, _) in reversed(cases.items())])
    with pytest.warns(UserWarning, match="1 ids only in base"):
        f = fates(base, trained)
    assert f.attrs["only_base"] == ["only_b"] and f.attrs["only_trained"] == ["only_t"]
    assert list(f["question_id"]) == list(cases)  # base order
    got = f.set_index("question_id")
    for q, (_, _, real, reach) in cases.items():
        assert (got.loc[q, "realization"], got.loc[q, "reachability"]) == (real, reach), q
    counts = fate_counts(f).set_index(["axis", "fate"])
    assert len(counts) == len(REALIZATION_FATES) + len(REACHABILITY_FATES)
    assert counts.loc[("realization", "newly_realized_from_unreachable"), "count"] == 2
    assert counts.loc[("reachability", "left_reachable"), "count"] == 2
    assert counts.loc[("realization", "lost"), "share"] == pytest.approx(1 / 8)
    assert counts.groupby(level="axis")["count"].sum().tolist() == [8, 8]


def test_fates_rejects_different_questions_and_duplicates():
    base = _table([("a", 0, 0), ("b", 1, 1)])
    other_gold = base.copy()
    other_gold.loc[1, "gold"] = "h"
    with pytest.raises(ValueError, match=r"gold answers differ .*\['b'\]"):
        fates(base, other_gold)
    with pytest.raises(ValueError, match=r"trained has duplicate question_ids \['a'\]"):
        fates(base, pd.concat([base, base.iloc[:1]]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fates(base, base)  # identical id sets: no warning


def test_realization_by_hit_rate_bin():
    base = _table([("u1", 0, 0), ("u2", 0, 0), ("u3", 0, 0), ("m1", 0, 1), ("m2", 1, 2), ("h1", 1, 4), ("h2", 0, 4)])
    trained = _table([("u1", 1, 1), ("u2", 0, 0), ("u3", 0, 0), ("m1", 1, 4), ("m2", 0, 1), ("h1", 1, 4),
                      ("h2", 1, 4)])
    t = realization_by_hit_rate_bin(base, trained, bins=[0, 0.5, 1.0])
    # base-realized m2, h1 are in no bin; 0: u*, (0, 50%] = 1-2 hits of 4: m1 (1 hit), (50%, 100%] = 3-4: h2 (4)
    assert t["bin"].tolist() == ["0 of 4", "1-2 of 4", "3-4 of 4"]
    assert t["hits_lo"].tolist() == [0, 1, 3] and t["hits_hi"].tolist() == [0, 2, 4] and (t["K"] == 4).all()
    assert t["bin_lo"].tolist() == [0, 0.25, 0.75] and t["bin_hi"].tolist() == [0, 0.5, 1.0]
    assert t["n"].tolist() == [3, 1, 1] and t["realized"].tolist() == [1, 1, 1]
    assert t["base_reachable"].tolist() == [False, True, True]
    assert t["realization"].iloc[0] == pytest.approx(1 / 3)
    assert (t["realization_lo"].iloc[0], t["realization_hi"].iloc[0]) == pytest.approx(wilson_interval(1, 3))
    # chance baseline: 3 realized among 5 base-unrealized questions, spread by bin size
    assert t["expected_realized"].tolist() == pytest.approx([3 * 3 / 5, 3 / 5, 3 / 5])
    assert ((t.expected_lo <= t.expected_realized) & (t.expected_realized <= t.expected_hi)).all()
    with pytest.raises(ValueError, match="strictly increasing"):
        realization_by_hit_rate_bin(base, trained, bins=[0, 0.5, 0.5, 1])
    with pytest.raises(ValueError, match="from 0 to 1"):
        realization_by_hit_rate_bin(base, trained, bins=[0.1, 1])
    # default bins follow K = 4: 0 | 1 | 2-4 hits
    d = realization_by_hit_rate_bin(base, trained)
    assert d["bin"].tolist() == ["0 of 4", "1 of 4", "2-4 of 4"] and d["n"].tolist() == [3, 1, 1]
    with pytest.raises(ValueError, match="mix candidate budgets"):
        realization_by_hit_rate_bin(pd.concat([base, _table([("k8", 0, 1)], K=8)]), trained)


# ---- MLP-study arithmetic


def test_repair_and_breakage_rates():
    r = repair_rate([False] * 8, [True, True, True, False, True, True, False, True])
    assert (r.k, r.n, r.rate) == (6, 8, 0.75)
    assert (r.lo, r.hi) == pytest.approx(wilson_interval(6, 8))
    assert r.to_dict("repair") == {"repair": 0.75, "repair_lo": r.lo, "repair_hi": r.hi, "repair_n": 8, "repair_k": 6}
    b = breakage_rate([True] * 5, [True, False, True, True, True])
    assert (b.k, b.n, b.rate) == (1, 5, 0.2)
    with pytest.raises(ValueError, match="1 of 3 were correct before"):
        repair_rate([False, True, False], [True, True, True])
    with pytest.raises(ValueError, match="1 of 2 were wrong before"):
        breakage_rate([True, False], [True, True])
    with pytest.raises(ValueError, match="one length"):
        repair_rate([False], [True, False])
    assert math.isnan(repair_rate([], []).rate)


def test_independence_baseline_and_gains_from_reachable_questions():
    from reach_lens.rlvr.fates import gains_under_independence
    from reach_lens.stats import independence_baseline

    # 40 base-unrealized questions, 10 base-reachable; 8 gains, all from the reachable ones
    rows_b = [(f"r{i}", 0, 2) for i in range(10)] + [(f"u{i}", 0, 0) for i in range(30)]
    rows_t = [(f"r{i}", int(i < 8), 2) for i in range(10)] + [(f"u{i}", 0, 0) for i in range(30)]
    chance = gains_under_independence(fates(_table(rows_b), _table(rows_t)), seed=1)
    assert chance["observed"] == 8 and chance["expected"] == pytest.approx(8 * 10 / 40)
    assert chance["lo"] <= 2 <= chance["hi"] < 8  # what independence gives excludes the observed count
    # gains spread like the questions: observed at the expectation
    rows_t = [(f"r{i}", int(i < 2), 2) for i in range(10)] + [(f"u{i}", int(i < 6), 0) for i in range(30)]
    even = gains_under_independence(fates(_table(rows_b), _table(rows_t)), seed=1)
    assert even["observed"] == 2 and even["expected"] == pytest.approx(2.0) and even["lo"] <= 2 <= even["hi"]
    expected, lo, hi = independence_baseline([True] * 3 + [False] * 7, [0] * 5 + [1] * 5, 3, n_perm=500)
    assert expected.tolist() == pytest.approx([1.5, 1.5, 0.0]) and hi[2] == 0 and (lo <= expected).all()
    with pytest.raises(ValueError, match="out of range 0..1"):
        independence_baseline([True], [2], 2)
