"""The four study scripts (sampling_gap, selection, routing, census) end to end.

Unit tests run each script on a tiny random model (``cli.load`` patched) whose unembedding favours option
letters, over a small ARC-format question file, so the tables can be checked against values recomputed here
from the stored records; bad-input tests check that every argument is refused before anything loads. The
integration tests (marker ``integration``) run the scripts on the embedded model at tiny sizes.
"""
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make_tiny_model

from reach_lens import cli
from reach_lens.stats import wilson_interval
from reach_lens.routing import METHODS, SPACES
from reach_lens.select import SELECTORS, majority_vote

ROOT = Path(__file__).resolve().parents[1]
LETTERS = {3 + ord(c) - 32: c for c in "ABCD"}


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"experiment_{name}", ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class LetterTokenizer:
    """Printable ASCII as ids 3..97 and newline as 98 (0 pad, 1 BOS, 2 EOS); an option letter's id decodes to
    " X\\n\\n", so a continuation that starts with one ends there (the stop string of the shared format)."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    padding_side = "right"

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        ids = [98 if c == "\n" else min(max(3 + ord(c) - 32, 3), 97) for c in text]
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + ids}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f" {LETTERS[i]}\n\n" if i in LETTERS else "\n" if i == 98 else chr(i - 3 + 32)
                       for i in ids if i >= 3)


@pytest.fixture(scope="module")
def letter_model():
    """A tiny random model that mostly answers with a letter (A-C; D is no option, so a format failure)."""
    model = make_tiny_model(n_layers=4, d_vocab=100, seed=1)
    model.tokenizer = LetterTokenizer()
    with torch.no_grad():
        for i, c in LETTERS.items():
            model.unembed.b_U[i] += 2.5 if c == "D" else 4.5
    return model


@pytest.fixture
def tiny(letter_model, monkeypatch, tmp_path):
    """Scripts run on the letter model over 8 three-option ARC questions; returns (source file, common args)."""
    source = tmp_path / "questions.jsonl"
    rows = [{"id": f"q{i}", "question": f"Which one is number {i}?", "answerKey": "ABC"[i % 3],
             "choices": {"text": ["ice", "fire", "snow"], "label": ["A", "B", "C"]}} for i in range(8)]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(cli, "load", lambda args, name=None: letter_model)
    common = ["--source", str(source), "--fmt", "shared", "--out", str(tmp_path / "runs"),
              "--figures", str(tmp_path / "figures"), "--threads", "1"]
    return source, common


def stored(directory: Path) -> pd.DataFrame:
    """A stored table read straight from its parquet parts (not through the library)."""
    return pd.concat([pd.read_parquet(p) for p in sorted(directory.glob("part-*.parquet"))], ignore_index=True)


def cells(out: Path) -> list[Path]:
    """The run directories of a study's --out (its summary-* directories left out)."""
    return [p for p in out.iterdir() if not p.name.startswith("summary-")]


def one(paths) -> Path:
    paths = list(paths)
    assert len(paths) == 1, paths
    return paths[0]


# ---------------------------------------------------------------- sampling gap


