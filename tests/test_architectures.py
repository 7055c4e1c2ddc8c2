"""Every supported architecture, on a tiny random checkpoint built here: load_model(dir) matches Hugging Face.

For each architecture a tiny configuration (64-wide, 2 layers, 128-token vocabulary) is built with
``AutoConfig.for_model``, instantiated with a fixed seed, given non-trivial weights (every matrix scaled
up, every norm weight and bias perturbed, so that a dropped bias or a wrong norm offset shows), saved
with a tiny word-level tokenizer, and loaded with ``load_model``. The configurations switch on each
architecture's attention details (grouped KV heads, head_dim != d_model / n_heads, sliding windows
shorter than the test sequences, soft-capping, query_pre_attn_scalar, QK clipping, partial rotary,
parallel blocks, MoE routing, rope scaling) so that a conversion that ignores one of them fails.
"""
import dataclasses

import pytest
import torch
from conftest import in_ci
from tokenizers import Tokenizer, models, pre_tokenizers
from transformer_lens.pretrained import weight_conversions as tl_conv
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
)

from reach_lens import architectures
from reach_lens.architectures import (
    ARCHITECTURES,
    SUPPORTED_ARCHITECTURES,
    Architecture,
    attention_features,
    llama_like_config,
    register_architecture,
)
from reach_lens.models import hooked_from_hf, load_model

VOCAB_SIZE = 128
SEQ_LEN = 16  # longer than every sliding window below (4), so windows matter
WINDOW = 4

LLAMA_LIKE = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=64)
TWO_LAYER_TYPES = ["sliding_attention", "full_attention"]

