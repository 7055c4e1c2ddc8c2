"""The RLVR study's arithmetic on hand-built records whose answers are known: fates, delta n_reachable, propensity
bins, budget / lineage / format tables; protocol mismatches refused; the verifiable reward; the id-hash split."""
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import legends_off_data
from matplotlib.backends.backend_agg import FigureCanvasAgg

from reach_lens.protocol import Protocol
from reach_lens.records import make_record
from reach_lens.rlvr import tables
from reach_lens.rlvr.audit_run import check_comparable, records_at
from reach_lens.rlvr.fates import (PAPER_HIT_RATE_EDGES, crossover, fate_counts, fates, gains_under_resampling,
                                   hit_rate_bin_labels, hit_rate_bins, realization_by_hit_rate_bin)
from reach_lens.rlvr.rewards import cut_at_stops, task_reward
from reach_lens.rlvr.split import check_disjoint, ids_hash, split_questions
from reach_lens.stats import guessing_floor, poisson_binomial_interval, poisson_binomial_pmf, wilson_interval
from reach_lens.store import ProtocolMismatch
from reach_lens.tasks import Question, get_task
from reach_lens.tasks.mc import make_mc_question


def cand(correct: bool, lp: float = -1.0) -> dict:
    answer = "g" if correct else "x"
    return {"text": answer, "answer": answer, "correct": correct, "mean_logprob": lp, "length": 1}


def record(qid: str, d: int, hits, K: int = 4) -> dict:
    """d: deployed correct; hits: an int (the first `hits` candidates correct) or a list of 0/1 per candidate."""
    flags = [1] * hits + [0] * (K - hits) if isinstance(hits, int) else list(hits)
    cands = [cand(bool(f)) for f in flags]
    deployed = {"text": "g" if d else "x", "answer": "g" if d else "x", "correct": bool(d)}
    return make_record(qid, "g", deployed, cands, vote=0)


def table(rows, K: int = 4) -> pd.DataFrame:
    return pd.DataFrame([record(q, d, h, K) for q, d, h in rows])


# every fate on both axes: (qid, base (d, hits), trained (d, hits))
CASES = [
    ("gain_reach", (0, 2), (1, 3)),        # newly realized from base-reachable; stable reachable
    ("gain_unreach", (0, 0), (1, 1)),      # newly realized from base-unreachable; entered reachable
    ("lost", (1, 3), (0, 0)),              # lost; left reachable
    ("lost_kept", (1, 1), (0, 2)),         # lost; stable reachable
    ("stable_r", (1, 4), (1, 4)),          # stable realized
    ("stable_u", (0, 0), (0, 0)),          # stable unrealized; stable unreachable
    ("entered", (0, 0), (0, 2)),           # stable unrealized; entered reachable
    ("left", (0, 1), (0, 0)),              # stable unrealized; left reachable
]


def pair():
    base = table([(q, b[0], b[1]) for q, b, _ in CASES])
    trained = table([(q, t[0], t[1]) for q, _, t in CASES])
    return base, trained


def test_every_fate_and_the_fates_table():
    base, trained = pair()
    counts = fate_counts(fates(base, trained))
    assert (counts["count"] > 0).all(), counts[counts["count"] == 0]  # every fate occurs at least once
    row = tables.fates_table({"rl": (base, trained)}).iloc[0]
    assert (row.n, row.K) == (8, 4)
    assert (row.gains_from_reachable, row.gains_from_unreachable, row.losses) == (1, 1, 2)
    assert row.net_deployed_change == int(trained["d"].sum() - base["d"].sum()) == 0
    assert (row.entered_reachable, row.left_reachable) == (2, 2)
    assert row.net_reachable_change == int(trained["o"].sum() - base["o"].sum()) == 0


def test_delta_n_reachable_and_table5():
    base = table([("a", 0, 1), ("b", 0, 2), ("c", 1, 1), ("d", 0, 0), ("e", 0, 3)])
    trained = table([("a", 1, 4), ("b", 1, 0), ("c", 1, 0), ("d", 0, 0), ("e", 0, 0)])
    t5 = tables.checkpoint_changes({"rl": (base, trained)}, m=4).iloc[0]
    assert (t5.n, t5.K) == (5, 4)
    assert (t5.n_reachable_base, t5.n_reachable_trained, t5.delta_n_reachable) == (4, 1, -3)
    assert t5.D_base == pytest.approx(0.2) and t5.D_trained == pytest.approx(0.6)
    assert t5.O_base == pytest.approx(0.8) and t5.O_trained == pytest.approx(0.2)
    assert t5.O_change == pytest.approx(-0.6) and t5.D_change == pytest.approx(0.4)
    assert (t5.O_base_lo, t5.O_base_hi) == pytest.approx(wilson_interval(4, 5))
    assert t5.O_change_lo <= t5.O_change <= t5.O_change_hi
    # reach: both reach a, base alone b, c, e: 0 vs 3 discordant, exact McNemar p = 2 / 2**3
    assert (t5.O_change_gained, t5.O_change_lost, t5.O_change_p) == (0, 3, pytest.approx(0.25))
    assert (t5.D_change_gained, t5.D_change_lost, t5.D_change_p) == (2, 0, pytest.approx(0.5))
    assert (t5.delta_n_reachable_lo, t5.delta_n_reachable_hi) == pytest.approx((5 * t5.O_change_lo, 5 * t5.O_change_hi))
    assert t5.floor == pytest.approx(1 - 0.75 ** 4)


