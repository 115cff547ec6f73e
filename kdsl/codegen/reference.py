"""The NumPy reference interpreter: the test oracle every other backend is checked against.

It evaluates an operator straight from the top-down semantics of its primitives, holding the data
as one ndarray whose axes carry dim names. Each primitive has one small rule below, written to be
read and trusted rather than to be fast; it shares no code with the PyTorch or TVM backends (it
imports only NumPy and :mod:`kdsl.lang`, and the padded sizes of ``pad=True`` from
:mod:`kdsl.solve.padding`, which decides sizes and computes nothing), so two backends cannot agree
by sharing a bug with it.

>>> import numpy as np
>>> from kdsl.lang import *
>>> N, C, L = primary("N C L"); K = coefficient("K")
>>> blur = Input(N, C, L) >> Unfold(L, K, "k") >> Reduce("k") >> Output(N, C, L, defaults={"K": 3})
>>> run(blur, {"N": 1, "C": 1, "L": 4}, np.array([[[1.0, 2.0, 3.0, 4.0]]]), [])
array([[[3., 6., 9., 7.]]])
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral

import numpy as np

from kdsl.codegen.reference_steps import RULES, Named, StepEnv, concrete
from kdsl.lang.chain import Chain
from kdsl.lang.errors import LayerError, LoweringError, ShapeError
from kdsl.lang.nonlinear import FC, BlendJoin, Fold, Map, Rename, Softmax
from kdsl.lang.operator import Node, Operator
from kdsl.lang.primitive_base import CONTRACTION, REDUCTION
from kdsl.lang.primitives import (
    Primitive,
)
from kdsl.solve.constraints import pad_binding
from kdsl.solve.padding import Padding

__all__ = ["GRAPH_RULES", "RULES", "Shapes", "binding", "random_inputs", "run", "shapes"]


# ------------------------------------------------------------------------------------------------
# Concrete sizes
# ------------------------------------------------------------------------------------------------


def binding(op: Operator, layer: Mapping[str, int]) -> dict[str, int]:
    """The value of every variable ``op`` mentions: the layer's, else the operator's default.

    >>> from kdsl.lang import *
    >>> N, C = primary("N C"); G = coefficient("G")
    >>> op = Input(N, C) >> Split(C, C / G, "g", "c") >> Output(N, "g", "c", defaults={"G": 2})
    >>> binding(op, {"N": 1, "C": 8, "extra": 5})
    {'C': 8, 'N': 1, 'G': 2}
    """
    if not isinstance(layer, Mapping):
        raise LayerError(f"a layer must be a mapping of variable names to ints, got {type(layer).__name__}")
    values: dict[str, int] = {}
    missing = []
    defaults = op.default_coefficients
    for var in op.variables:
        if var.name in layer:
            value = layer[var.name]
            source = "the layer"
        elif var.name in defaults:
            value = defaults[var.name]
            source = "the operator's defaults"
        else:
            missing.append(var.name)
            continue
        if isinstance(value, bool) or not isinstance(value, Integral) or value <= 0:
            raise LayerError(f"{source} gives {var.name} = {value!r}; sizes must be positive integers")
        values[var.name] = int(value)
    if missing:
        raise LayerError(
            f"no value for {', '.join(missing)}: the layer binds {sorted(layer) or 'nothing'} and the "
            f"operator's defaults are {defaults or 'none'}; add {', '.join(missing)} to the layer"
        )
    return values


@dataclass(frozen=True)
class Shapes:
    """Concrete shapes of an operator at one layer: the input, each weight (in order), the output;
    a kernel of several inputs has the others' in ``extra_inputs`` (:attr:`inputs` lists all)."""

    input: tuple[int, ...]
    weights: tuple[tuple[int, ...], ...]
    output: tuple[int, ...]
    extra_inputs: tuple[tuple[int, ...], ...] = field(default=(), repr=False)

    @property
    def inputs(self) -> tuple[tuple[int, ...], ...]:
        """Every input's shape, in the order the kernel takes them."""
        return (self.input, *self.extra_inputs)


