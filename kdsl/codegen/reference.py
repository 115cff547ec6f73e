"""The NumPy reference interpreter: the test oracle every other backend is checked against.

It evaluates an operator straight from the top-down semantics of its primitives, holding the data
as one ndarray whose axes carry dim names. Each primitive has one small rule below, written to be
read and trusted rather than to be fast; it shares no code with the PyTorch or TVM backends (it
imports only NumPy and :mod:`kdsl.lang`), so two backends cannot agree by sharing a bug with it.

>>> import numpy as np
>>> from kdsl.lang import *
>>> N, C, L = primary("N C L"); K = coefficient("K")
>>> blur = Input(N, C, L) >> Unfold(L, K, "k") >> Reduce("k") >> Output(N, C, L, defaults={"K": 3})
>>> run(blur, {"N": 1, "C": 1, "L": 4}, np.array([[[1.0, 2.0, 3.0, 4.0]]]), [])
array([[[3., 6., 9., 7.]]])
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

import numpy as np

from kdsl.lang.build import Operator
from kdsl.lang.errors import DivisibilityError, LayerError, LoweringError, ShapeError
from kdsl.lang.primitives import (
    CONTRACTION,
    REDUCTION,
    Expand,
    Merge,
    Primitive,
    Reduce,
    Share,
    Shift,
    Split,
    Stride,
    Unfold,
    Weight,
)
from kdsl.lang.sizes import Size

__all__ = ["RULES", "Shapes", "binding", "random_inputs", "run", "shapes"]


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


def _concrete(size: Size, values: Mapping[str, int], what: str) -> int:
    """``size`` at this layer, which must be a positive integer (else a DivisibilityError)."""
    value = size.evaluate(values)
    if value.denominator != 1 or value <= 0:
        used = ", ".join(f"{v.name}={values[v.name]}" for v in size.variables) or "no variables"
        raise DivisibilityError(
            f"{what}: the size {size} is {value} at this layer ({used}); it must be a positive integer, "
            f"so choose sizes where it divides"
        )
    return int(value)


def _weight(step: Share) -> Weight:
    weight = step.weight
    if not isinstance(weight, Weight) or not weight.resolved:
        raise LoweringError(f"the step {step!r} is not resolved; build operators with Input(...) >> ...")
    return weight


@dataclass(frozen=True)
class Shapes:
    """Concrete shapes of an operator at one layer: the input, each weight (in order), the output."""

    input: tuple[int, ...]
    weights: tuple[tuple[int, ...], ...]
    output: tuple[int, ...]


def shapes(op: Operator, layer: Mapping[str, int]) -> Shapes:
    """Check every size ``op`` creates at ``layer`` and return the concrete shapes.

    Raises ``LayerError`` for an unbound variable and ``DivisibilityError`` when a created size is
    not a positive integer (naming the step, the size and the values).

    >>> from kdsl.lang import *
    >>> N, C, H = primary("N C H"); s = coefficient("s")
    >>> op = Input(N, C, H) >> Unfold(H, 3, "k") >> Stride(H, s) >> Reduce("k") >> Output(N, C, "H")
    >>> shapes(op, {"N": 2, "C": 3, "H": 8, "s": 2})
    Shapes(input=(2, 3, 8), weights=(), output=(2, 3, 4))
    >>> shapes(op, {"N": 2, "C": 3, "H": 7, "s": 2})
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.DivisibilityError: Stride(H, s): the dim H: the size H/s is 7/2 at this layer (H=7, s=2); ...
    """
    values = binding(op, layer)
    for dim in op.inputs:
        _concrete(dim.size, values, f"the input dim {dim.name}")
    # every size a step mentions or creates must be a positive integer at this layer
    weight_shapes = []
    for step, after in zip(op.steps, op.live[1:]):
        what = step.describe()
        for size in step.sizes():
            _concrete(size, values, what)
        for name in step.produces:
            _concrete(after[name], values, f"{what}: the dim {name}")
        for weight in step.weights():
            weight_shapes.append(tuple(_concrete(d.size, values, f"{what}: {d.name}") for d in weight.dims))
    return Shapes(
        input=tuple(_concrete(d.size, values, d.name) for d in op.inputs),
        weights=tuple(weight_shapes),
        output=tuple(_concrete(op.live[-1][d.name], values, d.name) for d in op.outputs),
    )


# ------------------------------------------------------------------------------------------------
# The interpreter: the data as an ndarray plus the name of each axis
# ------------------------------------------------------------------------------------------------


@dataclass
class _Named:
    """An array whose axes are named by dims (``axes[i]`` names ``data``'s axis ``i``)."""

    data: np.ndarray
    axes: list[str]

    def axis(self, name: str) -> int:
        return self.axes.index(name)

    def size(self, name: str) -> int:
        return self.data.shape[self.axis(name)]


@dataclass
class _Env:
    """What a rule may need besides the data: the layer's values, the weight arrays not used yet,
    and (for a contraction) the reductions right after it, which it sums inside its einsum."""

    values: Mapping[str, int]
    arrays: Iterator[np.ndarray]
    following: list[Primitive] = field(default_factory=list)


def _split(t: _Named, step: Split, env: _Env) -> _Named:
    # out[i, j] = in[B*i + j] is exactly a row-major reshape of the axis into (G, B).
    axis = t.axis(step.dim)
    block = _concrete(step.block, env.values, step.describe())
    shape = t.data.shape
    data = t.data.reshape((*shape[:axis], shape[axis] // block, block, *shape[axis + 1 :]))
    return _Named(data, [*t.axes[:axis], step.outer, step.inner, *t.axes[axis + 1 :]])


def _merge(t: _Named, step: Merge, env: _Env) -> _Named:
    # out[i] = in[i // B, i % B]: put the inner axis right after the outer one, then reshape.
    axes = [a for a in t.axes if a != step.inner]
    position = axes.index(step.outer)
    axes.insert(position + 1, step.inner)
    data = np.transpose(t.data, [t.axis(a) for a in axes])
    shape = data.shape
    data = data.reshape((*shape[:position], shape[position] * shape[position + 1], *shape[position + 2 :]))
    return _Named(data, [*axes[:position], step.name, *axes[position + 2 :]])


def _shift(t: _Named, step: Shift, env: _Env) -> _Named:
    # out[i] = in[(i + offset) mod N]
    axis = t.axis(step.dim)
    n = t.data.shape[axis]
    source = (np.arange(n) + step.offset) % n
    return _Named(np.take(t.data, source, axis=axis), list(t.axes))


def _expand(t: _Named, step: Expand, env: _Env) -> _Named:
    # out[..., c] = in[...]: a new last axis along which the data repeats.
    size = _concrete(step.size, env.values, step.describe())
    data = np.broadcast_to(t.data[..., np.newaxis], (*t.data.shape, size)).copy()
    return _Named(data, [*t.axes, step.name])


def _unfold(t: _Named, step: Unfold, env: _Env) -> _Named:
    # out[i, j] = in[i + j - K//2], and 0 where that index falls outside [0, N). The bound is the
    # dim's size N, not the window K (the window may be larger than the dim).
    axis = t.axis(step.dim)
    n = t.data.shape[axis]
    window = _concrete(step.window, env.values, step.describe())
    source = np.arange(n)[:, np.newaxis] + np.arange(window)[np.newaxis, :] - window // 2
    inside = (source >= 0) & (source < n)
    gathered = np.take(t.data, np.clip(source, 0, n - 1), axis=axis)  # axes (.., N, K, ..)
    mask = inside.reshape((1,) * axis + (n, window) + (1,) * (t.data.ndim - axis - 1))
    data = np.where(mask, gathered, np.zeros((), dtype=t.data.dtype))
    return _Named(data, [*t.axes[: axis + 1], step.name, *t.axes[axis + 1 :]])


def _stride(t: _Named, step: Stride, env: _Env) -> _Named:
    # out[i] = in[S*i], for i < N/S
    axis = t.axis(step.dim)
    stride = _concrete(step.stride, env.values, step.describe())
    kept = np.arange(t.data.shape[axis] // stride) * stride
    return _Named(np.take(t.data, kept, axis=axis), list(t.axes))


def _reduce(t: _Named, step: Reduce, env: _Env) -> _Named:
    # out = sum_i in[i] (or the mean)
    axis = t.axis(step.dim)
    data = t.data.mean(axis=axis) if step.mean else t.data.sum(axis=axis)
    return _Named(data, [a for a in t.axes if a != step.dim])


def _share(t: _Named, step: Share, env: _Env) -> _Named:
    """out = data * weight, matching the shared axes by name; the weight-only dims become new axes.

    ``reductions`` are the Reduce steps that directly follow; they are summed inside the same
    einsum so that the (often large) product is never materialized. That is the same function as
    multiplying first and reducing afterwards.
    """
    weight, array, reductions = _weight(step), next(env.arrays), env.following
    weight_axes = [d.name for d in weight.dims]
    all_axes = list(t.axes) + [d.name for d, is_new in zip(weight.dims, weight.new) if is_new]
    if len(all_axes) > len(string.ascii_letters):
        raise LoweringError(f"Share({weight.name}): more than {len(string.ascii_letters)} axes at once")
    letter = dict(zip(all_axes, string.ascii_letters))
    reduced = {r.dim for r in reductions}
    kept = [a for a in all_axes if a not in reduced]
    spec = (
        "".join(letter[a] for a in t.axes)
        + ","
        + "".join(letter[a] for a in weight_axes)
        + "->"
        + "".join(letter[a] for a in kept)
    )
    data = np.einsum(spec, t.data, array, optimize=True)
    sizes = dict(zip(t.axes, t.data.shape)) | dict(zip(weight_axes, array.shape))
    for r in reductions:
        if r.mean:
            data = data / np.asarray(sizes[r.dim], dtype=data.dtype)
    return _Named(np.asarray(data, dtype=t.data.dtype), kept)


#: The interpreter's table: one rule per primitive kind (a test checks that none is missing).
RULES: dict[str, Callable[[_Named, Any, _Env], _Named]] = {
    "Split": _split,
    "Merge": _merge,
    "Shift": _shift,
    "Expand": _expand,
    "Unfold": _unfold,
    "Stride": _stride,
    "Reduce": _reduce,
    "Share": _share,
}


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


def run(op: Operator, layer: Mapping[str, int], x: np.ndarray, weights: Sequence[np.ndarray]) -> np.ndarray:
    """Evaluate ``op`` on the input ``x`` with ``weights`` (in ``op.weights`` order) at ``layer``.

    ``layer`` maps variable names to ints (extra names are ignored; a coefficient it omits takes
    the operator's default). ``x`` must be a floating (or complex) array shaped like the input
    dims; the computation runs in its dtype and the result is shaped like the output dims.

    >>> import numpy as np
    >>> from kdsl.lang import *
    >>> M, Cin, Cout = primary("M Cin Cout")
    >>> matmul = Input(M, Cin) >> Share(Weight(Cin, Cout, name="w")) >> Reduce(Cin) >> Output(M, Cout)
    >>> x, (w,) = np.arange(6.0).reshape(2, 3), [np.ones((3, 2))]
    >>> run(matmul, {"M": 2, "Cin": 3, "Cout": 2}, x, [w])
    array([[ 3.,  3.],
           [12., 12.]])
    >>> run(matmul, {"M": 2, "Cin": 4, "Cout": 2}, x, [w])
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.ShapeError: the input x: the dim Cin has size 3 but this layer needs 4
    """
    expected = shapes(op, layer)
    values = binding(op, layer)
    x = _check_array(x, expected.input, [d.name for d in op.inputs], "the input x")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.complexfloating)):
        raise LoweringError(f"the input x has dtype {x.dtype}; pass a floating array, e.g. x.astype(np.float64)")
    if isinstance(weights, np.ndarray) or not isinstance(weights, Sequence):
        raise ShapeError(f"weights must be a list of arrays (one per weight), got {type(weights).__name__}")
    if len(weights) != len(op.weights):
        listed = ", ".join(str(w.name) for w in op.weights) or "none"
        raise ShapeError(f"the operator has {len(op.weights)} weights ({listed}) but {len(weights)} were given")
    arrays = [
        _check_array(array, shape, [d.name for d in weight.dims], f"the weight {weight.name}").astype(x.dtype)
        for array, shape, weight in zip(weights, expected.weights, op.weights)
    ]

    tensor = _Named(x, [d.name for d in op.inputs])
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
        tensor = rule(tensor, step, _Env(values, remaining, following))
    order = [tensor.axis(d.name) for d in op.outputs]
    return np.ascontiguousarray(np.transpose(tensor.data, order))


def random_inputs(
    op: Operator, layer: Mapping[str, int], seed: int = 0, dtype: type | np.dtype = np.float64
) -> tuple[np.ndarray, list[np.ndarray]]:
    """A standard-normal input and weights shaped for ``op`` at ``layer`` (seeded, reproducible).

    >>> from kdsl.lang import *
    >>> N, Cin, Cout = primary("N Cin Cout")
    >>> linear = Input(N, Cin) >> Share(Weight(Cout, Cin, name="w")) >> Reduce(Cin) >> Output(N, Cout)
    >>> x, weights = random_inputs(linear, {"N": 2, "Cin": 3, "Cout": 4})
    >>> x.shape, [w.shape for w in weights], x.dtype
    ((2, 3), [(4, 3)], dtype('float64'))
    """
    expected = shapes(op, layer)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(expected.input).astype(dtype)
    weights = [rng.standard_normal(shape).astype(dtype) for shape in expected.weights]
    return x, weights
