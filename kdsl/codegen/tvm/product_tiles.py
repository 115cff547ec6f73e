"""The heuristic's register tile for a product of data inputs: a short vector axis taken whole.

A batched matmul (``bmm``, ``bmm_tn``) or attention's scores multiply two data inputs: no weight is
packed into panels (packing a data input would be a second pass over it: 126 MB at OpEvo's BMM2), so
the operand under the vector axis is read as it lies, a row of ``N`` a whole dim apart from the next.
With ``N`` of at most :data:`~kdsl.codegen.tvm.schedule_space.SHORT_VECTORS` whole vectors taken whole,
a register tile reads each row of that operand as one contiguous run and each broadcast of the other
operand feeds every vector of the row: 4 vectors x 4 rows take 8 loads a step, where 2 vectors x 8 rows
took 10. Measured (``docs/tune/README.md``, "Batched matmuls"): OpEvo's BMM1-3 1.13-1.16x faster.

The space imports this module (never the other way round), so the function takes the space untyped.
"""

from __future__ import annotations

from typing import Any

from kdsl.codegen.tvm.blocks import Axis, StageBlock


def whole_product_rows(space: Any, stage: StageBlock, vector: Axis | None, vf: int, short: int) -> int:
    """The vector tile ``vf`` of reduction ``stage`` widened to its whole ``vector`` axis where the stage
    reads two or more buffers and no weight (a product of data inputs), the axis is read contiguously, is at
    most ``short`` whole vectors of ``space``'s lanes, and the register tile still keeps two rows or more;
    else ``vf`` as it was.

    >>> from kdsl import gallery
    >>> from kdsl.codegen.tvm import lower
    >>> from kdsl.codegen.tvm.schedule_space import ScheduleSpace
    >>> from kdsl.runtime.cpu import from_features
    >>> avx512 = from_features("skylake-avx512", {"avx512f", "fma"}, cores=2, ghz=3.0)
    >>> space = ScheduleSpace(lower(gallery.load("bmm"), {"B": 2, "M": 8, "K": 8, "N": 64}), avx512)
    >>> [space.heuristic()[f"n2_product.tile.{a}"] for a in "MN"]
    [(2, 1, 4), (1, 1, 64)]
    """
    weights = {w.name for w in space.lowered.weights}
    buffers = {buffer for buffer, _ in stage.reads}
    if vector is None or vector.gathers or len(buffers) < 2 or buffers & weights:
        return vf
    lanes, extent = space.lanes, vector.extent
    if not vf < extent <= short * lanes or extent % lanes:
        return vf
    _, rows = space._register_axis(stage, vector, space.accumulators // (extent // lanes))
    return extent if rows >= 2 else vf
