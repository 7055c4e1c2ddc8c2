"""The RLVR checkpoint study (the paper's Tables 5-8, Figures 6-7): base vs trained checkpoints, question by
question, under one protocol.

    python experiments/rlvr_compare.py                    # embedded base vs its GRPO and SFT checkpoints (trained
                                                          # first when missing), SQuAD audit split, n=300, K=16
    python experiments/rlvr_compare.py --task arc_easy    # the multiple-choice cell (its oracles beside the floor)
    python experiments/rlvr_compare.py --checkpoints rl=/path/to/rl sft=/path/to/sft --model /path/to/base \\
        --task gsm8k --source path/to/gsm8k/test.jsonl --audit-share 0.999 --K 100

Every checkpoint answers the same audit questions (the audit side of the salted id-hash split; a checkpoint
whose training ids include any of them is refused) with a greedy answer and 2K samples at T in the main
format, and a greedy answer in the control format. Protocols must match in everything but the checkpoint
(model, weights): a difference (K, T, format, grader, question set, ...) is refused, naming the field. The
first K of the 2K samples are exactly the K-sample probe (samples are seeded per question and index), so
Table 6's K and 2K come from one set of samples.

Outputs (resumable runs under <out>/<task>-n<n>-K<K>-T<T>-s<seed>/<checkpoint>/: <fmt>/deployed, <fmt>/T<T> and
<control fmt>/deployed; tables
in its summary-<hash>/ directory, figures there and in --figures):
  table5.csv (n, K, base D/O, trained D/O with Wilson 95%, delta n_reachable with a paired bootstrap interval),
  fates.csv (Figure 6a; gains from base-reachable questions against two nulls: independence, and resampling with
  the base's hit rate over its 2K samples), table6_budget.csv, table7_lineage.csv, table8_format_transfer.csv,
  propensity.csv (Figure 7, at K and at 2K), reach_curves.csv (reach@k, k = 1..2K, per checkpoint), crossover.csv
  (per trained checkpoint: the k where the base's reach@k overtakes, or the smallest gap), summary.md; figures
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
from reach_lens.rlvr.audit_run import audit_checkpoint, audit_protocols, check_comparable, control_format
from reach_lens.rlvr.fates import hit_rate_bins
from reach_lens.rlvr.report import report
from reach_lens.rlvr.split import check_disjoint, split_questions
from reach_lens.runs import publish, summary_dir
from reach_lens.tasks import get_task, subsample

LOG = logs.logger("rlvr_compare")
SAY = LOG.info
BASE = "base"
PAPER = "paper Table 5 (n=300, K=200, T=0.8): DAPO-32B D 55.0 -> 69.7, O 96.0 -> 82.7, 40 fewer reachable questions"


def checkpoint_arg(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not LABEL=PATH (e.g. rl=/path/to/checkpoint)")
    if label == BASE:
        raise argparse.ArgumentTypeError(f"label {BASE!r} is the base model's (--model); pick another label")
    if not (Path(path).expanduser() / "config.json").exists():
        raise argparse.ArgumentTypeError(f"{path!r} is not a Hugging Face checkpoint directory (no config.json)")
    return label, Path(path).expanduser()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(parents=[cli.common(out="runs/rlvr_compare", batch_size=32), cli.engines(),
                                         cli.data(n=300, chunk=25, task="squad")],
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--K", type=cli.positive_int, default=16,
                   help="main candidate budget (Table 5, fates, propensity); 2K samples are drawn for Table 6")
    p.add_argument("--T", type=cli.positive_float, default=0.8, help="sampling temperature")
    p.add_argument("--checkpoints", type=checkpoint_arg, nargs="+", default=None, metavar="LABEL=PATH",
                   help="trained checkpoints (default: the default GRPO and SFT recipes, trained when missing)")
    p.add_argument("--no-train", action="store_true", help="refuse to train missing default checkpoints")
    p.add_argument("--control-fmt", default=None, choices=("native", "shared", "fewshot"),
                   help="format of the format-transfer table (Table 8); default: another plain-text format than the "
                        "main one (shared after native; fewshot, where the task has it, after shared; else native)")
    p.add_argument("--salt", default="rlvr", help="salt of the train/audit id-hash split")
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
    """Records in the main format (greedy + 2K samples) and greedy answers in the control format, per checkpoint;
    every checkpoint's protocols are checked against the base's before it generates anything."""
    records, control, protocols = {}, {}, {}
    for label, path in checkpoints.items():
        model = cli.load_engine(args, None if path is None else str(path))
        # a private engine, dropped with the model: engine_for's cache would keep every checkpoint in memory
        engine = model if isinstance(model, Engine) else TransformerLensEngine(model)
        protocols[label] = audit_protocols(engine, task, questions, args.fmt, args.control_fmt, 2 * args.K, args.T,
                                           args.seed, settings, source=args.source, split=args.split)
        for run in ("sampled", "control"):
            check_comparable({checkpoint: ps[run] for checkpoint, ps in protocols.items()})
        name = protocols[label]["sampled"].model
        SAY(f"{label}: {name} ({protocols[label]['sampled'].weights}, {protocols[label]['sampled'].engine} engine)")
        records[label], control[label] = audit_checkpoint(loop, engine, task, questions, protocols[label],
                                                          run_root / name, label)
        engine.close()
        del model, engine
        gc.collect()
    return records, control, [p for ps in protocols.values() for p in ps.values()]


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    loop = cli.setup(args)
    task = get_task(args.task)
    # the recipes' and the protocols' format; auto is zero-shot where a task's default is few-shot (training pays
    # the prompt for every completion)
    args.fmt = task.resolve_format(args.fmt, checkpoint_tokenizer(args.model), zero_shot=True)
    if args.control_fmt is None:
        args.control_fmt = control_format(args.fmt, task)
    if args.control_fmt == args.fmt:
        raise UserError(f"--control-fmt {args.control_fmt!r} is the main format of {args.task}: the "
                            "format-transfer table needs another format")
    task.check_format(args.control_fmt)
    loaded = cli.load_source(task, args.source, args.split)
    _, audit_side, split = split_questions(loaded, args.task, args.salt, args.audit_share)
    if args.n > len(audit_side):
        raise UserError(f"--n {args.n} out of range: the audit side of {args.task} holds {len(audit_side)} questions "
                         f"(--audit-share {args.audit_share}); use --n <= {len(audit_side)}")
    questions = subsample(audit_side, args.n, args.seed)
    from reach_lens.rlvr.train import default_checkpoints, read_metadata, training_ids

    # the default checkpoints are those train_rlvr.py makes by default on this device (float32 training on the
    # CPU), whatever --dtype the audit's engine runs in (vLLM's default on the CPU is bfloat16)
    trained_in = str(cli.resolve_dtype("auto", args.device)).removeprefix("torch.")
    trained = dict(args.checkpoints) if args.checkpoints else default_checkpoints(
        args.model, args.task, args.fmt, args.salt, args.audit_share, trained_in, args.source, args.device,
        train_missing=not args.no_train)

    for label, path in trained.items():
        check_disjoint([q.id for q in questions], training_ids(path), f"{label} checkpoint ({path})")
        meta = read_metadata(path)
        if meta is not None and meta["split"]["audit_ids_sha256"] != split.to_dict()["audit_ids_sha256"]:
            LOG.warning(f"{label} was trained under another split ({meta['split']['salt']!r}, "
                        f"{meta['split']['audit_share']}); its training ids are still disjoint from these audit "
                        "questions")
    settings = {"K": args.K, "samples": 2 * args.K, "split": split.to_dict(), "control_fmt": args.control_fmt}
    run_root = args.out / f"{args.task}-n{len(questions)}-K{args.K}-T{args.T:g}-s{args.seed}"
    native, control, protocols = audit_checkpoints(args, loop, task, questions, settings, {BASE: None, **trained},
                                                   run_root)

    t = tables.audit_tables(native, control, BASE, args.K, args.T, audit.options_per_question(questions), args.bins,
                            seed=args.seed)
    summary = summary_dir(run_root, protocols)
    for name, table in t.items():
        table.to_csv(summary / f"{name}.csv", index=False)
    text = report(t["table5"], t["fates"], t["table6_budget"], t["table7_lineage"], t["table8_format_transfer"],
                  t["propensity"], args.K, args.T, args.fmt, args.control_fmt, PAPER, t["crossover"])
    (summary / "summary.md").write_text(text)
    base_name = protocols[0].model
    tag = f"{base_name}-{args.task}-n{len(questions)}-K{args.K}"
    what = f"{base_name} on {args.task}"
    publish(args.figures, {
        summary / f"rlvr_fates_{tag}.png": plots.plot_rlvr_fates(t["fates"], title=f"Fates, {what}"),
        summary / f"rlvr_changes_{tag}.png": plots.plot_rlvr_changes(t["table5"], title=f"D and O_K change, {what}"),
        summary / f"rlvr_propensity_{tag}.png": plots.plot_rlvr_propensity(
            t["propensity"], title=f"Realization after training by base hit rate, {what}"),
        summary / f"rlvr_lineage_{tag}.png": plots.plot_rlvr_lineage(t["table7_lineage"], title=f"Lineage, {what}"),
        summary / f"rlvr_reach_curves_{tag}.png": plots.plot_rlvr_reach_curves(t["reach_curves"], t["crossover"],
                                                                              title=f"reach@k, {what}")})
    print("\n" + text, flush=True)
    SAY(f"{(time.time() - started) / 60:.1f} min; tables in {summary}, figures in {args.figures}")
    return 0


if __name__ == "__main__":
    cli.run(main)