def shapes(op: Operator, layer: Mapping[str, int], *, pad: bool = False) -> Shapes:
    """Check every size ``op`` creates at ``layer`` and return the concrete shapes.

    Raises ``LayerError`` for an unbound variable and ``DivisibilityError`` when a created size is
    not a positive integer (naming the step, the size and the values). With ``pad=True`` the
    sizes are padded (:mod:`kdsl.solve.padding`): the input and output have the caller's
    (original, cropped) shapes and the weights the padded ones.

    >>> from kdsl.lang import *
    >>> N, C, H = primary("N C H"); s = coefficient("s")
    >>> op = Input(N, C, H) >> Unfold(H, 3, "k") >> Stride(H, s) >> Reduce("k") >> Output(N, C, "H")
    >>> shapes(op, {"N": 2, "C": 3, "H": 8, "s": 2})
    Shapes(input=(2, 3, 8), weights=(), output=(2, 3, 4))
    >>> shapes(op, {"N": 2, "C": 3, "H": 7, "s": 2})
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.DivisibilityError: Stride(H, s): the dim H: the size H/s is 7/2 at this layer (H=7, s=2); ...
    >>> shapes(op, {"N": 2, "C": 3, "H": 7, "s": 2}, pad=True)
    Shapes(input=(2, 3, 7), weights=(), output=(2, 3, 4))
    """
    if pad:
        _one_input(op, "padding (pad=True)")
        padding = _padding(op, layer)
        padded = shapes(op, padding.padded_binding)
        return Shapes(input=padding.input_shape, weights=padded.weights, output=padding.output_shape)
    values = binding(op, layer)
    chain = op.chain if isinstance(op, Operator) else op
    if chain is not None:
        # a linear operator's shapes are its chain's, its errors worded by the chain's steps
        return _chain_shapes(chain, values)
    return _node_shapes(op, values)


def _chain_shapes(op: Chain, values: Mapping[str, int]) -> Shapes:
    for dim in op.inputs:
        concrete(dim.size, values, f"the input dim {dim.name}")
    # every size a step mentions or creates must be a positive integer at this layer
    weight_shapes = []
    for step, after in zip(op.steps, op.live[1:]):
        what = step.describe()
        for size in step.sizes():
            concrete(size, values, what)
        for name in step.produces:
            concrete(after[name], values, f"{what}: the dim {name}")
        for weight in step.weights():
            weight_shapes.append(tuple(concrete(d.size, values, f"{what}: {d.name}") for d in weight.dims))
    return Shapes(
        input=tuple(concrete(d.size, values, d.name) for d in op.inputs),
        weights=tuple(weight_shapes),
        output=tuple(concrete(op.live[-1][d.name], values, d.name) for d in op.outputs),
    )


def _node_shapes(graph: Operator, values: Mapping[str, int]) -> Shapes:
    weight_shapes: list[tuple[int, ...]] = []
    for index, node in enumerate(graph.nodes):
        what = f"node {index} ({node.kind})"
        if isinstance(node.step, Chain):
            weight_shapes.extend(_chain_shapes(node.step, values).weights)
        elif isinstance(node.step, Primitive):
            for size in node.step.sizes():
                concrete(size, values, f"{what}: {node.step.describe()}")
            for weight in node.step.weights():
                weight_shapes.append(tuple(concrete(d.size, values, f"{what}: {d.name}") for d in weight.dims))
        for dim in node.dims:
            concrete(dim.size, values, f"{what}: the dim {dim.name}")
    first, *others = (tuple(concrete(d.size, values, d.name) for d in dims) for dims in graph.input_dims)
    return Shapes(
        input=first,
        weights=tuple(weight_shapes),
        output=tuple(concrete(d.size, values, d.name) for d in graph.outputs),
        extra_inputs=tuple(others),
    )


