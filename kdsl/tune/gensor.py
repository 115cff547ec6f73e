"""Gensor (2025): construction by a Markov walk over schedules, level by level of the memory hierarchy.

States are configurations of the schedule space; actions are its single-parameter steps. Gensor's
three kinds of action each have a benefit formula of the paper's (§ IV-B), normalized into transition
probabilities and drawn by roulette (§ IV-C):

* **tiling** (and inverse tiling): a prime factor moves between two levels of one axis's tile;
  benefit (formula 1) = the decrease in the traffic into the current memory level over the increase in
  the tile's footprint there (:func:`tiling_benefit`); a move whose footprint exceeds the level's
  capacity has probability 0 (the paper's memory check);
* **caching**: move on to the next memory level (at the register level: accumulate in a ``local``
  tile); benefit (formula 2) = the time to exchange the tile's data with the next level over the time
  with the current one, from latency and bandwidth (:func:`caching_benefit`); its probability is
  multiplied by ``1 / T`` and ``T`` halves at every step, so the walk moves on and terminates;
* **thread-level** (the paper's virtual threads, formula 3: bank conflicts of a GPU tile): a CPU has no
  shared-memory banks; its analogue is the balance of the parallel chunks over the cores
  (:func:`parallel_benefit`), a factor of every tiling move (growing a tile takes chunks away).

The levels, in the order the construction visits them (:data:`LEVELS`), and where each lives in the
space's ``S.tile.<axis>`` factorizations ((outer, middle, inner) for a spatial axis, (outer, inner) for a
reduction): ``register`` -- the inner spatial tiles, capacity the machine's accumulator registers
(:meth:`~kdsl.runtime.cpu.Machine.accumulators`), the vector axis counted in vectors;
``L1`` -- the inner reduction tiles (the slice of the reduction streamed through the register tile),
capacity half the L1 data cache; ``L2`` -- the middle spatial tiles (one core's block of the output,
the fused outer tiles being the parallel chunks), capacity half the L2 cache.

The paper's walk starts from the unscheduled program and its caching action moves the data "into faster,
higher-level memory, closer to the computing units": it tiles for the slowest level first and ends at
the fastest. This one goes the other way, register tile first: in our space's nest an L1 slice's
footprint depends on the register tile below it, and the register file is the one capacity known
exactly. The temperature restarts at each level (the paper halves it across the whole walk; as the
caching weight doubles per step, the later levels would get almost no step). Our copy of the paper
lost its formulas' symbols: the forms above follow its prose. Half the constructions also take the
loop order that the levels describe (:func:`blocked_order`), the others keep the start's.

The forms the paper's actions do not cover -- which axis fills the vector lanes, whether a data input it
gathers from is packed, partial sums in lanes, cache blocking (``S.block``) -- are chosen from the same
model by :mod:`kdsl.tune.gensor_forms`: every vector form of a stage starts constructions
(:func:`constructions`), and each built schedule gets the block of largest benefit at L2 and L3 for its
own tiles and layer.

The constructions rank by :func:`estimate`, an analytic time of this CPU: per reduction stage the
largest of its compute time (FMA peak scaled by vector, register-tile and parallel efficiency) and its
traffic at each cache level, with the peak, cache sizes and bandwidths of the target machine
(:meth:`Model.of`); measurements, as they arrive, scale its compute and memory terms
(:func:`calibrate`). :class:`Gensor` proposes the rule-based start, then the constructions and the
annealed walks' best-estimated distinct schedules, and walks again from each new best measured one.

>>> from kdsl.runtime.cpu import from_features
>>> machine = from_features("haswell", {"avx2", "fma"}, cores=2, ghz=3.0)
>>> model = Model.of(machine)
>>> model.lanes, model.registers, model.fma_per_cycle, model.accumulators == machine.accumulators()
(8, 16, 2, True)
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

from kdsl.codegen.tvm.parameters import config_key, primes
from kdsl.codegen.tvm.schedule_apply import MAX_LOCAL
from kdsl.codegen.tvm.schedule_space import ScheduleSpace, neighbours
from kdsl.codegen.tvm.space_rules import conflicts
from kdsl.lang.errors import LoweringError
from kdsl.tune.gensor_forms import finish, form_starts
from kdsl.tune.gensor_model import (
    CACHE_START,
    LEVELS,
    Model,
    caching_benefit,
    calibrate,
    capacity,
    estimate,
    level_cost,
    parallel_benefit,
    parallel_chunks,
    space_model,
    tiling_benefit,
    vector_aligned,
)
from kdsl.tune.records import Record


def _moves(stage: Any, config: Mapping[str, Any], level: str) -> list[dict[str, Any]]:
    """The tiling and inverse tiling actions of ``level``: a prime factor moved between its two slots
    (register: spatial outer <-> inner; L1: reduction outer <-> inner; L2: spatial outer <-> middle)."""
    nspatial = len(stage.spatial)
    pairs = {"register": (0, 2), "L1": (0, 1), "L2": (0, 1)}[level]
    out = []
    for k, (axis, extent) in enumerate(stage.spatial + stage.reduced):
        name = f"{stage.name}.tile.{axis}"
        if extent <= 1 or name not in config or (level == "L1") == (k < nspatial):
            continue
        value = config[name]
        for src, dst in (pairs, pairs[::-1]):
            for p in sorted(set(primes(value[src]))):
                moved = list(value)
                moved[src] //= p
                moved[dst] *= p
                out.append({**config, name: tuple(moved)})
    return out


def transitions(
    space: ScheduleSpace, stage: Any, config: Mapping[str, Any], level: str, temperature: float, model: Model
) -> list[tuple[float, dict[str, Any] | None]]:
    """The actions at ``level`` with their unnormalized probabilities: every tiling move (formula 1,
    times the thread-level factor; 0 where the tile outgrows the level) and the caching action
    (``None``: formula 2, times ``CACHE_START / temperature``; 0 while the vector tile is ragged)."""
    traffic, footprint = level_cost(space, stage, config, level, model)
    chunks = parallel_chunks(stage, config)
    out: list[tuple[float, dict[str, Any] | None]] = []
    for move in _moves(stage, config, level):
        if not capacity(space, stage, move, level, model):
            out.append((0.0, move))
            continue
        after, grown = level_cost(space, stage, move, level, model)
        benefit = tiling_benefit(traffic, after, footprint, grown)
        benefit *= parallel_benefit(chunks, parallel_chunks(stage, move), model.cores)
        out.append((benefit, move))
    cache = 0.0
    if level != "register" or vector_aligned(stage, config, model):
        nbytes = footprint * model.lanes * 4 if level == "register" else footprint
        cache = caching_benefit(model, level, nbytes) * CACHE_START / temperature
    out.append((cache, None))
    return out


def build(
    space: ScheduleSpace,
    start: Mapping[str, Any],
    rng: random.Random,
    model: Model | None = None,
    steps: int = 24,
    blocked: bool = False,
) -> dict[str, Any]:
    """One construction (Algorithm 1): from ``start``, each reduction stage's tile grown level by level
    (:data:`LEVELS`) by roulette over :func:`transitions`, the temperature halving at every step; the
    caching action moves on to the next level (at the register level it sets ``S.cache = "local"``).

    With ``blocked``, the loop order is the one the levels describe (:func:`blocked_order`): the outer
    reduction tiles outside the middle spatial tiles, the inner reduction tiles below all of them, so
    that the L2 block is swept once per L1 slice; else the start's order stays (the rule-based one keeps
    short windows unrolled in place)."""
    model = model or space_model(space)
    state = dict(start)
    for stage in space.stages:
        if stage.kind != "reduce" or f"{stage.name}.cache" not in space.parameters:
            continue
        if state.get(f"{stage.name}.lanes") is True or state.get(f"{stage.name}.rfactor") is True:
            continue  # row reductions in lanes, split reductions: not tiled
        if blocked:
            state.update(blocked_order(space, stage))
        for level in LEVELS:
            temperature = 1.0
            for _ in range(steps):
                actions = transitions(space, stage, state, level, temperature, model)
                weights = [w for w, _ in actions]
                if sum(weights) <= 0:
                    break
                _, chosen = actions[rng.choices(range(len(actions)), weights=weights)[0]]
                if chosen is None:
                    break
                state = chosen
                temperature /= 2
            if level == "register":
                state[f"{stage.name}.cache"] = "local"
    return state


def blocked_order(space: ScheduleSpace, stage: Any) -> dict[str, Any]:
    """The ``S.order`` and ``S.reductions`` of the levels' nest: the middle loops of the reductions
    first, then those of the spatial axes, and the inner reduction tiles below them all (``split``).

    >>> from kdsl.lang import library
    >>> from kdsl.codegen.tvm import lower
    >>> from kdsl.runtime.cpu import from_features
    >>> space = ScheduleSpace(lower(library.load("matmul"), {"M": 8, "Cin": 8, "Cout": 8}),
    ...               machine=from_features("x", {"avx2"}, cores=1, ghz=1.0))
    >>> blocked_order(space, space.stages[0])
    {'stage0.order': (2, 0, 1), 'stage0.reductions': 'split'}
    """
    out: dict[str, Any] = {}
    nspatial = len(stage.spatial)
    middle = [k for k, (_, e) in enumerate(stage.spatial + stage.reduced) if e > 1]
    if f"{stage.name}.order" in space.parameters:
        out[f"{stage.name}.order"] = tuple(
            [i for i, k in enumerate(middle) if k >= nspatial] + [i for i, k in enumerate(middle) if k < nspatial]
        )
    if f"{stage.name}.reductions" in space.parameters:
        out[f"{stage.name}.reductions"] = "split"
    return out


# ------------------------------------------------------------------------------------------------
# The walks and the tuner
# ------------------------------------------------------------------------------------------------


def constructions(
    space: ScheduleSpace,
    base: Mapping[str, Any],
    rng: random.Random,
    model: Model | None = None,
    count: int = 24,
    forms: bool = True,
) -> list[tuple[float, dict[str, Any]]]:
    """``count`` level-by-level constructions (:func:`build`) from ``base``'s choices with its tiles undone,
    completed by :func:`~kdsl.tune.gensor_forms.finish` (weight packing by the built vector tile, K and cache
    blocking), with their estimates, best first; those the space's rules refuse are left out. With ``forms``,
    the starts are every vector form of the stages (:func:`~kdsl.tune.gensor_forms.form_starts`: ``base``'s
    first), taken in turn; half of each form's constructions take the levels' loop order
    (:func:`blocked_order`), the others keep the start's.
    Without, every construction starts from ``base``'s form and keeps its loop order.

    >>> from kdsl.lang import library
    >>> from kdsl.codegen.tvm import lower
    >>> from kdsl.runtime.cpu import from_features
    >>> space = ScheduleSpace(lower(library.load("matmul"), {"M": 32, "Cin": 32, "Cout": 32}),
    ...               machine=from_features("x", {"avx2", "fma"}, cores=2, ghz=3.0))
    >>> ranked = constructions(space, space.heuristic(), random.Random(0), count=4)
    >>> len(ranked), ranked[0][0] <= ranked[-1][0]
    (4, True)
    """
    model = model or space_model(space)
    starts = form_starts(space, untiled(space, base)) if forms else [untiled(space, base)]
    built = []
    for i in range(count):
        blocked = forms and (i // len(starts)) % 2 == 1
        config = finish(space, build(space, starts[i % len(starts)], rng, model, blocked=blocked), model)
        if conflicts(space, config):  # refused by the space: not a candidate (the tuner would skip it unmeasured)
            continue
        built.append((estimate(space, config, model), i % len(starts), config))
    # equal estimates go to base's form: the model ties matmul's two vector axes (M with the data input
    # transposed, Cout with the weight in panels), and the M form measured 2-4x slower (GMM 1024^3, contended)
    built.sort(key=lambda ecc: (ecc[0], ecc[1]))
    return [(cost, config) for cost, _, config in built]


def plausible(space: ScheduleSpace, config: Mapping[str, Any], model: Model | None = None) -> bool:
    """Cheap checks the walk applies before the model: what the space's own rules refuse
    (:func:`~kdsl.codegen.tvm.space_rules.conflicts`: an ``S.block`` its tiles do not divide, a local
    accumulator over the limit, a copy folded into a write-back without one, ..), and the construction's
    memory check at the register level (:func:`capacity`: a register tile that spills, or a vector tile
    of more than :data:`~kdsl.codegen.tvm.schedule_apply.MAX_VECTORS` vectors, measured up to 10x
    slower than the model said on matmul 512x1024x1024)."""
    if conflicts(space, config):
        return False
    model = model or space_model(space)
    for stage in space.stages:
        s = stage.name
        if stage.kind == "reduce" and config.get(f"{s}.cache") == "local":
            # conflicts bounds a tiled stage's accumulator; this also bounds the register tile of a stage
            # that S.rfactor, S.lanes or S.attach schedule otherwise
            tile = prod(config.get(f"{s}.tile.{a}", (e, 1, 1))[2] for a, e in stage.spatial)
            if tile > MAX_LOCAL or not capacity(space, stage, config, "register", model):
                return False
    return True


def walk(
    space: ScheduleSpace,
    start: Mapping[str, Any],
    rng: random.Random,
    steps: int = 300,
    t0: float = 0.5,
    t1: float = 0.02,
    sample: int = 48,
    model: Model | None = None,
) -> list[tuple[float, dict[str, Any]]]:
    """An annealed Markov walk from ``start`` over every parameter of the space (not only the tiles):
    every visited state with its estimated time."""
    model = model or space_model(space)
    state = dict(start)
    cost = estimate(space, state, model)
    visited = [(cost, dict(state))]
    for step in range(steps):
        temperature = t0 * (t1 / t0) ** (step / max(1, steps - 1))
        options = list(neighbours(space, state))
        if len(options) > sample:
            options = rng.sample(options, sample)
        options = [o for o in options if plausible(space, o, model)]
        if not options:
            break
        costs = [estimate(space, o, model) for o in options]
        logits = [-(math.log(c) - math.log(cost)) / temperature for c in costs]
        top = max(logits)
        weights = [math.exp(v - top) for v in logits]
        i = rng.choices(range(len(options)), weights=weights)[0]
        state, cost = options[i], costs[i]
        visited.append((cost, dict(state)))
    return visited


def identity(space: ScheduleSpace) -> dict[str, Any]:
    """The unscheduled program as a configuration: nothing tiled, no cache, no layout change."""
    config = {name: space.identity_value(name) for name in space.parameters}
    for name in config:
        if name.endswith(".cache"):
            config[name] = "none"
        if name.endswith(".inline") or name.endswith(".unroll_tile"):
            # a branching kernel's element-wise stage chooses among names: "none" is its own pass
            config[name] = False if False in space.parameters[name].choices else "none"
    return config


def untiled(space: ScheduleSpace, config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with every reduction stage's tiles and cache as in the unscheduled program: the start of
    a construction, keeping the other choices (vector axis, layouts, unrolling, ...)."""
    base = identity(space)
    out = dict(config)
    for stage in space.stages:
        if stage.kind != "reduce":
            continue
        for name in space.parameters:
            if name.startswith(f"{stage.name}.tile.") or name == f"{stage.name}.cache":
                out[name] = base[name]
    return out


