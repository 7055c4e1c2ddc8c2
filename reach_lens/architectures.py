"""Which Hugging Face architectures become ``HookedTransformer``s: one ``Architecture`` record each, in one registry.

A record says everything reach_lens knows about an architecture: its TransformerLens 3.9 weight converter, the
attention features its checkpoints can switch on, how its ``HookedTransformerConfig`` is read, and which variants
TransformerLens cannot express. ``ARCHITECTURES`` is the registry (a live, read-only mapping;
``SUPPORTED_ARCHITECTURES`` its names): every decoder-only architecture TransformerLens 3.9 has a weight converter
for, and whatever ``register_architecture`` adds. ``hooked_config`` builds the config of a Hugging Face config and
refuses what the record says cannot be expressed; ``attention_features`` lists what a hand-written attention must
honour in a model.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens import loading_from_pretrained as tl_loading
from transformer_lens.pretrained import weight_conversions as tl_conv
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from reach_lens.cache import cache_dir
from reach_lens.errors import UserError

DEFAULT_N_CTX = 2048

Converter = Callable[[Any, HookedTransformerConfig], dict[str, torch.Tensor]]  # (hf_model, cfg) -> state dict
ConfigReader = Callable[[Any], dict]  # a Hugging Face config -> HookedTransformerConfig fields
VariantCheck = Callable[[Any], str | None]  # a Hugging Face config -> what it sets that cannot be expressed, or None


class UnsupportedArchitecture(UserError, ValueError):
    """A checkpoint whose architecture, or a variant of it, TransformerLens 3.9 cannot express."""


@dataclass(frozen=True)
class Architecture:
    """How one Hugging Face architecture becomes a ``HookedTransformer``.

    - ``name``: the class name a checkpoint's config.json lists under "architectures" (and the Hugging Face model
      class); it becomes the model's ``cfg.original_architecture``. TransformerLens's blocks branch on that name
      for OLMo 2/3 and OLMoE (full-width QK norms, post norms): their converters do not serve another name.
    - ``converter(hf_model, cfg)``: the TransformerLens state dict of a Hugging Face model.
    - ``features``: every attention feature (``ATTENTION_FEATURE_NAMES``) a checkpoint of it can switch on, for
      code that writes its own attention.
    - ``config(hf_config)``: the ``HookedTransformerConfig`` fields, as a dict; None reads them with
      ``transformer_lens_config`` (TransformerLens's own conversion, which knows only the architectures it names).
      The fields TransformerLens's conversion leaves out (head_dim, partial rotary, per-layer sliding windows,
      n_inner) and the context length are then taken from the Hugging Face config for every record.
    - ``text_config``: a multimodal wrapper whose language model is what converts: ``config``, ``rope_types``,
      ``fixed_flags`` and ``checks`` read ``hf_config.get_text_config()``.
    - ``rope_types``: the rope types TransformerLens expresses for it besides "default" (on global layers only:
      sliding-window layers must keep "default").
    - ``fixed_flags``: config flags whose other value its converter or TransformerLens's blocks ignore, with the
      value they must have (a config that lacks one counts as having it).
    - ``checks``: further refusals, each ``check(hf_config)`` naming what the config sets that cannot be
      expressed (e.g. ``"num_key_value_heads=2 (grouped-query attention)"``), or None.
    """

    name: str
    converter: Converter
    features: frozenset[str]
    config: ConfigReader | None = None
    text_config: bool = False
    rope_types: frozenset[str] = frozenset()
    fixed_flags: Mapping[str, object] = field(default_factory=dict)
    checks: tuple[VariantCheck, ...] = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"architecture name {self.name!r} must be a non-empty string (a Hugging Face class name)")
        checks = tuple(self.checks)
        functions = {"converter": self.converter, **{f"checks[{i}]": check for i, check in enumerate(checks)}}
        if self.config is not None:
            functions["config"] = self.config
        for what, function in functions.items():
            if not callable(function):
                raise TypeError(f"{what} {function!r} of architecture {self.name!r} must be callable")
        features = _string_set(self.name, "features", self.features)
        rope_types = _string_set(self.name, "rope_types", self.rope_types)
        unknown = sorted(features - ATTENTION_FEATURE_NAMES)
        if unknown:
            raise ValueError(f"unknown attention features {unknown} of architecture {self.name!r}; valid: "
                             f"{', '.join(sorted(ATTENTION_FEATURE_NAMES))}")
        object.__setattr__(self, "features", features)
        object.__setattr__(self, "rope_types", rope_types)
        object.__setattr__(self, "fixed_flags", MappingProxyType(dict(self.fixed_flags)))
        object.__setattr__(self, "checks", checks)


def _string_set(name: str, what: str, values: Iterable[str]) -> frozenset[str]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise TypeError(f"{what} of architecture {name!r} must be a set of strings, not {values!r}")
    return frozenset(values)


_REGISTRY: dict[str, Architecture] = {}
ARCHITECTURES: Mapping[str, Architecture] = MappingProxyType(_REGISTRY)  # name -> record, live and read-only
SUPPORTED_ARCHITECTURES = ARCHITECTURES.keys()  # the registered names, in registration order (a live view)


def register_architecture(architecture: Architecture) -> None:
    """Make ``load_model`` (and ``hooked_config``, ``hooked_from_hf``) convert checkpoints of ``architecture.name``.
    A name already registered is refused."""
    if not isinstance(architecture, Architecture):
        raise TypeError(f"register_architecture takes an Architecture record, not {architecture!r}")
    if architecture.name in _REGISTRY:
        raise ValueError(f"architecture {architecture.name!r} is already registered (a name has one record: "
                         f"ARCHITECTURES[{architecture.name!r}])")
    _REGISTRY[architecture.name] = architecture


def supported_architecture(hf_config, class_name: str | None = None) -> str:
    """The registered architecture a Hugging Face config (or model class) names; ``UnsupportedArchitecture``
    (a ``ValueError``) otherwise."""
    names = [class_name] if class_name else []
    names += [name for name in getattr(hf_config, "architectures", None) or [] if name not in names]
    if not names:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        )

        inferred = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(hf_config, "model_type", None))
        names = [inferred] if inferred else []
    architecture = next((name for name in names if name in _REGISTRY), None)
    if architecture is None:
        found = names or [f"model_type {getattr(hf_config, 'model_type', 'unknown')!r}"]
        raise UnsupportedArchitecture(
            f"unsupported architecture {found}: reach_lens converts the registered architectures (every decoder-only "
            f"architecture TransformerLens 3.9 has weight converters for, and those added with "
            f"reach_lens.architectures.register_architecture): {', '.join(_REGISTRY)}"
        )
    return architecture


def hooked_config(hf_config, *, n_ctx: int = DEFAULT_N_CTX, device: str = "cpu",
                  dtype: torch.dtype = torch.float32, architecture: str | None = None) -> HookedTransformerConfig:
    """A ``HookedTransformerConfig`` for the Hugging Face config of a registered architecture (``architecture``,
    default: the one the config names), read as its record says; a variant it cannot express is refused
    (``UnsupportedArchitecture``)."""
    name = architecture or supported_architecture(hf_config)
    if name not in _REGISTRY:
        raise UnsupportedArchitecture(f"architecture {name!r} is not registered; registered: {', '.join(_REGISTRY)}")
    record = _REGISTRY[name]
    if record.text_config:  # a multimodal wrapper: its language model is what converts
        hf_config = hf_config.get_text_config()
    _refuse_inexpressible(hf_config, record)
    cfg = record.config(hf_config) if record.config is not None else transformer_lens_config(hf_config, name)
    _apply_hf_details(cfg, hf_config)
    # the checkpoint's own limit, not TransformerLens's memory caps (2048 for Mistral, Qwen3, Bloom)
    limit = getattr(hf_config, "max_position_embeddings", None) or getattr(hf_config, "n_positions", None)
    cfg.update(
        n_ctx=min(n_ctx, limit or n_ctx),
        original_architecture=name,
        tokenizer_name=None,
        device=device,
        dtype=dtype,
    )
    cfg.pop("quantization_method", None)
    return HookedTransformerConfig(**cfg)


# TransformerLens's convert_hf_model_config picks some branches by substrings of the name it is given
# (also of a local path): a config directory whose path holds one of these would be read as another model.
_TL_NAME_TRIGGERS = ("llama", "gemma", "wav2vec2")


def transformer_lens_config(hf_config, architecture: str) -> dict:
    """TransformerLens 3.9's own ``convert_hf_model_config`` of ``hf_config``, read as if it named ``architecture``
    (one TransformerLens knows; ``UnsupportedArchitecture`` otherwise)."""
    config = copy.deepcopy(hf_config)
    config.architectures = [architecture]
    for parent in (None, cache_dir()):
        with tempfile.TemporaryDirectory(prefix="reach-lens-config-", dir=parent) as tmp:
            if any(trigger in tmp.lower() for trigger in _TL_NAME_TRIGGERS):
                continue
            config.save_pretrained(tmp)
            try:
                return tl_loading.convert_hf_model_config(tmp)
            except NotImplementedError as error:
                raise UnsupportedArchitecture(
                    f"TransformerLens 3.9 cannot read a config of {architecture!r} ({error}): give its Architecture "
                    "record a config reader (e.g. reach_lens.architectures.llama_like_config)") from error
    raise RuntimeError(
        f"no temporary directory without {', '.join(_TL_NAME_TRIGGERS)} in its path (TransformerLens would read "
        "the config as another model): set TMPDIR to another directory"
    )


def _rope_parameters(hf_config) -> dict:
    """Rope parameters per attention type (``{"all": {...}}`` when one set serves every layer)."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        return dict(params)
    return {"all": dict(params)}


