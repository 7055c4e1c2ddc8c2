"""Which MLP units (or SAE latents) to act on: ranked along a direction, drawn at random, and the share of a
block's output mass a set carries. Used by the localization study's units step (``localize.units``) and by
``reach_lens.sae`` for SAE latents."""

import random
from typing import Iterable

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

from reach_lens.hooks import check_layer


def top_units_along(model: HookedTransformer, layer: int, v: Float[Tensor, "d_model"], k: int = 32) -> list[int]:
    """The k MLP units of `layer` whose output weights point most along v: `W_out[u] · v/|v|`, descending.

    Signed, not absolute: a unit with a positive activation then writes +v into the residual stream,
    which is what "units that push along v" means for the steering study (the reverse direction is
    `top_units_along(model, layer, -v)`). The ranking reads weights only; gated-SiLU activations can be
    negative, so which units actually push along v on given inputs also depends on their activations.
    """
    check_layer(layer, model.cfg.n_layers)
    W_out = model.blocks[layer].mlp.W_out
    if v.shape != (W_out.shape[1],) or not v.any() or not 0 < k <= W_out.shape[0]:
        raise ValueError(f"v of shape {tuple(v.shape)} (norm {float(v.norm()):.3g}) and k={k}; "
                         f"expected a non-zero ({W_out.shape[1]},) vector and k in 1..{W_out.shape[0]}")
    scores = W_out.detach() @ (v.to(W_out) / v.norm())
    return torch.argsort(scores, descending=True, stable=True)[:k].tolist()


def random_units(d_mlp: int, k: int, seed: int, exclude: Iterable[int] = ()) -> list[int]:
    """k distinct units of 0..d_mlp-1 not in `exclude`, drawn with `random.Random(seed)`; sorted."""
    exclude = set(exclude)
    pool = sorted(set(range(d_mlp)) - exclude)
    if not 0 <= k <= len(pool):
        raise ValueError(f"k={k} out of range: {len(pool)} units left after excluding {len(exclude)}")
    return sorted(random.Random(seed).sample(pool, k))


def unit_output_mass(post_acts: Float[Tensor, "*batch d_mlp"], W_out: Float[Tensor, "d_mlp d_model"],
                     units: Iterable[int]) -> float:
    """Share of the MLP's output mass carried by `units`, in [0, 1].

    Unit u writes `a_u · W_out[u]` into the residual stream; its mass is that vector's norm,
    `|a_u| · |W_out[u]|`, summed over all leading (batch, position) entries. The share is the
    units' mass over all units' mass, so shares of disjoint unit sets add up.
    """
    mass = (post_acts.detach().abs() * W_out.detach().norm(dim=-1)).reshape(-1, W_out.shape[0]).sum(0)
    return float(mass[sorted(set(units))].sum() / mass.sum())
