"""The TVM backend: bottom-up coordinate expressions lowered to ``te.compute`` stages.

The operator's stage plan (:func:`kdsl.solve.plan`, the same plan the PyTorch backend lowers)
gives a sequence of views and contraction stages. Each contraction stage becomes one
``te.compute``: its spatial axes are the stage's result dims, its reduction axes the dims it
reduces, and its body reads the previous stage's tensor at the coordinate obtained by walking
the views in between *bottom-up* with the primitives' own coordinate rules (:mod:`kdsl.lang.index`,
turned into TIR here; a window's read is guarded by ``0 <= . < N``, N the dim's size, never the
window's), times every weight it shares. Views after the last stage become a final copy stage.

:func:`lower_chain` lowers a chain onto any TE tensor: :func:`lower` lowers every chain node of an
operator with it (a linear operator's one chain with plain stage names, a branching operator's with
stage names prefixed). The kernel built from these stages is :mod:`kdsl.codegen.tvm.kernel`'s.

**Nodes.** Every node of the graph has one rule in :data:`GRAPH_RULES` (a test checks that none is missing). A
rule reads its arguments' TE tensors by dim name and returns its own result:

=========  ==================================================================================
Chain      the linear chain lowered onto its argument's tensor (:func:`.lowering.lower_chain`,
           the same stages as a plain operator's, names prefixed ``n<i>_``)
Map        one element-wise stage (``max(x, 0)``, ``|x|``, ``-x``, sin, exp, sigmoid, tanh,
           GELU with ``erf``, ``by * x``)
Fold       a max (min) reduction stage over order keys (integers ordered as the floats, NaN
           first: :func:`.elementwise.order_key`) and an element-wise stage reading the floats back;
           when its argument is a chain with a window, padded elements take no part (below)
Softmax    three stages: the max (over order keys), the sum of ``exp(x - max)``, and
           ``exp(x - max) / sum``
FC         one sum reduction stage of the data times the weight ``[o, *dims]``
Rename     no stage: the same tensor with one dim called otherwise
Blend      one element-wise stage; a branch that lacks a dim is read without it (broadcast)
Product    one sum reduction stage over the reduced dims; a name indexes both branches
=========  ==================================================================================

**Chains read through their views.** A chain whose readers are all reductions (Fold, FC, Product) is
not materialized: they read its input through its views (:data:`VIEW_READERS`), so an Unfold's K-fold
copy never exists (involution at conv2_x, 1 thread: 2.7 -> 0.36 ms).

**Fold and window padding.** The reference's rule: an element that is a window's zero padding takes
no part in a max (min) fold (``F.max_pool2d``'s padding), and where no element takes part the result
is 0. A NaN among the elements that take part makes the result NaN, as ``torch.amax`` and
``F.max_pool2d`` (the fold runs on :func:`.elementwise.order_key` integers). A fold reading a chain
of views reads the chain's input through them, with ``-inf`` (``+inf``) instead of zero where a
window reads past its dim (in the padded copy of the input, or in the bounds check that the scheduler
puts back). Whether every output element has a valid read is decided here from the windows' guards,
evaluated once over the dims they mention; where it is not so, a second reduction counts valid reads and the result is 0
where there are none. A chain with a contraction stage and a window (a convolution whose window dim
is then folded) gets the reference's own scheme: the chain lowered a second time on ones (input and
weights) gives the mask of elements that read data. (Folding order keys, a fold whose valid elements
are all -inf gives -inf, as the reference; ``te.max`` over floats gave the lowest finite float.)

Stage names are unique across the kernel: ``n<i>_<what>`` for node ``i``; the output is ``out`` when
the last node's result needs a final transposition (else the last node's stage).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

from kdsl import solve
from kdsl.codegen.tvm.elementwise import BLEND_FORMS, MAP_FORMS, exp, from_order_key, order_key
from kdsl.lang.errors import DivisibilityError, KdslError, LoweringError
from kdsl.lang.index import Add, Const, Cyclic, FloorDiv, Half, Index, Mod, Scale, SizeOf, Var, evaluate, walk_up
from kdsl.lang.nonlinear import FC, BlendJoin, Fold, Map, ProductJoin, Rename, Softmax
from kdsl.lang.operator import Node, Operator
from kdsl.lang.primitives import CONTRACTION, REDUCTION, Primitive, Weight
from kdsl.lang.sizes import Size
from kdsl.solve.constraints import resolve_binding
from kdsl.solve.layers import as_layer


def load_tvm() -> Any:
    """Import tvm with this machine's thread settings, or explain how to install it."""
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    # Unpinned threads: pinned TVM workers slow PyTorch in the same process (TVM.md), and pinning bought
    # nothing here (syno_op1 at conv3_x timed the same either way; on these VMs a kernel's time drifts
    # by up to 1.5x between processes and minutes whatever the setting: compare alternated runs only).
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    try:
        import tvm
        import tvm.te
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise LoweringError(
            f"the TVM backend needs apache-tvm ({error}); install it with: pip install 'kdsl[tvm]' "
            "(apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1)"
        ) from None
    return tvm


