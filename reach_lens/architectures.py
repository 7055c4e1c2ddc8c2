"""Which Hugging Face architectures become ``HookedTransformer``s, and their ``HookedTransformerConfig``.

``SUPPORTED_ARCHITECTURES``: every decoder-only architecture TransformerLens 3.9 has a weight converter for
(``CONVERTERS``). ``hooked_config`` builds the config from a Hugging Face config (TransformerLens's own
conversion where it reads one, the rest written here) and refuses variants TransformerLens cannot express.
``ATTENTION_FEATURES`` / ``attention_features`` list what a hand-written attention must honour per architecture.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens import loading_from_pretrained as tl_loading
from transformer_lens.pretrained import weight_conversions as tl_conv
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from reach_lens.cache import cache_dir
from reach_lens.errors import UserError

DEFAULT_N_CTX = 2048

# Hugging Face architecture name (config.json "architectures") -> TransformerLens 3.9 weight converter.
# Every decoder-only architecture TransformerLens 3.9 converts from a Hugging Face model object, except
# those whose Hugging Face class exists only as remote code (QWenLMHeadModel, GPT2LMHeadCustomModel).
CONVERTERS: dict[str, Callable] = {
    "LlamaForCausalLM": tl_conv.convert_llama_weights,
    "MistralForCausalLM": tl_conv.convert_mistral_weights,
    "MixtralForCausalLM": tl_conv.convert_mixtral_weights,
    "Qwen2ForCausalLM": tl_conv.convert_qwen2_weights,
    "Qwen3ForCausalLM": tl_conv.convert_qwen3_weights,
    "GemmaForCausalLM": tl_conv.convert_gemma_weights,
    "Gemma2ForCausalLM": tl_conv.convert_gemma_weights,
    "Gemma3ForCausalLM": tl_conv.convert_gemma_weights,
    "Gemma3ForConditionalGeneration": tl_conv.convert_gemma_weights,  # its language model; images are not read
    "OlmoForCausalLM": tl_conv.convert_olmo_weights,
    "Olmo2ForCausalLM": tl_conv.convert_olmo3_weights,  # same layout; unlike convert_olmo2_weights, GQA-aware
    "Olmo3ForCausalLM": tl_conv.convert_olmo3_weights,
    "OlmoeForCausalLM": tl_conv.convert_olmoe_weights,
    "PhiForCausalLM": tl_conv.convert_phi_weights,
    "Phi3ForCausalLM": tl_conv.convert_phi3_weights,
    "GPT2LMHeadModel": tl_conv.convert_gpt2_weights,
    "GPTNeoForCausalLM": tl_conv.convert_neo_weights,
    "GPTJForCausalLM": tl_conv.convert_gptj_weights,
    "GPTNeoXForCausalLM": tl_conv.convert_neox_weights,
    "OPTForCausalLM": tl_conv.convert_opt_weights,
    "BloomForCausalLM": tl_conv.convert_bloom_weights,
    "ApertusForCausalLM": tl_conv.convert_apertus_weights,
    "GptOssForCausalLM": tl_conv.convert_gpt_oss_weights,
}
SUPPORTED_ARCHITECTURES = tuple(CONVERTERS)


class UnsupportedArchitecture(UserError, ValueError):
    """A checkpoint whose architecture, or a variant of it, TransformerLens 3.9 cannot express."""

# What a hand-written (e.g. KV-cached) attention and block loop must honour, per architecture: every
# feature a checkpoint of that architecture can switch on in TransformerLens 3.9. ``attention_features``
# gives the ones a loaded model actually has. Vocabulary:
#   rotary / partial_rotary (rotary_dim < d_head) / rotary_adjacent_pairs (GPT-J's interleaved pairs) /
#   rope_scaling (llama3 NTK-by-parts, yarn or linear) / local_rotary_base (another base on sliding layers);
#   learned_positions / alibi; grouped_kv; sliding_window (on some or all layers, cfg.attn_types);
#   attn_softcap / final_logit_softcap; custom_attn_scale (not sqrt(d_head)) / no_attn_scale /
#   inverse_layer_idx_scale; qk_norm_per_head (RMSNorm over d_head) / qk_norm_full_width (RMSNorm over all
#   heads before the head split, OLMo family); clip_qkv; sandwich_norms (norm before and after each
#   sublayer) / post_norms (norm after each sublayer only); parallel_block (attention and MLP read the same
#   input); attention_bias; attention_sinks; embedding_layernorm; moe.
ATTENTION_FEATURES: dict[str, frozenset[str]] = {name: frozenset(features.split()) for name, features in {
    "LlamaForCausalLM": "rotary grouped_kv rope_scaling",
    "MistralForCausalLM": "rotary grouped_kv sliding_window",
    "MixtralForCausalLM": "rotary grouped_kv sliding_window moe",
    "Qwen2ForCausalLM": "rotary grouped_kv sliding_window attention_bias",
    "Qwen3ForCausalLM": "rotary grouped_kv sliding_window qk_norm_per_head",
    "GemmaForCausalLM": "rotary grouped_kv",
    "Gemma2ForCausalLM": "rotary grouped_kv sliding_window attn_softcap final_logit_softcap custom_attn_scale "
                         "sandwich_norms",
    "Gemma3ForCausalLM": "rotary grouped_kv sliding_window final_logit_softcap custom_attn_scale sandwich_norms "
                         "qk_norm_per_head local_rotary_base rope_scaling",
    "Gemma3ForConditionalGeneration": "rotary grouped_kv sliding_window custom_attn_scale sandwich_norms "
                                      "qk_norm_per_head local_rotary_base rope_scaling",
    "OlmoForCausalLM": "rotary clip_qkv",
    "Olmo2ForCausalLM": "rotary grouped_kv qk_norm_full_width post_norms",
    "Olmo3ForCausalLM": "rotary grouped_kv sliding_window qk_norm_full_width post_norms rope_scaling "
                        "local_rotary_base",
    "OlmoeForCausalLM": "rotary grouped_kv qk_norm_full_width clip_qkv moe",
    "PhiForCausalLM": "rotary partial_rotary parallel_block attention_bias",
    "Phi3ForCausalLM": "rotary partial_rotary grouped_kv sliding_window",
    "GPT2LMHeadModel": "learned_positions attention_bias inverse_layer_idx_scale",
    "GPTNeoForCausalLM": "learned_positions sliding_window no_attn_scale attention_bias",
    "GPTJForCausalLM": "rotary partial_rotary rotary_adjacent_pairs parallel_block",
    "GPTNeoXForCausalLM": "rotary partial_rotary parallel_block attention_bias",
    "OPTForCausalLM": "learned_positions attention_bias",
    "BloomForCausalLM": "alibi attention_bias embedding_layernorm",
    "ApertusForCausalLM": "rotary grouped_kv qk_norm_per_head rope_scaling",
    "GptOssForCausalLM": "rotary grouped_kv sliding_window attention_bias attention_sinks rope_scaling moe",
}.items()}


def supported_architecture(hf_config, class_name: str | None = None) -> str:
    """The supported architecture a Hugging Face config (or model class) names; ``UnsupportedArchitecture``
    (a ``ValueError``) otherwise."""
    names = [class_name] if class_name else []
    names += [name for name in getattr(hf_config, "architectures", None) or [] if name not in names]
    if not names:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        )

        inferred = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(hf_config, "model_type", None))
        names = [inferred] if inferred else []
    architecture = next((name for name in names if name in CONVERTERS), None)
    if architecture is None:
        found = names or [f"model_type {getattr(hf_config, 'model_type', 'unknown')!r}"]
        raise UnsupportedArchitecture(
            f"unsupported architecture {found}: reach_lens converts the decoder-only architectures that "
            f"TransformerLens 3.9 has weight converters for: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return architecture


def hooked_config(hf_config, *, n_ctx: int = DEFAULT_N_CTX, device: str = "cpu",
                  dtype: torch.dtype = torch.float32, architecture: str | None = None) -> HookedTransformerConfig:
    """A ``HookedTransformerConfig`` for the Hugging Face config of a supported architecture.

    TransformerLens's own ``convert_hf_model_config`` does the work where it reads the Hugging Face
    config (it reads Gemma and OLMo 1/2 configs only by official name: those are written here); the
    details it leaves out (head_dim, partial rotary, per-layer sliding windows, n_inner) are taken from
    the Hugging Face config, and a variant it cannot express is refused.
    """
    architecture = architecture or supported_architecture(hf_config)
    if architecture in _TEXT_PART:  # a multimodal wrapper: its language model is what converts
        hf_config, text_architecture = hf_config.get_text_config(), _TEXT_PART[architecture]
        if getattr(hf_config, "final_logit_softcapping", None) is not None:
            raise UnsupportedArchitecture(
                f"unsupported variant of {architecture}: final_logit_softcapping={hf_config.final_logit_softcapping} "
                "(transformers 5 does not apply it to the multimodal wrapper's logits, earlier versions did)")
    else:
        text_architecture = architecture
    _refuse_inexpressible(hf_config, text_architecture)
    if text_architecture in _CONFIG_WRITTEN_HERE:
        cfg = _CONFIG_WRITTEN_HERE[text_architecture](hf_config)
    else:
        cfg = _transformer_lens_config(hf_config, text_architecture)
    _apply_hf_details(cfg, hf_config, text_architecture)
    # the checkpoint's own limit, not TransformerLens's memory caps (2048 for Mistral, Qwen3, Bloom)
    limit = getattr(hf_config, "max_position_embeddings", None) or getattr(hf_config, "n_positions", None)
    cfg.update(
        n_ctx=min(n_ctx, limit or n_ctx),
        original_architecture=architecture,
        tokenizer_name=None,
        device=device,
        dtype=dtype,
    )
    cfg.pop("quantization_method", None)
    return HookedTransformerConfig(**cfg)


# Multimodal wrappers whose text part is a supported decoder (the converter skips the vision tower).
_TEXT_PART = {"Gemma3ForConditionalGeneration": "Gemma3ForCausalLM"}

# TransformerLens's convert_hf_model_config picks some branches by substrings of the name it is given
# (also of a local path): a config directory whose path holds one of these would be read as another model.
_TL_NAME_TRIGGERS = ("llama", "gemma", "wav2vec2")


def _transformer_lens_config(hf_config, architecture: str) -> dict:
    config = copy.deepcopy(hf_config)
    config.architectures = [architecture]
    # Fields TransformerLens 3.9 reads under their transformers 4 names (transformers 5 moved them).
    if architecture == "GPT2LMHeadModel" and not hasattr(config, "n_ctx"):
        config.n_ctx = config.n_positions
    for parent in (None, cache_dir()):
        with tempfile.TemporaryDirectory(prefix="reach-lens-config-", dir=parent) as tmp:
            if any(trigger in tmp.lower() for trigger in _TL_NAME_TRIGGERS):
                continue
            config.save_pretrained(tmp)
            return tl_loading.convert_hf_model_config(tmp)
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


def _llama_like_config(hf_config) -> dict:
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
    cfg = _llama_like_config(hf_config)
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
    cfg = _llama_like_config(hf_config)
    if hf_config.model_type == "olmo":  # non-parametric LayerNorm (the converter writes ones and zeros)
        cfg.update(normalization_type="LN", final_rms=False, eps=1e-5, clip_qkv=hf_config.clip_qkv)
    return cfg


def _phi_config(hf_config) -> dict:
    # TransformerLens reads hf_config.partial_rotary_factor, which transformers 5 keeps in rope_parameters
    # only (the rotary dimension itself is set in _apply_hf_details)
    cfg = _llama_like_config(hf_config)
    cfg.update(eps=hf_config.layer_norm_eps, normalization_type="LN", final_rms=False, gated_mlp=False,
               parallel_attn_mlp=True, n_key_value_heads=None)
    return cfg


_CONFIG_WRITTEN_HERE: dict[str, Callable[..., dict]] = {
    "GemmaForCausalLM": _gemma_config,
    "Gemma2ForCausalLM": _gemma_config,
    "Gemma3ForCausalLM": _gemma_config,
    "OlmoForCausalLM": _olmo_config,
    "Olmo2ForCausalLM": _olmo_config,
    "PhiForCausalLM": _phi_config,
}


def _apply_hf_details(cfg: dict, hf_config, architecture: str) -> None:
    """Details of the Hugging Face config that TransformerLens's config conversion leaves out."""
    head_dim = getattr(hf_config, "head_dim", None)
    if head_dim:
        cfg["d_head"] = head_dim
    if cfg.get("positional_embedding_type") == "rotary" and architecture != "GPTJForCausalLM":
        partial = _rope_parameters(hf_config).get("all", {}).get("partial_rotary_factor")
        partial = partial or getattr(hf_config, "partial_rotary_factor", None) or 1.0
        cfg["rotary_dim"] = int(cfg["d_head"] * partial)
    n_inner = getattr(hf_config, "n_inner", None) or (
        getattr(hf_config, "intermediate_size", None) if architecture == "GPTNeoForCausalLM" else None)
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