def llama_like_config(hf_config) -> dict:
    """``HookedTransformerConfig`` fields of a Llama-shaped Hugging Face config: RMS norms, rotary positions over
    the whole head, gated MLP, grouped KV heads where it has them (the base of the Gemma, OLMo and Phi readers)."""
    n_heads = hf_config.num_attention_heads
    d_head = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // n_heads
    n_kv = getattr(hf_config, "num_key_value_heads", None) or n_heads
    return {
        "d_model": hf_config.hidden_size,
        "d_head": d_head,
        "n_heads": n_heads,
        "n_key_value_heads": n_kv if n_kv != n_heads else None,
        "d_mlp": hf_config.intermediate_size,
        "n_layers": hf_config.num_hidden_layers,
        "n_ctx": hf_config.max_position_embeddings,
        "eps": getattr(hf_config, "rms_norm_eps", 1e-5),
        "d_vocab": hf_config.vocab_size,
        "act_fn": getattr(hf_config, "hidden_activation", None) or hf_config.hidden_act,
        "normalization_type": "RMS",
        "positional_embedding_type": "rotary",
        "rotary_dim": d_head,
        "rotary_base": tl_loading._get_rope_theta(hf_config),
        "final_rms": True,
        "gated_mlp": True,
    }


def _gemma_config(hf_config) -> dict:
    cfg = llama_like_config(hf_config)
    cfg["n_key_value_heads"] = hf_config.num_key_value_heads  # the Gemma converter always uses grouped names
    if hf_config.model_type == "gemma":
        return cfg
    cfg["use_normalization_before_and_after"] = True
    cfg["attn_scale"] = float(hf_config.query_pre_attn_scalar) ** 0.5
    if getattr(hf_config, "final_logit_softcapping", None) is not None:
        cfg["output_logits_soft_cap"] = float(hf_config.final_logit_softcapping)
    # Gemma 2 soft-caps attention scores; Gemma 3 keeps attn_logit_softcapping in its config but never applies it
    if hf_config.model_type == "gemma2" and hf_config.attn_logit_softcapping is not None:
        cfg["attn_scores_soft_cap"] = float(hf_config.attn_logit_softcapping)
    if hf_config.model_type.startswith("gemma3"):
        cfg["use_qk_norm"] = True
        rope = _rope_parameters(hf_config)
        full, local = rope.get("full_attention", {}), rope.get("sliding_attention", {})
        if full:
            cfg["rotary_base"] = full["rope_theta"]
            if full.get("rope_type") == "linear":
                cfg["rotary_scaling_factor"] = float(full["factor"])
        if local:
            cfg["rotary_base_local"] = local["rope_theta"]
    return cfg


