"""Chunks on Ray actors equal chunks in this process, and a killed actor loses nothing (tiny random models, a local
Ray cluster of 2 CPU workers)."""
import time

import pandas as pd
import pytest
import torch
from conftest import make_tiny_model

from reach_lens import parallel
from reach_lens.generate import Request, engine_for
from reach_lens.interventions import Silence
from reach_lens.protocol import Protocol
from reach_lens.store import RunStore

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'reach_lens[ray]')")


@pytest.fixture(scope="module")
def pool():
    """One local cluster and one pool of 2 CPU workers for the module (actors start once: ~10 s each)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    workers = parallel.make_pool(workers=2, address="local")
    yield workers
    workers.close()
    ray.shutdown()


def prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, 50, (int(k),), generator=g).tolist()) for k in torch.randint(3, 12, (n,), generator=g)]


def test_models_travel_by_key_and_come_back_as_the_same_object():
    model = make_tiny_model()
    seen = []

    def register(m):
        seen.append(m)
        return "m0"

    fn = parallel.loads(parallel.dumps(lambda part: (model, engine_for(model), part), register), lambda key: model)
    got_model, got_engine, part = fn(7)
    assert got_model is model and got_engine is engine_for(model) and part == 7
    assert all(m is model for m in seen)


def test_ray_pool_equals_local_pool(pool):
    model = make_tiny_model()
    other = make_tiny_model(seed=5)  # a second model in the same closure travels too
    silenced = [Silence(1, "hook_mlp_out")]
    parts = [prompts(3, seed) for seed in range(5)]

    def rows_of(part):
        a = engine_for(model).generate([Request(p, 5, temperature=0.8, seed=len(p)) for p in part],
                                       interventions=silenced)
        b = engine_for(other).generate([Request(p, 3) for p in part])
        return [{"tokens": x.tokens, "other": y.tokens} for x, y in zip(a, b)]

    local = dict(parallel.LocalPool().map(rows_of, parts))
    assert dict(pool.map(rows_of, parts)) == local


def test_a_collected_model_is_forgotten_and_its_successor_runs_its_own_weights(pool):
    """Models are keyed by identity while alive: a model freed before the next one is loaded (as the studies do
    between checkpoints) must not leave its key to whatever object later takes its address."""
    import gc

    def rows_of_model(m):
        return lambda part: [engine_for(m).generate([Request(p, 4)])[0].tokens for p in part]

    parts = [prompts(2, seed) for seed in range(2)]
    first = make_tiny_model(seed=0)
    dict(pool.map(rows_of_model(first), parts))
    first_id, first_key = id(first), pool.keys[id(first)]
    del first
    gc.collect()
    assert first_id not in pool.keys and first_key not in pool.refs
    second = make_tiny_model(seed=7)
    assert dict(pool.map(rows_of_model(second), parts)) == dict(parallel.LocalPool().map(rows_of_model(second), parts))
    assert pool.keys[id(second)] != first_key


def test_a_killed_actor_loses_nothing_and_duplicates_nothing(pool, tmp_path):
    model = make_tiny_model()
    parts = [prompts(2, seed) for seed in range(6)]

    def rows_of(part):
        time.sleep(0.5)
        gens = engine_for(model).generate([Request(p, 4) for p in part])
        return [{"question_id": f"{p}", "tokens": g.tokens} for p, g in zip(part, gens)]

    task = type("T", (), {"name": "toy", "grader": "toy/1", "max_new_tokens": lambda self, f: 4,
                          "stop_strings": lambda self, f: ()})()
    questions = [type("Q", (), {"id": f"{p}", "gold": "x"})() for part in parts for p in part]
    store = RunStore(tmp_path / "run", Protocol.of(study="toy", facts=engine_for(model).describe(), task=task,
                                                   questions=questions, fmt="shared", probe="deploy"))
    killed = None
    for _, rows in pool.map(rows_of, parts):
        store.append("rows", rows)
        if killed is None:  # kill an actor mid-run (busy with a chunk, or about to get one)
            killed = pool.actors[0]
            ray.kill(killed)
    assert pool.actors[0] is not killed  # its chunk failed and went to a fresh actor
    stored = store.read("rows", key=None)
    assert len(stored) == sum(map(len, parts)) == stored.question_id.nunique()
    expected = dict(parallel.LocalPool().map(rows_of, parts))
    assert sorted(map(tuple, stored.tokens)) == sorted(tuple(r["tokens"]) for rows in expected.values() for r in rows)


def test_run_loop_on_the_pool_equals_the_loop_in_process(pool, tmp_path):
    from reach_lens.runs import RunLoop

    model = make_tiny_model(seed=2)
    items = [type("Q", (), {"id": f"q{i}", "gold": "x", "prompt": p})() for i, p in enumerate(prompts(7, seed=3))]
    task = type("T", (), {"name": "toy", "grader": "toy/1", "max_new_tokens": lambda self, f: 4,
                          "stop_strings": lambda self, f: ()})()

    def rows_of(part):
        gens = engine_for(model).generate([Request(q.prompt, 4, temperature=1.0, seed=i) for i, q in enumerate(part)])
        return [{"question_id": q.id, "tokens": g.tokens} for q, g in zip(part, gens)]

    protocol = Protocol.of(study="toy", facts=engine_for(model).describe(), task=task, questions=items, fmt="shared",
                           probe="deploy")
    here = RunLoop(chunk=3).resume(RunStore(tmp_path / "here", protocol), "rows", items, rows_of)
    there = RunLoop(chunk=3, pool=pool).resume(RunStore(tmp_path / "there", protocol), "rows", items, rows_of)
    key = lambda df: sorted(zip(df.question_id, map(tuple, df.tokens)))  # noqa: E731
    assert key(here) == key(there) and len(there) == 7


@pytest.mark.integration
def test_sampling_gap_on_two_workers_equals_one_process(pool, tmp_path, monkeypatch):
    """The embedded model, 4 ARC-Easy questions: --workers 2 stores the same records as one process."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "sampling_gap.py"
    spec = importlib.util.spec_from_file_location("sampling_gap_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    pool.close()  # the script starts its own 2 workers on the 2 CPUs of this cluster
    made, make_pool = [], parallel.make_pool
    monkeypatch.setattr(parallel, "make_pool", lambda *a, **k: made.append(make_pool(*a, **k)) or made[-1])
    common = ["--tasks", "arc_easy", "--n", "4", "--K", "2", "--T", "0.8", "--temperatures", "0.8", "--chunk", "1",
              "--figures", str(tmp_path / "figures")]
    assert script.main([*common, "--out", str(tmp_path / "one")]) == 0
    assert script.main([*common, "--out", str(tmp_path / "two"), "--workers", "2"]) == 0
    assert len(made) == 1 and isinstance(made[0], parallel.RayPool)
    made[0].close()

    def records(out):
        run = next(p for p in out.iterdir() if not p.name.startswith("summary-"))
        parts = sorted((run / "T0.8" / "records").glob("part-*.parquet"))
        df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
        return {q: [c["text"] for c in cs] for q, cs in zip(df.question_id, df.candidates)}

    assert records(tmp_path / "two") == records(tmp_path / "one")


def test_a_pool_larger_than_the_free_cluster_is_refused_not_left_waiting(pool):
    with pytest.raises(ValueError, match="3 workers need 3 free CPUs"):
        parallel.RayPool(3, threads_per_worker=1)
