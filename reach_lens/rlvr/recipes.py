"""Training recipes of the RLVR study: what is trained, on which split, with which hyperparameters.

    recipe = default_recipe("grpo")              # TRL GRPOTrainer, the task's grader as the reward, LoRA
    recipe = default_recipe("sft", steps=100)    # TRL SFTTrainer on gold answers, same split
    recipe.name              # "grpo-smollm2-135m-instruct-arc_easy-lora16-150steps-s0-1a2b3c4d": its directory

A recipe is a frozen, JSON-able value: its dict goes into the checkpoint's metadata, and its name (which
carries a hash of every field) is the checkpoint's directory under ``cache_dir()/checkpoints/rlvr``, so
two recipes never share a directory and a finished recipe is found again instead of retrained.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

from reach_lens.cache import cache_dir
from reach_lens.protocol import canonical_json

KINDS = ("grpo", "sft")
PRECISIONS = ("float32", "bfloat16", "float16")
PROMPT_FILTERS = (None, "informative")
REFINEMENTS = ("prompt_filter",)  # optional refinements of a recipe: they enter its name's hash only when set


@dataclass(frozen=True)
class Recipe:
    """One training run of a base model: ``base`` is an embedded model's name or a checkpoint directory (the one
trained from; two bases never share a recipe, so never a checkpoint directory).

    ``lora_r`` None means full fine-tuning; otherwise LoRA of that rank on every linear layer, merged
    into the weights when saved. GRPO draws ``num_generations`` completions for each of
    ``prompts_per_step`` prompts per optimizer step at ``temperature``; SFT takes ``batch_size`` gold
    completions per step. ``max_completion_length`` None means the task's own ``max_new_tokens(fmt)``.
    ``precision`` is the training arithmetic: float32, or bfloat16 / float16 mixed precision (float32 master
    weights, TRL's ``bf16`` / ``fp16``); it changes the result, so it is part of the recipe (the device is not:
    it is recorded in the checkpoint's metadata). ``prompt_filter`` ``"informative"`` (GRPO only) trains on the
    training questions whose ``num_generations`` base-model samples at ``temperature`` are neither all right nor
    all wrong, the only groups whose GRPO advantages are not all zero: DAPO's dynamic sampling, done once on the
    base model before training instead of at every step.
    """

    kind: str
    base: str = "smollm2-135m-instruct"
    task: str = "arc_easy"
    fmt: str = "native"
    salt: str = "rlvr"
    audit_share: float = 0.6
    steps: int = 150
    learning_rate: float = 2e-4
    lora_r: int | None = 16
    lora_alpha: int = 32
    num_generations: int = 8
    prompts_per_step: int = 1
    temperature: float = 1.0
    beta: float = 0.0
    max_completion_length: int | None = None
    batch_size: int = 8
    seed: int = 0
    save_steps: int = 25
    logging_steps: int = 5
    precision: str = "float32"
    prompt_filter: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"recipe kind {self.kind!r} unknown; valid: {list(KINDS)}")
        for name in ("steps", "num_generations", "prompts_per_step", "batch_size", "save_steps", "logging_steps",
                     "lora_alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} {value!r} out of range: expected an int >= 1")
        if self.kind == "grpo" and self.num_generations < 2:
            raise ValueError(f"num_generations {self.num_generations} out of range: GRPO needs >= 2 per prompt")
        if self.lora_r is not None and (isinstance(self.lora_r, bool) or not isinstance(self.lora_r, int)
                                        or self.lora_r < 1):
            raise ValueError(f"lora_r {self.lora_r!r} out of range: expected an int >= 1, or None for full fine-tuning")
        if self.prompt_filter not in PROMPT_FILTERS:
            raise ValueError(f"prompt_filter {self.prompt_filter!r} unknown; valid: {list(PROMPT_FILTERS)}")
        if self.prompt_filter is not None and self.kind != "grpo":
            raise ValueError(f"prompt_filter {self.prompt_filter!r} filters GRPO groups; a {self.kind} recipe has none")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} unknown; valid: {list(PRECISIONS)}")
        if not 0 < self.audit_share < 1:
            raise ValueError(f"audit_share {self.audit_share} out of range: expected a number strictly between 0 and 1")
        if not self.learning_rate > 0 or not self.temperature > 0 or self.beta < 0:
            raise ValueError(f"learning_rate {self.learning_rate} and temperature {self.temperature} must be > 0, "
                             f"beta {self.beta} >= 0")

    @property
    def tuning(self) -> str:
        return "full" if self.lora_r is None else f"lora{self.lora_r}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Recipe:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown recipe fields {unknown}; valid: {sorted(names)}")
        return cls(**d)

    @property
    def name(self) -> str:
        hashed = {k: v for k, v in self.to_dict().items() if k not in REFINEMENTS or v is not None}
        digest = hashlib.sha256(canonical_json(hashed).encode()).hexdigest()[:8]
        tuning = self.tuning + ("" if self.prompt_filter is None else f"-{self.prompt_filter}")
        return f"{self.kind}-{Path(self.base).name}-{self.task}-{tuning}-{self.steps}steps-s{self.seed}-{digest}"


DEFAULTS = {
    # sized to fit 45 minutes of a 2-core CPU (docs/results.md): 1 prompt x 8 completions per step
    "grpo": dict(steps=150, learning_rate=2e-4, lora_r=16, num_generations=8, prompts_per_step=1, temperature=1.0),
    # 8 gold answers per step, the same LoRA and split: 70 steps are about two epochs of the training split
    "sft": dict(steps=70, learning_rate=2e-4, lora_r=16, batch_size=8),
}
TASK_DEFAULTS = {
    # SQuAD's zero-shot prompts (~230 tokens) cost about 3x ARC's per step, so 60 GRPO steps; 40 SFT steps are 320
    # gold answers, three quarters of an epoch of its 418 training questions
    "squad": {"grpo": dict(steps=60), "sft": dict(steps=40)},
}


def default_recipe(kind: str, **changes) -> Recipe:
    """The recipe the study trains by default (``DEFAULTS``, with the task's ``TASK_DEFAULTS``), with ``changes``."""
    if kind not in KINDS:
        raise ValueError(f"recipe kind {kind!r} unknown; valid: {list(KINDS)}")
    task = changes.get("task", Recipe.__dataclass_fields__["task"].default)
    return Recipe(kind=kind, **{**DEFAULTS[kind], **TASK_DEFAULTS.get(task, {}).get(kind, {}), **changes})


def base_name(model: str | Path | None) -> str:
    """A recipe's ``base`` for a model argument: an embedded model's name (the default one's for None), or a
    checkpoint directory's resolved path."""
    from reach_lens.models import EMBEDDED_MODELS, EMBEDDED_NAME

    if model is None:
        return EMBEDDED_NAME
    return str(model) if str(model) in EMBEDDED_MODELS else str(Path(model).expanduser().resolve())


def checkpoints_root() -> Path:
    """``cache_dir()/checkpoints/rlvr``: where trained checkpoints live."""
    return cache_dir() / "checkpoints" / "rlvr"


def checkpoint_path(recipe: Recipe, root: Path | None = None) -> Path:
    """The HF checkpoint directory of ``recipe`` (exists once training finished)."""
    return (checkpoints_root() if root is None else Path(root)) / recipe.name
