"""The machine model of Gensor's construction (:mod:`kdsl.tune.gensor`): the target's levels,
the paper's benefit formulas (§ IV-B), the tiles, footprints and traffic of a reduction stage at each
level, and the analytic time of a schedule that ranks constructions and walks (:func:`estimate`,
scaled by measurements with :func:`calibrate`).

>>> from kdsl.runtime.cpu import from_features
>>> machine = from_features("haswell", {"avx2", "fma"}, cores=2, ghz=3.0)
>>> model = Model.of(machine)
>>> model.lanes, model.registers, model.fma_per_cycle, model.accumulators == machine.accumulators()
(8, 16, 2, True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from kdsl.codegen.tvm.parameters import reduction_block_depth
from kdsl.codegen.tvm.pass_stages import MAX_VECTORS
from kdsl.codegen.tvm.schedule_apply import unrolls_register_tile
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.runtime.cpu import Machine
from kdsl.tune.gensor_access import footprint as _footprint
from kdsl.tune.gensor_access import gather_share, load_pieces, resident_levels, stored_last
from kdsl.tune.records import Record

__all__ = [
    "CACHE_LINE",
    "CACHE_START",
    "DRAM_LATENCY",
    "FLOOR_BENEFIT",
    "FMA_LATENCY",
    "FREE_BENEFIT",
    "GATHER",
    "LATENCY_CYCLES",
    "LEVELS",
    "Model",
    "SCALES",
    "balance",
    "caching_benefit",
    "calibrate",
    "capacity",
    "estimate",
    "gather_share",
    "in_registers",
    "lane_gathers",
    "level_cost",
    "level_tile",
    "load_pieces",
    "nest_traffic",
    "outer_loops",
    "stage_nest",
    "stage_terms_of",
    "parallel_benefit",
    "resident_levels",
    "scattered",
    "stage_terms",
    "stored_last",
    "tiling_benefit",
]

#: The memory levels of the construction, in the order it visits them.
LEVELS = ("register", "L1", "L2")
#: Load latencies in cycles (typical of current x86 cores; LLVM's features do not give them).
LATENCY_CYCLES = {"register": 0.0, "L1": 5.0, "L2": 14.0, "L3": 50.0}
#: DRAM latency in seconds (no cycle count fits every machine).
DRAM_LATENCY = 90e-9
#: Benefit of a move that reduces traffic at no footprint cost (filling the lanes of a vector already
#: held) and of one that does not reduce it at all (kept possible: the inverse moves make the chain
#: irreducible, § IV-D).
FREE_BENEFIT, FLOOR_BENEFIT = 4.0, 0.02
#: The caching action's weight at the first step of a level: ``2**-12`` of its benefit, doubled per step
#: (a level gets about a dozen steps: an AVX2 register tile of 4 x 16 is 6 moves of a factor 2 from 1 x 1).
CACHE_START = 2.0**-12
#: Bytes of a cache line (x86's; the machine description does not give it).
CACHE_LINE = 64
#: A vector's efficiency when a read fills it by a gather (a load per lane) instead of one vector load.
GATHER = 0.05
#: Cycles of an FMA's latency: ``fma_per_cycle x FMA_LATENCY`` independent accumulators keep the units busy.
FMA_LATENCY = 4


@dataclass(frozen=True)
class Model:
    """The analytic model's CPU: cores, vector lanes, registers, FMA units, clock, cache capacities (bytes)
    and per-core bandwidths (bytes/s). :meth:`of` derives it from the target machine
    (:class:`~kdsl.runtime.cpu.Machine`); ``compute_scale`` and ``memory_scale`` are fitted to
    measurements by :func:`calibrate` (1 before any)."""

    cores: int = 2
    lanes: int = 16
    fma_per_cycle: int = 2
    hz: float = 2.1e9
    l1: int = 48 * 1024
    l2: int = 2 * 1024 * 1024
    l3: int = 32 * 1024 * 1024  # shared by the cores
    bw_l1: float = 128 * 2.1e9  # L1 -> registers
    bw_l2: float = 32 * 2.1e9  # L2 -> L1
    bw_l3: float = 16 * 2.1e9  # beyond L2
    bw_mem: float = 15e9  # DRAM, shared by the cores
    registers: int = 32
    accumulators: int = 28
    compute_scale: float = 1.0
    memory_scale: float = 1.0

    @classmethod
    def of(cls, machine: Machine) -> Model:
        """The model of ``machine``: its lanes, registers, FMA units, cores, clock and caches; bandwidths
        are per-cycle widths times its clock (two vector loads per cycle from L1, 32 bytes from L2 -- half
        a line, what current cores sustain -- and the machine's ``l3_bytes_per_cycle`` beyond). DRAM
        bandwidth is not in the description: 15 GB/s, which calibration scales.

        >>> from kdsl.runtime.cpu import from_features
        >>> m = Model.of(from_features("skylake-avx512", {"avx2", "fma", "avx512f"}, cores=2, ghz=2.0))
        >>> m.lanes, m.registers, m.bw_l1 / 2e9, m.peak / 1e9
        (16, 32, 128.0, 128.0)
        """
        hz = machine.ghz * 1e9
        return cls(
            cores=machine.cores,
            lanes=machine.lanes(),
            fma_per_cycle=machine.fma_units,
            hz=hz,
            l1=machine.l1d,
            l2=machine.l2,
            l3=machine.l3,
            bw_l1=2 * machine.vector_bits / 8 * hz,
            bw_l2=32 * hz,
            bw_l3=machine.l3_bytes_per_cycle * hz,
            bw_mem=15e9,
            registers=machine.vector_registers,
            accumulators=machine.accumulators(),
        )

    @property
    def peak(self) -> float:
        """Multiply-accumulates per second of all cores."""
        return self.cores * self.fma_per_cycle * self.lanes * self.hz

    def access(self, level: str, nbytes: float) -> float:
        """Seconds for one core to exchange ``nbytes`` with memory ``level`` (``register``, ``L1``,
        ``L2``, ``L3`` or ``DRAM``): its latency plus the bytes over its bandwidth."""
        if level == "DRAM":
            return DRAM_LATENCY + nbytes * self.cores / self.bw_mem
        bandwidth = {"register": 3 * self.bw_l1, "L1": self.bw_l1, "L2": self.bw_l2, "L3": self.bw_l3}[level]
        return LATENCY_CYCLES[level] / self.hz + nbytes / bandwidth


# ------------------------------------------------------------------------------------------------
# The benefit formulas (§ IV-B)
# ------------------------------------------------------------------------------------------------


def tiling_benefit(
    traffic_before: float, traffic_after: float, footprint_before: float, footprint_after: float
) -> float:
    """Formula 1: the decrease in traffic over the increase in footprint, both relative to the current
    state (so that benefits of different levels and units normalize together). Higher means more reuse
    per byte of cache; a move that reduces traffic without growing the footprint gets
    :data:`FREE_BENEFIT`, one that does not reduce traffic :data:`FLOOR_BENEFIT`.

    >>> tiling_benefit(100, 50, 10, 20), tiling_benefit(100, 50, 10, 40) < tiling_benefit(100, 50, 10, 20)
    (0.5, True)
    >>> tiling_benefit(100, 120, 10, 5) == FLOOR_BENEFIT, tiling_benefit(100, 90, 10, 10) == FREE_BENEFIT
    (True, True)
    """
    saved = traffic_before - traffic_after
    if saved <= 0 or traffic_before <= 0:
        return FLOOR_BENEFIT
    grown = footprint_after - footprint_before
    if grown <= 0:
        return FREE_BENEFIT
    return max(FLOOR_BENEFIT, min(FREE_BENEFIT, (saved / traffic_before) / (grown / max(footprint_before, 1e-30))))


def caching_benefit(model: Model, level: str, nbytes: float) -> float:
    """Formula 2 for the caching action at ``level``: the time to exchange the tile's ``nbytes`` with
    the next level over the time with this one (latency plus bytes over bandwidth), as the fraction of
    that time saved, ``1 - t_this / t_next`` in [0, 1).

    >>> from kdsl.runtime.cpu import from_features
    >>> m = Model.of(from_features("haswell", {"avx2", "fma"}, cores=2, ghz=3.0))
    >>> [round(caching_benefit(m, level, 4096), 2) for level in ("L1", "L2")]
    [0.51, 0.54]
    """
    nxt = {"register": "L1", "L1": "L2", "L2": "L3"}[level]
    slow = model.access(nxt, nbytes)
    return max(0.0, 1.0 - model.access(level, nbytes) / slow) if slow > 0 else 0.0


def balance(chunks: int, cores: int) -> float:
    """The fraction of the cores' time that ``chunks`` equal parallel chunks keep busy.

    >>> balance(4, 2), balance(3, 2), balance(1, 2)
    (1.0, 0.75, 0.5)
    """
    return chunks / (math.ceil(chunks / cores) * cores)


def parallel_benefit(chunks_before: int, chunks_after: int, cores: int) -> float:
    """The thread-level factor (the analogue of the paper's formula 3, which counts a GPU tile's bank
    conflicts with and without virtual threads; the ceilings play the same part): the balance of the
    parallel chunks after the move over before; 0 when fewer chunks than cores remain.

    >>> parallel_benefit(8, 4, 2), parallel_benefit(8, 3, 2), parallel_benefit(2, 1, 2)
    (1.0, 0.75, 0.0)
    """
    if chunks_after < min(cores, chunks_before):
        return 0.0
    return balance(chunks_after, cores) / balance(chunks_before, cores)


# ------------------------------------------------------------------------------------------------
# Tiles, footprints and traffic of one reduction stage at one level
# ------------------------------------------------------------------------------------------------


def _tiles(stage: Any, config: Mapping[str, Any]) -> list[tuple[int, ...]]:
    nspatial = len(stage.spatial)
    out = []
    for k, (axis, extent) in enumerate(stage.spatial + stage.reduced):
        levels = 3 if k < nspatial else 2
        out.append(tuple(config.get(f"{stage.name}.tile.{axis}", (extent,) + (1,) * (levels - 1))))
    return out


def level_tile(stage: Any, config: Mapping[str, Any], level: str) -> list[int]:
    """The extent of each axis (spatial, then reduced) of ``stage``'s tile at ``level``."""
    tiles = _tiles(stage, config)
    nspatial = len(stage.spatial)
    if level == "register":
        return [t[2] if k < nspatial else 1 for k, t in enumerate(tiles)]
    if level == "L1":
        return [t[2] if k < nspatial else t[1] for k, t in enumerate(tiles)]
    return [t[1] * t[2] if k < nspatial else t[1] for k, t in enumerate(tiles)]


def _register_footprint(stage: Any, tile: Sequence[int], vector: int | None, lanes: int) -> int:
    """Vector registers the register tile's accumulators hold (the vector axis in whole vectors)."""
    return prod(math.ceil(t / lanes) if k == vector else t for k, t in enumerate(tile[: len(stage.spatial)]))


def _register_loads(stage: Any, tile: Sequence[int], vector: int | None, lanes: int) -> int:
    """Loads of one reduction step of the register tile: a vector per ``lanes`` elements of a read that
    the vector axis walks along its last dim, else one broadcast per element."""
    loads = 0
    for _, dims in stage.reads:
        if vector is not None and vector in dims[-1] and len(dims[-1]) == 1:
            loads += _footprint(dims[:-1], tile) * math.ceil(tile[vector] / lanes)
        else:
            loads += _footprint(dims, tile)
    return loads


def level_cost(
    space: ScheduleSpace, stage: Any, config: Mapping[str, Any], level: str, model: Model
) -> tuple[float, float]:
    """``(traffic, footprint)`` of ``stage`` at ``level``: the data moved into that level over the whole
    stage and the data one tile holds there. At the register level in loads and vector registers, else
    in bytes; the output tile is reloaded once per reduction slice outside it (once in all where the
    register tile accumulates in a ``local`` cache)."""
    tile = level_tile(stage, config, level)
    axes = stage.spatial + stage.reduced
    nspatial = len(stage.spatial)
    labels = [a for a, _ in axes]
    vector = config.get(f"{stage.name}.vector")
    vi = labels.index(vector) if vector in labels else None
    tiles = prod(e for _, e in axes) / prod(tile)
    size = prod(e for _, e in stage.spatial)
    slices = prod(e for _, e in stage.reduced) / prod(tile[nspatial:])
    if level == "register":
        footprint = _register_footprint(stage, tile, vi, model.lanes)
        cached = in_registers(stage, config)
        out = size / model.lanes * (1 if cached else 2 * slices)
        return tiles * _register_loads(stage, tile, vi, model.lanes) + out, footprint
    out_dims = [{k} for k in range(nspatial)]
    footprint = sum(_footprint(dims, tile) for _, dims in stage.reads) + _footprint(out_dims, tile)
    traffic = tiles * sum(_footprint(dims, tile) for _, dims in stage.reads) + size * slices
    return 4.0 * traffic, 4.0 * footprint


def in_registers(stage: Any, config: Mapping[str, Any]) -> bool:
    """Whether ``stage``'s register tile accumulates in registers across its reduction: a local tile (written
    back once), or the tile accumulated in place (``S.cache = "none"``) and fully unrolled, each accumulator
    one address that LLVM's loop-invariant code motion keeps in a register across the reduction loops (the
    heuristic's matmuls in place ran 1.07-1.49x faster than with TVM's local tile, which lives in a workspace
    each tile zeroes and copies: docs/tune/README.md, session 40).

    >>> from types import SimpleNamespace
    >>> stage = SimpleNamespace(name="s", spatial=[("M", 64), ("N", 64)])
    >>> tiles = {"s.tile.M": (8, 1, 8), "s.tile.N": (4, 1, 16), "s.vector": "N"}
    >>> in_registers(stage, {**tiles, "s.cache": "local"}), in_registers(stage, {**tiles, "s.cache": "none"})
    (True, False)
    >>> in_registers(stage, {**tiles, "s.cache": "none", "s.unroll_tile": True})  # 8 x 16: 8 unrolled rows
    True
    """
    cache = config.get(f"{stage.name}.cache")
    return cache == "local" or (cache == "none" and unrolls_register_tile(stage, config))


def capacity(space: ScheduleSpace, stage: Any, config: Mapping[str, Any], level: str, model: Model) -> bool:
    """The paper's memory check: the tile fits ``level`` (the register tile: accumulator registers and at
    most :data:`~kdsl.codegen.tvm.schedule_apply.MAX_VECTORS` vectors along the vector axis; L1 and L2:
    half their capacity, the other half for what other loops keep there)."""
    if level == "register":
        tile = level_tile(stage, config, level)
        labels = [a for a, _ in stage.spatial]
        vector = config.get(f"{stage.name}.vector")
        vi = labels.index(vector) if vector in labels else None
        if vi is not None and tile[vi] > MAX_VECTORS * model.lanes:
            return False
        return _register_footprint(stage, tile, vi, model.lanes) <= model.accumulators
    _, footprint = level_cost(space, stage, config, level, model)
    return footprint <= (model.l1 if level == "L1" else model.l2) // 2


def parallel_chunks(stage: Any, config: Mapping[str, Any]) -> int:
    return prod(t[0] for t in _tiles(stage, config)[: len(stage.spatial)])


def vector_aligned(stage: Any, config: Mapping[str, Any], model: Model) -> bool:
    """The register tile's vector axis holds whole vectors (or the whole axis, or no whole vector fits)."""
    vector = config.get(f"{stage.name}.vector")
    extents = dict(stage.spatial)
    if vector not in extents:
        return True
    inner = config.get(f"{stage.name}.tile.{vector}", (extents[vector], 1, 1))[2]
    return inner % model.lanes == 0 or inner == extents[vector] or extents[vector] % model.lanes != 0


# ------------------------------------------------------------------------------------------------
# The analytic time of a schedule (ranks constructions and walks)
# ------------------------------------------------------------------------------------------------


def stage_terms(
    space: ScheduleSpace, config: Mapping[str, Any], model: Model | None = None
) -> list[tuple[float, float]]:
    """``(compute, memory)`` seconds of each stage and packing pass of ``config`` (unscaled): a stage
    takes the larger of the two."""
    model = model or space_model(space)
    terms: list[tuple[float, float]] = []
    for stage in space.stages:
        if stage.kind != "reduce":
            if config.get(f"{stage.name}.inline") is True:
                continue
            terms.append((0.0, prod(e for _, e in stage.spatial) * 8 / (model.bw_l3 * model.cores)))
            continue
        terms.append(_stage_time(space, stage, config, model))
    for tensor in space.tensors:
        if tensor.kind != "intermediate" and _packed(config, tensor):
            terms.append((0.0, _copy_bytes(space, config, tensor) / (model.bw_l3 * model.cores)))
    return terms


def _copy_bytes(space: ScheduleSpace, config: Mapping[str, Any], tensor: Any) -> int:
    """The memory traffic of a packing copy (fp32): read and written back in a pass of its own; inside its
    reader (``layout.T.pack``) read once by each task that an outer tile of an axis it does not index repeats,
    and written to cache only."""
    size = prod(tensor.shape) * 4
    if config.get(f"layout.{tensor.name}.pack", "pass") == "pass":
        return 2 * size
    stage = space.stage_named(tensor.reader)
    indexed = set().union(*(d for buffer, dims in stage.reads if buffer == tensor.name for d in dims))
    return size * prod(
        config[f"{stage.name}.tile.{a}"][0] for a, e in stage.spatial if e > 1 and stage.axis(a).index not in indexed
    )


def _packed(config: Mapping[str, Any], tensor: Any) -> bool:
    """Whether an input or weight is copied into another layout before the stages run (tiled or permuted)."""
    perm = config.get(f"layout.{tensor.name}.perm")
    permuted = perm is not None and tuple(perm) != tuple(range(len(tensor.shape)))
    return permuted or config.get(f"layout.{tensor.name}.tile", "none") != "none"


def _combine(terms: Sequence[tuple[float, float]], compute_scale: float, memory_scale: float) -> float:
    return sum(max(compute_scale * c, memory_scale * m) for c, m in terms)


def estimate(space: ScheduleSpace, config: Mapping[str, Any], machine: Model | None = None) -> float:
    """Estimated seconds of ``config`` (a model for ranking, not a prediction of absolute time) on
    ``machine`` (default: the model of the space's target machine)."""
    model = machine or space_model(space)
    return _combine(stage_terms(space, config, model), model.compute_scale, model.memory_scale)


def stage_nest(stage: Any, config: Mapping[str, Any]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The loop nest of a reduction stage under ``config``, outermost first, as ``(axis index, extent)``
    (the fused parallel loop's parts, the middle loops in ``S.order``, the inner reductions, the level of
    ``S.spatial_below``, the register tile with the vector axis last), and that level's loops alone."""
    s = stage.name
    axes = stage.spatial + stage.reduced
    nspatial = len(stage.spatial)
    tiles = _tiles(stage, config)
    labels = [a for a, _ in axes]
    vector = config.get(f"{s}.vector")
    vi = labels.index(vector) if vector in labels[:nspatial] else None
    outer = outer_loops(stage, config)
    middle_ix = [k for k, (_, e) in enumerate(axes) if e > 1]
    order = config.get(f"{s}.order", tuple(range(len(middle_ix))))
    middle = [
        (middle_ix[i], tiles[middle_ix[i]][1] if middle_ix[i] < nspatial else tiles[middle_ix[i]][0]) for i in order
    ]
    # S.rblock: the blocked reduction's middle loop counts its blocks, and the steps within a block (then its
    # inner tile) go below every middle loop whatever S.reductions says
    depths = {k: reduction_block_depth(config, s, labels[k]) for k in range(nspatial, len(axes))}
    middle = [(k, axes[k][1] // depths[k]) if depths.get(k) else (k, e) for k, e in middle]
    steps = {k: ((depths[k] // tiles[k][1], tiles[k][1]) if depths[k] else (tiles[k][1],)) for k in depths}
    r_inner = [(k, e) for k in depths for e in steps[k]]
    blocked = [(k, e) for k in depths if depths[k] for e in steps[k]]
    s_inner = [(k, tiles[k][2]) for k in range(nspatial) if k != vi]
    v_inner = [(vi, tiles[vi][2])] if vi is not None else []
    below_label = config.get(f"{s}.spatial_below", "none")
    # S.spatial_below: that axis's middle tile leaves the middle loops for a level under the inner reductions
    below = [(k, e) for k, e in middle if k < nspatial and labels[k] == below_label]
    middle = [(k, e) for k, e in middle if (k, e) not in below]
    if config.get(f"{s}.reductions", "split") == "whole":
        # each reduction's inner tile sits right below its own outer tile, in the middle loops' order
        whole = []
        for k, extent in middle:
            whole.append((k, extent))
            if k >= nspatial and not depths[k]:
                whole.append((k, tiles[k][1]))
        return outer + whole + blocked + below + s_inner + v_inner, below
    return outer + middle + r_inner + below + s_inner + v_inner, below


def stage_terms_of(space: ScheduleSpace, stage: Any, config: Mapping[str, Any], model: Model) -> tuple[float, float]:
    """``(compute, memory)`` seconds of one reduction stage (unscaled; see :func:`stage_terms`)."""
    return _stage_time(space, stage, config, model)


def _stage_time(space: ScheduleSpace, stage: Any, config: Mapping[str, Any], m: Model) -> tuple[float, float]:
    if config.get(f"{stage.name}.lanes") is True:
        return _lanes_time(space, stage, config, m)
    s = stage.name
    axes = stage.spatial + stage.reduced
    nspatial = len(stage.spatial)
    tiles = _tiles(stage, config)
    labels = [a for a, _ in stage.spatial]
    vector = config.get(f"{s}.vector")
    vi = labels.index(vector) if vector in labels else None
    nest, below = stage_nest(stage, config)
    outer = outer_loops(stage, config)
    macs = prod(e for _, e in axes)
    # compute: vector lanes, register tile, parallel balance, unrolling
    vf = tiles[vi][2] if vi is not None else 1
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
    gathered = 0.0  # gathered vectors per FMA
    split = 0.0  # loads beyond one per vector, per vector FMA, of the reads loaded in pieces
    if vi is not None and vf >= 4:
        for buffer, dims in stage.reads:
            uses = [d for d, used in enumerate(dims) if vi in used]
            tensor = read_tensor(space, config, buffer, uses)
            if uses and (len(uses) > 1 or uses[0] != stored_last(config, tensor, len(dims))):
                gathered += gather_share(stage, tiles, dims)
            elif uses:
                split += (load_pieces(vf, lanes) / math.ceil(vf / lanes) - 1) * gather_share(stage, tiles, dims)
    accumulators = _register_footprint(stage, [t[2] for t in tiles[:nspatial]], vi, lanes)
    accumulators *= prod(e for _, e in below)  # its tile joins the local accumulator
    if in_registers(stage, config):
        # independent accumulators hide the FMA latency: fma units x latency of them keep the units busy
        reg_eff = min(1.0, accumulators / (m.fma_per_cycle * FMA_LATENCY))
        if accumulators > m.accumulators:
            reg_eff *= 0.5  # spills
    else:
        reg_eff = 0.3
    parallel = prod(e for _, e in outer)
    par_eff = balance(parallel, m.cores) if parallel >= m.cores else parallel / m.cores
    unroll = 1.1 if config.get(f"{s}.unroll_tile") else 1.0
    unroll *= 1.05 if config.get(f"{s}.unroll", 1) >= 4 else 1.0
    compute = guards * macs / (m.peak * vec_eff * reg_eff * par_eff + 1e-9) / unroll
    # a gather loads lane by lane: its time adds to the FMAs' (it is not a slower FMA; spread over few lanes
    # or few accumulators, the FMAs are slow already, and the gather costs as much as with whole vectors) and
    # to the memory's (its loads are that read's accesses: a GEMV whose weight streams from DRAM hid a gather
    # per FMA under its traffic and tied with summing in lanes, measured 4.4x the rule-based schedule before it)
    gather_time = gathered * macs / (m.peak * GATHER * par_eff + 1e-9)
    compute += gather_time
    # an extra load takes an issue slot as an FMA does (two of each per cycle on current x86 cores)
    compute += split * macs / (m.peak * (vf / (math.ceil(vf / lanes) * lanes)) * par_eff + 1e-9)
    if in_registers(stage, config) and scattered(stage, config):
        compute += prod(e for _, e in stage.spatial) / (m.hz * m.cores * par_eff)  # a store per element
    return compute, _memory_time(stage, nest_traffic(stage, config, nest, m), m) + gather_time


def _memory_time(stage: Any, traffic: Sequence[float], m: Model) -> float:
    """Seconds of :func:`nest_traffic`'s bytes into L1, L2 and L3: the slowest of the three levels, but for
    the levels that hold all the stage's data (:func:`resident_levels`)."""
    resident = resident_levels(stage, m)
    times = (traffic[0] / (m.bw_l2 * m.cores), traffic[1] / (m.bw_l3 * m.cores), traffic[2] / m.bw_mem)
    return max(t for t, kept in zip(times, resident) if not kept) if not all(resident) else 0.0


def outer_loops(stage: Any, config: Mapping[str, Any]) -> list[tuple[int, int]]:
    """The fused parallel loop's parts, outermost first, as ``(axis index, extent)``: the outer spatial tiles
    in the block's order, a weight-only vector axis's first, and with ``S.block = "a:n"`` the blocks of
    ``a`` outermost and its ``n`` tiles innermost (as the schedule applies them).

    >>> from types import SimpleNamespace
    >>> stage = SimpleNamespace(name="s", spatial=[("M", 64), ("N", 64)], reduced=[("K", 8)], weight_only={"N"})
    >>> config = {"s.tile.M": (16, 1, 4), "s.tile.N": (4, 1, 16), "s.vector": "N", "s.block": "M:4"}
    >>> outer_loops(stage, config)
    [(0, 4), (1, 4), (0, 4)]
    """
    tiles = _tiles(stage, config)
    labels = [a for a, _ in stage.spatial]
    outer = [(k, tiles[k][0]) for k in range(len(labels))]
    vector = config.get(f"{stage.name}.vector")
    if vector in labels and vector in stage.weight_only:
        outer.insert(0, outer.pop(labels.index(vector)))
    block = config.get(f"{stage.name}.block", "none")
    if block != "none":
        axis, count = block.split(":")
        k, n = labels.index(axis), int(count)
        extent = tiles[k][0]
        if extent % n == 0 and n < extent:  # else the space refuses it: no block to model
            rest = [(j, e) for j, e in outer if j != k]
            outer = [(k, extent // n), *rest, (k, n)]
    return outer


def read_tensor(space: ScheduleSpace, config: Mapping[str, Any], buffer: str, uses: Sequence[int]) -> str:
    """The tensor whose layout a read of ``buffer`` sees along the buffer dims ``uses``: an inlined
    zero-padded copy is read from its input (a dim it does not pad keeps its place), else ``buffer``."""
    pad = next((p for p in space.stages if p.name == buffer and p.kind == "pad"), None)
    if pad is None or config.get(f"{buffer}.inline") is not True or any(d in pad.padded for d in uses):
        return buffer
    source, dims = pad.reads[0]
    return source if all(dims[d] == {d} for d in uses if d < len(dims)) else buffer


def nest_traffic(stage: Any, config: Mapping[str, Any], nest: Sequence[tuple[int, int]], m: Model) -> list[float]:
    """Bytes ``nest`` (loops outermost first, as ``(axis index, extent)``) moves into L1, L2 and L3 (a core's
    share). At each level, for each loop whose nest below fits half the level: every buffer's footprint
    below it, fetched again for every iteration of the loops outside it that index the buffer, and of those
    outside such a loop (a loop that does not index a buffer, right outside its fitting tile, reuses it);
    the least of these over the loops that fit. A local accumulator stays in registers and is written back
    once (counted in every loop's footprint, it made the rule-based matmul schedule, 8 x 32 accumulators
    under a reduction of 1024, look 3x slower than schedules that measured no faster).

    >>> from types import SimpleNamespace
    >>> stage = SimpleNamespace(name="s", spatial=[("M", 64), ("N", 64)], reduced=[("K", 64)],
    ...                         reads=[("x", [{0}, {2}]), ("w", [{2}, {1}])])
    >>> config = {"s.cache": "local"}
    >>> model = Model(l1=4096, l2=16 * 1024, l3=1 << 20, cores=1)
    >>> by_rows = nest_traffic(stage, config, [(0, 64), (1, 4), (2, 64), (1, 16)], model)
    >>> by_rows[2] == 4 * (64 * 64 + 64 * 64 + 64 * 64)  # all fits L3: read once, written once
    True
    >>> by_rows[0] > by_rows[1] > by_rows[2]
    True
    """
    nspatial = len(stage.spatial)
    cached = in_registers(stage, config)
    buffers = [dims for _, dims in stage.reads] + ([] if cached else [[{k} for k in range(nspatial)]])
    indexes = [{k for used in dims for k in used} for dims in buffers]
    writeback = 4 * prod(e for _, e in stage.spatial) if cached else 0
    # a scattered write-back (every element a line of its own) costs lines where the result does not stay
    spread = CACHE_LINE // 4 if scattered(stage, config) else 1
    extents_below = [1] * (nspatial + len(stage.reduced))
    per_position = []  # (footprint bytes of the nest from loop i in, bytes moved when that nest stays cached)
    for position in range(len(nest) - 1, -1, -1):
        k, e = nest[position]
        extents_below[k] *= e
        sizes = [_footprint(dims, extents_below) for dims in buffers]
        moved = 0
        for size, used in zip(sizes, indexes):
            fetches, indexed = 1, False
            for j in range(position - 1, -1, -1):
                indexed = indexed or nest[j][0] in used
                fetches *= nest[j][1] if indexed else 1
            moved += size * fetches
        per_position.append((4 * sum(sizes), 4 * moved))
    everything = 4 * prod(e for _, e in nest) * len(buffers)  # nothing fits: every access moves
    traffic = []
    for cap in (m.l1, m.l2, m.l3 // m.cores):
        fits = [moved for footprint, moved in per_position if footprint <= cap // 2]
        stays = cap == m.l1 or writeback <= cap // 2  # L1: stores are combined on their way to L2
        traffic.append((min(fits) if fits else everything) + writeback * (1 if stays else spread))
    return traffic


def scattered(stage: Any, config: Mapping[str, Any]) -> bool:
    """Whether the vector axis is not the dim the stage's result is stored along (its last spatial axis
    longer than 1, or the dim its layout puts last): the local accumulator's write-back is then a store
    per element, each a whole stored row apart (matmul with ``M`` on the lanes measured 2-4x slower than
    with ``Cout``, whose vectors are stored whole: 1024^3, 16384x32x1024, 65536x4x1024, contended).

    >>> from types import SimpleNamespace
    >>> stage = SimpleNamespace(name="s", spatial=[("M", 64), ("N", 64), ("u", 1)])
    >>> scattered(stage, {"s.vector": "N"}), scattered(stage, {"s.vector": "M"})
    (False, True)
    """
    labels = [a for a, e in stage.spatial]
    vector = config.get(f"{stage.name}.vector")
    if vector not in labels:
        return False
    last = max((k for k, (_, e) in enumerate(stage.spatial) if e > 1), default=len(labels) - 1)
    perm = config.get(f"layout.{stage.name}.perm")
    tile = config.get(f"layout.{stage.name}.tile", "none")
    if tile != "none":
        last = int(tile.split(":")[0])
    elif perm is not None:
        last = list(perm)[-1]
    return labels.index(vector) != last


def _lanes_time(space: ScheduleSpace, stage: Any, config: Mapping[str, Any], m: Model) -> tuple[float, float]:
    """``S.lanes``: partial sums in the vector lanes the space splits the contiguous reduction into, one
    chain of FMAs per output element (its latency not hidden) and a sum of the lanes after it. A read
    whose stored innermost dim is not the reduction's fills its vectors by a gather (the tiled stage's
    :data:`GATHER`). The traffic is :func:`nest_traffic`'s of the nest the schedule runs, every spatial
    axis outer and the whole reduction inner, so that it is one measure with the tiled stages' (counted
    as every read streamed once from L3, a matmul in lanes looked as if it moved less than any tiling
    of it; and without the gathers every layout cost the same, where the records of matmul 64x256x256 in
    lanes measured a median of 198 us with no gathered read (9 configurations), 1.6 ms with one (6) and
    2.0 ms with two (3); 128x512x256: 0.65, 5.3 and 10.3 ms (7, 8, 1))."""
    macs = prod(e for _, e in stage.spatial + stage.reduced)
    parallel = prod(e for _, e in stage.spatial)
    par_eff = balance(parallel, m.cores) if parallel >= m.cores else parallel / m.cores
    lanes = space.lane_partials(stage)
    fill = lanes / (math.ceil(lanes / m.lanes) * m.lanes)
    fill *= GATHER ** lane_gathers(space, stage, config)
    chains = macs / (m.peak * fill * par_eff / (m.fma_per_cycle * FMA_LATENCY) + 1e-9)
    compute = chains + parallel * lanes / (m.hz * m.cores * par_eff)  # the lanes' sum: an add per lane
    # no local accumulator: the partial sums' vector is the nest's output buffer, read and written per point
    nest = [(k, e) for k, (_, e) in enumerate(stage.spatial + stage.reduced)]
    return compute, _memory_time(stage, nest_traffic(stage, {}, nest, m), m)


def lane_gathers(space: ScheduleSpace, stage: Any, config: Mapping[str, Any]) -> int:
    """How many of the stage's reads gather the vectors of ``S.lanes``: the last reduced axis (the one the
    lanes split) indexes them along more than one dim, or along a dim their layout does not store last
    (an inlined zero-padded copy is read from its input's layout, :func:`read_tensor`).

    >>> from types import SimpleNamespace
    >>> stage = SimpleNamespace(name="s", spatial=[("M", 8), ("N", 8)], reduced=[("K", 64)],
    ...                         reads=[("x", [{0}, {2}]), ("w", [{2}, {1}])])
    >>> space = SimpleNamespace(stages=[stage])
    >>> lane_gathers(space, stage, {}), lane_gathers(space, stage, {"layout.w.perm": (1, 0)})
    (1, 0)
    """
    axis = len(stage.spatial) + len(stage.reduced) - 1
    count = 0
    for buffer, dims in stage.reads:
        uses = [d for d, used in enumerate(dims) if axis in used]
        if not uses:
            continue  # a read the reduction does not index: one broadcast serves every lane
        tensor = read_tensor(space, config, buffer, uses)
        count += len(uses) > 1 or uses[0] != stored_last(config, tensor, len(dims))
    return count


def space_model(space: ScheduleSpace) -> Model:
    model = space.__dict__.get("_gensor_model")
    if model is None:
        model = space.__dict__["_gensor_model"] = Model.of(space.machine)
    return model


#: The scales :func:`calibrate` tries for the compute and the memory terms (factors of sqrt(2)).
SCALES = tuple(2.0 ** (k / 2) for k in range(-8, 9))


def calibrate(space: ScheduleSpace, model: Model, records: Sequence[Record], minimum: int = 4) -> Model:
    """``model`` with its compute and memory terms scaled to fit the measured ``records`` (least squares
    of the log time over a grid of :data:`SCALES`; ties go to the scales nearest 1): the peak and the
    bandwidths as this machine reaches them in these kernels. Unchanged with fewer than ``minimum``
    measured records."""
    measured = [(r.latency, stage_terms(space, r.config, model)) for r in records if r.latency]
    if len(measured) < minimum:
        return model
    best, best_error = (1.0, 1.0), float("inf")
    for a in SCALES:
        for b in SCALES:
            error = sum((math.log(t) - math.log(max(_combine(terms, a, b), 1e-30))) ** 2 for t, terms in measured)
            error += 1e-9 * (abs(math.log(a)) + abs(math.log(b)))
            if error < best_error:
                best, best_error = (a, b), error
    return dataclasses.replace(model, compute_scale=best[0], memory_scale=best[1])
