"""The PyTorch backend: readable ``nn.Module`` source, top-down views and one einsum per stage.

:func:`source` writes a self-contained Python module (it imports only torch) whose code reads
like the DSL: each view is a ``reshape``/``permute`` or a small torch call, commented with the
einops pattern it does in the DSL's own dim names, and each contraction stage of the operator's
plan (:func:`kdsl.solve.plan`, Syno's rfactor) is one ``torch.einsum``. The shapes and permutations
are worked out when the source is written (:mod:`kdsl.codegen.torch_views`), not per call: on a GPU
at small sizes a forward's Python and its count of aten operators cost as much as the kernels. A
stage that is exactly a native op (a convolution of any kind: grouped, depthwise, strided, dilated;
1-D to 3-D; a matrix product; average pooling; ``F.unfold``) is lowered to it instead — same
numerics, faster — with its padding folded in and its weight re-laid out by views only. (A weight
whose layout needs a copy, as a search-found one might, is copied on each call: a cache keyed on
the parameter's version would have to follow ``.to()``, ``load_state_dict`` and in-place optimizer
steps, and under autograd the copy is part of the graph anyway; a small weight's copy is one
kernel.) :func:`build` compiles that source into a module for one layer that
behaves like a ``torch.nn`` one: its parameters carry the DSL's weight names, are initialised with
the fan-in PyTorch uses for the equivalent layer (:func:`fan_ins`), sizes no weight needs are read
from the input (:func:`lazy_variables`), ``bias=True`` adds a bias, and the module pickles,
deep-copies, saves whole with ``torch.save`` and compiles with ``torch.compile`` (see :func:`build`).

**Branching operators.** A branching operator's forward computes one variable per node (``x3`` is
node 3), one rule per node kind (:data:`GRAPH_RULES`). Each chain node is lowered as above on its
argument's variable (a linear operator's forward is its one chain, written without node variables);
the Canvas steps become torch calls: ``torch.relu`` and friends, ``F.softmax``, ``F.linear``, a 1x1
convolution or a ``torch.einsum``, broadcasting views for blends (every view is a ``reshape`` or
``permute`` worked out when the code is written, :mod:`kdsl.codegen.torch_views`: on a GPU at small
sizes the Python of each call costs as much as the kernels). A max (min) fold over the windows
of a chain that is only Unfold (+ Stride) and Split views is ``F.max_pool{1,2,3}d`` with that
padding; a fold of any other windowed chain ignores the windows' zero padding through a mask: the
chain run on ones (with weights of ones) is positive exactly where an element reads data.

>>> import torch
>>> from kdsl.lang import *
>>> N, Cin, Cout = primary("N Cin Cout")
>>> linear = Input(N, Cin) >> Share(Weight(Cout, Cin, name="w")) >> Reduce(Cin) >> Output(N, Cout)
>>> module = build(linear, {"Cin": 3, "Cout": 4})
>>> module(torch.ones(2, 3)).shape
torch.Size([2, 4])
>>> [(name, tuple(p.shape)) for name, p in module.named_parameters()]
[('w', (4, 3))]
>>> from kdsl.lang import *
>>> N, C, H, W = primary("N C H W")
>>> pool = Input(N, C, H, W) >> Unfold(H, 3, "kh") >> Unfold(W, 3, "kw") >> Fold("kh", "kw") >> Output(N, C, H, W)
>>> text = source(pool)
>>> for line in text[text.index("# node 1") : text.rindex("if self.bias")].splitlines():
...     print(line.strip())
# node 1: chain Unfold(H, 3) >> Unfold(W, 3) of node 0 -> [N, C, H, W, kh, kw] (pooled natively below, never computed)
# node 2: Fold(kh, kw, how=max) of node 1 -> [N, C, H, W]
x2 = _pool(x, "max", (3, 3), (1, 1), ((1, 1), (1, 1)))
<BLANKLINE>
"""

from __future__ import annotations

import hashlib
import keyword
import linecache
import re
import sys
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from math import prod
from typing import Any

