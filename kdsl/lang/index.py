"""Index expressions: the one small algebra in which primitives state their bottom-up coordinate rules.

Walking an operator *bottom-up* answers "which input element does this output element read?". Each
view primitive maps the coordinates of the dims it produces to coordinates of the dims it consumes
(:meth:`kdsl.lang.primitives.Primitive.coordinate`, declared with the primitive: e.g. a split
``(i, j) -> B*i + j``, a window ``(i, j) -> i + j - K//2``, a read that is zero outside ``[0, N)``:
a :class:`Guard`).

The expressions are immutable values over named loop variables whose constants are symbolic sizes
(:class:`~kdsl.lang.sizes.Size`), so one walk serves every backend: the TVM backend turns them into
``tirx`` expressions at a binding, the loop-nest listing prints them, and :func:`evaluate` computes
them at concrete indices (the tests check the rules against the reference interpreter with it).

>>> from kdsl.lang.sizes import coefficient, primary
>>> L, K = primary("L"), coefficient("K")
>>> i, j = Var("l"), Var("k")
>>> source = i + j - Half(K)
>>> print(source)
l + k - K//2
>>> evaluate(source, {"l": 4, "k": 0}, {"K": 3})
3
>>> print(Cyclic(Cyclic(i, 1, L), 2, L))
(l + 3) % L
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from kdsl.lang.sizes import Size

__all__ = [
    "Add",
    "Const",
    "Cyclic",
    "FloorDiv",
    "Guard",
    "Half",
    "Index",
    "Mod",
    "Scale",
    "SizeOf",
    "Var",
    "evaluate",
    "walk_up",
]


class Index:
    """An integer index expression. ``+``, ``-``, ``*`` (by a size), ``//`` and ``%`` (by a size) build
    new expressions, folding the trivial cases (``x + 0``, ``x * 1``) so printed rules stay readable."""

    __slots__ = ()

    def __add__(self, other: Index | int) -> Index:
        other = _lift(other)
        if isinstance(other, Const) and other.value == 0:
            return self
        if isinstance(self, Const) and self.value == 0:
            return other
        return Add(self, other, 1)

    def __sub__(self, other: Index | int) -> Index:
        other = _lift(other)
        if isinstance(other, Const) and other.value == 0:
            return self
        return Add(self, other, -1)

    def __mul__(self, factor: Size | int) -> Index:
        factor = Size.of(factor)
        return self if factor == 1 else Scale(self, factor)

    def __floordiv__(self, divisor: Size | int) -> Index:
        divisor = Size.of(divisor)
        return self if divisor == 1 else FloorDiv(self, divisor)

    def __mod__(self, divisor: Size | int) -> Index:
        divisor = Size.of(divisor)
        return Const(0) if divisor == 1 else Mod(self, divisor)


def _lift(value: Index | int) -> Index:
    return value if isinstance(value, Index) else Const(int(value))


@dataclass(frozen=True, eq=True)
class Var(Index):
    """A loop variable (an output coordinate), by name."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=True)
class Const(Index):
    value: int

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True, eq=True)
class SizeOf(Index):
    """The value of a size (``N``, ``Cin/G``) as an index constant."""

    size: Size

    def __str__(self) -> str:
        return str(self.size)


