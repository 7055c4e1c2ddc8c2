"""A small embedded RLVR compare end to end (the base against a copy of itself), and a rerun that recomputes nothing."""
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.heavy(150)
@pytest.mark.integration
def test_small_embedded_compare_then_resume_recomputes_nothing(tmp_path, monkeypatch):
    from reach_lens import probes
    from reach_lens.models import embedded_checkpoint_dir

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    copy = tmp_path / "base-copy"  # the base's weights under another name: a "trained" checkpoint that changed nothing
    copy.mkdir()
    for f in embedded_checkpoint_dir().iterdir():
        (copy / f.name).symlink_to(f)
    edited = tmp_path / "edited"  # a checkpoint that did change: every MLP's output halved
    hf = AutoModelForCausalLM.from_pretrained(embedded_checkpoint_dir(), dtype=torch.float32)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.mlp.down_proj.weight.mul_(0.5)
    hf.save_pretrained(edited)
    AutoTokenizer.from_pretrained(embedded_checkpoint_dir()).save_pretrained(edited)  # with its chat template
    from reach_lens.rlvr.fates import hit_rate_bin_labels

    script = load_script("rlvr_compare")
    args = ["--checkpoints", f"copy={copy}", f"edited={edited}", "--n", "4", "--K", "2", "--chunk", "2",
            "--threads", "1", "--control-fmt", "native", "--out", str(tmp_path / "runs"), "--figures", str(tmp_path / "figures")]
    assert script.main(args) == 0
    summary = next((tmp_path / "runs").glob("*/summary-*"))
    t5 = pd.read_csv(summary / "table5.csv").set_index("pair")
    assert list(t5.n) == [4, 4] and set(t5.K) == {2} and set(t5["T"]) == {0.8}
    # same weights, same protocol, same seeds: the same greedy answers and samples, so nothing changes
    same = t5.loc[t5.index.str.contains("copy")].iloc[0]
    assert same.D_change == 0 and same.O_change == 0 and same.delta_n_reachable == 0
    fates = pd.read_csv(summary / "fates.csv").set_index("pair")
    moves = ["gains_from_reachable", "gains_from_unreachable", "losses", "entered_reachable", "left_reachable"]
    assert fates.loc[fates.index.str.contains("copy"), moves].to_numpy().sum() == 0
    # the edited checkpoint is audited as itself, its own greedy texts and samples, not the base's again (in SQuAD's
    # RLVR format: the zero-shot shared text)
    def texts(label_dir):
        parts = sorted(label_dir.glob("shared/T0.8/records/part-*.parquet"))
        df = pd.concat([pd.read_parquet(p) for p in parts]).set_index("question_id").sort_index()
        return [[t, *(c["text"] for c in cs)] for t, cs in zip(df.deployed_text, df.candidates)]
    run_root = summary.parent
    by_name = {p.name: texts(p) for p in run_root.iterdir() if (p / "shared").is_dir()}
    assert len(by_name) == 3 and len({str(v) for v in by_name.values()}) == 2  # base == copy != edited
    t6 = pd.read_csv(summary / "table6_budget.csv")
    assert sorted(set(t6.K)) == [2, 4] and (t6.O_base <= 1).all()
    assert set(pd.read_csv(summary / "table7_lineage.csv").checkpoint) == {"base", "copy", "edited"}
    prop = pd.read_csv(summary / "propensity.csv")  # at K = 2 bins 0 | 1-2 hits, at 2K = 4 bins 0 | 1 | 2-4
    assert {(p, K): g["bin"].tolist() for (p, K), g in prop.groupby(["pair", "K"])} == {
        (p, K): hit_rate_bin_labels(K) for p in set(prop["pair"]) for K in (2, 4)}
    assert len(set(prop["pair"])) == 2
    assert len(prop) == 2 * (2 + 3) and (prop["bin_hi"] * prop["K"] == prop["hits_hi"]).all()
    assert set(pd.read_csv(summary / "table8_format_transfer.csv").n) == {4}
    # the resampling null beside independence: the base's hit rate over all its 2K = 4 samples
    null = ["gains_from_reachable_expected_resampling", "gains_from_reachable_expected_resampling_lo",
            "gains_from_reachable_expected_resampling_hi", "gains_from_unreachable_expected_resampling"]
    assert set(null) <= set(fates.columns) and (fates.resampling_samples == 4).all()
    assert (fates[null[1]] <= fates[null[0]]).all() and (fates[null[0]] <= fates[null[2]]).all()
    assert (fates[null[0]] >= 0).all() and (fates[null[2]] <= 4).all()
    # reach@k for k = 1..2K per checkpoint, and per trained checkpoint where the base's curve meets its own
    curves = pd.read_csv(summary / "reach_curves.csv")
    assert list(curves.columns) == ["checkpoint", "T", "k", "reach", "lo", "hi", "n", "K", "guess"]
    assert curves.guess.isna().all()  # the default task (SQuAD) is free-form: no guessing floor
    assert {c: g.k.tolist() for c, g in curves.groupby("checkpoint")} == {c: [1, 2, 3, 4] for c in
                                                                           ("base", "copy", "edited")}
    assert ((curves.lo <= curves.reach + 1e-9) & (curves.reach <= curves.hi + 1e-9) & (curves.hi <= 1)).all()
    assert (curves.groupby("checkpoint").reach.diff().dropna() >= -1e-12).all()  # reach@k never falls with k
    cross = pd.read_csv(summary / "crossover.csv").set_index("pair")
    assert set(cross.index) == {"copy", "edited"} and (cross.base == "base").all() and (cross.K == 4).all()
    assert {"T", "n", "crossed", "k_cross", "k_min_gap", "min_gap", "min_gap_lo", "min_gap_hi"} <= set(cross.columns)
    copy = cross.loc["copy"]  # the same curves: the base is level from k = 1, the gap 0 everywhere
    assert copy.crossed and copy.k_cross == 1 and copy.min_gap == 0 and copy.min_gap_lo == copy.min_gap_hi == 0
    assert (cross.crossed == cross.k_cross.notna()).all() and cross.k_min_gap.between(1, 4).all()
    # base − trained reach@k from all 2K = 4 samples with its paired band, and the narrowing test: the copy is 0
    diff = pd.read_csv(summary / "reach_difference.csv")
    assert {c: g.k.tolist() for c, g in diff.groupby("pair")} == {c: [1, 2, 3, 4] for c in ("copy", "edited")}
    same = diff[diff.pair == "copy"]
    assert (same[["base_minus_trained", "base_minus_trained_lo", "base_minus_trained_hi"]] == 0).all().all()
    assert ((diff.base_minus_trained_lo <= diff.base_minus_trained + 1e-9)
            & (diff.base_minus_trained <= diff.base_minus_trained_hi + 1e-9)).all()
    narrow = pd.read_csv(summary / "narrowing.csv").set_index("pair")
    assert (narrow.K == 2).all() and (narrow.samples == 4).all() and not narrow.loc["copy", "narrows"]
    text = (summary / "summary.md").read_text()
    assert "Per lineage" in text and "no narrowing shown (copy is never ahead)" in text
    assert len(list((tmp_path / "figures").glob("rlvr_*.png"))) == 5
    assert len(list((tmp_path / "figures").glob("rlvr_reach_curves_*.png"))) == 1

    def fail(*a, **k):
        pytest.fail("a resumed run generated again")

    monkeypatch.setattr(probes, "sample", fail)
    monkeypatch.setattr(probes, "deploy", fail)
    before = {p.name: pd.read_csv(p) for p in summary.glob("*.csv")}
    assert script.main(args) == 0
    for name, table in before.items():
        pd.testing.assert_frame_equal(pd.read_csv(summary / name), table)
