"""Hook factories and interventions on tiny random models: sites as hook points, silencing, steering, units,
serialization (older records included), and the positions hooks read from the engine's PositionSource."""
import json
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformer_lens import TransformerLensKeyValueCache

from reach_lens.generate import Request, engine_for
from reach_lens.hooks import LAYER_OUTPUTS, hook_point, split_hook_point
from reach_lens.interventions import Latents, Route, Silence, Steer, Units, Vector, hooks_for, intervention_from_dict
from reach_lens.positions import PositionSource
from reach_lens.unit_selection import random_units, top_units_along, unit_output_mass
from conftest import make_tiny_model

P = 6  # prompt length
CACHE_TOL = dict(atol=1e-4, rtol=1e-5)  # cached vs uncached float32 forwards: same math, other kernel shapes


@pytest.fixture(scope="module")
def model():
    return make_tiny_model()


@pytest.fixture(scope="module")
def biased_model():
    """A tiny model whose MLPs have a non-zero output bias b_out."""
    m = make_tiny_model(seed=1)
    with torch.no_grad():
        for block in m.blocks:
            block.mlp.b_out.copy_(torch.randn(m.cfg.d_model))
    return m


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 50, (3, P), generator=torch.Generator().manual_seed(0))


def run(model, tokens, interventions=(), **kwargs):
    with torch.no_grad(), model.hooks(fwd_hooks=hooks_for(list(interventions), model)):
        return model(tokens, **kwargs)


def manual_forward(model, tokens, drop_mlp=None, drop_attn=None):
    """Forward built from the block modules, leaving out one layer's MLP or attention output."""
    with torch.no_grad():
        resid = model.embed(tokens)
        for i, block in enumerate(model.blocks):
            if i == drop_mlp:
                x = block.ln1(resid)
                resid = resid + block.attn(x, x, x)
            elif i == drop_attn:
                resid = resid + block.mlp(block.ln2(resid))
            else:
                resid = block(resid)
        return model.unembed(model.ln_final(resid))


def greedy_cached(model, prompt, steps, interventions=()):
    """Greedy decoding with a KV cache under the hooks: generated tokens and each step's logits."""
    b = prompt.shape[0]
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, b)
    ones = lambda n: torch.ones(b, n, dtype=torch.long)
    seq, step_logits = prompt, []
    with torch.no_grad(), model.hooks(fwd_hooks=hooks_for(list(interventions), model)):
        logits = model(prompt, past_kv_cache=cache, attention_mask=ones(P))
        for _ in range(steps):
            step_logits.append(logits[:, -1])
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
            logits = model(nxt, past_kv_cache=cache, attention_mask=ones(1))
    return seq, torch.stack(step_logits, 1)


def greedy_full(model, prompt, steps, interventions=()):
    """The same greedy decoding with a full forward (no cache) at every step."""
    seq, step_logits = prompt, []
    with torch.no_grad(), model.hooks(fwd_hooks=hooks_for(list(interventions), model)):
        for _ in range(steps):
            last = model(seq)[:, -1]
            step_logits.append(last)
            seq = torch.cat([seq, last.argmax(-1, keepdim=True)], 1)
    return seq, torch.stack(step_logits, 1)


def as_tuple(t):
    """A tensor as the nested tuples of floats that interventions store."""
    return tuple(map(as_tuple, t)) if t.ndim > 1 else tuple(t.tolist())


def direction(model, seed=0, scale=8.0):
    return tuple((scale * torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(seed))).tolist())


# ---------------------------------------------------------------- sites


def test_every_hook_point_reads_as_itself_and_relative_to_its_block(model):
    for name in model.hook_dict:
        block, within = split_hook_point(name)
        assert hook_point(name, None, model) == name
        if block is not None:
            assert hook_point(within, block, model) == hook_point(name, block, model) == name
    assert hook_point("hook_mlp_out", 3) == "blocks.3.hook_mlp_out"  # without a model: the name alone
    assert hook_point("hook_embed") == "hook_embed" and split_hook_point("hook_embed") == (None, "hook_embed")