# HF architecture -> (model_type, config overrides). Each one's attention details are switched on.
SPECS: dict[str, tuple[str, dict]] = {
    "LlamaForCausalLM": ("llama", dict(
        LLAMA_LIKE, num_key_value_heads=2, head_dim=24, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8})),
    "MistralForCausalLM": ("mistral", dict(LLAMA_LIKE, num_key_value_heads=2, head_dim=24, sliding_window=WINDOW)),
    "MixtralForCausalLM": ("mixtral", dict(LLAMA_LIKE, num_key_value_heads=2, num_local_experts=4,
                                           num_experts_per_tok=2, sliding_window=WINDOW)),
    "Qwen2ForCausalLM": ("qwen2", dict(LLAMA_LIKE, num_key_value_heads=2, use_sliding_window=True,
                                       sliding_window=WINDOW, max_window_layers=1, layer_types=None)),
    "Qwen3ForCausalLM": ("qwen3", dict(LLAMA_LIKE, num_key_value_heads=2, head_dim=32, use_sliding_window=True,
                                       sliding_window=WINDOW, max_window_layers=1, layer_types=None)),
    "GemmaForCausalLM": ("gemma", dict(LLAMA_LIKE, num_key_value_heads=1, head_dim=32)),
    "Gemma2ForCausalLM": ("gemma2", dict(
        LLAMA_LIKE, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, layer_types=TWO_LAYER_TYPES,
        query_pre_attn_scalar=24, attn_logit_softcapping=5.0, final_logit_softcapping=8.0)),
    "Gemma3ForCausalLM": ("gemma3_text", dict(
        LLAMA_LIKE, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, layer_types=TWO_LAYER_TYPES,
        query_pre_attn_scalar=24, final_logit_softcapping=8.0,
        attn_logit_softcapping=5.0,  # Hugging Face's Gemma 3 ignores this field, and so must the conversion
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}})),
    # Gemma 3 4B-27B: a vision tower (never read) beside the Gemma 3 language model; image token ids kept
    # out of the test tokens (which start at 3)
    "Gemma3ForConditionalGeneration": ("gemma3", dict(
        text_config=dict(LLAMA_LIKE, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                         layer_types=TWO_LAYER_TYPES, query_pre_attn_scalar=24,
                         rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                          "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0,
                                                             "factor": 8.0}}),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=0, boi_token_index=1, eoi_token_index=2)),
    "OlmoForCausalLM": ("olmo", dict(LLAMA_LIKE, clip_qkv=2.0)),
    "Olmo2ForCausalLM": ("olmo2", dict(LLAMA_LIKE, num_key_value_heads=2)),  # as OLMo-2 32B
    "Olmo2ForCausalLM+mha": ("olmo2", dict(LLAMA_LIKE)),  # as OLMo-2 1B-13B
    "Olmo3ForCausalLM": ("olmo3", dict(
        LLAMA_LIKE, num_key_value_heads=2, sliding_window=WINDOW, layer_types=TWO_LAYER_TYPES,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 16, "attention_factor": 1.2}})),
    "OlmoeForCausalLM": ("olmoe", dict(LLAMA_LIKE, intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                       num_key_value_heads=2, clip_qkv=2.0)),
    "PhiForCausalLM": ("phi", dict(LLAMA_LIKE, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                "partial_rotary_factor": 0.5})),
    "Phi3ForCausalLM": ("phi3", dict(LLAMA_LIKE, num_key_value_heads=2, sliding_window=WINDOW, pad_token_id=0,
                                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.75})),
    "GPT2LMHeadModel": ("gpt2", dict(vocab_size=VOCAB_SIZE, n_embd=64, n_layer=2, n_head=4, n_inner=96,
                                     n_positions=64, scale_attn_by_inverse_layer_idx=True)),
    "GPTNeoForCausalLM": ("gpt_neo", dict(vocab_size=VOCAB_SIZE, hidden_size=64, num_layers=2, num_heads=4,
                                          intermediate_size=96, max_position_embeddings=64, window_size=WINDOW,
                                          attention_types=[[["global", "local"], 1]])),
    "GPTJForCausalLM": ("gptj", dict(vocab_size=VOCAB_SIZE, n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                     n_positions=64)),
    "GPTNeoXForCausalLM": ("gpt_neox", dict(LLAMA_LIKE, use_parallel_residual=True,
                                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                             "partial_rotary_factor": 0.25})),
    "GPTNeoXForCausalLM+sequential": ("gpt_neox", dict(LLAMA_LIKE, use_parallel_residual=False)),
    "OPTForCausalLM": ("opt", dict(vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, ffn_dim=128, word_embed_proj_dim=64,
                                   max_position_embeddings=64)),
    "BloomForCausalLM": ("bloom", dict(vocab_size=VOCAB_SIZE, hidden_size=64, n_layer=2, n_head=4)),
    "ApertusForCausalLM": ("apertus", dict(
        LLAMA_LIKE, num_key_value_heads=2,
        rope_parameters={"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8})),
    "GptOssForCausalLM": ("gpt_oss", dict(
        LLAMA_LIKE, intermediate_size=32, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=WINDOW, layer_types=TWO_LAYER_TYPES,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})),
}


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(VOCAB_SIZE - 3)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def build_checkpoint(directory, case: str):
    """A tiny random Hugging Face checkpoint of ``case`` (an architecture, or ``architecture+variant``) saved in
    ``directory``; returns the HF model."""
    architecture = case.split("+")[0]
    model_type, overrides = SPECS[case]
    try:
        config = AutoConfig.for_model(model_type, **overrides)
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    except Exception as error:  # noqa: BLE001 - a transformers without this model type, or rejecting the config
        message = f"transformers cannot build a tiny {architecture} here: {type(error).__name__}: {error}"
        if in_ci():  # CI installs the pinned stack: every supported architecture must be tested there
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    assert type(hf).__name__ == architecture
    with torch.no_grad():  # random init is near-uniform and norms are exactly 1: make every parameter matter
        for p in hf.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
            else:
                p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return hf


def random_tokens(seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB_SIZE, (3, SEQ_LEN), generator=generator)


def test_every_supported_architecture_has_a_spec_and_an_attention_record():
    assert {case.split("+")[0] for case in SPECS} == set(SUPPORTED_ARCHITECTURES)
    assert all(ARCHITECTURES[name].features for name in SUPPORTED_ARCHITECTURES)


@pytest.mark.parametrize("case", sorted(SPECS))
def test_tiny_checkpoint_matches_hf(tmp_path, case):
    architecture = case.split("+")[0]
    hf = build_checkpoint(tmp_path, case)
    model = load_model(tmp_path)
    assert model.cfg.original_architecture == architecture
    assert model.cfg.dtype == torch.float32 and model.cfg.device == "cpu"

    tokens = random_tokens()
    with torch.no_grad():
        ours = model(tokens).log_softmax(-1)
        theirs = hf(tokens).logits.log_softmax(-1)
    assert theirs.std() > 0.1  # the comparison is not between two flat distributions
    assert (ours - theirs).abs().max().item() < 1e-4

    # Unprocessed: the parameters are exactly the TransformerLens converter's output (no LN folding, no
    # centering, no value-bias folding), and the unembedding is the checkpoint's lm_head itself.
    expected = ARCHITECTURES[architecture].converter(hf, model.cfg)
    state = model.state_dict()
    for name, tensor in expected.items():
        if name == "pos_embed.W_pos":
            tensor = tensor[: model.cfg.n_ctx]
        if name not in state:  # a converter output the model has no slot for (Phi-3's LayerNorm biases)
            assert not tensor.any(), name
            continue
        assert torch.equal(state[name].flatten(), tensor.flatten().to(state[name].dtype)), name  # xIELU: [1] vs []
    assert torch.equal(model.unembed.W_U, hf.lm_head.weight.T)
    assert model.cfg.normalization_type in ("LN", "RMS")  # not folded into LNPre / RMSPre

    # dtype flows into the config and every parameter, and bfloat16 is about as close to Hugging Face's
    # float32 as Hugging Face's own bfloat16 (measured: 0.02-0.07 nats; MoE routing flips make it 0.65 vs
    # 0.77 for Mixtral).
    half = load_model(tmp_path, dtype=torch.bfloat16)
    assert half.cfg.dtype == torch.bfloat16
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    hf_half = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        ours_half = half(tokens).float().log_softmax(-1)
        theirs_half = hf_half(tokens).logits.float().log_softmax(-1)
    error, hf_error = ((x - theirs).abs().max().item() for x in (ours_half, theirs_half))
    assert error <= 2 * hf_error + 0.02, (error, hf_error)
    assert (ours_half.argmax(-1) == theirs.argmax(-1)).float().mean().item() >= 0.9

    # Each main case switches on every attention feature its architecture records; variants a subset.
    features = attention_features(model)
    if case == architecture:
        assert features == ARCHITECTURES[architecture].features
    else:
        assert features <= ARCHITECTURES[architecture].features


def test_in_memory_model_without_architectures_converts(tmp_path):
    """hooked_from_hf (the GGUF path's entry) reads the architecture from the model class when the config
    names none, as for a model built from a config and never saved."""
    tiny_tokenizer().save_pretrained(tmp_path)  # TransformerLens reloads the tokenizer from its name_or_path
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    for case in ("Gemma2ForCausalLM", "GPT2LMHeadModel"):  # a config written here, one from TransformerLens
        model_type, overrides = SPECS[case]
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **overrides)).eval()
        assert not hf.config.architectures
        model = hooked_from_hf(hf, tokenizer)
        tokens = random_tokens()
        with torch.no_grad():
            assert (model(tokens).log_softmax(-1) - hf(tokens).logits.log_softmax(-1)).abs().max() < 1e-4


