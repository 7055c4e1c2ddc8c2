"""Hook factories: functions that make TransformerLens hook functions, and the position tracker they use.

A hook is `fn(act, hook) -> act`. Every factory returns `Hooks`, a `list[tuple[str, HookFn]]`, so composing
hooks is list concatenation and the result goes straight into `with model.hooks(fwd_hooks=...)` (which removes
every hook on exit, also when the forward raises). Parameters are bound by closure, never read back from
`hook.name`. The serializable interventions that call these factories are in `reach_lens.interventions`.

Hook points used (layer l): `blocks.{l}.hook_attn_out`, `blocks.{l}.hook_mlp_out` (what attention and MLP add
to the residual stream), `blocks.{l}.hook_resid_pre/post`, `blocks.{l}.mlp.hook_post` (MLP hidden units,
[batch, pos, d_mlp]) and `blocks.{l}.attn.hook_attn_scores` (the position tracker's probe).

Positioned hooks (steering at chosen positions, a per-position mean) find the absolute positions of the
forward they act in from a `PositionSource` when given one (the generation engine's, `reach_lens.positions`),
otherwise from the forward itself (`PositionTracker`).

A hook marked `positionwise` (`positionwise(fn)`) computes each position's output from that position's
activation alone, by the same rule at every position and in every batch row. The generation engine may then
run a token prefix that every prompt of a call shares once under the hooks, instead of once per prompt; an
unmarked hook (a hook at chosen positions, any hook registered on the model by hand) is never shared that way.
"""
from typing import Callable, Optional, Sequence, Union

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.hook_points import HookPoint

from reach_lens.positions import PositionSource

HookFn = Callable[..., Tensor]
Hooks = list[tuple[str, HookFn]]

SILENCE_SITES = {"attn": ("hook_attn_out",), "mlp": ("hook_mlp_out",), "layer": ("hook_attn_out", "hook_mlp_out")}
STEER_SITES = ("mlp_out", "attn_out", "resid_pre", "resid_post")
SILENCE_MODES = ("zero", "mean")
UNIT_MODES = ("keep", "zero", "scale")


def positionwise(fn: HookFn) -> HookFn:
    """Mark `fn` as acting on each position alone, the same way at every position (module docstring)."""
    fn.positionwise = True
    return fn


def is_positionwise(fn: HookFn) -> bool:
    return getattr(fn, "positionwise", False) is True


def check_layer(layer: int, n_layers: int) -> None:
    """Raise ValueError unless 0 <= layer < n_layers."""
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} out of range for a {n_layers}-layer model (0..{n_layers - 1})")


def check_choice(name: str, value: str, valid: Sequence[str]) -> None:
    """Raise ValueError unless `value` is one of `valid`, naming `name`, the value and the valid ones."""
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(map(repr, valid))}")


# ---------------------------------------------------------------- positions under a KV cache


