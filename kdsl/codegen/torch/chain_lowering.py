"""Lowering one linear chain: its views, one primitive rule each (:data:`RULES`), and one einsum per
contraction stage of its plan (:func:`kdsl.solve.plan`, Syno's rfactor), or a native op where the
stage is exactly one (:mod:`kdsl.codegen.torch.fast_paths`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction
from math import prod
from typing import Any

from kdsl.codegen.torch.fast_paths import STAGE_FAST_PATHS, StageViews, _native_im2col, _native_matmul
from kdsl.codegen.torch.identifiers import _Axes
from kdsl.codegen.torch.views import einsum_code, parse_pattern
from kdsl.codegen.torch.writer import _atom, _rolls, _shift, _Writer
from kdsl.lang.errors import LoweringError
from kdsl.lang.operator import Operator
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
            found = StageViews(views, block, sizes, weight_index, dict(plan.binding))
            if any(fast_path(writer, found) for fast_path in STAGE_FAST_PATHS):
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


def _slide(writer: _Writer, step: Slide) -> None:
    # Tensor.unfold(dim, K, s) is exactly a window without padding: (N - K) // s + 1 windows, the window last
    position = writer.axes.index(step.dim)
    data, window, stride = writer.data, writer.size(step.window), writer.size(step.stride)
    writer.emit(f"{writer.var} = {data}.unfold({position}, {window}, {stride})  # Slide({step.dim}) -> {step.name}")
    writer.axes = writer.axes + [step.name]


def _dilate(writer: _Writer, step: Dilate) -> None:
    # each element followed by s - 1 zeros: stack the data with zeros along a new axis after the dim, then
    # flatten the pair (autograd flows through the stack)
    position = writer.axes.index(step.dim)
    data = writer.data
    zeros = f"[torch.zeros_like({data})] * ({writer.size(step.factor)} - 1)"
    writer.emit(
        f"{writer.var} = torch.stack([{data}, *{zeros}], {position + 1}).flatten({position}, {position + 1})"
        f"  # Dilate({step.dim})"
    )


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
    "Slide": _slide,
    "Dilate": _dilate,
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
