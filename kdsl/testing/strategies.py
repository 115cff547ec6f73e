"""Hypothesis strategies that draw valid kdsl operators and concrete sizes for them.

Use them to property-test your own backend against kdsl's reference interpreter:

>>> from hypothesis import given
>>> from kdsl.testing import strategies as kst
>>> @given(kst.operators_with_layers())
... def test_my_backend(op_and_layer):
...     op, layer = op_and_layer
...     assert all(layer[v] >= 1 for v in op.primary_variables)
>>> test_my_backend()

Operators are built step by step from random primitives over a small vocabulary of variables
(primary ``N C H W``, weight-only primary ``E V``, coefficients ``K s G``); a step that the
language rejects is skipped, so every drawn operator is valid. A ``Share``'s weight may bring up to
three new dims of its own (as search's weights do: ``Weight(Dim("a", C), "d", C)``), of any size
in the vocabulary. No variable is named like something a backend's generated code uses (``F``).
:func:`layers` binds every variable so that every size in the operator is a positive integer and
no intermediate tensor gets large.

:func:`graphs` draws branching kernels (:class:`kdsl.lang.Operator`) the same way, through the public
API: linear chains drawn like the operators' steps, Canvas's Map, Fold, Softmax, FC and Rename, and
branches joined by Blend (every kind, either branch broadcast) and Product;
:func:`graphs_with_layers` gives one with a binding (``layers`` binds a kernel too).
:func:`canvas_kernels` draws them from search's own sampler instead (Canvas's micro-DAG sampler,
:mod:`kdsl.search.canvas`): the kernels search proposes, free widths filled for a small layer.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache
from math import lcm, prod
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from kdsl.lang.branches import Blend, Product, Tensor
from kdsl.lang.build import Builder, Input, Output
from kdsl.lang.chain import Chain
from kdsl.lang.errors import KdslError
from kdsl.lang.nonlinear import BLEND_KINDS, FC, FOLD_KINDS, MAP_FUNCTIONS, Fold, Map, Rename, Softmax
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import (
    Dilate,
    Dim,
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
from kdsl.lang.sizes import Size, coefficient, primary
from kdsl.search.canvas import CanvasSampler
from kdsl.search.space import Space

PRIMARY = ("N", "C", "H", "W")
WEIGHT_ONLY = ("E", "V")
COEFFICIENTS = ("K", "s", "G")


def _var(name: str) -> Size:
    return primary(name) if name in PRIMARY or name in WEIGHT_ONLY else coefficient(name)  # type: ignore[return-value]


# One draw rule per primitive kind: ``rule(draw, builder, index, live, pick, size)`` gives a step or None
# (not applicable here); ``pick`` draws a live dim, ``size`` is a coefficient drawn for the step.
def _split(draw: Any, builder: Builder, index: int, live: list, pick: Any, size: Size) -> Any:
    return Split(draw(pick), size, f"o{index}", f"i{index}")


def _merge(draw: Any, builder: Builder, index: int, live: list, pick: Any, size: Size) -> Any:
    if len(live) < 2:
        return None
    outer, inner = draw(st.lists(pick, min_size=2, max_size=2, unique=True))
    return Merge(outer, inner, f"m{index}")


def _shift(draw: Any, builder: Builder, index: int, live: list, pick: Any, size: Size) -> Any:
    return Shift(draw(pick), draw(st.sampled_from((1, -1, 2))))


def _expand(draw: Any, builder: Builder, index: int, live: list, pick: Any, size: Size) -> Any:
    return Expand(f"e{index}", size)


def _unfold(draw: Any, builder: Builder, index: int, live: list, pick: Any, size: Size) -> Any:
    return Unfold(draw(pick), size, f"k{index}")


def _stride(draw: Any, builder: Builder, index: int, live: list, pick: Any, size: Size) -> Any:
    windowed = sorted(builder.live.windowed)
    return Stride(draw(st.sampled_from(windowed)), size) if windowed else None


def _slide(draw: Any, builder: Builder, index: int, live: list, pick: Any, size: Size) -> Any:
    # the number of windows is a primary of its own, P<index>, that layers() binds to (N - K) // s + 1
    stride = draw(st.sampled_from((Size.of(1), _var("s"))))
    return Slide(draw(pick), size, primary(f"P{index}"), f"k{index}", stride)


def _dilate(draw: Any, builder: Builder, index: int, live: list, pick: Any, size: Size) -> Any:
    return Dilate(draw(pick), size)


def _reduce(draw: Any, builder: Builder, index: int, live: list, pick: Any, size: Size) -> Any:
    return Reduce(draw(pick), mean=draw(st.booleans())) if len(live) >= 2 else None


def _share(draw: Any, builder: Builder, index: int, live: list, pick: Any, size: Size) -> Any:
    shared = draw(st.lists(pick, min_size=1, max_size=min(2, len(live)), unique=True))
    entries: list[object] = list(shared)
    # new (weight-only) dims: none, one, or several, sized like anything in the vocabulary
    # (a new dim the size of a live one is still new: Dim gives it its own name)
    for new in range(draw(st.integers(0, 3))):
        new_size = _var(draw(st.sampled_from(WEIGHT_ONLY + COEFFICIENTS + PRIMARY)))
        entries.insert(draw(st.integers(0, len(entries))), Dim(f"n{index}_{new}", new_size))
    return Share(Weight(*entries, name=f"w{index}"))


#: The strategies' table: how to draw each primitive kind (a test checks that none is missing).
DRAWS: dict[str, Callable[..., Any]] = {
    "Split": _split,
    "Merge": _merge,
    "Shift": _shift,
    "Expand": _expand,
    "Unfold": _unfold,
    "Stride": _stride,
    "Slide": _slide,
    "Dilate": _dilate,
    "Reduce": _reduce,
    "Share": _share,
}
KINDS = tuple(DRAWS)


@st.composite
def _step(draw: Any, builder: Builder, index: int) -> Any:
    live = list(builder.live.sizes)
    kind = draw(st.sampled_from(KINDS))
    pick = st.sampled_from(live)
    coefficient_var = _var(draw(st.sampled_from(COEFFICIENTS)))
    return DRAWS[kind](draw, builder, index, live, pick, coefficient_var)


@st.composite
def operators(draw: Any, max_steps: int = 6, min_steps: int = 1) -> Operator:
    """Valid operators of up to ``max_steps`` primitives over a random input of 1-3 dims."""
    names = draw(st.lists(st.sampled_from(PRIMARY), min_size=1, max_size=3, unique=True))
    builder = Builder.start(Input(*(_var(n) for n in names)).dims)
    target = draw(st.integers(min_steps, max_steps))
    attempts = 0
    while len(builder.steps) < target and attempts < 4 * max_steps:
        attempts += 1
        primitive = draw(_step(builder, attempts))
        if primitive is None:
            continue
        try:
            builder = builder >> primitive  # type: ignore[assignment]
        except KdslError:
            continue
    assume(len(builder.steps) >= min_steps)
    order = draw(st.permutations(list(builder.live.sizes)))
    try:
        op = builder >> Output(*order)
    except KdslError:  # e.g. a merged dim of size 1 (G/(G*K)*K): the language refuses it here
        assume(False)
    assert isinstance(op, Operator) and op.is_linear
    coefficients = op.coefficient_variables
    if coefficients and draw(st.booleans()):
        chosen = draw(st.sampled_from(coefficients))
        op = op.with_defaults(**{chosen: draw(st.integers(2, 3))})
    return op


def _sizes(op: Operator) -> list[Size]:
    sizes = [d.size for d in op.inputs] + [d.size for d in op.outputs]
    for step in op.steps:
        sizes.extend(step.sizes())
    return sizes


def _live_sizes(op: Operator) -> list[list[Size]]:
    """The sizes of the live dims after every step (to bound intermediate tensors)."""
    return [list(sizes.values()) for sizes in op.live]


@st.composite
def layers(draw: Any, op: Operator, max_elements: int = 20_000) -> dict[str, int]:
    """A binding of every variable of ``op`` (an operator or a branching kernel) under which every
    size is a positive integer and no intermediate tensor has more than ``max_elements`` elements."""
    binding: dict[str, int] = {}
    for name in op.coefficient_variables:
        binding[name] = draw(st.integers(1, 3))
    binding.update(op.defaults)
    # every primary is a multiple of every denominator a coefficient can put under it
    denominator = 1
    if not op.is_linear:
        sizes, snapshots = _graph_snapshots(op)
    else:
        sizes, snapshots = _sizes(op), _live_sizes(op)
    every_size = sizes + [size for snapshot in snapshots for size in snapshot]
    for size in every_size:
        value = Size.make(size.constant, {v: e for v, e in size.exponents if v.kind == "coefficient"})
        denominator = lcm(denominator, Fraction(value.evaluate(binding)).denominator)
    for name in op.primary_variables:
        binding[name] = denominator * draw(st.integers(1, 3))
    # a Slide's number of windows follows from its dim, window and stride (in step order: one Slide's
    # windows may be the dim another slides over)
    for step in _slides(op):
        values = [step_size.evaluate(binding) for step_size in (step.window, step.stride)]
        dim_size = _size_before(op, step).evaluate(binding)
        assume(all(v.denominator == 1 for v in (*values, dim_size)) and values[0] <= dim_size)
        count = step.size.variable_name
        assert count is not None  # drawn as a primary of its own
        binding[count] = int((dim_size - values[0]) // values[1]) + 1
    for step in _slides(op):
        dim_size, window, stride = (x.evaluate(binding) for x in (_size_before(op, step), step.window, step.stride))
        assume(step.size.evaluate(binding) == (dim_size - window) // stride + 1)
    for size in every_size:
        value = size.evaluate(binding)
        assume(value.denominator == 1 and value >= 1)
    for snapshot in snapshots:
        assume(prod(int(s.evaluate(binding)) for s in snapshot) <= max_elements)
    return binding


def _chains(op: Operator) -> list[Any]:
    """The linear chains of ``op``: itself, or a kernel's chain nodes."""
    return [op] if op.is_linear else [node.step for node in op.nodes if isinstance(node.step, Chain)]


