"""``python -m reach_lens.report RUN_DIR``: write the run's report.html (and, with ``--lm-eval-samples``, its
lm-evaluation-harness sample files); prints what it wrote."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reach_lens.errors import UserError
from reach_lens.report import write_lm_eval_samples, write_report

DESCRIPTION = ("Write the self-contained report.html of a run directory (and, with --lm-eval-samples, its "
               "lm-evaluation-harness sample files); prints the paths written.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reach_lens.report", description=DESCRIPTION)
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                   help="a study's summary-* directory, one run store, or a directory holding run stores")
    p.add_argument("--out", type=Path, default=None, help="the report's path (default RUN_DIR/report.html)")
    p.add_argument("--lm-eval-samples", nargs="?", type=Path, const=True, default=None, metavar="DIR",
                   help="also write lm-evaluation-harness samples_<task>_<time>.jsonl files, one per records table, "
                        "under DIR (default RUN_DIR/lm_eval_samples)")
    args = p.parse_args(argv)
    try:
        print(write_report(args.run_dir, args.out))
        if args.lm_eval_samples is not None:
            out = None if args.lm_eval_samples is True else args.lm_eval_samples
            for path in write_lm_eval_samples(args.run_dir, out):
                print(path)
    except UserError as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
