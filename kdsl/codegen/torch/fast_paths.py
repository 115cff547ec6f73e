"""Native fast paths of the PyTorch backend: a stage (with the views before it) that is exactly one of
PyTorch's functions is lowered to it (``F.conv{1,2,3}d`` of any kind, ``F.avg_pool{1,2,3}d`` over tiles
or strided windows, a matrix product, ``F.unfold``), found from the operator's structure, never its
name: :data:`STAGE_FAST_PATHS` lists those of a stage with its views, :data:`CONV_VIEW_RULES` the views
a convolution's input may go through. Each emitter returns False, emitting nothing, when its pattern does not match;
:mod:`kdsl.codegen.torch.chain_lowering` then writes the views and one einsum."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kdsl.codegen.torch.writer import _atom, _rearrange, _rolls, _weight_lengths, _Writer
from kdsl.lang.primitives import Merge, Primitive, Reduce, Share, Shift, Slide, Split, Stride, Unfold, Weight
from kdsl.lang.sizes import Size


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


@dataclass
class _ConvViews:
    """The views before a stage read as a convolution's: a window per spatial dim (with its stride,
    dilation and offset), the Splits of data dims (groups), the rolls of the input."""

    sizes: dict[str, Size]  # the live dims before the views
    spatial: dict[str, _Spatial] = field(default_factory=dict)  # sliding dim -> its window
    splits: dict[str, Split] = field(default_factory=dict)
    by_window: dict[str, _Spatial] = field(default_factory=dict)  # window dim -> its sliding dim's entry
    rolls: list[Shift] = field(default_factory=list)

    def untouched(self, dim: str) -> bool:
        """Whether ``dim`` is a dim of the data that no view before unfolded or split."""
        return dim in self.sizes and dim not in self.spatial and dim not in self.splits


def _sliding_window(found: _ConvViews, step: Unfold) -> bool:
    if not found.untouched(step.dim):
        return False
    entry = _Spatial(step.dim, step.name, step.window)
    found.spatial[step.dim] = entry
    found.by_window[step.name] = entry
    return True


def _group_split(found: _ConvViews, step: Split) -> bool:
    if not found.untouched(step.dim):
        return False
    found.splits[step.dim] = step
    return True


def _stride_or_dilation(found: _ConvViews, step: Stride) -> bool:
    slide, window = found.spatial.get(step.dim), found.by_window.get(step.dim)
    if slide is not None and slide.stride is None:
        slide.stride = step.stride  # every S-th position: a strided convolution
    elif window is not None and window.dilation is None:
        window.dilation, window.taps = step.stride, window.size / step.stride  # every S-th tap: a dilated one
    else:
        return False
    return True


def _roll_or_offset(found: _ConvViews, step: Shift) -> bool:
    window = found.by_window.get(step.dim)
    if found.untouched(step.dim):
        found.rolls.append(step)  # a cyclic shift of the input before it is unfolded: a roll
    elif window is not None and window.dilation is None and not window.offset and step.offset >= 0:
        window.offset = step.offset  # a shifted window (before any dilation): less padding before
    else:
        return False
    return True


#: How a convolution's input may be viewed, one rule per primitive kind: an Unfold of a data dim
#: slides a window along it, a Split of one makes groups, a Stride of the sliding dim strides and one
#: of the window dilates, a Shift of the input rolls it and one of the window offsets it. A rule takes
#: the view (True) or declines (False); a view of another kind, or one its rule declines, is no
#: convolution's.
CONV_VIEW_RULES: dict[str, Callable[[_ConvViews, Any], bool]] = {
    "Unfold": _sliding_window,
    "Split": _group_split,
    "Stride": _stride_or_dilation,
    "Shift": _roll_or_offset,
}


def _read_conv_views(views: list[Primitive], sizes: dict[str, Size]) -> _ConvViews | None:
    """The views read by :data:`CONV_VIEW_RULES`, or None where one is not a convolution's."""
    found = _ConvViews(sizes)
    for step in views:
        rule = CONV_VIEW_RULES.get(step.kind)
        if rule is None or not rule(found, step):
            return None
    return found


@dataclass(frozen=True)
class StageViews:
    """A contraction stage of a chain's plan with the views before it, as a fast path reads them."""

    views: list[Primitive]  # the views before the stage
    block: list[Primitive]  # the stage: its Shares and Reduces
    sizes: dict[str, Size]  # the live dims before the views
    weight_index: dict[str, int]  # weight name -> the position of its code in ``writer.weights``
    binding: Mapping[str, int]