@pytest.mark.parametrize("K", [4, 16, 32, 200])
@pytest.mark.parametrize("edges", [None, PAPER_HIT_RATE_EDGES], ids=["doubling", "paper_edges"])
def test_propensity_bins_follow_K(K, edges):
    ranges = hit_rate_bins(K, edges)
    assert ranges[0] == (0, 0)  # the base-unreachable bin stays
    member = np.array([[lo <= c <= hi for lo, hi in ranges] for c in range(K + 1)])  # [K + 1 counts, bins]
    assert (member.sum(axis=1) == 1).all(), ranges  # every c in 0..K in exactly one bin
    assert member[1:, 1:].any(axis=0).all(), ranges  # every non-zero bin holds some achievable c/K, c >= 1
    assert ranges[1][0] == 1 and member[1, 1]  # the lowest non-zero bin starts at (and holds) one hit in K
    # the table: one base-unrealized question per hit count c lands every c in its bin, no bin empty
    base = table([(f"c{c}", 0, c) for c in range(K + 1)], K=K)
    t = realization_by_hit_rate_bin(base, base, edges, n_perm=50)
    assert t["n"].tolist() == member.sum(axis=0).tolist() and (t["n"] >= 1).all()
    assert (t["K"] == K).all() and t["bin"].tolist() == hit_rate_bin_labels(K, edges)
    assert list(zip(t["hits_lo"], t["hits_hi"])) == ranges
    assert t["bin_lo"].tolist() == pytest.approx([lo / K for lo, _ in ranges])
    assert t["bin_hi"].tolist() == pytest.approx([hi / K for _, hi in ranges])
    assert t["base_reachable"].tolist() == [False] + [True] * (len(ranges) - 1)


def test_propensity_bins_written_out():
    assert hit_rate_bin_labels(16) == ["0 of 16", "1 of 16", "2-3 of 16", "4-7 of 16", "8-16 of 16"]
    assert hit_rate_bins(32) == [(0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, 32)]
    assert hit_rate_bins(200)[-2:] == [(64, 127), (128, 200)]
    assert hit_rate_bins(1) == [(0, 0), (1, 1)] and hit_rate_bins(2) == [(0, 0), (1, 2)]
    # the paper's fixed edges at K = 16: (0, 5%] holds no c/16, so 1/16 = 6.25% opens the next bin (0, 15%]
    assert not [c for c in range(1, 17) if c / 16 <= 0.05]
    assert hit_rate_bins(16, PAPER_HIT_RATE_EDGES) == [(0, 0), (1, 2), (3, 5), (6, 16)]
    # at K = 20 every paper bin is reachable and an edge belongs to the bin it closes (1/20 = 5%, 3/20 = 15%)
    assert hit_rate_bins(20, PAPER_HIT_RATE_EDGES) == [(0, 0), (1, 1), (2, 3), (4, 7), (8, 20)]
    with pytest.raises(ValueError, match="K >= 1"):
        hit_rate_bins(0)
    with pytest.raises(ValueError, match="from 0 to 1"):
        hit_rate_bins(16, [0.1, 1])


def test_propensity_shares_by_hand():
    K = 16
    # (qid, base d, base hits) -> trained d; realized base questions are in no bin
    rows = [("z1", 0, 0, 1), ("z2", 0, 0, 0), ("z3", 0, 0, 0), ("z4", 0, 0, 0),   # 0 of 16: 1 of 4
            ("a1", 0, 1, 1), ("a2", 0, 1, 1),                                     # 1 of 16: 2 of 2
            ("b1", 0, 2, 0), ("b2", 0, 3, 1), ("b3", 0, 3, 0),                    # 2-3 of 16: 1 of 3
            ("c1", 0, 8, 1), ("c2", 0, 16, 0),                                    # 8-16 of 16: 1 of 2 (4-7: empty)
            ("r1", 1, 5, 0), ("r2", 1, 0, 1)]                                     # base-realized: no bin
    base = table([(q, d, h) for q, d, h, _ in rows], K=K)
    trained = table([(q, t, t) for q, _, _, t in rows], K=K)
    t = realization_by_hit_rate_bin(base, trained, n_perm=500)
    assert t["bin"].tolist() == ["0 of 16", "1 of 16", "2-3 of 16", "4-7 of 16", "8-16 of 16"]
    assert t["n"].tolist() == [4, 2, 3, 0, 2] and t["realized"].tolist() == [1, 2, 1, 0, 1]
    np.testing.assert_allclose(t["realization"], [1 / 4, 1, 1 / 3, np.nan, 1 / 2])
    assert (t["realization_lo"].iloc[2], t["realization_hi"].iloc[2]) == pytest.approx(wilson_interval(1, 3))
    assert math.isnan(t["realization_lo"].iloc[3]) and math.isnan(t["realization_hi"].iloc[3])  # empty, kept
    # independence: 5 realized among 11 base-unrealized questions, spread by bin size
    assert t["expected_realized"].tolist() == pytest.approx([5 * n / 11 for n in (4, 2, 3, 0, 2)])
    assert ((t.expected_lo <= t.expected_realized) & (t.expected_realized <= t.expected_hi)).all()
    # the paper's edges at K = 16: 0 | 1-2 | 3-5 | 6-16
    p = realization_by_hit_rate_bin(base, trained, PAPER_HIT_RATE_EDGES, n_perm=100)
    assert p["bin"].tolist() == ["0 of 16", "1-2 of 16", "3-5 of 16", "6-16 of 16"]
    assert p["n"].tolist() == [4, 3, 2, 2] and p["realized"].tolist() == [1, 2, 1, 1]
    # tables.propensity: a pair column, each row with the K its bins were built for and the bin's edges
    prop = tables.propensity({"rl": (base, trained)})
    assert set(prop["pair"]) == {"rl"} and (prop["K"] == K).all() and len(prop) == 5
    assert list(prop.columns[:7]) == ["pair", "K", "bin", "hits_lo", "hits_hi", "bin_lo", "bin_hi"]
    pd.testing.assert_frame_equal(prop.drop(columns="pair"), realization_by_hit_rate_bin(base, trained))


def test_propensity_at_K_and_2K_follow_each_K():
    # 8 samples; at K = 4 the first 4 count. a: 1 hit of 8 (the 5th), 0 of 4; b: 1 of 8 and 1 of 4
    base = pd.DataFrame([record("a", 0, [0, 0, 0, 0, 1, 0, 0, 0], 8), record("b", 0, [1] + [0] * 7, 8),
                         record("c", 0, [1] * 4 + [0] * 4, 8)])
    trained = pd.DataFrame([record(q, 1, [1] * 8, 8) for q in "abc"])
    prop = pd.concat([tables.propensity({"rl": (records_at(base, 4), records_at(trained, 4))}),
                      tables.propensity({"rl": (base, trained)})], ignore_index=True)
    at = {K: g.set_index("bin")["n"].to_dict() for K, g in prop.groupby("K")}
    assert at == {4: {"0 of 4": 1, "1 of 4": 1, "2-4 of 4": 1},
                  8: {"0 of 8": 0, "1 of 8": 2, "2-3 of 8": 0, "4-8 of 8": 1}}


