"""Hook factories and serializable interventions for a `HookedTransformer`.

A hook is `fn(act, hook) -> act`. Every factory returns `list[tuple[str, HookFn]]`, so composing
interventions is list concatenation and the result goes straight into
`with model.hooks(fwd_hooks=...)` (which removes every hook on exit, also when the forward raises).
Parameters are bound by closure, never read back from `hook.name`.

Hook points used (layer l): `blocks.{l}.hook_attn_out`, `blocks.{l}.hook_mlp_out` (what attention
and MLP add to the residual stream), `blocks.{l}.hook_resid_pre/post`, `blocks.{l}.mlp.hook_post`
(MLP hidden units, [batch, pos, d_mlp]) and `blocks.{l}.attn.hook_attn_scores` (position probe).

A hook marked `positionwise` (`positionwise(fn)`) computes each position's output from that position's
activation alone, by the same rule at every position and in every batch row. The generation engine may then
run a token prefix that every prompt of a call shares once under the hooks, instead of once per prompt; an
unmarked hook (any user hook, a hook at chosen positions) is never shared that way.
"""
import hashlib
import math
import operator
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Optional, Sequence, Union

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.hook_points import HookPoint

from reach_lens import positions as row_positions

HookFn = Callable[..., Tensor]
Hooks = list[tuple[str, HookFn]]

COMPONENT_HOOKS = {"attn": ("hook_attn_out",), "mlp": ("hook_mlp_out",), "layer": ("hook_attn_out", "hook_mlp_out")}
STEER_HOOKS = ("mlp_out", "attn_out", "resid_pre", "resid_post")
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


def _choice(name: str, value: str, valid: Sequence[str]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(map(repr, valid))}")


# ---------------------------------------------------------------- positions under a KV cache


