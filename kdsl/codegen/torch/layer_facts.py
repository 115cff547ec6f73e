"""What a generated module says about itself the way ``torch.nn`` layers do: the ``nn.Conv{1,2,3}d`` /
``nn.Linear`` attributes of an operator whose one weight has such a layer's layout, read from the
operator's shape facts (never from its name), and the class name a module gets.

An operator is *convolution-like* (:func:`nn_layer`) when it is a linear chain of one input and one
weight, sums (no mean), keeps the rank of ``[N, C, *spatial]`` (0 to 3 spatial dims, dim 1 the
channels) and inserts no zeros into its spatial dims (no ``Dilate``: a transposed convolution's
stride means something else), and its weight carries a window per spatial dim (or none: a 1x1
convolution or a linear layer) with, beyond them, ``out_channels * in_channels / groups`` elements
where ``groups = in_channels * prod(kernel_size) / fan_in``: the weight ``nn.Conv2d(in, out, k,
groups=g)`` has, possibly laid out in another order of dims (``grouped_conv2d``'s ``[G, Cout/G,
Cin/G, kh, kw]``) whose elements are in ``nn``'s order (the group outermost, then the output
channel in it, the input channel in it, the windows: ``_nn_layout``, so a reshape maps one onto the
other and a weight of a transposed layout is not taken for ``nn``'s). Its attributes then are
``in_channels``, ``out_channels``, ``kernel_size``, ``stride``, ``dilation`` and ``groups`` (tuples
per spatial dim, like ``nn.Conv2d``'s), or ``in_features`` and ``out_features`` for a linear layer
(no spatial dims).

**State dicts.** The weight of a convolution-like operator is ``weight`` (:func:`weight_attributes`)
and loads ``torch.nn``'s: ``nn.Conv2d(64, 64, 3, padding=1).state_dict()`` into the gallery's
``conv2d``, ``nn.Linear``'s into ``linear``, and an ``nn.Conv2d(..., groups=g)``'s reshaped into
``grouped_conv2d``'s ``[G, Cout/G, Cin/G, kh, kw]`` and ``depthwise_conv2d``'s ``[Cin, kh, kw]``
(the elements are in the same order). A state dict saved under the DSL name (``w``) loads too. The
other operators keep their weights' DSL names, and each gallery file's docstring says how they map
onto PyTorch's (``Weights: ...``); for the common ones (``first`` and ``second`` the two
``nn.Conv2d`` of a depthwise separable block, ``nn_linear`` an ``nn.Linear``, ``nn_conv`` an
``nn.ConvTranspose2d(Cin, Cout, K, stride=s, padding=K - 1 - K // 2)``):

==============================  ====================================================================
``depthwise_separable_conv2d``  ``depthwise = first.weight[:, 0]``, ``pointwise = second.weight[:, :, 0, 0]``
``squeeze_excitation``          ``squeeze``, ``excite``: the two ``nn.Linear`` weights as they are
``matmul``                      ``w = nn_linear.weight.T`` (``[Cin, Cout]``: not ``nn.Linear``'s layout)
``conv_transpose2d``            ``w[o, c] = nn_conv.weight[c, o].flip(-1, -2)`` (``nn.ConvTranspose2d``)
==============================  ====================================================================

>>> from kdsl.lang import library
>>> layer = nn_layer(library.load("grouped_conv2d"))
>>> [(name, str(size) if not isinstance(size, tuple) else tuple(map(str, size))) for name, size in layer.attributes]
[('in_channels', 'Cin'), ('out_channels', 'Cout'), ('kernel_size', ('K', 'K')), ('stride', ('1', '1')), \
('dilation', ('1', '1')), ('groups', 'G')]
>>> nn_layer(library.load("avg_pool2d")) is None  # no weight
True
>>> class_name(library.load("grouped_conv2d")), class_name(library.load("linear"))
('GroupedConv2d', 'Linear')
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod

from kdsl.codegen.torch.identifiers import RESERVED_ATTRIBUTES, _class_name
from kdsl.codegen.torch.module_signature import fan_ins, lazy_variables
from kdsl.lang.library import gallery_name
from kdsl.lang.operator import Operator
from kdsl.lang.primitive_base import REDUCTION
from kdsl.lang.primitives import Dilate, Merge, Share, Slide, Split, Stride
from kdsl.lang.sizes import Size

_ONE = Size.of(1)


@dataclass(frozen=True)
class NnLayer:
    """The ``torch.nn`` facts of a convolution-like operator, as sizes of its variables."""

    in_channels: Size
    out_channels: Size
    kernel_size: tuple[Size, ...]
    stride: tuple[Size, ...]
    dilation: tuple[Size, ...]
    groups: Size

    @property
    def spatial(self) -> int:
        """How many spatial dims: 0 for a linear layer."""
        return len(self.kernel_size)

    @property
    def attributes(self) -> list[tuple[str, Size | tuple[Size, ...]]]:
        """(attribute, size or tuple of sizes) in ``torch.nn``'s order."""
        if not self.spatial:
            return [("in_features", self.in_channels), ("out_features", self.out_channels)]
        return [
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("kernel_size", self.kernel_size),
            ("stride", self.stride),
            ("dilation", self.dilation),
            ("groups", self.groups),
        ]


