"""Selection-study arithmetic (`routing.analysis`): format-collapse flags, recovery with the learned router, medians
over clean cells; and the one bootstrap band routing curves and reach curves share (`stats.curve_band`)."""
import numpy as np
import pandas as pd
import pytest

from reach_lens.audit import reach_curve
from reach_lens.stats import curve_band, pass_at_k, wilson_interval
from reach_lens.records import make_record
from reach_lens.routing import analysis
from reach_lens.select import SELECTORS, majority_vote


def records(answers: list[list[str | None]], gold: str = "B", deployed: str = "A") -> pd.DataFrame:
    rows = []
    for i, ans in enumerate(answers):
        cands = [{"text": a or "?", "answer": a, "correct": a == gold, "mean_logprob": -1.0 - 0.1 * k, "length": 3,
                  "entropy": 1.0 + 0.1 * k, "hidden": [1.0, float(k)]} for k, a in enumerate(ans)]
        rows.append(make_record(f"q{i}", gold, {"text": deployed, "answer": deployed, "correct": deployed == gold},
                                cands, majority_vote(cands)))
    return pd.DataFrame(rows)


CLEAN = records([["A", "B", "B", "C"], ["B", "A", "A", None], ["C", "C", "B", "A"]])  # 1 of 12 unextractable
COLLAPSED = records([[None, None, "B", None], [None, "A", None, None], ["B", None, None, "B"]])  # 8 of 12


def test_format_collapse_flags_the_cell_above_the_threshold():
    clean = analysis.recovery_rows(CLEAN, SELECTORS, collapse_threshold=0.5)
    collapsed = analysis.recovery_rows(COLLAPSED, SELECTORS, collapse_threshold=0.5)
    assert clean.format_failure_rate.unique().tolist() == [1 / 12] and not clean.collapsed.any()
    assert collapsed.format_failure_rate.unique().tolist() == [8 / 12] and collapsed.collapsed.all()
    assert analysis.recovery_rows(COLLAPSED, SELECTORS, collapse_threshold=0.7).collapsed.sum() == 0
    vote = clean.set_index("selector").loc["majority_vote"]
    assert (vote.greedy, vote.oracle, vote.selector_acc) == (0.0, 1.0, pytest.approx(1 / 3))  # B, A, C win
    assert vote.recovery == pytest.approx(1 / 3)


def test_medians_leave_collapsed_cells_out():
    rec = pd.concat([analysis.recovery_rows(CLEAN, SELECTORS).assign(task="clean", probe="routes"),
                     analysis.recovery_rows(COLLAPSED, SELECTORS).assign(task="collapsed", probe="routes")])
    summary = analysis.recovery_summary(rec).set_index("selector")
    clean = analysis.recovery_rows(CLEAN, SELECTORS).set_index("selector")
    for selector in SELECTORS:
        assert summary.loc[selector, "median"] == pytest.approx(clean.loc[selector, "recovery"])
        assert (summary.loc[selector, "cells_defined"], summary.loc[selector, "collapsed_cells"]) == (1, 1)
    only_collapsed = analysis.recovery_summary(rec[rec.task == "collapsed"])
    assert only_collapsed["median"].isna().all() and (only_collapsed.cells_defined == 0).all()


def test_cell_recovery_adds_the_learned_router_to_the_route_probe():
    router = pd.DataFrame({"question_id": ["q2", "q0", "q1"], "correct": [True, True, False]})
    rows = analysis.cell_recovery({"routes": CLEAN, "T0.8": COLLAPSED}, router, SELECTORS, collapse_threshold=0.5)
    assert sorted(rows[rows.probe == "routes"].selector) == sorted([*SELECTORS, analysis.ROUTER])
    assert analysis.ROUTER not in set(rows[rows.probe == "T0.8"].selector)
    r = rows[rows.selector == analysis.ROUTER].iloc[0]
    assert (r.selector_acc, r.greedy, r.oracle, r.recovery) == pytest.approx((2 / 3, 0.0, 1.0, 2 / 3))
    assert not r.collapsed and rows[rows.probe == "T0.8"].collapsed.all()
    # every share carries its Wilson interval, the router's row too, each right after its column
    assert (r.selector_acc_lo, r.selector_acc_hi) == wilson_interval(2, 3)
    assert (r.greedy_lo, r.greedy_hi, r.oracle_lo, r.oracle_hi) == (*wilson_interval(0, 3), *wilson_interval(3, 3))
    for _, row in rows.iterrows():
        assert (row.greedy_lo, row.greedy_hi) == wilson_interval(round(row.greedy * row.n), row.n)
    columns = list(rows.columns)
    assert columns[columns.index("greedy"):columns.index("greedy") + 3] == ["greedy", "greedy_lo", "greedy_hi"]


def test_found_in_reads_route_candidates():
    recs = CLEAN.copy()
    recs["candidates"] = [[{**c, "route": [0, 1]} for c in cands] for cands in recs.candidates]
    assert analysis.found_in(recs)["q0"] == [((0, 1), 0.0), ((0, 1), 1.0), ((0, 1), 1.0), ((0, 1), 0.0)]


def test_reach_curve_and_routing_curves_share_one_bootstrap_band():
    recs = records([["A", "B", "B", "C"], ["A", "A", "A", "A"], ["B", "B", "B", "B"], ["C", None, "B", "A"]])
    curve = reach_curve(recs, n_boot=300, seed=4)
    per_q = np.array([[pass_at_k(4, int(h), k) for k in range(1, 5)] for h in recs.hits])
    mean, lo, hi = curve_band(per_q, n_boot=300, seed=4)
    np.testing.assert_allclose(curve.reach, mean)
    np.testing.assert_allclose(curve.lo, lo)
    np.testing.assert_allclose(curve.hi, hi)
    assert (lo <= mean + 1e-12).all() and (mean <= hi + 1e-12).all()
    with pytest.raises(ValueError, match=r"values must be \[n questions, k points\]"):
        curve_band(np.zeros(3))
