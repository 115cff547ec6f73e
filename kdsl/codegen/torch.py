"""The PyTorch backend: readable ``nn.Module`` source, top-down views and one einsum per stage.

:func:`source` writes a self-contained Python module (it imports only torch and einops) whose
code reads like the DSL: each view is an einops ``rearrange`` or a small torch call with the
DSL's own dim names, and each contraction stage of the operator's plan (:func:`kdsl.solve.plan`,
Syno's rfactor) is one ``einsum``. A stage that is exactly a native op (a convolution of any
kind: grouped, depthwise, strided, dilated; 1-D to 3-D) is lowered to ``F.conv*d`` instead —
same numerics, faster. :func:`build` compiles that source into a module for one layer.

>>> import torch
>>> from kdsl.lang import *
>>> N, Cin, Cout = primary("N Cin Cout")
>>> linear = Input(N, Cin) >> Share(Weight(Cout, Cin, name="w")) >> Reduce(Cin) >> Output(N, Cout)
>>> module = build(linear, {"N": 2, "Cin": 3, "Cout": 4})
>>> module(torch.ones(2, 3)).shape
torch.Size([2, 4])
>>> [tuple(w.shape) for w in module.weights]
[(4, 3)]
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kdsl.lang.build import Operator
from kdsl.lang.errors import LoweringError
from kdsl.lang.primitives import (
    BuildContext,
    Expand,
    Live,
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

HELPERS = '''
def _conv(x, w, pads, stride, dilation, groups):
    """F.conv{1,2,3}d with zero padding given as F.pad lists it (last dim first, left then right);
    symmetric padding goes to the convolution itself, which avoids copying a padded input."""
    conv = (F.conv1d, F.conv2d, F.conv3d)[w.dim() - 3]
    lefts, rights = pads[0::2], pads[1::2]
    if lefts == rights and min(lefts) >= 0:
        return conv(x, w, stride=stride, padding=tuple(reversed(lefts)), dilation=dilation, groups=groups)
    return conv(F.pad(x, pads), w, stride=stride, dilation=dilation, groups=groups)

def _unfold(x, axis, window):
    """out[..., i, ..., j] = x[..., i + j - window // 2, ...], zero outside; the window goes last."""
    x = x.movedim(axis, -1)
    x = F.pad(x, (window // 2, window - 1 - window // 2))
    x = x.unfold(-1, window, 1)
    return x.movedim(-2, axis)
'''


def load_torch() -> Any:
    try:
        import torch
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise LoweringError(
            f"the PyTorch backend needs torch ({error}); install it with: pip install torch==2.13.0 einops"
        ) from None
    return torch


def _axis_name(name: str) -> str:
    """An einops-safe axis name (einops rejects names that start or end with an underscore)."""
    safe = name
    if safe.startswith("_"):
        safe = "d" + safe
    if safe.endswith("_"):
        safe = safe + "x"
    return safe


def _size_code(size: Size) -> str:
    """Integer Python code for a size, in terms of the module's size variables."""
    numerator = [str(size.constant.numerator)] if size.constant.numerator != 1 else []
    denominator = [str(size.constant.denominator)] if size.constant.denominator != 1 else []
    for var, exponent in size.exponents:
        target = numerator if exponent > 0 else denominator
        target.extend([var.name] * abs(exponent))
    text = " * ".join(numerator) or "1"
    if denominator:
        below = " * ".join(denominator)
        text = f"({text}) // ({below})" if len(denominator) > 1 or len(numerator) > 1 else f"{text} // {below}"
    return text


@dataclass
class _Writer:
    """Lines of the forward and the data's dims (``axes``, in order). Merges are deferred and
    fused into one ``rearrange`` (``merged``: dim -> the physical dims it flattens), so a chain
    like Merge(Cin, kh), Merge(., kw) copies an unfolded tensor once, not once per Merge."""

    lines: list[str]
    axes: list[str]
    merged: dict[str, list[str]] = field(default_factory=dict)
    physical: list[str] = field(default_factory=list)  # the tensor's real dims while merges wait

    def emit(self, line: str) -> None:
        self.flush()
        self.lines.append(line)

    def flush(self) -> None:
        if not self.merged:
            return
        physical = self.physical
        target = " ".join(
            "(" + " ".join(_axis_name(d) for d in self.merged[a]) + ")" if a in self.merged else _axis_name(a)
            for a in self.axes
        )
        self.merged = {}
        self.lines.append(f'x = rearrange(x, "{self.pattern(physical)} -> {target}")')

    def merge(self, outer: str, inner: str, name: str) -> None:
        if not self.merged:
            self.physical = list(self.axes)
        position = self.axes.index(outer)
        flattened = self.merged.pop(outer, [outer]) + self.merged.pop(inner, [inner])
        rest = [a for a in self.axes if a not in (outer, inner)]
        insert_at = sum(1 for a in self.axes[:position] if a != inner)
        self.axes = rest[:insert_at] + [name] + rest[insert_at:]
        self.merged[name] = flattened

    def pattern(self, axes: list[str] | None = None) -> str:
        return " ".join(_axis_name(a) for a in (self.axes if axes is None else axes))


def _forward_body(op: Operator, plan: Any) -> list[str]:
    """The forward's lines (indented by the caller)."""
    writer = _Writer([], [d.name for d in op.inputs])
    live = Live({d.name: d.size for d in op.inputs}, frozenset())
    context = BuildContext()
    weight_index = {w.name: i for i, w in enumerate(op.weights)}
    steps = list(plan.steps)
    stages = list(plan.stages)
    position = 0
    for stage in stages + [None]:
        stop = stage.start if stage is not None else len(steps)
        views = steps[position:stop]
        if stage is not None:
            block = steps[stage.start : stage.stop]
            result = [name for name, _ in stage.result]
            native = _native_conv(
                writer, views, block, dict(live.sizes), result, weight_index, dict(plan.binding)
            ) or _native_pool(writer, views, block, dict(live.sizes), result)
            if native:
                for step in views + block:
                    step.apply(live, context)
                position = stage.stop
                continue
        for step in _reshapes_last(views):
            _emit_view(writer, step, live)
            step.apply(live, context)
        if stage is not None:
            before = dict(live.sizes)
            for step in block:
                step.apply(live, context)
            _emit_stage(writer, block, before, result, weight_index)
            position = stage.stop
    outputs = [d.name for d in plan.outputs]
    if writer.axes != outputs:
        writer.emit(f'x = rearrange(x, "{writer.pattern()} -> {writer.pattern(outputs)}")')
    writer.emit("return x")
    return writer.lines


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
    for roll in rolls:
        _emit_view(writer, roll, None)
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
    left = " ".join(
        f"({_axis_name(by_dim[a].outer)} {_axis_name(by_dim[a].inner)})" if a in by_dim else _axis_name(a)
        for a in writer.axes
    )
    middle = f"{_group(others)} " + " ".join(
        f"({_axis_name(by_dim[a].outer)} {_axis_name(by_dim[a].inner)})" for a in pooled
    )
    tile_sizes = ", ".join(f"{_axis_name(by_dim[a].inner)}={_size_code(by_dim[a].block)}" for a in pooled)
    writer.emit(f'x = rearrange(x, "{left} -> {middle}", {tile_sizes})  # as a pooling input')
    kernel = ", ".join(_size_code(by_dim[a].block) for a in pooled)
    writer.emit(f"x = F.avg_pool{len(pooled)}d(x, ({kernel},))  # mean over {', '.join(sorted(reduced))}")
    outs = " ".join(_axis_name(by_dim[a].outer) for a in pooled)
    lengths = "".join(f", {_axis_name(a)}={_size_code(sizes[a])}" for a in others)
    unflat = others + [by_dim[a].outer for a in pooled]
    writer.emit(f'x = rearrange(x, "{_group(others)} {outs} -> {writer.pattern(unflat)}"{lengths})')
    writer.axes = unflat
    return True


def _identity(source: str, target: str) -> bool:
    """Whether an einops pattern pair only wraps single dims in parentheses (a no-op to skip)."""

    def tokens(pattern: str) -> list[str]:
        return [re.sub(r"^\((\w+)\)$", r"\1", t) for t in re.findall(r"\([^)]*\)|\S+", pattern)]

    return tokens(source) == tokens(target)


def _rearrange(writer: _Writer, operand: str, source: str, target: str, extra: str = "", comment: str = "") -> str:
    """Emit ``rearrange`` unless it is a no-op; return the variable name holding the result."""
    name = "w" if operand.startswith("weights") else "x"
    if _identity(source, target):
        if operand != name:
            writer.emit(f"{name} = {operand}")
        return name
    writer.emit(f'{name} = rearrange({operand}, "{source} -> {target}"{extra}){comment}')
    return name


def _group(names: list[str]) -> str:
    return "(" + " ".join(_axis_name(n) for n in names) + ")"


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
            left.append(_group([split.outer, split.inner]))
            lengths[_axis_name(split.inner)] = _size_code(split.block)
        else:
            left.append(_axis_name(axis))
    conv_in = f"{_group(batch)} {_group(groups + channels)} {' '.join(_axis_name(d) for d in dims)}"
    extra = "".join(f", {k}={v}" for k, v in lengths.items())
    _rearrange(writer, "x", " ".join(left), conv_in, extra, "  # as a convolution's input")
    weight_pattern = " ".join(_axis_name(d.name) for d in weight.dims)
    windows = " ".join(_axis_name(spatial[d].window) if spatial[d].window else "()" for d in dims)
    conv_weight = f"{_group(groups + outs)} {_group(channels)} {windows}"
    _rearrange(writer, f"weights[{weight_index[weight.name]}]", weight_pattern, conv_weight)
    pads, strides, dilations = [], [], []
    for d in reversed(dims):  # F.pad lists the last dim first
        entry = spatial[d]
        if not entry.window:  # a 1-wide kernel: no padding
            pads += ["0", "0"]
            strides.insert(0, "1")
            dilations.insert(0, "1")
            continue
        stride = _size_code(entry.stride) if entry.stride is not None else "1"
        dilation = _size_code(entry.dilation) if entry.dilation is not None else "1"
        taps = _size_code(entry.taps) if entry.taps is not None else _size_code(entry.size)
        left_pad = (
            f"{_size_code(entry.size)} // 2 - {entry.offset}" if entry.offset else f"{_size_code(entry.size)} // 2"
        )
        out_size = f"{_size_code(sizes[d])} // {stride}" if entry.stride is not None else _size_code(sizes[d])
        # right padding so that exactly out_size positions fit (negative pads crop)
        if entry.stride is None:  # out_size == size: the right pad is the span of the taps minus the left pad
            span = f"{dilation} * ({taps} - 1)" if entry.dilation is not None else f"{taps} - 1"
            right_pad = f"{span} - ({left_pad})"
        else:
            right_pad = (
                f"({out_size} - 1) * {stride} + {dilation} * ({taps} - 1) + 1 - {_size_code(sizes[d])} - ({left_pad})"
            )
        pads += [f"{left_pad}", right_pad]
        strides.insert(0, stride)
        dilations.insert(0, dilation)
    group_count = " * ".join(_size_code(sizes[g]) for g in groups) or "1"
    writer.emit(
        f"x = _conv(x, w, pads=({', '.join(pads)}), stride=({', '.join(strides)},), "
        f"dilation=({', '.join(dilations)},), groups={group_count})"
    )
    out_lengths = {}
    for name in batch:
        out_lengths[_axis_name(name)] = _size_code(sizes[name])
    for name in groups:
        out_lengths[_axis_name(name)] = _size_code(sizes[name])
    conv_out = f"{_group(batch)} {_group(groups + outs)} {' '.join(_axis_name(d) for d in dims)}"
    extra = "".join(f", {k}={v}" for k, v in out_lengths.items())
    # keep the convolution's own (contiguous) order; later steps refer to dims by name
    unflat = batch + groups + outs + dims
    if len(batch) != 1 or len(groups + outs) != 1:
        _rearrange(writer, "x", conv_out, writer.pattern(unflat), extra)
    writer.axes = unflat
    return True


def _emit_view(writer: _Writer, step: Primitive, live: Live | None) -> None:
    axes = writer.axes
    if isinstance(step, Split):
        position = axes.index(step.dim)
        after = axes[:position] + [step.outer, step.inner] + axes[position + 1 :]
        grouped = axes[:position] + [f"({_axis_name(step.outer)} {_axis_name(step.inner)})"] + axes[position + 1 :]
        left = " ".join(a if a.startswith("(") else _axis_name(a) for a in grouped)
        writer.emit(
            f'x = rearrange(x, "{left} -> {writer.pattern(after)}", {_axis_name(step.inner)}={_size_code(step.block)})'
        )
        writer.axes = after
    elif isinstance(step, Merge):
        writer.merge(step.outer, step.inner, step.name)
    elif isinstance(step, Shift):
        writer.emit(f"x = torch.roll(x, shifts={-step.offset}, dims={axes.index(step.dim)})  # Shift({step.dim})")
    elif isinstance(step, Expand):
        writer.emit(f"x = x.unsqueeze(-1).expand(*x.shape, {_size_code(step.size)})  # Expand({step.name})")
        writer.axes = axes + [step.name]
    elif isinstance(step, Unfold):
        writer.emit(
            f"x = _unfold(x, {axes.index(step.dim)}, {_size_code(step.window)})  # Unfold({step.dim}) -> {step.name}"
        )
        writer.axes = axes + [step.name]
    elif isinstance(step, Stride):
        position = axes.index(step.dim)
        index = ", ".join([":"] * position + [f"::{_size_code(step.stride)}"])
        writer.emit(f"x = x[{index}]  # Stride({step.dim})")
    else:  # pragma: no cover - contractions are handled by stages
        raise LoweringError(f"no PyTorch view for {step!r}")


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
    w = f"weights[{weight_index[weight.name]}]"
    weight_pattern = " ".join(_axis_name(d.name) for d in weight.dims)
    _rearrange(writer, w, weight_pattern, f"{_group(outs)} {_group(run)}")
    lengths = "".join(f", {_axis_name(a)}={_size_code(before[a])}" for a in pre + post)
    out_lengths = "".join(
        f", {_axis_name(a)}={_size_code(weight_size)}"
        for a, weight_size in ((d.name, d.size) for d in weight.dims if d.name in outs)
    )
    if not post:
        _rearrange(writer, "x", writer.pattern(), f"{_group(pre)} {_group(run)}")
        writer.emit(f"x = F.linear(x, w)  # Share({weight.name}), Reduce({', '.join(run)})")
        flat = f"{_group(pre)} {_group(outs)}"
    else:
        _rearrange(writer, "x", writer.pattern(), f"{_group(pre)} {_group(run)} {_group(post)}")
        writer.emit(f"x = torch.matmul(w, x)  # Share({weight.name}), Reduce({', '.join(run)})")
        flat = f"{_group(pre)} {_group(outs)} {_group(post)}"
    unflat = pre + outs + post
    _rearrange(writer, "x", flat, writer.pattern(unflat), f"{lengths}{out_lengths}")
    writer.axes = unflat
    return True


def _emit_stage(
    writer: _Writer, block: list[Primitive], before: dict[str, Size], result: list[str], weight_index: dict[str, int]
) -> None:
    if _native_matmul(writer, block, before, weight_index):
        return
    shares = [step.weight for step in block if isinstance(step, Share)]
    reduces = [step for step in block if isinstance(step, Reduce)]
    operands = ["x"] + [f"weights[{weight_index[w.name]}]" for w in shares if isinstance(w, Weight)]
    patterns = [writer.pattern()] + [writer.pattern([d.name for d in w.dims]) for w in shares if isinstance(w, Weight)]
    comment = ", ".join(f"Share({w.name})" for w in shares if isinstance(w, Weight))
    if reduces:
        comment += (", " if comment else "") + "Reduce(" + ", ".join(r.dim for r in reduces) + ")"
    if shares:
        writer.emit(
            f'x = einsum({", ".join(operands)}, "{", ".join(patterns)} -> {writer.pattern(result)}")  # {comment}'
        )
    else:
        writer.emit(f'x = reduce(x, "{writer.pattern()} -> {writer.pattern(result)}", "sum")  # {comment}')
    sizes = {**before}
    for share in shares:
        if isinstance(share, Weight):
            sizes.update({d.name: d.size for d in share.dims})
    means = [r.dim for r in reduces if r.mean]
    if means:
        writer.emit(f"x = x / ({' * '.join(_size_code(sizes[m]) for m in means)})  # mean")
    writer.axes = result


def _class_name(name: str) -> str:
    parts = re.split(r"[^A-Za-z0-9]+", name)
    text = "".join(p[:1].upper() + p[1:] for p in parts if p) or "Operator"
    return text if text[0].isalpha() else "Op" + text


def source(op: Operator, layer: Mapping[str, int] | None = None, *, name: str = "KdslOperator") -> str:
    """Python source of an ``nn.Module`` computing ``op`` that runs without kdsl installed.

    The module's constructor takes every size variable; the plan (the order of contraction
    stages) is the one that is cheapest at ``layer`` (at a reference size if not given).
    """
    from kdsl import solve

    binding = solve.bind(op, layer) if layer is not None else None
    plan = solve.plan(op, binding)
    body = _forward_body(op, plan)
    variables = [v.name for v in op.variables]
    for variable in variables:
        if keyword.iskeyword(variable) or variable in ("self", "x", "weights"):
            raise LoweringError(f"the variable name {variable!r} cannot be a Python argument name")
    defaults = op.default_coefficients
    required = [v for v in variables if v not in defaults]
    optional = [v for v in variables if v in defaults]
    signature = ", ".join([f"{v}: int" for v in required] + [f"{v}: int = {defaults[v]}" for v in optional])
    weight_lines = []
    for weight in op.weights:
        shape = ", ".join(_size_code(d.size) for d in weight.dims)
        fan_in = " * ".join(_size_code(d.size) for d, new in zip(weight.dims, weight.new) if not new) or "1"
        weight_lines.append(f"        # {weight.name}[{', '.join(d.name for d in weight.dims)}], fan-in {fan_in}")
        weight_lines.append(f"        shapes.append(({shape},))")
        weight_lines.append(f"        fan_ins.append({fan_in})")
    unpack = ", ".join(variables)
    class_name = _class_name(name)
    text = [
        '"""Generated by kdsl from this operator:',
        "",
        *("    " + line if line else "" for line in op.to_dsl().rstrip().splitlines()),
        '"""',
        "",
        "import math",
        "",
        "import torch",
        "import torch.nn.functional as F",
        "from einops import einsum, rearrange, reduce",
        "from torch import nn",
        HELPERS,
        "",
        f"class {class_name}(nn.Module):",
        f"    def __init__(self, {signature}):",
        "        super().__init__()",
        f"        self.sizes = dict({', '.join(f'{v}={v}' for v in variables)})",
        "        shapes, fan_ins = [], []",
        *weight_lines,
        "        self.weights = nn.ParameterList(nn.Parameter(torch.empty(shape)) for shape in shapes)",
        "        self.fan_ins = fan_ins",
        "        self.reset_parameters()",
        "",
        "    def reset_parameters(self):",
        "        # like PyTorch's convolutions: uniform in +-1/sqrt(fan-in)",
        "        for weight, fan_in in zip(self.weights, self.fan_ins):",
        "            bound = 1.0 / math.sqrt(fan_in)",
        "            nn.init.uniform_(weight, -bound, bound)",
        "",
        "    def forward(self, x):",
        f"        {unpack}{',' if len(variables) == 1 else ''} = self.sizes.values()" if variables else "",
        *(
            f"        {d.name} = x.shape[{i}]  # may differ from construction (e.g. the batch)"
            for i, d in enumerate(op.inputs)
            if d.size.variable_name == d.name
            and all(d.name not in (e.name for e in w.dims) for w in op.weights)
            and not any(v.name == d.name for w in op.weights for e in w.dims for v in e.size.variables)
        ),
        "        weights = list(self.weights)",
        *("        " + line for line in body),
    ]
    return "\n".join(text) + "\n"


def build(op: Operator, layer: Mapping[str, int], *, name: str = "KdslOperator") -> Any:
    """A ``torch.nn.Module`` computing ``op`` at the sizes of ``layer`` (weights in ``.weights``)."""
    load_torch()
    from kdsl import solve

    binding = solve.bind(op, layer)
    code = source(op, binding, name=name)
    namespace: dict[str, Any] = {"__name__": f"kdsl_generated_{op.key}"}
    # The code is generated by kdsl from a validated operator (names are identifiers, sizes are
    # integers), never user text, so compiling it is safe.
    exec(compile(code, f"<kdsl {op.key}>", "exec"), namespace)
    module = namespace[_class_name(name)](**{v.name: binding[v.name] for v in op.variables})
    module.kdsl_source = code
    return module
