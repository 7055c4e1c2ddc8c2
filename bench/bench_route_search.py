"""A routing question's cost: the routing study's searches of a few SQuAD questions, MCTS asking one route per round
(the sequential search) against rounds of several routes (virtual loss), in one run on the same loaded model.

Work, the routing study's cell (`experiments/routing.py --tasks squad --K 32 --methods random mcts`): per
question, K distinct skip/repeat routes from each of three searches run in lockstep (geometric random, uniform
random, MCTS), each route's greedy answer to the question's zero-shot passage prompt. The questions are the
routing study's seed-0 subsample of the embedded SQuAD validation set, from ``--first``.

Printed: seconds per question for each ``--mcts-batch`` value, the ratio to the sequential search, the engine
calls (rounds) per search, whether the random searches' routes and their answers equal the sequential run's
(they must: MCTS's rounds do not touch the other searches' seeds; in bfloat16 a greedy token can depend on the
batch's other rows, so answers are compared and the differences counted, not asserted), and each method's
oracle over the questions (MCTS's changes with its rounds: a different search).

    python bench/bench_route_search.py [--n 3] [--first 0] [--K 32] [--mcts-batch 1 4] [--dtype bfloat16] [--threads 2]
"""
from __future__ import annotations

import argparse
import time

import torch

from reach_lens.models import load_model
from reach_lens.routing import search_rows
from reach_lens.tasks import get_task, subsample


def run(model, task, questions, fmt: str, K: int, mcts_batch: int) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    rows = search_rows(model, task, questions, fmt, ["skip_repeat"], ["random", "mcts"], K, seed=0,
                       random_routes=("geometric", "uniform"), batch_size=16, mcts_batch=mcts_batch)
    return time.perf_counter() - start, rows


def by_method(row: dict) -> dict[str, dict]:
    return {s["method"]: s for s in row["searches"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=3, help="SQuAD questions")
    p.add_argument("--first", type=int, default=0, help="index of the first question in the seed-0 subsample")
    p.add_argument("--K", type=int, default=32)
    p.add_argument("--mcts-batch", type=int, nargs="+", default=[1, 4], help="routes per MCTS round; 1 first")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.mcts_batch[0] != 1:
        p.error("--mcts-batch: the first value is the reference and must be 1 (the sequential search)")
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(dtype=getattr(torch, args.dtype))
    task = get_task("squad")
    fmt = task.resolve_format("auto", model.tokenizer, zero_shot=True)
    questions = subsample(task.load(), args.first + args.n, seed=0)[args.first:]
    run(model, task, questions[:1], fmt, 4, 1)  # warm-up
    print(f"{len(questions)} SQuAD questions ({fmt}), K = {args.K} routes x 3 searches (geometric, uniform, MCTS), "
          f"{args.dtype}, {torch.get_num_threads()} threads")
    reference = None
    for batch in args.mcts_batch:
        seconds, rows = run(model, task, questions, fmt, args.K, batch)
        rounds = sum(len(by_method(r)["mcts"]["batch_sizes"]) for r in rows) / len(rows)
        oracle = {m: sum(max(s["rewards"]) > 0 for s in (by_method(r)[m] for r in rows))
                  for m in ("random", "random_uniform", "mcts")}
        line = (f"  mcts-batch {batch}: {seconds / len(rows):6.1f} s/question, MCTS {rounds:.1f} rounds a search; "
                f"questions reached: geometric {oracle['random']}, uniform {oracle['random_uniform']}, "
                f"MCTS {oracle['mcts']} of {len(rows)}")
        if reference is None:
            reference = (seconds, rows)
        else:
            same_routes = all(by_method(a)[m]["routes"] == by_method(b)[m]["routes"]
                              for a, b in zip(rows, reference[1]) for m in ("random", "random_uniform"))
            differ = 0
            for a, b in zip(rows, reference[1]):
                answers = {tuple(c["route"]): c["answer"] for c in b["candidates"]}
                now = {tuple(c["route"]): c["answer"] for c in a["candidates"]}
                differ += sum(now[tuple(r)] != answers[tuple(r)] for m in ("random", "random_uniform")
                              for r in by_method(a)[m]["routes"])
            line += (f"; {reference[0] / seconds:.2f}x the sequential search; random routes "
                     f"{'identical' if same_routes else 'DIFFERENT'}, {differ} of their answers differ")
        print(line, flush=True)


if __name__ == "__main__":
    main()
