"""Activations and logits at each prompt's last token (where the answer is decided), and the direction v."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.utilities import apply_softcap

from reach_lens.generate.prefill import padded_batches
from reach_lens.interventions import Intervention, hooks_for
from reach_lens.models import encode


def _right_padded(model: HookedTransformer, prompts: Sequence[str], batch_size: int):
    """Batches ``(rows, tokens, last)`` of right-padded prompt tokens: the prompts' indices, their tokens and each
    row's last real position. Prompts of similar length go together (``padded_batches``, at most ``batch_size`` a
    batch), so padding stays a small share of the work; ``_in_order`` puts per-row results back in prompt order.

    Under causal attention a position never sees the padding after it, so everything computed at a
    prompt's last real token is exact.
    """
    token_lists = [encode(model, p) for p in prompts]
    pad = model.tokenizer.pad_token_id or 0
    for group in padded_batches([len(t) for t in token_lists]):
        for start in range(0, len(group), batch_size):
            rows = group[start:start + batch_size]
            width = max(len(token_lists[i]) for i in rows)
            tokens = torch.tensor([token_lists[i] + [pad] * (width - len(token_lists[i])) for i in rows],
                                  device=model.cfg.device)
            yield rows, tokens, torch.tensor([len(token_lists[i]) - 1 for i in rows], device=model.cfg.device)


def _in_order(parts: Sequence[tuple[list[int], Tensor]]) -> Tensor:
    """The rows of ``(rows, values)`` batches (``_right_padded``'s order) stacked back in prompt order."""
    order = torch.tensor([i for rows, _ in parts for i in rows], device="cpu")  # values are on the CPU
    return torch.cat([values for _, values in parts])[torch.argsort(order)]


def last_prompt_activations(model: HookedTransformer, prompts: Sequence[str], hook_name: str,
                            batch_size: int = 16, interventions: Sequence[Intervention] = ()) -> Float[Tensor, "n d"]:
    """Activation at ``hook_name`` (a ``blocks.{l}.…`` hook) on the last token of each prompt, under
    ``interventions``."""
    layer = int(hook_name.split(".")[1])
    out = []
    with model.hooks(fwd_hooks=hooks_for(interventions, model)):
        for rows, tokens, last in _right_padded(model, prompts, batch_size):
            with torch.no_grad():
                _, cache = model.run_with_cache(tokens, names_filter=[hook_name], stop_at_layer=layer + 1)
            out.append((rows, cache[hook_name][torch.arange(len(tokens), device=last.device), last].cpu()))
    return _in_order(out)


def perturbed_last_activations(model: HookedTransformer, prompts: Sequence[str], layer: int,
                               perturbations: Sequence[Intervention], batch_size: int = 16
                               ) -> tuple[Float[Tensor, "n d_mlp"], list[Float[Tensor, "n d_mlp"]]]:
    """MLP ``layer``'s hidden units (``mlp.hook_post``) at the last token of each prompt: unperturbed, and under
    each perturbation (an intervention at a layer <= ``layer``) in turn. Equal to ``last_prompt_activations``
    without and with ``interventions=[p]``, but one clean run gives the clean units and the residual
    entering each perturbation's layer, from which each perturbed run starts (the layers before it run once).
    """
    name = f"blocks.{layer}.mlp.hook_post"
    bad = [p for p in perturbations if not 0 <= p.layer <= layer]
    if bad:
        raise ValueError(f"perturbation {bad[0]} acts after layer {layer}: it cannot change its units")
    starts = sorted({p.layer for p in perturbations})
    cached = [name, *(f"blocks.{l}.hook_resid_pre" for l in starts)]  # the clean units and each run's start
    clean: list[tuple[list[int], Tensor]] = []
    out: list[list[tuple[list[int], Tensor]]] = [[] for _ in perturbations]
    seen: dict[str, Tensor] = {}

    def grab(act: Tensor, hook) -> Tensor:
        seen["post"] = act
        return act

    for rows, tokens, last in _right_padded(model, prompts, batch_size):
        at_last = torch.arange(len(tokens), device=last.device), last
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=cached, stop_at_layer=layer + 1)
            clean.append((rows, cache[name][at_last].cpu()))
            for i, p in enumerate(perturbations):
                resid = cache[f"blocks.{p.layer}.hook_resid_pre"]
                with model.hooks(fwd_hooks=hooks_for([p], model) + [(name, grab)]):
                    for block in model.blocks[p.layer:layer + 1]:
                        resid = block(resid)
                out[i].append((rows, seen.pop("post")[at_last].cpu()))
    return _in_order(clean), [_in_order(o) for o in out]


def last_prompt_logits(model: HookedTransformer, prompts: Sequence[str], batch_size: int = 16,
                       interventions: Sequence[Intervention] = ()) -> Float[Tensor, "n d_vocab"]:
    """Next-token logits after each prompt (the first generated token's distribution), under ``interventions``.

    The blocks run over every position, but ``ln_final`` and the unembedding only at each prompt's last
    token (the unembedding of every position would cost more than the blocks of a small model).
    """
    out = []
    with model.hooks(fwd_hooks=hooks_for(interventions, model)):
        for rows, tokens, last in _right_padded(model, prompts, batch_size):
            with torch.no_grad():
                at_last = torch.arange(len(tokens), device=last.device), last
                resid = model(tokens, stop_at_layer=model.cfg.n_layers)[at_last]
                if model.cfg.normalization_type is not None:
                    resid = model.ln_final(resid[:, None])[:, 0]
                logits = apply_softcap(model.unembed(resid[:, None]), model.cfg.output_logits_soft_cap)[:, 0]
                out.append((rows, logits.cpu()))
    return _in_order(out)


def mlp_direction(model: HookedTransformer, layer: int, failure_prompts: Sequence[str],
                  healthy_prompts: Sequence[str], batch_size: int = 16) -> tuple[Float[Tensor, "d_model"], dict]:
    """The failure direction at the MLP output of ``layer``.

    ``v = mean(mlp_out | failure) - mean(mlp_out | healthy)`` at the last prompt token, unscaled: ``-1 * v``
    moves the failure questions' mean onto the healthy mean, and ``alpha`` in {2, 4, 8} overshoots by that
    factor. ``info``: layer, n_failure, n_healthy, norm, mlp_out_norm (mean norm of the MLP output there),
    mean_abs_cosine (of the outputs with v).
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
