"""PyTorch's own implementation of each classic gallery operator, for tests and benchmarks.

This is kdsl's one table of native PyTorch baselines: tests compare against it, ``kdsl bench codegen``
and ``kdsl bench tune`` time against it. Each entry maps a gallery name to ``(prepare, call)``:
``prepare(weights, sizes)`` turns the operator's weights (in its declared layouts) into the layout the
PyTorch function takes (done once, outside any timing), and ``call(x, prepared, sizes)`` runs that
function. :func:`native_function` gives a ready-to-time call.

>>> import torch
>>> prepare, call = NATIVE["linear"]
>>> call(torch.ones(2, 3), prepare([torch.ones(4, 3)], {}), {}).shape
torch.Size([2, 4])
>>> native_function("matmul", torch.ones(2, 3), [torch.ones(3, 5)], {})().shape
torch.Size([2, 5])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kdsl.lang.errors import KdslError

__all__ = ["NATIVE", "native_function"]

Sizes = Mapping[str, int]


def _f() -> Any:
    import torch.nn.functional as F

    return F


def _as_is(weights: Sequence[Any], v: Sizes) -> list[Any]:
    return list(weights)


def _conv2d_prepare(weights: Sequence[Any], v: Sizes) -> list[Any]:
    return [weights[0].contiguous()]


def _grouped_prepare(weights: Sequence[Any], v: Sizes) -> list[Any]:
    G, K = v["G"], v["K"]
    return [weights[0].reshape(v["Cout"], v["Cin"] // G, K, K).contiguous()]


def _separable_prepare(weights: Sequence[Any], v: Sizes) -> list[Any]:
    return [weights[0][:, None].contiguous(), weights[1][:, :, None, None].contiguous()]


def _kx1_prepare(weights: Sequence[Any], v: Sizes) -> list[Any]:
    return [weights[0][..., None].contiguous(), weights[1][:, :, None, :].contiguous()]


NATIVE: dict[str, tuple[Callable[[Sequence[Any], Sizes], list[Any]], Callable[[Any, list[Any], Sizes], Any]]] = {
    "conv1d": (_as_is, lambda x, w, v: _f().conv1d(x, w[0], padding=v["K"] // 2)),
    "conv2d": (_conv2d_prepare, lambda x, w, v: _f().conv2d(x, w[0], padding=v["K"] // 2)),
    "pointwise_conv2d": (lambda w, v: [w[0][:, :, None, None].contiguous()], lambda x, w, v: _f().conv2d(x, w[0])),
    "depthwise_conv2d": (
        lambda w, v: [w[0][:, None].contiguous()],
        lambda x, w, v: _f().conv2d(x, w[0], padding=v["K"] // 2, groups=v["Cin"]),
    ),
    "grouped_conv2d": (_grouped_prepare, lambda x, w, v: _f().conv2d(x, w[0], padding=v["K"] // 2, groups=v["G"])),
    "depthwise_separable_conv2d": (
        _separable_prepare,
        lambda x, w, v: _f().conv2d(_f().conv2d(x, w[0], padding=v["K"] // 2, groups=v["Cin"]), w[1]),
    ),
    "dilated_conv2d": (
        _conv2d_prepare,
        lambda x, w, v: _f().conv2d(x, w[0], padding=v["d"] * (v["K"] - 1) // 2, dilation=v["d"]),
    ),
    "strided_conv2d": (_conv2d_prepare, lambda x, w, v: _f().conv2d(x, w[0], stride=v["s"], padding=v["K"] // 2)),
    "conv2d_kx1_1xk": (
        _kx1_prepare,
        lambda x, w, v: _f().conv2d(_f().conv2d(x, w[0], padding=(v["K"] // 2, 0)), w[1], padding=(0, v["K"] // 2)),
    ),
    "avg_pool2d": (_as_is, lambda x, w, v: _f().avg_pool2d(x, v["K"])),
    "pixel_shuffle": (_as_is, lambda x, w, v: _f().pixel_shuffle(x, v["r"])),
    "pixel_unshuffle": (_as_is, lambda x, w, v: _f().pixel_unshuffle(x, v["r"])),
    "unfold2d": (_as_is, lambda x, w, v: _f().unfold(x, v["K"], padding=v["K"] // 2)),
    "linear": (_as_is, lambda x, w, v: _f().linear(x, w[0])),
    "matmul": (_as_is, lambda x, w, v: x @ w[0]),
    "shift_conv2d": (
        lambda w, v: [w[0][:, :, None, None].contiguous()],
        lambda x, w, v: _f().conv2d(x.roll(shifts=(-1, -1), dims=(2, 3)), w[0]),
    ),
}


def native_function(name: str, x: Any, weights: Sequence[Any], sizes: Sizes) -> Callable[[], Any]:
    """PyTorch's own ``name`` on ``x`` as a call without arguments (for timing): ``weights`` are in the
    gallery operator's layouts and are prepared once, here.

    >>> native_function("syno_op1", None, [], {})
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.KdslError: PyTorch has no native function for 'syno_op1'; ...
    """
    if name not in NATIVE:
        known = ", ".join(sorted(NATIVE))
        raise KdslError(f"PyTorch has no native function for {name!r}; the table knows {known}")
    prepare, call = NATIVE[name]
    prepared = prepare(weights, sizes)
    return lambda: call(x, prepared, sizes)
