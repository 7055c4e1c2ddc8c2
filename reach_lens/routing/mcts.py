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

Batching: ``batch`` new routes per round (default 1, the sequential search). With batch > 1 the round's
selections use a virtual loss: a selected node's visit is counted at once, with reward 0 (a loss, rewards lying in
[0, 1]), along its path to the root, so the next selection of the round sees it visited and unrewarded and goes
elsewhere; when the round's rewards are told each one is added to its path's sums, so after the round the counts
equal the sequential search's updates of the same routes. batch = 1 is the sequential search, draw for draw. Run
many questions' searches in lockstep with `run_searches` to batch across questions too.
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
                 p_random: float = 0.1, widen: float = 0.5, batch: int = 1):
        super().__init__(space, K, seed)
        if batch < 1:
            raise ValueError(f"batch={batch}: at least 1 route per round")
        if not 0.0 <= p_random <= 1.0:
            raise ValueError(f"p_random={p_random} out of range (0..1)")
        if not 0.0 <= widen <= 1.0:
            raise ValueError(f"widen={widen} out of range (0..1); 0 = one child per node, 1 = a child per visit")
        self.c, self.length_penalty, self.p_random, self.widen = c, length_penalty, p_random, widen
        self.batch = batch

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
    def _visit(node: Optional[_Node]) -> None:
        """Count a visit of ``node`` and its ancestors, its reward not yet added (the virtual loss)."""
        while node is not None:
            node.visits += 1
            node = node.parent

    @staticmethod
    def _reward(node: Optional[_Node], reward: float) -> None:
        """Add ``reward`` to the sums of ``node`` and its ancestors, whose visit `_visit` counted."""
        while node is not None:
            node.total += reward
            node = node.parent

    def _leaf(self, root: _Node) -> _Node:
        """Select from ``root``, expand one untried child where the selected node may widen, count its visit."""
        node = self._select(root)
        if self._expandable(node):
            child = self._node(node.untried.pop(), node)
            node.children.append(child)
            node = child
        self._visit(node)
        return node

    def _propose(self) -> Iterator[list[LayerRoute]]:
        root = self._node(self.space.full_path, None)
        self._visit(root)
        yield [root.path]
        self._reward(root, self.reward[root.path])
        while True:
            leaves = [self._leaf(root) for _ in range(min(self.batch, self.remaining))]
            yield [leaf.path for leaf in leaves]
            cut = False
            for leaf in leaves:
                if leaf.path in self.reward:
                    self._reward(leaf, self.reward[leaf.path])
                else:  # cut by the budget: the search is over
                    cut = True
            if cut:
                return