def error_reason(error: Exception) -> str:
    """The informative line of a (possibly very long) TVM error, at most 300 characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Error message:") or ("Error:" in line and "schedule primitive" not in line):
            return line[:300]
    return (lines[-1] if lines else type(error).__name__)[:300]


def invertible_copy(block: Any) -> bool:
    """Whether ``reverse_compute_inline`` may fold the copy ``block`` (a TIR ``SBlock``) into its producer.

    The copy must read one buffer, as many elements as it writes, at indices built only from sums of
    its iter vars times constants, ``// c`` and ``% c`` (the fused splits that Split and Merge produce),
    with every iter var of extent > 1 used (a broadcast is not a bijection). A constant term is refused:
    TVM 0.27 accepted the read ``stage0[(v + 1) // 2]`` (``v`` in [0, 2), a bijection) as affine and
    inverted it to ``out[2*v - 1]`` under ``T.where(v == 1)``, so ``out[0]`` was never written. Anything
    else stays a separate pass, which is only slower."""
    tvm = load_tvm()
    tirx = tvm.tirx
    if len(block.reads) != 1 or len(block.writes) != 1:
        return False
    used: list[Any] = []

    def plain(expr: Any) -> bool:
        if isinstance(expr, tirx.Var):
            used.append(expr)
            return True
        if isinstance(expr, tirx.Add):
            return plain(expr.a) and plain(expr.b)
        if isinstance(expr, tirx.Mul):
            if isinstance(expr.b, tirx.IntImm):
                return int(expr.b.value) > 0 and plain(expr.a)
            if isinstance(expr.a, tirx.IntImm):
                return int(expr.a.value) > 0 and plain(expr.b)
            return False
        if isinstance(expr, (tirx.FloorDiv, tirx.FloorMod)):
            return isinstance(expr.b, tirx.IntImm) and int(expr.b.value) > 0 and plain(expr.a)
        return False

    for rng in block.reads[0].region:
        if isinstance(rng.min, tirx.IntImm) and int(rng.min.value) == 0:
            continue  # a size-1 dim of the producer
        if not plain(rng.min):
            return False
    every_var = all(any(iv.var.same_as(u) for u in used) for iv in block.iter_vars if int(iv.dom.extent) > 1)
    # as many elements read as written: a strided read (out[i] = y[2*i]) covers only part of its producer
    same_count = prod(int(iv.dom.extent) for iv in block.iter_vars) == prod(int(n) for n in block.reads[0].source.shape)
    return every_var and same_count


def default_target(mcpu: str | None = None) -> Any:
    """An LLVM target naming ``mcpu`` (else LLVM emits SSE2 code) and the cores ``TVM_NUM_THREADS`` gives.

    ``mcpu``: an LLVM CPU name (``haswell``, ``znver3``, ``skylake-avx512``); by default the one that
    ``KDSL_MCPU`` names, else this machine's. Code for an older CPU runs here (an AVX-512 machine runs
    ``haswell``'s AVX2 code), so the option measures another ISA's case on one machine; a name LLVM
    does not know is a :class:`~kdsl.lang.errors.LoweringError` naming it."""
    tvm = load_tvm()
    from tvm.target import codegen

    mcpu = mcpu or os.environ.get("KDSL_MCPU") or str(codegen.llvm_get_system_cpu())
    if not codegen.llvm_is_valid_cpu(mcpu, str(codegen.llvm_get_system_triple())):
        raise LoweringError(
            f"mcpu {mcpu!r} is not a CPU LLVM knows for {codegen.llvm_get_system_triple()} "
            f"(e.g. haswell, znver3, skylake-avx512, sapphirerapids; this machine is {codegen.llvm_get_system_cpu()})"
        )
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": int(os.environ["TVM_NUM_THREADS"])})


@dataclass
class StageInfo:
    """What the scheduler needs to know about one compute stage."""

    name: str
    spatial: list[str]  # dim names of the output axes, in order
    reduced: list[str]  # dim names of the reduction axes, in order
    weight_only: set[str] = field(default_factory=set)  # spatial dims that only weights index
    is_copy: bool = False  # a pure view (no contraction)
    is_pad: bool = False  # a zero-padded copy of a tensor that a window (Unfold) reads past the edges
    padded: tuple[int, ...] = ()  # for a pad stage: the positions of the padded dims
    reads_from: tuple[str, ...] = ()  # the stages (pads included) whose results this stage reads
    elementwise: bool = False  # a branching kernel's element-wise stage (Map, Blend, ...): it may be inlined
    lane_reduce: bool = False  # a branching kernel's reduction that may keep vector lanes of partial results


@dataclass
class Lowered:
    """An operator (or a branching kernel) lowered to TE for one layer."""

    op: Operator
    binding: dict[str, int]
    x: Any
    weights: list[Any]
    out: Any
    stages: list[StageInfo]
    output_shape: tuple[int, ...]

    def prim_func(self) -> Any:
        tvm = load_tvm()
        func = tvm.te.create_prim_func([self.x, *self.weights, self.out])
        return func.with_attr("global_symbol", "main")

    def module(self) -> Any:
        tvm = load_tvm()
        return tvm.IRModule({"main": self.prim_func()})


def _sizes_along(plan: Any, binding: Mapping[str, int]) -> list[dict[str, int]]:
    """The concrete live sizes before every step of the plan, and after the last one."""
    return [{name: int(size.evaluate(binding)) for name, size in live} for live in plan.live]


@dataclass
class _Guard:
    """The validity condition of a windowed read: ``0 <= coordinate < size`` of dim ``dim``.

    ``pad`` is the (low, high) zero padding of ``dim`` that makes the condition always true, when the
    coordinate reaches the source tensor unchanged (no view above the Unfold touches ``dim``)."""

    condition: Any
    dim: str
    pad: tuple[int, int] | None


def _tir(tvm: Any, expr: Index, leaves: Mapping[str, Any]) -> Any:
    """An index expression over constant sizes as a TIR expression (``leaves``: the loop variables)."""
    if isinstance(expr, Var):
        return leaves[expr.name]
    if isinstance(expr, Const):
        return tvm.tirx.const(expr.value, "int32")  # the dtype of TE's axes
    if isinstance(expr, SizeOf):
        return _int(expr.size)
    if isinstance(expr, Half):
        return _int(expr.size) // 2
    if isinstance(expr, Add):
        left, right = _tir(tvm, expr.left, leaves), _tir(tvm, expr.right, leaves)
        return left + right if expr.sign > 0 else left - right
    if isinstance(expr, Scale):
        return _tir(tvm, expr.expr, leaves) * _int(expr.size)
    if isinstance(expr, FloorDiv):
        return tvm.tirx.floordiv(_tir(tvm, expr.expr, leaves), _int(expr.size))
    if isinstance(expr, Mod):
        return tvm.tirx.floormod(_tir(tvm, expr.expr, leaves), _int(expr.size))
    if isinstance(expr, Cyclic):
        return _cyclic(tvm, _tir(tvm, expr.expr, leaves), expr.offset, _int(expr.extent))
    raise LoweringError(f"no TIR form for the index expression {expr!r}")


def _int(size: Size) -> int:
    return int(size.constant)


def _walk_up(
    tvm: Any, views: list[tuple[Primitive, dict[str, int]]], coords: dict[str, Any], binding: Mapping[str, int]
) -> tuple[dict[str, Any], list[_Guard]]:
    """Walk ``views`` (each with the live sizes before it) bottom-up from ``coords``: return the
    coordinates in the tensor before the first view, and the guards that make a read valid.

    The walk is the primitives' own coordinate rules (:func:`kdsl.lang.index.walk_up`) over the steps
    evaluated at the binding, so the identities of size-1 dims apply; the result becomes TIR."""
    bound = [(step.at(binding), {name: Size.of(n) for name, n in sizes.items()}) for step, sizes in views]
    up, guards = walk_up(bound, {name: Var(name) for name in coords})
    result = {name: _tir(tvm, expr, coords) for name, expr in up.items()}
    checks = []
    for guard in guards:
        source, window = _tir(tvm, guard.expr, coords), _int(guard.window)
        # bounded by the size of the dim being unfolded, not by the window
        condition = tvm.tirx.all(source >= 0, source < _int(guard.extent))
        checks.append(_Guard(condition, guard.dim, (window // 2, window - 1 - window // 2) if guard.paddable else None))
    return result, checks


def _paddings(
    tvm: Any, views: list[tuple[Primitive, dict[str, int]]], names: Sequence[str], binding: Mapping[str, int]
) -> dict[str, tuple[int, int]]:
    """The zero padding of the source's dims that removes the guards of reads through ``views``
    (found by walking symbolic coordinates of the dims ``names``)."""
    probe = {name: tvm.tirx.Var(f"probe_{name}", "int32") for name in names}
    _, guards = _walk_up(tvm, views, probe, binding)
    pads: dict[str, tuple[int, int]] = {}
    for guard in guards:
        if guard.pad is not None and guard.pad != (0, 0):
            low, high = pads.get(guard.dim, (0, 0))
            pads[guard.dim] = (max(low, guard.pad[0]), max(high, guard.pad[1]))
    return pads


def _pad(
    tvm: Any,
    tensor: Any,
    dims: list[str],
    pads: Mapping[str, tuple[int, int]],
    name: str,
    dtype: str,
    fill: float = 0.0,
) -> Any:
    """``tensor`` with ``fill`` (zeros) around the dims of ``pads``: ``padded[i + low] = tensor[i]``."""
    shape = [int(n) + sum(pads.get(d, (0, 0))) for n, d in zip(tensor.shape, dims)]

    def compute(*indices: Any) -> Any:
        inside, source = [], []
        for index, d, n in zip(indices, dims, tensor.shape):
            low = pads.get(d, (0, 0))[0]
            if d in pads:
                inside.extend([index >= low, index < low + int(n)])
            source.append(index - low if low else index)
        value = tensor[tuple(source)]
        if not inside:
            return value
        return tvm.tirx.if_then_else(tvm.tirx.all(*inside), value, tvm.tirx.const(fill, dtype))

    return tvm.te.compute(tuple(shape), compute, name=name)


def _cyclic(tvm: Any, coordinate: Any, offset: int, extent: int) -> Any:
    """``(coordinate + offset) mod extent`` for a coordinate in ``[0, extent)``, without floormod."""
    offset %= extent
    if offset == 0:
        return coordinate
    moved = coordinate + offset
    return tvm.tirx.Select(moved >= extent, moved - extent, moved)


def _read(
    tvm: Any,
    tensor: Any,
    dims: list[str],
    coords: dict[str, Any],
    guards: list[_Guard],
    dtype: str,
    padded: tuple[Any, Mapping[str, tuple[int, int]]] | None = None,
    fill: float = 0.0,
) -> Any:
    """``tensor[coords]``, ``fill`` (zero) where a guard fails; with ``padded = (tensor, pads)`` the padded
    copy is read instead and the guards it covers are dropped."""
    if padded is not None:
        tensor, pads = padded
        coords = {d: c + pads[d][0] if d in pads else c for d, c in coords.items()}
        guards = [g for g in guards if g.pad is None or g.dim not in pads]
    value = tensor[tuple(coords[d] for d in dims)]
    if guards:
        conditions = [g.condition for g in guards]
        condition = conditions[0] if len(conditions) == 1 else tvm.tirx.all(*conditions)
        value = tvm.tirx.if_then_else(condition, value, tvm.tirx.const(fill, dtype))
    return value


def _stage_body(
    tvm: Any,
    dtype: str,
    binding: Mapping[str, int],
    weight_tensors: dict[str, Any],
    result: list[str],
    axes: dict[str, Any],
    shares: list[Weight],
    pending: list[tuple[Primitive, dict[str, int]]],
    source: Any,
    source_dims: list[str],
    mean_sizes: list[int],
    new_dims: set[str],
    padded: tuple[Any, Mapping[str, tuple[int, int]]] | None,
) -> Callable[..., Any]:
    """The ``fcompute`` of one contraction stage."""

    def compute(*indices: Any) -> Any:
        coords = dict(zip(result, indices))
        coords.update(axes)
        data_coords = {k: v for k, v in coords.items() if k not in new_dims}
        up, guards = _walk_up(tvm, pending, data_coords, binding)
        value = _read(tvm, source, source_dims, up, guards, dtype, padded)
        for weight in shares:
            value = value * weight_tensors[weight.name][tuple(coords[d.name] for d in weight.dims)]
        if mean_sizes:
            value = value * tvm.tirx.const(1.0 / prod(mean_sizes), dtype)
        if axes:
            return tvm.te.sum(value, axis=list(axes.values()))
        return value

    return compute


@dataclass
class ChainLowered:
    """A linear chain lowered onto a given tensor: its stages, and its result.

    ``tensor`` holds the result with axes ``dims`` (the chain's output dims, in order), or is ``None``
    when the chain was lowered with ``materialize=False`` and ends in views: then ``source`` (axes
    ``source_dims``) is the last tensor computed and ``views`` (each step with the live sizes before
    it) the views a reader walks bottom-up from the output coordinates (:meth:`read`)."""

    tensor: Any
    dims: list[str]
    stages: list[StageInfo]
    source: Any
    source_dims: list[str]
    views: list[tuple[Primitive, dict[str, int]]]
    binding: dict[str, int]

    def read(self, tvm: Any, coords: Mapping[str, Any], dtype: str, fill: float = 0.0) -> tuple[Any, list[Any]]:
        """The value at output ``coords`` read through the views from ``source`` (``fill`` where a window
        reads past its dim), and the guards' conditions (empty when every read is valid)."""
        up, guards = _walk_up(tvm, self.views, dict(coords), self.binding)
        return _read(tvm, self.source, self.source_dims, up, guards, dtype, None, fill), [g.condition for g in guards]


def lower_chain(
    tvm: Any,
    op: Operator,
    binding: Mapping[str, int],
    source: Any,
    source_dims: Sequence[str],
    weight_tensors: Mapping[str, Any],
    dtype: str,
    prefix: str = "",
    materialize: bool = True,
) -> ChainLowered:
    """Lower the linear chain ``op`` onto the TE tensor ``source`` (axes named ``source_dims``, the dims
    of ``op.inputs`` in any order) with the weights ``weight_tensors`` (by weight name). Stage names
    start with ``prefix`` (unique names across a branching kernel; ``""`` for a plain operator). With
    ``materialize=False`` trailing views are left to the reader (:class:`ChainLowered`)."""
    te = tvm.te
    plan = solve.plan(op, binding)
    steps = list(plan.steps)
    sizes = _sizes_along(plan, binding)
    chain_input = source
    source_dims = list(source_dims)
    pending: list[tuple[Primitive, dict[str, int]]] = []
    stages: list[StageInfo] = []

    def padder(
        tensor: Any, dims: list[str], views: list[tuple[Primitive, dict[str, int]]], names: Sequence[str]
    ) -> tuple[Any, dict[str, tuple[int, int]]] | None:
        """A zero-padded copy of ``tensor`` (a stage of its own) for reads through windows, so that the
        reading stage has no bounds checks; the scheduler may inline it back."""
        pads = _paddings(tvm, views, names, binding)
        if not pads:
            return None
        name = f"{prefix}pad{sum(1 for s in stages if s.is_pad)}"
        padded_dims = tuple(i for i, d in enumerate(dims) if d in pads)
        stages.append(StageInfo(name, list(dims), [], is_pad=True, padded=padded_dims, reads_from=(tensor.op.name,)))
        return _pad(tvm, tensor, dims, pads, name, dtype), pads

    stage_starts = {stage.start: stage for stage in plan.stages}
    index = 0
    while index < len(steps):
        stage = stage_starts.get(index)
        if stage is None:
            pending.append((steps[index], sizes[index]))
            index += 1
            continue
        block = steps[stage.start : stage.stop]
        after = sizes[stage.stop]
        result = [name for name, _ in stage.result]
        reduced = [step.dim for step in block if REDUCTION in step.facts]
        reduce_sizes = {
            step.dim: sizes[i][step.dim] for i, step in enumerate(block, stage.start) if REDUCTION in step.facts
        }
        means = [step.dim for step in block if REDUCTION in step.facts and step.mean]
        shares = [step.weight for step in block if CONTRACTION in step.facts]
        name = f"{prefix}stage{sum(1 for s in stages if not s.is_pad)}"
        axes = {r: te.reduce_axis((0, reduce_sizes[r]), name=f"r_{r}") for r in reduced}
        new_dims = {d.name for w in shares for d, new in zip(w.dims, w.new) if new}
        data_names = [d for d in [*result, *axes] if d not in new_dims]
        padded = padder(source, source_dims, pending, data_names)

        compute = _stage_body(
            tvm,
            dtype,
            binding,
            weight_tensors,
            result,
            axes,
            shares,
            list(pending),
            source,
            list(source_dims),
            [reduce_sizes[m] for m in means],
            new_dims,
            padded,
        )
        shape = tuple(after[r] for r in result)
        read = (padded[0] if padded else source).op.name
        source = te.compute(shape, compute, name=name)
        source_dims = result
        stages.append(StageInfo(name, result, reduced, weight_only=new_dims & set(result), reads_from=(read,)))
        pending = []
        index = stage.stop

    output_names = [d.name for d in plan.outputs]
    if pending or source is chain_input or source_dims != output_names:
        if not materialize:
            return ChainLowered(None, output_names, stages, source, list(source_dims), list(pending), dict(binding))
        pending_views, copied, copied_dims = list(pending), source, list(source_dims)
        copy_padded = padder(copied, copied_dims, pending_views, output_names)

        def copy(*indices: Any) -> Any:
            up, guards = _walk_up(tvm, pending_views, dict(zip(output_names, indices)), binding)
            return _read(tvm, copied, copied_dims, up, guards, dtype, copy_padded)

        output_shape = tuple(sizes[-1][n] for n in output_names)
        source = te.compute(output_shape, copy, name=f"{prefix}out")
        read = (copy_padded[0] if copy_padded else copied).op.name
        stages.append(StageInfo(f"{prefix}out", output_names, [], is_copy=True, reads_from=(read,)))
    return ChainLowered(source, output_names, stages, source, output_names, [], dict(binding))


# ------------------------------------------------------------------------------------------------
# Operators: one rule per node kind
# ------------------------------------------------------------------------------------------------


#: Most index combinations the static check of a fold's valid reads evaluates (else a counting stage).
MAX_STATIC_CHECK = 1 << 22


@dataclass
class _Value:
    """A node's result: ``tensor`` with axes ``dims``, or (``tensor`` None) a chain's input read through
    its views, ``chain.dims[k]`` being ``dims[k]`` (a Rename changes names, not positions)."""

    dims: list[str]
    tensor: Any = None
    chain: ChainLowered | None = None

    def at(self, coords: Mapping[str, Any]) -> Any:
        """The element at ``coords`` (by dim name) of a materialized value."""
        assert self.tensor is not None
        return self.tensor[tuple(coords[d] for d in self.dims)]


class _Context:
    """The state of one graph's lowering: placeholders, stages so far, each node's value."""

    def __init__(self, graph: Operator, binding: dict[str, int], dtype: str) -> None:
        self.tvm = load_tvm()
        self.te = self.tvm.te
        self.graph = graph
        self.binding = binding
        self.dtype = dtype
        self.stages: list[StageInfo] = []
        shape = tuple(self.size(d.size, f"the input dim {d.name}") for d in graph.inputs)
        self.x = self.te.placeholder(shape, dtype, name="x")
        self.weights: list[Any] = []
        self.weight_tensors: dict[str, Any] = {}
        for weight in graph.weights:
            w_shape = tuple(self.size(d.size, f"the weight {weight.name}: {d.name}") for d in weight.dims)
            tensor = self.te.placeholder(w_shape, dtype, name=weight.name)
            self.weights.append(tensor)
            self.weight_tensors[str(weight.name)] = tensor
        self.values: list[_Value] = [_Value([d.name for d in graph.inputs], self.x)]

    def size(self, size: Size, what: str) -> int:
        value = size.evaluate(self.binding)
        if value.denominator != 1 or value <= 0:
            raise DivisibilityError(
                f"{what}: the size {size} is {value} at this layer; it must be a positive integer, "
                f"so choose sizes where it divides"
            )
        return int(value)

    def const(self, value: float) -> Any:
        return self.tvm.tirx.const(value, self.dtype)

    def shape(self, index: int, dims: Sequence[str]) -> tuple[int, ...]:
        """The extents of ``dims`` of node ``index``'s result."""
        sizes = {d.name: d.size for d in self.graph.nodes[index].dims}
        return tuple(self.size(sizes[d], f"node {index}: the dim {d}") for d in dims)

    def extents(self, index: int) -> dict[str, int]:
        node = self.graph.nodes[index]
        return {d.name: self.size(d.size, f"node {index}: the dim {d.name}") for d in node.dims}

    def stage(self, info: StageInfo, shape: Sequence[int], compute: Callable[..., Any]) -> Any:
        self.stages.append(info)
        return self.te.compute(tuple(shape), compute, name=info.name)

    def reduce_axes(self, extents: Mapping[str, int], dims: Sequence[str]) -> dict[str, Any]:
        return {d: self.te.reduce_axis((0, extents[d]), name=f"r_{d}") for d in dims}


def _reads(*values: _Value) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v.tensor.op.name for v in values if v.tensor is not None))


