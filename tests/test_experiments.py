"""Small end-to-end runs of the census and sampling-gap experiments on the embedded model."""
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
def test_sampling_gap_small_run(tmp_path):
    script = load_script("sampling_gap")
    args = ["--n", "6", "--K", "4", "--temperatures", "0.8", "1.2", "--out", str(tmp_path / "runs"),
            "--figures", str(tmp_path / "figures")]
    assert script.main(args) == 0
    run_dir = next((tmp_path / "runs").iterdir())
    table = pd.read_csv(run_dir / "table.csv").iloc[0]
    assert table.n == 6 and table.K == 4
    assert table.vote <= table.oracle  # the vote picks one of the K candidates, the oracle any of them
    curve = pd.read_csv(run_dir / "reach_curve.csv")
    assert list(curve.k) == [1, 2, 3, 4] and curve.reach.is_monotonic_increasing
    assert curve.reach.iloc[-1] == pytest.approx(table.oracle)
    sweep = pd.read_csv(run_dir / "temperature_sweep.csv")
    assert sorted(sweep["T"]) == [0.8, 1.2]
    assert len(list((tmp_path / "figures").glob("*.png"))) == 2


@pytest.mark.integration
def test_census_small_run(tmp_path):
    script = load_script("census")
    args = ["--n", "8", "--sparsities", "0.5", "--tasks", "arc_easy", "--out", str(tmp_path / "runs"),
            "--figures", str(tmp_path / "figures")]
    assert script.main(args) == 0
    table = pd.read_csv(tmp_path / "runs" / "census.csv")
    assert len(table) == 2 and set(table.sparsity) == {0.0, 0.5}
    assert (table.n_fail <= table.n).all() and (table.n_fail + table.n_healthy <= table.n).all()
    assert (tmp_path / "figures" / "census.png").stat().st_size > 5000


@pytest.mark.integration
def test_routing_small_run_with_learned_router_and_resume(tmp_path, monkeypatch):
    script = load_script("routing")
    args = ["--models", "embedded", "--tasks", "arc_easy", "--n", "3", "--K", "4", "--spaces", "skip_repeat",
            "--methods", "random", "mcts", "--vote-k", "2", "--mcts-k", "3",
            "--out", str(tmp_path / "runs"), "--figures", str(tmp_path / "figures")]
    assert script.main(args) == 0
    summary = tmp_path / "runs" / "summary-n3-K4-s0"
    table1 = pd.read_csv(summary / "table1.csv").set_index("task")
    assert table1.loc["arc_easy", "n"] == 3 and table1["learned_router_pp"].notna().all()
    curves = pd.read_csv(summary / "oracle_curves.csv")
    oracle = curves[curves.series == "random"].sort_values("k").value
    assert list(curves.k.unique()) == [1, 2, 3, 4] and oracle.is_monotonic_increasing
    assert (summary / "routing_oracle_skip_repeat.png").stat().st_size > 5000

    # a rerun generates nothing: searches, candidates and the router's routes come from the store
    monkeypatch.setattr(script.RouteEvaluator, "evaluate", lambda *a, **k: pytest.fail("regenerated a route"))
    assert script.main(args) == 0
    pd.testing.assert_frame_equal(pd.read_csv(summary / "table1.csv").set_index("task"), table1)


@pytest.mark.integration
def test_selection_small_run_has_every_channel(tmp_path):
    script = load_script("selection")
    args = ["--tasks", "arc_easy", "--n", "4", "--K", "3", "--T", "0.8", "--temperatures", "0.8",
            "--out", str(tmp_path / "runs"), "--figures", str(tmp_path / "figures")]
    assert script.main(args) == 0
    recovery = pd.read_csv(tmp_path / "runs" / "summary-n4-K3-s0" / "recovery.csv")
    routes = recovery[recovery.probe == "routes"]
    assert sorted(routes.selector) == sorted(script.CHANNELS) and (routes.n == 4).all()
    assert "learned_router" not in set(recovery[recovery.probe == "T0.8"].selector)  # routes only
    assert (routes.selector_acc.between(0, 1)).all() and (routes.greedy <= routes.oracle).all()
