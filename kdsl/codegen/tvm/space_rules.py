"""Which configurations of a schedule space apply: its cross-parameter rules, checked and repaired without TVM.

Every parameter of a :class:`~kdsl.codegen.tvm.schedule_space.ScheduleSpace` is drawn from its own
values, but a few are valid only given others, and :meth:`ScheduleSpace.apply
<kdsl.codegen.tvm.schedule_space.ScheduleSpace.apply>` refuses a configuration that breaks one
(:mod:`kdsl.codegen.tvm.schedule_apply` raises the same reasons). The rules, per tiled reduction stage
``S`` (one that neither ``S.rfactor``, ``S.lanes`` nor ``S.attach`` schedules otherwise):

* ``S.block = "a:n"`` needs ``n`` to divide the count of ``a``'s outer tiles, ``extent // (middle *
  inner)``, and to be fewer (:func:`block_choices`);
* ``S.rblock = "a:n"`` needs the inner tile of reduction ``a`` to divide the block's depth ``n``
  (:func:`rblock_choices`);
* a local accumulator (``S.cache = "local"``) holds at most :data:`~kdsl.codegen.tvm.schedule_apply.MAX_LOCAL`
  elements: the register tile times the middle tiles of the spatial axes below the reductions
  (:func:`local_tile`), and its tile along a dim of ``S``'s own layout tile ``layout.S.tile = "d:f"``
  is a multiple or a divisor of ``f``;
* a copy's ``inline`` (``True``) and an element-wise stage's ``inline = "producer"`` fold into their
  producer's write-back, which only a local accumulator has;
* ``S.prefetch = "next"`` needs the slab axis outermost in the fused parallel loop, one value a task group
  (:func:`~kdsl.codegen.tvm.prefetch.prefetch_conflict`; repaired to ``"none"``);
* a packing copy inside its reader (``layout.T.pack`` ``"task"`` or ``"block"``) needs a packed ``T`` and a tiled
  reader, ``"block"`` also the reader's ``S.rblock`` (repaired to ``"task"``, else ``"pass"``).

:func:`conflicts` lists what a configuration breaks; :func:`repair` changes the fewest dependent
parameters to satisfy them (the tiles are kept; the ``S.block``, ``S.rblock``, ``S.cache``, layout tile or ``inline``
that they rule out is moved to the nearest value they allow, except a local accumulator that in place would
scatter into the output every step, :func:`scatters_in_place`). The set of valid configurations is the
space's as before: only proposals change, so records keep their meaning. The space imports this
module (never the other way round), so the functions take the space untyped.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterator, Mapping
from math import prod
from typing import Any

from kdsl.codegen.tvm.blocks import StageBlock
from kdsl.codegen.tvm.pack_inside import is_packed
from kdsl.codegen.tvm.parameters import order_labels, stored_last
from kdsl.codegen.tvm.prefetch import prefetch_conflict
from kdsl.codegen.tvm.schedule_apply import MAX_LOCAL


def tiled(stage: StageBlock, config: Mapping[str, Any]) -> bool:
    """Whether ``stage`` is a reduction that the applier tiles (the nest where the rules apply)."""
    s = stage.name
    return (
        stage.kind == "reduce"
        and not config.get(f"{s}.rfactor")
        and not config.get(f"{s}.lanes")
        and config.get(f"{s}.attach") != "outer"
    )


def outer_count(stage: StageBlock, axis: str, config: Mapping[str, Any]) -> int:
    """The number of outer tiles of spatial ``axis`` under ``config``'s ``S.tile.<axis>``."""
    extent = dict(stage.spatial)[axis]
    _, middle, inner = config.get(f"{stage.name}.tile.{axis}", (extent, 1, 1))
    return extent // (middle * inner)


def _allowed(space: Any, stage: StageBlock, parameter: str, allows: Callable[[str, int], bool]) -> list[str]:
    """The values ``"a:n"`` of ``S.<parameter>`` among the space's that ``allows(a, n)`` keeps (``"none"``
    first, and alone where the space has no such parameter)."""
    param = space.parameters.get(f"{stage.name}.{parameter}")
    if param is None:
        return ["none"]
    kept = [c for c in param.choices[1:] if allows(c.split(":")[0], int(c.split(":")[1]))]
    return ["none", *kept]


def block_choices(space: Any, stage: StageBlock, config: Mapping[str, Any]) -> list[str]:
    """The values of ``S.block`` that ``config``'s tiles allow (``"none"`` first), among the space's: ``n``
    divides the count of ``a``'s outer tiles, and is fewer."""

    def allows(axis: str, n: int) -> bool:
        tiles = outer_count(stage, axis, config)
        return tiles % n == 0 and n < tiles

    return _allowed(space, stage, "block", allows)


def rblock_choices(space: Any, stage: StageBlock, config: Mapping[str, Any]) -> list[str]:
    """The values of ``S.rblock`` that ``config``'s tiles allow (``"none"`` first), among the space's: a
    block of ``n`` steps of reduction ``a`` holds whole inner tiles."""

    def allows(axis: str, depth: int) -> bool:
        _, inner = config.get(f"{stage.name}.tile.{axis}", (dict(stage.reduced)[axis], 1))
        return depth % inner == 0

    return _allowed(space, stage, "rblock", allows)