#: The node kinds that read a chain of views through its views (materializing it first, an Unfold's
#: K-fold copy or a Shift's copy, would cost a pass over memory; a Softmax reads its argument three times).
VIEW_READERS = frozenset({"Fold", "FC", "Product", "Map", "Blend"})


def _read_through_views(graph: Operator, index: int) -> bool:
    """Whether every reader of node ``index`` (through Renames) is one of :data:`VIEW_READERS`, and the
    output is not."""
    last = len(graph.nodes) - 1
    stack, readers = [index], []
    while stack:
        node = stack.pop()
        if node == last:
            return False
        for consumer in graph.consumers[node]:
            if graph.nodes[consumer].kind == "Rename":
                stack.append(consumer)
            else:
                readers.append(consumer)
    return bool(readers) and all(graph.nodes[r].kind in VIEW_READERS for r in readers)


def _view_reader(
    ctx: _Context, index: int, value: _Value, fill: float = 0.0, tag: str = ""
) -> tuple[Callable[[Mapping[str, Any]], tuple[Any, list[Any]]], str]:
    """A reader of ``value`` by its dim names: ``read(coords) -> (element, guard conditions)``, and the
    name of the tensor it reads. An unmaterialized chain is read through its views from its input, padded
    with ``fill`` (a copy of its own, ``n<index>_pad<tag>``, that the scheduler may inline back into
    bounds checks)."""
    if value.tensor is not None:
        return (lambda coords: (value.at(coords), [])), value.tensor.op.name
    chain = value.chain
    assert chain is not None
    pads = _paddings(ctx.tvm, chain.views, list(chain.dims), chain.binding)
    padded = None
    read_name = chain.source.op.name
    if pads:
        pad_name = f"n{index}_pad{tag}"
        padded_dims = tuple(k for k, d in enumerate(chain.source_dims) if d in pads)
        info = StageInfo(
            pad_name, list(chain.source_dims), [], is_pad=True, padded=padded_dims, reads_from=(read_name,)
        )
        ctx.stages.append(info)
        padded = (_pad(ctx.tvm, chain.source, chain.source_dims, pads, pad_name, ctx.dtype, fill), pads)
        read_name = pad_name

    def read(coords: Mapping[str, Any]) -> tuple[Any, list[Any]]:
        by_chain = {c: coords[d] for c, d in zip(chain.dims, value.dims)}
        up, guards = _walk_up(ctx.tvm, chain.views, by_chain, chain.binding)
        element = _read(ctx.tvm, chain.source, chain.source_dims, up, guards, ctx.dtype, padded, fill)
        return element, [g.condition for g in guards]

    return read, read_name