def _olmo_config(hf_config) -> dict:
    cfg = llama_like_config(hf_config)
    if hf_config.model_type == "olmo":  # non-parametric LayerNorm (the converter writes ones and zeros)
        cfg.update(normalization_type="LN", final_rms=False, eps=1e-5, clip_qkv=hf_config.clip_qkv)
    return cfg


def _phi_config(hf_config) -> dict:
    # TransformerLens reads hf_config.partial_rotary_factor, which transformers 5 keeps in rope_parameters
    # only (the rotary dimension itself is set in _apply_hf_details)
    cfg = llama_like_config(hf_config)
    cfg.update(eps=hf_config.layer_norm_eps, normalization_type="LN", final_rms=False, gated_mlp=False,
               parallel_attn_mlp=True, n_key_value_heads=None)
    return cfg


def _gpt2_config(hf_config) -> dict:
    config = copy.deepcopy(hf_config)
    if not hasattr(config, "n_ctx"):  # TransformerLens 3.9 reads the transformers 4 name
        config.n_ctx = config.n_positions
    return transformer_lens_config(config, "GPT2LMHeadModel")


def _gpt_neo_config(hf_config) -> dict:
    cfg = transformer_lens_config(hf_config, "GPTNeoForCausalLM")
    if hf_config.intermediate_size:  # TransformerLens assumes 4 x d_model
        cfg["d_mlp"] = hf_config.intermediate_size
    return cfg


