"""Action spaces and route searches on toy rewards (no model)."""
import hashlib
import itertools
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reach_lens.routing.local import crossover
from reach_lens.routing import (METHODS, MCTS, SPACES, Genetic, HillClimb, RandomSearch, Segments, SkipOnly,
                                SkipRepeat, make_space, run_searches)

space_names = st.sampled_from(sorted(SPACES))


def multiplicity(path, n_layers):
    counts = [0] * n_layers
    for layer in path:
        counts[layer] += 1
    return counts


def closeness(space, target):
    """Toy reward: 1 - (L1 distance between layer multiplicities of route and target), batched."""
    goal = multiplicity(target, space.n_layers)

    def reward(paths):
        return [1.0 - sum(abs(a - b) for a, b in zip(multiplicity(p, space.n_layers), goal)) for p in paths]

    return reward


# ---------------------------------------------------------------- action spaces


@settings(max_examples=60, deadline=None)
@given(name=space_names, n_layers=st.integers(1, 9), seed=st.integers(0, 10**6), mean=st.floats(1.0, 6.0))
def test_random_routes_and_their_neighbours_are_valid(name, n_layers, seed, mean):
    space = make_space(name, n_layers, mean_edits=mean)
    rng = random.Random(seed)
    for _ in range(5):
        path = space.random_route(rng)
        assert space.is_valid(path) and len(path) <= 2 * n_layers
        nbrs = space.neighbors(path)
        assert len(set(nbrs)) == len(nbrs) and path not in nbrs
        assert all(space.is_valid(p) for p in nbrs)


@settings(max_examples=40, deadline=None)
@given(n_layers=st.integers(2, 9), seed=st.integers(0, 10**6))
def test_spaces_are_nested(n_layers, seed):
    """Every skip-only route is a skip/repeat and a segments route; skip-only rejects repeats."""
    rng = random.Random(seed)
    skip, rep, seg = SkipOnly(n_layers), SkipRepeat(n_layers), Segments(n_layers)
    path = skip.random_route(rng)
    assert rep.is_valid(path) and seg.is_valid(path)
    repeated = rep.random_route(rng)
    assert skip.is_valid(repeated) == (len(set(repeated)) == len(repeated))


@pytest.mark.parametrize("space, path, valid", [
    (SkipOnly(4), (0, 2, 3), True),
    (SkipOnly(4), (0, 2, 2), False),
    (SkipOnly(4), (2, 0), False),
    (SkipOnly(4), (), False),
    (SkipOnly(4), (0, 4), False),
    (SkipRepeat(4), (0, 0, 0, 1, 3, 3), True),
    (SkipRepeat(4), (1, 0), False),
    (SkipRepeat(2), (0, 0, 0, 1, 1), False),  # longer than 2L
    (Segments(6), (0, 1, 2, 0, 1, 2, 3, 5), True),  # [0..2] x2, keep 3, skip 4, keep 5
    (Segments(6), (0, 1, 2, 3, 0, 1, 2, 3, 4, 5), True),
    (Segments(6), (0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5), False),  # a 5-layer segment
    (Segments(6), (0, 0, 0, 1), False),  # repeat x3
    (Segments(6), (0, 2, 1), False),
    (Segments(6), (0, 1, 3, 0, 1, 3), False),  # a segment is contiguous layers
])
def test_is_valid_on_hand_made_routes(space, path, valid):
    assert space.is_valid(path) is valid


def test_neighbours_are_the_published_edits():
    assert SkipOnly(3).neighbors((0, 1, 2)) == [(1, 2), (0, 2), (0, 1)]
    assert set(SkipRepeat(3).neighbors((0, 1, 2))) == {
        (1, 2), (0, 2), (0, 1), (2,), (0,), (0, 0, 1, 2), (0, 1, 1, 2), (0, 1, 2, 2)}
    # a repeated segment is not edited further; a kept window of up to 4 layers is skipped or repeated
    nbrs = Segments(6).neighbors((0, 1, 0, 1, 2, 3, 4, 5))
    assert (0, 1, 0, 1, 3, 4, 5) in nbrs and (0, 1, 0, 1, 2, 3, 4, 5, 2, 3, 4, 5) in nbrs
    assert all(p[:4] == (0, 1, 0, 1) for p in nbrs) and len(nbrs) == 4 + 3 + 2 + 1 + 4 + 3 + 2 + 1
    assert (0, 1, 0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5) not in nbrs