def test_sampling_gap_tables_are_the_stored_records(tiny):
    _, common = tiny
    script = load_script("sampling_gap")
    assert script.main(["--tasks", "arc_easy", "--n", "6", "--K", "4", "--T", "0.8", "--temperatures", "0.8", "1.2",
                        *common]) == 0
    run = one(cells(Path(common[5])))
    deployed = stored(run / "deployed" / "deployed").set_index("question_id")
    out = one(run.glob("summary-T0.8-*"))
    table = pd.read_csv(out / "table.csv").iloc[0]
    sweep = pd.read_csv(out / "temperature_sweep.csv").set_index("T")
    assert sorted(sweep.index) == [0.8, 1.2] and (table.n, table.K, table["T"]) == (6, 4, 0.8)
    for T in (0.8, 1.2):
        records = stored(run / f"T{T:g}" / "records")
        cands = [list(c) for c in records.candidates]
        assert [len(c) for c in cands] == [4] * 6
        oracle = np.mean([any(c["correct"] for c in cs) for cs in cands])
        vote = np.mean([cs[majority_vote(cs)]["correct"] for cs in cands])
        D = np.mean([deployed.loc[q, "correct"] for q in records.question_id])
        assert (sweep.loc[T, "O"], sweep.loc[T, "vote"], sweep.loc[T, "D"]) == pytest.approx((oracle, vote, D))
        if T == 0.8:
            assert (table.oracle, table.vote, table.deployed) == pytest.approx((oracle, vote, D))
            assert (table.oracle_lo, table.oracle_hi) == pytest.approx(wilson_interval(round(oracle * 6), 6))
            curve = pd.read_csv(out / "reach_curve.csv")
            hit_rate = np.mean([np.mean([c["correct"] for c in cs]) for cs in cands])
            assert list(curve.k) == [1, 2, 3, 4]
            assert (curve.reach.iloc[0], curve.reach.iloc[-1]) == pytest.approx((hit_rate, oracle))
    table2 = pd.read_csv(one(Path(common[5]).glob("summary-table2-*")) / "table2.csv").iloc[0]
    assert (table2.oracle, table2.deployed, table2.n) == pytest.approx((table.oracle, table.deployed, 6))
    assert table2.guess_deployed == pytest.approx(1 / 3) and table2.guess_oracle == pytest.approx(1 - (2 / 3) ** 4)
    gaps = pd.read_csv(one(Path(common[5]).glob("summary-table2-*")) / "gap_curves.csv")
    assert list(gaps.k) == [1, 2, 3, 4] and gaps.gap.iloc[-1] == pytest.approx(table.oracle - table.deployed)
    assert gaps.guess_gap.iloc[0] == pytest.approx(1 / 3 - table.deployed)  # a guesser's one try, minus D
    figures = sorted(p.name for p in Path(common[7]).glob("*.png"))
    assert len(figures) == 4 and sum(p.name in figures for p in out.glob("*.png")) == 2


def test_sampling_gap_with_another_engine_records_it_and_keeps_its_runs_apart(tiny, letter_model, monkeypatch):
    """--engine vllm: the hook-free probes run on that engine (here a stand-in with vLLM's name, capabilities and
    protocol description; tests/test_vllm.py runs the real one), its name and seeding enter the protocol, and its
    runs never share a directory with the TransformerLens engine's."""
    from reach_lens.generate import TransformerLensEngine, vllm_engine

    made = []

    class StandIn(TransformerLensEngine):
        name, capabilities = "vllm", frozenset({"loglik"})

        def __init__(self, model, dtype, tensor_parallel_size, seed, device):
            made.append((str(model), dtype, tensor_parallel_size, device))
            super().__init__(letter_model)

        def describe(self):
            return {**super().describe(), "engine": f"vllm ({vllm_engine.SEEDING})"}

    _, common = tiny
    monkeypatch.setattr(vllm_engine, "VLLMEngine", StandIn)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")  # --threads 1 binds vLLM's CPU workers only where unset
    script = load_script("sampling_gap")
    argv = ["--tasks", "arc_easy", "--n", "4", "--K", "2", "--temperatures", "0.8", *common]
    with pytest.raises(cli.UserError, match="--n-devices 2 splits a model over GPUs; --device is 'cpu'"):
        script.main([*argv, "--engine", "vllm", "--device", "cpu", "--n-devices", "2"])
    assert script.main([*argv, "--engine", "vllm", "--model", "/ckpt", "--device", "cpu"]) == 0
    assert made == [("/ckpt", "bfloat16", 1, "cpu")]  # --dtype auto: vLLM runs bfloat16 on the CPU too
    run = one(cells(Path(common[5])))
    assert run.name.endswith("-vllm")
    protocol = json.loads((run / "T0.8" / "protocol.json").read_text())["protocol"]
    assert protocol["engine"] == "vllm (per-request seeds)"
    assert script.main(argv) == 0  # the TransformerLens engine: another directory
    assert len(cells(Path(common[5]))) == 2
    monkeypatch.setattr(cli, "resolve_device", lambda name: "cuda")  # as on a GPU machine: tensor parallelism
    assert script.main([*argv, "--engine", "vllm", "--model", "/ckpt", "--n-devices", "2",
                        "--out", str(Path(common[5]) / "gpu")]) == 0
    assert made[-1] == ("/ckpt", "bfloat16", 2, "cuda")


