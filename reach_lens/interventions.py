"""Serializable interventions on a `HookedTransformer`, and the hooks they make.

Every intervention is a frozen dataclass (an `Intervention`): `hooks(model, source=None)` makes its TransformerLens
hooks (`reach_lens.hooks`), `to_dict()` / `from_dict()` turn it into plain JSON and back (what a run's protocol
records), `vectors()` gives its vectors by content hash. Each subclass with a `kind` of its own is registered under
that kind when it is defined, so `intervention_from_dict` reads every kind: reach_lens's own and yours. The probes
and the generation engine take interventions and build their hooks themselves; `hooks_for(interventions, model)`
gives them for a forward of your own:

    with model.hooks(fwd_hooks=hooks_for([Silence(20), Steer(12, v, -4.0, "hook_resid_post")], model)):
        logits = model(tokens)

One convention for every intervention: where first, then what, then the mode, then its number.

- **Where**: `layer`, the block, and `site`, the place: a TransformerLens hook name, relative to the block
  (`"hook_mlp_out"`, `"hook_attn_out"`, `"hook_resid_pre"`, `"hook_resid_mid"`, `"hook_resid_post"`,
  `"mlp.hook_post"`, ...) or full (`"blocks.3.hook_mlp_out"`; `"hook_embed"` with layer None), turned into the hook
  point by `hooks.hook_point`. `Silence.site` is the hook point replaced (default `"hook_mlp_out"`, what the MLP
  adds to the residual stream; `LAYER_OUTPUTS` for the whole layer), `Steer.site` the one added at; `Latents.site`
  (it has no layer) is the full name of the hook point its SAE is attached at. `Units` always act at
  `mlp.hook_post` and `Route` on whole layers, so they have no site. A site in block `layer` is recorded relative
  to it (`Silence(3, "blocks.3.hook_mlp_out") == Silence(3)`).
- **Mode words**: "zero" (replace by zeros), "mean" (replace by a mean), "keep" (zero all others), "scale"
  (multiply by `factor`, which mode "scale" requires and the others refuse); `Steer` adds `alpha * v`.
- **Vectors** are given as tensors (or arrays, or sequences) and recorded in protocols by their content hash;
  the vectors themselves are saved beside the run (`RunStore`, `vectors/<sha256>.npy`).
- **Positions**: hooks acting at chosen positions (`Steer(positions=...)`, a per-position `Silence` mean) read
  each batch row's positions from `source`, the engine's `PositionSource`, when built with one, and otherwise
  find them from the forward itself (a plain forward, TransformerLens's `generate`: `hooks.PositionTracker`).
- **Older records**: sites were once words of their own. Stored records with them still read, as the hook names
  they meant (`older_sites`): Silence "mlp", "attn", "layer" as "hook_mlp_out", "hook_attn_out", `LAYER_OUTPUTS`;
  Steer "mlp_out", "attn_out", "resid_pre", "resid_post" as "hook_mlp_out", ... The constructors take hook names
  only, and name the one an older word meant.
"""
import hashlib
import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar, Iterable, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor
from transformer_lens import HookedTransformer

from reach_lens.hooks import (LAYER_OUTPUTS, SILENCE_MODES, UNIT_MODES, Hooks, check_choice, hook_point,
                              positionwise, silence_hooks, split_hook_point, steer_hooks, through_saes, unit_hooks)
from reach_lens.positions import PositionSource
from reach_lens.routes import is_skip_only, validate_route

LATENT_MODES = ("zero", "scale")
KIND_MODULES = ("reach_lens.localize.plants",)  # reach_lens's modules that define kinds besides this one
Site = Union[str, tuple[str, ...]]


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


def _layer(kind: str, layer: object, optional: bool = False) -> Optional[int]:
    if layer is None and optional:
        return None
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
        raise TypeError(f"{kind}: layer {layer!r} must be an int{' or None' if optional else ''}")
    return int(layer)