def test_random_route_edit_count_is_geometric():
    """Skip-only: every edit deletes one layer, so deletions ~ geometric with mean `mean_edits`."""
    space = SkipOnly(40, mean_edits=3.0)
    rng = random.Random(0)
    deleted = np.array([40 - len(space.random_route(rng)) for _ in range(3000)])
    assert abs(deleted.mean() - 3.0) < 0.15
    assert abs((deleted == 1).mean() - 1 / 3) < 0.03


def all_routes(space):
    """Every route of a small space, by brute force over all layer sequences up to the length cap."""
    L = space.n_layers
    return {p for m in range(1, 2 * L + 1) for p in itertools.product(range(L), repeat=m) if space.is_valid(p)}


def segment_routes(L):
    """Every segments route, independently of `Segments`: each cut of 0..L-1 into windows of 1-4 layers, each
    skipped, kept or repeated, concatenated (distinct routes only)."""
    def cuts(i):
        if i == L:
            yield []
        for s in range(1, min(4, L - i) + 1):
            for rest in cuts(i + s):
                yield [tuple(range(i, i + s)), *rest]
    return {r for parts in cuts(0) for modes in itertools.product((0, 1, 2), repeat=len(parts))
            if (r := tuple(layer for part, m in zip(parts, modes) for layer in part * m))}


@pytest.mark.parametrize("name", sorted(SPACES))
def test_count_routes_is_the_number_of_valid_routes(name):
    for L in (1, 2, 3):
        assert make_space(name, L).count_routes() == len(all_routes(make_space(name, L)))
    assert Segments(6).count_routes() == len(segment_routes(6))
    assert (SkipOnly(30).count_routes(), SkipRepeat(2).count_routes()) == (2 ** 30 - 1, 2 + 3 + 4 + 5)


@pytest.mark.parametrize("name, L", [("skip", 4), ("skip_repeat", 2), ("skip_repeat", 3), ("segments", 3),
                                     ("segments", 5)])
def test_uniform_routes_are_uniform_over_the_space(name, L):
    """Chi-square goodness of fit of 100 draws per route against the uniform law over every route (found by
    brute force): a fixed seed, so the test is deterministic; the geometric law fails the same test."""
    from scipy.stats import chisquare

    space = make_space(name, L)
    routes = sorted(segment_routes(L) if name == "segments" else all_routes(space))
    rng = random.Random(0)
    n = 100 * len(routes)
    uniform = Counter(space.draw_route(rng, "uniform") for _ in range(n))
    assert set(uniform) == set(routes)  # every route drawn, nothing else
    counts = [uniform[r] for r in routes]
    assert chisquare(counts).pvalue > 1e-3
    tv = 0.5 * sum(abs(c / n - 1 / len(routes)) for c in counts)
    assert tv < 0.05
    geometric = Counter(space.draw_route(rng, "geometric") for _ in range(n))
    assert chisquare([geometric[r] for r in routes]).pvalue < 1e-6


def test_uniform_routes_of_a_deep_space_are_far_from_the_full_path():
    """Uniform skip/repeat routes of 30 layers: lengths concentrate near the cap 2L (most routes are long),
    unlike geometric walks, which stay within a few edits of the full path."""
    space, rng = SkipRepeat(30), random.Random(1)
    lengths = np.array([len(space.uniform_route(rng)) for _ in range(500)])
    assert lengths.min() >= 1 and lengths.max() <= 60 and lengths.mean() > 50
    assert all(space.is_valid(space.uniform_route(rng)) for _ in range(50))


def test_random_search_law():
    space = SkipOnly(5)
    trace = RandomSearch(space, 8, seed=2, law="uniform").run(lambda ps: [0.0] * len(ps))
    assert trace.routes[0] == space.full_path and len(set(trace.routes)) == 8
    assert trace.routes[1:] == _distinct_uniform(space, 7, random.Random(2), space.full_path)
    with pytest.raises(ValueError, match="route law 'flat' unknown; valid: 'geometric', 'uniform'"):
        RandomSearch(space, 8, seed=2, law="flat")
    with pytest.raises(ValueError, match="route law 'flat' unknown"):
        space.draw_route(random.Random(0), "flat")


def _distinct_uniform(space, n, rng, full):
    out = {}
    while len(out) < n:
        r = space.uniform_route(rng)
        if r != full:
            out[r] = None
    return list(out)


