"""The NumPy reference interpreter's rules per primitive (:mod:`kdsl.codegen.reference` runs them):
each takes an array whose axes carry dim names and returns the step's result, written from the
primitive's top-down semantics to be read and trusted rather than to be fast.

>>> import numpy as np
>>> from kdsl.lang.primitives import Stride
>>> t = Named(np.arange(6.0).reshape(1, 6), ["C", "L"])
>>> RULES["Stride"](t, Stride("L", Size.of(2)), StepEnv({}, iter(())))
Named(data=array([[0., 2., 4.]]), axes=['C', 'L'])
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kdsl.lang.errors import DivisibilityError, LoweringError
from kdsl.lang.primitives import (
    Dilate,
    Expand,
    Merge,
    Primitive,
    Reduce,
    Share,
    Shift,
    Slide,
    Split,
    Stride,
    Unfold,
    Weight,
)
from kdsl.lang.sizes import Size

__all__ = ["RULES", "Named", "StepEnv", "concrete"]


def concrete(size: Size, values: Mapping[str, int], what: str) -> int:
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


@dataclass
class Named:
    """An array whose axes are named by dims (``axes[i]`` names ``data``'s axis ``i``)."""

    data: np.ndarray
    axes: list[str]

    def axis(self, name: str) -> int:
        return self.axes.index(name)

    def size(self, name: str) -> int:
        return self.data.shape[self.axis(name)]


@dataclass
class StepEnv:
    """What a rule may need besides the data: the layer's values, the weight arrays not used yet,
    and (for a contraction) the reductions right after it, which it sums inside its einsum."""

    values: Mapping[str, int]
    arrays: Iterator[np.ndarray]
    following: list[Primitive] = field(default_factory=list)


def _split(t: Named, step: Split, env: StepEnv) -> Named:
    # out[i, j] = in[B*i + j] is exactly a row-major reshape of the axis into (G, B).
    axis = t.axis(step.dim)
    block = concrete(step.block, env.values, step.describe())
    shape = t.data.shape
    data = t.data.reshape((*shape[:axis], shape[axis] // block, block, *shape[axis + 1 :]))
    return Named(data, [*t.axes[:axis], step.outer, step.inner, *t.axes[axis + 1 :]])


def _merge(t: Named, step: Merge, env: StepEnv) -> Named:
    # out[i] = in[i // B, i % B]: put the inner axis right after the outer one, then reshape.
    axes = [a for a in t.axes if a != step.inner]
    position = axes.index(step.outer)
    axes.insert(position + 1, step.inner)
    data = np.transpose(t.data, [t.axis(a) for a in axes])
    shape = data.shape
    data = data.reshape((*shape[:position], shape[position] * shape[position + 1], *shape[position + 2 :]))
    return Named(data, [*axes[:position], step.name, *axes[position + 2 :]])


def _shift(t: Named, step: Shift, env: StepEnv) -> Named:
    # out[i] = in[(i + offset) mod N]
    axis = t.axis(step.dim)
    n = t.data.shape[axis]
    source = (np.arange(n) + step.offset) % n
    return Named(np.take(t.data, source, axis=axis), list(t.axes))


def _expand(t: Named, step: Expand, env: StepEnv) -> Named:
    # out[..., c] = in[...]: a new last axis along which the data repeats.
    size = concrete(step.size, env.values, step.describe())
    data = np.broadcast_to(t.data[..., np.newaxis], (*t.data.shape, size)).copy()
    return Named(data, [*t.axes, step.name])


def _unfold(t: Named, step: Unfold, env: StepEnv) -> Named:
    # out[i, j] = in[i + j - K//2], and 0 where that index falls outside [0, N). The bound is the
    # dim's size N, not the window K (the window may be larger than the dim).
    axis = t.axis(step.dim)
    n = t.data.shape[axis]
    window = concrete(step.window, env.values, step.describe())
    source = np.arange(n)[:, np.newaxis] + np.arange(window)[np.newaxis, :] - window // 2
    inside = (source >= 0) & (source < n)
    gathered = np.take(t.data, np.clip(source, 0, n - 1), axis=axis)  # axes (.., N, K, ..)
    mask = inside.reshape((1,) * axis + (n, window) + (1,) * (t.data.ndim - axis - 1))
    data = np.where(mask, gathered, np.zeros((), dtype=t.data.dtype))
    return Named(data, [*t.axes[: axis + 1], step.name, *t.axes[axis + 1 :]])


def _stride(t: Named, step: Stride, env: StepEnv) -> Named:
    # out[i] = in[S*i], for i < N/S
    axis = t.axis(step.dim)
    stride = concrete(step.stride, env.values, step.describe())
    kept = np.arange(t.data.shape[axis] // stride) * stride
    return Named(np.take(t.data, kept, axis=axis), list(t.axes))


def _slide(t: Named, step: Slide, env: StepEnv) -> Named:
    # out[i, j] = in[s*i + j] for i < P: every read is inside [0, N) (the solver checked P)
    axis = t.axis(step.dim)
    window = concrete(step.window, env.values, step.describe())
    count = concrete(step.size, env.values, step.describe())
    stride = concrete(step.stride, env.values, step.describe())
    length = t.data.shape[axis]
    if window > length:  # a layer the solver did not check; no count of windows fits
        raise DivisibilityError(
            f"{step.describe()}: the window {window} does not fit in the dim {step.dim} of size {length}; "
            f"choose a window no larger than the dim {step.dim}, or layers where {step.dim} is larger"
        )
    if count != (length - window) // stride + 1:
        raise DivisibilityError(
            f"{step.describe()}: {length} positions with a window of {window} and stride {stride} give "
            f"{max(0, (length - window) // stride + 1)} windows, not {step.size} = {count}"
        )
    source = np.arange(count)[:, np.newaxis] * stride + np.arange(window)[np.newaxis, :]
    data = np.take(t.data, source, axis=axis)  # axes (.., P, K, ..)
    return Named(data, [*t.axes[: axis + 1], step.name, *t.axes[axis + 1 :]])


def _dilate(t: Named, step: Dilate, env: StepEnv) -> Named:
    # out[i] = in[i / s] where s divides i, else 0: every element followed by s - 1 zeros
    axis = t.axis(step.dim)
    factor = concrete(step.factor, env.values, step.describe())
    shape = list(t.data.shape)
    shape[axis] *= factor
    data = np.zeros(shape, dtype=t.data.dtype)
    data[(slice(None),) * axis + (slice(None, None, factor),)] = t.data
    return Named(data, list(t.axes))


def _reduce(t: Named, step: Reduce, env: StepEnv) -> Named:
    # out = sum_i in[i] (or the mean)
    axis = t.axis(step.dim)
    data = t.data.mean(axis=axis) if step.mean else t.data.sum(axis=axis)
    return Named(data, [a for a in t.axes if a != step.dim])


def _share(t: Named, step: Share, env: StepEnv) -> Named:
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
    return Named(np.asarray(data, dtype=t.data.dtype), kept)


#: The interpreter's table: one rule per primitive kind (a test checks that none is missing).
RULES: dict[str, Callable[[Named, Any, StepEnv], Named]] = {
    "Split": _split,
    "Merge": _merge,
    "Shift": _shift,
    "Expand": _expand,
    "Unfold": _unfold,
    "Stride": _stride,
    "Slide": _slide,
    "Dilate": _dilate,
    "Reduce": _reduce,
    "Share": _share,
}