class PositionTracker:
    """Which absolute positions the hooks of block `layer` see, outside reach_lens's generation engine.

    Inside the engine, every forward declares each row's own positions (`reach_lens.positions`) and the
    positioned hooks below use those: exact per row in batches of mixed lengths, refilled slots and padded
    caches. Outside it (a plain forward, TransformerLens's own `generate`), this tracker finds them: under a KV cache a decode step shows hooks only `[batch, 1, ...]`. The block's own attention
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
    component: str = "mlp",
    mode: str = "zero",
    mean: Union[Float[Tensor, "d_model"], Float[Tensor, "pos d_model"], None] = None,
) -> Hooks:
    """Replace what the MLP, the attention or both ("layer") of `layer` add to the residual stream.

    mode "zero": by zeros. mode "mean": by `mean`, one [d_model] vector for every position, or
    [pos, d_model] indexed by absolute position (exact under a KV cache, via a PositionTracker).
    Zeroing both outputs of a layer is skipping it. Mean mode needs one component ("attn" or "mlp").
    """
    check_layer(layer, model.cfg.n_layers)
    _choice("component", component, tuple(COMPONENT_HOOKS))
    _choice("mode", mode, SILENCE_MODES)
    names = [f"blocks.{layer}.{h}" for h in COMPONENT_HOOKS[component]]
    if mode == "zero":
        if mean is not None:
            raise ValueError("mode 'zero' takes no mean; use mode='mean'")
        return [(name, positionwise(lambda act, hook: torch.zeros_like(act))) for name in names]
    if mean is None or component == "layer":
        raise ValueError(f"mode 'mean' needs a mean and one component ('attn' or 'mlp'), got {component!r}")
    if mean.ndim not in (1, 2) or mean.shape[-1] != model.cfg.d_model:
        raise ValueError(f"mean of shape {tuple(mean.shape)}; expected [d_model] or [pos, d_model], d_model={model.cfg.d_model}")
    if mean.ndim == 1:
        return [(names[0], positionwise(lambda act, hook: mean.to(act).expand_as(act).clone()))]
    tracker = PositionTracker(layer)

    def replace(act: Tensor, hook: HookPoint) -> Tensor:
        rows = row_positions.current()
        if rows is not None:
            rows.check(act, hook.name)
            reach = int(rows.positions.max())
            if reach >= mean.shape[0]:
                raise ValueError(f"mean covers {mean.shape[0]} positions; the forward reaches position {reach}")
            return mean.to(act)[rows.positions.clamp(min=0)]
        end = tracker.start + act.shape[1]
        if end > mean.shape[0]:
            raise ValueError(f"mean covers {mean.shape[0]} positions; the forward reaches position {end - 1}")
        return mean[tracker.start:end].to(act).expand_as(act).clone()

    return [tracker.probe(), (names[0], replace)]


def steer_hooks(
    model: HookedTransformer,
    layer: int,
    v: Float[Tensor, "d_model"],
    alpha: float,
    hook: str = "mlp_out",
    positions: Optional[Sequence[int]] = None,
) -> Hooks:
    """Add `alpha * v` at `blocks.{layer}.hook_{hook}`, at every position or at absolute `positions`.

    Negative positions count from the end of the prompt. Exact under a KV cache (see PositionTracker).
    """
    check_layer(layer, model.cfg.n_layers)
    _choice("hook", hook, STEER_HOOKS)
    if v.shape != (model.cfg.d_model,):
        raise ValueError(f"steering vector of shape {tuple(v.shape)}; expected ({model.cfg.d_model},)")
    name = f"blocks.{layer}.hook_{hook}"
    delta = alpha * v
    if positions is None:
        return [(name, positionwise(lambda act, hook: act + delta.to(act)))]
    if len(positions) == 0:
        raise ValueError("positions is empty; pass None to steer every position")
    tracker = PositionTracker(layer)
    positions = tuple(positions)
    before_attention = hook == "resid_pre"

    def add(act: Tensor, hook: HookPoint) -> Tensor:
        rows = row_positions.current()
        if rows is not None:
            rows.check(act, hook.name)
            return act + rows.at(positions)[..., None].to(act) * delta.to(act)
        idx = tracker.predict(positions, act.shape[1]) if before_attention else tracker.local(positions)
        return _add_at(act, idx, delta.to(act))

    return [tracker.probe(), (name, add)]


def unit_hooks(model: HookedTransformer, layer: int, units: Sequence[int], mode: str = "keep",
               factor: float = 0.0) -> Hooks:
    """At `blocks.{layer}.mlp.hook_post`: keep only `units` (zero the rest), zero them, or scale them by `factor`."""
    check_layer(layer, model.cfg.n_layers)
    _choice("mode", mode, UNIT_MODES)
    d_mlp = model.cfg.d_mlp
    bad = [u for u in units if not 0 <= u < d_mlp]
    if bad:
        raise ValueError(f"unit {bad[0]} out of range for d_mlp={d_mlp} (0..{d_mlp - 1})")
    idx = list(units)
    device = model.blocks[layer].mlp.W_out.device
    factors = torch.zeros(d_mlp, device=device) if mode == "keep" else torch.ones(d_mlp, device=device)
    factors[idx] = {"keep": 1.0, "zero": 0.0, "scale": factor}[mode]
    return [(f"blocks.{layer}.mlp.hook_post", positionwise(lambda act, hook: act * factors.to(act)))]


# ---------------------------------------------------------------- unit selection


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


# ---------------------------------------------------------------- routes (validation)


def validate_route(path: Sequence[int], n_layers: int, max_len: Optional[int] = None) -> tuple[int, ...]:
    """Check a route (layer indices, run in order) and return it as a tuple; max_len defaults to 2·n_layers."""
    max_len = 2 * n_layers if max_len is None else max_len
    try:
        path = tuple(operator.index(layer) for layer in path)
    except TypeError:
        raise ValueError(f"route {list(path)} has a layer that is not an integer") from None
    if not path:
        raise ValueError("route is empty; it needs at least one layer")
    for layer in path:
        if not 0 <= layer < n_layers:
            raise ValueError(f"route {list(path)} has layer {layer!r}, out of range for a "
                             f"{n_layers}-layer model (0..{n_layers - 1})")
    if len(path) > max_len:
        raise ValueError(f"route of length {len(path)} exceeds max_len {max_len}: {list(path)}")
    return path


def is_skip_only(path: Sequence[int]) -> bool:
    """True if the route only deletes layers (strictly increasing), so a skip mask can run it."""
    return all(a < b for a, b in zip(path, path[1:]))


# ---------------------------------------------------------------- serializable interventions
#
# One convention for every intervention: where first (the layer; for SAE latents, the hook the SAE is attached
# at), then what (component, vector, units, latents), then the mode, then its number. Mode words: "zero"
# (replace by zeros), "mean" (replace by a mean), "keep" (zero all others), "scale" (multiply by `factor`); Steer
# adds `alpha * v`. Vectors are given as tensors (or arrays, or sequences) and recorded in protocols by their
# content hash; the vectors themselves are saved beside the run (`RunStore`, `vectors/<sha256>.npy`).


def _floats(x: Iterable[float]) -> tuple[float, ...]:
    out = tuple(float(e) for e in x)
    if not all(math.isfinite(e) for e in out):
        raise ValueError(f"non-finite value in {out}")
    return out


def _integers(name: str, values: Iterable) -> tuple[int, ...]:
    """Values that are integers (bools and floats such as 1.5 or 1.0 are refused), as a tuple of ints."""
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must be integers, got {v!r} ({type(v).__name__})")
        out.append(int(v))
    return tuple(out)


def _layer(kind: str, layer: object, new_spelling: str) -> int:
    """The layer argument, an int; a string there is the old argument order, refused naming the new one."""
    if isinstance(layer, str):
        raise TypeError(f"{kind}({layer!r}, ...): the layer comes first now, e.g. {new_spelling}")
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
        raise TypeError(f"{kind}: layer {layer!r} must be an int")
    return int(layer)


@dataclass(frozen=True, eq=False)
class Vector:
    """A read-only float64 vector or matrix of an intervention, equal and hashed by content (``sha256`` of its
    shape and bytes). ``Vector.of`` takes a tensor, an array or (nested) sequences of numbers."""

    values: np.ndarray

    @classmethod
    def of(cls, x: Union["Vector", Tensor, np.ndarray, Sequence]) -> "Vector":
        if isinstance(x, Vector):
            return x
        if isinstance(x, Tensor):
            x = x.detach().to("cpu", torch.float64).numpy()
        values = np.array(x, dtype=np.float64)
        if values.ndim not in (1, 2) or values.size == 0:
            raise ValueError(f"a vector must be 1-d ([d_model]) or 2-d ([pos, d_model]) and non-empty, got shape "
                             f"{values.shape}")
        if not np.isfinite(values).all():
            raise ValueError("non-finite value in the vector")
        values.setflags(write=False)
        return cls(values)

    @property
    def sha256(self) -> str:
        digest = hashlib.sha256(repr(self.values.shape).encode())
        digest.update(np.ascontiguousarray(self.values).tobytes())
        return digest.hexdigest()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    def tensor(self, dtype: torch.dtype, device) -> Tensor:
        return torch.tensor(self.values, dtype=dtype, device=device)

    def to_dict(self) -> dict:
        """What a protocol records: ``{"sha256", "shape"}`` (the values go to the run's ``vectors/``)."""
        return {"sha256": self.sha256, "shape": list(self.shape)}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vector) and self.sha256 == other.sha256

    def __hash__(self) -> int:
        return hash(self.sha256)

    def __repr__(self) -> str:
        return f"Vector(shape={self.shape}, sha256={self.sha256[:12]})"


