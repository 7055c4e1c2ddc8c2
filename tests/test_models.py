"""Model loading: local checkpoints of each supported architecture, GGUF, errors, pruning."""
import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    GPT2Config,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from reach_lens.models import encode, load_model, prune_magnitude

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


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({**json.loads((tmp_path / "config.json").read_text()), "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"):
        load_model(tmp_path)


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


@pytest.mark.integration
def test_embedded_model_matches_hf_on_real_prompts():
    from transformers import AutoModelForCausalLM

    from reach_lens.models import embedded_checkpoint_dir

    model = load_model()
    hf = AutoModelForCausalLM.from_pretrained(embedded_checkpoint_dir(), dtype=torch.float32).eval()
    assert model.cfg.n_layers == 30 and model.cfg.d_model == 576 and model.cfg.d_vocab == 49152
    chat = model.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Which gas do plants absorb from the air? A. oxygen B. carbon dioxide"}],
        tokenize=False, add_generation_prompt=True)
    for text in [chat, "Question: What is the boiling point of water at sea level?\nAnswer:"]:
        tokens = torch.tensor([encode(model, text)])
        with torch.no_grad():
            ours = model(tokens).log_softmax(-1)
            theirs = hf(tokens).logits.log_softmax(-1)
        assert (ours - theirs).abs().max().item() < 1e-4
    with torch.no_grad():
        greedy_hf = hf.generate(tokens, max_new_tokens=12, do_sample=False)[0, tokens.shape[1]:].tolist()
        current = tokens
        for _ in range(12):
            current = torch.cat([current, model(current)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert current[0, tokens.shape[1]:].tolist() == greedy_hf
