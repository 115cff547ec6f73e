"""Default CPU schedules for lowered kdsl operators: the schedule space at its heuristic configuration.

A lowered operator is a list of ``te.compute`` stages (:class:`kdsl.codegen.tvm.StageInfo`): contractions
(data times 0-3 weights, summed over reduced dims), reduce-only stages (pooling), element-wise products
(Shares without a Reduce) and pure copies (the views after the last stage). Unscheduled, TVM runs them as
naive scalar loop nests, ~100x slower than PyTorch. The default schedule is
``ScheduleSpace(lowered).apply(space.heuristic())`` (:mod:`kdsl.codegen.tvm.schedule_space`): one set of rules,
built from each stage's block analysis (:mod:`kdsl.codegen.tvm.blocks`: which block axes index which
buffer dim, with which stride), never from the operator's name, so it applies to operators that search
invents, and from the target machine's description (:mod:`kdsl.runtime.cpu`: vector lanes, the
register file that bounds the register tile, caches), never from constants: the same operator gets a
16-lane tile of 16 accumulators for AVX-512 and an 8-lane tile of 8 for AVX2 (``--mcpu haswell``).
:meth:`~kdsl.codegen.tvm.schedule_space.ScheduleSpace.heuristic` documents the rules: a register-tiled
micro-kernel per reduction stage (vector axis, register axis, reductions outside the tile in the block's order
with the short ones unrolled, a local accumulator laid out tile-last, weights packed along the vector axis;
one long reduction without windows (a matmul's) unrolled 4 steps inside its loop and accumulated in place in
the output rows the stage writes itself; a thin product, whose weights fit in L2 and whose short reduction
keeps a tile's data rows in L1, gives each parallel task whole output rows, accumulated in place, unless the
whole kernel stays in L2 and its weights exceed half of L1), copies folded into the write-back, zero-padded
copies materialized only where bounds checks would fall inside a vector; other stages get their outer loops
fused and parallel and their innermost loop vectorized where its reads are contiguous. A window sum or mean
(average pooling: a reduction that reads no weight) is bound by memory, not arithmetic: its vector runs along
the rows it reads, ragged where no whole vector divides them, so its input is read as it lies, and a separable pooling's
row sums are computed per tile of the column sums that read them; a row that reads its input with a stride
(a window at stride 2) is a serial loop with the window unrolled inside it, which LLVM's loop vectorizer
loads as whole vectors (a TVM vector there is a strided ramp that LLVM loads lane by lane).

Branching kernels (:mod:`kdsl.codegen.tvm.node_rules`) add stages of their own: max/min folds, FCs,
Products and the softmax's max and sum are reduction stages and get the same register-tiled
micro-kernel (the softmax's over a contiguous row keep vector lanes of partial results instead); Maps,
Blends and the softmax's division are element-wise and are inlined into readers that read each element
once, or folded into the write-back of the reduction they read, else run as a parallel vectorized pass.

**Falling back.** Every stage is applied on a copy of the schedule; if any primitive raises
(``ScheduleError``/``TVMError``: an unusual index expression, a block that cannot be inlined), that stage
gets the plain parallel schedule instead, and if even that fails it is left as it was. A schedule never
changes what a stage computes, so the fallback is only slower. :func:`default_schedule` can ``report``
what each stage got.

Not done (yet): cache blocking of long reductions (a 1024-deep matmul streams its data rows once per
weight slab), rfactor for stages that reduce everything to one value (they stay serial), packing of
data inputs (a stage whose only contiguous axis is short vectorizes with 8 or 4 lanes or not at all).

:mod:`kdsl.bench.schedule` times the default schedule against PyTorch (``python -m kdsl.bench.schedule``).
"""

from __future__ import annotations

from typing import Any

from kdsl.codegen.tvm.lowering import Lowered
from kdsl.codegen.tvm.schedule_space import ScheduleSpace


def default_schedule(lowered: Lowered, report: list[tuple[str, str]] | None = None) -> Any:
    """A CPU schedule for every stage of ``lowered`` (see the module docstring); ``report``, when given,
    receives ``(stage, what it got)`` for every stage, fallbacks included with their reason."""
    space = ScheduleSpace(lowered)
    return space.apply(space.heuristic(), fallback=True, report=report)