@pytest.mark.parametrize("script_name", ["census", "mlp_localize", "routing", "sampling_gap", "selection",
                                         "rlvr_compare", "train_rlvr"])
def test_every_experiment_takes_device_and_dtype(script_name):
    args = load_script(script_name).parse_args(["--device", "cpu", "--dtype", "bfloat16"])
    assert (args.device, args.dtype) == ("cpu", "bfloat16")
    if script_name != "train_rlvr":  # training runs where TRL puts it; the studies split models over GPUs too
        assert load_script(script_name).parse_args(["--n-devices", "2", "--batch-size", "4"]).n_devices == 2


def test_sampling_gap_rerun_at_another_T_keeps_the_first_tables(tiny):
    _, common = tiny
    script = load_script("sampling_gap")
    base = ["--tasks", "arc_easy", "--n", "3", "--K", "2", "--temperatures", "0.8", "1.2", *common]
    assert script.main([*base, "--T", "0.8"]) == 0
    run = one(cells(Path(common[5])))
    first = {p.name: p.read_text() for p in one(run.glob("summary-*")).glob("*.csv")}
    assert set(first) == {"table.csv", "temperature_sweep.csv", "reach_curve.csv", "gap_curve.csv"}
    assert script.main([*base, "--T", "1.2"]) == 0
    summaries = sorted(run.glob("summary-*"))
    assert len(summaries) == 2
    kept = one(run.glob("summary-T0.8-*"))
    assert {p.name: p.read_text() for p in kept.glob("*.csv")} == first
    assert pd.read_csv(one(run.glob("summary-T1.2-*")) / "table.csv")["T"].item() == 1.2


@pytest.mark.parametrize("argv, option, says", [
    (["--n", "0"], "--n", "0 out of range: expected an integer >= 1"),
    (["--K", "0"], "--K", "0 out of range: expected an integer >= 1"),
    (["--T", "-0.5"], "--T", "-0.5 out of range: expected a number > 0"),
    (["--temperatures", "0.8", "0"], "--temperatures", "0.0 out of range: expected a number > 0"),
    (["--chunk", "0"], "--chunk", "0 out of range"),
    (["--batch-size", "-1"], "--batch-size", "-1 out of range"),
    (["--tasks", "nope"], "--tasks", "unknown task 'nope': expected a registered name, jsonl:PATH"),
    (["--grader", "exact"], "--grader", "invalid choice: 'exact'"),
])
def test_sampling_gap_bad_arguments_fail_before_anything_loads(tmp_path, monkeypatch, capsys, argv, option, says):
    monkeypatch.setattr(cli, "load", lambda *a, **k: pytest.fail("the model loaded before the arguments were checked"))
    script = load_script("sampling_gap")
    with pytest.raises(SystemExit) as exit_:
        script.main([*argv, "--out", str(tmp_path / "runs")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (f"argument {option}" in err or option == "--source") and says in err
    assert not (tmp_path / "runs").exists()


def test_sampling_gap_refuses_one_source_for_two_tasks_and_file_options_without_a_file(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "load", lambda *a, **k: pytest.fail("the model loaded before the arguments were checked"))
    script = load_script("sampling_gap")
    for argv, says in ((["--tasks", "arc_easy", "piqa", "--source", "x.jsonl"], "one data source for 2 tasks"),
                       (["--tasks", "squad", "--grader", "mc_letter"], "--grader is for a task read from a file")):
        with pytest.raises(cli.UserError, match=says):
            script.main([*argv, "--out", str(tmp_path / "runs")])
    assert not (tmp_path / "runs").exists()


def test_sampling_gap_empty_or_short_source_fails_before_the_model(tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "load", lambda *a, **k: pytest.fail("the model loaded before the questions were checked"))
    script = load_script("sampling_gap")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(cli.UserError, match=r"no questions: arc_easy from .*empty.jsonl holds 0 questions"):
        script.main(["--tasks", "arc_easy", "--source", str(empty), "--out", str(tmp_path / "runs")])
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"id": "q", "question": "?", "answerKey": "A",
                                 "choices": {"text": ["x", "y"], "label": ["A", "B"]}}) + "\n")
    with pytest.raises(cli.UserError, match=r"--n 5 out of range: arc_easy from .*short.jsonl holds 1 questions"):
        script.main(["--tasks", "arc_easy", "--source", str(short), "--n", "5", "--out", str(tmp_path / "runs")])
    with pytest.raises(cli.UserError, match=r"cannot load arc_easy from .*missing.jsonl.*: data source .* does not exist"):
        script.main(["--tasks", "arc_easy", "--source", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "runs")])
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("script_name", ["sampling_gap", "selection", "routing", "census"])
@pytest.mark.parametrize("option", ["--out", "--figures"])
def test_outputs_under_a_regular_file_fail_before_loading(tmp_path, monkeypatch, script_name, option):
    monkeypatch.setattr(cli, "load", lambda *a, **k: pytest.fail("the model loaded before the outputs were checked"))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    script = load_script(script_name)
    with pytest.raises(cli.UserError, match=rf"{option} '.*a-file/sub': '.*a-file' is a file, not a directory"):
        script.main([option, str(blocker / "sub")])


