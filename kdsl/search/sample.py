"""Random sampling: independent random rollouts from the empty partial operator.

Rollout ``i`` of seed ``s`` draws from its own generator, seeded with ``(s, i)``, so a run is
reproducible and resumes from its iteration counter alone. A rollout picks a random child at
each step; at a complete state it stops with probability ``stop`` (or when it has no children); at
a dead end it backs up and tries another child, within a budget (:func:`rollout`), and steers its
last steps by the shape distance.

>>> from kdsl.search.space import Space
>>> space = Space("matmul", "resnet18", max_depth=2, caps={"Shift": 0, "Expand": 0})
>>> sampler = Sampling(space, seed=1)
>>> from itertools import islice
>>> found = [s for s in islice(sampler.states(), 5) if s is not None]
>>> [state.depth for state in found], sampler.iteration
([2, 2, 2, 2, 2], 5)
"""

from __future__ import annotations

import random
from collections.abc import Generator, Mapping
from typing import Any

from kdsl.search.distance import state_distance
from kdsl.search.space import Space
from kdsl.search.synthesis import State, children, is_complete, root

__all__ = ["BACKTRACK_BUDGET", "Sampling", "rollout"]


#: How many children a steered rollout may enter in all (its first path and the backtracking).
BACKTRACK_BUDGET = 16


def rollout(
    space: Space,
    rng: random.Random,
    start: State | None = None,
    stop: float = 0.5,
    stats: dict | None = None,
    *,
    steer: bool = True,
) -> State | None:
    """One random rollout from ``start`` (default: the root); a complete state or None.

    A rollout picks a random child at each step; at a complete state it stops with probability
    ``stop``. With ``steer`` (the default) it is aimed at finishing: at a dead end (no child passes
    the rules, caps, allowances, masks, budgets and the shape distance: most failures, at any
    depth) it backs up and tries another child, entering at most :data:`BACKTRACK_BUDGET`
    children in all; once the steps left are at most one more than the shape distance (a lower
    bound on the steps still needed) it tries first the children that bring the distance down;
    and a walk that went on past a complete state and found nothing returns that state. Without
    it, a dead end fails (the plain rollout: about 1% of rollouts complete in ``kdsl bench search``)."""
    state = start if start is not None else root(space)
    if not steer:
        return _plain(space, rng, state, stop, stats)
    budget = [BACKTRACK_BUDGET]
    return _walk(space, rng, state, stop, stats, budget)


def _options(space: Space, state: State, stats: dict | None) -> list[State]:
    """The children of ``state`` (one more node visited in ``stats``)."""
    options = [child for _, child in children(space, state, stats)]
    if stats is not None:
        stats["nodes"] = stats.get("nodes", 0) + 1
    return options


def _walk(space: Space, rng: random.Random, state: State, stop: float, stats: dict | None, budget: list[int]):
    complete = is_complete(space, state)
    if complete and rng.random() < stop:
        return state
    options = _options(space, state, stats)
    rng.shuffle(options)
    if space.use_distance:
        options = _steered(space, state, options)
    for child in options:
        if budget[0] <= 0:
            break
        budget[0] -= 1
        found = _walk(space, rng, child, stop, stats, budget)
        if found is not None:
            return found
    return state if complete else None


def _plain(space: Space, rng: random.Random, state: State, stop: float, stats: dict | None) -> State | None:
    while True:
        complete = is_complete(space, state)
        if complete and rng.random() < stop:
            return state
        options = _options(space, state, stats)
        if not options:
            return state if complete else None
        state = rng.choice(options)


def _steered(space: Space, state: State, options: list[State]) -> list[State]:
    """When little slack is left, the children that bring the shape distance down first (in the
    order given), then the others."""
    distance = state_distance(space, state)
    if space.max_depth - state.depth > distance + 1:
        return options
    closer = [child for child in options if state_distance(space, child) < distance]
    return closer + [child for child in options if state_distance(space, child) >= distance]


class Sampling:
    """Random rollouts; ``progress`` holds the iteration counter."""

    name = "random"

    def __init__(
        self, space: Space, seed: int = 0, progress: Mapping[str, Any] | None = None, stop: float = 0.5
    ) -> None:
        progress = dict(progress or {})
        self.space = space
        self.seed = seed
        self.stop = stop
        self.iteration = int(progress.get("iteration", 0))
        self.failures = int(progress.get("failures", 0))
        self.finished = False
        self.stats: dict[str, int] = {}

    @property
    def nodes(self) -> int:
        return self.stats.get("nodes", 0)

    def progress(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "failures": self.failures}

    def states(self) -> Generator[State | None, object, None]:
        """Endless rollouts: a complete state, or None for a failed rollout."""
        while True:
            rng = random.Random(f"{self.seed}:{self.iteration}")
            state = rollout(self.space, rng, stop=self.stop, stats=self.stats)
            self.iteration += 1
            if state is None:
                self.failures += 1
            yield state
