"""Layer routing: budget-matched random routes vs structured path search (the paper's Figures 1-2, Table 1).

    python experiments/routing.py                                     # default grid (see below): n=30, K=16
    python experiments/routing.py --full-grid --n 2 --K 64            # every model, task, space and method
    python experiments/routing.py --K 200 --methods random mcts --tasks squad
    python experiments/routing.py --models embedded --tasks arc_easy --n 3 --K 16 --random-routes uniform

Default grid: the embedded SmolLM2-135M-Instruct x (SQuAD, zero-shot text with its passage; ARC-Easy, chat
format, read against its guessing floor) in Dr.LLM's skip/repeat space, random routes under both laws against
MCTS, n = 30 questions per cell, K = 16 distinct routes per search. It is sized to what a question costs: a
route recomputes the prompt from its first edited layer on, so each SQuAD question (~230 prompt tokens) pays its
passage again for every one of its distinct routes (docs/results.md has the measured time). `--full-grid` adds
the magnitude-pruned copy, ARC-Challenge and PIQA, the skip and segments spaces, hill climbing and the genetic
search (the grid of the earlier multiple-choice runs); `--K 64 --methods random mcts hill_climb` is the larger
budget.

For every question, every (action space, search method) pair gets a budget of K distinct routes, the
full path first, so every curve starts at the unmodified model. The reward is greedy correctness (the gold
answer, after generation): every curve is an oracle, a diagnostic of what routing can reach, not a method.
The answer-blind numbers are the majority vote over the first k random routes and the learned router.
"Random" is `--random-routes`, one random search per law, each compared with the same structured searches:
geometric (method "random": walks of a geometric number of edits, mean 2, from the full path: close to it) and
uniform (method "random_uniform": uniform over all routes of the action space, length <= 2L); default both.
O_random(K) - O_structured(K) on the same questions is one paired comparison (`stats.paired_comparison`):
Newcombe's 95% interval, the exact McNemar p and the discordant counts (questions only random reaches, only the
structured search reaches). A cell counts as "random better" or "structured better" only when p < 0.05, else a
tie; shares of questions carry Wilson intervals.

Outputs (a summary-<hash>/ directory of --out, named by the protocols it reads, and --figures), one set per law
(<law> in file names):
- oracle_curves.csv, routing_oracle_<space>_*.png: o(k), the share of questions with a correct route among
  the first k, per method, with the random-route vote@k and the deployed D (Figure 1);
- random_minus_structured.csv, direction_counts.csv, routing_random_minus_structured_*.png: O_random(K) -
  O_structured(K) per cell and how many cells go each way, per action space (Figure 2);
- table1.csv: pp over the unmodified model in the Dr.LLM skip/repeat space (Table 1): learned router, random
  vote@16, MCTS oracle@50, random oracle@K, per task and over all of a model's questions pooled ("all
  questions pooled"; the paper's pool is defined differently: its value exceeds every task column's).
  The learned router (`reach_lens.routing.router`) maps a prompt's mean mid-depth residual to per-layer
  skip/keep/repeat; it trains on the routes this run's searches found correct in that space, pooled over the
  model's tasks and cross-fitted over questions (5 folds), and its greedy answer under its route is graded.
A cell (model, task, space) whose structured-search candidates fail answer extraction more often than
--collapse-threshold is flagged as format collapse: left out of the clean counts and drawn hollow. The flag does
not depend on the random law; how often the random routes themselves lose the answer format is reported beside
it (random_format_failure_rate, and in the figures' titles).
"""
from __future__ import annotations

import argparse
import time

import pandas as pd

from reach_lens import audit, cli, logs, plots, stats
from reach_lens.generate import engine_for
from reach_lens.models import prune_magnitude
from reach_lens.protocol import Protocol
from reach_lens.report import write_report
from reach_lens.routing import (METHODS, ROUTE_LAWS, SPACES, LearnedRouter, RouterCell, analysis, known_candidates,
                                random_method, search_rows)
from reach_lens.runs import publish, summary_dir
from reach_lens.store import RunStore

