"""Whether an operator can stand in for one ``nn.Conv2d``, and at which sizes (:func:`fit`).

An operator *serves* a convolution when, with the coefficients it is given, it maps the conv's
input ``[N, Cin, H, W]`` to the conv's output at every resolution the probe tries, and each of its
output pixels reads the same input pixels as the conv's (same window, stride, padding and
dilation). Channels are free to mix differently: grouped_conv2d serves a dense 3x3 convolution,
which is the point of swapping it in.

The checks run in order, and every one that fails adds a reason:

1. the conv itself: zero padding, a padding PyTorch applies the same on both sides;
2. groups: a grouped conv is served by an operator with a coefficient ``G`` (set to the conv's
   groups) or by a per-channel operator (its output channel dim is its input's, as in
   depthwise_conv2d) when the conv is depthwise; a dense operator would change what it computes;
3. the gallery's coefficient names, for plain reasons: ``K`` is the window, ``s`` the stride,
   ``d`` the dilation;
4. the solver: the operator is bound at the conv's channels and a probe resolution
   (:func:`kdsl.solve.bind`) and its output shape is compared with the conv's;
5. the module: the resolution must be a size the module reads from its input
   (:func:`kdsl.codegen.torch.lazy_variables`), since a conv does not fix it;
6. the pixels: the module, its weights all ones, runs on one impulse per input pixel (float64, at
   a few channels: which pixels an output reads does not depend on how many there are); the
   output pixels each impulse reaches must be the conv's, or at least the centre output must
   read a window of the conv's extent (a search-found operator may shift its window or read it
   sparsely, as grouped_conv2d_shifted_window and canvas_resnet34 do; pointwise_conv2d, which
   keeps a 3x3 conv's shape, reads 1x1 and does not serve it).

>>> import torch
>>> from kdsl.lang import library
>>> fitted = fit(library.load("grouped_conv2d"), ConvSpec.of(torch.nn.Conv2d(64, 64, 3, padding=1)))
>>> fitted.reasons, dict(fitted.binding)
((), {'Cin': 64, 'Cout': 64, 'G': 4, 'K': 3})
>>> for reason in fit(library.load("grouped_conv2d"), ConvSpec.of(torch.nn.Conv2d(64, 128, 1, stride=2))).reasons:
...     print(reason)
kernel 1x1, the operator's K is 3
stride 2, the operator keeps the resolution (it has no stride)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kdsl.codegen.torch import build, lazy_variables, load_torch
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator
from kdsl.solve import bind, shapes

__all__ = ["ConvSpec", "Fit", "fit"]

#: the batch of the solver's probe (the module reads N from its input)
_PROBE_BATCH = 2
#: the pixel check narrows the channels to no fewer than this (:func:`_narrow`)
_NARROW = 16


@dataclass(frozen=True)
class ConvSpec:
    """What an ``nn.Conv2d`` computes, as plain numbers (hashable: fits are cached by it)."""

    in_channels: int
    out_channels: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int] | None  # None: a padding PyTorch applies unevenly ("same" with an even window)
    dilation: tuple[int, int]
    groups: int
    bias: bool
    padding_mode: str

    @classmethod
    def of(cls, conv: Any) -> ConvSpec:
        """The spec of an ``nn.Conv2d`` (or a subclass).

        >>> import torch
        >>> ConvSpec.of(torch.nn.Conv2d(8, 16, 3, padding="same", bias=False)).padding
        (1, 1)
        """
        kernel, dilation = tuple(conv.kernel_size), tuple(conv.dilation)
        padding: tuple[int, int] | None
        if conv.padding == "valid":
            padding = (0, 0)
        elif conv.padding == "same":
            totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
            padding = None if any(t % 2 for t in totals) else (totals[0] // 2, totals[1] // 2)
        else:
            padding = (int(conv.padding[0]), int(conv.padding[1]))
        return cls(
            int(conv.in_channels),
            int(conv.out_channels),
            (int(kernel[0]), int(kernel[1])),
            (int(conv.stride[0]), int(conv.stride[1])),
            padding,
            (int(dilation[0]), int(dilation[1])),
            int(conv.groups),
            conv.bias is not None,
            str(conv.padding_mode),
        )

    def output_size(self, size: int, axis: int) -> int:
        """PyTorch's output size along ``axis`` (0: H, 1: W) for an input of ``size`` pixels."""
        padding = self.padding[axis] if self.padding is not None else 0
        extent = self.dilation[axis] * (self.kernel[axis] - 1) + 1
        return (size + 2 * padding - extent) // self.stride[axis] + 1

    def describe(self) -> str:
        """One line: ``3x3 conv 64->128, stride 2``.

        >>> ConvSpec(3, 64, (7, 7), (2, 2), (3, 3), (1, 1), 1, False, "zeros").describe()
        '7x7 conv 3->64, stride 2'
        """
        text = f"{_window(self.kernel)} conv {self.in_channels}->{self.out_channels}"
        extras = [
            f"stride {_pair(self.stride)}" if self.stride != (1, 1) else "",
            f"dilation {_pair(self.dilation)}" if self.dilation != (1, 1) else "",
            f"groups {self.groups}" if self.groups != 1 else "",
        ]
        return ", ".join([text, *(extra for extra in extras if extra)])