@lru_cache(maxsize=1024)  # every build asks (the class name, the weight's name, the source): ~1 ms each
def nn_layer(op: Operator) -> NnLayer | None:
    """The ``torch.nn`` facts of ``op`` when it is convolution-like (see the module's text), else ``None``."""
    if not op.is_linear or len(op.input_nodes) != 1 or len(op.weights) != 1:
        return None
    inputs, outputs = op.inputs, op.outputs
    spatial = len(inputs) - 2
    if not 0 <= spatial <= 3 or len(outputs) != len(inputs) or inputs[0].size != outputs[0].size:
        return None
    if [d.name for d in inputs[2:]] != [d.name for d in outputs[2:]]:
        return None
    lazy = lazy_variables(op)
    if any(v.name in lazy for d in (inputs[1], outputs[1]) for v in d.size.variables):
        return None  # a channel count read from the input at each call is no constructor fact
    found = _windows_and_strides(op)
    if found is None:
        return None
    windows, strides = found
    weight = op.weights[0]
    kernel = tuple(d.size for d in weight.dims if d.name in windows)
    if len(kernel) not in (0, spatial) or not _nn_layout(op, list(windows)):
        return None
    kernel = kernel or (_ONE,) * spatial
    in_channels, out_channels = inputs[1].size, outputs[1].size
    groups = in_channels * prod(kernel, start=_ONE) / fan_ins(op)[0]
    if prod((d.size for d in weight.dims), start=_ONE) != out_channels * in_channels / groups * prod(
        kernel, start=_ONE
    ):
        return None
    dilation = tuple(windows[d.name] for d in weight.dims if d.name in windows) or (_ONE,) * spatial
    return NnLayer(in_channels, out_channels, kernel, tuple(strides[d.name] for d in inputs[2:]), dilation, groups)


def _windows_and_strides(op: Operator) -> tuple[dict[str, Size], dict[str, Size]] | None:
    """The window dims (in the order the spatial dims are unfolded) with their dilation (a stride
    on the window) and each spatial dim's stride, or ``None`` where a step has no torch.nn meaning:
    zeros inserted (Dilate), a mean, a window reshaped."""
    windows: dict[str, Size] = {}  # window dim -> its dilation
    strides = {d.name: _ONE for d in op.inputs[2:]}
    for step in op.steps:
        if isinstance(step, Dilate) or (REDUCTION in step.facts and step.mean):
            return None
        if "window" in step.ports:  # a sliding window, same-padded or valid
            windows[step.produces[-1]] = _ONE
        if isinstance(step, Slide) and str(step.dim) in strides:
            strides[str(step.dim)] = strides[str(step.dim)] * step.stride
        if isinstance(step, Stride):
            if str(step.dim) in strides:
                strides[str(step.dim)] = strides[str(step.dim)] * step.stride
            elif str(step.dim) in windows:
                windows[str(step.dim)] = windows[str(step.dim)] * step.stride
        elif not (step.keeps or isinstance(step, Share) or REDUCTION in step.facts) and set(step.consumes) & set(
            windows
        ):
            return None  # a window reshaped (a shift keeps it): no kernel_size of nn's
    return windows, strides


