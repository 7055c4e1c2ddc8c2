"""Route search under one budget contract, and the drivers that run searches in batches.

Contract, shared by every method (random, MCTS, hill climbing, genetic):
- K is the number of *distinct* routes evaluated. The reward function is called once per distinct route;
  a route proposed again is served from the search's memo and not counted.
- The full path is always the first route evaluated, so every oracle curve starts at the unmodified
  model (k = 1).
- The trace lists routes in evaluation order with their rewards; the oracle trajectory is
  o(k) = max reward among the first k routes, k = 1..K.

A search is an ask/tell object: `ask()` returns the next batch of new routes (empty when the search is
over), `tell(rewards)` records their rewards. `run_searches` drives many searches in lockstep (e.g. one per
question), so one call of the reward function evaluates a batch from each of them together.
A search may end before K routes when it cannot propose new ones (a small space, or `STALE_LIMIT`
consecutive proposals of known routes).
"""
import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterator, Optional, Sequence

import numpy as np

from reach_lens.routes import LayerRoute
from reach_lens.routing.spaces import ActionSpace

STALE_LIMIT = 1000

RewardFn = Callable[[list[LayerRoute]], Sequence[float]]
BatchRewardFn = Callable[[list[tuple[int, LayerRoute]]], Sequence[float]]


@dataclass
class SearchTrace:
    """Routes of one search in evaluation order, their rewards, and the sizes of the batches asked."""

    method: str
    space: str
    K: int
    seed: int
    routes: list[LayerRoute] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)

    def oracle(self, K: Optional[int] = None) -> np.ndarray:
        """o(k) = max reward of the first k routes, k = 1..K (default self.K); after the last route
        evaluated it stays at its final value (a search that ended early finds nothing more)."""
        K = self.K if K is None else K
        if not self.rewards:
            raise ValueError("empty trace: no route was evaluated")
        o = np.maximum.accumulate(np.asarray(self.rewards[:K], dtype=float))
        return np.concatenate([o, np.full(K - len(o), o[-1])]) if len(o) < K else o

    @property
    def best(self) -> LayerRoute:
        """The first route with the highest reward."""
        return self.routes[int(np.argmax(self.rewards))]


class Search(ABC):
    """Base class: the memo, the budget and the ask/tell protocol around a proposal generator.

    Subclasses write `_propose()`, a generator that yields lists of routes (any routes: known ones and
    duplicates are filtered, the rest is cut to the budget left) and, when resumed, finds the rewards of
    the routes it proposed in `self.reward` (routes cut by the budget stay absent).
    """

    name: ClassVar[str]

    def __init__(self, space: ActionSpace, K: int, seed: int):
        if K < 1:
            raise ValueError(f"K={K}; the budget must be at least 1 route")
        self.space, self.K, self.seed = space, K, seed
        self.rng = random.Random(seed)
        self.reward: dict[LayerRoute, float] = {}
        self._trace = SearchTrace(self.name, space.name, K, seed)
        self._steps: Optional[Iterator[list[LayerRoute]]] = None
        self._pending: list[LayerRoute] = []
        self._done = False

    @property
    def remaining(self) -> int:
        return self.K - len(self.reward)

    @abstractmethod
    def _propose(self) -> Iterator[list[LayerRoute]]:
        """Yield batches of proposed routes; the first batch must start with the full path."""

    def ask(self) -> list[LayerRoute]:
        """The next batch of new distinct routes to evaluate (at most `remaining`); [] once the search is over."""
        if self._pending:
            raise RuntimeError(f"{len(self._pending)} routes asked but not told; call tell(rewards) first")
        if self._steps is None:
            self._steps = self._propose()
        stale = 0
        while not self._done and self.remaining > 0 and stale < STALE_LIMIT:
            try:
                proposed = next(self._steps)
            except StopIteration:
                break
            new = [p for p in dict.fromkeys(map(self.space.check, proposed)) if p not in self.reward]
            if not self.reward and (not new or new[0] != self.space.full_path):
                raise RuntimeError(f"{self.name} did not propose the full path first")
            if new:
                self._pending = new[:self.remaining]
                return list(self._pending)
            stale += 1
        self._done = True
        if self._steps is not None:
            self._steps.close()
        return []

    def tell(self, rewards: Sequence[float]) -> None:
        """Record the rewards of the routes of the last `ask()`, in the same order."""
        if len(rewards) != len(self._pending):
            raise ValueError(f"{len(rewards)} rewards for {len(self._pending)} routes asked")
        for path, r in zip(self._pending, rewards):
            r = float(r)
            if not math.isfinite(r):
                raise ValueError(f"reward {r} for route {list(path)} is not finite")
            self.reward[path] = r
            self._trace.routes.append(path)
            self._trace.rewards.append(r)
        self._trace.batch_sizes.append(len(self._pending))
        self._pending = []

    def trace(self) -> SearchTrace:
        return self._trace

    def run(self, reward_fn: RewardFn) -> SearchTrace:
        """Run to the end, calling `reward_fn(routes) -> rewards` once per batch."""
        return run_searches([self], lambda pairs: reward_fn([p for _, p in pairs]))[0]


def run_searches(searches: Sequence[Search], reward_fn: BatchRewardFn) -> list[SearchTrace]:
    """Run searches in lockstep: each round asks every unfinished search for a batch and evaluates all of
    them in one call `reward_fn([(search index, route), ...]) -> rewards`. Returns the traces."""
    active = list(range(len(searches)))
    while active:
        asked = [(i, searches[i].ask()) for i in active]
        active = [i for i, batch in asked if batch]
        pairs = [(i, p) for i, batch in asked for p in batch]
        if not pairs:
            break
        rewards = list(reward_fn(pairs))
        if len(rewards) != len(pairs):
            raise ValueError(f"reward_fn returned {len(rewards)} rewards for {len(pairs)} routes")
        start = 0
        for i, batch in asked:
            if batch:
                searches[i].tell(rewards[start:start + len(batch)])
                start += len(batch)
    return [s.trace() for s in searches]


def distinct_random_routes(space: ActionSpace, n: int, rng: random.Random, exclude: set[LayerRoute],
                           max_draws: int) -> list[LayerRoute]:
    """Up to n distinct `space.random_route` draws not in `exclude`, from at most max_draws draws."""
    out: dict[LayerRoute, None] = {}
    for _ in range(max_draws):
        if len(out) >= n:
            break
        r = space.random_route(rng)
        if r not in exclude:
            out[r] = None
    return list(out)