def test_n_ctx_is_capped_by_the_checkpoint_not_by_transformer_lens_defaults(tmp_path):
    config = AutoConfig.for_model("mistral", **{**LLAMA_LIKE, "max_position_embeddings": 4096})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "mistral")
    tiny_tokenizer().save_pretrained(tmp_path / "mistral")
    assert load_model(tmp_path / "mistral", n_ctx=3000).cfg.n_ctx == 3000  # TransformerLens would cap at 2048
    assert load_model(tmp_path / "mistral", n_ctx=8192).cfg.n_ctx == 4096
    build_checkpoint(tmp_path / "gpt2", "GPT2LMHeadModel")  # 64 learned positions
    assert load_model(tmp_path / "gpt2", n_ctx=32).pos_embed.W_pos.shape[0] == 32
    assert load_model(tmp_path / "gpt2", n_ctx=100).pos_embed.W_pos.shape[0] == 64


def test_unsupported_architectures_are_refused_with_the_supported_list(tmp_path):
    configs = {
        "MambaForCausalLM": AutoConfig.for_model("mamba", hidden_size=16, num_hidden_layers=1, vocab_size=32),
        "T5ForConditionalGeneration": AutoConfig.for_model("t5", d_model=16, num_layers=1, num_heads=2, d_kv=8,
                                                           d_ff=32, vocab_size=32),
    }
    for name, config in configs.items():
        config.architectures = [name]
        config.save_pretrained(tmp_path / name)
        with pytest.raises(ValueError, match=f"unsupported architecture.*{name}") as error:
            load_model(tmp_path / name)
        assert ", ".join(SUPPORTED_ARCHITECTURES) in str(error.value)


LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [1.0] * 8,
            "original_max_position_embeddings": 32}
