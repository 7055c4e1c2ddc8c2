"""reach_lens on SAELens's HookedSAETransformer: probes and hooks with random SAEs attached to a tiny random model
(SAEs built from a config: no hub), the engine against the SAE-attached model's own forward, SAE-latent
interventions, and the engine's prefix cache across attaching, detaching and use_error_term."""
import importlib.util
import json

import pytest
import torch
from conftest import in_ci, make_tiny_model

if importlib.util.find_spec("sae_lens") is None:
    reason = 'needs SAELens (the optional extra: pip install -e ".[sae]")'
    if in_ci():
        pytest.fail(f"{reason}; CI installs it, so its absence fails under CI=true", pytrace=False)
    pytest.skip(reason, allow_module_level=True)

from sae_lens import (HookedSAETransformer, StandardSAE, StandardSAEConfig, TemporalSAE,
                      TemporalSAEConfig, TopKSAE, TopKSAEConfig, Transcoder, TranscoderConfig)
from sae_lens.saes.sae import SAEMetadata
from test_probes import CharTokenizer

from reach_lens.generate import EngineCapabilityError, Request, TransformerLensEngine, engine_for
from reach_lens.generate.attention import fast_attention_supported
from reach_lens.interventions import Latents, Silence, Steer, hooks_for, intervention_from_dict
from reach_lens.models import model_fingerprint, store_linear_weights_transposed
from reach_lens.probes import deploy, recognize, route, sample
from reach_lens.sae import (attach, attached, decoder_directions, describe_saes, latent_hook,
                            latent_output_mass, load_sae, through_saes, to_sae_transformer, top_latents_along)
from reach_lens.tasks import get_task
from reach_lens.tasks.mc import make_mc_question
from reach_lens.unit_selection import unit_output_mass

RESID, MLP, Z = "blocks.1.hook_resid_pre", "blocks.2.hook_mlp_out", "blocks.0.attn.hook_z"
TC_IN, TC_OUT = "blocks.3.ln2.hook_normalized", "blocks.3.hook_mlp_out"


def make_sae(hook: str, kind: str = "standard", seed: int = 0, d_sae: int = 64, **cfg):
    """A random SAE at ``hook`` (d_in 32 = d_model = n_heads * d_head of the tiny model), biases random too."""
    torch.manual_seed(seed)
    if kind == "standard":
        sae = StandardSAE(StandardSAEConfig(d_in=32, d_sae=d_sae, metadata=SAEMetadata(hook_name=hook), **cfg))
    elif kind == "topk":
        sae = TopKSAE(TopKSAEConfig(d_in=32, d_sae=d_sae, k=8, metadata=SAEMetadata(hook_name=hook), **cfg))
    else:
        sae = Transcoder(TranscoderConfig(d_in=32, d_sae=d_sae, d_out=32, apply_b_dec_to_input=False,
                                          metadata=SAEMetadata(hook_name=hook, hook_name_out=TC_OUT), **cfg))
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.3)
        sae.b_dec.normal_(0, 0.3)
    return sae.eval()


def all_saes():
    return [make_sae(RESID), make_sae(MLP, "topk", seed=1), make_sae(Z, seed=2, reshape_activations="hook_z"),
            make_sae(TC_IN, "transcoder", seed=3)]


def argmax_loop(model, prompt, n, route=None, hooks=()):
    """Greedy tokens and their log-probs by uncached forwards: the model's own forward for the full path (with
    SAEs attached: HookedSAETransformer.forward), a plain block loop for a route."""
    tokens, logprobs = list(prompt), []
    with torch.no_grad(), model.hooks(fwd_hooks=list(hooks)):
        for _ in range(n):
            t = torch.tensor([tokens])
            if route is None:
                logits = model(t)[0, -1]
            else:
                resid = model.input_to_embed(t)[0]
                for layer in route:
                    resid = model.blocks[layer](resid)
                logits = model.unembed(model.ln_final(resid))[0, -1]
            logp = torch.log_softmax(logits, -1)
            tokens.append(int(logp.argmax()))
            logprobs.append(float(logp[tokens[-1]]))
    return tokens[len(prompt):], logprobs


