"""Building blocks of the MLP-localization study: screening, panels, the steering direction, and a
planted failure for the positive control.

Vocabulary (DESIGN.md): a question is *recognized* when multiple-choice likelihood ranks its gold option
first, and *generated* when greedy direct generation answers it correctly. The **failure set** holds
questions recognized but not generated; the **healthy panel** holds questions both recognized and
generated. Both are fixed before any intervention.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.utilities import apply_softcap

from reach_lens import audit, probes
from reach_lens.models import encode
from reach_lens.tasks import Question, Task

RECOGNITION_RULES = ("sum", "norm")


def screen(model: HookedTransformer, task: Task, questions: Sequence[Question], fmt: str,
           recognition: str = "sum", hooks=(), batch_size: int = 16) -> pd.DataFrame:
    """Recognition and direct generation of every question, one row each.

    Columns: question_id, gold, recognized (gold option ranked first by summed ("sum") or per-token
    ("norm") option log-likelihood), recog_pred, generated (greedy answer graded correct), gen_answer,
    gen_text, gen_format_ok.
    """
    if recognition not in RECOGNITION_RULES:
        raise ValueError(f"recognition rule {recognition!r} unknown; expected one of {RECOGNITION_RULES}")
    if task.kind != "mc":
        raise ValueError(f"task {task.name!r} is {task.kind}; recognition needs a multiple-choice task")
    recog = probes.recognize(model, task, questions, hooks=hooks, batch_size=batch_size).set_index("question_id")
    deployed = probes.deploy(model, task, questions, fmt, hooks=hooks, batch_size=batch_size)
    pred_column = "pred_sum" if recognition == "sum" else "pred_norm"
    rows = []
    for q, gen in zip(questions, deployed):
        pred = int(recog.loc[q.id, pred_column])
        rows.append({
            "question_id": q.id,
            "gold": q.gold,
            "recognized": pred == q.gold_index,
            "recog_pred": q.labels[pred],
            "generated": bool(gen["correct"]),
            "gen_answer": gen["answer"],
            "gen_text": gen["text"],
            "gen_format_ok": gen["answer"] is not None,
        })
    return pd.DataFrame(rows)


def _unit_hash(seed: int, question_id: str) -> float:
    digest = hashlib.sha256(f"panel-split:{seed}:{question_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def build_panels(screened: pd.DataFrame, seed: int, calibration_share: float = 0.5,
                 max_evaluation: int | None = None) -> pd.DataFrame:
    """Failure set and healthy panel, each split into calibration and evaluation questions.

    A question goes to calibration when ``sha256("panel-split:seed:id")`` (read as a number in [0, 1)) falls below
    ``calibration_share``: the split depends on nothing but the id, so it is fixed before any
    intervention and independent of question order. Calibration questions define the steering direction
    and choose units; evaluation questions measure every intervention. ``max_evaluation`` caps each
    evaluation panel (lowest hashes first). Columns: question_id, panel ("failure" | "healthy"),
    role ("calibration" | "evaluation").
    """
    if not 0.0 < calibration_share < 1.0:
        raise ValueError(f"calibration_share {calibration_share} out of range: expected 0 < share < 1")
    rows = []
    for panel, mask in (("failure", screened.recognized & ~screened.generated),
                        ("healthy", screened.recognized & screened.generated)):
        ids = sorted(screened.loc[mask, "question_id"], key=lambda i: _unit_hash(seed, i))
        evaluation = [i for i in ids if _unit_hash(seed, i) >= calibration_share]
        if max_evaluation is not None:
            evaluation = evaluation[:max_evaluation]
        for qid in ids:
            role = "calibration" if _unit_hash(seed, qid) < calibration_share else "evaluation"
            if role == "evaluation" and qid not in evaluation:
                continue
            rows.append({"question_id": qid, "panel": panel, "role": role})
    return pd.DataFrame(rows, columns=["question_id", "panel", "role"])


def _right_padded(model: HookedTransformer, prompts: Sequence[str], batch_size: int):
    """Batches of right-padded prompt tokens with each row's last real position.

    Under causal attention a position never sees the padding after it, so everything computed at a
    prompt's last real token is exact.
    """
    token_lists = [encode(model, p) for p in prompts]
    pad = model.tokenizer.pad_token_id or 0
    for start in range(0, len(token_lists), batch_size):
        chunk = token_lists[start:start + batch_size]
        width = max(len(t) for t in chunk)
        tokens = torch.tensor([t + [pad] * (width - len(t)) for t in chunk], device=model.cfg.device)
        yield tokens, torch.tensor([len(t) - 1 for t in chunk], device=model.cfg.device)


def last_prompt_activations(model: HookedTransformer, prompts: Sequence[str], hook_name: str,
                            batch_size: int = 16) -> Float[Tensor, "n d"]:
    """Activation at ``hook_name`` (a ``blocks.{l}.…`` hook) on the last token of each prompt."""
    layer = int(hook_name.split(".")[1])
    out = []
    for tokens, last in _right_padded(model, prompts, batch_size):
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=[hook_name], stop_at_layer=layer + 1)
        out.append(cache[hook_name][torch.arange(len(tokens)), last].cpu())
    return torch.cat(out)


def last_prompt_logits(model: HookedTransformer, prompts: Sequence[str], batch_size: int = 16,
                       hooks=()) -> Float[Tensor, "n d_vocab"]:
    """Next-token logits after each prompt (the first generated token's distribution).

    The blocks run over every position, but ``ln_final`` and the unembedding only at each prompt's last
    token (the unembedding of every position would cost more than the blocks of a small model).
    """
    out = []
    with model.hooks(fwd_hooks=list(hooks)):
        for tokens, last in _right_padded(model, prompts, batch_size):
            with torch.no_grad():
                resid = model(tokens, stop_at_layer=model.cfg.n_layers)[torch.arange(len(tokens)), last]
                if model.cfg.normalization_type is not None:
                    resid = model.ln_final(resid[:, None])[:, 0]
                out.append(apply_softcap(model.unembed(resid[:, None]), model.cfg.output_logits_soft_cap)[:, 0].cpu())
    return torch.cat(out)


def mlp_direction(model: HookedTransformer, layer: int, failure_prompts: Sequence[str],
                  healthy_prompts: Sequence[str], batch_size: int = 16) -> tuple[Float[Tensor, "d_model"], dict]:
    """The failure direction at the MLP output of ``layer``.

    ``v = mean(mlp_out | failure) - mean(mlp_out | healthy)`` at the last prompt token (where the answer
    is decided), unscaled: ``-1 * v`` moves the failure questions' mean onto the healthy mean, and
    ``alpha`` in {2, 4, 8} overshoots by that factor.
    """
    if not failure_prompts or not healthy_prompts:
        raise ValueError(f"need calibration questions in both panels, got {len(failure_prompts)} failure "
                         f"and {len(healthy_prompts)} healthy")
    name = f"blocks.{layer}.hook_mlp_out"
    fail = last_prompt_activations(model, failure_prompts, name, batch_size)
    healthy = last_prompt_activations(model, healthy_prompts, name, batch_size)
    v = fail.mean(0) - healthy.mean(0)
    both = torch.cat([fail, healthy])
    info = {"layer": layer, "n_failure": len(fail), "n_healthy": len(healthy), "norm": float(v.norm()),
            "mlp_out_norm": float(both.norm(dim=-1).mean()),
            "mean_abs_cosine": float(torch.nn.functional.cosine_similarity(both, v[None], dim=-1).abs().mean())}
    return v, info


def answer_push(model: HookedTransformer, target_token: int, away_from: Sequence[int]) -> Float[Tensor, "d_model"]:
    """A residual-stream direction that raises ``target_token``'s logit over the ``away_from`` tokens.

    The unit vector of ``W_U[:, target] - mean(W_U[:, away_from])``, times the mean norm of the token
    embeddings (so that a strength of 1 is about one embedding's worth of push).
    """
    W_U = model.unembed.W_U.detach()
    direction = W_U[:, target_token] - W_U[:, list(away_from)].mean(-1)
    return direction / direction.norm() * model.W_E.detach().norm(dim=-1).mean()


def plant_answer_failure(model: HookedTransformer, layer: int, push: Float[Tensor, "d_model"],
                         strength: float) -> HookedTransformer:
    """A copy of ``model`` whose MLP block at ``layer`` adds ``strength * push`` at every position.

    The edit is to the block's output bias only, so its effect equals ``Steer(layer, push, strength)``
    at ``hook_mlp_out`` and silencing that MLP block removes it entirely; nothing else changes.
    """
    if not 0 <= layer < model.cfg.n_layers:
        raise ValueError(f"layer {layer} out of range for a {model.cfg.n_layers}-layer model (0..{model.cfg.n_layers - 1})")
    planted = copy.deepcopy(model)
    with torch.no_grad():
        planted.blocks[layer].mlp.b_out.add_(strength * push.to(planted.blocks[layer].mlp.b_out))
    planted.cfg.model_name = f"{model.cfg.model_name}-planted-L{layer}"
    return planted


def panel_rates(results: pd.DataFrame) -> dict:
    """Repair and breakage of one condition from its per-question results (columns panel, correct).

    Repair = share of the failure panel answered correctly; breakage = share of the healthy panel
    answered wrongly; each with its Wilson 95% interval, count and n (``audit.Rate.to_dict``). An empty
    panel gives NaN rates with n = 0.
    """
    out = {}
    for name, panel, rate in (("repair", "failure", audit.repair_rate), ("breakage", "healthy", audit.breakage_rate)):
        after = results.loc[results.panel == panel, "correct"].to_numpy(bool)
        before = np.full(len(after), panel == "healthy")
        if len(after):
            out.update(rate(before, after).to_dict(name))
        else:
            out.update({name: np.nan, f"{name}_lo": np.nan, f"{name}_hi": np.nan, f"{name}_n": 0, f"{name}_k": 0})
    return out


LAYER_RULES = ("net", "repair")


def identify_layer(sweep: pd.DataFrame, rule: str = "net") -> int:
    """The MLP block the study goes on with, from the layer sweep (columns layer, component, repair, breakage).

    ``"repair"`` is the paper's rule: the largest MLP repair. ``"net"`` (default) takes the largest MLP
    repair minus healthy breakage, so a block whose silencing breaks the model everywhere (repairing
    failures by changing every answer) is not taken for a locus. Ties go to lower breakage, then the lower layer.
    """
    if rule not in LAYER_RULES:
        raise ValueError(f"layer rule {rule!r} unknown; expected one of {LAYER_RULES}")
    mlp = sweep[sweep.component == "mlp"]
    if not len(mlp):
        raise ValueError("the sweep has no MLP rows (component == 'mlp'); cannot identify a layer")
    score = mlp.repair - mlp.breakage if rule == "net" else mlp.repair
    ranked = mlp.assign(score=score).sort_values(["score", "breakage", "layer"], ascending=[False, True, True])
    return int(ranked.iloc[0].layer)
