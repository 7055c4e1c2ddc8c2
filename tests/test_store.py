import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from reach_lens.audit import make_record
from reach_lens.store import ProtocolMismatch, RunStore, fingerprint

REPO = Path(__file__).resolve().parents[1]
PROTOCOL = {"model": "tiny", "task": "arith", "split": "test", "n": 12, "seed": 0, "T": 0.8, "K": 3,
            "probe": {"kind": "sample", "max_new_tokens": 8}, "interventions": []}

# A resumable run: computes one record per question, logs each computation, appends one question at a time.
WORKER = '''
import os, sys, time
from reach_lens.audit import make_record
from reach_lens.store import RunStore

def record(i):
    gold = str(i % 5)
    answers = [gold, None, str((i + 1) % 5)]
    cands = [{"text": f"t{i}-{k}", "answer": a, "correct": a == gold, "mean_logprob": -0.1 * (k + 1),
              "length": 3 + k, "hidden": [float(i), float(k), 0.5]} for k, a in enumerate(answers)]
    ans = gold if i % 3 else None
    return make_record(f"q{i:03d}", gold, {"text": f"d{i}", "answer": ans, "correct": ans == gold}, cands)

def main(root, calls_path, sleep, protocol):
    store = RunStore(root, protocol)
    done = store.done("records")
    for i in range(protocol["n"]):
        qid = f"q{i:03d}"
        if qid in done:
            continue
        with open(calls_path, "a") as f:
            f.write(qid + "\\n")
            f.flush()
            os.fsync(f.fileno())
        rec = record(i)
        time.sleep(sleep)
        store.append("records", [rec])

if __name__ == "__main__":
    import json
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), json.loads(sys.argv[4]))
'''


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    spec = importlib.util.spec_from_file_location("store_worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def _calls(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_killed_run_resumes_without_loss_duplicates_or_recomputation(tmp_path, worker):
    script, module = worker
    n = PROTOCOL["n"]
    ref_root = tmp_path / "uninterrupted"
    module.main(ref_root, tmp_path / "ref_calls.txt", 0.0, PROTOCOL)
    reference = RunStore(ref_root, PROTOCOL).read("records")
    assert len(reference) == n

    root, calls1, calls2 = tmp_path / "run", tmp_path / "calls1.txt", tmp_path / "calls2.txt"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(calls1), "0.3", json.dumps(PROTOCOL)],
                            env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (root / "protocol.json").exists() and len(RunStore(root, PROTOCOL).done("records")) >= 3:
                break
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "worker finished or failed before it could be killed"
    done_at_kill = RunStore(root, PROTOCOL).done("records")
    assert 3 <= len(done_at_kill) < n
    assert done_at_kill <= set(_calls(calls1))

    module.main(root, calls2, 0.0, PROTOCOL)  # resume with a new RunStore over the same directory
    recomputed = _calls(calls2)
    assert len(recomputed) == len(set(recomputed))
    assert set(recomputed).isdisjoint(done_at_kill)
    assert set(recomputed) | done_at_kill == {f"q{i:03d}" for i in range(n)}

    store = RunStore(root, PROTOCOL)
    resumed = store.read("records")
    assert len(store.read("records", key=None)) == n  # no duplicate rows even before de-duplication
    assert resumed.to_dict("records") == reference.to_dict("records")
    assert resumed["deployed_answer"].tolist()[:3] == [None, "1", "2"]
    assert resumed["candidates"][0][1]["answer"] is None


def test_round_trip_keeps_none_nested_fields_and_dtypes(tmp_path, worker):
    _, module = worker
    rows = [module.record(i) for i in range(4)]
    store = RunStore(tmp_path, PROTOCOL)
    store.append("records", rows[:3])
    store.append("records", pd.DataFrame(rows[3:]))  # a DataFrame works as well as a list of dicts
    back = store.read("records")
    assert back.to_dict("records") == rows
    assert back["d"].dtype == bool and back["K"].dtype == "int64"
    assert back["vote_answer"].dtype == object
    assert store.done("records") == {"q000", "q001", "q002", "q003"}
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == ["part-000000.parquet", "part-000001.parquet"]


