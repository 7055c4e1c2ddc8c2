"""PEFT adapters: ``load_model(adapter_dir)`` is the base model with the adapter merged in, as peft merges it.

A tiny random Llama checkpoint is the base; a LoRA with non-zero B matrices (``init_lora_weights=False``, so the
untrained adapter changes the model) is saved beside it, recording the base's directory as peft does.
"""
import json
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_models import save_checkpoint, tiny_tokenizer
from transformers import AutoModelForCausalLM

from reach_lens.errors import UserError
from reach_lens.models import (
    checkpoint_tokenizer,
    encode,
    load_model,
    local_checkpoint,
    model_fingerprint,
)

TOKENS = torch.tensor([[5, 9, 13, 40, 22, 7, 60, 3, 3, 11]])


@pytest.fixture
def adapter(tmp_path):
    """``(adapter_dir, base_dir)``: a LoRA over every attention and MLP projection of a tiny Llama, saved untrained."""
    peft = pytest.importorskip("peft")
    save_checkpoint(tmp_path / "base", "llama")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")  # so that peft records the base's directory
    torch.manual_seed(1)
    lora = peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    peft.get_peft_model(base, lora).save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter", tmp_path / "base"


def hf_merged(adapter_dir, base_dir):
    """The reference: peft's own merge of the adapter into the Hugging Face base model."""
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload().eval()


def logprobs(model, tokens=TOKENS) -> torch.Tensor:
    with torch.no_grad():
        out = model(tokens)
    return getattr(out, "logits", out).log_softmax(-1)


def test_an_adapter_loads_merged_into_its_recorded_base(adapter):
    adapter_dir, base_dir = adapter
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base_dir)
    model = load_model(adapter_dir)
    ours, merged, base = logprobs(model), logprobs(hf_merged(*adapter)), logprobs(load_model(base_dir))
    assert (ours - merged).abs().max().item() < 1e-5
    assert (ours - base).abs().max().item() > 0.1  # the adapter changes the model
    assert model.cfg.model_name == "adapter" and model.cfg.original_architecture == "LlamaForCausalLM"
    assert encode(model, "w1 w2") == [4, 5]  # no tokenizer in the adapter: the base's (which adds no BOS)
    assert model_fingerprint(model) != model_fingerprint(load_model(base_dir))


def test_an_adapter_with_its_own_tokenizer_uses_it(adapter):
    adapter_dir, _ = adapter
    tiny_tokenizer(add_bos=True).save_pretrained(adapter_dir)
    assert encode(load_model(adapter_dir), "w1 w2") == [1, 4, 5]
    assert checkpoint_tokenizer(adapter_dir)("w1")["input_ids"] == [1, 4]


def test_the_base_can_be_overridden_when_the_recorded_one_is_not_here(adapter, tmp_path):
    adapter_dir, base_dir = adapter
    expected = logprobs(hf_merged(*adapter))
    moved = shutil.move(base_dir, tmp_path / "elsewhere")
    with pytest.raises(FileNotFoundError) as error:
        load_model(adapter_dir)
    message = str(error.value)
    assert isinstance(error.value, UserError)
    for part in (f"PEFT adapter '{adapter_dir}'", f"its recorded base '{base_dir}'", "does not exist",
                 "base_model=", "adapter_config.json"):
        assert part in message, (part, message)
    model = load_model(adapter_dir, base_model=moved)
    assert (logprobs(model) - expected).abs().max().item() < 1e-5
    with pytest.raises(FileNotFoundError, match=f"base_model '{tmp_path}/nowhere'"):
        load_model(adapter_dir, base_model=tmp_path / "nowhere")
    assert encode(model, "w1") == [4] and checkpoint_tokenizer(adapter_dir, base_model=moved)("w1")["input_ids"] == [4]


def test_local_checkpoint_of_an_adapter_is_the_merged_checkpoint_written_once(adapter, tmp_path, monkeypatch):
    monkeypatch.setenv("REACH_LENS_CACHE", str(tmp_path / "cache"))
    adapter_dir, base_dir = adapter
    directory = local_checkpoint(adapter_dir)
    assert directory.parent == tmp_path / "cache" / "merged"
    written = AutoModelForCausalLM.from_pretrained(directory)
    expected = hf_merged(*adapter).state_dict()
    assert written.state_dict().keys() == expected.keys()
    for name, tensor in written.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert model_fingerprint(load_model(directory)) == model_fingerprint(load_model(adapter_dir))

    import reach_lens.models

    def no_merge(*args):
        raise AssertionError("merged again")

    with monkeypatch.context() as patch:  # a second call reads the cache
        patch.setattr(reach_lens.models, "_read_adapter", no_merge)
        assert local_checkpoint(adapter_dir) == directory
    weights = adapter_dir / "adapter_model.safetensors"
    state = load_file(weights)
    first = next(iter(state))
    state[first] = state[first] + 1.0
    save_file(state, weights, metadata={"format": "pt"})
    changed = local_checkpoint(adapter_dir)  # other adapter files: another merged checkpoint
    assert changed != directory
    assert not torch.equal(AutoModelForCausalLM.from_pretrained(changed).state_dict()[_merged_name(first)],
                           written.state_dict()[_merged_name(first)])
    with pytest.raises(ValueError, match=f"base_model 'x' is for a PEFT adapter directory.*'{base_dir}' is not one"):
        local_checkpoint(base_dir, base_model="x")


def _merged_name(adapter_key: str) -> str:
    """The base parameter a LoRA matrix of peft's state dict is merged into."""
    module = adapter_key.removeprefix("base_model.model.").rsplit(".lora_", 1)[0]
    return f"{module}.weight"


def test_adapter_errors_name_the_adapter_and_the_way_out(adapter, tmp_path, monkeypatch):
    adapter_dir, base_dir = adapter
    with pytest.raises(ValueError, match=f"base_model '{base_dir}' is for a PEFT adapter directory"):
        load_model(base_dir, base_model=base_dir)
    with pytest.raises(FileNotFoundError, match="model path '/no/such/adapter' does not exist"):
        load_model("/no/such/adapter", base_model=base_dir)
    with pytest.raises(ValueError, match=f"has a PEFT adapter as base \\(base_model '{adapter_dir}'\\): merge that"):
        load_model(adapter_dir, base_model=adapter_dir)

    config_path = adapter_dir / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "base_model_name_or_path": None}))
    with pytest.raises(FileNotFoundError, match="records no base model: pass the base model's location"):
        load_model(adapter_dir)
    config_path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read the PEFT adapter config .*adapter_config.json"):
        load_model(adapter_dir)
    config_path.write_text(json.dumps(config))

    save_checkpoint(tmp_path / "qwen3", "qwen3")  # another model: the LoRA's shapes do not fit it
    with pytest.raises(ValueError, match=f"cannot merge the PEFT adapter '{adapter_dir}' into base_model"):
        load_model(adapter_dir, base_model=tmp_path / "qwen3")

    monkeypatch.setitem(sys.modules, "peft", None)  # as if peft were not installed
    with pytest.raises(ImportError, match=r'needs peft, installed with the rlvr extra: pip install -e "\.\[rlvr\]"'):
        load_model(adapter_dir)