def _apply_hf_details(cfg: dict, hf_config) -> None:
    """Details of the Hugging Face config that TransformerLens's config conversion leaves out."""
    head_dim = getattr(hf_config, "head_dim", None)
    if head_dim:
        cfg["d_head"] = head_dim
    if cfg.get("positional_embedding_type") == "rotary":
        partial = _rope_parameters(hf_config).get("all", {}).get("partial_rotary_factor")
        partial = partial or getattr(hf_config, "partial_rotary_factor", None) or 1.0
        cfg["rotary_dim"] = getattr(hf_config, "rotary_dim", None) or int(cfg["d_head"] * partial)  # GPT-J: its own
    n_inner = getattr(hf_config, "n_inner", None)
    if n_inner:
        cfg["d_mlp"] = n_inner
    layer_types = getattr(hf_config, "layer_types", None)
    window = getattr(hf_config, "sliding_window", None)
    if layer_types:
        local = [kind == "sliding_attention" for kind in layer_types]
        if any(local) and window:
            cfg.update(use_local_attn=True, window_size=window,
                       attn_types=["local" if is_local else "global" for is_local in local])
        else:
            cfg.update(use_local_attn=False, window_size=None, attn_types=None)


def _refuse_inexpressible(hf_config, record: Architecture) -> None:
    """An ``UnsupportedArchitecture`` for a variant of a registered architecture that its record says
    TransformerLens 3.9 cannot express."""
    problems = []
    allowed_rope = {"default"} | record.rope_types
    for kind, params in _rope_parameters(hf_config).items():
        rope_type = params.get("rope_type") or params.get("type") or "default"
        # TransformerLens scales rotary frequencies on global layers only (Gemma 3's linear, OLMo 3's yarn)
        if rope_type not in allowed_rope or (kind == "sliding_attention" and rope_type != "default"):
            problems.append(f"rope_type {rope_type!r}" + ("" if kind == "all" else f" on {kind} layers"))
    for flag, expected in record.fixed_flags.items():
        if bool(getattr(hf_config, flag, expected)) != expected:
            problems.append(f"{flag}={getattr(hf_config, flag)!r}")
    problems += [problem for check in record.checks if (problem := check(hf_config))]
    if problems:
        raise UnsupportedArchitecture(
            f"unsupported variant of {record.name}: {', '.join(problems)} (TransformerLens 3.9's conversion "
            "cannot express it, and a silent conversion would not match the checkpoint)"
        )


