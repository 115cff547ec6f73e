"""How the reads of a reduction stage's register tile reach memory, for the analytic model of
:mod:`kdsl.tune.gensor_model`: the dim a layout stores contiguously (:func:`stored_last`), the gathered
vectors per FMA that a register tile shares among the positions reusing them (:func:`gather_share`), the
loads that fill a vector of another width than the machine's (:func:`load_pieces`), and the cache levels
that hold all of a stage's data between the timed calls (:func:`resident_levels`).

>>> stored_last({"layout.x.tile": "1:8"}, "x", 4), load_pieces(7, 16)
(1, 3)
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

from kdsl.codegen.tvm.parameters import stored_last

__all__ = ["footprint", "gather_share", "load_pieces", "resident_levels", "stored_last"]


def footprint(dims: Sequence[set[int]], tile: Sequence[int]) -> int:
    """Elements of a buffer that a tile touches (a window's axes add up along one dim)."""
    return prod(sum(tile[i] - 1 for i in used) + 1 for used in dims)


def gather_share(stage: Any, tiles: Sequence[tuple[int, ...]], dims: Sequence[set[int]]) -> float:
    """Gathered vectors per FMA of a register tile one of whose reads (indexed by the stage's axes ``dims``)
    fills its vectors by a gather: 1 where every FMA of the tile needs a gathered vector of its own, less
    where the register tile runs along axes the read does not index and the FMAs there reuse the vector (a
    weight gathered along the channels serves every output position of the tile: a depthwise 3x3 with 7
    positions per channel vector measured 22 us gathered against 18 us packed, 128x14x14 on AVX-512, where
    a gather per FMA would cost 20x the FMAs).

    >>> from types import SimpleNamespace
    >>> stage = SimpleNamespace(spatial=[("C", 128), ("W", 14)])
    >>> gather_share(stage, [(4, 1, 32), (2, 1, 7)], [{0}, {1}]), gather_share(stage, [(4, 1, 32), (2, 1, 7)], [{0}])
    (1.0, 0.14285714285714285)
    """
    used = {k for axes in dims for k in axes}
    return 1.0 / prod(t[2] for k, t in enumerate(tiles[: len(stage.spatial)]) if k not in used)


def load_pieces(vf: int, lanes: int) -> int:
    """Loads that fill ``vf`` contiguous lanes: whole vectors, then the rest in power-of-two pieces (LLVM splits
    a vector load of another width so as not to read past the data: 7 lanes on AVX-512 are a load of 4, one of
    2 and one of 1, put together by inserts; the compiled depthwise 3x3 at 512x7x7 with rows of 7 on the lanes
    has, beside its 63 FMAs, 33 two-lane and 20 one-lane loads and 27 one-lane inserts).

    >>> load_pieces(16, 16), load_pieces(32, 16), load_pieces(7, 16), load_pieces(28, 16), load_pieces(12, 8)
    (1, 2, 3, 3, 2)
    """
    return vf // lanes + bin(vf % lanes).count("1")


def resident_levels(stage: Any, m: Any) -> tuple[bool, bool, bool]:
    """Whether L1, L2 and a core's share of L3 of ``m`` (its ``l1``, ``l2``, ``l3`` bytes and ``cores``) each hold
    all the data ``stage`` reads and writes (in half their capacity, the rule of
    :func:`~kdsl.tune.gensor_model.nest_traffic`): kdsl times a kernel by calling it again and again, and
    data that stays in a level between the calls is not fetched into it again (depthwise 3x3 64x28x28
    moves 430 KB a call and measured 14 us: 30 GB/s, twice what the DRAM term asked of every schedule,
    which hid each form's compute under one floor: at 128x28x28, channels on the lanes looked 2% faster
    than rows on the lanes, with several times their FMA time, and measured 53-85 us against 25-33 us).

    >>> from types import SimpleNamespace
    >>> stage = SimpleNamespace(spatial=[("C", 64), ("H", 28), ("W", 28)], reduced=[("kh", 3), ("kw", 3)],
    ...                         reads=[("x", [{0}, {1, 3}, {2, 4}]), ("w", [{0}, {3}, {4}])])
    >>> resident_levels(stage, SimpleNamespace(l1=48 * 1024, l2=1 << 20, l3=32 << 20, cores=2))
    (False, True, True)
    """
    extents = [e for _, e in stage.spatial + stage.reduced]
    nbytes = 4 * (sum(footprint(dims, extents) for _, dims in stage.reads) + prod(extents[: len(stage.spatial)]))
    return tuple(nbytes <= cap // 2 for cap in (m.l1, m.l2, m.l3 // m.cores))  # type: ignore[return-value]
