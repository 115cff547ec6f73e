"""Exhaustive enumeration by iterative deepening: depth-first walks of every canonical partial
operator with a growing depth limit (1, 2, ..., the space's depth), each walk yielding only the
operators that finish exactly at its limit. So a short run returns the shallow operators first
(the pointwise conv at depth 2, conv2d at 6) instead of the first deep corner of the tree, and
each complete state is yielded exactly once. Re-walking the shallow levels costs little: the
tree grows by a large factor per level, and the shape distance prunes every walk against its own
limit (a node that cannot finish by the limit is not expanded).

Each output goal of the space (the spec's output, then, where every layer has ``Cout = Cin``, the
output with ``Cin``: :attr:`Space.output_goals`) has its own iterative deepening, and the walks
take turns of :data:`HEARTBEAT` nodes: a short run gets the shallow operators of every goal (the
depthwise conv at depth 5 as well as conv2d at 6), and an extra goal, whose tree is larger at
equal depth, delays the spec's own operators by a factor of two at most. An extra goal yields only
operators that need it (:func:`kdsl.search.synthesis.spec_twin`) and that carry a weight.

The cursor of each walk is its limit and the path of child indices of the last node it visited,
so a run resumes where it stopped.

>>> from kdsl.search.space import Space
>>> space = Space("matmul", "resnet18", coefficients={"K": [3]}, max_depth=2, caps={"Shift": 0, "Expand": 0})
>>> walk = Enumeration(space)
>>> [[str(step) for step in state.steps] for state in walk.states() if state is not None]
[['Reduce(Cin)', 'Share(weight-only [Cout], shared [Cin])']]
>>> walk.finished, walk.progress()["limit"]
(True, 2)
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from kdsl.search.space import Space
from kdsl.search.state import CONTRACTIONS
from kdsl.search.synthesis import State, children, is_complete, root, spec_twin, to_operators

__all__ = ["Enumeration", "count_by_depth"]

#: yield a heartbeat (None) this often, so that the driver can checkpoint and watch the clock (and
#: let the walk of the next output goal take its turn)
HEARTBEAT = 256


class _Walk:
    """The iterative deepening of one output goal: its limit, the path of the last node visited
    at that limit (``after`` where it resumes), its node count, and whether it is done."""

    def __init__(self, goal: int, cursor: Mapping[str, Any] | None = None) -> None:
        cursor = cursor or {}
        self.goal = goal
        self.limit = int(cursor.get("limit", 1))
        after = cursor.get("after")
        self.after: tuple[int, ...] | None = tuple(after) if after is not None else None
        self.path = self.after
        self.nodes = int(cursor.get("nodes", 0))
        self.finished = bool(cursor.get("finished", False))

    def cursor(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "after": list(self.path) if self.path is not None else None,
            "nodes": self.nodes,
            "finished": self.finished,
        }


class Enumeration:
    """Iterative-deepening enumeration of every output goal; ``progress`` (a dict) resumes it where
    a previous run stopped. A cursor saved by the earlier depth-first enumeration (no ``limit``)
    starts over from depth 1, one saved before output goals (no ``walks``) resumes the spec's goal
    and starts the others: the results store skips the operators it already holds."""

    name = "enumerate"

    def __init__(self, space: Space, seed: int = 0, progress: Mapping[str, Any] | None = None) -> None:
        progress = dict(progress or {})
        self.space = space
        goals = len(space.output_goals)
        saved = progress.get("walks")
        if isinstance(saved, list) and len(saved) == goals:
            self.walks = [_Walk(goal, cursor) for goal, cursor in enumerate(saved)]
        else:
            first = progress if "limit" in progress else None
            self.walks = [_Walk(0, first)] + [_Walk(goal) for goal in range(1, goals)]
        self.turn = int(progress.get("turn", 0)) % goals
        self.stats: dict[str, int] = {}

    @property
    def nodes(self) -> int:
        """Nodes visited by every walk."""
        return sum(walk.nodes for walk in self.walks)

    @property
    def limit(self) -> int:
        """The depth the unfinished walks have reached (the smallest of their limits)."""
        return min((walk.limit for walk in self.walks if not walk.finished), default=self.space.max_depth)

    @property
    def finished(self) -> bool:
        return all(walk.finished for walk in self.walks)

    def progress(self) -> dict[str, Any]:
        """The cursors: for each goal's walk, every node up to ``after`` (pre-order) in its walk to
        depth ``limit`` has been visited (and every walk to a smaller limit). ``limit`` and
        ``after`` at the top are those of the spec's goal."""
        first = self.walks[0].cursor()
        return {
            "limit": first["limit"],
            "after": first["after"],
            "nodes": self.nodes,
            "finished": self.finished,
            "walks": [walk.cursor() for walk in self.walks],
            "turn": self.turn,
        }

    def states(self) -> Generator[State | None, object, None]:
        """Complete states (and ``None`` heartbeats), shallowest first within each goal, after the
        cursors; the goals' walks take turns of :data:`HEARTBEAT` nodes."""
        running = {walk.goal: self._deepen(walk) for walk in self.walks if not walk.finished}
        while running:
            goals = sorted(running)
            goal = next((g for g in goals if g >= self.turn), goals[0])
            for item in running[goal]:
                yield item
                if item is None:  # this walk's heartbeat: the next goal's turn
                    break
            else:
                del running[goal]
            self.turn = goal + 1 if goal + 1 < len(self.walks) else 0

    def _deepen(self, walk: _Walk) -> Generator[State | None, object, None]:
        while True:
            yield from self._walk(walk, root(self.space, walk.goal), (), walk.after)
            if walk.limit >= self.space.max_depth:
                break
            walk.limit += 1
            walk.after = walk.path = None
        walk.finished = True

    def _walk(self, walk: _Walk, state: State, path: tuple[int, ...], after: tuple[int, ...] | None) -> Generator:
        if after is None:
            walk.nodes += 1
            walk.path = path
            if state.depth == walk.limit and is_complete(self.space, state):
                # an extra goal yields only what needs it (see spec_twin); a twin is counted apart
                if walk.goal == 0 or spec_twin(self.space, state) is None:
                    yield state
                else:
                    self.stats["twin"] = self.stats.get("twin", 0) + 1
            elif walk.nodes % HEARTBEAT == 0:
                yield None
        if state.depth >= walk.limit:
            return
        # an operator of an extra goal carries a weight, as every one of the spec's goal must (a
        # Cin -> Cout map needs one): a parameter-free Cin -> Cin map (a shift, a pooling, a
        # shuffle) is no stand-in for a learned layer; conv2d_same_channels has those
        kinds = None
        if walk.goal and state.depth == walk.limit - 1 and not any(step.kind in CONTRACTIONS for step in state.steps):
            kinds = CONTRACTIONS
        for index, (_, child) in enumerate(children(self.space, state, self.stats, walk.limit, kinds)):
            if not after:  # None (visit everything) or () (this node was the last visited)
                yield from self._walk(walk, child, (*path, index), None)
            elif index == after[0]:
                yield from self._walk(walk, child, (*path, index), after[1:] if len(after) > 1 else ())
            elif index > after[0]:
                yield from self._walk(walk, child, (*path, index), None)


def count_by_depth(space: Space) -> dict[int, int]:
    """The number of distinct canonical operators (by ``op.key``) at each depth.

    >>> from kdsl.search.space import Space
    >>> space = Space("matmul", "resnet18", coefficients={"K": [3]}, max_depth=4, caps={"Expand": 0})
    >>> count_by_depth(space)  # with Cin -> Cin operators (Cout = Cin on every layer) from depth 3
    {2: 1, 3: 3, 4: 21}
    """
    keys: dict[str, int] = {}
    for state in Enumeration(space).states():
        if state is None:
            continue
        for op in to_operators(space, state):
            keys.setdefault(op.key, state.depth)
    counts: dict[int, int] = {}
    for depth in keys.values():
        counts[depth] = counts.get(depth, 0) + 1
    return dict(sorted(counts.items()))
