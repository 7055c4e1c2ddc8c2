"""Recognition-vs-generation census over (checkpoint, task) cells (the paper's Figure 4a).

    python experiments/census.py                                  # embedded model + pruned copies x ARC-E, ARC-C, PIQA
    python experiments/census.py --models smollm2-135m-instruct gemma3-270m   # both embedded models
    python experiments/census.py --logiqa-source path/to/logiqa/Test.txt --n 200

For each cell: recognition accuracy (gold option ranked first by option log-likelihood), direct-generation
accuracy (greedy answer graded), and the count of questions meeting the failure criterion (recognition
correct, generation wrong). A cell *meets the criterion* (`census.meets_criterion`) when its recognition
accuracy exceeds its generation accuracy with disjoint 95% Wilson intervals and it holds at least
``--min-failures`` failure questions: a failure set large enough for the localization study.

Outputs: census.csv and census.parquet in a summary-<hash>/ directory of --out (named by the protocols of its
cells), and census_<models>.png there and in --figures (models joined by +).
"""
from __future__ import annotations

import argparse
import time

import pandas as pd

from reach_lens import audit, census, cli, localize, logs, plots, stats
from reach_lens.generate import engine_for
from reach_lens.models import prune_magnitude
from reach_lens.protocol import Protocol
from reach_lens.report import write_report
from reach_lens.runs import publish, summary_dir
from reach_lens.store import RunStore
from reach_lens.tasks import check_formats, get_task

TASKS = ("arc_easy", "arc_challenge", "piqa")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(parents=[cli.common(out="runs/census"), cli.data(n=100, chunk=64, tasks=TASKS)],
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=[None], metavar="MODEL",
                   help="models, each with its pruned copies (default: --model; e.g. smollm2-135m-instruct "
                        "gemma3-270m for both embedded models)")
    p.add_argument("--sparsities", type=cli.share, nargs="*", default=[0.3, 0.5],
                   help="MLP magnitude-pruning sparsities for extra checkpoints (default 0.3 0.5)")
    p.add_argument("--logiqa-source", default=None, help="LogiQA file/dir/HF name: adds LogiQA cells")
    p.add_argument("--recognition", default="sum", choices=localize.RECOGNITION_RULES,
                   help="recognition: the gold option ranked first by summed (sum, default) or per-token (norm) "
                        "option log-likelihood")
    p.add_argument("--min-failures", type=cli.nonnegative_int, default=5,
                   help="failure questions a cell needs to meet the criterion (default 5)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    loop, started = cli.setup(args), time.time()
    cells = {name: (task, args.source, args.split) for name, task in cli.tasks(args).items()}
    cells |= {"logiqa": (get_task("logiqa"), args.logiqa_source, None)} if args.logiqa_source else {}
    check_formats(args.fmt, [task for task, _, _ in cells.values()])
    questions = {t: cli.questions(task, source, split, args.n, args.seed, args.skip) for t, (task, source, split) in cells.items()}
    rows, protocols = [], []
    for base_name in args.models:
        base = cli.load(args, base_name)
        name = base.cfg.model_name
        for sparsity in [0.0, *args.sparsities]:
            rows += screen_checkpoint(base, name, sparsity, cells, questions, args, loop, protocols)
        del base
    table = pd.DataFrame(rows)
    models = list(dict.fromkeys(table.checkpoint.str.replace(r"-mlp[0-9.]+$", "", regex=True)))
    pruned = " and MLP-pruned copies" if args.sparsities else ""

    out = summary_dir(args.out, protocols)
    table.to_csv(out / "census.csv", index=False)
    table.to_parquet(out / "census.parquet", index=False)
    publish(args.figures, {out / f"census_{'+'.join(models)}.png": plots.plot_census(  # one figure per model set
        table, title=f"Recognition vs generation, {' and '.join(models)}{pruned} (n = {args.n} per cell)")})
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table[["cell", "fmt", "n", "recognition_acc", "generation_acc", "format_failure_rate", "n_fail",
                     "n_healthy", "meets_criterion"]].to_string(index=False, float_format=lambda x: f"{x:.3f}"),
              flush=True)
    logs.say("census")(f"{int(table.meets_criterion.sum())} of {len(table)} cells meet the criterion; "
                       f"{table.n_fail.sum()} failure questions in all; {(time.time() - started) / 60:.1f} min; tables and figure in {out}, also in {args.figures}")
    logs.say("census")(f"report: {write_report(out)}")
    return 0


def screen_checkpoint(base, name: str, sparsity: float, cells, questions, args, loop, protocols: list) -> list[dict]:
    """The census rows of one checkpoint (``base`` pruned to ``sparsity``, or itself at 0) over every task cell,
    screened resumably; appends the cells' protocols to ``protocols``."""
    model = base if sparsity == 0 else prune_magnitude(base, sparsity)
    checkpoint = name if sparsity == 0 else f"{name}-mlp{sparsity:g}"
    rows = []
    for t, (task, source, split) in cells.items():
        qs, fmt = questions[t], task.resolve_format(args.fmt, engine_for(model).tokenizer)
        protocol = Protocol.of(study="census", facts=engine_for(model).describe(), task=task, questions=qs,
                               source=source, split=split, seed=args.seed, fmt=fmt, probe="screen",
                               settings={"recognition": args.recognition, "sparsity": sparsity})
        protocols.append(protocol)
        store = RunStore(args.out / f"{checkpoint}-{t}-n{len(qs)}{cli.skip_tag(args)}-s{args.seed}", protocol)
        screened = loop.resume(store, "screen", qs, lambda part, task=task, fmt=fmt: localize.screen(
            model, task, part, fmt, args.recognition, batch_size=args.batch_size), desc=f"{checkpoint} {t} screen")
        short = ("base" if sparsity == 0 else f"mlp{sparsity:g}") if len(args.models) == 1 else (
            name if sparsity == 0 else f"{name} mlp{sparsity:g}")
        rows.append({"cell": f"{checkpoint} / {t}", "label": f"{short} / {t}", "checkpoint": checkpoint,
                     "sparsity": sparsity, "task": t, "fmt": fmt,
                     "chance": stats.guessing_floor(audit.options_per_question(qs), 1),
                     **census.census_cell(screened, args.min_failures)})
    return rows


if __name__ == "__main__":
    cli.run(main)
