"""reach@k of base vs trained from all 2K samples: the base − trained curve with its paired bootstrap band, and the
narrowing test whose peak is chosen again in every resample, on small synthetic hit counts."""
import numpy as np
import pandas as pd
import pytest
from conftest import legends_off_data

from reach_lens import audit
from reach_lens.records import make_record
from reach_lens.rlvr import tables
from reach_lens.rlvr.audit_run import records_at
from reach_lens.rlvr.fates import REACH_N_BOOT, reach_lead
from reach_lens.rlvr.report import _differences, lineages, narrowing_words, report
from reach_lens.stats import pass_at_k

N_BOOT = 2000  # enough for these tests' margins; the study's default is fates.REACH_N_BOOT


def hit_table(hits, samples: int) -> pd.DataFrame:
    """Records of `samples` samples with the given hit counts (the columns the joins and curves read)."""
    hits = np.asarray(hits)
    return pd.DataFrame({"question_id": [f"q{i}" for i in range(len(hits))], "gold": "g", "d": 0,
                         "o": (hits > 0).astype(int), "hits": hits, "K": samples})


def record_table(flags_per_question) -> pd.DataFrame:
    """Full records (candidates kept, for `records_at`): one list of 0/1 per sample and question."""
    def cand(ok):
        return {"text": "g" if ok else "x", "answer": "g" if ok else "x", "correct": bool(ok), "mean_logprob": -1.0,
                "length": 1}
    deployed = {"text": "x", "answer": "x", "correct": False}
    return pd.DataFrame([make_record(f"q{i}", "g", deployed, [cand(f) for f in flags], vote=0)
                         for i, flags in enumerate(flags_per_question)])


def shrinking_lead(n_each: int = 200, samples: int = 16):
    """Half the questions: trained always right (16 of 16), base 1 of 16, a lead 1 - k/16 that closes by 2K; the
    other half: trained 2 of 16, base none, a lead that opens to 1. Together the lead peaks inside and falls to 0.5."""
    base = hit_table([1] * n_each + [0] * n_each, samples)
    trained = hit_table([samples] * n_each + [2] * n_each, samples)
    return {"base": base, "grpo": trained}


def test_a_trained_checkpoint_equal_to_the_base_differs_by_zero_and_shows_no_narrowing():
    base = hit_table([0, 1, 3, 8, 8, 2, 0, 5], 8)
    differences, narrowing = tables.reach_leads({"base": base, "same": base.copy()}, "base", K=4, n_boot=N_BOOT)
    assert differences.k.tolist() == list(range(1, 9)) and (differences.samples == 8).all()
    assert (differences.base_minus_trained == 0).all()
    # paired: every resample takes the same questions on both sides, so the band is exactly 0 (unpaired it is not)
    assert (differences.base_minus_trained_lo == 0).all() and (differences.base_minus_trained_hi == 0).all()
    row = narrowing.iloc[0]
    assert row.narrowing == 0 and row.narrowing_lo <= 0 <= row.narrowing_hi and not row.narrows
    words = narrowing_words(row)
    assert words.endswith("no narrowing shown (same is never ahead)") and "narrows" not in words
    assert (row.n_boot, row.seed) == (N_BOOT, 0)