# ------------------------------------------------------------------------------------------------
# Rules, one per node kind
# ------------------------------------------------------------------------------------------------


def _chain(ctx: _Context, index: int, node: Node) -> _Value:
    arg = ctx.values[node.args[0]]
    chain = node.chain
    linear = ctx.graph.is_linear
    if linear:
        binding = ctx.binding  # lower() bound the whole operator
    else:
        try:
            binding = solve.bind(chain, ctx.binding)
        except KdslError as error:
            raise error.with_context(f"node {index} (a chain)") from None
    lowered = lower_chain(
        ctx.tvm,
        chain,
        binding,
        arg.tensor,
        arg.dims,
        ctx.weight_tensors,
        ctx.dtype,
        prefix="" if linear else f"n{index}_",
        materialize=not _read_through_views(ctx.graph, index),
    )
    if not linear:
        for info in lowered.stages:
            # a chain's reduction may keep vector lanes of partial sums where its vector would gather (the
            # mean over H, W of a squeeze-excitation, read across rows of 3136 elements otherwise)
            info.lane_reduce = bool(info.reduced)
    ctx.stages.extend(lowered.stages)
    if lowered.tensor is None:
        return _Value(list(lowered.dims), None, lowered)
    return _Value(list(lowered.dims), lowered.tensor)