def _pair(values: tuple[int, int]) -> str:
    """``2`` for ``(2, 2)``, ``1x2`` for ``(1, 2)``."""
    return str(values[0]) if values[0] == values[1] else f"{values[0]}x{values[1]}"


def _window(values: tuple[int, int]) -> str:
    """``3x3`` for ``(3, 3)``."""
    return f"{values[0]}x{values[1]}"


@dataclass(frozen=True)
class Fit:
    """The outcome of :func:`fit`: ``binding`` to build the module from (the conv's channels and
    the coefficients; the batch and resolution are read from the input), or why the operator does
    not serve the conv (``reasons``, empty when it does)."""

    binding: Mapping[str, int]
    reasons: tuple[str, ...]

    @property
    def serves(self) -> bool:
        """Whether the operator can replace the conv."""
        return not self.reasons


def _dims(op: Operator) -> tuple[list[str | None], list[str | None]] | str:
    """The variable of each input and output dim, or why the operator is no 2-D convolution's shape."""
    if len(op.input_nodes) != 1:
        return f"the operator takes {len(op.input_nodes)} inputs, a Conv2d one"
    inputs = [d.size.variable_name for d in op.inputs]
    outputs = [d.size.variable_name for d in op.outputs]
    if len(inputs) != 4 or len(outputs) != 4:
        shown = ", ".join(d.name for d in op.inputs), ", ".join(d.name for d in op.outputs)
        return f"the operator maps [{shown[0]}] -> [{shown[1]}], a Conv2d [N, C, H, W] -> [N, C, H, W]"
    if None in inputs:
        named = ", ".join(f"{d.name} = {d.size}" for d in op.inputs if d.size.variable_name is None)
        return f"the operator's input sizes must each be one variable (the conv's sizes bind them), got {named}"
    return inputs, outputs


def _conv_reasons(spec: ConvSpec, op: Operator, coefficients: dict[str, int], outputs: list[str | None]) -> list[str]:
    """Steps 1-3 of the module docstring: reasons read off the conv and the coefficients alone."""
    reasons = []
    if spec.padding_mode != "zeros":
        reasons.append(f"padding mode {spec.padding_mode}, the operator pads with zeros")
    if spec.padding is None:
        reasons.append("padding 'same' with an even window pads one side more, the operator pads both alike")
    if spec.groups != 1:
        per_channel = outputs[1] == [d.size.variable_name for d in op.inputs][1]
        depthwise = spec.groups == spec.in_channels == spec.out_channels
        if "G" in op.coefficient_variables:
            coefficients["G"] = spec.groups
        elif not (per_channel and depthwise):
            reasons.append(f"groups {spec.groups}, the operator has no coefficient G (it would mix all channels)")
    checks = (("K", spec.kernel, "kernel"), ("s", spec.stride, "stride"), ("d", spec.dilation, "dilation"))
    for name, values, what in checks:
        value = coefficients.get(name)
        if value is not None and values != (value, value):
            shown = _window(values) if name == "K" else _pair(values)
            reasons.append(f"{what} {shown}, the operator's {name} is {value}")
    return reasons


def _probe(spec: ConvSpec) -> int:
    """A probe resolution: even, a multiple of the stride, at least twice the window's extent."""
    extent = max(d * (k - 1) + 1 for k, d in zip(spec.kernel, spec.dilation))
    size = 8
    while size < 2 * extent:
        size *= 2
    return size * max(spec.stride)


def fit(op: Operator, spec: ConvSpec, coefficients: Mapping[str, int] | None = None) -> Fit:
    """Whether ``op`` serves the convolution ``spec`` with ``coefficients`` (over the operator's
    defaults), and the binding to build it from (see the module docstring for the checks).

    >>> import torch
    >>> from kdsl.lang import library
    >>> fit(library.load("strided_conv2d"), ConvSpec.of(torch.nn.Conv2d(8, 16, 3, stride=2, padding=1))).serves
    True
    >>> fit(library.load("conv2d"), ConvSpec.of(torch.nn.Conv2d(8, 16, 3, padding=0))).reasons[0]
    'padding 0: the operator maps 8x8 pixels to 8x8, the conv to 6x6'
    """
    dims = _dims(op)
    if isinstance(dims, str):
        return Fit({}, (dims,))
    inputs, outputs = dims
    values = {**dict(op.defaults), **dict(coefficients or {})}
    reasons = _conv_reasons(spec, op, values, outputs)
    batch, cin, height, width = (str(name) for name in inputs)  # each one variable (_dims checked it)
    if outputs[1] == cin and spec.in_channels != spec.out_channels:
        reasons.append(f"channels {spec.in_channels}->{spec.out_channels}, the operator keeps the channel count")
        return Fit({}, tuple(reasons))
    size = _probe(spec)
    layer = {batch: _PROBE_BATCH, cin: spec.in_channels, height: size, width: size}
    if outputs[1] is not None and outputs[1] != cin:
        layer[outputs[1]] = spec.out_channels
    try:
        binding = bind(op, layer, values)
        got = tuple(shapes(op, binding)["output"])
    except KdslError as error:
        return Fit({}, (*reasons, _first_clause(str(error))))
    want = (_PROBE_BATCH, spec.out_channels, spec.output_size(size, 0), spec.output_size(size, 1))
    if got != want:
        shape = _shape_reason(spec, size, got, want)
        if not any(reason.split()[0] == shape.split()[0] for reason in reasons):  # said already
            reasons.append(shape)
    if reasons:
        return Fit({}, tuple(reasons))
    lazy = lazy_variables(op)
    fixed = [name for name in (height, width) if name not in lazy]
    if fixed:
        return Fit({}, (f"the operator's weights depend on {', '.join(fixed)} (its module fixes the resolution)",))
    built = {name: value for name, value in binding.items() if name not in lazy}
    narrow = _narrow(op, binding, values, (cin, outputs[1]))
    pixels = _pixel_reason(op, {k: v for k, v in narrow.items() if k not in lazy}, narrow[cin], size, spec)
    return Fit(built, (pixels,) if pixels else ())