def test_a_lead_that_really_shrinks_by_2K_narrows():
    checkpoints = shrinking_lead()
    differences, narrowing = tables.reach_leads(checkpoints, "base", K=8, n_boot=N_BOOT)
    k = np.arange(1, 17)
    expected = 0.5 * (1 - k / 16) + 0.5 * np.array([pass_at_k(16, 2, int(j)) for j in k])  # trained − base
    assert (-differences.base_minus_trained).tolist() == pytest.approx(expected.tolist())
    row = narrowing.iloc[0]
    assert row.k_peak == int(k[np.argmax(expected)]) and 1 < row.k_peak < 16
    assert (row.lead_peak, row.lead_last) == pytest.approx((expected.max(), 0.5))
    assert row.narrowing == pytest.approx(expected.max() - 0.5)
    assert 0 < row.narrowing_lo < row.narrowing < row.narrowing_hi and row.narrows
    words = narrowing_words(row)
    assert words == (f"the lead of grpo over base (trained − base reach@k) at its peak (k = {row.k_peak}, "
                     f"{100 * row.lead_peak:+.1f} pp) minus at k = 16 (+50.0 pp): {100 * row.narrowing:+.1f} pp "
                     f"[{100 * row.narrowing_lo:+.1f}, {100 * row.narrowing_hi:+.1f}], narrows")
    # the same lead on 4 questions: the interval reaches 0, no narrowing is claimed
    few = {name: t.iloc[[0, 1, -2, -1]] for name, t in checkpoints.items()}
    small = tables.reach_leads(few, "base", K=8, n_boot=N_BOOT)[1].iloc[0]
    assert small.narrowing == pytest.approx(row.narrowing) and small.narrowing_lo <= 0 and not small.narrows
    assert narrowing_words(small).endswith(", no narrowing shown")


def test_a_lead_that_peaks_at_2K_shows_no_narrowing():
    base = hit_table([0] * 200, 8)
    trained = hit_table([1] * 100 + [0] * 100, 8)  # one hit of 8 on half the questions: a lead k / 16
    row = tables.reach_leads({"base": base, "up": trained}, "base", K=4, n_boot=N_BOOT)[1].iloc[0]
    assert row.k_peak == 8 and row.narrowing == 0 and row.narrowing_lo <= 0 and not row.narrows


def test_the_band_holds_the_point_estimate_and_the_resampling_is_paired():
    rng = np.random.default_rng(3)
    base_hits = rng.binomial(16, rng.beta(0.5, 1.0, 150))
    # close to the base, question by question: one more hit where the base has one (the same questions reachable)
    trained_hits = np.where(base_hits > 0, np.minimum(16, base_hits + 1), 0)
    differences, _ = tables.reach_leads({"base": hit_table(base_hits, 16), "t": hit_table(trained_hits, 16)}, "base",
                                        K=8, n_boot=N_BOOT)
    d, lo, hi = (differences[c].to_numpy() for c in ("base_minus_trained", "base_minus_trained_lo",
                                                     "base_minus_trained_hi"))
    assert ((lo <= d) & (d <= hi)).all() and (lo[:-1] < hi[:-1]).all() and lo[-1] == hi[-1] == 0
    # resampling the two sides' questions independently would ignore how alike each question's pair is
    ks = list(range(1, 17))
    b, t = audit.pass_at_ks(base_hits, 16, ks), audit.pass_at_ks(trained_hits, 16, ks)
    rng = np.random.default_rng(0)
    draw = lambda: rng.integers(0, 150, size=(N_BOOT, 150))  # noqa: E731
    unpaired = b[draw()].mean(axis=1) - t[draw()].mean(axis=1)  # [n_boot, k]
    u_lo, u_hi = np.quantile(unpaired, [0.025, 0.975], axis=0)
    assert ((hi - lo) < 0.5 * (u_hi - u_lo)).all()


