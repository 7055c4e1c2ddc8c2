"""Action spaces over layer routes: which routes exist, which are one edit apart, and how to draw one.

A route (`reach_lens.routes.LayerRoute`) is a tuple of layer indices run in order; the full path is (0, ..., L-1).
Every space is a set of routes reachable from the full path by *forward edits*, and `neighbors(path)` lists the
routes one forward edit away, in a fixed order (so seeded searches are reproducible):

- `SkipOnly`: delete one position. Routes: non-empty strictly increasing subsets of 0..L-1.
- `SkipRepeat` (Dr.LLM): delete 1 or 2 consecutive positions, or repeat one position (it then runs
  twice in a row); length <= 2L. Routes: non-empty non-decreasing sequences of length <= 2L.
- `Segments` (CoLa / PoLar): the layers are cut into contiguous segments of 1-4 layers, each skipped,
  kept, or repeated x2 (the segment runs twice: l..m, l..m). A forward edit skips or repeats one window
  of 1-4 consecutive layers that the route currently runs exactly once, in order.

Two laws of random routes (`draw_route(rng, law)`, `law` in `ROUTE_LAWS`):

- ``"geometric"`` (`random_route`): the number of edits E is geometric on {1, 2, ...} with mean
  `mean_edits` (P(E=e) = q(1-q)^(e-1), q = 1/mean_edits), and E edits, each drawn uniformly from the
  current route's neighbours, are applied to the full path: random walks of the same edits the structured
  searches use, mostly close to the full path (E=1 with probability q).
- ``"uniform"`` (`uniform_route`): exactly uniform over every route of the space (all of them have length
  <= 2L, the length cap), drawn from a counted description of the space with exact integer arithmetic:
  * skip: a uniform subset of the L layers (each in or out with probability 1/2), redrawn while empty;
  * skip/repeat: a route is a vector of run counts c_0..c_{L-1} >= 0 with 1 <= m = sum c_l <= 2L (the
    route runs layer l c_l times, in layer order). There are C(m+L-1, L-1) vectors of sum m; m is drawn
    with probability proportional to that count, then a uniform vector of sum m by stars and bars (L-1
    bar positions drawn uniformly among m+L-1 slots);
  * segments: a route is, one to one, a set of disjoint *repeated* windows of 1-4 consecutive layers plus a
    skip/keep choice for every other layer (adjacent kept or skipped segments merge into the same route;
    a repeated window l..m shows as the only descent m -> l, so the windows can be read back from the
    route). With f(i) the number of such descriptions of layers i..L-1, f(L) = 1 and
    f(i) = 2 f(i+1) + sum_{s=1..4, i+s<=L} f(i+s); a description is drawn layer by layer with those
    weights, redrawn when it skips every layer (the empty route).
  `count_routes()` gives each space's number of routes.
"""
import math
import operator
import random
from abc import ABC, abstractmethod
from functools import lru_cache
from typing import ClassVar, Sequence

from reach_lens.routes import LayerRoute

MAX_SEGMENT = 4
ROUTE_LAWS = ("geometric", "uniform")


def _dedupe(paths: list[LayerRoute]) -> list[LayerRoute]:
    return list(dict.fromkeys(paths))


