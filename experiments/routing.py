"""Layer routing: budget-matched random routes vs structured path search (the paper's Figures 1-2, Table 1).

    python experiments/routing.py                                     # default grid (see below), n=2, K=64
    python experiments/routing.py --K 200 --methods random mcts --spaces skip_repeat
    python experiments/routing.py --models embedded --tasks arc_easy --n 3 --K 16    # a quick look

Grid: model (the embedded SmolLM2-135M-Instruct and a magnitude-pruned copy) x task (ARC-Easy, ARC-Challenge,
PIQA). For every question, every (action space, search method) pair gets a budget of K distinct routes, the
full path first, so every curve starts at the unmodified model. The reward is greedy correctness: the gold
answer is used after generation, so every curve here is an oracle (a diagnostic of what routing can reach,
not a deployable method). The one answer-blind number is the majority vote over the first k random routes.

Outputs (run directory and --figures; n and K are on every figure):
- oracle_curves.csv, routing_oracle_<space>.png: o(k) = share of questions with a correct route among the
  first k, per method, with the random-route vote@k and the deployed D (Figure 1);
- random_minus_structured.csv, direction_counts.csv, routing_random_minus_structured.png: per cell,
  O_random(K) - O_structured(K) and how many cells go each way, per action space (Figure 2);
- table1.csv: percentage points over the unmodified model (Table 1): learned router, random vote@16,
  MCTS oracle@50, random oracle@K, in the Dr.LLM skip/repeat space. The learned router
  (`reach_lens.routing.router`) maps a question's prompt representation (mean mid-depth residual of the
  cell's model) to per-layer skip/keep/repeat; it is trained on the routes the searches of this run found
  correct in that space, pooled over the model's tasks and cross-fitted over questions (5 folds), so each
  question's route comes from a router that never saw that question's search results. Its greedy answer
  under the predicted route is graded like any candidate (deployable: the gold answer only trains it).
Format collapse: a cell (model, task, space) whose random-route candidates fail answer extraction more often
than --collapse-threshold is flagged, left out of the clean counts and medians, and drawn hollow.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reach_lens.audit import bootstrap_ci  # noqa: E402
from reach_lens.models import load_model, prune_magnitude  # noqa: E402
from reach_lens.protocol import Protocol  # noqa: E402
from reach_lens.probes import question_seed  # noqa: E402
from reach_lens.routing import (  # noqa: E402
    METHODS, SPACES, RouteEvaluator, RouterCell, learned_router_outcomes, make_space, run_searches)
from reach_lens.select import majority_vote  # noqa: E402
from reach_lens.store import RunStore  # noqa: E402
from reach_lens.tasks import get_task, subsample  # noqa: E402

MODELS = ("embedded", "pruned")
TABLE1_SPACE = "skip_repeat"
COLORS = {"random": "tab:blue", "mcts": "tab:red", "hill_climb": "tab:green", "genetic": "tab:purple",
          "random vote": "tab:orange"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="base model name or path (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS,
                   help="'embedded': the base model; 'pruned': its magnitude-pruned copy")
    p.add_argument("--prune-sparsity", type=float, default=0.5, help="MLP weight sparsity of the pruned copy")
    p.add_argument("--tasks", nargs="+", default=["arc_easy", "arc_challenge", "piqa"])
    p.add_argument("--source", default=None, help="data source for every task (default: each task's embedded data)")
    p.add_argument("--split", default=None)
    p.add_argument("--n", type=int, default=2, help="questions per cell (2 keeps the default grid near 30 min on 2 CPU cores)")
    p.add_argument("--K", type=int, default=64, help="distinct routes per search (the paper: 200 on request)")
    p.add_argument("--spaces", nargs="+", default=list(SPACES), choices=list(SPACES))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--vote-k", type=int, default=16, help="k of the random-route vote in Table 1")
    p.add_argument("--mcts-k", type=int, default=50, help="simulations of the MCTS oracle in Table 1")
    p.add_argument("--collapse-threshold", type=float, default=0.5,
                   help="format-failure share of random-route candidates above which a cell is 'collapsed'")
    p.add_argument("--fmt", default="native", choices=("native", "shared"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="rows per decode batch")
    p.add_argument("--chunk", type=int, default=6,
                   help="questions searched in lockstep (and stored together): more share each decode batch")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice; on a shared machine 1 avoids stalls)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "routing")
    p.add_argument("--figures", type=Path, default=ROOT / "figures")
    args = p.parse_args(argv)
    if "random" not in args.methods:
        p.error("--methods must include 'random' (every comparison is against it)")
    return args


# ---------------------------------------------------------------- running searches


def search_chunk(model, task, questions, args) -> tuple[list[dict], list[dict]]:
    """All (space, method) searches of `questions` in lockstep; returns trace rows and candidate rows."""
    ev = RouteEvaluator(model, task, questions, args.fmt, batch_size=args.batch_size, keep_hidden=False)
    searches, meta = [], []
    for qi, q in enumerate(questions):
        for space in args.spaces:
            for method in args.methods:
                seed = question_seed(args.seed, f"{q.id}|{space}|{method}")
                searches.append(METHODS[method](make_space(space, model.cfg.n_layers), args.K, seed))
                meta.append((qi, space, method, seed))
    traces = run_searches(searches, ev.reward_fn([m[0] for m in meta]))
    trace_rows = [{"question_id": questions[qi].id, "space": space, "method": method, "seed": seed,
                   "routes": [list(r) for r in t.routes], "rewards": t.rewards, "batch_sizes": t.batch_sizes}
                  for (qi, space, method, seed), t in zip(meta, traces)]
    cand_rows = [{"question_id": questions[qi].id, **{k: v for k, v in c.items() if k != "hidden"}}
                 for (qi, _), c in ev.memo.items()]
    return trace_rows, cand_rows


def cell_store(model, model_label: str, task, questions, args) -> RunStore:
    task_name = task.name
    protocol = Protocol.of(study="routing", model=model, task=task, questions=questions, source=args.source,
                           split=args.split, seed=args.seed, fmt=args.fmt, probe="route", K=args.K,
                           settings={"spaces": args.spaces, "methods": args.methods, "reward": "greedy correctness"})
    return RunStore(args.out / f"{model_label}-{task_name}-n{len(questions)}-K{args.K}-s{args.seed}", protocol)


def run_cell(model, model_label: str, task_name: str, args) -> tuple[RouterCell, pd.DataFrame, pd.DataFrame]:
    """Search every question of one cell (resuming from its store); the cell with its Table-1-space searches
    as learned-router training data and every generated candidate as known routes."""
    task = get_task(task_name)
    questions = subsample(task.load(args.source, args.split), args.n, args.seed)
    store = cell_store(model, model_label, task, questions, args)
    done = store.done("traces") if (store.root / "traces").exists() else set()
    todo = [q for q in questions if q.id not in done]
    for start in range(0, len(todo), args.chunk):
        part = todo[start:start + args.chunk]
        t0 = time.time()
        trace_rows, cand_rows = search_chunk(model, task, part, args)
        store.append("candidates", cand_rows)
        store.append("traces", trace_rows)
        print(f"  {model_label} {task_name}: questions {start + 1}-{start + len(part)} of {len(todo)} "
              f"({len(cand_rows)} routes generated) in {time.time() - t0:.0f} s", flush=True)
    traces, cands = store.read("traces", key=None), store.read("candidates", key=None)
    space = traces[traces.space == table1_space(args)]
    found = {q.id: [] for q in questions}
    for qid, routes, rewards in zip(space.question_id, space.routes, space.rewards):
        found[qid] += [(tuple(r), float(w)) for r, w in zip(routes, rewards)]
    known = {(qid, tuple(r)): bool(c) for qid, r, c in zip(cands.question_id, cands.route, cands.correct)}
    return RouterCell(task, questions, found, store, known), traces, cands


# ---------------------------------------------------------------- analysis


def curve(values: np.ndarray, seed: int, n_boot: int = 2000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over questions of values [n, K] with a 95% bootstrap band (one resample of questions for all k)."""
    n = len(values)
    weights = np.random.default_rng(seed).multinomial(n, np.full(n, 1.0 / n), size=n_boot)
    boot = weights @ values / n
    lo, hi = np.quantile(boot, [0.025, 0.975], axis=0)
    return values.mean(axis=0), lo, hi


