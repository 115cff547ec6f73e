"""Gensor's construction of the schedule space's newer forms: the vector form of each reduction stage
(which axis fills the lanes, whether a data input it gathers from is packed, or partial sums in lanes)
and its cache blocking (``S.block``), chosen from the analytic model of :mod:`kdsl.tune.gensor_model`
rather than taken from the rule-based schedule.

* **Vector forms** (:func:`vector_forms`): one per spatial axis of the stage, its reads as they are; one
  more per axis whose data reads gather along it, with that input packed so the axis's dim is last (the
  space's packing rule: a depthwise convolution's channels on the lanes); and ``S.lanes`` where the
  space offers it (a dot product along a reduction that every read walks contiguously, as in a GEMV).
  Weights keep the space's packing of the vector axis (packed panels: measured 2.5x faster on matmul, a
  gain the model does not see). Every form is a start of the level-by-level construction
  (:func:`form_starts`), and the constructions' estimates choose among them: the form's vector fill,
  gathers and packing pass are terms of :func:`~kdsl.tune.gensor_model.estimate`.
* **K blocking** (``S.rblock``, in :func:`finish`): the rule-based schedule's rule applied to the built
  tiles (blocks of a long reduction whose weight panel fills L1, accumulated in place), where it applies.
* **Cache blocking** (:func:`blocking_benefit`, :func:`choose_block`): after the tiles are built, the
  outer tiles of one spatial axis in blocks of ``n`` (the blocks outermost in the fused parallel loop).
  Its benefit is the paper's caching benefit (formula 2) read per level: at L2 and at a core's share of
  L3 (the sizes of :mod:`kdsl.runtime.cpu`), the bytes the nest moves into the level
  (:func:`~kdsl.tune.gensor_model.nest_traffic`) with the block and without, each over the bandwidth
  that fills that level. Where the working set fits a level, blocking saves nothing there; where the
  data swept once per weight panel exceeds it, a block whose data fits keeps it there. The block size
  is the one of largest benefit for this layer and tiling: per layer, not one global rule.

>>> from kdsl.lang import library
>>> from kdsl.codegen.tvm import lower
>>> from kdsl.codegen.tvm.schedule_space import ScheduleSpace
>>> from kdsl.runtime.cpu import from_features
>>> machine = from_features("x", {"avx2", "fma"}, cores=2, ghz=3.0)
>>> space = ScheduleSpace(lower(library.load("matmul"), {"M": 64, "Cin": 32, "Cout": 64}), machine=machine)
>>> sorted({form["stage0.vector"] for form in vector_forms(space, space.stages[0], space.heuristic())})
['Cout', 'M']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kdsl.codegen.tvm.blocks import StageBlock
from kdsl.codegen.tvm.parameters import config_key
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.codegen.tvm.space_rules import block_choices
from kdsl.tune.gensor_model import Model, nest_traffic, space_model, stage_nest, stage_terms_of

__all__ = ["blocking_benefit", "choose_block", "finish", "form_starts", "level_times", "vector_forms"]


def _layouts_read(space: ScheduleSpace, stage: StageBlock) -> list[str]:
    """The layout parameters of the tensors ``stage`` reads, directly or through a zero-padded copy."""
    names = set()
    for buffer, _ in stage.reads:
        names.add(buffer)
        producer = next((p for p in space.stages if p.name == buffer), None)
        if producer is not None and producer.kind == "pad":
            names.add(producer.reads[0][0])
    return [p for p in space.parameters if p.startswith("layout.") and p.split(".")[1] in names]


def vector_forms(space: ScheduleSpace, stage: StageBlock, config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The vector forms of reduction ``stage`` as configurations made from ``config`` (its tiles left as
    they are): each spatial axis as the vector axis with the weights packed along it as the space packs
    them, the same with a data input that the axis gathers from packed with that dim last (where the
    space can), and partial sums in lanes (``S.lanes``) where the space offers them. Duplicates dropped."""
    s = stage.name
    identity = {name: space.identity_value(name) for name in _layouts_read(space, stage)}
    base = {**config, **identity}
    if f"{s}.lanes" in space.parameters:
        base[f"{s}.lanes"] = False
    out: dict[str, dict[str, Any]] = {}
    vectors = space.parameters[f"{s}.vector"].choices if f"{s}.vector" in space.parameters else ()
    for label in vectors:
        axis = stage.axis(label)
        # the vector tile the space would take: the weights' packing factor until the construction has
        # built its own (finish)
        vf = space.vector_tile(axis)
        packed = {**base, f"{s}.vector": label}
        for pad in space.stages:  # zero-padded copies: inlined unless this vector runs along a padded dim
            if pad.kind == "pad" and stage.name in pad.consumers and f"{pad.name}.inline" in space.parameters:
                packed[f"{pad.name}.inline"] = not space.padding_in_vector(pad, stage, label)
        packed.update(space.vector_layouts(stage, axis, max(vf, 1)))
        inputs = {f"layout.{t.name}.perm" for t in space.tensors if t.kind == "input"}
        plain = {k: (base[k] if k in inputs and k in identity else v) for k, v in packed.items()}
        for form in (plain, packed):
            out.setdefault(config_key(form), form)
    if f"{s}.lanes" in space.parameters and space.lane_axis(stage) is not None:
        lanes = {**base, f"{s}.lanes": True}
        out.setdefault(config_key(lanes), lanes)
    return list(out.values())


