"""The KV-cache sampler against step-by-step full forwards, on tiny random models (and the embedded one)."""
import pytest
import torch
from conftest import make_tiny_model
from transformer_lens import HookedTransformer

from reach_lens.sampling import Generation, _output_weight, generate, make_prefix, row_seed


def reference(model: HookedTransformer, prompt: list[int], n: int, stop: int | None = None,
              hooks=()) -> tuple[list[int], list[float], list[float]]:
    """Greedy tokens by full forwards without cache, with each step's log-prob and entropy."""
    tokens, logprobs, entropies = list(prompt), [], []
    with torch.no_grad(), model.hooks(fwd_hooks=list(hooks)):
        for _ in range(n):
            logp = torch.log_softmax(model(torch.tensor([tokens]))[0, -1], -1)
            token = int(logp.argmax())
            tokens.append(token)
            logprobs.append(float(logp[token]))
            entropies.append(float(-(logp.exp() * logp).sum()))
            if token == stop:
                break
    return tokens[len(prompt):], logprobs, entropies


def random_prompts(lengths, d_vocab=50, seed=1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, d_vocab, (n,), generator=g).tolist() for n in lengths]


def letters(ids: list[int]) -> str:
    return "".join(chr(ord("a") + t % 26) for t in ids)


@pytest.fixture(scope="module")
def model() -> HookedTransformer:
    return make_tiny_model()


@pytest.fixture(scope="module")
def fallback_model() -> HookedTransformer:
    """Attention results per head are not supported by the sampler's own attention: TransformerLens's runs."""
    m = make_tiny_model(seed=3)
    m.set_use_attn_result(True)
    return m


@pytest.mark.parametrize("which", ["model", "fallback_model"])
def test_greedy_matches_full_forward_with_refills(which, request):
    m = request.getfixturevalue(which)
    # batch_size 2 over 6 prompts: rows finish at different steps (stop token) and later, longer prompts
    # are written into freed slots, which forces the cache to grow to the left and to be regathered
    prompts = random_prompts([3, 5, 30, 2, 17, 44])
    stop = reference(m, prompts[0], 4)[0][3]  # the first row ends early, so slots are refilled
    out = generate(m, prompts, max_new_tokens=12, batch_size=2, stop_token_ids=(stop,))
    for prompt, (gen,) in zip(prompts, out):
        tokens, logprobs, entropies = reference(m, prompt, 12, stop)
        assert gen.tokens == tokens
        assert gen.token_logprobs == pytest.approx(logprobs, abs=1e-4)
        assert gen.entropy == pytest.approx(sum(entropies) / len(entropies), abs=1e-4)
        assert gen.finish_reason == ("eos" if tokens[-1] == stop else "length")
    assert out[0][0].finish_reason == "eos" and len(out[0][0].tokens) <= 4


def test_samples_do_not_depend_on_batch_company(model):
    prompts = random_prompts([6, 11, 4])
    alone = generate(model, [prompts[1]], n_per_prompt=4, temperature=0.8, seeds=[5], max_new_tokens=10,
                     stop_token_ids=())
    crowd = generate(model, [prompts[0], prompts[1], prompts[2]], n_per_prompt=4, temperature=0.8,
                     seeds=[1, 5, 2], max_new_tokens=10, stop_token_ids=(), batch_size=3)
    assert [g.tokens for g in crowd[1]] == [g.tokens for g in alone[0]]
    # the K samples of one prompt differ, and another seed gives other samples
    assert len({tuple(g.tokens) for g in alone[0]}) > 1
    other = generate(model, [prompts[1]], n_per_prompt=4, temperature=0.8, seeds=[6], max_new_tokens=10,
                     stop_token_ids=())
    assert [g.tokens for g in other[0]] != [g.tokens for g in alone[0]]


def test_sampling_follows_the_tempered_distribution(model):
    prompt = random_prompts([5])[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt]))[0, -1]
    n = 3000
    for temperature in (1.0, 0.5):
        out = generate(model, [prompt], n_per_prompt=n, temperature=temperature, seeds=[0], max_new_tokens=1)
        counts = torch.bincount(torch.tensor([g.tokens[0] for g in out[0]]), minlength=50).double()
        expected = torch.softmax(logits.double() / temperature, -1)
        total_variation = 0.5 * (counts / n - expected).abs().sum()
        assert total_variation < 0.06, (temperature, total_variation)
        # log-probs are those of the untempered distribution
        chosen = out[0][0].tokens[0]
        assert out[0][0].token_logprobs[0] == pytest.approx(float(torch.log_softmax(logits, -1)[chosen]), abs=1e-5)