@pytest.mark.parametrize(
    "site,layer,match",
    [("blocks.2.hook_mlp_out", 1, "site 'blocks.2.hook_mlp_out' is in block 2, not in layer 1"),
     ("hook_embed", 0, r"site 'hook_embed' is outside the blocks: it takes no layer \(layer=None\), got layer 0"),
     ("hook_resid_pre", None, r"inside a block: name the block, by a layer or by the full name \(e.g. 'blocks.0.hook"),
     ("mlp", 2, "site 'mlp' is not a TransformerLens hook name; e.g. 'hook_mlp_out'"),
     ("hook_pos_embed", None, r"no hook point 'hook_pos_embed' on this model; e.g. 'hook_embed'"),  # rotary: none
     ("blocks.9.hook_mlp_out", None, r"layer 9 out of range for a 4-layer model \(0..3\)")],
)
def test_a_site_that_names_no_hook_point_of_the_layer_or_model_is_refused(model, site, layer, match):
    with pytest.raises(ValueError, match=match):
        hook_point(site, layer, model)


def test_a_site_in_the_layer_is_recorded_relative_to_it(model):
    v = direction(model)
    assert Silence(3, "blocks.3.hook_mlp_out") == Silence(None, "blocks.3.hook_mlp_out") == Silence(3) \
        == Silence(3, ("hook_mlp_out",)) == Silence(3, "hook_mlp_out")
    assert Silence(None, ("blocks.1.hook_attn_out", "blocks.1.hook_mlp_out")) == Silence(1, LAYER_OUTPUTS)
    assert Steer(None, v, 1.0, "blocks.2.hook_resid_pre") == Steer(2, v, 1.0, "hook_resid_pre")
    mixed = Silence(None, ("blocks.0.hook_mlp_out", "blocks.2.hook_mlp_out"))  # two blocks: no one layer
    assert (mixed.layer, mixed.site) == (None, ("blocks.0.hook_mlp_out", "blocks.2.hook_mlp_out"))
    assert [name for name, _ in Silence(12).hooks(make_tiny_model(n_layers=13))] == ["blocks.12.hook_mlp_out"]


@pytest.mark.parametrize(
    "kind,word,site,points",
    [("silence", "mlp", "hook_mlp_out", ["blocks.1.hook_mlp_out"]),
     ("silence", "attn", "hook_attn_out", ["blocks.1.hook_attn_out"]),
     ("silence", "layer", LAYER_OUTPUTS, ["blocks.1.hook_attn_out", "blocks.1.hook_mlp_out"]),
     ("steer", "mlp_out", "hook_mlp_out", ["blocks.1.hook_mlp_out"]),
     ("steer", "attn_out", "hook_attn_out", ["blocks.1.hook_attn_out"]),
     ("steer", "resid_pre", "hook_resid_pre", ["blocks.1.hook_resid_pre"]),
     ("steer", "resid_post", "hook_resid_post", ["blocks.1.hook_resid_post"])],
)
def test_older_records_read_as_the_hook_points_they_meant(model, tokens, kind, word, site, points):
    """A record with an older site word rebuilds the intervention at the same hook points (the ones the older words
    were hooked at); the constructors refuse the older word, naming the hook name to use."""
    v = direction(model)
    if kind == "silence":
        old = {"kind": "silence", "layer": 1, "site": word, "mode": "zero", "mean": None}
        new, make = Silence(1, site), lambda s: Silence(1, s)
    else:
        old = {"kind": "steer", "layer": 1, "v": list(v), "alpha": 2.0, "site": word, "positions": None}
        new, make = Steer(1, v, 2.0, site), lambda s: Steer(1, v, 2.0, s)
    read = intervention_from_dict(json.loads(json.dumps(old)))
    assert read == new and [name for name, _ in read.hooks(model)] == points
    assert torch.equal(run(model, tokens, [read]), run(model, tokens, [new]))
    with pytest.raises(ValueError, match=rf"site '{word}' is a word of older records; sites are TransformerLens hook "
                                         rf"names: use site=.*{re.escape(repr(site))}"):
        make(word)


def test_silencing_acts_at_any_hook_point(model, tokens):
    hidden = run(model, tokens, [Silence(1, "mlp.hook_post")])
    assert torch.equal(hidden, run(model, tokens, [Units(1, (), "keep")]))  # every hidden unit zeroed
    zeros = tuple([0.0] * model.cfg.d_mlp)
    assert torch.equal(run(model, tokens, [Silence(1, "mlp.hook_post", "mean", mean=zeros)]), hidden)
    assert torch.equal(run(model, tokens, [Silence(None, "hook_embed")]),
                       run(model, tokens, [Silence(0, "hook_resid_pre")]))  # rotary: the embedding is resid_pre 0
    assert (hidden - run(model, tokens)).abs().max() > 1e-2