def random_prompts(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(3, 99, (n,), generator=g).tolist()) for n in lengths]


def no_hooks_left(model) -> bool:
    return all(not (m._forward_hooks or m._forward_pre_hooks) for m in model.modules())


@pytest.fixture(scope="module")
def plain():
    m = make_tiny_model(d_vocab=100)
    m.tokenizer = CharTokenizer()
    return m


@pytest.fixture(scope="module")
def sae_model(plain):
    return to_sae_transformer(plain)


@pytest.fixture(scope="module")
def arc():
    return get_task("arc_easy")


@pytest.fixture(scope="module")
def questions():
    return [make_mc_question("q1", "Which is hot?", ["ice", "fire", "snow"], 1),
            make_mc_question("q2", "What do bees make?", ["honey", "milk", "silk", "wool"], 0),
            make_mc_question("q3", "Sky colour?", ["green", "blue"], 1)]


# ---------------------------------------------------------------- getting a HookedSAETransformer


def test_conversion_is_exact_and_keeps_the_storage_layout():
    m = make_tiny_model(d_vocab=100, seed=5)
    store_linear_weights_transposed(m)  # as load_model leaves its models
    m.tokenizer = CharTokenizer()
    tokens = torch.tensor(random_prompts([11, 11]))
    copied, shared = to_sae_transformer(m), to_sae_transformer(m, share_weights=True)
    assert isinstance(copied, HookedSAETransformer) and to_sae_transformer(copied) is copied
    with torch.no_grad():
        for other in (copied, shared):
            assert torch.equal(other(tokens), m(tokens))
            assert other.tokenizer is m.tokenizer and other.cfg.to_dict() == m.cfg.to_dict()
            for (name, p), q in zip(m.named_parameters(), other.parameters()):
                assert p.stride() == q.stride() and p.requires_grad == q.requires_grad, name
    assert model_fingerprint(copied) == model_fingerprint(m)
    assert all(t.device == torch.device("cpu") for t in [*copied.parameters(), *copied.buffers()])
    assert all(p.data_ptr() == q.data_ptr() for p, q in zip(m.parameters(), shared.parameters()))
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(m.parameters(), copied.parameters()))
    prompts = random_prompts([5, 9])
    reqs = [Request(p, 6, stop_token_ids=()) for p in prompts]
    assert [g.tokens for g in engine_for(copied).generate(reqs)] == [g.tokens for g in engine_for(m).generate(reqs)]
    assert fast_attention_supported(copied)  # the engine's own attention runs in every test below
    with torch.no_grad():
        copied.blocks[0].mlp.W_out.mul_(2.0)  # copies are independent
    assert not torch.equal(copied(tokens), m(tokens))


# ---------------------------------------------------------------- probes and the engine with SAEs attached


def test_with_error_terms_every_probe_equals_the_plain_models(plain, sae_model, arc, questions):
    routes = [[tuple(range(4)), (0, 1, 1, 2, 3), (0, 2, 3)]] * len(questions)

    def probes_on(m):
        return (deploy(m, arc, questions, "shared", batch_size=2),
                sample(m, arc, questions, "shared", K=3, temperature=1.0, seed=5),
                route(m, arc, questions, "shared", routes, batch_size=4),
                recognize(m, arc, questions))

    expected = probes_on(plain)
    with attached(sae_model, all_saes(), use_error_term=True):
        got = probes_on(sae_model)
    for want, have in zip(expected[:3], got[:3]):
        flat_want = want if isinstance(want[0], dict) else [c for cs in want for c in cs]
        flat_have = have if isinstance(have[0], dict) else [c for cs in have for c in cs]
        assert [c["text"] for c in flat_have] == [c["text"] for c in flat_want]
        assert [c["mean_logprob"] for c in flat_have] == pytest.approx([c["mean_logprob"] for c in flat_want],
                                                                       abs=1e-4)
    assert [r["pred_sum"] for r in got[3]] == [r["pred_sum"] for r in expected[3]]
    for have, want in zip(got[3], expected[3]):
        assert have["loglik"] == pytest.approx(want["loglik"], abs=1e-4)
    with attached(sae_model, all_saes(), use_error_term=False):  # the SAEs do change the model without them
        assert [c["mean_logprob"] for c in deploy(sae_model, arc, questions, "shared")] != pytest.approx(
            [c["mean_logprob"] for c in expected[0]], abs=1e-3)
    assert not sae_model.acts_to_saes and no_hooks_left(sae_model)


