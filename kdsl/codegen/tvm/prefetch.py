"""Software prefetch of the next slab of a parallel loop's data (``S.prefetch = "next"``).

A batched product (``bmm`` at 960 x 128x128 . 128x64) reads each batch's operands once, from memory: 96 KiB a
batch, used by the 128 tasks of that batch and never again. Within a batch the hardware prefetchers see short
strided runs (four rows of ``x`` per tile, a column panel of the second operand) and fetch little ahead, so every
batch starts with its operands' misses. On a Zen 3 (2 threads) the default schedule took 20.9 ms, and 15.3 ms where
every batch read the same four cached batches instead (``docs/tune/suites_2026-11-29f/cache_bmm.py``): a quarter of
the time waited on memory.

``S.prefetch = "next"`` fetches the next slab ahead. The stage's *slab axis* (its first spatial axis, which alone
indexes the first dim of a data read, :func:`slab_axis`) is the outermost loop of the fused parallel loop, by its
outer tiles or by cache blocks of them (``S.block``): each value ``o`` of that loop covers ``R`` consecutive values of
the axis (:func:`slab_rows`: its middle and inner tiles, times the tiles of a block) in ``P`` consecutive tasks, and
TVM gives each thread a contiguous range of tasks, so a thread's next value is ``o + 1``. Task ``t`` prefetches
``1/P`` of every such read's next slab, rows ``[(o + 1) R, (o + 2) R)`` (contiguous: the buffer's other dims whole),
a few cache lines a task, into L2; the next value's operands then arrive while this value's tasks compute. Each
thread's first slab is not prefetched, and the last value's tasks prefetch their own slab again (clamped): both
cost only a few instructions.

The prefetches are ``llvm.prefetch`` calls at the top of the parallel loop's body, inserted into the scheduled
module (:func:`insert_prefetches`); no schedule primitive places a statement that is not a block.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from kdsl.codegen.tvm.blocks import StageBlock
from kdsl.codegen.tvm.store_check import _BINARY
from kdsl.codegen.tvm.toolchain import load_tvm
from kdsl.lang.errors import LoweringError

#: Values of ``S.prefetch``, the default first.
PREFETCH_CHOICES = ("none", "next")
#: Bytes of a cache line (every x86 CPU kdsl targets).
LINE_BYTES = 64
#: ``llvm.prefetch``'s locality: 2 is ``prefetcht1``, into L2 (the next slab waits a whole slab of tasks, and
#: would only push the current tasks' data out of L1).
LOCALITY = 2
#: Prefetches of one task above which they run in a loop instead of unrolled.
UNROLL_PREFETCHES = 16


def slab_axis(stage: StageBlock, weights: Collection[str]) -> str | None:
    """The axis whose next slab ``S.prefetch`` fetches: the stage's first spatial axis, longer than 1 and not
    weight-only, where it alone indexes the first dim of a read that is not a weight; ``None`` where there is none.

    >>> from kdsl import gallery
    >>> from kdsl.codegen.tvm import lower
    >>> from kdsl.codegen.tvm.blocks import analyze
    >>> [stage] = analyze(lower(gallery.load("bmm"), {"B": 4, "M": 8, "K": 8, "N": 8}))
    >>> slab_axis(stage, weights=())
    'B'
    """
    if stage.kind != "reduce" or not stage.axes:
        return None
    first = stage.axes[0]
    if first.reduce or first.extent <= 1 or first.weight_only:
        return None
    return first.label if slab_reads(stage, weights) else None


def slab_reads(stage: StageBlock, weights: Collection[str]) -> list[str]:
    """The reads of ``stage`` whose first dim its first axis alone indexes, weights left out: what ``S.prefetch``
    fetches slabs of."""
    first = stage.axes[0].index
    return [
        buffer
        for buffer, dims in stage.reads
        if buffer not in weights and dims and dims[0] == {first} and all(first not in d for d in dims[1:])
    ]


def prefetch_conflict(stage: StageBlock, config: Mapping[str, Any], weights: Collection[str]) -> str | None:
    """Why ``S.prefetch = "next"`` does not apply to ``stage`` under ``config`` (``None``: it applies). The slab
    axis must be the fused parallel loop's outermost: under cache blocks (``S.block``, which go first in that loop)
    the blocks must be of the slab axis, and without them no weight-only vector axis split into several outer
    tiles may stand ahead of it (the fused loop puts those first)."""
    s = stage.name
    if config.get(f"{s}.prefetch", "none") == "none":
        return None
    axis = slab_axis(stage, weights)
    if axis is None:
        return f"{s}: S.prefetch next needs a first spatial axis that alone indexes the first dim of a data read"
    block = config.get(f"{s}.block", "none")
    if block != "none":
        if block.split(":")[0] != axis:
            return f"{s}: S.prefetch next needs S.block none or blocks of {axis} (the blocks go first; it is {block})"
        return None
    vector = config.get(f"{s}.vector")
    if vector in stage.weight_only:
        v_extent = dict(stage.spatial)[vector]
        _, v_middle, v_inner = config.get(f"{s}.tile.{vector}", (v_extent, 1, 1))
        if v_extent // (v_middle * v_inner) > 1:
            return f"{s}: S.prefetch next needs {axis} first in the parallel loop (the weight-only vector {vector} is)"
    return None


def slab_rows(stage: StageBlock, axis: str, config: Mapping[str, Any]) -> int:
    """Values of the slab axis ``axis`` that one value of the fused parallel loop's outermost loop covers: its middle
    and inner tiles, times the outer tiles of a cache block of it (``S.block = "axis:n"``).

    >>> from types import SimpleNamespace as Stage
    >>> stage = Stage(name="s", spatial=[("M", 512), ("N", 64)])
    >>> tiles = {"s.tile.M": (128, 1, 4)}
    >>> slab_rows(stage, "M", tiles), slab_rows(stage, "M", {**tiles, "s.block": "M:16"})
    (4, 64)
    """
    extent = dict(stage.spatial)[axis]
    _, middle, inner = config.get(f"{stage.name}.tile.{axis}", (extent, 1, 1))
    block = config.get(f"{stage.name}.block", "none")
    blocks = int(block.split(":")[1]) if block != "none" and block.split(":")[0] == axis else 1
    return middle * inner * blocks


@dataclass
class PrefetchPlan:
    """One stage's prefetch: its name, its (update) block and its fused parallel loop (``SBlockRV``, ``LoopRV``)."""

    stage: str
    block: Any
    loop: Any
    rows: int  # values of the slab axis a value of the parallel loop's outermost loop covers (slab_rows)