def _one_input(op: Operator, what: str) -> None:
    if isinstance(op, Operator) and len(op.input_nodes) > 1:
        raise LoweringError(
            f"{what} is not supported for a kernel of several inputs ({', '.join(op.input_names)}) yet; "
            f"pass sizes that divide"
        )


def _padding(op: Operator, layer: Mapping[str, int]) -> Padding:
    """The padding of ``op`` at ``layer`` (a mapping that may bind coefficients, like every
    layer here; an unbound variable is the same LayerError as unpadded)."""
    if not isinstance(layer, Mapping):
        raise LayerError(f"a layer must be a mapping of variable names to ints, got {type(layer).__name__}")
    return pad_binding(op, binding(op, layer))


# ------------------------------------------------------------------------------------------------
# The interpreter: the data as an ndarray plus the name of each axis
# ------------------------------------------------------------------------------------------------


def _check_array(array: object, expected: tuple[int, ...], names: Sequence[str], what: str) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise ShapeError(f"{what} must be a NumPy array, got {type(array).__name__}")
    if array.ndim != len(expected):
        raise ShapeError(
            f"{what} has {array.ndim} axes {array.shape} but needs {len(expected)} "
            f"([{', '.join(f'{n}: {s}' for n, s in zip(names, expected))}])"
        )
    for name, want, got in zip(names, expected, array.shape):
        if want != got:
            raise ShapeError(f"{what}: the dim {name} has size {got} but this layer needs {want}")
    return array


