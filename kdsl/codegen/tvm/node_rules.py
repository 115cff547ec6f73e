"""The TVM lowering of a branching operator's nodes: one rule per node kind (:data:`GRAPH_RULES`).

**Nodes.** Every node of the graph has one rule in :data:`GRAPH_RULES` (a test checks that none is missing). A
rule reads its arguments' TE tensors by dim name and returns its own result:

=========  ==================================================================================
Chain      the linear chain lowered onto its argument's tensor (:func:`.chain_stages.lower_chain`,
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from kdsl import solve
from kdsl.codegen.tvm.chain_stages import (
    ChainLowered,
    StageInfo,
    lower_chain,
    padded_copy,
    read_guarded,
    walk_views,
    window_paddings,
)
from kdsl.codegen.tvm.elementwise import BLEND_FORMS, MAP_FORMS, exp, from_order_key, order_key
from kdsl.codegen.tvm.toolchain import load_tvm
from kdsl.lang.errors import DivisibilityError, KdslError, LoweringError
from kdsl.lang.index import Index, Var, evaluate, walk_up
from kdsl.lang.nonlinear import FC, BlendJoin, Fold, Map, ProductJoin, Rename, Softmax
from kdsl.lang.operator import Node, Operator
from kdsl.lang.sizes import Size

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


class GraphContext:
    """The state of one graph's lowering: placeholders, stages so far, each node's value."""

    def __init__(self, graph: Operator, binding: dict[str, int], dtype: str) -> None:
        self.tvm = load_tvm()
        self.te = self.tvm.te
        self.graph = graph
        self.binding = binding
        self.dtype = dtype
        self.stages: list[StageInfo] = []
        # one placeholder per input: x, then x_<name> for each other input of a kernel of several
        self.inputs: list[Any] = []
        for position, dims in enumerate(graph.input_dims):
            name = "x" if position == 0 else f"x_{graph.input_names[position]}"
            where = "the input" if position == 0 else f"the input {graph.input_names[position]}:"
            shape = tuple(self.size(d.size, f"{where} dim {d.name}") for d in dims)
            self.inputs.append(self.te.placeholder(shape, dtype, name=name))
        self.x = self.inputs[0]
        self.weights: list[Any] = []
        self.weight_tensors: dict[str, Any] = {}
        for weight in graph.weights:
            w_shape = tuple(self.size(d.size, f"the weight {weight.name}: {d.name}") for d in weight.dims)
            tensor = self.te.placeholder(w_shape, dtype, name=weight.name)
            self.weights.append(tensor)
            self.weight_tensors[str(weight.name)] = tensor
        self.values: list[_Value] = [_Value([d.name for d in graph.inputs], self.x)]

    def input_value(self, index: int) -> _Value:
        """The value of the input node ``index``: its placeholder, its dims by name."""
        position = self.graph.input_nodes.index(index)
        return _Value([d.name for d in self.graph.nodes[index].dims], self.inputs[position])

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


def read_names(*values: _Value) -> tuple[str, ...]:
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
    ctx: GraphContext, index: int, value: _Value, fill: float = 0.0, tag: str = ""
) -> tuple[Callable[[Mapping[str, Any]], tuple[Any, list[Any]]], str]:
    """A reader of ``value`` by its dim names: ``read(coords) -> (element, guard conditions)``, and the
    name of the tensor it reads. An unmaterialized chain is read through its views from its input, padded
    with ``fill`` (a copy of its own, ``n<index>_pad<tag>``, that the scheduler may inline back into
    bounds checks)."""
    if value.tensor is not None:
        return (lambda coords: (value.at(coords), [])), value.tensor.op.name
    chain = value.chain
    assert chain is not None
    pads = window_paddings(ctx.tvm, chain.views, list(chain.dims), chain.binding)
    padded = None
    read_name = chain.source.op.name
    if pads:
        pad_name = f"n{index}_pad{tag}"
        padded_dims = tuple(k for k, d in enumerate(chain.source_dims) if d in pads)
        info = StageInfo(
            pad_name, list(chain.source_dims), [], is_pad=True, padded=padded_dims, reads_from=(read_name,)
        )
        ctx.stages.append(info)
        padded = (padded_copy(ctx.tvm, chain.source, chain.source_dims, pads, pad_name, ctx.dtype, fill), pads)
        read_name = pad_name

    def read(coords: Mapping[str, Any]) -> tuple[Any, list[Any]]:
        by_chain = {c: coords[d] for c, d in zip(chain.dims, value.dims)}
        up, guards = walk_views(ctx.tvm, chain.views, by_chain, chain.binding)
        element = read_guarded(ctx.tvm, chain.source, chain.source_dims, up, guards, ctx.dtype, padded, fill)
        return element, [g.condition for g in guards]

    return read, read_name


# ------------------------------------------------------------------------------------------------
# Rules, one per node kind
# ------------------------------------------------------------------------------------------------


def _chain(ctx: GraphContext, index: int, node: Node) -> _Value:
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


def _map(ctx: GraphContext, index: int, node: Node) -> _Value:
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


def _key_fold(ctx: GraphContext, how: str, value: Any, axes: Sequence[Any]) -> Any:
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

    ctx: GraphContext
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


def _fold(ctx: GraphContext, index: int, node: Node) -> _Value:
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
        reads = read_names(arg) or (arg.chain.source.op.name,)  # type: ignore[union-attr]
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
        f"{parts.name}_raw", parts.out_dims, parts.folded, reads_from=(*read_names(parts.arg, mask), *chain_source)
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


def _softmax(ctx: GraphContext, index: int, node: Node) -> _Value:
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
    reads = read_names(arg)
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


def _fc(ctx: GraphContext, index: int, node: Node) -> _Value:
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


def _rename(ctx: GraphContext, index: int, node: Node) -> _Value:
    step = node.step
    assert isinstance(step, Rename)
    arg = ctx.values[node.args[0]]
    dims = [step.name if d == step.dim else d for d in arg.dims]
    return _Value(dims, arg.tensor, arg.chain)


def _blend(ctx: GraphContext, index: int, node: Node) -> _Value:
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


def _product(ctx: GraphContext, index: int, node: Node) -> _Value:
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
GRAPH_RULES: dict[str, Callable[[GraphContext, int, Node], _Value]] = {
    "Chain": _chain,
    "Map": _map,
    "Fold": _fold,
    "Softmax": _softmax,
    "FC": _fc,
    "Rename": _rename,
    "Blend": _blend,
    "Product": _product,
}
