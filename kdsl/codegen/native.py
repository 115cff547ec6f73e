"""PyTorch's own implementation of each classic gallery operator, for tests and benchmarks.

Branching kernels (max pooling, residual, squeeze-excitation, involution, attention, Canvas's
kernels) have no single PyTorch function; their entries are hand-written compositions of
PyTorch's functions (:data:`BRANCHING`), the way a PyTorch user would write each kernel.

This is kdsl's one table of native PyTorch baselines: tests compare against it, ``kdsl bench codegen``
and ``kdsl bench tune`` time against it. Each entry maps a gallery name to ``(prepare, call)``:
``prepare(weights, sizes)`` turns the operator's weights (in its declared layouts) into the layout the
PyTorch function takes (done once, outside any timing), and ``call(x, prepared, sizes)`` runs that
function. :func:`native_function` gives a ready-to-time call; where PyTorch's function takes ``out=``
(:data:`INTO`) that call writes into an output allocated once, as kdsl's kernels do, so that a timing
compares the kernels and not one side's allocation.

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

__all__ = ["BRANCHING", "INTO", "NATIVE", "WINDOWS_AND_PRODUCTS", "has_native", "native_function"]

Sizes = Mapping[str, int]


def _f() -> Any:
    import torch.nn.functional as F

    return F


def _torch() -> Any:
    import torch

    return torch


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


# -- branching kernels: hand-written PyTorch, one function per gallery kernel ----------------------
# Each docstring's formula is the gallery file's; the weights come in the kernel's order
# (kdsl.codegen.reference.shapes(graph, layer).weights) and ``prepare`` gives them the layouts
# PyTorch's functions take.


def _pointwise(weight: Any) -> Any:
    """An FC weight [out, in] as a 1x1 conv weight [out, in, 1, 1]."""
    return weight[:, :, None, None].contiguous()


def _residual_conv2d(x: Any, w: list[Any], v: Sizes) -> Any:
    """x + conv2d(x): w[o, Cin, kh, kw] is F.conv2d's weight."""
    return x + _f().conv2d(x, w[0], padding=v["K"] // 2)


def _squeeze_excitation(x: Any, w: list[Any], v: Sizes) -> Any:
    """x * sigmoid(excite @ relu(squeeze @ mean_hw(x))): squeeze[z, Cin], excite[c, z] are F.linear's weights."""
    F = _f()
    gate = F.linear(F.relu(F.linear(F.adaptive_avg_pool2d(x, 1).flatten(1), w[0])), w[1]).sigmoid()
    return x * gate[:, :, None, None]


def _involution(x: Any, w: list[Any], v: Sizes) -> Any:
    """Li et al.'s involution: w = [reduce[z, Cin], span[G*K*K, z]] as 1x1 conv weights; S channels per group."""
    F = _f()
    n, channels, height, width = x.shape
    K, groups = v["K"], channels // v["S"]
    kernel = F.conv2d(F.relu(F.conv2d(x, w[0])), w[1]).view(n, groups, 1, K * K, height, width)
    patches = F.unfold(x, K, padding=K // 2).view(n, groups, v["S"], K * K, height, width)
    return (kernel * patches).sum(3).view(n, channels, height, width)


def _spatial_attention(x: Any, w: list[Any], v: Sizes) -> Any:
    """softmax over positions of q . k, times v: w = [query, key, value] as 1x1 conv weights."""
    F = _f()
    n, _, height, width = x.shape
    q, k, values = (F.conv2d(x, weight).flatten(2) for weight in w)  # [n, d or c, H*W]
    attention = (q.transpose(1, 2) @ k).softmax(-1)  # [n, query pixel, key pixel]
    return (values @ attention.transpose(1, 2)).view(n, -1, height, width)


def _shift_add(x: Any, w: list[Any], v: Sizes) -> Any:
    """A K-tap depth-wise window along H, plus itself shifted by one pixel along W: w[0] is [Cin, 1, K, 1]."""
    window = _f().conv2d(x, w[0], padding=(v["K"] // 2, 0), groups=x.shape[1])
    return window + window.roll(-1, 3)


def _canvas_resnet34(x: Any, w: list[Any], v: Sizes) -> Any:
    """FC(x + x shifted along H) + depth-wise conv(x): w = [mix as [Cin, Cin, 1, 1], depthwise as [Cin, 1, K, K]]."""
    F = _f()
    return F.conv2d(x + x.roll(-1, 2), w[0]) + F.conv2d(x, w[1], padding=v["K"] // 2, groups=x.shape[1])


BRANCHING: dict[str, tuple[Callable[[Sequence[Any], Sizes], list[Any]], Callable[[Any, list[Any], Sizes], Any]]] = {
    "max_pool2d": (_as_is, lambda x, w, v: _f().max_pool2d(x, v["K"], 1, v["K"] // 2)),
    "max_pool2d_2x2": (_as_is, lambda x, w, v: _f().max_pool2d(x, v["K"], v["K"])),
    "residual_conv2d": (_as_is, _residual_conv2d),
    "squeeze_excitation": (_as_is, _squeeze_excitation),
    "involution": (lambda w, v: [_pointwise(w[0]), _pointwise(w[1])], _involution),
    "spatial_attention": (lambda w, v: [_pointwise(weight) for weight in w], _spatial_attention),
    "shift_add": (lambda w, v: [w[0][:, None, :, None].contiguous()], _shift_add),
    "canvas_resnet34": (lambda w, v: [_pointwise(w[0]), w[1][:, None].contiguous()], _canvas_resnet34),
}
NATIVE.update(BRANCHING)


# -- valid and transposed windows, products of two inputs (issue 27's operators) ------------------
# Kept beside NATIVE rather than in it: the tests and benches that walk NATIVE give every entry one
# input and a tiny layer without the output sizes (Ho, Wo) a window without padding needs. For the
# products, ``x`` is the tuple of the kernel's data inputs, in its input order.


def _flipped(weights: Sequence[Any], v: Sizes) -> list[Any]:
    """The gallery's transposed-convolution weight w[o, c, k...] as PyTorch's v[c, o, k...]: flipped in
    every window, channels swapped (``gallery/conv_transpose2d.dsl``)."""
    weight = weights[0]
    windows = weight.ndim - 2
    return [weight.flip(list(range(-windows, 0))).transpose(0, 1).contiguous()]


def _conv_transpose(x: Any, w: list[Any], v: Sizes) -> Any:
    """F.conv_transpose{2,3}d with padding K - 1 - K//2 and the output padding that gives s times the input."""
    K, s = v["K"], v["s"]
    padding, size = K - 1 - K // 2, x.shape[-1]
    output_padding = s * size - ((size - 1) * s - 2 * padding + K)
    function = _f().conv_transpose2d if w[0].ndim == 4 else _f().conv_transpose3d
    return function(x, w[0], stride=s, padding=padding, output_padding=output_padding)


def _bmm(x: Any, w: list[Any], v: Sizes) -> Any:
    import torch

    return torch.bmm(x[0], x[1])


def _bmm_tn(x: Any, w: list[Any], v: Sizes) -> Any:
    import torch

    return torch.bmm(x[0].transpose(1, 2), x[1])


WINDOWS_AND_PRODUCTS: dict[
    str, tuple[Callable[[Sequence[Any], Sizes], list[Any]], Callable[[Any, list[Any], Sizes], Any]]
] = {
    "conv2d_valid": (_conv2d_prepare, lambda x, w, v: _f().conv2d(x, w[0], padding=0)),
    "alexnet_c1": (_conv2d_prepare, lambda x, w, v: _f().conv2d(x, w[0], stride=v["s"], padding=0)),
    "conv_transpose2d": (_flipped, _conv_transpose),
    "conv_transpose3d": (_flipped, _conv_transpose),
    "bmm": (_as_is, _bmm),
    "bmm_tn": (_as_is, _bmm_tn),
}


# -- the same functions writing into a given output -----------------------------------------------
# PyTorch's matrix products take ``out=``; each entry computes what its NATIVE or WINDOWS_AND_PRODUCTS
# entry does (same ATen kernel: F.linear without a bias is matmul(x, w.T), ``x @ w`` is torch.matmul)
# into ``out``. The convolutions (F.conv1d/2d/3d, F.conv_transpose*d), pixel (un)shuffle and the
# hand-written compositions take no ``out=``, so their baselines still allocate their output on every
# call; F.unfold's only out= path is the private torch._C._nn.im2col, which a user would not write.


def _bmm_tn_into(x: Any, w: list[Any], v: Sizes, out: Any) -> Any:
    return _torch().bmm(x[0].transpose(1, 2), x[1], out=out)


#: name -> ``into(x, prepared, sizes, out)``: :data:`NATIVE`'s (or :data:`WINDOWS_AND_PRODUCTS`') call of
#: that name, written into ``out`` (an output of the allocating call's shape, dtype and device)
INTO: dict[str, Callable[[Any, list[Any], Sizes, Any], Any]] = {
    "linear": lambda x, w, v, out: _torch().matmul(x, w[0].T, out=out),
    "matmul": lambda x, w, v, out: _torch().matmul(x, w[0], out=out),
    "bmm": lambda x, w, v, out: _torch().bmm(x[0], x[1], out=out),
    "bmm_tn": _bmm_tn_into,
    # avg_pool2d is the ATen op itself, whose binding takes out= (its .out overload)
    "avg_pool2d": lambda x, w, v, out: _f().avg_pool2d(x, v["K"], out=out),
}


def has_native(name: str) -> bool:
    """Whether PyTorch has a baseline for the gallery operator ``name`` (:data:`NATIVE` or
    :data:`WINDOWS_AND_PRODUCTS`).

    >>> has_native("bmm"), has_native("syno_op1")
    (True, False)
    """
    return name in NATIVE or name in WINDOWS_AND_PRODUCTS


def native_function(name: str, x: Any, weights: Sequence[Any], sizes: Sizes) -> Callable[[], Any]:
    """PyTorch's own ``name`` on ``x`` as a call without arguments (for timing): ``weights`` are in the
    gallery operator's layouts and are prepared once, here; for a kernel of several inputs ``x`` is
    the tuple of them. Where the function takes ``out=`` (:data:`INTO`) and no input requires its
    gradient, every call writes into one output allocated here and returns it, so a caller that keeps
    a result across calls should copy it.

    >>> import torch
    >>> gemv = native_function("linear", torch.ones(1, 3), [torch.ones(4, 3)], {})
    >>> first = gemv()
    >>> gemv() is first, first.tolist()
    (True, [[3.0, 3.0, 3.0, 3.0]])
    >>> native_function("syno_op1", None, [], {})
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.KdslError: PyTorch has no native function for 'syno_op1'; ...
    """
    if not has_native(name):
        known = ", ".join(sorted({*NATIVE, *WINDOWS_AND_PRODUCTS}))
        raise KdslError(f"PyTorch has no native function for {name!r}; the table knows {known}")
    prepare, call = NATIVE[name] if name in NATIVE else WINDOWS_AND_PRODUCTS[name]
    prepared = prepare(weights, sizes)
    into = INTO.get(name)
    if into is None or _needs_grad(x, prepared):  # out= refuses inputs that autograd tracks
        return lambda: call(x, prepared, sizes)
    # one call of the allocating form gives the output's shape, dtype, device and strides; its buffer
    # is then the one every call writes into
    out = call(x, prepared, sizes)
    return lambda: into(x, prepared, sizes, out)


def _needs_grad(x: Any, prepared: Sequence[Any]) -> bool:
    """Whether any input or prepared weight of a native call is a tensor that requires its gradient."""
    tensors = [*(x if isinstance(x, tuple) else (x,)), *prepared]
    return any(getattr(tensor, "requires_grad", False) for tensor in tensors)
