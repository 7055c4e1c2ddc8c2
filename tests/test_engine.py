"""The generation engine against independent references on tiny random models: an uncached forward (full path),
a plain uncached block loop (routes), and each request run alone. Interventions go to the engine, which builds
their hooks; raw hooks (``HOOKS``) are registered on the model by hand around the call, as a user would."""
import pytest
import torch
from conftest import make_tiny_model
from transformer_lens import HookedTransformer

from reach_lens.generate import (Engine, EngineCapabilityError, Generation, LoglikRequest, NonFiniteLogits, Request,
                                 TransformerLensEngine, engine_for, first_hooked_layer, row_seed)
from reach_lens.generate.attention import output_weight
from reach_lens.generate.loop import DecodeLoop, embed, schedule
from reach_lens.generate import prefill
from reach_lens.generate.prefill import padded_batches
from reach_lens.interventions import Silence, Steer, Units, hooks_for


def reference(model: HookedTransformer, prompt, n, route=None, hooks=(), stop=None):
    """Greedy tokens by uncached forwards (``model(...)`` for the full path, a plain block loop for a route) under
    ``hooks`` (raw hooks, or ``hooks_for(interventions, model)``: positions from each forward), with each step's
    log-prob and entropy, and the last residual entering ln_final."""
    tokens, logprobs, entropies, hidden = list(prompt), [], [], None
    with torch.no_grad(), model.hooks(fwd_hooks=list(hooks)):
        for _ in range(n):
            t = torch.tensor([tokens])
            if route is None:
                resid = model(t, stop_at_layer=model.cfg.n_layers)
            else:
                resid = model.input_to_embed(t)[0]
                for layer in route:
                    resid = model.blocks[layer](resid)
            hidden = resid[0, -1]
            logits = model.unembed(model.ln_final(resid))[0, -1]
            logp = torch.log_softmax(logits, -1)
            token = int(logp.argmax())
            tokens.append(token)
            logprobs.append(float(logp[token]))
            entropies.append(float(-(logp.exp() * logp).sum()))
            if token == stop:
                break
    return tokens[len(prompt):], logprobs, entropies, hidden


def random_prompts(lengths, d_vocab=50, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, d_vocab, (n,), generator=g).tolist()) for n in lengths]


def letters(ids):
    return "".join(chr(ord("a") + t % 26) for t in ids)


def greedy(prompt, n, route=None, stop=(), keep_hidden=False):
    return Request(prompt, max_new_tokens=n, route=route, stop_token_ids=stop, keep_hidden=keep_hidden)


@pytest.fixture(scope="module")
def model() -> HookedTransformer:
    return make_tiny_model(n_layers=4)


@pytest.fixture(scope="module")
def fallback_model() -> HookedTransformer:
    """Per-head attention results are not supported by the engine's own attention: TransformerLens's runs."""
    m = make_tiny_model(seed=3)
    m.set_use_attn_result(True)
    return m


ROUTES = [None, (0, 1, 2, 3), (0, 2, 3), (1, 3), (0, 1, 1, 2, 3), (0, 0, 1, 3, 3), (2, 0, 1, 3), (0, 1, 2, 3, 2)]
HOOKS = {"none": [], "mlp1": [("blocks.1.hook_mlp_out", lambda a, hook: torch.zeros_like(a))],
         "embed": [("hook_embed", lambda a, hook: a * 1.5)]}


@pytest.mark.parametrize("which", ["model", "fallback_model"])
@pytest.mark.parametrize("hooks", list(HOOKS))
def test_greedy_equals_uncached_reference_for_routes_in_mixed_batches(which, hooks, request):
    m = request.getfixturevalue(which)
    prompts = random_prompts([3, 17, 6, 30])
    reqs = [greedy(p, 7, r, keep_hidden=True) for p in prompts for r in ROUTES]
    # batch_size 3: rows of several prompts and routes share a batch, end, and are refilled
    with m.hooks(fwd_hooks=HOOKS[hooks]):
        gens = TransformerLensEngine(m).generate(reqs, batch_size=3)
    assert len({len(r.prompt) for r in reqs}) > 1
    for req, gen in zip(reqs, gens):
        tokens, logprobs, entropies, hidden = reference(m, req.prompt, 7, req.route, HOOKS[hooks])
        assert gen.tokens == tokens, (req.prompt, req.route)
        assert gen.token_logprobs == pytest.approx(logprobs, abs=1e-4)
        assert gen.token_entropies == pytest.approx(entropies, abs=1e-4)
        torch.testing.assert_close(gen.hidden, hidden, atol=1e-3, rtol=1e-3)
        assert gen.route == req.route and gen.finish_reason == "length"


