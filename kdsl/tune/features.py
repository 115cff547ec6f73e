"""Features of a schedule configuration that mean the same thing on every operator and layer.

:mod:`kdsl.tune.cost_model`'s features are the space's own parameters (``conv.tile.h``, ``layout.w.perm``):
a model trained on conv2d's records cannot read matmul's. These are what the configuration does on the
machine, read from the block analysis of the lowered program (:mod:`kdsl.codegen.tvm.blocks`) and the
analytic model of :mod:`kdsl.tune.gensor_model`, each normalized so that its scale does not depend on the
operator's size:

* the whole program: log MACs; the analytic estimate, its compute and memory terms, each in units of
  the machine's peak time for the MACs (1 = peak); the same three against the space's heuristic
  configuration (so a model can learn "how much worse than the default" across operators); how many
  extra passes (copies, pads, element-wise stages not inlined, layout packing) the schedule runs and
  their share of the estimate;
* the dominant reduction stage (most MACs): the vector length, whether it fills whole vectors, the
  share of its reads that gather along the vector axis; the register tile in accumulators against the
  register file and against what hides the FMA latency; the parallel chunks over the cores and their
  balance; unrolling; the loads per MAC at the register level and the bytes per MAC and footprint
  against capacity at L1 and L2 (:func:`~kdsl.tune.gensor_model.level_cost`); the inner reduction and
  cache tiles; the stage's spatial and reduction extents.

Every value is finite (:func:`config_features` clamps logs of zero). The cross-operator model reads
them against the task's heuristic configuration (:func:`features_matrix`'s default kind, the names in
:data:`RELATIVE`): within one task the order of configurations is what it learns, and a value less the
heuristic's means the same on every operator where the absolute value does not (docs/tune/README.md:
+0.03 held-out Spearman on both splits).

>>> len(FEATURES) == len(set(FEATURES))
True
>>> FEATURES[:3]
('log_macs', 'estimate_over_peak', 'compute_over_peak')
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

from kdsl.codegen.tvm.parameters import stored_last
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.codegen.tvm.space_rules import scatters_in_place
from kdsl.tune import gensor_model
from kdsl.tune.gensor_model import FMA_LATENCY, Model, balance, level_cost, space_model
from kdsl.tune.records import TuneError

#: The names of :func:`config_features`' values, in order.
FEATURES: tuple[str, ...] = (
    "log_macs",
    "estimate_over_peak",
    "compute_over_peak",
    "memory_over_peak",
    "estimate_vs_heuristic",
    "compute_vs_heuristic",
    "memory_vs_heuristic",
    "extra_passes",
    "pass_share",
    "packed_tensors",
    "reduce_stages",
    "vector_log_length",
    "vector_fill",
    "vector_whole",
    "gather_share",
    "write_scatter",
    "permuted_tensors",
    "inline_pads",
    "accumulators_over_registers",
    "accumulators_over_latency",
    "local_accumulator",
    "parallel_over_cores",
    "parallel_balance",
    "rfactor",
    "log_unroll",
    "unroll_tile",
    "reductions_whole",
    "register_loads_per_mac",
    "register_footprint_over_accumulators",
    "l1_bytes_per_mac",
    "l1_footprint_over_capacity",
    "l2_bytes_per_mac",
    "l2_footprint_over_capacity",
    "log_reduce_inner",
    "log_cache_tile",
    "log_spatial",
    "log_reduction",
)


def _log2(value: float) -> float:
    """log2, clamped so that a zero (no MACs, no traffic) stays finite."""
    return math.log2(max(value, 1e-12))


def _reduce_stages(space: ScheduleSpace) -> list[Any]:
    return [stage for stage in space.stages if stage.kind == "reduce"]


def _terms(space: ScheduleSpace, config: Mapping[str, Any], model: Model) -> tuple[float, float, float, float]:
    """``(estimate, compute, memory, passes)`` seconds: the analytic estimate, the sum of its stages'
    compute and memory terms, and the time of the passes that do no MACs."""
    terms = gensor_model.stage_terms(space, config, model)
    estimate = sum(max(c, m) for c, m in terms)
    compute = sum(c for c, _ in terms)
    memory = sum(m for _, m in terms)
    passes = sum(m for c, m in terms if c == 0.0)
    return estimate, compute, memory, passes


def _heuristic_terms(space: ScheduleSpace, model: Model) -> tuple[float, float, float, float]:
    """The terms of the space's heuristic configuration, cached on the space (one per task)."""
    cached = space.__dict__.get("_heuristic_terms")
    if cached is None:
        # as applied, like every configuration it is compared with (a GEMV's heuristic sums in lanes)
        cached = space.__dict__["_heuristic_terms"] = _terms(space, as_applied(space, space.heuristic()), model)
    return cached


