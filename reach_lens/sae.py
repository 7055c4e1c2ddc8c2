"""SAELens's sparse autoencoders in reach_lens: load one from a local SAELens directory, attach it to a model,
rank its latents along a direction. Needs the optional extra: ``pip install -e ".[sae]"``.

    from reach_lens.sae import load_sae, attach, latent_hook, top_latents_along, latent_output_mass
    sae = load_sae("saes/smollm2-l20-mlp_out")            # a SAELens directory: cfg.json, sae_weights.safetensors
    sae_model = attach(model, sae, use_error_term=True)   # a HookedSAETransformer, sharing model's weights
    top = top_latents_along(sae, v, k=32)                 # latents whose decoder rows point most along v
    silenced = Latents(sae.cfg.metadata.hook_name, top)   # silence them
    rows = probes.deploy(sae_model, task, questions, "native", interventions=[silenced])

A ``HookedSAETransformer`` is a ``HookedTransformer``: every probe runs on it unchanged, and the generation
engine runs the attached SAEs (SAELens splices each one in as a module at its hook point, which the engine's
blocks call). ``use_error_term=True`` makes an SAE the identity on what flows on, except for interventions on
its latents (``reach_lens.interventions.Latents``). The engine refuses what its cached, block-by-block forward cannot
reproduce: SAEs attached with ``exclude_special_tokens`` and temporal SAEs.

With an SAE attached at a hook point, that name is the SAE's module, no longer a hook point: TransformerLens
refuses hooks on it. ``through_saes`` renames such hooks to the SAE's ``hook_sae_output`` (what flows on).
"""

from __future__ import annotations

import copy
import hashlib
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

from reach_lens.hooks import split_hook_point, through_saes
from reach_lens.unit_selection import unit_output_mass

try:
    from sae_lens import SAE, HookedSAETransformer
    from sae_lens.constants import SAE_CFG_FILENAME, SAE_WEIGHTS_FILENAME
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError('reach_lens.sae needs SAELens: pip install -e ".[sae]" (or pip install "sae-lens>=6.54,<7")') \
        from error

__all__ = ["attach", "attached", "decoder_directions", "describe_sae", "describe_saes", "latent_hook", "latent_output_mass",
           "load_sae", "through_saes", "to_sae_transformer", "top_latents_along"]


# ---------------------------------------------------------------- loading and attaching


def load_sae(path: str | Path, device: str = "cpu", dtype: str | torch.dtype | None = None) -> SAE:
    """An SAE from a local SAELens directory (``cfg.json`` + ``sae_weights.safetensors``, as
    ``sae.save_model(path)`` writes it), in eval mode; ``dtype`` None keeps the one in its config."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"SAE directory {str(path)!r} does not exist (expected a SAELens directory with "
                                f"{SAE_CFG_FILENAME} and {SAE_WEIGHTS_FILENAME})")
    missing = [name for name in (SAE_CFG_FILENAME, SAE_WEIGHTS_FILENAME) if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{str(path)!r} is not a SAELens SAE directory: missing {', '.join(missing)} "
                                "(sae.save_model(path) writes one)")
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    return SAE.load_from_disk(path, device=device, dtype=dtype).eval()


def load_mlp_sae(path: str | Path, model: HookedTransformer) -> SAE:
    """The SAE at ``path`` on ``model``'s device, refused (ValueError) unless it reads an MLP output of ``model``:
    its hook ``blocks.L.hook_mlp_out`` with L a layer of the model, its ``d_in`` the model's ``d_model``."""
    sae = load_sae(path, device=str(model.cfg.device))
    hook = sae.cfg.metadata.hook_name
    block, within = split_hook_point(hook)
    if block is None or within != "hook_mlp_out" or not 0 <= block < model.cfg.n_layers \
            or sae.cfg.d_in != model.cfg.d_model:
        raise ValueError(f"SAE at {path}: hook {hook!r}, d_in {sae.cfg.d_in}; expected 'blocks.L.hook_mlp_out' with "
                         f"L in 0..{model.cfg.n_layers - 1} and d_in = d_model = {model.cfg.d_model}")
    return sae