def test_fates_refuse_records_of_another_K():
    base = table([("a", 0, 1)], K=4)
    with pytest.raises(ValueError, match="candidate budgets differ"):
        fates(base, table([("a", 0, 1)], K=8))


def test_resampling_null_by_hand():
    # the base-unrealized questions of CASES: gain_reach (2 of 4 hits: p = 0.5) and left (1 of 4: p = 0.25) are
    # base-reachable; gain_unreach, stable_u, entered have no hit (p = 0)
    assert poisson_binomial_pmf([0.5, 0.25, 0]).tolist() == pytest.approx([0.375, 0.5, 0.125, 0.0])
    assert poisson_binomial_interval([0.5, 0.25, 0]) == (0, 2)  # cdf 0.375, 0.875, 1
    assert poisson_binomial_interval([0.5, 0.25, 0], level=0.5) == (0, 1)  # the 25% and 75% quantiles
    assert poisson_binomial_interval([0.5] * 20) == (6, 14)  # Binomial(20, 1/2): cdf(5) = .021, cdf(14) = .979
    assert poisson_binomial_interval([]) == (0, 0)
    base, trained = pair()
    null = gains_under_resampling(fates(base, trained))
    assert (null["observed"], null["observed_unreachable"], null["n"]) == (1, 1, 5)
    assert null["expected"] == pytest.approx(0.75) and (null["lo"], null["hi"]) == (0, 2)
    assert null["expected_unreachable"] == 0 and (null["unreachable_lo"], null["unreachable_hi"]) == (0, 0)
    row = tables.fates_table({"rl": (base, trained)}).iloc[0]
    assert row.gains_from_reachable_expected_resampling == pytest.approx(0.75)
    assert (row.gains_from_reachable_expected_resampling_lo, row.gains_from_reachable_expected_resampling_hi) == (0, 2)
    assert row.gains_from_unreachable_expected_resampling == 0 and row.resampling_samples == 4
    assert row.gains_from_unreachable_expected_resampling_hi == 0


def test_resampling_null_with_the_base_hit_rate_over_2K_samples():
    # 8 base samples, fates at K = 4 (the first 4). early: 2 of 8 (both in the first 4); late: 2 of 8, none in the
    # first 4 (base-unreachable at K = 4); rich: 6 of 8; real: base-realized (no null)
    base = pd.DataFrame([record("early", 0, [1, 1, 0, 0, 0, 0, 0, 0], 8), record("late", 0, [0, 0, 0, 0, 1, 1, 0, 0], 8),
                         record("rich", 0, [1] * 6 + [0, 0], 8), record("real", 1, [1] * 8, 8)])
    trained = pd.DataFrame([record("early", 1, [1] * 8, 8), record("late", 1, [1] * 8, 8),
                            record("rich", 0, [0] * 8, 8), record("real", 1, [1] * 8, 8)])
    pairs = {"rl": (records_at(base, 4), records_at(trained, 4))}
    row = tables.fates_table(pairs, base_samples=base).iloc[0]
    assert (row.gains_from_reachable, row.gains_from_unreachable, row.resampling_samples) == (1, 1, 8)
    # reachable: p = 0.25 (early) + 0.75 (rich); pmf [0.1875, 0.625, 0.1875]
    assert row.gains_from_reachable_expected_resampling == pytest.approx(1.0)
    assert (row.gains_from_reachable_expected_resampling_lo, row.gains_from_reachable_expected_resampling_hi) == (0, 2)
    # late has a hit in samples 5-8: the null may gain it though it is unreachable at K = 4
    assert row.gains_from_unreachable_expected_resampling == pytest.approx(0.25)
    assert (row.gains_from_unreachable_expected_resampling_lo, row.gains_from_unreachable_expected_resampling_hi) == (0, 1)
    # without base_samples the hit rate is over the first 4: early 2/4, rich 4/4, late 0
    own = tables.fates_table(pairs).iloc[0]
    assert own.gains_from_reachable_expected_resampling == pytest.approx(1.5) and own.resampling_samples == 4
    assert own.gains_from_unreachable_expected_resampling == 0
    with pytest.raises(ValueError, match="not its base"):
        tables.fates_table(pairs, base_samples=trained)
    with pytest.raises(ValueError, match="lack 1 of the pair's questions"):
        tables.fates_table(pairs, base_samples=base.iloc[:3])


