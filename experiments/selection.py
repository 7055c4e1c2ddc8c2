"""Answer-blind selection over route candidates and over temperature samples (the paper's Figure 3).

    python experiments/selection.py                                  # embedded model x ARC-E, ARC-C, PIQA; n=15, K=32
    python experiments/selection.py --models embedded pruned --n 30 --temperatures 0.4 0.8 1.2

Per question, two candidate sets of K answers, each with the greedy unmodified answer as the deployed one:
- routes: the full path and K-1 distinct random routes of one action space (`--space`), greedy under each;
- samples: K temperature samples of the unmodified model at each temperature of `--temperatures`.
Each answer-blind channel of `reach_lens.select` (majority vote, likelihood-weighted vote, highest mean
log-prob, lowest entropy, hidden-state medoid) picks one candidate without the gold answer; its recovery is
(selector - greedy) / (oracle - greedy), per cell (undefined where the oracle gains nothing). The sixth
channel, the learned router (route candidates only), predicts one route per question from the prompt's
representation; it is trained on the random routes found correct on the other questions of the same model
(pooled over tasks, 5-fold cross-fitting), and its greedy answer under that route is graded. Its route need
not be among the question's K candidates, so its recovery is not bounded by 1.

Outputs (run directory and --figures): recovery.csv and selection_recovery_*.png (Figure 3a: recovery per
channel, route candidates vs temperature samples at --T); temperature_gap.csv and selection_temperature_*.png
and selection_gap_vs_temperature_*.png (Figure 3b: oracle - majority vote across temperatures, per cell and
all cells in one figure).
"""
from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reach_lens import audit, plots  # noqa: E402
from reach_lens.models import load_model, prune_magnitude  # noqa: E402
from reach_lens.probes import question_seed  # noqa: E402
from reach_lens.protocol import Protocol  # noqa: E402
from reach_lens.records import make_record  # noqa: E402
from reach_lens.routing import (  # noqa: E402
    SPACES, RandomSearch, RouteEvaluator, RouterCell, graded, learned_router_outcomes, make_space, run_searches)
from reach_lens.select import SELECTORS, majority_vote, recovery, recovery_table  # noqa: E402
from reach_lens.store import RunStore  # noqa: E402
from reach_lens.tasks import get_task, subsample  # noqa: E402