from kdsl import solve
from kdsl.codegen.torch_views import einsum_code, parse_pattern, rearrange_code
from kdsl.codegen.torch_writer import _atom, _rearrange, _rolls, _shift, _size_code, _weight_lengths, _Writer
from kdsl.lang.errors import DivisibilityError, LayerError, LoweringError
from kdsl.lang.nonlinear import BLEND_KINDS, FC, MAP_FUNCTIONS, BlendJoin, Fold, Map, ProductJoin, Rename, Softmax
from kdsl.lang.operator import Node, Operator
from kdsl.lang.parser import parse
from kdsl.lang.primitives import (
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
from kdsl.solve.constraints import resolve_binding
from kdsl.solve.layers import Layer, as_layer, layer_label
from kdsl.solve.padding import Padding

HELPERS = """
def _conv(x, w, pads, stride, dilation, groups, out):
    \"\"\"F.conv{1,2,3}d with zero padding given as F.pad lists it (last dim first, left then right)
    and ``out`` positions per spatial dim; symmetric padding goes to the convolution itself, which
    avoids copying a padded input.\"\"\"
    conv = (F.conv1d, F.conv2d, F.conv3d)[w.dim() - 3]
    lefts, rights = pads[0::2], pads[1::2]
    if lefts == rights and min(lefts) >= 0:
        return conv(x, w, stride=stride, padding=tuple(reversed(lefts)), dilation=dilation, groups=groups)
    if min(lefts) >= 0 and all(right <= left for left, right in zip(lefts, rights)):
        # padding the right as much as the left only adds outputs past the end (none, for a strided
        # convolution whose last window fits): one convolution and a crop (a view), no padded copy
        y = conv(x, w, stride=stride, padding=tuple(reversed(lefts)), dilation=dilation, groups=groups)
        return y if y.shape[2:] == out else y[(..., *(slice(0, n) for n in out))]
    return conv(F.pad(x, pads), w, stride=stride, dilation=dilation, groups=groups)

def _unfold(x, axes, windows):
    \"\"\"out[..., i, ..., j] = x[..., i + j - window // 2, ...] along each axis, zero outside; the
    windows go last, in order. One F.pad for all the axes (one copy), then views.\"\"\"
    pads = [0] * (2 * (x.dim() - min(axes)))  # F.pad lists the last dim first
    for axis, window in zip(axes, windows):
        at = 2 * (x.dim() - 1 - axis)
        pads[at], pads[at + 1] = window // 2, window - 1 - window // 2
    x = F.pad(x, pads)
    for axis, window in zip(axes, windows):
        x = x.unfold(axis, window, 1)
    return x

def _im2col(x, kernel):
    \"\"\"F.unfold of [N, C, H, W] with "same" windows (zero padding window // 2 before, the rest
    after): [N, C * kh * kw, H * W]. Odd windows pad alike on both sides: F.unfold itself, one kernel.\"\"\"
    if all(k % 2 for k in kernel):
        return F.unfold(x, kernel, padding=tuple(k // 2 for k in kernel))
    n, c = x.shape[:2]
    x = _unfold(x, (2, 3), kernel)
    return x.permute(0, 1, 4, 5, 2, 3).reshape(n, c * kernel[0] * kernel[1], -1)

def _check_input(x, dims, sizes):
    \"\"\"Raise ShapeError unless x has one axis per dim, of the dim's size (None: any size).\"\"\"
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) == len(dims):  # a plain loop: this runs on every call, a generator costs more than it
        for size, got in zip(sizes, shape):
            if size is not None and size != got:
                break
        else:
            return
    expected = ", ".join(dim if size is None else f"{dim}={size}" for dim, size in zip(dims, sizes))
    raise ShapeError(f"the input must have shape [{expected}] ({len(dims)} dims), got {list(shape)}")
"""

#: kdsl's ShapeError where kdsl is installed (callers catch KdslError), else a ValueError of that name.
ERROR_IMPORT = """
try:
    from kdsl.lang.errors import ShapeError
except ImportError:  # running without kdsl

    class ShapeError(ValueError):
        \"\"\"The input's shape does not fit the operator.\"\"\"
"""

#: Every name the generated ``__init__`` and ``forward`` use for themselves. Size variables are
#: locals of those methods, so a variable with one of these names (or a keyword, or one Python
#: would mangle) gets another identifier there (see :func:`_identifiers`); a test checks that
#: the generated methods use no other name.
OWN_NAMES = frozenset(
    {
        "self",
        "super",
        "__class__",  # zero-argument super() reads it
        "list",
        "nn",
        "torch",
        "F",
        "math",
        "einsum",
        "rearrange",
        "reduce",
        "ShapeError",
        "bias",
        "_conv",
        "_unfold",
        "_im2col",
        "_check_input",
        "shapes",
        "shape",
        "fan_ins",
        "weights",
        "x",
        "w",
    }
)
#: The public attributes of ``torch.nn.Module`` (torch 2.13; a test compares them with the installed
#: torch's). A weight named like one gets another attribute (:func:`weight_attributes`).
NN_MODULE_ATTRIBUTES = frozenset(
    """T_destination add_module apply bfloat16 buffers call_super_init children compile cpu cuda double
    dump_patches eval extra_repr float forward get_buffer get_extra_state get_parameter get_submodule half
    ipu load_state_dict modules mtia named_buffers named_children named_modules named_parameters parameters
    register_backward_hook register_buffer register_forward_hook register_forward_pre_hook
    register_full_backward_hook register_full_backward_pre_hook register_load_state_dict_post_hook
    register_load_state_dict_pre_hook register_module register_parameter register_state_dict_post_hook
    register_state_dict_pre_hook requires_grad_ set_extra_state set_submodule share_memory state_dict to
    to_empty train training type xpu zero_grad""".split()
)
#: The attributes a weight's parameter must not take: ``nn.Module``'s and the generated module's own.
RESERVED_ATTRIBUTES = NN_MODULE_ATTRIBUTES | {
    "bias",
    "fan_ins",
    "kdsl_source",
    "masks",
    "operator",
    "padded_forward",
    "padding",
    "reset_parameters",
    "sizes",
    "weights",
}
#: Module-level names of the generated source (a class name must not hide one of them).
MODULE_NAMES = OWN_NAMES | {"math", "HELPERS"}

#: Axis names einops rejects or that clash with the keyword arguments of rearrange/reduce.
_EINOPS_TAKEN = frozenset({"axis", "tensor", "pattern", "reduction"})


def load_torch() -> Any:
    try:
        import torch
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise LoweringError(
            f"the PyTorch backend needs torch ({error}); install it with: pip install torch==2.13.0 einops"
        ) from None
    return torch


def _einops_ok(name: str) -> bool:
    """Whether einops takes ``name`` as an axis and it can be passed as a keyword argument."""
    return (
        name.isidentifier()
        and not name.startswith("_")
        and not name.endswith("_")
        and not keyword.iskeyword(name)
        and name not in _EINOPS_TAKEN
    )


def _python_ok(name: str, reserved: frozenset[str] = frozenset()) -> bool:
    """Whether ``name`` can be a size variable's own identifier in the generated methods."""
    mangled = name.startswith("__") and not name.endswith("__")  # Python renames it inside a class
    return not (name in OWN_NAMES or name in reserved or keyword.iskeyword(name) or name == "__debug__" or mangled)


def _identifiers(variables: list[str], reserved: frozenset[str] = frozenset()) -> dict[str, str]:
    """Size variable -> its Python identifier in the generated code: its own name where that is
    safe, else a new one that no other variable and no name of the module has (``F`` -> ``F_``).
    ``reserved``: more names the generated code uses for itself (a branching kernel's variables)."""
    taken = set(variables) | OWN_NAMES | reserved
    table = {}
    for name in variables:
        identifier = name
        if not _python_ok(name, reserved):
            identifier = f"v{name}" if name.startswith("__") else f"{name}_"
            while identifier in taken or not _python_ok(identifier, reserved):
                identifier += "_"
            taken.add(identifier)
        table[name] = identifier
    return table


@dataclass
class _Axes:
    """DSL dim name -> einops axis name, one-to-one by construction: a dim keeps its own name
    where einops takes it, else gets a new one that no dim and no earlier axis has."""

    taken: set[str]
    names: dict[str, str] = field(default_factory=dict)

    def __call__(self, name: str) -> str:
        if name not in self.names:
            base = name if _einops_ok(name) and name not in self.names.values() else name.strip("_") or "dim"
            axis, number = base, 2
            while not _einops_ok(axis) or axis in self.names.values() or (axis != name and axis in self.taken):
                axis, number = f"{base}{number}", number + 1
            self.names[name] = axis
        return self.names[name]

    def renamed(self) -> dict[str, str]:
        return {name: axis for name, axis in self.names.items() if name != axis}


def _dim_names(op: Operator) -> list[str]:
    """Every dim name of ``op``, in order of appearance."""
    names = [d.name for d in op.inputs]
    for step in op.steps:
        names += list(step.consumes) + list(step.produces)
    names += [d.name for d in op.outputs]
    return list(dict.fromkeys(names))


def _forward_body(op: Operator, plan: Any, axis: _Axes, identifiers: dict[str, str], weights: list[str]) -> list[str]:
    """The forward's lines (indented by the caller); ``weights``: the code of each weight."""
    writer = _Writer([], [d.name for d in op.inputs], axis, identifiers, weights=weights)
    _chain_body(writer, op, plan, {w.name: i for i, w in enumerate(op.weights)})
    writer.emit(f"return {writer.data}")
    return writer.lines


def _chain_body(writer: _Writer, op: Operator, plan: Any, weight_index: dict[str, int], reorder: bool = True) -> None:
    """Emit the lines computing the linear ``op`` (by ``plan``) from ``writer.data``, whose dims are
    ``writer.axes``, into ``writer.var``, with its dims in ``op.outputs`` order (with
    ``reorder=False``, in the order it computed them: ``writer.axes`` says which); each weight's
    code is ``writer.weights[weight_index[name]]``."""
    if _native_im2col(writer, plan):
        return
    steps = list(plan.steps)
    position = 0
    for stage in [*plan.stages, None]:
        stop = stage.start if stage is not None else len(steps)
        views = steps[position:stop]
        if stage is not None:
            block = steps[stage.start : stage.stop]
            result = [name for name, _ in stage.result]
            sizes = dict(plan.live[position])  # the live dims before these views
            native = _native_conv(
                writer, views, block, sizes, result, weight_index, dict(plan.binding)
            ) or _native_pool(writer, views, block, sizes, result)
            if native:
                position = stage.stop
                continue
        ordered = _reshapes_last(views)
        while ordered:
            shifts, unfolds = _leading_shifts(ordered), _leading_unfolds(ordered, writer.axes)
            if len(shifts) > 1:
                _rolls(writer, shifts)
                del ordered[: len(shifts)]
            elif len(unfolds) > 1:
                _unfolds(writer, unfolds)
                del ordered[: len(unfolds)]
            else:
                _emit_view(writer, ordered.pop(0))
        if stage is not None:
            _emit_stage(writer, block, dict(plan.live[stage.start]), result, weight_index, dict(plan.binding))
            position = stage.stop
    outputs = [d.name for d in plan.outputs]
    if writer.axes != outputs and (reorder or writer.merged or writer.layout is not None):
        writer.reorder(outputs)  # one copy with waiting merges; else the caller takes writer.axes as they are
    writer.flush()


def _reshapes_last(views: list[Primitive]) -> list[Primitive]:
    """The same views with Split/Merge moved after the views they commute with (ones on other
    dims), so that deferred Merges fuse into one copy after Unfolds instead of one copy per Unfold."""
    remaining = list(views)
    ordered: list[Primitive] = []

    def names(step: Primitive) -> set[str]:
        return set(step.consumes) | set(step.produces)

    while remaining:
        choice = 0
        for index, step in enumerate(remaining):
            if isinstance(step, (Split, Merge)):
                continue
            if all(not names(step) & names(earlier) for earlier in remaining[:index]):
                choice = index
                break
        ordered.append(remaining.pop(choice))
    return ordered


# -- native-op peepholes: a stage (with the views before it) that is exactly one of PyTorch's
# functions, found from the operator's structure, never its name --------------------------------


def _native_im2col(writer: _Writer, plan: Any) -> bool:
    """Emit ``_im2col`` (``F.unfold``) when the chain is exactly it: the data [n, c, h, w], an Unfold
    of h and of w, and Merges to [n, (c, h's window, w's window), (h, w)]; False otherwise."""
    if plan.stages or len(writer.axes) != 4 or writer.merged or writer.layout is not None:
        return False
    n, c, h, w = writer.axes
    windows: dict[str, Unfold] = {}
    pieces: dict[str, list[str]] = {name: [name] for name in writer.axes}
    for step in plan.steps:
        if isinstance(step, Unfold) and step.dim in (h, w) and step.dim not in windows:
            windows[step.dim] = step
            pieces[step.name] = [step.name]
        elif isinstance(step, Merge) and step.outer in pieces and step.inner in pieces:
            pieces[step.name] = pieces.pop(step.outer) + pieces.pop(step.inner)
        else:
            return False
    if set(windows) != {h, w}:
        return False
    outputs = [d.name for d in plan.outputs]
    wanted = [[n], [c, windows[h].name, windows[w].name], [h, w]]
    if [pieces.get(name) for name in outputs] != wanted:
        return False
    kernel = f"({writer.size(windows[h].window)}, {writer.size(windows[w].window)})"
    writer.emit(f"{writer.var} = _im2col({writer.data}, {kernel})  # F.unfold: {', '.join(outputs)}")
    writer.axes = outputs
    return True


@dataclass
class _Spatial:
    dim: str
    window: str
    size: Size  # the window's length before any dilation
    taps: Size | None = None  # the number of taps after a dilation Stride
    offset: int = 0  # window Shift
    dilation: Size | None = None
    stride: Size | None = None


def _native_conv(
    writer: _Writer,
    views: list[Primitive],
    block: list[Primitive],
    sizes: dict[str, Size],
    result: list[str],
    weight_index: dict[str, int],
    binding: Mapping[str, int],
) -> bool:
    """Emit ``F.conv{1,2,3}d`` for views + stage when they are exactly a (grouped, strided,
    dilated) convolution; return False (emitting nothing) otherwise."""
    shares = [step for step in block if isinstance(step, Share)]
    reduces = [step for step in block if isinstance(step, Reduce)]
    if len(shares) != 1 or any(r.mean for r in reduces):
        return False
    weight = shares[0].weight
    assert isinstance(weight, Weight)
    spatial: dict[str, _Spatial] = {}
    splits: dict[str, Split] = {}
    by_window: dict[str, _Spatial] = {}
    rolls: list[Shift] = []
    for step in views:
        if isinstance(step, Unfold) and step.dim in sizes and step.dim not in spatial and step.dim not in splits:
            entry = _Spatial(step.dim, step.name, step.window)
            spatial[step.dim] = entry
            by_window[step.name] = entry
        elif isinstance(step, Split) and step.dim in sizes and step.dim not in spatial and step.dim not in splits:
            splits[step.dim] = step
        elif isinstance(step, Stride) and step.dim in spatial and spatial[step.dim].stride is None:
            spatial[step.dim].stride = step.stride
        elif isinstance(step, Shift) and step.dim in sizes and step.dim not in spatial and step.dim not in splits:
            rolls.append(step)  # a cyclic shift of the input before it is unfolded: a roll
        elif isinstance(step, Shift) and step.dim in by_window and by_window[step.dim].dilation is None:
            if by_window[step.dim].offset or step.offset < 0:
                return False
            by_window[step.dim].offset = step.offset
        elif isinstance(step, Stride) and step.dim in by_window and by_window[step.dim].dilation is None:
            entry = by_window[step.dim]
            entry.dilation = step.stride
            entry.taps = entry.size / step.stride
        else:
            return False
    if len(spatial) > 3:
        return False
    weight_dims = [d.name for d in weight.dims]
    new = {d.name for d, is_new in zip(weight.dims, weight.new) if is_new}
    reduced = [r.dim for r in reduces]
    data = []  # data dims after the views (names), in the writer's order
    for axis in writer.axes:
        if axis in splits:
            data += [splits[axis].outer, splits[axis].inner]
        else:
            data.append(axis)
    data += [e.window for e in spatial.values()]
    windows = {e.window for e in spatial.values()}
    if not windows <= set(reduced) or not windows <= set(weight_dims):
        return False
    batch = [d for d in data if d not in weight_dims and d not in spatial and d not in windows]
    groups = [d for d in data if d in weight_dims and d not in reduced and d not in windows]
    channels = [d for d in data if d in weight_dims and d in reduced and d not in windows]
    outs = [d for d in weight_dims if d in new]
    if any(d in reduced for d in batch) or any(d in reduced for d in outs) or any(d in spatial for d in weight_dims):
        return False
    if set(reduced) != windows | set(channels):
        return False
    # every tap must read x[stride*i + dilation*j + offset - window//2] without wrapping around
    for entry in spatial.values():
        if entry.offset:
            if entry.dilation is None or entry.taps is None:
                return False
            # the last tap d*(taps-1) + offset stays inside the window d*taps iff offset < d
            if entry.offset >= entry.dilation.evaluate(binding):
                return False
    # data-only dims after the channels (W in a K x 1 conv of NCHW data) stay in place as spatial
    # dims with a 1-wide kernel, so the input needs no transposed copy
    first_channel = min((data.index(d) for d in groups + channels), default=len(data))
    for name in [d for d in batch if data.index(d) > first_channel]:
        if len(spatial) < 3:
            spatial[name] = _Spatial(name, "", Size.of(1))
            batch.remove(name)
    if not spatial:
        return False
    known = dict(sizes)
    for split in splits.values():
        known[split.outer] = sizes[split.dim] / split.block
        known[split.inner] = split.block
    order = [d for d in data if d in spatial]
    if rolls:
        _rolls(writer, rolls)
    return _emit_conv(
        writer, splits, spatial, order, batch, groups, channels, outs, weight, known, result, weight_index
    )


def _native_pool(
    writer: _Writer, views: list[Primitive], block: list[Primitive], sizes: dict[str, Size], result: list[str]
) -> bool:
    """Emit ``F.avg_pool{1,2,3}d`` when the views split dims into (outer, tile) and the stage
    takes the mean over the tiles; return False (emitting nothing) otherwise."""
    if any(not isinstance(step, Reduce) or not step.mean for step in block):
        return False
    splits = [step for step in views if isinstance(step, Split)]
    if len(splits) != len(views) or not 1 <= len(splits) <= 3:
        return False
    tiles = {split.inner: split for split in splits}
    reduced = {step.dim for step in block}
    if reduced != set(tiles) or any(split.dim not in writer.axes for split in splits):
        return False
    pooled = [axis for axis in writer.axes if axis in {split.dim for split in splits}]
    by_dim = {split.dim: split for split in splits}
    others = [axis for axis in writer.axes if axis not in by_dim]
    kernel = ", ".join(writer.size(by_dim[a].block) for a in pooled)
    unflat = others + [by_dim[a].outer for a in pooled]
    # F.avg_pool{d}d pools the last d dims of a tensor with one or two more in front: where the
    # data is laid out so, it takes the data as it is, else as (others flattened, pooled dims)
    direct = writer.axes[len(others) :] == pooled and 1 <= len(others) <= 2
    if not direct:
        pooled_pattern = " ".join(writer.axis(a) for a in pooled)
        writer.move(writer.pattern(), f"{writer.group(others)} {pooled_pattern}", comment=", as a pooling input")
    writer.emit(
        f"{writer.var} = F.avg_pool{len(pooled)}d({writer.data}, ({kernel},))  # mean over {', '.join(sorted(reduced))}"
    )
    writer.axes = unflat
    if not direct:
        outs = " ".join(writer.axis(by_dim[a].outer) for a in pooled)
        lengths = {writer.axis(a): writer.size(sizes[a]) for a in others}
        writer.lay_out(f"{writer.group(others)} {outs}", lengths)
    return True


def _emit_conv(
    writer: _Writer,
    splits: dict[str, Split],
    spatial: dict[str, _Spatial],
    dims: list[str],
    batch: list[str],
    groups: list[str],
    channels: list[str],
    outs: list[str],
    weight: Weight,
    sizes: dict[str, Size],
    result: list[str],
    weight_index: dict[str, int],
) -> bool:
    left = []
    lengths = {}
    for axis in writer.axes:
        if axis in splits:
            split = splits[axis]
            left.append(writer.group([split.outer, split.inner]))
            lengths[writer.axis(split.inner)] = writer.size(split.block)
        else:
            left.append(writer.axis(axis))
    conv_in = f"{writer.group(batch)} {writer.group(groups + channels)} {' '.join(writer.axis(d) for d in dims)}"
    _rearrange(writer, writer.data, " ".join(left), conv_in, lengths, ", as a convolution's input")
    weight_pattern = " ".join(writer.axis(d.name) for d in weight.dims)
    windows = " ".join(writer.axis(spatial[d].window) if spatial[d].window else "()" for d in dims)
    conv_weight = f"{writer.group(groups + outs)} {writer.group(channels)} {windows}"
    w = _rearrange(
        writer, writer.weight(weight_index[weight.name]), weight_pattern, conv_weight, _weight_lengths(writer, weight)
    )
    pads, strides, dilations, outs_sizes = [], [], [], []
    for d in reversed(dims):  # F.pad lists the last dim first
        entry = spatial[d]
        if not entry.window:  # a 1-wide kernel: no padding
            pads += ["0", "0"]
            strides.insert(0, "1")
            dilations.insert(0, "1")
            outs_sizes.insert(0, writer.size(sizes[d]))
            continue
        stride = _atom(writer.size(entry.stride)) if entry.stride is not None else "1"
        dilation = _atom(writer.size(entry.dilation)) if entry.dilation is not None else "1"
        taps = writer.size(entry.taps) if entry.taps is not None else writer.size(entry.size)
        left_pad = (
            f"{writer.size(entry.size)} // 2 - {entry.offset}" if entry.offset else f"{writer.size(entry.size)} // 2"
        )
        out_size = f"{writer.size(sizes[d])} // {stride}" if entry.stride is not None else writer.size(sizes[d])
        # right padding so that exactly out_size positions fit (negative pads crop)
        if entry.stride is None:  # out_size == size: the right pad is the span of the taps minus the left pad
            span = f"{dilation} * ({taps} - 1)" if entry.dilation is not None else f"{taps} - 1"
            right_pad = f"{span} - ({left_pad})"
        else:
            right_pad = (
                f"({out_size} - 1) * {stride} + {dilation} * ({taps} - 1) + 1 - {writer.size(sizes[d])} - ({left_pad})"
            )
        pads += [f"{left_pad}", right_pad]
        strides.insert(0, stride)
        dilations.insert(0, dilation)
        outs_sizes.insert(0, out_size)
    group_count = " * ".join(_atom(writer.size(sizes[g])) for g in groups) or "1"
    writer.emit(
        f"{writer.var} = _conv({writer.data}, {w}, pads=({', '.join(pads)}), stride=({', '.join(strides)},), "
        f"dilation=({', '.join(dilations)},), groups={group_count}, out=({', '.join(outs_sizes)},))"
    )
    out_lengths = {}
    for name in batch:
        out_lengths[writer.axis(name)] = writer.size(sizes[name])
    for name in groups:
        out_lengths[writer.axis(name)] = writer.size(sizes[name])
    new_sizes = {d.name: d.size for d in weight.dims}
    for name in outs[1:]:  # with the groups, all but one out dim gives einops the rest
        out_lengths[writer.axis(name)] = writer.size(new_sizes[name])
    conv_out = f"{writer.group(batch)} {writer.group(groups + outs)} {' '.join(writer.axis(d) for d in dims)}"
    # keep the convolution's own (contiguous) order; later steps refer to dims by name. The groups
    # are split only when a line reads the data: a Merge that joins them back costs nothing then
    unflat = batch + groups + outs + dims
    writer.axes = unflat
    if len(batch) != 1 or len(groups + outs) != 1:
        writer.lay_out(conv_out, out_lengths)
    return True


def _native_matmul(
    writer: _Writer, block: list[Primitive], before: dict[str, Size], weight_index: dict[str, int]
) -> bool:
    """Emit one matrix product (``F.linear``, or ``torch.matmul`` that broadcasts over the leading
    dims) when the stage contracts a contiguous run of the data's dims against one weight whose
    other dims are all new; the data then needs no transposed copy. False if not applicable."""
    shares = [step.weight for step in block if isinstance(step, Share)]
    reduces = [step for step in block if isinstance(step, Reduce)]
    if len(shares) != 1 or not reduces or any(r.mean for r in reduces):
        return False
    weight = shares[0]
    assert isinstance(weight, Weight)
    contracted = [d.name for d, new in zip(weight.dims, weight.new) if not new]
    outs = [d.name for d, new in zip(weight.dims, weight.new) if new]
    if not outs or {r.dim for r in reduces} != set(contracted):
        return False
    positions = sorted(writer.axes.index(c) for c in contracted)
    if positions != list(range(positions[0], positions[0] + len(positions))):
        return False
    pre, run, post = (
        writer.axes[: positions[0]],
        writer.axes[positions[0] : positions[-1] + 1],
        writer.axes[positions[-1] + 1 :],
    )
    w = writer.weight(weight_index[weight.name])
    weight_pattern = " ".join(writer.axis(d.name) for d in weight.dims)
    weight_lengths = _weight_lengths(writer, weight)
    lengths = {writer.axis(a): writer.size(before[a]) for a in pre + post}
    lengths.update({writer.axis(d.name): writer.size(d.size) for d in weight.dims if d.name in outs})
    comment = f"  # Share({weight.name}), Reduce({', '.join(run)})"
    if not post:
        _rearrange(writer, writer.data, writer.pattern(), f"{writer.group(pre)} {writer.group(run)}")
        if [d.name for d in weight.dims] == [*run, *outs]:  # a [in, out] weight, as x @ w takes it: no transpose
            w = _rearrange(writer, w, weight_pattern, f"{writer.group(run)} {writer.group(outs)}", weight_lengths)
            writer.emit(f"{writer.var} = torch.matmul({writer.data}, {w}){comment}")
        else:
            w = _rearrange(writer, w, weight_pattern, f"{writer.group(outs)} {writer.group(run)}", weight_lengths)
            writer.emit(f"{writer.var} = F.linear({writer.data}, {w}){comment}")
        flat = f"{writer.group(pre)} {writer.group(outs)}"
    else:
        w = _rearrange(writer, w, weight_pattern, f"{writer.group(outs)} {writer.group(run)}", weight_lengths)
        _rearrange(
            writer, writer.data, writer.pattern(), f"{writer.group(pre)} {writer.group(run)} {writer.group(post)}"
        )
        writer.emit(f"{writer.var} = torch.matmul({w}, {writer.data}){comment}")
        flat = f"{writer.group(pre)} {writer.group(outs)} {writer.group(post)}"
    unflat = pre + outs + post
    writer.axes = unflat
    if flat != writer.pattern(unflat):
        writer.lay_out(flat, lengths)
    return True


def _split(writer: _Writer, step: Split) -> None:
    axes = writer.axes
    position = axes.index(step.dim)
    after = axes[:position] + [step.outer, step.inner] + axes[position + 1 :]
    grouped = axes[:position] + [f"({writer.axis(step.outer)} {writer.axis(step.inner)})"] + axes[position + 1 :]
    left = " ".join(a if a.startswith("(") else writer.axis(a) for a in grouped)
    lengths = {writer.axis(step.inner): writer.size(step.block)}
    if writer.layout is not None and not writer.merged:  # split a dim of the waiting layout in it
        waiting, known = writer.layout
        groups = []
        for group in parse_pattern(waiting):
            pieces = []
            for name in group:
                pieces += (
                    [writer.axis(step.outer), writer.axis(step.inner)] if name == writer.axis(step.dim) else [name]
                )
            groups.append(pieces)
        left = " ".join(g[0] if len(g) == 1 else "(" + " ".join(g) + ")" for g in groups)
        known = dict(known)
        whole = known.pop(writer.axis(step.dim), None)
        block = writer.split_sizes.get(step.dim)
        if whole is not None and block is not None:  # a split's block split again: the outer piece's length
            writer.split_sizes[step.outer] = block / step.block
            known[writer.axis(step.outer)] = writer.size(block / step.block)
        elif whole is not None:
            known[writer.axis(step.outer)] = f"{_atom(whole)} // {_atom(writer.size(step.block))}"
        lengths = {**known, **lengths}
    else:
        writer.flush()
    writer.split_sizes[step.inner] = step.block
    writer.axes = after
    # the split waits for a line that reads the data: Merges of the pieces right after it (a
    # pixel shuffle's) then move the data once
    writer.lay_out(left, lengths)


def _merge(writer: _Writer, step: Merge) -> None:
    writer.merge(step.outer, step.inner, step.name)  # deferred: consecutive merges fuse into one copy


def _leading_shifts(steps: list[Primitive]) -> list[Shift]:
    """The Shifts at the start of ``steps``, each on another dim (one ``torch.roll`` does them all)."""
    shifts: list[Shift] = []
    for step in steps:
        if not isinstance(step, Shift) or any(s.dim == step.dim for s in shifts):
            break
        shifts.append(step)
    return shifts


def _expand(writer: _Writer, step: Expand) -> None:
    data = writer.data
    writer.emit(
        f"{writer.var} = {data}.unsqueeze(-1).expand(*{data}.shape, {writer.size(step.size)})  # Expand({step.name})"
    )
    writer.axes = writer.axes + [step.name]


def _unfold(writer: _Writer, step: Unfold) -> None:
    _unfolds(writer, [step])


def _leading_unfolds(steps: list[Primitive], axes: list[str]) -> list[Unfold]:
    """The Unfolds at the start of ``steps`` of distinct dims of the data (one pad does them all)."""
    unfolds: list[Unfold] = []
    for step in steps:
        if not isinstance(step, Unfold) or step.dim not in axes or any(u.dim == step.dim for u in unfolds):
            break
        unfolds.append(step)
    return unfolds


def _unfolds(writer: _Writer, steps: list[Unfold]) -> None:
    """Unfold several dims of the data with one zero pad (``_unfold``): each window goes last."""
    data = writer.data
    axes = ", ".join(str(writer.axes.index(step.dim)) for step in steps)
    windows = ", ".join(writer.size(step.window) for step in steps)
    what = ", ".join(f"Unfold({step.dim}) -> {step.name}" for step in steps)
    writer.emit(f"{writer.var} = _unfold({data}, ({axes},), ({windows},))  # {what}")
    writer.axes = writer.axes + [step.name for step in steps]


def _stride(writer: _Writer, step: Stride) -> None:
    position = writer.axes.index(step.dim)
    index = ", ".join([":"] * position + [f"::{writer.size(step.stride)}"])
    writer.emit(f"{writer.var} = {writer.data}[{index}]  # Stride({step.dim})")


def _contracted(writer: _Writer, step: Primitive) -> None:
    raise LoweringError(f"{step.describe()} is lowered as part of a contraction stage (one einsum), not alone")


#: The PyTorch backend's table: one rule per primitive kind. A view emits its own line; Share and
#: Reduce are the members of a contraction stage, which :func:`_emit_stage` lowers as one einsum (or a
#: native convolution, matrix product or pooling) and never one at a time.
RULES: dict[str, Callable[[_Writer, Any], None]] = {
    "Split": _split,
    "Merge": _merge,
    "Shift": _shift,
    "Expand": _expand,
    "Unfold": _unfold,
    "Stride": _stride,
    "Share": _contracted,
    "Reduce": _contracted,
}


def _emit_view(writer: _Writer, step: Primitive) -> None:
    RULES[step.kind](writer, step)


def _weights_first(
    writer: _Writer,
    weights: list[Weight],
    reduced: set[str],
    before: dict[str, Size],
    weight_index: dict[str, int],
    binding: Mapping[str, int],
) -> list[str] | None:
    """Contract a stage's weights with each other first, over the dims that only they carry and
    the stage sums, when that costs less than one pass over the whole iteration space: emit
    ``w = einsum(weights..., -> kept dims)`` and return the kept dims, else None. torch.einsum
    (without opt_einsum) contracts its operands left to right, so ``x * w1 * w2`` would first
    write the product of the data with all of ``w1``'s dims (search's b00aca54: a 7-D tensor
    Cin/(G*s) times larger than the output) before ``w2`` sums any of them away."""
    if len(weights) < 2:
        return None
    data = set(writer.axes)
    sizes = {**before, **{d.name: d.size for w in weights for d in w.dims}}
    names = list(dict.fromkeys(d.name for w in weights for d in w.dims))
    inner = [n for n in names if n in reduced and n not in data]
    if not inner:
        return None
    kept = [n for n in names if n not in inner]

    def elements(dims: set[str]) -> Fraction:
        return prod((sizes[n].evaluate(binding) for n in dims), start=Fraction(1))

    direct = elements(data | set(names))
    first = elements(set(names)) + elements(data | set(kept))
    if first >= direct:
        return None
    operands = [writer.weight(weight_index[w.name]) for w in weights]
    patterns = [writer.pattern([d.name for d in w.dims]) for w in weights]
    code = einsum_code(operands, patterns, writer.pattern(kept))
    spec = f"{', '.join(patterns)} -> {writer.pattern(kept)}"
    writer.emit(f"w = {code}  # the weights first: sums {', '.join(inner)}; {spec}")
    return kept


def _emit_stage(
    writer: _Writer,
    block: list[Primitive],
    before: dict[str, Size],
    result: list[str],
    weight_index: dict[str, int],
    binding: Mapping[str, int] | None = None,
) -> None:
    if _native_matmul(writer, block, before, weight_index):
        return
    shares = [step.weight for step in block if isinstance(step, Share)]
    reduces = [step for step in block if isinstance(step, Reduce)]
    weights = [w for w in shares if isinstance(w, Weight)]
    kept = _weights_first(writer, weights, {r.dim for r in reduces}, before, weight_index, binding or {})
    if kept is not None:
        operands, patterns = [writer.data, "w"], [writer.pattern(), writer.pattern(kept)]
    else:
        operands = [writer.data] + [writer.weight(weight_index[w.name]) for w in weights]
        patterns = [writer.pattern()] + [writer.pattern([d.name for d in w.dims]) for w in weights]
    comment = ", ".join(f"Share({w.name})" for w in shares if isinstance(w, Weight))
    if reduces:
        comment += (", " if comment else "") + "Reduce(" + ", ".join(r.dim for r in reduces) + ")"
    means = [r.dim for r in reduces if r.mean]
    if shares:
        spec = f"{', '.join(patterns)} -> {writer.pattern(result)}"
        code = einsum_code(operands, patterns, writer.pattern(result))
        writer.emit(f"{writer.var} = {code}  # {comment}: {spec}")
    else:  # a sum (or mean) over some dims: one torch reduction, the rest in the data's order
        data, summed = writer.data, {r.dim for r in reduces}
        positions = tuple(i for i, a in enumerate(writer.axes) if a in summed)
        how = "mean" if len(means) == len(reduces) else "sum"
        writer.emit(f"{writer.var} = {data}.{how}(dim={positions})  # {comment}")
        writer.axes = [a for a in writer.axes if a not in summed]
        if writer.axes != result:
            writer.reorder(result)
        if how == "mean":
            means = []
    sizes = {**before}
    for share in shares:
        if isinstance(share, Weight):
            sizes.update({d.name: d.size for d in share.dims})
    if means:
        writer.emit(
            f"{writer.var} = {writer.data} / ({' * '.join(_atom(writer.size(sizes[m])) for m in means)})  # mean"
        )
    writer.axes = result


def _class_name(name: str) -> str:
    parts = re.split(r"[^A-Za-z0-9]+", name)
    text = "".join(p[:1].upper() + p[1:] for p in parts if p) or "Operator"
    text = text if text[0].isalpha() else "Op" + text
    return text + "Operator" if text in MODULE_NAMES or keyword.iskeyword(text) else text


def _free_inputs(op: Operator) -> set[int]:
    """Positions of the input dims whose size the forward reads from its input (the batch): the
    dim's size is one primary variable that no other size mentions, and no step touches the dim,
    so any value gives the same operator on more (or fewer) rows."""
    touched = {name for step in op.steps for name in step.consumes}
    mentioned: list[str] = [v.name for step in op.steps for s in step.sizes() for v in s.variables]
    for dim in op.inputs:
        mentioned += [v.name for v in dim.size.variables]
    free = set()
    for position, dim in enumerate(op.inputs):
        var = dim.size.variable_name
        if var is not None and dim.name not in touched and mentioned.count(var) == 1 and var in op.primary_variables:
            free.add(position)
    return free


def weight_attributes(op: Operator) -> list[str]:
    """The attribute (and ``state_dict`` key) of each weight of ``op``, in ``op.weights`` order: the
    weight's own name, unless ``nn.Module`` or the generated module uses that name itself
    (:data:`RESERVED_ATTRIBUTES`: ``training``, ``weights``, ``bias``, ...), then the name with ``_``
    appended until it is free (the generated source lists these renamings).

    >>> from kdsl import gallery
    >>> weight_attributes(gallery.load("depthwise_separable_conv2d"))
    ['depthwise', 'pointwise']
    """
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


def _summed_dims(op: Operator) -> list[list[tuple[str, Size]]]:
    """Per weight of ``op``: the dims (name, size) it sums over. A ``Reduce`` (a sum, not a mean)
    of dim ``d`` counts for the weight shared last on ``d`` or on a dim ``d`` was made from
    (through Merge, Split and the other views) before the Reduce. An FC sums its input dims."""
    if not op.is_linear:
        found: list[list[tuple[str, Size]]] = []
        for node in op.nodes:
            if node.kind == "Chain":
                found += _summed_dims(node.chain)
            else:
                found += [[(d.name, d.size) for d, new in zip(w.dims, w.new) if not new] for w in node.weights()]
        return found
    summed: list[list[tuple[str, Size]]] = [[] for _ in op.weights]
    last: dict[str, int] = {}  # live dim -> the weight shared last on it (its position in op.weights)
    count = 0
    for position, step in enumerate(op.steps):
        if isinstance(step, Share):
            if isinstance(step.weight, Weight):
                for dim in step.weight.dims:
                    last[dim.name] = count
                count += 1
            continue
        if isinstance(step, Reduce):
            owner = last.pop(step.dim, None)  # type: ignore[arg-type]
            if owner is not None and not step.mean:
                summed[owner].append((str(step.dim), op.live[position][str(step.dim)]))
            continue
        owners = [last[name] for name in step.consumes if name in last]
        for name in step.consumes:
            last.pop(name, None)
        for name in step.produces:
            if owners:
                last[name] = max(owners)
    return summed


def fan_ins(op: Operator) -> list[Size]:
    """The fan-in of each weight of ``op`` (in ``op.weights`` order) that PyTorch would use for the
    equivalent layer: the product of the sizes of the dims the weight sums over.

    A dim counts for the weight shared last on it before a ``Reduce`` sums it (a mean does not
    count: it already divides by the size). So a conv2d weight ``[Cout, Cin, kh, kw]`` has fan-in
    ``Cin*K^2`` (``nn.Conv2d``); a dim the operator does not sum but keeps in the output, like the
    channel of a depthwise conv or the group of a grouped one, does not count: the depthwise
    weight ``[Cin, kh, kw]`` has fan-in ``K^2`` (``nn.Conv2d(groups=Cin)``), and in a depthwise
    separable conv the later ``Reduce(Cin)`` counts for the pointwise weight ``[Cout, Cin]``, shared
    after it. A weight that sums nothing (a per-element scale) has fan-in 1. An FC weight of a
    branching kernel sums its input dims (``nn.Linear``).

    >>> from kdsl import gallery
    >>> [str(f) for f in fan_ins(gallery.load("depthwise_separable_conv2d"))]
    ['K**2', 'Cin']
    >>> [str(f) for f in fan_ins(gallery.load("grouped_conv2d"))]
    ['Cin*K**2/G']
    """
    return [prod((size for _, size in dims), start=Size.of(1)) for dims in _summed_dims(op)]


def _needed_variables(op: Operator) -> dict[str, str]:
    """Variable -> the first weight whose shape or fan-in needs it (so it must be known when the
    module is built), as text for messages."""
    needed: dict[str, str] = {}
    for weight, fan_in in zip(op.weights, fan_ins(op)):
        text = f"the weight {weight.name}[{', '.join(d.name for d in weight.dims)}]"
        for size in [d.size for d in weight.dims] + [fan_in]:
            for var in size.variables:
                needed.setdefault(var.name, text)
    return needed


def lazy_variables(op: Operator) -> dict[str, int]:
    """The size variables a module of ``op`` can leave unbound until it is called, like the
    ``nn.Lazy*`` modules (variable -> the position of the input dim it is read from): primaries
    that no weight's shape or fan-in mentions and that are exactly the size of an input dim (N, H,
    W of a convolution; the first such dim).

    >>> from kdsl import gallery
    >>> lazy_variables(gallery.load("conv2d"))
    {'H': 2, 'N': 0, 'W': 3}
    """
    needed = _needed_variables(op)
    positions = {}
    for position, dim in enumerate(op.inputs):
        var = dim.size.variable_name
        if var is not None and var not in needed and var not in positions and var in op.primary_variables:
            positions[var] = position
    return dict(sorted(positions.items(), key=lambda item: [v.name for v in op.variables].index(item[0])))


def _known_binding(op: Operator, layer: object) -> dict[str, int]:
    """The binding of ``op``'s variables that ``layer`` gives (with the coefficients' defaults),
    checked like :func:`kdsl.solve.bind` where it binds everything. A primary the layer omits is
    left out when :func:`lazy_variables` allows it (the module reads it from its input); else
    :class:`LayerError` names it and what needs it. The constraints whose variables are all bound
    are checked (:class:`DivisibilityError`); the forward checks the others on its input."""
    item = as_layer(layer)
    missing = [v.name for v in op.variables if v.kind == "primary" and item.get(v.name) is None]
    if not missing:
        return solve.bind(op, item)
    lazy, needed = lazy_variables(op), _needed_variables(op)
    for name in missing:
        if name not in lazy:
            why = (
                f"{needed[name]} needs it (weights have their shapes when the module is built)"
                if name in needed
                else "the forward needs it and no input dim has exactly that size to read it from"
            )
            raise LayerError(f"{layer_label(item.name)} does not give the size {name}: {why}; add {name} to the layer")
    filled = Layer(item.name, {**item.values, **{name: 1 for name in missing}})
    binding = {k: v for k, v in resolve_binding(op, filled).items() if k not in missing}
    for constraint in solve.constraints(op):
        known = constraint.kind != "window" and set(constraint.variables) <= set(binding)
        if known and not constraint.holds(binding):
            raise DivisibilityError(constraint.failure(item.name, binding))
    return binding


def _fraction_code(size: Size, identifiers: Mapping[str, str]) -> tuple[str, str]:
    """Python code of a size's numerator and denominator (``"1"`` when it has none)."""
    numerator = [str(size.constant.numerator)] if size.constant.numerator != 1 else []
    denominator = [str(size.constant.denominator)] if size.constant.denominator != 1 else []
    for var, exponent in size.exponents:
        (numerator if exponent > 0 else denominator).extend([identifiers[var.name]] * abs(exponent))
    return " * ".join(numerator) or "1", " * ".join(denominator) or "1"


def _one_line(op: Operator) -> str:
    """The operator in one line, for the module's repr."""
    inputs = ", ".join(d.name for d in op.inputs)
    outputs = ", ".join(d.name for d in op.outputs)
    if not op.is_linear:
        nodes = "; ".join(f"node {i}: {node.describe()}" for i, node in enumerate(op.nodes) if i)
        return f"Input({inputs}) -> {nodes} -> Output({outputs})"
    return " >> ".join([f"Input({inputs})", *(step.describe() for step in op.steps), f"Output({outputs})"])


def _bias_dim(op: Operator) -> int:
    """The output dim a bias runs along: the one named ``Cout``, else the second (the channels of
    ``[N, C, ...]``), else the only one."""
    names = [d.name for d in op.outputs]
    return names.index("Cout") if "Cout" in names else min(1, len(names) - 1)


def source(
    op: Operator, layer: Mapping[str, int] | None = None, *, name: str = "KdslOperator", pad: bool = False
) -> str:
    """Python source of an ``nn.Module`` computing ``op`` (an operator or a branching kernel) that
    runs without kdsl installed.

    With ``pad=True`` (``layer`` required) a size that does not divide the layer is padded
    (:mod:`kdsl.solve.padding`): the module is the operator at the padded sizes, its ``forward``
    zero-pads the input with ``F.pad``, calls ``padded_forward`` (the unpadded forward at those
    sizes) and crops the output (see :func:`padded_source`).

    The module's constructor takes every size variable (as a keyword argument of the variable's
    name, unless the module uses that name itself: then the source says which name it takes
    instead) and ``bias`` (``bias=True`` adds a parameter ``bias`` with one value per output
    channel: the output dim named ``Cout``, else the second one). The sizes of
    :func:`lazy_variables` (N, H, W of a convolution) may be ``None``: the forward then reads them
    from its input at each call (like ``nn.Lazy*`` modules, and any size where no weight depends on
    it) and checks that they divide as the operator needs (``ShapeError``). Each weight is a
    parameter named after the DSL's weight (:func:`weight_attributes`), initialised like PyTorch's
    layers, uniform in ±1/sqrt(fan-in) (``kaiming_uniform_(a=sqrt(5))``) with the fan-in of
    :func:`fan_ins`; ``module.weights`` lists them in ``op.weights`` order.

    The plan (the order of contraction stages) of each linear chain is the one that is cheapest at
    ``layer`` (at a reference size for the variables it does not give). The forward checks its
    input's shape (``ShapeError``). A branching kernel's forward computes one variable per node
    (``x3`` is node 3) with one rule per node kind (:data:`GRAPH_RULES`).

    >>> from kdsl.lang import *
    >>> N, C, L = primary("N C L")
    >>> x = Input(N, C, L)
    >>> kernel = (x + (x >> Map("relu"))) >> Output(N, C, L)
    >>> text = source(kernel)
    >>> print(text[text.index("# node 1") :].strip())
    # node 1: Map(relu) of node 0 -> [N, C, L]
    x1 = torch.relu(x)
    # node 2: Blend(add) of node 0, node 1 -> [N, C, L]
    x2 = x + x1
    if self.bias is not None:
        x2 = x2 + self.bias[:, None]  # one per C
    return x2
    """
    if pad:
        if layer is None:
            raise LoweringError("source(..., pad=True) pads the sizes of one layer: pass the layer")
        return padded_source(op, solve.pad_binding(op, layer), name=name)
    binding = _known_binding(op, layer) if layer is not None else None
    variables = [v.name for v in op.variables]
    if not op.is_linear:
        ids = _identifiers(variables, own_names(op))
        dims = _graph_dim_names(op)
        free = free_inputs(op)
    else:
        ids = _identifiers(variables)
        dims = _dim_names(op)
        free = _free_inputs(op)
    axis = _Axes(set(dims))
    for dim in sorted(dims, key=lambda d: not _einops_ok(d)):  # names einops takes keep themselves
        axis(dim)
    attributes = weight_attributes(op)
    codes = [f"self.{a}" for a in attributes]
    if not op.is_linear:
        body = _graph_body(op, binding, axis, ids, codes)
    else:
        body = _forward_body(op, solve.plan(op, binding), axis, ids, codes)
    defaults = op.default_coefficients
    lazy = lazy_variables(op)
    required = [v for v in variables if v not in defaults and v not in lazy]
    signature = ", ".join(
        [f"{ids[v]}: int" for v in required]
        + [f"{ids[v]}: int | None = None" for v in variables if v in lazy]
        + [f"{ids[v]}: int = {defaults[v]}" for v in variables if v in defaults]
        + ["bias: bool = False"]
    )
    weight_lines = []
    fan_codes = {}
    for weight, attribute, sums in zip(op.weights, attributes, _summed_dims(op)):
        shape = ", ".join(_size_code(d.size, ids) for d in weight.dims)
        fan_code = " * ".join(_atom(_size_code(size, ids)) for _, size in sums) or "1"
        what = f"sums {', '.join(d for d, _ in sums)}" if sums else "sums nothing"
        dims_text = ", ".join(d.name for d in weight.dims)
        weight_lines.append(f"        # {weight.name}[{dims_text}]: {what}, fan-in {fan_code}")
        weight_lines.append(f"        self.{attribute} = nn.Parameter(torch.empty({shape}))")
        fan_codes[attribute] = fan_code
    position = _bias_dim(op)
    channel = op.outputs[position]
    owners = [a for w, a in zip(op.weights, attributes) if channel.name in {d.name for d in w.dims}]
    bias_fan_in = fan_codes[owners[-1]] if owners else fan_codes[attributes[-1]] if attributes else "1"
    fan_codes["bias"] = bias_fan_in
    expected = []
    late = False  # an input dim whose size mentions a lazy variable without being it
    for i, d in enumerate(op.inputs):
        mentions = {v.name for v in d.size.variables} & set(lazy)
        if i in free:
            expected.append("None")
        elif mentions and d.size.variable_name not in lazy:
            expected.append("None")
            late = True
        else:
            expected.append(_size_code(d.size, ids))
    dim_list = "[" + ", ".join(f'"{d.name}"' for d in op.inputs) + "]"
    read = [v for v in lazy if lazy[v] not in free]
    lazy_lines = []
    if read:
        lazy_lines.append(
            f"        if {' or '.join(f'{ids[v]} is None' for v in read)}:  "
            "# not given when built: the input's sizes (no weight depends on them)"
        )
        targets = ", ".join(ids[v] for v in read)
        lazy_lines.append(f"            {targets} = {', '.join(f'x.shape[{lazy[v]}]' for v in read)}")
        if late:
            full = ["None" if i in free else _size_code(d.size, ids) for i, d in enumerate(op.inputs)]
            lazy_lines.append(f"            _check_input(x, {dim_list}, [{', '.join(full)}])")
        for constraint in solve.constraints(op):
            if constraint.kind != "integral" or not set(constraint.variables) & set(read):
                continue
            numerator, denominator = _fraction_code(constraint.sizes[0], ids)
            if denominator == "1":
                continue
            values = ", ".join(f"{v}={{{ids[v]}}}" for v in constraint.variables)
            text = constraint.description.replace("{", "{{").replace("}", "}}")
            message = f"{text} ({values}), for the input of shape {{list(x.shape)}}"
            lazy_lines.append(f"            if ({numerator}) % ({denominator}):")
            lazy_lines.append(
                f"                raise ShapeError(f{message!r})"
            )  # one f-string: torch.compile traces it
    notes = []
    renamed_axes = axis.renamed()
    if renamed_axes:
        pairs = ", ".join(f"{dim} -> {new}" for dim, new in renamed_axes.items())
        notes.append(f"# einops axes of the dims whose names einops does not take: {pairs}")
    renamed_ids = {v: i for v, i in ids.items() if v != i}
    if renamed_ids:
        pairs = ", ".join(f"{v} -> {i}" for v, i in renamed_ids.items())
        notes.append(f"# constructor arguments of the size variables whose names this module uses itself: {pairs}")
    renamed_weights = {w.name: a for w, a in zip(op.weights, attributes) if w.name != a}
    if renamed_weights:
        pairs = ", ".join(f"{w} -> {a}" for w, a in renamed_weights.items())
        notes.append(f"# attributes of the weights whose names nn.Module or this module uses itself: {pairs}")
    dsl = op.to_dsl().rstrip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    class_name = _class_name(name)
    *body, last = body
    result = last.removeprefix("return ")
    if not re.fullmatch(r"\w+", result):
        body.append(f"x = {result}")
        result = "x"
    trailing = len(op.outputs) - 1 - position
    index = "[:, " + ", ".join(["None"] * trailing) + "]" if trailing else ""
    body += [
        "if self.bias is not None:",
        f"    {result} = {result} + self.bias{index}  # one per {channel.name}",
        f"return {result}",
    ]
    weight_list = ", ".join(codes)
    text = [
        '"""Generated by kdsl from this operator:',
        "",
        *("    " + line if line else "" for line in dsl.splitlines()),
        '"""',
        "",
        "import math",
        "",
        "import torch",
        "import torch.nn.functional as F",
        "from torch import nn",
        ERROR_IMPORT,
        HELPERS + (GRAPH_HELPERS if not op.is_linear else ""),
        "",
        *notes,
        f"class {class_name}(nn.Module):",
        f"    operator = {_one_line(op)!r}",
        "",
        f"    def __init__(self, {signature}):",
        "        super().__init__()",
        "        self.sizes = {" + ", ".join(f'"{v}": {ids[v]}' for v in variables) + "}",
        *weight_lines,
        f"        # bias: one per {channel.name} (output dim {position}), fan-in {bias_fan_in} like its weight's",
        "        if bias:",
        f"            self.bias = nn.Parameter(torch.empty({_size_code(channel.size, ids)}))",
        "        else:",
        '            self.register_parameter("bias", None)',
        "        self.fan_ins = {" + ", ".join(f'"{a}": {code}' for a, code in fan_codes.items()) + "}",
        *(
            ["        self.masks = {}  # node -> the padding mask of its max/min fold (they depend on shapes only)"]
            if not op.is_linear and masked_folds(op)
            else []
        ),
        "        self.reset_parameters()",
        "",
        "    def reset_parameters(self):",
        "        # PyTorch's default for its layers, kaiming_uniform_(a=sqrt(5)): uniform in +-1/sqrt(fan-in)",
        "        for name, fan_in in self.fan_ins.items():",
        "            if getattr(self, name) is not None:",
        "                bound = 1.0 / math.sqrt(fan_in)",
        "                nn.init.uniform_(getattr(self, name), -bound, bound)",
        "",
        "    @property",
        "    def weights(self):",
        '        """The weights in the operator\'s order."""',
        f"        return [{weight_list}]",
        "",
        "    def extra_repr(self):",
        "        given = [f'{name}={size}' for name, size in self.sizes.items() if size is not None]",
        "        lazy = [name for name, size in self.sizes.items() if size is None]",
        "        read = ['(' + ', '.join(lazy) + ' from the input)'] if lazy else []",
        "        biased = ['bias=True'] if self.bias is not None else []",
        "        return ', '.join([self.operator, *given, *read, *biased])",
        "",
        "    def forward(self, x):",
        f"        {', '.join(ids[v] for v in variables)}{',' if len(variables) == 1 else ''} = self.sizes.values()"
        if variables
        else "",
        f"        _check_input(x, {dim_list}, [{', '.join(expected)}])",
        *(
            f"        {ids[d.size.variable_name]} = x.shape[{i}]  # any size (like a batch)"
            for i, d in enumerate(op.inputs)
            if i in free and d.size.variable_name is not None
        ),
        *lazy_lines,
        *("        " + line for line in body),
    ]
    return "\n".join(text) + "\n"


# ------------------------------------------------------------------------------------------------
# Branching operators: one rule per node kind
# ------------------------------------------------------------------------------------------------


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
    chain's lines (the operator machinery of :mod:`kdsl.codegen.torch`), ``weights`` the code of
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
    writer = _GraphWriter(graph, axis, size, emit_chain, list(weights), names=["x"] * len(graph.nodes))
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


def free_inputs(graph: Operator) -> set[int]:
    """Positions of the input dims whose size the forward reads from its input (the batch), as for
    an operator: no node reads the dim by name, and no step and no other input dim mentions its
    variable, so any value gives the same kernel on more (or fewer) rows."""
    touched: set[str] = set()
    mentioned: list[str] = [v.name for d in graph.inputs for v in d.size.variables]
    for node in graph.nodes:
        steps = node.chain.steps if node.kind == "Chain" else [node.step] if isinstance(node.step, Primitive) else []
        for step in steps:
            touched.update(step.consumes)
            mentioned += [v.name for s in step.sizes() for v in s.variables]
        if isinstance(node.step, ProductJoin):
            touched.update(node.step.reduce)
    free = set()
    for position, dim in enumerate(graph.inputs):
        var = dim.size.variable_name
        if var is not None and dim.name not in touched and mentioned.count(var) == 1 and var in graph.primary_variables:
            free.add(position)
    return free


def own_names(graph: Operator) -> frozenset[str]:
    """The forward's own variables besides :data:`OWN_NAMES` (a size variable must not take one)."""
    count = len(graph.nodes)
    return frozenset(
        {"ones", "_pool", "_masked_fold"} | {f"x{i}" for i in range(count)} | {f"mask{i}" for i in range(count)}
    )


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


def build(
    op: Operator,
    layer: Mapping[str, int],
    *,
    name: str = "KdslOperator",
    pad: bool = False,
    bias: bool = False,
) -> Any:
    """A ``torch.nn.Module`` computing ``op`` (an operator or a branching kernel) at the sizes of
    ``layer``: the class :func:`source` writes, with one parameter per weight named after it
    (``module.depthwise``; ``module.weights`` lists them in ``op.weights`` order) and, with
    ``bias=True``, a ``bias`` per output channel (the output dim named ``Cout``, else the second),
    initialised like ``nn.Conv2d``'s: with the fan-in of the last weight that has that dim (else of
    the last weight).

    Sizes the layer does not give are read from the input at each call where no weight depends on
    them (:func:`lazy_variables`: N, H, W of a convolution); a size a weight needs raises
    :class:`LayerError` naming it.

    With ``pad=True`` a size that does not divide the layer is padded (:mod:`kdsl.solve.padding`):
    the weights have the padded shapes, the forward takes and returns the layer's shapes (it
    zero-pads its input and crops its output), and ``module.padding`` records the padding.

    The module is an instance of a real class: its source is compiled into a module object
    registered in ``sys.modules`` as ``kdsl_generated_<key>_<hash of the source>`` (one per source,
    so ``torch.compile`` and tracebacks find it), and it pickles as data, not as a reference to that
    class: the operator's DSL text, the layer, ``name`` and ``pad``, plus the module's state (its
    ``__dict__``: parameters, hooks, training flag). Unpickling (``pickle``, ``copy.deepcopy``,
    ``torch.load(..., weights_only=False)``, in this process or a fresh one with kdsl installed)
    parses the DSL with :func:`kdsl.lang.parse` (which never runs code), regenerates the class and
    restores the state without initialising anything.

    >>> import torch
    >>> from kdsl.lang import library
    >>> layer = {"N": 1, "Cin": 64, "Cout": 64, "H": 7, "W": 7, "G": 3}
    >>> module = build(library.load("grouped_conv2d"), layer, pad=True)
    >>> [tuple(w.shape) for w in module.weights], tuple(module(torch.ones(1, 64, 7, 7)).shape)
    ([(3, 22, 22, 3, 3)], (1, 64, 7, 7))
    >>> print(module.padding.describe())
    Cin 64 -> 66 (Split(Cin, Cin/G))
    Cout 64 -> 66 (Share(w): the weight dim co: Cout/G)
    >>> module = build(library.load("depthwise_separable_conv2d"), {"Cin": 8, "Cout": 16}, bias=True)
    >>> list(module.state_dict())
    ['depthwise', 'pointwise', 'bias']
    >>> tuple(module(torch.ones(2, 8, 5, 9)).shape)
    (2, 16, 5, 9)
    """
    load_torch()
    item = as_layer(layer)
    recipe = (op.to_dsl(), item.name, tuple(item.items), name, pad)
    code, padding, binding, cls = _generated(op, recipe)
    variables = [v.name for v in op.variables]
    ids = _identifiers(variables, own_names(op)) if not op.is_linear else _identifiers(variables)
    module = cls(**{ids[v]: binding[v] for v in variables if v in binding}, bias=bias)
    module.kdsl_source = code
    module.padding = padding
    module._kdsl_recipe = recipe
    _INSTANCES[cls.__module__].add(module)
    return module


#: (DSL text, layer name, layer items, class name, pad) -> what :func:`build` made of it, the most
#: recently used last; at most :data:`CACHED_CLASSES` of them.
_GENERATED: OrderedDict[tuple[Any, ...], tuple[str, Padding | None, dict[str, int], type]] = OrderedDict()

#: How many generated classes stay cached (and registered) while no module of theirs is alive.
#: A search builds thousands of candidates: their classes must not pile up in ``sys.modules``.
CACHED_CLASSES = 256

#: The name of each generated module registered in ``sys.modules`` -> the live modules of its class
#: (built or unpickled ones): it stays registered while one lives, for ``torch.compile``.
_INSTANCES: dict[str, weakref.WeakSet[Any]] = {}

#: Attributes :func:`_restore` sets again, so a pickled module's state leaves them out.
_DERIVED = ("kdsl_source", "padding", "_kdsl_recipe")


def _generated(op: Operator, recipe: tuple[Any, ...]) -> tuple[str, Padding | None, dict[str, int], type]:
    """The source, padding, binding and class of ``op`` built by ``recipe`` (cached)."""
    found = _GENERATED.get(recipe)
    if found is not None:
        _GENERATED.move_to_end(recipe)
        return found
    _, layer_name, items, name, pad = recipe
    layer = Layer(layer_name, items)
    padding = solve.pad_binding(op, layer) if pad else None
    binding = padding.padded_binding if padding is not None else _known_binding(op, layer)
    code = padded_source(op, padding, name=name) if padding is not None else source(op, binding, name=name)
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    module_name = f"kdsl_generated_{op.key}_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        module = types.ModuleType(module_name)
        filename = f"<{module_name}>"
        # The code is generated by kdsl from a validated operator (names are identifiers, sizes are
        # integers), never user text, so compiling it is safe.
        exec(compile(code, filename, "exec"), module.__dict__)
        linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)  # tracebacks
        module.__dict__[_class_name(name)].__reduce_ex__ = _reduce_ex
        sys.modules[module_name] = module  # importable by name: torch.compile looks classes up there
        _INSTANCES[module_name] = weakref.WeakSet()
    found = (code, padding, dict(binding), getattr(module, _class_name(name)))
    _GENERATED[recipe] = found
    if len(_GENERATED) > CACHED_CLASSES:
        _forget_unused()
    return found