def _slides(op: Operator) -> list[Slide]:
    """Every Slide step of ``op``, in order."""
    return [step for chain in _chains(op) for step in chain.steps if isinstance(step, Slide)]


def _size_before(op: Operator, slide: Slide) -> Size:
    """The size of the dim ``slide`` slides over."""
    for chain in _chains(op):
        for position, step in enumerate(chain.steps):
            if step is slide:
                return dict(chain.live[position])[slide.dim]
    raise AssertionError("the Slide is no step of the operator")


@st.composite
def operators_with_layers(draw: Any, max_steps: int = 6) -> tuple[Operator, dict[str, int]]:
    """An operator and a layer binding for it."""
    op = draw(operators(max_steps=max_steps))
    return op, draw(layers(op))


# ------------------------------------------------------------------------------------------------
# Branching kernels (kdsl.lang.branches): linear chains between Canvas's steps, branches joined again
# ------------------------------------------------------------------------------------------------

#: the factors a drawn Map("scale") takes (every other Map function takes none)
SCALE_FACTORS = (0.5, -2.0, 3.0)
#: Blend spellings: the operators build add/sub/mul, Blend(...) any kind
BLEND_SPELLINGS = ("+", "-", "*", *(f"Blend:{how}" for how in BLEND_KINDS))
#: what one drawing step does (joins listed twice: kernels that branch are the point)
GRAPH_ACTIONS = (
    "blend",
    "product",
    "linear",
    "map",
    "fold",
    "window_fold",
    "softmax",
    "fc",
    "rename",
    "blend",
    "product",
)


