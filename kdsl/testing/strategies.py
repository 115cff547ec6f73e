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
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from math import lcm, prod
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from kdsl.lang.build import Builder, Input, Operator, Output
from kdsl.lang.errors import KdslError
from kdsl.lang.primitives import (
    Dim,
    Expand,
    Merge,
    Reduce,
    Share,
    Shift,
    Split,
    Stride,
    Unfold,
    Weight,
)
from kdsl.lang.sizes import Size, coefficient, primary

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
    op = builder >> Output(*order)
    assert isinstance(op, Operator)
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
    """A binding of every variable of ``op`` under which every size is a positive integer and no
    intermediate tensor has more than ``max_elements`` elements."""
    binding: dict[str, int] = {}
    for name in op.coefficient_variables:
        binding[name] = draw(st.integers(1, 3))
    binding.update(op.defaults)
    # every primary is a multiple of every denominator a coefficient can put under it
    denominator = 1
    snapshots = _live_sizes(op)
    every_size = _sizes(op) + [size for snapshot in snapshots for size in snapshot]
    for size in every_size:
        value = Size.make(size.constant, {v: e for v, e in size.exponents if v.kind == "coefficient"})
        denominator = lcm(denominator, Fraction(value.evaluate(binding)).denominator)
    for name in op.primary_variables:
        binding[name] = denominator * draw(st.integers(1, 3))
    for size in every_size:
        value = size.evaluate(binding)
        assume(value.denominator == 1 and value >= 1)
    for snapshot in snapshots:
        assume(prod(int(s.evaluate(binding)) for s in snapshot) <= max_elements)
    return binding


@st.composite
def operators_with_layers(draw: Any, max_steps: int = 6) -> tuple[Operator, dict[str, int]]:
    """An operator and a layer binding for it."""
    op = draw(operators(max_steps=max_steps))
    return op, draw(layers(op))
