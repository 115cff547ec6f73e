"""Branching operators: the forward computes one variable per node (``x3`` is node 3), one rule per
node kind (:data:`GRAPH_RULES`); each chain node is lowered by :mod:`kdsl.codegen.torch.chain_lowering`
on its argument's variable, a max (min) fold of a pooling chain becomes ``F.max_pool{1,2,3}d``."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kdsl import solve
from kdsl.codegen.torch.chain_lowering import _chain_body, _dim_names
from kdsl.codegen.torch.identifiers import _Axes
from kdsl.codegen.torch.module_signature import forward_arguments
from kdsl.codegen.torch.views import einsum_code, rearrange_code
from kdsl.codegen.torch.writer import _size_code, _Writer
from kdsl.lang.nonlinear import BLEND_KINDS, FC, MAP_FUNCTIONS, BlendJoin, Fold, Map, Rename, Softmax
from kdsl.lang.operator import Node, Operator
from kdsl.lang.primitives import Split, Stride, Unfold
from kdsl.lang.sizes import Size

#: Helpers only the modules of branching kernels use (added after :data:`HELPERS`).
GRAPH_HELPERS = """
def _pool(x, how, kernel, stride, pads):
    \"\"\"Max (or min) pooling over the last len(kernel) dims, padded (left, right) per dim with values
    that take no part (F.max_pool*d's own padding where it is symmetric).\"\"\"
    if how == "min":
        return -_pool(-x, "max", kernel, stride, pads)
    pool = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[len(kernel) - 1]
    lefts, rights = [left for left, _ in pads], [right for _, right in pads]
    if lefts == rights and all(2 * left <= size for left, size in zip(lefts, kernel)):
        return pool(x, kernel, stride, padding=tuple(lefts))
    flat = [p for left, right in reversed(pads) for p in (left, right)]  # F.pad lists the last dim first
    return pool(F.pad(x, flat, value=float("-inf")), kernel, stride)

def _masked_fold(x, mask, dims, how):
    \"\"\"Max (or min) of x over dims, of the elements where mask holds (a window's zero padding takes
    no part); 0 where no element does.\"\"\"
    fill = float("-inf") if how == "max" else float("inf")
    folded = (torch.amax if how == "max" else torch.amin)(x.masked_fill(~mask, fill), dim=dims)
    return folded.masked_fill(~mask.any(dim=dims), 0)
