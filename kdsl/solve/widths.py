"""What each free width (dynamic variable) of a template may be: the rules :func:`kdsl.solve.fill`
fills widths under (Canvas §6.2-6.3).

Every size a width ``x`` appears in must be an integer. Where ``x`` stands in a numerator,
``x**e * p/q``, it must be a *multiple* (of ``q``'s part that ``p`` leaves, Canvas's ``p x / q``).
Where a join or a split leaves it in a denominator, ``p / (q * x**k)``, it must be a *divisor*:
``x**k`` divides ``p/q`` (Canvas's broadcast, where the width must be a factor of ``C*K``). A width
may be both; its valid values are then the divisors of ``p/q`` that are multiples.

>>> from kdsl.lang import *
>>> N, C, H, W = primary("N C H W"); K = coefficient("K"); x1 = dynamic("x1")
>>> op = (Input(N, C, H, W) >> Unfold(H, K, "k") >> Merge(C, "k", "ck")
...       >> Split("ck", x1, "a", "b") >> Reduce("a") >> Output(N, "b", H, W))
>>> {name: [str(size) for size in sizes] for name, sizes in divisor_bounds(op).items()}
{'x1': ['C*K']}
>>> rule = layer_rules(op, {"N": 1, "C": 4, "H": 8, "W": 8, "K": 3})["x1"]
>>> rule.least(), rule.largest(), rule.grown(2), rule.grown(6), rule.valid(5)
(1, 12, 4, 12, False)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kdsl.lang.errors import DivisibilityError
from kdsl.lang.operator import Operator
from kdsl.lang.sizes import Size
from kdsl.solve.coefficients import divisors
from kdsl.solve.constraints import constraints

__all__ = ["WidthRule", "divisor_bounds", "freedom", "layer_rules", "width_terms"]


def width_terms(op: Operator) -> list[tuple[str, int, Size, str]]:
    """For every integral constraint with exactly one free width ``x``: ``(x, e, rest, step)`` with
    the constrained size ``x**e * rest`` (``e < 0``: ``x`` divides it)."""
    found = []
    for constraint in constraints(op):
        if constraint.kind != "integral":
            continue
        size = constraint.sizes[0]
        widths = [(var, e) for var, e in size.exponents if var.kind == "dynamic"]
        if len(widths) != 1:
            continue  # none, or several in one size: the final check judges those
        var, e = widths[0]
        rest = Size.make(size.constant, {v: x for v, x in size.exponents if v != var})
        found.append((var.name, e, rest, constraint.step))
    return found


def freedom(op: Operator) -> dict[str, Size]:
    """What is left to choose of each free width: the monomial it must be a multiple of for every
    size it appears in to be an integer (the lcm of the denominators around it).

    >>> from kdsl.lang import *
    >>> N, Cin = primary("N Cin"); G, K = coefficient("G K"); x1 = dynamic("x1")
    >>> op = (Input(N, Cin) >> Share(Weight(Cin, Dim("z", x1), name="w")) >> Reduce(Cin)
    ...       >> Split("z", G * K, "q", "c") >> Output(N, "q", "c"))
    >>> {name: str(size) for name, size in freedom(op).items()}
    {'x1': 'G*K'}
    """
    result: dict[str, Size] = {name: Size.of(1) for name in op.dynamic_variables}
    for name, exponent, rest, _ in width_terms(op):
        if exponent < 0:
            continue  # a divisor bound (divisor_bounds), not a multiple
        # x**e * rest is an integer for any layer when x is a multiple of rest's denominator
        need = Size.make(rest.constant.denominator, {v: -x for v, x in rest.exponents if x < 0})
        if exponent > 1:
            need = _root_up(need, exponent)
        result[name] = _lcm_monomial(result[name], need)
    return result


def divisor_bounds(op: Operator) -> dict[str, list[Size]]:
    """The sizes each free width (its power, where it stands squared or more) must divide: one per
    size that has the width in its denominator (a width with none is left out)."""
    result: dict[str, list[Size]] = {}
    for name, exponent, rest, _ in width_terms(op):
        if exponent < 0 and rest not in result.setdefault(name, []):
            result[name].append(rest)
    return {name: sizes for name, sizes in result.items() if sizes}


@dataclass(frozen=True)
class WidthRule:
    """The values one free width may take on one layer: multiples of ``multiple`` whose
    ``power``-th power divides ``bound`` for each ``(bound, power)`` of ``divides``."""

    multiple: int
    divides: tuple[tuple[int, int], ...] = ()

    def valid(self, value: int) -> bool:
        return value >= 1 and value % self.multiple == 0 and all(bound % value**k == 0 for bound, k in self.divides)

    def _values(self) -> list[int]:
        """Every valid value, ascending (only for a width with a divisor bound: finitely many)."""
        smallest = min(bound for bound, _ in self.divides)
        return [d for d in divisors(smallest) if self.valid(d)]

    def least(self) -> int | None:
        """The least valid value, or None when there is none."""
        if not self.divides:
            return self.multiple
        values = self._values()
        return values[0] if values else None

    def largest(self) -> int | None:
        """The largest valid value (None: unbounded, or no valid value)."""
        if not self.divides:
            return None
        values = self._values()
        return values[-1] if values else None

    def at_least(self, target: float) -> int | None:
        """The least valid value of at least ``target`` (None when a divisor bound leaves none)."""
        if not self.divides:
            return math.ceil(target / self.multiple) * self.multiple
        return next((v for v in self._values() if v >= target), None)

    def grown(self, value: int) -> int | None:
        """The next width of a filling round after ``value``: twice it where nothing bounds it, else the
        least valid value of at least twice it, else the least above it (None: it cannot grow)."""
        if not self.divides:
            return value * 2
        above = [v for v in self._values() if v > value]
        return next((v for v in above if v >= 2 * value), above[0] if above else None)


def layer_rules(
    op: Operator, binding: Mapping[str, int], terms: list[tuple[str, int, Size, str]] | None = None
) -> dict[str, WidthRule]:
    """Each free width's :class:`WidthRule` under ``binding`` (which binds everything else);
    :class:`DivisibilityError` names a width no value fits."""
    multiple = dict.fromkeys(op.dynamic_variables, 1)
    divides: dict[str, list[tuple[int, int]]] = {name: [] for name in op.dynamic_variables}
    for name, exponent, rest, step in terms if terms is not None else width_terms(op):
        value = rest.evaluate(binding)
        if exponent > 0:
            need = value.denominator if exponent == 1 else _root_up_int(value.denominator, exponent)
            multiple[name] = math.lcm(multiple[name], need)
        elif value.denominator != 1:
            raise DivisibilityError(
                f"{step}: the size {rest}/{name}{'' if exponent == -1 else f'**{-exponent}'} needs {rest} = "
                f"{value} to be a whole number for any width {name} to divide it"
            )
        else:
            divides[name].append((int(value), -exponent))
    rules = {name: WidthRule(multiple[name], tuple(divides[name])) for name in op.dynamic_variables}
    for name, rule in rules.items():
        if rule.least() is None:
            bounds = ", ".join(str(bound) for bound, _ in rule.divides)
            raise DivisibilityError(
                f"no width {name} fits: it must be a multiple of {rule.multiple} and divide {bounds} here"
            )
    return rules


def _lcm_monomial(a: Size, b: Size) -> Size:
    exponents: dict[Any, int] = dict(a.exponents)
    for var, e in b.exponents:
        exponents[var] = max(exponents.get(var, 0), e)
    return Size.make(math.lcm(int(a.constant), int(b.constant)), exponents)


def _root_up(size: Size, exponent: int) -> Size:
    """The least monomial whose ``exponent``-th power is a multiple of ``size`` (integral sizes)."""
    constant = _root_up_int(int(size.constant), exponent)
    return Size.make(constant, {v: -(-e // exponent) for v, e in size.exponents})


def _root_up_int(value: int, exponent: int) -> int:
    """The least m with ``value | m**exponent``."""
    result, factor, rest = 1, 2, value
    while factor * factor <= rest:
        count = 0
        while rest % factor == 0:
            rest //= factor
            count += 1
        result *= factor ** -(-count // exponent)
        factor += 1
    return result * rest if rest > 1 else result