def test_crossover_on_synthetic_curves():
    ks = [1, 2, 4, 8, 16]
    spread = np.array([[0.1, -0.1, 0.0, 0.0], [0.0, 0.0, 0.1, -0.1]])  # per-question offsets, mean 0 per column
    def per_question(means, which):
        return np.asarray(means)[None, :] + spread[which][:, None]  # [4 questions, 5 ks]
    trained = per_question([0.5, 0.6, 0.7, 0.75, 0.8], 0)
    # the base overtakes at k = 8: gaps trained - base 0.3, 0.2, 0.05, -0.05, -0.1
    c = crossover(per_question([0.2, 0.4, 0.65, 0.8, 0.9], 1), trained, ks, n_boot=500)
    assert (c["k_cross"], c["k_min_gap"]) == (8, 16) and c["min_gap"] == pytest.approx(-0.1)
    assert c["lo"] < -0.1 < c["hi"]
    # equal reach counts as overtaken (base >= trained): gaps 0.3, 0.2, 0, 0.05, 0.1
    tie = crossover(per_question([0.2, 0.4, 0.7, 0.7, 0.7], 1), trained, ks, n_boot=100)
    assert tie["k_cross"] == 4 and tie["k_min_gap"] == 4 and tie["min_gap"] == pytest.approx(0.0)
    # the trained curve stays ahead: no crossover, the smallest gap 0.04 at k = 16, its interval around it
    c = crossover(per_question([0.1, 0.3, 0.55, 0.72, 0.86], 1), per_question([0.5, 0.6, 0.7, 0.8, 0.9], 0), ks,
                  n_boot=500)
    assert c["k_cross"] is None and c["k_min_gap"] == 16 and c["min_gap"] == pytest.approx(0.04)
    assert c["lo"] < 0.04 < c["hi"] and c["hi"] - c["lo"] < 0.25
    # the interval is the paired bootstrap of the gap at k = 16: per-question gaps 0.14, -0.06, -0.06, 0.14
    gaps = np.array([0.14, -0.06, -0.06, 0.14])
    w = np.random.default_rng(0).multinomial(4, np.full(4, 0.25), size=500)
    assert (c["lo"], c["hi"]) == pytest.approx(tuple(np.quantile(w @ gaps / 4, [0.025, 0.975])))
    assert (c["k_max_gap"], c["max_gap"], c["gap_last"]) == (1, pytest.approx(0.4), pytest.approx(0.04))
    assert (c["gap_last_lo"], c["gap_last_hi"]) == (c["lo"], c["hi"])  # the last k is also the smallest gap here
    # ahead everywhere, smallest at k = 1, peaking at k = 4 and narrowing towards K: gaps 0.05, 0.2, 0.3, 0.15, 0.1
    narrows = crossover(per_question([0.3, 0.4, 0.4, 0.6, 0.7], 1), per_question([0.35, 0.6, 0.7, 0.75, 0.8], 0),
                        ks, n_boot=500)
    assert narrows["k_cross"] is None and (narrows["k_min_gap"], narrows["k_max_gap"]) == (1, 4)
    assert (narrows["max_gap"], narrows["gap_last"]) == (pytest.approx(0.3), pytest.approx(0.1))
    assert narrows["gap_last_lo"] < 0.1 < narrows["gap_last_hi"]
    # the trained curve is never ahead: the base is at or above it from the first k
    assert crossover(trained, trained - 0.1, ks, n_boot=10)["k_cross"] == 1
    with pytest.raises(ValueError, match="one \\[n >= 1"):
        crossover(trained, trained[:, :3], ks)


def reach_lineages():
    """Records of 4 samples: base hits 1, 1, 1, 0 (reach@k = 3/4 * k/4); "cross" 4, 4, 0, 0 (reach 1/2 at every k:
    the base overtakes at k = 3); "ahead" 4, 4, 4, 1 (reach 3/4 + k/16: ahead up to K)."""
    def lineage(hits):
        return table([(f"q{i}", 0, h) for i, h in enumerate(hits)])
    return {"base": lineage([1, 1, 1, 0]), "cross": lineage([4, 4, 0, 0]), "ahead": lineage([4, 4, 4, 1])}


def test_reach_curves_and_crossovers_from_records():
    checkpoints = reach_lineages()
    curves = tables.reach_curves(checkpoints, n_boot=200)
    assert list(curves.columns) == ["checkpoint", "k", "reach", "lo", "hi", "n", "K"]
    by = {c: g.set_index("k")["reach"] for c, g in curves.groupby("checkpoint")}
    assert by["base"].tolist() == pytest.approx([0.1875, 0.375, 0.5625, 0.75])
    assert by["cross"].tolist() == pytest.approx([0.5] * 4)
    assert by["ahead"].tolist() == pytest.approx([0.8125, 0.875, 0.9375, 1.0])
    assert ((curves.lo <= curves.reach + 1e-12) & (curves.reach <= curves.hi + 1e-12)).all()
    cross = tables.crossovers(checkpoints, "base", n_boot=200).set_index("pair")
    assert list(cross.index) == ["cross", "ahead"] and (cross.K == 4).all() and (cross.n == 4).all()
    assert cross.loc["cross", "crossed"] and cross.loc["cross", "k_cross"] == 3
    assert cross.loc["cross", "k_min_gap"] == 4 and cross.loc["cross", "min_gap"] == pytest.approx(-0.25)
    assert not cross.loc["ahead", "crossed"] and pd.isna(cross.loc["ahead", "k_cross"])
    assert cross.loc["ahead", "k_min_gap"] == 4 and cross.loc["ahead", "min_gap"] == pytest.approx(0.25)
    assert cross.loc["ahead", "min_gap_lo"] <= 0.25 <= cross.loc["ahead", "min_gap_hi"]
    assert (cross.loc["ahead", "reach_base_K"], cross.loc["ahead", "reach_trained_K"]) == pytest.approx((0.75, 1.0))
    from reach_lens.rlvr.report import lineages

    fates = tables.fates_table({p: (checkpoints["base"], checkpoints[p]) for p in ("cross", "ahead")})
    lines = lineages(fates, cross.reset_index())
    assert lines[0].startswith("- **cross**: the base's reach@k overtakes at k = 3 (of 2K = 4 samples)")
    assert "no crossover up to 2K = 4 samples; smallest gap trained − base +25.0 pp" in lines[1]
    assert "narrows" not in " ".join(lines)  # no narrowing without its test (`tables.reach_leads`)
    assert all("if the trained greedy answer were one of the base's samples" in line for line in lines)
    with pytest.raises(ValueError, match="not among the checkpoints"):
        tables.crossovers(checkpoints, "missing")