def run(
    op: Operator,
    layer: Mapping[str, int],
    x: np.ndarray | Sequence[np.ndarray],
    *weights: np.ndarray | Sequence[np.ndarray],
    pad: bool = False,
) -> np.ndarray:
    """Evaluate ``op`` (an operator or a branching kernel) on the input ``x`` with ``weights`` (in
    ``op.weights`` order) at ``layer``.

    The arguments after the layer are those a compiled kernel takes (``kernel(x, *weights)``): the
    input, then the weights one by one, ``run(op, layer, x, w)``; the weights given as one list,
    ``run(op, layer, x, [w])``, is the same call. A kernel of several inputs takes them as one
    tuple ``x`` (as :func:`random_inputs` gives them) or one by one before the weights, as the
    compiled kernel does: ``run(op, layer, (a, b), w)`` or ``run(op, layer, a, b, w)``.

    ``layer`` maps variable names to ints (extra names are ignored; a coefficient it omits takes
    the operator's default). ``x`` must be a floating (or complex) array shaped like the input
    dims; the computation runs in its dtype and the result is shaped like the output dims.

    With ``pad=True`` a size that does not divide is padded (:mod:`kdsl.solve.padding`): ``x``
    has the layer's shape and is zero-padded at the end of each padded dim, the operator runs at
    the padded sizes (``weights`` have the padded shapes, see ``shapes(..., pad=True)``) and each
    output dim is cropped to the elements it keeps.

    >>> import numpy as np
    >>> from kdsl.lang import *
    >>> M, Cin, Cout = primary("M Cin Cout")
    >>> matmul = Input(M, Cin) >> Share(Weight(Cin, Cout, name="w")) >> Reduce(Cin) >> Output(M, Cout)
    >>> x, (w,) = np.arange(6.0).reshape(2, 3), [np.ones((3, 2))]
    >>> run(matmul, {"M": 2, "Cin": 3, "Cout": 2}, x, [w])
    array([[ 3.,  3.],
           [12., 12.]])
    >>> run(matmul, {"M": 2, "Cin": 3, "Cout": 2}, x, w).tolist()  # the weights one by one, as a kernel takes them
    [[3.0, 3.0], [12.0, 12.0]]
    >>> run(matmul, {"M": 2, "Cin": 4, "Cout": 2}, x, [w])
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.ShapeError: the input x: the dim Cin has size 3 but this layer needs 4

    A kernel of several inputs takes ``x`` as a tuple of arrays, in ``op.input_names`` order:

    >>> B, M, K, N = primary("B M K N")
    >>> bmm = Product(Input(B, M, K, name="a"), Input(B, K, N, name="b"), "K") >> Output(B, M, N)
    >>> a, b = np.ones((1, 2, 3)), np.full((1, 3, 2), 2.0)
    >>> run(bmm, {"B": 1, "M": 2, "K": 3, "N": 2}, (a, b), []).tolist()
    [[[6.0, 6.0], [6.0, 6.0]]]
    >>> run(bmm, {"B": 1, "M": 2, "K": 3, "N": 2}, a, b).tolist()  # as the compiled kernel takes them
    [[[6.0, 6.0], [6.0, 6.0]]]

    Padded: a sum over windows of 3 at a stride of 2 on 5 elements runs on 6 (the sixth a zero)
    and keeps ceil(5/2) = 3 results.

    >>> L = primary("L"); s = coefficient("s")
    >>> strided = Input(L) >> Unfold(L, 3, "k") >> Stride(L, s) >> Reduce("k") >> Output("L", defaults={"s": 2})
    >>> run(strided, {"L": 5}, np.arange(1.0, 6.0), [], pad=True)
    array([3., 9., 9.])
    """
    x, weights = _call_arguments(op, x, weights)
    if pad:
        _one_input(op, "padding (pad=True)")
        padding = _padding(op, layer)
        x = _check_array(x, padding.input_shape, [d.name for d in op.inputs], "the input x")
        padded = np.pad(x, [(0, d.amount) for d in padding.inputs])
        result = run(op, padding.padded_binding, padded, weights)
        return np.ascontiguousarray(result[tuple(slice(0, d.original) for d in padding.outputs)])
    expected = shapes(op, layer)
    values = binding(op, layer)
    xs = _input_arrays(op, x, expected)
    x = xs[0]
    if len(weights) != len(op.weights):
        listed = ", ".join(str(w.name) for w in op.weights) or "none"
        raise ShapeError(f"the operator has {len(op.weights)} weights ({listed}) but {len(weights)} were given")
    arrays = [
        _check_array(array, shape, [d.name for d in weight.dims], f"the weight {weight.name}").astype(x.dtype)
        for array, shape, weight in zip(weights, expected.weights, op.weights)
    ]
    return _run_nodes(op, values, xs, arrays)


def _call_arguments(op: Operator, x: object, rest: tuple[object, ...]) -> tuple[object, object]:
    """:func:`run`'s ``x`` and weights from the arguments after the layer, in either call shape:
    (x, [weights]) or (x, *weights); several inputs as one tuple or one by one first."""
    count = len(op.input_names)
    if count > 1 and not isinstance(x, (tuple, list)):
        arrays = len(rest) if not rest or not isinstance(rest[-1], (tuple, list)) else len(rest) - 1
        if arrays < count - 1:  # a list after them is the weights: run(op, layer, a, b, [w])
            raise ShapeError(
                f"the kernel takes {count} inputs ({', '.join(op.input_names)}) before its weights, "
                f"got {1 + arrays} arrays"
            )
        x, rest = (x, *rest[: count - 1]), rest[count - 1 :]
    if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
        return x, rest[0]  # the weights as one list: run(op, layer, x, [w])
    return x, list(rest)


