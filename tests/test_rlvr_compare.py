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


@pytest.mark.integration
def test_small_embedded_compare_then_resume_recomputes_nothing(tmp_path, monkeypatch):
    from reach_lens import probes
    from reach_lens.models import embedded_checkpoint_dir

    copy = tmp_path / "base-copy"  # the base's weights under another name: a "trained" checkpoint that changed nothing
    copy.mkdir()
    for f in embedded_checkpoint_dir().iterdir():
        (copy / f.name).symlink_to(f)
    script = load_script("rlvr_compare")
    args = ["--checkpoints", f"copy={copy}", "--n", "4", "--K", "2", "--chunk", "2", "--threads", "1",
            "--out", str(tmp_path / "runs"), "--figures", str(tmp_path / "figures")]
    assert script.main(args) == 0
    summary = next((tmp_path / "runs").glob("*/summary-*"))
    t5 = pd.read_csv(summary / "table5.csv").iloc[0]
    assert (t5.n, t5.K, t5["T"]) == (4, 2, 0.8)
    # same weights, same protocol, same seeds: the same greedy answers and samples, so nothing changes
    assert t5.D_change == 0 and t5.O_change == 0 and t5.delta_n_reachable == 0
    fates = pd.read_csv(summary / "fates.csv").iloc[0]
    assert fates[["gains_from_reachable", "gains_from_unreachable", "losses", "entered_reachable",
                  "left_reachable"]].sum() == 0
    t6 = pd.read_csv(summary / "table6_budget.csv")
    assert sorted(t6.K) == [2, 4] and (t6.O_base <= 1).all()
    assert set(pd.read_csv(summary / "table7_lineage.csv").checkpoint) == {"base", "copy"}
    assert len(pd.read_csv(summary / "propensity.csv")) == 2 * 5  # 5 bins at K and at 2K
    assert pd.read_csv(summary / "table8_format.csv").n.iloc[0] == 4
    assert len(list((tmp_path / "figures").glob("rlvr_*.png"))) == 4

    def fail(*a, **k):
        pytest.fail("a resumed run generated again")

    monkeypatch.setattr(probes, "sample", fail)
    monkeypatch.setattr(probes, "deploy", fail)
    before = {p.name: pd.read_csv(p) for p in summary.glob("*.csv")}
    assert script.main(args) == 0
    for name, table in before.items():
        pd.testing.assert_frame_equal(pd.read_csv(summary / name), table)