def _place(kind: str, layer: object, site: object, older: Mapping[str, Site], many: bool = False
           ) -> tuple[Optional[int], Site]:
    """`layer` and `site` (one hook name, or with `many` a sequence of them) checked by `hooks.hook_point`, in the
    form they are recorded in: sites in block `layer` relative to it; a layer None whose sites are full names in one
    block takes that block. `older`: the older site words of the kind, refused naming the hook name they meant."""
    layer = _layer(kind, layer, optional=True)
    sites = tuple(site) if many and isinstance(site, Sequence) and not isinstance(site, str) else (site,)
    if not sites:
        raise ValueError(f"{kind}: site is empty; name at least one hook point")
    word = next((s for s in sites if isinstance(s, str) and s in older), None)
    if word is not None:
        meant = older[word]
        meant = f"LAYER_OUTPUTS {meant!r}" if meant == LAYER_OUTPUTS else repr(meant)
        raise ValueError(f"{kind}: site {word!r} is a word of older records; sites are TransformerLens hook names: "
                         f"use site={meant}")
    names = [hook_point(s, layer) for s in sites]
    if len(set(names)) != len(names):
        raise ValueError(f"{kind}: site {site!r} names a hook point twice")
    blocks = {split_hook_point(name)[0] for name in names}
    if layer is None and len(blocks) == 1 and None not in blocks:
        layer = blocks.pop()
    recorded = tuple(name if layer is None else split_hook_point(name)[1] for name in names)
    return layer, recorded[0] if len(recorded) == 1 else recorded


def _factor(kind: str, mode: str, factor: object, what: str) -> Optional[float]:
    """The factor of mode "scale", a finite float (required); None for the other modes (which refuse one)."""
    if mode != "scale":
        if factor is not None:
            raise ValueError(f"{kind}: factor={factor!r} is only used with mode 'scale', not {mode!r}")
        return None
    if isinstance(factor, bool) or not isinstance(factor, (int, float, np.number)):
        raise ValueError(f"{kind}: mode 'scale' needs a number factor (what the {what} are multiplied by), "
                         f"got {factor!r}")
    return _floats([factor])[0]


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
    ``vectors/`` directory), or the values themselves (a list, as in records written before vectors were hashed)."""
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


_KINDS: dict[str, type["Intervention"]] = {}  # kind -> class, filled as subclasses are defined


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class Intervention(ABC):
    """What every intervention is: a frozen dataclass with a `kind`, its hooks, and its JSON form.

    Subclass it (as a frozen dataclass) for an intervention of your own: the probes and the engine run any. A
    subclass that sets its own `kind` is registered under it when defined (`intervention_from_dict` reads it back);
    a kind another class holds is refused, and defining the same class again (same module and qualified name: a
    reloaded module, a notebook cell run twice) replaces it. A subclass without a `kind` of its own (a base for
    others) is not registered. `vector_fields` name its `Vector` fields (recorded by hash); `older_sites` map site
    words of older records of its kind to the sites they read as. Name its place with `hooks.hook_point`."""

    kind: ClassVar[str]
    vector_fields: ClassVar[tuple[str, ...]] = ()
    older_sites: ClassVar[Mapping[str, Site]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" not in cls.__dict__:
            return
        kind = cls.kind
        if not isinstance(kind, str) or not kind:
            raise TypeError(f"{_qualified(cls)}.kind {kind!r} must be a non-empty str")
        held = _KINDS.get(kind)
        if held is not None and _qualified(held) != _qualified(cls):
            raise ValueError(f"intervention kind {kind!r} of {_qualified(cls)} is taken by {_qualified(held)}; "
                             f"give {cls.__name__} a kind of its own")
        for other in [k for k, c in _KINDS.items() if _qualified(c) == _qualified(cls)]:  # redefined, maybe renamed
            del _KINDS[other]
        _KINDS[kind] = cls

    @abstractmethod
    def hooks(self, model: HookedTransformer, source: Optional[PositionSource] = None) -> Hooks:
        """Its TransformerLens hooks on `model`; positioned ones read positions from `source` when given (the
        engine's), else from the forward itself (module docstring)."""

    def to_dict(self) -> dict:
        """Plain JSON: `kind`, then every field (vectors by hash: `Vector.to_dict`)."""
        out = {"kind": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, Vector) else _jsonable(value)
        return out

    def vectors(self) -> dict[str, np.ndarray]:
        """The vectors of this intervention by their sha256 (what `to_dict` records by hash)."""
        return {v.sha256: v.values for f in fields(self) if isinstance(v := getattr(self, f.name), Vector)}

    @classmethod
    def from_dict(cls, d: dict, vectors: Mapping[str, np.ndarray] | Path | str | None = None):
        """The intervention of `d` (its `to_dict()`); vectors recorded by hash are read from `vectors`; an older
        site word (`older_sites`) reads as the site it meant."""
        if d.get("kind") != cls.kind:
            raise ValueError(f"kind {d.get('kind')!r} is not {cls.kind!r}")
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names - {"kind"}
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)} for {cls.kind}; valid: {sorted(names)}")
        values = {k: _tupled(v) for k, v in d.items() if k != "kind"}
        site = values.get("site")
        if isinstance(site, str) and site in cls.older_sites:
            values["site"] = cls.older_sites[site]
        for name in cls.vector_fields:
            if values.get(name) is not None:
                values[name] = _vector_from_dict(d[name], vectors, f"{cls.kind}.{name}")
        return cls(**values)