def test_row_seed_is_stable_and_distinct():
    assert row_seed(3, 0) == row_seed(3, 0)
    assert len({row_seed(s, k) for s in range(5) for k in range(5)}) == 25


def test_stop_strings_cut_text(model):
    prompt = random_prompts([8])[0]
    tokens, _, _ = reference(model, prompt, 10)
    text = letters(tokens)
    stop = text[4:6]
    cut = text.find(stop)
    out = generate(model, [prompt], max_new_tokens=10, stop_strings=(stop,), decode_fn=letters, stop_token_ids=())
    gen = out[0][0]
    assert gen.finish_reason == "stop"
    assert gen.text == text[:cut]
    assert gen.tokens == tokens[: cut + len(stop)]  # up to the token completing the stop string
    plain = generate(model, [prompt], max_new_tokens=10, decode_fn=letters, stop_token_ids=())[0][0]
    assert plain.text == text and plain.finish_reason == "length"


def test_rows_ending_at_their_first_token(model):
    prompts = random_prompts([4, 9, 3])
    first = [reference(model, p, 1)[0][0] for p in prompts]
    out = generate(model, prompts, max_new_tokens=5, stop_token_ids=(first[1],), batch_size=1)
    assert out[1][0].tokens == [first[1]] and out[1][0].finish_reason == "eos"
    single = generate(model, prompts, max_new_tokens=1, stop_token_ids=())
    assert [g[0].tokens for g in single] == [[f] for f in first]


def zero_mlp(act, hook):
    return torch.zeros_like(act)


def test_hooks_apply_and_see_one_position_per_step(model):
    prompts = random_prompts([6, 13])
    hooks = [("blocks.1.hook_mlp_out", zero_mlp)]
    out = generate(model, prompts, max_new_tokens=8, hooks=hooks, stop_token_ids=())
    plain = generate(model, prompts, max_new_tokens=8, stop_token_ids=())
    for prompt, gen, unhooked in zip(prompts, out, plain):
        assert gen[0].tokens == reference(model, prompt, 8, hooks=hooks)[0]
    assert [g[0].tokens for g in out] != [g[0].tokens for g in plain]  # the hook changes the output

    shapes = []

    def record(act, hook):
        shapes.append(tuple(act.shape[:2]))
        return act

    generate(model, prompts, max_new_tokens=3, hooks=[("blocks.0.hook_resid_pre", record)], stop_token_ids=())
    assert shapes[:2] == [(1, 6), (1, 13)]  # each prompt prefilled alone
    assert shapes[2:] == [(2, 1), (2, 1)]  # then one position per decode step for both rows
    assert not model.hook_dict["blocks.0.hook_resid_pre"].fwd_hooks  # scoped


def test_attention_hook_points_match_uncached_model(model):
    """A hook on the attention pattern sees the same values as in a full forward."""
    prompt = random_prompts([9])[0]
    seen = []

    def record(act, hook):
        seen.append(act[0, :, -1].clone())  # last query position: [head, key_pos]
        return act

    gen = generate(model, [prompt], max_new_tokens=3, hooks=[("blocks.2.attn.hook_pattern", record)],
                   stop_token_ids=())[0][0]
    full = prompt + gen.tokens
    for step in range(3):
        _, cache = model.run_with_cache(torch.tensor([full[: len(prompt) + step]]))
        torch.testing.assert_close(seen[step], cache["blocks.2.attn.hook_pattern"][0, :, -1], atol=1e-5, rtol=1e-4)