ROUTES = [None, (0, 1, 2, 3), (0, 2, 3), (0, 1, 1, 2, 3), (0, 0, 1, 3, 3), (2, 0, 1, 3), (0, 1, 2, 3, 2)]


@pytest.mark.parametrize("hooked", [False, True])
def test_greedy_equals_the_sae_models_own_argmax_loop(sae_model, hooked):
    prompts = random_prompts([3, 17, 6])
    with attached(sae_model, all_saes()):  # reconstructions replace the activations
        ivs = ([Latents(RESID, (1, 5, 9)), Latents(TC_IN, (0, 3), "scale", 3.0),
                Steer(2, torch.linspace(-1, 1, 32), 0.5, site="hook_resid_post")] if hooked else [])
        hooks = hooks_for(ivs, sae_model)
        reqs = [Request(p, 6, route=r, stop_token_ids=()) for p in prompts for r in ROUTES]
        gens = TransformerLensEngine(sae_model).generate(reqs, interventions=ivs, batch_size=3)
        for req, gen in zip(reqs, gens):
            tokens, logprobs = argmax_loop(sae_model, req.prompt, 6, req.route, hooks)
            assert gen.tokens == tokens, (req.prompt, req.route)
            assert gen.token_logprobs == pytest.approx(logprobs, abs=1e-4)
    assert no_hooks_left(sae_model)


def test_the_engine_refuses_sae_settings_it_cannot_reproduce(sae_model):
    prompt = random_prompts([5])[0]
    with attached(sae_model, make_sae(RESID)):
        sae_model.add_sae(make_sae(RESID), exclude_special_tokens=[1])  # replaces it, with a mask
        with pytest.raises(EngineCapabilityError, match=r"'blocks.1.hook_resid_pre' .*exclude_special_tokens"):
            engine_for(sae_model).generate([Request(prompt, 2)])
    temporal = TemporalSAE(TemporalSAEConfig(d_in=32, d_sae=64, n_heads=4, bottleneck_factor=8, kval_topk=4,
                                             metadata=SAEMetadata(hook_name=RESID)))
    with attached(sae_model, temporal):
        with pytest.raises(EngineCapabilityError, match="attends over earlier positions"):
            engine_for(sae_model).generate([Request(prompt, 2)])
    assert not sae_model.acts_to_saes and no_hooks_left(sae_model)


def test_loglik_refuses_or_honours_exclude_special_tokens(sae_model):
    """engine.loglik runs the blocks itself, so HookedSAETransformer.forward's special-token mask is never set:
    loglik must refuse such SAEs (it does), or honour the mask."""
    from reach_lens.generate import LoglikRequest

    context, continuation = (1, 40, 41, 42), (43, 44)
    with attached(sae_model, make_sae(RESID)):
        sae_model.add_sae(make_sae(RESID), exclude_special_tokens=[1])  # bypassed at BOS (token 1)
        with torch.no_grad():
            logp = torch.log_softmax(sae_model(torch.tensor([context + continuation]))[0], -1)
        try:
            got = engine_for(sae_model).loglik([LoglikRequest(context, continuation)])[0]
        except EngineCapabilityError:
            return
    assert got == pytest.approx(float(logp[3, 43] + logp[4, 44]), abs=1e-5)


# ---------------------------------------------------------------- the prefix cache


