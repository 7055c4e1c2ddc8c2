"""Route execution on tiny random models: skip masks in one batched forward, block loops over a path."""
import pytest
import torch
from transformer_lens import TransformerLensKeyValueCache

from reach_lens.hooks import Route, Silence, Steer, hooks_for
from reach_lens.routing import (
    init_path_cache,
    is_skip_only,
    run_path,
    skip_mask,
    skip_mask_hooks,
    validate_route,
)
from conftest import make_tiny_model

L = 4
FULL = list(range(L))
SKIP_ROUTES = [[0, 2, 3], [1, 3], FULL, [0, 1, 2], [3]]
CACHE_TOL = dict(atol=1e-4, rtol=1e-5)  # cached vs uncached float32 forwards: same math, other kernel shapes


@pytest.fixture(scope="module")
def model():
    return make_tiny_model(n_layers=L)


def toks(batch, pos, seed=0):
    return torch.randint(0, 50, (batch, pos), generator=torch.Generator().manual_seed(seed))


def ones(batch, n):
    return torch.ones(batch, n, dtype=torch.long)


def masked(model, tokens, routes, **kwargs):
    with torch.no_grad(), model.hooks(fwd_hooks=skip_mask_hooks(routes, L)):
        return model(tokens, **kwargs)


def test_full_route_is_the_plain_forward(model):
    tokens = toks(3, 7)
    with torch.no_grad():
        plain = model(tokens)
        torch.testing.assert_close(run_path(model, tokens, FULL), plain, atol=1e-6, rtol=0)
    assert skip_mask_hooks([FULL], L) == [] and Route(tuple(FULL)).hooks(model) == []
    torch.testing.assert_close(masked(model, tokens, [FULL] * 3), plain, atol=1e-6, rtol=0)


def test_skip_mask():
    assert torch.equal(skip_mask([[0, 2], [1]], 3), torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))


def test_batched_skip_routes_equal_run_path_row_by_row(model):
    tokens = toks(len(SKIP_ROUTES), 7)
    batched = masked(model, tokens, SKIP_ROUTES)
    with torch.no_grad():
        plain = model(tokens)
        for row, route in enumerate(SKIP_ROUTES):
            same_batch = run_path(model, tokens, route)[row]
            alone = run_path(model, tokens[row:row + 1], route)[0]
            torch.testing.assert_close(batched[row], same_batch, atol=1e-6, rtol=0)
            torch.testing.assert_close(batched[row], alone, atol=1e-5, rtol=0)  # other batch size: other kernels
            if route != FULL:
                assert (batched[row] - plain[row]).abs().max() > 1e-2


def test_prompts_times_routes_in_one_batch(model):
    B, routes = 2, [[0, 2, 3], [1, 2, 3], FULL]
    tokens = toks(B, 6, seed=1)
    batched = masked(model, tokens.repeat_interleave(len(routes), 0), [r for _ in range(B) for r in routes])
    with torch.no_grad():
        for b in range(B):
            for k, route in enumerate(routes):
                expected = run_path(model, tokens, route)[b]
                torch.testing.assert_close(batched[b * len(routes) + k], expected, atol=1e-5, rtol=0)


def test_one_route_applies_to_every_row_and_matches_route_intervention(model):
    tokens = toks(3, 5)
    with torch.no_grad(), model.hooks(fwd_hooks=Route((0, 3)).hooks(model)):
        via_silence = model(tokens)
    assert torch.equal(masked(model, tokens, [[0, 3]]), via_silence)
    with torch.no_grad():
        torch.testing.assert_close(via_silence, run_path(model, tokens, [0, 3]), atol=1e-6, rtol=0)