# ---------------------------------------------------------------- selection


def test_selection_draws_the_sampling_gap_samples_and_flags_collapse(tiny):
    _, common = tiny
    assert load_script("sampling_gap").main(["--tasks", "arc_easy", "--n", "4", "--K", "3", "--T", "0.8",
                                             "--temperatures", "0.8", *common]) == 0
    sel_common = [*common[:4], "--out", str(Path(common[5]).parent / "sel"), *common[6:]]
    args = ["--tasks", "arc_easy", "--n", "4", "--K", "3", "--T", "0.8", "--temperatures", "0.8",
            "--collapse-threshold", "0.05", *sel_common]
    assert load_script("selection").main(args) == 0

    gap_run = one(cells(Path(common[5])))
    sel_run = one(p for p in (Path(common[5]).parent / "sel").iterdir() if not p.name.startswith("summary-"))
    gap, sel = stored(gap_run / "T0.8" / "records"), stored(sel_run / "T0.8" / "records")
    assert list(gap.question_id) == list(sel.question_id)
    for a, b in zip(gap.candidates, sel.candidates):  # same model, T and seed: the same samples
        assert [(c["text"], c["mean_logprob"], c["length"]) for c in a] == [(c["text"], c["mean_logprob"], c["length"]) for c in b]
    pd.testing.assert_frame_equal(stored(gap_run / "deployed" / "deployed")[["question_id", "text", "answer", "correct"]],
                                  stored(sel_run / "deployed" / "deployed")[["question_id", "text", "answer", "correct"]])

    out = one((Path(common[5]).parent / "sel").glob("summary-*"))
    recovery = pd.read_csv(out / "recovery.csv")
    routes = stored(one(sel_run.glob("routes-*")) / "records")
    assert sorted(recovery[recovery.probe == "routes"].selector) == sorted([*SELECTORS, "learned_router"])
    assert "learned_router" not in set(recovery[recovery.probe == "T0.8"].selector)
    for probe, records in (("routes", routes), ("T0.8", sel)):
        rows = recovery[recovery.probe == probe].set_index("selector")
        cands = [list(c) for c in records.candidates]
        failures = sum(c["answer"] is None for cs in cands for c in cs) / sum(map(len, cands))
        assert rows.format_failure_rate.to_numpy() == pytest.approx(failures)
        assert (rows.collapsed == (failures > 0.05)).all()
        assert rows.loc["majority_vote", "selector_acc"] == pytest.approx(np.mean([cs[majority_vote(cs)]["correct"] for cs in cands]))
        assert rows.loc["majority_vote", "oracle"] == pytest.approx(np.mean([any(c["correct"] for c in cs) for cs in cands]))
    assert recovery.collapsed.any(), "the letter model fails extraction on some candidates: the test needs a collapsed cell"
    medians = pd.read_csv(out / "recovery_medians.csv")
    collapsed_probes = set(recovery[recovery.collapsed].probe)
    assert medians[medians.probe.isin(collapsed_probes)]["median"].isna().all()  # collapsed cells are left out
    assert (medians[medians.probe.isin(collapsed_probes)].collapsed_cells == 1).all()