def test_stop_tokens_end_rows_and_slots_are_refilled(model):
    prompts = random_prompts([3, 5, 30, 2, 17, 44])
    stop = reference(model, prompts[0], 4)[0][3]
    gens = engine_for(model).generate([greedy(p, 12, stop=(stop,)) for p in prompts], batch_size=2)
    for p, gen in zip(prompts, gens):
        tokens = reference(model, p, 12, stop=stop)[0]
        assert gen.tokens == tokens
        assert gen.finish_reason == ("eos" if tokens[-1] == stop else "length")
    assert gens[0].finish_reason == "eos" and len(gens[0].tokens) <= 4


def test_prefix_sharing_changes_nothing_and_a_weight_edit_invalidates_it():
    m = make_tiny_model(seed=4)
    prompts = random_prompts([9, 4])
    reqs = [greedy(p, 5, r) for p in prompts for r in ROUTES]
    engine = TransformerLensEngine(m)
    alone = TransformerLensEngine(m, share_prefixes=False)
    for hooks in HOOKS.values():
        with m.hooks(fwd_hooks=hooks):
            first = engine.generate(reqs)
            again = engine.generate(reqs)  # served from the clean-prefix cache
            reference_gens = alone.generate(reqs)
        assert [g.tokens for g in first] == [g.tokens for g in again] == [g.tokens for g in reference_gens]
        for a, b in zip(again, reference_gens):
            assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-5)
    assert engine.prefix_cache.entries
    with torch.no_grad():
        m.blocks[0].mlp.W_out.mul_(-3.0)  # an in-place edit: cached prefixes are stale
    edited = engine.generate(reqs)
    assert [g.tokens for g in edited] == [reference(m, r.prompt, 5, r.route)[0] for r in reqs]


@pytest.mark.parametrize("which", ["model", "fallback_model"])
@pytest.mark.parametrize("hooks", list(HOOKS))
def test_prompts_sharing_first_tokens_compute_them_once_and_equal_the_reference(which, hooks, request, monkeypatch):
    m = request.getfixturevalue(which)
    shots = random_prompts([21], seed=7)[0]
    prompts = [shots + tail for tail in random_prompts([3, 9, 1], seed=8)]
    reqs = [greedy(p, 6, r) for p in prompts for r in (None, (0, 1, 2, 3), (0, 1, 1, 2, 3), (0, 2, 3), (1, 3))]
    engine = TransformerLensEngine(m)
    with m.hooks(fwd_hooks=HOOKS[hooks]):
        gens = engine.generate(reqs, batch_size=4)
    for req, gen in zip(reqs, gens):
        tokens, logprobs, _, _ = reference(m, req.prompt, 6, req.route, HOOKS[hooks])
        assert gen.tokens == tokens, (req.prompt, req.route)
        assert gen.token_logprobs == pytest.approx(logprobs, abs=1e-4)
    cached = set(engine.prefix_cache.entries)
    if hooks == "embed":  # a hooked embedding leaves nothing clean to share
        assert not cached
        return
    assert shots in cached  # the common prefix was prefilled once, as its own entry
    # a later call with a new question extends the cached shots: only its own tokens pass through the blocks
    new_prompt = shots + (5, 6, 7, 8)
    widths = []
    block = m.blocks[0]  # watched by wrapping forward, not by a hook (a hook would make the block unclean)
    monkeypatch.setattr(block, "forward", lambda resid, *a, forward=block.forward, **k: (
        widths.append(resid.shape[1]), forward(resid, *a, **k))[1])
    with m.hooks(fwd_hooks=HOOKS[hooks]):
        gen = engine.generate([greedy(new_prompt, 4)])[0]
    monkeypatch.undo()
    assert widths[0] == 4 and max(widths) == 4
    assert gen.tokens == reference(m, new_prompt, 4, hooks=HOOKS[hooks])[0]