def test_steering_outside_the_blocks_under_kv_cache_the_engine_and_without(model, tokens):
    """Steering at the embedding (before block 0's attention, where the tracker guesses) and at ln_final (after the
    last block) at chosen positions: a KV-cached decode and uncached forwards agree, and so does the engine at the
    embedding (it runs ln_final only where logits are read); the embedding is block 0's resid_pre in this rotary
    model."""
    v = direction(model)
    embed = [Steer(None, v, 4.0, "hook_embed", (1, P + 1))]
    assert torch.equal(run(model, tokens, embed), run(model, tokens, [Steer(0, v, 4.0, "hook_resid_pre", (1, P + 1))]))
    for ivs in (embed, [Steer(None, v, 0.5, "ln_final.hook_normalized", (P - 1, P + 2))]):
        cached, cached_logits = greedy_cached(model, tokens, 5, ivs)
        full, full_logits = greedy_full(model, tokens, 5, ivs)
        assert torch.equal(cached, full)
        torch.testing.assert_close(cached_logits, full_logits, **CACHE_TOL)
        assert (full_logits - greedy_full(model, tokens, 5)[1]).abs().max() > 1e-2
    gens = engine_for(model).generate([Request(tuple(row.tolist()), 5, stop_token_ids=()) for row in tokens],
                                      interventions=embed)
    assert [list(g.tokens) for g in gens] == greedy_full(model, tokens, 5, embed)[0][:, P:].tolist()


def test_steering_per_head_inputs_at_positions_under_kv_cache():
    """hook_v_input ([batch, pos, head, d_model], before the attention) steered at chosen positions: a KV-cached
    decode equals uncached forwards, and the prompt before the first position is untouched."""
    m = make_tiny_model()
    m.set_use_split_qkv_input(True)
    tokens = torch.randint(0, 50, (3, P), generator=torch.Generator().manual_seed(0))
    ivs = [Steer(1, direction(m), 4.0, "hook_v_input", (2, P + 1))]
    cached, cached_logits = greedy_cached(m, tokens, 4, ivs)
    full, full_logits = greedy_full(m, tokens, 4, ivs)
    assert torch.equal(cached, full)
    torch.testing.assert_close(cached_logits, full_logits, **CACHE_TOL)
    steered, clean = run(m, tokens, ivs), run(m, tokens)
    assert torch.equal(steered[:, :2], clean[:, :2]) and (steered[:, 2:] - clean[:, 2:]).abs().max() > 1e-2


# ---------------------------------------------------------------- silencing


def test_empty_intervention_list_is_the_plain_forward(model, tokens):
    assert hooks_for([], model) == []
    assert torch.equal(run(model, tokens), model(tokens))


@pytest.mark.parametrize("layer", [0, 2, 3])
def test_silencing_mlp_equals_forward_without_that_mlp(model, tokens, layer):
    expected = manual_forward(model, tokens, drop_mlp=layer)
    got = run(model, tokens, [Silence(layer, "hook_mlp_out")])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert (got - run(model, tokens)).abs().max() > 1e-2


def test_silencing_attention_equals_forward_without_that_attention(model, tokens):
    expected = manual_forward(model, tokens, drop_attn=1)
    torch.testing.assert_close(run(model, tokens, [Silence(1, "hook_attn_out")]), expected, atol=1e-5, rtol=0)


def test_silencing_a_layer_is_silencing_both_components(model, tokens):
    both = run(model, tokens, [Silence(2, "hook_attn_out"), Silence(2, "hook_mlp_out")])
    assert torch.equal(run(model, tokens, [Silence(2, LAYER_OUTPUTS)]), both)
    assert torch.equal(run(model, tokens, [Route((0, 1, 3))]), both)


def test_mean_silencing_writes_the_mean(model, tokens):
    mean = torch.randn(model.cfg.d_model)
    seen = {}
    record = lambda act, hook: seen.setdefault("out", act.clone())
    with torch.no_grad(), model.hooks(fwd_hooks=Silence(1, "hook_mlp_out", "mean", mean=as_tuple(mean)).hooks(model)
                                      + [("blocks.1.hook_mlp_out", record)]):
        model(tokens)
    assert torch.equal(seen["out"], mean.expand(3, P, -1))
    per_pos = mean.expand(P, -1)
    assert torch.equal(run(model, tokens, [Silence(1, "hook_mlp_out", "mean", mean=as_tuple(per_pos))]),
                       run(model, tokens, [Silence(1, "hook_mlp_out", "mean", mean=as_tuple(mean))]))