def form_starts(space: ScheduleSpace, config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Starts of the construction: ``config`` itself, then, for each reduction stage, ``config`` with each of
    that stage's other vector forms (:func:`vector_forms`; the other stages as in ``config``)."""
    out = {config_key(config): dict(config)}
    for stage in space.stages:
        if stage.kind != "reduce" or f"{stage.name}.cache" not in space.parameters:
            continue
        for form in vector_forms(space, stage, config):
            out.setdefault(config_key(form), form)
    return list(out.values())


def level_times(
    space: ScheduleSpace, stage: StageBlock, config: Mapping[str, Any], model: Model | None = None
) -> dict[str, float]:
    """Seconds ``stage``'s nest under ``config`` spends filling each level (the paper's exchange time of
    formula 2, per level): the bytes it moves into L2 over L3's bandwidth and into a core's share of L3
    over DRAM's (:func:`~kdsl.tune.gensor_model.nest_traffic`), beside its compute time."""
    model = model or space_model(space)
    traffic = nest_traffic(stage, config, stage_nest(stage, config)[0], model)
    compute, _ = stage_terms_of(space, stage, config, model)
    return {
        "compute": compute * model.compute_scale,
        "L2": traffic[1] / (model.bw_l3 * model.cores) * model.memory_scale,
        "L3": traffic[2] / model.bw_mem * model.memory_scale,
    }


def blocking_benefit(
    space: ScheduleSpace, stage: StageBlock, config: Mapping[str, Any], block: str, model: Model | None = None
) -> float:
    """Seconds that ``S.block = block`` saves ``stage`` over ``config``'s blocking: the stage takes the slowest
    of its compute and of its levels' fill times (:func:`level_times`), and a block helps only where the
    level it relieves was the slowest (matmul 512x1024x1024 on a 1 MiB L2 is compute-bound in the model,
    and measured 0.92x blocked; 4096x512x2048 is bound by L3 and measured 1.36x). Negative where the block
    costs more (weight panels streamed once per block) than it saves."""
    model = model or space_model(space)
    before = level_times(space, stage, config, model)
    after = level_times(space, stage, {**config, f"{stage.name}.block": block}, model)
    return max(before.values()) - max(after.values())


def choose_block(space: ScheduleSpace, stage: StageBlock, config: Mapping[str, Any], model: Model | None = None) -> str:
    """The ``S.block`` of largest :func:`blocking_benefit` for ``stage``'s tiles in ``config`` (between blocks
    that save the same, the one whose levels take least time in all), or ``"none"`` where no block saves
    time: the working set fits, the stage is bound by its compute, or the blocks' weight traffic outweighs
    the data's."""
    model = model or space_model(space)
    name = f"{stage.name}.block"
    if name not in space.parameters:
        return "none"
    unblocked = {**config, name: "none"}
    slowest = max(level_times(space, stage, unblocked, model).values())
    best, best_key = "none", (0.0, 0.0)
    for choice in block_choices(space, stage, unblocked)[1:]:  # the blocks its tiles allow ("none" first)
        times = level_times(space, stage, {**unblocked, name: choice}, model)
        key = (slowest - max(times.values()), -sum(times.values()))
        if key[0] > 0 and key > best_key:
            best, best_key = choice, key
    return best


def finish(space: ScheduleSpace, config: Mapping[str, Any], model: Model | None = None) -> dict[str, Any]:
    """A built configuration completed with the forms that depend on its tiles: each reduction stage's weights
    packed by its built vector tile (where the space offers that factor), its K blocking and its cache
    blocking (:func:`choose_block`).

    K blocking (``S.rblock``) is the rule-based schedule's rule applied to the built tiles
    (:meth:`~kdsl.codegen.tvm.space_memory.MemoryRules.block_reduction`: where one register tile's operands
    over a long reduction exceed half of L2, blocks whose weight panel fills L1, accumulated in place), not
    the model's pick: the model puts matmul 512x4096x1024 at its compute bound with blocks or without, where
    the rule measured 1.16x. The start's blocks never stay: chosen for the start's tiles, they rarely hold
    whole inner tiles of the built ones, and with the built local accumulator they span the middle tiles,
    which the space refuses (every construction for that matmul was refused before)."""
    model = model or space_model(space)
    out = dict(config)
    for stage in space.stages:
        s = stage.name
        if f"{s}.rblock" in out:
            out[f"{s}.rblock"] = "none"  # chosen for the start's tiles
        if stage.kind != "reduce" or f"{s}.cache" not in space.parameters or out.get(f"{s}.lanes") is True:
            continue
        vector = out.get(f"{s}.vector")
        if f"{s}.tile.{vector}" in out:
            inner = out[f"{s}.tile.{vector}"][2]
            for weight, dim in stage.axis(vector).packs + stage.axis(vector).panels:
                name = f"layout.{weight}.tile"
                current = out.get(name, "none")
                if (
                    current != "none"
                    and current.startswith(f"{dim}:")
                    and f"{dim}:{inner}" in space.parameters[name].choices
                ):
                    out[name] = f"{dim}:{inner}"
        if f"{s}.rblock" in space.parameters and "none" in space.parameters[f"{s}.cache"].choices:
            blocked = space.block_reduction(stage, {**out, f"{s}.cache": "none"})
            if blocked[f"{s}.rblock"] != "none":
                out = blocked
        if f"{s}.block" in space.parameters:
            out[f"{s}.block"] = choose_block(space, stage, out, model)
    # a register-level accumulator below reduction loops that run outside the middle spatial tiles (the levels'
    # order, or a start's blocks first) spans those tiles: over the space's limit it accumulates in place, unless
    # in place it would scatter into the output every step (space_rules.scatters_in_place: then it is refused)
    return space.repair(out)