@pytest.mark.parametrize("which", ["model", "fallback_model"])
def test_positionwise_hooks_run_the_shared_prefix_once_and_equal_the_reference(which, request, monkeypatch):
    """Under positionwise hooks (silencing, steering every position, unit scaling) the hooked blocks see the
    prompts' common prefix once and then only each prompt's own tokens, batch_size prompts at a time (right-padded);
    the answers equal uncached forwards. An unmarked hook doing the same thing, and a hook at chosen positions, run
    every prompt's tokens in full, one prompt at a time, longest first. Without hooks the prompts' clean prefills are
    batched the same way, and cached: a second call prefills nothing."""
    m = request.getfixturevalue(which)
    shots = random_prompts([21], seed=7)[0]
    tails = random_prompts([3, 9, 8], seed=8)
    prompts = [shots + tail for tail in tails]
    v = torch.randn(m.cfg.d_model, generator=torch.Generator().manual_seed(2))
    zero_unmarked = [("blocks.2.hook_mlp_out", lambda a, hook: torch.zeros_like(a))]
    cases = {"none": ([], [], True), "silence": ([Silence(2, "hook_mlp_out")], [], True),
             "steer+units": ([Steer(2, v, 4.0), Units(3, [1, 5], mode="scale", factor=3.0)], [], True),
             "unmarked": ([], zero_unmarked, False),
             "positioned": ([Steer(2, v, 4.0, positions=(22,))], [], False)}
    for name, (ivs, by_hand, shared) in cases.items():
        widths = []
        block = m.blocks[2]
        monkeypatch.setattr(block, "forward", lambda resid, *a, forward=block.forward, **k: (
            widths.append(tuple(resid.shape[:2])), forward(resid, *a, **k))[1])
        with m.hooks(fwd_hooks=by_hand):
            gens = TransformerLensEngine(m).generate([greedy(p, 5) for p in prompts], interventions=ivs, batch_size=3)
        monkeypatch.undo()
        hooks = hooks_for(ivs, m) + by_hand
        prefills = [w for w in widths if w[1] > 1]  # decode steps run one token per row
        if shared:  # the shots, then the own tokens of the 9- and 8-token tails padded to 9, then the 3-token tail
            assert prefills == [(1, len(shots)), (2, 9), (1, 3)], name  # (3 tokens padded to 9: too much padding)
        else:
            assert prefills == [(1, len(p)) for p in sorted(prompts, key=len, reverse=True)], name
        for p, gen in zip(prompts, gens):
            tokens, logprobs, _, _ = reference(m, p, 5, hooks=hooks)
            assert gen.tokens == tokens, name
            assert gen.token_logprobs == pytest.approx(logprobs, abs=1e-4), name
    engine = TransformerLensEngine(m)
    first = engine.generate([greedy(p, 5) for p in prompts])
    widths = []
    monkeypatch.setattr(block, "forward", lambda resid, *a, forward=block.forward, **k: (
        widths.append(tuple(resid.shape[:2])), forward(resid, *a, **k))[1])
    again = engine.generate([greedy(p, 5) for p in prompts])
    monkeypatch.undo()
    assert all(w[1] == 1 for w in widths) and [g.tokens for g in again] == [g.tokens for g in first]


@pytest.mark.parametrize("which", ["model", "fallback_model"])
def test_long_prompts_after_long_shots_hold_the_shots_once_and_equal_the_reference(which, request, monkeypatch):
    """Few-shot prompts (a long block of shots, then each question's tokens): the shots run once, each prompt's own
    tokens in batches whose attention scores fit ``SCORES_BUDGET``; every cached question keeps its own positions
    only and refers to the shots' entry, which a prefix cache too small for all the questions never evicts before
    them. Greedy answers equal step-by-step uncached forwards and the engine without sharing; a later call with
    routes and a hook reuses those entries and equals the reference too."""
    m = request.getfixturevalue(which)
    cfg = m.cfg
    shots = random_prompts([80], seed=11)[0]
    tails = random_prompts([30, 5, 24, 18, 9, 27, 12], seed=12)
    prompts = [shots + t for t in tails]
    budget = 2 * cfg.n_heads * 30 * (80 + 30)  # two of the longest questions per block call
    monkeypatch.setattr(prefill, "SCORES_BUDGET", budget)
    per_position = 4 * ((cfg.n_layers + 1) * cfg.d_model + cfg.n_layers * 2 * cfg.n_key_value_heads * cfg.d_head)
    engine = TransformerLensEngine(m, prefix_cache_bytes=per_position * (len(shots) + 60))  # shots + ~3 questions
    widths = []
    block = m.blocks[0]
    monkeypatch.setattr(block, "forward", lambda resid, *a, forward=block.forward, **k: (
        widths.append(tuple(resid.shape[:2])), forward(resid, *a, **k))[1])
    gens = engine.generate([greedy(p, 6) for p in prompts], batch_size=4)
    monkeypatch.undo()
    alone = TransformerLensEngine(m, share_prefixes=False).generate([greedy(p, 6) for p in prompts], batch_size=4)
    for p, gen, ref in zip(prompts, gens, alone):
        tokens, logprobs, _, _ = reference(m, p, 6)
        assert gen.tokens == tokens == ref.tokens, len(p)
        assert gen.token_logprobs == pytest.approx(logprobs, abs=1e-4)
        assert gen.token_logprobs == pytest.approx(ref.token_logprobs, abs=1e-5)

    prefills = [w for w in widths if w[1] > 1]
    assert prefills[0] == (1, len(shots))  # the shots, once
    own = prefills[1:]
    assert sum(rows for rows, _ in own) == len(prompts)  # then every prompt once, its own tokens only
    assert all(n <= max(map(len, tails)) for _, n in own)
    assert all(rows == 1 or rows * cfg.n_heads * n * (len(shots) + n) <= budget for rows, n in own)
    assert len(own) > 3  # the budget split the batches

    cache = engine.prefix_cache
    base = cache.entries[shots]  # kept, although the questions did not all fit
    questions = [p for p in cache.entries if p != shots]
    assert 0 < len(questions) < len(prompts)  # the least recently used questions went first
    assert cache.bytes == sum(e.nbytes for e in cache.entries.values()) <= cache.max_bytes
    for p in questions:
        entry = cache.entries[p]
        assert entry.base is base and entry.depth == cfg.n_layers
        assert all(r.shape[1] == len(p) - len(shots) for r in entry.resid)  # the shots' positions not copied
        assert all(k.shape[1] == v.shape[1] == len(p) - len(shots) for k, v in entry.kv)
        full = entry.residual(2)
        assert full.shape[1] == len(p) and torch.equal(full[:, :len(shots)], base.resid[2])

    routes = (None, (0, 1, 1, 2, 3), (0, 2, 3), (0, 1, 2, 3, 3))
    reqs = [greedy(p, 5, r) for p in prompts[:4] for r in routes]
    with m.hooks(fwd_hooks=HOOKS["mlp1"]):
        hooked = engine.generate(reqs, batch_size=5)
    for req, gen in zip(reqs, hooked):
        tokens, logprobs, _, _ = reference(m, req.prompt, 5, req.route, HOOKS["mlp1"])
        assert gen.tokens == tokens, (len(req.prompt), req.route)
        assert gen.token_logprobs == pytest.approx(logprobs, abs=1e-4)


