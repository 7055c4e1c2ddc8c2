"""End-to-end runs of experiments/mlp_localize.py on the embedded model (small n)."""
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("mlp_localize", ROOT / "experiments" / "mlp_localize.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mlp_localize"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.integration
def test_mlp_localize_end_to_end_and_resume(tmp_path, monkeypatch):
    script = load_script()
    args = ["--n", "60", "--layers", "12,24", "--max-eval", "6", "--alphas", "4", "--random-seeds", "2",
            "--unit-k", "8", "--out", str(tmp_path / "runs"), "--figures", str(tmp_path / "figures")]
    assert script.main(args) == 0
    run_dir = next((tmp_path / "runs").iterdir())
    sweep = pd.read_csv(run_dir / "layer_sweep.csv")
    assert sorted(zip(sweep.layer, sweep.component)) == sorted((l, c) for l in (12, 24) for c in ("mlp", "attn", "layer"))
    panels = pd.read_csv(run_dir / "panels.csv")
    assert panels.question_id.is_unique and set(panels.role) == {"calibration", "evaluation"}
    screen = pd.read_csv(run_dir / "screen.csv").set_index("question_id")
    for row in panels.itertuples():  # panels follow the criterion of the screen they were fixed from
        assert screen.loc[row.question_id, "recognized"]
        assert screen.loc[row.question_id, "generated"] == (row.panel == "healthy")
    summary = (run_dir / "summary.md").read_text()
    assert "Failure set" in summary and "Steering" in summary and "Wall time" in summary
    for name in ("layer_sweep", "steering", "units"):
        assert (run_dir / f"{name}.png").stat().st_size > 5000

    # a rerun over the same directory recomputes nothing and reproduces every table
    calls = []
    monkeypatch.setattr(script.probes, "deploy", lambda *a, **k: calls.append(1) or [])
    monkeypatch.setattr(script.localize, "screen", lambda *a, **k: calls.append(1) or None)
    before = {n: pd.read_csv(run_dir / f"{n}.csv") for n in ("layer_sweep", "steering", "units", "panels")}
    assert script.main(args) == 0
    assert calls == []
    for name, table in before.items():
        pd.testing.assert_frame_equal(pd.read_csv(run_dir / f"{name}.csv"), table)


@pytest.mark.integration
def test_planted_failure_is_localized_to_its_mlp(tmp_path):
    script = load_script()
    planted = 25
    # PIQA: the model's correct answers are split between both letters, so a push towards one letter fails
    # many of them (on ARC-Easy it answers "A" to most questions, leaving few non-"A" failures to plant)
    args = ["--task", "piqa", "--planted", str(planted), "--n", "120", "--layers", "9,16,24,25", "--max-eval", "12",
            "--calibration-share", "0.25", "--alphas", "4", "--random-seeds", "2", "--unit-k", "8",
            "--out", str(tmp_path / "runs"), "--figures", str(tmp_path / "figures")]
    assert script.main(args) == 0
    run_dir = next((tmp_path / "runs").iterdir())
    sweep = pd.read_csv(run_dir / "layer_sweep.csv").set_index(["layer", "component"])
    # the pool answers correctly without the planted block, so silencing it undoes the edit exactly
    assert sweep.loc[(planted, "mlp"), "repair"] == 1.0 and sweep.loc[(planted, "mlp"), "breakage"] == 0.0
    assert sweep.loc[(planted, "mlp"), "repair_n"] >= 3
    assert sweep.loc[(planted, "attn"), "repair"] < 0.5  # the component control
    assert all(sweep.loc[(layer, "mlp"), "repair"] < 1.0 for layer in (9, 16, 24))
    summary = (run_dir / "summary.md").read_text()
    assert f"identified layer {planted}: localized correctly" in summary
    screen = pd.read_csv(run_dir / "screen.csv")
    assert screen.recognized.mean() >= 0.9  # the edit barely moves recognition (the pool was all recognized)
