"""The learned router: route <-> per-layer labels, prompt features, LayerRouter, training examples, cross-fitting."""
import random

import numpy as np
import pytest
import torch
from conftest import make_tiny_model

from reach_lens.routing import make_space
from reach_lens.routing.router import (
    KEEP,
    REPEAT,
    SKIP,
    LayerRouter,
    cross_fit_routes,
    decode_route,
    has_labels,
    labels_to_route,
    prompt_features,
    route_to_labels,
    training_examples,
)


def test_labels_round_trip_on_random_skip_repeat_routes():
    L = 8
    space = make_space("skip_repeat", L, mean_edits=4.0)
    rng = random.Random(0)
    routes = [space.random_route(rng) for _ in range(300)]
    labelled = [r for r in routes if has_labels(r, L)]
    assert len(labelled) > 200 and any(REPEAT in route_to_labels(r, L) for r in labelled)
    for r in labelled:
        labels = route_to_labels(r, L)
        assert labels.dtype == np.int64 and labels.shape == (L,)
        assert labels_to_route(labels) == r
    assert route_to_labels(tuple(range(L)), L).tolist() == [KEEP] * L
    nrng = np.random.default_rng(0)
    for _ in range(100):
        labels = nrng.integers(0, 3, L)
        if labels.any():
            assert route_to_labels(labels_to_route(labels), L).tolist() == labels.tolist()


@pytest.mark.parametrize("route", [(0, 2, 1, 3), (1, 1, 1, 2), (0, 1, 0, 1)])
def test_routes_without_labels_raise_and_are_not_labelled(route):
    assert not has_labels(route, 4)
    with pytest.raises(ValueError, match=r"route \["):
        route_to_labels(route, 4)


def test_labels_validation():
    with pytest.raises(ValueError, match="skip every layer"):
        labels_to_route([SKIP, SKIP])
    with pytest.raises(ValueError, match="must be a 1-D"):
        labels_to_route([1, 3])
    with pytest.raises(ValueError, match="out of range"):
        route_to_labels((0, 4), 4)


def test_decode_route_argmax_ties_to_keep_and_all_skip_fallback():
    probs = np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [0.4, 0.4, 0.2], [0.1, 0.8, 0.1]])
    assert decode_route(probs) == (1, 1, 2, 3)
    all_skip = np.array([[0.9, 0.05, 0.05], [0.6, 0.3, 0.1], [0.7, 0.2, 0.1]])
    route = decode_route(all_skip)
    assert route == (1,) and make_space("skip_repeat", 3).is_valid(route)
    with pytest.raises(ValueError, match=r"shape \(3, 2\)"):
        decode_route(np.ones((3, 2)))


def test_prompt_features_batched_equal_one_at_a_time_for_prompts_of_different_lengths():
    model = make_tiny_model(n_layers=4, d_vocab=50)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 50, (n,), generator=g).tolist() for n in (7, 12, 3, 9, 1)]
    prompts[1] = torch.tensor(prompts[1])
    batched = prompt_features(model, prompts, batch_size=3)
    alone = torch.cat([prompt_features(model, [p]) for p in prompts])
    assert batched.shape == (5, 32) and batched.dtype == torch.float32
    assert torch.allclose(batched, alone, rtol=1e-5, atol=1e-4)  # float rounding of batched matmuls
    with torch.no_grad():  # default layer (L-1)//2 = 1: the residual after blocks 0 and 1
        ref = torch.stack([model(torch.as_tensor(p)[None], stop_at_layer=2)[0].mean(0) for p in prompts])
    assert torch.allclose(batched, ref, rtol=1e-5, atol=1e-4)
    assert not torch.allclose(prompt_features(model, prompts, layer=3), batched)
    with pytest.raises(ValueError, match="layer 4 out of range"):
        prompt_features(model, prompts, layer=4)
    with pytest.raises(ValueError, match=r"prompt 0 has shape \(0,\)"):
        prompt_features(model, [[]])


def planted(n, d=16, L=8, seed=0):
    """Features whose feature-0 sign decides whether layer 2 is skipped and layer 5 repeated; keep elsewhere."""
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    labels = np.full((n, L), KEEP, dtype=np.int64)
    pos = (x[:, 0] > 0).numpy()
    labels[pos, 2], labels[pos, 5] = SKIP, REPEAT
    return x, labels


@pytest.mark.parametrize("hidden", [0, 16])
def test_layer_router_learns_a_planted_rule(hidden):
    x, y = planted(400)
    xt, yt = planted(400, seed=1)
    router = LayerRouter(hidden=hidden).fit(x, y)
    probs = router.predict_proba(xt)
    assert probs.shape == (400, 8, 3) and torch.allclose(probs.sum(-1), torch.ones(400, 8))
    pred = np.array([route_to_labels(r, 8) for r in router.predict_routes(xt)])
    assert (pred[:, [2, 5]] == yt[:, [2, 5]]).mean() > 0.95
    assert (pred[:, [0, 1, 3, 4, 6, 7]] == KEEP).all()
    keep_only = LayerRouter(hidden=hidden).fit(x, np.full((400, 8), KEEP))
    assert set(keep_only.predict_routes(xt)) == {tuple(range(8))}


def test_layer_router_is_deterministic_given_seed_and_weights_matter():
    x, y = planted(200)
    a = LayerRouter(hidden=8, seed=3).fit(x, y).predict_proba(x)
    b = LayerRouter(hidden=8, seed=3).fit(x, y).predict_proba(x)
    assert torch.equal(a, b)
    # zero weight on every example with feature 0 > 0: layer 2 is then never skipped
    w = (x[:, 0] <= 0).float().numpy()
    routes = LayerRouter().fit(x, y, sample_weight=w).predict_routes(x)
    assert all(2 in r for r in routes)


