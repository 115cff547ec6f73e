"""Random sampling: independent random rollouts from the empty partial operator.

Rollout ``i`` of seed ``s`` draws from its own generator, seeded with ``(s, i)``, so a run is
reproducible and resumes from its iteration counter alone. A rollout picks a uniformly random
child at each step; at a complete state it stops with probability ``stop`` (or when it has no
children); at a dead end it fails.

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

from kdsl.search.space import Space
from kdsl.search.synthesis import State, children, is_complete, root

__all__ = ["Sampling", "rollout"]


def rollout(
    space: Space, rng: random.Random, start: State | None = None, stop: float = 0.5, stats: dict | None = None
) -> State | None:
    """One random rollout from ``start`` (default: the root); a complete state or None."""
    state = start if start is not None else root(space)
    while True:
        complete = is_complete(space, state)
        if complete and rng.random() < stop:
            return state
        options = [child for _, child in children(space, state, stats)]
        if stats is not None:
            stats["nodes"] = stats.get("nodes", 0) + 1
        if not options:
            return state if complete else None
        state = rng.choice(options)


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
