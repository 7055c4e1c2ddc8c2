"""Random routes, hill climbing and a genetic search, under the budget contract of `routing.search`.

Batching: random search asks for all K routes at once; hill climbing asks for `batch` unevaluated
neighbours of the current route at a time; the genetic search asks for one generation at a time.
"""
import random
from typing import Iterator, Optional

from reach_lens.routes import LayerRoute
from reach_lens.routing.search import Search, distinct_random_routes
from reach_lens.routing.spaces import ROUTE_LAWS, ActionSpace


def random_method(law: str) -> str:
    """The method name of a random search under route ``law``: "random" (geometric, the default) or
    "random_<law>" (e.g. "random_uniform"); stored traces and analyses are keyed by it."""
    if law not in ROUTE_LAWS:
        raise ValueError(f"route law {law!r} unknown; valid: {', '.join(map(repr, ROUTE_LAWS))}")
    return "random" if law == "geometric" else f"random_{law}"


class RandomSearch(Search):
    """The full path, then K-1 distinct draws of `space.draw_route(rng, law)` (one batch): `law` "geometric"
    (random walks of a geometric number of edits from the full path) or "uniform" (uniform over the space's
    routes); see `routing.spaces`. Draws equal to a route already drawn are redrawn (at most 100 K draws)."""

    name = "random"

    def __init__(self, space: ActionSpace, K: int, seed: int, law: str = "geometric"):
        super().__init__(space, K, seed)
        if law not in ROUTE_LAWS:
            raise ValueError(f"route law {law!r} unknown; valid: {', '.join(map(repr, ROUTE_LAWS))}")
        self.law = law

    def _propose(self) -> Iterator[list[LayerRoute]]:
        full, out = self.space.full_path, {}
        for _ in range(100 * self.K):
            if len(out) >= self.K - 1:
                break
            route = self.space.draw_route(self.rng, self.law)
            if route != full:
                out[route] = None
        yield [full, *out]


class HillClimb(Search):
    """First-improvement hill climbing from the full path over `space.neighbors`.

    The neighbours of the current route are shuffled and evaluated `batch` at a time (None: all at once,
    i.e. steepest ascent); after each batch the search moves to the best neighbour whose reward beats the
    current one. With no better neighbour it moves sideways to a random equal-reward neighbour not yet
    visited (rewards such as 0/1 correctness are mostly flat), and failing that restarts at a random route.
    """

    name = "hill_climb"

    def __init__(self, space: ActionSpace, K: int, seed: int, batch: Optional[int] = 16):
        super().__init__(space, K, seed)
        if batch is not None and batch < 1:
            raise ValueError(f"batch={batch}; must be >= 1, or None for all neighbours at once")
        self.batch = batch

    def _better(self, options: list[LayerRoute], current: LayerRoute) -> Optional[LayerRoute]:
        known = [p for p in options if p in self.reward and self.reward[p] > self.reward[current]]
        return max(known, key=self.reward.__getitem__) if known else None

    def _propose(self) -> Iterator[list[LayerRoute]]:
        current = self.space.full_path
        yield [current]
        visited = {current}
        while current in self.reward:
            options = self.space.neighbors(current)
            self.rng.shuffle(options)
            nxt = self._better(options, current)
            todo = [p for p in options if p not in self.reward]
            step = self.batch or max(len(todo), 1)
            for start in range(0, len(todo), step):
                if nxt is not None:
                    break
                yield todo[start:start + step]
                nxt = self._better(options, current)
            if nxt is None:
                level = [p for p in options if self.reward.get(p) == self.reward[current] and p not in visited]
                nxt = level[0] if level else None
            if nxt is None:
                fresh = distinct_random_routes(self.space, 1, self.rng, visited, max_draws=100)
                if not fresh:
                    return
                nxt = fresh[0]
                yield [nxt]
            current = nxt
            visited.add(current)


def _cuts(path: LayerRoute, n_layers: int) -> dict[int, int]:
    """{c: i} for every layer c in 1..L-1 where path[:i] holds exactly the layers < c."""
    out = {}
    for c in range(1, n_layers):
        i = sum(1 for l in path if l < c)
        if all(l < c for l in path[:i]):
            out[c] = i
    return out


def crossover(a: LayerRoute, b: LayerRoute, space: ActionSpace, rng: random.Random) -> Optional[LayerRoute]:
    """One-point crossover at a layer c where both routes split into layers < c, then layers >= c:
    a's part below c + b's part from c on; a uniformly drawn c among those giving a new valid route."""
    cuts_a, cuts_b = _cuts(a, space.n_layers), _cuts(b, space.n_layers)
    children = [a[:cuts_a[c]] + b[cuts_b[c]:] for c in cuts_a if c in cuts_b]
    children = [c for c in dict.fromkeys(children) if c not in (a, b) and space.is_valid(c)]
    return children[rng.randrange(len(children))] if children else None


class Genetic(Search):
    """A (mu + lambda) genetic search over routes.

    Generation 0: the full path and `population - 1` random routes. Each later generation makes
    `population` new children: parents by binary tournament on reward; with probability `p_crossover`
    a one-point `crossover` of two parents; then one random forward edit (a random neighbour) with
    probability `p_mutation`, and always when the child equals a parent. The best `population` of parents
    and children (ties in random order) survive. A child already evaluated is redrawn (20 tries each).
    """

    name = "genetic"

    def __init__(self, space: ActionSpace, K: int, seed: int, population: int = 8,
                 p_crossover: float = 0.5, p_mutation: float = 0.5):
        super().__init__(space, K, seed)
        if population < 2:
            raise ValueError(f"population={population}; needs at least 2")
        for name, p in (("p_crossover", p_crossover), ("p_mutation", p_mutation)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name}={p} out of range (0..1)")
        self.population, self.p_crossover, self.p_mutation = population, p_crossover, p_mutation

    def _parent(self, pop: list[LayerRoute]) -> LayerRoute:
        a, b = self.rng.choice(pop), self.rng.choice(pop)
        return a if self.reward[a] >= self.reward[b] else b

    def _child(self, pop: list[LayerRoute]) -> LayerRoute:
        a = self._parent(pop)
        child, b = a, None
        if self.rng.random() < self.p_crossover:
            b = self._parent(pop)
            child = crossover(a, b, self.space, self.rng) or a
        if child in (a, b) or self.rng.random() < self.p_mutation:
            options = self.space.neighbors(child)
            child = options[self.rng.randrange(len(options))] if options else child
        return child

    def _propose(self) -> Iterator[list[LayerRoute]]:
        full = self.space.full_path
        yield [full] + distinct_random_routes(self.space, self.population - 1, self.rng, {full},
                                              max_draws=100 * self.population)
        pop = [p for p in self.reward]
        while True:
            children: dict[LayerRoute, None] = {}
            for _ in range(20 * self.population):
                if len(children) >= self.population:
                    break
                child = self._child(pop)
                if child not in self.reward:
                    children[child] = None
            if not children:
                return
            yield list(children)
            pool = pop + [c for c in children if c in self.reward]
            self.rng.shuffle(pool)
            pop = sorted(pool, key=self.reward.__getitem__, reverse=True)[:self.population]
