"""The run report (reach_lens.report): the questions table the run loop stores for it, the page's data against the
stores it reads (every study's section), old stores without that table, the command line, and the
lm-evaluation-harness export against a samples file lm-eval itself writes.

The studies run in process on tiny random Llama checkpoints with a word-level tokenizer (tests/test_cli.py's) whose
output layer favours the option letters, so that some answers are right, some wrong and some unparseable, over a
few ARC-format questions: each run takes seconds.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from transformers import PreTrainedTokenizerFast

from reach_lens import probes
from reach_lens.report import collect, page_data, write_lm_eval_samples, write_report
from reach_lens.report.__main__ import main as report_main
from reach_lens.report.studies import route_edits
from reach_lens.rlvr.audit_run import records_at
from reach_lens.select import SELECTORS
from reach_lens.stats import pass_at_k
from reach_lens.tasks import get_task
from test_cli import arc_file, word_llama  # the tiny word-level Llama and its ARC-format questions

try:  # tests/test_lm_eval.py's tiny model, task and simple_evaluate run, for the export's comparison
    from test_lm_eval import DATA as LM_EVAL_DATA, GEN_YAML, simple_evaluate_samples, tiny_checkpoint, tiny_pair, \
        write_task  # noqa: F401  (fixtures)
except pytest.skip.Exception:  # lm-eval is not installed
    tiny_checkpoint = tiny_pair = None

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"report_{name}", ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def stored(directory: Path) -> pd.DataFrame:
    """A stored table read straight from its parquet parts (not through the library)."""
    return pd.concat([pd.read_parquet(p) for p in sorted(directory.glob("part-*.parquet"))], ignore_index=True)


def val(x):
    """A stored scalar as the page holds it: None for a missing value (parquet reads it as NaN or None)."""
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else x


def one(paths) -> Path:
    paths = list(paths)
    assert len(paths) == 1, paths
    return paths[0]


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    """Two checkpoints and a question file; ``run(script, name, *argv)`` runs a study into ``<tmp>/<name>``."""
    top = tmp_path_factory.mktemp("report")
    base, other = word_llama(top / "tiny-llama", 24, 0, 20.0), word_llama(top / "other", 24, 1, 20.0)
    data = arc_file(top / "questions.jsonl", 8)

    def run(script: str, name: str, *argv: str) -> Path:
        args = ["--model", str(base), "--fmt", "shared", "--threads", "1", "--out", str(top / name),
                "--figures", str(top / "figures"), *argv]
        assert load_script(script).main(args) == 0
        return top / name

    return {"top": top, "base": base, "other": other, "data": data, "run": run}


@pytest.fixture(scope="module")
def gap_run(lab) -> Path:
    return lab["run"]("sampling_gap", "gap", "--tasks", "arc_easy", "--source", str(lab["data"]), "--n", "8",
                      "--K", "4", "--T", "0.8", "--temperatures", "0.8", "1.2")


@pytest.fixture(scope="module")
def routing_run(lab) -> Path:
    return lab["run"]("routing", "routing", "--models", "embedded", "--tasks", "arc_easy", "--source",
                      str(lab["data"]), "--n", "4", "--K", "4", "--spaces", "skip_repeat", "--methods", "random",
                      "mcts", "--vote-k", "2", "--mcts-k", "3")


@pytest.fixture(scope="module")
def rlvr_run(lab) -> Path:
    return lab["run"]("rlvr_compare", "rlvr", "--checkpoints", f"other={lab['other']}", "--task", "arc_easy",
                      "--source", str(lab["data"]), "--n", "8", "--K", "2", "--control-fmt", "native")


def summary_of(out: Path, pattern: str = "summary-*") -> Path:
    return one(p for p in out.rglob(pattern) if p.is_dir() and (p / "protocols.json").exists())


def html_data(path: Path) -> dict:
    """The JSON a written report inlines."""
    text = path.read_text(encoding="utf-8")
    start = text.index('<script id="data" type="application/json">') + len('<script id="data" type="application/json">')
    return json.loads(text[start:text.index("</script>", start)].replace("<\\/", "</"))


def probe(data: dict, label_part: str) -> dict:
    return one(p for p in data["probes"] if label_part in p["label"])


def question_ids(data: dict, p: dict) -> list[str]:
    return [data["cells"][p["cell"]]["questions"][r["q"]][0] for r in p["rows"]]


# ---------------------------------------------------------------- what the run loop stores


def test_the_deployed_store_keeps_each_question_with_its_prompt(gap_run, lab):
    cell = one(p for p in gap_run.iterdir() if p.is_dir() and not p.name.startswith("summary-"))
    task = get_task("arc_easy")
    questions = {q.id: q for q in task.load(lab["data"])}
    tokenizer = PreTrainedTokenizerFast.from_pretrained(lab["base"])
    deployed = stored(cell / "deployed" / "questions")
    assert sorted(deployed.question_id) == sorted(questions)
    for row in deployed.itertuples():
        q = questions[row.question_id]
        assert (row.question, row.gold, list(row.options), list(row.labels)) == (q.question, q.gold, list(q.options),
                                                                                 list(q.labels))
        assert row.prompt == task.prompt(q, "shared", tokenizer)
    sampled = stored(cell / "T0.8" / "questions")  # the records store: the questions, its loop knows no prompt
    assert list(sampled.question_id) == list(deployed.question_id) and sampled.prompt.isna().all()


def test_a_rerun_stores_the_questions_an_older_store_lacks_and_computes_nothing(gap_run, lab, tmp_path, monkeypatch):
    old = tmp_path / "gap"
    shutil.copytree(gap_run, old)
    for table in old.rglob("questions"):
        shutil.rmtree(table)
    summary = summary_of(old, "summary-table2-*")
    data = page_data(collect(summary))  # an older store still renders: ids, no text
    assert all(q[1:] == [None] * 7 for cell in data["cells"] for q in cell["questions"])
    assert len(probe(data, "T=0.8")["rows"]) == 8
    with pytest.raises(Exception, match="no stored prompt.*rerun the study"):
        write_lm_eval_samples(summary)
    monkeypatch.setattr(probes, "deploy", lambda *a, **k: pytest.fail("a rerun answered a question again"))
    monkeypatch.setattr(probes, "sample", lambda *a, **k: pytest.fail("a rerun sampled again"))
    lab["run"]("sampling_gap", str(old), "--tasks", "arc_easy", "--source", str(lab["data"]), "--n", "8", "--K", "4",
               "--T", "0.8", "--temperatures", "0.8", "1.2")
    cell = one(p for p in old.iterdir() if p.is_dir() and not p.name.startswith("summary-"))
    assert stored(cell / "deployed" / "questions").prompt.notna().all()
    again = page_data(collect(summary))
    assert all(q[1] for cell in again["cells"] for q in cell["questions"])


# ---------------------------------------------------------------- the page against its stores


def test_every_row_is_the_stored_record_and_candidates_are_grouped_not_lost(gap_run):
    summary = summary_of(gap_run, "summary-table2-*")
    written = summary / "report.html"  # the study wrote it
    data = html_data(written)
    assert data == json.loads(json.dumps(page_data(collect(summary))))
    assert data["tables"][0]["name"] == "table2.csv"
    assert data["tables"][0]["rows"] == pd.read_csv(summary / "table2.csv").replace({np.nan: None}).values.tolist()
    main = data["probes"][data["default"]]
    assert main["label"] == "T=0.8, K=4"  # the main table's temperature is the probe shown first
    cell = one(p for p in gap_run.iterdir() if p.is_dir() and not p.name.startswith("summary-"))
    records = stored(cell / "T0.8" / "records").set_index("question_id")
    deployed = stored(cell / "deployed" / "deployed").set_index("question_id")
    assert sorted(question_ids(data, main)) == sorted(records.index)
    for qid, row in zip(question_ids(data, main), main["rows"]):
        r = records.loc[qid]
        assert (row["d"], row["hits"], row["o"], row["ff"], row["K"]) == (r.d, r.hits, r.o, r.format_failures, 4)
        assert row["dep"] == [deployed.loc[qid, "text"], val(deployed.loc[qid, "answer"]),
                              int(deployed.loc[qid, "correct"])]
        assert row["vote"] == [val(r.vote_answer), int(r.vote_correct)]
        grouped = Counter()
        for g in row["c"]:
            grouped[(g[0], g[1], bool(g[2]))] += g[5]
        assert grouped == Counter((c["text"], c["answer"], bool(c["correct"])) for c in r.candidates)
        assert set(row["t"]) >= ({"realized"} if r.d else set()) | ({"never_reached"} if not r.o else set())
    hits = {c for c in records.hits}
    assert all(data["passk"]["4"][c] == [round(pass_at_k(4, c, k), 4) for k in range(1, 5)] for c in hits)
    assert data["floors"]["3"][3] == pytest.approx(1 - (2 / 3) ** 4, abs=1e-4)  # the 3-option guesser at k = K
    assert '"hidden"' not in written.read_text()


def test_routing_rows_are_the_stored_searches_with_each_route_as_its_edits(routing_run):
    data = page_data(collect(summary_of(routing_run)))
    searches = stored(one(p for p in routing_run.iterdir() if (p / "searches").is_dir()) / "searches")
    cell = one(p for p in routing_run.iterdir() if (p / "router").is_dir())
    router = stored(cell / "router").set_index("question_id")
    labels = sorted(p["label"] for p in data["probes"])
    assert labels == ["skip_repeat / mcts, K=4", "skip_repeat / random, K=4", "skip_repeat / random_uniform, K=4"]
    for s in searches.itertuples():
        by_route = {tuple(c["route"]): c for c in s.candidates}
        for t in s.searches:
            p = probe(data, f"/ {t['method']}, K")
            row = p["rows"][question_ids(data, p).index(s.question_id)]
            cands = [by_route[tuple(r)] for r in t["routes"]]
            assert row["d"] == int(by_route[(0, 1)]["correct"]) and row["hits"] == sum(c["correct"] for c in cands)
            assert [g[6] for g in row["c"]] == [route_edits(r, 2) for r in t["routes"]]  # distinct routes: one each
            assert row["x"]["router"][1:] == [val(router.loc[s.question_id, "answer"]),
                                              int(router.loc[s.question_id, "correct"])]
            reached = [m for m in ("random", "random_uniform", "mcts") if f"by:{m}" in row["t"]]
            assert (t["method"] in reached) == bool(row["o"])


def test_route_edits_read_against_the_full_path():
    assert route_edits(range(8), 8) == "full path"
    assert route_edits([0, 1, 2, 3, 4, 5, 6], 8) == "skip 7"
    assert route_edits([0, 1, 2, 5, 6, 7, 7], 8) == "skip 3-4, repeat 7"
    assert route_edits([0, 1, 1, 1, 2], 3) == "repeat 1 x3"
    assert route_edits([0, 1, 2, 1, 2, 3], 4) == "repeat 1-2 as a window"


def test_rlvr_checkpoints_side_by_side_with_the_fates_of_the_summary(rlvr_run):
    summary = summary_of(rlvr_run)
    data = html_data(summary / "report.html")
    (cmp,) = data["compares"]
    assert sorted(cmp["labels"]) == ["base", "other"] and cmp["K"] == 2
    questions = pd.read_csv(summary / "questions.csv").set_index("question_id")
    for label in ("base", "other"):
        cell = cmp["cells"][cmp["labels"].index(label)]
        model = data["stores"][data["cells"][cell]["stores"][0]]["protocol"]["model"]
        assert data["cells"][cell]["label"].startswith(f"{label}: {model} / ")
        records = stored(one(rlvr_run.glob(f"*/{model}/shared/T0.8/records")))
        at_k = records_at(records, 2).set_index("question_id")
        control = stored(one(rlvr_run.glob(f"*/{model}/native/deployed/deployed"))).set_index("question_id")
        side = "base" if label == "base" else "trained"
        for qid, rows in cmp["rows"].items():
            x = rows[cmp["cells"].index(cell)]
            assert x == [int(at_k.loc[qid, "d"]), int(at_k.loc[qid, "hits"]), int(at_k.loc[qid, "o"]),
                         int(records.set_index("question_id").loc[qid, "hits"]), 4, int(control.loc[qid, "correct"])]
            assert (x[0], x[1]) == (questions.loc[qid, f"d_{side}"], questions.loc[qid, f"hits_{side}"])
    trained = one(p for p in data["probes"] if p["cell"] == cmp["cells"][cmp["labels"].index("other")]
                  and p["kind"] == "samples")
    for qid, row in zip(question_ids(data, trained), trained["rows"]):
        assert f"fate:{questions.loc[qid, 'realization']}" in row["t"]
        assert cmp["fates"][qid] == [["other", questions.loc[qid, "realization"], questions.loc[qid, "reachability"]]]


def test_selection_rows_carry_what_each_selector_picked(lab):
    out = lab["run"]("selection", "selection", "--tasks", "arc_easy", "--source", str(lab["data"]), "--n", "4",
                     "--K", "4", "--temperatures", "0.8")
    html = summary_of(out) / "report.html"
    data = html_data(html)
    samples = stored(one(out.glob("*/T0.8/records"))).set_index("question_id")
    p = probe(data, "T=0.8")
    for qid, row in zip(question_ids(data, p), p["rows"]):
        cands = list(samples.loc[qid, "candidates"])
        for name, group, right in row["x"]["picks"]:
            i = SELECTORS[name](cands)
            assert right == int(cands[i]["correct"]) and row["c"][group][0] == cands[i]["text"]
    assert probe(data, "routes (skip_repeat, geometric)")["rows"][0]["c"][0][6] is not None  # routes noted
    assert "hidden" in samples.candidates.iloc[0][0] and '"hidden"' not in html.read_text()  # stored, not inlined


def test_census_and_localization_screens_with_each_condition_against_the_clean_answer(lab):
    out = lab["run"]("census", "census", "--tasks", "arc_easy", "--source", str(lab["data"]), "--n", "8",
                     "--sparsities", "0.5", "--min-failures", "1")
    data = html_data(summary_of(out) / "report.html")
    census = pd.read_csv(summary_of(out) / "census.csv")
    screens = [p for p in data["probes"] if p["kind"] == "screen"]
    assert len(screens) == len(census) == 2
    for p in screens:
        tags = Counter(t for r in p["rows"] for t in r["t"])
        row = census[census.n_fail == tags["recognized_not_generated"]].iloc[0]
        assert (tags["recognized"], tags["generated"]) == (round(row.recognition_acc * 8),
                                                           round(row.generation_acc * 8))

    data24 = arc_file(lab["top"] / "more.jsonl", 24, rotate=True)
    out = lab["run"]("mlp_localize", "localize", "--task", "arc_easy", "--source", str(data24), "--n", "24",
                     "--min-panel", "1", "--layers", "0,1", "--max-eval", "3", "--max-calibration", "3", "--alphas",
                     "2", "--random-seeds", "1", "--unit-k", "2")
    run_dir = one(out.iterdir())
    data = html_data(run_dir / "report.html")
    assert data["tables"][0]["name"] == "evaluation.csv" and data["text"] == (run_dir / "summary.md").read_text()
    (p,) = data["probes"]
    conditions = stored(run_dir / "conditions")
    screen = stored(run_dir / "screen").set_index("question_id")
    panels = stored(run_dir / "panels").set_index("question_id")
    for qid, row in zip(question_ids(data, p), p["rows"]):
        if qid not in panels.index:
            assert "cond" not in row["x"]
            continue
        assert f"panel:{panels.loc[qid, 'panel']}" in row["t"] and f"role:{panels.loc[qid, 'role']}" in row["t"]
        mine = conditions[conditions.question_id == qid]
        assert [c[0] for c in row["x"]["cond"]] == list(mine.condition)
        clean = bool(screen.loc[qid, "generated"])
        for c, now in zip(row["x"]["cond"], mine.correct):
            assert c[5] == ("repaired" if now and not clean else "broken" if clean and not now else "unchanged")
    assert any(c[1].startswith("steer L") and "alpha" in c[1] for r in p["rows"] for c in r["x"].get("cond", []))


def test_a_report_is_made_while_a_writer_holds_every_store(gap_run, tmp_path):
    """Stores are read as a reader: a writer's lock on each of them (as a running study holds) is never asked for."""
    import fcntl
    import os

    run = shutil.copytree(gap_run, tmp_path / "gap")  # a copy: this process holds the study's own locks
    locks = []
    for lock in run.rglob(".writer.lock"):
        fd = os.open(lock, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: as another process's lock
        locks.append(fd)
    try:
        assert len(locks) == 3  # deployed and two temperatures
        data = page_data(collect(summary_of(run, "summary-table2-*")))
        assert len(data["probes"]) == 2
    finally:
        for fd in locks:
            os.close(fd)


# ---------------------------------------------------------------- the command line


def test_the_command_line_renders_a_summary_a_run_root_and_one_store(gap_run, lab, tmp_path, capsys):
    summary = summary_of(gap_run, "summary-table2-*")
    cell = one(p for p in gap_run.iterdir() if p.is_dir() and not p.name.startswith("summary-"))
    assert report_main([str(summary), "--out", str(tmp_path / "a.html")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "a.html")
    root = html_data(write_report(cell, tmp_path / "root.html"))  # deployed and both temperatures, one cell
    assert root["kind"] == "root" and sorted(p["label"] for p in root["probes"]) == ["T=0.8, K=4", "T=1.2, K=4"]
    assert any(t["name"].endswith("/table.csv") for t in root["tables"])  # its summary-T0.8 directory's tables
    single = html_data(write_report(cell / "deployed", tmp_path / "store.html"))
    assert single["kind"] == "store" and [p["label"] for p in single["probes"]] == ["greedy (shared)"]
    two = tmp_path / "two"  # two cells of one model and task under one root: their labels say what differs
    for seed in ("0", "1"):
        lab["run"]("sampling_gap", str(two), "--tasks", "arc_easy", "--source", str(lab["data"]), "--n", "8", "--K",
                   "2", "--temperatures", "0.8", "--seed", seed)
    labels = sorted(c["label"] for c in page_data(collect(two))["cells"])
    assert len(labels) == 2 and labels[0].endswith("seed=0]") and labels[1].endswith("seed=1]")
    assert report_main([str(tmp_path / "nothing")]) == 1
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert report_main([str(tmp_path / "empty")]) == 1
    assert "holds no run store" in capsys.readouterr().err


# ---------------------------------------------------------------- lm-evaluation-harness samples


def _json_types(value) -> object:
    """The JSON shape of a value: types of its scalars, keys of its dicts, the shape of a list's first item."""
    if isinstance(value, dict):
        return {k: _json_types(v) for k, v in value.items()}
    if isinstance(value, list):
        return ["list", _json_types(value[0]) if value else None]
    return type(value).__name__


@pytest.mark.skipif(tiny_checkpoint is None, reason="lm-eval is not installed (pip install -e '.[lm-eval]')")
def test_the_export_has_the_layout_of_lm_evals_own_samples_file(tiny_pair, tiny_checkpoint, tmp_path):
    """lm-eval's simple_evaluate(log_samples=True) on a tiny model (tests/test_lm_eval.py's), saved by its own
    EvaluationTracker, against the export of a reach_lens run of the same lm-eval task on the same checkpoint: every
    key of lm-eval's file with its JSON type, the same prompt and target hashes and the same greedy completions."""
    from lm_eval.loggers import EvaluationTracker

    lm, _ = tiny_pair
    yaml = write_task(tmp_path / "tasks", GEN_YAML, LM_EVAL_DATA / "gen.jsonl", "tiny_gen")
    theirs = [s for s in simple_evaluate_samples(lm, yaml) if s["filter"] == "strict"]
    tracker = EvaluationTracker(output_path=str(tmp_path / "lm_eval_out"))
    tracker.general_config_tracker.model_name_sanitized = "tiny"
    tracker.date_id = "2026-12-07T00-00-00.000000"
    tracker.save_results_samples("tiny_gen", theirs)
    lines = (tmp_path / "lm_eval_out" / "tiny" / "samples_tiny_gen_2026-12-07T00-00-00.000000.jsonl").read_text()
    lm_eval_file = {s["prompt_hash"]: s for s in map(json.loads, lines.splitlines())}

    out = tmp_path / "runs"
    assert load_script("sampling_gap").main([
        "--model", str(tiny_checkpoint), "--tasks", f"lm-eval:{yaml}", "--lm-eval-filter", "strict", "--n", "6",
        "--K", "2", "--temperatures", "0.8", "--out", str(out), "--figures", str(tmp_path / "figures"),
        "--threads", "1"]) == 0
    (path,) = write_lm_eval_samples(summary_of(out, "summary-table2-*"), tmp_path / "export")
    assert path.parent == tmp_path / "export" / tiny_checkpoint.name
    assert path.name.startswith("samples_lm_eval_tiny_gen_T0_8_") and path.suffix == ".jsonl"
    ours = {s["prompt_hash"]: s for s in map(json.loads, path.read_text().splitlines())}
    assert len(ours) == 6 and set(ours) == set(lm_eval_file)  # the same six prompts
    for prompt_hash, their in lm_eval_file.items():
        mine = ours[prompt_hash]
        shape = _json_types(mine)
        for key, value in their.items():
            assert key in mine, key
            if key == "doc":  # each tool's own record of the question: a dict either way
                assert isinstance(mine[key], dict)
            elif key == "arguments":  # lm-eval's one request per document; here the greedy one and the K drawn
                assert shape[key]["gen_args_0"] == _json_types(value)["gen_args_0"] | {
                    "arg_1": shape[key]["gen_args_0"]["arg_1"]}
                assert isinstance(value["gen_args_0"]["arg_1"], dict)
            else:
                assert shape[key] == _json_types(value), key
        assert mine["target_hash"] == their["target_hash"] and mine["target"] == their["target"]
        assert mine["arguments"]["gen_args_0"]["arg_0"] == their["arguments"]["gen_args_0"]["arg_0"]
        assert mine["resps"][0] == their["resps"][0] and mine["exact_match"] == their["exact_match"]
        assert len(mine["resps"][1]) == 2 and mine["pass@2"] == float(mine["hits"] > 0)


def test_a_300_question_report_at_k64_stays_under_20_mb(tmp_path):
    """bench/bench_report.py's synthetic cell at its worst (every candidate distinct, up to 60 words, a hidden vector
    on each): the page inlines no hidden state and stays within the size budget."""
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "bench_report.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    summary = bench.synthetic_cell(tmp_path / "cell", 300, 64, hidden=16, distinct=64, length=60)
    path = write_report(summary)
    data = html_data(path)
    (p,) = data["probes"]
    assert len(p["rows"]) == 300 and sum(g[5] for r in p["rows"] for g in r["c"]) == 300 * 64
    assert path.stat().st_size < 20e6 and '"hidden"' not in path.read_text()