def test_records_at_and_budget_table():
    # 8 samples; the first 4 decide reachability at K = 4
    base = pd.DataFrame([record("a", 0, [0, 0, 0, 0, 1, 0, 0, 0], 8), record("b", 0, [1, 0, 0, 0, 0, 0, 0, 0], 8),
                         record("c", 1, [0] * 8, 8)])
    trained = pd.DataFrame([record("a", 1, [1] * 8, 8), record("b", 1, [0] * 8, 8), record("c", 1, [1] + [0] * 7, 8)])
    at4 = records_at(base, 4)
    assert at4["K"].tolist() == [4, 4, 4] and at4["hits"].tolist() == [0, 1, 0] and at4["o"].tolist() == [False, True,
                                                                                                          False]
    assert at4["d"].tolist() == [False, False, True]
    with pytest.raises(ValueError, match="out of range"):
        records_at(base, 9)
    t6 = tables.checkpoint_changes_by_budget({"rl": (base, trained)}, K=4, m=4).set_index("K")
    assert list(t6.index) == [4, 8] and (t6["samples"] == 8).all()
    assert t6.loc[4, "O_base"] == pytest.approx(1 / 3) and t6.loc[8, "O_base"] == pytest.approx(2 / 3)
    assert t6.loc[4, "delta_n_reachable"] == 1 and t6.loc[8, "delta_n_reachable"] == 0
    # unbiased reach@4 from 8 samples: a and b have 1 hit of 8 -> 1 - C(7,4)/C(8,4) = 0.5 each; c has 0
    assert t6.loc[4, "reach_base_unbiased"] == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert t6.loc[8, "floor"] == pytest.approx(1 - 0.75 ** 8)
    t7 = tables.deployed_vote_oracle({"base": base, "rl": trained}, K=4, m=[4, 4, 5]).set_index("checkpoint")
    assert t7.loc["rl", "D"] == pytest.approx(1.0) and t7.loc["rl", "O"] == pytest.approx(2 / 3)
    assert t7.loc["base", "O_all"] == pytest.approx(2 / 3) and t7.loc["base", "samples"] == 8
    assert t7.loc["base", "floor"] == pytest.approx(np.mean([1 - 0.75 ** 4, 1 - 0.75 ** 4, 1 - 0.8 ** 4]))


def test_format_table():
    # pool = base-reachable, not base-realized: a, b, c (d is realized, e unreachable)
    base = table([("a", 0, 1), ("b", 0, 2), ("c", 0, 4), ("d", 1, 2), ("e", 0, 0)])
    trained = table([("a", 1, 4), ("b", 1, 4), ("c", 0, 4), ("d", 1, 4), ("e", 1, 1)])

    def greedy(flags):
        return pd.DataFrame({"question_id": list("abcde"), "correct": [bool(f) for f in flags]})

    t8 = tables.format_transfer({"rl": (base, trained, greedy([0, 1, 0, 0, 0]), greedy([1, 0, 0, 1, 1]))},
                                n_boot=200).iloc[0]
    assert (t8.n, t8.n_pool) == (5, 3)
    assert t8.realized_native == pytest.approx(2 / 3) and t8.realized_shared == pytest.approx(1 / 3)
    assert t8.base_realized_shared == pytest.approx(1 / 3)
    assert t8.retained == pytest.approx(0.5) and t8.retained_lo <= t8.retained_hi
    assert t8.D_trained_shared == pytest.approx(0.6) and t8.D_base_native == pytest.approx(0.2)
    nothing = tables.format_transfer({"rl": (base, base, greedy([0] * 5), greedy([0] * 5))}, n_boot=50).iloc[0]
    assert nothing.realized_native == 0 and math.isnan(nothing.retained)


def test_gold_completions_follow_the_prompt_format():
    from reach_lens.rlvr.data import gold_completion
    from reach_lens.tasks import Question, get_task

    q = Question("s1", "How many?", "23 years", context="Title: T\nBackground: B", aliases=("23 years", "23"))
    squad = get_task("squad")
    assert gold_completion(squad, q, "shared") == " 23 years" == gold_completion(squad, q, "fewshot")
    assert gold_completion(squad, q, "native") == "23 years"
    assert squad.grade(q, gold_completion(squad, q, "fewshot")).correct


def test_guess_floor():
    assert guessing_floor(4, 1) == pytest.approx(0.25)
    assert guessing_floor(4, 4) == pytest.approx(1 - 0.75 ** 4)
    assert guessing_floor([2, 4], 2) == pytest.approx((0.75 + (1 - 0.75 ** 2)) / 2)
    assert math.isnan(guessing_floor(None, 200))  # free-form answers have no floor


# ---- protocols


def protocol(**changes) -> Protocol:
    fields = dict(study="rlvr_compare", model="base", weights="0123456789abcdef", task="arc_easy", source=None,
                  split=None, questions="a" * 64, n=300, seed=0, fmt="native", grader="mc_letter/2", probe="sample",
                  K=8, temperature=0.8, max_new_tokens=8, stop_strings=(".", "\n"), settings={"K": 4})
    return Protocol(**{**fields, **changes})


@pytest.mark.parametrize("field, value", [("K", 16), ("temperature", 1.0), ("fmt", "shared"), ("grader", "mc_letter/1"),
                                          ("questions", "b" * 64), ("settings", {"K": 2})])
def test_comparison_refuses_protocols_that_differ_beyond_the_checkpoint(field, value):
    base = protocol()
    check_comparable({"base": base, "rl": protocol(model="rl-ckpt", weights="fedcba9876543210")})  # only the checkpoint
    with pytest.raises(ProtocolMismatch, match=rf"rl vs base:\n  {field}"):
        check_comparable({"base": base, "rl": protocol(model="rl-ckpt", **{field: value})})


# ---- reward


def test_reward_on_known_completions():
    task = get_task("arc_easy")
    q = make_mc_question("q1", "Which is a mammal?", ["trout", "whale", "shark", "eel"], 1)  # gold B
    reward = task_reward(task, [q])
    completions = ["B", "B. whale", "(B)", "C", "A. trout", "I am not sure", "", "   ", "C. Actually B", "B\nno, C"]
    expected = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]  # the audit cuts at "." and "\n" before grading
    assert reward(prompts=["p"] * 10, completions=completions, question_id=["q1"] * 10, trainer_state=None) == expected
    assert reward.__name__ == "arc_easy_grader"
    with pytest.raises(KeyError, match="not one of"):
        reward(prompts=["p"], completions=["B"], question_id=["other"])
    arith = get_task("basic_arithmetic")
    q2 = Question("easy/x", "Calculate 741 * 16 =", "11856")
    r2 = task_reward(arith, [q2])
    assert r2(prompts=["p"] * 4, completions=["741 * 16 = 11856", "11856\n\n12", "11865", "no idea"],
              question_id=["easy/x"] * 4) == [1.0, 1.0, 0.0, 0.0]
    assert cut_at_stops("ab.cd\nef", (".", "\n")) == "ab" and cut_at_stops("abc", (".",)) == "abc"


