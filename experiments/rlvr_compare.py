"""The RLVR checkpoint study (the paper's Tables 5-8, Figures 6-7): base vs trained checkpoints, question by
question, under one protocol.

    python experiments/rlvr_compare.py                    # embedded base vs its GRPO and SFT checkpoints (trained
                                                          # first when missing), SQuAD audit split, n=300, K=16
    python experiments/rlvr_compare.py --task arc_easy    # the multiple-choice cell (its oracles beside the floor)
    python experiments/rlvr_compare.py --model /path/to/base --checkpoints rl=/path/to/rl sft=adapter/ \
        --task jsonl:my_benchmark.jsonl --n all --K 64 --top-p 0.95 --max-new-tokens 512 --control-fmt none

Checkpoints are anything --model takes: Hugging Face directories or names, .gguf files, PEFT adapter directories
(merged onto their base). Every checkpoint answers the same questions with a greedy answer and 2K samples at T
(and --top-p) in the main format, and a greedy answer in the control format (unless --control-fmt none). The
questions are the audit side of the salted id-hash split when a checkpoint carries reach_lens training metadata
(a checkpoint whose training ids include any of them is refused), else every question of the task: the run says
which. Protocols must match in everything but the checkpoint (model, weights): a difference (K, T, top-p, budget,
format, grader, question set, ...) is refused, naming the field. The first K of the 2K samples are exactly the
K-sample probe (samples are seeded per question and index), so Table 6's K and 2K come from one set of samples.

Outputs (resumable runs under <out>/<task>-n<n>-K<K>-T<T>-s<seed>/<checkpoint>/: <fmt>/deployed, <fmt>/T<T> and
<control fmt>/deployed; tables in its summary-<hash>/ directory, figures there and in --figures):
  table5.csv (n, K, base D/O, trained D/O with Wilson 95%, delta n_reachable with a paired bootstrap interval),
  fates.csv (Figure 6a; gains from base-reachable questions against two nulls: independence, and resampling with
  the base's hit rate over its 2K samples), table6_budget.csv, table7_lineage.csv, table8_format_transfer.csv,
  propensity.csv (Figure 7, at K and at 2K), reach_curves.csv (reach@k, k = 1..2K, per checkpoint), crossover.csv
  (per trained checkpoint: the k where the base's reach@k overtakes, or the smallest gap), reach_difference.csv
  (base − trained reach@k, k = 1..2K, with a pointwise paired bootstrap band), narrowing.csv (per trained
  checkpoint: its lead at its peak minus at k = 2K, with an interval that picks the peak again in every resample;
  "narrows" only where it excludes 0; every reach@k from all 2K samples), questions.csv (per
  question and checkpoint: base and trained D, hits/K, O at K and over 2K, fate), summary.md; figures
  rlvr_fates_*, rlvr_changes_*, rlvr_propensity_*, rlvr_lineage_*, rlvr_reach_curves_*.
With a multiple-choice task every oracle is printed beside the uniform guesser's floor 1 - (1 - 1/m)^K.
"""
from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from reach_lens import audit, cli, logs, plots
from reach_lens.errors import UserError
from reach_lens.generate import Engine, TransformerLensEngine
from reach_lens.models import checkpoint_tokenizer
from reach_lens.rlvr import tables
from reach_lens.rlvr.audit_run import (audit_checkpoint, audit_protocols, audit_questions, check_comparable,
                                       check_training_ids, control_format)
from reach_lens.rlvr.fates import hit_rate_bins
from reach_lens.rlvr.report import report
from reach_lens.report import write_report
from reach_lens.runs import publish, summary_dir
from reach_lens.tasks import subsample