@pytest.mark.parametrize("site", ["hook_attn_out", "hook_resid_pre"])  # after and before the attention
def test_per_position_mean_is_exact_under_kv_cache(model, tokens, site):
    mean = torch.randn(P + 4, model.cfg.d_model, generator=torch.Generator().manual_seed(3))
    ivs = [Silence(1, site, "mean", mean=as_tuple(mean))]
    cached, cached_logits = greedy_cached(model, tokens, 4, ivs)
    full, full_logits = greedy_full(model, tokens, 4, ivs)
    assert torch.equal(cached, full)
    torch.testing.assert_close(cached_logits, full_logits, **CACHE_TOL)
    with pytest.raises(ValueError, match="mean covers 10 positions"):
        greedy_full(model, tokens, 6, ivs)


# ---------------------------------------------------------------- steering


def test_steering_with_alpha_zero_changes_nothing(model, tokens):
    for hook in ("hook_mlp_out", "hook_attn_out", "hook_resid_pre", "hook_resid_post"):
        assert torch.equal(run(model, tokens, [Steer(1, direction(model), 0.0, hook)]), run(model, tokens))


def test_steering_adds_alpha_v_at_the_hook(model, tokens):
    v = direction(model)
    seen = {}
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.2.hook_resid_post", lambda a, hook: seen.setdefault("clean", a))])
        model.run_with_hooks(tokens, fwd_hooks=Steer(2, v, -2.0, "hook_resid_post").hooks(model)
                             + [("blocks.2.hook_resid_post", lambda a, hook: seen.setdefault("steered", a))])
    torch.testing.assert_close(seen["steered"] - seen["clean"], -2.0 * torch.tensor(v).expand(3, P, -1))


@pytest.mark.parametrize(
    "hook,positions",
    [("hook_mlp_out", None), ("hook_mlp_out", (1, P + 1)), ("hook_resid_pre", None), ("hook_resid_pre", (P - 1, P + 2)),
     ("hook_attn_out", (0, P)), ("hook_resid_post", (P + 3,)), ("hook_resid_mid", (2, P + 1)),
     ("ln1.hook_normalized", (P - 2, P + 1))],
)
def test_steering_under_kv_cache_equals_steering_without(model, tokens, hook, positions):
    ivs = [Steer(1, direction(model), 4.0, hook, positions)]
    cached, cached_logits = greedy_cached(model, tokens, 5, ivs)
    full, full_logits = greedy_full(model, tokens, 5, ivs)
    assert torch.equal(cached, full)
    torch.testing.assert_close(cached_logits, full_logits, **CACHE_TOL)
    _, clean_logits = greedy_full(model, tokens, 5)
    assert (full_logits - clean_logits).abs().max() > 1e-2  # the steering does something


def test_steering_under_transformer_lens_generate(model, tokens):
    ivs = [Steer(2, direction(model), 6.0, "hook_mlp_out", (2, P + 1))]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks_for(ivs, model)):
        generated = model.generate(tokens, max_new_tokens=5, do_sample=False, stop_at_eos=False, verbose=False)
    assert torch.equal(generated, greedy_full(model, tokens, 5, ivs)[0])


def test_negative_positions_count_from_the_end_of_the_prompt(model, tokens):
    v = direction(model)
    for hook in ("hook_mlp_out", "hook_resid_pre"):
        last = greedy_cached(model, tokens, 4, [Steer(1, v, 4.0, hook, (-1, -3))])
        absolute = greedy_cached(model, tokens, 4, [Steer(1, v, 4.0, hook, (P - 1, P - 3))])
        assert torch.equal(last[0], absolute[0])
        torch.testing.assert_close(last[1], absolute[1], atol=1e-6, rtol=0)
        assert torch.equal(run(model, tokens, [Steer(1, v, 4.0, hook, (-1,))]),
                           run(model, tokens, [Steer(1, v, 4.0, hook, (P - 1,))]))


@pytest.mark.parametrize("hook", ["hook_mlp_out", "hook_resid_pre", "hook_attn_out"])
def test_steering_at_a_position_changes_logits_only_from_there_on(model, tokens, hook):
    clean = run(model, tokens)
    steered = run(model, tokens, [Steer(0, direction(model), 4.0, hook, (3,))])
    assert torch.equal(steered[:, :3], clean[:, :3])
    assert (steered[:, 3] - clean[:, 3]).abs().max() > 1e-2