class PositionTracker:
    """Which absolute positions the hooks of block `layer` see, for positioned hooks built without a source.

    The generation engine declares each row's own positions on a `PositionSource` (`reach_lens.positions`), and
    positioned hooks built with it use those: exact per row in batches of mixed lengths, refilled slots and
    padded caches. Hooks built without one (for a plain forward, TransformerLens's own `generate`) use this
    tracker: under a KV cache a decode step shows hooks only `[batch, 1, ...]`. The block's own attention
    scores, `[batch, head, query_pos, key_pos]`, tell where those positions are: `key_pos - query_pos`
    is the number of cached positions, i.e. the absolute position of the first query. `probe` reads it
    on every call of the block, so the block's later hooks (`hook_attn_out`, `mlp.hook_post`,
    `hook_mlp_out`, `hook_resid_post`) know their positions exactly: in a plain forward, under
    TransformerLens's cache (`generate` included), with `start_at_layer`, and in a hand-written block loop
    (a repeated block is probed at each call). Positions are columns of the token tensor (left padding included).

    A forward without cache (`key_pos == query_pos`) is a prompt: its length is the `prompt_len`
    against which negative positions count (-1 = last prompt position), also in later decode steps.
    In an uncached generation loop every forward is a fresh prompt, so use positions >= 0 there.

    `hook_resid_pre` fires before the block's attention, so `predict` guesses: a call of more than one
    position starts at 0 (a prompt), a one-position call continues the previous one (a decode step).
    The probe then checks the guess; if it was wrong and changed which positions were touched, the
    forward raises RuntimeError (e.g. chunked prefill into a cache, a repeated block decoding, or a
    one-token prompt after earlier forwards under the same hooks).
    """

    def __init__(self, layer: int):
        self.layer = layer
        self.start: Optional[int] = None
        self.n = 0
        self.prompt_len: Optional[int] = None
        self._check: Optional[tuple[tuple[int, ...], list[int]]] = None

    def probe(self) -> tuple[str, HookFn]:
        """The hook that reads the cache offset from this block's attention scores."""

        def observe(scores: Tensor, hook: HookPoint) -> Tensor:
            self.n, self.start = scores.shape[-2], scores.shape[-1] - scores.shape[-2]
            if self.start == 0:
                self.prompt_len = self.n
            if self._check is not None:
                positions, guessed = self._check
                self._check = None
                actual = self.local(positions)
                if actual != guessed:
                    raise RuntimeError(
                        f"hook_resid_pre of layer {self.layer} guessed local positions {guessed} for "
                        f"{positions}, but the block sees absolute positions {self.start}..{self.start + self.n - 1} "
                        f"(local {actual}); steer at hook_mlp_out/attn_out/resid_post instead"
                    )
            return scores

        return f"blocks.{self.layer}.attn.hook_attn_scores", observe

    def local(self, positions: Sequence[int], start: Optional[int] = None, n: Optional[int] = None,
              prompt_len: Optional[int] = None) -> list[int]:
        """Indices along the pos axis of the current call that hold the given absolute positions."""
        start = self.start if start is None else start
        n = self.n if n is None else n
        prompt_len = self.prompt_len if prompt_len is None else prompt_len
        if start is None:
            raise RuntimeError(f"position probe of layer {self.layer} has not fired: keep its hook in the list")
        out = set()
        for p in positions:
            if p < 0:
                if prompt_len is None:
                    raise RuntimeError(f"negative position {p} counts from the end of the prompt, "
                                       "but no forward without KV cache ran under these hooks")
                if prompt_len + p < 0:
                    raise ValueError(f"position {p} is before the start of a {prompt_len}-position prompt")
                p = prompt_len + p
            if start <= p < start + n:
                out.add(p - start)
        return sorted(out)

    def predict(self, positions: Sequence[int], n: int) -> list[int]:
        """Local indices for a hook that fires before the attention probe; checked by the probe."""
        start = 0 if n > 1 or self.start is None else self.start + self.n
        guessed = self.local(positions, start, n, n if start == 0 else None)
        self._check = (tuple(positions), guessed)
        return guessed


def _add_at(act: Tensor, idx: list[int], delta: Tensor) -> Tensor:
    if not idx:
        return act
    mask = torch.zeros(act.shape[1], 1, dtype=act.dtype, device=act.device)
    mask[idx] = 1.0
    return act + mask * delta


# ---------------------------------------------------------------- hook factories


def silence_hooks(
    model: HookedTransformer,
    layer: int,
    site: str = "mlp",
    mode: str = "zero",
    mean: Union[Float[Tensor, "d_model"], Float[Tensor, "pos d_model"], None] = None,
    source: Optional[PositionSource] = None,
) -> Hooks:
    """Replace what the MLP, the attention or both (`site` "mlp", "attn", "layer") of `layer` add to the residual
    stream.

    mode "zero": by zeros. mode "mean": by `mean`, one [d_model] vector for every position, or [pos, d_model]
    indexed by absolute position (from `source` when given, else from a PositionTracker: exact under a KV cache).
    Zeroing both outputs of a layer is skipping it. Mean mode needs one site ("attn" or "mlp").
    """
    check_layer(layer, model.cfg.n_layers)
    check_choice("site", site, tuple(SILENCE_SITES))
    check_choice("mode", mode, SILENCE_MODES)
    names = [f"blocks.{layer}.{h}" for h in SILENCE_SITES[site]]
    if mode == "zero":
        if mean is not None:
            raise ValueError("mode 'zero' takes no mean; use mode='mean'")
        return [(name, positionwise(lambda act, hook: torch.zeros_like(act))) for name in names]
    if mean is None or site == "layer":
        raise ValueError(f"mode 'mean' needs a mean and one site ('attn' or 'mlp'), got {site!r}")
    if mean.ndim not in (1, 2) or mean.shape[-1] != model.cfg.d_model:
        raise ValueError(f"mean of shape {tuple(mean.shape)}; expected [d_model] or [pos, d_model], d_model={model.cfg.d_model}")
    if mean.ndim == 1:
        return [(names[0], positionwise(lambda act, hook: mean.to(act).expand_as(act).clone()))]

    def check_reach(reach: int) -> None:
        if reach >= mean.shape[0]:
            raise ValueError(f"mean covers {mean.shape[0]} positions; the forward reaches position {reach}")

    if source is not None:
        def replace_rows(act: Tensor, hook: HookPoint) -> Tensor:
            rows = source.rows(act, hook.name)
            check_reach(int(rows.positions.max()))
            return mean.to(act)[rows.positions.clamp(min=0).to(act.device)]

        return [(names[0], replace_rows)]
    tracker = PositionTracker(layer)

    def replace(act: Tensor, hook: HookPoint) -> Tensor:
        check_reach(tracker.start + act.shape[1] - 1)
        return mean[tracker.start:tracker.start + act.shape[1]].to(act).expand_as(act).clone()

    return [tracker.probe(), (names[0], replace)]


