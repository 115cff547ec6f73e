"""Applying a configuration of a :class:`~kdsl.codegen.tvm.schedule_space.ScheduleSpace` as TVM schedule primitives.

:meth:`ScheduleSpace.apply <kdsl.codegen.tvm.schedule_space.ScheduleSpace.apply>` builds an :class:`_Applier`
over a fresh ``s_tir.Schedule`` of the operator's TE program; the applier schedules stage by stage (layouts,
reduction tiling, caches, rfactor, lanes, inlining, attaching) as the space's docstring describes, and with
``fallback`` gives a stage whose part of the configuration fails the plain parallel schedule instead.
The space imports this module (never the other way round), so the applier takes the space untyped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import gcd, prod
from typing import Any

from kdsl.codegen.tvm.blocks import StageBlock
from kdsl.codegen.tvm.pack_inside import compute_copy_at, pack_layout, pass_order
from kdsl.codegen.tvm.parameters import order_labels, reduction_block_depth
from kdsl.codegen.tvm.pass_stages import PassStages, vectorize_inner
from kdsl.codegen.tvm.prefetch import PrefetchPlan, prefetch_conflict, slab_rows
from kdsl.codegen.tvm.toolchain import error_reason
from kdsl.lang.errors import LoweringError

#: Most elements in a local accumulator tile (larger tiles are rejected: they live in memory anyway).
MAX_LOCAL = 8192
#: Most iterations of an unrolled register tile (outside its vector loop).
MAX_UNROLLED_TILE = 64


@dataclass
class _Tensor:
    """An input, weight or intermediate tensor of a space: what its ``layout.<name>.*`` parameters lay out."""

    name: str
    shape: tuple[int, ...]
    kind: str  # "input", "weight" or "intermediate"
    reader: str  # the first stage that reads it (or the producer's name, for intermediates)


@dataclass
class _TileLoops:
    """A reduction stage's loops split by their tile factors (tiles of 1 make no loop)."""

    outer: list[Any] = field(default_factory=list)  # outer spatial tiles and unit spatial loops: fused, parallel
    r_inner: list[tuple[Any, int]] = field(default_factory=list)  # inner reduction tiles (and unit ones), extents
    s_inner: list[Any] = field(default_factory=list)  # the register tile's loops but the vector axis's
    inner_axes: list[int] = field(default_factory=list)  # block iters of the register tile's axes, vector last
    middle: dict[str, list[Any]] = field(default_factory=dict)  # label -> its loops at the label's place in the order
    r_tiles: dict[int, int] = field(
        default_factory=dict
    )  # id of an inner reduction tile placed with its outer tile -> extent
    vector_inner: Any = None
    vector_outer: Any = None
    below: list[Any] = field(default_factory=list)  # S.spatial_below's middle tile: under the inner reductions
    block_outer: Any = None  # S.block's axis's outer tile (split into blocks of S.block's count)


@dataclass
class _Nest:
    """The ordered nest of a reduction stage: the middle loops below the accumulator's place (with their
    labels), the register tile's loops (vector loop last) and the accumulator's place (``None``: the root)."""

    below: list[tuple[str, Any]]
    inner: list[Any]
    at: Any


def unrolls_register_tile(stage: StageBlock, config: Mapping[str, Any]) -> bool:
    """Whether the applier unrolls ``stage``'s register tile: ``S.unroll_tile`` asks, and the tile has at most
    :data:`MAX_UNROLLED_TILE` points besides the vector axis's lanes (a larger unrolled body compiles for
    minutes).

    >>> from types import SimpleNamespace
    >>> stage = SimpleNamespace(name="s", spatial=[("M", 64), ("N", 64)])
    >>> config = {"s.tile.M": (8, 1, 8), "s.tile.N": (4, 1, 16), "s.vector": "N", "s.unroll_tile": True}
    >>> unrolls_register_tile(stage, config), unrolls_register_tile(stage, {**config, "s.tile.M": (1, 1, 64)})
    (True, True)
    >>> unrolls_register_tile(stage, {**config, "s.vector": "M"})  # 16 rows x 8 vector lanes, 16 points
    True
    """
    if not config.get(f"{stage.name}.unroll_tile"):
        return False
    vector = config.get(f"{stage.name}.vector")
    points = prod(config.get(f"{stage.name}.tile.{a}", (1, 1, 1))[2] for a, _ in stage.spatial if a != vector)
    return points <= MAX_UNROLLED_TILE