def per_question(traces: pd.DataFrame, cands: pd.DataFrame, K: int, n_layers: int) -> dict:
    """Per (space, method): question ids, oracle trajectories [n, K]; per space: random vote@k [n, K],
    format-failure share of random candidates; and D per question."""
    by_key = {(r.question_id, tuple(r.route)): r for r in cands.itertuples()}
    full = tuple(range(n_layers))
    out: dict = {"oracle": {}, "vote": {}, "format_failures": {}}
    qids = sorted(set(traces.question_id))
    out["qids"] = qids
    out["D"] = np.array([float(by_key[(q, full)].correct) for q in qids])
    for (space, method), g in traces.groupby(["space", "method"]):
        g = g.set_index("question_id").loc[qids]
        o = np.zeros((len(qids), K))
        for i, rewards in enumerate(g.rewards):
            acc = np.maximum.accumulate(np.asarray(rewards, dtype=float))
            o[i] = np.concatenate([acc, np.full(K - len(acc), acc[-1])])
        out["oracle"][(space, method)] = o
        if method == "random":
            vote = np.zeros((len(qids), K))
            failures = []
            for i, (q, routes) in enumerate(zip(qids, g.routes)):
                cs = [by_key[(q, tuple(r))]._asdict() for r in routes]
                failures += [c["answer"] is None for c in cs]
                for k in range(1, K + 1):
                    vote[i, k - 1] = float(cs[majority_vote(cs[:k])]["correct"]) if k <= len(cs) else vote[i, k - 2]
            out["vote"][space] = vote
            out["format_failures"][space] = float(np.mean(failures))
    return out