def test_bad_space_arguments():
    with pytest.raises(ValueError, match="unknown action space 'skips'"):
        make_space("skips", 4)
    with pytest.raises(ValueError, match="mean_edits=0.5"):
        SkipOnly(4, mean_edits=0.5)
    with pytest.raises(ValueError, match=r"route \[0, 0\] is not in the skip space"):
        SkipOnly(4).check((0, 0))


def test_crossover_joins_a_prefix_and_a_suffix():
    space, rng = Segments(8), random.Random(0)
    a, b = (0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7), (0, 1, 3, 4, 5, 6, 7, 6, 7)
    for _ in range(20):
        child = crossover(a, b, space, rng)
        assert space.is_valid(child) and child not in (a, b)
        assert child in {a[:sum(l < c for l in a)] + b[sum(l < c for l in b):] for c in range(1, 8)}
    assert crossover((0, 1, 0, 1), (0, 1, 0, 1), Segments(2), rng) is None


# ---------------------------------------------------------------- the budget contract


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("space_name", sorted(SPACES))
def test_budget_contract(method, space_name):
    space = make_space(space_name, 6)
    target = space.random_route(random.Random(7))
    reward = closeness(space, target)
    calls = []

    def reward_fn(paths):
        calls.append(list(paths))
        return reward(paths)

    K = 25
    trace = METHODS[method](space, K, seed=3).run(reward_fn)
    evaluated = [p for batch in calls for p in batch]
    assert evaluated[0] == space.full_path == trace.routes[0]
    assert len(evaluated) == len(set(evaluated)) == len(trace.routes) <= K
    assert evaluated == trace.routes and trace.rewards == reward(evaluated)
    assert trace.batch_sizes == [len(c) for c in calls]
    assert all(space.is_valid(p) for p in evaluated)
    o = trace.oracle()
    assert len(o) == K and o[0] == trace.rewards[0] and np.all(np.diff(o) >= 0)
    assert o[-1] == max(trace.rewards)
    again = METHODS[method](space, K, seed=3).run(reward)
    assert again.routes == trace.routes
    other = METHODS[method](space, K, seed=4).run(reward)
    assert other.routes[0] == space.full_path and other.routes != trace.routes


@pytest.mark.parametrize("method", sorted(METHODS))
def test_search_stops_when_the_space_is_exhausted(method):
    space = SkipOnly(3)  # 7 routes
    trace = METHODS[method](space, 50, seed=0).run(closeness(space, (1,)))
    assert 1 <= len(trace.routes) <= 7 and len(set(trace.routes)) == len(trace.routes)
    assert len(trace.oracle()) == 50 and trace.oracle()[-1] == max(trace.rewards)


def test_lockstep_equals_separate_runs():
    space = SkipRepeat(5)
    targets = [space.random_route(random.Random(s)) for s in range(3)]
    rewards = [closeness(space, t) for t in targets]
    searches = [MCTS(space, 12, 0), Genetic(space, 12, 1), HillClimb(space, 12, 2)]
    sizes = []

    def batched(pairs):
        sizes.append(len(pairs))
        return [rewards[i]([p])[0] for i, p in pairs]

    traces = run_searches(searches, batched)
    alone = [type(s)(space, 12, s.seed).run(rewards[i]) for i, s in enumerate(searches)]
    assert [t.routes for t in traces] == [t.routes for t in alone]
    assert [t.rewards for t in traces] == [t.rewards for t in alone]
    assert sizes[0] == 1 + 8 + 1  # first round: the MCTS root, genetic generation 0, the climber's full path


def test_ask_tell_misuse():
    search = RandomSearch(SkipOnly(4), 5, 0)
    batch = search.ask()
    with pytest.raises(RuntimeError, match="not told"):
        search.ask()
    with pytest.raises(ValueError, match="2 rewards for 5 routes"):
        search.tell([0.0, 1.0])
    with pytest.raises(ValueError, match="not finite"):
        search.tell([float("nan")] * len(batch))
    with pytest.raises(ValueError, match="K=0"):
        MCTS(SkipOnly(4), 0, 0)


# ---------------------------------------------------------------- searches on toy objectives


def hits(method, space, target, K, seeds):
    return [target in method(space, K, s).run(closeness(space, target)).routes for s in seeds]


def test_mcts_finds_a_known_best_route():
    space, target = SkipOnly(8), (0, 2, 3, 4, 6, 7)  # two deletions from the full path
    mcts = hits(MCTS, space, target, 40, range(30))
    rand = hits(RandomSearch, space, target, 40, range(30))
    assert sum(mcts) >= 22 and sum(mcts) >= sum(rand) + 8  # (24 and 13 when written)
    # on a 31-route space, 25 routes suffice for every seed
    assert all(hits(MCTS, SkipOnly(5), (0, 2, 4), 25, range(10)))