SAY = logs.say("routing")

MODELS, TASKS = ("embedded", "pruned"), ("squad", "arc_easy", "arc_challenge", "piqa")
# the default grid; --full-grid takes every model, task, space and method instead
DEFAULT_GRID = {"models": ["embedded"], "tasks": ["squad", "arc_easy"], "spaces": ["skip_repeat"],
                "methods": ["random", "mcts"]}
FULL_GRID = {"models": list(MODELS), "tasks": list(TASKS), "spaces": list(SPACES), "methods": list(METHODS)}


def parse_args(argv=None) -> argparse.Namespace:
    parents = [cli.common(out="runs/routing", batch_size=32), cli.data(n=30, chunk=15, tasks=DEFAULT_GRID["tasks"])]
    p = argparse.ArgumentParser(parents=parents, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full-grid", action="store_true",
                   help=f"every model, task, space and method ({' '.join(MODELS)} x {' '.join(TASKS)} x "
                        f"{' '.join(SPACES)} x {' '.join(METHODS)}) where --models, --tasks, --spaces or --methods "
                        "is not given")
    p.add_argument("--models", nargs="+", default=None, choices=MODELS,
                   help="'embedded': the --model itself; 'pruned': its magnitude-pruned copy (default embedded)")
    p.add_argument("--prune-sparsity", type=cli.share, default=0.5, help="MLP weight sparsity of the pruned copy")
    p.add_argument("--K", type=cli.positive_int, default=16, help="distinct routes per search (the paper: 200)")
    p.add_argument("--spaces", nargs="+", default=None, choices=list(SPACES),
                   help=f"action spaces of the routes (default {' '.join(DEFAULT_GRID['spaces'])})")
    p.add_argument("--methods", nargs="+", default=None, choices=list(METHODS),
                   help=f"search methods, 'random' included (default {' '.join(DEFAULT_GRID['methods'])})")
    p.add_argument("--random-routes", nargs="+", default=list(ROUTE_LAWS), choices=ROUTE_LAWS,
                   help="laws of the random searches' routes, each its own search and analysis: geometric walks "
                        "from the full path and/or uniform (default both)")
    p.add_argument("--mcts-batch", type=cli.positive_int, default=1,
                   help="routes MCTS asks per round, with a virtual loss on the round's pending routes (default 1: "
                        "the sequential search; more: fewer, larger engine calls)")
    p.add_argument("--vote-k", type=cli.positive_int, default=16, help="k of the random-route vote in Table 1")
    p.add_argument("--mcts-k", type=cli.positive_int, default=50, help="simulations of the MCTS oracle in Table 1")
    p.add_argument("--collapse-threshold", type=cli.share, default=0.5,
                   help="format-failure share of the structured searches' candidates above which a cell is 'collapsed'")
    p.set_defaults(tasks=None)
    args = p.parse_args(argv)
    for name, default in DEFAULT_GRID.items():
        if getattr(args, name) is None:
            setattr(args, name, list(FULL_GRID[name] if args.full_grid else default))
    if "random" not in args.methods:
        p.error("--methods must include 'random' (every comparison is against it)")
    args.random_routes = list(dict.fromkeys(args.random_routes))
    return args


def search_cell(model, label: str, task, qs, args, loop) -> tuple[Protocol, RunStore, pd.DataFrame]:
    """The protocol, store and searches table of one (model, task) cell: every search of every question (resumed)."""
    fmt = task.resolve_format(args.fmt, engine_for(model).tokenizer, zero_shot=True)
    protocol = Protocol.of(study="routing", facts=engine_for(model).describe(), task=task, questions=qs,
                           source=args.source, split=args.split, seed=args.seed, fmt=fmt, probe="route", K=args.K,
                           settings={"spaces": args.spaces, "methods": args.methods, "reward": "greedy correctness",
                                     "random_routes": args.random_routes,
                                     **({"mcts_batch": args.mcts_batch} if args.mcts_batch != 1 else {})})
    laws = "+".join(args.random_routes) + ("" if args.mcts_batch == 1 else f"-mcts{args.mcts_batch}")
    store = RunStore(args.out / f"{protocol.model}-{task.name}-n{len(qs)}{cli.skip_tag(args)}-K{args.K}-s{args.seed}-{laws}", protocol)
    searches = loop.resume(store, "searches", qs, lambda part: search_rows(
        model, task, part, fmt, args.spaces, args.methods, args.K, args.seed, args.random_routes, args.batch_size,
        args.mcts_batch),
        desc=f"{label} {task.name} searches")
    return protocol, store, searches