def _forget_unused() -> None:
    """Drop the least recently used classes past :data:`CACHED_CLASSES`, and unregister every
    generated module that neither the cache nor a live module uses (they are made again on demand)."""
    while len(_GENERATED) > CACHED_CLASSES:
        _GENERATED.popitem(last=False)
    cached = {cls.__module__ for *_, cls in _GENERATED.values()}
    for module_name, instances in list(_INSTANCES.items()):
        if module_name not in cached and not instances:
            del _INSTANCES[module_name]
            sys.modules.pop(module_name, None)
            linecache.cache.pop(f"<{module_name}>", None)


def _reduce_ex(module: Any, protocol: int) -> tuple[Any, ...]:
    """Pickle a built module as the recipe that regenerates its class and its state (see :func:`build`)."""
    state = {key: value for key, value in module.__dict__.items() if key not in _DERIVED}
    return (_restore, (module._kdsl_recipe,), state)


def _restore(recipe: tuple[Any, ...]) -> Any:
    """A module of ``recipe``'s class, not initialised: unpickling then sets its state."""
    load_torch()
    found = _GENERATED.get(recipe)
    code, padding, _, cls = found if found is not None else _generated(parse(recipe[0]), recipe)
    module = cls.__new__(cls)
    module.__dict__.update(kdsl_source=code, padding=padding, _kdsl_recipe=recipe)
    _INSTANCES[cls.__module__].add(module)
    return module


