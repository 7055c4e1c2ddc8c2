"""Route-prefix sharing: K distinct skip/repeat routes of one question, with and without sharing.

Work, identical for both engines: greedy decoding (the task's budget and stop strings) of one ARC-Easy
question's chat prompt (embedded SmolLM2-135M-Instruct) under K=64 distinct routes of the skip/repeat space:
the full path and K-1 draws of the routing study's random search (`--random-routes`, default geometric).

- shared: `TransformerLensEngine(model)`: the routes' prefills share the clean full-path prefix and the route
  trie (routes that start with the same layers compute those positions once);
- alone: `TransformerLensEngine(model, share_prefixes=False)`: every route's prefill from the embedding.

Both must give the same tokens (checked). Each timed run starts from an empty prefix cache; one warm-up call
runs first; times are the best of `--repeat`. Layer compute is counted in block-position evaluations of the
prefill (rows x prompt positions of every block call), instrumented by wrapping `Prefiller._block` (every
prefill block call goes through it), and also computed analytically from the trie: without sharing,
sum over routes of len(route) x n; with it, (depth of the clean prefix + number of distinct route prefixes
beyond each route's clean start) x n. Decoding is the same batched work in both engines and is not counted.

    python bench/bench_routes.py [--K 64] [--question 0] [--repeat 2] [--threads 1] [--random-routes uniform]
"""
from __future__ import annotations

import argparse
import time
from unittest import mock

import torch

from reach_lens.generate import Request, TransformerLensEngine
from reach_lens.generate.prefill import Prefiller, clean_length
from reach_lens.models import load_model
from reach_lens.probes import prompt_ids, question_seed
from reach_lens.routing import ROUTE_LAWS, RandomSearch, SkipRepeat
from reach_lens.tasks import get_task, subsample


def best_time(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def counted(fn) -> tuple[int, object]:
    """Block-position evaluations of the prefills that ``fn()`` runs, and its result."""
    count, inner = [0], Prefiller._block

    def block(self, layer, resid, past=None):
        count[0] += resid.shape[0] * resid.shape[1]
        return inner(self, layer, resid, past)

    with mock.patch.object(Prefiller, "_block", block):
        out = fn()
    return count[0], out


def analytic(routes: list[tuple[int, ...]], n: int) -> tuple[int, int]:
    """(without sharing, with sharing) block-position evaluations of the prefills, from the route trie."""
    alone = sum(len(r) for r in routes) * n
    start = {r: clean_length(r) for r in routes}
    trie = {r[:i] for r in routes for i in range(start[r] + 1, len(r) + 1)}
    return alone, (max(start.values()) + len(trie)) * n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--K", type=int, default=64)
    p.add_argument("--question", type=int, default=0, help="index in the seed-0 subsample of ARC-Easy")
    p.add_argument("--random-routes", default="geometric", choices=ROUTE_LAWS)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model()
    task = get_task("arc_easy")
    q = subsample(task.load(), args.question + 1, 0)[args.question]
    prompt = prompt_ids(model, task, [q], "native")[0]
    L = model.cfg.n_layers
    search = RandomSearch(SkipRepeat(L), args.K, question_seed(0, f"{q.id}|skip_repeat|random"), law=args.random_routes)
    routes = search.run(lambda ps: [0.0] * len(ps)).routes
    assert len(set(routes)) == args.K and routes[0] == tuple(range(L))
    requests = [Request(prompt, task.max_new_tokens("native"), route=r, stop_strings=task.stop_strings("native"))
                for r in routes]
    engines = {"shared": TransformerLensEngine(model), "alone": TransformerLensEngine(model, share_prefixes=False)}
    print(f"model {model.cfg.model_name}, {L} layers; prompt {len(prompt)} tokens; K={args.K} distinct "
          f"{args.random_routes} skip/repeat routes (lengths {min(map(len, routes))}-{max(map(len, routes))}, "
          f"mean {sum(map(len, routes)) / len(routes):.1f}); {requests[0].max_new_tokens} new tokens max; "
          f"torch threads {torch.get_num_threads()}")

    def run(engine):
        def go():
            engine.clear_prefix_cache()
            return [g.tokens for g in engine.generate(requests, batch_size=args.K)]
        return go

    run(engines["shared"])()  # warm-up
    results = {name: best_time(run(engine), args.repeat) for name, engine in engines.items()}
    counts = {name: counted(run(engine))[0] for name, engine in engines.items()}
    same = sum(a == b for a, b in zip(results["shared"][1], results["alone"][1]))
    alone_n, shared_n = analytic(list(routes), len(prompt))
    for name, (seconds, _) in results.items():
        print(f"{name:7s} {seconds:7.2f} s   prefill block-position evaluations {counts[name]:>9,d}")
    print(f"same tokens: {same}/{len(routes)} routes")
    print(f"speed-up of route-prefix sharing: {results['alone'][0] / results['shared'][0]:.2f}x")
    print(f"prefill layer compute saved: {1 - counts['shared'] / counts['alone']:.1%} (instrumented); "
          f"{1 - shared_n / alone_n:.1%} (analytic from the trie: {shared_n:,d} of {alone_n:,d})")
    return 0 if same == len(routes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