def test_every_curve_point_is_unbiased_from_all_2K_samples():
    # 2K = 4 samples, K = 2: q0 right only in its last two samples, q1 in its first, q2 never, q3 in all
    flags = [[0, 0, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    base, trained = record_table(flags), record_table([[0, 0, 0, 0]] * 4)
    differences, _ = tables.reach_leads({"base": base, "t": trained}, "base", K=2, n_boot=200)
    at = differences.set_index("k")
    hits = [2, 1, 0, 4]
    for k in (1, 2, 3, 4):
        assert at.reach_base[k] == pytest.approx(np.mean([pass_at_k(4, h, k) for h in hits]))
    assert at.reach_base[4] == pytest.approx(np.mean(base.hits > 0)) == 0.75  # the share with any hit of 2K
    curves = tables.reach_curves({"base": base}, n_boot=200).set_index("k")
    assert curves.reach.tolist() == pytest.approx(at.reach_base.tolist()) and (curves.K == 4).all()
    # reach@K from all 2K samples is not O_K of the first K: q0 has no hit in its first two samples
    assert records_at(base, 2).o.mean() == 0.5 and at.reach_base[2] == pytest.approx((5 / 6 + 1 / 2 + 1) / 4)
    with pytest.raises(ValueError, match="t: records of 4 samples, not 2K = 8 \\(K = 4\\)"):
        tables.reach_leads({"base": base, "t": trained}, "base", K=4)
    with pytest.raises(ValueError, match="base: records of 4 samples, not 2K = 6"):
        tables.audit_tables({"base": base, "t": trained}, None, "base", K=3, T=0.8, m=None)
    with pytest.raises(ValueError, match="need the base 'missing' and a trained one"):
        tables.reach_leads({"base": base, "t": trained}, "missing", K=2)
    with pytest.raises(ValueError, match="checkpoints \\['base'\\]: need the base 'base' and a trained one"):
        tables.reach_leads({"base": base}, "base", K=2)


def test_reach_lead_refuses_curves_it_cannot_pair_and_resamples_by_its_seed():
    b = np.zeros((3, 4))
    with pytest.raises(ValueError, match="must be one \\[n >= 1, len\\(ks\\) = 4\\] shape"):
        reach_lead(b, b[:2], [1, 2, 3, 4])
    with pytest.raises(ValueError, match="ks \\[1, 3, 2, 4\\] must increase"):
        reach_lead(b, b, [1, 3, 2, 4])
    with pytest.raises(ValueError, match="n_boot=0 must be >= 1"):
        reach_lead(b, b, [1, 2, 3, 4], n_boot=0)
    # one seed, one set of resamples; the narrowing interval is the basic bootstrap's over each resample's own peak
    rng = np.random.default_rng(1)
    b, t = rng.random((30, 4)), rng.random((30, 4))
    one, again = reach_lead(b, t, [1, 2, 3, 4], n_boot=300, seed=5), reach_lead(b, t, [1, 2, 3, 4], n_boot=300, seed=5)
    assert one["lo"].tolist() == again["lo"].tolist() and one["narrowing_lo"] == again["narrowing_lo"]
    lead = (np.random.default_rng(5).multinomial(30, np.full(30, 1 / 30), size=300) @ (t - b)) / 30  # [300, 4]
    q_lo, q_hi = np.quantile(lead.max(axis=1) - lead[:, -1], [0.025, 0.975])
    assert (one["narrowing_lo"], one["narrowing_hi"]) == pytest.approx((2 * one["narrowing"] - q_hi,
                                                                        2 * one["narrowing"] - q_lo))
    assert one["lo"].tolist() == pytest.approx(np.quantile(-lead, 0.025, axis=0).tolist())


def test_the_summary_claims_narrowing_only_from_the_computed_interval():
    checkpoints = {**shrinking_lead(), "same": shrinking_lead()["base"].copy()}
    differences, narrowing = tables.reach_leads(checkpoints, "base", K=8, n_boot=N_BOOT)
    fates = tables.fates_table({p: (checkpoints["base"], checkpoints[p]) for p in ("grpo", "same")})
    lines = lineages(fates, narrowing=narrowing)
    assert lines[0].startswith("- **grpo**: the lead of grpo over base") and ", narrows;" in lines[0]
    assert "no narrowing shown (same is never ahead)" in lines[1] and "narrows" not in lines[1]
    section = "\n".join(_differences(differences, narrowing, K=8))
    assert "k = 1..2K = 16, unbiased pass@k from all 16 samples" in section and f"{N_BOOT} paired question" in section
    peak = int(narrowing.set_index("pair").k_peak["grpo"])
    at = differences[differences.pair == "grpo"].set_index("k")
    assert (f"| grpo | {100 * at.base_minus_trained[1]:+.1f} pp [{100 * at.base_minus_trained_lo[1]:+.1f}, "
            f"{100 * at.base_minus_trained_hi[1]:+.1f}] |") in section and f"k = {peak}: " in section


def test_reach_figure_draws_the_difference_band_and_names_K_and_2K(tmp_path):
    from matplotlib.collections import PolyCollection

    from reach_lens import plots

    checkpoints = {**shrinking_lead(n_each=40), "same": shrinking_lead(n_each=40)["base"].copy()}
    curves = tables.reach_curves(checkpoints, n_boot=200).assign(T=0.8)
    cross = tables.crossovers(checkpoints, "base", n_boot=200).assign(T=0.8)
    differences, narrowing = tables.reach_leads(checkpoints, "base", K=8, n_boot=N_BOOT)
    path = tmp_path / "rlvr_reach_curves_base-squad-n80-K8.png"
    fig = plots.plot_rlvr_reach_curves(curves, cross, differences, narrowing, path, title="reach@k, base on squad")
    assert path.exists() and len(fig.axes) == 4
    assert fig._suptitle.get_text().startswith("reach@k, base on squad, K = 8: reach@k for k = 1..2K = 16\n")
    assert f"{N_BOOT} paired question resamples, seed 0" in fig._suptitle.get_text()
    grpo_diff, same_diff = fig.axes[1], fig.axes[3]
    line = [ln for ln in grpo_diff.get_lines() if ln.get_label() == "base − grpo"][0]
    g = differences[differences.pair == "grpo"]
    assert line.get_ydata().tolist() == pytest.approx((100 * g.base_minus_trained).tolist())
    band = [c for c in grpo_diff.collections if isinstance(c, PolyCollection)]
    assert len(band) == 1 and band[0].get_label() == "paired 95% band"
    lows = band[0].get_paths()[0].vertices[:, 1]
    assert lows.min() == pytest.approx(100 * g.base_minus_trained_lo.min())
    assert grpo_diff.get_title().endswith(", narrows") and same_diff.get_title().endswith(", no narrowing shown")
    assert "k = 16" in grpo_diff.get_title()
    assert fig.axes[2].get_title().startswith("same: base at or above it from k = 1")
    assert all(ax.get_xscale() == "log" for ax in fig.axes)
    assert legends_off_data(fig)
    fig.savefig("/tmp/rlvr_reach_band_check.png")
    with pytest.raises(ValueError, match="no base − trained difference or narrowing for 'same'"):
        plots.plot_rlvr_reach_curves(curves, cross, differences[differences.pair == "grpo"], narrowing)


def test_audit_tables_write_the_difference_and_narrowing_tables_and_the_summary_reads_them():
    flags = [[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 1]]
    base, trained = record_table(flags), record_table([[1, 1, 1, 1]] * 3 + [[0, 0, 0, 0]] * 3)
    t = tables.audit_tables({"base": base, "grpo": trained}, None, "base", K=2, T=0.8, m=None)
    assert list(t["reach_difference"].columns) == [
        "pair", "T", "base", "k", "reach_base", "reach_trained", "base_minus_trained", "base_minus_trained_lo",
        "base_minus_trained_hi", "n", "K", "samples", "n_boot", "seed"]
    assert list(t["narrowing"].columns) == ["pair", "T", "base", "n", "K", "samples", "k_peak", "lead_peak",
                                            "lead_last", "narrowing", "narrowing_lo", "narrowing_hi", "narrows",
                                            "n_boot", "seed"]
    assert (t["narrowing"].n_boot == REACH_N_BOOT).all() and (t["reach_difference"].samples == 4).all()
    text = report(t["table5"], t["fates"], t["table6_budget"], t["table7_lineage"], None, t["propensity"], 2, 0.8,
                  "native", "shared", "", t["crossover"], t["reach_difference"], t["narrowing"])
    assert "## reach@k, base − trained (k = 1..2K = 4" in text and f"over {REACH_N_BOOT} paired question" in text
    assert text.count("narrows") == int(t["narrowing"].narrows.sum()) + 1  # + the method's "narrows" in quotes