def _refuse_inexpressible(hf_config, architecture: str) -> None:
    """A ``ValueError`` for a variant of a supported architecture that TransformerLens 3.9 cannot express."""
    problems = []
    allowed_rope = {"default"} | _EXTRA_ROPE_TYPES.get(architecture, set())
    for kind, params in _rope_parameters(hf_config).items():
        rope_type = params.get("rope_type") or params.get("type") or "default"
        # TransformerLens scales rotary frequencies on global layers only (Gemma 3's linear, OLMo 3's yarn)
        if rope_type not in allowed_rope or (kind == "sliding_attention" and rope_type != "default"):
            problems.append(f"rope_type {rope_type!r}" + ("" if kind == "all" else f" on {kind} layers"))
    for flag, expected in _INEXPRESSIBLE.get(architecture, {}).items():
        if bool(getattr(hf_config, flag, expected)) != expected:
            problems.append(f"{flag}={getattr(hf_config, flag)!r}")
    n_kv = getattr(hf_config, "num_key_value_heads", None)
    if architecture in ("OlmoForCausalLM", "PhiForCausalLM") and n_kv not in (None, hf_config.num_attention_heads):
        problems.append(f"num_key_value_heads={n_kv} (grouped-query attention)")
    if architecture == "OPTForCausalLM" and hf_config.word_embed_proj_dim != hf_config.hidden_size:
        problems.append(f"word_embed_proj_dim={hf_config.word_embed_proj_dim} != hidden_size={hf_config.hidden_size}")
    if problems:
        raise UnsupportedArchitecture(
            f"unsupported variant of {architecture}: {', '.join(problems)} (TransformerLens 3.9's conversion "
            "cannot express it, and a silent conversion would not match the checkpoint)"
        )