@dataclass(frozen=True, eq=True)
class Half(Index):
    """``size // 2``: the centre offset of a window of that size."""

    size: Size

    def __str__(self) -> str:
        return str(int(self.size.constant) // 2) if self.size.is_constant else f"{self.size}//2"


@dataclass(frozen=True, eq=True)
class Add(Index):
    """``left + sign * right`` (sign is 1 or -1)."""

    left: Index
    right: Index
    sign: int

    def __str__(self) -> str:
        right = _wrap(self.right) if self.sign < 0 else str(self.right)
        return f"{self.left} {'+' if self.sign > 0 else '-'} {right}"


@dataclass(frozen=True, eq=True)
class _BySize(Index):
    """``expr <op> size`` for an operation by a size (``symbol`` prints it)."""

    expr: Index
    size: Size
    symbol: ClassVar[str]

    def __str__(self) -> str:
        return f"{_wrap(self.expr)}{self.symbol}{_wrap_size(self.size)}"


class Scale(_BySize):
    """``expr * size``."""

    symbol = "*"


class FloorDiv(_BySize):
    """``expr // size`` (floor division)."""

    symbol = " // "


class Mod(_BySize):
    """``expr % size`` (the non-negative remainder)."""

    symbol = " % "


@dataclass(frozen=True, eq=True, init=False)
class Cyclic(Index):
    """``(expr + offset) mod extent`` for an ``expr`` already in ``[0, extent)``: a cyclic shift.

    Shifts of a shift fold into one offset, ``((x + a) mod E + b) mod E = (x + a + b) mod E``
    (backends can then lower the wrap-around as one select instead of nested modulos)."""

    expr: Index
    offset: int
    extent: Size

    def __init__(self, expr: Index, offset: int, extent: Size) -> None:
        if isinstance(expr, Cyclic) and expr.extent == extent:
            expr, offset = expr.expr, expr.offset + offset
        object.__setattr__(self, "expr", expr)
        object.__setattr__(self, "offset", offset)
        object.__setattr__(self, "extent", extent)

    def __str__(self) -> str:
        sign = "+" if self.offset >= 0 else "-"
        return f"({self.expr} {sign} {abs(self.offset)}) % {_wrap_size(self.extent)}"


def _wrap(expr: Index) -> str:
    text = str(expr)
    return f"({text})" if isinstance(expr, (Add, FloorDiv, Mod)) else text


def _wrap_size(size: Size) -> str:
    text = str(size)
    return f"({text})" if any(c in text for c in "*/ ") else text


@dataclass
class Guard:
    """A windowed read: zero unless ``0 <= expr < extent``, the extent being the size of the dim
    ``dim`` that was unfolded (never the window's). ``window`` is that Unfold's window size: zero
    padding of ``dim`` by ``(window//2, window - 1 - window//2)`` makes the guard always true, as long
    as no view above the Unfold remaps ``dim`` (then ``paddable`` is False)."""

    expr: Index
    extent: Size
    dim: str
    window: Size
    paddable: bool = True
    #: a Dilate's read: zero unless ``divisor`` divides ``expr`` too (between two elements is a zero)
    divisor: Size | None = None

    def __str__(self) -> str:
        if self.divisor is not None:
            return f"{_wrap(self.expr)} % {_wrap_size(self.divisor)} == 0"
        return f"0 <= {self.expr} < {self.extent}"

    def holds(self, indices: Mapping[str, int], binding: Mapping[str, int]) -> bool:
        """Whether the read is valid at ``indices`` (sizes at ``binding``).

        >>> from kdsl.lang.sizes import Size
        >>> Guard(Var("i"), Size.of(6), "L", Size.of(1), False, Size.of(2)).holds({"i": 3}, {})
        False
        """
        value = evaluate(self.expr, indices, binding)
        if not 0 <= value < int(_size_value(self.extent, binding)):
            return False
        return self.divisor is None or value % int(_size_value(self.divisor, binding)) == 0


def _size_value(size: Size, binding: Mapping[str, int]) -> Fraction:
    return Fraction(size.evaluate(binding))


def evaluate(expr: Index, indices: Mapping[str, int], binding: Mapping[str, int]) -> int:
    """The value of ``expr`` with loop variables at ``indices`` and sizes at ``binding``.

    >>> from kdsl.lang.sizes import primary
    >>> B = primary("B")
    >>> evaluate(FloorDiv(Var("m"), B), {"m": 7}, {"B": 3}), evaluate(Var("m") % B, {"m": 7}, {"B": 3})
    (2, 1)
    """
    if isinstance(expr, Var):
        return indices[expr.name]
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, SizeOf):
        return int(_size_value(expr.size, binding))
    if isinstance(expr, Half):
        return int(_size_value(expr.size, binding)) // 2
    if isinstance(expr, Add):
        return evaluate(expr.left, indices, binding) + expr.sign * evaluate(expr.right, indices, binding)
    if isinstance(expr, Scale):
        return evaluate(expr.expr, indices, binding) * int(_size_value(expr.size, binding))
    if isinstance(expr, FloorDiv):
        return evaluate(expr.expr, indices, binding) // int(_size_value(expr.size, binding))
    if isinstance(expr, Mod):
        return evaluate(expr.expr, indices, binding) % int(_size_value(expr.size, binding))
    if isinstance(expr, Cyclic):
        return (evaluate(expr.expr, indices, binding) + expr.offset) % int(_size_value(expr.extent, binding))
    raise TypeError(f"not an index expression: {expr!r}")


def walk_up(
    views: list[tuple[object, Mapping[str, Size]]], coords: Mapping[str, Index]
) -> tuple[dict[str, Index], list[Guard]]:
    """Walk view steps bottom-up from the coordinates ``coords`` of the dims after the last one.

    ``views`` pairs each step with the live sizes before it (as a stage plan gives them). Returns the
    coordinates of the dims before the first step, and the guards of the windows read on the way; a
    guard whose dim is remapped by a step above its Unfold is marked not paddable.
    """
    coords = dict(coords)
    guards: list[Guard] = []
    for step, sizes in reversed(views):
        touched = {*step.consumes, *step.produces}  # type: ignore[attr-defined]
        for guard in guards:
            if guard.dim in touched:
                guard.paddable = False
        guard = step.coordinate(coords, sizes)  # type: ignore[attr-defined]
        if guard is not None:
            guards.append(guard)
    return coords, guards