def analyse(cells: dict, args) -> dict[str, pd.DataFrame]:
    curves, diffs = [], []
    K = args.K
    for (model_label, task_name), pq in cells.items():
        n = len(pq["qids"])
        for space in args.spaces:
            collapsed = pq["format_failures"][space] > args.collapse_threshold
            series = {m: pq["oracle"][(space, m)] for m in args.methods}
            series["random vote"] = pq["vote"][space]
            for name, values in series.items():
                mean, lo, hi = curve(values, args.seed)
                curves.append(pd.DataFrame({"model": model_label, "task": task_name, "space": space, "series": name,
                                            "k": np.arange(1, K + 1), "value": mean, "lo": lo, "hi": hi, "n": n,
                                            "K": K, "D": pq["D"].mean(), "collapsed": collapsed,
                                            "format_failure_rate": pq["format_failures"][space]}))
            for method in args.methods:
                if method == "random":
                    continue
                d = pq["oracle"][(space, "random")][:, -1] - pq["oracle"][(space, method)][:, -1]
                lo, hi = bootstrap_ci(d, seed=args.seed)
                diffs.append({"model": model_label, "task": task_name, "space": space, "method": method, "n": n,
                              "K": K, "random_oracle": pq["oracle"][(space, "random")][:, -1].mean(),
                              "structured_oracle": pq["oracle"][(space, method)][:, -1].mean(),
                              "diff": d.mean(), "diff_lo": lo, "diff_hi": hi, "collapsed": collapsed,
                              "format_failure_rate": pq["format_failures"][space]})
    curves_df = pd.concat(curves, ignore_index=True)
    diffs_df = pd.DataFrame(diffs)
    counts = []
    for (space, method), g in diffs_df.groupby(["space", "method"]) if len(diffs_df) else []:
        clean = g[~g.collapsed]
        counts.append({"space": space, "method": method, "clean_cells": len(clean),
                       "random_better": int((clean["diff"] > 1e-12).sum()), "tie": int((clean["diff"].abs() <= 1e-12).sum()),
                       "structured_better": int((clean["diff"] < -1e-12).sum()), "collapsed_cells": int(g.collapsed.sum()),
                       "median_diff_clean": float(clean["diff"].median()) if len(clean) else float("nan")})
    return {"oracle_curves": curves_df, "random_minus_structured": diffs_df, "direction_counts": pd.DataFrame(counts),
            "table1": table1(cells, args)}


