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
oracle over the questions (MCTS's changes with its rounds: a different search), with MCTS's oracle against the
sequential search's on the same questions (`stats.paired_verdict`: Newcombe's paired 95% interval, exact McNemar).
``--methods mcts`` runs MCTS alone: the oracle comparison of a pilot cell at a third of the cost.

Where the time goes: a route recomputes the prompt from the first layer it does not share with a route already
prefilled (the full path's prefix is cached; routes of one engine call share a trie), so a question's prefill is
a count of layer passes over its prompt (the full path: L). Printed per run: those passes as asked (each MCTS
round an engine call of its own) and with every route of the question in one call, and the prefill floor they
set: passes / L times one full-path forward of the question's prompt through the blocks, timed here.

    python bench/bench_route_search.py [--n 3] [--first 0] [--K 32] [--mcts-batch 1 4] [--methods random mcts]
        [--dtype bfloat16] [--threads 2] [--batch-size 64]
"""
from __future__ import annotations

import argparse
import time

import torch

from reach_lens import stats
from reach_lens.models import load_model
from reach_lens.probes import prompt_ids
from reach_lens.routing import search_rows
from reach_lens.tasks import get_task, subsample


def run(model, task, questions, fmt: str, K: int, mcts_batch: int, methods: list[str],
        batch_size: int) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    rows = search_rows(model, task, questions, fmt, ["skip_repeat"], methods, K, seed=0,
                       random_routes=("geometric", "uniform"), batch_size=batch_size, mcts_batch=mcts_batch)
    return time.perf_counter() - start, rows


def by_method(row: dict) -> dict[str, dict]:
    return {s["method"]: s for s in row["searches"]}


def prefixes(routes) -> set[tuple[int, ...]]:
    """Every non-empty first-layers prefix of `routes`: the nodes of their trie."""
    return {tuple(r[:i]) for r in routes for i in range(1, len(r) + 1)}


def layer_passes(row: dict, n_layers: int) -> tuple[int, int]:
    """Layer passes over a question's prompt in prefill: (as asked, every round's new routes in one engine call
    sharing the full path's cached prefix; all of the question's routes in one call)."""
    full = prefixes([range(n_layers)])
    rounds: dict[int, list[tuple[int, ...]]] = {}
    for search in row["searches"]:
        start = 0
        for j, size in enumerate(search["batch_sizes"]):
            rounds.setdefault(j, []).extend(map(tuple, search["routes"][start:start + size]))
            start += size
    seen: set[tuple[int, ...]] = set()
    as_asked = n_layers
    for j in sorted(rounds):
        new = [r for r in dict.fromkeys(rounds[j]) if r not in seen]
        seen.update(new)
        as_asked += len(prefixes(new) - full)
    return as_asked, len(prefixes(seen) | full)


def full_path_seconds(model, task, questions, fmt: str) -> list[float]:
    """Seconds of one forward of each question's prompt through every block (no unembedding), best of 3."""
    times = []
    with torch.no_grad():
        for tokens in prompt_ids(model, task, questions, fmt):
            x = torch.tensor([tokens])
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                model(x, stop_at_layer=model.cfg.n_layers)
                best = min(best, time.perf_counter() - start)
            times.append(best)
    return times


def reached(rows: list[dict], method: str) -> list[bool]:
    """Per question: does `method`'s search have a correct route (its oracle over all its routes)."""
    return [max(by_method(r)[method]["rewards"]) > 0 for r in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=3, help="SQuAD questions")
    p.add_argument("--first", type=int, default=0, help="index of the first question in the seed-0 subsample")
    p.add_argument("--K", type=int, default=32)
    p.add_argument("--mcts-batch", type=int, nargs="+", default=[1, 4], help="routes per MCTS round; 1 first")
    p.add_argument("--methods", nargs="+", default=["random", "mcts"], choices=("random", "mcts"),
                   help="searches; 'random' runs the geometric and the uniform law; MCTS always runs")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=64, help="decode batch (the routing cell's --batch-size)")
    args = p.parse_args()
    if args.mcts_batch[0] != 1:
        p.error("--mcts-batch: the first value is the reference and must be 1 (the sequential search)")
    args.methods = list(dict.fromkeys([*args.methods, "mcts"]))
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(dtype=getattr(torch, args.dtype))
    task = get_task("squad")
    fmt = task.resolve_format("auto", model.tokenizer, zero_shot=True)
    questions = subsample(task.load(), args.first + args.n, seed=0)[args.first:]
    run(model, task, questions[:1], fmt, 4, 1, args.methods, args.batch_size)  # warm-up
    forward = full_path_seconds(model, task, questions, fmt)
    L = model.cfg.n_layers
    searched = (["random", "random_uniform"] if "random" in args.methods else []) + ["mcts"]
    print(f"{len(questions)} SQuAD questions ({fmt}), K = {args.K} routes x {len(searched)} searches "
          f"({', '.join(searched)}), {args.dtype}, {torch.get_num_threads()} threads, decode batch {args.batch_size}")
    reference = None
    for batch in args.mcts_batch:
        seconds, rows = run(model, task, questions, fmt, args.K, batch, args.methods, args.batch_size)
        rounds = sum(len(by_method(r)["mcts"]["batch_sizes"]) for r in rows) / len(rows)
        oracle = {m: sum(reached(rows, m)) for m in searched}
        line = (f"  mcts-batch {batch}: {seconds / len(rows):6.1f} s/question, MCTS {rounds:.1f} rounds a search; "
                f"questions reached of {len(rows)}: " + ", ".join(f"{m} {k}" for m, k in oracle.items()))
        passes = [layer_passes(r, L) for r in rows]
        floor = sum(a / L * t for (a, _), t in zip(passes, forward)) / len(rows)
        prefill = (f"\n    prefill: {sum(a for a, _ in passes) / len(rows):.0f} layer passes of the prompt a question "
                   f"as asked, {sum(b for _, b in passes) / len(rows):.0f} in one call (full path {L}); one full-path "
                   f"forward {sum(forward) / len(forward):.2f} s: prefill floor {floor:.1f} s a question")
        if reference is None:
            reference = (seconds, rows)
        else:
            line += f"; {reference[0] / seconds:.2f}x the sequential search"
            if "random" in args.methods:
                same_routes = all(by_method(a)[m]["routes"] == by_method(b)[m]["routes"]
                                  for a, b in zip(rows, reference[1]) for m in ("random", "random_uniform"))
                differ = 0
                for a, b in zip(rows, reference[1]):
                    answers = {tuple(c["route"]): c["answer"] for c in b["candidates"]}
                    now = {tuple(c["route"]): c["answer"] for c in a["candidates"]}
                    differ += sum(now[tuple(r)] != answers[tuple(r)] for m in ("random", "random_uniform")
                                  for r in by_method(a)[m]["routes"])
                line += (f"; random routes {'identical' if same_routes else 'DIFFERENT'}, "
                         f"{differ} of their answers differ")
            verdict = stats.paired_verdict(stats.paired_comparison(reached(rows, "mcts"), reached(reference[1], "mcts")),
                                           names=(f"MCTS R={batch}", "MCTS R=1"))
            line += f"\n    oracle: {verdict}"
        print(line + prefill, flush=True)


if __name__ == "__main__":
    main()