# ---- split


def test_salted_id_split_is_disjoint_and_stable():
    qs = [Question(f"q{i}", "t", "A") for i in range(200)]
    train, audit_side, split = split_questions(qs, "demo", salt="s", audit_share=0.5)
    assert {q.id for q in train}.isdisjoint({q.id for q in audit_side}) and len(train) + len(audit_side) == 200
    # a question's side depends on its id only: not on the others, or their order
    _, audit2, split2 = split_questions(list(reversed(qs[:100])), "demo", salt="s", audit_share=0.5)
    assert {q.id for q in audit2} == {q.id for q in audit_side if int(q.id[1:]) < 100}
    d = split.to_dict()
    assert d["audit_ids_sha256"] == ids_hash(q.id for q in audit_side) and d["n_train"] == len(train)
    assert split_questions(qs, "demo", salt="other", audit_share=0.5)[2].to_dict()["audit_ids_sha256"] != \
        d["audit_ids_sha256"]
    check_disjoint([q.id for q in audit_side], split.train_ids)
    with pytest.raises(ValueError, match="1 audit question"):
        check_disjoint(["q1", "zz"], ["q1", "q2"])
    with pytest.raises(ValueError, match="strictly between"):
        split_questions(qs, "demo", audit_share=1.0)


# ---- figures


def test_rlvr_figures_draw_from_the_tables(tmp_path, monkeypatch):
    from reach_lens import plots

    drawn = {}
    save = plots.common.save  # what every plot function saves with

    def capture(fig, path):
        drawn[Path(path).stem] = fig
        out = save(fig, path)
        assert legends_off_data(fig), f"{path}: a legend lies over an axes' data area"
        return out

    monkeypatch.setattr(plots.common, "save", capture)

    def heights(ax):
        return [round(float(p.get_height()), 9) for p in ax.patches]

    base, trained = pair()
    pairs = {"rl": (base, trained), "sft": (base, base)}
    t5 = tables.checkpoint_changes(pairs, m=4).assign(T=0.8)
    fates = tables.fates_table(pairs).assign(T=0.8)
    prop = tables.propensity(pairs).assign(T=0.8)
    t7 = tables.deployed_vote_oracle({"base": base, "rl": trained}, K=2, m=4).assign(T=0.8)
    plots.plot_rlvr_fates(fates, tmp_path / "fates.png")
    plots.plot_rlvr_changes(t5, tmp_path / "changes.png")
    plots.plot_rlvr_propensity(prop, tmp_path / "prop.png")
    plots.plot_rlvr_lineage(t7, tmp_path / "lin.png")
    left, right = drawn["fates"].axes[:2]
    expected = [sign * v for col, sign in (("gains_from_reachable", 1), ("gains_from_unreachable", 1), ("losses", -1),
                                           ("net_deployed_change", 1)) for v in fates[col]]
    assert heights(left) == pytest.approx(expected)  # series by series, one bar per pair
    assert heights(right) == pytest.approx([sign * v for col, sign in (("entered_reachable", 1), ("left_reachable", -1),
                                                                        ("net_reachable_change", 1)) for v in fates[col]])
    assert heights(drawn["changes"].axes[0]) == pytest.approx([100 * v for m in ("D", "O") for v in t5[f"{m}_change"]])
    assert heights(drawn["lin"].axes[0]) == pytest.approx([v for m in ("D", "vote", "O") for v in t7[m]])
    floors = [ln.get_ydata()[0] for ln in drawn["lin"].axes[0].get_lines() if plots.GUESSER in str(ln.get_label())]
    assert floors == pytest.approx([t7.floor.iloc[0], t7.floor_all.iloc[0]])
    # Figure 6b names each pair's O_K before and after against the floor
    ticks = [t.get_text() for t in drawn["changes"].axes[0].get_xticklabels()]
    assert all(f"{plots.GUESSER}: {t5.floor.iloc[0]:.1%}" in t for t in ticks)
    assert f"O_K {t5.O_base.iloc[0]:.1%} -> {t5.O_trained.iloc[0]:.1%}" in ticks[0]
    # Figure 6a: the chance baseline of gains from base-reachable questions, with its permutation interval
    ticks6a = [ln for ln in left.get_lines() if ln.get_marker() == "_"]
    assert [round(float(y), 9) for y in ticks6a[0].get_ydata()] == pytest.approx(
        list(fates.gains_from_reachable_expected))
    # free-form answers: no floor line, and the pair says so
    free_t7 = tables.deployed_vote_oracle({"base": base, "rl": trained}, K=2, m=None).assign(T=0.8)
    plots.plot_rlvr_lineage(free_t7, tmp_path / "lin_free.png")
    assert not [ln for ln in drawn["lin_free"].axes[0].get_lines() if plots.GUESSER in str(ln.get_label())]
    plots.plot_rlvr_changes(tables.checkpoint_changes(pairs, m=None).assign(T=0.8),
                            tmp_path / "changes_free.png")
    assert all("free-form" in t.get_text() for t in drawn["changes_free"].axes[0].get_xticklabels())
    points = {c.get_label(): c.lines[0] for c in drawn["prop"].axes[0].containers}  # one panel: K = 4
    for (p, K), g in prop.groupby(["pair", "K"], sort=False):
        np.testing.assert_allclose(points[f"{p}, K = {K}"].get_ydata(), g.realization.to_numpy(dtype=float))
    log = pd.DataFrame({"step": [5, 10, 15, 15], "reward": [0.2, 0.4, 0.3, np.nan], "reward_std": [0.4, 0.5, 0.4, np.nan]})
    plots.plot_rlvr_training(log, tmp_path / "train.png")
    assert list(drawn["train"].axes[0].get_lines()[0].get_ydata()) == [0.2, 0.4, 0.3]  # the NaN row is dropped
    plots.plot_rlvr_training(pd.DataFrame({"step": [5, 10], "loss": [0.4, 0.3]}), tmp_path / "sft.png")
    assert "training loss" in drawn["sft"].axes[0].get_ylabel()
    with pytest.raises(ValueError, match="lacks columns"):
        plots.plot_rlvr_changes(t5.drop(columns="T"), tmp_path / "x.png")