def test_padded_batches_group_similar_lengths_and_bound_the_padding():
    """Longest first; a batch closes when padding it to its longest prompt would add more than a quarter of its
    tokens (10, 9, 8 padded to 10: 30 rows for 27 tokens; adding 3 would make 40 for 30)."""
    assert padded_batches([3, 9, 8, 2, 10]) == [[4, 1, 2], [0, 3]]
    assert padded_batches([5, 5, 5]) == [[0, 1, 2]]
    assert padded_batches([4, 1], waste=0.0) == [[0], [1]]
    assert padded_batches([]) == []
    for lengths in ([7, 1, 3, 3, 12, 6, 6, 2], [1] * 5 + [40]):
        batches = padded_batches(lengths)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        for b in batches:
            assert max(lengths[i] for i in b) * len(b) <= 1.25 * sum(lengths[i] for i in b)


def test_positioned_interventions_in_a_mixed_length_batch_equal_each_prompt_alone(model):
    prompts = random_prompts([4, 19, 7, 12])
    v = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    mean = torch.randn(64, model.cfg.d_model, generator=torch.Generator().manual_seed(1))
    interventions = {
        # prefill positions, counted from each prompt's end, and decode positions beyond the shortest prompts
        "steer_last_prompt": [Steer(2, tuple(v.tolist()), 10.0, positions=(-1,))],
        "steer_decode": [Steer(1, tuple(v.tolist()), 10.0, site="hook_resid_pre", positions=(6, 9, 21))],
        "silence_mean": [Silence(2, "hook_mlp_out", mode="mean", mean=tuple(map(tuple, mean.tolist())))],
    }
    engine = engine_for(model)
    for name, ivs in interventions.items():
        batched = engine.generate([greedy(p, 8) for p in prompts], interventions=ivs, batch_size=4)
        plain = engine.generate([greedy(p, 8) for p in prompts], batch_size=4)
        moved = max(abs(a - b) for g, h in zip(batched, plain) for a, b in zip(g.token_logprobs, h.token_logprobs))
        assert moved > 1e-2, name  # the intervention acts
        for p, gen in zip(prompts, batched):
            single = engine.generate([greedy(p, 8)], interventions=ivs, batch_size=1)[0]
            assert gen.tokens == single.tokens, (name, len(p))
            assert gen.token_logprobs == pytest.approx(single.token_logprobs, abs=1e-4)
    # and absolute positions equal an uncached forward's (each forward there is a fresh prompt: positions >= 0)
    ivs = [Steer(1, tuple(v.tolist()), 4.0, positions=(2, 5))]
    for p, gen in zip(prompts, engine.generate([greedy(p, 6) for p in prompts], interventions=ivs)):
        assert gen.tokens == reference(model, p, 6, hooks=hooks_for(ivs, model))[0]


def test_positioned_interventions_under_routes_whose_prefixes_are_prefilled_together(model):
    """Routes of one prompt that share a depth run through one block call in the route trie: each row there
    is still at its prompt's own positions (and each route equals that route run alone, and the plain block loop)."""
    prompts = random_prompts([5, 13])
    routes = [(0, 1, 2, 3), (0, 2, 2, 3), (0, 1, 1, 2, 3), (0, 2, 3, 3)]
    v = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(2))
    engine = engine_for(model)
    for ivs in ([Steer(2, tuple(v.tolist()), 10.0, positions=(-1, 1))],
                [Steer(1, tuple(v.tolist()), 10.0, site="hook_resid_pre", positions=(3, 15))]):
        gens = engine.generate([greedy(p, 6, r) for p in prompts for r in routes], interventions=ivs, batch_size=8)
        plain = engine.generate([greedy(p, 6, r) for p in prompts for r in routes], batch_size=8)
        assert any(g.tokens != h.tokens or abs(g.token_logprobs[0] - h.token_logprobs[0]) > 1e-2
                   for g, h in zip(gens, plain))  # the intervention acts
        for (p, r), gen in zip([(p, r) for p in prompts for r in routes], gens):
            single = engine.generate([greedy(p, 6, r)], interventions=ivs, batch_size=1)[0]
            assert gen.tokens == single.tokens, (len(p), r)
            assert gen.token_logprobs == pytest.approx(single.token_logprobs, abs=1e-4)
    # absolute prefill positions equal the plain block loop's (a fresh prompt every step: positions >= 0)
    ivs = [Steer(1, tuple(v.tolist()), 4.0, positions=(2, 4))]
    for r in routes:
        gen = engine.generate([greedy(prompts[1], 5, r)], interventions=ivs)[0]
        assert gen.tokens == reference(model, prompts[1], 5, r, hooks=hooks_for(ivs, model))[0], r