def _map(ctx: _Context, index: int, node: Node) -> _Value:
    step = node.step
    assert isinstance(step, Map)
    arg = ctx.values[node.args[0]]
    if step.fn not in MAP_FORMS:
        raise LoweringError(f"the TVM backend has no rule for Map({step.fn!r})")
    form = MAP_FORMS[step.fn]
    fn = lambda value: form(ctx.tvm, value, ctx.dtype, step.by)
    dims = list(arg.dims)
    read, read_name = _view_reader(ctx, index, arg)
    info = StageInfo(f"n{index}_map", dims, [], elementwise=True, reads_from=(read_name,))
    tensor = ctx.stage(info, ctx.shape(index, dims), lambda *i: fn(read(dict(zip(dims, i)))[0]))
    return _Value(dims, tensor)


def _key_fold(ctx: _Context, how: str, value: Any, axes: Sequence[Any]) -> Any:
    """A max (min) fold of ``value`` over ``axes`` as PyTorch's: NaN if an element is NaN, -inf over
    -inf. It folds :func:`.elementwise.order_key` integers with ``te.max`` (``te.min``), whose rfactor
    the schedule knows; the result is a key (:func:`.elementwise.from_order_key` reads it)."""
    reducer = ctx.te.max if how == "max" else ctx.te.min
    return reducer(order_key(ctx.tvm, value, ctx.dtype, how), axis=list(axes))