def steer_hooks(
    model: HookedTransformer,
    layer: int,
    v: Float[Tensor, "d_model"],
    alpha: float,
    site: str = "mlp_out",
    positions: Optional[Sequence[int]] = None,
    source: Optional[PositionSource] = None,
) -> Hooks:
    """Add `alpha * v` at `blocks.{layer}.hook_{site}`, at every position or at absolute `positions`.

    Negative positions count from the end of the prompt. The positions of a forward come from `source` when
    given, else from a PositionTracker (exact under a KV cache).
    """
    check_layer(layer, model.cfg.n_layers)
    check_choice("site", site, STEER_SITES)
    if v.shape != (model.cfg.d_model,):
        raise ValueError(f"steering vector of shape {tuple(v.shape)}; expected ({model.cfg.d_model},)")
    name = f"blocks.{layer}.hook_{site}"
    delta = alpha * v
    if positions is None:
        return [(name, positionwise(lambda act, hook: act + delta.to(act)))]
    if len(positions) == 0:
        raise ValueError("positions is empty; pass None to steer every position")
    positions = tuple(positions)
    if source is not None:
        def add_rows(act: Tensor, hook: HookPoint) -> Tensor:
            return act + source.rows(act, hook.name).at(positions)[..., None].to(act) * delta.to(act)

        return [(name, add_rows)]
    tracker = PositionTracker(layer)
    before_attention = site == "resid_pre"

    def add(act: Tensor, hook: HookPoint) -> Tensor:
        idx = tracker.predict(positions, act.shape[1]) if before_attention else tracker.local(positions)
        return _add_at(act, idx, delta.to(act))

    return [tracker.probe(), (name, add)]


def unit_hooks(model: HookedTransformer, layer: int, units: Sequence[int], mode: str = "keep",
               factor: Optional[float] = None) -> Hooks:
    """At `blocks.{layer}.mlp.hook_post` ([batch, pos, d_mlp]): keep only `units` (zero the rest), zero them, or
    multiply them by `factor` (mode "scale", which needs one)."""
    check_layer(layer, model.cfg.n_layers)
    check_choice("mode", mode, UNIT_MODES)
    if (mode == "scale") != (factor is not None):
        raise ValueError(f"factor={factor!r} with mode {mode!r}: mode 'scale' needs a factor, the others take none")
    d_mlp = model.cfg.d_mlp
    bad = [u for u in units if not 0 <= u < d_mlp]
    if bad:
        raise ValueError(f"unit {bad[0]} out of range for d_mlp={d_mlp} (0..{d_mlp - 1})")
    idx = list(units)
    device = model.blocks[layer].mlp.W_out.device
    factors = torch.zeros(d_mlp, device=device) if mode == "keep" else torch.ones(d_mlp, device=device)
    factors[idx] = {"keep": 1.0, "zero": 0.0, "scale": factor}[mode]
    return [(f"blocks.{layer}.mlp.hook_post", positionwise(lambda act, hook: act * factors.to(act)))]


def through_saes(hooks: Hooks, model: HookedTransformer) -> Hooks:
    """`hooks` with each hook point that an attached SAELens SAE occupies renamed to that SAE's `hook_sae_output`
    (what flows on from there), so e.g. `Silence(3, "mlp")` still zeroes what the MLP of layer 3 adds when an SAE
    sits at `blocks.3.hook_mlp_out` (TransformerLens refuses hooks on the SAE's module itself). Other hooks, and
    every hook on a model without SAEs, are returned unchanged."""
    saes = getattr(model, "acts_to_saes", {})
    occupied = {sae.cfg.metadata.hook_name_out or hook for hook, sae in saes.items()}
    return [(f"{name}.hook_sae_output" if isinstance(name, str) and name in occupied else name, fn)
            for name, fn in hooks]