def _vector_from_dict(value, vectors: "Mapping[str, np.ndarray] | Path | str | None", where: str) -> Vector:
    """A vector field of a stored intervention: ``{"sha256", "shape"}`` looked up in ``vectors`` (a mapping or a run's
    ``vectors/`` directory), or the values themselves (records written before vectors were hashed)."""
    if not isinstance(value, dict):
        return Vector.of(value)
    sha = value.get("sha256")
    found = None
    if isinstance(vectors, (str, Path)):
        path = Path(vectors) / f"{sha}.npy"
        found = np.load(path) if path.is_file() else None
    elif vectors is not None:
        found = vectors.get(sha)
    if found is None:
        raise ValueError(f"{where} is recorded by its hash sha256={sha}: pass vectors= (a mapping, or the run "
                         "directory's vectors/ folder, which holds it)")
    vector = Vector.of(found)
    if vector.sha256 != sha:
        raise ValueError(f"{where}: the vector found for sha256={sha} hashes to {vector.sha256}")
    return vector


_VECTOR_FIELDS = {"silence": ("mean",), "steer": ("v",)}


class _Intervention:
    """to_dict (JSON-able; vectors by hash) and from_dict for the frozen dataclasses below."""

    kind: ClassVar[str]

    def to_dict(self) -> dict:
        out = {"kind": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, Vector) else _jsonable(value)
        return out

    def vectors(self) -> dict[str, np.ndarray]:
        """The vectors of this intervention by their sha256 (what ``to_dict`` records by hash)."""
        return {v.sha256: v.values for f in fields(self) if isinstance(v := getattr(self, f.name), Vector)}

    @classmethod
    def from_dict(cls, d: dict, vectors: "Mapping[str, np.ndarray] | Path | str | None" = None):
        if d.get("kind") != cls.kind:
            raise ValueError(f"kind {d.get('kind')!r} is not {cls.kind!r}")
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names - {"kind"}
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)} for {cls.kind}; valid: {sorted(names)}"
                             + _renamed(cls.kind, unknown))
        values = {k: _tupled(v) for k, v in d.items() if k != "kind"}
        for name in _VECTOR_FIELDS.get(cls.kind, ()):
            if values.get(name) is not None:
                values[name] = _vector_from_dict(d[name], vectors, f"{cls.kind}.{name}")
        return cls(**values)