def signature(space: ScheduleSpace, config: Mapping[str, Any]) -> str:
    """What tells two proposals apart beyond a near-copy: the reduction stages' L2 and register tiles
    (middle and inner spatial tiles) and inner reduction tiles, vector axes, caches, ``S.reductions``,
    ``S.block``, ``S.rblock``, ``S.lanes``, ``S.spatial_below`` and ``S.prefetch``, and which tensors are packed or
    permuted (not the outer tiles, the loop order, unrolling, nor the layout tile's factor: matmul's walks proposed
    the same schedule with its input packed by 4, 8, 16 and 32, all within noise of each other)."""
    reduce = {s.name for s in space.stages if s.kind == "reduce"}
    kept: dict[str, Any] = {}
    for name, value in config.items():
        if ".tile." in name and name.split(".tile.")[0] in reduce:
            kept[name] = tuple(value)[1:]
        elif name.endswith(
            (".vector", ".cache", ".reductions", ".block", ".rblock", ".lanes", ".spatial_below", ".prefetch")
        ):
            kept[name] = value
        elif name.startswith("layout.") and name.endswith(".tile"):
            kept[name] = value != "none"
        elif name.startswith("layout.") and name.endswith(".perm"):
            kept[name] = tuple(value) != tuple(sorted(value))  # a permuted (packed) tensor
    return config_key(kept)


