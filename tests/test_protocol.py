"""Protocol: round trips, every field's change detected and named, the question-set hash, validation, of()."""
import dataclasses
import hashlib
import importlib.metadata
import json
import math
import subprocess
from pathlib import Path

import pytest
from conftest import make_tiny_model

from reach_lens.interventions import Silence, Steer
from reach_lens.models import model_fingerprint
from reach_lens.protocol import PROBES, Protocol, canonical_json, code_commit, question_set_hash
from reach_lens.version import reach_lens_version
from reach_lens.tasks import Question
from reach_lens.generate import engine_for

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = [Question("q1", "2+2?", "4"), Question("q2", "3+3?", "6"), Question("q3", "1+1?", "2")]


def base(**changes) -> Protocol:
    fields = {
        "study": "sampling_gap", "model": "tiny", "weights": "0123456789abcdef", "task": "arith",
        "source": "data/arith.jsonl", "split": "test", "questions": question_set_hash(QUESTIONS), "n": 3, "seed": 0,
        "fmt": "native", "grader": "numeric/1", "probe": "sample", "K": 8, "temperature": 0.8, "max_new_tokens": 16,
        "stop_strings": ("\n\n",), "engine": "transformer_lens", "device": "cpu", "dtype": "float32",
        "interventions": (Silence(2, "hook_mlp_out").to_dict(),), "settings": {"alphas": [2, 4]}, "version": "0.1.0",
        "commit": "c0ffee"}
    return Protocol(**{**fields, **changes})


# one changed value per field; commit is reported, never matched
CHANGES = {
    "study": "selection", "model": "tiny-rl", "weights": "fedcba9876543210", "task": "gsm8k", "source": None,
    "split": "validation", "questions": question_set_hash(QUESTIONS[:2]), "n": 2, "seed": 1, "fmt": "shared",
    "grader": "numeric/2", "probe": "route", "K": 16, "temperature": 1.2, "max_new_tokens": 32,
    "stop_strings": ("\n\n", "Question:"), "prompt": "gsm8k:fewshot/1:STD:GSM8k:sha256=0123456789abcdef",
    "top_p": 0.95, "task_spec": {"file": "arith.jsonl", "sha256": "ab" * 32, "fields": {"question": "q", "answer": "a"}},
    "engine": "vllm", "device": "cuda", "dtype": "bfloat16",
    "interventions": (), "settings": {"alphas": [2, 4, 8]}, "version": "0.2.0",
    "libraries": {"torch": "2.14.1", "transformers": "5.24.0", "transformer-lens": "3.9.0"},
}


class StandInTask:
    """What Protocol.of reads from a task."""

    name = "arith"
    grader = "numeric/1"

    def max_new_tokens(self, fmt: str) -> int:
        return {"native": 12, "shared": 24}[fmt]

    def stop_strings(self, fmt: str) -> tuple[str, ...]:
        return ("\n",) if fmt == "shared" else ()


def test_round_trip_through_json():
    p = base()
    d = json.loads(json.dumps(p.to_dict()))
    back = Protocol.from_dict(d)
    assert back == p and hash(back) == hash(p) and back.fingerprint() == p.fingerprint()
    assert back.to_dict() == p.to_dict() and isinstance(back.stop_strings, tuple)
    assert d["interventions"] == [Silence(2, "hook_mlp_out").to_dict()] and d["commit"] == "c0ffee"


def test_lists_tuples_objects_and_key_order_normalise_to_one_value():
    a = base()
    b = base(stop_strings=["\n\n"], interventions=[Silence(2, "hook_mlp_out")], settings={"alphas": (2, 4)})
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    c = base(settings={"y": 1, "x": 2})
    assert list(c.settings) == ["x", "y"] and c == base(settings={"x": 2, "y": 1})
    assert base(source=Path("data/arith.jsonl")) == a