def _no_grouped_kv(hf_config) -> str | None:
    n_kv = getattr(hf_config, "num_key_value_heads", None)
    if n_kv in (None, hf_config.num_attention_heads):
        return None
    return f"num_key_value_heads={n_kv} (grouped-query attention)"


def _opt_projection(hf_config) -> str | None:
    if hf_config.word_embed_proj_dim == hf_config.hidden_size:
        return None
    return f"word_embed_proj_dim={hf_config.word_embed_proj_dim} != hidden_size={hf_config.hidden_size}"


def _no_wrapper_logit_softcap(hf_config) -> str | None:
    if getattr(hf_config, "final_logit_softcapping", None) is None:
        return None
    return (f"final_logit_softcapping={hf_config.final_logit_softcapping} (transformers 5 does not apply it to the "
            "multimodal wrapper's logits, earlier versions did)")


def _rotary(m: HookedTransformer) -> bool:
    return m.cfg.positional_embedding_type == "rotary"


# What a hand-written (e.g. KV-cached) attention and block loop must honour, each feature with its test on a loaded
# model. Vocabulary:
#   rotary / partial_rotary (rotary_dim < d_head) / rotary_adjacent_pairs (GPT-J's interleaved pairs) /
#   rope_scaling (llama3 NTK-by-parts, yarn or linear) / local_rotary_base (another base on sliding layers);
#   learned_positions / alibi; grouped_kv; sliding_window (on some or all layers, cfg.attn_types);
#   attn_softcap / final_logit_softcap; custom_attn_scale (not sqrt(d_head)) / no_attn_scale /
#   inverse_layer_idx_scale; qk_norm_per_head (RMSNorm over d_head) / qk_norm_full_width (RMSNorm over all
#   heads before the head split, OLMo family); clip_qkv; sandwich_norms (norm before and after each
#   sublayer) / post_norms (norm after each sublayer only); parallel_block (attention and MLP read the same
#   input); attention_bias; attention_sinks; embedding_layernorm; moe.
_FEATURE_PRESENT: dict[str, Callable[[HookedTransformer], bool]] = {
    "rotary": _rotary,
    "partial_rotary": lambda m: _rotary(m) and m.cfg.rotary_dim < m.cfg.d_head,
    "rotary_adjacent_pairs": lambda m: _rotary(m) and m.cfg.rotary_adjacent_pairs,
    "rope_scaling": lambda m: _rotary(m) and (m.cfg.use_NTK_by_parts_rope or m.cfg.use_yarn_rope
                                              or m.cfg.rotary_scaling_factor != 1),
    "local_rotary_base": lambda m: _rotary(m) and m.cfg.rotary_base_local is not None,
    "learned_positions": lambda m: m.cfg.positional_embedding_type == "standard",
    "alibi": lambda m: m.cfg.positional_embedding_type == "alibi",
    "grouped_kv": lambda m: m.cfg.n_key_value_heads is not None and m.cfg.n_key_value_heads != m.cfg.n_heads,
    "sliding_window": lambda m: m.cfg.use_local_attn and "local" in (m.cfg.attn_types or ["local"]),
    "attn_softcap": lambda m: m.cfg.attn_scores_soft_cap > 0,
    "final_logit_softcap": lambda m: m.cfg.output_logits_soft_cap > 0,
    "no_attn_scale": lambda m: not m.cfg.use_attn_scale,
    "custom_attn_scale": lambda m: m.cfg.use_attn_scale and abs(m.cfg.attn_scale - m.cfg.d_head**0.5) > 1e-6,
    "inverse_layer_idx_scale": lambda m: m.cfg.scale_attn_by_inverse_layer_idx,
    "qk_norm_per_head": lambda m: m.cfg.use_qk_norm,
    "qk_norm_full_width": lambda m: not m.cfg.use_qk_norm and getattr(m.blocks[0].attn, "q_norm", None) is not None,
    "clip_qkv": lambda m: bool(m.cfg.clip_qkv),
    "sandwich_norms": lambda m: m.cfg.use_normalization_before_and_after,
    "post_norms": lambda m: m.cfg.original_architecture in POST_NORM_ARCHITECTURES,
    "parallel_block": lambda m: m.cfg.parallel_attn_mlp,
    "attention_bias": lambda m: any(bool(getattr(block.attn, name).any()) for block in m.blocks
                                    for name in ("b_Q", "b_K", "b_V", "b_O")),
    "attention_sinks": lambda m: m.cfg.use_attention_sinks,
    "embedding_layernorm": lambda m: m.cfg.post_embedding_ln,
    "moe": lambda m: bool(m.cfg.num_experts),
}
ATTENTION_FEATURE_NAMES = frozenset(_FEATURE_PRESENT)