def steps_from(space: ScheduleSpace, config: Mapping[str, Any], model: Model | None = None) -> list[dict[str, Any]]:
    """The construction's tiling moves from ``config`` at every level of every reduction stage that pass
    the memory check (:func:`capacity`) and keep a chunk per core: the states one step of the Markov
    chain away from it."""
    model = model or space_model(space)
    out = []
    for stage in space.stages:
        if stage.kind != "reduce" or config.get(f"{stage.name}.cache") != "local":
            continue
        chunks = parallel_chunks(stage, config)
        for level in LEVELS:
            for move in _moves(stage, config, level):
                fits = all(capacity(space, stage, move, lv, model) for lv in LEVELS)
                if fits and parallel_benefit(chunks, parallel_chunks(stage, move), model.cores) > 0:
                    out.append(move)
    return out


def _diverse(
    space: ScheduleSpace, ranked: Sequence[tuple[float, dict[str, Any]]]
) -> list[tuple[float, dict[str, Any]]]:
    """``ranked`` with one state per :func:`signature` first (in order), then the rest: a walk's best
    states are near-copies of one, and a batch of them measures one schedule several times over."""
    first, rest, seen = [], [], set()
    for cost, config in ranked:
        sig = signature(space, config)
        (rest if sig in seen else first).append((cost, config))
        seen.add(sig)
    return first + rest


