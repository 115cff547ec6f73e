"""ALT-style joint layout and loop tuning (Xu et al., EuroSys 2023), over kdsl's schedule space.

Layouts come from a pruned template: every input, weight and intermediate tensor keeps its dim order and
may tile one dim by 4-64 with the tile moved last (``tiled channel last``; the space's ``layout.T.tile``);
a data input may also take one dim last (``channels last``: the packing that a vector axis's gathers need,
:func:`moved_last`). The loop tuning moves every other parameter of the space (cache blocking ``S.block``,
partial sums in lanes ``S.lanes``, ``S.spatial_below``, the vector axis and the tiles).
*Cross exploration* (the first ``explore`` share of the budget): for one candidate layout at a time, a short
loop tuning (OpEvo with the layout pinned, ``per_layout`` trials) measures what that layout allows, and the
best latency is fed back to the layout search, whose next candidates are one-tensor changes of the best
layouts so far. Then *loop-only tuning*: OpEvo on the best layout for the rest of the budget.

*The cost model* (ALT §5.2.3; :class:`~kdsl.tune.cost_model.CostModel`, boosted trees refitted on the
measured records every round): once ``min_records`` configurations have a latency, every round ranks a
pool of ``pool`` candidates and measures the top of it. For the layout search the candidates are the
one-tensor changes of the three best layouts, each scored by the model with the best measured loop
configurations under it; for loop tuning (under the current layout) they are every one-step neighbour
of the best configuration, q-random-walk mutations of the best few, and random ones. A share ``explore``
of each round is drawn at random from the rest of the pool (a model trained on tens of points is wrong
in places it has not seen). Every candidate is repaired where its parameters rule each other out
(:meth:`~kdsl.codegen.tvm.schedule_space.ScheduleSpace.repair`) and every proposed one is checked to
apply. ALT measures the top 8 of 128-point batches (§7); the pool here is larger because a candidate
costs a model evaluation, not a measurement.

>>> pruned_choices(("none", "0:4", "0:8", "1:16", "1:128"))
['none', '0:8', '1:16']
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from kdsl.codegen.tvm.parameters import Categorical, config_key
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.tune.cost_model import CostModel, have_sklearn
from kdsl.tune.gensor import plausible
from kdsl.tune.opevo import OpEvo, mutate
from kdsl.tune.records import Record, TuneError, is_integer, is_number

#: Tile factors of ALT's pruned layout template.
TEMPLATE_FACTORS = (8, 16, 32)
#: Measured configurations the cost model needs before it ranks candidates (fewer: the search without it).
MIN_RECORDS = 8
#: Candidates the cost model ranks per round.
POOL = 512
#: Best measured configurations whose mutations fill the pool (ALT's loop actors walk from the best points).
BASES = 4


def pruned_choices(choices: Sequence[str]) -> list[str]:
    """The layout tile choices of the pruned template: none, or a factor in :data:`TEMPLATE_FACTORS`."""
    return [c for c in choices if c == "none" or int(c.split(":")[1]) in TEMPLATE_FACTORS]


def moved_last(n: int, start: Sequence[int]) -> list[tuple[int, ...]]:
    """The dim orders of the pruned template for an ``n``-dim data input: its own, ``start`` (the rule-based
    schedule's) and each dim moved last (``channels last``: ``[N, C, H, W]`` as ``[N, H, W, C]``).

    >>> moved_last(3, (0, 1, 2))
    [(0, 1, 2), (1, 2, 0), (0, 2, 1)]
    """
    identity = tuple(range(n))
    orders = [identity, tuple(start), *(tuple(d for d in identity if d != last) + (last,) for last in range(n - 1))]
    return list(dict.fromkeys(orders))


def check_alt_options(
    per_layout: int, layouts: int, q: float, model: bool, min_records: int, pool: int, explore: float
) -> None:
    """Refuse ALT options out of range (a :class:`TuneError` naming the option); ``kdsl tune`` calls it
    (through :func:`kdsl.tune.driver.check_options`) before anything is compiled or measured.

    >>> check_alt_options(4, 6, 0.5, False, 8, 0, 0.125)
    Traceback (most recent call last):
    ...
    kdsl.tune.records.TuneError: alt: pool must be a positive integer, got 0
    """
    if model and not have_sklearn():
        raise TuneError("alt's cost model needs scikit-learn: pip install 'kdsl[search]' (or model=false)")
    for option, value, least in (("per_layout", per_layout, 1), ("layouts", layouts, 1), ("pool", pool, 1)):
        if not is_integer(value) or value < least:
            raise TuneError(f"alt: {option} must be a positive integer, got {value!r}")
    if not is_integer(min_records) or min_records < 2:
        raise TuneError(f"alt: min_records must be an integer of at least 2 (a model needs 2), got {min_records!r}")
    if not is_number(explore) or not 0 <= explore <= 1:
        raise TuneError(f"alt: explore must be in [0, 1], got {explore!r}")
    if not is_number(q) or not 0 <= q < 1:
        raise TuneError(f"alt: q must be in [0, 1), got {q!r}")


class Alt:
    """Cross exploration of layouts with short loop tunings, then loop tuning on the best layout; candidates
    ranked by a learned cost model once ``min_records`` configurations are measured (``model=False``: never)."""

    name = "alt"

    def __init__(
        self,
        space: ScheduleSpace,
        history: Sequence[Record] = (),
        *,
        seed: int = 0,
        per_layout: int = 4,
        layouts: int = 6,
        q: float = 0.5,
        model: bool = True,
        min_records: int = MIN_RECORDS,
        pool: int = POOL,
        explore: float = 0.125,
    ) -> None:
        check_alt_options(per_layout, layouts, q, model, min_records, pool, explore)
        self.space = space
        self.rng = random.Random(seed)
        self.seed = seed
        self.per_layout = per_layout
        self.layouts = layouts
        self.q = q
        self.min_records = min_records
        self.pool = pool
        self.explore = explore
        self.cost = CostModel(space, seed) if model else None
        self.fitted = -1  # records the model was last fitted on
        self.history = list(history)
        self.seen = {r.key for r in history}
        heuristic = space.heuristic()
        self.start = heuristic
        self.layout_names = [n for n in space.parameters if n.startswith("layout.")]
        self.loops = {n: p for n, p in space.parameters.items() if n not in self.layout_names}
        self.template: dict[str, list[Any]] = {}
        for name in self.layout_names:
            param = space.parameters[name]
            if name.endswith(".tile") and isinstance(param, Categorical):
                self.template[name] = pruned_choices(param.choices)
            elif name.endswith(".perm") and space.tensor_named(name.split(".")[1]).kind == "input":
                # a data input packed with one dim last (channels last: the vector axis's gathers made loads)
                self.template[name] = moved_last(param.n, heuristic[name])
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

    def _layout_of(self, config: Mapping[str, Any]) -> dict[str, Any]:
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
        if self._model_ready():
            return self._propose_ranked(n)
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

    # -- the cost model ------------------------------------------------------------------------------

    def _measured(self) -> list[Record]:
        """The records with a latency, fastest first (ties in the order they were measured)."""
        return sorted((r for r in self.history if r.latency is not None), key=lambda r: r.latency or 0.0)

    def _model_ready(self) -> bool:
        """Whether the cost model ranks this round's candidates: enough measured records (refitted on
        every new record, as ALT trains its model online)."""
        if self.cost is None or len(self._measured()) < self.min_records:
            return False
        if self.fitted != len(self.history):
            self.cost.fit(self.history)
            self.fitted = len(self.history)
        return self.cost.trained

    def _propose_ranked(self, n: int) -> list[dict[str, Any]]:
        """``n`` configurations ranked by the model, across layouts as the cross exploration moves on
        (``per_layout`` each), then under the best layout."""
        out: list[dict[str, Any]] = []
        while len(out) < n:
            if not self.final and (self.current is None or self.used >= self.per_layout):
                layout = self._ranked_layout() if len(self.tried) < self.layouts else None
                if layout is None:  # loop-only tuning on the best layout
                    layout = min(self.tried.values(), key=lambda lb: lb[1])[0]
                    self.final = True
                self.current, self.used, self.inner = layout, 0, None
                self.tried.setdefault(config_key(layout), (layout, float("inf")))
            assert self.current is not None
            room = n - len(out) if self.final else min(n - len(out), self.per_layout - self.used)
            batch = self._ranked_configs(self.current, room, out)
            out += batch
            self.used += len(batch)
            if len(batch) < room:
                if self.final:
                    break
                self.used = self.per_layout  # this layout yields no more: the next one
        return out

    def _ranked_layout(self) -> dict[str, Any] | None:
        """The untried one-tensor change of the three best layouts that the model expects fastest with the
        best measured loop configurations (at random with probability ``explore``)."""
        ranked = sorted(self.tried.values(), key=lambda lb: lb[1])[:3]
        candidates: dict[str, dict[str, Any]] = {}
        for layout, _ in ranked:
            for name, choices in self.template.items():
                for choice in choices:
                    changed = {**layout, name: choice}
                    key = config_key(changed)
                    if key not in self.tried:
                        candidates.setdefault(key, changed)
        if not candidates:
            return None
        layouts = list(candidates.values())
        if self.rng.random() < self.explore:
            return self.rng.choice(layouts)
        loops = [self._loops_of(r.config) for r in self._measured()[:3]]
        assert self.cost is not None
        scores = self.cost.predict([{**loop, **layout} for layout in layouts for loop in loops])
        best = [min(scores[i * len(loops) : (i + 1) * len(loops)]) for i in range(len(layouts))]
        return layouts[min(range(len(layouts)), key=lambda i: (best[i], i))]

    def _loops_of(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {n: tuple(v) if isinstance(v, list) else v for n, v in config.items() if n in self.loops}

    def _ranked_configs(
        self, layout: Mapping[str, Any], k: int, taken: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Up to ``k`` new configurations under ``layout`` that apply: the model's top of a pool of
        candidates, and a share ``explore`` drawn at random from the rest of it."""
        measured = self._measured()
        bases = [self._loops_of(r.config) for r in measured if self._layout_of(r.config) == layout][:BASES]
        for record in measured:  # a layout with few measurements borrows the best loops measured elsewhere
            if len(bases) >= BASES:
                break
            loops = self._loops_of(record.config)
            if loops not in bases:
                bases.append(loops)
        bases = [{**b, **layout} for b in bases] or [{**self.start, **layout}]
        skip = self.seen | {config_key(c) for c in taken}
        pool: dict[str, dict[str, Any]] = {}

        def add(config: dict[str, Any]) -> None:
            config = self.space.repair(config, keep=layout)  # an S.block its mutated tiles rule out, ..
            key = config_key(config)
            if key not in skip and key not in pool and plausible(self.space, config):
                pool[key] = config

        for name, param in self.loops.items():  # every one-step neighbour of the best
            for value in param.neighbours(bases[0][name]):
                add({**bases[0], name: value})
        # about one, two or four parameters walked per mutation (OpEvo walks two): the better configurations
        # are often several changes away (conv2d's best at conv3_x changed four parameters of the start)
        rates = [min(1.0, walks / max(1, len(self.loops))) for walks in (1.0, 2.0, 4.0)]
        for attempt in range(4 * self.pool):
            if len(pool) >= self.pool * 3 // 4:
                break
            rate = rates[attempt % len(rates)]
            add({**mutate(self.loops, self.rng.choice(bases), self.q, self.rng, rate), **layout})
        for _ in range(2 * self.pool):
            if len(pool) >= self.pool:
                break
            add({**self.space.random(self.rng), **layout})
        configs = list(pool.values())
        if not configs:
            return []
        assert self.cost is not None
        scores = self.cost.predict(configs)
        order = sorted(range(len(configs)), key=lambda i: (scores[i], i))
        explore = math.floor(k * self.explore + self.rng.random())  # the share, rounded at random
        chosen: list[int] = []
        checked: set[int] = set()
        for i in order:  # the model's top
            if len(chosen) >= k - explore or len(checked) >= 6 * k:
                break
            checked.add(i)
            if self._applies(configs[i]):
                chosen.append(i)
        rest = [i for i in order if i not in checked]
        self.rng.shuffle(rest)
        for i in rest:  # exploration, and the places the space rejected in the model's top
            if len(chosen) >= k or len(checked) >= 12 * k:
                break
            checked.add(i)
            if self._applies(configs[i]):
                chosen.append(i)
        out = [configs[i] for i in chosen]
        self.seen |= {config_key(c) for c in out}
        return out

    def _applies(self, config: Mapping[str, Any]) -> bool:
        return self.space.rejection(config) is None