def test_slots_run_on_the_rows_that_use_them_equal_the_whole_batch(model, monkeypatch):
    """A decode slot run on its rows alone (a copy of their keys and values) gives what the whole batch with the
    other rows discarded gives, under positioned decode interventions, with rows ending and slots refilled; and
    the subset path is taken (most slots of these routes are run by a few rows only)."""
    prompts = random_prompts([5, 13, 8])
    routes = [(0, 0, 0, 1, 3), (1, 1, 2, 2, 2, 3), (0, 2, 3, 3, 3), (0, 1, 2, 3), (2, 2, 2, 2), (3,)]
    v = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(3))
    ivs = [Steer(1, tuple(v.tolist()), 10.0, site="hook_resid_pre", positions=(9, 15))]
    stop = reference(model, prompts[0], 3, routes[0])[0][2]  # ends rows early: slots are refilled
    reqs = [greedy(p, 7, r, stop=(stop,)) for p in prompts for r in routes]
    calls = []  # rows each slot runs on (_run_rows's ``rows``, its sixth argument)
    monkeypatch.setattr(DecodeLoop, "_run_rows", lambda self, *a, _run=DecodeLoop._run_rows: calls.append(len(a[5]))
                        or _run(self, *a))
    subsets = TransformerLensEngine(model).generate(reqs, interventions=ivs, batch_size=5)
    assert sum(0 < c < 5 for c in calls) > 10
    calls.clear()
    whole = TransformerLensEngine(model, decode_subsets=False).generate(reqs, interventions=ivs, batch_size=5)
    assert not calls
    assert any(g.finish_reason == "eos" for g in whole) and any(g.finish_reason == "length" for g in whole)
    for req, a, b in zip(reqs, subsets, whole):
        assert a.tokens == b.tokens, (req.prompt, req.route)
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-4)  # batch shapes differ: float rounding
    for req, gen in zip(reqs[::4], subsets[::4]):  # and the plain block loop
        assert gen.tokens == reference(model, req.prompt, 7, req.route, hooks_for(ivs, model), stop=stop)[0]


def test_samples_depend_on_prompt_route_temperature_and_seed_only(model):
    prompts = random_prompts([6, 11, 4])

    def req(p, seed, route=None, T=0.8):
        return Request(p, max_new_tokens=10, temperature=T, seed=seed, route=route, stop_token_ids=())

    engine = engine_for(model)
    alone = [g.tokens for g in engine.generate([req(prompts[1], row_seed(5, k)) for k in range(4)], batch_size=1)]
    crowd = engine.generate([req(p, row_seed(s, k), r) for p, s in zip(prompts, (1, 5, 2)) for r in (None, (0, 2, 3))
                             for k in range(4)], batch_size=5)
    assert [g.tokens for g in crowd[8:12]] == alone
    assert len({tuple(t) for t in alone}) > 1  # the K samples differ
    other = [g.tokens for g in engine.generate([req(prompts[1], row_seed(6, k)) for k in range(4)])]
    assert other != alone
    greedy_rows = engine.generate([req(prompts[1], row_seed(5, 0), T=0.0)])  # T = 0 ignores the seed
    assert greedy_rows[0].tokens == reference(model, prompts[1], 10)[0]


def test_sampling_follows_the_tempered_distribution(model):
    prompt = random_prompts([5])[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt]))[0, -1]
    n = 3000
    for temperature in (1.0, 0.5):
        gens = engine_for(model).generate([Request(prompt, 1, temperature=temperature, seed=row_seed(0, k))
                                           for k in range(n)], batch_size=64)
        counts = torch.bincount(torch.tensor([g.tokens[0] for g in gens]), minlength=50).double()
        expected = torch.softmax(logits.double() / temperature, -1)
        assert 0.5 * (counts / n - expected).abs().sum() < 0.06
        assert gens[0].token_logprobs[0] == pytest.approx(float(torch.log_softmax(logits, -1)[gens[0].tokens[0]]),
                                                          abs=1e-5)