class _Names:
    """Fresh numbers for dims and weights: names never collide across branches (a clash of dims in
    two branches is a join the language refuses; of weights, a kernel it refuses)."""

    def __init__(self) -> None:
        self.count = 0

    def next(self) -> int:
        self.count += 1
        return self.count


class _NotHere(Exception):
    """A drawing step that does not apply to the value drawn (a scalar has no dim to act on)."""


def _shape(value: object) -> dict[str, Size]:
    return Tensor.of(value, "graphs").shape


def _live(value: object) -> list[str]:
    live = list(_shape(value))
    if not live:
        raise _NotHere
    return live


def _builder_of(value: object) -> Builder:
    """A linear builder with the value's live dims: its pending chain's own where it has one (so
    a Stride finds the windows that chain made), else a fresh one on the value's dims."""
    if isinstance(value, Builder):
        return value
    tensor = Tensor.of(value, "graphs")
    if tensor.pending is not None:
        return tensor.pending
    return Builder.start(tensor.vertex.dims)


def _pick(draw: Any, pool: list[object]) -> object:
    # the newest values most of the time, so the kernel grows deep rather than only wide
    if len(pool) > 1 and draw(st.integers(0, 3)):
        return pool[-1]
    return pool[draw(st.integers(0, len(pool) - 1))]