MODELS = ("embedded", "pruned")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="base model name or path (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--models", nargs="+", default=["embedded"], choices=MODELS)
    p.add_argument("--prune-sparsity", type=float, default=0.5, help="MLP weight sparsity of the pruned copy")
    p.add_argument("--tasks", nargs="+", default=["arc_easy", "arc_challenge", "piqa"])
    p.add_argument("--source", default=None)
    p.add_argument("--split", default=None)
    p.add_argument("--n", type=int, default=15)
    p.add_argument("--K", type=int, default=32)
    p.add_argument("--space", default="skip_repeat", choices=list(SPACES), help="action space of the random routes")
    p.add_argument("--T", type=float, default=0.8, help="temperature of the samples in Figure 3a")
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.4, 0.8, 1.2])
    p.add_argument("--fmt", default="native", choices=("native", "shared"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--chunk", type=int, default=5, help="questions per stored chunk")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice; on a shared machine 1 avoids stalls)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "selection")
    p.add_argument("--figures", type=Path, default=ROOT / "figures")
    return p.parse_args(argv)


def route_records(ev: RouteEvaluator, questions, args) -> list[dict]:
    space = make_space(args.space, ev.model.cfg.n_layers)
    searches = [RandomSearch(space, args.K, question_seed(args.seed, f"{q.id}|{args.space}|random")) for q in questions]
    traces = run_searches(searches, ev.reward_fn(list(range(len(questions)))))
    records = []
    for i, (q, t) in enumerate(zip(questions, traces)):
        cands = [ev.candidate(i, r) for r in t.routes]
        records.append(make_record(q.id, q.gold, cands[0], cands, majority_vote(cands)))
    return records


def sample_records(ev: RouteEvaluator, questions, T: float, args) -> list[dict]:
    full = tuple(range(ev.model.cfg.n_layers))
    rows = [(i, full) for i in range(len(questions)) for _ in range(args.K)]
    seeds = [question_seed(args.seed, f"{q.id}|T{T:g}|{k}") for q in questions for k in range(args.K)]
    gens = ev.generator(ev.prompts, rows, temperature=T, seeds=seeds)
    records = []
    for i, q in enumerate(questions):
        cands = [graded(ev.task, q, g) for g in gens[i * args.K:(i + 1) * args.K]]
        records.append(make_record(q.id, q.gold, ev.candidate(i, full), cands, majority_vote(cands)))
    return records


ROUTER = "learned_router"
CHANNELS = [*SELECTORS, ROUTER]


def cell_stores(model, label: str, task_name: str, args):
    """The task, its questions and one store per probe of a cell, keyed by a label ("routes", "T<temperature>");
    what each store holds (probe, temperature) is read from its protocol, never from the label."""
    task = get_task(task_name)
    questions = subsample(task.load(args.source, args.split), args.n, args.seed)
    base = Protocol.of(study="selection", model=model, task=task, questions=questions, source=args.source,
                       split=args.split, seed=args.seed, fmt=args.fmt, probe="route", K=args.K,
                       settings={"space": args.space, "search": "random"})
    root = args.out / f"{label}-{task_name}-n{len(questions)}-K{args.K}-s{args.seed}"
    probes = {"routes": base}
    probes.update({f"T{T:g}": base.replace(probe="sample", temperature=T, settings={})
                   for T in sorted(set(args.temperatures) | {args.T})})
    return task, questions, {name: RunStore(root / name, protocol) for name, protocol in probes.items()}


def run_cell(model, label: str, task_name: str, args) -> tuple[dict[str, pd.DataFrame], dict[str, RunStore], tuple]:
    """Records of every probe of one cell (resuming from their stores), its stores, and (task, questions, route store)."""
    task, questions, stores = cell_stores(model, label, task_name, args)
    out = {}
    for name, store in stores.items():
        done = store.done("records") if (store.root / "records").exists() else set()
        todo = [q for q in questions if q.id not in done]
        for start in range(0, len(todo), args.chunk):
            part = todo[start:start + args.chunk]
            t0 = time.time()
            ev = RouteEvaluator(model, task, part, args.fmt, batch_size=args.batch_size)
            records = (route_records(ev, part, args) if store.protocol.probe == "route"
                       else sample_records(ev, part, store.protocol.temperature, args))
            store.append("records", records)
            print(f"  {label} {task_name} {name}: {start + len(part)}/{len(todo)} questions in {time.time() - t0:.0f} s",
                  flush=True)
        out[name] = store.read("records")
    return out, stores, (task, questions, stores["routes"])


def learned_router_rows(model, label: str, route_cells: dict[str, tuple], args) -> list[dict]:
    """Recovery of the cross-fitted learned router on the route probe of every task of one model.

    `route_cells[task] = (task, questions, route store, route records)`; the router trains on the other
    questions' route candidates, and its routes outside a question's candidates are generated once and kept
    in the route store's `router` table (a rerun generates nothing).
    """
    cells = {}
    for task_name, (task, questions, store, records) in route_cells.items():
        found = {qid: [(tuple(c["route"]), float(c["correct"])) for c in cands]
                 for qid, cands in zip(records.question_id, records.candidates)}
        cells[task_name] = RouterCell(task, questions, found, store)
    outcomes = learned_router_outcomes(model, cells, args.fmt, seed=args.seed, batch_size=args.batch_size)
    rows = []
    for task_name, (_, questions, _, records) in route_cells.items():
        acc = float(np.mean([outcomes[task_name][q.id][1] for q in questions]))
        greedy, oracle = float(records.d.mean()), float(records.o.mean())
        rows.append({"selector": ROUTER, "n": len(records), "K": int(records.K.iloc[0]), "greedy": greedy,
                     "oracle": oracle, "selector_acc": acc, "recovery": recovery(acc, greedy, oracle),
                     "model": label, "task": task_name, "probe": "routes"})
    moved = sum(route != tuple(range(model.cfg.n_layers)) for per_task in outcomes.values()
                for route, _ in per_task.values())
    print(f"  {label}: the learned router leaves the full path on {moved} of {sum(map(len, outcomes.values()))} "
          "questions", flush=True)
    return rows


def plot_recovery(rec: pd.DataFrame, T: float, paths: list[Path]) -> None:
    channels = CHANNELS
    fig = Figure(figsize=(9, 3.8))
    ax = fig.add_subplot()
    probes = [("routes", "route candidates", "tab:blue", -0.15), (f"T{T:g}", f"samples, T={T:g}", "tab:orange", 0.15)]
    for probe, label, color, dx in probes:
        r = rec[rec.probe == probe]
        for x, ch in enumerate(channels):
            vals = r[r.selector == ch].recovery.to_numpy(dtype=float)
            vals = vals[np.isfinite(vals)]
            ax.plot(np.full(len(vals), x + dx), vals, "o", color=color, alpha=0.6, ms=5,
                    label=label if x == 0 else None)
            if len(vals):
                ax.plot([x + dx - 0.1, x + dx + 0.1], [np.median(vals)] * 2, color=color, lw=2.5)
    ax.axhline(0, color="black", lw=0.8)
    ax.axhline(1, color="gray", lw=0.8, ls=":")
    ax.set_xticks(range(len(channels)), [textwrap.fill(c.replace("_", " "), 14) for c in channels], fontsize=8)
    ax.set_ylabel("recovery (selector - greedy) / (oracle - greedy)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    n = f"{rec.n.min()}" if rec.n.min() == rec.n.max() else f"{rec.n.min()}-{rec.n.max()}"
    ax.set_title(f"Answer-blind recovery per model x task cell (dots) and median (bars); n={n} per cell, "
                 f"K={rec.K.max()}\ncells with oracle = greedy have no recovery; the learned router picks routes only", fontsize=8)
    FigureCanvasAgg(fig)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=150, bbox_inches="tight")


def plot_gap(sweep: pd.DataFrame, paths: list[Path]) -> None:
    """Oracle - majority vote vs temperature, one line (with its paired-bootstrap band) per cell."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for (model, task), g in sweep.groupby(["model", "task"], sort=False):
        g = g.sort_values("T")
        line, = ax.plot(g["T"], g.selection_gap, marker="o", ms=4, label=f"{model} / {task} (n={g.n.iloc[0]})")
        ax.fill_between(g["T"], g.selection_gap_lo, g.selection_gap_hi, color=line.get_color(), alpha=0.12, lw=0)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("sampling temperature T")
    ax.set_ylabel("O_K - majority vote@K (share of questions)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"Selection gap of temperature samples, K={sweep.K.max()} (95% paired bootstrap bands)", fontsize=9)
    FigureCanvasAgg(fig)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=150, bbox_inches="tight")


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    if args.threads:
        torch.set_num_threads(args.threads)
    base = load_model(args.model)
    recoveries, sweeps = [], []
    out_dir = args.out / f"summary-n{args.n}-K{args.K}-s{args.seed}"
    tag = f"n{args.n}-K{args.K}"
    for label in args.models:
        model = base if label == "embedded" else prune_magnitude(base, args.prune_sparsity)
        route_cells = {}
        for task_name in args.tasks:
            tables, stores, (task, questions, route_store) = run_cell(model, label, task_name, args)
            route_cells[task_name] = (task, questions, route_store, tables["routes"])
            for probe, records in tables.items():
                rec = recovery_table(records, SELECTORS)
                recoveries.append(rec.assign(model=label, task=task_name, probe=probe))
            sweep = pd.DataFrame([{"T": stores[p].protocol.temperature, **audit.summarize(r, seed=args.seed)}
                                  for p, r in tables.items() if stores[p].protocol.probe == "sample"])
            sweeps.append(sweep.assign(model=label, task=task_name))
            name = f"selection_temperature_{label}_{task_name}_{tag}.png"
            for path in (out_dir / name, args.figures / name):
                plots.plot_temperature_gap(sweep, path, title=f"Oracle - majority vote vs T, {label} / {task_name}")
        recoveries.append(pd.DataFrame(learned_router_rows(model, label, route_cells, args)))
    recovery = pd.concat(recoveries, ignore_index=True)
    sweep = pd.concat(sweeps, ignore_index=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    recovery.to_csv(out_dir / "recovery.csv", index=False)
    sweep.to_csv(out_dir / "temperature_gap.csv", index=False)
    plot_recovery(recovery, args.T, [out_dir / "selection_recovery.png", args.figures / f"selection_recovery_{tag}.png"])
    plot_gap(sweep, [out_dir / "selection_gap_vs_temperature.png", args.figures / f"selection_gap_vs_temperature_{tag}.png"])

    main_probes = recovery[recovery.probe.isin(["routes", f"T{args.T:g}"])]
    summary = (main_probes.groupby(["probe", "selector"]).recovery
               .agg(median="median", cells_defined="count").reset_index())
    print(f"\nRecovery at K={args.K} (median over cells where oracle > greedy):")
    print(summary.to_string(index=False, float_format=lambda v: f"{v:+.2f}"))
    print("\nOracle - majority vote across temperatures (share of questions):")
    print(sweep[["model", "task", "T", "n", "D", "vote", "O", "selection_gap"]]
          .to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"\n[selection] {(time.time() - started) / 60:.1f} min wall time; tables and figures in {out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