def test_prefix_cache_sees_attaching_detaching_use_error_term_and_sae_weights(plain):
    m = to_sae_transformer(plain)
    engine = TransformerLensEngine(m)
    prompts = random_prompts([7, 12])
    reqs = [Request(p, 5, route=r, stop_token_ids=()) for p in prompts for r in (None, (0, 1, 1, 2, 3))]

    def check(label):
        gens = engine.generate(reqs)  # no hooks: every prompt's whole clean prefix comes from the cache
        assert engine.prefix_cache.entries
        got = [(g.tokens, g.token_logprobs) for g in gens]
        for (tokens, logprobs), req in zip(got, reqs):
            want_tokens, want_logprobs = argmax_loop(m, req.prompt, 5, req.route)
            assert tokens == want_tokens, label
            assert logprobs == pytest.approx(want_logprobs, abs=1e-4), label
        return [t for t, _ in got]

    clean = check("plain")
    sae = make_sae(RESID)
    m.add_sae(sae)
    with_sae = check("attached")
    assert with_sae != clean
    m._acts_to_saes[RESID].use_error_term = True  # an attribute: no parameter or module changes
    assert check("use_error_term toggled on") == clean
    m._acts_to_saes[RESID].use_error_term = False
    assert check("use_error_term toggled off") == with_sae
    with torch.no_grad():
        sae.W_dec.mul_(-1.0)  # the SAE's parameters are not the model's
    check("SAE weights edited in place")
    m.add_sae(make_sae(RESID, seed=7))  # another SAE at the same hook
    check("SAE replaced")
    m.reset_saes()
    assert check("detached") == clean


# ---------------------------------------------------------------- latents


def record(store, key):
    def fn(act, hook):
        store[key] = act.detach().clone()
        return act
    return fn


@pytest.mark.parametrize("kind", ["standard", "topk"])
@pytest.mark.parametrize("use_error_term", [True, False])
def test_a_latent_intervention_changes_exactly_that_latents_contribution(sae_model, kind, use_error_term):
    sae = make_sae(MLP, kind, seed=4)
    tokens = torch.tensor(random_prompts([9, 9]))
    acts_name, out_name = latent_hook(sae), f"{MLP}.hook_sae_output"
    with attached(sae_model, sae, use_error_term=use_error_term), torch.no_grad():
        base = {}
        sae_model.run_with_hooks(tokens, fwd_hooks=[(acts_name, record(base, "acts")), (out_name, record(base, "out"))])
        latent = int(base["acts"].flatten(0, 1).count_nonzero(0).argmax())  # the latent active most often
        assert base["acts"][..., latent].count_nonzero() > 0
        for mode, given, factor in (("zero", None, 0.0), ("scale", 3.0, 3.0)):
            seen = {}
            hooks = Latents(MLP, (latent,), mode, given).hooks(sae_model)
            sae_model.run_with_hooks(tokens, fwd_hooks=hooks + [(acts_name, record(seen, "acts")),
                                                                (out_name, record(seen, "out"))])
            expected_acts = base["acts"].clone()
            expected_acts[..., latent] *= factor
            torch.testing.assert_close(seen["acts"], expected_acts, rtol=0, atol=0)
            change = (factor - 1.0) * base["acts"][..., latent, None] * sae.W_dec[latent]
            torch.testing.assert_close(seen["out"] - base["out"], change, rtol=1e-4, atol=1e-4)
    assert no_hooks_left(sae_model)


def test_plain_transformer_lens_users_get_the_same_behaviour_and_no_hook_left(sae_model, plain):
    prompts = random_prompts([4, 10])
    interventions = [Latents(RESID, (2, 7)), Latents(MLP, (1,), "scale", -2.0), Silence(0, "hook_attn_out"),
                     Steer(3, torch.linspace(1, -1, 32), 1.5, positions=(0, 2))]
    with attached(sae_model, [make_sae(RESID), make_sae(MLP, "topk", seed=1)], use_error_term=True):
        hooks = hooks_for(interventions, sae_model)
        inside = engine_for(sae_model).generate([Request(p, 5, stop_token_ids=()) for p in prompts],
                                                interventions=interventions)
        for p, gen in zip(prompts, inside):
            with sae_model.hooks(fwd_hooks=hooks_for(interventions, sae_model)):  # a plain TransformerLens user
                tokens = list(p)
                for _ in range(5):
                    tokens.append(int(sae_model(torch.tensor([tokens]))[0, -1].argmax()))
            assert gen.tokens == tokens[len(p):]
        assert no_hooks_left(sae_model)
        with pytest.raises(RuntimeError, match="boom"):
            with sae_model.hooks(fwd_hooks=hooks + [(latent_hook(make_sae(RESID)), boom)]):
                sae_model(torch.tensor([prompts[0]]))
        assert no_hooks_left(sae_model)
    assert not sae_model.acts_to_saes


