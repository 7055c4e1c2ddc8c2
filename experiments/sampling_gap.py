"""The sampling gap: deployed (greedy) vs majority vote@K vs oracle@K (the paper's Table 2 and Figure 3b).

    python experiments/sampling_gap.py                                    # embedded model, ARC-Easy, n=100, K=8
    python experiments/sampling_gap.py --task gsm8k --source ../shared/data/gsm8k/test.jsonl --n 50
    python experiments/sampling_gap.py --temperatures 0.2 0.5 0.8 1.1 --K 16

The oracle uses the gold answer after generation: a diagnostic of what is reachable, never a deployable
selector. Samples come from `probes.sample` with the study seed, so every study draws the same samples of a
question at a given T. Runs (resumable) live in <out>/<model>-<task>-n<n>-K<K>-s<seed>/ (deployed/, T<T>/);
the table (table.csv, at --T), the sweep over --temperatures (temperature_sweep.csv) and the reach curve
(reach_curve.csv) go to a summary-T<T>-<hash>/ directory there, named by the protocols they come from, with
the figures, which are also copied to --figures.
"""
from __future__ import annotations

import argparse
import time

import pandas as pd

from reach_lens import audit, cli, plots, probes
from reach_lens.protocol import Protocol
from reach_lens.records import make_record
from reach_lens.select import majority_vote
from reach_lens.store import RunStore
from reach_lens.tasks import get_task


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(parents=[cli.common(out="runs/sampling_gap"), cli.data(n=100, chunk=10, task="arc_easy")],
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--K", type=cli.positive_int, default=8, help="samples per question")
    p.add_argument("--T", type=cli.positive_float, default=0.8, help="temperature of the main table")
    p.add_argument("--temperatures", type=cli.positive_float, nargs="+", default=[0.4, 0.8, 1.2],
                   help="temperatures of the sweep figure (the main T is always included)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cli.setup(args)
    say, started = cli.say("sampling_gap"), time.time()
    task = get_task(args.task)
    questions = cli.questions(task, args.source, args.split, args.n, args.seed)
    model = cli.load(args)
    name = model.cfg.model_name
    deploy = Protocol.of(study="sampling_gap", model=model, task=task, questions=questions, source=args.source,
                         split=args.split, seed=args.seed, fmt=args.fmt, probe="deploy")
    sample = {T: deploy.replace(probe="sample", K=args.K, temperature=T) for T in sorted({*args.temperatures, args.T})}
    run = args.out / f"{name}-{args.task}-n{len(questions)}-K{args.K}-s{args.seed}"

    def deployed_rows(part):
        return [{"question_id": q.id, **c} for q, c in zip(part, probes.deploy(model, task, part, args.fmt,
                                                                                batch_size=args.batch_size))]

    deployed = cli.resume(RunStore(run / "deployed", deploy), "deployed", questions, args.chunk, deployed_rows,
                          desc="greedy deployment").set_index("question_id")

    def records_at(T, part):
        cands = probes.sample(model, task, part, args.fmt, K=args.K, temperature=T, seed=args.seed,
                              batch_size=args.batch_size)
        return [make_record(q.id, q.gold, deployed.loc[q.id].to_dict(), cs, majority_vote(cs))
                for q, cs in zip(part, cands)]

    records = {T: cli.resume(RunStore(run / f"T{T:g}", p), "records", questions, args.chunk,
                             lambda part, T=T: records_at(T, part), desc=f"sampling K={args.K} at T={T:g}")
               for T, p in sample.items()}
    sweep = audit.temperature_sweep(records, seed=args.seed)
    r = sweep[sweep["T"] == args.T].iloc[0]
    table = pd.DataFrame([{"model": name, "task": args.task, "T": args.T, **audit.gap_table_row(r)}])
    curve = audit.reach_curve(records[args.T], seed=args.seed)

    out = cli.summary_dir(run, [deploy, *sample.values()], name=f"summary-T{args.T:g}")
    for file, df in (("table", table), ("temperature_sweep", sweep), ("reach_curve", curve)):
        df.to_csv(out / f"{file}.csv", index=False)
    tag = f"{name}-{args.task}-n{len(questions)}-K{args.K}-s{args.seed}"
    cli.publish(args.figures,
                plots.plot_reach_curve(curve, out / f"sampling_gap_reach_{tag}-T{args.T:g}.png",
                                       title=f"reach@k, {name} on {args.task}, T={args.T:g}", deployed=r.D, vote=r.vote),
                plots.plot_temperature_gap(sweep, out / f"sampling_gap_temperature_{tag}.png",
                                           title=f"Selection gap vs T, {name} on {args.task}"))

    say(f"{name} on {args.task}, n={int(r.n)}, K={int(r.K)}, T={args.T:g} (95% Wilson intervals; gaps: paired bootstrap)")
    print("| deployed D | vote@K | oracle@K | gap O-D | gap O-vote | format failures |\n|---|---|---|---|---|---|")
    print(" | ".join(["", *(f"{r[k]:{f}} [{r[k + '_lo']:{f}}, {r[k + '_hi']:{f}}]" for k, f in
                           (("D", ".1%"), ("vote", ".1%"), ("O", ".1%"), ("gap", "+.1%"), ("selection_gap", "+.1%"))),
                     f"{r.format_failure_rate:.1%}", ""]).strip())
    say("temperature sweep (oracle - vote): "
        + ", ".join(f"T={t:g}: {g:+.1%}" for t, g in zip(sweep["T"], sweep.selection_gap)))
    say(f"{(time.time() - started) / 60:.1f} min; tables and figures in {out}, figures also in {args.figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
