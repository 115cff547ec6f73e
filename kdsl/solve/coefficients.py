"""Solving coefficients: which values of ``G``, ``s``, ``K`` an operator is valid with on every layer.

Coefficients are global (one ``G`` for all layers), so a value must satisfy every constraint on
every layer at once. :func:`solve_coefficients` derives, from :func:`~.constraints.constraints`,
a finite candidate set per coefficient, then keeps the combinations the exact checker accepts:

* *divisor sets* (Canvas §6.2 derives its global ``G`` the same way): an integral size whose
  coefficients are all in the denominator, ``P/D`` (``Cin/G``, ``Cout/(G*s)``), is an integer on
  every layer exactly when ``D`` divides ``g``, the gcd over the layers of the primary part ``P``.
  Each coefficient ``c`` with ``c**e`` in ``D`` is then a divisor of ``g`` (with ``c**e | g``), and a
  product of coefficients divides ``g`` jointly (:class:`Divides`).
* *window ranges*: a window ``w*c**e`` smaller than a dim whose size has no coefficient in its
  numerator bounds ``c**e`` below ``min(dim / w)`` over the layers (``K < 7`` on ResNet-18's last stage).
* *bounds* for the rest: a coefficient that no constraint bounds (a window under
  ``allow_large_windows``, a size only in numerators) takes its values from ``bounds`` (``{"K": 7}``
  means 1..7, a list means those values), else the operator's default, else :class:`LayerError`
  names it. A bound also caps a derived set (``{"G": 8}`` keeps G's divisors up to 8).

The candidate sets are necessary conditions, and the final filter is
:func:`~.constraints.assignments` itself, so the result equals brute force over the same bounds.

>>> from kdsl.lang import library
>>> solved = solve_coefficients(library.load("grouped_conv2d"), "resnet18")
>>> solved.values
{'G': (1, 2, 4, 8, 16, 32, 64), 'K': (1, 2, 3, 4, 5, 6)}
>>> print(solved.reasons["G"])
G divides 64 (Split(Cin, Cin/G): Cin/G); G divides 64 (Share(w): the weight dim co: Cout/G)
>>> print(solved.reasons["K"])
K <= 6 (Unfold(H, K): K < H on every layer); K <= 6 (Unfold(W, K): K < W on every layer)
>>> len(solved.assignments)
42
>>> syno = solve_coefficients(library.load("syno_op1"), "resnet18", bounds={"K": [3]})
>>> [str(d) for d in syno.divides]
['G divides 64 (Split(Cin, Cin/G): Cin/G)', 'G*s divides 64 (Share(W2): the weight dim c: Cout/(G*s))']
>>> sorted({(a["G"], a["s"]) for a in syno.assignments if a["G"] == 16})
[(16, 1), (16, 2), (16, 4)]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from kdsl.lang.errors import DivisibilityError, LayerError
from kdsl.lang.operator import Operator
from kdsl.lang.sizes import Size
from kdsl.solve.constraints import Constraint, assignments, constraints, resolve_binding
from kdsl.solve.layers import Layer, as_layers

__all__ = ["CoefficientSolution", "Divides", "divides", "divisors", "solve_coefficients"]


def divisors(value: int) -> tuple[int, ...]:
    """The positive divisors of ``value`` (>= 1), ascending.

    >>> divisors(64), divisors(14), divisors(1)
    ((1, 2, 4, 8, 16, 32, 64), (1, 2, 7, 14), (1,))
    """
    small, large = [], []
    for d in range(1, math.isqrt(value) + 1):
        if value % d == 0:
            small.append(d)
            if d != value // d:
                large.append(value // d)
    return tuple(small + large[::-1])


@dataclass(frozen=True)
class Divides:
    """``monomial`` (a product of coefficients) must divide ``gcd`` for ``size`` to be an integer on
    every layer; ``gcd`` is that of the size's primary part over the layers, 0 when the primary part is
    not an integer on some layer (then no value works). ``where`` is the step that needs it.

    >>> from kdsl.lang.sizes import primary, coefficient
    >>> Cout = primary("Cout"); G, s = coefficient("G s")
    >>> found = divides(Cout / (G * s), [{"Cout": 64}, {"Cout": 96}])
    >>> str(found), found.values("G"), found.values("s")
    ('G*s divides 32', (1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16, 32))
    """

    monomial: Size
    gcd: int
    size: Size
    where: str = ""

    def values(self, name: str) -> tuple[int, ...]:
        """The values of the coefficient ``name`` this condition leaves (each ``v`` with ``v**e | gcd``)."""
        exponent = -self.size.exponent(name)
        if self.gcd == 0:
            return ()
        return tuple(d for d in divisors(self.gcd) if self.gcd % d**exponent == 0)

    def __str__(self) -> str:
        """``G*s divides 64 (where)``: 64 is the gcd over the layers of the size's primary part."""
        if self.gcd == 0:
            return f"{self.size} is not an integer on every layer for any {self.monomial}"
        return f"{self.monomial} divides {self.gcd}" + (f" ({self.where})" if self.where else "")