def _native_conv(writer: _Writer, stage: StageViews) -> bool:
    """Emit ``F.conv{1,2,3}d`` for views + stage when they are exactly a (grouped, strided,
    dilated) convolution; return False (emitting nothing) otherwise."""
    shares = [step for step in stage.block if isinstance(step, Share)]
    reduces = [step for step in stage.block if isinstance(step, Reduce)]
    if len(shares) != 1 or any(r.mean for r in reduces):
        return False
    weight = shares[0].weight
    assert isinstance(weight, Weight)
    sizes = stage.sizes
    found = _read_conv_views(stage.views, sizes)
    if found is None:
        return False
    spatial, splits, rolls = found.spatial, found.splits, found.rolls
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
            if entry.offset >= entry.dilation.evaluate(stage.binding):
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
    return _emit_conv(writer, splits, spatial, order, batch, groups, channels, outs, weight, known, stage.weight_index)


def _pool_windows(views: list[Primitive]) -> dict[str, tuple[str, Size, Size, str]] | None:
    """The windows of a pooling's views: pooled dim -> (its window dim, kernel, stride, the pooled
    dim's name after them); a Split makes tiles (stride = kernel), a Slide windows without padding
    with a stride of their own (PyTorch's floor). None where a view is neither, or two touch one dim."""
    windows: dict[str, tuple[str, Size, Size, str]] = {}
    for step in views:
        if isinstance(step, Split):
            window = (step.inner, step.block, step.block, step.outer)
        elif isinstance(step, Slide):
            window = (step.name, step.window, step.stride, step.dim)
        else:
            return None
        if step.dim in windows:
            return None
        windows[step.dim] = window
    return windows


def _native_pool(writer: _Writer, stage: StageViews) -> bool:
    """Emit ``F.avg_pool{1,2,3}d`` when the views split dims into (outer, tile) or slide windows
    along them (Slide) and the stage takes the mean over the tiles or windows; return False
    (emitting nothing) otherwise."""
    views, block, sizes = stage.views, stage.block, stage.sizes
    if any(not isinstance(step, Reduce) or not step.mean for step in block):
        return False
    windows = _pool_windows(views)
    if windows is None or not 1 <= len(windows) <= 3:
        return False
    reduced = {step.dim for step in block}
    if reduced != {window for window, *_ in windows.values()} or any(dim not in writer.axes for dim in windows):
        return False
    pooled = [axis for axis in writer.axes if axis in windows]
    slides = any(isinstance(step, Slide) for step in views)
    if slides:
        # the plan takes a mean over separable windows one dim at a time: the dims around the pooled
        # one, from the third on, join it with 1-wide windows, so the data goes in as it lies
        start = min(writer.axes.index(pooled[0]), 2)
        if start and len(writer.axes) - start <= 3:
            pooled = writer.axes[start:]
    others = [axis for axis in writer.axes if axis not in pooled]
    one = Size.of(1)
    kernel = ", ".join(writer.size(windows[a][1] if a in windows else one) for a in pooled)
    unflat = others + [windows[a][3] if a in windows else a for a in pooled]
    # F.avg_pool{d}d pools the last d dims of a tensor with one or two more in front: where the
    # data is laid out so, it takes the data as it is, else as (others flattened, pooled dims)
    direct = writer.axes[len(others) :] == pooled and 1 <= len(others) <= 2
    if not direct:
        # a previous pooling's output may still lie as its (others, pooled) groups: lay it out first
        writer.flush()
        pooled_pattern = " ".join(writer.axis(a) for a in pooled)
        writer.move(writer.pattern(), f"{writer.group(others)} {pooled_pattern}", comment=", as a pooling input")
    arguments = f"({kernel},)"
    if slides:  # a stride of the windows' own (a Split's tiles stride by their kernel, the default)
        arguments += ", (" + ", ".join(writer.size(windows[a][2] if a in windows else one) for a in pooled) + ",)"
    writer.emit(
        f"{writer.var} = F.avg_pool{len(pooled)}d({writer.data}, {arguments})  # mean over {', '.join(sorted(reduced))}"
    )
    writer.axes = unflat
    if not direct:
        outs = " ".join(writer.axis(name) for name in unflat[len(others) :])
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


#: The native ops a contraction stage with the views before it may be, tried in order: each emits
#: its op and returns True, or declines with False, emitting nothing (then the views are written one
#: by one and the stage is one einsum, or :func:`_native_matmul`). A chain that is exactly
#: ``F.unfold`` is :func:`_native_im2col`, tried before its stages.
STAGE_FAST_PATHS: tuple[Callable[[_Writer, StageViews], bool], ...] = (_native_conv, _native_pool)
