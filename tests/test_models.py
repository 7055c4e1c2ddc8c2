"""Model loading: local checkpoints, GGUF, errors, fingerprints, pruning (every architecture:
tests/test_architectures.py)."""
import copy

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from reach_lens.models import (
    encode,
    load_model,
    model_fingerprint,
    prune_magnitude,
    weight_matrices,
)

VOCAB = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(61)]


def tiny_tokenizer(add_bos: bool) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    if add_bos:
        from tokenizers import processors

        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    return tok


COMMON = dict(vocab_size=len(VOCAB), hidden_size=32, intermediate_size=48, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)

ARCHITECTURES = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**COMMON, rope_theta=10000.0, tie_word_embeddings=True)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**COMMON, rope_theta=1e6, tie_word_embeddings=False)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16, rope_theta=1e6)),
}


def save_checkpoint(directory, arch: str, add_bos: bool = False):
    torch.manual_seed(0)
    hf = ARCHITECTURES[arch]().eval()
    with torch.no_grad():  # random init is near-uniform; sharpen it so comparisons mean something
        for p in hf.parameters():
            if p.dim() == 2:
                p.mul_(5.0)
    hf.save_pretrained(directory)
    tiny_tokenizer(add_bos).save_pretrained(directory)
    return hf


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_local_checkpoint_matches_hf_logprobs(tmp_path, arch):
    hf = save_checkpoint(tmp_path, arch)
    model = load_model(tmp_path)
    assert model.cfg.original_architecture == hf.config.architectures[0]
    tokens = torch.tensor([[5, 9, 13, 40, 22, 7, 60, 3, 3, 11]])
    with torch.no_grad():
        ours = model(tokens).log_softmax(-1)
        theirs = hf(tokens).logits.log_softmax(-1)
    assert (ours - theirs).abs().max().item() < 1e-4
    assert theirs.std() > 0.1  # the comparison is not between two flat distributions


def test_encode_follows_the_tokenizer_bos_rule(tmp_path):
    save_checkpoint(tmp_path / "nobos", "llama", add_bos=False)
    save_checkpoint(tmp_path / "bos", "llama", add_bos=True)
    without, with_bos = load_model(tmp_path / "nobos"), load_model(tmp_path / "bos")
    assert encode(without, "w1 w2") == [4, 5]
    assert encode(with_bos, "w1 w2") == [1, 4, 5]
    assert encode(with_bos, "<s> w1") == [1, 4]  # no second BOS when the text already has one


def test_missing_and_malformed_paths_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        load_model(str(tmp_path / "does-not-exist"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 100)
    with pytest.raises(ValueError, match="broken.gguf.*corrupt or truncated"):
        load_model(bad)


def test_corrupt_weights_file_is_reported(tmp_path):
    save_checkpoint(tmp_path, "llama")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match="corrupt"):
        load_model(tmp_path)


def test_prune_magnitude_zeroes_the_smallest_weights_of_a_copy(tiny_model):
    pruned = prune_magnitude(tiny_model, 0.5, layers=[1, 2])
    for layer in range(tiny_model.cfg.n_layers):
        for name in ("W_in", "W_gate", "W_out"):
            original = getattr(tiny_model.blocks[layer].mlp, name)
            after = getattr(pruned.blocks[layer].mlp, name)
            if layer in (1, 2):
                zero_share = (after == 0).float().mean().item()
                assert abs(zero_share - 0.5) < 0.01
                kept = after != 0
                assert torch.equal(after[kept], original[kept])
                assert original[~kept].abs().max() <= original[kept].abs().min()
            else:
                assert torch.equal(after, original)
        assert torch.equal(pruned.blocks[layer].attn.W_Q, tiny_model.blocks[layer].attn.W_Q)
    assert (tiny_model.blocks[1].mlp.W_in == 0).sum() == 0  # the original is untouched


