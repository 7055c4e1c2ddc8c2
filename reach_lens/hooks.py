"""Hook factories: functions that make TransformerLens hook functions, the one reading of a site as a hook point,
and the position tracker positioned hooks use.

A hook is `fn(act, hook) -> act`. Every factory returns `Hooks`, a `list[tuple[str, HookFn]]`, so composing
hooks is list concatenation and the result goes straight into `with model.hooks(fwd_hooks=...)` (which removes
every hook on exit, also when the forward raises). Parameters are bound by closure, never read back from
`hook.name`. The serializable interventions that call these factories are in `reach_lens.interventions`.

**Sites** are TransformerLens hook names, and `hook_point(site, layer, model)` turns one into the hook point it
names: a name relative to a block (`"hook_mlp_out"`, `"hook_attn_out"`, `"hook_resid_pre"`, `"hook_resid_mid"`,
`"hook_resid_post"`, `"mlp.hook_post"` (MLP hidden units, [batch, pos, d_mlp]), `"attn.hook_z"`, ...) is taken in
block `layer`; a full name (`"blocks.3.hook_mlp_out"`, or one outside the blocks: `"hook_embed"`,
`"ln_final.hook_normalized"`) is taken as it is. `LAYER_OUTPUTS` are what a block adds to the residual stream
(zeroing both skips the block). The position tracker reads `blocks.{l}.attn.hook_attn_scores`.

Positioned hooks (steering at chosen positions, a per-position mean) find the absolute positions of the
forward they act in from a `PositionSource` when given one (the generation engine's, `reach_lens.positions`),
otherwise from the forward itself (`PositionTracker`).

A hook marked `positionwise` (`positionwise(fn)`) computes each position's output from that position's
activation alone, by the same rule at every position and in every batch row. The generation engine may then
run a token prefix that every prompt of a call shares once under the hooks, instead of once per prompt; an
unmarked hook (a hook at chosen positions, any hook registered on the model by hand) is never shared that way.
"""
import difflib
import re
from typing import Callable, Optional, Sequence, Union

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.hook_points import HookPoint

from reach_lens.positions import PositionSource

HookFn = Callable[..., Tensor]
Hooks = list[tuple[str, HookFn]]

LAYER_OUTPUTS = ("hook_attn_out", "hook_mlp_out")  # what block l adds to the residual stream; both zeroed: l skipped
UNITS_SITE = "mlp.hook_post"  # the MLP's hidden units, [batch, pos, d_mlp]
OUTSIDE_BLOCKS = ("hook_tokens", "hook_embed", "hook_pos_embed", "ln_final", "unembed")  # roots of the other points
# block hook points that fire before the block's attention scores (what the position tracker reads)
BEFORE_ATTENTION = ("hook_resid_pre", "hook_attn_in", "hook_q_input", "hook_k_input", "hook_v_input", "ln1.hook_scale",
                    "ln1.hook_normalized", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_rot_q",
                    "attn.hook_rot_k")
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


# ---------------------------------------------------------------- sites


_BLOCK = re.compile(r"^blocks\.(-?\d+)\.(.+)$")


def split_hook_point(name: str) -> tuple[Optional[int], str]:
    """(block, name within it) of a full hook name; (None, name) for a point outside the blocks."""
    match = _BLOCK.match(name)
    return (int(match.group(1)), match.group(2)) if match else (None, name)