_EXTRA_ROPE_TYPES = {
    "LlamaForCausalLM": {"llama3"},
    "ApertusForCausalLM": {"llama3"},
    "GptOssForCausalLM": {"yarn"},
    "Olmo3ForCausalLM": {"yarn"},
    "Gemma3ForCausalLM": {"linear"},
}
# Config flags whose non-default value the architecture's TransformerLens converter or blocks ignore.
_INEXPRESSIBLE: dict[str, dict[str, object]] = {
    "LlamaForCausalLM": {"attention_bias": False, "mlp_bias": False},
    "Qwen3ForCausalLM": {"attention_bias": False},
    "GemmaForCausalLM": {"attention_bias": False},
    "Gemma2ForCausalLM": {"attention_bias": False},
    "Gemma3ForCausalLM": {"attention_bias": False, "use_bidirectional_attention": False},
    "OlmoForCausalLM": {"attention_bias": False},
    "Olmo2ForCausalLM": {"attention_bias": False},
    "Olmo3ForCausalLM": {"attention_bias": False},
    "OlmoeForCausalLM": {"attention_bias": False},
    "ApertusForCausalLM": {"attention_bias": False},
    "PhiForCausalLM": {"qk_layernorm": False},
    "OPTForCausalLM": {"do_layer_norm_before": True, "_remove_final_layer_norm": False, "enable_bias": True,
                       "layer_norm_elementwise_affine": True},
    "BloomForCausalLM": {"apply_residual_connection_post_layernorm": False},
    "GPTNeoXForCausalLM": {"attention_bias": True},
    "GPT2LMHeadModel": {"add_cross_attention": False},
}


