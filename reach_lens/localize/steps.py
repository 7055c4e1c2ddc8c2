"""The study's steps on ``Conditions``: what is chosen on calibration questions, what is measured on evaluation.

1. ``selection_sweep`` (calibration): silence the MLP and the attention of every swept layer.
2. ``evaluate_choice`` (evaluation): the identified MLP, attention and whole layer at its layer, the runner-ups
   chosen on calibration; paired margins and the verdict.
3. ``steering``: rescue (-alpha v on failures) and induction (+alpha v on healthy questions) at each alpha on
   both splits; each direction's dose is chosen on calibration and reported on evaluation; a random direction of
   v's norm at every alpha on evaluation. v is measured at the last prompt token (``mlp_direction``); the
   steering adds alpha v to the MLP output at EVERY position, the prompt's and each generated token's.
4. ``units.unit_arms`` (evaluation failures): the top-k units (or SAE latents) along v against random-k sets,
   relative to the block.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm import tqdm

from reach_lens.hooks import LAYER_OUTPUTS
from reach_lens.interventions import Silence, Steer
from reach_lens.localize.conditions import Conditions
from reach_lens.localize.panels import ROLES
from reach_lens.localize.verdict import component_name, margins, runner_ups, verdict

SWEPT = ("mlp", "attn")  # the components every layer competes with; the whole layer is a control at one layer
COMPONENT_SITES = {"mlp": "hook_mlp_out", "attn": "hook_attn_out", "layer": LAYER_OUTPUTS}  # what is silenced
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


def silence_component(component: str, layer: int) -> Silence:
    """The study's component ("mlp", "attn" or "layer", ``COMPONENT_SITES``) of ``layer``, silenced."""
    if component not in COMPONENT_SITES:
        raise ValueError(f"component {component!r} unknown; valid: {', '.join(map(repr, COMPONENT_SITES))}")
    return Silence(layer, COMPONENT_SITES[component])


def selection_sweep(conditions: Conditions, layers: Sequence[int], components: Sequence[str] = SWEPT) -> pd.DataFrame:
    """Repair and breakage on the calibration panels with each component of each layer silenced.

    Columns: layer, component, role, repair*, breakage* (``panel_rates``)."""
    rows = []
    for layer, component in tqdm([(l, c) for l in layers for c in components], desc="selection sweep (calibration)",
                                 unit="cond"):
        name = silence_name(component, layer)
        conditions.run(name, [silence_component(component, layer)], "calibration")
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
        conditions.run(name, [silence_component(component, at)], "evaluation")
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
    random direction of v's norm at every alpha on evaluation (the control that says whether v is special, at
    every dose reported). ``alpha v`` is added at ``blocks.{layer}.hook_mlp_out`` at every position: each prompt
    token and each generated token.

    Returns (table, doses): rows role ("calibration" | "evaluation" | "random direction"), alpha, rescue* (repair
    of the failures under -alpha v), induction* (breakage of the healthy questions under +alpha v); doses =
    {"rescue": alpha, "induction": alpha}, each the largest calibration rate (the smaller alpha on ties).
    """
    def run(name: str, direction: tuple, alpha: float, role: str, which: str) -> dict:
        panel, sign, measure = ("failure", -1, "repair") if which == "rescue" else ("healthy", 1, "breakage")
        conditions.run(name, [Steer(layer, direction, sign * alpha)], role, (panel,))
        rates = conditions.rates(name, role, (panel,))
        return {k.replace(measure, which): rates[k] for k in rates if measure in k}

    noise = torch.randn(len(v), generator=torch.Generator().manual_seed(seed))
    random = tuple((noise * v.norm() / noise.norm()).tolist())
    vector, rows = tuple(v.tolist()), []
    for role in ROLES:
        for alpha in tqdm(alphas, desc=f"steering at MLP {layer} ({role})", unit="alpha"):
            rows.append({"role": role, "alpha": alpha,
                         **run(f"steer-rescue-a{alpha:g}-L{layer}", vector, alpha, role, "rescue"),
                         **run(f"steer-induce-a{alpha:g}-L{layer}", vector, alpha, role, "induction")})
    for alpha in tqdm(alphas, desc=f"random direction at MLP {layer} (evaluation)", unit="alpha"):
        rows.append({"role": "random direction", "alpha": alpha,
                     **run(f"steer-random{seed}-rescue-a{alpha:g}-L{layer}", random, alpha, "evaluation", "rescue"),
                     **run(f"steer-random{seed}-induction-a{alpha:g}-L{layer}", random, alpha, "evaluation",
                           "induction")})
    cal = pd.DataFrame(rows).query("role == 'calibration'")
    doses = {d: float(cal.sort_values([d, "alpha"], ascending=[False, True]).iloc[0].alpha)
             for d in ("rescue", "induction")}
    return pd.DataFrame(rows), doses


def calibration_prompts(conditions: Conditions, panel: str) -> list[str]:
    return [conditions.task.prompt(q, conditions.fmt, conditions.model.tokenizer)
            for q in conditions.questions("calibration", (panel,))]