def below_reductions(stage: StageBlock, config: Mapping[str, Any]) -> list[str]:
    """The spatial axes whose middle tiles run below the stage's first reduction loop (``S.order``'s after
    the first middle reduction, and ``S.spatial_below``'s): their middle tiles join the accumulator."""
    spatial = {a for a, _ in stage.spatial}
    labels = order_labels(stage)
    order = [labels[i] for i in config.get(f"{stage.name}.order", range(len(labels)))]
    first = next((i for i, a in enumerate(order) if a not in spatial), len(order))
    below_axis = config.get(f"{stage.name}.spatial_below", "none")
    return [a for a in order[first:] if a in spatial and a != below_axis] + (
        [below_axis] if below_axis in spatial else []
    )


def local_tile(stage: StageBlock, config: Mapping[str, Any]) -> dict[str, int]:
    """Elements of each spatial axis in the stage's local accumulator tile."""
    below = below_reductions(stage, config)
    out = {}
    for axis, extent in stage.spatial:
        _, middle, inner = config.get(f"{stage.name}.tile.{axis}", (extent, 1, 1))
        out[axis] = inner * (middle if axis in below else 1)
    return out


def _layout_misaligned(stage: StageBlock, config: Mapping[str, Any], tile: Mapping[str, int]) -> str | None:
    """Why ``S``'s own layout tile does not align with its local accumulator tile, or ``None``."""
    layout = config.get(f"layout.{stage.name}.tile", "none")
    if layout == "none":
        return None
    dim, factor = (int(part) for part in layout.split(":"))
    axis, extent = stage.spatial[dim]
    t = tile[axis]
    if extent == 1 or t % factor == 0 or factor % t == 0:
        return None
    return f"{stage.name}: its local accumulator holds {t} elements of {axis}, not aligned with layout tile {factor}"


def has_local(space: Any, name: str | None, config: Mapping[str, Any]) -> bool:
    """Whether stage ``name`` gets a local accumulator (what a copy or element-wise stage folds into)."""
    if name is None:
        return False
    stage = space.stage_named(name)
    return tiled(stage, config) and config.get(f"{name}.cache") == "local"


def _folded_producer(space: Any, stage: StageBlock, config: Mapping[str, Any]) -> tuple[str, Any, str | None] | None:
    """``(parameter, value it falls back to, producer)`` where ``stage`` folds into its producer's write-back."""
    name = f"{stage.name}.inline"
    if stage.kind == "copy" and config.get(name) is True:
        stages = {t.name for t in space.stages}
        return name, False, next((b for b, _ in stage.reads if b in stages), None)
    if stage.elementwise and config.get(name) == "producer":
        return name, "none", space.inline_producer(stage)
    return None


def conflicts(space: Any, config: Mapping[str, Any]) -> list[str]:
    """What ``config`` breaks of the rules above, one line each (empty: none of them).

    >>> from kdsl import gallery
    >>> from kdsl.codegen.tvm import lower
    >>> from kdsl.codegen.tvm.schedule_space import ScheduleSpace
    >>> space = ScheduleSpace(lower(gallery.load("matmul"), {"M": 64, "Cin": 32, "Cout": 64}))
    >>> config = {**space.heuristic(), "stage0.tile.M": (2, 1, 32), "stage0.block": "M:2"}
    >>> conflicts(space, config)
    ['stage0: S.block M:2 needs 2 to divide the 2 outer tiles of M, and to be fewer']
    >>> conflicts(space, repair(space, config))
    []
    """
    out = []
    for stage in space.stages:
        s = stage.name
        if not tiled(stage, config):
            continue
        block = config.get(f"{s}.block", "none")
        if block not in block_choices(space, stage, config):
            axis, n = block.split(":")
            out.append(
                f"{s}: S.block {block} needs {n} to divide the {outer_count(stage, axis, config)} outer tiles"
                f" of {axis}, and to be fewer"
            )
        rblock = config.get(f"{s}.rblock", "none")
        if rblock not in rblock_choices(space, stage, config):
            axis, depth = rblock.split(":")
            out.append(f"{s}: S.rblock {rblock} needs the inner tile of {axis} to divide {depth}")
        prefetch = prefetch_conflict(stage, config, space.weight_names)
        if prefetch:
            out.append(prefetch)
        if config.get(f"{s}.cache") == "local":
            tile = local_tile(stage, config)
            if prod(tile.values()) > MAX_LOCAL:
                out.append(f"{s}: a local accumulator of {prod(tile.values())} elements (more than {MAX_LOCAL})")
            misaligned = _layout_misaligned(stage, config, tile)
            if misaligned:
                out.append(misaligned)
    for stage in space.stages:
        folded = _folded_producer(space, stage, config)
        if folded is not None and not has_local(space, folded[2], config):
            out.append(f"{stage.name}: folding into the write-back needs a local accumulator in {folded[2]}")
    for tensor, place, allowed in _copy_places(space, config):
        if place not in allowed:
            out.append(
                f"layout.{tensor.name}.pack {place}: {tensor.name} is not packed, or {tensor.reader} "
                + ("has no S.rblock" if "task" in allowed else "is not a tiled reduction")
            )
    return out


