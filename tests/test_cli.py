"""The experiment scripts' shared command line: errors a user causes end in a message and a status, output goes
through logging with --quiet/--verbose, and every argument has help.

The scripts run as subprocesses (their real exit status and stderr) on a tiny random Llama checkpoint with a
word-level tokenizer, written once per module, over a few ARC-format questions: no embedded model is loaded.
``cli.run`` itself is also checked in process for every ``UserError`` subclass.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from reach_lens import cli, logs
from reach_lens.architectures import UnsupportedArchitecture
from reach_lens.errors import UserError
from reach_lens.generate.types import EngineCapabilityError
from reach_lens.localize.panels import PanelTooSmall
from reach_lens.models import ModelNotFound, UnreadableModel
from reach_lens.store import ProtocolMismatch, UnreadableRunDirectory

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("census", "mlp_localize", "rlvr_compare", "routing", "sampling_gap", "selection", "train_rlvr")


# ---------------------------------------------------------------- helpers


def run_script(name: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python experiments/<name>.py argv`` with this checkout first on the path; its status, stdout, stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, str(ROOT / "experiments" / f"{name}.py"), *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def refused(result: subprocess.CompletedProcess, script: str, *says: str) -> str:
    """Assert a clean refusal (status 1, '<script>.py: error: ...', no traceback); returns stderr."""
    err = result.stderr
    assert result.returncode == 1, (result.returncode, err)
    assert "Traceback" not in err, err
    assert f"{script}.py: error: " in err, err
    for text in says:
        assert text in err, (text, err)
    return err


def arc_file(path: Path, n: int = 8, broken_line: int | None = None, rotate: bool = False) -> Path:
    """``n`` three-option ARC-format questions; line ``broken_line`` (1-based) is not JSON; ``rotate``: question i's
    options turned by i, its gold by i // 3 (so that the option a model likes and the letter it likes fall on
    different questions' golds)."""
    texts = ["ice", "fire", "snow"]
    rows = [json.dumps({"id": f"q{i}", "question": f"Which one is number {i}?",
                        "answerKey": "ABC"[(i // 3 if rotate else i) % 3],
                        "choices": {"text": texts[i % 3:] + texts[:i % 3] if rotate else texts,
                                    "label": ["A", "B", "C"]}}) for i in range(n)]
    if broken_line is not None:
        rows[broken_line - 1] = '{"id": "q-broken", "question": '
    path.write_text("".join(row + "\n" for row in rows))
    return path


def word_llama(directory: Path, numbers: int = 8, seed: int = 0, letter_scale: float = 1.0) -> Path:
    """A tiny random Llama checkpoint (2 layers, d_model 16) with a word-level tokenizer of the ARC-format questions
    of ``arc_file`` (numbers 0..``numbers``-1) and a chat template, saved in ``directory``; ``letter_scale`` scales
    the output rows of the letters A, B, C (above 1: its answers are often a letter)."""
    words = sorted({w for i in range(numbers) for w in f"Which one is number {i}? ice fire snow A B C Answer:".split()})
    vocab = ["<unk>", "<s>", "</s>", *words]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                        pad_token="</s>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(config)
    if letter_scale != 1.0:
        with torch.no_grad():
            for letter in "ABC":
                model.lm_head.weight[vocab.index(letter)] *= letter_scale
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random Llama checkpoint (``word_llama``)."""
    return word_llama(tmp_path_factory.mktemp("ckpt") / "tiny-llama")


# ---------------------------------------------------------------- the errors a user causes, per script


def test_bad_arguments_exit_2_with_argparse_usage(tmp_path):
    result = run_script("sampling_gap", "--n", "0", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "usage: sampling_gap.py" in result.stderr and "error: argument --n: 0 out of range" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_source_is_a_message(tmp_path):
    argv = ["--tasks", "arc_easy", "--source", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "runs")]
    refused(run_script("census", *argv, cwd=tmp_path), "census", "cannot load arc_easy from", "missing.jsonl",
            "does not exist")
    assert not (tmp_path / "runs").exists()


def test_unsupported_architecture_is_refused_before_any_weight(tmp_path):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    result = run_script("mlp_localize", "--model", str(bert), "--source", str(arc_file(tmp_path / "q.jsonl")),
                        "--n", "4", "--out", str(tmp_path / "runs"), "--threads", "1", cwd=tmp_path)
    refused(result, "mlp_localize", "unsupported architecture ['BertForMaskedLM']", "LlamaForCausalLM")


def test_quiet_run_then_another_protocol_in_the_same_directory(tmp_path, checkpoint):
    """A --quiet run prints its table and nothing else; a rerun under another --fmt is refused, naming the field."""
    argv = ["--model", str(checkpoint), "--tasks", "arc_easy", "--source", str(arc_file(tmp_path / "q.jsonl")),
            "--n", "2", "--K", "2", "--T", "0.8", "--temperatures", "0.8", "--out", str(tmp_path / "runs"),
            "--figures", str(tmp_path / "figures"), "--threads", "1"]
    first = run_script("sampling_gap", *argv, "--fmt", "shared", "--quiet", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("Table 2: n=2 per cell, K=2")  # the results only: no library's prints
    assert "| model | task | deployed D |" in first.stdout and "| tiny-llama | arc_easy |" in first.stdout
    assert not [line for line in first.stderr.splitlines() if line.startswith("[")], first.stderr  # no messages
    assert "%|" not in first.stderr, first.stderr  # no progress bars (ours, the loaders')
    again = run_script("sampling_gap", *argv, "--fmt", "native", cwd=tmp_path)
    refused(again, "sampling_gap", "holds a run under a different protocol", 'fmt: stored "shared", given "native"')


def test_a_run_directory_of_another_schema_is_refused(tmp_path, checkpoint):
    run = tmp_path / "runs" / "tiny-llama-arc_easy-n2-K2-s0" / "deployed"
    run.mkdir(parents=True)
    (run / "protocol.json").write_text(json.dumps({"study": "sampling_gap", "n": 2}))
    result = run_script("sampling_gap", "--model", str(checkpoint), "--tasks", "arc_easy", "--source",
                        str(arc_file(tmp_path / "q.jsonl")), "--n", "2", "--K", "2", "--fmt", "shared",
                        "--out", str(tmp_path / "runs"), "--figures", str(tmp_path / "figures"), "--threads", "1",
                        cwd=tmp_path)
    refused(result, "sampling_gap", "has schema None; this reach_lens reads")


def test_too_small_panel_ends_the_main_job_with_a_message(tmp_path, checkpoint):
    result = run_script("mlp_localize", "--model", str(checkpoint), "--source", str(arc_file(tmp_path / "q.jsonl")),
                        "--n", "4", "--fmt", "shared", "--out", str(tmp_path / "runs"), "--figures",
                        str(tmp_path / "figures"), "--threads", "1", cwd=tmp_path)
    refused(result, "mlp_localize", "panels too small for the study", "need >= 5 each")
    assert "[mlp_localize] " in result.stderr  # the study's messages: on stderr, by its logger


def test_a_bad_row_of_a_users_file_is_refused_naming_file_row_and_field_before_anything_runs(tmp_path, capsys):
    rows = [{"question": "Which one is number 1?", "answer": "ice"}, {"question": "Which one is number 2?", "answer": ""}]
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_script("sampling_gap", "--tasks", f"jsonl:{data}", "--n", "2", "--out", str(tmp_path / "runs"),
                        "--figures", str(tmp_path / "figures"), cwd=tmp_path)
    refused(result, "sampling_gap", "mine.jsonl line 2: field 'answer': missing or empty answer")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "figures").exists()
    script = load_script("sampling_gap")
    with pytest.raises(UserError, match="--fields is for a task read from a file"):
        script.main(["--tasks", "squad", "--fields", "question=q", "--out", str(tmp_path / "runs")])
    with pytest.raises(SystemExit) as stop:
        script.main(["--tasks", "arc"])
    assert stop.value.code == 2 and "unknown task 'arc': expected a registered name, jsonl:PATH" in \
        capsys.readouterr().err


def test_compare_audits_any_checkpoint_pair_on_a_users_file(tmp_path, checkpoint):
    """experiments/compare.py: a base against a copy of itself (a checkpoint reach_lens did not train) on a JSONL
    file: every question is audited (no training split), no control format, top-p and the budget in the protocol,
    the per-question table beside the others, and the copy changes nothing."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in checkpoint.iterdir():
        (copy / f.name).symlink_to(f)
    data = arc_file(tmp_path / "mine.jsonl", n=6)
    result = run_script("compare", str(checkpoint), str(copy), "--task", f"jsonl:{data}", "--K", "2",
                        "--top-p", "0.9", "--max-new-tokens", "3", "--fmt", "shared", "--threads", "1", "--out",
                        str(tmp_path / "runs"), "--figures", str(tmp_path / "figures"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "auditing every question (6): no checkpoint carries reach_lens training metadata" in result.stderr
    summary = next((tmp_path / "runs").glob("mine-n6-K2-T0.8-s0/summary-*"))
    assert not (summary / "table8_format_transfer.csv").exists() and "Table 8" not in result.stdout
    questions = pd.read_csv(summary / "questions.csv")
    assert list(questions.pair) == ["copy"] * 6 and sorted(questions.question_id) == [f"q{i}" for i in range(6)]
    assert (questions.d_base == questions.d_trained).all() and (questions.hits_base == questions.hits_trained).all()
    assert (questions.samples == 4).all() and set(questions.realization) <= {"stable_realized", "stable_unrealized"}
    protocols = json.loads((summary / "protocols.json").read_text())
    sampled = [p for p in protocols if p["probe"] == "sample"]
    assert {p["top_p"] for p in sampled} == {0.9} and {p["max_new_tokens"] for p in protocols} == {3}
    assert {p["task_spec"]["file"] for p in protocols} == {"mine.jsonl"} and {p["model"] for p in protocols} == {
        "tiny-llama", "copy"}
    assert {p["settings"]["split"] for p in protocols} == {None}


def test_an_lm_eval_task_runs_through_a_study_with_its_options(tmp_path, checkpoint):
    """--tasks lm-eval:YAML (a multiple-choice task over a local file) with --lm-eval-metric: the study runs and its
    protocols pin the task's spec; an option of the other scheme is refused."""
    pytest.importorskip("lm_eval")
    data = arc_file(tmp_path / "q.jsonl", n=4)
    yaml = tmp_path / "tasks" / "tiny_arc.yaml"
    yaml.parent.mkdir()
    yaml.write_text(f"""task: tiny_arc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices.text}}}}"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
""")
    argv = ["--model", str(checkpoint), "--tasks", f"lm-eval:{yaml}", "--lm-eval-metric", "acc_norm", "--n", "4",
            "--K", "2", "--temperatures", "0.8", "--fmt", "shared", "--out", str(tmp_path / "runs"), "--figures",
            str(tmp_path / "figures"), "--threads", "1"]
    result = run_script("sampling_gap", *argv, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "| tiny-llama | lm-eval-tiny_arc |" in result.stdout, result.stdout
    protocols = json.loads(next((tmp_path / "runs").glob("summary-table2-*/protocols.json")).read_text())
    assert {p["task_spec"]["metric"] for p in protocols} == {"acc_norm"} and {p["task"] for p in protocols} == {"lm-eval-tiny_arc"}
    with pytest.raises(UserError, match="--grader is for a task read from a file"):
        load_script("sampling_gap").main([*argv, "--grader", "mc_letter"])


# ---------------------------------------------------------------- cli.run itself


USER_ERRORS = [ProtocolMismatch, UnreadableRunDirectory, EngineCapabilityError, PanelTooSmall,
               UnsupportedArchitecture, ModelNotFound, UnreadableModel, UserError]


@pytest.mark.parametrize("error", USER_ERRORS, ids=lambda e: e.__name__)
def test_run_turns_each_user_error_into_a_message_and_status_1(error, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["study.py"])

    def main(argv):
        raise error("what went wrong\n  and where")

    with pytest.raises(SystemExit) as stop:
        cli.run(main, [])
    assert stop.value.code == 1
    assert capsys.readouterr().err == "study.py: error: what went wrong\n  and where\n"
    with pytest.raises(error, match="what went wrong"):  # --debug: the exception itself, with its traceback
        cli.run(main, ["--debug"])


def test_user_errors_keep_their_builtin_types():
    assert all(issubclass(e, UserError) for e in USER_ERRORS)
    assert all(issubclass(e, ValueError) for e in USER_ERRORS if e not in (ModelNotFound, UserError))
    assert issubclass(ModelNotFound, FileNotFoundError)


def test_run_keeps_a_bug_s_traceback_and_passes_statuses_through(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["study.py"])

    def bug(argv):
        raise ValueError("an index went wrong")  # not a UserError: a bug, never turned into a message

    with pytest.raises(ValueError, match="an index went wrong"):
        cli.run(bug, [])
    for main, status, err in [(lambda argv: 0, 0, ""), (lambda argv: 3, 3, ""),
                              (lambda argv: sys.exit(2), 2, "")]:
        with pytest.raises(SystemExit) as stop:
            cli.run(main, [])
        assert stop.value.code == status
        assert capsys.readouterr().err == err

    def interrupted(argv):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stop:
        cli.run(interrupted, [])
    assert stop.value.code == 130 and capsys.readouterr().err == "study.py: interrupted\n"


def test_malformed_source_is_a_message_naming_its_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "load", lambda *a, **k: pytest.fail("the model loaded before the questions were read"))
    monkeypatch.setattr(sys, "argv", ["selection.py"])
    source = arc_file(tmp_path / "q.jsonl", broken_line=3)
    with pytest.raises(SystemExit) as stop:
        cli.run(load_script("selection").main, ["--tasks", "arc_easy", "--source", str(source), "--out",
                                                str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert stop.value.code == 1 and err.startswith("selection.py: error: cannot load arc_easy from ")
    assert "q.jsonl line 3: invalid JSON" in err and "Traceback" not in err
    with pytest.raises(UserError) as debug:  # --debug: the error and its cause, for their tracebacks
        cli.run(load_script("selection").main, ["--tasks", "arc_easy", "--source", str(source), "--debug",
                                                "--out", str(tmp_path / "runs")])
    assert isinstance(debug.value.__cause__, ValueError) and "line 3" in str(debug.value.__cause__)


# ---------------------------------------------------------------- output: logging, --quiet, --verbose


@pytest.fixture
def output():
    yield
    logs.configure_output()  # the default again: INFO, progress bars shown


@pytest.mark.parametrize("flags, shown", [({}, {"info", "warning"}), ({"quiet": True}, {"warning"}),
                                          ({"verbose": True}, {"debug", "info", "warning"})])
def test_levels_and_progress_bars(output, capsys, flags, shown):
    from tqdm import tqdm

    logs.configure_output(**flags)
    log = logs.logger("census")
    logs.say("census")("info")
    log.debug("debug")
    log.warning("warning")
    for _ in tqdm(range(3), desc="a bar"):
        pass
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("[census]")]
    expected = {"debug": "[census] debug", "info": "[census] info", "warning": "[census] warning: warning"}
    assert lines == [expected[k] for k in ("info", "debug", "warning") if k in shown]
    assert ("a bar" in captured.err) == (not flags.get("quiet")) and captured.out == ""


def test_quiet_and_verbose_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.verbosity().parse_args(["--quiet", "--verbose"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


# ---------------------------------------------------------------- every argument has help


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"cli_experiment_{name}", ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class _Built(Exception):
    pass


def script_parser(name: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser a script's ``parse_args`` builds, caught as it starts parsing."""
    built = []

    def catch(self, args=None, namespace=None):
        built.append(self)
        raise _Built

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", catch)
    with pytest.raises(_Built):
        load_script(name).parse_args([])
    return built[0]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_argument_has_help_and_the_output_flags(name, monkeypatch):
    parser = script_parser(name, monkeypatch)
    options = {option for action in parser._actions for option in action.option_strings}
    assert {"--quiet", "--verbose", "--debug", "--help"} <= options
    missing = [action.option_strings or action.dest for action in parser._actions
               if not (action.help and action.help.strip()) or action.help == argparse.SUPPRESS]
    assert not missing, f"{name}: arguments without help: {missing}"


def test_dtype_auto_is_float32_for_the_transformer_lens_engine_on_the_cpu_and_bfloat16_elsewhere():
    assert cli.resolve_dtype("auto", "cpu") == torch.float32
    assert cli.resolve_dtype("auto", "cpu", "vllm") == torch.bfloat16
    assert cli.resolve_dtype("auto", "cuda:0") == cli.resolve_dtype("auto", "cuda", "vllm") == torch.bfloat16
    assert cli.resolve_dtype("float32", "cpu", "vllm") == torch.float32


def test_skip_takes_the_next_questions_of_the_hash_order_and_names_its_runs():
    from reach_lens.tasks import get_task, subsample

    task = get_task("arc_easy")
    first = cli.questions(task, None, None, 20, 0)
    following = cli.questions(task, None, None, 20, 0, skip=20)
    assert not {q.id for q in first} & {q.id for q in following}  # disjoint from the run of --n 20
    assert [q.id for q in first + following] == [q.id for q in subsample(task.load(), 40, 0)]
    total = len(task.load())
    assert len(cli.questions(task, None, None, None, 0, skip=total - 3)) == 3  # --n all after --skip
    with pytest.raises(UserError, match=rf"--n 5 after --skip {total - 3} out of range"):
        cli.questions(task, None, None, 5, 0, skip=total - 3)
    with pytest.raises(UserError, match="leaves no question"):
        cli.questions(task, None, None, None, 0, skip=total)
    parser = argparse.ArgumentParser(parents=[cli.data(n=30, chunk=15, tasks=["squad"])])
    assert cli.skip_tag(parser.parse_args([])) == "" and cli.skip_tag(parser.parse_args(["--skip", "100"])) == "-skip100"
    with pytest.raises(SystemExit):
        parser.parse_args(["--skip", "-1"])
