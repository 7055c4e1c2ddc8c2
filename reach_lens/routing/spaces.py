"""Action spaces over layer routes: which routes exist, which are one edit apart, and how to draw one.

A route (`Path`) is a tuple of layer indices run in order; the full path is (0, ..., L-1). Every space
is a set of routes reachable from the full path by *forward edits*, and `neighbors(path)` lists the
routes one forward edit away, in a fixed order (so seeded searches are reproducible):

- `SkipOnly`: delete one position. Routes: non-empty strictly increasing subsets of 0..L-1.
- `SkipRepeat` (Dr.LLM): delete 1 or 2 consecutive positions, or repeat one position (it then runs
  twice in a row); length <= 2L. Routes: non-empty non-decreasing sequences of length <= 2L.
- `Segments` (CoLa / PoLar): the layers are cut into contiguous segments of 1-4 layers, each skipped,
  kept, or repeated x2 (the segment runs twice: l..m, l..m). A forward edit skips or repeats one window
  of 1-4 consecutive layers that the route currently runs exactly once, in order.

`random_route(rng)` draws the number of edits E from a geometric law on {1, 2, ...} with mean
`mean_edits` (P(E=e) = q(1-q)^(e-1), q = 1/mean_edits) and applies E edits, each drawn uniformly from
the current route's neighbours, starting at the full path; so random routes are random walks of the
same edits the structured searches use, mostly close to the full path (E=1 with probability q).
"""
import operator
import random
from abc import ABC, abstractmethod
from functools import lru_cache
from typing import ClassVar, Sequence

Path = tuple[int, ...]

MAX_SEGMENT = 4


def _dedupe(paths: list[Path]) -> list[Path]:
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
    def full_path(self) -> Path:
        return tuple(range(self.n_layers))

    def _in_range(self, path: Sequence[int]) -> bool:
        return 0 < len(path) <= self.max_len and all(
            isinstance(l, int) and not isinstance(l, bool) and 0 <= l < self.n_layers for l in path)

    @abstractmethod
    def is_valid(self, path: Sequence[int]) -> bool:
        """True if `path` is a route of this space."""

    @abstractmethod
    def neighbors(self, path: Path) -> list[Path]:
        """Distinct routes one forward edit away from `path` (never `path` itself), in a fixed order."""

    def check(self, path: Sequence[int]) -> Path:
        """`path` as a tuple of ints; ValueError if it is not a route of this space."""
        try:
            path = tuple(operator.index(l) for l in path)
        except TypeError:
            raise ValueError(f"route {list(path)} has a layer that is not an integer") from None
        if not self.is_valid(path):
            raise ValueError(f"route {list(path)} is not in the {self.name} space of a {self.n_layers}-layer model")
        return path

    def random_route(self, rng: random.Random) -> Path:
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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_layers={self.n_layers}, mean_edits={self.mean_edits})"


class SkipOnly(ActionSpace):
    """Delete any subset of layers; one edit deletes one position."""

    name = "skip"

    def is_valid(self, path: Sequence[int]) -> bool:
        return self._in_range(path) and all(a < b for a, b in zip(path, path[1:]))

    def neighbors(self, path: Path) -> list[Path]:
        path = self.check(path)
        if len(path) == 1:
            return []
        return [path[:i] + path[i + 1:] for i in range(len(path))]


class SkipRepeat(ActionSpace):
    """Dr.LLM's edits: delete 1 or 2 consecutive positions, or repeat one position; length <= 2L."""

    name = "skip_repeat"

    def is_valid(self, path: Sequence[int]) -> bool:
        return self._in_range(path) and all(a <= b for a, b in zip(path, path[1:]))

    def neighbors(self, path: Path) -> list[Path]:
        path = self.check(path)
        n = len(path)
        out = [path[:i] + path[i + 1:] for i in range(n)] if n > 1 else []
        out += [path[:i] + path[i + 2:] for i in range(n - 1)] if n > 2 else []
        out += [path[:i + 1] + path[i:] for i in range(n)] if n < self.max_len else []
        return _dedupe(out)


class Segments(ActionSpace):
    """CoLa / PoLar segments of 1-4 layers, each skipped, kept or repeated x2."""

    name = "segments"

    def is_valid(self, path: Sequence[int]) -> bool:
        return self._in_range(path) and _parses(tuple(path), self.n_layers)

    def neighbors(self, path: Path) -> list[Path]:
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


@lru_cache(maxsize=65536)
def _parses(path: Path, n_layers: int) -> bool:
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
