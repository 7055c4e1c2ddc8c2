"""Recognition-vs-generation census over (checkpoint, task) cells (the paper's Figure 4a).

    python experiments/census.py                                  # embedded model + pruned copies x ARC-E, ARC-C, PIQA
    python experiments/census.py --logiqa-source ../shared/data/logiqa/Test.txt --n 200

For each cell: recognition accuracy (gold option ranked first by option log-likelihood), direct-generation
accuracy (greedy answer graded), and the count of questions meeting the failure criterion (recognition
correct, generation wrong). A cell *meets the criterion* when its recognition accuracy exceeds its
generation accuracy with disjoint 95% Wilson intervals and it holds at least ``--min-failures`` failure
questions: a failure set large enough for the localization study.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reach_lens import audit, localize, plots  # noqa: E402
from reach_lens.models import load_model, prune_magnitude  # noqa: E402
from reach_lens.protocol import Protocol  # noqa: E402
from reach_lens.store import RunStore  # noqa: E402
from reach_lens.tasks import get_task, subsample  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model name or path (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--sparsities", type=float, nargs="*", default=[0.3, 0.5],
                   help="MLP magnitude-pruning sparsities for extra checkpoints (default 0.3 0.5)")
    p.add_argument("--tasks", nargs="+", default=["arc_easy", "arc_challenge", "piqa"])
    p.add_argument("--logiqa-source", default=None, help="LogiQA file/dir/HF name: adds LogiQA cells")
    p.add_argument("--n", type=int, default=100, help="questions per cell (default 100)")
    p.add_argument("--fmt", default="native", choices=("native", "shared"))
    p.add_argument("--recognition", default="sum", choices=localize.RECOGNITION_RULES)
    p.add_argument("--min-failures", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is faster on a machine shared with other jobs)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "census")
    p.add_argument("--figures", type=Path, default=ROOT / "figures")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.time()
    if args.threads:
        torch.set_num_threads(args.threads)
    base = load_model(args.model)
    checkpoints = [(base.cfg.model_name, 0.0, base)]
    checkpoints += [(f"{base.cfg.model_name}-mlp{s:g}", s, prune_magnitude(base, s)) for s in args.sparsities]
    task_sources = [(t, None) for t in args.tasks] + ([("logiqa", args.logiqa_source)] if args.logiqa_source else [])
    rows = []
    for name, sparsity, model in checkpoints:
        for task_name, source in task_sources:
            task = get_task(task_name)
            questions = subsample(task.load(source), args.n, args.seed)
            protocol = Protocol.of(study="census", model=model, task=task, questions=questions, source=source,
                                   seed=args.seed, fmt=args.fmt, probe="screen",
                                   settings={"recognition": args.recognition, "sparsity": sparsity})
            store = RunStore(args.out / f"{name}-{task_name}-n{len(questions)}-s{args.seed}", protocol)
            done = store.done("screen")
            todo = [q for q in questions if q.id not in done]
            if todo:
                print(f"[census] {name} x {task_name}: screening {len(todo)} of {len(questions)} questions", flush=True)
                for start in range(0, len(todo), 64):
                    store.append("screen", localize.screen(model, task, todo[start:start + 64], args.fmt,
                                                           args.recognition, batch_size=args.batch_size))
            screened = store.read("screen")
            n = len(screened)
            rec, gen = int(screened.recognized.sum()), int(screened.generated.sum())
            rec_lo, rec_hi = audit.wilson_interval(rec, n)
            gen_lo, gen_hi = audit.wilson_interval(gen, n)
            n_fail = int((screened.recognized & ~screened.generated).sum())
            rows.append({
                "cell": f"{name} / {task_name}", "label": f"{'base' if sparsity == 0 else f'mlp{sparsity:g}'} / {task_name}",
                "checkpoint": name, "sparsity": sparsity, "task": task_name, "n": n,
                "recognition_acc": rec / n, "recognition_lo": rec_lo, "recognition_hi": rec_hi,
                "generation_acc": gen / n, "generation_lo": gen_lo, "generation_hi": gen_hi,
                "format_failure_rate": 1 - screened.gen_format_ok.mean(),
                "n_fail": n_fail, "n_healthy": int((screened.recognized & screened.generated).sum()),
                "meets_criterion": bool(rec_lo > gen_hi and n_fail >= args.min_failures),
            })
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "census.csv", index=False)
    table.to_parquet(args.out / "census.parquet", index=False)
    args.figures.mkdir(parents=True, exist_ok=True)
    plots.plot_census(table, args.figures / "census.png",
                      title=f"Recognition vs generation, {base.cfg.model_name} and MLP-pruned copies "
                            f"(n = {args.n} per cell, {args.fmt} format)")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table[["cell", "n", "recognition_acc", "generation_acc", "format_failure_rate", "n_fail",
                     "n_healthy", "meets_criterion"]].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"[census] {int(table.meets_criterion.sum())} of {len(table)} cells meet the criterion; "
          f"{table.n_fail.sum()} failure questions in all; {(time.time() - started) / 60:.1f} min; "
          f"table {args.out / 'census.csv'}, figure {args.figures / 'census.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
