import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest

from reach_lens.interventions import Silence
from reach_lens.protocol import Protocol, question_set_hash
from reach_lens.records import make_record
from reach_lens.store import ProtocolMismatch, RunDirectoryBusy, RunStore, UnreadableRunDirectory
from reach_lens.tasks import Question

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = [Question(f"q{i:03d}", "", str(i % 5)) for i in range(12)]
PROTOCOL = Protocol(study="store_test", model="tiny", weights="0123456789abcdef", task="arith", source=None,
                    split="test", questions=question_set_hash(QUESTIONS), n=12, seed=0, fmt="shared",
                    grader="numeric/1", probe="sample", K=3, temperature=0.8, max_new_tokens=8, stop_strings=(),
                    settings={"alphas": [2, 4]}, version="0.1.0", commit="c0ffee")

# A resumable run: computes one record per question, logs each computation, appends one question at a time.
WORKER = '''
import os, sys, time
from reach_lens.protocol import Protocol
from reach_lens.records import make_record
from reach_lens.select import majority_vote
from reach_lens.store import RunStore

def record(i):
    gold = str(i % 5)
    answers = [gold, None, str((i + 1) % 5)]
    cands = [{"text": f"t{i}-{k}", "answer": a, "correct": a == gold, "mean_logprob": -0.1 * (k + 1),
              "length": 3 + k, "hidden": [float(i), float(k), 0.5]} for k, a in enumerate(answers)]
    ans = gold if i % 3 else None
    return make_record(f"q{i:03d}", gold, {"text": f"d{i}", "answer": ans, "correct": ans == gold}, cands,
                       majority_vote(cands))

def main(root, calls_path, sleep, protocol):
    store = RunStore(root, protocol)
    done = store.done("records")
    for i in range(protocol.n):
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
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), Protocol.from_dict(json.loads(sys.argv[4])))
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
    n = PROTOCOL.n
    ref_root = tmp_path / "uninterrupted"
    module.main(ref_root, tmp_path / "ref_calls.txt", 0.0, PROTOCOL)
    reference = RunStore(ref_root, PROTOCOL).read("records")
    assert len(reference) == n

    root, calls1, calls2 = tmp_path / "run", tmp_path / "calls1.txt", tmp_path / "calls2.txt"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(calls1), "0.3", json.dumps(PROTOCOL.to_dict())],
                            env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (root / "protocol.json").exists() and len(RunStore.reader(root, PROTOCOL).done("records")) >= 3:
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
    rows = [make_record("a", "1", {"text": "1", "answer": "1", "correct": True}, [{**base, "entropy": 0.7}], 0),
            make_record("b", "1", {"text": "1", "answer": "1", "correct": True}, [base], 0)]
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
    store = RunStore(tmp_path, PROTOCOL)
    stored = json.loads((tmp_path / "protocol.json").read_text())
    assert stored == {"schema": "reach_lens.run/1", "fingerprint": PROTOCOL.fingerprint(),
                      "protocol": PROTOCOL.to_dict()}
    assert stored["protocol"]["commit"] == "c0ffee" and store.fingerprint == PROTOCOL.fingerprint()
    # lists vs tuples, key order and intervention objects vs their dicts do not matter
    RunStore(tmp_path, PROTOCOL.replace(stop_strings=[], settings={"alphas": (2, 4)}))
    with_silence = PROTOCOL.replace(interventions=[Silence(1, "hook_mlp_out")])
    RunStore(tmp_path / "other", with_silence)
    RunStore(tmp_path / "other", with_silence.replace(interventions=(Silence(1, "hook_mlp_out").to_dict(),)))


def test_only_a_protocol_is_accepted(tmp_path):
    for given in (PROTOCOL.to_dict(), json.dumps(PROTOCOL.to_dict()), None):
        with pytest.raises(TypeError, match=r"RunStore takes a reach_lens.protocol.Protocol, got \w+: build one with "
                                            r"Protocol.of"):
            RunStore(tmp_path, given)
    assert not (tmp_path / "protocol.json").exists()


def test_protocol_mismatch_names_every_differing_field(tmp_path):
    RunStore(tmp_path, PROTOCOL)
    other_questions = [*QUESTIONS[:-1], Question("q011", "", "0")]  # one gold answer changed
    changed = PROTOCOL.replace(K=16, temperature=1.0, grader="numeric/2", questions=question_set_hash(other_questions),
                               settings={"alphas": [2, 4, 8], "extra": "x"}, interventions=[Silence(3, "hook_attn_out")],
                               commit="another")
    with pytest.raises(ProtocolMismatch) as e:
        RunStore(tmp_path, changed)
    msg = str(e.value)
    assert str(tmp_path) in msg and "7 field(s) differ" in msg
    assert "K: stored 3, given 16" in msg
    assert "temperature: stored 0.8, given 1.0" in msg
    assert 'grader: stored "numeric/1", given "numeric/2"' in msg
    assert f'questions: stored "{PROTOCOL.questions}", given "{changed.questions}"' in msg
    assert "settings.alphas: stored [2,4], given [2,4,8]" in msg
    assert 'settings.extra: stored <absent>, given "x"' in msg
    assert 'interventions: stored [], given [{"kind":"silence","layer":3,"mean":null,"mode":"zero","site":"hook_attn_out"}]' in msg
    assert "Pick another directory" in msg
    assert "commit" not in msg and "model" not in msg and "n:" not in msg  # only differing matched fields
    with pytest.raises(ProtocolMismatch, match=r"settings.alphas: stored \[2,4\], given \[2.0,4\]"):
        RunStore(tmp_path, PROTOCOL.replace(settings={"alphas": [2.0, 4]}))


def test_a_different_commit_alone_is_fine_and_the_stored_one_stays(tmp_path):
    RunStore(tmp_path, PROTOCOL)
    store = RunStore(tmp_path, PROTOCOL.replace(commit="newer"))
    assert store.protocol.commit == "newer"
    assert json.loads((tmp_path / "protocol.json").read_text())["protocol"]["commit"] == "c0ffee"


def test_a_directory_of_another_schema_is_refused_with_how_to_proceed(tmp_path):
    other = {"model": "tiny", "checkpoint": "0123456789abcdef", "task": "arith", "n": 12, "seed": 0, "T": 0.8}
    (tmp_path / "protocol.json").write_text(json.dumps({"fingerprint": "0" * 64, "protocol": other}))
    with pytest.raises(UnreadableRunDirectory) as e:
        RunStore(tmp_path, PROTOCOL)
    msg = str(e.value)
    assert str(tmp_path) in msg and "schema None" in msg and "reach_lens.run/" in msg
    assert "another --out" in msg and f"mv {tmp_path} {tmp_path}.old" in msg
    assert json.loads((tmp_path / "protocol.json").read_text())["protocol"] == other  # left as it was


def test_edited_or_unreadable_protocol_file_is_detected(tmp_path):
    RunStore(tmp_path, PROTOCOL)
    path = tmp_path / "protocol.json"
    stored = json.loads(path.read_text())
    stored["protocol"]["K"] = 99
    path.write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="was the file edited"):
        RunStore(tmp_path, PROTOCOL)
    stored["protocol"]["K"], stored["protocol"]["T"] = 3, 0.8
    path.write_text(json.dumps(stored))
    with pytest.raises(ValueError, match=r"unknown protocol fields \['T'\].*was the file edited"):
        RunStore(tmp_path, PROTOCOL)
    path.write_text(json.dumps({**stored, "schema": "reach_lens.run/99"}))
    with pytest.raises(ValueError, match="schema 'reach_lens.run/99'; this reach_lens reads 'reach_lens.run/1'"):
        RunStore(tmp_path, PROTOCOL)
    path.write_text('{"schema": ')
    with pytest.raises(ValueError, match="cannot be read as JSON"):
        RunStore(tmp_path, PROTOCOL)


def test_a_corrupted_part_is_set_aside_with_a_warning_and_recomputed(tmp_path):
    store = RunStore(tmp_path, PROTOCOL)
    for i in range(3):
        store.append("records", [{"question_id": f"q{2 * i}", "v": 2 * i}, {"question_id": f"q{2 * i + 1}", "v": 1}])
    bad = tmp_path / "records" / "part-000001.parquet"
    garbage = b"PAR1 this is not a parquet file"
    bad.write_bytes(garbage)
    with pytest.warns(UserWarning, match=r"part-000001.parquet cannot be read .*moved aside to "
                                         r"part-000001.parquet.corrupt.*recomputed on resume"):
        assert store.done("records") == {"q0", "q1", "q4", "q5"}
    assert not bad.exists() and (tmp_path / "records" / "part-000001.parquet.corrupt").read_bytes() == garbage
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # set aside once: later reads are clean
        assert store.read("records")["question_id"].tolist() == ["q0", "q1", "q4", "q5"]
    # the resumed run writes the missing rows as a new part; the set-aside number is not reused
    assert store.append("records", [{"question_id": "q2", "v": 2}, {"question_id": "q3", "v": 1}]).name == \
        "part-000003.parquet"
    assert sorted(store.read("records")["question_id"]) == [f"q{i}" for i in range(6)]
    # read() sets a corrupt part aside as well, and never overwrites an earlier set-aside copy
    (tmp_path / "records" / "part-000001.parquet").write_bytes(b"garbage again")
    with pytest.warns(UserWarning, match=r"moved aside to part-000001.parquet.corrupt-1"):
        assert len(store.read("records")) == 6
    assert (tmp_path / "records" / "part-000001.parquet.corrupt").read_bytes() == garbage


# Opens the run as a writer, waits for the go file (so two start together), then appends one question at a time.
WRITER = '''
import json, sys, time
from pathlib import Path
from reach_lens.errors import UserError
from reach_lens.protocol import Protocol
from reach_lens.store import RunStore

