"""Renderers: a Halide-like loop-nest listing and an SVG picture of an operator's primitive graph.

>>> from kdsl.lang import *
>>> N, C, L = primary("N C L"); K = coefficient("K")
>>> op = Input(N, C, L) >> Unfold(L, K, "k") >> Share(Weight(C, "k", name="w")) >> Reduce("k") >> Output(N, C, L)
>>> print(loop_nest(op))
for n < N, c < C, l < L:
  stage0[n, c, l] = 0
  for k < K:
    stage0[n, c, l] += x[n, c, l + k - K//2] * w[c, k]    # 0 unless 0 <= l + k - K//2 < L
out = stage0
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

from kdsl import solve
from kdsl.lang.build import Operator
from kdsl.lang.index import Var, walk_up
from kdsl.lang.primitives import (
    Primitive,
    Reduce,
    Share,
    Weight,
)
from kdsl.lang.sizes import Size


def _wrap(text: str) -> str:
    return f"({text})" if any(c in text for c in " +-") else text


def _walk_up(
    views: list[tuple[Primitive, Mapping[str, Size]]], coords: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The bottom-up coordinate of every source dim, as text: the primitives' own coordinate rules
    (:mod:`kdsl.lang.index`), the same ones the TVM backend lowers."""
    up, guards = walk_up(views, {name: Var(text) for name, text in coords.items()})
    return {name: str(expr) for name, expr in up.items()}, [str(g) for g in guards]


def _iterator(name: str, size: Size) -> str:
    """The loop variable of a dim: lower case when the dim is named after its extent (H -> h)."""
    return name.lower() if str(size) == name else name


def loop_nest(op: Operator, binding: Mapping[str, int] | None = None) -> str:
    """The operator's stage plan as loops over symbolic extents, one loop nest per stage."""
    plan = solve.plan(op, binding)
    sizes: list[dict[str, Size]] = [dict(live) for live in plan.live]  # before each step, then after
    lines: list[str] = []
    source, source_dims = "x", [d.name for d in op.inputs]
    pending: list[tuple[Primitive, dict[str, Size]]] = []
    starts = {stage.start: stage for stage in plan.stages}
    index = 0
    while index < len(plan.steps):
        stage = starts.get(index)
        if stage is None:
            pending.append((plan.steps[index], sizes[index]))
            index += 1
            continue
        block = plan.steps[stage.start : stage.stop]
        result = [name for name, _ in stage.result]
        reduced = [(s.dim, sizes[i][s.dim]) for i, s in enumerate(block, stage.start) if isinstance(s, Reduce)]
        shares = [s.weight for s in block if isinstance(s, Share)]
        new = {d.name for w in shares if isinstance(w, Weight) for d, n in zip(w.dims, w.new) if n}
        coords = {name: _iterator(name, size) for name, size in stage.result}
        coords |= {name: _iterator(name, size) for name, size in reduced}
        up, guards = _walk_up(pending, {k: v for k, v in coords.items() if k not in new})
        read = f"{source}[{', '.join(up[d] for d in source_dims)}]"
        factors = [read] + [
            f"{w.name}[{', '.join(coords[d.name] for d in w.dims)}]" for w in shares if isinstance(w, Weight)
        ]
        name = f"stage{len([s for s in plan.stages if s.start < stage.start])}"
        target = f"{name}[{', '.join(coords[r] for r in result)}]"
        lines.append("for " + ", ".join(f"{coords[n]} < {s}" for n, s in stage.result) + ":")
        body = " * ".join(factors)
        note = f"    # 0 unless {' and '.join(guards)}" if guards else ""
        if reduced:
            lines.append(f"  {target} = 0")
            lines.append("  for " + ", ".join(f"{coords[n]} < {s}" for n, s in reduced) + ":")
            lines.append(f"    {target} += {body}{note}")
            means = [str(s) for (n, s), step in zip(reduced, [b for b in block if isinstance(b, Reduce)]) if step.mean]
            if means:
                lines.append(f"  {target} /= {' * '.join(_wrap(m) for m in means)}")
        else:
            lines.append(f"  {target} = {body}{note}")
        source, source_dims, pending = name, result, []
        index = stage.stop
    outputs = [d.name for d in plan.outputs]
    if pending or source_dims != outputs or source == "x":
        coords = {name: _iterator(name, sizes[-1][name]) for name in outputs}
        up, guards = _walk_up(pending, coords)
        note = f"    # 0 unless {' and '.join(guards)}" if guards else ""
        lines.append("for " + ", ".join(f"{coords[n]} < {sizes[-1][n]}" for n in outputs) + ":")
        target = ", ".join(coords[n] for n in outputs)
        lines.append(f"  out[{target}] = {source}[{', '.join(up[d] for d in source_dims)}]{note}")
    else:
        lines.append(f"out = {source}")
    return "\n".join(lines)