def boom(act, hook):
    raise RuntimeError("boom")


def test_hooks_on_a_point_an_sae_occupies_go_through_it(sae_model, plain):
    prompts = random_prompts([6, 8])
    reqs = [Request(p, 5, stop_token_ids=()) for p in prompts]
    want = engine_for(plain).generate(reqs, interventions=[Silence(2, "hook_mlp_out")])
    with attached(sae_model, make_sae(MLP, "topk", seed=1)):
        silence = Silence(2, "hook_mlp_out").hooks(sae_model)
        with pytest.raises(TypeError, match="_SAEWrapper"):  # TransformerLens: the name is now the SAE's module
            with sae_model.hooks(fwd_hooks=silence):
                pass
        rerouted = through_saes(silence, sae_model)
        assert [name for name, _ in rerouted] == [name for name, _ in hooks_for([Silence(2)], sae_model)] \
            == [f"{MLP}.hook_sae_output"]
        got = engine_for(sae_model).generate(reqs, interventions=[Silence(2)])  # the engine reroutes too
        assert [g.tokens for g in got] == [g.tokens for g in want]  # zero what flows on: the MLP adds nothing
    plain_silence = Silence(2, "hook_mlp_out").hooks(plain)
    assert through_saes(plain_silence, plain) == plain_silence and no_hooks_left(sae_model)


def test_latents_serialize_and_name_bad_values(sae_model, plain):
    for iv in (Latents(RESID, (3, 1, 4)), Latents(TC_IN, [0], "scale", 2)):
        d = json.loads(json.dumps(iv.to_dict()))
        assert d["kind"] == "latents" and intervention_from_dict(d) == iv == Latents.from_dict(d)
    assert Latents(RESID, [3]).latent_ids == (3,) and Latents(RESID, (1,), "scale", 2).factor == 2.0
    for args, message in [(("blocks.1.hook_resid_pre", (1.5,)), "latent_ids must be integers, got 1.5"),
                          ((RESID, ("3",)), "got '3'"), ((RESID, (True,)), "got True"),
                          ((RESID, 5), "sequence of integers, got 5"), ((RESID, ()), "latent_ids is empty"),
                          ((RESID, (2, -1)), "latent id -1 out of range"),
                          ((RESID, (1,), "keep"), "unknown mode 'keep'"),
                          ((RESID, (1,), "zero", 2.0), "factor=2.0 is only used with mode 'scale'"),
                          ((RESID, (1,), "scale"), "needs a number factor"),
                          ((RESID, (1,), "scale", float("inf")), "non-finite"),
                          ((f"{RESID}.hook_sae_acts_post", (1,)), f"pass the hook the SAE is attached at: '{RESID}'"),
                          (("", (1,)), "expected the hook an SAE is attached at")]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
            Latents(*args)
    with pytest.raises(ValueError, match="needs a sae_lens HookedSAETransformer .* got a HookedTransformer"):
        Latents(RESID, (1,)).hooks(plain)
    with pytest.raises(ValueError, match=r"no SAE attached at 'blocks.1.hook_resid_pre'; attached: none"):
        Latents(RESID, (1,)).hooks(sae_model)
    with attached(sae_model, make_sae(MLP, d_sae=48)):
        with pytest.raises(ValueError, match=r"attached: 'blocks.2.hook_mlp_out'"):
            Latents(RESID, (1,)).hooks(sae_model)
        with pytest.raises(ValueError, match=r"latent id 48 out of range .* d_sae=48 \(0\.\.47\)"):
            Latents(MLP, (0, 48)).hooks(sae_model)
        assert Latents(MLP, (47,)).hooks(sae_model)[0][0] == f"{MLP}.hook_sae_acts_post"


# ---------------------------------------------------------------- reach_lens.sae