def insert_prefetches(sch: Any, plans: Sequence[PrefetchPlan]) -> tuple[Any, list[str]]:
    """A new ``s_tir.Schedule`` of ``sch``'s module with each plan's prefetches at the top of its parallel loop's
    body, and one line per plan saying what it prefetches. :class:`LoweringError` where a plan's slab axis is not
    its parallel loop's outermost (:func:`prefetch_conflict` keeps the space from such configurations)."""
    tvm = load_tvm()
    import tvm_ffi

    tirx = tvm.tirx
    mod = sch.mod
    (gvar,) = mod.get_global_vars()
    func = mod[gvar]
    inserts: list[tuple[Any, list[Any]]] = []
    notes = []
    for plan in plans:
        loop = sch.get(plan.loop)
        realize = _realize_named(tvm_ffi, tvm, loop.body, sch.get(plan.block).name_hint)
        stmts, note = _prefetch_stmts(tirx, plan.stage, loop, realize, plan.rows)
        inserts.append((loop.loop_var, stmts))
        notes.append(note)

    def prepend(node: Any) -> Any:
        for var, stmts in inserts:
            if node.loop_var.same_as(var) and stmts:
                body = tirx.SeqStmt([*stmts, node.body])
                return tirx.For(
                    node.loop_var, node.min, node.extent, node.kind, body, node.thread_binding, node.annotations
                )
        return node

    new_func = tvm_ffi.structural_map(func, (tirx.For, prepend))
    return tvm.s_tir.Schedule(tvm.IRModule({gvar: new_func})), notes


def _realize_named(tvm_ffi: Any, tvm: Any, body: Any, name: str) -> Any:
    """The ``SBlockRealize`` of block ``name`` inside ``body``."""
    found: list[Any] = []

    def visit(node: Any) -> None:
        if node.block.name_hint == name:
            found.append(node)

    tvm_ffi.structural_walk(body, (tvm.s_tir.SBlockRealize, visit))
    if len(found) != 1:
        raise LoweringError(f"S.prefetch: {len(found)} blocks named {name} under its parallel loop, not one")
    return found[0]