def _nn_layout(op: Operator, windows: list[str]) -> bool:
    """Whether the one weight's elements are in the order of ``nn.Conv``'s ``[out_channels,
    in_channels/groups, *kernel_size]`` (``nn.Linear``'s ``[out, in]``), so that a reshape maps one
    onto the other: its dims are the group (a data dim the weight keeps, outermost in both channel
    dims), the output channels in a group (a dim only the weight has), the input channels in a group
    (shared and summed) and the windows in the order of the spatial dims."""
    share = next(step for step in op.steps if isinstance(step, Share))
    summed = {str(d) for step in op.steps if REDUCTION in step.facts for d in step.consumes}
    dims = [d.name for d in op.weights[0].dims]
    kept = [d for d in dims if d in share.consumes and d not in summed and d not in windows]
    new = [d for d in dims if d not in share.consumes]
    inner = [d for d in dims if d in share.consumes and d in summed and d not in windows]
    if (
        len(kept) > 1
        or len(new) > 1
        or len(inner) > 1
        or dims != kept + new + inner + [w for w in windows if w in dims]
    ):
        return False
    channel_in, channel_out = op.inputs[1].name, op.outputs[1].name
    splits = {tuple(step.produces): str(step.dim) for step in op.steps if isinstance(step, Split)}
    merges = {tuple(step.consumes): step.produces[0] for step in op.steps if isinstance(step, Merge)}
    # the output channel is the group and the channel in it, group outermost (grouped_conv2d's Merge(g, co))
    out_ok = merges.get((*kept, *new)) == channel_out if kept and new else (kept + new) == [channel_out]
    # the input channel is summed whole, or split into the group and the channel in it, group outermost
    in_ok = splits.get((*kept, *inner)) == channel_in if kept and inner else inner in ([channel_in], [])
    return out_ok and in_ok and (bool(inner) or kept == [channel_in])


def weight_attributes(op: Operator) -> list[str]:
    """The attribute (and ``state_dict`` key) of each weight of ``op``, in ``op.weights`` order.

    The one weight of a convolution-like operator (:func:`nn_layer`: its weight has ``nn.Conv2d``'s
    or ``nn.Linear``'s layout) is ``weight``, as ``torch.nn`` names it: the gallery's conv2d loads an
    ``nn.Conv2d``'s state dict. Other weights keep their DSL names, unless ``nn.Module`` or the
    generated module uses that name itself (:data:`RESERVED_ATTRIBUTES`: ``training``, ``weights``,
    ``bias``, ``groups``, ...), then the name with ``_`` appended until it is free (the generated
    source lists these renamings).

    >>> from kdsl.lang import library
    >>> weight_attributes(library.load("depthwise_separable_conv2d")), weight_attributes(library.load("conv2d"))
    (['depthwise', 'pointwise'], ['weight'])
    """
    if nn_layer(op) is not None:
        return ["weight"]
    names = [w.name or f"w{i}" for i, w in enumerate(op.weights)]
    taken = set(names) | RESERVED_ATTRIBUTES
    attributes = []
    for name in names:
        attribute = name
        if name in RESERVED_ATTRIBUTES or name in attributes:
            while attribute in taken or attribute in attributes:
                attribute += "_"
            taken.add(attribute)
        attributes.append(attribute)
    return attributes


def class_name(op: Operator) -> str:
    """The class name of ``op``'s module: its gallery name in CamelCase (``grouped_conv2d`` ->
    ``GroupedConv2d``) when ``op`` is a gallery operator, else ``KdslConv2d`` (``KdslLinear``, ...)
    for a convolution-like operator of 2 (0) spatial dims, else ``KdslOperator``."""
    name = gallery_name(op)
    if name is not None:
        return _class_name(name)
    layer = nn_layer(op)
    if layer is None:
        return "KdslOperator"
    return f"KdslConv{layer.spatial}d" if layer.spatial else "KdslLinear"