def _jsonable(x):
    return [_jsonable(e) for e in x] if isinstance(x, tuple) else x


def _tupled(x):
    return tuple(_tupled(e) for e in x) if isinstance(x, list) else x


@dataclass(frozen=True)
class Silence(Intervention):
    """Replace the activations at `site` of `layer` (one hook name or several; default the MLP's output, what it adds
    to the residual stream; `LAYER_OUTPUTS` for the whole layer): by zeros (mode "zero") or by `mean` (mode "mean",
    one site: [d], or [pos, d] by absolute position, for activations [batch, pos, d]); see `hooks.silence_hooks`."""

    layer: Optional[int]
    site: Site = "hook_mlp_out"
    mode: str = "zero"
    mean: Optional[Vector] = None
    kind: ClassVar[str] = "silence"
    vector_fields: ClassVar[tuple[str, ...]] = ("mean",)
    older_sites: ClassVar[Mapping[str, Site]] = {"mlp": "hook_mlp_out", "attn": "hook_attn_out", "layer": LAYER_OUTPUTS}

    def __post_init__(self):
        layer, site = _place("Silence", self.layer, self.site, self.older_sites, many=True)
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "site", site)
        check_choice("mode", self.mode, SILENCE_MODES)
        if self.mean is not None:
            object.__setattr__(self, "mean", Vector.of(self.mean))

    def hooks(self, model: HookedTransformer, source: Optional[PositionSource] = None) -> Hooks:
        mean = None if self.mean is None else self.mean.tensor(model.cfg.dtype, model.cfg.device)
        return silence_hooks(model, self.layer, self.site, self.mode, mean, source)