def table1_space(args) -> str:
    return TABLE1_SPACE if TABLE1_SPACE in args.spaces else args.spaces[0]


def table1(cells: dict, args) -> pd.DataFrame:
    """pp over the unmodified model per (model, task) and pooled over tasks, in the Dr.LLM space."""
    space = table1_space(args)
    K, vote_k, mcts_k = args.K, min(args.vote_k, args.K), min(args.mcts_k, args.K)
    rows = []
    for model_label in dict.fromkeys(m for m, _ in cells):
        per_task = {t: pq for (m, t), pq in cells.items() if m == model_label}
        values = {t: {"D": pq["D"], "router": pq["router"], "vote": pq["vote"][space][:, vote_k - 1],
                      "random": pq["oracle"][(space, "random")][:, -1],
                      "mcts": pq["oracle"][(space, "mcts")][:, mcts_k - 1] if "mcts" in args.methods else None}
                  for t, pq in per_task.items()}
        values["pool"] = {k: None if values[next(iter(per_task))][k] is None
                          else np.concatenate([values[t][k] for t in per_task]) for k in ("D", "router", "vote", "random", "mcts")}
        for t, v in values.items():
            D = v["D"]
            pp = lambda x: float("nan") if x is None else 100.0 * float(np.mean(x - D))  # noqa: E731
            rows.append({"model": model_label, "task": t, "space": space, "n": len(D), "D": float(D.mean()),
                         "learned_router_pp": pp(v["router"]), f"random_vote@{vote_k}_pp": pp(v["vote"]),
                         f"mcts_oracle@{mcts_k}_pp": pp(v["mcts"]), f"random_oracle@{K}_pp": pp(v["random"])})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- figures


def _save(fig: Figure, paths: list[Path]) -> None:
    FigureCanvasAgg(fig)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=150, bbox_inches="tight")


def plot_curves(curves: pd.DataFrame, space: str, paths: list[Path]) -> None:
    c = curves[curves.space == space]
    models, tasks = list(dict.fromkeys(c.model)), list(dict.fromkeys(c.task))
    fig = Figure(figsize=(4.2 * len(tasks), 3.4 * len(models)))
    axes = np.array(fig.subplots(len(models), len(tasks), squeeze=False))
    for i, m in enumerate(models):
        for j, t in enumerate(tasks):
            ax, cell = axes[i, j], c[(c.model == m) & (c.task == t)]
            for name, g in cell.groupby("series", sort=False):
                ls = "--" if name == "random vote" else "-"
                ax.plot(g.k, g.value, ls=ls, color=COLORS.get(name), label=name, lw=1.4, drawstyle="steps-post")
                ax.fill_between(g.k, g.lo, g.hi, color=COLORS.get(name), alpha=0.12, lw=0, step="post")
            ax.axhline(cell.D.iloc[0], color="black", lw=0.9, ls=":", label="deployed D")
            flag = f", format collapse ({cell.format_failure_rate.iloc[0]:.0%})" if cell.collapsed.iloc[0] else ""
            ax.set_title(f"{m} / {t} (n={cell.n.iloc[0]}){flag}", fontsize=9)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            if i == len(models) - 1:
                ax.set_xlabel("k (distinct routes)")
            if j == 0:
                ax.set_ylabel("share of questions with a correct route")
    axes[0, 0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Oracle o(k) over routes, action space '{space}' (K={int(c.K.max())}; 95% bootstrap bands)",
                 fontsize=10)
    _save(fig, paths)