"""

#: Python code of each Map function, ``{}`` the argument (``by`` the scale factor).
MAP_CODE: dict[str, str] = {
    "relu": "torch.relu({x})",
    "abs": "torch.abs({x})",
    "neg": "torch.neg({x})",
    "sin": "torch.sin({x})",
    "exp": "torch.exp({x})",
    "sigmoid": "torch.sigmoid({x})",
    "tanh": "torch.tanh({x})",
    "gelu": "F.gelu({x})",  # the exact erf form, PyTorch's default
    "scale": "{x} * {by!r}",
}
assert set(MAP_CODE) == set(MAP_FUNCTIONS)

#: Python code of each Blend kind (torch broadcasts the smaller branch once its axes line up).
BLEND_CODE: dict[str, str] = {
    "add": "{lhs} + {rhs}",
    "sub": "{lhs} - {rhs}",
    "mul": "{lhs} * {rhs}",
    "min": "torch.minimum({lhs}, {rhs})",
    "max": "torch.maximum({lhs}, {rhs})",
}
assert set(BLEND_CODE) == set(BLEND_KINDS)


@dataclass
class _Pooling:
    """A Fold that is exactly a max (min) pooling of the chain before it: the chain is only Unfold
    (+ Stride on the sliding dim) and Split views, and the Fold folds exactly their windows."""

    source: int  # the node the chain reads
    dims: list[str]  # the pooled dims of the source, in its order
    outputs: dict[str, str]  # pooled dim -> its name after the pooling (a Split's outer dim)
    kernel: dict[str, Size]
    stride: dict[str, Size | None]
    padded: dict[str, bool]  # an Unfold window pads (K // 2, K - 1 - K // 2); a Split tile does not


def _pooling(graph: Operator, index: int) -> _Pooling | None:
    node = graph.nodes[index]
    step = node.step
    assert isinstance(step, Fold)
    arg = graph.nodes[node.args[0]]
    if arg.kind != "Chain" or graph.padding_region(index) not in ((), (node.args[0],)):
        # native pooling pads only its own windows: no earlier window may have padded its input
        return None
    chain = arg.chain
    inputs = {d.name for d in chain.inputs}
    window_of: dict[str, str] = {}  # pooled dim -> its window (Unfold) or tile (Split) dim
    outputs: dict[str, str] = {}
    kernel: dict[str, Size] = {}
    stride: dict[str, Size | None] = {}
    padded: dict[str, bool] = {}
    for view in chain.steps:
        if isinstance(view, Unfold) and view.dim in inputs and view.dim not in window_of:
            window_of[view.dim], kernel[view.dim], stride[view.dim] = view.name, view.window, None
            outputs[view.dim], padded[view.dim] = view.dim, True
        elif isinstance(view, Stride) and padded.get(view.dim) and stride[view.dim] is None:
            stride[view.dim] = view.stride  # every S-th window: a strided pooling
        elif isinstance(view, Split) and view.dim in inputs and view.dim not in window_of:
            window_of[view.dim], kernel[view.dim], stride[view.dim] = view.inner, view.block, view.block
            outputs[view.dim], padded[view.dim] = view.outer, False
        else:
            return None
    if set(window_of.values()) != set(step.dims) or not 1 <= len(window_of) <= 3:
        return None
    dims = [d.name for d in chain.inputs if d.name in window_of]
    return _Pooling(arg.args[0], dims, outputs, kernel, stride, padded)


#: Emits a linear chain: (chain, the variable holding its input, the input's dims in order, the
#: variable to write, the code of each of the chain's weights) -> (the lines, the variable holding
#: the result, the order of its dims: ``chain.outputs``'s, or the order the chain computed them in).
ChainEmitter = Callable[[Operator, str, list[str], str, list[str]], tuple[list[str], str, list[str]]]


@dataclass
class _GraphWriter:
    """The forward of a branching kernel while it is written: its lines, the variable holding
    each node (``x`` the input, ``x3`` node 3; a Rename shares its argument's), each node's first
    weight, and the chains whose only readers pool them natively (they are never computed).
    ``axis`` gives a dim's einops axis name, ``size`` a size's Python code, ``emit_chain`` a linear
    chain's lines (:mod:`kdsl.codegen.torch.chain_lowering`), ``weights`` the code of
    each weight of the graph, in :attr:`Operator.weights` order (``self.wq``)."""

    graph: Operator
    axis: Callable[[str], str]
    size: Callable[[Size], str]
    emit_chain: ChainEmitter
    weights: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    first_weight: list[int] = field(default_factory=list)
    poolings: dict[int, _Pooling] = field(default_factory=dict)
    skipped: set[int] = field(default_factory=set)
    #: node -> the order of its variable's axes where the rule left them in another order than the
    #: node's (a convolution's channels second): readers align them, so no permute back and forth
    layouts: dict[int, list[str]] = field(default_factory=dict)

    def pattern(self, dims: list[str]) -> str:
        return " ".join(self.axis(d) for d in dims)

    def dims(self, index: int) -> list[str]:
        """The axes of node ``index``'s variable, in order: the node's own dims, or the order its
        rule left them in (:attr:`layouts`)."""
        if index in self.layouts:
            return self.layouts[index]
        return [d.name for d in self.graph.nodes[index].dims]

    def chain(self, chain: Operator, arg: int, var: str, weights: list[str], indent: str = "") -> tuple[str, list[str]]:
        """Emit the lines computing the linear ``chain`` on node ``arg`` into ``var`` (``weights``:
        the code of each of its weights); return the variable that holds its result and its axes."""
        lines, result, axes = self.emit_chain(chain, self.names[arg], self.dims(arg), var, weights)
        self.lines += [indent + line for line in lines]
        return result, axes


def _tuple(items: list[str]) -> str:
    """Python code of a tuple of the codes ``items``."""
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _describe_node(graph: Operator, index: int) -> str:
    node = graph.nodes[index]
    args = ", ".join(f"node {a}" for a in node.args)
    dims = ", ".join(d.name for d in node.dims)
    return f"# node {index}: {node.describe()} of {args} -> [{dims}]"


def _chain_node(writer: _GraphWriter, index: int, node: Node) -> list[str]:
    if index in writer.skipped:
        writer.lines[-1] += " (pooled natively below, never computed)"
        return writer.dims(index)
    first = writer.first_weight[index]
    weights = writer.weights[first : first + len(node.chain.weights)]
    writer.names[index], axes = writer.chain(node.chain, node.args[0], f"x{index}", weights)
    return axes


def _map_node(writer: _GraphWriter, index: int, node: Node) -> list[str]:
    step = node.step
    assert isinstance(step, Map)
    code = MAP_CODE[step.fn].format(x=writer.names[node.args[0]], by=step.by)
    writer.lines.append(f"x{index} = {code}")
    return writer.dims(node.args[0])


def _emit_pooling(writer: _GraphWriter, var: str, how: str, pooling: _Pooling) -> list[str]:
    """``_pool`` (F.max_pool{1,2,3}d) on the pooled dims moved last, the others flattened in front."""
    source = writer.dims(pooling.source)
    rest = [d for d in source if d not in pooling.dims]
    outputs = [pooling.outputs[d] for d in pooling.dims]
    # F.max_pool{d}d pools the last d dims of a tensor with one or two more in front: the data as it
    # lies where it is so, else (the others flattened, the pooled dims)
    direct = source[len(rest) :] == pooling.dims and 1 <= len(rest) <= 2
    data = writer.names[pooling.source]
    if not direct:
        code = rearrange_code(
            data, writer.pattern(source), f"({writer.pattern(rest)}) {writer.pattern(pooling.dims)}", {}
        )
        writer.lines.append(f"{var} = {code}  # as a pooling input")
        data = var
    kernel = _tuple([writer.size(pooling.kernel[d]) for d in pooling.dims])
    stride = _tuple([writer.size(pooling.stride[d]) if pooling.stride[d] is not None else "1" for d in pooling.dims])
    pads = []
    for d in pooling.dims:
        window = pooling.kernel[d]
        if not pooling.padded[d]:
            pads.append("(0, 0)")
        elif not window.variables:  # a fixed window: its padding as numbers
            length = int(window.constant)
            pads.append(f"({length // 2}, {length - 1 - length // 2})")
        else:
            code = writer.size(window)
            code = code if re.fullmatch(r"\w+", code) else f"({code})"
            pads.append(f"({code} // 2, {code} - 1 - {code} // 2)")
    writer.lines.append(f'{var} = _pool({data}, "{how}", {kernel}, {stride}, {_tuple(pads)})')
    if not direct:
        sizes = {d.name: d.size for d in writer.graph.nodes[pooling.source].dims}
        lengths = {writer.axis(d): writer.size(sizes[d]) for d in rest}
        code = rearrange_code(
            var, f"({writer.pattern(rest)}) {writer.pattern(outputs)}", writer.pattern(rest + outputs), lengths
        )
        if code is not None:
            writer.lines.append(f"{var} = {code}")
    return rest + outputs


def _fold_node(writer: _GraphWriter, index: int, node: Node) -> list[str]:
    # max/min over the dims; the elements that only a window's zero padding fills take no part
    step = node.step
    assert isinstance(step, Fold)
    var, arg = f"x{index}", node.args[0]
    pooling = writer.poolings.get(index)
    if pooling is not None:
        return _emit_pooling(writer, var, step.how, pooling)
    dims = writer.dims(arg)
    axes = tuple(dims.index(d) for d in step.dims)  # type: ignore[arg-type]
    folded = [d for d in dims if d not in step.dims]
    region = writer.graph.padding_region(index)
    if region:
        mask, data = f"mask{index}", writer.names[arg]
        # the mask depends on the shapes only: it is computed on the first call and when they change
        writer.lines.append(f"{mask} = self.masks.get({index})")
        writer.lines.append(f"if {mask} is None or {mask}.shape != {data}.shape or {mask}.device != {data}.device:")
        writer.lines.append(
            f"    # where node {arg} holds data, not a window's zero padding: its linear region on ones is > 0"
        )
        writer.lines.append("    with torch.no_grad():")
        current = f"torch.ones_like({writer.names[writer.graph.nodes[region[0]].args[0]]})"
        for made in region:  # the chains in order; a Rename between two of them only renames
            chain, source = writer.graph.nodes[made].chain, writer.graph.nodes[made].args[0]
            ones = []
            if chain.weights:
                first = writer.first_weight[made]
                own = writer.weights[first : first + len(chain.weights)]
                writer.lines.append(f"        ones = [torch.ones_like(w) for w in [{', '.join(own)}]]")
                ones = [f"ones[{i}]" for i in range(len(own))]
            if current != mask:
                writer.lines.append(f"        {mask} = {current}")
            saved, writer.names[source] = writer.names[source], mask  # the chain runs on the mask
            current, _ = writer.chain(chain, source, mask, ones, indent="        ")  # the layout of the data's
            writer.names[source] = saved
        writer.lines.append(f"        self.masks[{index}] = {mask} = {current} > 0")
        writer.lines.append(f'{var} = _masked_fold({data}, {mask}, {axes}, "{step.how}")')
        return folded
    function = "torch.amax" if step.how == "max" else "torch.amin"
    writer.lines.append(f"{var} = {function}({writer.names[arg]}, dim={axes})")
    return folded


def masked_folds(graph: Operator) -> list[int]:
    """The Fold nodes that need a padding mask: a windowed chain before them, and no native pooling."""
    return [
        index
        for index, node in enumerate(graph.nodes)
        if node.kind == "Fold" and graph.padding_region(index) and _pooling(graph, index) is None
    ]


def _softmax_node(writer: _GraphWriter, index: int, node: Node) -> list[str]:
    step = node.step
    assert isinstance(step, Softmax)
    arg, dims = writer.names[node.args[0]], writer.dims(node.args[0])
    positions = sorted(dims.index(d) for d in step.dims)  # type: ignore[arg-type]
    first, last = positions[0], positions[-1]
    if first == last:
        writer.lines.append(f"x{index} = F.softmax({arg}, dim={first})")
    else:  # adjacent dims: one softmax over them flattened
        writer.lines.append(f"x{index} = F.softmax({arg}.flatten({first}, {last}), dim={first}).reshape({arg}.shape)")
    return dims


def _fc_node(writer: _GraphWriter, index: int, node: Node) -> list[str]:
    step = node.step
    assert isinstance(step, FC)
    arg, dims = writer.names[node.args[0]], writer.dims(node.args[0])
    listed = list(step.dims)  # type: ignore[arg-type]
    weight = writer.weights[writer.first_weight[index]]
    count = len(listed)
    if dims[-count:] == listed:  # the channels come last: a matrix product with no copy
        data = arg if count == 1 else f"{arg}.flatten({-count})"
        matrix = weight if count == 1 else f"{weight}.flatten(1)"
        writer.lines.append(f"x{index} = F.linear({data}, {matrix})")
        return dims[:-count] + [step.name]
    spatial = len(dims) - 2
    if count == 1 and dims.index(listed[0]) == 1 and 1 <= spatial <= 3:
        # channels second, one batch dim before, 1-3 after: a 1x1 convolution, one kernel and no copy
        # (an einsum would move the channels last and back)
        units = ", ".join([":", ":"] + ["None"] * spatial)
        writer.lines.append(f"x{index} = F.conv{spatial}d({arg}, {weight}[{units}])")
        return [dims[0], step.name, *dims[2:]]
    out = [d.name for d in node.dims]
    patterns = [writer.pattern(dims), writer.pattern([step.name, *listed])]
    code = einsum_code([arg, weight], patterns, writer.pattern(out))
    writer.lines.append(f"x{index} = {code}  # {', '.join(patterns)} -> {writer.pattern(out)}")
    return out


def _rename_node(writer: _GraphWriter, index: int, node: Node) -> list[str]:
    writer.names[index] = writer.names[node.args[0]]  # no data moves: the axis only has another name
    step = node.step
    assert isinstance(step, Rename)
    return [step.name if d == step.dim else d for d in writer.dims(node.args[0])]


def _aligned(writer: _GraphWriter, arg: int, out: list[str]) -> str:
    """Node ``arg``'s variable with its axes in ``out``'s order, a length-1 axis for each it lacks."""
    dims = writer.dims(arg)
    if dims == out:
        return writer.names[arg]
    target = " ".join(writer.axis(d) if d in dims else "()" for d in out)
    code = rearrange_code(writer.names[arg], writer.pattern(dims), target, {})
    return writer.names[arg] if code is None else code


def _blend_node(writer: _GraphWriter, index: int, node: Node) -> list[str]:
    step = node.step
    assert isinstance(step, BlendJoin)
    out = writer.dims(index)
    lhs, rhs = (_aligned(writer, arg, out) for arg in node.args)
    writer.lines.append(f"x{index} = " + BLEND_CODE[step.how].format(lhs=lhs, rhs=rhs))
    return out


def _product_node(writer: _GraphWriter, index: int, node: Node) -> list[str]:
    lhs, rhs = node.args
    out = writer.dims(index)
    patterns = [writer.pattern(writer.dims(lhs)), writer.pattern(writer.dims(rhs))]
    code = einsum_code([writer.names[lhs], writer.names[rhs]], patterns, writer.pattern(out))
    writer.lines.append(f"x{index} = {code}  # {', '.join(patterns)} -> {writer.pattern(out)}")
    return out


#: The PyTorch backend's table for branching kernels: one rule per node kind (the keys of
#: :data:`kdsl.codegen.reference.GRAPH_RULES`). A rule appends its node's lines and returns the
#: order of the result's axes (the driver rearranges them into the node's order where they differ).
GRAPH_RULES: dict[str, Callable[[_GraphWriter, int, Node], list[str]]] = {
    "Chain": _chain_node,
    "Map": _map_node,
    "Fold": _fold_node,
    "Softmax": _softmax_node,
    "FC": _fc_node,
    "Rename": _rename_node,
    "Blend": _blend_node,
    "Product": _product_node,
}


def forward_lines(
    graph: Operator,
    axis: Callable[[str], str],
    size: Callable[[Size], str],
    emit_chain: ChainEmitter,
    weights: list[str],
) -> list[str]:
    """The forward's lines after the input check (the input is ``x``, ``weights`` the code of each
    weight in :attr:`Operator.weights` order), ending in ``return``; the caller indents them."""
    arguments = forward_arguments(graph, _node_names(graph))
    names = ["x"] * len(graph.nodes)
    for position, index in enumerate(graph.input_nodes):  # an input is the forward's argument
        names[index] = arguments[position]
    writer = _GraphWriter(graph, axis, size, emit_chain, list(weights), names=names)
    count = 0
    for node in graph.nodes:
        writer.first_weight.append(count)
        count += len(node.weights())
    for index, node in enumerate(graph.nodes):
        if node.kind == "Fold":
            pooling = _pooling(graph, index)
            if pooling is not None:
                writer.poolings[index] = pooling
    for index, node in enumerate(graph.nodes):
        readers = graph.consumers[index]
        if node.kind == "Chain" and readers and all(reader in writer.poolings for reader in readers):
            writer.skipped.add(index)
    for index, node in enumerate(graph.nodes[1:], 1):
        if node.step is None:
            continue  # another input: its argument, named above
        writer.names[index] = f"x{index}"
        writer.lines.append(_describe_node(graph, index))
        axes = GRAPH_RULES[node.kind](writer, index, node)
        if axes != writer.dims(index) and index not in writer.skipped:
            writer.layouts[index] = axes  # its readers take the axes in this order
    result, outputs = len(graph.nodes) - 1, [d.name for d in graph.outputs]
    last = writer.names[result]
    if writer.dims(result) != outputs:
        last = rearrange_code(last, writer.pattern(writer.dims(result)), writer.pattern(outputs), {}) or last
    writer.lines.append(f"return {last}")
    return writer.lines


def _node_names(graph: Operator) -> frozenset[str]:
    count = len(graph.nodes)
    return frozenset(
        {"ones", "_pool", "_masked_fold", "_check_named"}
        | {f"x{i}" for i in range(count)}
        | {f"mask{i}" for i in range(count)}
    )


def own_names(graph: Operator) -> frozenset[str]:
    """The forward's own variables besides :data:`OWN_NAMES` (a size variable must not take one):
    its node variables and, with several inputs, its arguments."""
    if len(graph.input_nodes) > 1:
        return _node_names(graph) | set(forward_arguments(graph, _node_names(graph)))
    return _node_names(graph)


def _graph_body(
    graph: Operator, binding: Mapping[str, int] | None, axis: _Axes, ids: dict[str, str], weights: list[str]
) -> list[str]:
    """A branching kernel's forward lines (:func:`forward_lines`), each
    linear chain lowered like an operator (its own plan at ``binding``) on its argument's variable."""

    def emit_chain(
        chain: Operator, data: str, dims: list[str], var: str, own: list[str]
    ) -> tuple[list[str], str, list[str]]:
        writer = _Writer([], dims, axis, ids, current=data, var=var, weights=own)
        inputs = [d.name for d in chain.inputs]
        if writer.axes != inputs:
            writer.move(writer.pattern(), writer.pattern(inputs))
            writer.axes = inputs
        weight_index = {w.name: i for i, w in enumerate(chain.weights)}
        # the result stays in the order the chain computed it (a convolution's channels second):
        # the graph's readers take it so, rather than a permute here and its inverse there
        _chain_body(writer, chain, solve.plan(chain, binding), weight_index, reorder=False)
        return writer.lines, writer.data, list(writer.axes)

    return forward_lines(graph, axis, lambda size: _size_code(size, ids), emit_chain, weights)


def _graph_dim_names(graph: Operator) -> list[str]:
    """Every dim name of ``graph``, in order of appearance."""
    names = [d.name for d in graph.inputs]
    for node in graph.nodes:
        if node.kind == "Chain":
            names += _dim_names(node.chain)
        elif isinstance(node.step, FC):
            names += [node.step.name]
        names += [d.name for d in node.dims]
    return list(dict.fromkeys(names))