_RENAMED = {("units", "scale"): "factor", ("latents", "alpha"): "factor"}


def _renamed(kind: str, unknown: Iterable[str]) -> str:
    hints = [f"{old!r} is now {_RENAMED[(kind, old)]!r}" for old in sorted(unknown) if (kind, old) in _RENAMED]
    return f" ({'; '.join(hints)})" if hints else ""


def _jsonable(x):
    return [_jsonable(e) for e in x] if isinstance(x, tuple) else x


def _tupled(x):
    return tuple(_tupled(e) for e in x) if isinstance(x, list) else x


@dataclass(frozen=True)
class Silence(_Intervention):
    """Silence what the "mlp", the "attn" or the whole "layer" of `layer` adds to the residual stream: replace it
    by zeros (mode "zero") or by `mean` (mode "mean": [d_model], or [pos, d_model] by absolute position); see
    silence_hooks."""

    layer: int
    component: str = "mlp"
    mode: str = "zero"
    mean: Optional[Vector] = None
    kind: ClassVar[str] = "silence"

    def __post_init__(self):
        # Silence("mlp", 20), the old order, arrives here as layer "mlp" and component 20
        object.__setattr__(self, "layer", _layer("Silence", self.layer, f"Silence({self.component!r}, {self.layer!r})"))
        _choice("component", self.component, tuple(COMPONENT_HOOKS))
        _choice("mode", self.mode, SILENCE_MODES)
        if self.mean is not None:
            object.__setattr__(self, "mean", Vector.of(self.mean))

    def hooks(self, model: HookedTransformer) -> Hooks:
        mean = None if self.mean is None else self.mean.tensor(model.cfg.dtype, model.cfg.device)
        return silence_hooks(model, self.layer, self.component, self.mode, mean)


@dataclass(frozen=True)
class Steer(_Intervention):
    """Add `alpha * v` at `blocks.{layer}.hook_{hook}`, at every position or at `positions` (see steer_hooks);
    `v` is a [d_model] tensor (or array, or sequence)."""

    layer: int
    v: Vector
    alpha: float
    hook: str = "mlp_out"
    positions: Optional[tuple[int, ...]] = None
    kind: ClassVar[str] = "steer"

    def __post_init__(self):
        object.__setattr__(self, "layer", _layer("Steer", self.layer, "Steer(12, v, -4.0)"))
        _choice("hook", self.hook, STEER_HOOKS)
        object.__setattr__(self, "v", Vector.of(self.v))
        if len(self.v.shape) != 1:
            raise ValueError(f"Steer: v of shape {self.v.shape}; expected one [d_model] vector")
        object.__setattr__(self, "alpha", _floats([self.alpha])[0])
        if self.positions is not None:
            object.__setattr__(self, "positions", _integers("positions", self.positions))

    def hooks(self, model: HookedTransformer) -> Hooks:
        return steer_hooks(model, self.layer, self.v.tensor(model.cfg.dtype, model.cfg.device), self.alpha, self.hook,
                           self.positions)


_UNSET = object()