def _prefetch_stmts(tirx: Any, name: str, loop: Any, realize: Any, rows: int) -> tuple[list[Any], str]:
    """The prefetch statements of one task of ``loop`` for block ``realize`` (its first iter var the slab axis,
    ``rows`` values of it a value of the loop's outermost part) and a line saying what they fetch."""
    task = loop.loop_var
    tasks = int(loop.extent)
    block = realize.block
    slab_var = block.iter_vars[0]
    values = int(slab_var.dom.extent) // rows
    per_value = tasks // values
    binding = realize.iter_values[0]
    # task t's first value of the slab axis (the loops inside the task at 0) must lie in slab t // per_value
    probes = sorted({0, per_value - 1, per_value, tasks - 1} & set(range(tasks)))
    if tasks % values or any(evaluate_index(binding, {task.name: t}) // rows != t // per_value for t in probes):
        raise LoweringError(
            f"S.prefetch: {name}'s slab axis is not its parallel loop's outermost ({binding} for {tasks} tasks)"
        )
    written = {region.source.name for region in block.writes}
    stmts: list[Any] = []
    fetched = []
    for region in block.reads:
        buffer = region.source
        first = region.region[0]
        if buffer.name in written or not first.min.same_as(slab_var.var) or int(first.extent) != 1:
            continue
        stmt, each, elements, itemsize = _slab_prefetch(tirx, buffer, task, per_value, values, rows)
        stmts.append(stmt)
        fetched.append(f"{buffer.name} ({elements * itemsize // 1024} KiB a slab, {each} lines a task)")
    note = "prefetches " + (", ".join(fetched) if fetched else "nothing (no data read is sliced by its first dim)")
    return stmts, note


def _slab_prefetch(
    tirx: Any, buffer: Any, task: Any, per_value: int, values: int, rows: int
) -> tuple[Any, int, int, int]:
    """The statement with which task ``task`` prefetches its share of ``buffer``'s next slab (the ``rows`` rows
    after its own value's, clamped to the last slab), with the lines a task, the slab's elements and the item
    size."""
    shape = [int(d) for d in buffer.shape[1:]]
    itemsize = max(1, buffer.dtype.bits * buffer.dtype.lanes // 8)
    per_line = max(1, LINE_BYTES // itemsize)
    row = prod(shape)
    elements = rows * row
    lines = -(-elements // per_line)
    each = -(-lines // per_value)  # lines a task
    next_row = tirx.min(task // per_value + 1, values - 1) * rows
    chunk = task % per_value

    def call(line: Any) -> Any:
        # the task's line-th line of the next slab, clamped to the slab's last element (the last task's lines
        # may run past it where the lines do not divide among the tasks)
        offset = tirx.min((chunk * each + line) * per_line, elements - 1)
        indices = (
            [next_row + offset // row, *_unravel(offset % row, shape)]
            if rows > 1
            else [next_row, *_unravel(offset, shape)]
        )
        address = tirx.address_of(tirx.BufferLoad(buffer, indices))
        return tirx.Evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch", address, 0, LOCALITY, 1))

    if each == 1:
        return call(0), each, elements, itemsize
    line = tirx.Var("prefetch_line", "int32")
    kind = tirx.ForKind.UNROLLED if each <= UNROLL_PREFETCHES else tirx.ForKind.SERIAL
    return tirx.For(line, 0, each, kind, call(line)), each, elements, itemsize


def evaluate_index(expr: Any, values: Mapping[str, int]) -> int:
    """The value of an integer TIR expression with its variables named in ``values`` (others 0): constants,
    variables, casts, and the binary operators the store check evaluates
    (:data:`~kdsl.codegen.tvm.store_check._BINARY`).

    >>> from kdsl.codegen.tvm.toolchain import load_tvm
    >>> tirx = load_tvm().tirx
    >>> t, i = tirx.Var("t", "int32"), tirx.Var("i", "int32")
    >>> evaluate_index(tirx.min(t // 4 + 1, 9) * 16 + i, {"t": 13})
    64
    """
    kind = type(expr).__name__
    if kind == "IntImm":
        return int(expr.value)
    if kind == "Var":
        return int(values.get(expr.name, 0))
    if kind == "Cast":
        return evaluate_index(expr.value, values)
    if kind not in _BINARY:
        raise LoweringError(f"S.prefetch: cannot evaluate an index expression of kind {kind} ({expr})")
    return int(_BINARY[kind](evaluate_index(expr.a, values), evaluate_index(expr.b, values)))


def _unravel(offset: Any, shape: Sequence[int]) -> list[Any]:
    """Row-major indices of the flat ``offset`` into a buffer of ``shape``."""
    indices = []
    stride = prod(shape)
    for k, dim in enumerate(shape):
        stride //= dim
        index = offset // stride if stride > 1 else offset
        indices.append(index % dim if k else index)  # the flat offset is within the slab: no wrap of the first
    return indices