def test_load_sae_from_a_local_sae_lens_directory(tmp_path):
    sae = make_sae(MLP, "topk", seed=9)
    sae.save_model(tmp_path / "sae")
    loaded = load_sae(tmp_path / "sae")
    assert type(loaded) is TopKSAE and loaded.cfg.k == 8 and loaded.cfg.metadata.hook_name == MLP
    for name, t in sae.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name
    assert load_sae(str(tmp_path / "sae"), dtype=torch.float64).W_dec.dtype == torch.float64
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_sae(tmp_path / "nowhere")
    (tmp_path / "sae" / "sae_weights.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="missing sae_weights.safetensors"):
        load_sae(tmp_path / "sae")


def test_attach_converts_checks_and_describes(plain):
    sae = make_sae(RESID)
    m = attach(plain, sae, use_error_term=True)
    assert isinstance(m, HookedSAETransformer) and m.acts_to_saes == {RESID: sae}
    assert m.blocks[0].mlp.W_out.data_ptr() == plain.blocks[0].mlp.W_out.data_ptr()  # shares the weights
    assert attach(m, make_sae(MLP, "topk"), use_error_term=False) is m
    described = describe_saes(m)
    assert described[RESID] == {"architecture": "standard", "d_in": 32, "d_sae": 64, "hook_out": RESID,
                                "use_error_term": True, "weights": described[RESID]["weights"]}
    assert described[MLP]["architecture"] == "topk" and not described[MLP]["use_error_term"]
    assert describe_saes(plain) == {}
    with pytest.raises(ValueError, match=r"input hook 'blocks.9.hook_resid_pre' is not a hook point"):
        attach(m, make_sae("blocks.9.hook_resid_pre"))
    wide = StandardSAE(StandardSAEConfig(d_in=64, d_sae=8, metadata=SAEMetadata(hook_name=RESID)))
    with pytest.raises(ValueError, match=r"d_in=64 does not match 'blocks.1.hook_resid_pre'.* 32 values"):
        attach(m, wide)
    with pytest.raises(ValueError, match="SAE dtype torch.float64 differs"):
        attach(m, make_sae(RESID).to(torch.float64))
    with pytest.raises(TypeError, match="needs a HookedSAETransformer"), attached(plain, sae):
        pass
    m.reset_saes()


def test_top_latents_along_and_output_mass():
    sae = make_sae(MLP, seed=6)
    W = sae.W_dec.detach()
    v = W[5] + 0.01 * W[9]
    top = top_latents_along(sae, v, 4)
    scores = W @ (v / v.norm())
    assert top[0] == 5 and top == torch.argsort(scores, descending=True)[:4].tolist()
    assert top_latents_along(sae, -v, 1) == [int(scores.argmin())]
    for bad_v, k in ((v[:5], 4), (torch.zeros(32), 4), (v, 0), (v, 65)):
        with pytest.raises(ValueError, match="expected a non-zero"):
            top_latents_along(sae, bad_v, k)
    rescaled = make_sae(MLP, "topk", seed=6, rescale_acts_by_decoder_norm=True)
    with torch.no_grad():
        rescaled.W_dec[3] = W[5] * 100  # a long row: its norm does not count when activations are rescaled by it
        rescaled.W_dec[5] = W[5] * 0.5
    directions = decoder_directions(rescaled)
    torch.testing.assert_close(directions.norm(dim=-1), torch.ones(64))
    assert set(top_latents_along(rescaled, W[5], 2)) == {3, 5}
    acts = torch.rand(2, 7, 64)
    mass = latent_output_mass(acts, sae, [1, 2])
    assert mass == pytest.approx(unit_output_mass(acts, W, [1, 2]))
    assert mass + latent_output_mass(acts, sae, [i for i in range(64) if i not in (1, 2)]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="latent 64 out of range for d_sae=64"):
        latent_output_mass(acts, sae, [64])
    with pytest.raises(ValueError, match=r"expected \[\.\.\., d_sae=64\]"):
        latent_output_mass(acts[..., :10], sae, [1])


@pytest.mark.integration
def test_the_embedded_model_converts_exactly_and_an_error_term_sae_changes_no_answer():
    from reach_lens.models import encode, load_model

    m = load_model()
    s = to_sae_transformer(m, share_weights=True)
    prompt = tuple(encode(m, "Question: Which gas do plants take in from the air?\nAnswer:"))
    with torch.no_grad():
        assert torch.equal(s(torch.tensor([prompt])), m(torch.tensor([prompt])))
    torch.manual_seed(0)
    sae = StandardSAE(StandardSAEConfig(d_in=m.cfg.d_model, d_sae=1024,
                                        metadata=SAEMetadata(hook_name="blocks.20.hook_mlp_out")))
    attach(s, sae, use_error_term=True)
    reqs = [Request(prompt, 8)]
    want = engine_for(m).generate(reqs)[0]
    got = engine_for(s).generate(reqs)[0]
    assert got.tokens == want.tokens and got.token_logprobs == pytest.approx(want.token_logprobs, abs=1e-3)
    s.reset_saes()


def test_protocols_see_attached_saes(plain):
    """An SAE-attached model is another model for a run's protocol: the weights fingerprint covers the SAE."""
    m = to_sae_transformer(plain)
    bare = engine_for(m).describe()["weights"]
    with attached(m, make_sae(RESID), use_error_term=True):
        with_sae = engine_for(m).describe()["weights"]
    assert with_sae.startswith(bare) and with_sae != bare
    assert engine_for(m).describe()["weights"] == bare


# ---------------------------------------------------------------- the MLP study's top-k step over SAE latents


def test_the_units_step_over_sae_latents_silences_the_top_latents_along_v(plain, arc, questions, tmp_path):
    """``localize.unit_arms(..., sae=...)``: the top arm silences exactly the top latents along v by the rule (weights:
    ``top_latents_along(sae, v, k)``; contribution: their mean activation on the calibration failures times the
    decoder row along v), its stored answers equal a direct deploy under those Latents, the random arms are disjoint
    from it, and masses are shares of the decoder's output; an SAE at another hook is refused."""
    import pandas as pd

    from reach_lens import localize
    from reach_lens.protocol import Protocol
    from reach_lens.store import RunStore

    sae = make_sae(MLP, seed=4)
    sae_model = attach(plain, sae, use_error_term=True)
    try:
        roles = {"q1": "evaluation", "q2": "evaluation", "q3": "calibration"}
        panels = pd.DataFrame([{"question_id": q.id, "panel": "failure", "role": roles[q.id]} for q in questions])
        store = RunStore(tmp_path, Protocol.of(study="test", facts=engine_for(plain).describe(), task=arc,
                                               questions=questions, fmt="shared", probe="screen"))
        conditions = localize.Conditions(sae_model, arc, "shared", store, panels, questions)
        evaluated = questions[:2]
        v = torch.randn(32, generator=torch.Generator().manual_seed(0))
        calibration = [arc.prompt(questions[2], "shared", plain.tokenizer)]
        acts = localize.last_prompt_activations(sae_model, calibration, latent_hook(sae))
        expected = {"weights": top_latents_along(sae, v, 4),
                    "contribution": localize.top_units(localize.unit_scores(decoder_directions(sae), v, "contribution",
                                                                            acts), 4)}
        for rank, top_ids in expected.items():
            table = localize.unit_arms(conditions, 2, v, k=4, seeds=3, sae=sae, rank=rank)
            top = table[table.arm == "top"].iloc[0]
            assert list(top.units) == top_ids and set(table.space) == {"SAE latents"} and set(table["rank"]) == {rank}
            for r in table[table.arm == "random"].itertuples():
                assert len(r.units) == 4 and not set(r.units) & set(top.units)
            direct = deploy(sae_model, arc, evaluated, "shared", interventions=[Latents(MLP, tuple(top.units))])
            assert int(top.repair_k) == sum(d["correct"] for d in direct)
            block = deploy(plain, arc, evaluated, "shared", interventions=[Silence(2, "hook_mlp_out")])
            assert table.iloc[0].arm == "block" and int(table.iloc[0].repair_k) == sum(d["correct"] for d in block)
            assert ((table.mass >= 0) & (table.mass <= 1)).all()
        with pytest.raises(ValueError, match="blocks.1.hook_mlp_out"):
            localize.unit_arms(conditions, 1, v, k=4, seeds=1, sae=sae)
    finally:
        sae_model.reset_saes()