def to_sae_transformer(model: HookedTransformer, share_weights: bool = False) -> HookedSAETransformer:
    """``model`` as a SAELens ``HookedSAETransformer``: same config, tokenizer, parameters and buffers (each
    tensor's storage layout kept), so the logits are exactly equal. A ``HookedSAETransformer`` is returned as is.

    ``share_weights=False`` copies the tensors (the two models are independent); ``True`` makes the new model
    use the same tensors: no second copy in memory, and an in-place edit of one (pruning) is an edit of both.
    """
    if isinstance(model, HookedSAETransformer):
        return model
    if not isinstance(model, HookedTransformer):
        raise TypeError(f"expected a HookedTransformer, got {type(model).__name__}")
    cfg = copy.deepcopy(model.cfg)
    init_weights, tokenizer_name = cfg.init_weights, cfg.tokenizer_name
    cfg.init_weights, cfg.tokenizer_name = False, None  # nothing to initialize, no tokenizer to fetch
    with warnings.catch_warnings(), torch.device("meta"):  # every tensor comes from model's state dict below
        warnings.simplefilter("ignore", DeprecationWarning)  # TransformerLens 3.9 deprecates HookedTransformer
        out = HookedSAETransformer(cfg, move_to_device=False)
    cfg.init_weights, cfg.tokenizer_name = init_weights, tokenizer_name
    out.tokenizer = model.tokenizer
    state = model.state_dict()
    if not share_weights:
        state = {name: t.clone() for name, t in state.items()}  # clone keeps strides (transposed storage)
    out.load_state_dict(state, strict=True, assign=True)
    left = [name for name, t in [*out.named_parameters(), *out.named_buffers()] if t.is_meta]
    if left:  # a tensor outside the state dict (TransformerLens 3.9 has none)
        raise RuntimeError(f"to_sae_transformer: {left[0]} is not in the model's state dict, so it was not copied")
    return out.train(model.training)


def attach(model: HookedTransformer, sae: SAE, use_error_term: bool = False) -> HookedSAETransformer:
    """Attach ``sae`` at its hook (``sae.cfg.metadata.hook_name``) until ``model.reset_saes()``, replacing an SAE
    already there; returns the ``HookedSAETransformer`` (``model`` itself, or, for a plain ``HookedTransformer``,
    ``to_sae_transformer(model, share_weights=True)``). Raises where SAELens would only log a warning."""
    sae_model = to_sae_transformer(model, share_weights=True)
    _check(sae_model, sae)
    sae_model.add_sae(sae, use_error_term=use_error_term)
    return sae_model


@contextmanager
def attached(model: HookedSAETransformer, saes: SAE | Sequence[SAE],
             use_error_term: bool = False) -> Iterator[HookedSAETransformer]:
    """SAEs attached inside the block only; on exit (also after an exception) the SAEs that were at their hooks
    before are back (SAELens's ``model.saes``)."""
    if not isinstance(model, HookedSAETransformer):
        raise TypeError(f"attached needs a HookedSAETransformer, got {type(model).__name__} "
                        "(reach_lens.sae.to_sae_transformer(model) converts one)")
    saes = [saes] if isinstance(saes, SAE) else list(saes)
    for sae in saes:
        _check(model, sae)
    with model.saes(saes=saes, use_error_term=use_error_term):
        yield model


def _check(model: HookedSAETransformer, sae: SAE) -> None:
    if not isinstance(sae, SAE):
        raise TypeError(f"expected a sae_lens SAE, got {type(sae).__name__}")
    hook_in = sae.cfg.metadata.hook_name
    if not hook_in:
        raise ValueError("the SAE's cfg.metadata.hook_name is not set: it says where the SAE reads")
    saes = model.acts_to_saes
    attached_hooks = set(saes) | {s.cfg.metadata.hook_name_out or h for h, s in saes.items()}
    for role, hook in (("input", hook_in), ("output", sae.cfg.metadata.hook_name_out or hook_in)):
        if hook not in model.hook_dict and hook not in attached_hooks:
            examples = ", ".join(repr(n) for n in model.hook_dict if n.startswith("blocks.0.hook_"))
            raise ValueError(f"the SAE's {role} hook {hook!r} is not a hook point of this model (blocks "
                             f"0..{model.cfg.n_layers - 1}; e.g. {examples})")
    width = _hook_width(model, hook_in)
    if width is not None and sae.cfg.d_in != width:
        raise ValueError(f"SAE d_in={sae.cfg.d_in} does not match {hook_in!r}, which carries {width} values per "
                         "position")
    if sae.dtype != model.cfg.dtype:
        raise ValueError(f"SAE dtype {sae.dtype} differs from the model's {model.cfg.dtype} (it would change the "
                         "dtype of what flows on): load it with load_sae(path, dtype=...) or call sae.to(dtype)")


