"""Train the RLVR study's checkpoints: TRL GRPO with the task's grader as the verifiable reward, or SFT on gold
answers, on a training split disjoint by question id from the audit split (salted id hash).

    python experiments/train_rlvr.py                      # both default recipes (GRPO, then SFT) on SQuAD (zero-shot)
    python experiments/train_rlvr.py --task arc_easy      # the multiple-choice cell
    python experiments/train_rlvr.py --recipe grpo --steps 150 --threads 1
    python experiments/train_rlvr.py --recipe sft --full  # full fine-tuning instead of LoRA
    python experiments/train_rlvr.py --recipe grpo --prompt-filter informative   # GRPO on the questions whose
                                                          # base-model groups are mixed (DAPO's dynamic sampling)
    python experiments/train_rlvr.py --reward-density squad trivia_qa nq_open basic_arithmetic arc_easy
                                                          # measure each task's reward density first (the choice)

Checkpoints are plain Hugging Face directories under <cache>/checkpoints/rlvr/<recipe name>/ (LoRA merged),
with reach_lens_training.json (recipe, split rule, both id lists' hashes, steps, wall time), training_ids.json
and training_log.csv; `reach_lens.models.load_model(path)` reads them. A killed run resumes from its last TRL
checkpoint (every --save-steps) when rerun with the same arguments; a finished recipe is not retrained.
Needs the `rlvr` extra (trl, peft).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from reach_lens import cli, logs, plots
from reach_lens.errors import UserError
from reach_lens.models import EMBEDDED_MODELS, checkpoint_tokenizer, local_checkpoint
from reach_lens.rlvr.recipes import KINDS, PROMPT_FILTERS, base_name, checkpoints_root, default_recipe
from reach_lens.tasks import FORMATS, get_task, task_names

SAY = logs.say("train_rlvr")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                parents=[cli.verbosity()])
    p.add_argument("--recipe", choices=(*KINDS, "all"), default="all", help="grpo, sft, or all (default: both)")
    p.add_argument("--model", default=None,
                   help="base model: an embedded one by name or a Hugging Face checkpoint directory (default: the "
                        "embedded SmolLM2-135M-Instruct)")
    p.add_argument("--task", default="squad", choices=task_names(), metavar="TASK",
                   help="training task (its grader is the reward; default squad)")
    p.add_argument("--source", default=None, help="task data (default: the embedded data)")
    p.add_argument("--fmt", default="auto", choices=FORMATS,
                   help="prompt format of training and of --reward-density: auto (each task's own for the base "
                        "model, zero-shot where that is few-shot: training pays the prompt for every completion), "
                        "native, shared or fewshot (part of the recipe; rlvr_compare must use the same)")
    p.add_argument("--steps", type=cli.positive_int, default=None, help="optimizer steps (default: the recipe's)")
    p.add_argument("--lr", type=cli.positive_float, default=None, help="learning rate (default: the recipe's)")
    tuning = p.add_mutually_exclusive_group()
    tuning.add_argument("--lora-r", type=cli.positive_int, default=None, help="LoRA rank (default 16)")
    tuning.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    p.add_argument("--num-generations", type=cli.positive_int, default=None, help="GRPO completions per prompt")
    p.add_argument("--temperature", type=cli.positive_float, default=None, help="GRPO sampling temperature")
    p.add_argument("--prompt-filter", default=None, choices=[f for f in PROMPT_FILTERS if f],
                   help="GRPO: train only on questions whose group of base-model samples is neither all right nor all "
                        "wrong (DAPO's dynamic sampling, once before training; for tasks of low reward density)")
    p.add_argument("--salt", default="rlvr", help="salt of the id-hash split (the compare must use the same)")
    p.add_argument("--audit-share", type=cli.share, default=0.6, help="share of question ids held out for the audit")
    p.add_argument("--seed", type=int, default=0, help="seed of training and of the question subsample (default 0)")
    p.add_argument("--save-steps", type=cli.positive_int, default=25, help="TRL checkpoint interval (resume points)")
    p.add_argument("--device", type=cli.device_name, default="auto",
                   help="auto (cuda when a GPU is present), cpu or cuda (TRL uses the visible GPUs; pick GPU N with "
                        "CUDA_VISIBLE_DEVICES=N)")
    p.add_argument("--dtype", choices=("auto", *cli.DTYPES), default="auto",
                   help="training precision: auto (bfloat16 mixed precision on a GPU, float32 on the CPU), float32, "
                        "bfloat16 or float16 (part of the recipe, so of the checkpoint's name)")
    p.add_argument("--threads", type=cli.positive_int, default=None, help="torch CPU threads (1 on a shared machine)")
    p.add_argument("--out", type=Path, default=None, help="checkpoint root (default <cache>/checkpoints/rlvr)")
    p.add_argument("--reward-density", nargs="+", default=None, choices=task_names(), metavar="TASK",
                   help="train nothing: measure the base model's reward density (share of correct samples at T=0.8, "
                        "K=8) on --density-n training questions of each TASK, the measurement a task is chosen by")
    p.add_argument("--density-n", type=cli.positive_int, default=40, help="questions per task for --reward-density")
    p.add_argument("--figures", type=Path, default=Path("figures"), help="where the training curves go")
    args = p.parse_args(argv)
    cli.check_output_dir(args.figures, "--figures")
    if args.model is not None and args.model not in EMBEDDED_MODELS and not Path(args.model).is_dir():
        p.error(f"--model {args.model!r} is neither an embedded model ({', '.join(EMBEDDED_MODELS)}) nor a Hugging "
                "Face checkpoint directory")
    if args.recipe == "all" and (args.steps or args.lr):
        p.error("--steps and --lr set one recipe's values: name it with --recipe grpo or --recipe sft")
    return args


def recipes_of(args: argparse.Namespace) -> list:
    changes = {"base": base_name(args.model), "task": args.task, "fmt": args.fmt, "salt": args.salt,
               "audit_share": args.audit_share, "seed": args.seed, "save_steps": args.save_steps,
               "precision": args.dtype}
    if args.full:
        changes["lora_r"] = None
    elif args.lora_r is not None:
        changes["lora_r"] = args.lora_r
    for name, key in (("steps", "steps"), ("lr", "learning_rate"), ("num_generations", "num_generations"),
                      ("temperature", "temperature"), ("prompt_filter", "prompt_filter")):
        if getattr(args, name) is not None:
            changes[key] = getattr(args, name)
    kinds = KINDS if args.recipe == "all" else (args.recipe,)
    return [default_recipe(kind, **{k: v for k, v in changes.items()
                                    if kind == "grpo" or k not in ("num_generations", "temperature", "prompt_filter")})
            for kind in kinds]


def measure_reward_density(args: argparse.Namespace) -> int:
    """The base model's reward density on the training side of each task (K=8 samples at T=0.8 each)."""
    from reach_lens.models import load_model
    from reach_lens.rlvr.rewards import reward_density
    from reach_lens.rlvr.split import split_questions
    from reach_lens.generate import engine_for
    from reach_lens.tasks import subsample

    model = load_model(args.model, device=args.device)
    rows = []
    for name in args.reward_density:
        task = get_task(name)
        train_side, _, _ = split_questions(cli.load_source(task, args.source if name == args.task else None, None),
                                           name, args.salt, args.audit_share)
        questions = subsample(train_side, min(args.density_n, len(train_side)), args.seed)
        fmt = task.resolve_format(args.fmt, engine_for(model).tokenizer, zero_shot=True)
        rows.append({**reward_density(model, task, questions, fmt, K=8, temperature=0.8, seed=args.seed),
                     "fmt": fmt})
        SAY(f"{name} ({fmt}): reward density {rows[-1]['density']:.3f} (n = {len(questions)}, K = 8, T = 0.8)")
    table = pd.DataFrame(rows).sort_values("density", ascending=False)
    out = Path("runs") / "train_rlvr"
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "reward_density.csv", index=False)
    print(table.to_string(index=False, float_format="{:.3f}".format), flush=True)
    SAY(f"table in {out / 'reward_density.csv'}; the densest task gives GRPO the most signal")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    logs.configure_output(quiet=args.quiet, verbose=args.verbose)
    try:
        import peft  # noqa: F401
        import trl  # noqa: F401
    except ImportError as e:
        raise UserError(f"training needs the rlvr extra: pip install -e '.[rlvr]' ({e})") from e
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from reach_lens.rlvr.train import training_device

    try:
        args.device = training_device(cli.resolve_device(args.device))
    except ValueError as e:
        raise UserError(f"--device: {e}") from None
    args.dtype = str(cli.resolve_dtype(args.dtype, args.device)).removeprefix("torch.")
    if args.reward_density:
        return measure_reward_density(args)
    args.fmt = get_task(args.task).resolve_format(args.fmt, checkpoint_tokenizer(args.model), zero_shot=True)
    from reach_lens.rlvr.train import TRAINING_LOG, read_metadata, train

    base = Path(local_checkpoint(args.model))
    root = args.out or checkpoints_root()
    for recipe in recipes_of(args):
        started = time.time()
        path = train(recipe, base, root / recipe.name, source=args.source, device=args.device)
        meta = read_metadata(path)
        reward = (f"; reward (mean of 5 logging steps) {meta['reward_first']:.3f} -> {meta['reward_last']:.3f}"
                  if meta.get("reward_first") is not None else "")
        curve = args.figures / f"rlvr_training_{recipe.name}.png"
        kept = meta.get("prompt_filter")
        trained_on = ("training split" if kept is None else
                      f"the {kept['kept']} {kept['rule']} of its {kept['of']} training questions")
        plots.plot_rlvr_training(pd.read_csv(path / TRAINING_LOG), curve,
                                 f"{recipe.kind} ({recipe.tuning}) on {recipe.task}, {trained_on}")
        SAY(f"{recipe.kind}: {meta['steps']} steps, {meta['wall_seconds'] / 60:.1f} min of training "
            f"({(time.time() - started) / 60:.1f} min this call){reward}; checkpoint {path}; curve {curve}")
    return 0


if __name__ == "__main__":
    cli.run(main)