def test_changes_cover_every_matched_field():
    names = {f.name for f in dataclasses.fields(Protocol)}
    assert set(CHANGES) == names - {"commit"}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_every_field_change_is_detected_and_named(name):
    p, q = base(), base(**{name: CHANGES[name]})
    diff = p.diff(q)
    assert [d[0] for d in diff] == [name]
    assert diff[0][1] == p.to_dict()[name] and diff[0][2] == q.to_dict()[name]
    assert not p.matches(q) and p.fingerprint() != q.fingerprint() and p != q
    assert p.matches(q, ignore=(name,))


def test_a_field_added_later_keeps_the_fingerprints_of_runs_stored_before_it():
    """A stored run's protocol.json lacks task_spec; read back it holds the empty default and its fingerprint (the
    run directory's and its summary's name) is the one computed before the field existed."""
    p = base()
    before = {k: v for k, v in p.to_dict().items() if k not in ("commit", "task_spec", "top_p")}
    stored = hashlib.sha256(canonical_json(before).encode()).hexdigest()
    assert p.task_spec == {} and p.top_p == 1.0 and p.fingerprint() == stored
    old = {k: v for k, v in p.to_dict().items() if k not in ("task_spec", "top_p")}
    assert Protocol.from_dict(old).fingerprint() == stored and Protocol.from_dict(old).matches(p)
    assert base(task_spec={"sha256": "0" * 64}).fingerprint() != stored != base(top_p=0.9).fingerprint()


def test_commit_is_reported_not_matched():
    p, q = base(), base(commit="deadbeef")
    assert p.diff(q) == [] and p.matches(q) and p.fingerprint() == q.fingerprint()
    assert p != q  # equality is of the whole value; matching is what compares runs
    assert base(commit=None).matches(p)


def test_diff_names_several_fields_in_order_and_distinguishes_json_types():
    p, q = base(), base(K=4, temperature=0.4, grader="numeric/2")
    assert p.diff(q) == [("grader", "numeric/1", "numeric/2"), ("K", 8, 4), ("temperature", 0.8, 0.4)]
    assert [n for n, *_ in base().diff(base(settings={"alphas": [2.0, 4]}))] == ["settings"]  # 2 vs 2.0


def test_ignore_model_and_weights_compares_checkpoints():
    base_ckpt = base()
    trained = base(model="tiny-rl", weights="fedcba9876543210", commit="other")
    assert not base_ckpt.matches(trained)
    assert base_ckpt.matches(trained, ignore=("model", "weights"))
    assert base_ckpt.diff(base(model="x", weights="y", K=4), ignore=("model", "weights")) == [("K", 8, 4)]
    with pytest.raises(ValueError, match=r"unknown fields \['weight'\]"):
        base_ckpt.matches(trained, ignore=("weight",))
    with pytest.raises(TypeError, match="sequence of field names"):
        base_ckpt.diff(trained, ignore="model")
    with pytest.raises(TypeError, match="Protocol"):
        base_ckpt.diff(trained.to_dict())


def test_question_set_hash_is_content_and_order():
    h = question_set_hash(QUESTIONS)
    assert len(h) == 64 and h == question_set_hash(list(QUESTIONS))
    one_gold = [QUESTIONS[0], dataclasses.replace(QUESTIONS[1], gold="7"), QUESTIONS[2]]
    assert question_set_hash(one_gold) != h
    assert question_set_hash(QUESTIONS[::-1]) != h
    assert question_set_hash([dataclasses.replace(QUESTIONS[0], id="q9"), *QUESTIONS[1:]]) != h
    # the question text is not part of it (ids and gold answers are)
    assert question_set_hash([dataclasses.replace(QUESTIONS[0], question="2 + 2 ?"), *QUESTIONS[1:]]) == h
    # no concatenation ambiguity between fields
    assert question_set_hash([Question("a", "", "bc")]) != question_set_hash([Question("ab", "", "c")])


