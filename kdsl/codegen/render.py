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

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from html import escape

from kdsl import solve
from kdsl.lang.chain import Chain
from kdsl.lang.index import Var, walk_up
from kdsl.lang.nonlinear import FC, JOINS, UNARY, BlendJoin, Fold, Map, ProductJoin, Rename, Softmax
from kdsl.lang.operator import Node, Operator, chain_step_texts
from kdsl.lang.primitives import (
    Dim,
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


def _chain_iterators(plan: solve.Plan, reserved: set[str]) -> Callable[[str, Size], str]:
    """The loop variable of each dim of a chain (:func:`_iterator`), made unique: a lowered name
    that is also a weight's, a tensor's or an upper-case dim's takes a trailing ``_`` (``W`` with a
    weight ``w`` loops over ``w_``, so ``w_ + kw`` never reads as the weight)."""
    taken = reserved | {s.weight.name for s in plan.steps if isinstance(s, Share) and isinstance(s.weight, Weight)}
    taken |= {name for live in plan.live for name, size in dict(live).items() if _iterator(name, size) == name}
    chosen: dict[tuple[str, str], str] = {}

    def iterator(name: str, size: Size) -> str:
        key = (name, str(size))
        if key not in chosen:
            var = _iterator(name, size)
            if var != name:
                while var in taken:
                    var += "_"
                taken.add(var)
            chosen[key] = var
        return chosen[key]

    return iterator


def loop_nest(op: Operator, binding: Mapping[str, int] | None = None) -> str:
    """The operator's stage plan as loops over symbolic extents, one loop nest per stage.

    A branching kernel lists one block per node, headed by a comment that names the node, its
    step, the results it reads and the one it makes (see :func:`graph_loop_nest`)."""
    if not op.is_linear:
        return graph_loop_nest(op, binding)
    plan = solve.plan(op, binding)
    stage_names = [f"stage{number}" for number in range(len(plan.stages))]
    return "\n".join(_chain_lines(plan, "x", [d.name for d in op.inputs], stage_names, "out"))


def _chain_lines(
    plan: solve.Plan, source: str, source_dims: list[str], stage_names: list[str], target: str
) -> list[str]:
    """The loop nests of one linear chain's plan reading ``source`` (its dims in order): stage
    ``k`` writes ``stage_names[k]``, the result is ``target`` (an alias line when the last stage
    already is the result, unless the last stage is named ``target`` itself)."""
    sizes: list[dict[str, Size]] = [dict(live) for live in plan.live]  # before each step, then after
    iterator = _chain_iterators(plan, {source, target, *stage_names})
    lines: list[str] = []
    start = source
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
        coords = {name: iterator(name, size) for name, size in stage.result}
        coords |= {name: iterator(name, size) for name, size in reduced}
        up, guards = _walk_up(pending, {k: v for k, v in coords.items() if k not in new})
        read = f"{source}[{', '.join(up[d] for d in source_dims)}]"
        factors = [read] + [
            f"{w.name}[{', '.join(coords[d.name] for d in w.dims)}]" for w in shares if isinstance(w, Weight)
        ]
        name = stage_names[len([s for s in plan.stages if s.start < stage.start])]
        target_ref = f"{name}[{', '.join(coords[r] for r in result)}]"
        lines.append("for " + ", ".join(f"{coords[n]} < {s}" for n, s in stage.result) + ":")
        body = " * ".join(factors)
        note = f"    # 0 unless {' and '.join(guards)}" if guards else ""
        if reduced:
            lines.append(f"  {target_ref} = 0")
            lines.append("  for " + ", ".join(f"{coords[n]} < {s}" for n, s in reduced) + ":")
            lines.append(f"    {target_ref} += {body}{note}")
            means = [str(s) for (n, s), step in zip(reduced, [b for b in block if isinstance(b, Reduce)]) if step.mean]
            if means:
                lines.append(f"  {target_ref} /= {' * '.join(_wrap(m) for m in means)}")
        else:
            lines.append(f"  {target_ref} = {body}{note}")
        source, source_dims, pending = name, result, []
        index = stage.stop
    outputs = [d.name for d in plan.outputs]
    if pending or source_dims != outputs or source == start:
        coords = {name: iterator(name, sizes[-1][name]) for name in outputs}
        up, guards = _walk_up(pending, coords)
        note = f"    # 0 unless {' and '.join(guards)}" if guards else ""
        lines.append("for " + ", ".join(f"{coords[n]} < {sizes[-1][n]}" for n in outputs) + ":")
        result_ref = ", ".join(coords[n] for n in outputs)
        lines.append(f"  {target}[{result_ref}] = {source}[{', '.join(up[d] for d in source_dims)}]{note}")
    elif source != target:
        lines.append(f"{target} = {source}")
    return lines


# -- branching kernels ------------------------------------------------------------------------


def _iterators(dims: Sequence[Dim]) -> dict[str, str]:
    """Loop variables of a node's dims: lower case when the dim is named after its extent, as in
    :func:`loop_nest`; where that gives two dims one variable (``C`` and ``c``), the lowered one
    takes a trailing ``_`` (``c_``)."""
    chosen: dict[str, str] = {}
    taken = {d.name for d in dims if _iterator(d.name, d.size) == d.name}
    for d in dims:
        if d.name in chosen:  # the same dim in both arguments of a step
            continue
        var = _iterator(d.name, d.size)
        if var != d.name:
            while var in taken:
                var += "_"
            taken.add(var)
        chosen[d.name] = var
    return chosen


def _loops(dims: Sequence[Dim], coords: Mapping[str, str]) -> str:
    return "for " + ", ".join(f"{coords[d.name]} < {d.size}" for d in dims) + ":"


def _ref(name: str, dims: Sequence[Dim], coords: Mapping[str, str]) -> str:
    return f"{name}[{', '.join(coords[d.name] for d in dims)}]"


@dataclass(frozen=True)
class _NodeView:
    """What a node's loop-nest rule sees: the kernel, the node, the names of every result and the
    plans of the chains."""

    graph: Operator
    index: int
    names: tuple[str, ...]
    plans: Mapping[int, solve.Plan]

    @property
    def node(self) -> Node:
        return self.graph.nodes[self.index]

    @property
    def name(self) -> str:
        return self.names[self.index]

    def arg(self, position: int = 0) -> tuple[str, tuple[Dim, ...]]:
        """The name and dims of the node's argument ``position``."""
        index = self.node.args[position]
        return self.names[index], self.graph.nodes[index].dims


def _chain_nest(view: _NodeView) -> list[str]:
    chain = view.node.chain
    plan = view.plans[view.index]
    source, _ = view.arg()
    stage_names = [f"{view.name}_{number}" for number in range(len(plan.stages))]
    if plan.stages and plan.stages[-1].stop == len(plan.steps):
        last = plan.stages[-1]
        if [n for n, _ in last.result] == [d.name for d in plan.outputs]:
            stage_names[-1] = view.name  # the last stage writes the node's result
    return _chain_lines(plan, source, [d.name for d in chain.inputs], stage_names, view.name)


def _map_nest(view: _NodeView) -> list[str]:
    step = view.node.step
    assert isinstance(step, Map)
    source, dims = view.arg()
    coords = _iterators(view.node.dims)
    read = _ref(source, dims, coords)
    value = f"{step.by:g} * {read}" if step.fn == "scale" else f"-{read}" if step.fn == "neg" else f"{step.fn}({read})"
    return [_loops(view.node.dims, coords), f"  {_ref(view.name, view.node.dims, coords)} = {value}"]


def _summed(dims: Sequence[Dim], names: Collection[str], coords: Mapping[str, str]) -> tuple[list[Dim], str]:
    """The dims of ``dims`` named in ``names`` (a fold's or a softmax's), and the range text over them."""
    inner = [d for d in dims if d.name in names]
    return inner, ", ".join(f"{coords[d.name]} < {d.size}" for d in inner)


def _fold_nest(view: _NodeView) -> list[str]:
    step = view.node.step
    assert isinstance(step, Fold)
    source, dims = view.arg()
    coords = _iterators(dims)
    _, over = _summed(dims, step.dims, coords)
    note = ""
    if view.graph.padding_region(view.index):
        note = "    # a window's zero padding takes no part (0 where no element is data)"
    return [
        _loops(view.node.dims, coords),
        f"  {_ref(view.name, view.node.dims, coords)} = {step.how}({_ref(source, dims, coords)} for {over}){note}",
    ]


def _softmax_nest(view: _NodeView) -> list[str]:
    step = view.node.step
    assert isinstance(step, Softmax)
    source, dims = view.arg()
    coords = _iterators(dims)
    inner, over = _summed(dims, step.dims, coords)
    outer = [d for d in dims if d.name not in step.dims]
    total = f"s{view.index}"
    read = _ref(source, dims, coords)
    indent = "  " if outer else ""
    lines = [_loops(outer, coords)] if outer else []
    lines.append(f"{indent}{total} = sum(exp({read}) for {over})")
    lines.append(f"{indent}{_loops(inner, coords)}")
    lines.append(f"{indent}  {_ref(view.name, view.node.dims, coords)} = exp({read}) / {total}")
    return lines


def _fc_nest(view: _NodeView) -> list[str]:
    step = view.node.step
    assert isinstance(step, FC) and isinstance(step.weight, Weight)
    source, dims = view.arg()
    coords = _iterators([*dims, *view.node.dims])
    folded = [d for d in dims if d.name in step.dims]
    target = _ref(view.name, view.node.dims, coords)
    return [
        _loops(view.node.dims, coords),
        f"  {target} = 0",
        f"  {_loops(folded, coords)}",
        f"    {target} += {_ref(source, dims, coords)} * {_ref(step.weight.name or 'w', step.weight.dims, coords)}",
    ]


def _rename_nest(view: _NodeView) -> list[str]:
    step = view.node.step
    assert isinstance(step, Rename)
    source, _ = view.arg()
    return [f"{view.name} = {source}    # the same data; the dim {step.dim} is called {step.name} from here on"]


_BLEND_TEXT = {"add": "{} + {}", "sub": "{} - {}", "mul": "{} * {}", "min": "min({}, {})", "max": "max({}, {})"}


def _blend_nest(view: _NodeView) -> list[str]:
    step = view.node.step
    assert isinstance(step, BlendJoin)
    (lhs, lhs_dims), (rhs, rhs_dims) = view.arg(0), view.arg(1)
    coords = _iterators(view.node.dims)
    value = _BLEND_TEXT[step.how].format(_ref(lhs, lhs_dims, coords), _ref(rhs, rhs_dims, coords))
    return [_loops(view.node.dims, coords), f"  {_ref(view.name, view.node.dims, coords)} = {value}"]


def _product_nest(view: _NodeView) -> list[str]:
    step = view.node.step
    assert isinstance(step, ProductJoin)
    (lhs, lhs_dims), (rhs, rhs_dims) = view.arg(0), view.arg(1)
    union = {d.name: d for d in (*lhs_dims, *rhs_dims)}
    coords = _iterators(list(union.values()))
    reduced = [union[name] for name in step.reduce]
    target = _ref(view.name, view.node.dims, coords)
    body = f"{_ref(lhs, lhs_dims, coords)} * {_ref(rhs, rhs_dims, coords)}"
    return [
        _loops(view.node.dims, coords),
        f"  {target} = 0",
        f"  {_loops(reduced, coords)}",
        f"    {target} += {body}",
    ]


#: one loop-nest rule per node kind of a branching kernel (the input has no loops)
LOOP_NEST_RULES: dict[str, Callable[[_NodeView], list[str]]] = {
    "Chain": _chain_nest,
    "Map": _map_nest,
    "Fold": _fold_nest,
    "Softmax": _softmax_nest,
    "FC": _fc_nest,
    "Rename": _rename_nest,
    "Blend": _blend_nest,
    "Product": _product_nest,
}
assert set(LOOP_NEST_RULES) == {"Chain", *UNARY, *JOINS}


def _result_names(graph: Operator) -> tuple[str, ...]:
    """``x`` for the input, ``t1``, ``t2``, ... for the nodes, and ``out`` for the last one when
    its dims are already in the output's order."""
    names = ["x"] + [f"t{index}" for index in range(1, len(graph.nodes))]
    for index in graph.input_nodes if len(graph.input_nodes) > 1 else ():  # several inputs: by name
        names[index] = str(graph.nodes[index].name)
    if [d.name for d in graph.nodes[-1].dims] == [d.name for d in graph.outputs] and graph.nodes[-1].kind != "Rename":
        names[-1] = "out"
    return tuple(names)


def graph_loop_nest(graph: Operator, binding: Mapping[str, int] | None = None) -> str:
    """A branching kernel as loop nests, one block per node: a chain's stage plan (at ``binding``,
    else the reference point), then Canvas's steps; joins read both branches by dim name.

    >>> from kdsl.lang import *
    >>> N, C, L = primary("N C L")
    >>> x = Input(N, C, L)
    >>> print(graph_loop_nest((x + (x >> Map("relu"))) >> Output(N, C, L)))
    # node 1  Map(relu)  x -> t1[N, C, L]
    for n < N, c < C, l < L:
      t1[n, c, l] = relu(x[n, c, l])
    # node 2  Blend(add)  x, t1 -> out[N, C, L]
    for n < N, c < C, l < L:
      out[n, c, l] = x[n, c, l] + t1[n, c, l]
    """
    names = _result_names(graph)
    plans = solve.chain_plans(graph, binding)
    lines: list[str] = []
    if len(graph.input_nodes) > 1:
        inputs = (f"{names[i]}[{', '.join(d.name for d in graph.nodes[i].dims)}]" for i in graph.input_nodes)
        lines.append(f"# inputs {', '.join(inputs)}")
    for index, node in enumerate(graph.nodes):
        if node.step is None:
            continue
        reads = ", ".join(names[arg] for arg in node.args)
        dims = ", ".join(d.name for d in node.dims)
        lines.append(f"# node {index}  {node.describe()}  {reads} -> {names[index]}[{dims}]")
        lines.extend(LOOP_NEST_RULES[node.kind](_NodeView(graph, index, names, plans)))
    if names[-1] != "out" and [d.name for d in graph.nodes[-1].dims] == [d.name for d in graph.outputs]:
        lines.append(f"out = {names[-1]}")
    elif names[-1] != "out":
        last = graph.nodes[-1]
        coords = _iterators(last.dims)
        lines.append(f"# the output [{', '.join(d.name for d in graph.outputs)}]")
        lines.append(_loops(graph.outputs, coords))
        lines.append(f"  {_ref('out', graph.outputs, coords)} = {_ref(names[-1], last.dims, coords)}")
    return "\n".join(lines)


# -- SVG --------------------------------------------------------------------------------------

_ROW, _COLUMN, _MARGIN = 64, 120, 30

#: box colours (fill, stroke), so drawings of different operators look different at a glance:
#: windows and moves blue, reshapes violet, weights orange, reductions green, input/output grey
_BOX_COLOURS = {
    "end": ("#eef0f4", "#6b7385"),
    "window": ("#e3edfc", "#3a5a9a"),
    "reshape": ("#efe6fb", "#6a45a8"),
    "weight": ("#fdebd9", "#b8621b"),
    "reduce": ("#e2f4e5", "#2f7d3e"),
}


def _box_kind(step: Primitive) -> str:
    """The colour of a step's box: by what it does to the dims (a window creates one beside its
    dim, a move keeps one dim; reshapes change how many there are)."""
    if isinstance(step, Share):
        return "weight"
    if isinstance(step, Reduce):
        return "reduce"
    if hasattr(step, "window") or len(step.consumes) == len(step.produces) == 1:
        return "window"
    return "reshape"


def svg(op: Operator) -> str:
    """An SVG drawing of the primitive graph: each dim is a vertical lane from the primitive that
    makes it to the one that consumes it; each primitive is a box across its lanes. A branching
    kernel is drawn node by node (:func:`graph_svg`)."""
    if not op.is_linear:
        return graph_svg(op)
    column: dict[str, int] = {}
    free: list[int] = []
    next_column = 0
    lanes: list[tuple[int, int, int, str]] = []  # (column, top row, bottom row, label)
    started: dict[str, tuple[int, str]] = {}
    boxes: list[tuple[int, int, int, str, str]] = []  # (row, first column, last column, label, colour)

    def open_lane(name: str, row: int, size: Size) -> None:
        nonlocal next_column
        if free:
            col = free.pop(0)
        else:
            col, next_column = next_column, next_column + 1
        column[name] = col
        started[name] = (row, name if str(size) == name else f"{name}: {size}")  # "H", "kh: K"

    def close_lane(name: str, row: int) -> None:
        top, label = started.pop(name)
        lanes.append((column[name], top, row, label))
        free.append(column.pop(name))
        free.sort()

    for d in op.inputs:
        open_lane(d.name, 0, d.size)
    boxes.append((0, 0, max(0, len(op.inputs) - 1), "input x", "end"))
    for row, step in enumerate(op.steps, start=1):
        consumed = list(step.consumes)
        cols = [column[n] for n in consumed]
        for name in consumed:
            close_lane(name, row)
        for name in step.produces:
            open_lane(name, row, op.live[row][name])  # the live dims after this step
            cols.append(column[name])
        # the label names the dims it acts on (Unfold(H, K)); a Share shows its weight's shape
        label = step.describe()
        if isinstance(step, Share) and isinstance(step.weight, Weight):
            label = f"Share {step.weight.name}[{', '.join(str(d.size) for d in step.weight.dims)}]"
        elif isinstance(step, Reduce) and step.mean:
            label = label[:-1] + ", mean)"
        cols = cols or [0]
        boxes.append((row, min(cols), max(cols), label, _box_kind(step)))
    last = len(op.steps) + 1
    for d in op.outputs:
        close_lane(d.name, last)
    boxes.append((last, 0, max(0, next_column - 1), "output [" + ", ".join(d.name for d in op.outputs) + "]", "end"))
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
    for row, first, last_col, label, kind in boxes:
        left = x_of(first) - _COLUMN // 2 + 8
        right = x_of(last_col) + _COLUMN // 2 - 8
        fill, stroke = _BOX_COLOURS[kind]
        parts.append(
            f'<rect x="{left}" y="{y_of(row) - 12}" width="{right - left}" height="24" rx="6" '
            f'fill="{fill}" stroke="{stroke}"/>'
        )
        # a label wider than its box is squeezed into it rather than drawn over the next lane
        fit = (
            f' textLength="{right - left - 8}" lengthAdjust="spacingAndGlyphs"'
            if len(label) * 6.7 > right - left - 8
            else ""
        )
        parts.append(
            f'<text x="{(left + right) // 2}" y="{y_of(row) + 4}" text-anchor="middle"{fit}>{escape(label)}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


# -- SVG of a branching kernel ----------------------------------------------------------------

_CHAR, _LINE, _PAD, _GAP_X, _GAP_Y, _LANE = 7, 15, 8, 28, 44, 6


def _node_lines(graph: Operator, index: int) -> list[str]:
    """The text of a node's box: what it is, a chain's steps one per line, its result's dims."""
    node = graph.nodes[index]
    dims = "[" + ", ".join(f"{d.name}: {d.size}" for d in node.dims) + "]"
    if node.step is None:
        return [f"input {node.name or 'x'}", dims]
    if isinstance(node.step, Chain):
        steps = chain_step_texts(node.step)
        return [f"{index}: chain", *(f"  {step}" for step in steps), dims]
    role = " (join)" if node.kind in JOINS else ""
    return [f"{index}: {node.describe()}{role}", dims]


def graph_svg(graph: Operator) -> str:
    """An SVG drawing of a branching kernel: each node a box (its step, a chain's steps, its
    result's dims), placed in rows by depth, with an arrow from each argument; a join's two
    arrows are marked ``lhs`` and ``rhs``, and the output box shows the declared order. An arrow
    that skips rows runs through a lane of its own in each row it crosses (a layered drawing).

    >>> from kdsl.lang import *
    >>> N, C, L = primary("N C L")
    >>> x = Input(N, C, L)
    >>> picture = graph_svg((x + (x >> Map("relu"))) >> Output(N, C, L))
    >>> picture.count("<rect"), "2: Blend(add) (join)" in picture, ">rhs<" in picture
    (5, True, True)
    """
    layout = _layout(graph)
    width, height = layout.width, layout.height
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="monospace" font-size="11">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    parts += _arrows(layout)
    parts += _boxes(graph, layout)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


@dataclass
class _GraphLayout:
    """Where :func:`graph_svg` draws each item: the nodes, the output box, then the lanes arrows run
    through (``depth`` is an item's row; ``left`` its x; ``tops``/``bottoms`` a row's y range)."""

    texts: list[list[str]]
    depth: list[int]
    widths: list[int]
    heights: list[int]
    edges: list[tuple[list[int], int, int]]  # (items along the arrow, position, arguments)
    left: dict[int, int]
    tops: list[int]
    bottoms: list[int]
    width: int
    height: int


def _layout(graph: Operator) -> _GraphLayout:
    """Rows by depth; an arrow over several rows passes through a lane in each row it crosses."""
    count = len(graph.nodes)
    texts = [_node_lines(graph, index) for index in range(count)]
    texts.append(["output [" + ", ".join(f"{d.name}: {d.size}" for d in graph.outputs) + "]"])
    args: list[tuple[int, ...]] = [node.args for node in graph.nodes] + [(count - 1,)]
    depth: list[int] = []
    for index in range(count + 1):
        depth.append(1 + max((depth[a] for a in args[index]), default=-1))
    widths = [_PAD * 2 + _CHAR * max(len(line) for line in lines) for lines in texts]
    heights = [_PAD + _LINE * len(lines) for lines in texts]
    # an arrow over several rows passes through a lane (an item of width _LANE, no box) in each
    edges: list[tuple[list[int], int, int]] = []
    for target in range(count + 1):
        for position, source in enumerate(args[target]):
            path = [source]
            for row in range(depth[source] + 1, depth[target]):
                lane = len(depth)
                depth.append(row)
                widths.append(_LANE)
                heights.append(0)
                args.append((path[-1],))
                path.append(lane)
            edges.append(([*path, target], position, len(args[target])))
    rows: list[list[int]] = [[] for _ in range(max(depth) + 1)]
    centre: dict[int, float] = {}
    for row, members in enumerate(rows):
        members.extend(i for i in range(len(depth)) if depth[i] == row)
        # below the first row, an item sits near its arguments (fewer crossing arrows)
        if row:
            members.sort(key=lambda i: (sum(centre[a] for a in args[i]) / len(args[i]), i))
        x = 0.0
        for i in members:
            centre[i] = x + widths[i] / 2
            x += widths[i] + _GAP_X
    row_width = [sum(widths[i] for i in members) + _GAP_X * (len(members) - 1) for members in rows]
    width = int(max(row_width)) + 2 * _MARGIN
    tops: list[int] = []
    bottoms: list[int] = []
    y = _MARGIN
    for members in rows:
        tops.append(y)
        y += max(heights[i] for i in members)
        bottoms.append(y)
        y += _GAP_Y
    height = y - _GAP_Y + _MARGIN
    left: dict[int, int] = {}
    for row, members in enumerate(rows):
        shift = (width - 2 * _MARGIN - row_width[row]) / 2 + _MARGIN
        for i in members:
            left[i] = int(centre[i] - widths[i] / 2 + shift)
    return _GraphLayout(texts, depth, widths, heights, edges, left, tops, bottoms, width, height)


def _curve(x1: int, y1: int, x2: int, y2: int) -> str:
    bend = (y2 - y1) // 2
    return f" C{x1},{y1 + bend} {x2},{y2 - bend} {x2},{y2}"


def _arrows(layout: _GraphLayout) -> list[str]:
    """Each argument's arrow, through its lanes; a join's two marked ``lhs`` and ``rhs``."""
    left, widths, heights, depth, tops, bottoms = (
        layout.left,
        layout.widths,
        layout.heights,
        layout.depth,
        layout.tops,
        layout.bottoms,
    )
    parts = []
    for path, position, arity in layout.edges:
        source, target = path[0], path[-1]
        x, y = left[source] + widths[source] // 2, tops[depth[source]] + heights[source]
        d = f"M{x},{y}"
        for lane in path[1:-1]:
            lane_x = left[lane] + _LANE // 2
            d += _curve(x, y, lane_x, tops[depth[lane]]) + f" L{lane_x},{bottoms[depth[lane]]}"
            x, y = lane_x, bottoms[depth[lane]]
        x2 = left[target] + int(widths[target] * (position + 1) / (arity + 1))
        y2 = tops[depth[target]]
        d += _curve(x, y, x2, y2)
        parts.append(f'<path d="{d}" fill="none" stroke="#555" marker-end="url(#arrow)"/>')
        if arity == 2:
            parts.append(f'<text x="{x2 + 3}" y="{y2 - 4}" fill="#a33">{("lhs", "rhs")[position]}</text>')
    return parts


def _boxes(graph: Operator, layout: _GraphLayout) -> list[str]:
    """Each node's box and lines, then the output's (joins in another colour)."""
    count = len(graph.nodes)
    parts = []
    for index in range(count + 1):
        fill = "#fdf1e6" if index < count and graph.nodes[index].kind in JOINS else "#eef3fb"
        x, y = layout.left[index], layout.tops[layout.depth[index]]
        parts.append(
            f'<rect x="{x}" y="{y}" width="{layout.widths[index]}" height="{layout.heights[index]}" rx="6" '
            f'fill="{fill}" stroke="#3a5a9a"/>'
        )
        texts = layout.texts[index]
        for number, line in enumerate(texts):
            colour = ' fill="#225"' if number == len(texts) - 1 and index < count else ""
            parts.append(
                f'<text x="{x + _PAD}" y="{y + _PAD + _LINE * number + 9}" xml:space="preserve"{colour}>'
                f"{escape(line)}</text>"
            )
    return parts