def hook_point(site: str, layer: Optional[int] = None, model: Optional[HookedTransformer] = None) -> str:
    """The full TransformerLens hook name of `site` (module docstring): a name relative to a block, in block `layer`;
    a full name as it is, refused when its block is not `layer` (a point outside the blocks takes no layer).

    With `model`, also checked to be a hook point of it (or one an attached SAELens SAE occupies), naming the layer
    range or a few similar hook points when it is not.
    """
    if not isinstance(site, str) or not site.rpartition(".")[2].startswith("hook_"):
        raise ValueError(f"site {site!r} is not a TransformerLens hook name; e.g. 'hook_mlp_out', 'hook_attn_out', "
                         "'hook_resid_pre', 'mlp.hook_post' (in a block), 'blocks.3.hook_mlp_out', 'hook_embed'")
    block, _ = split_hook_point(site)
    if block is not None:
        if layer is not None and block != layer:
            raise ValueError(f"site {site!r} is in block {block}, not in layer {layer}")
        name = site
    elif site.split(".")[0] in OUTSIDE_BLOCKS:
        if layer is not None:
            raise ValueError(f"site {site!r} is outside the blocks: it takes no layer (layer=None), got layer {layer}")
        name = site
    elif layer is None:
        raise ValueError(f"site {site!r} is a hook point inside a block: name the block, by a layer or by the full "
                         f"name (e.g. 'blocks.0.{site}')")
    else:
        name = f"blocks.{layer}.{site}"
    if model is not None:
        _check_on(model, name)
    return name


def _check_on(model: HookedTransformer, name: str) -> None:
    block, _ = split_hook_point(name)
    if block is not None:
        check_layer(block, model.cfg.n_layers)
    points = model.hook_dict
    if name not in points and f"{name}.hook_sae_output" not in points:  # an SAE there: through_saes routes to it
        near = difflib.get_close_matches(name, list(points), n=4) or [
            p for p in (f"blocks.{block or 0}.{s}" for s in ("hook_resid_pre", *LAYER_OUTPUTS, "hook_resid_post"))
            if p in points]
        raise ValueError(f"no hook point {name!r} on this model; e.g. {', '.join(map(repr, near))}")


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

    Hook points that fire before the block's attention (`hook_resid_pre`, `BEFORE_ATTENTION`; `hook_embed` before
    block 0) use `predict`, a guess: a call of more than one position starts at 0 (a prompt), a one-position call
    continues the previous one (a decode step). The probe then checks the guess; if it was wrong and changed what
    the hook did, the forward raises RuntimeError (e.g. chunked prefill into a cache, a repeated block decoding, or
    a one-token prompt after earlier forwards under the same hooks).
    """

    def __init__(self, layer: int):
        self.layer = layer
        self.start: Optional[int] = None
        self.n = 0
        self.prompt_len: Optional[int] = None
        self._check: Optional[Callable[[], Optional[tuple[str, str]]]] = None

    def probe(self) -> tuple[str, HookFn]:
        """The hook that reads the cache offset from this block's attention scores."""

        def observe(scores: Tensor, hook: HookPoint) -> Tensor:
            self.n, self.start = scores.shape[-2], scores.shape[-1] - scores.shape[-2]
            if self.start == 0:
                self.prompt_len = self.n
            if self._check is not None:
                check, self._check = self._check, None
                wrong = check()
                if wrong is not None:
                    guessed, actual = wrong
                    raise RuntimeError(
                        f"a hook before the attention of layer {self.layer} guessed {guessed}, but the block sees "
                        f"absolute positions {self.start}..{self.start + self.n - 1}{actual}; act at a hook point "
                        "after the block's attention (hook_attn_out, hook_resid_mid, hook_mlp_out, hook_resid_post) "
                        "instead"
                    )
            return scores

        return hook_point("attn.hook_attn_scores", self.layer), observe

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

    def first(self) -> int:
        """The absolute position of the current call's first column (for a hook after the attention probe)."""
        if self.start is None:
            raise RuntimeError(f"position probe of layer {self.layer} has not fired: keep its hook in the list")
        return self.start

    def predict(self, positions: Sequence[int], n: int) -> list[int]:
        """Local indices for a hook that fires before the attention probe; checked by the probe."""
        start = self._guess(n)
        guessed = self.local(positions, start, n, n if start == 0 else None)

        def check() -> Optional[tuple[str, str]]:
            actual = self.local(positions)
            return None if actual == guessed else (f"local positions {guessed} for {positions}", f" (local {actual})")

        self._check = check
        return guessed

    def predict_first(self, n: int) -> int:
        """`first` for a hook that fires before the attention probe, of a call of `n` positions; checked by it."""
        start = self._guess(n)
        self._check = lambda: None if self.start == start else (f"that the call starts at position {start}", "")
        return start

    def _guess(self, n: int) -> int:
        return 0 if n > 1 or self.start is None else self.start + self.n