def attention_features(model: HookedTransformer) -> frozenset[str]:
    """The features of ``model`` (see ``ATTENTION_FEATURES``) that a hand-written attention must honour."""
    cfg = model.cfg
    rotary = cfg.positional_embedding_type == "rotary"
    attn = model.blocks[0].attn
    biases = [getattr(block.attn, name) for block in model.blocks for name in ("b_Q", "b_K", "b_V", "b_O")]
    checks = {
        "rotary": rotary,
        "partial_rotary": rotary and cfg.rotary_dim < cfg.d_head,
        "rotary_adjacent_pairs": rotary and cfg.rotary_adjacent_pairs,
        "rope_scaling": rotary and (cfg.use_NTK_by_parts_rope or cfg.use_yarn_rope or cfg.rotary_scaling_factor != 1),
        "local_rotary_base": rotary and cfg.rotary_base_local is not None,
        "learned_positions": cfg.positional_embedding_type == "standard",
        "alibi": cfg.positional_embedding_type == "alibi",
        "grouped_kv": cfg.n_key_value_heads is not None and cfg.n_key_value_heads != cfg.n_heads,
        "sliding_window": cfg.use_local_attn and "local" in (cfg.attn_types or ["local"]),
        "attn_softcap": cfg.attn_scores_soft_cap > 0,
        "final_logit_softcap": cfg.output_logits_soft_cap > 0,
        "no_attn_scale": not cfg.use_attn_scale,
        "custom_attn_scale": cfg.use_attn_scale and abs(cfg.attn_scale - cfg.d_head**0.5) > 1e-6,
        "inverse_layer_idx_scale": cfg.scale_attn_by_inverse_layer_idx,
        "qk_norm_per_head": cfg.use_qk_norm,
        "qk_norm_full_width": not cfg.use_qk_norm and getattr(attn, "q_norm", None) is not None,
        "clip_qkv": bool(cfg.clip_qkv),
        "sandwich_norms": cfg.use_normalization_before_and_after,
        "post_norms": cfg.original_architecture in POST_NORM_ARCHITECTURES,
        "parallel_block": cfg.parallel_attn_mlp,
        "attention_bias": any(bool(b.any()) for b in biases),
        "attention_sinks": cfg.use_attention_sinks,
        "embedding_layernorm": cfg.post_embedding_ln,
        "moe": bool(cfg.num_experts),
    }
    return frozenset(name for name, present in checks.items() if present)