def test_reward_density_counts_correct_samples_and_informative_groups(monkeypatch):
    from reach_lens import probes
    from reach_lens.rlvr.rewards import reward_density

    hits = [0, 4, 1, 3]  # of K = 4 samples per question
    monkeypatch.setattr(probes, "sample", lambda model, task, qs, fmt, K, temperature, seed, batch_size:
                        [[{"correct": k < h} for k in range(K)] for h in hits])
    got = reward_density(None, get_task("arc_easy"), [None] * 4, "native", K=4, temperature=0.8)
    assert got["density"] == pytest.approx(8 / 16) and got["any_correct"] == pytest.approx(3 / 4)
    assert got["informative"] == pytest.approx(2 / 4)  # all-wrong and all-right groups carry no GRPO advantage
    assert (got["n"], got["K"], got["T"], got["task"]) == (4, 4, 0.8, "arc_easy")


def test_recipes_of_two_base_models_never_share_a_checkpoint(tmp_path):
    from reach_lens.rlvr.recipes import base_name, checkpoint_path, default_recipe

    smol, gemma = (default_recipe("grpo", base=base_name(m), task="squad", fmt="shared")
                   for m in (None, "gemma3-270m"))
    assert smol.base == "smollm2-135m-instruct" and gemma.base == "gemma3-270m"
    assert smol.name.startswith("grpo-smollm2-135m-instruct-squad-") and gemma.name.startswith("grpo-gemma3-270m-")
    assert checkpoint_path(smol) != checkpoint_path(gemma)
    (tmp_path / "my-base").mkdir()
    assert base_name(tmp_path / "my-base") == str((tmp_path / "my-base").resolve())
    assert default_recipe("sft", base=base_name(tmp_path / "my-base")).name.startswith("sft-my-base-arc_easy-")


def test_a_prompt_filter_names_its_own_checkpoint_and_leaves_earlier_names_alone():
    from reach_lens.rlvr.recipes import Recipe, default_recipe

    plain = default_recipe("grpo", task="squad", fmt="shared")
    # the name this recipe had before prompt_filter existed (its checkpoint was trained under it): still found
    assert plain.name == "grpo-smollm2-135m-instruct-squad-lora16-60steps-s0-d7bf7180"
    assert Recipe.from_dict({k: v for k, v in plain.to_dict().items() if k != "prompt_filter"}) == plain
    filtered = default_recipe("grpo", task="squad", fmt="shared", prompt_filter="informative")
    assert filtered.name.startswith("grpo-smollm2-135m-instruct-squad-lora16-informative-60steps-s0-")
    assert filtered.name != plain.name and Recipe.from_dict(filtered.to_dict()) == filtered
    with pytest.raises(ValueError, match="prompt_filter 'informative' filters GRPO groups; a sft recipe has none"):
        default_recipe("sft", prompt_filter="informative")
    with pytest.raises(ValueError, match="prompt_filter 'easy' unknown"):
        default_recipe("grpo", prompt_filter="easy")


def test_train_rlvr_prompt_filter_applies_to_the_grpo_recipe_only():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "train_rlvr.py"
    spec = importlib.util.spec_from_file_location("train_rlvr_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    def recipes(*argv):
        args = script.parse_args(["--task", "squad", "--dtype", "float32", *argv])
        return script.recipes_of(args)

    grpo, sft = recipes("--prompt-filter", "informative")
    assert (grpo.kind, grpo.prompt_filter, sft.kind, sft.prompt_filter) == ("grpo", "informative", "sft", None)
    assert recipes()[0].prompt_filter is None and recipes()[0].name != grpo.name


def _propensity_colours(fig) -> dict[str, set[str]]:
    """Every colour each checkpoint's artists are drawn in, over all panels: the points' and expected ticks'
    lines, caps and error-bar collections (errorbar containers are labelled "pair, K = k[, expected]")."""
    from matplotlib.colors import to_hex

    out: dict[str, set[str]] = {}
    for ax in fig.axes:
        for c in ax.containers:
            data, caps, bars = c.lines
            colours = {to_hex(data.get_color())} | {to_hex(cap.get_color()) for cap in caps}
            colours |= {to_hex(rgba) for col in bars for rgba in col.get_colors()}
            out.setdefault(c.get_label().split(",")[0], set()).update(colours)
    return out


def test_propensity_figure_one_colour_per_checkpoint_legend_off_the_data():
    from reach_lens import plots

    # 8 samples: the figure draws each pair at K = 4 and at 2K = 8
    base = pd.DataFrame([record(f"q{i}", i % 5 == 0, [int((i * j) % 7 < 2) for j in range(8)], 8) for i in range(30)])
    trained = {name: pd.DataFrame([record(f"q{i}", (i + s) % 3 == 0, [int((i + j + s) % 5 == 0) for j in range(8)], 8)
                                   for i in range(30)]) for name, s in (("grpo", 0), ("sft", 1), ("dpo", 2))}
    prop = pd.concat([tables.propensity({n: (records_at(base, 4), records_at(t, 4)) for n, t in trained.items()}),
                      tables.propensity({n: (base, t) for n, t in trained.items()})], ignore_index=True).assign(T=0.8)
    fig = plots.plot_rlvr_propensity(prop)
    colours = _propensity_colours(fig)
    assert set(colours) == set(trained)
    assert all(len(c) == 1 for c in colours.values()), colours  # one colour per checkpoint, at K and at 2K
    assert len({next(iter(c)) for c in colours.values()}) == len(trained)  # and distinct checkpoints differ
    # K and 2K: a panel each, their bins on x (bins no question falls in left out and counted), a marker each;
    # every point where its table says
    assert len(fig.axes) == 2
    filled = prop[prop.n > 0]
    empty = len(prop[prop.pair == "grpo"]) - len(filled[filled.pair == "grpo"])
    assert empty >= 1 and f"{empty} bins no question falls in are left out" in fig.get_supxlabel()
    for ax, K in zip(fig.axes, (4, 8)):
        ticks = [t.get_text().split("\n")[0] for t in ax.get_xticklabels()]
        assert ticks == [b for b in hit_rate_bin_labels(K) if b in set(filled[filled.K == K].bin)]
        points = {c.get_label(): c.lines[0] for c in ax.containers if not c.get_label().endswith("expected")}
        assert set(points) == {f"{n}, K = {K}" for n in trained}
        for n in trained:
            g = filled[(filled.pair == n) & (filled.K == K)]
            np.testing.assert_allclose(points[f"{n}, K = {K}"].get_ydata(), g.realization.to_numpy(dtype=float))
        assert len({ln.get_marker() for ln in points.values()}) == 1
    markers = [{c.lines[0].get_marker() for c in ax.containers if not c.get_label().endswith("expected")}
               for ax in fig.axes]
    assert markers[0] != markers[1]
    # the legend names each checkpoint and each K, and lies off every panel
    legend = fig.axes[-1].get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    assert all(n in texts for n in trained) and any("K = 4" in t for t in texts) and any("K = 8" in t for t in texts)
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent(renderer)), (box, ax.get_window_extent(renderer))