def test_prune_magnitude_rejects_bad_arguments(tiny_model):
    with pytest.raises(ValueError, match="sparsity 1.5"):
        prune_magnitude(tiny_model, 1.5)
    with pytest.raises(ValueError, match="layer 9 out of range for a 4-layer model"):
        prune_magnitude(tiny_model, 0.1, layers=[9])
    with pytest.raises(ValueError, match="unknown component 'ln'"):
        prune_magnitude(tiny_model, 0.1, components=("ln",))


def test_model_fingerprint_is_stable_across_loads_and_sees_pruning_and_one_weight(tmp_path):
    save_checkpoint(tmp_path, "llama")
    first, second = load_model(tmp_path), load_model(tmp_path)
    fingerprint = model_fingerprint(first)
    assert model_fingerprint(second) == fingerprint
    assert model_fingerprint(prune_magnitude(first, 0.1)) != fingerprint
    edited = copy.deepcopy(first)
    with torch.no_grad():
        edited.blocks[1].mlp.W_out[3, 5] += 1e-3
    assert model_fingerprint(edited) != fingerprint
    assert model_fingerprint(first) == fingerprint  # neither the pruned copy nor the edited copy touched it


def test_prune_magnitude_on_a_loaded_model_with_transposed_storage(tmp_path):
    save_checkpoint(tmp_path, "llama")  # grouped KV heads: attention K/V are stored once per KV head
    model = load_model(tmp_path)
    assert not model.blocks[0].mlp.W_in.is_contiguous()  # store_linear_weights_transposed is in effect
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    pruned = prune_magnitude(model, 0.3, components=("mlp", "attn"))

    for name, p in model.named_parameters():  # the original is untouched, values and storage
        assert torch.equal(p, before[name]), name
    assert not model.blocks[0].mlp.W_in.is_contiguous()
    n_matrices = 0
    for block_before, block_after in zip(model.blocks, pruned.blocks):
        for component in ("mlp", "attn"):
            for original, after in zip(weight_matrices(block_before, component), weight_matrices(block_after, component)):
                n_matrices += 1
                assert (after == 0).sum().item() == round(0.3 * after.numel())  # exactly the requested share
                kept = after != 0
                assert torch.equal(after[kept], original[kept])
                assert original[~kept].abs().max() <= original[kept].abs().min()
    assert n_matrices == model.cfg.n_layers * 7  # W_in, W_gate, W_out, W_Q, _W_K, _W_V, W_O

    # The same pruned weights in ordinary contiguous storage give the same forward.
    plain = copy.deepcopy(pruned)
    for p in plain.parameters():
        p.data = p.data.contiguous()
    assert not pruned.blocks[0].mlp.W_in.is_contiguous() and plain.blocks[0].mlp.W_in.is_contiguous()
    tokens = torch.tensor([[5, 9, 13, 40, 22, 7, 60, 3, 3, 11]])
    with torch.no_grad():
        ours, reference, unpruned = pruned(tokens), plain(tokens), model(tokens)
    assert (ours - reference).abs().max().item() < 1e-5
    assert (ours - unpruned).abs().max().item() > 1e-2  # the pruning did change the model


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_loaded_weights_equal_transformer_lens_own_unprocessed_load(tmp_path, arch):
    """load_model skips TransformerLens's random init and copies the converted weights module by module: the same
    parameters and buffers as TransformerLens's load_and_process_state_dict with all processing off."""
    from transformer_lens import HookedTransformer

    from reach_lens.architectures import ARCHITECTURES, hooked_config

    hf = save_checkpoint(tmp_path, arch)
    ours = load_model(tmp_path)
    cfg = hooked_config(hf.config)
    reference = HookedTransformer(cfg, move_to_device=False)
    reference.load_and_process_state_dict(ARCHITECTURES[cfg.original_architecture].converter(hf, cfg), fold_ln=False,
                                          center_writing_weights=False, center_unembed=False,
                                          fold_value_biases=False, refactor_factored_attn_matrices=False)
    expected = reference.state_dict()
    assert ours.cfg.init_weights  # the config still builds an initialized model
    assert list(ours.state_dict()) == list(expected)
    for name, tensor in ours.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