@pytest.mark.parametrize("changes, error, message", [
    ({"probe": "greedy"}, ValueError, r"probe 'greedy' is not one of \['deploy', 'sample', 'route', 'recognize', 'screen'\]"),
    ({"n": -1}, ValueError, r"n -1 out of range: expected >= 0"),
    ({"n": 2.0}, TypeError, r"n 2.0 must be an int"),
    ({"seed": True}, TypeError, r"seed True must be an int"),
    ({"K": 0}, ValueError, r"K 0 out of range: expected >= 1"),
    ({"K": None}, ValueError, r"probe 'sample' draws K candidates: K must be an int >= 1, got None"),
    ({"temperature": -0.5}, ValueError, r"temperature -0.5 out of range"),
    ({"temperature": math.nan}, ValueError, r"temperature nan out of range"),
    ({"temperature": math.inf}, ValueError, r"temperature inf out of range"),
    ({"temperature": "0.8"}, TypeError, r"temperature '0.8' must be a number"),
    ({"temperature": 0.0}, ValueError, r"probe 'sample' at temperature 0"),
    ({"probe": "deploy", "K": None, "temperature": 0.8}, ValueError,
     r"probe 'deploy' is greedy: temperature must be 0 and top_p 1, got 0.8 and 1.0"),
    ({"probe": "deploy", "K": None, "temperature": 0.0, "top_p": 0.9}, ValueError,
     r"probe 'deploy' is greedy: temperature must be 0 and top_p 1, got 0.0 and 0.9"),
    ({"top_p": 0.0}, ValueError, r"top_p 0.0 out of range: expected a number with 0 < top_p <= 1"),
    ({"top_p": 1.5}, ValueError, r"top_p 1.5 out of range"),
    ({"task_spec": ["file"]}, TypeError, r"task_spec \['file'\] .*must be a dict"),
    ({"probe": "deploy", "temperature": 0.0}, ValueError,
     r"probe 'deploy' gives one answer per question: K must be None, got 8"),
    ({"max_new_tokens": 0}, ValueError, r"max_new_tokens 0 out of range: expected >= 1"),
    ({"settings": {"alpha": math.nan}}, ValueError, r"settings .* is not JSON-able"),
    ({"settings": {"v": object()}}, ValueError, r"settings .* is not JSON-able"),
    ({"settings": {1: "x"}}, TypeError, r"settings keys \[1\] must be str"),
    ({"settings": [("a", 1)]}, TypeError, r"settings .* must be a dict"),
    ({"stop_strings": "\n"}, TypeError, r"stop_strings '\\n' must be a sequence of str"),
    ({"interventions": ("silence",)}, TypeError, r"interventions\[0\] 'silence' must be a dict"),
    ({"interventions": ({"kind": "steer", "v": [math.inf]},)}, ValueError, r"interventions\[0\] .* is not JSON-able"),
    ({"questions": "abc"}, ValueError, r"questions 'abc' must be a question-set hash"),
    ({"grader": "numeric"}, ValueError, r"grader 'numeric' must be 'name/version'"),
    ({"model": ""}, ValueError, r"model is empty: expected a non-empty str"),
    ({"split": 3}, TypeError, r"split 3 must be a non-empty str or None"),
])
def test_bad_values_are_refused_naming_them(changes, error, message):
    with pytest.raises(error, match=message):
        base(**changes)


def test_every_probe_has_a_valid_protocol():
    for probe in PROBES:
        sampled = probe in ("sample", "route")
        p = base(probe=probe, K=8 if sampled else None, temperature=0.8 if probe == "sample" else 0.0)
        assert p.probe == probe


def test_from_dict_refuses_unknown_and_missing_fields():
    d = base().to_dict()
    with pytest.raises(ValueError, match=r"unknown protocol fields \['T', 'checkpoint'\]"):
        Protocol.from_dict({**d, "T": 0.8, "checkpoint": "x"})
    for name in ("grader", "questions", "version", "commit"):
        partial = {k: v for k, v in d.items() if k != name}
        with pytest.raises(ValueError, match=rf"protocol lacks fields \['{name}'\]"):
            Protocol.from_dict(partial)
    defaults = {k: v for k, v in d.items() if k not in ("engine", "device", "dtype", "interventions", "settings")}
    assert Protocol.from_dict(defaults).settings == {} and Protocol.from_dict(defaults).engine == "transformer_lens"
    with pytest.raises(TypeError, match="takes a dict"):
        Protocol.from_dict([("study", "x")])