def test_attention_is_restored_after_an_error(model):
    def boom(act, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        generate(model, [[1, 2, 3]], max_new_tokens=2, hooks=[("blocks.0.hook_mlp_out", boom)])
    assert all("forward" not in block.attn.__dict__ for block in model.blocks)
    assert not model.hook_dict["blocks.0.hook_mlp_out"].fwd_hooks


def test_row_hooks_follow_rows_across_slots(model):
    """Per-row hooks get the global row ids of each forward's batch, wherever the rows sit."""
    prompts = random_prompts([5, 12, 7])
    scales = {0: 0.0, 1: 1.0, 2: 3.0, 3: 0.5, 4: 2.0, 5: -1.0}  # row i * 2 + k

    def hooks_for(rows):
        factor = torch.tensor([scales.get(r, 1.0) for r in rows])

        def scale(act, hook):
            return act * factor[:, None, None]

        return [("blocks.1.hook_attn_out", scale)]

    stop = 3
    out = generate(model, prompts, n_per_prompt=2, max_new_tokens=9, row_hooks=hooks_for, batch_size=2,
                   stop_token_ids=(stop,))
    for i, prompt in enumerate(prompts):
        for k in range(2):
            fixed = [("blocks.1.hook_attn_out", lambda act, hook, s=scales[2 * i + k]: act * s)]
            assert out[i][k].tokens == reference(model, prompt, 9, stop, hooks=fixed)[0], (i, k)


def test_prefix_reuse_equals_plain_generation(model):
    prompts = random_prompts([7, 15, 4])
    prefix = make_prefix(model, prompts, layers=[1, 2, 3])
    for layer in (1, 2, 3):
        hooks = [(f"blocks.{layer}.hook_mlp_out", zero_mlp)]
        plain = generate(model, prompts, max_new_tokens=6, hooks=hooks, stop_token_ids=())
        reused = generate(model, prompts, max_new_tokens=6, hooks=hooks, start_layer=layer, prefix=prefix,
                          stop_token_ids=())
        assert [g[0].tokens for g in reused] == [g[0].tokens for g in plain]
        for r, g in zip(reused, plain):
            assert r[0].token_logprobs == pytest.approx(g[0].token_logprobs, abs=1e-5)
    with pytest.raises(ValueError, match="before start_layer 2"):
        generate(model, prompts, max_new_tokens=2, hooks=[("blocks.1.hook_mlp_out", zero_mlp)], start_layer=2,
                 prefix=prefix)
    with pytest.raises(ValueError, match="before start_layer 2"):
        generate(model, prompts, max_new_tokens=2, hooks=[(lambda name: name == "hook_embed", zero_mlp)],
                 start_layer=2, prefix=prefix)
    with pytest.raises(ValueError, match="not in the prefix's layers"):
        generate(model, prompts, max_new_tokens=2, start_layer=0, prefix=prefix)
    with pytest.raises(ValueError, match="other prompts"):
        generate(model, prompts[:2], max_new_tokens=2, start_layer=1, prefix=prefix)


def test_invalid_arguments(model):
    with pytest.raises(ValueError, match="token id 50 out of range"):
        generate(model, [[1, 50]], max_new_tokens=2)
    with pytest.raises(ValueError, match="pass seeds"):
        generate(model, [[1, 2]], max_new_tokens=2, temperature=0.7)
    with pytest.raises(ValueError, match="n_ctx=128"):
        generate(model, [[1] * 100], max_new_tokens=29)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(model, [[1], []], max_new_tokens=2)
    with pytest.raises(ValueError, match="need a decode_fn"):
        generate(model, [[1]], max_new_tokens=2, stop_strings=("x",))
    with pytest.raises(ValueError, match="layer 4 out of range for a 4-layer model"):
        make_prefix(model, [[1, 2]], layers=[4])


def test_attention_weights_in_rearrange_friendly_storage():
    """Same results, and the output projection stays a view, when the attention weights are stored so that
    TransformerLens's rearranges need no copy (W_O as [d_model, head, d_head] underneath)."""
    m = make_tiny_model(seed=5)
    prompts = random_prompts([6, 10])
    before = generate(m, prompts, max_new_tokens=6, stop_token_ids=())
    for block in m.blocks:
        w_o = block.attn.W_O
        w_o.data = w_o.data.permute(2, 0, 1).contiguous().permute(1, 2, 0)
        for w in (block.attn.W_Q, block.attn._W_K, block.attn._W_V):
            w.data = w.data.permute(0, 2, 1).contiguous().permute(0, 2, 1)
        assert _output_weight(w_o).data_ptr() == w_o.data_ptr()
    after = generate(m, prompts, max_new_tokens=6, stop_token_ids=())
    assert [g[0].tokens for g in after] == [g[0].tokens for g in before]
    assert after[0][0].token_logprobs == pytest.approx(before[0][0].token_logprobs, abs=1e-5)


def test_generation_mean_logprob():
    gen = Generation([1, 2], [-1.0, -3.0], 0.5, "length", None)
    assert gen.mean_logprob == -2.0


@pytest.mark.integration
def test_embedded_model_greedy_matches_full_forward():
    from reach_lens.models import encode, load_model

    m = load_model()
    prompts = [encode(m, "The capital of France is"), encode(m, "Question: What do plants need to grow?\nAnswer:")]
    out = generate(m, prompts, max_new_tokens=12, stop_token_ids=())
    for prompt, (gen,) in zip(prompts, out):
        assert gen.tokens == reference(m, prompt, 12)[0]
        assert gen.text == m.tokenizer.decode(gen.tokens, skip_special_tokens=True)
    sampled = generate(m, prompts, n_per_prompt=3, temperature=0.8, seeds=[0, 1], max_new_tokens=8,
                       stop_strings=("\n",))
    for gens in sampled:
        for gen in gens:
            assert "\n" not in gen.text
            assert gen.finish_reason in ("eos", "stop", "length")