def _hook_width(model: HookedTransformer, hook: str) -> int | None:
    """Values per position at ``hook``, for the hook points SAEs are usually trained on (None: unknown)."""
    cfg = model.cfg
    last = hook.rsplit(".", 1)[-1]
    if last in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_mlp_out", "hook_attn_out",
                "hook_embed") or hook.endswith(("ln1.hook_normalized", "ln2.hook_normalized", "mlp.hook_in")):
        return cfg.d_model
    if hook.endswith(("mlp.hook_pre", "mlp.hook_post")):
        return cfg.d_mlp
    if hook.endswith("attn.hook_z"):
        return cfg.n_heads * cfg.d_head
    return None


def latent_hook(sae: SAE) -> str:
    """The hook point of ``sae``'s latent activations once attached, ``[batch, pos, d_sae]`` (what ``Latents``
    hooks; e.g. for ``localize.last_prompt_activations``)."""
    return f"{sae.cfg.metadata.hook_name_out or sae.cfg.metadata.hook_name}.hook_sae_acts_post"


def describe_sae(sae: SAE) -> dict:
    """One SAE, JSON-able, for a run's protocol: its hook points, architecture, ``d_in``, ``d_sae`` and a sha256
    fingerprint of its weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(sae.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    hook = sae.cfg.metadata.hook_name
    return {"hook": hook, "architecture": sae.cfg.architecture(), "d_in": sae.cfg.d_in, "d_sae": sae.cfg.d_sae,
            "hook_out": sae.cfg.metadata.hook_name_out or hook, "weights": digest.hexdigest()[:16]}


def describe_saes(model: HookedTransformer) -> dict[str, dict]:
    """The SAEs attached to ``model``, by hook: ``describe_sae`` of each (less the hook) and its ``use_error_term``."""
    return {hook: {**{k: v for k, v in describe_sae(wrapper.sae).items() if k != "hook"},
                   "use_error_term": bool(wrapper.use_error_term)}
            for hook, wrapper in getattr(model, "_acts_to_saes", {}).items()}


# ---------------------------------------------------------------- latents along a direction


def decoder_directions(sae: SAE) -> Float[Tensor, "d_sae d_out"]:
    """What one unit of each latent's activation writes: ``W_dec``, with unit-norm rows for SAEs whose
    activations are rescaled by the decoder norm (``cfg.rescale_acts_by_decoder_norm``, TopK SAEs)."""
    W_dec = sae.W_dec.detach()
    if getattr(sae.cfg, "rescale_acts_by_decoder_norm", False):
        W_dec = W_dec / W_dec.norm(dim=-1, keepdim=True)
    return W_dec


def top_latents_along(sae: SAE, v: Float[Tensor, "d_out"], k: int = 32) -> list[int]:
    """The k latents whose decoder rows point most along v: ``decoder_directions(sae)[i] · v/|v|``, descending
    (ties by id): the SAE analogue of ``unit_selection.top_units_along``. Signed: SAE latents are non-negative, so
    a top latent, when active, writes +v (``top_latents_along(sae, -v)`` for the reverse direction). Random
    controls: ``unit_selection.random_units(sae.cfg.d_sae, k, seed, exclude=top)``."""
    W = decoder_directions(sae)
    if v.shape != (W.shape[1],) or not v.any() or not 0 < k <= W.shape[0]:
        raise ValueError(f"v of shape {tuple(v.shape)} (norm {float(v.norm()):.3g}) and k={k}; expected a non-zero "
                         f"({W.shape[1]},) vector and k in 1..{W.shape[0]}")
    scores = W @ (v.to(W) / v.norm())
    return torch.argsort(scores, descending=True, stable=True)[:k].tolist()


def latent_output_mass(acts: Float[Tensor, "*batch d_sae"], sae: SAE, latents: Iterable[int]) -> float:
    """Share of the SAE decoder's output mass carried by ``latents``, in [0, 1]: latent i writes
    ``a_i · decoder_directions(sae)[i]``, its mass is that vector's norm, summed over the leading entries of
    ``acts`` (recorded at ``latent_hook(sae)``). Shares of disjoint latent sets add up
    (``unit_selection.unit_output_mass`` over the decoder)."""
    d_sae = sae.cfg.d_sae
    latents = list(latents)
    if acts.shape[-1] != d_sae:
        raise ValueError(f"activations of shape {tuple(acts.shape)}; expected [..., d_sae={d_sae}]")
    bad = [i for i in latents if not 0 <= i < d_sae]
    if bad:
        raise ValueError(f"latent {bad[0]} out of range for d_sae={d_sae} (0..{d_sae - 1})")
    return unit_output_mass(acts, decoder_directions(sae).to(acts), latents)