def test_top_p_samples_the_nucleus_and_top_p_1_is_plain_sampling(model):
    """A nucleus of mass 0.5 holds the most probable tokens until their tempered mass reaches 0.5: the samples follow
    that truncated, renormalized distribution; top_p = 1 draws exactly the tokens plain sampling draws."""
    prompt = random_prompts([5])[0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt]))[0, -1].double()
    probs = torch.softmax(logits / 0.8, -1)
    ordered, order = probs.sort(descending=True)
    inside = order[(ordered.cumsum(-1) - ordered) < 0.5]
    expected = torch.zeros_like(probs)
    expected[inside] = probs[inside] / probs[inside].sum()
    n = 2000
    gens = engine_for(model).generate([Request(prompt, 1, temperature=0.8, top_p=0.5, seed=row_seed(0, k))
                                       for k in range(n)], batch_size=64)
    tokens = torch.tensor([g.tokens[0] for g in gens])
    assert set(tokens.tolist()) <= set(inside.tolist()) and 1 < len(inside) < 50
    assert 0.5 * (torch.bincount(tokens, minlength=50).double() / n - expected).abs().sum() < 0.06
    plain = [Request(prompt, 6, temperature=0.8, seed=row_seed(1, k), stop_token_ids=()) for k in range(8)]
    whole = [Request(prompt, 6, temperature=0.8, top_p=1.0, seed=row_seed(1, k), stop_token_ids=()) for k in range(8)]
    assert [g.tokens for g in engine_for(model).generate(plain)] == [g.tokens for g in engine_for(model).generate(whole)]
    tiny = engine_for(model).generate([Request(prompt, 4, temperature=0.8, top_p=1e-9, seed=row_seed(2, 0),
                                               stop_token_ids=())])
    assert tiny[0].tokens == reference(model, prompt, 4)[0]  # a nucleus of one token is greedy decoding


def test_stop_strings_cut_text():
    class Letters:
        eos_token_id = None
        padding_side = "right"

        def decode(self, ids, skip_special_tokens=True):
            return letters(ids)

    m = make_tiny_model(seed=6)
    m.tokenizer = Letters()
    prompt = random_prompts([8])[0]
    tokens = reference(m, prompt, 10)[0]
    text = letters(tokens)
    stop = text[4:6]
    gen = TransformerLensEngine(m).generate([Request(prompt, 10, stop_strings=(stop,))])[0]
    assert gen.finish_reason == "stop" and gen.text == text[:text.find(stop)]
    assert gen.tokens == tokens[: text.find(stop) + len(stop)]
    plain = TransformerLensEngine(m).generate([Request(prompt, 10)])[0]
    assert plain.text == text and plain.finish_reason == "length"


def test_hooks_see_one_position_per_decode_step_and_are_removed(model):
    prompts = random_prompts([6, 13])
    shapes = []

    def record(act, hook):
        shapes.append(tuple(act.shape[:2]))
        return act

    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", record)]):
        engine_for(model).generate([greedy(p, 3) for p in prompts])
    assert shapes[:2] == [(1, 13), (1, 6)]  # each prompt prefilled alone, the longest first
    assert shapes[2:] == [(2, 1), (2, 1)]  # then one position per decode step for both rows

    engine_for(model).generate([greedy(p, 3) for p in prompts], interventions=[Silence(3, "hook_mlp_out")])
    assert not model.hook_dict["blocks.3.hook_mlp_out"].fwd_hooks  # the engine's hooks are gone after the call
    v = tuple(torch.randn(model.cfg.d_model).tolist())
    with pytest.raises(ValueError, match="position -9 is before the start"):  # raised by a hook, inside a forward
        engine_for(model).generate([greedy(prompts[0], 2)], interventions=[Steer(3, v, 1.0, positions=(-9,))])
    assert all("forward" not in block.attn.__dict__ for block in model.blocks)
    assert not model.hook_dict["blocks.3.hook_mlp_out"].fwd_hooks


def test_attention_pattern_hooks_see_the_uncached_values(model):
    prompt = random_prompts([9])[0]
    seen = []

    def record(act, hook):
        seen.append(act[0, :, -1].clone())
        return act

    with model.hooks(fwd_hooks=[("blocks.2.attn.hook_pattern", record)]):
        gen = engine_for(model).generate([greedy(prompt, 3)])[0]
    full = list(prompt) + gen.tokens
    for step in range(3):
        _, cache = model.run_with_cache(torch.tensor([full[: len(prompt) + step]]))
        torch.testing.assert_close(seen[step], cache["blocks.2.attn.hook_pattern"][0, :, -1], atol=1e-5, rtol=1e-4)


def test_first_hooked_layer(model):
    assert first_hooked_layer(model) == model.cfg.n_layers
    for hooks, expected in ((HOOKS["mlp1"], 1), (HOOKS["embed"], -1),
                            ([("ln_final.hook_normalized", lambda a, hook: a)], model.cfg.n_layers),
                            ([(lambda name: name.endswith("hook_mlp_out"), lambda a, hook: a)], 0)):
        with model.hooks(fwd_hooks=hooks):
            assert first_hooked_layer(model) == expected