class ActionSpace(ABC):
    """Routes over an `n_layers`-layer model; see the module docstring for the three spaces."""

    name: ClassVar[str]

    def __init__(self, n_layers: int, mean_edits: float = 2.0):
        if n_layers < 1:
            raise ValueError(f"n_layers={n_layers}; a model needs at least 1 layer")
        if not mean_edits >= 1.0:
            raise ValueError(f"mean_edits={mean_edits}; the geometric law on {{1, 2, ...}} needs mean >= 1")
        self.n_layers = n_layers
        self.mean_edits = float(mean_edits)
        self.max_len = 2 * n_layers

    @property
    def full_path(self) -> LayerRoute:
        return tuple(range(self.n_layers))

    def _in_range(self, path: Sequence[int]) -> bool:
        return 0 < len(path) <= self.max_len and all(
            isinstance(l, int) and not isinstance(l, bool) and 0 <= l < self.n_layers for l in path)

    @abstractmethod
    def is_valid(self, path: Sequence[int]) -> bool:
        """True if `path` is a route of this space."""

    @abstractmethod
    def neighbors(self, path: LayerRoute) -> list[LayerRoute]:
        """Distinct routes one forward edit away from `path` (never `path` itself), in a fixed order."""

    def check(self, path: Sequence[int]) -> LayerRoute:
        """`path` as a tuple of ints; ValueError if it is not a route of this space."""
        try:
            path = tuple(operator.index(l) for l in path)
        except TypeError:
            raise ValueError(f"route {list(path)} has a layer that is not an integer") from None
        if not self.is_valid(path):
            raise ValueError(f"route {list(path)} is not in the {self.name} space of a {self.n_layers}-layer model")
        return path

    def random_route(self, rng: random.Random) -> LayerRoute:
        """Full path plus E uniform random forward edits, E ~ geometric with mean `mean_edits`."""
        q = 1.0 / self.mean_edits
        edits = 1
        while rng.random() >= q:
            edits += 1
        path = self.full_path
        for _ in range(edits):
            options = self.neighbors(path)
            if not options:
                break
            path = options[rng.randrange(len(options))]
        return path

    @abstractmethod
    def uniform_route(self, rng: random.Random) -> LayerRoute:
        """A route drawn uniformly from every route of this space (module docstring)."""

    @abstractmethod
    def count_routes(self) -> int:
        """How many routes this space holds."""

    def draw_route(self, rng: random.Random, law: str = "geometric") -> LayerRoute:
        """A random route under `law`: "geometric" (`random_route`) or "uniform" (`uniform_route`)."""
        if law == "geometric":
            return self.random_route(rng)
        if law == "uniform":
            return self.uniform_route(rng)
        raise ValueError(f"route law {law!r} unknown; valid: {', '.join(map(repr, ROUTE_LAWS))}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_layers={self.n_layers}, mean_edits={self.mean_edits})"


class SkipOnly(ActionSpace):
    """Delete any subset of layers; one edit deletes one position."""

    name = "skip"

    def is_valid(self, path: Sequence[int]) -> bool:
        return self._in_range(path) and all(a < b for a, b in zip(path, path[1:]))

    def neighbors(self, path: LayerRoute) -> list[LayerRoute]:
        path = self.check(path)
        if len(path) == 1:
            return []
        return [path[:i] + path[i + 1:] for i in range(len(path))]

    def uniform_route(self, rng: random.Random) -> LayerRoute:
        while True:
            bits = rng.getrandbits(self.n_layers)
            if bits:
                return tuple(l for l in range(self.n_layers) if bits >> l & 1)

    def count_routes(self) -> int:
        return 2 ** self.n_layers - 1


class SkipRepeat(ActionSpace):
    """Dr.LLM's edits: delete 1 or 2 consecutive positions, or repeat one position; length <= 2L."""

    name = "skip_repeat"

    def is_valid(self, path: Sequence[int]) -> bool:
        return self._in_range(path) and all(a <= b for a, b in zip(path, path[1:]))

    def neighbors(self, path: LayerRoute) -> list[LayerRoute]:
        path = self.check(path)
        n = len(path)
        out = [path[:i] + path[i + 1:] for i in range(n)] if n > 1 else []
        out += [path[:i] + path[i + 2:] for i in range(n - 1)] if n > 2 else []
        out += [path[:i + 1] + path[i:] for i in range(n)] if n < self.max_len else []
        return _dedupe(out)

    def _per_length(self) -> list[int]:
        """Routes of length m = 1..max_len: C(m + L - 1, L - 1) run-count vectors of sum m."""
        L = self.n_layers
        return [math.comb(m + L - 1, L - 1) for m in range(1, self.max_len + 1)]

    def uniform_route(self, rng: random.Random) -> LayerRoute:
        L, counts = self.n_layers, self._per_length()
        u = rng.randrange(sum(counts))
        m = 1
        for c in counts:
            if u < c:
                break
            u -= c
            m += 1
        bars = sorted(rng.sample(range(m + L - 1), L - 1))
        edges = [-1, *bars, m + L - 1]
        runs = [b - a - 1 for a, b in zip(edges, edges[1:])]  # L run counts summing to m
        return tuple(l for l, r in enumerate(runs) for _ in range(r))

    def count_routes(self) -> int:
        return sum(self._per_length())


class Segments(ActionSpace):
    """CoLa / PoLar segments of 1-4 layers, each skipped, kept or repeated x2."""

    name = "segments"

    def is_valid(self, path: Sequence[int]) -> bool:
        return self._in_range(path) and _parses(tuple(path), self.n_layers)

    def neighbors(self, path: LayerRoute) -> list[LayerRoute]:
        path = self.check(path)
        counts = [0] * self.n_layers
        for layer in path:
            counts[layer] += 1
        out = []
        for i in range(len(path)):
            for s in range(1, MAX_SEGMENT + 1):
                window = path[i:i + s]
                if len(window) < s or window != tuple(range(path[i], path[i] + s)):
                    break
                if any(counts[l] != 1 for l in window):
                    break
                if len(path) > s:
                    out.append(path[:i] + path[i + s:])
                out.append(path[:i + s] + window + path[i + s:])
        return _dedupe(out)

    def _descriptions(self) -> list[int]:
        """f[i] = descriptions of layers i..L-1 (module docstring), f[L] = 1."""
        L = self.n_layers
        f = [0] * L + [1]
        for i in range(L - 1, -1, -1):
            f[i] = 2 * f[i + 1] + sum(f[i + s] for s in range(1, min(MAX_SEGMENT, L - i) + 1))
        return f

    def uniform_route(self, rng: random.Random) -> LayerRoute:
        L, f = self.n_layers, self._descriptions()
        while True:
            route: list[int] = []
            i = 0
            while i < L:
                u = rng.randrange(f[i])
                if u < f[i + 1]:  # skip layer i
                    i += 1
                    continue
                u -= f[i + 1]
                if u < f[i + 1]:  # keep layer i
                    route.append(i)
                    i += 1
                    continue
                u -= f[i + 1]
                for s in range(1, min(MAX_SEGMENT, L - i) + 1):  # repeat window i..i+s-1
                    if u < f[i + s]:
                        route += list(range(i, i + s)) * 2
                        i += s
                        break
                    u -= f[i + s]
            if route:
                return tuple(route)

    def count_routes(self) -> int:
        return self._descriptions()[0] - 1  # every description but the one that skips every layer


@lru_cache(maxsize=65536)
def _parses(path: LayerRoute, n_layers: int) -> bool:
    """Whether `path` is a concatenation, over layers 0..L-1 in order, of segments of 1-4 consecutive
    layers, each skipped (absent), kept (once) or repeated (twice)."""
    seen: set[tuple[int, int]] = set()
    stack = [(0, 0)]  # (position in path, next layer)
    while stack:
        i, l = stack.pop()
        if (i, l) in seen:
            continue
        seen.add((i, l))
        if l == n_layers:
            if i == len(path):
                return True
            continue
        for s in range(1, min(MAX_SEGMENT, n_layers - l) + 1):
            seg = tuple(range(l, l + s))
            stack.append((i, l + s))
            if path[i:i + s] == seg:
                stack.append((i + s, l + s))
                if path[i + s:i + 2 * s] == seg:
                    stack.append((i + 2 * s, l + s))
    return False


SPACES: dict[str, type[ActionSpace]] = {cls.name: cls for cls in (SkipOnly, SkipRepeat, Segments)}


def make_space(name: str, n_layers: int, mean_edits: float = 2.0) -> ActionSpace:
    """The action space called `name` ("skip", "skip_repeat" or "segments")."""
    if name not in SPACES:
        raise ValueError(f"unknown action space {name!r}; valid: {', '.join(map(repr, SPACES))}")
    return SPACES[name](n_layers, mean_edits)