def main(argv=None) -> int:
    args = parse_args(argv)
    loop, started = cli.setup(args), time.time()
    tasks, questions = cli.question_sets(args)
    base = cli.load(args)
    L, space1 = base.cfg.n_layers, analysis.gains_space(args.spaces)
    cells, protocols = {}, []
    for label in args.models:
        model = base if label == "embedded" else prune_magnitude(base, args.prune_sparsity)
        runs = {t: search_cell(model, label, task, questions[t], args, loop) for t, task in tasks.items()}
        router = LearnedRouter(model, {t: RouterCell(tasks[t], questions[t], analysis.found_routes(df, space1),
                                                     known_candidates(df.candidates, df.question_id), protocol.fmt)
                                       for t, (protocol, _, df) in runs.items()}, args.seed, args.batch_size)
        for t, (protocol, store, searches) in runs.items():
            routed = loop.resume(store, "router", questions[t], lambda part, t=t, router=router: router.rows(t, part),
                                 desc=f"{label} {t} learned router")
            cells[(label, t)] = analysis.per_question(searches, args.K, L, router=routed)
            protocols.append(protocol)
            SAY(f"{label} {t}: the learned router leaves the full path on "
                f"{sum(tuple(r) != tuple(range(L)) for r in routed.route)} of {len(routed)} questions")
    out = summary_dir(args.out, protocols)
    for law in args.random_routes:
        tables = analysis.analyse(cells, args.spaces, args.methods, args.K, args.vote_k, args.mcts_k,
                                  args.collapse_threshold, random_method=random_method(law))
        floors = {t: audit.options_per_question(qs) for t, qs in questions.items()}  # None: free-form, no floor
        curves = tables["oracle_curves"]
        curves["guess"] = [stats.guessing_floor(floors[t], k) for t, k in zip(curves.task, curves.k)]
        tag = f"{base.cfg.model_name}-n{args.n}{cli.skip_tag(args)}-K{args.K}-{law}"  # two models' runs never share a figure
        for name, df in tables.items():
            df.to_csv(out / f"{name}_{law}.csv", index=False)
        figures = {out / f"routing_oracle_{space}_{tag}.png": plots.plot_oracle_curves(tables["oracle_curves"], space)
                   for space in args.spaces}
        if len(tables["random_minus_structured"]):
            figures[out / f"routing_random_minus_structured_{tag}.png"] = plots.plot_random_minus_structured(
                tables["random_minus_structured"], tables["direction_counts"], title=f"{law} random routes")
        publish(args.figures, figures)
        broken = tables["oracle_curves"].groupby(["model", "task", "space"]).random_format_failure_rate.first()
        print(f"{law} random routes minus structured oracle at K={args.K}, clean cells (random routes without an "
              f"answer: {broken.min():.0%}-{broken.max():.0%} per cell):\n"
              + tables["direction_counts"].to_string(index=False), flush=True)
        if len(tables["random_minus_structured"]):
            print(f"Per cell ({law} random routes; Newcombe 95% interval, exact McNemar p):\n"
                  + analysis.comparison_lines(tables["random_minus_structured"]).to_string(index=False), flush=True)
        print(f"Table 1 ({law} random routes; pp over the unmodified model):\n"
              + tables["table1"].to_string(index=False, float_format="{:.1f}".format), flush=True)
    SAY(f"{(time.time() - started) / 60:.1f} min wall time; tables and figures in {out}, figures also in {args.figures}")
    SAY(f"report: {write_report(out)}")
    return 0


if __name__ == "__main__":
    cli.run(main)