def _linear_steps(draw: Any, value: object, names: _Names, count: int) -> object:
    for _ in range(count):
        builder = _builder_of(value)
        live = list(builder.live.sizes)
        if not live:
            break
        index = names.next()
        primitive = DRAWS[draw(st.sampled_from(KINDS))](
            draw, builder, index, live, st.sampled_from(live), _var(draw(st.sampled_from(COEFFICIENTS)))
        )
        if primitive is None:
            continue
        try:
            value = value >> primitive  # type: ignore[operator]
        except KdslError:
            continue
    return value


def _map(draw: Any) -> Map:
    fn = draw(st.sampled_from(tuple(MAP_FUNCTIONS)))
    return Map(fn, by=draw(st.sampled_from(SCALE_FACTORS))) if fn == "scale" else Map(fn)


def _unary(draw: Any, action: str, value: object, names: _Names) -> object:
    """One Canvas step (or a window and its fold) on ``value``; a KdslError means: not here."""
    live = _live(value)
    pick = st.sampled_from(live)
    if action == "map":
        return value >> _map(draw)  # type: ignore[operator]
    if action == "fold":
        return value >> Fold(draw(pick), how=draw(st.sampled_from(FOLD_KINDS)))  # type: ignore[operator]
    if action == "window_fold":
        # max/min pooling: the window's zero padding takes no part (with a stride now and then)
        index = names.next()
        window = draw(st.sampled_from((2, 3, _var("K"))))
        pooled = value >> Unfold(draw(pick), window, f"k{index}")  # type: ignore[operator]
        if draw(st.booleans()):
            pooled = pooled >> Stride(draw(pick), _var("s"))
        return pooled >> Fold(f"k{index}", how=draw(st.sampled_from(FOLD_KINDS)))
    if action == "softmax":
        start = draw(st.integers(0, len(live) - 1))
        width = draw(st.integers(1, min(2, len(live) - start)))
        return value >> Softmax(*live[start : start + width])  # type: ignore[operator]
    if action == "fc":
        index = names.next()
        dims = draw(st.lists(pick, min_size=1, max_size=min(2, len(live)), unique=True))
        size = _var(draw(st.sampled_from(WEIGHT_ONLY + ("C", "K"))))
        return value >> FC(*dims, name=f"f{index}", size=size, weight=f"fw{index}")  # type: ignore[operator]
    assert action == "rename"
    return value >> Rename(draw(pick), f"r{names.next()}")  # type: ignore[operator]