# -- SVG --------------------------------------------------------------------------------------

_ROW, _COLUMN, _MARGIN = 64, 120, 30


def svg(op: Operator) -> str:
    """An SVG drawing of the primitive graph: each dim is a vertical lane from the primitive that
    makes it to the one that consumes it; each primitive is a box across its lanes."""
    column: dict[str, int] = {}
    free: list[int] = []
    next_column = 0
    lanes: list[tuple[int, int, int, str]] = []  # (column, top row, bottom row, label)
    started: dict[str, tuple[int, str]] = {}
    boxes: list[tuple[int, int, int, str]] = []  # (row, first column, last column, label)

    def open_lane(name: str, row: int, size: Size) -> None:
        nonlocal next_column
        if free:
            col = free.pop(0)
        else:
            col, next_column = next_column, next_column + 1
        column[name] = col
        started[name] = (row, f"{name}: {size}")

    def close_lane(name: str, row: int) -> None:
        top, label = started.pop(name)
        lanes.append((column[name], top, row, label))
        free.append(column.pop(name))
        free.sort()

    for d in op.inputs:
        open_lane(d.name, 0, d.size)
    boxes.append((0, 0, max(0, len(op.inputs) - 1), "input x"))
    for row, step in enumerate(op.steps, start=1):
        consumed = list(step.consumes)
        cols = [column[n] for n in consumed]
        for name in consumed:
            close_lane(name, row)
        for name in step.produces:
            open_lane(name, row, op.live[row][name])  # the live dims after this step
            cols.append(column[name])
        label = type(step).__name__
        if isinstance(step, Share) and isinstance(step.weight, Weight):
            label += f" {step.weight.name}[{', '.join(str(d.size) for d in step.weight.dims)}]"
        elif isinstance(step, Reduce) and step.mean:
            label += " (mean)"
        cols = cols or [0]
        boxes.append((row, min(cols), max(cols), label))
    last = len(op.steps) + 1
    for d in op.outputs:
        close_lane(d.name, last)
    boxes.append((last, 0, max(0, next_column - 1), "output [" + ", ".join(d.name for d in op.outputs) + "]"))
    width = _MARGIN * 2 + max(next_column, 1) * _COLUMN
    height = _MARGIN * 2 + (last + 1) * _ROW
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="monospace" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]

    def x_of(col: int) -> int:
        return _MARGIN + col * _COLUMN + _COLUMN // 2

    def y_of(row: int) -> int:
        return _MARGIN + row * _ROW + _ROW // 2

    for col, top, bottom, label in lanes:
        parts.append(f'<line x1="{x_of(col)}" y1="{y_of(top)}" x2="{x_of(col)}" y2="{y_of(bottom)}" stroke="#555"/>')
        parts.append(f'<text x="{x_of(col) + 4}" y="{y_of(top) + 26}" fill="#225">{escape(label)}</text>')
    for row, first, last_col, label in boxes:
        left = x_of(first) - _COLUMN // 2 + 8
        right = x_of(last_col) + _COLUMN // 2 - 8
        parts.append(
            f'<rect x="{left}" y="{y_of(row) - 12}" width="{right - left}" height="24" rx="6" '
            f'fill="#eef3fb" stroke="#3a5a9a"/>'
        )
        parts.append(f'<text x="{(left + right) // 2}" y="{y_of(row) + 4}" text-anchor="middle">{escape(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