def test_of_fills_model_task_and_question_fields():
    model = make_tiny_model(n_layers=2)
    p = Protocol.of(study="sampling_gap", facts=engine_for(model).describe(), task=StandInTask(), questions=QUESTIONS,
                    fmt="shared", probe="sample", K=4, temperature=0.7, seed=3, source=Path("x/y.jsonl"),
                    interventions=[Steer(1, tuple([0.5] * 32), -2.0)], settings={"chunk": 10})
    assert (p.model, p.weights, p.task, p.grader) == ("custom", model_fingerprint(model), "arith", "numeric/1")
    assert (p.questions, p.n, p.seed, p.source, p.split) == (question_set_hash(QUESTIONS), 3, 3, "x/y.jsonl", None)
    assert (p.max_new_tokens, p.stop_strings, p.K, p.temperature) == (24, ("\n",), 4, 0.7)
    assert (p.engine, p.device, p.dtype) == ("transformer_lens", "cpu", "float32")
    assert p.interventions == (Steer(1, tuple([0.5] * 32), -2.0).to_dict(),) and p.settings == {"chunk": 10}
    assert p.version == reach_lens_version() == importlib.metadata.version("reach_lens")
    recognize = Protocol.of(study="census", facts=engine_for(model).describe(), task=StandInTask(), questions=QUESTIONS,
                            fmt="native", probe="recognize")
    assert recognize.max_new_tokens is None and recognize.stop_strings == () and recognize.K is None
    assert not recognize.matches(p.replace(probe="recognize", K=None, temperature=0.0))  # other fmt, settings, ...


def test_commit_is_this_checkout_head():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert code_commit() in (head, f"{head}+dirty")
    assert base(commit=code_commit()).commit == code_commit()
    fields = {k: v for k, v in base().to_dict().items() if k != "commit"}
    assert Protocol(**{**fields, "stop_strings": tuple(fields["stop_strings"]),
                       "interventions": tuple(fields["interventions"])}).commit == code_commit()


def test_protocols_record_library_versions_and_refuse_rows_of_other_ones(tmp_path):
    from importlib import metadata

    from reach_lens.store import ProtocolMismatch, RunStore

    p = base()
    assert p.libraries == {name: metadata.version(name) for name in ("torch", "transformers", "transformer-lens")}
    store = RunStore(tmp_path / "run", p)
    store.append("records", [{"question_id": "q1", "x": 1}])
    upgraded = p.replace(libraries={**p.libraries, "torch": "9.9.9"})
    assert upgraded.diff(p) == [("libraries", upgraded.libraries, p.libraries)]
    with pytest.raises(ProtocolMismatch, match=r'libraries\.torch: stored "\d[^"]*", given "9\.9\.9"'):
        RunStore(tmp_path / "run", upgraded)
    # a run stored before versions were recorded reads as {}, which no new run matches: flagged, not mixed
    old = {k: v for k, v in p.to_dict().items() if k != "libraries"}
    assert Protocol.from_dict(old).libraries == {} and not Protocol.from_dict(old).matches(p)
    with pytest.raises(TypeError, match="must map library names to version strings"):
        base(libraries={"torch": 2.13})


def test_optional_libraries_enter_a_protocol_when_the_run_uses_them():
    from reach_lens.protocol import _extra_libraries

    assert _extra_libraries({"weights": "0123456789abcdef"}) == []
    assert _extra_libraries({"weights": "0123456789abcdef+sae0123456789ab"}) == ["sae-lens"]
    assert _extra_libraries({"weights": "x", "engine": "vllm (per-request seeds)"}) == ["vllm"]