# model_type, config, what the refusal names
INEXPRESSIBLE_VARIANTS = [
    ("llama", dict(LLAMA_LIKE, attention_bias=True), "LlamaForCausalLM: attention_bias=True"),
    ("phi3", dict(LLAMA_LIKE, rope_parameters=LONGROPE), "Phi3ForCausalLM: rope_type 'longrope'"),
    ("qwen2", dict(LLAMA_LIKE, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                "original_max_position_embeddings": 32}),
     "Qwen2ForCausalLM: rope_type 'yarn'"),
    ("gemma3_text", dict(LLAMA_LIKE, head_dim=16, layer_types=TWO_LAYER_TYPES, rope_parameters={
        "sliding_attention": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}),
     "Gemma3ForCausalLM: rope_type 'linear' on sliding_attention layers"),
    ("gemma3", dict(text_config=dict(LLAMA_LIKE, head_dim=16, final_logit_softcapping=30.0)),
     "Gemma3ForConditionalGeneration: final_logit_softcapping=30.0"),
    ("olmo2", dict(LLAMA_LIKE, attention_bias=True), "Olmo2ForCausalLM: attention_bias=True"),
    ("phi", dict(LLAMA_LIKE, num_key_value_heads=2), "PhiForCausalLM: num_key_value_heads=2"),
    ("opt", dict(vocab_size=VOCAB_SIZE, do_layer_norm_before=False), "OPTForCausalLM: do_layer_norm_before=False"),
]


@pytest.mark.parametrize("model_type, config, message", INEXPRESSIBLE_VARIANTS,
                         ids=[variant[0] for variant in INEXPRESSIBLE_VARIANTS])
def test_variant_that_transformer_lens_cannot_express_is_refused(tmp_path, model_type, config, message):
    AutoConfig.for_model(model_type, **config).save_pretrained(tmp_path)  # no weights: refused before reading any
    with pytest.raises(ValueError, match=f"unsupported variant of {message}"):
        load_model(tmp_path)


@pytest.mark.parametrize("case", sorted(SPECS))
def test_engine_greedy_equals_uncached_argmax(tmp_path, case):
    """The generation engine (its own cached attention where it supports the model, TransformerLens's attention
    on the same right-aligned cache otherwise) continues prompts of different lengths, batched together, exactly
    as a step-by-step argmax over uncached forwards does; under a route with a repeated layer too."""
    from reach_lens.generate import Request, TransformerLensEngine

    build_checkpoint(tmp_path, case)
    model = load_model(tmp_path)
    tokens = random_tokens(seed=2)
    prompts = [tuple(tokens[0, :5].tolist()), tuple(tokens[1, :11].tolist()), tuple(tokens[2, :3].tolist())]
    L = model.cfg.n_layers
    routes = [None, (0, *range(L))]  # the full path, and one that runs layer 0 twice
    requests = [Request(p, 6, route=r, stop_token_ids=()) for p in prompts for r in routes]
    engine = TransformerLensEngine(model)
    gens = engine.generate(requests, batch_size=4)
    for request, gen in zip(requests, gens):
        sequence = list(request.prompt)
        with torch.no_grad():
            for _ in range(6):
                x = torch.tensor([sequence])
                if request.route is None:
                    logits = model(x)[0, -1]
                else:
                    resid = model.input_to_embed(x)[0]
                    for layer in request.route:
                        resid = model.blocks[layer](resid)
                    logits = model.unembed(model.ln_final(resid))[0, -1]
                    if model.cfg.output_logits_soft_cap > 0:
                        logits = model.cfg.output_logits_soft_cap * torch.tanh(logits / model.cfg.output_logits_soft_cap)
                sequence.append(int(logits.argmax()))
        assert gen.tokens == sequence[len(request.prompt):], (case, request.route, engine.attention)


@pytest.fixture
def registry():
    """The architecture registry, restored after the test: records a test registers do not leak into other tests."""
    saved = dict(architectures._REGISTRY)
    yield
    architectures._REGISTRY.clear()
    architectures._REGISTRY.update(saved)


def _nope_layers(hf_config) -> str | None:
    """SmolLM3's NoPE layers (no rotary positions): TransformerLens 3.9 rotates every layer."""
    return None if all(hf_config.no_rope_layers) else f"no_rope_layers={hf_config.no_rope_layers}"


SMOLLM3 = dict(LLAMA_LIKE, num_key_value_heads=2, pad_token_id=None, bos_token_id=1, eos_token_id=2)