@dataclass(frozen=True)
class Steer(Intervention):
    """Add `alpha * v` at `site` of `layer` (a hook name; default the MLP's output), at every position or at
    `positions` (negative: from the prompt's end); `v` is a [d_model] tensor (or array, or sequence), and the
    activations at `site` must end in d_model; see `hooks.steer_hooks`."""

    layer: Optional[int]
    v: Vector
    alpha: float
    site: str = "hook_mlp_out"
    positions: Optional[tuple[int, ...]] = None
    kind: ClassVar[str] = "steer"
    vector_fields: ClassVar[tuple[str, ...]] = ("v",)
    older_sites: ClassVar[Mapping[str, Site]] = {w: f"hook_{w}" for w in ("mlp_out", "attn_out", "resid_pre",
                                                                            "resid_post")}

    def __post_init__(self):
        layer, site = _place("Steer", self.layer, self.site, self.older_sites)
        object.__setattr__(self, "layer", layer)
        object.__setattr__(self, "site", site)
        object.__setattr__(self, "v", Vector.of(self.v))
        if len(self.v.shape) != 1:
            raise ValueError(f"Steer: v of shape {self.v.shape}; expected one [d_model] vector")
        object.__setattr__(self, "alpha", _floats([self.alpha])[0])
        if self.positions is not None:
            object.__setattr__(self, "positions", _integers("positions", self.positions))

    def hooks(self, model: HookedTransformer, source: Optional[PositionSource] = None) -> Hooks:
        return steer_hooks(model, self.layer, self.v.tensor(model.cfg.dtype, model.cfg.device), self.alpha, self.site,
                           self.positions, source)


@dataclass(frozen=True)
class Units(Intervention):
    """MLP hidden units of `layer` (`blocks.{layer}.mlp.hook_post`): keep only them (mode "keep": zero all others),
    zero them ("zero") or multiply them by `factor` ("scale", which requires it); see `hooks.unit_hooks`."""

    layer: int
    units: tuple[int, ...]
    mode: str = "keep"
    factor: Optional[float] = None
    kind: ClassVar[str] = "units"

    def __post_init__(self):
        object.__setattr__(self, "layer", _layer("Units", self.layer))
        check_choice("mode", self.mode, UNIT_MODES)
        object.__setattr__(self, "units", _integers("units", self.units))
        object.__setattr__(self, "factor", _factor("Units", self.mode, self.factor, "units' activations"))

    def hooks(self, model: HookedTransformer, source: Optional[PositionSource] = None) -> Hooks:
        return unit_hooks(model, self.layer, self.units, self.mode, self.factor)


@dataclass(frozen=True)
class Latents(Intervention):
    """Zero SAE latents (mode "zero"), or multiply them by `factor` (mode "scale", which requires it), at the latent
    activations (`hook_sae_acts_post`, [batch, pos, d_sae]) of the SAE that a SAELens `HookedSAETransformer` has
    attached at `site` (the SAE's `cfg.metadata.hook_name`, e.g. "blocks.3.hook_mlp_out"; for a transcoder, its
    input hook).

    The hook acts between the SAE's encoder and decoder: latent i then writes `factor * a_i * W_dec[i]` (nothing
    when zeroed) instead of `a_i * W_dec[i]`, and no other latent changes (a TopK SAE has chosen its latents
    before the hook). With the SAE attached with `use_error_term=True`, SAELens adds the error of the unhooked
    reconstruction, so what flows on changes by exactly those latents' change. Latent ids are checked against
    the SAE's `d_sae` when the hooks are built (`reach_lens.sae` loads and attaches SAEs).
    """

    site: str
    latent_ids: tuple[int, ...]
    mode: str = "zero"
    factor: Optional[float] = None
    kind: ClassVar[str] = "latents"

    def __post_init__(self):
        site = self.site
        if not isinstance(site, str) or not site:
            raise ValueError(f"site {site!r}: expected the hook an SAE is attached at, e.g. 'blocks.3.hook_mlp_out'")
        if ".hook_sae_" in site:
            raise ValueError(f"site {site!r} names one of the SAE's own hook points; pass the hook the SAE is "
                             f"attached at: {site.split('.hook_sae_')[0]!r}")
        hook_point(site)  # a full hook name
        ids = self.latent_ids
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise ValueError(f"latent_ids must be a sequence of integers, got {ids!r}")
        ids = _integers("latent_ids", ids)
        if not ids:
            raise ValueError("latent_ids is empty: name at least one latent")
        negative = [i for i in ids if i < 0]
        if negative:
            raise ValueError(f"latent id {negative[0]} out of range: latent ids are >= 0")
        check_choice("mode", self.mode, LATENT_MODES)
        object.__setattr__(self, "latent_ids", ids)
        object.__setattr__(self, "factor", _factor("Latents", self.mode, self.factor, "latents' activations"))

    def hooks(self, model: HookedTransformer, source: Optional[PositionSource] = None) -> Hooks:
        saes = getattr(model, "acts_to_saes", None)  # sae_lens.HookedSAETransformer: {hook name: SAE}
        if saes is None:
            raise ValueError(f"Latents needs a sae_lens HookedSAETransformer with an SAE attached at "
                             f"{self.site!r}, got a {type(model).__name__} (reach_lens.sae.attach makes one)")
        sae = saes.get(self.site)
        if sae is None:
            raise ValueError(f"no SAE attached at {self.site!r}; attached: {', '.join(map(repr, saes)) or 'none'}")
        d_sae = sae.cfg.d_sae
        bad = [i for i in self.latent_ids if i >= d_sae]
        if bad:
            raise ValueError(f"latent id {bad[0]} out of range for the SAE at {self.site!r} with "
                             f"d_sae={d_sae} (0..{d_sae - 1})")
        factors = torch.ones(d_sae)
        factors[list(self.latent_ids)] = 0.0 if self.mode == "zero" else self.factor
        name = f"{sae.cfg.metadata.hook_name_out or self.site}.hook_sae_acts_post"
        return [(name, positionwise(lambda act, hook: act * factors.to(act)))]