def _primary_value(size: Size, binding: Mapping[str, int]) -> Fraction:
    """The constant times the primary variables of ``size`` under ``binding``."""
    value = Fraction(size.constant)
    for var, exp in size.exponents:
        if var.kind != "coefficient":
            if var.name not in binding:
                raise LayerError(f"a layer does not bind the variable {var.name} (needed by the size {size})")
            value *= Fraction(binding[var.name]) ** exp
    return value


def divides(size: Size, layers: Sequence[Mapping[str, int]], where: str = "") -> Divides | None:
    """The divisibility condition that ``size`` being an integer on every layer puts on its
    coefficients, or None when it puts none this way (no coefficient in its denominator, or one in
    its numerator too: then ``P*K/G`` can be an integer for many ``G``). ``layers`` bind the
    primaries."""
    coefficients = [(var, exp) for var, exp in size.exponents if var.kind == "coefficient"]
    if not coefficients or any(exp > 0 for _, exp in coefficients):
        return None
    if any(var.kind == "dynamic" for var, _ in size.exponents):
        return None  # a free width changes per layer: kdsl.solve.fill chooses it, not a gcd
    monomial = Size.make(1, {var: -exp for var, exp in coefficients})
    gcd = 0
    for binding in layers:
        value = _primary_value(size, binding)
        if value.denominator != 1:
            return Divides(monomial, 0, size, where)
        gcd = math.gcd(gcd, value.numerator)
    return Divides(monomial, gcd, size, where)


def _window_limit(constraint: Constraint, bindings: Sequence[Mapping[str, int]]) -> tuple[dict[str, int], str]:
    """For a window constraint ``w*c**e < dim``: the largest value of each coefficient ``c`` in the
    window's numerator, when the window has no coefficient in its denominator and the dim none in
    its numerator (then the dim is at most its primary part, and ``c**e < dim/w`` on every layer)."""
    window, dim_size = constraint.sizes
    numerator = {var.name: exp for var, exp in window.exponents if var.kind == "coefficient" and exp > 0}
    if not numerator or any(var.kind != "primary" and exp < 0 for var, exp in window.exponents):
        return {}, ""
    if any(var.kind != "primary" and exp > 0 for var, exp in dim_size.exponents):
        return {}, ""
    limit = min(_primary_value(dim_size, b) / _primary_value(window, b) for b in bindings)
    largest = {}
    for name, exp in numerator.items():
        value = 0
        while Fraction(value + 1) ** exp < limit:
            value += 1
        largest[name] = value
    return largest, f"{constraint.step}: {window} < {dim_size}"