def padded_source(op: Operator, padding: Padding, *, name: str = "KdslOperator") -> str:
    """The source of ``op`` at ``padding``'s padded binding (as :func:`source` writes it, its
    ``forward`` renamed ``padded_forward``) and a ``forward`` that zero-pads the input at the end
    of each padded dim (``F.pad``), calls ``padded_forward`` and crops each output dim to the
    elements it keeps. With nothing padded it is :func:`source` at the layer.

    >>> from kdsl.lang import library
    >>> from kdsl import solve
    >>> op = library.load("grouped_conv2d")
    >>> layer = {"N": 1, "Cin": 64, "Cout": 64, "H": 7, "W": 7, "G": 3}
    >>> text = padded_source(op, solve.pad_binding(op, layer))
    >>> print(text[text.index("    def forward"):text.index("    def padded_forward")].strip())
    def forward(self, x):
            # kdsl pad=True: Cin 64 -> 66 (Split(Cin, Cin/G)); Cout 64 -> 66 (Share(w): the weight dim co: Cout/G)
            # zero-pad the input at the end of each padded dim, run at the padded sizes, crop the output
            _check_input(x, ["N", "Cin", "H", "W"], [None, 64, 7, 7])
            x = F.pad(x, (0, 0, 0, 0, 0, 2))  # Cin 64 -> 66
            y = self.padded_forward(x)
            return y[:, :64]  # Cout 66 -> 64
    """
    code = source(op, padding.padded_binding, name=name)
    if not padding.needed:
        return code
    free = free_inputs(op) if not op.is_linear else _free_inputs(op)
    dims = ", ".join(f'"{d.name}"' for d in padding.inputs)
    sizes = ", ".join("None" if i in free else str(d.original) for i, d in enumerate(padding.inputs))
    lines = [
        "    def forward(self, x):",
        "        # kdsl pad=True: " + "; ".join(str(v) for v in padding.variables),
        "        # zero-pad the input at the end of each padded dim, run at the padded sizes, crop the output",
        f"        _check_input(x, [{dims}], [{sizes}])",
    ]
    padded_inputs = [d for d in padding.inputs if d.amount]
    if padded_inputs:
        # F.pad lists (left, right) pairs from the last dim backwards, up to the first padded dim
        first = min(i for i, d in enumerate(padding.inputs) if d.amount)
        pairs = ", ".join(f"0, {d.amount}" for d in reversed(padding.inputs[first:]))
        notes = ", ".join(f"{d.name} {d.original} -> {d.padded}" for d in padded_inputs)
        lines.append(f"        x = F.pad(x, ({pairs}))  # {notes}")
    lines.append("        y = self.padded_forward(x)")
    cropped = [d for d in padding.outputs if d.amount]
    if cropped:
        last = max(i for i, d in enumerate(padding.outputs) if d.amount)
        index = ", ".join(f":{d.original}" if d.amount else ":" for d in padding.outputs[: last + 1])
        notes = ", ".join(f"{d.name} {d.padded} -> {d.original}" for d in cropped)
        lines.append(f"        return y[{index}]  # {notes}")
    else:
        lines.append("        return y")
    marker = "\n    def forward(self, x):\n"
    head, tail = code.split(marker)
    return head + "\n" + "\n".join(lines) + "\n\n    def padded_forward(self, x):\n" + tail