TWO_MODEL_RUNS = {  # script: (its arguments, its run directory and figure names for a model name)
    "sampling_gap": (["--n", "3", "--K", "2", "--T", "0.8", "--temperatures", "0.8"],
                     lambda m: ([f"{m}-arc_easy-n3-K2-s0"],
                                [f"sampling_gap_reach_{m}-arc_easy-n3-K2-s0-T0.8.png",
                                 f"sampling_gap_temperature_{m}-arc_easy-n3-K2-s0.png",
                                 f"sampling_gap_table2_{m}-n3-K2-s0-T0.8.png", f"sampling_gap_over_k_{m}-n3-K2-s0-T0.8.png"])),
    "selection": (["--n", "3", "--K", "2", "--T", "0.8", "--temperatures", "0.8"],
                  lambda m: ([f"{m}-arc_easy-n3-K2-s0"],
                             [f"selection_recovery_{m}-n3-K2-T0.8.png", f"selection_gap_vs_temperature_{m}-n3-K2.png",
                              f"selection_temperature_embedded_arc_easy_{m}-n3-K2.png"])),
    "routing": (["--n", "2", "--K", "3", "--methods", "random", "mcts", "--random-routes", "geometric"],
                lambda m: ([f"{m}-arc_easy-n2-K3-s0-geometric"],
                           [f"routing_oracle_skip_repeat_{m}-n2-K3-geometric.png",
                            f"routing_random_minus_structured_{m}-n2-K3-geometric.png"])),
}


@pytest.mark.parametrize("script_name", sorted(TWO_MODEL_RUNS))
def test_two_models_in_one_directory_keep_their_runs_and_figures(script_name, tiny, letter_model, monkeypatch):
    """A second model's run goes beside the first one's: its own run directories and figures, none overwritten
    (before, the second run's store refused the other model's protocol)."""
    _, common = tiny
    other = make_tiny_model(n_layers=4, d_vocab=100, seed=2)
    other.tokenizer, other.cfg.model_name = LetterTokenizer(), "other-tiny"
    extra, expected = TWO_MODEL_RUNS[script_name]
    for model in (letter_model, other):
        monkeypatch.setattr(cli, "load", lambda args, name=None, model=model: model)
        assert load_script(script_name).main(["--tasks", "arc_easy", *extra, *common]) == 0
    names = (letter_model.cfg.model_name, "other-tiny")
    runs = sorted(p.name for p in Path(common[5]).iterdir() if not p.name.startswith("summary-"))
    assert runs == sorted(run for name in names for run in expected(name)[0])
    figures = {p.name for p in Path(common[7]).iterdir()}
    for name in names:
        assert set(expected(name)[1]) <= figures


# ---------------------------------------------------------------- routing