def attention_features(model: HookedTransformer) -> frozenset[str]:
    """The features of ``model`` (``ATTENTION_FEATURE_NAMES``) that a hand-written attention must honour."""
    return frozenset(name for name, present in _FEATURE_PRESENT.items() if present(model))


# The built-in records: every decoder-only architecture TransformerLens 3.9 converts from a Hugging Face model object,
# except those whose Hugging Face class exists only as remote code (QWenLMHeadModel, GPT2LMHeadCustomModel).
_NO_ATTENTION_BIAS = {"attention_bias": False}
_GEMMA3 = Architecture(
    "Gemma3ForCausalLM", tl_conv.convert_gemma_weights,
    frozenset({"rotary", "grouped_kv", "sliding_window", "final_logit_softcap", "custom_attn_scale", "sandwich_norms",
               "qk_norm_per_head", "local_rotary_base", "rope_scaling"}),
    config=_gemma_config, rope_types=frozenset({"linear"}),
    fixed_flags={"attention_bias": False, "use_bidirectional_attention": False})
_OLMO2 = Architecture(  # same layout as OLMo 3; unlike convert_olmo2_weights, convert_olmo3_weights is GQA-aware
    "Olmo2ForCausalLM", tl_conv.convert_olmo3_weights,
    frozenset({"rotary", "grouped_kv", "qk_norm_full_width", "post_norms"}),
    config=_olmo_config, fixed_flags=_NO_ATTENTION_BIAS)

