"""Where a CUDA kernel's stores land, computed from its lowered TIR for every block and thread of the grid.

A GPU race of the kind split-K once had (a tile's partial sums written past the output's end, over the
next slice's sums: conv1d at conv5_x on an H200) cannot be seen by running the kernel on a CPU or by TVM's
GPU verification, which checks resources, not indices. It can be seen in the index arithmetic: this
module walks a device kernel (``tirx.PrimFunc`` after TVM's lowering: flat buffers, ``launch_thread``,
``if`` guards, ``let`` bindings, loops) along the paths that reach the stores into one buffer, evaluates
each store's flat index and every guard above it with NumPy for **all** ``(blockIdx, threadIdx, loop
iteration)`` at once (one array axis per launch dimension or loop on the path), and keeps the indices of
the stores whose guards hold.

:func:`store_indices` gives those indices; :func:`cover_problems` checks that they write each element of
a buffer exactly once: an index outside the allocation is an out-of-bounds write, one written twice is a
race between the threads (or a slice's overwrite), one never written is read unset by the next kernel.

>>> import numpy as np
>>> from tvm.script import tirx as T
>>> @T.prim_func(s_tir=True)
... def tail(a_ptr: T.handle("float32", "global")):
...     a = T.decl_buffer((49,), data=a_ptr)
...     with T.launch_thread("blockIdx.x", 2) as bx:
...         with T.launch_thread("threadIdx.x", 32) as tx:
...             if bx * 32 + tx < 49:
...                 a[bx * 32 + tx] = T.float32(0)
>>> store_indices(tail, "a").size, cover_problems(store_indices(tail, "a"), "a", 49)
(49, [])
>>> cover_problems(store_indices(tail, "a"), "a", 40)  # as if the buffer were 40 long
['a: 9 stores outside its 40 elements (indices 40..48)']
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from typing import Any

import numpy as np

from kdsl.codegen.tvm.toolchain import load_tvm
from kdsl.lang.errors import LoweringError

__all__ = ["MAX_POINTS", "cover_problems", "store_indices"]

#: the most (block, thread, loop iteration) points evaluated for one store: a store inside a long serial
#: loop (a plain stage's reduction) would need more memory than the check is worth
MAX_POINTS = 1 << 25


def store_indices(func: Any, buffer: str | None, value_from: str | None = None) -> np.ndarray:
    """The flat index of every store into ``buffer`` (its name, ``.`` read as ``_``; ``None``: any buffer)
    that kernel ``func`` executes, over its whole grid, guards applied: one entry per executed store
    (repeats are kept).

    ``value_from``: only the stores of a value loaded from that buffer (a register tile's write-back). TVM
    places intermediates of different kernels in one allocation under one of their names, so in a kernel
    the name of the buffer stored to need not be the intermediate's own."""
    if buffer is None and value_from is None:
        raise LoweringError("store check: name the buffer stored to, the buffer whose values are stored, or both")
    walker = _Walker(func, _spellings(buffer) if buffer else None, _spellings(value_from) if value_from else None)
    walker.stmt(func.body, np.bool_(True), 0)
    if not walker.found:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(walker.found)


def cover_problems(indices: np.ndarray, buffer: str, size: int) -> list[str]:
    """What is wrong with the stores at ``indices`` (:func:`store_indices`) into ``buffer`` of ``size``
    elements, a buffer meant to be written once per element (a split-K kernel's partial sums): writes
    outside ``[0, size)``, elements written more than once, elements never written. Empty when the stores
    are an exact cover."""
    problems = []
    outside = indices[(indices < 0) | (indices >= size)]
    if outside.size:
        problems.append(
            f"{buffer}: {outside.size} stores outside its {size} elements (indices {outside.min()}..{outside.max()})"
        )
    inside = indices[(indices >= 0) & (indices < size)]
    counts = np.bincount(inside, minlength=size)
    if (counts > 1).any():
        first = int(np.argmax(counts > 1))
        problems.append(
            f"{buffer}: {int((counts > 1).sum())} elements written more than once (element {first}: "
            f"{int(counts[first])} times)"
        )
    if (counts == 0).any():
        first = int(np.argmax(counts == 0))
        problems.append(f"{buffer}: {int((counts == 0).sum())} elements never written (element {first})")
    return problems


class _Walker:
    """The statements of one kernel walked with an environment of NumPy arrays: a variable bound at depth
    ``d`` (a launch dimension or loop) is ``arange(extent)`` on array axis ``-(d + 1)``, so that values of
    enclosing and enclosed variables broadcast against each other."""

    def __init__(self, func: Any, names: set[str] | None, sources: set[str] | None) -> None:
        self.tvm = load_tvm()
        self.names = names
        self.sources = sources
        self.env: dict[Any, Any] = {}
        self.lets: dict[Any, Any] = {}
        self.found: list[np.ndarray] = []
        self.paths: dict[Any, bool] = {}

    def reaches(self, node: Any) -> bool:
        """Whether a store into the buffer is inside ``node`` (so that loops around other work are skipped)."""
        key = node  # TVM nodes hash by their object: the same statement is one key however it was reached
        if key not in self.paths:
            tirx = self.tvm.tirx
            if isinstance(node, tirx.BufferStore):
                hit = (self.names is None or node.buffer.name in self.names) and (
                    self.sources is None
                    # a load is a TensorLoad in TVM 0.27, its buffer the ``source``
                    or getattr(getattr(node.value, "source", None), "name", None) in self.sources
                )
            elif isinstance(node, tirx.SeqStmt):
                hit = any([self.reaches(child) for child in node.seq])
            elif isinstance(node, tirx.IfThenElse):
                hit = self.reaches(node.then_case) or (node.else_case is not None and self.reaches(node.else_case))
            else:
                body = getattr(node, "body", None)
                hit = isinstance(body, tirx.Stmt) and self.reaches(body)
            self.paths[key] = hit
        return self.paths[key]

    def axis(self, extent: int, start: int, depth: int) -> np.ndarray:
        return (np.arange(extent, dtype=np.int64) + start).reshape((extent,) + (1,) * depth)

    def stmt(self, node: Any, mask: Any, depth: int) -> None:
        tirx = self.tvm.tirx
        if isinstance(node, tirx.SeqStmt):
            for child in node.seq:
                self.stmt(child, mask, depth)
        elif isinstance(node, (tirx.Bind, tirx.LetStmt)):
            # bindings come before their uses; in TVM 0.27 a binding is flat (in force for the rest of its
            # sequence). Evaluated when first used: a binding that no store needs may read memory, which this
            # check cannot evaluate
            self.lets[node.var] = node.value
            body = getattr(node, "body", None)  # a LetStmt of older TVMs scopes a body
            if body is not None:
                self.stmt(body, mask, depth)
        elif not self.reaches(node):
            return
        elif isinstance(node, tirx.AttrStmt):
            if node.attr_key == "thread_extent":
                self.env[node.node.var] = self.axis(int(node.value), 0, depth)
                depth += 1
            self.stmt(node.body, mask, depth)
        elif isinstance(node, tirx.For):
            if node.step is not None and not (isinstance(node.step, tirx.IntImm) and node.step.value == 1):
                raise LoweringError(f"store check: loop {node.loop_var.name} has a step of {node.step}")
            self.env[node.loop_var] = self.axis(int(node.extent), int(node.min), depth)
            self.stmt(node.body, mask, depth + 1)
        elif isinstance(node, tirx.IfThenElse):
            condition = self.expr(node.condition)
            self.stmt(node.then_case, mask & condition, depth)
            if node.else_case is not None:
                self.stmt(node.else_case, mask & ~condition, depth)
        elif isinstance(node, tirx.BufferStore):  # reaches(): one into the buffer, of a value from the source
            self.store(node, mask, depth)
        else:
            raise LoweringError(f"store check: no rule for {type(node).__name__} on the way to a store")

    def store(self, node: Any, mask: Any, depth: int) -> None:
        if len(node.indices) != 1:
            raise LoweringError(f"store check: buffer {node.buffer.name} is not flat ({len(node.indices)} indices)")
        index = self.expr(node.indices[0])
        shape = np.broadcast_shapes(np.shape(index), np.shape(mask))
        if prod(shape) > MAX_POINTS:
            raise LoweringError(f"store check: {prod(shape)} points for a store into {node.buffer.name}")
        self.found.append(np.broadcast_to(index, shape)[np.broadcast_to(mask, shape)].astype(np.int64))

    def expr(self, node: Any) -> Any:
        tirx = self.tvm.tirx
        if isinstance(node, tirx.IntImm):
            return np.bool_(node.value) if str(node.ty) == "bool" else np.int64(node.value)
        if isinstance(node, tirx.Var):
            if node not in self.env and node in self.lets:
                self.env[node] = self.expr(self.lets.pop(node))
            if node not in self.env:
                raise LoweringError(f"store check: {node.name} is not bound on the way to the store")
            return self.env[node]
        if isinstance(node, tirx.Cast):
            return self.expr(node.value)
        if isinstance(node, tirx.Not):
            return ~self.expr(node.a)
        if isinstance(node, tirx.Select):
            return np.where(self.expr(node.condition), self.expr(node.true_value), self.expr(node.false_value))
        if isinstance(node, self.tvm.ir.Call) and getattr(node.op, "name", "") == "tirx.if_then_else":
            condition, then, other = (self.expr(arg) for arg in node.args)
            return np.where(condition, then, other)
        if isinstance(node, tirx.Let):
            self.lets[node.var] = node.value
            return self.expr(node.body)
        for kind, rule in _BINARY.items():
            if isinstance(node, getattr(tirx, kind)):
                return rule(self.expr(node.a), self.expr(node.b))
        raise LoweringError(f"store check: no rule for the expression {node} ({type(node).__name__})")


def _spellings(name: str) -> set[str]:
    """A buffer's name as TIR and the CUDA source spell it (``stage0.rf`` is ``stage0_rf`` once lowered)."""
    return {name, name.replace(".", "_")}


def _truncdiv(a: Any, b: Any) -> Any:
    quotient = np.abs(a) // np.abs(b)
    return np.where((np.asarray(a) < 0) != (np.asarray(b) < 0), -quotient, quotient)


#: TIR's binary expressions as NumPy operations (FloorDiv/FloorMod round down, Div/Mod toward zero)
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "FloorDiv": np.floor_divide,
    "FloorMod": np.mod,
    "Div": _truncdiv,
    "Mod": lambda a, b: a - _truncdiv(a, b) * b,
    "Min": np.minimum,
    "Max": np.maximum,
    "LT": np.less,
    "LE": np.less_equal,
    "GT": np.greater,
    "GE": np.greater_equal,
    "EQ": np.equal,
    "NE": np.not_equal,
    "And": np.logical_and,
    "Or": np.logical_or,
}
