import math

import numpy as np
import pandas as pd
import pytest

from reach_lens.records import RECORD_COLUMNS, make_record
from reach_lens.select import (SELECTORS, hidden_medoid, likelihood_weighted_vote, majority_vote, max_mean_logprob,
                               min_entropy, recovery, recovery_table)


def cand(answer, correct=False, lp=-1.0, length=10, **extra):
    return {"text": f"... {answer}", "answer": answer, "correct": correct, "mean_logprob": lp, "length": length, **extra}


def test_majority_vote_picks_most_frequent_and_returns_first_index():
    cs = [cand("3"), cand("5"), cand("5"), cand("3", lp=-0.1), cand("5")]
    assert majority_vote(cs) == 1


def test_majority_vote_ignores_format_failures_even_when_most_frequent():
    cs = [cand(None), cand(None), cand(None), cand("7"), cand("8"), cand("8")]
    assert majority_vote(cs) == 4


def test_majority_vote_tie_goes_to_larger_summed_sequence_logprob():
    # "a": 2 votes, summed seq log-prob -1*10 + -1*10 = -20; "b": 2 votes, -0.5*10 + -2*4 = -13 -> "b" wins
    cs = [cand("a"), cand("b", lp=-0.5), cand("a"), cand("b", lp=-2.0, length=4)]
    assert majority_vote(cs) == 1
    # length matters: same mean log-probs, but "a" is much shorter -> larger summed log-prob
    cs = [cand("b", lp=-1.0, length=50), cand("a", lp=-1.0, length=5)]
    assert majority_vote(cs) == 1


def test_majority_vote_full_tie_goes_to_first_occurrence():
    cs = [cand(None), cand("x"), cand("y"), cand("y"), cand("x")]
    assert majority_vote(cs) == 1


def test_votes_with_no_parsed_answer_return_zero():
    cs = [cand(None), cand(None)]
    assert majority_vote(cs) == 0
    assert likelihood_weighted_vote(cs) == 0


def test_likelihood_weighted_vote_sums_exp_mean_logprob():
    # "a": 2 * exp(-3) = 0.0996; "b": exp(-0.5) = 0.607 -> b, although a has more votes
    cs = [cand("a", lp=-3.0), cand("a", lp=-3.0), cand("b", lp=-0.5)]
    assert likelihood_weighted_vote(cs) == 2
    # three weak votes beat one strong one: 3 * exp(-1) = 1.10 > exp(-0.1) = 0.905
    cs = [cand("b", lp=-0.1), cand("a"), cand("a"), cand("a")]
    assert likelihood_weighted_vote(cs) == 1
    # exact tie -> first occurrence
    cs = [cand("b"), cand("a")]
    assert likelihood_weighted_vote(cs) == 0


def test_max_mean_logprob_skips_format_failures_and_breaks_ties_first():
    cs = [cand(None, lp=-0.01), cand("a", lp=-2.0), cand("b", lp=-0.5), cand("c", lp=-0.5)]
    assert max_mean_logprob(cs) == 2
    assert max_mean_logprob([cand(None, lp=-3.0), cand(None, lp=-1.0)]) == 1  # all failed: pool is everything


def test_min_entropy_and_missing_channel_error():
    cs = [cand("a", entropy=0.9), cand(None, entropy=0.1), cand("b", entropy=0.3), cand("c", entropy=0.3)]
    assert min_entropy(cs) == 2
    with pytest.raises(ValueError, match=r"candidates \[1\] lack 'entropy'"):
        min_entropy([cand("a", entropy=0.2), cand("b")])
    with pytest.raises(ValueError, match=r"candidates \[0\] lack 'entropy'"):
        min_entropy([cand("a", entropy=None)])  # None after a parquet round trip counts as missing


def test_hidden_medoid_is_the_candidate_closest_to_the_others():
    # three vectors around the +x axis and one on the -x axis: the middle of the cluster is the medoid
    cs = [cand("a", hidden=[1.0, 0.3]), cand("b", hidden=[-1.0, 0.0]), cand("c", hidden=[1.0, 0.0]),
          cand("d", hidden=[1.0, -0.3])]
    assert hidden_medoid(cs) == 2
    # cosine ignores scale; a format failure is outside the pool even if it would be the medoid
    cs = [cand(None, hidden=[1.0, 0.0]), cand("a", hidden=[5.0, 0.0]), cand("b", hidden=[0.0, 2.0])]
    assert hidden_medoid(cs) == 1  # two-member pool: equal sums, first wins
    assert hidden_medoid([cand("a", hidden=np.array([1.0, 2.0]))]) == 0
    with pytest.raises(ValueError, match="zero"):
        hidden_medoid([cand("a", hidden=[0.0, 0.0]), cand("b", hidden=[1.0, 0.0])])
    with pytest.raises(ValueError, match="lack 'hidden'"):
        hidden_medoid([cand("a")])