def test_non_finite_activations_raise_naming_the_request(model):
    nan = [("blocks.2.hook_resid_post", lambda a, hook: a * float("nan"))]
    nan_on_long = [("blocks.2.hook_resid_post", lambda a, hook: a * float("nan") if a.shape[1] == 4 else a)]
    with pytest.raises(NonFiniteLogits, match=r"request 1 \(prompt of 4 tokens\) at generated token 0.*hook"), \
            model.hooks(fwd_hooks=nan_on_long):
        engine_for(model).generate([greedy((1, 2), 2), greedy((1, 2, 3, 4), 2)], batch_size=1)

    late = {"calls": 0}

    def nan_at_decode(act, hook):
        late["calls"] += 1
        return act * float("nan") if act.shape[1] == 1 else act

    with pytest.raises(NonFiniteLogits, match="at generated token 1"), \
            model.hooks(fwd_hooks=[("blocks.0.hook_mlp_out", nan_at_decode)]):
        engine_for(model).generate([greedy((1, 2, 3), 4)])
    with pytest.raises(NonFiniteLogits, match="loglik request 0"), model.hooks(fwd_hooks=nan):
        engine_for(model).loglik([LoglikRequest((1, 2), (3, 4))])


def test_loglik_equals_an_unbatched_forward(model):
    reqs = [LoglikRequest(p[:-2], p[-2:]) for p in random_prompts([5, 12, 3, 8])]
    scores = engine_for(model).loglik(reqs, batch_size=3)
    for r, s in zip(reqs, scores):
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([r.context + r.continuation]))[0], -1)
        n = len(r.context)
        expected = sum(float(logp[n - 1 + i, t]) for i, t in enumerate(r.continuation))
        assert s == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("which", ["model", "fallback_model"])
def test_loglik_shares_each_context_and_equals_padded_sequences(which, request, monkeypatch):
    """Requests with one context (a question's options) run the context once and their continuations on its keys
    and values, also under a positionwise hook; the scores equal whole sequences run one at a time. A hook that is
    not positionwise, and a model without the cached attention (fallback_model), run every request whole."""
    m = request.getfixturevalue(which)
    contexts = random_prompts([7, 3, 11], seed=4)
    conts = random_prompts([1, 4, 2, 3, 1, 5], seed=5)
    reqs = [LoglikRequest(contexts[k % 3], cont) for k, cont in enumerate(conts)] + [LoglikRequest(contexts[0], conts[2])]
    v = torch.randn(m.cfg.d_model, generator=torch.Generator().manual_seed(3))
    cases = {"none": ([], [], True), "positionwise": ([Steer(1, v, 3.0)], [], True),
             "unmarked": ([], [("blocks.1.hook_mlp_out", lambda a, hook: a + 3.0 * v)], False),
             "positioned": ([Steer(1, v, 3.0, positions=(1, 3))], [], False)}
    for name, (ivs, by_hand, shared) in cases.items():
        widths = []
        embed = m.embed
        monkeypatch.setattr(embed, "forward", lambda tokens, forward=embed.forward: (
            widths.append(tuple(tokens.shape)), forward(tokens))[1])
        with m.hooks(fwd_hooks=by_hand):
            scores = TransformerLensEngine(m).loglik(reqs, interventions=ivs, batch_size=4)
        monkeypatch.undo()
        hooks = hooks_for(ivs, m) + by_hand
        if shared and which == "model":  # each context, then its continuations: contexts of 11 and 7 tokens pad
            # well together but hold 2 + 3 > batch_size requests, so they run apart; the 3-token one pads badly
            assert widths == [(1, 11), (2, 5), (1, 7), (3, 3), (1, 3), (2, 4)], name
        else:
            assert sum(w[0] for w in widths) == len(reqs), name
        for r, score in zip(reqs, scores):
            with torch.no_grad(), m.hooks(fwd_hooks=hooks):
                logp = torch.log_softmax(m(torch.tensor([r.context + r.continuation]))[0], -1)
            n = len(r.context)
            assert score == pytest.approx(sum(float(logp[n - 1 + i, t]) for i, t in enumerate(r.continuation)),
                                          abs=1e-4), name


def test_bad_requests_name_the_value(model):
    engine = engine_for(model)
    with pytest.raises(ValueError, match="token id 50 out of range"):
        engine.generate([greedy((1, 50), 2)])
    with pytest.raises(ValueError, match="pass a seed"):
        Request((1, 2), 2, temperature=0.7)
    with pytest.raises(ValueError, match="n_ctx=128"):
        engine.generate([greedy((1,) * 100, 29)])
    with pytest.raises(ValueError, match="prompt is empty"):
        Request((), 2)
    with pytest.raises(ValueError, match="temperature -0.5 out of range"):
        Request((1,), 2, temperature=-0.5, seed=0)
    with pytest.raises(ValueError, match=r"top_p 0 out of range: expected 0 < top_p <= 1"):
        Request((1,), 2, temperature=0.5, top_p=0, seed=0)
    with pytest.raises(ValueError, match=r"route \[0, 4\] has layer 4, out of range for a 4-layer model"):
        engine.generate([greedy((1, 2), 2, route=(0, 4))])
    with pytest.raises(ValueError, match="need a decoder"):
        TransformerLensEngine(make_tiny_model()).generate([Request((1,), 2, stop_strings=("x",))])