def test_resid_pre_position_guess_is_checked(model, tokens):
    """A chunked prefill into a cache makes the resid_pre guess wrong: the forward raises, never silently."""
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, 3)
    ones = lambda n: torch.ones(3, n, dtype=torch.long)
    steer = Steer(1, direction(model), 4.0, "hook_resid_pre", (P + 1,))
    with torch.no_grad(), model.hooks(fwd_hooks=steer.hooks(model)):
        model(tokens, past_kv_cache=cache, attention_mask=ones(P))
        with pytest.raises(RuntimeError, match="guessed local positions"):
            model(tokens[:, :2], past_kv_cache=cache, attention_mask=ones(2))


def test_negative_position_before_the_prompt_raises(model, tokens):
    with pytest.raises(ValueError, match="position -7 is before the start of a 6-position prompt"):
        run(model, tokens, [Steer(1, direction(model), 1.0, "hook_mlp_out", (-7,))])


# ---------------------------------------------------------------- units


def test_zeroing_all_units_is_silencing_the_mlp_up_to_its_bias(biased_model, tokens):
    m = biased_model
    all_units = tuple(range(m.cfg.d_mlp))
    b_out = m.blocks[2].mlp.b_out.detach()
    zeroed = run(m, tokens, [Units(2, all_units, "zero")])
    torch.testing.assert_close(zeroed, run(m, tokens, [Silence(2, "hook_mlp_out", "mean", mean=as_tuple(b_out))]),
                               atol=1e-5, rtol=0)
    assert (zeroed - run(m, tokens, [Silence(2, "hook_mlp_out")])).abs().max() > 1e-2  # the bias matters here
    assert torch.equal(run(m, tokens, [Units(2, (), "keep")]), zeroed)


def test_keeping_all_units_changes_nothing(model, tokens):
    assert torch.equal(run(model, tokens, [Units(1, tuple(range(model.cfg.d_mlp)), "keep")]), run(model, tokens))
    assert torch.equal(run(model, tokens, [Units(1, (3, 5), "scale", 1.0)]), run(model, tokens))


def test_unit_modes_act_on_the_chosen_units(model, tokens):
    seen = {}
    units = (0, 7, 63)
    for mode, factor in (("keep", None), ("zero", None), ("scale", 3.0), ("clean", None)):
        ivs = [] if mode == "clean" else [Units(1, units, mode, factor)]
        record = ("blocks.1.mlp.hook_post", lambda a, hook, mode=mode: seen.setdefault(mode, a.clone()))
        with torch.no_grad(), model.hooks(fwd_hooks=hooks_for(ivs, model) + [record]):
            model(tokens)
    others = [u for u in range(model.cfg.d_mlp) if u not in units]
    assert torch.equal(seen["keep"][..., units], seen["clean"][..., units])
    assert not seen["keep"][..., others].any()
    assert not seen["zero"][..., units].any() and torch.equal(seen["zero"][..., others], seen["clean"][..., others])
    torch.testing.assert_close(seen["scale"][..., units], 3.0 * seen["clean"][..., units])


def test_top_units_along_on_a_hand_built_w_out():
    m = make_tiny_model(n_layers=2)
    W = torch.zeros(m.cfg.d_mlp, m.cfg.d_model)
    W[5, 0], W[9, 0], W[1, 0], W[7] = 3.0, 2.0, -10.0, 0.0
    W[7, 0], W[7, 1] = 1.0, 50.0  # large norm, small projection on e0
    with torch.no_grad():
        m.blocks[1].mlp.W_out.copy_(W)
    e0 = torch.zeros(m.cfg.d_model)
    e0[0] = 1.0
    assert top_units_along(m, 1, e0, k=3) == [5, 9, 7]
    assert top_units_along(m, 1, 10 * e0, k=3) == [5, 9, 7]
    assert top_units_along(m, 1, -e0, k=1) == [1]
    with pytest.raises(ValueError, match="k=65"):
        top_units_along(m, 1, e0, k=65)
    with pytest.raises(ValueError, match="non-zero"):
        top_units_along(m, 1, 0 * e0, k=3)


@given(seed=st.integers(0, 2**32), k=st.integers(0, 20), exclude=st.sets(st.integers(0, 63), max_size=40))
def test_random_units_is_seeded_and_avoids_exclude(seed, k, exclude):
    units = random_units(64, k, seed, exclude)
    assert units == random_units(64, k, seed, exclude)
    assert len(set(units)) == k and units == sorted(units)
    assert not set(units) & exclude and all(0 <= u < 64 for u in units)


def test_random_units_depends_on_seed_and_checks_k():
    assert random_units(1536, 32, 0) != random_units(1536, 32, 1)
    with pytest.raises(ValueError, match="k=5 out of range: 3 units left"):
        random_units(4, 5, 0, exclude=[2])