def test_selectors_reject_empty_and_non_finite():
    for name, select in SELECTORS.items():
        with pytest.raises(ValueError, match="0 candidates"):
            select([])
    with pytest.raises(ValueError, match="non-finite"):
        max_mean_logprob([cand("a", lp=math.nan)])


def test_recovery_arithmetic_and_undefined_cases():
    assert recovery(0.5, 0.4, 0.8) == pytest.approx(0.25)
    assert recovery(0.3, 0.4, 0.8) == pytest.approx(-0.25)
    assert math.isnan(recovery(0.5, 0.4, 0.4))
    assert math.isnan(recovery(0.5, 0.6, 0.4))  # oracle below greedy: nothing to recover


def _record(cell, d, cands):
    return {"cell": cell, "d": d, "o": any(c["correct"] for c in cands), "K": len(cands), "candidates": cands}


def test_recovery_table_per_cell():
    recs = pd.DataFrame([
        # cell A: greedy 0/2, oracle 2/2; majority picks right on q1 only; max_mean_logprob on both
        _record("A", False, [cand("1", True, lp=-0.2), cand("2", lp=-0.9), cand("1", True, lp=-0.3)]),
        _record("A", False, [cand("4", lp=-0.8), cand("4", lp=-0.9), cand("5", True, lp=-0.1)]),
        # cell B: greedy = oracle -> recovery NaN
        _record("B", True, [cand("1", True), cand("1", True), cand("2")]),
    ])
    t = recovery_table(recs, {"majority_vote": majority_vote, "max_mean_logprob": max_mean_logprob}, by=["cell"])
    t = t.set_index(["cell", "selector"])
    assert t.loc[("A", "majority_vote"), "selector_acc"] == 0.5
    assert t.loc[("A", "majority_vote"), "recovery"] == 0.5
    assert t.loc[("A", "max_mean_logprob"), "recovery"] == 1.0
    assert t.loc[("A", "max_mean_logprob"), "n"] == 2 and t.loc[("A", "max_mean_logprob"), "K"] == 3
    assert math.isnan(t.loc[("B", "majority_vote"), "recovery"])
    # against greedy on the same questions: max_mean_logprob alone answers both of A's (2 vs 0, p = 0.5)
    a = t.loc[("A", "max_mean_logprob")]
    assert (a.selector_only, a.greedy_only, a.vs_greedy, a.vs_greedy_p) == (2, 0, 1.0, 0.5)
    assert a.vs_greedy_lo < 1.0 == a.vs_greedy_hi
    b = t.loc[("B", "majority_vote")]  # both right on B's one question: no discordant pair, p = 1
    assert (b.selector_only, b.greedy_only, b.vs_greedy, b.vs_greedy_p) == (0, 0, 0.0, 1.0)
    whole = recovery_table(recs, {"majority_vote": majority_vote})
    assert len(whole) == 1 and whole.loc[0, "n"] == 3
    with pytest.raises(ValueError, match="lack columns"):
        recovery_table(recs.drop(columns="o"), SELECTORS)


def test_recovery_table_reads_records_built_by_make_record():
    # the majority-vote channel of recovery_table agrees with the vote that make_record stored
    specs = [(False, [cand("1", True), cand("2"), cand("1", True)]), (False, [cand("4"), cand("4"), cand("5", True)]),
             (True, [cand(None), cand("7", True), cand("8")])]
    recs = pd.DataFrame([make_record(f"q{i}", "g", {"text": "", "answer": "x", "correct": d}, cs, majority_vote(cs))
                         for i, (d, cs) in enumerate(specs)])
    assert set(recs.columns) == set(RECORD_COLUMNS)
    t = recovery_table(recs, {"majority_vote": majority_vote}).iloc[0]
    assert t.selector_acc == pytest.approx(recs.vote_correct.mean()) == pytest.approx(2 / 3)
    assert (t.greedy, t.oracle, t.K) == (pytest.approx(1 / 3), 1.0, 3)
