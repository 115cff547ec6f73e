"""Data races and unwritten outputs of a CPU kernel, found in its lowered TIR.

A kernel whose result depends on timing (right in one run, wrong in the next under load) has a data race:
two iterations of a ``parallel`` loop, run by different threads, store to the same element (a scratch
buffer allocated above the parallel loop and written by every iteration, a cache stage attached above it,
partial sums added into a shared buffer), or it leaves an output element unwritten, so a check reads what
the buffer held before (right when an earlier run had written it). Neither shows in a schedule's trace;
both show in the index arithmetic of the function TVM compiles.

:func:`lowered_function` runs TVM's own TIR pipeline (the one ``tvm.compile`` runs) up to the split into
host and device code and returns the function there: flat buffers, ``parallel`` and vectorized loops,
scratch allocations where TVM placed them (``AllocBuffer``, after ``PlanAndUpdateBufferAllocationLocation``,
``CompactBufferAllocation`` and ``StorageRewrite``), ``let`` bindings from common-subexpression elimination.
:func:`find_races` walks it and evaluates, with NumPy, the flat index of every store inside a ``parallel``
loop into a buffer allocated outside that loop (or a parameter), for every iteration of the loops around it
and every vector lane, guards applied; then reports each buffer that two iterations of the parallel loop
store to at one index: ``same elements`` when the index does not depend on the parallel loop at all (every
thread writes it), ``overlap`` when it does but two iterations still meet. A store it cannot evaluate (an
index read from memory, too many points) is reported ``unchecked``: conservative, to be judged by reading
the IR. A store whose guard reads memory is counted as executed. The same evaluation reports ``out of
bounds`` the stores (into a parameter, or inside a parallel loop into a buffer allocated outside it) whose
index falls outside the buffer they store through: a write into other memory, an input or a scratch buffer
the next reader then takes as data. :func:`unwritten` counts the elements of a buffer that no store of the
function writes.

>>> from tvm.script import tirx as T
>>> @T.prim_func(s_tir=True)
... def racy(a: T.Buffer((8,), "float32"), out: T.Buffer((8,), "float32")):
...     tmp = T.alloc_buffer((1,), "float32")  # one scratch element above the parallel loop
...     for i in T.parallel(8):
...         tmp[0] = a[i] * T.float32(2)
...         out[i] = tmp[0]
>>> [str(race) for race in find_races(lowered_function(racy))]
['tmp: same elements in every iteration of parallel loop i (1 element(s), 8 iterations)']
>>> @T.prim_func(s_tir=True)
... def fine(a: T.Buffer((8,), "float32"), out: T.Buffer((8,), "float32")):
...     for i in T.parallel(8):
...         tmp = T.alloc_buffer((1,), "float32")  # private to the iteration
...         tmp[0] = a[i] * T.float32(2)
...         out[i] = tmp[0]
>>> find_races(lowered_function(fine)), unwritten(lowered_function(fine), "out")
([], 0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

from kdsl.codegen.tvm.store_check import _BINARY
from kdsl.codegen.tvm.toolchain import default_target, load_tvm
from kdsl.lang.errors import LoweringError

__all__ = ["MAX_POINTS", "Race", "find_races", "lowered_function", "races_of_schedule", "unwritten"]

#: the most points (loop iterations times lanes) evaluated for one store; a larger one is ``unchecked``
MAX_POINTS = 1 << 24
#: the pass before which the function is taken: every TIR pass of the CPU pipeline has run by then
_LAST_PASS = "tirx.SplitHostDevice"


@dataclass(frozen=True)
class Race:
    """A finding: a buffer that two iterations of a parallel loop store to at one index (``same elements``,
    ``overlap``), or might (``unchecked``), or that a store writes outside of (``out of bounds``)."""

    buffer: str
    loop: str
    kind: str  # "same elements", "overlap", "out of bounds" or "unchecked"
    elements: int  # how many of the buffer's elements are shared (0 when unchecked)
    detail: str = ""

    def __str__(self) -> str:
        if self.kind == "unchecked":
            return f"{self.buffer}: unchecked in parallel loop {self.loop} ({self.detail})"
        if self.kind == "out of bounds":
            return f"{self.buffer}: {self.elements} store(s) out of bounds in loop {self.loop} ({self.detail})"
        where = "in every iteration" if self.kind == "same elements" else "by two or more iterations"
        counted = f"{self.elements} element(s), {self.detail}"
        return f"{self.buffer}: {self.kind} {where} of parallel loop {self.loop} ({counted})"


class _Stop(Exception):
    """Raised by the instrument once it has the function: the rest of the compile is not needed."""


def lowered_function(module: Any, target: Any = None) -> Any:
    """The ``main`` PrimFunc of ``module`` (an ``IRModule``, a PrimFunc or an ``s_tir.Schedule``) after
    every TIR pass ``tvm.compile`` runs for ``target`` (default: this machine) before it splits host from
    device code; no machine code is generated."""
    tvm = load_tvm()
    module = getattr(module, "mod", module)
    if isinstance(module, tvm.tirx.PrimFunc):
        module = tvm.IRModule({"main": module})
    seen: dict[str, Any] = {}

    @tvm.ir.instrument.pass_instrument
    class _Grab:
        def run_before_pass(self, mod: Any, info: Any) -> None:
            if info.name == _LAST_PASS and "mod" not in seen:
                seen["mod"] = mod
                raise _Stop

    try:
        with tvm.transform.PassContext(instruments=[_Grab()]):
            tvm.compile(module, target=target if target is not None else default_target())
    except Exception:  # the instrument's stop arrives as TVM's error; any other is TVM refusing the module
        if "mod" not in seen:
            raise
    if "mod" not in seen:
        raise LoweringError(f"race check: TVM's pipeline never reached {_LAST_PASS}")
    functions = {gv.name_hint: f for gv, f in seen["mod"].functions.items()}
    return functions.get("main", next(iter(functions.values())))


def races_of_schedule(sch: Any, target: Any = None) -> list[Race]:
    """:func:`find_races` of a scheduled kernel (an ``s_tir.Schedule`` or ``IRModule``) once lowered."""
    return find_races(lowered_function(sch, target))


def find_races(func: Any) -> list[Race]:
    """Every buffer that two iterations of a ``parallel`` loop of ``func`` (a lowered PrimFunc,
    :func:`lowered_function`) store to at one index; see the module docstring."""
    walker = _Walker(params=func.params)
    walker.stmt(func.body)
    return walker.races()


def unwritten(func: Any, buffer: str) -> int:
    """How many elements of ``buffer`` (a parameter of the lowered PrimFunc ``func``, by name) no store of
    ``func`` writes: an output element a kernel leaves as it was. A store it cannot evaluate raises."""
    walker = _Walker(cover=buffer)
    walker.stmt(func.body)
    if walker.unchecked_cover:
        raise LoweringError(f"race check: a store into {buffer} cannot be evaluated ({walker.unchecked_cover[0]})")
    params = [p for p in func.params if getattr(p, "name", None) == buffer]
    shape = getattr(params[0].ty, "shape", None) if params else None
    size = prod(int(d) for d in shape) if shape is not None else walker.cover_size
    if size is None:
        raise LoweringError(f"race check: {buffer} is no parameter of the function")
    written = np.unique(np.concatenate(walker.covered)) if walker.covered else np.zeros(0, dtype=np.int64)
    return int(size - np.count_nonzero((written >= 0) & (written < size)))


class _Unknown(Exception):
    """An expression this check cannot evaluate (a load from memory, an unbound variable)."""


@dataclass
class _Parallel:
    """A parallel loop on the way down: its variable, depth, and the buffers allocated inside it."""

    var: Any
    depth: int
    extent: int
    private: set[Any] = field(default_factory=set)  # the buffers (their variables) allocated inside it
    stores: dict[str, list[np.ndarray]] = field(default_factory=dict)  # buffer -> (iteration, index) pairs
    independent: set[str] = field(default_factory=set)  # buffers stored at indices the loop does not change


class _Walker:
    """The statements of a lowered function walked with an environment of NumPy arrays: a loop at depth
    ``d`` is ``arange(extent)`` on axis ``-(d + 1)`` and a store's vector lanes one axis more, so that the
    values of enclosing and enclosed variables broadcast against each other (as in :mod:`.store_check`)."""

    def __init__(self, cover: str | None = None, params: Any = ()) -> None:
        self.tvm = load_tvm()
        self.env: dict[Any, Any] = {}
        self.lets: dict[Any, Any] = {}
        self.depth = 0  # loops around the statement being walked
        self.lanes_depth = 0  # the axis a Ramp's lanes take: the depth of the store being evaluated
        self.masks: list[Any] = []
        self.parallel: list[_Parallel] = []
        self.done: list[_Parallel] = []
        self.unchecked: list[Race] = []
        self.cover, self.cover_size = cover, None
        self.covered: list[np.ndarray] = []
        self.unchecked_cover: list[str] = []
        self.alias: dict[Any, Any] = {}  # a view's buffer variable -> the buffer it views
        self.params = set(params)
        self.outside: list[Race] = []  # stores outside their buffer

    def _root(self, buffer: Any) -> Any:
        while buffer in self.alias:
            buffer = self.alias[buffer]
        return buffer

    def races(self) -> list[Race]:
        found = [*self.outside, *self.unchecked]
        for loop in self.done:
            name = loop.var.name
            for buffer, pairs in loop.stores.items():
                unique = np.unique(np.concatenate(pairs), axis=0)  # one row per (iteration, index)
                indices, counts = np.unique(unique[:, 1], return_counts=True)
                shared = indices[counts > 1]
                if not shared.size:
                    continue
                if buffer in loop.independent:
                    detail = f"{int(counts.max())} iterations"
                    found.append(Race(buffer, name, "same elements", int(shared.size), detail))
                else:
                    detail = f"index {int(shared[0])} by {int(counts[counts > 1][0])} iterations"
                    found.append(Race(buffer, name, "overlap", int(shared.size), detail))
        return found

    def stmt(self, node: Any) -> None:
        tirx = self.tvm.tirx
        if isinstance(node, tirx.SeqStmt):
            for child in node.seq:
                self.stmt(child)
        elif isinstance(node, (tirx.Bind, getattr(tirx, "LetStmt", tirx.Bind))):
            self.lets[node.var] = node.value  # flat in TVM 0.27: in force for the rest of its sequence
            body = getattr(node, "body", None)
            if body is not None:
                self.stmt(body)
        elif isinstance(node, tirx.AllocBuffer):
            for loop in self.parallel:
                loop.private.add(node.buffer)
            body = getattr(node, "body", None)
            if isinstance(body, tirx.Stmt):
                self.stmt(body)
        elif isinstance(node, tirx.DeclBuffer):
            # a view (``out_1 = T.decl_buffer(data=out.data)``): its stores are stores into the buffer it views
            source = getattr(node.data, "args", None)
            if source and isinstance(source[0], tirx.Var):
                self.alias[node.buffer] = self._root(source[0])
            body = getattr(node, "body", None)
            if isinstance(body, tirx.Stmt):
                self.stmt(body)
        elif isinstance(node, tirx.For):
            self._loop(node)
        elif isinstance(node, tirx.IfThenElse):
            condition = self._maybe(node.condition)
            self.masks.append(condition)
            self.stmt(node.then_case)
            self.masks.pop()
            if node.else_case is not None:
                self.masks.append(None if condition is None else np.logical_not(condition))
                self.stmt(node.else_case)
                self.masks.pop()
        elif isinstance(node, tirx.BufferStore):
            self._store(node)
        else:
            body = getattr(node, "body", None)  # AttrStmt, DeclBuffer, AssertStmt, While: walk what they hold
            if isinstance(body, tirx.Stmt):
                self.stmt(body)

    def _loop(self, node: Any) -> None:
        tirx = self.tvm.tirx
        try:
            start, extent = int(node.min), int(node.extent)
        except (TypeError, ValueError):
            raise LoweringError(f"race check: loop {node.loop_var.name} has extent {node.extent}") from None
        self.env[node.loop_var] = (np.arange(extent, dtype=np.int64) + start).reshape((extent,) + (1,) * self.depth)
        loop = _Parallel(node.loop_var, self.depth, extent) if node.kind == tirx.ForKind.PARALLEL else None
        if loop is not None:
            self.parallel.append(loop)
        self.depth += 1
        self.stmt(node.body)
        self.depth -= 1
        if loop is not None:
            self.parallel.pop()
            self.done.append(loop)

    def _store(self, node: Any) -> None:
        root = self._root(node.buffer)
        name = root.name
        shared = [loop for loop in self.parallel if root not in loop.private]
        covering = self.cover is not None and name == self.cover
        if not shared and not covering and root not in self.params:
            return
        keep = {self.depth - loop.depth for loop in shared}  # the parallel loops' axes, never collapsed
        try:
            index, mask = self._points(node, keep)
        except _Unknown as error:
            for loop in shared:
                self.unchecked.append(Race(name, loop.var.name, "unchecked", 0, str(error)))
            if covering:
                self.unchecked_cover.append(str(error))
            return
        shape = np.broadcast_shapes(index.shape, mask.shape)
        written = np.broadcast_to(index, shape)[np.broadcast_to(mask, shape)]
        if covering:
            self.covered.append(written)
        self._bounds(node, name, written)
        for loop in shared:
            axis = self.depth - loop.depth  # the parallel loop's axis in the point arrays
            if index.shape[axis] == 1:  # every iteration computes the same indices
                loop.independent.add(name)
            shape = list(np.broadcast_shapes(index.shape, mask.shape))
            shape[axis] = loop.extent
            points = tuple(shape)
            if prod(points) > MAX_POINTS:
                self.unchecked.append(Race(name, loop.var.name, "unchecked", 0, f"{prod(points)} points"))
                continue
            iterations = np.arange(loop.extent).reshape((-1,) + (1,) * (self.depth - axis))
            runs = np.broadcast_to(mask, points)
            pairs = np.stack([np.broadcast_to(iterations, points)[runs], np.broadcast_to(index, points)[runs]], 1)
            loop.stores.setdefault(name, []).append(np.unique(pairs, axis=0))

    def _bounds(self, node: Any, name: str, written: np.ndarray) -> None:
        """Record the store's indices outside the buffer it stores through (a write into other memory: an
        input or another scratch buffer, whose next reader then computes garbage)."""
        shape = getattr(getattr(node.buffer, "ty", None), "shape", None)
        try:
            size = prod(int(d) for d in shape) if shape is not None else None
        except (TypeError, ValueError):
            size = None
        if size is None or not written.size:
            return
        outside = written[(written < 0) | (written >= size)]
        if outside.size:
            loop = self.parallel[-1].var.name if self.parallel else "-"
            detail = f"indices {int(outside.min())}..{int(outside.max())} of {size}"
            self.outside.append(Race(name, loop, "out of bounds", int(np.unique(outside).size), detail))

    def _points(self, node: Any, keep: set[int]) -> tuple[np.ndarray, np.ndarray]:
        """The store's flat index and whether it runs, each over (lane, loop iterations, outermost loop
        last): arrays with one axis per enclosing loop and the lanes first, extent 1 where they do not
        vary. A guard over loops the index does not use (other than the axes in ``keep``) is reduced over
        them: the element is written if any of those iterations writes it."""
        if len(node.indices) != 1:
            raise _Unknown(f"buffer {node.buffer.name} is not flat ({len(node.indices)} indices)")
        self.lanes_depth = self.depth
        index = np.asarray(self._expr(node.indices[0]))
        full = (1,) * (self.depth + 1 - index.ndim) + index.shape
        index = index.reshape(full)
        mask = np.asarray(True)
        for condition in self.masks:
            if condition is not None:
                mask = np.logical_and(mask, condition)
        mask = mask.reshape((1,) * (len(full) - mask.ndim) + mask.shape)
        collapse = tuple(a for a in range(len(full)) if index.shape[a] == 1 and mask.shape[a] > 1 and a not in keep)
        if collapse:
            mask = mask.any(axis=collapse, keepdims=True)
        if prod(np.broadcast_shapes(index.shape, mask.shape)) > MAX_POINTS:
            raise _Unknown(f"{prod(np.broadcast_shapes(index.shape, mask.shape))} points, more than {MAX_POINTS}")
        return index, mask

    def _maybe(self, node: Any) -> Any:
        """A guard's value, or None (counted as true) when it cannot be evaluated."""
        try:
            return self._expr(node)
        except _Unknown:
            return None

    def _expr(self, node: Any) -> Any:
        tirx, ir = self.tvm.tirx, self.tvm.ir
        if isinstance(node, tirx.IntImm):
            return np.bool_(node.value) if str(node.ty) == "bool" else np.int64(node.value)
        if isinstance(node, tirx.Var):
            if node not in self.env and node in self.lets:
                self.env[node] = self._expr(self.lets[node])
            if node not in self.env:
                raise _Unknown(f"{node.name} is not a loop or let variable")
            return self.env[node]
        if isinstance(node, tirx.Ramp):
            lanes = int(node.lanes)
            lane = np.arange(lanes, dtype=np.int64).reshape((lanes,) + (1,) * self.lanes_depth)
            return self._expr(node.base) + self._expr(node.stride) * lane
        if isinstance(node, tirx.Broadcast):
            return self._expr(node.value)
        if isinstance(node, tirx.Cast):
            return self._expr(node.value)
        if isinstance(node, tirx.Not):
            return np.logical_not(self._expr(node.a))
        if isinstance(node, tirx.Select):
            return np.where(self._expr(node.condition), self._expr(node.true_value), self._expr(node.false_value))
        if isinstance(node, ir.Call) and getattr(node.op, "name", "") == "tirx.if_then_else":
            condition, then, other = (self._expr(arg) for arg in node.args)
            return np.where(condition, then, other)
        if isinstance(node, tirx.Let):
            self.lets[node.var] = node.value
            return self._expr(node.body)
        rule: Callable[[Any, Any], Any] | None = next(
            (rule for kind, rule in _BINARY.items() if isinstance(node, getattr(tirx, kind))), None
        )
        if rule is None:
            raise _Unknown(f"no rule for {type(node).__name__}")
        return rule(self._expr(node.a), self._expr(node.b))