def _input_arrays(op: Operator, x: object, expected: Shapes) -> list[np.ndarray]:
    """The input arrays, checked: ``x`` itself for one input, ``x``'s items (a tuple or list, in
    ``op.input_names`` order) for several."""
    names = op.input_names
    if len(names) == 1:
        given = [x]
    elif isinstance(x, (tuple, list)) and len(x) == len(names):
        given = list(x)
    else:
        count = f"{len(x)} arrays" if isinstance(x, (tuple, list)) else f"a {type(x).__name__}"
        raise ShapeError(
            f"the kernel takes {len(names)} inputs ({', '.join(names)}); pass a tuple of that many arrays, got {count}"
        )
    arrays = []
    for name, array, shape, dims in zip(names, given, expected.inputs, op.input_dims):
        checked = _check_array(array, shape, [d.name for d in dims], f"the input {name}")
        if not (np.issubdtype(checked.dtype, np.floating) or np.issubdtype(checked.dtype, np.complexfloating)):
            raise LoweringError(
                f"the input {name} has dtype {checked.dtype}; pass a floating array, e.g. {name}.astype(np.float64)"
            )
        arrays.append(checked)
    return arrays


def _run_chain(op: Operator, values: Mapping[str, int], x: np.ndarray, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The chain's result, axes in ``op.outputs`` order."""
    tensor = Named(x, [d.name for d in op.inputs])
    remaining = iter(arrays)
    index = 0
    while index < len(op.steps):
        step = op.steps[index]
        index += 1
        following: list[Primitive] = []
        if CONTRACTION in step.facts:
            while index < len(op.steps) and REDUCTION in op.steps[index].facts:
                following.append(op.steps[index])
                index += 1
        rule = RULES.get(step.kind)
        if rule is None:
            raise LoweringError(f"the reference interpreter has no rule for {step!r}")
        tensor = rule(tensor, step, StepEnv(values, remaining, following))
    order = [tensor.axis(d.name) for d in op.outputs]
    return np.ascontiguousarray(np.transpose(tensor.data, order))


# ------------------------------------------------------------------------------------------------
# Branching kernels: one rule per node kind, over named arrays
# ------------------------------------------------------------------------------------------------


def _erf(data: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[data.dtype])(data) if data.size else data


#: Map's functions, written from their definitions (kdsl.lang.nonlinear.MAP_FUNCTIONS)
MAP_RULES: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "relu": lambda a, by: np.maximum(a, 0),
    "abs": lambda a, by: np.abs(a),
    "neg": lambda a, by: -a,
    "sin": lambda a, by: np.sin(a),
    "exp": lambda a, by: np.exp(a),
    "sigmoid": lambda a, by: 1 / (1 + np.exp(-a)),
    "tanh": lambda a, by: np.tanh(a),
    "gelu": lambda a, by: a * (1 + _erf(a / math.sqrt(2))) / 2,
    "scale": lambda a, by: a * np.asarray(by, dtype=a.dtype),
}


@dataclass
class _GraphEnv:
    """What a node rule may need: the layer's values, the weight arrays in order, the node's
    position, and the kernel (a Fold looks at the chain before it for zero padding)."""

    values: Mapping[str, int]
    arrays: Iterator[np.ndarray]
    graph: Operator
    index: int
    results: list[Named]


def _as(t: Named, axes: Sequence[str]) -> np.ndarray:
    """``t``'s data with its axes in the order ``axes`` (a name ``t`` lacks becomes a length-1 axis)."""
    present = [a for a in axes if a in t.axes]
    data = np.transpose(t.data, [t.axis(a) for a in present])
    shape = [t.size(a) if a in t.axes else 1 for a in axes]
    return data.reshape(shape)


def _chain_node(args: list[Named], node: Node, env: _GraphEnv) -> Named:
    chain = node.chain
    arrays = [next(env.arrays) for _ in chain.weights]
    data = _run_chain(chain, env.values, _as(args[0], [d.name for d in chain.inputs]), arrays)
    return Named(data, [d.name for d in chain.outputs])


def _map_node(args: list[Named], node: Node, env: _GraphEnv) -> Named:
    step = node.step
    assert isinstance(step, Map)
    return Named(MAP_RULES[step.fn](args[0].data, step.by), list(args[0].axes))


