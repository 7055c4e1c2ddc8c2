"""Compare a base model with checkpoints of your own on your own benchmark: the RLVR audit (rlvr_compare.py) with
positional models and the defaults of an outside comparison (every question, no control format).

    python experiments/compare.py BASE CHECKPOINT [CHECKPOINT ...] --task jsonl:my_benchmark.jsonl --K 64
    python experiments/compare.py Qwen/Qwen2.5-0.5B rl=runs/grpo/final sft=adapters/sft --task lm-eval:gsm8k.yaml

Models are anything load_model takes (Hugging Face directories or names, .gguf files, PEFT adapter directories);
a checkpoint is labelled by its last path component unless written LABEL=MODEL. Every other option is
rlvr_compare.py's (--help there); --n defaults to all and --control-fmt to none here.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rlvr_compare  # noqa: E402  (the study this script fronts, beside it)

from reach_lens import cli  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="other options: python experiments/rlvr_compare.py --help")
    p.add_argument("base", help="the base model")
    p.add_argument("checkpoints", nargs="+", type=cli.labelled_model, metavar="[LABEL=]CHECKPOINT",
                   help="the checkpoints compared with it (labelled by their last path component, or LABEL=)")
    args, rest = p.parse_known_args(argv)
    defaults = []
    for option, value in (("--n", "all"), ("--control-fmt", "none")):
        if not any(r == option or r.startswith(option + "=") for r in rest):
            defaults += [option, value]
    models = [f"{label}={model}" for label, model in args.checkpoints]
    return rlvr_compare.main(["--model", args.base, "--checkpoints", *models, *defaults, *rest])


if __name__ == "__main__":
    cli.run(main)