def test_unit_output_mass():
    acts = torch.tensor([[[1.0, -2.0, 0.0, 1.0]], [[0.0, 2.0, 0.0, 1.0]]])  # [batch 2, pos 1, d_mlp 4]
    W_out = torch.tensor([[3.0, 4.0], [1.0, 0.0], [9.0, 9.0], [0.0, 2.0]])  # norms 5, 1, 12.7, 2
    # masses: unit0 1*5, unit1 4*1, unit2 0, unit3 2*2 -> total 13
    assert unit_output_mass(acts, W_out, [0]) == pytest.approx(5 / 13)
    assert unit_output_mass(acts, W_out, [1, 3]) == pytest.approx(8 / 13)
    assert unit_output_mass(acts, W_out, range(4)) == pytest.approx(1.0)
    assert unit_output_mass(acts, W_out, [2]) == 0.0


# ---------------------------------------------------------------- hygiene and serialization


def assert_no_hooks(model):
    for name, hp in model.hook_dict.items():
        assert not hp.fwd_hooks and not hp._forward_hooks, name


def test_hooks_never_leak(model, tokens):
    ivs = [Silence(0, LAYER_OUTPUTS), Steer(1, direction(model), 2.0, "hook_resid_pre", (-1,)),
           Units(2, (1, 2), "zero"), Route((0, 2, 3)),
           Silence(3, "hook_mlp_out", "mean", mean=tuple([0.5] * model.cfg.d_model))]
    with pytest.raises(KeyError):
        with model.hooks(fwd_hooks=hooks_for(ivs, model)):
            model(tokens)
            raise KeyError("boom")
    assert_no_hooks(model)
    with pytest.raises(ValueError, match="before the start"):  # raised inside the forward, by a hook
        run(model, tokens, [Steer(1, direction(model), 1.0, "hook_mlp_out", (-50,))])
    assert_no_hooks(model)


floats = st.floats(allow_nan=False, allow_infinity=False, width=32)
vectors = st.lists(floats, min_size=1, max_size=6).map(tuple)
interventions = st.one_of(
    st.builds(Silence, site=st.sampled_from(["hook_mlp_out", "hook_attn_out", LAYER_OUTPUTS, "mlp.hook_post",
                                             "attn.hook_z", "hook_resid_mid"]), layer=st.integers(0, 80)),
    st.builds(Silence, site=st.sampled_from(["hook_embed", "ln_final.hook_normalized",
                                             ("blocks.0.hook_mlp_out", "blocks.2.hook_mlp_out")]), layer=st.none()),
    st.builds(Silence, site=st.sampled_from(["hook_mlp_out", "hook_attn_out"]), layer=st.integers(0, 80),
              mode=st.just("mean"),
              mean=st.one_of(vectors, st.lists(st.lists(floats, min_size=3, max_size=3).map(tuple),
                                               min_size=1, max_size=4).map(tuple))),
    st.builds(Steer, layer=st.integers(0, 80), v=vectors, alpha=floats,
              site=st.sampled_from(["hook_mlp_out", "hook_attn_out", "hook_resid_pre", "hook_resid_post"]),
              positions=st.one_of(st.none(), st.lists(st.integers(-100, 100), min_size=1, max_size=4).map(tuple))),
    st.builds(Units, layer=st.integers(0, 80), units=st.lists(st.integers(0, 5000), max_size=8).map(tuple),
              mode=st.sampled_from(["keep", "zero"])),
    st.builds(Units, layer=st.integers(0, 80), units=st.lists(st.integers(0, 5000), max_size=8).map(tuple),
              mode=st.just("scale"), factor=floats),
    st.builds(Latents, site=st.sampled_from(["blocks.0.hook_mlp_out", "blocks.3.hook_resid_pre"]),
              latent_ids=st.lists(st.integers(0, 5000), min_size=1, max_size=8).map(tuple), mode=st.just("zero")),
    st.builds(Latents, site=st.just("blocks.1.hook_mlp_out"),
              latent_ids=st.lists(st.integers(0, 5000), min_size=1, max_size=8).map(tuple), mode=st.just("scale"),
              factor=floats),
    st.builds(Route, layers=st.lists(st.integers(0, 80), min_size=1, max_size=10).map(tuple)),
)


@given(iv=interventions)
def test_interventions_round_trip(iv):
    d = iv.to_dict()
    assert type(iv).from_dict(d, iv.vectors()) == iv
    assert intervention_from_dict(json.loads(json.dumps(d)), iv.vectors()) == iv