def _derived(draw: Any, value: object, names: _Names) -> object:
    """A second branch of ``value`` whose dims are the same or fewer (so a Blend can broadcast)."""
    live = _live(value)
    # half the time a branch with fewer dims: a Blend broadcasts it (over the other, on either side)
    fewer = draw(st.booleans())
    choice = draw(st.sampled_from(("reduce", "fold") if fewer else ("map", "shift", "softmax", "linear")))
    if choice == "shift":
        return value >> Shift(draw(st.sampled_from(live)), draw(st.sampled_from((1, -1))))  # type: ignore[operator]
    if choice == "reduce":
        return value >> Reduce(draw(st.sampled_from(live)), mean=draw(st.booleans()))  # type: ignore[operator]
    if choice == "linear":
        return _linear_steps(draw, value, names, draw(st.integers(1, 2)))
    return _unary(draw, choice, value, names)


def _blend(draw: Any, lhs: object, rhs: object) -> object:
    spelling = draw(st.sampled_from(BLEND_SPELLINGS))
    if spelling == "+":
        return lhs + rhs  # type: ignore[operator]
    if spelling == "-":
        return lhs - rhs  # type: ignore[operator]
    if spelling == "*":
        return lhs * rhs  # type: ignore[operator]
    return Blend(spelling.split(":")[1], lhs, rhs)


def _join(draw: Any, action: str, pool: list[object], names: _Names) -> object:
    lhs = _pick(draw, pool)
    if draw(st.integers(0, 3)):  # mostly a branch of lhs itself (joins of unrelated values rarely fit)
        rhs = _derived(draw, lhs, names)
        if action == "product" and draw(st.booleans()):  # attention: the other branch's axis renamed
            rhs = rhs >> Rename(draw(st.sampled_from(_live(rhs))), f"r{names.next()}")  # type: ignore[operator]
    else:
        rhs = _pick(draw, pool)
    if draw(st.booleans()):  # either branch may be the smaller one: broadcasting both ways
        lhs, rhs = rhs, lhs
    if action == "blend":
        return _blend(draw, lhs, rhs)
    union = list(dict.fromkeys([*_shape(lhs), *_shape(rhs)]))
    if not union:
        raise _NotHere
    reduce = draw(st.lists(st.sampled_from(union), max_size=min(2, len(union) - 1), unique=True))
    return Product(lhs, rhs, *reduce)


@st.composite
def graphs(draw: Any, max_actions: int = 6, inputs: int = 1) -> Operator:
    """Valid branching kernels over a 2-3 dim input: linear chains (drawn like :func:`operators`'
    steps) between Map, Fold (also as max/min pooling over an Unfold window), Softmax, FC and
    Rename steps, and branches joined by Blend (every kind, spelled ``+ - *`` or ``Blend``, the
    smaller branch on either side) and Product (with 0-2 reduced dims). Built only through the
    public API; a step the language refuses is skipped, so every drawn kernel is valid.

    >>> from hypothesis import given
    >>> @given(graphs())
    ... def test_kernels(graph):
    ...     assert not graph.is_linear and graph.nodes[0].kind == "Input"
    >>> test_kernels()

    With ``inputs=2`` the kernel reads two named inputs (``a`` and ``b``, over dims drawn apart, some
    of them shared), first joined by a Product over some of their dims, as attention's Q·Kᵀ is.
    """
    dim_names = draw(st.lists(st.sampled_from(PRIMARY), min_size=2, max_size=3, unique=True))
    names = _Names()
    made: list[object] = []
    if inputs == 1:
        pool: list[object] = [Input(*(_var(n) for n in dim_names))]
    else:
        others = draw(st.lists(st.sampled_from(PRIMARY), min_size=1, max_size=3, unique=True))
        pool = [Input(*(_var(n) for n in dim_names), name="a"), Input(*(_var(n) for n in others), name="b")]
        union = list(dict.fromkeys([*dim_names, *others]))
        reduce = draw(st.lists(st.sampled_from(union), max_size=min(2, len(union) - 1), unique=True))
        pool.append(Product(pool[0], pool[1], *reduce))
        made.append(pool[-1])
    for _ in range(draw(st.integers(min(2, max_actions), max_actions))):
        action = draw(st.sampled_from(GRAPH_ACTIONS))
        try:
            if action == "linear":
                value = _linear_steps(draw, _pick(draw, pool), names, draw(st.integers(1, 3)))
            elif action in ("blend", "product"):
                value = _join(draw, action, pool, names)
            else:
                value = _unary(draw, action, _pick(draw, pool), names)
        except (KdslError, _NotHere):
            continue
        pool.append(value)
        made.append(value)
    assume(made)
    result = made[-1]
    order = draw(st.permutations(list(_shape(result))))
    graph = result >> Output(*order)  # type: ignore[operator]
    assume(not graph.is_linear)  # a build that stayed one linear chain is a linear operator
    assume(len(graph.input_nodes) == inputs)  # the result may have left the second input unread
    assert not graph.is_linear
    coefficients = graph.coefficient_variables
    if coefficients and draw(st.booleans()):
        graph = graph.with_defaults(**{draw(st.sampled_from(coefficients)): draw(st.integers(2, 3))})
    return graph