LOG = logs.logger("rlvr_compare")
SAY = LOG.info
BASE = "base"
PAPER = "paper Table 5 (n=300, K=200, T=0.8): DAPO-32B D 55.0 -> 69.7, O 96.0 -> 82.7, 40 fewer reachable questions"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(parents=[cli.common(out="runs/rlvr_compare", batch_size=32), cli.engines(),
                                         cli.data(n=300, chunk=25, task="squad", n_all=True)],
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--K", type=cli.positive_int, default=16,
                   help="main candidate budget (Table 5, fates, propensity); 2K samples are drawn for Table 6")
    p.add_argument("--T", type=cli.positive_float, default=0.8, help="sampling temperature")
    p.add_argument("--top-p", type=cli.top_p, default=1.0, help="nucleus of the samples (default 1: all tokens)")
    p.add_argument("--max-new-tokens", type=cli.positive_int, default=None,
                   help="generation budget of every answer (default: the task's)")
    p.add_argument("--checkpoints", type=cli.labelled_model, nargs="+", default=None, metavar="[LABEL=]MODEL",
                   help="trained checkpoints, anything --model takes (a Hugging Face directory or name, a .gguf, a "
                        "PEFT adapter directory); default: the default GRPO and SFT recipes, trained when missing")
    p.add_argument("--no-train", action="store_true", help="refuse to train missing default checkpoints")
    p.add_argument("--control-fmt", default=None, choices=("native", "shared", "fewshot", "none"),
                   help="format of the format-transfer table (Table 8), or none (no control run, no Table 8); "
                        "default: another plain-text format than the main one (shared after native; fewshot, where "
                        "the task has it, after shared; else native)")
    p.add_argument("--salt", default="rlvr", help="salt of the train/audit id-hash split (checkpoints reach_lens "
                                                  "trained; others are audited on every question)")
    p.add_argument("--audit-share", type=cli.share, default=0.6, help="share of question ids on the audit side")
    p.add_argument("--bins", type=float, nargs="+", default=None,
                   help="propensity bins as hit-rate edges from 0 to 1 (bins: exactly 0, then (lo, hi]; a bin no "
                        "c/K reaches is merged into the next), e.g. the paper's 0 0.05 0.15 0.35 1; default: hit "
                        "counts doubling from one hit of K (0, 1, 2-3, 4-7, ... of K)")
    args = p.parse_args(argv)
    try:
        if args.bins is not None:
            hit_rate_bins(args.K, args.bins)
    except ValueError as e:
        p.error(f"--bins: {e}")
    if args.checkpoints is not None and len({label for label, _ in args.checkpoints}) != len(args.checkpoints):
        p.error("--checkpoints: labels must be distinct")
    return args


