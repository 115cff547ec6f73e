"""Padding (Syno): round the primary sizes of a layer up until every created size divides.

A size that does not divide a layer (``Cin/G`` with G=3 on 64 channels, ``H/s`` with s=2 on a
7-pixel map) is a :class:`~kdsl.lang.errors.DivisibilityError` by default: a hard error is the
safe default for a hand-written operator. Asked for (``pad=True`` in :func:`~kdsl.solve.check`,
:func:`~kdsl.solve.pad_binding` and every backend, ``kdsl check --pad``, ``Space(pad=True)``), the
solver instead rounds the *primary* variables up, per layer, to the least values under which every
``integral`` constraint holds; coefficients stay as given.

**Semantics.** A padded operator at a layer is:

1. zero-pad the input at the end of each input dim whose size grew (``Cin`` 64 -> 66: two
   channels of zeros after the 64 real ones);
2. run the operator at the padded binding (so its weights have the padded shapes: a grouped
   conv's ``w[g, co, ci, kh, kw]`` is ``[3, 22, 22, 3, 3]``);
3. crop each output dim to ``ceil(its size at the original binding)`` elements, keeping the first
   ones (``Cout`` 66 -> 64; ``H/s`` at H=7 keeps ceil(3.5) = 4 = 8/2 rows, so nothing is cropped).

Costs (FLOPs, parameters) are counted at the padded binding: they are what the padded operator
computes. Reads of the zero padding are real reads, so a non-linear step (a max fold, a softmax)
sees the zeros like any other value.

**Least values.** A constraint over one primary ``P`` (``c * P**e``, ``c`` fixed by the
coefficients) holds exactly when ``P`` is a multiple of some ``m``; so each primary is rounded up
to the next multiple of the lcm of its ``m``'s, which is the least value that can work. Constraints
over several primaries (``H*W/4``) are met by a best-first search over those primaries (smallest
product of their values first), which gives a padding where no single padded primary could be
smaller. A constraint that no rounding of primaries can fix (one over coefficients only, like
``K/2``, or a primary in a denominator) raises a ``DivisibilityError`` naming it, its values and
the layer.

This module holds the record (:class:`Padding`) and the rounding (:func:`pad_sizes`, given the
constraints); :func:`kdsl.solve.constraints.pad_binding` collects the constraints and binds a layer
(it lives there, next to ``bind``, because the constraints module imports this one).

>>> from kdsl.lang import library
>>> from kdsl.solve import load_layers, pad_binding
>>> padding = pad_binding(library.load("grouped_conv2d"), load_layers("resnet18")[0], {"G": 3})
>>> print(padding.describe())
Cin 64 -> 66 (Split(Cin, Cin/G))
Cout 64 -> 66 (Share(w): the weight dim co: Cout/G)
>>> [(d.name, d.original, d.padded) for d in padding.inputs if d.amount]
[('Cin', 64, 66)]
>>> [(d.name, d.original, d.padded) for d in padding.outputs if d.amount]
[('Cout', 64, 66)]
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import ceil, gcd, lcm, prod
from typing import Protocol

from kdsl.lang.errors import DivisibilityError
from kdsl.lang.operator import Operator
from kdsl.lang.sizes import Size
from kdsl.solve.layers import Layer, layer_label

#: The most padded bindings the search over several primaries visits before it gives up.
MAX_SEARCH = 100_000


class Condition(Protocol):
    """What :func:`pad_sizes` reads of a :class:`~kdsl.solve.constraints.Constraint`."""

    kind: str
    sizes: tuple[Size, ...]
    step: str
    what: str

    def holds(self, binding: Mapping[str, int]) -> bool: ...

    def failure(self, layer: str, binding: Mapping[str, int], hint: str | None = None) -> str: ...


@dataclass(frozen=True)
class PaddedVariable:
    """A primary variable that padding rounded up, and the constraint that forced it."""

    name: str
    original: int
    padded: int
    constraint: str

    def __str__(self) -> str:
        return f"{self.name} {self.original} -> {self.padded} ({self.constraint})"


@dataclass(frozen=True)
class DimPad:
    """One input or output dim of a padded operator: ``original`` elements (an input's size at
    the original binding; the elements an output keeps) and ``padded`` (its size at the padded
    binding)."""

    name: str
    original: int
    padded: int

    @property
    def amount(self) -> int:
        """How many elements padding adds (input: zeros appended; output: elements cropped)."""
        return self.padded - self.original


@dataclass(frozen=True)
class Padding:
    """How one layer is padded: the original and padded bindings (every variable of the
    operator, as sorted ``(name, value)`` pairs; :attr:`original_binding` and
    :attr:`padded_binding` give dicts), the variables that changed (:attr:`variables`), and the
    input dims (zero-padded at the end up to ``padded``) and output dims (cropped to
    ``original``), in the operator's order.
    """

    layer: str
    original: tuple[tuple[str, int], ...]
    padded: tuple[tuple[str, int], ...]
    variables: tuple[PaddedVariable, ...]
    inputs: tuple[DimPad, ...]
    outputs: tuple[DimPad, ...]

    @property
    def original_binding(self) -> dict[str, int]:
        return dict(self.original)

    @property
    def padded_binding(self) -> dict[str, int]:
        return dict(self.padded)

    @property
    def needed(self) -> bool:
        """Whether any size changed (else the padded operator is the operator itself)."""
        return bool(self.variables)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of the input the caller passes (the original sizes)."""
        return tuple(d.original for d in self.inputs)

    @property
    def output_shape(self) -> tuple[int, ...]:
        """The shape of the cropped output the caller gets."""
        return tuple(d.original for d in self.outputs)

    def describe(self) -> str:
        """One line per padded variable: ``Cin 64 -> 66 (Split(Cin, Cin/G))``; empty when none."""
        return "\n".join(str(v) for v in self.variables)