def _padding_mask(env: _GraphEnv, fold: int) -> np.ndarray | None:
    """Where the Fold node ``fold``'s argument holds data rather than a window's zero padding: its
    linear region (the chains, through Renames, back to the last non-linear node) run on ones with
    weights of ones is positive exactly where an element reads at least one input element. ``None``
    when no window in that region can have padded it. The result's axes are the argument's dims."""
    graph = env.graph
    region = graph.padding_region(fold)
    if not region:
        return None
    source = env.results[graph.nodes[region[0]].args[0]]
    current = Named(np.ones(source.data.shape, dtype=source.data.dtype), list(source.axes))
    for index in region:
        node = graph.nodes[index]
        if current.axes != [d.name for d in graph.nodes[node.args[0]].dims]:
            # Renames between two chains: same axes in the same order, other names
            current = Named(current.data, [d.name for d in graph.nodes[node.args[0]].dims])
        weights = [
            np.ones(tuple(concrete(d.size, env.values, d.name) for d in w.dims), current.data.dtype)
            for w in node.chain.weights
        ]
        data = _run_chain(node.chain, env.values, _as(current, [d.name for d in node.chain.inputs]), weights)
        current = Named(data, [d.name for d in node.chain.outputs])
    return current.data > 0


def _fold_node(args: list[Named], node: Node, env: _GraphEnv) -> Named:
    # out = max (or min) over the dims of the elements that read data: padding takes no part, as in
    # F.max_pool2d's padding; where none does, 0
    step = node.step
    assert isinstance(step, Fold)
    t = args[0]
    mask = _padding_mask(env, env.index)
    if mask is not None:
        names = [d.name for d in env.graph.nodes[node.args[0]].dims]
        mask = np.transpose(mask, [names.index(a) for a in t.axes])
    else:
        mask = np.ones(t.data.shape, dtype=bool)
    axes = tuple(t.axis(d) for d in step.dims)  # type: ignore[arg-type]
    empty = -np.inf if step.how == "max" else np.inf
    folded = np.where(mask, t.data, empty)
    data = folded.max(axis=axes) if step.how == "max" else folded.min(axis=axes)
    data = np.where(mask.any(axis=axes), data, 0).astype(t.data.dtype)
    return Named(data, [a for a in t.axes if a not in step.dims])


def _softmax_node(args: list[Named], node: Node, env: _GraphEnv) -> Named:
    step = node.step
    assert isinstance(step, Softmax)
    t = args[0]
    axes = tuple(t.axis(d) for d in step.dims)  # type: ignore[arg-type]
    shifted = np.exp(t.data - t.data.max(axis=axes, keepdims=True))  # the max cancels; it keeps exp finite
    return Named(shifted / shifted.sum(axis=axes, keepdims=True), list(t.axes))


def _letters(axes: Sequence[str], what: str) -> dict[str, str]:
    unique = list(dict.fromkeys(axes))
    if len(unique) > len(string.ascii_letters):
        raise LoweringError(f"{what}: more than {len(string.ascii_letters)} axes at once")
    return dict(zip(unique, string.ascii_letters))


def _fc_node(args: list[Named], node: Node, env: _GraphEnv) -> Named:
    # out[.., o] = sum_c in[.., c] * w[o, c]
    step = node.step
    assert isinstance(step, FC)
    t, array = args[0], next(env.arrays)
    weight_axes = [step.name, *step.dims]  # type: ignore[list-item]
    out_axes = [d.name for d in node.dims]
    letter = _letters([*t.axes, step.name], step.describe())
    spec = "".join(letter[a] for a in t.axes) + "," + "".join(letter[a] for a in weight_axes)
    spec += "->" + "".join(letter[a] for a in out_axes)
    return Named(np.asarray(np.einsum(spec, t.data, array), dtype=t.data.dtype), out_axes)