def _hashed_reward(paths):
    return [int(hashlib.sha256(repr(p).encode()).hexdigest(), 16) % 7 / 6 for p in paths]


def test_mcts_batch_1_is_the_sequential_search_draw_for_draw():
    # the routes, in order, of the sequential MCTS (one route per round, as written before rounds of several
    # routes existed) under a fixed reward of each route, K = 30 over 8 layers, seeds 0-2
    sequential = {("skip_repeat", 0): "9a50249ce4701753", ("skip_repeat", 1): "1956a644f5d138f1",
                  ("skip_repeat", 2): "5440060d89077a4a", ("skip", 0): "587f35c42ea06864",
                  ("skip", 1): "136a5461663aae73", ("skip", 2): "a545bee2bf050cfd"}
    for (space, seed), digest in sequential.items():
        trace = MCTS(make_space(space, 8), 30, seed, batch=1).run(_hashed_reward)
        assert hashlib.sha256(repr(trace.routes).encode()).hexdigest()[:16] == digest, (space, seed)
        assert trace.batch_sizes == [1] * 30


@pytest.mark.parametrize("batch", [2, 4, 8])
def test_mcts_rounds_of_several_routes_keep_the_budget_contract(batch):
    space = make_space("skip_repeat", 8)
    trace = MCTS(space, 30, 0, batch=batch).run(_hashed_reward)
    assert trace.routes[0] == space.full_path and len(set(trace.routes)) == len(trace.routes) == 30
    assert trace.batch_sizes[0] == 1 and max(trace.batch_sizes) == batch and len(trace.batch_sizes) < 30
    assert trace.routes == MCTS(space, 30, 0, batch=batch).run(_hashed_reward).routes  # seeded
    # the virtual loss spreads a round over the tree: its routes are distinct (no round asks one route twice)
    # and the search still finds a known best route (two deletions) about as often as the sequential one
    target = (0, 2, 3, 4, 6, 7)
    found = sum(target in MCTS(SkipOnly(8), 40, s, batch=batch).run(closeness(SkipOnly(8), target)).routes
                for s in range(30))
    assert found >= 17  # sequential 24 of 30, random 13; batched 24, 26, 19 for 2, 4, 8 when written
    with pytest.raises(ValueError, match="batch=0"):
        MCTS(space, 30, 0, batch=0)


def test_mcts_length_penalty_prefers_short_routes():
    """With a flat reward only the penalty steers selection, towards deletions, never repeats."""
    space = SkipRepeat(6)
    plain = MCTS(space, 40, 0).run(lambda paths: [0.0] * len(paths))
    no_penalty = MCTS(space, 40, 0, length_penalty=0.0).run(lambda paths: [0.0] * len(paths))
    assert np.mean([len(p) for p in plain.routes]) < np.mean([len(p) for p in no_penalty.routes])


@pytest.mark.parametrize("method", [HillClimb, Genetic])
@pytest.mark.parametrize("space, target", [
    (SkipOnly(10), (0, 1, 3, 4, 6, 7, 9)),
    (SkipRepeat(10), (0, 1, 1, 3, 4, 6, 7, 7, 9)),
    (Segments(10), (0, 1, 2, 3, 2, 3, 4, 7, 8, 9)),
])
def test_local_searches_improve_on_a_toy_objective(method, space, target):
    reward = closeness(space, target)
    start = reward([space.full_path])[0]
    best = [max(method(space, 60, s).run(reward).rewards) for s in range(5)]
    random_best = [max(RandomSearch(space, 60, s).run(reward).rewards) for s in range(5)]
    assert min(best) > start and np.mean(best) > np.mean(random_best)


def test_hill_climb_reaches_the_target_on_skip_only():
    space, target = SkipOnly(10), (0, 1, 3, 4, 6, 7, 9)
    assert all(hits(HillClimb, space, target, 60, range(5)))


def test_hill_climb_batches_and_steepest_ascent():
    space = SkipOnly(10)
    first = HillClimb(space, 30, 0, batch=4).run(closeness(space, (0, 1, 2)))
    assert first.batch_sizes[:3] == [1, 4, 4]
    steep = HillClimb(space, 30, 0, batch=None).run(closeness(space, (0, 1, 2)))
    assert steep.batch_sizes[:2] == [1, 10]
