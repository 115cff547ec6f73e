"""Gensor-style measurement-free construction (Gensor, 2025): an annealed Markov walk over schedules.

States are configurations of the schedule space; actions are its single-parameter steps (tile or untile: a
prime factor moves between tile levels; cache or not; which axis is vectorized; unroll more or less; loop
order swaps; layout packing). Each action's transition probability comes from an analytic benefit model
of this CPU (:func:`estimate`): the time of a stage is the largest of its compute time (FMA peak scaled
by vector, register-tile and parallel efficiency) and its data traffic at each cache level (footprints of
the loop nest below each loop against L1/L2 capacity, times the iterations outside), and the walk moves
to ``s'`` with probability ∝ ``exp(-(log t(s') - log t(s)) / T)``, ``T`` annealed towards 0. Walks start
from the unscheduled program (everything at root, nothing tiled) and from the space's rule-based
configuration (:meth:`~kdsl.codegen.tvm.schedule_space.Space.heuristic`), and construct a schedule in seconds,
without measuring anything; :class:`Gensor` then proposes the rule-based start and the walks'
best-estimated distinct schedules in turn, so that measuring its top few is optional (``kdsl tune --tuner
gensor --trials 1`` measures just the first; :func:`construct` returns the best estimate of all).

>>> from kdsl.codegen.tvm.machine import from_features
>>> model = Model.of(from_features("haswell", {"avx2", "fma"}, cores=2, ghz=3.0))
>>> model.lanes, model.registers, model.fma_per_cycle
(8, 16, 2)
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from kdsl.codegen.tvm.machine import Machine
from kdsl.codegen.tvm.schedule_space import MAX_LOCAL, Space, config_key, neighbours
from kdsl.lang.errors import LoweringError
from kdsl.tune.records import Record


@dataclass(frozen=True)
class Model:
    """The analytic model's CPU: cores, vector lanes, FMA units, clock, cache capacities (bytes) and
    bandwidths (bytes/s). :meth:`of` derives it from the target machine
    (:class:`~kdsl.codegen.tvm.machine.Machine`); the bandwidths are per-cycle rates of a current
    x86 core times its clock (L2 -> L1: a 64-byte line per cycle)."""

    cores: int = 2
    lanes: int = 16
    fma_per_cycle: int = 2
    hz: float = 2.1e9
    l1: int = 48 * 1024
    l2: int = 2 * 1024 * 1024
    bw_l2: float = 64 * 2.1e9  # L2 -> L1, per core
    bw_l3: float = 24e9  # beyond L2, per core
    bw_mem: float = 15e9  # DRAM, shared
    registers: int = 32

    @classmethod
    def of(cls, machine: Machine) -> Model:
        """The model of ``machine``: its lanes, registers, FMA units, cores, clock and caches."""
        hz = machine.ghz * 1e9
        return cls(
            cores=machine.cores,
            lanes=machine.lanes(),
            fma_per_cycle=machine.fma_units,
            hz=hz,
            l1=machine.l1d,
            l2=machine.l2,
            bw_l2=64 * hz,
            bw_l3=24e9,
            bw_mem=15e9,
            registers=machine.vector_registers,
        )


def estimate(space: Space, config: Mapping[str, Any], machine: Model | None = None) -> float:
    """Estimated seconds of ``config`` (a model for ranking, not a prediction of absolute time) on
    ``machine`` (default: the model of the space's target machine)."""
    machine = machine or _model(space)
    total = 0.0
    for stage in space.stages:
        s = stage.name
        if stage.kind != "reduce":
            size = prod(e for _, e in stage.spatial)
            if config.get(f"{s}.inline") is True:
                continue
            total += size * 8 / machine.bw_l3
            continue
        total += _stage_time(space, stage, config, machine)
    for tensor in space.tensors:
        if tensor.kind != "intermediate" and config.get(f"layout.{tensor.name}.tile", "none") != "none":
            total += prod(tensor.shape) * 8 / machine.bw_l3  # a packing pass
    return total


def _stage_time(space: Space, stage: Any, config: Mapping[str, Any], m: Model) -> float:
    s = stage.name
    axes = stage.spatial + stage.reduced
    nspatial = len(stage.spatial)
    tiles = []
    for k, (axis, extent) in enumerate(axes):
        levels = 3 if k < nspatial else 2
        tiles.append(tuple(config.get(f"{s}.tile.{axis}", (extent,) + (1,) * (levels - 1))))
    labels = [a for a, _ in axes]
    vector = config.get(f"{s}.vector")
    vi = labels.index(vector) if vector in labels else None
    # the loop nest, outermost first: (axis index, extent)
    outer = [(k, tiles[k][0]) for k in range(nspatial)]
    middle_ix = [k for k, (_, e) in enumerate(axes) if e > 1]
    order = config.get(f"{s}.order", tuple(range(len(middle_ix))))
    middle = [
        (middle_ix[i], tiles[middle_ix[i]][1] if middle_ix[i] < nspatial else tiles[middle_ix[i]][0]) for i in order
    ]
    r_inner = [(k, tiles[k][1]) for k in range(nspatial, len(axes))]
    s_inner = [(k, tiles[k][2]) for k in range(nspatial) if k != vi]
    v_inner = [(vi, tiles[vi][2])] if vi is not None else []
    if config.get(f"{s}.reductions", "split") == "whole":
        # each reduction's inner tile sits right below its own outer tile, in the middle loops' order
        whole = []
        for k, extent in middle:
            whole.append((k, extent))
            if k >= nspatial:
                whole.append((k, tiles[k][1]))
        nest = outer + whole + s_inner + v_inner
    else:
        nest = outer + middle + r_inner + s_inner + v_inner
    macs = prod(e for _, e in axes)
    # compute: vector lanes, register tile, parallel balance, unrolling
    vf = v_inner[0][1] if v_inner else 1
    lanes = m.lanes
    vec_eff = (vf / (math.ceil(vf / lanes) * lanes)) if vf >= 4 else 1.0 / lanes
    guards = 1.0
    for buffer, dims in stage.reads:  # an inlined zero-padded copy: its bounds checks come along
        pad = next((p for p in space.stages if p.name == buffer and p.kind == "pad"), None)
        if pad is None or config.get(f"{buffer}.inline") is not True:
            continue
        if vi is not None and vf >= 4 and any(vi in dims[d] for d in pad.padded):
            vec_eff /= lanes  # a check per lane: the read is not vectorized
        else:
            guards *= 1.05  # a check per broadcast scalar
    if vi is not None and vf >= 4:
        for buffer, dims in stage.reads:
            uses = [d for d, used in enumerate(dims) if vi in used]
            tile = config.get(f"layout.{buffer}.tile", "none")
            packed = tile != "none" and uses and int(tile.split(":")[0]) == uses[0]
            perm = config.get(f"layout.{buffer}.perm")
            last = (list(perm)[-1] if perm is not None else len(dims) - 1) if not packed else uses[0] if uses else -1
            if uses and (len(uses) > 1 or uses[0] != last):
                vec_eff *= 0.05  # a gather along the vector axis
    tile_elems = prod(e for _, e in s_inner + v_inner)
    accumulators = max(1, tile_elems // lanes)
    if config.get(f"{s}.cache") == "local":
        reg_eff = min(1.0, accumulators / 8.0)
        if accumulators > m.registers - 4:
            reg_eff *= 0.5
    else:
        reg_eff = 0.3
    parallel = prod(e for _, e in outer)
    par_eff = parallel / (math.ceil(parallel / m.cores) * m.cores) if parallel >= m.cores else parallel / m.cores
    unroll = 1.1 if config.get(f"{s}.unroll_tile") else 1.0
    unroll *= 1.05 if config.get(f"{s}.unroll", 1) >= 4 else 1.0
    peak = m.cores * m.fma_per_cycle * lanes * m.hz
    compute = guards * macs / (peak * vec_eff * reg_eff * par_eff * min(unroll, 1.0) + 1e-9) / unroll
    # memory: footprint of the nest below each loop, against each cache level
    buffers = [dims for _, dims in stage.reads] + [[{k} for k in range(nspatial)]]
    extents_below = [1] * len(axes)
    footprints = []  # (footprint bytes of the nest below loop i, iterations of the loops outside and at i)
    for position in range(len(nest) - 1, -1, -1):
        k, e = nest[position]
        extents_below[k] *= e
        footprint = 0
        for dims in buffers:
            footprint += prod(sum(extents_below[i] - 1 for i in used) + 1 for used in dims)
        outside = prod(ee for _, ee in nest[:position])
        footprints.append((footprint * 4, outside))
    traffic = []
    for capacity in (m.l1, m.l2):
        fits = [(f, o) for f, o in footprints if f <= capacity // 2]
        f, o = max(fits, key=lambda fo: fo[0]) if fits else (footprints[0][0], prod(e for _, e in nest))
        traffic.append(f * o)
    memory = max(traffic[0] / (m.bw_l2 * m.cores), traffic[1] / (m.bw_l3 * m.cores))
    return max(compute, memory)


def _model(space: Space) -> Model:
    model = space.__dict__.get("_gensor_model")
    if model is None:
        model = space.__dict__["_gensor_model"] = Model.of(space.machine)
    return model


def plausible(space: Space, config: Mapping[str, Any]) -> bool:
    """Cheap checks the walk applies before the model (the space rejects such configurations)."""
    for stage in space.stages:
        s = stage.name
        if stage.kind == "reduce" and config.get(f"{s}.cache") == "local":
            tile = prod(config.get(f"{s}.tile.{a}", (e, 1, 1))[2] for a, e in stage.spatial)
            if tile > MAX_LOCAL:
                return False
        if stage.kind == "copy" and config.get(f"{s}.inline") is True:
            producers = [b for b, _ in stage.reads if f"{b}.cache" in config]
            if any(config[f"{b}.cache"] != "local" for b in producers):
                return False
    return True


def walk(
    space: Space,
    start: Mapping[str, Any],
    rng: random.Random,
    steps: int = 300,
    t0: float = 0.5,
    t1: float = 0.02,
    sample: int = 48,
) -> list[tuple[float, dict[str, Any]]]:
    """An annealed Markov walk from ``start``: every visited state with its estimated time."""
    state = dict(start)
    cost = estimate(space, state)
    visited = [(cost, dict(state))]
    for step in range(steps):
        temperature = t0 * (t1 / t0) ** (step / max(1, steps - 1))
        options = list(neighbours(space, state))
        if len(options) > sample:
            options = rng.sample(options, sample)
        options = [o for o in options if plausible(space, o)]
        if not options:
            break
        costs = [estimate(space, o) for o in options]
        logits = [-(math.log(c) - math.log(cost)) / temperature for c in costs]
        top = max(logits)
        weights = [math.exp(v - top) for v in logits]
        i = rng.choices(range(len(options)), weights=weights)[0]
        state, cost = options[i], costs[i]
        visited.append((cost, dict(state)))
    return visited


def identity(space: Space) -> dict[str, Any]:
    """The unscheduled program as a configuration: nothing tiled, no cache, no layout change."""
    config = {name: space._identity(param) for name, param in space.parameters.items()}
    for name in config:
        if name.endswith(".cache"):
            config[name] = "none"
        if name.endswith(".inline") or name.endswith(".unroll_tile"):
            config[name] = False
    return config


class Gensor:
    """Proposes the best-estimated schedules of annealed walks, no measurement needed to choose them."""

    name = "gensor"

    def __init__(
        self, space: Space, history: Sequence[Record] = (), *, seed: int = 0, walks: int = 3, steps: int = 300
    ) -> None:
        self.space = space
        self.rng = random.Random(seed)
        self.seen = {r.key for r in history}
        self.walks = walks
        self.steps = steps
        self.pool: list[tuple[float, dict[str, Any]]] = []
        self.best_measured: tuple[float, dict[str, Any]] | None = None
        for record in history:
            if record.latency is not None and (self.best_measured is None or record.latency < self.best_measured[0]):
                self.best_measured = (record.latency, record.config)

    def construct(self) -> None:
        """Run the walks: from the unscheduled program, from the space's rule-based schedule (Gensor
        builds from rules too; the model decides where to go from there), and from the best measured
        schedule if any."""
        starts = [identity(self.space)] * self.walks + [self.space.heuristic()]
        if self.best_measured is not None:
            starts.append({k: tuple(v) if isinstance(v, list) else v for k, v in self.best_measured[1].items()})
        # the walks' best states in turn (each walk's best first): the global top few are near-copies
        # of one state, and the model is not exact enough to bet a whole batch on one walk
        walks = [sorted(walk(self.space, start, self.rng, steps=self.steps), key=lambda cc: cc[0]) for start in starts]
        self.pool = [walk_[i] for i in range(max(len(w) for w in walks)) for walk_ in walks if i < len(walk_)]
        # the rule-based start first: the model ranks it below states that measure up to 2x slower
        # (conv2d conv3_x: its picks ran 2.1 ms, the rule-based configuration 1.1 ms)
        self.pool.insert(0, (estimate(self.space, starts[self.walks]), starts[self.walks]))

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
                try:
                    self.space.apply(config)
                except LoweringError:
                    continue
                out.append(config)
            if len(out) >= n:
                break
        return out

    def update(self, records: Sequence[Record]) -> None:
        for record in records:
            self.seen.add(record.key)
            if record.latency is not None and (self.best_measured is None or record.latency < self.best_measured[0]):
                self.best_measured = (record.latency, record.config)
                self.pool = []  # walk again from the new best


def construct(space: Space, seed: int = 0, walks: int = 3, steps: int = 300) -> dict[str, Any]:
    """Gensor's schedule without any measurement: the best-estimated valid configuration of the walks."""
    tuner = Gensor(space, seed=seed, walks=walks, steps=steps)
    tuner.construct()
    tuner.pool.sort(key=lambda cc: cc[0])  # no measurement to come: the best estimate of all walks
    picks = tuner.propose(1)
    if not picks:
        raise LoweringError("the walks found no valid schedule")
    return picks[0]