@dataclass(frozen=True)
class Route(Intervention):
    """Run only `layers`, in order: the route (the full path is every layer once). As hooks only skip-only routes
    work (each skipped layer silenced); the generation engine runs any route (`Request(route=layers)`,
    `probes.route`)."""

    layers: tuple[int, ...]
    kind: ClassVar[str] = "route"

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))

    def hooks(self, model: HookedTransformer, source: Optional[PositionSource] = None) -> Hooks:
        n_layers = model.cfg.n_layers
        layers = validate_route(self.layers, n_layers)
        if not is_skip_only(layers):
            raise ValueError(f"route {list(layers)} repeats or reorders layers: as hooks only skips work; run it "
                             "through the engine (reach_lens.generate.Request(route=...), probes.route)")
        return [h for layer in range(n_layers) if layer not in layers
                for h in silence_hooks(model, layer, LAYER_OUTPUTS)]


def intervention_kinds() -> dict[str, type[Intervention]]:
    """Every registered kind and its class: reach_lens's own (`KIND_MODULES` imported) and those of the
    `Intervention` subclasses defined so far."""
    for module in KIND_MODULES:
        importlib.import_module(module)
    return dict(_KINDS)


def intervention_from_dict(d: dict, vectors: Mapping[str, np.ndarray] | Path | str | None = None) -> Intervention:
    """Rebuild an intervention of any registered kind from its `to_dict()`, dispatching on d["kind"]; vectors
    recorded by hash are read from ``vectors`` (a mapping by sha256, or a run directory's ``vectors/`` folder).

    A kind of your own is read once its class is defined: import its module before reading."""
    kind = d.get("kind")
    cls = _KINDS.get(kind) or intervention_kinds().get(kind)
    if cls is None:
        raise ValueError(f"unknown intervention kind {kind!r}; registered: {', '.join(map(repr, _KINDS))} (a kind "
                         "of your own is registered when its Intervention subclass is defined: import it before "
                         "reading)")
    return cls.from_dict(d, vectors)


def hooks_for(interventions: Sequence[Intervention], model: HookedTransformer,
              source: Optional[PositionSource] = None) -> Hooks:
    """All hooks of `interventions`, concatenated in order (`hooks.through_saes` on a model with SAEs attached);
    `source`: the engine's `PositionSource` (None outside the engine)."""
    return through_saes([h for iv in interventions for h in iv.hooks(model, source)], model)