def test_layer_router_shape_errors():
    x, y = planted(20)
    with pytest.raises(RuntimeError, match="not fitted"):
        LayerRouter().predict_proba(x)
    with pytest.raises(ValueError, match=r"labels have shape \(19, 8\)"):
        LayerRouter().fit(x, y[:19])
    with pytest.raises(ValueError, match=r"sample_weight has shape \(3,\)"):
        LayerRouter().fit(x, y, sample_weight=np.ones(3))
    with pytest.raises(ValueError, match=r"features have shape \(20,\)"):
        LayerRouter().fit(x[:, 0], y)
    router = LayerRouter().fit(x, y)
    with pytest.raises(ValueError, match=r"features have shape \(20, 5\); the router was fitted on dimension 16"):
        router.predict_proba(x[:, :5])


def test_training_examples_weights_order_and_exclusions():
    L = 4
    full = (0, 1, 2, 3)
    found = {
        "a": [((0, 2, 3), 1.0), (full, 1.0), ((0, 1, 1, 2, 3), 0.0), ((0, 2, 3), 1.0), ((1, 2, 3), 1.0)],
        "b": [(full, 0.0), ((0, 1, 3), 0.0)],                      # no correct route: nothing
        "c": [(full, 1.0)],                                        # only the full path: one KEEP-all example
        "d": [((0, 0, 0, 1, 2, 3), 1.0), ((0, 1, 2, 2, 3), 1.0)],  # layer 0 run 3 times: dropped
        "e": [((i,), 1.0) for i in range(L)],                      # capped at max_per_question
    }
    ex = training_examples(found, L, max_per_question=3)
    assert ex.labels.dtype == np.int64 and ex.labels.shape == (len(ex.question_ids), L)
    assert "b" not in ex.question_ids
    for q in "acde":
        assert ex.weights[[i for i, x in enumerate(ex.question_ids) if x == q]].sum() == pytest.approx(1.0)
    rows = {q: [labels_to_route(ex.labels[i]) for i, x in enumerate(ex.question_ids) if x == q] for q in "acde"}
    assert rows == {"a": [full, (0, 2, 3), (1, 2, 3)], "c": [full], "d": [(0, 1, 2, 2, 3)], "e": [(0,), (1,), (2,)]}
    empty = training_examples({"b": found["b"]}, L)
    assert empty.question_ids == [] and empty.labels.shape == (0, L) and empty.weights.shape == (0,)


def test_cross_fit_never_returns_a_route_only_its_own_question_found():
    # question i's only correct route repeats layer i, which no other question's route does: a router that
    # never saw question i's results cannot produce it.
    L = n = 30
    feats = {f"q{i}": torch.randn(8, generator=torch.Generator().manual_seed(i)) for i in range(n)}
    own = {f"q{i}": tuple(sorted(list(range(L)) + [i])) for i in range(n)}
    found = {q: [(tuple(range(L)), 0.0), (own[q], 1.0)] for q in feats}
    routes = cross_fit_routes(feats, found, L, folds=5, seed=0, weight_decay=1e-4)
    assert set(routes) == set(feats)
    assert all(routes[q] != own[q] for q in feats)  # a router fitted on all questions returns all 30 of them
    assert all(make_space("skip_repeat", L).is_valid(r) for r in routes.values())
    for i in range(3):  # question i's results now skip layer i instead: its prediction must not move
        altered = {**found, f"q{i}": [(tuple(l for l in range(L) if l != i), 1.0)]}
        assert cross_fit_routes(feats, altered, L, folds=5, seed=0, weight_decay=1e-4)[f"q{i}"] == routes[f"q{i}"]


def test_cross_fit_prediction_ignores_the_question_own_results_and_is_deterministic():
    x, y = planted(120)
    qids = [f"q{i}" for i in range(120)]
    feats = dict(zip(qids, x))
    found = {q: [(tuple(range(8)), 0.0), (labels_to_route(y[i]), 1.0)] for i, q in enumerate(qids)}
    routes = cross_fit_routes(feats, found, 8, folds=4, seed=1)
    assert routes == cross_fit_routes(feats, found, 8, folds=4, seed=1)
    acc = np.mean([route_to_labels(routes[q], 8)[2] == y[i, 2] for i, q in enumerate(qids)])
    assert acc > 0.9  # held-out questions get the planted rule
    for q in qids[:6]:
        altered = dict(found)
        altered[q] = [((0, 1, 2), 1.0), ((3, 4, 5, 6, 7), 1.0), ((7,), 1.0)]
        assert cross_fit_routes(feats, altered, 8, folds=4, seed=1)[q] == routes[q]
        del altered[q]
        assert cross_fit_routes(feats, altered, 8, folds=4, seed=1)[q] == routes[q]


def test_cross_fit_without_examples_predicts_the_full_path():
    feats = {i: torch.randn(4) for i in range(6)}
    found = {i: [((0, 2), 0.0)] for i in range(6)}
    assert cross_fit_routes(feats, found, 3, folds=3) == {i: (0, 1, 2) for i in range(6)}
    with pytest.raises(ValueError, match="have no features"):
        cross_fit_routes({0: torch.randn(4)}, {1: []}, 3)
    with pytest.raises(ValueError, match="folds=1"):
        cross_fit_routes(feats, found, 3, folds=1)
