"""Answer-blind selection over route candidates and over temperature samples (the paper's Figure 3).

    python experiments/selection.py                                  # embedded model x SQuAD, ARC-Easy; n=50, K=32
    python experiments/selection.py --models embedded pruned --n 30 --temperatures 0.4 0.8 1.2

Per question, two candidate sets of K answers, with the greedy answer (`probes.deploy`) as the deployed one, both
in one prompt format (`--fmt auto`: each task's own, zero-shot for short-answer tasks, whose few-shot block every
route would recompute):
- routes: the full path and K-1 distinct random routes of `--space` (`--random-routes`: geometric walks from
  the full path, or uniform over the space; the routing study's random search), greedy under each;
- samples: K temperature samples (`probes.sample`, study seed: the sampling-gap study's samples) at each T.
Each answer-blind channel of `reach_lens.select` (majority vote, likelihood-weighted vote, highest mean
log-prob, lowest entropy, hidden-state medoid) picks one candidate without the gold answer; its recovery is
(selector - greedy) / (oracle - greedy) per cell (undefined where the oracle gains nothing). The sixth channel,
the learned router (routes only), predicts one route per question from its prompt, trained on the random
routes found correct on other questions of the same model (pooled over tasks, 5-fold cross-fitting); its route
need not be a candidate, so its recovery is not bounded by 1. A cell (model, task, probe) whose candidates fail
answer extraction more often than --collapse-threshold is format collapse: drawn hollow, left out of medians.

Outputs (a summary-<hash>/ directory of --out, named by the protocols it reads, and --figures): recovery.csv,
recovery_medians.csv, selection_recovery_*.png (Figure 3a, routes vs samples at --T); temperature_gap.csv,
selection_temperature_*.png, selection_gap_vs_temperature_*.png (Figure 3b: oracle - vote across T).
"""
from __future__ import annotations

import argparse
import time

import pandas as pd

from reach_lens import audit, cli, logs, plots, probes, stats
from reach_lens.generate import engine_for
from reach_lens.models import prune_magnitude
from reach_lens.protocol import Protocol
from reach_lens.report import write_report
from reach_lens.routing import (ROUTE_LAWS, SPACES, LearnedRouter, RouterCell, analysis, known_candidates,
                                random_route_candidates)
from reach_lens.runs import publish, summary_dir
from reach_lens.select import SELECTORS
from reach_lens.store import RunStore

SAY = logs.say("selection")
MODELS, TASKS = ("embedded", "pruned"), ("squad", "arc_easy")  # free-form beside multiple choice (and its floor)


def parse_args(argv=None) -> argparse.Namespace:
    parents = [cli.common(out="runs/selection", batch_size=32), cli.data(n=50, chunk=5, tasks=TASKS)]
    p = argparse.ArgumentParser(parents=parents, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["embedded"], choices=MODELS,
                   help="'embedded': the --model itself; 'pruned': its magnitude-pruned copy")
    p.add_argument("--prune-sparsity", type=cli.share, default=0.5, help="MLP weight sparsity of the pruned copy")
    p.add_argument("--K", type=cli.positive_int, default=32, help="candidates per question and probe (default 32)")
    p.add_argument("--space", default="skip_repeat", choices=list(SPACES), help="action space of the random routes")
    p.add_argument("--random-routes", default="geometric", choices=ROUTE_LAWS,
                   help="law of the random routes: geometric walks from the full path, or uniform")
    p.add_argument("--T", type=cli.positive_float, default=0.8, help="temperature of the samples in Figure 3a")
    p.add_argument("--temperatures", type=cli.positive_float, nargs="+", default=[0.4, 0.8, 1.2],
                   help="temperatures of Figure 3b (the main --T is always included; default 0.4 0.8 1.2)")
    p.add_argument("--collapse-threshold", type=cli.share, default=0.5,
                   help="share of unextractable answers among a cell's candidates that makes it 'format collapse'")
    return p.parse_args(argv)


def temperatures(args) -> list[float]:
    return sorted({*args.temperatures, args.T})  # the main T is always among them