def _constraint_text(condition: Condition) -> str:
    """``Split(Cin, Cin/G)``, or ``Stride(H, s): H/s`` when the step's text does not show the size."""
    size = str(condition.sizes[0])
    return condition.step if size in condition.step else f"{condition.step}: {condition.what}{size}"


def _primaries(size: Size, primaries: frozenset[str]) -> list[tuple[str, int]]:
    return [(v.name, e) for v, e in size.exponents if v.name in primaries]


def _fixed_part(size: Size, primaries: frozenset[str], binding: Mapping[str, int]) -> Fraction:
    """The size with its primaries left out, under ``binding`` (the coefficients' share)."""
    value = size.constant
    for var, e in size.exponents:
        if var.name not in primaries:
            value *= Fraction(binding[var.name]) ** e
    return value


def _root_cover(d: int, e: int) -> int:
    """The least ``m`` with ``d`` dividing ``m**e``: every prime power ``p**a`` of ``d`` becomes
    ``p**ceil(a/e)`` (so ``P**e`` is a multiple of ``d`` exactly when ``P`` is one of ``m``)."""
    m, p = 1, 2
    while p * p <= d:
        a = 0
        while d % p == 0:
            d //= p
            a += 1
        m *= p ** (-(-a // e))
        p += 1
    return m * d  # what is left of d is a prime (or 1)


def _unfixable(condition: Condition, size: Size, primaries: frozenset[str]) -> bool:
    """Whether rounding primaries up cannot make ``size`` an integer: no primary in its numerator,
    or a primary in its denominator."""
    exponents = [e for _, e in _primaries(size, primaries)]
    return condition.kind != "integral" or not exponents or min(exponents) < 0


def _search(
    start: dict[str, int], names: list[str], steps: Mapping[str, int], integral: Sequence[Condition], layer: str
) -> dict[str, int]:
    """The padded binding with the smallest product of ``names``' values (ties: smallest values in
    order) among those where every integral constraint holds, each name moving in its own step."""
    first = tuple(start[n] for n in names)
    heap = [(prod(first), first)]
    seen = {first}
    for _ in range(MAX_SEARCH):
        if not heap:
            break
        _, values = heapq.heappop(heap)
        candidate = {**start, **dict(zip(names, values))}
        if all(c.holds(candidate) for c in integral):
            return candidate
        for position, name in enumerate(names):
            bumped = values[:position] + (values[position] + steps[name],) + values[position + 1 :]
            if bumped not in seen:
                seen.add(bumped)
                heapq.heappush(heap, (prod(bumped), bumped))
    raise DivisibilityError(
        f"{layer_label(layer)}: no padding of {', '.join(names)} within {MAX_SEARCH} tries makes every size an "
        f"integer; choose coefficients that divide the layer's sizes"
    )


def pad_sizes(op: Operator, layer: Layer, binding: Mapping[str, int], found: Sequence[Condition]) -> Padding:
    """The least padding of ``binding`` (every variable of ``op`` bound for ``layer``) under the
    constraints ``found`` (``constraints(op)``); window constraints are the caller's to check.

    Raises :class:`DivisibilityError` for a coefficient that is not positive, and for a size that
    is not an integer and that no rounding of primaries can fix.

    >>> from kdsl.lang import *
    >>> from kdsl.solve import constraints, load_layers
    >>> C, H, W = primary("C H W"); G = coefficient("G")
    >>> op = (Input(C, H, W) >> Split(C, C / G, "g", "c") >> Merge(H, W, "L") >> Split("L", 4, "a", "b")
    ...       >> Output("g", "c", "a", "b"))
    >>> layer = load_layers([{"name": "small", "C": 8, "H": 6, "W": 7}])[0]
    >>> print(pad_sizes(op, layer, {"C": 8, "H": 6, "W": 7, "G": 3}, constraints(op)).describe())
    C 8 -> 9 (Split(C, C/G))
    W 7 -> 8 (Split(L, 4): the outer dim a: H*W/4)
    """
    primaries = frozenset(v.name for v in op.variables if v.kind == "primary")
    for condition in found:
        if condition.kind == "window" or condition.holds(binding):
            continue
        if condition.kind in ("positive", "slide"):  # padding cannot change a number of windows
            raise DivisibilityError(condition.failure(layer.name, binding))
        if _unfixable(condition, condition.sizes[0], primaries):
            raise DivisibilityError(
                condition.failure(
                    layer.name,
                    binding,
                    "padding cannot fix it, since it rounds up only primary variables (in a numerator) and "
                    f"{condition.sizes[0]} has none; choose coefficients that divide",
                )
            )
    integral = [c for c in found if c.kind == "integral"]
    # one primary per constraint: P must be a multiple of some m; round up to the lcm of the m's
    steps = dict.fromkeys(sorted(primaries), 1)
    for condition in integral:
        size = condition.sizes[0]
        involved = _primaries(size, primaries)
        if len(involved) == 1 and involved[0][1] > 0:
            name, exponent = involved[0]
            fixed = _fixed_part(size, primaries, binding)
            need = fixed.denominator // gcd(fixed.numerator, fixed.denominator)
            steps[name] = lcm(steps[name], _root_cover(need, exponent))
    padded = dict(binding)
    for name, step in steps.items():
        padded[name] = ceil(binding[name] / step) * step
    if not all(c.holds(padded) for c in integral):
        # constraints over several primaries: search among those primaries, each in its own steps
        several = {n for c in integral if len(_primaries(c.sizes[0], primaries)) > 1 for n in c.variables}
        names = [v.name for v in op.variables if v.name in several and v.name in primaries]
        padded = _search(padded, names, steps, integral, layer.name)
    changed = []
    for name in (v.name for v in op.variables if v.name in primaries):
        if padded[name] == binding[name]:
            continue
        reverted = {**padded, name: binding[name]}
        forcing = [c for c in integral if name in c.variables and not c.holds(reverted)]
        forcing = forcing or [c for c in integral if name in c.variables]
        changed.append(PaddedVariable(name, binding[name], padded[name], _constraint_text(forcing[0])))
    original_items = tuple(sorted(binding.items()))
    return Padding(
        layer=layer.name,
        original=original_items,
        padded=tuple(sorted(padded.items())),
        variables=tuple(changed),
        inputs=tuple(_dim_pad(d.name, d.size, binding, padded) for d in op.inputs),
        outputs=tuple(_dim_pad(d.name, d.size, binding, padded) for d in op.outputs),
    )


def _dim_pad(name: str, size: Size, original: Mapping[str, int], padded: Mapping[str, int]) -> DimPad:
    return DimPad(name, ceil(size.evaluate(original)), int(size.evaluate(padded)))


__all__ = ["MAX_SEARCH", "Condition", "DimPad", "PaddedVariable", "Padding", "pad_sizes"]