def _bound_values(name: str, bound: object) -> tuple[int, ...]:
    """A user's bound: an int ``n`` means 1..n, an iterable of ints means those values."""
    if isinstance(bound, bool):
        raise LayerError(f"bounds[{name!r}] must be an int or a list of ints, got {bound!r}")
    if isinstance(bound, int):
        if bound < 1:
            raise LayerError(f"bounds[{name!r}] = {bound} must be at least 1 (the coefficient's largest value)")
        return tuple(range(1, bound + 1))
    if isinstance(bound, (str, bytes)) or not isinstance(bound, Iterable):
        raise LayerError(f"bounds[{name!r}] must be an int or a list of ints, got {bound!r}")
    values = []
    for value in bound:
        if isinstance(value, bool) or not isinstance(value, int):
            raise LayerError(f"bounds[{name!r}] holds {value!r}, which is not an integer")
        values.append(value)
    return tuple(sorted({v for v in values if v >= 1}))


@dataclass(frozen=True)
class CoefficientSolution:
    """What :func:`solve_coefficients` found. ``assignments``: every valid combination, in
    :func:`~.constraints.assignments`' order; ``values``: per coefficient, the values that appear in
    at least one of them; ``candidates``: the derived sets the search started from; ``reasons``: how
    each coefficient's set was bounded, in words; ``divides``: the divisibility conditions (joint
    ones, such as ``G*s divides 64``, included)."""

    names: tuple[str, ...]
    candidates: dict[str, tuple[int, ...]]
    reasons: dict[str, str]
    divides: tuple[Divides, ...]
    assignments: tuple[dict[str, int], ...]

    @property
    def values(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(sorted({a[name] for a in self.assignments})) for name in self.names}

    def as_dict(self) -> dict[str, object]:
        """The JSON form: values, reasons, divisibility conditions and the assignments."""
        return {
            "values": {name: list(values) for name, values in self.values.items()},
            "reasons": dict(self.reasons),
            "divides": [{"monomial": str(d.monomial), "gcd": d.gcd, "size": str(d.size)} for d in self.divides],
            "assignments": [dict(a) for a in self.assignments],
        }


def _value_set(values: Iterable[int]) -> str:
    found = sorted(values)
    if len(found) > 2 and found == list(range(found[0], found[-1] + 1)):
        return f"{found[0]}..{found[-1]}"
    return "{" + ", ".join(map(str, found)) + "}"