root, go, protocol = Path(sys.argv[1]), Path(sys.argv[2]), Protocol.from_dict(json.loads(sys.argv[3]))
while not go.exists():
    time.sleep(0.005)
try:
    store = RunStore(root, protocol)
except UserError as e:
    print(f"REFUSED {e}", flush=True)
    sys.exit(3)
print("WRITING", flush=True)
done = store.done("records")
for i in range(protocol.n):
    if f"q{i:03d}" not in done:
        time.sleep(0.05)
        store.append("records", [{"question_id": f"q{i:03d}", "value": i}])
'''


def _writer(tmp_path, root, go):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, str(script), str(root), str(go), json.dumps(PROTOCOL.to_dict())],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_writers_started_together_one_is_refused_naming_the_directory_and_holder(tmp_path):
    root, go = tmp_path / "run", tmp_path / "go"
    procs = [_writer(tmp_path, root, go) for _ in range(2)]
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 3], outs
    writer = next(p for p in procs if p.returncode == 0)
    refused = next(out for p, out in zip(procs, outs) if p.returncode == 3)[0]
    assert refused.startswith("REFUSED ") and str(root) in refused and f"pid {writer.pid} " in refused
    store = RunStore(root, PROTOCOL)
    rows = store.read("records", key=None)
    assert rows["question_id"].tolist() == [f"q{i:03d}" for i in range(PROTOCOL.n)]  # each once, in order
    assert len(store._parts("records")) == PROTOCOL.n


def test_a_killed_writers_lock_is_taken_over(tmp_path):
    root, go = tmp_path / "run", tmp_path / "go"
    go.touch()
    proc = _writer(tmp_path, root, go)
    assert proc.stdout.readline().strip() == "WRITING"
    assert f"pid {proc.pid} " in (root / ".writer.lock").read_text()
    with pytest.raises(RunDirectoryBusy, match=f"pid {proc.pid} "):  # refused while it lives, in this process too
        RunStore(root, PROTOCOL)
    reader = RunStore.reader(root, PROTOCOL)  # reading beside the writer needs no lock
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close(), proc.stderr.close()
    assert (root / ".writer.lock").exists()  # the stale file stays; its lock went with the process
    done = reader.done("records")
    assert len(done) < PROTOCOL.n
    with pytest.raises(PermissionError, match="reads only"):
        reader.append("records", [{"question_id": "x", "value": 0}])
    store = RunStore(root, PROTOCOL)  # takes the lock over
    assert f"pid {os.getpid()} " in (root / ".writer.lock").read_text()
    assert RunStore(root, PROTOCOL).done("records") == done  # a second store in the holding process is fine


def test_a_reader_needs_a_run(tmp_path):
    with pytest.raises(UnreadableRunDirectory, match="no protocol.json"):
        RunStore.reader(tmp_path / "absent", PROTOCOL)


def _takes_the_lock(tmp_path, root) -> bool:
    """Whether another process can open ``root`` as its writer now (it then writes the 12 rows and exits)."""
    go = tmp_path / "go"
    go.touch()
    proc = _writer(tmp_path, root, go)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 3), (out, err)
    return proc.returncode == 0


def test_close_releases_the_writer_lock_and_the_store_then_reads_only(tmp_path):
    root = tmp_path / "run"
    store = RunStore(root, PROTOCOL)
    store.append("records", [{"question_id": "q000", "value": 0}])
    assert not _takes_the_lock(tmp_path, root)  # held by this process
    store.close()
    store.close()  # again: nothing
    with pytest.raises(PermissionError, match="closed: it reads only"):
        store.append("records", [{"question_id": "q001", "value": 1}])
    assert store.read("records").question_id.tolist() == ["q000"]
    assert _takes_the_lock(tmp_path, root)  # another process writes now, and resumes after q000
    assert RunStore.reader(root, PROTOCOL).read("records").question_id.tolist() == [f"q{i:03d}" for i in range(12)]


def test_a_with_block_releases_the_lock_once_no_store_of_the_process_holds_it(tmp_path):
    root = tmp_path / "run"
    with RunStore(root, PROTOCOL) as first:
        second = RunStore(root, PROTOCOL)  # a second writing store in the holding process shares the lock
        assert first.write and second.write
    assert not first.write and not _takes_the_lock(tmp_path, root)  # second still holds it
    second.close()
    assert _takes_the_lock(tmp_path, root)


def test_a_refused_store_keeps_no_hold_on_the_directory(tmp_path):
    root = tmp_path / "run"
    RunStore(root, PROTOCOL).close()
    with pytest.raises(ProtocolMismatch):
        RunStore(root, PROTOCOL.replace(K=5))
    assert _takes_the_lock(tmp_path, root)