def tracker_for(model: HookedTransformer, name: str) -> tuple[PositionTracker, bool]:
    """A position tracker for hooks at hook point `name`, and whether they fire before the attention it probes
    (then they use `predict`): the point's own block; block 0 for the embeddings, the last block after the blocks."""
    block, within = split_hook_point(name)
    if block is not None:
        return PositionTracker(block), within in BEFORE_ATTENTION
    after = name.startswith(("ln_final", "unembed"))
    return PositionTracker(model.cfg.n_layers - 1 if after else 0), not after


def _add_at(act: Tensor, idx: list[int], delta: Tensor) -> Tensor:
    if not idx:
        return act
    mask = torch.zeros(act.shape[1], *(1,) * (act.ndim - 2), dtype=act.dtype, device=act.device)
    mask[idx] = 1.0
    return act + mask * delta


# ---------------------------------------------------------------- hook factories


def silence_hooks(
    model: HookedTransformer,
    layer: Optional[int],
    site: Union[str, Sequence[str]] = "hook_mlp_out",
    mode: str = "zero",
    mean: Union[Float[Tensor, "d"], Float[Tensor, "pos d"], None] = None,
    source: Optional[PositionSource] = None,
) -> Hooks:
    """Replace the activations at `site` of `layer` (a hook name, or several: `LAYER_OUTPUTS` is all that the layer
    adds to the residual stream; `hook_point`).

    mode "zero": by zeros. mode "mean" (one site): by `mean`, one [d] vector for every position, or [pos, d] indexed
    by absolute position (from `source` when given, else from a PositionTracker: exact under a KV cache), for
    activations [batch, pos, d]. Zeroing both `LAYER_OUTPUTS` of a layer is skipping it.
    """
    check_choice("mode", mode, SILENCE_MODES)
    names = [hook_point(s, layer, model) for s in ((site,) if isinstance(site, str) else site)]
    if not names:
        raise ValueError("site is empty: name at least one hook point")
    if mode == "zero":
        if mean is not None:
            raise ValueError("mode 'zero' takes no mean; use mode='mean'")
        return [(name, positionwise(lambda act, hook: torch.zeros_like(act))) for name in names]
    if mean is None or len(names) != 1:
        raise ValueError(f"mode 'mean' needs a mean and one site, got site {site!r} and "
                         f"{'no mean' if mean is None else 'a mean'}")
    (name,) = names
    if mean.ndim not in (1, 2):
        raise ValueError(f"mean of shape {tuple(mean.shape)}; expected [d] or [pos, d]")

    def check_shape(act: Tensor) -> None:
        if act.shape[-1] != mean.shape[-1] or (mean.ndim == 2 and act.ndim != 3):
            raise ValueError(f"mean of shape {tuple(mean.shape)} for the activations {tuple(act.shape)} at {name}; "
                             "expected [d] or [pos, d] for activations [batch, pos, d]")

    if mean.ndim == 1:
        def replace_all(act: Tensor, hook: HookPoint) -> Tensor:
            check_shape(act)
            return mean.to(act).expand_as(act).clone()

        return [(name, positionwise(replace_all))]

    def check_reach(reach: int) -> None:
        if reach >= mean.shape[0]:
            raise ValueError(f"mean covers {mean.shape[0]} positions; the forward reaches position {reach}")

    if source is not None:
        def replace_rows(act: Tensor, hook: HookPoint) -> Tensor:
            check_shape(act)
            rows = source.rows(act, hook.name)
            check_reach(int(rows.positions.max()))
            return mean.to(act)[rows.positions.clamp(min=0).to(act.device)]

        return [(name, replace_rows)]
    tracker, before_attention = tracker_for(model, name)

    def replace(act: Tensor, hook: HookPoint) -> Tensor:
        check_shape(act)
        start = tracker.predict_first(act.shape[1]) if before_attention else tracker.first()
        check_reach(start + act.shape[1] - 1)
        return mean[start:start + act.shape[1]].to(act).expand_as(act).clone()

    return [tracker.probe(), (name, replace)]


