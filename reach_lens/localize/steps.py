"""The study's steps on ``Conditions``: what is chosen on calibration questions, what is measured on evaluation.

1. ``selection_sweep`` (calibration): silence the MLP and the attention of every swept layer.
2. ``evaluate_choice`` (evaluation): the identified MLP, attention and whole layer at its layer, the runner-ups
   chosen on calibration; paired margins and the verdict.
3. ``steering``: rescue (-alpha v on failures) and induction (+alpha v on healthy questions) at each alpha on
   both splits; each direction's dose is chosen on calibration and reported on evaluation.
4. ``unit_arms`` (evaluation failures): the top-k units (or SAE latents) along v against random-k sets, relative
   to the block.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm import tqdm

from reach_lens.hooks import Latents, Silence, Steer, Units, random_units, top_units_along, unit_output_mass
from reach_lens.localize.activations import last_prompt_activations
from reach_lens.localize.conditions import Conditions
from reach_lens.localize.panels import ROLES
from reach_lens.localize.verdict import component_name, margins, runner_ups, verdict

SWEPT = ("mlp", "attn")  # the components every layer competes with; the whole layer is a control at one layer
CONTAINS = "whole layer (contains it)"


def parse_layers(spec: str) -> list[int]:
    """``"0-29"`` or ``"10,12,14"`` (or a mix) as sorted distinct layers; an argparse type."""
    layers: set[int] = set()
    try:
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            layers.update(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    except ValueError:
        raise ValueError(f"layers {spec!r}: expected e.g. '0-29' or '10,12,14'") from None
    if not layers:
        raise ValueError(f"layers {spec!r} names no layer")
    return sorted(layers)


def check_layers(layers: Sequence[int], n_layers: int) -> list[int]:
    bad = [layer for layer in layers if not 0 <= layer < n_layers]
    if bad:
        raise ValueError(f"layer {bad[0]} out of range for a {n_layers}-layer model (0..{n_layers - 1})")
    return list(layers)


def silence_name(component: str, layer: int) -> str:
    return f"silence-{component}-{layer}"


def selection_sweep(conditions: Conditions, layers: Sequence[int], components: Sequence[str] = SWEPT) -> pd.DataFrame:
    """Repair and breakage on the calibration panels with each component of each layer silenced.

    Columns: layer, component, role, repair*, breakage* (``panel_rates``)."""
    rows = []
    for layer, component in tqdm([(l, c) for l in layers for c in components], desc="selection sweep (calibration)",
                                 unit="cond"):
        name = silence_name(component, layer)
        conditions.run(name, [Silence(layer, component)], "calibration")
        rows.append({"layer": layer, "component": component, "role": "calibration",
                     **conditions.rates(name, "calibration")})
    return pd.DataFrame(rows)


def evaluate_choice(conditions: Conditions, sweep: pd.DataFrame, layer: int, rule: str, top: int = 3):
    """The identified MLP ``layer``, the attention and whole layer there, and the runner-ups (chosen on the
    calibration ``sweep`` by ``rule``), measured on the evaluation panels.

    Returns (table, margin_table, verdict): table rows name, component, layer, label, repair*, breakage*
    (evaluation) and cal_repair, cal_breakage; margins of the identified MLP over every other component but the
    whole layer around it (``verdict.margins``); ``verdict.verdict``.
    """
    conditions.run("none", [], "evaluation")
    runners = runner_ups(sweep, layer, rule, top)
    plan = {("mlp", layer): "identified", ("attn", layer): "same layer", ("layer", layer): CONTAINS}
    for r in runners.itertuples():
        key = (r.component, int(r.layer))
        plan[key] = f"{plan[key]}; {r.label}" if key in plan else r.label
    cal = sweep.set_index(["component", "layer"])
    rows = []
    for (component, at), label in tqdm(plan.items(), desc="evaluation of the choice", unit="cond"):
        name = silence_name(component, at)
        conditions.run(name, [Silence(at, component)], "evaluation")
        known = (component, at) in cal.index
        rows.append({"name": component_name(component, at), "component": component, "layer": at, "label": label,
                     **conditions.rates(name, "evaluation"),
                     "cal_repair": cal.loc[(component, at), "repair"] if known else np.nan,
                     "cal_breakage": cal.loc[(component, at), "breakage"] if known else np.nan})
    table = pd.DataFrame(rows)
    identified = conditions.correct(silence_name("mlp", layer), "evaluation", "failure")
    others = {r.name: conditions.correct(silence_name(r.component, r.layer), "evaluation", "failure")
              for r in table.itertuples() if r.label not in ("identified", CONTAINS)}
    margin_table = margins(identified, others)
    return table, margin_table, verdict(component_name("mlp", layer), table.iloc[0].to_dict(), margin_table)


def baseline_check(conditions: Conditions) -> dict:
    """Rates of the unintervened model on the evaluation panels: repair 0 and breakage 0 when the panels hold."""
    return conditions.rates("none", "evaluation")


def steering(conditions: Conditions, layer: int, v: Float[Tensor, "d_model"], alphas: Sequence[float],
             seed: int = 0):
    """Rescue and induction at each alpha on both splits, each direction's dose chosen on calibration, and a
    random direction of v's norm at those doses on evaluation (the control that says whether v is special).

    Returns (table, doses): rows role ("calibration" | "evaluation" | "random direction"), alpha, rescue* (repair
    of the failures under -alpha v), induction* (breakage of the healthy questions under +alpha v); doses =
    {"rescue": alpha, "induction": alpha}, each the largest calibration rate (the smaller alpha on ties).
    """
    def run(name: str, direction: tuple, alpha: float, role: str, which: str) -> dict:
        panel, sign, measure = ("failure", -1, "repair") if which == "rescue" else ("healthy", 1, "breakage")
        conditions.run(name, [Steer(layer, direction, sign * alpha)], role, (panel,))
        rates = conditions.rates(name, role, (panel,))
        return {k.replace(measure, which): rates[k] for k in rates if measure in k}

    vector, rows = tuple(v.tolist()), []
    for role in ROLES:
        for alpha in tqdm(alphas, desc=f"steering at MLP {layer} ({role})", unit="alpha"):
            rows.append({"role": role, "alpha": alpha,
                         **run(f"steer-rescue-a{alpha:g}-L{layer}", vector, alpha, role, "rescue"),
                         **run(f"steer-induce-a{alpha:g}-L{layer}", vector, alpha, role, "induction")})
    cal = pd.DataFrame(rows).query("role == 'calibration'")
    doses = {d: float(cal.sort_values([d, "alpha"], ascending=[False, True]).iloc[0].alpha)
             for d in ("rescue", "induction")}
    noise = torch.randn(len(v), generator=torch.Generator().manual_seed(seed))
    random = tuple((noise * v.norm() / noise.norm()).tolist())
    for which, alpha in doses.items():
        rows.append({"role": "random direction", "alpha": alpha,
                     **run(f"steer-random{seed}-{which}-a{alpha:g}-L{layer}", random, alpha, "evaluation", which)})
    return pd.DataFrame(rows), doses


def unit_arms(conditions: Conditions, layer: int, v: Float[Tensor, "d_model"], k: int, seeds: int,
              sae=None) -> pd.DataFrame:
    """Silence the top-``k`` units of MLP ``layer`` along v, and ``seeds`` random-``k`` sets (disjoint from the
    top set), on the evaluation failures; the whole block's own repair is the reference.

    With ``sae`` (a SAELens SAE attached at ``blocks.{layer}.hook_mlp_out`` of ``conditions.model``, a
    ``HookedSAETransformer``; ``use_error_term=True`` keeps the model's answers unchanged), the arms are SAE
    latents instead of MLP units: the top-``k`` latents whose decoder rows point along v, silenced with
    ``Latents``, against random-``k`` latent sets.

    Rows: arm (block | top | random), seed, units (unit or latent ids), repair*, repair_vs_block (NaN when the
    block repairs nothing), mass (share of the block's, or the SAE decoder's, output mass at the last prompt token
    of these questions).
    """
    model = conditions.model
    if sae is None:
        W_out = model.blocks[layer].mlp.W_out
        top, size, kind = top_units_along(model, layer, v, k), model.cfg.d_mlp, "units"
        hook = f"blocks.{layer}.mlp.hook_post"

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
        top, size, kind = sae_lib.top_latents_along(sae, v, k), sae.cfg.d_sae, "latents"
        hook = sae_lib.latent_hook(sae)

        def silence(ids):
            return Latents(point, tuple(ids))

        def mass(acts, ids):
            return sae_lib.latent_output_mass(acts, sae, ids)
    failures = conditions.questions("evaluation", ("failure",))
    prompts = [conditions.task.prompt(q, conditions.fmt, model.tokenizer) for q in failures]
    acts = last_prompt_activations(model, prompts, hook, conditions.batch_size)
    block = silence_name("mlp", layer)
    conditions.run(block, [Silence(layer, "mlp")], "evaluation", ("failure",))  # stored already at the identified layer
    arms = [("top", None, top)]
    arms += [("random", s, random_units(size, k, s, exclude=top)) for s in range(seeds)]
    rows = [{"arm": "block", "seed": None, "units": [], "mass": 1.0,
             **conditions.rates(block, "evaluation", ("failure",))}]
    for arm, seed, ids in tqdm(arms, desc=f"{kind} at MLP {layer}", unit="set"):
        name = f"{kind}-{arm}{k}" + (f"-s{seed}" if seed is not None else "") + f"-L{layer}"
        conditions.run(name, [silence(ids)], "evaluation", ("failure",))
        rows.append({"arm": arm, "seed": seed, "units": list(ids), "mass": mass(acts, ids),
                     **conditions.rates(name, "evaluation", ("failure",))})
    table = pd.DataFrame(rows).drop(columns=[c for c in ("breakage", "breakage_lo", "breakage_hi", "breakage_n",
                                                         "breakage_k")])
    whole = float(table.repair.iloc[0])
    table["repair_vs_block"] = table.repair / whole if whole > 0 else np.nan
    table["space"] = "SAE latents" if sae is not None else "MLP units"
    return table


def calibration_prompts(conditions: Conditions, panel: str) -> list[str]:
    return [conditions.task.prompt(q, conditions.fmt, conditions.model.tokenizer)
            for q in conditions.questions("calibration", (panel,))]