def test_routing_tables_are_the_stored_searches_and_a_rerun_generates_nothing(tiny, monkeypatch):
    _, common = tiny
    script = load_script("routing")
    args = ["--models", "embedded", "--tasks", "arc_easy", "--n", "4", "--K", "6", "--spaces", "skip_repeat",
            "--methods", "random", "mcts", "--vote-k", "3", "--mcts-k", "4", *common]
    assert script.main(args) == 0
    run = one(p for p in Path(common[5]).iterdir() if not p.name.startswith("summary-"))
    searches = stored(run / "searches")
    full = [0, 1, 2, 3]
    D, rand, mcts, vote = [], [], [], []
    for row in searches.itertuples():
        by_route = {tuple(c["route"]): c for c in row.candidates}
        traces = {t["method"]: t for t in row.searches}
        assert list(traces["random"]["routes"][0]) == full and len(traces["random"]["routes"]) == 6
        D.append(by_route[tuple(full)]["correct"])
        rand.append(any(by_route[tuple(r)]["correct"] for r in traces["random"]["routes"]))
        mcts.append(any(by_route[tuple(r)]["correct"] for r in traces["mcts"]["routes"][:4]))
        first = [by_route[tuple(r)] for r in traces["random"]["routes"][:3]]
        vote.append(first[majority_vote(first)]["correct"])
    router = stored(run / "router")
    out = one(Path(common[5]).glob("summary-*"))
    t1 = pd.read_csv(out / "table1_geometric.csv").set_index("task")
    assert list(t1.index) == ["arc_easy", "all questions pooled"]
    row = t1.loc["arc_easy"]
    assert row["D"] == pytest.approx(np.mean(D))
    assert row["random_oracle@6_pp"] == pytest.approx(100 * (np.mean(rand) - np.mean(D)))
    assert row["mcts_oracle@4_routes_pp"] == pytest.approx(100 * (np.mean(mcts) - np.mean(D)))
    assert row["random_vote@3_pp"] == pytest.approx(100 * (np.mean(vote) - np.mean(D)))
    assert row["learned_router_pp"] == pytest.approx(100 * (router.correct.mean() - np.mean(D)))
    curves = pd.read_csv(out / "oracle_curves_geometric.csv")
    random_curve = curves[curves.series == "random"].sort_values("k")
    assert random_curve.value.iloc[-1] == pytest.approx(np.mean(rand)) and random_curve.value.iloc[0] == pytest.approx(np.mean(D))
    mcts_oracle = np.mean([any(by["correct"] for by in (
        {tuple(c["route"]): c for c in r.candidates}[tuple(x)] for x in {t["method"]: t for t in r.searches}["mcts"]["routes"]))
        for r in searches.itertuples()])
    diff = pd.read_csv(out / "random_minus_structured_geometric.csv").iloc[0]
    assert diff["diff"] == pytest.approx(np.mean(rand) - mcts_oracle)
    # the uniform random search of the same run, against the same MCTS search
    uniform = [any({tuple(c["route"]): c for c in r.candidates}[tuple(x)]["correct"]
                   for x in {t["method"]: t for t in r.searches}["random_uniform"]["routes"]) for r in searches.itertuples()]
    diff = pd.read_csv(out / "random_minus_structured_uniform.csv").iloc[0]
    assert diff["diff"] == pytest.approx(np.mean(uniform) - mcts_oracle)
    assert pd.read_csv(out / "table1_uniform.csv").set_index("task").loc["arc_easy", "random_oracle@6_pp"] == \
        pytest.approx(100 * (np.mean(uniform) - np.mean(D)))
    first_tables = {p.name: p.read_text() for p in out.glob("*.csv")}

    import reach_lens.routing.evaluate as evaluate
    monkeypatch.setattr(evaluate, "route", lambda *a, **k: pytest.fail("a rerun generated a route"))
    monkeypatch.setattr(evaluate, "cross_fit_router", lambda *a, **k: pytest.fail("a rerun refitted the router"))
    assert script.main(args) == 0
    assert {p.name: p.read_text() for p in out.glob("*.csv")} == first_tables


def test_routing_default_grid_has_a_free_form_cell_and_the_full_grid_is_one_flag_away():
    script = load_script("routing")
    default = script.parse_args([])
    assert (default.models, default.tasks, default.spaces) == (["embedded"], ["squad", "arc_easy"], ["skip_repeat"])
    assert default.methods == ["random", "mcts"] and (default.n, default.K) == (30, 16)
    full = script.parse_args(["--full-grid"])
    assert (full.models, full.tasks) == (list(script.MODELS), list(script.TASKS))
    assert (full.spaces, full.methods) == (list(SPACES), list(METHODS))
    chosen = script.parse_args(["--full-grid", "--tasks", "piqa", "--methods", "random", "genetic"])  # given: kept
    assert (chosen.tasks, chosen.methods, chosen.spaces) == (["piqa"], ["random", "genetic"], list(SPACES))