def steer_hooks(
    model: HookedTransformer,
    layer: Optional[int],
    v: Float[Tensor, "d_model"],
    alpha: float,
    site: str = "hook_mlp_out",
    positions: Optional[Sequence[int]] = None,
    source: Optional[PositionSource] = None,
) -> Hooks:
    """Add `alpha * v` at `site` of `layer` (`hook_point`: a hook point whose activations end in d_model), at every
    position or at absolute `positions`.

    Negative positions count from the end of the prompt. The positions of a forward come from `source` when
    given, else from a PositionTracker (exact under a KV cache).
    """
    name = hook_point(site, layer, model)
    d_model = model.cfg.d_model
    if v.shape != (d_model,):
        raise ValueError(f"steering vector of shape {tuple(v.shape)}; expected ({d_model},)")
    delta = alpha * v

    def check_width(act: Tensor) -> None:
        if act.shape[-1] != d_model:
            raise ValueError(f"steering at {name}, whose activations {tuple(act.shape)} do not end in "
                             f"d_model={d_model}; steer where they do (e.g. hook_mlp_out, hook_resid_post)")

    if positions is None:
        def add_all(act: Tensor, hook: HookPoint) -> Tensor:
            check_width(act)
            return act + delta.to(act)

        return [(name, positionwise(add_all))]
    if len(positions) == 0:
        raise ValueError("positions is empty; pass None to steer every position")
    positions = tuple(positions)
    if source is not None:
        def add_rows(act: Tensor, hook: HookPoint) -> Tensor:
            check_width(act)
            hit = source.rows(act, hook.name).at(positions)
            return act + hit.view(*hit.shape, *(1,) * (act.ndim - 2)).to(act) * delta.to(act)

        return [(name, add_rows)]
    tracker, before_attention = tracker_for(model, name)

    def add(act: Tensor, hook: HookPoint) -> Tensor:
        check_width(act)
        idx = tracker.predict(positions, act.shape[1]) if before_attention else tracker.local(positions)
        return _add_at(act, idx, delta.to(act))

    return [tracker.probe(), (name, add)]


def unit_hooks(model: HookedTransformer, layer: int, units: Sequence[int], mode: str = "keep",
               factor: Optional[float] = None) -> Hooks:
    """At `blocks.{layer}.mlp.hook_post` (`UNITS_SITE`, [batch, pos, d_mlp]): keep only `units` (zero the rest),
    zero them, or multiply them by `factor` (mode "scale", which needs one)."""
    name = hook_point(UNITS_SITE, layer, model)
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
    return [(name, positionwise(lambda act, hook: act * factors.to(act)))]


def through_saes(hooks: Hooks, model: HookedTransformer) -> Hooks:
    """`hooks` with each hook point that an attached SAELens SAE occupies renamed to that SAE's `hook_sae_output`
    (what flows on from there), so e.g. `Silence(3, "hook_mlp_out")` still zeroes what the MLP of layer 3 adds when
    an SAE sits at `blocks.3.hook_mlp_out` (TransformerLens refuses hooks on the SAE's module itself). Other hooks, and
    every hook on a model without SAEs, are returned unchanged."""
    saes = getattr(model, "acts_to_saes", {})
    occupied = {sae.cfg.metadata.hook_name_out or hook for hook, sae in saes.items()}
    return [(f"{name}.hook_sae_output" if isinstance(name, str) and name in occupied else name, fn)
            for name, fn in hooks]