def _copy_places(space: Any, config: Mapping[str, Any]) -> Iterator[tuple[Any, str, list[str]]]:
    """``(tensor, its layout.T.pack, the places config allows)`` of each tensor with the parameter: inside its
    reader only where it is packed and the reader a tiled reduction, per K block only where that has S.rblock."""
    for tensor in space.tensors:
        if f"layout.{tensor.name}.pack" not in space.parameters:
            continue
        place = config.get(f"layout.{tensor.name}.pack", "pass")
        reader = space.stage_named(tensor.reader)
        allowed = ["pass"]
        if is_packed(config, tensor.name, tensor.shape) and tiled(reader, config):
            allowed += ["task"] + (["block"] if config.get(f"{reader.name}.rblock", "none") != "none" else [])
        yield tensor, place, allowed


def repair(
    space: Any, config: Mapping[str, Any], rng: random.Random | None = None, keep: Collection[str] = ()
) -> dict[str, Any]:
    """``config`` with what breaks the rules moved to the nearest value the rest allows.

    An ``S.block`` (or ``S.rblock``) its tiles rule out becomes the allowed block of the same axis nearest in
    size (ties: the smaller), else ``"none"``; with ``rng``, one of the allowed blocks drawn uniformly instead (a
    conditional draw). A local accumulator over the size limit becomes ``S.cache = "none"``; one
    misaligned with ``S``'s own layout tile keeps the accumulator and drops the layout tile, unless the
    layout is in ``keep`` (ALT tunes loops under a fixed layout). A fold into a write-back that has no
    local accumulator is turned off. Names in ``keep`` are never changed (a conflict only they could
    resolve stays, and :meth:`ScheduleSpace.apply` refuses it)."""
    out = dict(config)
    for stage in space.stages:
        if not tiled(stage, out):
            continue
        s = stage.name
        allowed = block_choices(space, stage, out)
        block = out.get(f"{s}.block", "none")
        if block not in allowed and f"{s}.block" not in keep:
            out[f"{s}.block"] = rng.choice(allowed) if rng is not None else _nearest_block(block, allowed)
        allowed = rblock_choices(space, stage, out)
        rblock = out.get(f"{s}.rblock", "none")
        if rblock not in allowed and f"{s}.rblock" not in keep:
            out[f"{s}.rblock"] = rng.choice(allowed) if rng is not None else _nearest_block(rblock, allowed)
        if f"{s}.prefetch" not in keep and prefetch_conflict(stage, out, space.weight_names):
            out[f"{s}.prefetch"] = "none"
        if out.get(f"{s}.cache") != "local":
            continue
        tile = local_tile(stage, out)
        if prod(tile.values()) > MAX_LOCAL and f"{s}.cache" not in keep:
            if not scatters_in_place(stage, out):
                out[f"{s}.cache"] = "none"
        elif _layout_misaligned(stage, out, tile):
            layout = f"layout.{s}.tile"
            if layout not in keep:
                out[layout] = "none"
            elif f"{s}.cache" not in keep:
                out[f"{s}.cache"] = "none"
    for stage in space.stages:
        folded = _folded_producer(space, stage, out)
        if folded is not None and folded[0] not in keep and not has_local(space, folded[2], out):
            out[folded[0]] = folded[1]
    for tensor, place, allowed in _copy_places(space, out):
        if place not in allowed and f"layout.{tensor.name}.pack" not in keep:
            out[f"layout.{tensor.name}.pack"] = allowed[-1]  # per task where per block is not, else a pass
    return out


def scatters_in_place(stage: StageBlock, config: Mapping[str, Any]) -> bool:
    """Whether ``stage``, accumulated in place, would add each vector into its buffer across the buffer's rows:
    its vector axis is not the dim that the buffer's layout stores last (:func:`stored_last`), so every
    reduction step gathers and scatters (matmul 512x4096x1024 with ``M`` on the lanes in place: 7-125x slower
    than the best of its task in 22 of 23 records). :func:`repair` does not put an accumulator over the limit
    in place there (the conflict stays, and the configuration is refused unmeasured); the configuration itself
    stays valid."""
    vector = config.get(f"{stage.name}.vector")
    labels = [a for a, _ in stage.spatial]
    if vector not in labels:
        return False
    return labels.index(vector) != stored_last(config, stage.name, len(labels))


def _nearest_block(block: str, allowed: list[str]) -> str:
    """The allowed block of ``block``'s axis nearest in tile count (ties: the smaller), else ``"none"``.

    >>> _nearest_block("M:8", ["none", "M:2", "M:4", "N:8"]), _nearest_block("M:8", ["none", "N:8"])
    ('M:4', 'none')
    """
    axis, count = block.split(":")
    same = [c for c in allowed if c.split(":")[0] == axis]
    if not same:
        return "none"
    return min(same, key=lambda c: (abs(int(c.split(":")[1]) - int(count)), int(c.split(":")[1])))
