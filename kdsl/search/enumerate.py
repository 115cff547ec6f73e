"""Exhaustive enumeration by iterative deepening: depth-first walks of every canonical partial
operator with a growing depth limit (1, 2, ..., the space's depth), each walk yielding only the
operators that finish exactly at its limit. So a short run returns the shallow operators first
(the pointwise conv at depth 2, conv2d at 6) instead of the first deep corner of the tree, and
each complete state is yielded exactly once. Re-walking the shallow levels costs little: the
tree grows by a large factor per level, and the shape distance prunes every walk against its own
limit (a node that cannot finish by the limit is not expanded).

The cursor is the current limit and the path of child indices of the last node visited in that
walk, so a run resumes where it stopped.

>>> from kdsl.search.space import Space
>>> space = Space("matmul", "resnet18", coefficients={"K": [3]}, max_depth=2, caps={"Shift": 0, "Expand": 0})
>>> walk = Enumeration(space)
>>> [state.depth for state in walk.states() if state is not None]
[2]
>>> walk.finished, walk.progress()["limit"]
(True, 2)
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from kdsl.search.space import Space
from kdsl.search.synthesis import State, children, is_complete, root, to_operators

__all__ = ["Enumeration", "count_by_depth"]

#: yield a heartbeat (None) this often, so that the driver can checkpoint and watch the clock
HEARTBEAT = 256


class Enumeration:
    """Iterative-deepening enumeration; ``progress`` (a dict) resumes it where a previous run
    stopped. A cursor saved by the earlier depth-first enumeration (no ``limit``) starts over from
    depth 1: the results store skips the operators it already holds."""

    name = "enumerate"

    def __init__(self, space: Space, seed: int = 0, progress: Mapping[str, Any] | None = None) -> None:
        progress = dict(progress or {})
        self.space = space
        legacy = "limit" not in progress
        self.limit = 1 if legacy else int(progress["limit"])
        after = None if legacy else progress.get("after")
        self.after: tuple[int, ...] | None = tuple(after) if after is not None else None
        self.nodes = int(progress.get("nodes", 0))
        self.finished = bool(progress.get("finished", False)) and not legacy
        self.path: tuple[int, ...] | None = self.after
        self.stats: dict[str, int] = {}

    def progress(self) -> dict[str, Any]:
        """The cursor: in the walk to depth ``limit``, every node up to ``after`` (pre-order) has
        been visited (and every walk to a smaller limit)."""
        return {
            "limit": self.limit,
            "after": list(self.path) if self.path is not None else None,
            "nodes": self.nodes,
            "finished": self.finished,
        }

    def states(self) -> Generator[State | None, object, None]:
        """Complete states (and ``None`` heartbeats), shallowest first, after the cursor."""
        if self.finished:
            return
        while True:
            yield from self._walk(root(self.space), (), self.after)
            if self.limit >= self.space.max_depth:
                break
            self.limit += 1
            self.after = self.path = None
        self.finished = True

    def _walk(self, state: State, path: tuple[int, ...], after: tuple[int, ...] | None) -> Generator:
        if after is None:
            self.nodes += 1
            self.path = path
            if state.depth == self.limit and is_complete(self.space, state):
                yield state
            elif self.nodes % HEARTBEAT == 0:
                yield None
        if state.depth >= self.limit:
            return
        for index, (_, child) in enumerate(children(self.space, state, self.stats, self.limit)):
            if not after:  # None (visit everything) or () (this node was the last visited)
                yield from self._walk(child, (*path, index), None)
            elif index == after[0]:
                yield from self._walk(child, (*path, index), after[1:] if len(after) > 1 else ())
            elif index > after[0]:
                yield from self._walk(child, (*path, index), None)


def count_by_depth(space: Space) -> dict[int, int]:
    """The number of distinct canonical operators (by ``op.key``) at each depth.

    >>> from kdsl.search.space import Space
    >>> count_by_depth(Space("matmul", "resnet18", coefficients={"K": [3]}, max_depth=4, caps={"Expand": 0}))
    {2: 1, 4: 9}
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