def _first_clause(message: str) -> str:
    """An error message up to its advice (after the first ``;``), for a reason in a report."""
    return message.split("; ")[0].split("\n")[0]


def _shape_reason(spec: ConvSpec, size: int, got: tuple[int, ...], want: tuple[int, ...]) -> str:
    if got[1] != want[1]:
        return f"channels {spec.in_channels}->{spec.out_channels}, the operator gives {got[1]} output channels"
    if spec.stride != (1, 1) and got[2:] == (size, size):
        return f"stride {_pair(spec.stride)}, the operator keeps the resolution (it has no stride)"
    conv = f"{want[2]}x{want[3]}"
    what = f"stride {_pair(spec.stride)}" if want[2:] == (size // spec.stride[0], size // spec.stride[1]) else None
    if what is None:
        what = f"padding {_pair(spec.padding or (0, 0))}"
    return f"{what}: the operator maps {size}x{size} pixels to {got[2]}x{got[3]}, the conv to {conv}"


def _narrow(
    op: Operator, binding: Mapping[str, int], values: Mapping[str, int], channels: tuple[str, str | None]
) -> Mapping[str, int]:
    """``binding`` with its channel counts divided by the largest power of two that leaves each at
    least :data:`_NARROW` and still binds (``binding`` itself where none does): which pixels an
    output reads does not depend on how many channels there are, and the pixel check's cost grows
    with their square."""
    names = [name for name in dict.fromkeys(channels) if name is not None]
    factor = 1
    while all(binding[name] % (2 * factor) == 0 and binding[name] // (2 * factor) >= _NARROW for name in names):
        factor *= 2
    while factor > 1:
        narrowed = {**binding, **{name: binding[name] // factor for name in names}}
        try:
            return bind(op, narrowed, values)
        except KdslError:
            factor //= 2
    return binding


def _pixel_reason(op: Operator, binding: Mapping[str, int], channels: int, size: int, spec: ConvSpec) -> str | None:
    """Step 6: None when the operator (built at ``binding``, taking ``channels`` input channels)
    reads the conv's pixels, or a window of the conv's extent at the centre output (a search-found
    operator may shift its window or read it sparsely: grouped_conv2d_shifted_window still stands
    for a 3x3 conv, pointwise_conv2d does not)."""
    torch = load_torch()
    module = build(op, binding).double()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.fill_(1.0)
        impulses = torch.eye(size * size, dtype=torch.float64).reshape(size * size, 1, size, size)
        ours = module(impulses.expand(-1, channels, -1, -1)).abs().sum(1) != 0
        ones = torch.ones(1, 1, *spec.kernel, dtype=torch.float64)
        theirs = torch.nn.functional.conv2d(
            impulses, ones, stride=spec.stride, padding=spec.padding or 0, dilation=spec.dilation
        )[:, 0]
        theirs = theirs != 0
    if torch.equal(ours, theirs):
        return None
    center = (spec.output_size(size, 0) // 2) * spec.output_size(size, 1) + spec.output_size(size, 1) // 2
    window, wanted = (_extent(reads.reshape(size * size, -1)[:, center], size) for reads in (ours, theirs))
    if window == wanted:
        return None
    if window is None:
        return "the operator's centre output reads no input pixel"
    return f"kernel {_window(spec.kernel)}, an output pixel of the operator reads a {_window(window)} window"


def _extent(read: Any, size: int) -> tuple[int, int] | None:
    """The height and width of the box around the input pixels one output reads (``read``: a mask
    over the ``size * size`` input pixels)."""
    found = read.reshape(size, size).nonzero()
    if len(found) == 0:
        return None
    rows, cols = found[:, 0], found[:, 1]
    return int(rows.max() - rows.min()) + 1, int(cols.max() - cols.min()) + 1
