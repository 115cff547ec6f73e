"""Packing copies inside their reader's loop nest (``layout.T.pack``): Goto's packing of a weight panel per block.

A packed input or weight (``layout.T.perm`` / ``layout.T.tile`` other than the identity) is copied into its
layout by ``cache_read`` + ``transform_layout``. With ``layout.T.pack = "pass"`` the copy is a parallel pass of
its own over the whole tensor before its reader runs: on matmul 512x4096x1024 that pass reads the 16 MiB weight
from memory, writes 16 MiB and the reduction reads them back. With ``"task"`` the copy is computed at the reader's
fused parallel loop (each task copies the part of ``T`` it reads into a buffer of its own), with ``"block"`` at
the loop of the reader's ``S.rblock`` blocks (each task copies one K block of its part, which then stays in L2
while the task's data tiles read it): the weight is read from memory once and its packed copy never goes back.
TVM sizes the copy's buffer to the region read below that loop (it is allocated per task).

A task whose outer tiles split an axis that ``T`` does not index copies the same part as other tasks: the
copies are repeated there (the space keeps them valid; the heuristic uses ``"block"`` where each block of copy
feeds a whole block of multiply-adds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from math import prod
from typing import Any

#: Where a packed input or weight is copied into its layout (``layout.T.pack``), first the default.
PACK_PLACES = ("pass", "task", "block")
#: Source rows a packing copy reads at once where it tiles the source's contiguous dim (:func:`copy_order`;
#: 8 was the fastest of 1, 8, 32 and 128 on weights [1024, 1024], [1024, 4096] and [4096, 1024]).
PASS_ROWS = 8


def pack_layout(config: Mapping[str, Any], name: str, shape: Sequence[int]) -> tuple[tuple[int, ...], int | None, int]:
    """``(perm, tiled dim or None, factor)`` of ``layout.<name>.*`` in ``config`` for a tensor of ``shape`` (the
    identity when unset; a tile of a whole dim that the permutation already puts last is no tile).

    >>> pack_layout({"layout.w.perm": (1, 0), "layout.w.tile": "1:32"}, "w", (64, 64))
    ((1, 0), 1, 32)
    >>> pack_layout({"layout.w.tile": "1:32"}, "w", (64, 32)), pack_layout({}, "w", (64, 32))
    (((0, 1), None, 1), ((0, 1), None, 1))
    """
    perm = tuple(config.get(f"layout.{name}.perm", tuple(range(len(shape)))))
    tile = config.get(f"layout.{name}.tile", "none")
    if tile == "none":
        return perm, None, 1
    dim, factor = (int(part) for part in tile.split(":"))
    if shape[dim] == factor and perm[-1] == dim:
        return perm, None, 1  # the whole dim is already last
    return perm, dim, factor


def is_packed(config: Mapping[str, Any], name: str, shape: Sequence[int]) -> bool:
    """Whether ``config`` lays tensor ``name`` out other than as it is passed (so it has a packing copy).

    >>> is_packed({"layout.w.perm": (1, 0)}, "w", (8, 8)), is_packed({"layout.w.perm": (0, 1)}, "w", (8, 8))
    (True, False)
    """
    perm, tiled, _ = pack_layout(config, name, shape)
    return tiled is not None or perm != tuple(range(len(shape)))


def copy_order(sch: Any, by_dim: dict[int, Any], perm: Sequence[int], tiled: int | None, inner: Any) -> list[Any]:
    """Reorder a packing copy's loops (``by_dim``: source dim -> its loop, the tiled dim's over whole tiles or
    None; ``inner`` the loop within a tile or None) and return them outermost first.

    The packed layout's own order (``[d // f for d in perm] + [tiled % f]``) stores contiguously. Where the
    tiled dim is the source's last, that order reads one tile of each source row in turn: every read is a row
    further on (4-16 KiB), a new page each time, where the hardware prefetchers never follow. Then the rows
    run in blocks of :data:`PASS_ROWS` (else 4 or 2: whichever divides them into at least two blocks) around
    the tiles: each row is read along its length, a block's rows at once (a 16 MiB weight [4096, 1024] into
    [32, 4096, 32] at 2 threads, Cascade Lake: 4.8 -> 1.9 ms). Rows that no block divides keep the layout's order.
    """
    ordered = [by_dim[d] for d in perm if by_dim[d] is not None] + ([inner] if inner is not None else [])
    rows = [d for d in perm if d != tiled and by_dim[d] is not None]
    blocked = tiled is not None and tiled == len(perm) - 1 and by_dim[tiled] is not None and inner is not None
    if blocked and rows and rows == sorted(rows):
        row_loops = [by_dim[d] for d in rows]
        extent = prod(int(sch.get(loop).extent) for loop in row_loops)
        block = next((b for b in (PASS_ROWS, 4, 2) if extent % b == 0 and extent > b), None)
        if block is not None:
            sch.reorder(*row_loops, by_dim[tiled], inner)
            fused = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
            outer, within = sch.split(fused, [None, block])
            sch.reorder(outer, by_dim[tiled], within, inner)
            return [outer, by_dim[tiled], within, inner]
    if len(ordered) > 1:
        sch.reorder(*ordered)
    return ordered


def pass_order(sch: Any, loops: Sequence[Any], layout: tuple[tuple[int, ...], int | None, int]) -> list[Any]:
    """The loops of a packing pass of its own (``loops`` in the packed layout's order, ``layout`` from
    :func:`pack_layout`) reordered by :func:`copy_order`, outermost first."""
    perm, tiled, _ = layout
    if tiled is None or len(loops) != len(perm) + 1:
        return list(loops)
    return copy_order(sch, {d: loops[i] for i, d in enumerate(perm)}, perm, tiled, loops[-1])


def compute_copy_at(
    sch: Any, copy: Any, anchor: Any, layout: tuple[tuple[int, ...], int | None, int], vectorize: Callable[[Any], None]
) -> None:
    """Move the packing copy block ``copy`` below loop ``anchor`` of its reader and loop over the region it copies
    in the packed layout's order (``[d // f for d in perm] + [tiled % f]``), the last loop vectorized: stores run
    along the packed buffer, as in the pass of its own (a store per cache line otherwise)."""
    sch.compute_at(copy, anchor, preserve_unit_loops=True)
    loops = sch.get_loops(copy)
    depth = next(i for i, lp in enumerate(loops) if sch.get_sref(lp).same_as(sch.get_sref(anchor)))
    region = list(loops[depth + 1 :])
    perm, tiled, factor = layout
    if len(region) != len(perm):
        return  # TVM left out a loop of the region: keep its order (correct, only slower stores)
    by_dim: dict[int, Any] = dict(enumerate(region))
    inner = None
    if tiled is not None:
        extent = int(sch.get(by_dim[tiled]).extent)
        if extent % factor:
            return  # the region cuts the layout's tiles: no whole tile to store at once
        if extent > factor:
            by_dim[tiled], inner = sch.split(by_dim[tiled], [None, factor])
        else:
            by_dim[tiled], inner = None, by_dim[tiled]
    ordered = copy_order(sch, by_dim, perm, tiled, inner)
    last = ordered[-1]
    if int(sch.get(last).extent) % 4 == 0:
        vectorize(last)