def run_cell(model, label: str, task, qs, args, loop) -> tuple[list[Protocol], RunStore, dict[str, pd.DataFrame]]:
    """The protocols, the route store and the records of every probe of one (model, task) cell (resumed)."""
    fmt = task.resolve_format(args.fmt, engine_for(model).tokenizer, zero_shot=True)  # routes and samples: one prompt
    deploy = Protocol.of(study="selection", facts=engine_for(model).describe(), task=task, questions=qs,
                         source=args.source, split=args.split, seed=args.seed, fmt=fmt, probe="deploy")
    routes = deploy.replace(probe="route", K=args.K, settings={"space": args.space, "search": "random",
                                                               "random_routes": args.random_routes})
    samples = {T: deploy.replace(probe="sample", K=args.K, temperature=T) for T in temperatures(args)}
    root = args.out / f"{deploy.model}-{task.name}-n{len(qs)}{cli.skip_tag(args)}-K{args.K}-s{args.seed}"  # a pruned copy's name says so
    bs, cell = args.batch_size, f"{label} {task.name}"
    deployed = loop.deployed(model, task, qs, fmt, RunStore(root / "deployed", deploy), desc=f"{cell} deployed")
    store = RunStore(root / f"routes-{args.space}-{args.random_routes}", routes)
    tables = {"routes": loop.records(store, qs, deployed, lambda part: random_route_candidates(
        model, task, part, fmt, args.space, args.K, args.seed, args.random_routes, bs), desc=f"{cell} routes")}
    for T, p in samples.items():
        tables[f"T{T:g}"] = loop.records(RunStore(root / f"T{T:g}", p), qs, deployed, lambda part, T=T: probes.sample(
            model, task, part, fmt, K=args.K, temperature=T, seed=args.seed, batch_size=bs, keep_hidden=True),
            desc=f"{cell} samples at T={T:g}")
    return [deploy, routes, *samples.values()], store, tables


def main(argv=None) -> int:
    args = parse_args(argv)
    loop, started = cli.setup(args), time.time()
    tasks, questions = cli.question_sets(args)
    base = cli.load(args)
    recoveries, sweeps, protocols = [], [], []
    for label in args.models:
        model = base if label == "embedded" else prune_magnitude(base, args.prune_sparsity)
        runs = {t: run_cell(model, label, task, questions[t], args, loop) for t, task in tasks.items()}
        router = LearnedRouter(model, {t: RouterCell(tasks[t], questions[t], analysis.found_in(r["routes"]),
                                                     known_candidates(r["routes"].candidates, r["routes"].question_id),
                                                     ps[0].fmt)
                                       for t, (ps, _, r) in runs.items()}, args.seed, args.batch_size)
        for t, (cell_protocols, store, tables) in runs.items():
            routed = loop.resume(store, "router", questions[t], lambda part, t=t, router=router: router.rows(t, part),
                                 desc=f"{label} {t} learned router")
            recoveries.append(analysis.cell_recovery(tables, routed, SELECTORS, args.collapse_threshold)
                              .assign(model=label, task=t))
            sweep = audit.temperature_sweep({T: tables[f"T{T:g}"] for T in temperatures(args)}, seed=args.seed)
            options = audit.options_per_question(questions[t])  # None for free-form: no guessing floor
            sweeps.append(sweep.assign(model=label, task=t, guess_D=stats.guessing_floor(options, 1),
                                       guess_O=stats.guessing_floor(options, args.K)))
            protocols += cell_protocols
    recovery, sweep = pd.concat(recoveries, ignore_index=True), pd.concat(sweeps, ignore_index=True)
    medians = analysis.recovery_summary(recovery[recovery.probe.isin(["routes", f"T{args.T:g}"])])

    name = protocols[0].model  # in run directories and figure names: two models' runs never share one
    out, tag = summary_dir(args.out, protocols), f"{name}-n{args.n}{cli.skip_tag(args)}-K{args.K}"
    for file, df in (("recovery", recovery), ("recovery_medians", medians), ("temperature_gap", sweep)):
        df.to_csv(out / f"{file}.csv", index=False)
    figures = {out / f"selection_temperature_{m}_{t}_{tag}.png": plots.plot_temperature_gap(
        g, title=f"Oracle - majority vote vs T, {name}{'' if m == 'embedded' else f' ({m})'} / {t}")
        for (m, t), g in sweep.groupby(["model", "task"], sort=False)}
    figures[out / f"selection_recovery_{tag}-T{args.T:g}.png"] = plots.plot_recovery(
        recovery, [("routes", f"routes ({args.space}, {args.random_routes})"),
                   (f"T{args.T:g}", f"samples, T={args.T:g}")], title=f"Answer-blind recovery, {name}")
    figures[out / f"selection_gap_vs_temperature_{tag}.png"] = plots.plot_selection_gap(
        sweep, title=f"Selection gap of temperature samples, {name}")
    publish(args.figures, figures)

    print(f"recovery at K={args.K}, median over clean cells where oracle > greedy:\n"
          + medians.to_string(index=False, float_format=lambda v: f"{v:+.2f}"), flush=True)
    print("oracle - majority vote across temperatures (share of questions):\n" + sweep[["model", "task", "T", "n",
          "D", "vote", "O", "selection_gap"]].to_string(index=False, float_format=lambda v: f"{v:.3f}"), flush=True)
    SAY(f"{(time.time() - started) / 60:.1f} min wall time; tables and figures in {out}, also in {args.figures}")
    SAY(f"report: {write_report(out)}")
    return 0


if __name__ == "__main__":
    cli.run(main)
