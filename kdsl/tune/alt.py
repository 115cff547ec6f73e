"""ALT-style joint layout and loop tuning (Xu et al., EuroSys 2023), over kdsl's schedule space.

Layouts come from a pruned template: every input, weight and intermediate tensor keeps its dim order and
may tile one dim by 4-64 with the tile moved last (``tiled channel last``; the space's ``layout.T.tile``).
*Cross exploration* (the first ``explore`` share of the budget): for one candidate layout at a time, a short
loop tuning (OpEvo with the layout pinned, ``per_layout`` trials) measures what that layout allows, and the
best latency is fed back to the layout search, whose next candidates are one-tensor changes of the best
layouts so far. Then *loop-only tuning*: OpEvo on the best layout for the rest of the budget.

>>> pruned_choices(("none", "0:4", "0:8", "1:16", "1:128"))
['none', '0:8', '1:16']
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from kdsl.codegen.tvm.schedule_space import Categorical, Space, config_key
from kdsl.tune.opevo import OpEvo
from kdsl.tune.records import Record

#: Tile factors of ALT's pruned layout template.
TEMPLATE_FACTORS = (8, 16, 32)


def pruned_choices(choices: Sequence[str]) -> list[str]:
    """The layout tile choices of the pruned template: none, or a factor in :data:`TEMPLATE_FACTORS`."""
    return [c for c in choices if c == "none" or int(c.split(":")[1]) in TEMPLATE_FACTORS]


class Alt:
    """Cross exploration of layouts with short loop tunings, then loop tuning on the best layout."""

    name = "alt"

    def __init__(
        self,
        space: Space,
        history: Sequence[Record] = (),
        *,
        seed: int = 0,
        per_layout: int = 4,
        layouts: int = 6,
        q: float = 0.5,
    ) -> None:
        self.space = space
        self.rng = random.Random(seed)
        self.seed = seed
        self.per_layout = per_layout
        self.layouts = layouts
        self.q = q
        self.history = list(history)
        self.seen = {r.key for r in history}
        heuristic = space.heuristic()
        self.start = heuristic
        self.layout_names = [n for n in space.parameters if n.startswith("layout.")]
        self.template: dict[str, list[Any]] = {}
        for name in self.layout_names:
            param = space.parameters[name]
            if name.endswith(".tile") and isinstance(param, Categorical):
                self.template[name] = pruned_choices(param.choices)
        # layouts tried: key -> (layout, best latency)
        self.tried: dict[str, tuple[dict[str, Any], float]] = {}
        for record in history:
            layout = self._layout_of(record.config)
            key = config_key(layout)
            best = self.tried.get(key, (layout, float("inf")))[1]
            if record.latency is not None:
                best = min(best, record.latency)
            self.tried[key] = (layout, best)
        self.current: dict[str, Any] | None = None
        self.used = 0  # trials proposed for the current layout
        self.inner: OpEvo | None = None
        self.final = False

    def _layout_of(self, config: dict[str, Any]) -> dict[str, Any]:
        return {n: tuple(v) if isinstance(v, list) else v for n, v in config.items() if n in self.layout_names}

    def _next_layout(self) -> dict[str, Any] | None:
        base = self._layout_of(self.start)
        if config_key(base) not in self.tried:
            return base
        ranked = sorted(self.tried.values(), key=lambda lb: lb[1])
        for _ in range(100):
            layout = dict(self.rng.choice(ranked[:3])[0])
            name = self.rng.choice(list(self.template)) if self.template else None
            if name is None:
                return None
            layout[name] = self.rng.choice(self.template[name])
            if config_key(layout) not in self.tried:
                return layout
        return None

    def _switch(self, layout: dict[str, Any]) -> None:
        self.current = layout
        self.tried.setdefault(config_key(layout), (layout, float("inf")))
        self.used = 0
        start = {**self.start, **layout}
        history = [r for r in self.history if self._layout_of(r.config) == layout]
        self.inner = OpEvo(
            self.space, history, seed=self.rng.randrange(1 << 30), q=self.q, fixed=layout, start=start, seen=self.seen
        )

    def propose(self, n: int) -> list[dict[str, Any]]:
        if self.final:
            assert self.inner is not None
            return self.inner.propose(n)
        if self.inner is None or self.used >= self.per_layout:
            exploring = len(self.tried) < self.layouts
            layout = self._next_layout() if exploring else None
            if layout is None:  # loop-only tuning on the best layout
                best = min(self.tried.values(), key=lambda lb: lb[1])[0]
                self._switch(best)
                self.final = True
                assert self.inner is not None
                return self.inner.propose(n)
            self._switch(layout)
        assert self.inner is not None
        out = self.inner.propose(min(n, self.per_layout - self.used))
        self.used += len(out)
        if not out:
            self.used = self.per_layout
        return out

    def update(self, records: Sequence[Record]) -> None:
        self.history.extend(records)
        for record in records:
            self.seen.add(record.key)
            key = config_key(self._layout_of(record.config))
            layout, best = self.tried.get(key, (self._layout_of(record.config), float("inf")))
            if record.latency is not None:
                best = min(best, record.latency)
            self.tried[key] = (layout, best)
        if self.inner is not None:
            self.inner.update(records)