def _graph_snapshots(graph: Operator) -> tuple[list[Size], list[list[Size]]]:
    """Every size of the kernel, and the dims of every tensor it makes (chains' steps included,
    weights, and a Product's lhs-times-rhs iteration space), to bound each one."""
    sizes = [d.size for d in graph.inputs] + [d.size for d in graph.outputs]
    snapshots: list[list[Size]] = []
    for node in graph.nodes:
        sizes.extend(d.size for d in node.dims)
        snapshots.append([d.size for d in node.dims])
        if isinstance(node.step, Chain):
            sizes.extend(_sizes(node.step))
            snapshots.extend(_live_sizes(node.step))
        elif isinstance(node.step, Primitive):
            sizes.extend(node.step.sizes())
        if node.kind == "Product":
            union = {d.name: d.size for arg in node.args for d in graph.nodes[arg].dims}
            snapshots.append(list(union.values()))
    snapshots.extend([d.size for d in weight.dims] for weight in graph.weights)
    return sizes, snapshots


@st.composite
def graphs_with_layers(
    draw: Any, max_actions: int = 6, max_elements: int = 2_000, inputs: int = 1
) -> tuple[Operator, dict[str, int]]:
    """A branching kernel (of ``inputs`` data inputs) and a layer binding for it (every tensor at most
    ``max_elements``)."""
    graph = draw(graphs(max_actions=max_actions, inputs=inputs))
    return graph, draw(layers(graph, max_elements=max_elements))


#: the small conv2d layer :func:`canvas_kernels` fills and binds its kernels for
CANVAS_LAYER = {"name": "small", "N": 2, "Cin": 4, "Cout": 6, "H": 5, "W": 5}


@lru_cache(maxsize=8)
def _canvas_space(max_depth: int) -> Space:
    return Space("conv2d", [CANVAS_LAYER], coefficients={"K": [3], "G": [2]}, max_depth=max_depth)


@st.composite
def canvas_kernels(draw: Any, max_depth: int = 6) -> tuple[Operator, dict[str, int]]:
    """A kernel drawn by Canvas's sampler for the conv2d spec (``[N, Cin, H, W] -> [N, Cout, H,
    W]``, at most ``max_depth`` sampled steps, K=3, G=2) and the binding of :data:`CANVAS_LAYER`
    with its free widths filled (their least valid values) and its coefficients.

    >>> from hypothesis import given
    >>> @given(canvas_kernels())
    ... def test_kernels(kernel):
    ...     op, layer = kernel
    ...     assert not set(op.dynamic_variables) - set(layer)
    >>> test_kernels()
    """
    space = _canvas_space(max_depth)
    sampler = CanvasSampler(space, seed=draw(st.integers(0, 2**16)))
    # one attempt in three or so is a dead end: a few attempts of one seed nearly always give one
    found = next((k for k in (sampler.draw(i) for i in range(12)) if k is not None), None)
    assume(found is not None)
    assert found is not None
    layer = {k: v for k, v in CANVAS_LAYER.items() if k != "name"}
    return found.op, {**layer, **found.op.default_coefficients, **found.widths.get(CANVAS_LAYER["name"], {})}