def audit_checkpoints(args, loop, task, questions, settings, checkpoints: dict[str, Path | None], run_root: Path):
    """Records in the main format (greedy + 2K samples) and greedy answers in the control format (None without one),
    per checkpoint; every checkpoint's protocols are checked against the base's before it generates anything."""
    records, control, protocols = {}, {}, {}
    for label, path in checkpoints.items():
        model = cli.load_engine(args, None if path is None else str(path))
        # a private engine, dropped with the model: engine_for's cache would keep every checkpoint in memory
        engine = model if isinstance(model, Engine) else TransformerLensEngine(model)
        protocols[label] = audit_protocols(engine, task, questions, args.fmt, args.control_fmt, 2 * args.K, args.T,
                                           args.seed, settings, source=args.source, split=args.split,
                                           top_p=args.top_p, max_new_tokens=args.max_new_tokens)
        for run in protocols[label]:
            check_comparable({checkpoint: ps[run] for checkpoint, ps in protocols.items()})
        name = protocols[label]["sampled"].model
        SAY(f"{label}: {name} ({protocols[label]['sampled'].weights}, {protocols[label]['sampled'].engine} engine)")
        records[label], control[label] = audit_checkpoint(loop, engine, task, questions, protocols[label],
                                                          run_root / name, label)
        engine.close()
        del model, engine
        gc.collect()
    return records, control if args.control_fmt else None, [p for ps in protocols.values() for p in ps.values()]


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    loop = cli.setup(args)
    (task,) = cli.tasks(args).values()
    # the recipes' and the protocols' format; auto is zero-shot where a task's default is few-shot (training pays
    # the prompt for every completion)
    args.fmt = task.resolve_format(args.fmt, checkpoint_tokenizer(args.model), zero_shot=True)
    args.control_fmt = {"none": None, None: control_format(args.fmt, task)}.get(args.control_fmt, args.control_fmt)
    if args.control_fmt == args.fmt:
        raise UserError(f"--control-fmt {args.control_fmt!r} is the main format of {task.name}: the "
                        "format-transfer table needs another format (or none)")
    if args.control_fmt is not None:
        task.check_format(args.control_fmt)
    loaded = cli.load_source(task, args.source, args.split)
    from reach_lens.rlvr.train import default_checkpoints

    if not args.checkpoints and ":" in args.task:
        raise UserError(f"--task {args.task}: the default checkpoints are trained on a registered task; audit "
                        "checkpoints of your own with --checkpoints")
    # the default checkpoints are those train_rlvr.py makes by default on this device (float32 training on the
    # CPU), whatever --dtype the audit's engine runs in (vLLM's default on the CPU is bfloat16)
    trained_in = str(cli.resolve_dtype("auto", args.device)).removeprefix("torch.")
    trained = dict(args.checkpoints) if args.checkpoints else default_checkpoints(
        args.model, task.name, args.fmt, args.salt, args.audit_share, trained_in, args.source, args.device,
        train_missing=not args.no_train)
    audited, split, note = audit_questions(loaded, task.name, trained, args.salt, args.audit_share)
    SAY(f"auditing {note}")
    if (args.n or 0) + args.skip > len(audited) or (args.n is None and args.skip >= len(audited)):
        raise UserError(f"--n {args.n}" + (f" after --skip {args.skip}" if args.skip else "") + f" out of range: "
                        f"{len(audited)} questions are audited ({note}); use --skip + --n <= {len(audited)} or --n all")
    questions = subsample(audited, None if args.n is None else args.skip + args.n, args.seed)[args.skip:]
    check_training_ids(questions, trained)
    settings = {"K": args.K, "samples": 2 * args.K, "split": None if split is None else split.to_dict(),
                "control_fmt": args.control_fmt}
    run_root = args.out / f"{task.name}-n{len(questions)}{cli.skip_tag(args)}-K{args.K}-T{args.T:g}-s{args.seed}"
    native, control, protocols = audit_checkpoints(args, loop, task, questions, settings, {BASE: None, **trained},
                                                   run_root)

    t = tables.audit_tables(native, control, BASE, args.K, args.T, audit.options_per_question(questions), args.bins,
                            seed=args.seed)
    summary = summary_dir(run_root, protocols)
    for name, table in t.items():
        table.to_csv(summary / f"{name}.csv", index=False)
    text = report(t["table5"], t["fates"], t["table6_budget"], t["table7_lineage"], t.get("table8_format_transfer"),
                  t["propensity"], args.K, args.T, args.fmt, args.control_fmt, PAPER, t["crossover"],
                  t["reach_difference"], t["narrowing"])
    (summary / "summary.md").write_text(text)
    base_name = protocols[0].model
    tag = f"{base_name}-{task.name}-n{len(questions)}{cli.skip_tag(args)}-K{args.K}"
    what = f"{base_name} on {task.name}"
    publish(args.figures, {
        summary / f"rlvr_fates_{tag}.png": plots.plot_rlvr_fates(t["fates"], title=f"Fates, {what}"),
        summary / f"rlvr_changes_{tag}.png": plots.plot_rlvr_changes(t["table5"], title=f"D and O_K change, {what}"),
        summary / f"rlvr_propensity_{tag}.png": plots.plot_rlvr_propensity(
            t["propensity"], title=f"Realization after training by base hit rate, {what}"),
        summary / f"rlvr_lineage_{tag}.png": plots.plot_rlvr_lineage(t["table7_lineage"], title=f"Lineage, {what}"),
        summary / f"rlvr_reach_curves_{tag}.png": plots.plot_rlvr_reach_curves(
            t["reach_curves"], t["crossover"], t["reach_difference"], t["narrowing"], title=f"reach@k, {what}")})
    print("\n" + text, flush=True)
    SAY(f"{(time.time() - started) / 60:.1f} min; tables in {summary}, figures in {args.figures}")
    SAY(f"report: {write_report(summary)}")
    return 0


if __name__ == "__main__":
    cli.run(main)
