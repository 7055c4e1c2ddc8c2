"""Monte Carlo tree search over routes, with Dr.LLM's constants, under the budget contract of `routing.search`.

Tree: the root is the full path; a node's children are routes one forward edit away (`space.neighbors`),
tried in a random order. Each iteration selects a node, expands one untried child, takes the child's
reward (evaluated, or from the memo when the route was reached before by another sequence of edits)
and adds it to the visit counts and reward sums of the child and its ancestors.

Selection from a node: with probability `p_random` a uniformly random child, otherwise the child with
the highest  mean reward + c * sqrt(ln N_parent / N_child) - length_penalty * len(route) / L
(Dr.LLM: c = 1.8, length_penalty = 3.0, p_random = 0.1).

Widening: a node gets a new child while it has fewer than ceil(N ** widen) children (progressive
widening). Dr.LLM's released code instead descends whenever a node has any child, which makes its tree
a single chain of accumulating edits; standard UCT (expand all children first) would spend a K <= 64
budget on the ~3L one-edit neighbours of the full path. Progressive widening keeps both depth and
breadth within such budgets; widen=0 (one child per node) gives the released code's chain.

Batching: one new route per iteration (batch of 1); run many questions' searches in lockstep with
`run_searches` to batch across questions.
"""
import math
from typing import Iterator, Optional

from reach_lens.routes import LayerRoute
from reach_lens.routing.search import Search
from reach_lens.routing.spaces import ActionSpace


class _Node:
    __slots__ = ("path", "parent", "children", "untried", "visits", "total")

    def __init__(self, path: LayerRoute, parent: Optional["_Node"], untried: list[LayerRoute]):
        self.path, self.parent, self.untried = path, parent, untried
        self.children: list[_Node] = []
        self.visits, self.total = 0, 0.0


class MCTS(Search):
    """UCT with a length penalty and random child selection (Dr.LLM), progressive widening."""

    name = "mcts"

    def __init__(self, space: ActionSpace, K: int, seed: int, c: float = 1.8, length_penalty: float = 3.0,
                 p_random: float = 0.1, widen: float = 0.5):
        super().__init__(space, K, seed)
        if not 0.0 <= p_random <= 1.0:
            raise ValueError(f"p_random={p_random} out of range (0..1)")
        if not 0.0 <= widen <= 1.0:
            raise ValueError(f"widen={widen} out of range (0..1); 0 = one child per node, 1 = a child per visit")
        self.c, self.length_penalty, self.p_random, self.widen = c, length_penalty, p_random, widen

    def _node(self, path: LayerRoute, parent: Optional[_Node]) -> _Node:
        untried = self.space.neighbors(path)
        self.rng.shuffle(untried)
        return _Node(path, parent, untried)

    def _score(self, child: _Node, parent_visits: int) -> float:
        return (child.total / child.visits + self.c * math.sqrt(math.log(parent_visits) / child.visits)
                - self.length_penalty * len(child.path) / self.space.n_layers)

    def _expandable(self, node: _Node) -> bool:
        return bool(node.untried) and len(node.children) < math.ceil(node.visits ** self.widen)

    def _select(self, node: _Node) -> _Node:
        while node.children and not self._expandable(node):
            if self.rng.random() < self.p_random:
                node = node.children[self.rng.randrange(len(node.children))]
            else:
                parent = node
                node = max(parent.children, key=lambda ch: self._score(ch, parent.visits))
        return node

    @staticmethod
    def _backup(node: Optional[_Node], reward: float) -> None:
        while node is not None:
            node.visits += 1
            node.total += reward
            node = node.parent

    def _propose(self) -> Iterator[list[LayerRoute]]:
        root = self._node(self.space.full_path, None)
        yield [root.path]
        self._backup(root, self.reward[root.path])
        while True:
            node = self._select(root)
            if self._expandable(node):
                child = self._node(node.untried.pop(), node)
                node.children.append(child)
                node = child
            yield [node.path]
            if node.path not in self.reward:
                return
            self._backup(node, self.reward[node.path])
