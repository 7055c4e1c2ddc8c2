"""End-to-end runs of experiments/mlp_localize.py on the embedded model (small n; the model loaded once per session)."""
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from reach_lens.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("screen", "panels", "layer_sweep", "evaluation", "margins", "steering", "units")


def load_script():
    spec = importlib.util.spec_from_file_location("mlp_localize", ROOT / "experiments" / "mlp_localize.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mlp_localize"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def script(monkeypatch, embedded_model):
    """The script, its model loads answered by the session's embedded model."""
    module = load_script()
    monkeypatch.setattr(module.cli, "load", lambda args, name=None: embedded_model)
    return module


def small_args(out: Path) -> list[str]:
    return ["--n", "50", "--layers", "12,24", "--max-eval", "6", "--max-calibration", "6", "--min-panel", "3",
            "--alphas", "4", "--random-seeds", "2", "--unit-k", "8", "--out", str(out / "runs"),
            "--figures", str(out / "figures")]


def tables(run_dir: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_csv(run_dir / f"{name}.csv") for name in TABLES}


@pytest.mark.heavy(150)
@pytest.mark.integration
def test_mlp_localize_end_to_end_and_a_resumed_run_equals_an_uninterrupted_one(tmp_path, monkeypatch, script):
    assert script.main(small_args(tmp_path / "a")) == 0
    run_dir = next((tmp_path / "a" / "runs").iterdir())
    out = tables(run_dir)
    sweep = out["layer_sweep"]
    assert sorted(zip(sweep.layer, sweep.component)) == sorted((l, c) for l in (12, 24) for c in ("mlp", "attn"))
    assert set(sweep.role) == {"calibration"}  # the layer is chosen on calibration questions only
    panels = out["panels"]
    assert panels.question_id.is_unique and set(panels.role) == {"calibration", "evaluation"}
    screen = out["screen"].set_index("question_id")
    for row in panels.itertuples():  # panels follow the criterion (healthy: the paper's already-correct rule)
        assert screen.loc[row.question_id, "generated"] == (row.panel == "healthy")
        assert screen.loc[row.question_id, "recognized"] or row.panel == "healthy"
    evaluation = out["evaluation"]
    n_eval = panels[panels.role == "evaluation"].panel.value_counts()
    assert (evaluation.repair_n == n_eval["failure"]).all() and (evaluation.breakage_n == n_eval["healthy"]).all()
    assert evaluation.label.iloc[0] == "identified" and "best other MLP" in " ".join(evaluation.label)
    steering = out["steering"]
    assert set(steering.role) == {"calibration", "evaluation", "random direction"}
    # the random direction is measured on evaluation only, at every alpha
    random = steering[steering.role == "random direction"]
    assert sorted(random.alpha) == sorted(steering[steering.role == "evaluation"].alpha)
    assert random.rescue.notna().all() and random.induction.notna().all()
    assert set(out["units"]["rank"]) == {"contribution"}
    summary = (run_dir / "summary.md").read_text()
    for text in ("Which split chose what", "rule 'already-correct'", "Runner-ups chosen on calibration",
                 "paired: Newcombe 95%, exact McNemar p", "Verdict:", "rescue alpha =", "induction alpha =", "Wall time",
                 "v is measured at the last prompt token only", "every position, each prompt token and each generated",
                 "Unparseable greedy answers (no letter read) among the failures", "rule 'contribution'"):
        assert text in summary
    for name in ("layer_sweep", "steering", "units"):
        assert (run_dir / f"{name}.png").stat().st_size > 5000
    # the per-question table: every screened question, its panel, and each condition's outcome where it ran
    questions = pd.read_csv(run_dir / "questions.csv")
    assert questions.question_id.tolist() == out["screen"].question_id.tolist()
    on_panels = questions.set_index("question_id").loc[panels.question_id]
    assert (on_panels.panel.to_numpy() == panels.panel.to_numpy()).all()
    calibrated = on_panels[panels.set_index("question_id").role == "calibration"]
    assert calibrated["silence-mlp-12"].notna().all() and questions[questions.panel.isna()]["silence-mlp-12"].isna().all()

    # killed in the middle of the selection sweep, then resumed: the same tables as the uninterrupted run. The
    # killed run had stored its screen and panels (as the first run did): its directory starts from those.
    (tmp_path / "b" / "runs").mkdir(parents=True)
    shutil.copytree(run_dir, tmp_path / "b" / "runs" / run_dir.name,
                    ignore=lambda d, names: [n for n in names if n not in ("protocol.json", "screen", "panels")
                                             and Path(d) == run_dir])
    from reach_lens import localize
    answer, calls = localize.Conditions.answer, []

    def dies_on_the_third_condition(self, questions, interventions):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return answer(self, questions, interventions)

    monkeypatch.setattr(localize.Conditions, "answer", dies_on_the_third_condition)
    monkeypatch.setattr(localize, "screen", lambda *a, **k: pytest.fail("the screen was stored"))
    with pytest.raises(KeyboardInterrupt):
        script.main(small_args(tmp_path / "b"))
    monkeypatch.setattr(localize.Conditions, "answer", answer)
    assert script.main(small_args(tmp_path / "b")) == 0
    resumed = tables(next((tmp_path / "b" / "runs").iterdir()))
    for name in TABLES:
        pd.testing.assert_frame_equal(resumed[name], out[name], obj=name)

    # a rerun over a finished directory recomputes nothing and reproduces every table
    monkeypatch.setattr(localize.Conditions, "answer", lambda *a: pytest.fail("recomputed a condition"))
    assert script.main(small_args(tmp_path / "a")) == 0
    for name, table in tables(run_dir).items():
        pd.testing.assert_frame_equal(table, out[name], obj=name)


@pytest.mark.integration
def test_a_too_small_panel_stops_the_run_before_any_intervention(tmp_path, monkeypatch, script):
    from reach_lens import localize
    screen = localize.screen
    monkeypatch.setattr(localize, "screen", lambda *a, **k: screen(*a, **k).assign(generated=False))
    monkeypatch.setattr(localize.Conditions, "answer", lambda *a: pytest.fail("an intervention ran"))
    args = small_args(tmp_path)
    args[args.index("--n") + 1] = "12"
    with pytest.raises(UserError, match=r"healthy calibration: 0; healthy evaluation: 0"):
        script.main(args)


@pytest.mark.heavy(90)
@pytest.mark.integration
def test_pruning_created_failures_are_screened_on_what_the_unpruned_model_answers(tmp_path, monkeypatch, script):
    """--prune-created: the unpruned model screens every question; the pruned copy screens only those it recognizes
    and generates, in its own store, so each failure of its panels is one pruning created."""
    from reach_lens import localize

    class Panels(Exception):
        pass

    def stop_at_the_panel_check(panels, *a):
        raise Panels(panels)

    monkeypatch.setattr(localize, "check_panels", stop_at_the_panel_check)
    args = [*small_args(tmp_path), "--prune", "0.5", "--prune-created"]
    with pytest.raises(Panels) as stopped:
        script.main(args)
    run_dir = next((tmp_path / "runs").iterdir())
    assert run_dir.name.endswith("-prune0.5-created")
    unpruned = pd.read_parquet(run_dir / "screen_unpruned").sort_values("question_id")
    pruned = pd.read_parquet(run_dir / "pruned_model" / "screen")
    recognized = unpruned.recognized.map(lambda r: bool(r) if pd.notna(r) else False)
    pool = unpruned.question_id[recognized & unpruned.generated.astype(bool)]
    assert len(unpruned) == 50 and 0 < len(pool) < 50
    assert sorted(pruned.question_id) == sorted(pool)  # the pruned copy is screened on the pool only
    assert not pruned.generated.all()  # pruning at 50% breaks some of what the model answered
    panels = stopped.value.args[0]
    failures = set(panels.question_id[panels.panel == "failure"])
    assert failures <= set(pool) and set(panels.question_id) <= set(pool)
    weights = [json.loads((d / "protocol.json").read_text())["protocol"]["weights"] for d in (run_dir, run_dir / "pruned_model")]
    assert weights[0] != weights[1]


@pytest.mark.heavy(200)
@pytest.mark.integration
def test_bias_push_control_is_localized_to_its_mlp(tmp_path, script):
    """The easy control: a push towards one letter at MLP 25's output, the same on every question, found among the
    components of the layers around it (the full sweep is the documented --planted 25 run)."""
    planted = 25
    # PIQA: the push goes towards the pool's rarer gold letter, so only the few pool questions whose gold is that
    # letter stay healthy (6 of 49 here); a calibration share of 0.6 leaves 3 of them on each side of the split
    args = ["--task", "piqa", "--planted", str(planted), "--n", "120", "--layers", "24,25", "--max-eval", "12",
            "--max-calibration", "12", "--min-panel", "2", "--calibration-share", "0.6", "--alphas", "4",
            "--random-seeds", "2", "--unit-k", "8", "--out", str(tmp_path / "runs"), "--figures", str(tmp_path / "f")]
    assert script.main(args) == 0
    run_dir = next((tmp_path / "runs").iterdir())
    evaluation = pd.read_csv(run_dir / "evaluation.csv").set_index("name")
    # the pool answers correctly without the planted block, so silencing it undoes the edit exactly
    assert evaluation.loc[f"MLP {planted}", "label"] == "identified"
    assert evaluation.loc[f"MLP {planted}", "repair"] == 1.0 and evaluation.loc[f"MLP {planted}", "breakage"] == 0.0
    assert evaluation.loc[f"attention {planted}", "repair"] < 0.5  # the component control
    summary = (run_dir / "summary.md").read_text()
    assert f"Planted MLP {planted}, identified MLP {planted}: found" in summary
    screen = pd.read_csv(run_dir / "screen.csv")  # the planted model's screen of the pool
    assert screen.recognized.mean() >= 0.9  # the edit barely moves recognition (the pool was all recognized)


@pytest.mark.heavy(80)
@pytest.mark.integration
def test_units_step_over_sae_latents_end_to_end_and_each_sae_is_its_own_run(tmp_path, monkeypatch, script):
    """--units sae --sae PATH: the top-k step silences SAE latents (the SAE attached with its error term); a run
    with another SAE is another protocol and another directory, never a reuse of the first one's rows."""
    sae_lens = pytest.importorskip("sae_lens", reason="SAELens is not installed (pip install -e '.[sae]')")
    import torch
    from sae_lens.saes.sae import SAEMetadata

    def saved_sae(seed: int) -> Path:
        torch.manual_seed(seed)
        cfg = sae_lens.StandardSAEConfig(d_in=576, d_sae=96, metadata=SAEMetadata(hook_name="blocks.24.hook_mlp_out"))
        path = tmp_path / f"sae{seed}"
        sae_lens.StandardSAE(cfg).save_model(path)
        return path

    args = small_args(tmp_path)
    args[args.index("--layers") + 1] = "24"
    assert script.main([*args, "--units", "sae", "--sae", str(saved_sae(0))]) == 0
    run = next((tmp_path / "runs").iterdir())
    assert "-sae" in run.name
    units = pd.read_csv(run / "units.csv")
    assert set(units.space) == {"SAE latents"}
    assert units.arm.tolist() == ["block", "top", "random", "random"]  # the block, top-k and 2 random-k sets
    assert units[units.arm != "block"].units.map(lambda ids: len(eval(ids)) == 8 and max(eval(ids)) < 96).all()
    assert "SAE latents" in (run / "summary.md").read_text()

    # another SAE: a new run directory that starts from nothing (here: its first screen is stopped at once)
    from reach_lens import localize

    class NewRun(Exception):
        pass

    def screen_stops(*a, **k):
        raise NewRun

    monkeypatch.setattr(localize, "screen", screen_stops)
    assert script.main([*args, "--units", "sae", "--sae", str(saved_sae(0))]) == 0  # the same SAE: all stored
    with pytest.raises(NewRun):
        script.main([*args, "--units", "sae", "--sae", str(saved_sae(1))])
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all("-sae" in r.name for r in runs)


@pytest.mark.parametrize("bad", [["--layers", "3-x"], ["--alphas", "-2"], ["--max-eval", "0"], ["--n", "-1"],
                                 ["--n", "0"], ["--n", "some"], ["--task", "nope"], ["--task", "jsonl:"],
                                 ["--calibration-share", "1"], ["--planted", "3", "--planted-units", "4"],
                                 ["--healthy-rule", "both"], ["--layer-rule", "biggest"], ["--prune", "1.5"],
                                 ["--units", "sae", "--sae", "/no/such/sae"], ["--units", "latents"],
                                 ["--units", "sae"], ["--unit-rank", "mass"], ["--prune-created"],
                                 ["--prune", "0.3", "--prune-created", "--planted", "3"]])
def test_bad_arguments_are_refused_before_anything_loads(bad, capsys):
    with pytest.raises(SystemExit) as stop:
        load_script().parse_args(bad)
    assert stop.value.code == 2 and "error" in capsys.readouterr().err


def test_the_shared_data_arguments_take_n_all_and_name_what_they_refuse(tmp_path, monkeypatch, capsys):
    script = load_script()
    args = script.parse_args([])
    assert (args.task, args.n, args.fmt, args.unit_rank, args.exclude_format_failures) == \
        ("arc_easy", 300, "auto", "contribution", False)  # auto: the model's chat template, plain text without one
    seen = {}

    def questions(task, source, split, n, seed, skip=0):
        seen["n"] = n
        raise SystemExit("questions loaded")

    monkeypatch.setattr(script.cli, "questions", questions)
    monkeypatch.setattr(script.cli, "load", lambda *a: pytest.fail("loaded a model"))
    with pytest.raises(SystemExit, match="questions loaded"):
        script.main(["--n", "all", "--out", str(tmp_path / "runs"), "--figures", str(tmp_path / "f")])
    assert seen["n"] is None  # every question of the source
    for bad, says in ((["--n", "0"], "argument --n: 0 out of range: expected an integer >= 1 or 'all'"),
                      (["--task", "nope"], "argument --task: unknown task 'nope': expected a registered name"),
                      (["--units", "sae"], "--units sae and --sae PATH go together")):
        with pytest.raises(SystemExit) as stop:
            script.main([*bad, "--out", str(tmp_path / "runs")])
        assert stop.value.code == 2 and says in capsys.readouterr().err
    with pytest.raises(script.UserError, match="--task gsm8k: 'gsm8k' is not multiple choice"):
        script.main(["--task", "gsm8k", "--out", str(tmp_path / "runs")])
    assert not seen.keys() - {"n"} and not (tmp_path / "runs").exists()
