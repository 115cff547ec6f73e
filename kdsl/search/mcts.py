"""Monte Carlo tree search over partial operators (Syno §7.2): UCT selection, progressive
widening (a node with ``n`` visits considers ``ceil(widen * n**alpha)`` of its children, in a
seeded random order), virtual loss (a batch of ``parallel`` descents is selected before any is
scored, each pending descent counting as a visit with reward 0, so that parallel workers spread
out), random rollouts below the tree, and a pluggable reward (the driver sends the reward of each
complete state back into :meth:`MCTS.states`).

A run is reproducible from its seed; it resumes by replaying its iterations (rewards of known
operators come from the results store) up to the saved counter.

>>> from kdsl.search.space import Space
>>> space = Space("matmul", "resnet18", max_depth=2, caps={"Shift": 0, "Expand": 0})
>>> search = MCTS(space, seed=0)
>>> walk = search.states()
>>> state = next(walk)
>>> for _ in range(6):
...     state = walk.send(1.0 if state is not None else 0.0)
>>> search.iteration >= 1, search.root.visits >= 1
(True, True)
"""

from __future__ import annotations

import math
import random
from collections.abc import Generator, Mapping
from typing import Any

from kdsl.search.sample import rollout
from kdsl.search.space import Space
from kdsl.search.synthesis import State, children, is_complete, root

__all__ = ["MCTS", "TreeNode"]


class TreeNode:
    """A tree node: a partial operator, its children in a seeded random order, visit statistics."""

    __slots__ = ("state", "options", "expanded", "visits", "total", "virtual", "dead")

    def __init__(self, state: State) -> None:
        self.state = state
        self.options: list[State] | None = None
        self.expanded: list[TreeNode] = []
        self.visits = 0
        self.total = 0.0
        self.virtual = 0
        self.dead = False


class MCTS:
    """UCT with progressive widening and virtual loss; ``progress`` holds the iteration counter."""

    name = "mcts"

    def __init__(
        self,
        space: Space,
        seed: int = 0,
        progress: Mapping[str, Any] | None = None,
        *,
        exploration: float = 0.7,
        widen: float = 1.5,
        alpha: float = 0.5,
        parallel: int = 4,
    ) -> None:
        progress = dict(progress or {})
        self.space = space
        self.seed = seed
        self.exploration = exploration
        self.widen = widen
        self.alpha = alpha
        self.parallel = parallel
        self.resume_at = int(progress.get("iteration", 0))
        self.iteration = 0
        self.rng = random.Random(f"mcts:{seed}")
        self.root = TreeNode(root(space))
        self.stats: dict[str, int] = {}
        self.finished = False

    @property
    def nodes(self) -> int:
        return self.stats.get("nodes", 0)

    @property
    def replaying(self) -> bool:
        """True while re-running iterations a previous run already did."""
        return self.iteration < self.resume_at

    def progress(self) -> dict[str, Any]:
        return {"iteration": max(self.iteration, self.resume_at)}

    def _options(self, node: TreeNode) -> list[State]:
        if node.options is None:
            node.options = [child for _, child in children(self.space, node.state, self.stats)]
            self.stats["nodes"] = self.stats.get("nodes", 0) + 1
            self.rng.shuffle(node.options)
        return node.options

    def _score(self, parent: TreeNode, child: TreeNode) -> float:
        visits = child.visits + child.virtual
        if visits == 0:
            return math.inf
        mean = child.total / visits
        return mean + self.exploration * math.sqrt(math.log(parent.visits + parent.virtual + 1) / visits)

    def _descend(self) -> list[TreeNode]:
        node = self.root
        path = [node]
        node.virtual += 1
        while True:
            options = self._options(node)
            allowed = min(len(options), math.ceil(self.widen * (node.visits + node.virtual) ** self.alpha))
            if len(node.expanded) < allowed:
                child = TreeNode(options[len(node.expanded)])
                node.expanded.append(child)
                child.virtual += 1
                path.append(child)
                return path
            live = [c for c in node.expanded if not c.dead]
            if not live:
                return path
            node = max(live, key=lambda c: self._score(path[-1], c))
            node.virtual += 1
            path.append(node)

    def states(self) -> Generator[State | None, float | None, None]:
        """Complete states found by rollouts (None for a failed rollout); send back each reward."""
        while True:
            batch = []
            for _ in range(self.parallel):
                path = self._descend()
                leaf = path[-1]
                state = rollout(self.space, self.rng, start=leaf.state, stats=self.stats)
                if state is None and not self._options(leaf) and not is_complete(self.space, leaf.state):
                    leaf.dead = True
                batch.append((path, state))
            for path, state in batch:
                reward = yield state
                self.iteration += 1
                value = float(reward or 0.0)
                for node in path:
                    node.virtual -= 1
                    node.visits += 1
                    node.total += value
            if self.root.dead or (self.root.options is not None and not self.root.options):
                self.finished = True
                return
