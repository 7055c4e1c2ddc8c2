"""Ray with N workers against one process on the same sampling work (the embedded model, ARC-Easy prompts).

Work, identical for both: K=8 samples of each of 32 ARC-Easy questions (native format, task budget, T=0.8),
in chunks of 4 questions, through ``runs.RunLoop.resume`` into a fresh run store. One process runs the chunks with
``--threads`` torch threads; the pool runs them on ``--workers`` Ray actors with ``threads / workers`` threads
each (the same cores). Reported: wall time of each (the pool's includes starting its actors and shipping the
model), the ratio, and that both stores hold the same rows.

    python bench/bench_ray.py [--workers 2] [--threads 2] [--n 32]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from reach_lens import parallel, probes
from reach_lens.generate import engine_for
from reach_lens.models import load_model
from reach_lens.protocol import Protocol
from reach_lens.runs import RunLoop
from reach_lens.store import RunStore
from reach_lens.tasks import get_task, subsample


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="cores used by either method")
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--K", type=int, default=8)
    p.add_argument("--chunk", type=int, default=4)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model()
    task = get_task("arc_easy")
    questions = subsample(task.load(), args.n, 0)
    protocol = Protocol.of(study="bench_ray", facts=engine_for(model).describe(), task=task, questions=questions,
                           fmt="native", probe="sample", K=args.K, temperature=0.8)

    def rows_of(part):
        samples = probes.sample(model, task, part, "native", K=args.K, temperature=0.8, seed=0)
        return [{"question_id": q.id, "answers": [c["answer"] for c in cands], "texts": [c["text"] for c in cands]}
                for q, cands in zip(part, samples)]

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        local = RunLoop(args.chunk).resume(RunStore(Path(tmp) / "local", protocol), "records", questions, rows_of)
        t_local = time.perf_counter() - start
        start = time.perf_counter()
        pool = parallel.RayPool(args.workers, threads_per_worker=max(1, args.threads // args.workers))
        t_start = time.perf_counter() - start
        remote = RunLoop(args.chunk, pool=pool).resume(RunStore(Path(tmp) / "ray", protocol), "records", questions,
                                                       rows_of)
        t_ray = time.perf_counter() - start
        pool.close()
    same = sorted(zip(local.question_id, local.texts)) == sorted(zip(remote.question_id, remote.texts))
    tokens = args.n * args.K
    print(f"{args.n} questions x K={args.K} samples, chunks of {args.chunk}, {args.threads} threads in all")
    print(f"  one process            {t_local:7.1f} s")
    print(f"  Ray, {args.workers} workers         {t_ray:7.1f} s  (of which {t_start:.1f} s starting the pool)")
    print(f"  ratio Ray / one process = {t_ray / t_local:.2f}x; identical rows: {same}; {tokens} samples")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