def test_fates_figure_draws_both_nulls_beside_the_bar():
    from reach_lens import plots

    base, trained = pair()
    fates = tables.fates_table({"rl": (base, trained), "same": (base, base)}).assign(T=0.8)
    fig = plots.plot_rlvr_fates(fates)
    left = fig.axes[0]
    nulls = {}
    for c in left.containers:
        if str(c.get_label()).startswith("null:"):
            nulls.setdefault("independence" if "independence" in c.get_label() else "resampling", []).append(c)
    independence, resampling = nulls["independence"], nulls["resampling"]
    assert len(independence) == 1 and len(resampling) == 2  # resampling: beside both gains bars
    assert independence[0].lines[0].get_ydata().tolist() == pytest.approx([0.8, 0.0])
    assert independence[0].lines[0].get_marker() == "_"
    reach, unreach = (r.lines[0] for r in resampling)
    assert reach.get_ydata().tolist() == pytest.approx([0.75, 0.75])  # the base's hit rates: 2/4 + 1/4
    assert unreach.get_ydata().tolist() == pytest.approx([0.0, 0.0])
    assert reach.get_marker() == "D" and reach.get_markerfacecolor() == "none"
    assert resampling[0].lines[2][0].get_linestyle()[0][1] is not None  # the interval is dashed
    # both beside the first bar (gains from base-reachable), on either side of its centre
    bar = left.patches[0]
    centre = bar.get_x() + bar.get_width() / 2
    assert independence[0].lines[0].get_xdata()[0] < centre < reach.get_xdata()[0] < bar.get_x() + bar.get_width()
    # the intervals: the resampling bar runs 0..2 for each pair
    segments = resampling[0].lines[2][0].get_segments()
    assert [(s[0][1], s[1][1]) for s in segments] == [(0, 2), (0, 2)]
    legend = left.get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    assert sum("independence" in t for t in texts) == 1 and sum("resampling" in t for t in texts) == 1
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    assert not any(legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)


def test_reach_curve_figure_draws_each_curve_and_the_crossover(tmp_path):
    from reach_lens import plots

    checkpoints = reach_lineages()
    curves = tables.reach_curves(checkpoints, n_boot=100).assign(T=0.8)
    cross = tables.crossovers(checkpoints, "base", n_boot=100).assign(T=0.8)
    leads = tables.reach_leads(checkpoints, "base", K=2, n_boot=100)  # records of 2K = 4 samples
    fig = plots.plot_rlvr_reach_curves(curves, cross, *leads, tmp_path / "reach.png")
    assert (tmp_path / "reach.png").exists() and len(fig.axes) == 4  # per pair: reach@k, then base − trained
    reach_axes = fig.axes[::2]
    for ax, pair_label in zip(reach_axes, ["cross", "ahead"]):
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        for label, role in (("base", "base"), (pair_label, "trained")):
            g = curves[curves.checkpoint == label]
            assert lines[f"{label} ({role})"].get_xdata().tolist() == g.k.tolist()
            assert lines[f"{label} ({role})"].get_ydata().tolist() == pytest.approx(g.reach.tolist())
        assert ax.get_xscale() == "log"
    cross_ax, ahead_ax = reach_axes
    assert cross_ax.get_title() == "cross: base overtakes at k = 3 (of 2K = 4)"
    assert [ln.get_xdata()[0] for ln in cross_ax.get_lines() if ln.get_label().startswith("base overtakes")] == [3]
    c = cross.set_index("pair").loc["ahead"]
    assert ahead_ax.get_title() == (f"ahead: no crossover up to k = 2K = 4; gap at k = 4: +25.0 pp "
                                    f"[{100 * c.gap_K_lo:+.1f}, {100 * c.gap_K_hi:+.1f}]")
    gap = [ln for ln in ahead_ax.get_lines() if ln.get_label().startswith("smallest gap")]
    assert len(gap) == 1 and gap[0].get_xdata()[0] == 4 and "+25.0 pp" in gap[0].get_label()
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    for ax in fig.axes:
        box = ax.get_legend().get_window_extent(renderer)
        assert not any(box.overlaps(other.get_window_extent(renderer)) for other in fig.axes)
    assert not any(plots.GUESSER in ln.get_label() for ax in fig.axes for ln in ax.get_lines())  # free-form: none
    # multiple choice: every panel draws the guesser's floor 1 - (1 - 1/m)^k
    floored = curves.assign(guess=1 - 0.75 ** curves.k)
    fig = plots.plot_rlvr_reach_curves(floored, cross, *leads, tmp_path / "reach_mc.png")
    for ax in fig.axes[::2]:
        floor = [ln for ln in ax.get_lines() if plots.GUESSER in ln.get_label()]
        assert len(floor) == 1 and floor[0].get_ydata().tolist() == pytest.approx((1 - 0.75 ** np.arange(1, 5)).tolist())
        assert ax.get_ylim()[1] >= 1 - 0.75 ** 4
    with pytest.raises(ValueError, match="no curve for checkpoint"):
        plots.plot_rlvr_reach_curves(curves[curves.checkpoint != "ahead"], cross, *leads)