@dataclass(frozen=True, init=False)
class Units(_Intervention):
    """MLP hidden units of `layer`: keep only them (mode "keep": zero all others), zero them ("zero") or multiply
    them by `factor` ("scale"); see unit_hooks."""

    layer: int
    units: tuple[int, ...]
    mode: str = "keep"
    factor: float = 0.0
    kind: ClassVar[str] = "units"

    def __init__(self, layer: int, units: Iterable[int], mode: str = "keep", factor: float = 0.0, *,
                 scale: object = _UNSET):
        if scale is not _UNSET:
            raise TypeError("Units(scale=...) is now Units(factor=...): mode 'scale' multiplies the units by factor")
        put = object.__setattr__
        put(self, "layer", _layer("Units", layer, "Units(12, (5, 17), 'zero')"))
        _choice("mode", mode, UNIT_MODES)
        put(self, "units", _integers("units", units))
        put(self, "mode", mode)
        put(self, "factor", _floats([factor])[0])
        if mode != "scale" and self.factor != 0.0:
            raise ValueError(f"factor={self.factor} is only used with mode 'scale', not {mode!r}")

    def hooks(self, model: HookedTransformer) -> Hooks:
        return unit_hooks(model, self.layer, self.units, self.mode, self.factor)


LATENT_MODES = ("zero", "scale")
_OLD_LATENT_MODES = {"silence": "zero", "steer": "scale (with factor=)"}


@dataclass(frozen=True, init=False)
class Latents(_Intervention):
    """Zero SAE latents (mode "zero"), or multiply them by `factor` (mode "scale"), at the latent activations
    (`hook_sae_acts_post`) of the SAE that a SAELens `HookedSAETransformer` has attached at `layer_hook`
    (the SAE's `cfg.metadata.hook_name`, e.g. "blocks.3.hook_mlp_out"; for a transcoder, its input hook).

    The hook acts between the SAE's encoder and decoder: latent i then writes `factor * a_i * W_dec[i]` (nothing
    when zeroed) instead of `a_i * W_dec[i]`, and no other latent changes (a TopK SAE has chosen its latents
    before the hook). With the SAE attached with `use_error_term=True`, SAELens adds the error of the unhooked
    reconstruction, so what flows on changes by exactly those latents' change. Latent ids are checked against
    the SAE's `d_sae` when the hooks are built (`reach_lens.sae` loads and attaches SAEs).
    """

    layer_hook: str
    latent_ids: tuple[int, ...]
    mode: str = "zero"
    factor: Optional[float] = None
    kind: ClassVar[str] = "latents"
    modes: ClassVar[tuple[str, ...]] = LATENT_MODES

    def __init__(self, layer_hook: str, latent_ids: Iterable[int], mode: str = "zero",
                 factor: Optional[float] = None, *, alpha: object = _UNSET):
        if alpha is not _UNSET:
            raise TypeError("Latents(alpha=...) is now Latents(mode='scale', factor=...)")
        if mode in _OLD_LATENT_MODES:
            raise ValueError(f"Latents mode {mode!r} is now {_OLD_LATENT_MODES[mode]!r}")
        put = object.__setattr__
        if not isinstance(layer_hook, str) or not layer_hook:
            raise ValueError(f"layer_hook {layer_hook!r}: expected the hook an SAE is attached at, "
                             "e.g. 'blocks.3.hook_mlp_out'")
        if ".hook_sae_" in layer_hook:
            raise ValueError(f"layer_hook {layer_hook!r} names one of the SAE's own hook points; pass the hook "
                             f"the SAE is attached at: {layer_hook.split('.hook_sae_')[0]!r}")
        if isinstance(latent_ids, (str, bytes)) or not isinstance(latent_ids, Iterable):
            raise ValueError(f"latent_ids must be a sequence of integers, got {latent_ids!r}")
        ids = _integers("latent_ids", latent_ids)
        if not ids:
            raise ValueError("latent_ids is empty: name at least one latent")
        negative = [i for i in ids if i < 0]
        if negative:
            raise ValueError(f"latent id {negative[0]} out of range: latent ids are >= 0")
        _choice("mode", mode, self.modes)
        if mode == "zero" and factor is not None:
            raise ValueError(f"factor={factor!r} is only used with mode 'scale' (mode 'zero' zeroes the latents)")
        if mode == "scale":
            if isinstance(factor, bool) or not isinstance(factor, (int, float, np.number)):
                raise ValueError(f"mode 'scale' needs a number factor (the factor on the latents' activations), "
                                 f"got {factor!r}")
            factor = _floats([factor])[0]
        put(self, "layer_hook", layer_hook)
        put(self, "latent_ids", ids)
        put(self, "mode", mode)
        put(self, "factor", factor)

    def hooks(self, model: HookedTransformer) -> Hooks:
        saes = getattr(model, "acts_to_saes", None)  # sae_lens.HookedSAETransformer: {hook name: SAE}
        if saes is None:
            raise ValueError(f"Latents needs a sae_lens HookedSAETransformer with an SAE attached at "
                             f"{self.layer_hook!r}, got a {type(model).__name__} (reach_lens.sae.attach makes one)")
        sae = saes.get(self.layer_hook)
        if sae is None:
            raise ValueError(f"no SAE attached at {self.layer_hook!r}; attached: "
                             f"{', '.join(map(repr, saes)) or 'none'}")
        d_sae = sae.cfg.d_sae
        bad = [i for i in self.latent_ids if i >= d_sae]
        if bad:
            raise ValueError(f"latent id {bad[0]} out of range for the SAE at {self.layer_hook!r} with "
                             f"d_sae={d_sae} (0..{d_sae - 1})")
        factors = torch.ones(d_sae)
        factors[list(self.latent_ids)] = 0.0 if self.mode == "zero" else self.factor
        name = f"{sae.cfg.metadata.hook_name_out or self.layer_hook}.hook_sae_acts_post"
        return [(name, positionwise(lambda act, hook: act * factors.to(act)))]