class Gensor:
    """Proposes the rule-based start, then the best-estimated distinct schedules of the level-by-level
    constructions and of annealed walks; walks again from each new best measured schedule, with the
    model calibrated on the measurements so far."""

    name = "gensor"

    def __init__(
        self,
        space: ScheduleSpace,
        history: Sequence[Record] = (),
        *,
        seed: int = 0,
        walks: int = 3,
        steps: int = 300,
        constructions: int = 24,
    ) -> None:
        self.space = space
        self.rng = random.Random(seed)
        self.seen = {r.key for r in history}
        self.walks = walks
        self.steps = steps
        self.constructions = constructions
        self.records: list[Record] = list(history)
        self.model = calibrate(space, space_model(space), self.records)
        self.pool: list[tuple[float, dict[str, Any]]] = []
        self.best_measured: tuple[float, dict[str, Any]] | None = None
        for record in history:
            if record.latency is not None and (self.best_measured is None or record.latency < self.best_measured[0]):
                self.best_measured = (record.latency, record.config)

    def construct(self) -> None:
        """Fill the pool. Before any measurement: the rule-based schedule first (the model ranks it below
        states that measure up to 2x slower: conv2d conv3_x, 2.1 ms picks against 1.1 ms), then, in the
        order of their estimates and one per :func:`signature` first, the level-by-level constructions
        (:func:`constructions`) from every vector form of the stages (the rule-based one's first; the
        others: each axis on the lanes with or without packing the data input it gathers from, partial
        sums in lanes) with the other choices the rule-based schedule's (unrolling, pads) and its tiles
        undone, each with its own cache blocking, then annealed walks from the best construction and from
        the rule-based schedule. After a measurement: the Markov chain's next states from the best
        measured schedule (:func:`steps_from`: every tiling move at every level that passes the memory
        check), constructions from its choices, and a walk from it."""
        space, model = self.space, self.model
        heuristic = space.heuristic()
        best = None
        if self.best_measured is not None:
            best = {k: tuple(v) if isinstance(v, list) else v for k, v in self.best_measured[1].items()}
        base = best or heuristic
        ranked = constructions(space, base, self.rng, model, self.constructions, forms=best is None)
        walk_starts = [base] if best is not None else [ranked[0][1]] * max(1, self.walks - 1) + [heuristic]
        walked = [
            sorted(walk(space, s, self.rng, steps=self.steps, model=model), key=lambda cc: cc[0]) for s in walk_starts
        ]
        walked_pool = [w[i] for i in range(max(len(w) for w in walked)) for w in walked if i < len(w)]
        if best is None:
            self.pool = [(estimate(space, heuristic, model), heuristic), *_diverse(space, ranked)]
        else:
            nearby = sorted(
                ((estimate(space, c, model), c) for c in steps_from(space, best, model)), key=lambda cc: cc[0]
            )
            self.pool = [*nearby, *_diverse(space, ranked)]
        self.pool += _diverse(space, walked_pool)

    def propose(self, n: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for _ in range(2):
            if not self.pool:
                self.construct()
            while self.pool and len(out) < n:
                _, config = self.pool.pop(0)
                key = config_key(config)
                if key in self.seen:
                    continue
                self.seen.add(key)
                if self.space.rejection(config) is None:  # its verdict is kept: the driver applies nothing again
                    out.append(config)
            if len(out) >= n:
                break
        return out

    def update(self, records: Sequence[Record]) -> None:
        improved = False
        for record in records:
            self.seen.add(record.key)
            self.records.append(record)
            if record.latency is not None and (self.best_measured is None or record.latency < self.best_measured[0]):
                self.best_measured = (record.latency, record.config)
                improved = True
        if improved:
            self.model = calibrate(self.space, space_model(self.space), self.records)
            self.pool = []  # walk again from the new best


def construct(space: ScheduleSpace, seed: int = 0, walks: int = 3, steps: int = 300) -> dict[str, Any]:
    """Gensor's schedule without any measurement: the best-estimated valid configuration of the
    constructions and walks."""
    tuner = Gensor(space, seed=seed, walks=walks, steps=steps)
    tuner.construct()
    tuner.pool.sort(key=lambda cc: cc[0])  # no measurement to come: the best estimate of all
    picks = tuner.propose(1)
    if not picks:
        raise LoweringError("the walks found no valid schedule")
    return picks[0]