def _lane_axis(space: ScheduleSpace, stage: Any, config: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(axis index, lanes)`` where ``S.lanes`` is on: the stage sums partial results in vector lanes
    along its last reduced axis (:meth:`~kdsl.codegen.tvm.schedule_space.ScheduleSpace.lane_partials`),
    else None."""
    if config.get(f"{stage.name}.lanes") is not True or not stage.reduced:
        return None
    return len(stage.spatial) + len(stage.reduced) - 1, space.lane_partials(stage)


def as_applied(space: ScheduleSpace, config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as the schedule applies it. ``S.lanes`` replaces a stage's whole tiling
    (:mod:`kdsl.codegen.tvm.schedule_apply` returns before it tiles): every spatial point walks the whole
    reduction in one vector of partial sums held in memory, the spatial loops fused and parallel.
    Features read from the tiling parameters it ignores would describe a schedule that never runs (on
    matmul, 16 of 39 measured configurations, 12x slower than the rest by the median, some looking like
    the fastest tiles), so they are read from the tiling it does run: every spatial axis outer, the
    reduction whole and inner, no vector axis, accumulator or unrolling (the vector along the reduction
    is :func:`_stage_features`').

    >>> from kdsl.codegen.tvm.schedule_space import ScheduleSpace
    >>> as_applied(ScheduleSpace.__new__(ScheduleSpace), {"a": 1})  # no S.lanes on: unchanged
    {'a': 1}
    """
    out = dict(config)
    lanes_on = {key.removesuffix(".lanes") for key, on in config.items() if key.endswith(".lanes") and on is True}
    if not lanes_on:
        return out
    for stage in _reduce_stages(space):
        name = stage.name
        if name not in lanes_on:
            continue
        for axis, extent in stage.spatial:
            out[f"{name}.tile.{axis}"] = (extent, 1, 1)
        for axis, extent in stage.reduced:
            out[f"{name}.tile.{axis}"] = (1, extent)
        out.pop(f"{name}.vector", None)
        out.update({f"{name}.cache": "none", f"{name}.unroll": 1, f"{name}.unroll_tile": False})
        out.update({f"{name}.reductions": "split", f"{name}.block": "none", f"{name}.spatial_below": "none"})
        out[f"{name}.rblock"] = "none"
    return out


def _gather_share(stage: Any, config: Mapping[str, Any], vector: int | None) -> float:
    """The share of the stage's reads whose innermost stored dim is not the vector axis alone (a gather
    or a broadcast per lane), with the layout's permutation and packing applied."""
    if vector is None or not stage.reads:
        return 0.0
    gathers = 0
    for buffer, dims in stage.reads:
        uses = [d for d, used in enumerate(dims) if vector in used]
        if not uses:
            continue  # the vector axis does not index this read: one broadcast serves every lane
        if len(uses) > 1 or uses[0] != stored_last(config, buffer, len(dims)):
            gathers += 1
    return gathers / len(stage.reads)


def _write_scatter(space: ScheduleSpace, stage: Any, config: Mapping[str, Any]) -> float:
    """1 where the stage writes an intermediate buffer whose layout does not store the vector axis last
    (every vector store scatters: :func:`~kdsl.codegen.tvm.space_rules.scatters_in_place`), else 0."""
    intermediate = any(t.name == stage.name and t.kind == "intermediate" for t in space.tensors)
    return 1.0 if intermediate and scatters_in_place(stage, config) else 0.0


def _permuted(space: ScheduleSpace, config: Mapping[str, Any]) -> float:
    """Tensors whose layout permutes their dims (each a transform pass or strided accesses)."""
    count = 0
    for tensor in space.tensors:
        perm = config.get(f"layout.{tensor.name}.perm")
        if perm is not None and list(perm) != sorted(perm):
            count += 1
    return float(count)


def _stage_features(space: ScheduleSpace, stage: Any, config: Mapping[str, Any], model: Model) -> list[float]:
    """The dominant reduction stage's features (see the module's text), in :data:`FEATURES`' order."""
    name = stage.name
    nspatial = len(stage.spatial)
    labels = [a for a, _ in stage.spatial + stage.reduced]
    tiles = [tuple(config.get(f"{name}.tile.{a}", (e, 1, 1))) for a, e in stage.spatial]
    reduce_tiles = [tuple(config.get(f"{name}.tile.{a}", (e, 1))) for a, e in stage.reduced]
    vector_label = config.get(f"{name}.vector")
    vector = labels.index(vector_label) if vector_label in labels[:nspatial] else None
    length = tiles[vector][2] if vector is not None else 1
    lanes = model.lanes
    fill = length / (math.ceil(length / lanes) * lanes)
    pads = [p.name for p in space.stages if p.kind == "pad" and config.get(f"{p.name}.inline") is True]
    inline_pads = sum(1 for buffer, _ in stage.reads if buffer in pads)
    inner = [t[2] for t in tiles]
    accumulators = prod(math.ceil(t / lanes) if k == vector else t for k, t in enumerate(inner))
    chunks = prod(t[0] for t in tiles)
    macs = prod(e for _, e in stage.spatial + stage.reduced)
    register_loads, register_footprint = level_cost(space, stage, config, "register", model)
    l1_bytes, l1_footprint = level_cost(space, stage, config, "L1", model)
    l2_bytes, l2_footprint = level_cost(space, stage, config, "L2", model)
    gathers = _gather_share(stage, config, vector)
    lane = _lane_axis(space, stage, config)
    if lane is not None:  # one vector of partial sums along the reduction per spatial point (as_applied)
        vector, length = lane
        fill = length / (math.ceil(length / lanes) * lanes)
        gathers = _gather_share(stage, config, vector)
        accumulators = 1
        register_loads /= length  # the reads are vector loads along the lane axis
        register_footprint = 1
    return [
        _log2(length),
        fill,
        1.0 if length % lanes == 0 else 0.0,
        gathers,
        _write_scatter(space, stage, config),
        _permuted(space, config),
        float(inline_pads),
        accumulators / max(1, model.accumulators),
        min(1.0, accumulators / (model.fma_per_cycle * FMA_LATENCY)),
        1.0 if config.get(f"{name}.cache") == "local" else 0.0,
        _log2(chunks / max(1, model.cores)),
        balance(chunks, model.cores) if chunks >= model.cores else chunks / max(1, model.cores),
        1.0 if config.get(f"{name}.rfactor") is True or lane is not None else 0.0,
        _log2(float(config.get(f"{name}.unroll", 1) or 1)),
        1.0 if config.get(f"{name}.unroll_tile") else 0.0,
        1.0 if config.get(f"{name}.reductions", "split") == "whole" else 0.0,
        _log2(register_loads / macs),
        register_footprint / max(1, model.accumulators),
        _log2(l1_bytes / macs),
        _log2(l1_footprint / model.l1),
        _log2(l2_bytes / macs),
        _log2(l2_footprint / model.l2),
        _log2(prod(t[-1] for t in reduce_tiles)),
        _log2(prod(t[1] * t[2] for t in tiles)),
        _log2(prod(e for _, e in stage.spatial)),
        _log2(prod(e for _, e in stage.reduced)),
    ]


def config_features(space: ScheduleSpace, config: Mapping[str, Any], model: Model | None = None) -> list[float]:
    """The features of ``config`` in ``space`` (:data:`FEATURES`' order; see the module's text), on
    ``model`` (default: the analytic model of the space's machine)."""
    model = model or space_model(space)
    stages = _reduce_stages(space)
    lane_passes = sum(1 for s in stages if config.get(f"{s.name}.lanes") is True)  # each sums its lanes
    config = as_applied(space, config)  # the analytic terms and the tiles of the schedule that runs
    macs = sum(prod(e for _, e in s.spatial + s.reduced) for s in stages) or 1
    ideal = macs / model.peak  # seconds at the machine's peak
    estimate, compute, memory, passes = _terms(space, config, model)
    h_estimate, h_compute, h_memory, _ = _heuristic_terms(space, model)
    extra = lane_passes + sum(
        1 for s in space.stages if s.kind != "reduce" and config.get(f"{s.name}.inline") is not True
    )
    packed = sum(
        1 for t in space.tensors if t.kind != "intermediate" and config.get(f"layout.{t.name}.tile", "none") != "none"
    )
    out = [
        _log2(macs),
        _log2(estimate / ideal),
        _log2(compute / ideal),
        _log2(memory / ideal),
        _log2(estimate / max(h_estimate, 1e-30)),
        _log2(compute / max(h_compute, 1e-30)),
        _log2(memory / max(h_memory, 1e-30)),
        float(extra),
        passes / max(estimate, 1e-30),
        float(packed),
        float(len(stages)),
    ]
    if stages:
        dominant = max(stages, key=lambda s: prod(e for _, e in s.spatial + s.reduced))
        out += _stage_features(space, dominant, config, model)
    else:  # no reduction (a copy kernel): the stage's features are absent, not guessed
        out += [0.0] * (len(FEATURES) - len(out))
    return out


#: Features that are one value for every configuration of a task (the operator's and layer's size) or,
#: taken against the heuristic configuration, equal another one (``estimate_over_peak`` minus the
#: heuristic's is ``estimate_vs_heuristic``): :data:`RELATIVE` leaves them out.
TASK_CONSTANT: frozenset[str] = frozenset(
    {"log_macs", "reduce_stages", "log_spatial", "log_reduction"}
    | {"estimate_vs_heuristic", "compute_vs_heuristic", "memory_vs_heuristic"}
)
#: The names of the relative features (:func:`features_matrix`'s default kind), in order.
RELATIVE: tuple[str, ...] = tuple(name for name in FEATURES if name not in TASK_CONSTANT)
_RELATIVE_COLUMNS = [FEATURES.index(name) for name in RELATIVE]
#: The kinds of :func:`features_matrix`, and the names of each one's columns.
KINDS: dict[str, tuple[str, ...]] = {"relative": RELATIVE, "absolute": FEATURES}


def _heuristic_features(space: ScheduleSpace, model: Model) -> list[float]:
    """:func:`config_features` of the space's heuristic configuration, cached on the space (one per task)."""
    cached = space.__dict__.get("_heuristic_features")
    if cached is None:
        cached = space.__dict__["_heuristic_features"] = config_features(space, space.heuristic(), model)
    return cached


def features_matrix(
    space: ScheduleSpace, configs: Sequence[Mapping[str, Any]], kind: str = "relative"
) -> list[list[float]]:
    """The features of each configuration, of ``kind``: ``"absolute"`` is :func:`config_features`;
    ``"relative"`` (the cross-operator model's) is each of :data:`RELATIVE` minus the same feature of the
    space's heuristic configuration. The model learns a configuration's rank within its task, and a tree
    splits on one threshold for every task: absolute values (a register tile's loads per MAC, a footprint
    against L2) sit at other levels on other operators and layers, while "0.5 below the heuristic's"
    means the same on all. The heuristic is fixed per task, so a tuner's single candidate has its
    features too (a task median would depend on which configurations are in the set).

    >>> KINDS["relative"] == RELATIVE and len(RELATIVE) == len(FEATURES) - len(TASK_CONSTANT)
    True
    >>> features_matrix(None, [], kind="logs")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    kdsl.tune.records.TuneError: features: no kind 'logs'; choose from relative, absolute
    """
    if kind not in KINDS:
        raise TuneError(f"features: no kind {kind!r}; choose from {', '.join(KINDS)}")
    if not configs:
        return []
    model = space_model(space)
    rows = [config_features(space, config, model) for config in configs]
    if kind == "absolute":
        return rows
    heuristic = _heuristic_features(space, model)
    return [[row[k] - heuristic[k] for k in _RELATIVE_COLUMNS] for row in rows]
