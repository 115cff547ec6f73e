"""Symbolic sizes: monomials over named variables times a positive rational constant.

A size such as ``Cout/(G*s)`` is stored as a constant and an exponent vector, interned so that
equal sizes are the same object (hashing and comparing are cheap in search's hot loops).
Multiplying adds exponents; SymPy is only used by :meth:`Size.to_sympy`.

Three kinds of variable. Syno's two (§5.3): *primary* variables (``N``, ``Cin``, ``H``) are large,
come from the layer, and never appear in a denominator; *coefficient* variables (``K``, ``s``,
``G``) are small, shared by all layers, and may divide. Canvas's *dynamic* variables (§6.2, ``x1``)
are free widths, such as an FC's output size: like a primary, each layer has its own value (a
width that suits 64 channels does not suit 512, so Canvas solves ``x_{i,j}`` per layer ``i``), but
no layer table binds it: shape matching (:func:`unify`) and the budget solver
(:func:`kdsl.solve.fill`) find it. An operator with a free dynamic variable is a template.

>>> N, H = primary("N H"); K, s = coefficient("K s")
>>> (H / s) * s == H
True
>>> str(N * K**2 / (2 * s))
'N*K**2/(2*s)'
>>> (H / s).evaluate({"H": 56, "s": 2})
Fraction(28, 1)
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Literal, Union

from kdsl.lang.errors import LayerError, SizeError
from kdsl.lang.names import check_identifier

VariableKind = Literal["primary", "coefficient", "dynamic"]
#: printing order of a size's variables: primaries, coefficients, then dynamic variables
_KIND_ORDER = {"primary": 0, "coefficient": 1, "dynamic": 2}
KINDS: tuple[str, ...] = tuple(_KIND_ORDER)


class Var:
    """A named variable of one kind. Two variables are equal when name and kind are equal."""

    __slots__ = ("name", "kind", "_hash")

    def __init__(self, name: str, kind: VariableKind) -> None:
        check_identifier(name, "variable")
        if kind not in _KIND_ORDER:
            raise SizeError(f"variable kind must be 'primary', 'coefficient' or 'dynamic', not {kind!r}")
        self.name = name
        self.kind = kind
        self._hash = hash((name, kind))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Var) and other.name == self.name and other.kind == self.kind

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Var({self.name!r}, {self.kind!r})"

    def sort_key(self) -> tuple[int, str]:
        return (_KIND_ORDER[self.kind], self.name)


SizeLike = Union["Size", int, Fraction]


class Size:
    """An interned monomial ``constant * prod(var**exp)``. Build with :func:`primary`,
    :func:`coefficient`, :func:`Size.of`, and arithmetic (``*``, ``/``, ``**``)."""

    __slots__ = ("constant", "exponents", "_hash", "__weakref__")
    _interned: dict[tuple[Fraction, tuple[tuple[Var, int], ...]], Size] = {}

    constant: Fraction
    exponents: tuple[tuple[Var, int], ...]

    def __new__(cls, constant: Fraction, exponents: tuple[tuple[Var, int], ...]) -> Size:
        key = (constant, exponents)
        found = cls._interned.get(key)
        if found is not None:
            return found
        self = object.__new__(cls)
        self.constant = constant
        self.exponents = exponents
        self._hash = hash(key)
        cls._interned[key] = self
        return self

    # -- construction -------------------------------------------------------------------------
    @staticmethod
    def make(constant: int | Fraction, exponents: Mapping[Var, int]) -> Size:
        """The size ``constant * prod(var**exp)``; zero exponents are dropped."""
        constant = Fraction(constant)
        if constant <= 0:
            raise SizeError(f"a size must be positive, got the constant {constant}")
        by_name: dict[str, Var] = {}
        for var in exponents:
            seen = by_name.setdefault(var.name, var)
            if seen.kind != var.kind:
                raise SizeError(f"variable {var.name} is used both as {seen.kind} and as {var.kind}")
        items = tuple(sorted(((v, e) for v, e in exponents.items() if e != 0), key=lambda ve: ve[0].sort_key()))
        return Size(constant, items)

    @staticmethod
    def of(value: object) -> Size:
        """Coerce an int, a Fraction or a Size into a Size (``Size.of(3)`` is the constant 3)."""
        if isinstance(value, Size):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
            raise SizeError(f"expected a size (an int or an expression of variables), got {value!r}")
        return Size.make(value, {})

    @staticmethod
    def variable(name: str, kind: VariableKind) -> Size:
        return Size.make(1, {Var(name, kind): 1})

    # -- value semantics ----------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, (int, Fraction)) and not isinstance(other, bool):
            return not self.exponents and self.constant == other
        return self is other

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[object, ...]:
        return (Size, (self.constant, self.exponents))

    def __mul__(self, other: SizeLike) -> Size:
        other = Size.of(other)
        exps = dict(self.exponents)
        for var, e in other.exponents:
            exps[var] = exps.get(var, 0) + e
        return Size.make(self.constant * other.constant, exps)

    __rmul__ = __mul__

    def __truediv__(self, other: SizeLike) -> Size:
        return self * Size.of(other) ** -1

    def __rtruediv__(self, other: SizeLike) -> Size:
        return Size.of(other) * self**-1

    def __pow__(self, power: int) -> Size:
        if isinstance(power, bool) or not isinstance(power, int):
            raise SizeError(f"sizes can only be raised to integer powers, got {power!r}")
        return Size.make(self.constant**power, {v: e * power for v, e in self.exponents})

    # -- queries ------------------------------------------------------------------------------
    @property
    def is_constant(self) -> bool:
        return not self.exponents

    @property
    def variable_name(self) -> str | None:
        """The name if this size is exactly one variable (``H``), else ``None``."""
        if self.constant == 1 and len(self.exponents) == 1 and self.exponents[0][1] == 1:
            return self.exponents[0][0].name
        return None

    @property
    def variables(self) -> tuple[Var, ...]:
        return tuple(v for v, _ in self.exponents)

    def exponent(self, name: str) -> int:
        for var, e in self.exponents:
            if var.name == name:
                return e
        return 0

    def primaries_in_denominator(self) -> list[str]:
        return [v.name for v, e in self.exponents if e < 0 and v.kind == "primary"]

    def dynamic_variables(self) -> tuple[str, ...]:
        """The names of the dynamic variables in this size (``x1`` in ``x1/G``)."""
        return tuple(v.name for v, _ in self.exponents if v.kind == "dynamic")

    def substitute(self, values: Mapping[str, Size]) -> Size:
        """This size with each variable named in ``values`` replaced by its size there.

        >>> C = primary("C"); x1 = dynamic("x1"); G = coefficient("G")
        >>> str((x1 / G).substitute({"x1": 4 * C}))
        '4*C/G'
        """
        if not any(var.name in values for var, _ in self.exponents):
            return self
        result = Size.make(self.constant, {})
        for var, e in self.exponents:
            replacement = values.get(var.name)
            result = result * (Size.make(1, {var: 1}) if replacement is None else Size.of(replacement)) ** e
        return result

    def primary_part(self) -> Size:
        """The monomial of the primary variables only (constant 1)."""
        return Size.make(1, {v: e for v, e in self.exponents if v.kind == "primary"})

    def evaluate(self, binding: Mapping[str, int | Fraction]) -> Fraction:
        """The exact value under ``binding`` (variable name -> value); a missing name is an error."""
        value = self.constant
        for var, e in self.exponents:
            if var.name not in binding:
                raise LayerError(f"variable {var.name} has no value (needed by the size {self})")
            value *= Fraction(binding[var.name]) ** e
        return value

    def to_sympy(self):  # -> sympy.Expr
        """This size as a SymPy expression with positive integer symbols."""
        import sympy

        expr = sympy.Rational(self.constant.numerator, self.constant.denominator)
        for var, e in self.exponents:
            expr = expr * sympy.Symbol(var.name, positive=True, integer=True) ** e
        return expr

    # -- printing -----------------------------------------------------------------------------
    def __str__(self) -> str:
        def product(factors: list[str]) -> str:
            return "*".join(factors)

        num = [(v.name if e == 1 else f"{v.name}**{e}") for v, e in self.exponents if e > 0]
        den = [(v.name if e == -1 else f"{v.name}**{-e}") for v, e in self.exponents if e < 0]
        if self.constant.numerator != 1 or not num:
            num.insert(0, str(self.constant.numerator))
        if self.constant.denominator != 1:
            den.insert(0, str(self.constant.denominator))
        text = product(num)
        if den:
            text += "/" + (den[0] if len(den) == 1 else f"({product(den)})")
        return text

    def __repr__(self) -> str:
        return f"Size({self})"


def _variables(names: str | tuple[str, ...] | list[str], kind: VariableKind) -> tuple[Size, ...] | Size:
    if isinstance(names, str):
        names = names.replace(",", " ").split()
    elif not isinstance(names, (tuple, list)):
        raise SizeError(f'{kind}() takes the variable names as a string like "N H", got {names!r:.80}')
    if not names:
        raise SizeError(f"{kind}() needs at least one variable name")
    made = tuple(Size.variable(n, kind) for n in names)
    return made[0] if len(made) == 1 else made


def unify(left: Size, right: Size) -> tuple[str, Size] | None:
    """Solve ``left == right`` for one dynamic variable: ``(name, size)`` such that substituting
    gives equal sizes, or ``None`` when no dynamic variable can make them equal.

    The equation is a ratio of monomials equal to 1. A dynamic variable with exponent +-1 in it is
    solved for by monomial algebra (Canvas §6.2: by its Theorem 1 a dim holds at most one, in the
    numerator); one that stands squared or higher, by SymPy, where the root is again a monomial. When
    both sides have one, the later-named variable is expressed in the other, so ``x1`` stays free.

    >>> C, H = primary("C H"); G, K = coefficient("G K"); x1, x2 = dynamic("x1 x2")
    >>> name, size = unify(x2 / G, C * K**2 / G); name, str(size)
    ('x2', 'C*K**2')
    >>> name, size = unify(x1, x2 * K); name, str(size)
    ('x2', 'x1/K')
    >>> name, size = unify(x1**2, C**2 * K**2); name, str(size)  # SymPy takes the root
    ('x1', 'C*K')
    >>> unify(C, H) is None, unify(x1 * C, H) is None, unify(x1**2, C * K) is None  # x1 = H/C is no width
    (True, True, True)
    """
    if left is right:
        return None
    ratio = left / right  # == 1 is the equation
    candidates = sorted(
        ((var, e) for var, e in ratio.exponents if var.kind == "dynamic"),
        key=lambda ve: ve[0].name,
        reverse=True,
    )
    for var, e in candidates:
        rest = Size.make(ratio.constant, {v: x for v, x in ratio.exponents if v != var})
        # ratio = var**e * rest == 1, so var = rest**(-1/e)
        solution = rest ** (-e) if e in (1, -1) else _monomial_root(rest, -e)
        # a width divided by a layer's size or by another width is not a width (Theorem 1)
        if solution is not None and all(x > 0 for v, x in solution.exponents if v.kind != "coefficient"):
            return var.name, solution
    return None


def _monomial_root(size: Size, power: int) -> Size | None:
    """``size ** (1/power)`` when it is a monomial (integer exponents, rational constant), by SymPy;
    else None (``(C*K) ** (1/2)`` is no size)."""
    import sympy

    symbols = {var.name: var for var, _ in size.exponents}
    x = sympy.Symbol("_root", positive=True)
    roots = sympy.solve(sympy.Eq(x ** abs(power), size.to_sympy() if power > 0 else 1 / size.to_sympy()), x)
    for root in roots:
        constant, factors = sympy.Rational(1), {}
        for factor in sympy.Mul.make_args(root):
            base, exponent = factor.as_base_exp()
            if base.is_Symbol and base.name in symbols and exponent.is_Integer:
                factors[symbols[base.name]] = factors.get(symbols[base.name], 0) + int(exponent)
            elif factor.is_Rational:
                constant *= factor
            else:
                break  # a fractional power: the root is no monomial
        else:
            return Size.make(Fraction(int(constant.p), int(constant.q)), factors)
    return None


def primary(names: str) -> tuple[Size, ...] | Size:
    """Declare primary variables (large sizes bound per layer): ``N, H = primary("N H")``."""
    return _variables(names, "primary")


def coefficient(names: str) -> tuple[Size, ...] | Size:
    """Declare coefficient variables (small, shared by all layers): ``K, s = coefficient("K s")``."""
    return _variables(names, "coefficient")


def dynamic(names: str) -> tuple[Size, ...] | Size:
    """Declare dynamic variables (free widths, one value per layer, filled by the solver):
    ``x1, x2 = dynamic("x1 x2")``."""
    return _variables(names, "dynamic")
