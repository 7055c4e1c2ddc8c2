"""Which MLP block the study goes on with, its runner-ups, the margins between them, and the verdict.

The layer and the runner-ups are chosen on the calibration sweep; margins and the verdict use the evaluation
questions only. A **margin** is the paired difference of repair rates between the identified block and a
runner-up over the same evaluation failures (`stats.paired_comparison`): Newcombe's (1998) square-and-add
interval for paired proportions and the exact McNemar p-value. A locus is claimed only when the identified block
repairs more than every evaluated runner-up by the exact test at 0.05 (`stats.paired_direction`, the rule of every
A-vs-B verdict) and its repair interval lies above its own breakage interval.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from reach_lens.stats import paired_comparison, paired_direction, significance_words

LAYER_RULES = ("net", "repair")
RULE_TEXT = {"net": "largest repair minus healthy breakage", "repair": "largest repair (the paper's rule)"}
COMPONENT_NAMES = {"mlp": "MLP", "attn": "attention", "layer": "whole layer"}


def component_name(component: str, layer: int) -> str:
    return f"{COMPONENT_NAMES.get(component, component)} {int(layer)}"


def _scored(sweep: pd.DataFrame, rule: str) -> pd.DataFrame:
    """Rows ranked by ``rule`` (ties: lower breakage, then lower layer, then component name)."""
    if rule not in LAYER_RULES:
        raise ValueError(f"layer rule {rule!r} unknown; expected one of {LAYER_RULES}")
    score = sweep.repair - sweep.breakage if rule == "net" else sweep.repair
    return sweep.assign(score=score).sort_values(["score", "breakage", "layer", "component"],
                                                 ascending=[False, True, True, True])


def identify_layer(sweep: pd.DataFrame, rule: str = "net") -> int:
    """The MLP block the study goes on with, from a sweep (columns layer, component, repair, breakage).

    ``"repair"`` is the paper's rule: the largest MLP repair. ``"net"`` (default) takes the largest MLP repair
    minus healthy breakage, so a block whose silencing breaks the model everywhere (repairing failures by
    changing every answer) is not taken for a locus.
    """
    mlp = sweep[sweep.component == "mlp"]
    if not len(mlp):
        raise ValueError("the sweep has no MLP rows (component == 'mlp'); cannot identify a layer")
    return int(_scored(mlp, rule).iloc[0].layer)


def runner_ups(sweep: pd.DataFrame, layer: int, rule: str = "net", top: int = 3) -> pd.DataFrame:
    """The best other components by ``rule``: the ``top`` best of any kind, plus the best other MLP block when it
    is not among them. The identified MLP and the whole layer around it (which contains it) do not compete.

    Columns: those of ``sweep``, score, rank (1 = best of any kind), label ("best component", "best other MLP",
    both, or "runner-up k").
    """
    if top < 1:
        raise ValueError(f"top {top} out of range: expected >= 1")
    own = (sweep.layer == layer) & sweep.component.isin(["mlp", "layer"])
    ranked = _scored(sweep[~own], rule).reset_index(drop=True)
    if not len(ranked):
        raise ValueError(f"no component besides MLP {layer} in the sweep: nothing to compare it with")
    ranked["rank"] = np.arange(1, len(ranked) + 1)
    chosen = ranked.head(top)
    mlp = ranked[ranked.component == "mlp"]
    if len(mlp) and mlp.index[0] not in chosen.index:
        chosen = pd.concat([chosen, mlp.head(1)])
    best_mlp = mlp.index[0] if len(mlp) else None
    labels = []
    for i in chosen.index:
        names = (["best component"] if i == 0 else []) + (["best other MLP"] if i == best_mlp else [])
        labels.append(", ".join(names) or f"runner-up {i + 1}")
    return chosen.assign(label=labels).reset_index(drop=True)


def margins(identified: pd.Series, others: dict[str, pd.Series]) -> pd.DataFrame:
    """Paired repair margins of the identified block over each runner-up: ``others`` maps a runner-up's name to
    its per-question outcomes on the same failures (bool Series indexed by question_id, as ``identified``).

    Columns: name, diff, lo, hi (Newcombe 95%), p (exact McNemar), n, a_only (repaired only by the identified
    block), b_only.
    """
    rows = []
    for name, outcome in others.items():
        if set(outcome.index) != set(identified.index):
            raise ValueError(f"{name}: outcomes over other questions than the identified block's; margins are paired")
        paired = paired_comparison(identified.to_numpy(), outcome.loc[identified.index].to_numpy())
        rows.append({"name": name, **paired})
    return pd.DataFrame(rows, columns=["name", "diff", "lo", "hi", "p", "n", "a_only", "b_only"])


def verdict(identified: str, rates: dict, margin_table: pd.DataFrame) -> dict:
    """Whether ``identified`` (a name) is a locus, from its evaluation ``rates`` (repair/breakage with intervals)
    and its ``margin_table`` over the runner-ups.

    Returns locus (bool), ties (runner-ups whose exact paired test of the repair difference is not significant at
    0.05, `stats.paired_direction`), beaten_by (significant in the runner-up's favour), selective (repair interval above the breakage interval) and a sentence.
    """
    ways = {r.name: paired_direction(r._asdict()) for r in margin_table.itertuples()}
    ties = [name for name, way in ways.items() if way == "tie"]
    beaten = [name for name, way in ways.items() if way == "b"]
    words = {r.name: significance_words(r._asdict(), names=(identified, r.name)) for r in margin_table.itertuples()}
    selective = bool(rates["repair_lo"] > rates["breakage_hi"])
    locus = bool(len(margin_table)) and not ties and not beaten and selective
    if locus:
        text = (f"{identified} is a locus: on the evaluation failures it repairs more than every runner-up (each "
                "exact paired test significant at 0.05) and its repair interval lies above its breakage interval.")
    else:
        reasons = [f"{t} ties with it: {words[t]}" for t in ties] + [words[t] for t in beaten]
        if not selective:
            reasons.append("its repair interval does not lie above its breakage interval")
        text = f"No locus claimed for {identified}: " + "; ".join(reasons or ["no runner-up was evaluated"]) + "."
    return {"locus": locus, "ties": ties, "beaten_by": beaten, "selective": selective, "text": text}
