"""Planted failures with a known locus, for the positive controls.

- **bias push** (easy): the output bias of one MLP block adds ``strength * push`` at every position, the same
  on every question. Silencing many blocks that carry letter preference can undo it, and no direction or unit
  carries it.
- **unit plant** (selective): a rank-1 edit of one MLP block's ``W_out``, ``W_out[u] += strength * w_u * push``
  on a few units ``u`` chosen because they fire on only part of the question pool. The push then scales with
  those units' activations: questions that trigger them fail, the others hardly move. Steering along v and the
  top units have a known answer (the push and the planted units).

``push`` raises one answer letter's logit over the others (``answer_push``). ``UnitPlant`` is the unit plant as
an intervention (hooks equal in effect to the edit), for the strength search without a copy of the model.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

from reach_lens.hooks import UNITS_SITE, Hooks, check_layer, hook_point, positionwise
from reach_lens.interventions import Intervention, Vector
from reach_lens.positions import PositionSource


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
    """A copy of ``model`` whose MLP block at ``layer`` adds ``strength * push`` at every position (its output bias).

    Its effect equals ``Steer(layer, push, strength, "hook_mlp_out")``; silencing that MLP removes it entirely.
    """
    check_layer(layer, model.cfg.n_layers)
    planted = copy.deepcopy(model)
    with torch.no_grad():
        planted.blocks[layer].mlp.b_out.add_(strength * push.to(planted.blocks[layer].mlp.b_out))
    planted.cfg.model_name = f"{model.cfg.model_name}-planted-L{layer}"
    return planted


def trigger_units(acts: Float[Tensor, "n d_mlp"], k: int, share: float = 0.3,
                  perturbed: Sequence[Float[Tensor, "n d_mlp"]] = (), seeds: int = 3, candidates: int = 64) -> dict:
    """``k`` MLP units that fire together on about ``share`` of the questions and stay near zero on the others,
    from their activations ``acts`` (one row per question, at the last prompt token). With ``perturbed`` (the same
    activations with one upstream component silenced, each), the set is chosen to keep firing under every one.

    A unit's **contrast** on a question set S is its mean activation on S over its mean |activation| elsewhere
    (plus 5% of the mean |activation| of all units, so that a silent unit scores nothing). Seeds: the ``seeds``
    units with the largest contrast between their own top ``share`` of questions and the rest; a seed's top
    ``share`` is its trigger set S. From the ``candidates`` units of largest contrast on S (positive on S), units
    are added to the seed one at a time, each time the one that keeps the **set's contrast** (that of the trigger
    score ``acts[:, units] @ w``, ``w_u = 1 / (k * mean_S a_u)``, about 1 on S) largest in the worst of ``acts``
    and every ``perturbed``: so that no single upstream block carries the whole trigger. The seed whose set has the
    largest worst-case contrast wins.

    Returns units (sorted list[int]), weights (Tensor [k], in the order of units), triggered (bool Tensor [n], S),
    score (Tensor [n]), seed (int), contrast (the set's worst-case contrast).
    """
    n, d_mlp = acts.shape
    if not 1 <= k <= min(d_mlp, candidates) or not 0 < share < 1 or n < 4:
        raise ValueError(f"k={k} (1..{min(d_mlp, candidates)}), share={share} (0..1) and {n} questions (>= 4) "
                         "out of range")
    views = [acts.float(), *(p.float() for p in perturbed)]
    if any(v.shape != acts.shape for v in views):
        raise ValueError(f"perturbed activations must have the shape of acts {tuple(acts.shape)}")
    clean = views[0]
    m = max(1, min(n - 1, round(share * n)))
    floor = 0.05 * clean.abs().mean()

    def unit_contrast(on_set: Tensor) -> Tensor:  # on_set: [n, d_mlp] bool
        on = (clean * on_set).sum(0) / on_set.sum(0)
        c = on / ((clean.abs() * ~on_set).sum(0) / (~on_set).sum(0) + floor)
        c[on <= 0] = -float("inf")
        return c

    def set_contrast(units: list[int], S: Tensor, weights: Tensor) -> float:
        scores = [v[:, units] @ weights for v in views]
        return min(float(s[S].mean() / (s[~S].abs().mean() + 0.05)) for s in scores)

    own_top = torch.zeros_like(clean, dtype=torch.bool).scatter_(0, clean.argsort(0, descending=True)[:m], True)
    best = None
    for seed in unit_contrast(own_top).argsort(descending=True)[:seeds].tolist():
        S = own_top[:, seed].clone()
        on = clean[S].mean(0)
        ranked = unit_contrast(S[:, None].expand(n, d_mlp))
        pool = [u for u in ranked.argsort(descending=True)[:candidates].tolist() if u != seed and ranked[u] > 0]
        if len(pool) < k - 1:
            continue
        units = [seed]
        while len(units) < k:
            gain = {u: set_contrast(units + [u], S, 1.0 / (k * on[units + [u]])) for u in pool if u not in units}
            units.append(max(gain, key=gain.get))
        found = (set_contrast(units, S, 1.0 / (k * on[units])), seed, sorted(units), S, on)
        if best is None or found[0] > best[0]:
            best = found
    if best is None:
        raise ValueError(f"fewer than {k} units fire (positive mean activation) on any seed's trigger set")
    contrast, seed, units, S, on = best
    weights = 1.0 / (k * on[units])
    return {"units": units, "weights": weights, "triggered": S, "score": clean[:, units] @ weights, "seed": seed,
            "contrast": contrast}


@dataclass(frozen=True)
class UnitPlant(Intervention):
    """The unit plant as hooks, equal in effect to ``plant_unit_failure`` with the same arguments: read ``units`` of
    MLP ``layer`` at ``mlp.hook_post`` (``a``, [batch, pos, k]), add ``strength * (a @ weights) * push`` at its
    ``hook_mlp_out``. ``weights``: [k]; ``push``: [d_model] (tensors, arrays or sequences)."""

    layer: int
    units: tuple[int, ...]
    weights: Vector
    push: Vector
    strength: float
    kind: ClassVar[str] = "unit_plant"
    vector_fields: ClassVar[tuple[str, ...]] = ("weights", "push")

    def __post_init__(self):
        object.__setattr__(self, "layer", int(self.layer))
        object.__setattr__(self, "units", tuple(int(u) for u in self.units))
        object.__setattr__(self, "weights", Vector.of(self.weights))
        object.__setattr__(self, "push", Vector.of(self.push))
        object.__setattr__(self, "strength", float(self.strength))
        if self.weights.shape != (len(self.units),):
            raise ValueError(f"{len(self.units)} units need as many weights, got shape {self.weights.shape}")

    def hooks(self, model: HookedTransformer, source: PositionSource | None = None) -> Hooks:
        units_at = hook_point(UNITS_SITE, self.layer, model)
        out_at = hook_point("hook_mlp_out", self.layer, model)
        idx = list(self.units)
        weights = self.weights.tensor(model.cfg.dtype, model.cfg.device)
        push = self.push.tensor(model.cfg.dtype, model.cfg.device)
        strength = self.strength
        seen: dict[str, Tensor] = {}

        def read(act: Tensor, hook) -> Tensor:
            seen["score"] = act[..., idx] @ weights.to(act)
            return act

        def add(act: Tensor, hook) -> Tensor:
            return act + strength * seen.pop("score")[..., None] * push.to(act)

        return [(units_at, positionwise(read)), (out_at, positionwise(add))]


def plant_unit_failure(model: HookedTransformer, layer: int, units: Sequence[int], weights: Float[Tensor, "k"],
                       push: Float[Tensor, "d_model"], strength: float) -> HookedTransformer:
    """A copy of ``model`` with the rank-1 edit ``W_out[units] += strength * weights[:, None] * push[None]`` at
    ``layer`` (module docstring). Silencing that MLP removes it entirely."""
    check_layer(layer, model.cfg.n_layers)
    if len(units) != len(weights) or len(set(units)) != len(units):
        raise ValueError(f"{len(units)} units (distinct) need as many weights, got {len(weights)}")
    planted = copy.deepcopy(model)
    W_out = planted.blocks[layer].mlp.W_out
    with torch.no_grad():
        W_out[list(units)] += strength * weights.to(W_out)[:, None] * push.to(W_out)[None]
    planted.cfg.model_name = f"{model.cfg.model_name}-planted-units-L{layer}"
    return planted