def plot_diffs(diffs: pd.DataFrame, counts: pd.DataFrame, paths: list[Path]) -> None:
    spaces = list(dict.fromkeys(diffs.space))
    methods = list(dict.fromkeys(diffs.method))
    fig = Figure(figsize=(3.6 * len(spaces), 3.6))
    axes = fig.subplots(1, len(spaces), squeeze=False, sharey=True)[0]
    rng = np.random.default_rng(0)
    for ax, space in zip(axes, spaces):
        d = diffs[diffs.space == space]
        for x, method in enumerate(methods):
            g = d[d.method == method]
            xs = x + rng.uniform(-0.15, 0.15, len(g))
            for xi, row in zip(xs, g.itertuples()):
                ax.plot([xi], [100 * row.diff], marker="o", ms=6, color=COLORS.get(method),
                        mfc="none" if row.collapsed else COLORS.get(method), ls="none")
            c = counts[(counts.space == space) & (counts.method == method)].iloc[0]
            ax.text(x, 1.02, f"{c.random_better} / {c.tie} / {c.structured_better}", ha="center",
                    transform=ax.get_xaxis_transform(), fontsize=7)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(methods)), methods, fontsize=8)
        ax.set_title(f"{space}\n", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("O_random(K) - O_structured(K), pp")
    n = f"{diffs.n.min()}" if diffs.n.min() == diffs.n.max() else f"{diffs.n.min()}-{diffs.n.max()}"
    fig.suptitle(f"Random minus structured search, one dot per model x task cell (n={n} questions per cell, "
                 f"K={int(diffs.K.max())})\nabove each method: cells where random is better / tie / structured "
                 "is better (clean cells); hollow = format collapse", fontsize=8, y=1.08)
    _save(fig, paths)


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    if args.threads:
        torch.set_num_threads(args.threads)
    base = load_model(args.model)
    n_layers = base.cfg.n_layers
    cells = {}
    for label in args.models:
        model = base if label == "embedded" else prune_magnitude(base, args.prune_sparsity)
        router_cells = {}
        for task_name in args.tasks:
            router_cells[task_name], traces, cands = run_cell(model, label, task_name, args)
            cells[(label, task_name)] = per_question(traces, cands, args.K, n_layers)
        router = learned_router_outcomes(model, router_cells, args.fmt, seed=args.seed, batch_size=args.batch_size)
        moved = sum(route != tuple(range(n_layers)) for per_task in router.values() for route, _ in per_task.values())
        print(f"  {label}: the learned router leaves the full path on {moved} of "
              f"{sum(map(len, router.values()))} questions", flush=True)
        for task_name in args.tasks:
            pq = cells[(label, task_name)]
            pq["router"] = np.array([float(router[task_name][q][1]) for q in pq["qids"]])
        if model is not base:
            del model
    tables = analyse(cells, args)
    out_dir = args.out / f"summary-n{args.n}-K{args.K}-s{args.seed}"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        df.to_csv(out_dir / f"{name}.csv", index=False)
    tag = f"n{args.n}-K{args.K}"
    for space in args.spaces:
        plot_curves(tables["oracle_curves"], space,
                    [out_dir / f"routing_oracle_{space}.png", args.figures / f"routing_oracle_{space}_{tag}.png"])
    if len(tables["random_minus_structured"]):
        plot_diffs(tables["random_minus_structured"], tables["direction_counts"],
                   [out_dir / "routing_random_minus_structured.png",
                    args.figures / f"routing_random_minus_structured_{tag}.png"])

    print(f"\nRandom minus structured oracle at K={args.K} (clean cells; format-collapse threshold "
          f"{args.collapse_threshold:.0%} unextractable answers among random-route candidates):")
    print(tables["direction_counts"].to_string(index=False))
    print("\nTable 1 (pp over the unmodified model):")
    print(tables["table1"].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    print(f"\n[routing] {(time.time() - started) / 60:.1f} min wall time; tables and figures in {out_dir}, "
          f"figures also in {args.figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
