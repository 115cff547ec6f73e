"""Scheduling the stages of a configuration that are not tiled reductions: copies, element-wise stages,
materialized pads and reductions computed at their reader (``S.attach``).

:class:`PassStages` holds these passes of the applier (:class:`~kdsl.codegen.tvm.schedule_apply._Applier`
inherits them), as :class:`~kdsl.codegen.tvm.space_registers.RegisterRules` holds rules of the space. Each is a
parallel pass of its own, folded into its producer's write-back or computed inside its reader's parallel loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

from kdsl.codegen.tvm.blocks import StageBlock
from kdsl.codegen.tvm.parameters import largest_divisor
from kdsl.lang.errors import LoweringError

#: Most vectors along the vector axis in one register tile (and in any vectorized loop).
MAX_VECTORS = 2
#: Longest loop (in vectors) vectorized whole where no whole vector divides it (83 = 5 x 16 + 3 lanes): a window
#: sum's row (the heuristic's ragged vector tile) or an attached reduction's innermost loop; longer ones compile slowly.
RAGGED_VECTORS = 8


def vectorize_inner(sch: Any, loop: Any, lanes: int) -> None:
    """Vectorize ``loop``: whole up to :data:`MAX_VECTORS` vectors (a short loop of 28 becomes 16 + 8 + 4
    lanes), else split by at most that (a 1024-lane vector took LLVM minutes to compile)."""
    extent = int(sch.get(loop).extent)
    if extent <= MAX_VECTORS * lanes:
        if extent > 1:
            sch.vectorize(loop)
        return
    factor = next((f for f in (MAX_VECTORS * lanes, lanes, lanes // 2, 4) if extent % f == 0), None)
    if factor is not None:
        sch.vectorize(sch.split(loop, [None, factor])[1])


class PassStages:
    """The applier's passes over stages that are not tiled reductions (a part of
    :class:`~kdsl.codegen.tvm.schedule_apply._Applier`)."""

    space: Any
    sch: Any
    config: dict[str, Any]
    outer: dict[str, Any]  # stage -> its fused parallel loop
    local: dict[str, bool]  # stage -> whether it accumulates in a local tile

    def _copy(self, stage: StageBlock) -> str:
        """A copy of a tiled stage's result folds into that stage's write-back (saving a pass over
        memory: conv2d's transposition to ``[N, Cout, H, W]`` costs nothing), else it is a pass of its own."""
        sch, s = self.sch, stage.name
        block = sch.get_sblock(s)
        if self.config.get(f"{s}.inline"):
            producer = next(b for b, _ in stage.reads if b in {t.name for t in self.space.stages})
            if not self.local.get(producer):
                raise LoweringError(f"{s}: inlining the copy needs a local accumulator in {producer}")
            sch.reverse_compute_inline(block)
            return f"inlined into {producer}_local"
        return self._spatial(stage)

    def _elementwise(self, stage: StageBlock) -> str:
        """A branching kernel's element-wise stage: inlined as ``S.inline`` says, else a pass of its own."""
        sch, s = self.sch, stage.name
        where = self.config.get(f"{s}.inline", "none")
        if where == "consumers":
            sch.compute_inline(sch.get_sblock(s))
            return f"inlined into {', '.join(stage.consumers)}"
        if where == "producer":
            producer = self.space.inline_producer(stage)
            if producer is None or not self.local.get(producer):
                raise LoweringError(f"{s}: folding into the write-back needs a local accumulator in {producer}")
            sch.reverse_compute_inline(sch.get_sblock(s))
            return f"inlined into {producer}'s write-back"
        loops = sch.get_loops(sch.get_sblock(s))
        last, lanes = int(sch.get(loops[-1]).extent), self.space.lanes
        tail = self._contiguous_tail(stage) if last % lanes else 1
        if len(loops) > tail > 1:
            # trailing loops that every access walks contiguously (or not at all: a gate per channel) fuse
            # into one run of whole vectors (SE's gate at 8x256x14x14, 1 thread: 0.40 -> 0.19 ms, where a
            # row of 14 took no vector); a short run is vectorized whole up to RAGGED_VECTORS vectors (49 =
            # 3 x 16 + 1 lanes; for AVX2 6 x 8 + 1, which a bound of 4 vectors left scalar: SE at 8x512x7x7,
            # Zen 3, 2 threads: 118 -> 70 us)
            extent = prod(int(sch.get(lp).extent) for lp in loops[-tail:])
            factor = next((f for f in (2 * lanes, lanes) if extent % f == 0), 0)
            factor = factor or (
                extent if extent <= RAGGED_VECTORS * lanes else next((f for f in (lanes // 2, 4) if extent % f == 0), 1)
            )
            if factor > 1:
                fused = sch.fuse(*loops[-tail:])
                outer, inner = sch.split(fused, [None, factor])
                sch.parallel(sch.fuse(*loops[:-tail], outer))
                sch.vectorize(inner)
                return f"parallel, vector {factor} over {tail} fused loops"
        if (
            len(loops) > 1
            and not stage.axes[-1].gathers
            and last % 4 == 0
            and self.space.lanes < last <= 4 * self.space.lanes
        ):
            # a short row whole (56 = 3 x 16 + 8 lanes): the polynomial forms of exp, sin, .. are compute-bound, and
            # 16 lanes run them faster than the 8 that divide 56 (Map("exp") at 64x56x56, 1 thread: 60 -> 43 us)
            sch.parallel(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])
            sch.vectorize(loops[-1])
            return f"parallel, vector {last}"
        return self._spatial(stage)

    def _contiguous_tail(self, stage: StageBlock) -> int:
        """The most trailing block axes (at least 1) that every buffer access (the write and each read)
        either indexes as its own trailing dims, in order and whole, or does not index at all (a
        broadcast): fused into one loop, they walk every buffer contiguously."""
        tirx = self.space.tvm.tirx
        node = self.sch.get(self.sch.get_sblock(stage.name))
        ivars = [iv.var for iv in node.iter_vars]
        extents = [int(iv.dom.extent) for iv in node.iter_vars]
        accesses = []
        for region in [*node.reads, *node.writes]:
            mins = [rng.min for rng in region.region]
            uses = [
                {k for k, w in enumerate(ivars) if any(v.same_as(w) for v in tirx.analysis.undefined_vars(m))}
                for m in mins
            ]
            accesses.append((mins, uses, [int(d) for d in region.source.shape]))

        def fits(m: int) -> bool:
            tail = set(range(len(ivars) - m, len(ivars)))
            for mins, uses, shape in accesses:
                if not any(u & tail for u in uses):
                    continue  # a broadcast along the whole tail
                if len(mins) < m or any(u & tail for u in uses[: len(mins) - m]):
                    return False
                for t in range(1, m + 1):
                    k, d = len(ivars) - t, len(mins) - t
                    if not (isinstance(mins[d], tirx.Var) and mins[d].same_as(ivars[k]) and shape[d] == extents[k]):
                        return False
            return True

        return next((m for m in range(len(ivars), 1, -1) if fits(m)), 1)

    def _spatial(self, stage: StageBlock) -> str:
        """Copies, element-wise stages and materialized pads: the outer loops fused and parallel, the
        innermost vectorized when its extent divides into vectors and every read is contiguous along it
        (a gathered vector, as in pixel_shuffle's ``x[.., w // 2]``, is left to LLVM as scalars)."""
        sch, lanes = self.sch, self.space.lanes
        loops = sch.get_loops(sch.get_sblock(stage.name))
        last = int(sch.get(loops[-1]).extent)
        factor = next((f for f in (lanes, lanes // 2, lanes // 4) if f >= 4 and last % f == 0), 1)
        if stage.axes[-1].gathers:
            factor = 1
        outer = list(loops[:-1])
        if factor > 1:
            lo, vi = sch.split(loops[-1], [None, factor])
            outer.append(lo)
            sch.vectorize(vi)
        elif not outer:
            outer = list(loops)
        if outer:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
        return f"parallel, vector {factor}"

    def _attach(self, stage: StageBlock) -> str:
        sch = self.sch
        consumer = stage.consumers[0]
        if consumer not in self.outer:
            raise LoweringError(f"{stage.name}: its consumer {consumer} has no parallel loop to attach to")
        block = sch.get_sblock(stage.name)
        sch.compute_at(block, self.outer[consumer], preserve_unit_loops=True)
        own = sch.get_loops(block)[1:]
        n_spatial = sum(1 for iv in sch.get(block).iter_vars if int(iv.iter_type) == 0)
        spatial, reduce = own[:n_spatial], own[n_spatial:]
        if not reduce and spatial:
            vectorize_inner(sch, spatial[-1], self.space.lanes)
        elif spatial and int(sch.get(spatial[-1]).extent) > 1:
            width = self._vectorize_attached(stage, block, spatial[-1], reduce)
            return f"computed at {consumer}'s parallel loop, vector {width}"
        return f"computed at {consumer}'s parallel loop"

    def _vectorize_attached(self, stage: StageBlock, block: Any, last: Any, reduce: Sequence[Any]) -> int:
        """An attached reduction's reductions moved above its innermost spatial loop, which is vectorized (whole
        up to :data:`RAGGED_VECTORS` vectors), the inner reductions unrolled within ``S.unroll``: as computed
        at its reader, its loops were scalar with the reduction innermost (a separable pooling's row sums
        at Gensor's P3: 1.5x faster in all, contended). Returns the vector's width: a longer loop is split
        (``last`` then no longer exists: AVX2's float64 rows of 82 at Gensor-style pooling fell back)."""
        sch, lanes = self.sch, self.space.lanes
        sch.reorder(*reduce, last)
        width = int(sch.get(last).extent)
        if width > RAGGED_VECTORS * lanes:
            # a longer row in pieces of its largest divisor within that, ragged or not (82 = 2 x 41 for AVX2's 8
            # lanes: vectors of 41; whole vectors divided none of it, and Gensor's P2 summed its rows in scalars)
            width = largest_divisor(width, RAGGED_VECTORS * lanes)
            last = sch.split(last, [None, width])[1]
        if width > 1:
            sch.vectorize(last)
        budget = self.config.get(f"{stage.name}.unroll", 1)
        for loop in reversed(reduce):
            extent = int(sch.get(loop).extent)
            if extent > budget:
                break
            sch.unroll(loop)
            budget //= extent
        init = sch.decompose_reduction(block, reduce[0])
        init_last = sch.get_loops(init)[-1]
        if int(sch.get(init_last).extent) <= RAGGED_VECTORS * lanes:
            sch.vectorize(init_last)
        return width
