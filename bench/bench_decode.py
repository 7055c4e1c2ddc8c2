"""Decode slots on the rows that run them vs on the whole batch: the routing study's SQuAD work, both ways.

Work, identical for both engines: greedy decoding (the task's budget and stop strings) of `--questions` SQuAD
questions in the routing study's zero-shot text format (embedded SmolLM2-135M-Instruct), each under the full path
and the K-1 distinct routes of each random search of the study (`--random-routes`, default geometric and uniform,
the study's seeds), in decode batches of `--batch-size` rows.

A decode batch runs one schedule, a common supersequence of its rows' routes; uniform routes (~58 layers drawn
from 30) make schedules of ~270 slots of which each row runs a fifth.
- subsets: `TransformerLensEngine(model)`: a slot that at most `SUBSET_SHARE` of the batch runs is computed on
  those rows alone (on a copy of their keys and values);
- whole batch: `TransformerLensEngine(model, decode_subsets=False)`: every slot on every row, the outputs of the
  rows that do not run it discarded.

In float32 both must give the same tokens (checked; log-probabilities differ by the float rounding of different
batch shapes); in bfloat16 that rounding is coarse enough to flip a near-tied greedy token now and then (counted). Each timed run starts from an empty prefix cache, so the prefills (the same work in both) are included;
their own time is timed apart.

    python bench/bench_decode.py [--questions 2] [--K 32] [--batch-size 32] [--threads 2] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import time
from unittest import mock

import torch

from reach_lens.generate import Request, TransformerLensEngine
from reach_lens.generate.prefill import Prefiller
from reach_lens.models import load_model
from reach_lens.probes import prompt_ids, question_seed
from reach_lens.routing import ROUTE_LAWS, RandomSearch, SkipRepeat, random_method
from reach_lens.tasks import get_task, subsample


def timed_prefills(fn) -> tuple[float, object]:
    """Seconds spent in route prefills while ``fn()`` runs, and its result."""
    spent, inner = [0.0], Prefiller.__call__

    def call(self, prompt, routes):
        start = time.perf_counter()
        try:
            return inner(self, prompt, routes)
        finally:
            spent[0] += time.perf_counter() - start

    with mock.patch.object(Prefiller, "__call__", call):
        out = fn()
    return spent[0], out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--questions", type=int, default=2, help="first questions of the seed-0 subsample of SQuAD")
    p.add_argument("--K", type=int, default=32, help="distinct routes per random search, the full path included")
    p.add_argument("--random-routes", nargs="+", default=list(ROUTE_LAWS), choices=ROUTE_LAWS)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(dtype=getattr(torch, args.dtype))
    task = get_task("squad")
    fmt = task.resolve_format("auto", model.tokenizer, zero_shot=True)
    questions = subsample(task.load(), args.questions, 0)
    L = model.cfg.n_layers
    requests = []
    for q, prompt in zip(questions, prompt_ids(model, task, questions, fmt)):
        routes: dict[tuple[int, ...], None] = {}
        for law in args.random_routes:
            seed = question_seed(0, f"{q.id}|skip_repeat|{random_method(law)}")
            routes.update(dict.fromkeys(RandomSearch(SkipRepeat(L), args.K, seed, law=law).run(
                lambda ps: [0.0] * len(ps)).routes))
        requests += [Request(prompt, task.max_new_tokens(fmt), route=r, stop_strings=task.stop_strings(fmt))
                     for r in routes]
    lengths = [len(r.route) for r in requests]
    print(f"model {model.cfg.model_name} ({args.dtype}), {L} layers; {len(questions)} SQuAD questions ({fmt} format, "
          f"prompts of {min(len(r.prompt) for r in requests)}-{max(len(r.prompt) for r in requests)} tokens) x "
          f"{len(requests) // len(questions)} distinct routes ({'+'.join(args.random_routes)}; lengths "
          f"{min(lengths)}-{max(lengths)}, mean {sum(lengths) / len(lengths):.1f}); {requests[0].max_new_tokens} new "
          f"tokens max; batch {args.batch_size}; torch threads {torch.get_num_threads()}")
    engines = {"subsets": TransformerLensEngine(model), "whole batch": TransformerLensEngine(model, decode_subsets=False)}
    results = {}
    for name, engine in engines.items():
        engine.clear_prefix_cache()
        start = time.perf_counter()
        prefill, gens = timed_prefills(lambda: engine.generate(requests, batch_size=args.batch_size))
        results[name] = (time.perf_counter() - start, prefill, gens)
        print(f"{name:12s} {results[name][0]:7.1f} s   (prefills {prefill:5.1f} s, decode and the rest "
              f"{results[name][0] - prefill:6.1f} s)", flush=True)
    a, b = results["subsets"][2], results["whole batch"][2]
    same = sum(x.tokens == y.tokens for x, y in zip(a, b))
    drift = max(abs(u - v) for x, y in zip(a, b) if x.tokens == y.tokens for u, v in zip(x.token_logprobs, y.token_logprobs))
    print(f"same tokens: {same}/{len(requests)} rows (largest log-prob difference {drift:.1e})")
    (sub, sub_pre, _), (whole, whole_pre, _) = results["subsets"], results["whole batch"]
    print(f"speed-up of running slots on their rows: {whole / sub:.2f}x in all, "
          f"{(whole - whole_pre) / (sub - sub_pre):.2f}x outside the prefills")
    return 0 if same == len(requests) or args.dtype != "float32" else 1


if __name__ == "__main__":
    raise SystemExit(main())
