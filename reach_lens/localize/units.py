"""The units step: the top-k MLP units (or SAE latents) along v, silenced, against random-k sets.

Ranking rules (``UNIT_RANKS``), both along ``v̂ = v / |v|`` with ``w_u`` the vector unit u writes per unit of
activation (``W_out[u]``, or an SAE latent's decoder row):

- ``contribution`` (default): the mean contribution on the CALIBRATION failures, ``mean_i a_iu * (w_u · v̂)``, with
  ``a_iu`` the unit's activation at question i's last prompt token (where v is measured). A gated-SiLU unit can be
  negative there: then it pushes against v however well its weights point along it.
- ``weights``: ``w_u · v̂`` alone (``unit_selection.top_units_along``), blind to the sign and size of the
  activations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm import tqdm

from reach_lens.hooks import check_layer
from reach_lens.interventions import Latents, Silence, Units
from reach_lens.localize.activations import last_prompt_activations
from reach_lens.localize.conditions import Conditions
from reach_lens.localize.steps import silence_name
from reach_lens.unit_selection import random_units, unit_output_mass

UNIT_RANKS = ("contribution", "weights")
UNIT_RANK_TEXT = {"contribution": "mean contribution on the calibration failures (activation at the last prompt "
                                  "token x w_u . v/|v|)",
                  "weights": "output weights alone (w_u . v/|v|, activations ignored)"}


def unit_scores(writes: Float[Tensor, "units d_model"], v: Float[Tensor, "d_model"], rule: str,
                acts: Float[Tensor, "n units"] | None = None) -> Float[Tensor, "units"]:
    """Each unit's score along v by ``rule`` (module docstring): ``writes @ v̂``, times the mean of ``acts`` (one
    row per calibration failure) for ``contribution``."""
    if rule not in UNIT_RANKS:
        raise ValueError(f"unit rank rule {rule!r} unknown; expected one of {UNIT_RANKS}")
    if v.shape != (writes.shape[1],) or not v.any():
        raise ValueError(f"v of shape {tuple(v.shape)} (norm {float(v.norm()):.3g}); expected a non-zero "
                         f"({writes.shape[1]},) vector")
    along = writes.detach() @ (v.to(writes) / v.norm())
    if rule == "weights":
        return along
    if acts is None or acts.ndim != 2 or acts.shape[1] != writes.shape[0] or not len(acts):
        shape = None if acts is None else tuple(acts.shape)
        raise ValueError(f"the contribution rule needs activations [n >= 1, {writes.shape[0]}], got {shape}")
    return acts.detach().to(along).mean(0) * along


def top_units(scores: Float[Tensor, "units"], k: int) -> list[int]:
    """The ``k`` highest scores' units, descending (ties by id)."""
    if not 0 < k <= len(scores):
        raise ValueError(f"k={k} out of range: expected 1..{len(scores)}")
    return torch.argsort(scores, descending=True, stable=True)[:k].tolist()


def unit_arms(conditions: Conditions, layer: int, v: Float[Tensor, "d_model"], k: int, seeds: int,
              sae=None, rank: str = "contribution") -> pd.DataFrame:
    """Silence the top-``k`` units of MLP ``layer`` along v by ``rank`` (``UNIT_RANKS``; chosen on the calibration
    failures), and ``seeds`` random-``k`` sets (disjoint from the top set), on the evaluation failures; the whole
    block's own repair is the reference.

    With ``sae`` (a SAELens SAE attached at ``blocks.{layer}.hook_mlp_out`` of ``conditions.model``, a
    ``HookedSAETransformer``; ``use_error_term=True`` keeps the model's answers unchanged), the arms are SAE
    latents instead of MLP units (ranked by their decoder rows, and activations, along v), silenced with
    ``Latents``, against random-``k`` latent sets.

    Rows: arm (block | top | random), seed, units (unit or latent ids), score (mean score of the set by
    ``rank``), repair*, repair_vs_block (NaN when the block repairs nothing), mass (share of the block's, or the
    SAE decoder's, output mass at the last prompt token of the evaluation failures), rank, space.
    """
    model = conditions.model
    check_layer(layer, model.cfg.n_layers)
    if sae is None:
        W_out = model.blocks[layer].mlp.W_out
        writes, size, kind, hook = W_out.detach(), model.cfg.d_mlp, "units", f"blocks.{layer}.mlp.hook_post"

        def silence(ids):
            return Units(layer, tuple(ids), "zero")

        def mass(acts, ids):
            return unit_output_mass(acts, W_out, ids)
    else:
        from reach_lens import sae as sae_lib  # the optional extra, only when asked for
        point = sae.cfg.metadata.hook_name
        if point != f"blocks.{layer}.hook_mlp_out" or sae_lib.latent_hook(sae) not in model.hook_dict:
            raise ValueError(f"the SAE is at {point!r}; the latent arm needs one attached to the model at "
                             f"'blocks.{layer}.hook_mlp_out' (where v lives)")
        writes, size, kind = sae_lib.decoder_directions(sae), sae.cfg.d_sae, "latents"
        hook = sae_lib.latent_hook(sae)

        def silence(ids):
            return Latents(point, tuple(ids))

        def mass(acts, ids):
            return sae_lib.latent_output_mass(acts, sae, ids)

    def prompts(role: str) -> list[str]:
        return [conditions.task.prompt(q, conditions.fmt, model.tokenizer)
                for q in conditions.questions(role, ("failure",))]

    chosen_on = last_prompt_activations(model, prompts("calibration"), hook, conditions.batch_size) \
        if rank == "contribution" else None
    scores = unit_scores(writes, v, rank, chosen_on)
    top = top_units(scores, k)
    acts = last_prompt_activations(model, prompts("evaluation"), hook, conditions.batch_size)
    block = silence_name("mlp", layer)
    # stored already at the identified layer
    conditions.run(block, [Silence(layer, "hook_mlp_out")], "evaluation", ("failure",))
    arms = [("top", None, top)]
    arms += [("random", s, random_units(size, k, s, exclude=top)) for s in range(seeds)]
    rows = [{"arm": "block", "seed": None, "units": [], "score": np.nan, "mass": 1.0,
             **conditions.rates(block, "evaluation", ("failure",))}]
    for arm, seed, ids in tqdm(arms, desc=f"{kind} at MLP {layer}", unit="set"):
        # the random sets avoid the top set, so both depend on the rule
        name = f"{kind}-{rank}-{arm}{k}" + (f"-s{seed}" if seed is not None else "") + f"-L{layer}"
        conditions.run(name, [silence(ids)], "evaluation", ("failure",))
        rows.append({"arm": arm, "seed": seed, "units": list(ids), "score": float(scores[list(ids)].mean()),
                     "mass": mass(acts, ids), **conditions.rates(name, "evaluation", ("failure",))})
    table = pd.DataFrame(rows).drop(columns=[c for c in ("breakage", "breakage_lo", "breakage_hi", "breakage_n",
                                                         "breakage_k")])
    whole = float(table.repair.iloc[0])
    table["repair_vs_block"] = table.repair / whole if whole > 0 else np.nan
    table["rank"] = rank
    table["space"] = "SAE latents" if sae is not None else "MLP units"
    return table
