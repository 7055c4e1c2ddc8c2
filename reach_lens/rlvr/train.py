"""Train a recipe with TRL (GRPOTrainer or SFTTrainer) and save a plain Hugging Face checkpoint.

    path = train(default_recipe("grpo"), embedded_checkpoint_dir())   # resumes a killed run; returns the dir

Work in progress lives in ``<checkpoint>.work/`` (TRL checkpoints every ``save_steps``, from which a rerun
resumes with optimizer, scheduler and RNG states; removed once the checkpoint is saved); the finished model
is written to a temporary sibling and renamed into place, so a checkpoint directory that exists is complete.
LoRA adapters are merged into the weights, so ``reach_lens.models.load_model(path)`` reads the result like any
other checkpoint.

The checkpoint carries ``reach_lens_training.json`` (recipe, split rule and both id lists' hashes, steps,
wall time, library versions; under a prompt filter, the questions it kept), ``training_ids.json`` (the training
side's question ids, so an audit can prove it is disjoint) and ``training_log.csv`` (TRL's log: reward and its
spread per logging step for GRPO, loss for SFT).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from reach_lens.rlvr.data import as_dataset, grpo_rows, sft_rows
from reach_lens.errors import UserError
from reach_lens.rlvr.recipes import KINDS, Recipe, base_name, checkpoint_path, default_recipe
from reach_lens.rlvr.rewards import sample_hits, task_reward
from reach_lens.rlvr.split import Split, split_questions

METADATA = "reach_lens_training.json"
TRAINING_IDS = "training_ids.json"
TRAINING_LOG = "training_log.csv"
log = logging.getLogger(__name__)
_ELAPSED = "reach_lens_elapsed.json"


def _versions() -> dict:
    out = {}
    for name in ("trl", "peft", "transformers", "torch", "reach_lens"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def read_metadata(path: Path | str) -> dict | None:
    """The training metadata of a checkpoint directory, or None for a checkpoint reach_lens did not train (any
    other model argument: a hub name, a GGUF file, another directory)."""
    file = Path(path) / METADATA
    return json.loads(file.read_text()) if file.exists() else None


def training_ids(path: Path | str) -> list[str]:
    """The training question ids a reach_lens checkpoint was trained on ([] for other checkpoints)."""
    file = Path(path) / TRAINING_IDS
    return json.loads(file.read_text()) if file.exists() else []


def _peft_config(recipe: Recipe):
    if recipe.lora_r is None:
        return None
    from peft import LoraConfig

    return LoraConfig(r=recipe.lora_r, lora_alpha=recipe.lora_alpha, lora_dropout=0.0, target_modules="all-linear",
                      task_type="CAUSAL_LM")


def _common_args(recipe: Recipe, work: Path, device: str) -> dict:
    return dict(output_dir=str(work), max_steps=recipe.steps, learning_rate=recipe.learning_rate, seed=recipe.seed,
                data_seed=recipe.seed, logging_steps=recipe.logging_steps, save_steps=recipe.save_steps,
                save_total_limit=2, report_to="none", disable_tqdm=False, use_cpu=device == "cpu",
                bf16=recipe.precision == "bfloat16", fp16=recipe.precision == "float16",
                activation_checkpointing=False, dataloader_num_workers=0)


def training_device(device: str | None) -> str:
    """``cpu`` or ``cuda`` (TRL trains on the process's visible GPUs through accelerate; ``cuda:N`` selects GPU N
    by ``CUDA_VISIBLE_DEVICES``, set before the process starts). None or ``auto``: cuda when a GPU is present."""
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA GPU is available here")
    if device not in ("cpu", "cuda", "cuda:0"):
        raise ValueError(f"device {device!r}: training takes cpu or cuda (choose GPU N with CUDA_VISIBLE_DEVICES=N)")
    return device.partition(":")[0]


def stop_token_ids(tokenizer, stop_strings: Sequence[str]) -> list[int]:
    """Ids of the vocabulary tokens whose text contains one of ``stop_strings``.

    The audit's generation ends at the token that completes a stop string and grades the text before it, so
    ending a training completion at such a token grades the same text: exactly so for one-character stops
    (the MC native ``"."`` and ``"\\n"``), and for longer ones whenever one token holds the whole string (the
    reward cuts at stop strings either way). Tokens after the stop then take no part in the loss.
    """
    stops = [s for s in stop_strings if s]
    if not stops:
        return []
    return [i for i in range(len(tokenizer)) if any(s in tokenizer.decode([i]) for s in stops)]


def _trainer(recipe: Recipe, model, tokenizer, task, train_qs: Sequence[Any], work: Path, device: str):
    if recipe.kind == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        # TRL ends completions at (and masks the loss after) model.generation_config.eos_token_id: add the
        # task's stop tokens there (restored before saving), so training completions end where the audit's do
        eos = model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        extra = [i for i in stop_token_ids(tokenizer, task.stop_strings(recipe.fmt)) if i not in eos]
        model.generation_config.eos_token_id = [*eos, *extra] if extra else model.generation_config.eos_token_id

        args = GRPOConfig(**_common_args(recipe, work, device), per_device_train_batch_size=recipe.num_generations
                          * recipe.prompts_per_step, gradient_accumulation_steps=1,
                          num_generations=recipe.num_generations, temperature=recipe.temperature, beta=recipe.beta,
                          max_completion_length=recipe.max_completion_length or task.max_new_tokens(recipe.fmt))
        return GRPOTrainer(model=model, reward_funcs=[task_reward(task, train_qs, recipe.fmt)], args=args,
                           train_dataset=as_dataset(grpo_rows(task, train_qs, tokenizer, recipe.fmt)),
                           processing_class=tokenizer, peft_config=_peft_config(recipe))
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(**_common_args(recipe, work, device), per_device_train_batch_size=recipe.batch_size,
                     completion_only_loss=True, max_length=1024)
    rows = [{k: r[k] for k in ("prompt", "completion")} for r in sft_rows(task, train_qs, tokenizer, recipe.fmt)]
    return SFTTrainer(model=model, args=args, train_dataset=as_dataset(rows), processing_class=tokenizer,
                      peft_config=_peft_config(recipe))


def informative_questions(recipe: Recipe, base: Path | str, task: Any, questions: Sequence[Any], work: Path,
                          device: str = "cpu") -> tuple[list[Any], dict]:
    """The questions of ``recipe.prompt_filter == "informative"``: those whose ``num_generations`` samples of the
    base model at the recipe's temperature (``probes.sample``, seeded by the recipe's seed) are neither all right
    nor all wrong, with a description of the filter for the metadata. The kept ids are written to ``work`` first,
    so a resumed run does not sample again."""
    K, kept_file = recipe.num_generations, work / "informative_ids.json"
    if kept_file.exists():
        kept_ids = set(json.loads(kept_file.read_text()))
    else:
        from reach_lens.models import load_model

        log.info(f"{recipe.name}: drawing {K} samples of each of {len(questions)} training questions from the base "
                 f"model (T={recipe.temperature:g}) to keep the informative ones")
        model = load_model(base, device=device)
        hits = sample_hits(model, task, questions, recipe.fmt, K, recipe.temperature, recipe.seed)
        kept_ids = {str(q.id) for q, h in zip(questions, hits) if 0 < h < K}
        kept_file.write_text(json.dumps(sorted(kept_ids)))
    kept = [q for q in questions if str(q.id) in kept_ids]
    if not kept:
        raise ValueError(f"prompt_filter 'informative' kept none of the {len(questions)} training questions: the "
                         f"base model's {K} samples at T={recipe.temperature:g} are all right or all wrong on each")
    return kept, {"rule": recipe.prompt_filter, "K": K, "T": recipe.temperature, "of": len(questions),
                  "kept": len(kept), "kept_ids": [str(q.id) for q in kept]}


class _Elapsed:
    """Wall seconds spent training, summed over resumed sessions (kept beside the TRL checkpoints)."""

    def __init__(self, work: Path):
        self.file = work / _ELAPSED
        self.before = json.loads(self.file.read_text())["seconds"] if self.file.exists() else 0.0
        self.start = time.time()

    def total(self) -> float:
        return self.before + time.time() - self.start

    def save(self) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.file.write_text(json.dumps({"seconds": self.total()}))


def _callback(elapsed: _Elapsed):
    from transformers import TrainerCallback

    class SaveElapsed(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            elapsed.save()

    return SaveElapsed()


def train(recipe: Recipe, base: Path | str, out: Path | str | None = None, *, questions: Sequence[Any] | None = None,
          source: str | None = None, device: str | None = None) -> Path:
    """Train ``recipe`` from the HF checkpoint directory ``base`` on ``device`` (``training_device``); returns
    the finished checkpoint directory.

    ``out`` defaults to ``checkpoint_path(recipe)``; an existing finished checkpoint is returned untouched.
    ``questions`` (default: the task's questions from ``source``) are split by ``recipe``'s salted id hash,
    and only the training side is trained on.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_utils import get_last_checkpoint

    from reach_lens.tasks import get_task

    out = checkpoint_path(recipe) if out is None else Path(out)
    device = training_device(device)
    if (out / METADATA).exists():
        log.info(f"{recipe.name}: already trained, at {out}")
        return out
    task = get_task(recipe.task)
    task.check_format(recipe.fmt)
    questions = task.load(source) if questions is None else list(questions)
    train_qs, _, split = split_questions(questions, recipe.task, recipe.salt, recipe.audit_share)
    work = out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    elapsed = _Elapsed(work)
    torch.manual_seed(recipe.seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    base_eos = model.generation_config.eos_token_id
    kept, prompt_filter = train_qs, None
    if recipe.prompt_filter is not None:
        kept, prompt_filter = informative_questions(recipe, base, task, train_qs, work, device)
    trainer = _trainer(recipe, model, tokenizer, task, kept, work, device)
    trainer.add_callback(_callback(elapsed))
    last = get_last_checkpoint(str(work))
    log.info(f"{recipe.name}: {recipe.kind} on {len(kept)} training questions of {recipe.task}"
        + ("" if prompt_filter is None else f" (the informative ones of {len(train_qs)})")
        + f" ({split.to_dict()['n_audit']} held out for the audit), {recipe.steps} steps"
        + (f", resuming from {Path(last).name}" if last else ""))
    trainer.train(resume_from_checkpoint=last)
    elapsed.save()
    _save(trainer, tokenizer, recipe, split, base, out, elapsed.total(), base_eos, device, prompt_filter)
    shutil.rmtree(work, ignore_errors=True)  # the TRL checkpoints were resume points only
    log.info(f"{recipe.name}: saved to {out} ({elapsed.total() / 60:.1f} min of training)")
    return out


def _save(trainer, tokenizer, recipe: Recipe, split: Split, base: Path | str, out: Path, seconds: float,
          base_eos, device: str, prompt_filter: dict | None = None) -> None:
    model = trainer.model
    if hasattr(model, "merge_and_unload"):  # a PEFT model: fold the adapters into the weights
        model = model.merge_and_unload()
    model.generation_config.eos_token_id = base_eos
    staging = out.with_name(f".{out.name}.saving-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    log_history = pd.DataFrame(trainer.state.log_history)
    log_history.to_csv(staging / TRAINING_LOG, index=False)
    (staging / TRAINING_IDS).write_text(json.dumps(list(split.train_ids)))
    meta = {"schema": "reach_lens.rlvr.checkpoint/1", "recipe": recipe.to_dict(), "name": recipe.name,
            "split": split.to_dict(), "base": str(base), "steps": int(trainer.state.global_step),
            "wall_seconds": round(seconds, 1), "device": device, "threads": torch.get_num_threads(),
            "versions": _versions(),
            "reward_first": _mean_reward(log_history, first=True),
            "reward_last": _mean_reward(log_history, first=False), "prompt_filter": prompt_filter}
    (staging / METADATA).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(staging, out)


def _mean_reward(log_history: pd.DataFrame, first: bool, span: int = 5) -> float | None:
    """Mean logged GRPO reward over the first (or last) ``span`` logging steps; None for SFT."""
    if "reward" not in log_history:
        return None
    r = log_history["reward"].dropna()
    if r.empty:
        return None
    return float((r.head(span) if first else r.tail(span)).mean())


def default_checkpoints(model: str | None, task: str, fmt: str, salt: str, audit_share: float, precision: str,
                        source: str | None = None, device: str | None = None,
                        train_missing: bool = True) -> dict[str, Path]:
    """The default recipes' checkpoints of base ``model`` (None: the embedded one) on ``task``, trained here
    (saying so) when missing; with ``train_missing`` False a missing one is a ``UserError`` naming the command."""
    from reach_lens.models import local_checkpoint

    out = {}
    for kind in KINDS:
        recipe = default_recipe(kind, base=base_name(model), task=task, fmt=fmt, salt=salt, audit_share=audit_share,
                                precision=precision)
        path = checkpoint_path(recipe)
        if not (path / METADATA).exists():
            if not train_missing:
                raise UserError(f"{kind} checkpoint {path} is missing and --no-train is set: run "
                                f"python experiments/train_rlvr.py --recipe {kind} --task {task} --fmt {fmt}")
            base = Path(local_checkpoint(model))
            if not (base / "config.json").exists():
                raise UserError(f"cannot train from --model {model!r}: training needs a local Hugging Face "
                                "checkpoint directory; pass trained checkpoints with --checkpoints")
            log.info(f"{kind} checkpoint {recipe.name} is missing: training it first")
            train(recipe, base, path, source=source, device=device)
        out[kind] = path
    return out