def test_optional_candidate_keys_missing_on_some_rows_read_back_as_none(tmp_path):
    base = {"text": "x", "answer": "1", "correct": True, "mean_logprob": -0.5, "length": 2}
    rows = [make_record("a", "1", {"text": "1", "answer": "1", "correct": True}, [{**base, "entropy": 0.7}]),
            make_record("b", "1", {"text": "1", "answer": "1", "correct": True}, [base])]
    store = RunStore(tmp_path, PROTOCOL)
    store.append("records", rows)
    back = store.read("records")
    assert back["candidates"][0][0]["entropy"] == 0.7 and back["candidates"][1][0]["entropy"] is None


def test_read_dedups_on_key_keeping_first_and_ignores_stray_files(tmp_path):
    store = RunStore(tmp_path, PROTOCOL)
    assert store.read("records").empty and store.done("records") == set()
    store.append("records", [{"question_id": "a", "v": 1}, {"question_id": "b", "v": 2}])
    store.append("records", [{"question_id": "b", "v": 99}, {"question_id": "c", "v": 3}])  # b written twice
    (tmp_path / "records" / ".part-000002.parquet.4242.tmp").write_bytes(b"half a parquet file")
    (tmp_path / "records" / "notes.txt").write_text("not a part")
    back = store.read("records")
    assert back["question_id"].tolist() == ["a", "b", "c"] and back["v"].tolist() == [1, 2, 3]
    assert len(store.read("records", key=None)) == 4
    assert store.append("records", []) is None
    # the stray temp file does not take a part number
    assert store.append("records", [{"question_id": "d", "v": 4}]).name == "part-000002.parquet"


def test_append_rejects_ragged_rows_and_bad_table_names(tmp_path):
    store = RunStore(tmp_path, PROTOCOL)
    with pytest.raises(ValueError, match=r"row 1 has keys \['question_id', 'vv'\]"):
        store.append("records", [{"question_id": "a", "v": 1}, {"question_id": "b", "vv": 2}])
    with pytest.raises(ValueError, match="table name '../x'"):
        store.append("../x", [{"question_id": "a"}])
    store.append("t", [{"question_id": "a"}])
    with pytest.raises(ValueError, match="no column 'qid'"):
        store.read("t", key="qid")
    with pytest.raises(ValueError, match="no column 'qid'"):
        store.done("t", key="qid")


def test_protocol_file_and_fingerprint(tmp_path):
    RunStore(tmp_path, PROTOCOL)
    stored = json.loads((tmp_path / "protocol.json").read_text())
    assert stored["protocol"] == PROTOCOL and stored["fingerprint"] == fingerprint(PROTOCOL)
    reordered = dict(reversed(list(PROTOCOL.items())))
    RunStore(tmp_path, {**reordered, "interventions": ()})  # key order and tuple/list do not matter
    assert fingerprint({**PROTOCOL, "T": 1}) != fingerprint({**PROTOCOL, "T": 1.0})
    with pytest.raises(ValueError, match="not plain JSON"):
        RunStore(tmp_path / "other", {**PROTOCOL, "T": float("nan")})


def test_protocol_mismatch_names_every_differing_field(tmp_path):
    RunStore(tmp_path, PROTOCOL)
    changed = {**PROTOCOL, "K": 16, "probe": {"kind": "sample", "max_new_tokens": 32}, "extra": "x"}
    del changed["seed"]
    with pytest.raises(ProtocolMismatch) as e:
        RunStore(tmp_path, changed)
    msg = str(e.value)
    assert str(tmp_path) in msg
    assert "K: stored 3, given 16" in msg
    assert "probe.max_new_tokens: stored 8, given 32" in msg
    assert "seed: stored 0, given <absent>" in msg
    assert 'extra: stored <absent>, given "x"' in msg
    assert "Pick another directory" in msg
    assert "model" not in msg and "probe.kind" not in msg  # only differing fields are listed
    with pytest.raises(ProtocolMismatch, match=r"T: stored 0.8, given 1\b"):
        RunStore(tmp_path, {**PROTOCOL, "T": 1})


def test_edited_protocol_file_is_detected(tmp_path):
    RunStore(tmp_path, PROTOCOL)
    path = tmp_path / "protocol.json"
    stored = json.loads(path.read_text())
    stored["protocol"]["K"] = 99
    path.write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="was the file edited"):
        RunStore(tmp_path, PROTOCOL)