def _split(sch: Any, loop: Any, factors: Sequence[int], keep_outer: bool = False) -> list[Any | None]:
    """``loop`` split by ``factors``, ``None`` at the levels of factor 1 (no unit loops in the nest) but
    the outermost if ``keep_outer`` (a spatial axis always has a loop in the fused parallel loop)."""
    levels = [i for i, f in enumerate(factors) if f > 1 or (i == 0 and keep_outer)]
    parts: list[Any | None] = [None] * len(factors)
    if len(levels) == 1:
        parts[levels[0]] = loop
    elif levels:
        for i, part in zip(levels, sch.split(loop, [factors[i] for i in levels])):
            parts[i] = part
    return parts


class _Applier(PassStages):
    """Applies one validated configuration to a schedule, stage by stage."""

    def __init__(self, space: Any, sch: Any, config: dict[str, Any], fallback: bool = False) -> None:
        self.space = space
        self.sch = sch
        self.config = config
        self.fallback = fallback
        self.outer: dict[str, Any] = {}  # stage -> its fused parallel loop
        self.local: dict[str, bool] = {}
        self.copies: dict[str, list[tuple[Any, _Tensor]]] = {}  # reader -> packing copies its nest computes
        self.prefetches: list[PrefetchPlan] = []  # S.prefetch's, inserted once every stage is scheduled
        self.report: list[tuple[str, str]] = []

    def run(self) -> None:
        space, config = self.space, self.config
        attached = [s for s in space.stages if config.get(f"{s.name}.attach") == "outer"]
        for stage in space.stages:
            self._stage(stage, attached=stage in attached)
        for stage in attached:  # at their consumer's parallel loop, once it exists
            self._guarded(stage, lambda stage=stage: self._attach(stage))
        if self.copies:  # a reader scheduled otherwise than by tiles (space_rules refuses these)
            raise LoweringError(f"layout.T.pack inside {', '.join(self.copies)}: not a tiled reduction's nest")

    def _stage(self, stage: StageBlock, attached: bool) -> None:
        def schedule() -> str:
            # layouts first: packing copies of what this stage reads first, its own result in place
            for tensor in self.space.tensors:
                if (tensor.kind == "intermediate" and tensor.name == stage.name) or (
                    tensor.kind != "intermediate" and tensor.reader == stage.name
                ):
                    self._layout(tensor)
            if attached:
                return "attached to its consumer"
            if stage.kind == "reduce":
                return self._reduce(stage)
            if stage.kind == "copy":
                return self._copy(stage)
            if stage.kind == "pad" and self.config[f"{stage.name}.inline"]:
                self.sch.compute_inline(self.sch.get_sblock(stage.name))
                return "inlined into its reader (bounds checks outside the vector)"
            if stage.elementwise:
                return self._elementwise(stage)
            return self._spatial(stage)

        self._guarded(stage, schedule)

    def _guarded(self, stage: StageBlock, schedule: Any) -> None:
        """Run ``schedule``; with fallbacks, on failure give the stage the plain parallel schedule."""
        if not self.fallback:
            self.report.append((stage.name, schedule()))
            return
        backup = self.sch.copy()
        try:
            self.report.append((stage.name, schedule()))
        except Exception as error:  # any failing primitive: fall back, never crash
            reason = error_reason(error) if str(error).strip() else type(error).__name__
            self.sch, backup = backup, backup.copy()
            self.copies.pop(stage.name, None)  # made by the schedule just undone
            self.prefetches = [plan for plan in self.prefetches if plan.stage != stage.name]
            try:
                what = self._plain(stage)
            except Exception:  # even the plain schedule failed: leave the stage as lowered
                self.sch = backup
                what = "unscheduled"
            self.report.append((stage.name, f"fallback ({reason}): {what}"))

    def _plain(self, stage: StageBlock) -> str:
        """The fallback: the outermost spatial loop parallel, when the spatial loops are outermost."""
        sch = self.sch
        block = sch.get_sblock(stage.name)
        loops = sch.get_loops(block)
        spatial = [loop for loop, axis in zip(loops, stage.axes) if not axis.reduce]
        if spatial and len(spatial) == len(stage.spatial):
            sch.parallel(spatial[0])
        return "parallel outer loop"

    def _index_map(self, tensor: _Tensor) -> Any | None:
        perm, tiled, factor = pack_layout(self.config, tensor.name, tensor.shape)
        if tiled is None and perm == tuple(range(len(tensor.shape))):
            return None

        def index_map(*idx: Any) -> tuple[Any, ...]:
            out = [idx[d] // factor if d == tiled else idx[d] for d in perm]
            if tiled is not None:
                out.append(idx[tiled] % factor)
            return tuple(out)

        return self.space.tvm.tirx.IndexMap.from_func(index_map, ndim=len(tensor.shape), index_dtype="int32")

    def _layout(self, tensor: _Tensor) -> None:
        if not tensor.reader or self.config.get(f"{tensor.name}.inline") is True:
            return  # an inlined pad has no buffer of its own
        index_map, place = self._index_map(tensor), self.config.get(f"layout.{tensor.name}.pack", "pass")
        if index_map is None and place != "pass":
            raise LoweringError(f"layout.{tensor.name}.pack {place}: {tensor.name} is not packed (no copy to place)")
        if index_map is None:
            return
        sch = self.sch
        if tensor.kind == "intermediate":  # a pad's pass loops in its tiles' order, as a packing copy's below
            sch.transform_layout(sch.get_sblock(tensor.name), ("write", 0), index_map)
            if self.space.stage_named(tensor.name).kind == "pad":
                sch.transform_block_layout(sch.get_sblock(tensor.name), index_map)
            return
        # a packed copy ([v // f, <other dims>, v % f]: one register tile's weights in one contiguous block)
        block = sch.get_sblock(tensor.reader)
        names = [region.source.name for region in sch.get(block).reads]
        pack = sch.cache_read(block, names.index(tensor.name), "global")
        sch.transform_layout(pack, ("write", 0), index_map)
        if place != "pass":
            self.copies.setdefault(tensor.reader, []).append((pack, tensor))  # moved inside by _copies_inside
            return
        # the copy's loops in the packed order, contiguous vector stores (in the source's order each store is on
        # another line: conv3_x 1.17 -> 1.08 ms), rows in blocks by pass_order; fused, each thread runs that order
        sch.transform_block_layout(pack, index_map)
        loops = pass_order(sch, sch.get_loops(pack), pack_layout(self.config, tensor.name, tensor.shape))
        if len(loops) > 1:
            sch.parallel(sch.fuse(*loops[:-1]))
            vectorize_inner(sch, loops[-1], self.space.lanes)
        elif loops:
            sch.parallel(loops[0])

    def _reduce(self, stage: StageBlock) -> str:
        """The tiled loop nest: outer spatial tiles fused and parallel (a weight-only vector axis's first,
        so that one weight slab stays in cache while every data tile passes: else a 128x128x3x3 conv
        cycles 590 KB of weights per tile), the middle loops in ``order``, the inner reduction tiles, the
        register tile innermost with the vector axis last; tiles of 1 make no loop."""
        sch, config, s = self.sch, self.config, stage.name
        block = sch.get_sblock(s)
        loops = sch.get_loops(block)
        if config.get(f"{s}.rfactor"):
            self._rfactor(stage, block, loops)
            return "rfactor: a parallel partial sum"
        if config.get(f"{s}.lanes"):
            return self._lanes(stage, block, loops)
        vector = config.get(f"{s}.vector")
        if vector is not None and config[f"{s}.tile.{vector}"][2] == 1:
            vector = None  # no vector tile: nothing to vectorize or to lay out last
        tiles = self._split_tiles(stage, loops, vector)
        nest = self._order_nest(stage, tiles, vector)
        if config[f"{s}.cache"] == "local":
            self._local_accumulator(stage, block, tiles, nest, vector)
        # before the vector loop may be split (_vectorize_packed): its LoopRV is then gone
        tile_shape = "x".join(str(int(sch.get(lp).extent)) for lp in reversed(nest.inner)) or "1"
        # vectorize and parallelize before decompose_reduction: afterwards the update block is no longer
        # a complete reduction block under the tile loops and both refuse it
        if tiles.vector_inner is not None:
            self._vectorize_packed(stage, tiles, vector)
        self._unroll_tiles(stage, tiles, nest)
        if tiles.outer:  # else a serial reduction to one value (rfactor parallelizes it)
            fused = sch.fuse(*tiles.outer) if len(tiles.outer) > 1 else tiles.outer[0]
            sch.parallel(fused)
            self.outer[s] = fused
            if config.get(f"{s}.prefetch", "none") != "none":
                self._plan_prefetch(stage, block, fused)
        spatial_labels = {a for a, _ in stage.spatial}
        reductions = [*(lp for a, lp in nest.below if a not in spatial_labels), *(p for p, _ in tiles.r_inner)]
        if reductions:
            init = sch.decompose_reduction(block, reductions[0])
            init_loops = sch.get_loops(init)
            if tiles.vector_inner is not None and init_loops:
                sch.vectorize(init_loops[-1])
        self._copies_inside(stage, tiles)
        packed = sum(
            1 for t in self.space.tensors if t.reader == s and config.get(f"layout.{t.name}.tile", "none") != "none"
        )
        return f"register tile {tile_shape} (vector axis {vector}), packed {packed}"

    def _plan_prefetch(self, stage: StageBlock, block: Any, fused: Any) -> None:
        """``S.prefetch = "next"``: checked here, inserted into the module after every stage
        (:func:`~kdsl.codegen.tvm.prefetch.insert_prefetches`)."""
        conflict = prefetch_conflict(stage, self.config, self.space.weight_names)
        if conflict:
            raise LoweringError(conflict)
        rows = slab_rows(stage, stage.axes[0].label, self.config)
        self.prefetches.append(PrefetchPlan(stage.name, block, fused, rows))

    def _copies_inside(self, stage: StageBlock, tiles: _TileLoops) -> None:
        """Compute the packing copies of what ``stage`` reads at its parallel loop (``layout.T.pack = "task"``)
        or its ``S.rblock`` blocks' loop (``"block"``): :mod:`kdsl.codegen.tvm.pack_inside`."""
        rblock = self.config.get(f"{stage.name}.rblock", "none")
        for copy, tensor in self.copies.pop(stage.name, []):
            place = self.config[f"layout.{tensor.name}.pack"]
            if place == "block" and rblock == "none":
                raise LoweringError(f"layout.{tensor.name}.pack block needs {stage.name}.rblock (it is none)")
            anchor = tiles.middle[rblock.split(":")[0]][0] if place == "block" else self.outer.get(stage.name)
            if anchor is None:
                raise LoweringError(f"layout.{tensor.name}.pack {place}: {stage.name} has no parallel loop")
            layout = pack_layout(self.config, tensor.name, tensor.shape)
            compute_copy_at(self.sch, copy, anchor, layout, lambda lp: vectorize_inner(self.sch, lp, self.space.lanes))

    def _vectorize_packed(self, stage: StageBlock, tiles: _TileLoops, vector: str | None) -> None:
        """Vectorize the register tile's vector loop in pieces that each read one tile of every tensor that the
        stage reads laid out ``"d:f"`` along the vector axis (``[v // f, .., v % f]``): a vector of ``t`` lanes
        is one contiguous load only where ``f`` is a multiple of ``t``. A wider vector's index ``v // f, v % f``
        is no ramp, and TVM loads it lane by lane: U3 (matmul 16384x32x1024, Cascade Lake) with ``tile.Cout``
        ``(1, 16, 64)`` under the heuristic's ``layout.w.tile = "1:32"`` ran 7x slower than with ``"1:64"``
        (52 against 7.7 ms). The vector is split by the greatest common divisor of ``t`` and the factors, the
        pieces unrolled (the accumulator keeps its tile); tuners' pairs of tile and layout then all run."""
        sch, loop = self.sch, tiles.vector_inner
        lanes = width = int(sch.get(loop).extent)
        index = stage.axis(vector).index if vector is not None else None
        for buffer, dims in stage.reads:
            tile = self.config.get(f"layout.{buffer}.tile", "none")
            if tile == "none" or index is None:
                continue
            dim, factor = (int(part) for part in tile.split(":"))
            if dim < len(dims) and index in dims[dim]:
                width = gcd(width, factor)
        if width == lanes:
            sch.vectorize(loop)
            return
        pieces, inner = sch.split(loop, [None, width])
        sch.vectorize(inner)
        sch.unroll(pieces)

    def _split_tiles(self, stage: StageBlock, loops: Sequence[Any], vector: str | None) -> _TileLoops:
        """Split every loop of a reduction stage by its ``tile`` factors: spatial axes into outer, middle and
        register tiles, reductions into outer and inner tiles (an inner one with its outer tile, in the
        middle loops, when ``S.reductions`` is ``whole``)."""
        sch, config, s = self.sch, self.config, stage.name
        nspatial = len(stage.spatial)
        whole = config.get(f"{s}.reductions") == "whole"
        below = config.get(f"{s}.spatial_below", "none")
        tiles = _TileLoops()
        for k, (loop, (axis, extent)) in enumerate(zip(loops, stage.spatial + stage.reduced)):
            if extent == 1:  # unit loops: spatial ones fuse into the parallel loop, reductions are inner
                if k < nspatial:
                    tiles.outer.append(loop)
                else:
                    tiles.r_inner.append((loop, 1))
                continue
            factors = config[f"{s}.tile.{axis}"]
            depth = reduction_block_depth(config, s, axis) if k >= nspatial else 0
            if depth and depth % factors[1]:
                raise LoweringError(
                    f"{s}: S.rblock {axis}:{depth} needs the inner tile of {axis} ({factors[1]}) to divide {depth}"
                )
            if depth:
                # S.rblock: blocks of ``depth`` steps in S.order's place, the steps within a block and the inner
                # tile below every middle loop (Goto's K blocking: a block's operands reused across middle tiles)
                blocks, within, inner = _split(sch, loop, (extent // depth, depth // factors[1], factors[1]))
                tiles.middle[axis] = [blocks]
                tiles.r_inner += [(lp, f) for lp, f in ((within, depth // factors[1]), (inner, factors[1])) if lp]
                continue
            parts = _split(sch, loop, factors, keep_outer=k < nspatial)
            if k < nspatial:
                if parts[0] is not None:
                    tiles.outer.append(parts[0])
                    if config.get(f"{s}.block", "none").split(":")[0] == axis:
                        tiles.block_outer = parts[0]
                    if axis == vector:
                        tiles.vector_outer = parts[0]
                tiles.middle[axis] = [lp for lp in parts[1:2] if lp is not None]
                if axis == below:  # its middle tile leaves S.order's loops for the level below the reductions
                    tiles.below, tiles.middle[axis] = tiles.middle[axis], []
                if axis == vector:
                    tiles.vector_inner = parts[2]
                elif parts[2] is not None:
                    tiles.s_inner.append(parts[2])
                    tiles.inner_axes.append(k)
            else:
                tiles.middle[axis] = [lp for lp in parts[:1] if lp is not None]
                if parts[1] is not None and whole:
                    tiles.middle[axis].append(parts[1])
                    tiles.r_tiles[id(parts[1])] = factors[1]
                elif parts[1] is not None:
                    tiles.r_inner.append((parts[1], factors[1]))
        if tiles.vector_inner is not None:
            tiles.inner_axes.append([a for a, _ in stage.spatial].index(vector))
        return tiles

    def _order_nest(self, stage: StageBlock, tiles: _TileLoops, vector: str | None) -> _Nest:
        """Reorder the split loops: outer tiles (a weight-only vector axis's first), the middle loops in
        ``order``, the inner reduction tiles, the register tile with the vector loop last."""
        sch, config, s = self.sch, self.config, stage.name
        outer = tiles.outer
        middle_labels = order_labels(stage)
        order = config.get(f"{s}.order", tuple(range(len(middle_labels))))
        if tiles.vector_outer is not None and vector in stage.weight_only:
            outer.insert(0, outer.pop(next(i for i, lp in enumerate(outer) if lp.same_as(tiles.vector_outer))))
        if tiles.block_outer is not None:
            outer = tiles.outer = self._block(stage, outer, tiles.block_outer)  # the fused parallel loop's order
        spatial_labels = {a for a, _ in stage.spatial}
        middle = [(middle_labels[i], tiles.middle[middle_labels[i]]) for i in order]
        # the accumulator's place: below the last middle spatial loop before the first reduction loop (none
        # when every spatial extent is 1, a reduction to one value: the write-back stays at the root)
        first_reduce = next((i for i, (a, _) in enumerate(middle) if a not in spatial_labels), len(middle))
        spatial_before = [lp for _, lps in middle[:first_reduce] for lp in lps]
        below = [(a, lp) for a, lps in middle[first_reduce:] for lp in lps]
        middle_nest = [*spatial_before, *(lp for _, lp in below)]
        inner = tiles.s_inner + ([tiles.vector_inner] if tiles.vector_inner is not None else [])
        ordered = [*outer, *middle_nest, *[lp for lp, _ in tiles.r_inner], *tiles.below, *inner]
        if len(ordered) > 1:
            sch.reorder(*ordered)
        at = spatial_before[-1] if spatial_before else outer[-1] if outer else None
        below_axis = config.get(f"{s}.spatial_below", "none")
        # the spatial level under the reductions is below the accumulator's place: its tile is the accumulator's
        below += [(below_axis, lp) for lp in tiles.below]
        return _Nest(below, inner, at)

    def _block(self, stage: StageBlock, outer: list[Any], loop: Any) -> list[Any]:
        """Cache blocking (``S.block = "a:n"``): ``a``'s outer tile ``loop`` split into blocks of ``n`` tiles, the
        blocks outermost and the ``n`` tiles innermost in the fused parallel loop, so that consecutive tasks
        sweep the other outer tiles over one block (whose data stays in L2) before the next block."""
        sch, s = self.sch, stage.name
        axis, count = self.config[f"{s}.block"].split(":")
        extent, n = int(sch.get(loop).extent), int(count)
        if extent % n or extent == n:
            raise LoweringError(
                f"{s}: S.block {axis}:{n} needs {n} to divide {axis}'s {extent} outer tiles, and to be fewer"
            )
        blocks, tiles = sch.split(loop, [None, n])
        rest = [lp for lp in outer if not lp.same_as(loop)]
        return [blocks, *rest, tiles]

    def _local_accumulator(
        self, stage: StageBlock, block: Any, tiles: _TileLoops, nest: _Nest, vector: str | None
    ) -> None:
        """Accumulate the register tile in a local buffer laid out with the tile innermost, written back
        below the accumulator's place in the nest."""
        sch, s = self.sch, stage.name
        spatial_labels = {a for a, _ in stage.spatial}
        tile = prod(int(sch.get(lp).extent) for lp in nest.inner)
        tile *= prod(int(sch.get(lp).extent) for a, lp in nest.below if a in spatial_labels)
        if tile > MAX_LOCAL:
            raise LoweringError(f"{s}: a local accumulator of {tile} elements (more than {MAX_LOCAL})")
        self._check_layout_tile(stage, [a for a, _ in nest.below])
        writeback = sch.cache_write(block, 0, "local")
        if nest.at is not None:
            sch.reverse_compute_at(writeback, nest.at)
        self._tile_last(block, tiles.inner_axes)
        if tiles.vector_inner is not None and stage.spatial[-1][0] == vector:
            # with a short reduction (a depthwise window) the write-back costs as much as the FMAs
            last = sch.get_loops(writeback)[-1]
            if not isinstance(sch.get(last).extent, self.space.tvm.tirx.IntImm):
                # TVM relaxed the tile's region to a box whose size depends on the loop variables (conv1d:
                # S.block Cout:16 with layout.stage0.tile 2:64): no vector of a fixed width to take
                raise LoweringError(
                    f"{s}: the local accumulator's write-back has a loop of extent {sch.get(last).extent} (not a "
                    f"constant) to vectorize under S.block {self.config.get(f'{s}.block', 'none')} and layout tile "
                    f"{self.config.get(f'layout.{s}.tile', 'none')}"
                )
            vectorize_inner(sch, last, self.space.lanes)
        self.local[s] = True

    def _unroll_tiles(self, stage: StageBlock, tiles: _TileLoops, nest: _Nest) -> None:
        """Unroll the register tile (``unroll_tile``), then the inner reduction tiles innermost first while
        the ``unroll`` budget lasts."""
        sch, config, s = self.sch, self.config, stage.name
        unrolled = 1
        if unrolls_register_tile(stage, config):
            unrolled = prod(int(sch.get(lp).extent) for lp in tiles.s_inner)
            for lp in tiles.s_inner:
                sch.unroll(lp)
        budget = min(config[f"{s}.unroll"], max(1, 1024 // unrolled))
        # the inner reduction tiles in nest order, wherever S.reductions put them (the budget counts only these)
        unrollable = [(lp, tiles.r_tiles[id(lp)]) for _, lp in nest.below if id(lp) in tiles.r_tiles] + tiles.r_inner
        for lp, extent in reversed(unrollable):
            if extent <= budget:
                sch.unroll(lp)
                budget //= extent
            else:
                break

    def _check_layout_tile(self, stage: StageBlock, below: Sequence[str]) -> None:
        """Refuse a local accumulator whose tile is not a box of the stage's tiled layout.

        The write-back is ``reverse_compute_at`` the tile; TVM relaxes the tile's region in the layout
        ``[.., v // f, .., v % f]`` to a covering box. A tile of ``t`` elements along ``v`` is exactly a
        box when ``f`` divides ``t`` or ``t`` divides ``f``; otherwise the box also holds elements this tile
        has not computed, and the write-back copies them from the uninitialised accumulator, racing with
        the tile that does compute them (``stage0.tile.H = (2, 1, 6)`` with ``layout.stage0.tile = "0:4"``
        gave wrong outputs). ``below`` names the middle loops under the accumulator's place."""
        tile = self.config.get(f"layout.{stage.name}.tile", "none")
        if tile == "none":
            return
        dim, factor = (int(part) for part in tile.split(":"))
        axis, extent = stage.spatial[dim]
        if extent == 1:
            return
        _, middle_factor, inner_factor = self.config[f"{stage.name}.tile.{axis}"]
        t = inner_factor * (middle_factor if axis in below else 1)
        if t % factor and factor % t:
            raise LoweringError(
                f"{stage.name}: its local accumulator holds {t} elements of {axis}, which do not align with the "
                f"layout tile {factor} of {stage.name} (the write-back would copy elements not yet computed)"
            )

    def _tile_last(self, block: Any, indices: Sequence[int]) -> None:
        """Lay the local accumulator out with the buffer dims of the register tile's axes (block iters
        ``indices``, the vector axis last) innermost: a local tile whose vectorized axis is not innermost
        stays in memory and runs ~35x slower (4.6 vs 168 GFLOP/s in ``TVM.md``)."""
        sch, tirx = self.sch, self.space.tvm.tirx
        node = sch.get(block)
        region = node.writes[0].region
        uses: list[int] = []
        for index in indices:
            var = node.iter_vars[index].var
            for d, rng in enumerate(region):
                if d not in uses and any(v.same_as(var) for v in tirx.analysis.undefined_vars(rng.min)):
                    uses.append(d)
        order = [d for d in range(len(region)) if d not in uses] + uses
        if order != list(range(len(region))):
            index_map = tirx.IndexMap.from_func(lambda *idx: tuple(idx[p] for p in order), ndim=len(order))
            sch.transform_layout(block, ("write", 0), index_map)

    def _rfactor(self, stage: StageBlock, block: Any, loops: list[Any]) -> None:
        sch, s = self.sch, stage.name
        nspatial = len(stage.spatial)
        reduce_loops = loops[nspatial:]
        axis = next(a for a, e in stage.reduced if e > 1)
        k = [a for a, _ in stage.reduced].index(axis)
        factors = self.config[f"{s}.tile.{axis}"]
        outer_r, inner_r = sch.split(reduce_loops[k], list(factors))
        rest = [lp for i, lp in enumerate(reduce_loops) if i != k]
        sch.reorder(outer_r, *loops[:nspatial], *rest, inner_r)
        rf = sch.rfactor(outer_r, 0)
        sch.parallel(sch.get_loops(rf)[0])

    def _lanes(self, stage: StageBlock, block: Any, loops: list[Any]) -> str:
        """The last reduced axis split by the vector width and rfactored: a block of partial results, one
        per lane, vectorized along the contiguous axis, then a short reduction of the lanes (a row max or
        sum of a softmax, which a vector across rows would gather with the row's stride)."""
        sch = self.sch
        lanes = self.space.lane_partials(stage)
        nspatial = len(stage.spatial)
        spatial, reduce = loops[:nspatial], loops[nspatial:]
        run = reduce[-1] if stage.lane_run == 1 else sch.fuse(*reduce[-stage.lane_run :])
        _, inner = sch.split(run, [None, lanes])
        rf = sch.rfactor(inner, nspatial)
        sch.parallel(sch.fuse(*spatial) if len(spatial) > 1 else spatial[0])  # the lanes' reduction
        # the partial results' own spatial loops parallel too (a global max pool ran as long on 2 threads as 1)
        rf_loops = sch.get_loops(rf)
        rf_spatial = sch.fuse(*rf_loops[:nspatial]) if nspatial > 1 else rf_loops[0]
        if (rows := self.config.get(f"{stage.name}.lane_rows", 1)) > 1:  # interleaved: a stream, a sum each
            rf_spatial, inner = sch.split(rf_spatial, [None, rows])
            sch.reorder(*sch.get_loops(rf)[2:-1], inner, sch.get_loops(rf)[-1])
            sch.unroll(inner)
        sch.parallel(rf_spatial)
        rf_loops = sch.get_loops(rf)
        sch.vectorize(rf_loops[-1])
        init = sch.decompose_reduction(rf, rf_loops[1])
        sch.vectorize(sch.get_loops(init)[-1])
        along = ", ".join(a for a, _ in stage.reduced[-stage.lane_run :])
        return f"lanes: {lanes} partial results along {along}" + (f", {rows} rows at once" if rows > 1 else "")