def test_routing_random_laws_are_part_of_the_protocol(tiny):
    _, common = tiny
    script = load_script("routing")
    args = ["--models", "embedded", "--tasks", "arc_easy", "--n", "2", "--K", "4", "--spaces", "skip",
            "--methods", "random", *common]
    assert script.main([*args, "--random-routes", "uniform"]) == 0
    run = one(p for p in Path(common[5]).iterdir() if not p.name.startswith("summary-"))
    protocol = json.loads((run / "protocol.json").read_text())["protocol"]
    assert protocol["settings"]["random_routes"] == ["uniform"]
    traces = [t for s in stored(run / "searches").searches for t in s]
    assert {t["method"] for t in traces} == {"random_uniform"} and all(len(t["routes"]) == 4 for t in traces)
    assert script.main([*args, "--random-routes", "geometric"]) == 0  # its own run directory, not a mismatch
    assert len([p for p in Path(common[5]).iterdir() if not p.name.startswith("summary-")]) == 2


# ---------------------------------------------------------------- census


def test_census_table_is_the_stored_screens(tiny):
    _, common = tiny
    script = load_script("census")
    assert script.main(["--n", "8", "--sparsities", "0.5", "--tasks", "arc_easy", "--min-failures", "1", *common]) == 0
    out = one(Path(common[5]).glob("summary-*"))
    table = pd.read_csv(out / "census.csv").set_index("sparsity")
    assert sorted(table.index) == [0.0, 0.5]
    for sparsity in (0.0, 0.5):
        run = one(p for p in Path(common[5]).iterdir()
                  if not p.name.startswith("summary-") and json.loads((p / "protocol.json").read_text())
                  ["protocol"]["settings"]["sparsity"] == sparsity)
        screen = stored(run / "screen")
        row = table.loc[sparsity]
        rec, gen = int(screen.recognized.sum()), int(screen.generated.sum())
        n_fail = int((screen.recognized & ~screen.generated).sum())
        assert (row.n, row.recognition_acc, row.generation_acc, row.n_fail) == pytest.approx((8, rec / 8, gen / 8, n_fail))
        assert row.meets_criterion == (wilson_interval(rec, 8)[0] > wilson_interval(gen, 8)[1] and n_fail >= 1)
    figures = [p.name for p in Path(common[7]).glob("census_*.png")]
    assert figures == [f"census_{table.loc[0.0].checkpoint}.png"]  # named by the model, not by its pruned copies


# ---------------------------------------------------------------- on the embedded model


@pytest.mark.heavy(80)
@pytest.mark.integration
def test_sampling_gap_and_selection_on_the_embedded_model(tmp_path):
    figures = ["--figures", str(tmp_path / "figures"), "--n", "2", "--K", "2", "--T", "0.8", "--temperatures", "0.8"]
    assert load_script("sampling_gap").main(["--out", str(tmp_path / "gap"), *figures]) == 0
    assert load_script("selection").main(["--out", str(tmp_path / "sel"), "--tasks", "arc_easy", *figures]) == 0
    gap = stored(one(p for p in cells(tmp_path / "gap") if "arc_easy" in p.name) / "T0.8" / "records")
    sel = stored(one(p for p in (tmp_path / "sel").iterdir() if not p.name.startswith("summary-")) / "T0.8" / "records")
    for a, b in zip(gap.candidates, sel.candidates):
        assert [c["text"] for c in a] == [c["text"] for c in b]


@pytest.mark.integration
def test_routing_and_census_on_the_embedded_model(tmp_path):
    args = ["--tasks", "arc_easy", "--n", "2", "--figures", str(tmp_path / "figures")]
    assert load_script("routing").main([*args, "--models", "embedded", "--K", "3", "--spaces", "skip_repeat",
                                        "--methods", "random", "mcts", "--out", str(tmp_path / "routing")]) == 0
    t1 = pd.read_csv(one((tmp_path / "routing").glob("summary-*")) / "table1_geometric.csv")
    assert t1.n.tolist() == [2, 2] and t1["learned_router_pp"].notna().all()
    assert load_script("census").main([*args, "--sparsities", "--out", str(tmp_path / "census")]) == 0
    census = pd.read_csv(one((tmp_path / "census").glob("summary-*")) / "census.csv")
    assert census.n.tolist() == [2]