def _all_valid(chain: ChainLowered, fold_dims: Sequence[str], extents: Mapping[str, int]) -> bool:
    """Whether every output element of a fold over ``fold_dims`` (the chain's output names) has at
    least one read inside its windows: the guards evaluated on open index grids of the dims they use."""
    bound = [(step.at(chain.binding), {n: Size.of(v) for n, v in sizes.items()}) for step, sizes in chain.views]
    _, guards = walk_up(bound, {name: Var(name) for name in chain.dims})
    if not guards:
        return True
    used = sorted({name for g in guards for name in _variables(g.expr)} | set(fold_dims))
    if prod(extents[d] for d in used) > MAX_STATIC_CHECK:
        return False
    grid = {
        d: np.arange(extents[d]).reshape([-1 if k == j else 1 for k in range(len(used))]) for j, d in enumerate(used)
    }
    valid = np.ones([1] * len(used), dtype=bool)
    for guard in guards:
        coordinate = evaluate(guard.expr, grid, {})
        valid = valid & (coordinate >= 0) & (coordinate < int(guard.extent.evaluate({})))
    valid = np.broadcast_to(valid, [extents[d] for d in used])
    return bool(valid.any(axis=tuple(used.index(d) for d in fold_dims)).all())


def _variables(expr: Any) -> set[str]:
    """The loop variables an index expression mentions."""
    if isinstance(expr, Var):
        return {expr.name}
    found: set[str] = set()
    for value in vars(expr).values():
        if isinstance(value, Index):
            found |= _variables(value)
    return found


@dataclass
class _FoldParts:
    """What the three ways of lowering a Fold share."""

    ctx: _Context
    index: int
    arg: _Value
    out_dims: list[str]
    folded: list[str]
    axes: dict[str, Any]
    how: str  # "max" or "min"
    fill: float  # what a padded element reads as: -inf for max, +inf for min
    shape: tuple[int, ...]
    name: str

    def coords(self, indices: Sequence[Any]) -> dict[str, Any]:
        """The argument's coordinates at the output ``indices`` and the fold's reduction axes."""
        return {**dict(zip(self.out_dims, indices)), **self.axes}

    def chain_coords(self, coords: Mapping[str, Any]) -> dict[str, Any]:
        """``coords`` by the names of the unmaterialized chain's outputs (Renames keep positions)."""
        assert self.arg.chain is not None
        return {c: coords[d] for c, d in zip(self.arg.chain.dims, self.arg.dims)}

    def value(self, coords: Mapping[str, Any]) -> Any:
        """The argument's element (through the chain's views when it is not materialized)."""
        if self.arg.tensor is not None:
            return self.arg.at(coords)
        assert self.arg.chain is not None
        return self.arg.chain.read(self.ctx.tvm, self.chain_coords(coords), self.ctx.dtype)[0]

    def reduce(self, value: Any) -> Any:
        """The fold of ``value`` over the fold's axes, as an order key."""
        return _key_fold(self.ctx, self.how, value, self.axes.values())

    def decoded(self, keys: Any) -> _Value:
        """The fold's result: the floats of the key stage ``keys`` (an element-wise stage)."""
        info = StageInfo(self.name, self.out_dims, [], elementwise=True, reads_from=(keys.op.name,))
        tensor = self.ctx.stage(info, self.shape, lambda *i: from_order_key(self.ctx.tvm, keys[i], self.ctx.dtype))
        return _Value(self.out_dims, tensor)


def _fold(ctx: _Context, index: int, node: Node) -> _Value:
    step = node.step
    assert isinstance(step, Fold)
    arg = ctx.values[node.args[0]]
    extents = ctx.extents(node.args[0])
    folded = [str(d) for d in step.dims]
    out_dims = [d.name for d in node.dims]
    parts = _FoldParts(
        ctx,
        index,
        arg,
        out_dims,
        folded,
        ctx.reduce_axes(extents, folded),
        step.how,
        -math.inf if step.how == "max" else math.inf,
        ctx.shape(index, out_dims),
        f"n{index}_fold",
    )
    region = ctx.graph.padding_region(index)
    if not region:
        # no window in its linear region: every element takes part
        reads = _reads(arg) or (arg.chain.source.op.name,)  # type: ignore[union-attr]
        info = StageInfo(f"{parts.name}_key", out_dims, folded, reads_from=reads, lane_reduce=True)
        return parts.decoded(ctx.stage(info, parts.shape, lambda *i: parts.reduce(parts.value(parts.coords(i)))))
    if len(region) == 1 and arg.chain is not None and not arg.chain.stages:
        # one chain of views whose input no earlier window padded: read that input through them
        return _fold_through_views(parts, {c: extents[d] for c, d in zip(arg.chain.dims, arg.dims)})
    return _fold_masked(parts, region)


def _fold_through_views(parts: _FoldParts, extents: Mapping[str, int]) -> _Value:
    """A fold over a chain of views with a window: it reads the chain's input through the views, padding
    filled with -inf (+inf) (a padded copy, or the guards' else-value)."""
    ctx, chain = parts.ctx, parts.arg.chain
    assert chain is not None
    tirx = ctx.tvm.tirx
    fold_names = [c for c, d in zip(chain.dims, parts.arg.dims) if d in parts.folded]
    guarded, read_name = _view_reader(ctx, parts.index, parts.arg, parts.fill)

    all_valid = _all_valid(chain, fold_names, extents)
    name = f"{parts.name}_key" if all_valid else f"{parts.name}_raw"
    info = StageInfo(name, parts.out_dims, parts.folded, reads_from=(read_name,), lane_reduce=True)
    result = ctx.stage(info, parts.shape, lambda *i: parts.reduce(guarded(parts.coords(i))[0]))
    if all_valid:
        return parts.decoded(result)

    def valid_body(*i: Any) -> Any:
        _, conditions = guarded(parts.coords(i))
        inside = tirx.all(*conditions) if len(conditions) > 1 else conditions[0]
        return ctx.te.max(tirx.Select(inside, ctx.const(1.0), ctx.const(0.0)), axis=list(parts.axes.values()))

    return _finish_masked(parts, result, valid_body, read_name)