@dataclass(frozen=True)
class Route(_Intervention):
    """Run only the layers of `path`. As hooks only skip-only routes work; the generation engine runs any
    route (`Request(route=path)`, `probes.route`)."""

    path: tuple[int, ...]
    kind: ClassVar[str] = "route"

    def __post_init__(self):
        object.__setattr__(self, "path", tuple(self.path))

    def hooks(self, model: HookedTransformer) -> Hooks:
        n_layers = model.cfg.n_layers
        path = validate_route(self.path, n_layers)
        if not is_skip_only(path):
            raise ValueError(f"route {list(path)} repeats or reorders layers: as hooks only skips work; run it "
                             "through the engine (reach_lens.generate.Request(route=...), probes.route)")
        return [h for layer in range(n_layers) if layer not in path for h in silence_hooks(model, layer, "layer")]


Intervention = Union[Silence, Steer, Units, Latents, Route]
KINDS = {cls.kind: cls for cls in (Silence, Steer, Units, Latents, Route)}


def intervention_from_dict(d: dict, vectors: Mapping[str, np.ndarray] | Path | str | None = None) -> Intervention:
    """Rebuild any intervention from its `to_dict()`, dispatching on d["kind"]; vectors recorded by hash are read
    from ``vectors`` (a mapping by sha256, or a run directory's ``vectors/`` folder)."""
    kind = d.get("kind")
    if kind not in KINDS:
        raise ValueError(f"unknown intervention kind {kind!r}; valid: {', '.join(map(repr, KINDS))}")
    return KINDS[kind].from_dict(d, vectors)


def hooks_for(interventions: Sequence[Intervention], model: HookedTransformer) -> Hooks:
    """All hooks of `interventions`, concatenated in order (`through_saes` on a model with SAEs attached)."""
    return through_saes([h for iv in interventions for h in iv.hooks(model)], model)


def through_saes(hooks: Hooks, model: HookedTransformer) -> Hooks:
    """`hooks` with each hook point that an attached SAELens SAE occupies renamed to that SAE's `hook_sae_output`
    (what flows on from there), so e.g. `Silence(3, "mlp")` still zeroes what the MLP of layer 3 adds when an SAE
    sits at `blocks.3.hook_mlp_out` (TransformerLens refuses hooks on the SAE's module itself). Other hooks, and
    every hook on a model without SAEs, are returned unchanged."""
    saes = getattr(model, "acts_to_saes", {})
    occupied = {sae.cfg.metadata.hook_name_out or hook for hook, sae in saes.items()}
    return [(f"{name}.hook_sae_output" if isinstance(name, str) and name in occupied else name, fn)
            for name, fn in hooks]