for _record in (
    Architecture("LlamaForCausalLM", tl_conv.convert_llama_weights, frozenset({"rotary", "grouped_kv", "rope_scaling"}),
                 rope_types=frozenset({"llama3"}), fixed_flags={"attention_bias": False, "mlp_bias": False}),
    Architecture("MistralForCausalLM", tl_conv.convert_mistral_weights,
                 frozenset({"rotary", "grouped_kv", "sliding_window"})),
    Architecture("MixtralForCausalLM", tl_conv.convert_mixtral_weights,
                 frozenset({"rotary", "grouped_kv", "sliding_window", "moe"})),
    Architecture("Qwen2ForCausalLM", tl_conv.convert_qwen2_weights,
                 frozenset({"rotary", "grouped_kv", "sliding_window", "attention_bias"})),
    Architecture("Qwen3ForCausalLM", tl_conv.convert_qwen3_weights,
                 frozenset({"rotary", "grouped_kv", "sliding_window", "qk_norm_per_head"}),
                 fixed_flags=_NO_ATTENTION_BIAS),
    Architecture("GemmaForCausalLM", tl_conv.convert_gemma_weights, frozenset({"rotary", "grouped_kv"}),
                 config=_gemma_config, fixed_flags=_NO_ATTENTION_BIAS),
    Architecture("Gemma2ForCausalLM", tl_conv.convert_gemma_weights,
                 frozenset({"rotary", "grouped_kv", "sliding_window", "attn_softcap", "final_logit_softcap",
                            "custom_attn_scale", "sandwich_norms"}),
                 config=_gemma_config, fixed_flags=_NO_ATTENTION_BIAS),
    _GEMMA3,
    dataclasses.replace(  # Gemma 3 4B-27B: the language model converts; the vision tower is not read
        _GEMMA3, name="Gemma3ForConditionalGeneration", features=_GEMMA3.features - {"final_logit_softcap"},
        text_config=True, checks=(_no_wrapper_logit_softcap,)),
    Architecture("OlmoForCausalLM", tl_conv.convert_olmo_weights, frozenset({"rotary", "clip_qkv"}),
                 config=_olmo_config, fixed_flags=_NO_ATTENTION_BIAS, checks=(_no_grouped_kv,)),
    _OLMO2,
    Architecture("Olmo3ForCausalLM", tl_conv.convert_olmo3_weights,
                 _OLMO2.features | {"sliding_window", "rope_scaling", "local_rotary_base"},
                 rope_types=frozenset({"yarn"}), fixed_flags=_NO_ATTENTION_BIAS),
    Architecture("OlmoeForCausalLM", tl_conv.convert_olmoe_weights,
                 frozenset({"rotary", "grouped_kv", "qk_norm_full_width", "clip_qkv", "moe"}),
                 fixed_flags=_NO_ATTENTION_BIAS),
    Architecture("PhiForCausalLM", tl_conv.convert_phi_weights,
                 frozenset({"rotary", "partial_rotary", "parallel_block", "attention_bias"}),
                 config=_phi_config, fixed_flags={"qk_layernorm": False}, checks=(_no_grouped_kv,)),
    Architecture("Phi3ForCausalLM", tl_conv.convert_phi3_weights,
                 frozenset({"rotary", "partial_rotary", "grouped_kv", "sliding_window"})),
    Architecture("GPT2LMHeadModel", tl_conv.convert_gpt2_weights,
                 frozenset({"learned_positions", "attention_bias", "inverse_layer_idx_scale"}),
                 config=_gpt2_config, fixed_flags={"add_cross_attention": False}),
    Architecture("GPTNeoForCausalLM", tl_conv.convert_neo_weights,
                 frozenset({"learned_positions", "sliding_window", "no_attn_scale", "attention_bias"}),
                 config=_gpt_neo_config),
    Architecture("GPTJForCausalLM", tl_conv.convert_gptj_weights,
                 frozenset({"rotary", "partial_rotary", "rotary_adjacent_pairs", "parallel_block"})),
    Architecture("GPTNeoXForCausalLM", tl_conv.convert_neox_weights,
                 frozenset({"rotary", "partial_rotary", "parallel_block", "attention_bias"}),
                 fixed_flags={"attention_bias": True}),
    Architecture("OPTForCausalLM", tl_conv.convert_opt_weights, frozenset({"learned_positions", "attention_bias"}),
                 fixed_flags={"do_layer_norm_before": True, "_remove_final_layer_norm": False, "enable_bias": True,
                              "layer_norm_elementwise_affine": True},
                 checks=(_opt_projection,)),
    Architecture("BloomForCausalLM", tl_conv.convert_bloom_weights,
                 frozenset({"alibi", "attention_bias", "embedding_layernorm"}),
                 fixed_flags={"apply_residual_connection_post_layernorm": False}),
    Architecture("ApertusForCausalLM", tl_conv.convert_apertus_weights,
                 frozenset({"rotary", "grouped_kv", "qk_norm_per_head", "rope_scaling"}),
                 rope_types=frozenset({"llama3"}), fixed_flags=_NO_ATTENTION_BIAS),
    Architecture("GptOssForCausalLM", tl_conv.convert_gpt_oss_weights,
                 frozenset({"rotary", "grouped_kv", "sliding_window", "attention_bias", "attention_sinks",
                            "rope_scaling", "moe"}),
                 rope_types=frozenset({"yarn"})),
):
    register_architecture(_record)