def _rename_node(args: list[Named], node: Node, env: _GraphEnv) -> Named:
    step = node.step
    assert isinstance(step, Rename)
    return Named(args[0].data, [step.name if a == step.dim else a for a in args[0].axes])


BLEND_RULES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
}


def _blend_node(args: list[Named], node: Node, env: _GraphEnv) -> Named:
    # the smaller branch broadcasts over the larger one's dims, matched by name
    step = node.step
    assert isinstance(step, BlendJoin)
    axes = [d.name for d in node.dims]
    return Named(BLEND_RULES[step.how](_as(args[0], axes), _as(args[1], axes)), axes)


def _product_node(args: list[Named], node: Node, env: _GraphEnv) -> Named:
    # out = sum over the reduced dims of lhs * rhs; a name indexes both branches
    lhs, rhs = args
    out_axes = [d.name for d in node.dims]
    letter = _letters([*lhs.axes, *rhs.axes], "Product")
    spec = "".join(letter[a] for a in lhs.axes) + "," + "".join(letter[a] for a in rhs.axes)
    spec += "->" + "".join(letter[a] for a in out_axes)
    return Named(np.asarray(np.einsum(spec, lhs.data, rhs.data), dtype=lhs.data.dtype), out_axes)


#: One rule per node kind of a branching kernel (a test checks that none is missing).
GRAPH_RULES: dict[str, Callable[[list[Named], Node, _GraphEnv], Named]] = {
    "Chain": _chain_node,
    "Map": _map_node,
    "Fold": _fold_node,
    "Softmax": _softmax_node,
    "FC": _fc_node,
    "Rename": _rename_node,
    "Blend": _blend_node,
    "Product": _product_node,
}


def _run_nodes(
    graph: Operator, values: Mapping[str, int], xs: Sequence[np.ndarray], arrays: Sequence[np.ndarray]
) -> np.ndarray:
    """Evaluate the nodes in order, each by its rule in :data:`GRAPH_RULES`; each reads its arguments'
    named arrays (a linear operator is its input and one chain node; an input node takes the next
    of ``xs``, in the kernel's input order)."""
    results: list[Named] = [Named(xs[0], [d.name for d in graph.inputs])]
    remaining = iter(arrays)
    for index, node in enumerate(graph.nodes[1:], 1):
        if node.step is None:
            results.append(Named(xs[graph.input_nodes.index(index)], [d.name for d in node.dims]))
            continue
        env = _GraphEnv(values, remaining, graph, index, results)
        results.append(GRAPH_RULES[node.kind]([results[a] for a in node.args], node, env))
    return np.ascontiguousarray(_as(results[-1], [d.name for d in graph.outputs]))


def random_inputs(
    op: Operator,
    layer: Mapping[str, int],
    seed: int = 0,
    dtype: type | np.dtype = np.float64,
    *,
    pad: bool = False,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """A standard-normal input and weights shaped for ``op`` at ``layer`` (seeded, reproducible);
    with ``pad=True``, shaped as ``run(..., pad=True)`` takes them (padded weights).

    >>> from kdsl.lang import *
    >>> N, Cin, Cout = primary("N Cin Cout")
    >>> linear = Input(N, Cin) >> Share(Weight(Cout, Cin, name="w")) >> Reduce(Cin) >> Output(N, Cout)
    >>> x, weights = random_inputs(linear, {"N": 2, "Cin": 3, "Cout": 4})
    >>> x.shape, [w.shape for w in weights], x.dtype
    ((2, 3), [(4, 3)], dtype('float64'))
    """
    expected = shapes(op, layer, pad=pad)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(expected.input).astype(dtype)
    weights = [rng.standard_normal(shape).astype(dtype) for shape in expected.weights]
    if expected.extra_inputs:  # several inputs: a tuple of them, as run takes them
        others = [rng.standard_normal(shape).astype(dtype) for shape in expected.extra_inputs]
        return (x, *others), weights  # type: ignore[return-value]
    return x, weights