def test_a_registered_architecture_loads_and_matches_hf(tmp_path, registry):
    """A user's record for an architecture reach_lens does not know (SmolLM3: Llama's layout and blocks, plus layers
    without rotary positions) makes load_model convert it; its variant check refuses what the converter cannot do."""
    config = AutoConfig.for_model("smollm3", **SMOLLM3)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # as build_checkpoint does: every parameter matters
        for p in hf.parameters():
            if p.dim() >= 2:
                p.mul_(4.0)
            else:
                p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(tmp_path / "smollm3")
    tiny_tokenizer().save_pretrained(tmp_path / "smollm3")
    with pytest.raises(ValueError, match=r"unsupported architecture \['SmolLM3ForCausalLM'\]"):
        load_model(tmp_path / "smollm3")

    record = Architecture(
        "SmolLM3ForCausalLM", tl_conv.convert_llama_weights, frozenset({"rotary", "grouped_kv"}),
        config=llama_like_config, fixed_flags={"attention_bias": False, "mlp_bias": False},
        checks=(_nope_layers,))
    register_architecture(record)
    assert ARCHITECTURES["SmolLM3ForCausalLM"] is record and "SmolLM3ForCausalLM" in SUPPORTED_ARCHITECTURES
    model = load_model(tmp_path / "smollm3")
    assert model.cfg.original_architecture == "SmolLM3ForCausalLM"
    tokens = random_tokens()
    with torch.no_grad():
        ours, theirs = model(tokens).log_softmax(-1), hf(tokens).logits.log_softmax(-1)
    assert theirs.std() > 0.1
    assert (ours - theirs).abs().max().item() < 1e-4
    assert attention_features(model) == record.features

    AutoConfig.for_model("smollm3", **SMOLLM3, no_rope_layer_interval=2).save_pretrained(tmp_path / "nope")
    with pytest.raises(ValueError, match=r"unsupported variant of SmolLM3ForCausalLM: no_rope_layers=\[1, 0\]"):
        load_model(tmp_path / "nope")
    AutoConfig.for_model("smollm3", **SMOLLM3, attention_bias=True).save_pretrained(tmp_path / "bias")
    with pytest.raises(ValueError, match="unsupported variant of SmolLM3ForCausalLM: attention_bias=True"):
        load_model(tmp_path / "bias")


def test_a_record_without_a_config_reader_needs_a_name_transformer_lens_reads(tmp_path, registry):
    AutoConfig.for_model("smollm3", **SMOLLM3).save_pretrained(tmp_path)
    register_architecture(Architecture("SmolLM3ForCausalLM", tl_conv.convert_llama_weights, frozenset({"rotary"})))
    with pytest.raises(ValueError, match="cannot read a config of 'SmolLM3ForCausalLM'.*config reader"):
        load_model(tmp_path)


def test_a_duplicate_registration_is_refused_and_changes_nothing(registry):
    llama = ARCHITECTURES["LlamaForCausalLM"]
    with pytest.raises(ValueError, match="architecture 'LlamaForCausalLM' is already registered"):
        register_architecture(dataclasses.replace(llama, converter=tl_conv.convert_mistral_weights))
    assert ARCHITECTURES["LlamaForCausalLM"] is llama
    with pytest.raises(TypeError, match="read-only|does not support item assignment"):
        ARCHITECTURES["LlamaForCausalLM"] = llama  # the registry changes through register_architecture only
    with pytest.raises(TypeError, match="takes an Architecture record"):
        register_architecture("LlamaForCausalLM")


def test_a_record_names_its_bad_fields():
    with pytest.raises(ValueError, match=r"unknown attention features \['rotery'\] of architecture 'X'; valid: alibi, attention_bias, "):
        Architecture("X", tl_conv.convert_llama_weights, frozenset({"rotery", "grouped_kv"}))
    with pytest.raises(TypeError, match="features of architecture 'X' must be a set of strings"):
        Architecture("X", tl_conv.convert_llama_weights, "rotary")
    with pytest.raises(TypeError, match="converter None of architecture 'X' must be callable"):
        Architecture("X", None, frozenset())
    with pytest.raises(TypeError, match=r"checks\[0\] 'attention_bias' of architecture 'X' must be callable"):
        Architecture("X", tl_conv.convert_llama_weights, frozenset(), checks=("attention_bias",))
    with pytest.raises(ValueError, match="architecture name '' must be a non-empty string"):
        Architecture("", tl_conv.convert_llama_weights, frozenset())
    record = Architecture("X", tl_conv.convert_llama_weights, frozenset(), fixed_flags={"attention_bias": False})
    with pytest.raises(TypeError):
        record.fixed_flags["attention_bias"] = True  # frozen all the way down