def test_to_dict_is_plain_json_with_vectors_by_content_hash(tmp_path):
    from reach_lens.protocol import Protocol, question_set_hash
    from reach_lens.store import RunStore
    from reach_lens.tasks import Question

    v = torch.tensor([0.5, -1.0])
    steer = Steer(1, v, 2.0, positions=(-1,))
    sha = Vector.of(v).sha256
    assert steer.to_dict() == {"kind": "steer", "layer": 1, "v": {"sha256": sha, "shape": [2]}, "alpha": 2.0,
                               "site": "hook_mlp_out", "positions": [-1]}
    assert steer == Steer(1, (0.5, -1.0), 2.0, positions=(-1,)) == Steer(1, v.double().numpy(), 2.0, positions=(-1,))
    assert Steer(1, v + 1e-6, 2.0, positions=(-1,)) != steer  # another vector, another hash
    mean = Silence(0, "hook_mlp_out", "mean", mean=torch.ones(2, 3))
    assert mean.to_dict()["mean"] == {"sha256": Vector.of(torch.ones(2, 3)).sha256, "shape": [2, 3]}
    assert Units(3, (4, 1), "scale", 0.5).to_dict() == {"kind": "units", "layer": 3, "units": [4, 1], "mode": "scale",
                                                        "factor": 0.5}
    assert Units(3, (4,), "zero").to_dict()["factor"] is None
    assert Silence(2, "hook_attn_out").to_dict() == {"kind": "silence", "layer": 2, "site": "hook_attn_out",
                                                      "mode": "zero", "mean": None}
    assert Silence(2, LAYER_OUTPUTS).to_dict()["site"] == ["hook_attn_out", "hook_mlp_out"]
    assert Latents("blocks.1.hook_mlp_out", (7,)).to_dict() == {"kind": "latents", "site": "blocks.1.hook_mlp_out",
                                                               "latent_ids": [7], "mode": "zero", "factor": None}
    assert Route((0, 2)).to_dict() == {"kind": "route", "layers": [0, 2]}
    with pytest.raises(ValueError, match=f"steer.v is recorded by its hash sha256={sha}: pass vectors="):
        intervention_from_dict(steer.to_dict())
    # a run stores the vectors its protocol records by hash, and they rebuild the intervention
    qs = [Question("q", "x", "1")]
    protocol = Protocol(study="t", model="m", weights="w" * 16, task="t", source=None, split=None,
                        questions=question_set_hash(qs), n=1, seed=0, fmt="native", grader="g/1", probe="deploy",
                        K=None, temperature=0.0, max_new_tokens=4, stop_strings=(), interventions=(steer, mean))
    store = RunStore(tmp_path / "run", protocol.replace(seed=1))  # the vectors come along with replace
    assert sorted(p.name for p in store.vectors_dir.iterdir()) == sorted(f"{h}.npy" for h in (sha, mean.mean.sha256))
    assert [intervention_from_dict(d, store.vectors_dir) for d in protocol.interventions] == [steer, mean]
    assert intervention_from_dict({**steer.to_dict(), "v": [0.5, -1.0]}) == steer  # records of plain lists still read


def test_scale_modes_require_a_factor_and_the_others_refuse_one():
    with pytest.raises(ValueError, match="Units: mode 'scale' needs a number factor .* got None"):
        Units(2, (1,), "scale")
    with pytest.raises(ValueError, match="Latents: mode 'scale' needs a number factor .* got None"):
        Latents("blocks.1.hook_mlp_out", (1,), "scale")
    with pytest.raises(ValueError, match="Units: factor=0.0 is only used with mode 'scale', not 'keep'"):
        Units(2, (1,), "keep", 0.0)
    with pytest.raises(ValueError, match="Latents: factor=2.0 is only used with mode 'scale', not 'zero'"):
        Latents("blocks.1.hook_mlp_out", (1,), "zero", 2.0)
    with pytest.raises(ValueError, match="mode 'scale' needs a number factor"):
        intervention_from_dict({"kind": "units", "layer": 1, "units": [1], "mode": "scale", "factor": None})
    assert Units(2, (1,), "scale", 0.0).factor == 0.0  # zeroing by scale, when asked for explicitly


