"""Route evaluation throughput: K skip routes for one question, batched vs one route at a time.

Work, identical for every method: greedy decoding (task budget, 8 tokens, EOS stops a row) of one ARC-Easy
question's chat prompt (embedded SmolLM2-135M-Instruct) under K=32 skip-only routes: the full path and 31
draws of `SkipOnly.random_route` (seeded). Methods:

- batched: `RouteGenerator` on all K rows in one call (prefill per route from the shared clean prefix,
  one decode batch with a per-row layer mask);
- one at a time (same code): `RouteGenerator` called once per route (the clean prefix is still shared);
- one at a time (skip hooks): `sampling.generate` at batch 1 per route under `Route(path).hooks(model)`,
  i.e. what one would write without route batching;
- batched (skip mask, sampling.generate): one `generate` call, `row_hooks` from `skip_mask_hooks`.

Every method must produce the same tokens (checked). One warm-up call runs first; times are the best of
`--repeat` runs (the machine is shared).

    python bench/bench_routes.py [--K 32] [--question 0] [--repeat 2]
"""
import argparse
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reach_lens.hooks import Route  # noqa: E402
from reach_lens.models import load_model  # noqa: E402
from reach_lens.probes import prompt_ids  # noqa: E402
from reach_lens.routing import RouteGenerator, SkipOnly, skip_mask_hooks  # noqa: E402
from reach_lens.sampling import generate  # noqa: E402
from reach_lens.tasks import get_task, subsample  # noqa: E402


def best_time(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--K", type=int, default=32)
    p.add_argument("--question", type=int, default=0, help="index in the seed-0 subsample of ARC-Easy")
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
    space, rng = SkipOnly(L), random.Random(0)
    routes = [space.full_path]
    while len(routes) < args.K:
        r = space.random_route(rng)
        if r not in routes:
            routes.append(r)
    new_tokens = task.max_new_tokens("native")
    print(f"model {model.cfg.model_name}, {L} layers; prompt {len(prompt)} tokens; K={args.K} skip routes; "
          f"{new_tokens} new tokens max; torch threads {torch.get_num_threads()}")

    def batched():
        gen = RouteGenerator(model, new_tokens, batch_size=args.K)
        return [g.tokens for g in gen([prompt], [(0, r) for r in routes])]

    def one_at_a_time():
        gen = RouteGenerator(model, new_tokens, batch_size=1)
        return [gen([prompt], [(0, r)])[0].tokens for r in routes]

    def hooks_one_at_a_time():
        return [generate(model, [prompt], max_new_tokens=new_tokens, hooks=Route(r).hooks(model), batch_size=1)[0][0].tokens
                for r in routes]

    def skip_mask_generate():
        gens = generate(model, [prompt], n_per_prompt=len(routes), max_new_tokens=new_tokens, batch_size=len(routes),
                        row_hooks=lambda rows: skip_mask_hooks([routes[r] if r >= 0 else space.full_path for r in rows], L))
        return [g.tokens for g in gens[0]]

    methods = {"batched (RouteGenerator)": batched, "one at a time (RouteGenerator)": one_at_a_time,
               "one at a time (generate + skip hooks)": hooks_one_at_a_time,
               "batched (generate + skip_mask row_hooks)": skip_mask_generate}
    batched()  # warm-up
    results = {}
    for name, fn in methods.items():
        results[name] = best_time(fn, args.repeat)
        print(f"{name:45s} {results[name][0]:7.2f} s")
    reference = results["batched (RouteGenerator)"][1]
    for name, (_, tokens) in results.items():
        same = sum(a == b for a, b in zip(tokens, reference))
        print(f"  {name}: {same}/{len(routes)} routes give the batched tokens")
    t_batched = results["batched (RouteGenerator)"][0]
    for name in list(methods)[1:]:
        print(f"speed-up of batched RouteGenerator over {name}: {results[name][0] / t_batched:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