def solve_coefficients(
    op: Operator,
    layers: object,
    *,
    bounds: Mapping[str, int | Iterable[int]] | None = None,
    allow_large_windows: bool = False,
) -> CoefficientSolution:
    """The coefficient assignments under which ``op`` is valid on every layer of ``layers``, derived
    from its constraints (see the module docstring for how each coefficient's set is bounded).

    A coefficient every layer binds is the layers' (and not solved). Raises :class:`LayerError` for a
    coefficient that nothing bounds (no constraint, no ``bounds`` entry, no default), and
    :class:`DivisibilityError`, naming the coefficients and the first failing layer, when no
    assignment is valid.

    >>> from kdsl.lang import *
    >>> H = primary("H"); s, K = coefficient("s K")
    >>> op = Input(H) >> Unfold(H, K, "k") >> Stride(H, s) >> Reduce("k") >> Output("H")
    >>> solved = solve_coefficients(op, "resnet18_stride2", bounds={"K": [3]})
    >>> solved.values, solved.reasons["s"]
    ({'K': (3,), 's': (1, 2, 7, 14)}, 's divides 14 (Stride(H, s): H/s)')
    >>> solve_coefficients(op, "resnet18_stride2", allow_large_windows=True)
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.LayerError: the coefficient K is bounded by no constraint on the layers ...
    """
    table = as_layers(layers)
    bounds = dict(bounds or {})
    if not isinstance(bounds, Mapping):
        raise LayerError(f"bounds must be a dict like {{'K': 7}} or {{'K': [3, 5]}}, got {bounds!r}")
    names = [n for n in op.coefficient_variables if not (table and all(n in layer for layer in table))]
    # the primaries (and the coefficients the layers bind), per layer, as the checker binds them
    bindings = [_primaries(op, layer) for layer in table]
    derived: dict[str, set[int]] = {}
    why: dict[str, list[str]] = {name: [] for name in names}
    found: list[Divides] = []
    for constraint in constraints(op):
        if constraint.kind == "integral":
            where = constraint.description.removesuffix(" must be a positive integer")
            condition = divides(constraint.sizes[0], bindings, where)
            if condition is None or not any(v.name in why for v in condition.monomial.variables):
                continue
            found.append(condition)
            for var in condition.monomial.variables:
                if var.name not in why:
                    continue
                values = set(condition.values(var.name))
                derived[var.name] = derived.get(var.name, values) & values
                why[var.name].append(str(condition))
        elif constraint.kind == "window" and not allow_large_windows:
            largest, where = _window_limit(constraint, bindings)
            for name, value in largest.items():
                if name in why:
                    derived[name] = derived.get(name, set(range(1, value + 1))) & set(range(1, value + 1))
                    why[name].append(f"{name} <= {value} ({where} on every layer)")
    candidates: dict[str, tuple[int, ...]] = {}
    reasons: dict[str, str] = {}
    defaults = dict(op.defaults)
    for name in names:
        given = _bound_values(name, bounds[name]) if name in bounds else None
        if name in derived:
            values = derived[name] if given is None else derived[name] & set(given)
            reason = "; ".join(why[name]) + ("" if given is None else f"; within the bound {_value_set(given)}")
        elif given is not None:
            values, reason = set(given), f"no constraint bounds it: the bound {_value_set(given)}"
        elif name in defaults:
            values, reason = {defaults[name]}, f"no constraint bounds it: the operator's default {defaults[name]}"
        else:
            raise LayerError(
                f"the coefficient {name} is bounded by no constraint on the layers (it divides no layer size "
                f"and is no window smaller than a dim): pass bounds={{'{name}': 8}} (its largest value) or a "
                f"list of values, or give the operator a default"
            )
        candidates[name] = tuple(sorted(values))
        reasons[name] = reason
    solved = assignments(op, table, candidates, allow_large_windows=allow_large_windows)
    if not solved:
        raise DivisibilityError(_no_assignment(op, table, candidates, reasons, allow_large_windows))
    return CoefficientSolution(tuple(names), candidates, reasons, tuple(found), tuple(solved))


def _primaries(op: Operator, layer: Layer) -> dict[str, int]:
    return {var.name: layer[var.name] for var in op.variables if var.name in layer}


def _no_assignment(
    op: Operator,
    table: tuple[Layer, ...],
    candidates: Mapping[str, tuple[int, ...]],
    reasons: Mapping[str, str],
    windows_allowed: bool,
) -> str:
    """Why no assignment is valid: the coefficient left without candidates (with the conditions
    that emptied its set), else the first layer that rejects the smallest combination."""
    empty = [name for name, values in candidates.items() if not values]
    if empty:
        why = "; ".join(f"{name}: {reasons[name]}" for name in empty)
        return (
            f"no value of the coefficient {', '.join(empty)} is valid on every layer ({why}); "
            f"choose other bounds or layers whose sizes these values divide"
        )
    sets = ", ".join(f"{name} in {_value_set(values)}" for name, values in candidates.items())
    smallest = {name: values[0] for name, values in candidates.items()}
    for layer in table:
        binding = resolve_binding(op, layer, smallest)
        for constraint in constraints(op):
            if constraint.kind == "window" and windows_allowed:
                continue
            if not constraint.holds(binding):
                first = constraint.failure(layer.name, binding)
                return f"no assignment of the coefficients ({sets}) is valid on every layer; e.g. {first}"
    return f"no assignment of the coefficients ({sets}) is valid on every layer"