def _fold_masked(parts: _FoldParts, region: tuple[int, ...]) -> _Value:
    """A fold after a window and a contraction (or several chains): the reference's own mask, the
    fold's linear region (its chains, in order) lowered a second time on ones (input and weights),
    positive where an element read data."""
    ctx, index = parts.ctx, parts.index
    tirx = ctx.tvm.tirx
    chain_arg = ctx.values[ctx.graph.nodes[region[0]].args[0]]
    assert chain_arg.tensor is not None  # a chain's argument is materialized (only folds read through views)
    current = ctx.stage(
        StageInfo(f"n{index}_ones", list(chain_arg.dims), []),
        [int(n) for n in chain_arg.tensor.shape],
        lambda *i: ctx.const(1.0),
    )
    for step, made in enumerate(region):
        chain_node = ctx.graph.nodes[made]
        ones_weights = {}
        for k, weight in enumerate(chain_node.chain.weights):
            shape = [int(n) for n in ctx.weight_tensors[str(weight.name)].shape]
            info = StageInfo(f"n{index}_ones{step}_w{k}", [d.name for d in weight.dims], [])
            ones_weights[str(weight.name)] = ctx.stage(info, shape, lambda *i: ctx.const(1.0))
        binding = solve.bind(chain_node.chain, ctx.binding)
        # a Rename between two chains keeps the axes' order: the argument's dims name them
        dims = [d.name for d in ctx.graph.nodes[chain_node.args[0]].dims] if step else chain_arg.dims
        mask_chain = lower_chain(
            ctx.tvm, chain_node.chain, binding, current, dims, ones_weights, ctx.dtype, f"n{index}_mask{step}_"
        )
        ctx.stages.extend(mask_chain.stages)
        current = mask_chain.tensor
    mask = _Value(list(parts.arg.dims), current)
    fill = ctx.const(parts.fill)

    def body(*i: Any) -> Any:
        coords = parts.coords(i)
        return parts.reduce(tirx.Select(mask.at(coords) > ctx.const(0.0), parts.value(coords), fill))

    chain_source = () if parts.arg.chain is None else (parts.arg.chain.source.op.name,)
    info = StageInfo(
        f"{parts.name}_raw", parts.out_dims, parts.folded, reads_from=(*_reads(parts.arg, mask), *chain_source)
    )
    result = ctx.stage(info, parts.shape, body)

    def valid_body(*i: Any) -> Any:
        inside = mask.at(parts.coords(i)) > ctx.const(0.0)
        return ctx.te.max(tirx.Select(inside, ctx.const(1.0), ctx.const(0.0)), axis=list(parts.axes.values()))

    return _finish_masked(parts, result, valid_body, current.op.name)


def _finish_masked(parts: _FoldParts, result: Any, valid_body: Callable[..., Any], read_name: str) -> _Value:
    """The fold's result from its key stage ``result``, 0 where none of its elements read data
    (``valid_body``: 1 where one does)."""
    ctx, tirx = parts.ctx, parts.ctx.tvm.tirx
    info = StageInfo(f"n{parts.index}_valid", parts.out_dims, parts.folded, reads_from=(read_name,))
    valid = ctx.stage(info, parts.shape, valid_body)
    reads = (result.op.name, valid.op.name)
    info = StageInfo(parts.name, parts.out_dims, [], elementwise=True, reads_from=reads)
    zero = ctx.const(0.0)
    return _Value(
        parts.out_dims,
        ctx.stage(
            info,
            parts.shape,
            lambda *i: tirx.Select(valid[i] > zero, from_order_key(ctx.tvm, result[i], ctx.dtype), zero),
        ),
    )


def _softmax(ctx: _Context, index: int, node: Node) -> _Value:
    step = node.step
    assert isinstance(step, Softmax)
    arg = ctx.values[node.args[0]]
    dims = list(arg.dims)
    reduced = [str(d) for d in step.dims]
    kept = [d for d in dims if d not in reduced]
    extents = ctx.extents(index)
    kept_shape = [extents[d] for d in kept] or [1]
    kept_names = kept or ["softmax_all"]  # a softmax over every dim: its max and sum have one element

    def kept_coords(indices: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(kept, indices))

    def kept_at(tensor: Any, coords: Mapping[str, Any]) -> Any:
        return tensor[tuple(coords[d] for d in kept)] if kept else tensor[0]

    def peak_at(coords: Mapping[str, Any]) -> Any:
        return from_order_key(ctx.tvm, kept_at(peak, coords), ctx.dtype)

    axes = ctx.reduce_axes(extents, reduced)
    reads = _reads(arg)
    info_max = StageInfo(f"n{index}_max", kept_names, reduced, reads_from=reads, lane_reduce=True)
    peak = ctx.stage(
        info_max,
        kept_shape,
        # as an order key: a NaN in a row makes its max NaN, and the row NaN, as F.softmax
        lambda *i: _key_fold(ctx, "max", arg.at({**kept_coords(i), **axes}), axes.values()),
    )
    axes = ctx.reduce_axes(extents, reduced)

    def sum_body(*i: Any) -> Any:
        coords = {**kept_coords(i), **axes}
        return ctx.te.sum(exp(ctx.tvm, arg.at(coords) - peak_at(coords), ctx.dtype), axis=list(axes.values()))

    total = ctx.stage(
        StageInfo(f"n{index}_sum", kept_names, reduced, reads_from=(*reads, peak.op.name), lane_reduce=True),
        kept_shape,
        sum_body,
    )

    def out_body(*i: Any) -> Any:
        coords = dict(zip(dims, i))
        return exp(ctx.tvm, arg.at(coords) - peak_at(coords), ctx.dtype) / kept_at(total, coords)

    info = StageInfo(f"n{index}_softmax", dims, [], elementwise=True, reads_from=(*reads, peak.op.name, total.op.name))
    return _Value(dims, ctx.stage(info, [extents[d] for d in dims], out_body))