def test_positioned_hooks_read_the_positions_declared_on_their_source(model, tokens):
    """Built with a PositionSource, positioned hooks act at each row's declared positions: declared as the columns
    of an uncached forward they act as the hooks built without one; a row declared with a shorter prompt counts
    negative positions from its own end; nothing declared, they refuse to run."""
    mean = as_tuple(torch.randn(P, model.cfg.d_model, generator=torch.Generator().manual_seed(5)))

    def ivs(positions):
        return [Steer(1, direction(model), 4.0, "hook_resid_pre", positions),
                Silence(2, "hook_attn_out", "mean", mean=mean)]

    source = PositionSource()
    columns = torch.arange(P).expand(3, P)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks_for(ivs((-1, 2)), model, source)):
        with pytest.raises(RuntimeError, match="no row positions declared"):
            model(tokens)
        with source.declare(columns, torch.full((3,), P)):
            as_columns = model(tokens)
        with source.declare(columns, torch.tensor([P, P - 2, P])):
            own_lengths = model(tokens)
    assert torch.equal(as_columns, run(model, tokens, ivs((-1, 2))))
    torch.testing.assert_close(own_lengths[1], run(model, tokens, ivs((P - 3, 2)))[1], atol=1e-6, rtol=0)
    assert torch.equal(own_lengths[[0, 2]], as_columns[[0, 2]])


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda m: Silence(0, "ffn"), "site 'ffn' is not a TransformerLens hook name"),
        (lambda m: Silence(0, "hook_ffn_out").hooks(m), "no hook point 'blocks.0.hook_ffn_out' on this model; e.g. "),
        (lambda m: Silence(0, ("hook_mlp_out", "blocks.0.hook_mlp_out")), "names a hook point twice"),
        (lambda m: Silence(0, ()), "site is empty"),
        (lambda m: Silence(4, "hook_mlp_out").hooks(m), r"layer 4 out of range for a 4-layer model \(0..3\)"),
        (lambda m: Steer(-1, direction(m), 1.0).hooks(m), "layer -1 out of range"),
        (lambda m: Steer(0, (1.0, 2.0), 1.0).hooks(m), r"shape \(2,\); expected \(32,\)"),
        (lambda m: Steer(0, direction(m), 1.0, "resid_mid"), "site 'resid_mid' is not a TransformerLens hook name"),
        (lambda m: Steer(0, direction(m), 1.0, LAYER_OUTPUTS), r"site \('hook_attn_out', 'hook_mlp_out'\) is not a"),
        (lambda m: run(m, torch.zeros(1, 2, dtype=torch.long), [Steer(0, direction(m), 1.0, "mlp.hook_post")]),
         r"steering at blocks.0.mlp.hook_post, whose activations \(1, 2, 64\) do not end in d_model=32"),
        (lambda m: Steer(0, direction(m), float("nan")), "non-finite"),
        (lambda m: Steer(0, direction(m), 1.0, positions=()).hooks(m), "positions is empty"),
        (lambda m: Units(0, (64,), "zero").hooks(m), r"unit 64 out of range for d_mlp=64 \(0..63\)"),
        (lambda m: Units(0, (1,), "drop"), "unknown mode 'drop'"),
        (lambda m: Units(1, (1.5,)), r"units must be integers, got 1.5 \(float\)"),
        (lambda m: Units(1, (True,)), r"units must be integers, got True \(bool\)"),
        (lambda m: Units(0, (1,), "zero", factor=2.0), "factor=2.0 is only used with mode 'scale'"),
        (lambda m: Units(0, (1,), "scale"), "mode 'scale' needs a number factor"),
        (lambda m: Silence(0, LAYER_OUTPUTS, "mean", mean=(0.0,) * 32).hooks(m), "one site"),
        (lambda m: run(m, torch.zeros(1, 2, dtype=torch.long), [Silence(0, "hook_mlp_out", "mean", mean=(0.0,) * 5)]),
         r"mean of shape \(5,\) for the activations \(1, 2, 32\) at blocks.0.hook_mlp_out"),
        (lambda m: Silence(0, "hook_mlp_out", "zero", mean=(0.0,) * 32).hooks(m), "takes no mean"),
        (lambda m: Route((0, 9)).hooks(m), "has layer 9, out of range"),
        (lambda m: Route((2, 1)).hooks(m), "repeats or reorders layers"),
        (lambda m: intervention_from_dict({"kind": "prune"}), "unknown intervention kind 'prune'"),
        (lambda m: Steer.from_dict({"kind": "steer", "layer": 0, "v": [1.0], "alhpa": 1.0}), r"unknown fields \['alhpa'\]"),
        (lambda m: Steer.from_dict({"kind": "units", "layer": 0}), "kind 'units' is not 'steer'"),
    ],
)
def test_bad_input_names_the_value(model, make, match):
    with pytest.raises(ValueError, match=match):
        make(model)
