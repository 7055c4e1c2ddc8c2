"""The sampling gap: deployed (greedy) vs majority vote@K vs oracle@K, per model x task cell (the paper's Table 2
and Figure 3b).

    python experiments/sampling_gap.py                     # embedded model x SQuAD, TriviaQA, ARC-Easy, arithmetic
    python experiments/sampling_gap.py --tasks gsm8k --source path/to/gsm8k/test.jsonl --n 50
    python experiments/sampling_gap.py --models Qwen/Qwen2.5-0.5B-Instruct /path/to/ckpt --tasks arc_challenge
    python experiments/sampling_gap.py --tasks arc_easy --temperatures 0.2 0.5 0.8 1.1 --K 16

Each cell's runs (resumable) live in <out>/<model>-<task>-n<n>-K<K>-s<seed>/ (deployed/, T<T>/), with its table at
--T, the sweep over --temperatures and the reach curve in a summary-T<T>-<hash>/ directory named by the protocols
they come from. Table 2 (table2.csv: every cell's D, vote@K, O_K and gaps with 95% intervals, and for multiple
choice the uniform guesser's 1/m and 1 - (1 - 1/m)^K, which an O_K must be read against), gap_curves.csv (every
cell's O_k - D for k = 1..K with a paired bootstrap band) and their figures (named by the models, n, K, seed,
engine and T, so that runs of other models do not overwrite them) go to <out>/summary-table2-<hash>/ and
--figures. The oracle uses the gold answer after generation: a diagnostic of what is reachable, never a deployable
selector. Samples come from `probes.sample` with the study seed, so every study draws the same samples of a
question at a given T.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import pandas as pd

from reach_lens import audit, cli, logs, plots, probes, stats
from reach_lens.generate import engine_for
from reach_lens.protocol import Protocol
from reach_lens.report import write_report
from reach_lens.runs import publish, summary_dir
from reach_lens.store import RunStore


SAY = logs.say("sampling_gap")
DEFAULT_TASKS = ("squad", "trivia_qa", "arc_easy", "basic_arithmetic")  # free-form cells beside the MC one


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(parents=[cli.common(out="runs/sampling_gap"), cli.engines(),
                                         cli.data(n=150, chunk=10, tasks=list(DEFAULT_TASKS))],
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=[None], metavar="MODEL",
                   help="model names or paths, one Table 2 row per model x task (default: the embedded model)")
    p.add_argument("--K", type=cli.positive_int, default=8, help="samples per question")
    p.add_argument("--T", type=cli.positive_float, default=0.8, help="temperature of the main table")
    p.add_argument("--temperatures", type=cli.positive_float, nargs="+", default=[0.4, 0.8, 1.2],
                   help="temperatures of the sweep figure (the main T is always included)")
    return p.parse_args(argv)


def engine_suffix(protocols: Sequence[Protocol]) -> str:
    """"-vllm" (etc.) for protocols run on a hook-free engine ("vllm (...)"); "" for the TransformerLens engine."""
    engines = sorted({p.engine.split()[0] for p in protocols} - {"transformer_lens"})
    return "".join(f"-{e}" for e in engines)


def run_cell(model, task, questions, args, loop) -> tuple[dict, pd.DataFrame, list[Protocol]]:
    """One model x task cell: resumable greedy and sampled runs, its own summary, its Table 2 row and its gap
    curve O_k - D over k. ``model`` is a HookedTransformer or a hook-free engine (``--engine``)."""
    fmt = task.resolve_format(args.fmt, engine_for(model).tokenizer)
    deploy = Protocol.of(study="sampling_gap", facts=engine_for(model).describe(), task=task, questions=questions,
                         source=args.source, split=args.split, seed=args.seed, fmt=fmt, probe="deploy")
    name = deploy.model
    sample = {T: deploy.replace(probe="sample", K=args.K, temperature=T) for T in sorted({*args.temperatures, args.T})}
    tag = f"{name}-{task.name}-n{len(questions)}{cli.skip_tag(args)}-K{args.K}-s{args.seed}{engine_suffix([deploy])}"
    run = args.out / tag
    deployed = loop.deployed(model, task, questions, fmt, RunStore(run / "deployed", deploy),
                             desc=f"greedy deployment ({task.name})")
    records = {T: loop.records(RunStore(run / f"T{T:g}", p), questions, deployed, lambda part, T=T: probes.sample(
        model, task, part, fmt, K=args.K, temperature=T, seed=args.seed, batch_size=args.batch_size),
        desc=f"sampling {task.name}, K={args.K}, T={T:g}") for T, p in sample.items()}
    options = audit.options_per_question(questions)  # None for free-form answers: no guessing floor
    sweep = audit.temperature_sweep(records, seed=args.seed).assign(
        guess_D=stats.guessing_floor(options, 1), guess_O=stats.guessing_floor(options, args.K))
    r = sweep[sweep["T"] == args.T].iloc[0]
    row = {"model": name, "task": task.name, "fmt": fmt, "T": args.T, **audit.gap_table_row(r),
           "guess_deployed": r.guess_D, "guess_oracle": r.guess_O}
    curve = audit.reach_curve(records[args.T], seed=args.seed)
    curve["guess"] = stats.guessing_floor(options, curve["k"])
    gap = audit.gap_curve(records[args.T], seed=args.seed).assign(
        cell=f"{task.name} ({name})", guess_gap=curve["guess"] - r.D)
    out = summary_dir(run, [deploy, *sample.values()], name=f"summary-T{args.T:g}")
    for file, df in (("table", pd.DataFrame([row])), ("temperature_sweep", sweep), ("reach_curve", curve),
                     ("gap_curve", gap)):
        df.to_csv(out / f"{file}.csv", index=False)
    publish(args.figures, {
        out / f"sampling_gap_reach_{tag}-T{args.T:g}.png": plots.plot_reach_curve(
            curve, title=f"reach@k, {name} on {task.name}, T={args.T:g}", deployed=r.D, vote=r.vote),
        out / f"sampling_gap_temperature_{tag}.png": plots.plot_temperature_gap(
            sweep, title=f"Selection gap vs T, {name} on {task.name}")})
    SAY(f"{name} x {task.name}: tables in {out}")
    return row, gap, [deploy, *sample.values()]


def main(argv=None) -> int:
    args = parse_args(argv)
    loop, started = cli.setup(args), time.time()
    tasks, question_sets = cli.question_sets(args)
    rows, gaps, protocols = [], [], []
    for model_name in args.models:
        model = cli.load_engine(args, model_name)
        for name, task in tasks.items():
            row, gap, used = run_cell(model, task, question_sets[name], args, loop)
            rows.append(row)
            gaps.append(gap)
            protocols += used
        engine_for(model).close()
        del model
    table = pd.DataFrame(rows)
    out = summary_dir(args.out, protocols, name="summary-table2")
    gaps = pd.concat(gaps, ignore_index=True)
    table.to_csv(out / "table2.csv", index=False)
    gaps.to_csv(out / "gap_curves.csv", index=False)
    # the models and engine in the name: a run of other models beside this one's figures must not overwrite them
    tag = "+".join(dict.fromkeys(table["model"])) + f"-n{args.n}{cli.skip_tag(args)}-K{args.K}-s{args.seed}{engine_suffix(protocols)}" \
        f"-T{args.T:g}"
    publish(args.figures, {
        out / f"sampling_gap_table2_{tag}.png": plots.plot_gap_table(table),
        out / f"sampling_gap_over_k_{tag}.png": plots.plot_gap_curves(gaps, title=f"O_k - D over k, T = {args.T:g}")})

    print(f"Table 2: n={args.n} per cell, K={args.K}, T={args.T:g} (95% Wilson intervals; gaps: paired bootstrap; "
          "guess: a uniform guesser over the options)")
    print("| model | task | deployed D | vote@K | oracle@K | gap O-D | gap O-vote | guess O_K | format failures |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for _, r in table.iterrows():
        cells = [f"{r[k]:{f}} [{r[k + '_lo']:{f}}, {r[k + '_hi']:{f}}]" for k, f in
                 (("deployed", ".1%"), ("vote", ".1%"), ("oracle", ".1%"), ("gap", "+.1%"), ("selection_gap", "+.1%"))]
        guess = f"{r.guess_oracle:.1%}" if pd.notna(r.get("guess_oracle")) else "n/a (free-form)"
        print(" | ".join(["", r.model, r.task, *cells, guess, f"{r.format_failure_rate:.1%}", ""]).strip(), flush=True)
    SAY(f"{(time.time() - started) / 60:.1f} min; Table 2 in {out}, figures also in {args.figures}")
    SAY(f"report: {write_report(out)}")
    return 0


if __name__ == "__main__":
    cli.run(main)