def _fc(ctx: _Context, index: int, node: Node) -> _Value:
    step = node.step
    assert isinstance(step, FC) and not isinstance(step.weight, str) and step.weight is not None
    arg = ctx.values[node.args[0]]
    weight = ctx.weight_tensors[str(step.weight.name)]
    reduced = [str(d) for d in step.dims]
    out_dims = [d.name for d in node.dims]
    axes = ctx.reduce_axes(ctx.extents(node.args[0]), reduced)
    weight_dims = [step.name, *reduced]
    read, read_name = _view_reader(ctx, index, arg)

    def body(*i: Any) -> Any:
        coords = {**dict(zip(out_dims, i)), **axes}
        value = read(coords)[0] * weight[tuple(coords[d] for d in weight_dims)]
        return ctx.te.sum(value, axis=list(axes.values()))

    info = StageInfo(f"n{index}_fc", out_dims, reduced, weight_only={step.name}, reads_from=(read_name,))
    return _Value(out_dims, ctx.stage(info, ctx.shape(index, out_dims), body))


def _rename(ctx: _Context, index: int, node: Node) -> _Value:
    step = node.step
    assert isinstance(step, Rename)
    arg = ctx.values[node.args[0]]
    dims = [step.name if d == step.dim else d for d in arg.dims]
    return _Value(dims, arg.tensor, arg.chain)


def _blend(ctx: _Context, index: int, node: Node) -> _Value:
    step = node.step
    assert isinstance(step, BlendJoin)
    lhs, rhs = (ctx.values[a] for a in node.args)
    if step.how not in BLEND_FORMS:
        raise LoweringError(f"the TVM backend has no rule for Blend({step.how!r})")
    form = BLEND_FORMS[step.how]
    out_dims = [d.name for d in node.dims]

    read_lhs, lhs_name = _view_reader(ctx, index, lhs, tag="0")
    read_rhs, rhs_name = _view_reader(ctx, index, rhs, tag="1") if rhs is not lhs else (read_lhs, lhs_name)

    def body(*i: Any) -> Any:
        coords = dict(zip(out_dims, i))
        return form(ctx.tvm, read_lhs(coords)[0], read_rhs(coords)[0])

    reads = tuple(dict.fromkeys((lhs_name, rhs_name)))
    info = StageInfo(f"n{index}_blend", out_dims, [], elementwise=True, reads_from=reads)
    return _Value(out_dims, ctx.stage(info, ctx.shape(index, out_dims), body))


def _product(ctx: _Context, index: int, node: Node) -> _Value:
    step = node.step
    assert isinstance(step, ProductJoin)
    lhs, rhs = (ctx.values[a] for a in node.args)
    out_dims = [d.name for d in node.dims]
    extents = {**ctx.extents(node.args[1]), **ctx.extents(node.args[0])}
    axes = ctx.reduce_axes(extents, list(step.reduce))
    read_lhs, lhs_name = _view_reader(ctx, index, lhs, tag="0")
    read_rhs, rhs_name = _view_reader(ctx, index, rhs, tag="1") if rhs is not lhs else (read_lhs, lhs_name)

    def body(*i: Any) -> Any:
        coords = {**dict(zip(out_dims, i)), **axes}
        value = read_lhs(coords)[0] * read_rhs(coords)[0]
        return ctx.te.sum(value, axis=list(axes.values())) if axes else value

    reads = tuple(dict.fromkeys((lhs_name, rhs_name)))
    info = StageInfo(f"n{index}_product", out_dims, list(step.reduce), elementwise=not axes, reads_from=reads)
    return _Value(out_dims, ctx.stage(info, ctx.shape(index, out_dims), body))


#: One lowering rule per node kind of a branching kernel (a test checks that none is missing).
GRAPH_RULES: dict[str, Callable[[_Context, int, Node], _Value]] = {
    "Chain": _chain,
    "Map": _map,
    "Fold": _fold,
    "Softmax": _softmax,
    "FC": _fc,
    "Rename": _rename,
    "Blend": _blend,
    "Product": _product,
}


def lower(op: Operator, layer: Mapping[str, int], dtype: str = "float32") -> Lowered:
    """Lower an operator at the sizes of ``layer`` to TE placeholders and stages: one input ``x``, one
    placeholder per weight (``op.weights`` order), one output (its axes in ``op.outputs`` order). Each
    node lowers by its rule in :data:`GRAPH_RULES`; a linear operator is its input and one chain node.

    >>> from kdsl.lang import *
    >>> N, C, L = primary("N C L")
    >>> x = Input(N, C, L)
    >>> kernel = (x + (x >> Map("relu"))) >> Output(N, C, L)
    >>> [stage.name for stage in lower(kernel, {"N": 1, "C": 2, "L": 8}).stages]
    ['n1_map', 'n2_blend']
    """
    if not isinstance(op, Operator):
        raise LoweringError(f"expected an Operator, got {type(op).__name__}")
    # the one place a linear operator differs: it is bound and checked as a whole (solve.bind), and its
    # chain's stages keep their plain names (_chain)
    binding = solve.bind(op, layer) if op.is_linear else resolve_binding(op, as_layer(layer))
    ctx = _Context(op, binding, dtype)
    for index, node in enumerate(op.nodes[1:], 1):
        rule = GRAPH_RULES.get(node.kind)
        if rule is None:
            raise LoweringError(f"the TVM backend has no rule for the node kind {node.kind}")
        ctx.values.append(rule(ctx, index, node))
    result = ctx.values[-1]
    out_dims = [d.name for d in op.outputs]
    output_shape = tuple(ctx.size(d.size, f"the output dim {d.name}") for d in op.outputs)
    out = result.tensor
    if out is None or out is ctx.x or result.dims != out_dims:
        # the last node's result in the output's order (or a copy of the input, for a kernel of Renames)
        assert result.tensor is not None
        info = StageInfo("out", out_dims, [], is_copy=True, reads_from=_reads(result))
        out = ctx.stage(info, output_shape, lambda *i: result.at(dict(zip(out_dims, i))))
    return Lowered(op, binding, ctx.x, ctx.weights, out, ctx.stages, output_shape)