def test_an_engine_without_a_capability_refuses_requests_that_need_it():
    class SamplingOnly(Engine):
        name = "sampling_only"
        capabilities = frozenset({"loglik"})
        tokenizer = None

        def encode(self, text):
            return [1]

        def describe(self):
            return {"model": "fixed", "weights": "0", "device": "cpu", "dtype": "float32"}

        def generate(self, requests, interventions=(), batch_size=16):
            self.check(requests, interventions)
            return []

        def loglik(self, requests, interventions=(), batch_size=32):
            return []

    engine = SamplingOnly()
    assert engine.generate([greedy((1,), 2)]) == []
    with pytest.raises(EngineCapabilityError, match="request 1 has route"):
        engine.generate([greedy((1,), 2), greedy((1,), 2, route=(0, 1))])
    with pytest.raises(EngineCapabilityError, match="cannot run hooks"):
        engine.generate([greedy((1,), 2)], interventions=[Silence(1, "hook_mlp_out")])
    with pytest.raises(EngineCapabilityError, match="hidden states"):
        engine.generate([greedy((1,), 2, keep_hidden=True)])


def test_schedule_is_a_common_supersequence_and_routes_embed():
    routes = [(0, 1, 2, 3), (0, 2, 3), (0, 1, 1, 2, 3), (0, 0, 3)]
    sched = schedule(routes)
    assert sched == [0, 0, 1, 1, 2, 3]
    assert all(embed(r, sched) is not None for r in routes)
    unordered = schedule([(2, 0, 1, 3), (0, 1, 2, 3)])
    assert embed((2, 0, 1, 3), unordered) is not None and embed((0, 1, 2, 3), unordered) is not None
    assert embed((0, 1, 1), [0, 1, 2]) is None


def test_output_weight_is_a_view_in_both_storages():
    W_O = torch.randn(4, 8, 32)
    friendly = W_O.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    for w in (W_O, friendly):
        torch.testing.assert_close(output_weight(w), W_O.flatten(0, 1).T)
    assert output_weight(friendly).data_ptr() == friendly.data_ptr()


def test_generation_means():
    gen = Generation([1, 2], [-1.0, -3.0], [0.5, 1.5], "length", None)
    assert gen.mean_logprob == -2.0 and gen.entropy == 1.0


def test_positioned_hooks_ignore_idle_slots(model):
    """A row that ends early leaves an idle slot (no prompt): positions counted from a prompt's end must not be
    resolved against it."""
    v = tuple(torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(2)).tolist())
    ivs = [Steer(2, v, 10.0, positions=(-1, -3))]
    prompts = random_prompts([5, 9, 4])
    requests = [Request(p, n, stop_token_ids=()) for p, n in zip(prompts, (1, 8, 6))]
    together = engine_for(model).generate(requests, interventions=ivs, batch_size=3)
    for r, gen in zip(requests, together):
        assert gen.tokens == engine_for(model).generate([r], interventions=ivs)[0].tokens


@pytest.mark.parametrize("variant", [dict(use_qk_norm=True), dict(rotary_dim=4), dict(attn_scores_soft_cap=5.0)])
def test_fast_attention_honours_qk_norm_partial_rotary_and_soft_caps(variant):
    """Details the engine's own attention must reproduce (Qwen3's per-head QK norm, partial rotary, Gemma-2-style
    score soft-capping) on tiny models that take the fast path."""
    from conftest import tiny_config
    from reach_lens.generate.attention import fast_attention_supported

    cfg = tiny_config()
    for key, value in variant.items():
        setattr(cfg, key, value)
    torch.manual_seed(0)
    m = HookedTransformer(cfg)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_gate")):
                p.mul_(4.0)
            elif name.endswith(".w"):
                p.add_(0.3 * torch.randn_like(p))
    m.eval()
    assert fast_attention_supported(m)
    prompts = random_prompts([4, 13, 7])
    gens = TransformerLensEngine(m).generate([greedy(p, 6, r) for p in prompts for r in (None, (0, 1, 1, 3))],
                                             batch_size=3)
    for gen, (p, r) in zip(gens, [(p, r) for p in prompts for r in (None, (0, 1, 1, 3))]):
        assert gen.tokens == reference(m, p, 6, r)[0], (variant, r)


def test_engine_for_does_not_keep_its_model_alive():
    import gc
    import weakref

    m = make_tiny_model(seed=9)
    engine_for(m).generate([greedy((1, 2, 3), 2)])
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is None  # the engine (and its prefix cache) went with it