def test_skip_mask_is_exact_under_kv_cache(model):
    tokens = toks(len(SKIP_ROUTES), 9, seed=2)
    P = 5
    full = masked(model, tokens, SKIP_ROUTES)
    cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, len(SKIP_ROUTES))
    with torch.no_grad(), model.hooks(fwd_hooks=skip_mask_hooks(SKIP_ROUTES, L)):
        steps = [model(tokens[:, :P], past_kv_cache=cache, attention_mask=ones(len(SKIP_ROUTES), P))]
        steps += [model(tokens[:, i:i + 1], past_kv_cache=cache, attention_mask=ones(len(SKIP_ROUTES), 1))
                  for i in range(P, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **CACHE_TOL)


@pytest.mark.parametrize("path", [[0, 1, 1, 2, 3, 3], [3, 2, 1, 0], [0, 2, 2, 2, 3], FULL])
def test_run_path_with_kv_cache_equals_full_sequence(model, path):
    tokens, P = toks(2, 10, seed=3), 4
    with torch.no_grad():
        full = run_path(model, tokens, path)
        cache = init_path_cache(model, path, 2)
        steps = [run_path(model, tokens[:, :P], path, cache, attention_mask=ones(2, P))]
        steps.append(run_path(model, tokens[:, P:P + 2], path, cache, attention_mask=ones(2, 2)))  # a chunk
        steps += [run_path(model, tokens[:, i:i + 1], path, cache, attention_mask=ones(2, 1)) for i in range(P + 2, 10)]
    assert len(cache.entries) == len(path) and cache[0].past_keys.shape[1] == 10
    torch.testing.assert_close(torch.cat(steps, 1), full, **CACHE_TOL)
    if path != FULL:
        assert (full - model(tokens)).abs().max() > 1e-2


def test_repeated_layer_keeps_separate_kv_entries(model):
    path = [0, 1, 1, 2, 3]
    cache = init_path_cache(model, path, 1)
    with torch.no_grad():
        run_path(model, toks(1, 4), path, cache, attention_mask=ones(1, 4))
    assert not torch.equal(cache[1].past_keys, cache[2].past_keys)  # same layer, different inputs


def test_block_hooks_fire_at_every_path_position(model):
    calls = []
    tokens = toks(2, 5)
    path = [0, 1, 1, 1, 3]
    with torch.no_grad(), model.hooks(fwd_hooks=[("blocks.1.hook_mlp_out", lambda a, hook: calls.append(1) or a),
                                                 ("blocks.2.hook_mlp_out", lambda a, hook: calls.append(2) or a)]):
        run_path(model, tokens, path)
    assert calls == [1, 1, 1]
    with torch.no_grad(), model.hooks(fwd_hooks=Silence("layer", 1).hooks(model)):
        silenced = run_path(model, tokens, path)
    torch.testing.assert_close(silenced, run_path(model, tokens, [0, 3]), atol=1e-6, rtol=0)


def test_positioned_steering_in_a_repeated_route_under_cache(model):
    path, tokens, P = [0, 1, 1, 2, 3], toks(2, 9, seed=4), 5
    v = tuple((8 * torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))).tolist())
    steer = hooks_for([Steer(1, v, 4.0, "mlp_out", (1, P + 2))], model)
    with torch.no_grad(), model.hooks(fwd_hooks=steer):
        full = run_path(model, tokens, path)
        cache = init_path_cache(model, path, 2)
        steps = [run_path(model, tokens[:, :P], path, cache, attention_mask=ones(2, P))]
        steps += [run_path(model, tokens[:, i:i + 1], path, cache, attention_mask=ones(2, 1)) for i in range(P, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **CACHE_TOL)
    with torch.no_grad():
        clean = run_path(model, tokens, path)
    assert torch.equal(full[:, :1], clean[:, :1]) and (full[:, P + 2] - clean[:, P + 2]).abs().max() > 1e-2


def test_is_skip_only():
    assert is_skip_only([0, 1, 2]) and is_skip_only([1, 3]) and is_skip_only([2])
    assert not is_skip_only([0, 1, 1, 2]) and not is_skip_only([2, 1])


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda m: validate_route([0, 7], L), r"route \[0, 7\] has layer 7, out of range for a 4-layer model \(0..3\)"),
        (lambda m: validate_route([-1], L), "has layer -1"),
        (lambda m: validate_route([], L), "route is empty"),
        (lambda m: validate_route([0, 1.5], L), r"route \[0, 1.5\] has a layer that is not an integer"),
        (lambda m: validate_route([0] * 9, L), "length 9 exceeds max_len 8"),
        (lambda m: validate_route([0, 1, 2], L, max_len=2), "exceeds max_len 2"),
        (lambda m: skip_mask_hooks([[1, 0]], L), r"route \[1, 0\] \(row 0\) repeats or reorders layers"),
        (lambda m: skip_mask_hooks([[0, 5]], L), "has layer 5"),
        (lambda m: run_path(m, toks(1, 3), [0, 4]), "has layer 4"),
        (lambda m: run_path(m, toks(1, 3), [0, 1], init_path_cache(m, [0, 1, 1], 1)), "cache has 3 entries for a path of length 2"),
        (lambda m: masked(m, toks(3, 4), [[0], [1]]), "2 routes for a batch of 3 rows"),
    ],
)
def test_bad_routes_name_the_value(model, call, match):
    with pytest.raises(ValueError, match=match):
        call(model)
