"""Canvas's primitives: element-wise maps, max/min folds, softmax, FC, and the joins of branches.

Each is declared once here, like the eight linear primitives in :mod:`kdsl.lang.primitives`: its
fields (text, JSON, content key), its shape rule and its semantics. They are the vertices of a
branching kernel (:mod:`kdsl.lang.branches`) between linear chains; a linear chain never holds one,
so the planner, search and its canonicalization rules, which commute linear steps, never see a
non-linear step to commute past.

=========  ==========================  ==================================================
Map        ``[..] -> [..]``            ``out = f(in)`` element-wise; ``f`` one of
                                       :data:`MAP_FUNCTIONS` (``"scale"`` multiplies by ``by``)
Fold       ``[.., N, ..] -> [.., ..]`` ``out = max_i in[.., i, ..]`` (or min); elements that
                                       read only a window's zero padding take no part
Softmax    ``[.., A, B, ..]`` same     ``exp(in) / sum over the dims A, B, .. of exp(in)``;
                                       the dims must be adjacent (contiguous)
FC         ``[.., C1, C2, ..] ->``     ``out[.., o] = sum_c in[.., c] * w[o, c]``: all the
           ``[.., o]``                 listed channel dims remapped to one new dim of a
                                       free size (a weight)
Blend      two branches -> one         ``op(lhs, rhs)`` for op in add, sub, mul, min, max;
                                       the smaller branch broadcasts over the other's dims
Product    two branches -> one         ``out = sum over reduce of lhs * rhs``: dims with the
                                       same name index both (batched matmul, attention)
=========  ==========================  ==================================================

>>> from kdsl.lang import *
>>> N, C, H = primary("N C H")
>>> y = Input(N, C, H) >> Unfold(H, 3, "k") >> Fold("k", how="max")
>>> [str(s) for s in y.shape.values()]
['N', 'C', 'H']
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from kdsl.lang.errors import ShapeError, SizeError
from kdsl.lang.live import Live
from kdsl.lang.names import reserve
from kdsl.lang.primitives import BuildContext, Dim, Field, Primitive, Requirement, Weight, check_name, check_size
from kdsl.lang.sizes import Size

#: Facts of the Canvas primitives (every pass reads facts, not classes).
NONLINEAR = "nonlinear"  # not linear in the data: a barrier no rewrite of linear steps may cross
ELEMENTWISE = "elementwise"  # keeps every dim; one output element per input element
FOLD = "fold"  # folds dims away with max or min
NORMALIZE = "normalize"  # softmax over some dims
DENSE = "dense"  # FC: a weight over all the listed dims (linear, but a vertex of its own)
JOIN = "join"  # takes two branches
RENAME = "rename"  # gives a dim another name (no data moves)

#: the element-wise functions of :class:`Map`, with their NumPy-independent meaning for the docs
MAP_FUNCTIONS: dict[str, str] = {
    "relu": "max(x, 0)",
    "abs": "|x|",
    "neg": "-x",
    "sin": "sin(x)",
    "exp": "e**x",
    "sigmoid": "1 / (1 + e**-x)",
    "tanh": "tanh(x)",
    "gelu": "x * Phi(x), Phi the standard normal CDF (the exact, erf form)",
    "scale": "by * x",
}
#: functions with f(0) == 0 (so a zero-padded element maps to zero)
ZERO_PRESERVING = frozenset({"relu", "abs", "neg", "sin", "tanh", "gelu", "scale"})
FOLD_KINDS = ("max", "min")
BLEND_KINDS = ("add", "sub", "mul", "min", "max")
COMMUTATIVE_BLENDS = frozenset({"add", "mul", "min", "max"})
MAX_SCALE = 1e12


def _refs(dims: Sequence[object], role: str) -> tuple[object, ...]:
    if not dims:
        raise ShapeError(f"{role} needs at least one dim")
    return tuple(dims)


def _resolve_all(live: Live, refs: Sequence[object], role: str) -> tuple[str, ...]:
    names = tuple(live.resolve(ref, role) for ref in refs)
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ShapeError(f"{role}: the dim {name} is listed twice")
        seen.add(name)
    return names


@dataclass(frozen=True)
class Map(Primitive):
    """Element-wise ``out = f(in)``: ``Map("relu")``, ``Map("sigmoid")``, ``Map("scale", by=0.5)``.

    >>> Map("gelu").fn
    'gelu'
    """

    fn: str
    by: float = 1.0
    kind: ClassVar[str] = "Map"
    fields: ClassVar[tuple[Field, ...]] = (
        Field("fn", "choice"),
        Field("by", "number", optional=True, default=1.0),
    )
    facts: ClassVar[frozenset[str]] = frozenset({NONLINEAR, ELEMENTWISE})
    rank: ClassVar[int] = 4
    choices: ClassVar[Mapping[str, tuple[str, ...]]] = {"fn": tuple(MAP_FUNCTIONS)}

    def apply(self, live: Live, context: BuildContext) -> Map:
        role = f"Map({self.fn!r:.40})"
        if self.fn not in MAP_FUNCTIONS:
            raise ShapeError(f"{role}: unknown function; use one of {', '.join(MAP_FUNCTIONS)}")
        by = self.by
        if isinstance(by, bool) or not isinstance(by, (int, float)) or not math.isfinite(by):
            raise SizeError(f"{role}: by must be a finite number, got {by!r:.40}")
        by = float(by)
        if abs(by) > MAX_SCALE:
            raise SizeError(f"{role}: by={by} is too large (at most {MAX_SCALE:g} in absolute value)")
        if self.fn != "scale" and by != 1.0:
            raise ShapeError(f"{role}: only Map('scale', by=...) takes a factor; {self.fn} takes none")
        return Map(self.fn, by)


@dataclass(frozen=True, init=False)
class Fold(Primitive):
    """``Fold("kh", "kw", how="max")``: the maximum (or minimum) over the dims, which go away.

    Zero padding is no value: when the Fold reads linear steps with a window (its linear region:
    the chains and Renames back to the last non-linear node or the input), an element that reads
    only the window's zero padding takes no part (the elements that region, run on ones with
    weights of ones, leaves at 0); where no element takes part the result is 0. So
    ``Unfold(H, 3) >> Unfold(W, 3) >> Fold(.., how="max")`` is ``F.max_pool2d(x, 3, 1, 1)``. A
    non-linear node between the window and the Fold (a Map, say) makes its result plain data. An
    average fold is ``Reduce(..., mean=True)`` (it is linear).
    """

    dims: tuple[object, ...]
    how: str
    kind: ClassVar[str] = "Fold"
    fields: ClassVar[tuple[Field, ...]] = (
        Field("dims", "refs"),
        Field("how", "choice", optional=True, default="max", keyword=True),
    )
    facts: ClassVar[frozenset[str]] = frozenset({NONLINEAR, FOLD})
    rank: ClassVar[int] = 4
    choices: ClassVar[Mapping[str, tuple[str, ...]]] = {"how": FOLD_KINDS}

    def __init__(self, *dims: object, how: str = "max") -> None:
        object.__setattr__(self, "dims", _refs(dims, "Fold()"))
        object.__setattr__(self, "how", how)

    @classmethod
    def from_values(cls, values: dict[str, object]) -> Primitive:
        return cls(*values["dims"], how=values.get("how", "max"))  # type: ignore[misc]

    @property
    def consumes(self) -> tuple[str, ...]:
        return tuple(self.dims)  # type: ignore[arg-type]

    def apply(self, live: Live, context: BuildContext) -> Fold:
        role = f"Fold({', '.join(map(str, self.dims))})"
        if self.how == "mean":
            raise ShapeError(f"{role}: an average fold is linear; write Reduce(..., mean=True)")
        if self.how not in FOLD_KINDS:
            raise ShapeError(f"{role}: how must be one of {', '.join(FOLD_KINDS)}, got {self.how!r:.40}")
        names = _resolve_all(live, self.dims, role)
        if len(names) == len(live):
            raise ShapeError(f"{role}: folding every dim away leaves a scalar; keep at least one dim")
        for name in names:
            live.remove(name)
        return Fold(*names, how=self.how)


@dataclass(frozen=True, init=False)
class Softmax(Primitive):
    """``Softmax("P")``: ``exp(x) / sum(exp(x))`` over the dims, which must be adjacent."""

    dims: tuple[object, ...]
    kind: ClassVar[str] = "Softmax"
    fields: ClassVar[tuple[Field, ...]] = (Field("dims", "refs"),)
    facts: ClassVar[frozenset[str]] = frozenset({NONLINEAR, NORMALIZE})
    rank: ClassVar[int] = 4

    def __init__(self, *dims: object) -> None:
        object.__setattr__(self, "dims", _refs(dims, "Softmax()"))

    @classmethod
    def from_values(cls, values: dict[str, object]) -> Primitive:
        return cls(*values["dims"])  # type: ignore[misc]

    @property
    def consumes(self) -> tuple[str, ...]:
        return tuple(self.dims)  # type: ignore[arg-type]

    @property
    def produces(self) -> tuple[str, ...]:
        return tuple(self.dims)  # type: ignore[arg-type]

    def apply(self, live: Live, context: BuildContext) -> Softmax:
        role = f"Softmax({', '.join(map(str, self.dims))})"
        names = _resolve_all(live, self.dims, role)
        order = list(live.sizes)
        positions = sorted(order.index(n) for n in names)
        if positions[-1] - positions[0] != len(names) - 1:
            raise ShapeError(
                f"{role}: softmax runs over contiguous dims, but {', '.join(names)} are not adjacent in "
                f"{live.describe()}; Merge or reorder them first"
            )
        # kept in the order they have in the data, so equal softmaxes print alike
        return Softmax(*(order[p] for p in positions))


@dataclass(frozen=True, init=False)
class FC(Primitive):
    """A fully connected layer over channel dims: ``FC(C, name="o", size=O)`` maps every listed dim
    to one new dim ``o`` of size ``O`` through a weight ``[o, C, ...]`` (called ``weight``, default
    ``{name}_w``); ``out[.., o] = sum_c in[.., c] * w[o, c]``. The new dim takes the place of the
    first listed one.

    >>> from kdsl.lang import *
    >>> N, C, O = primary("N C O")
    >>> t = Input(N, C) >> FC(C, name="o", size=O)
    >>> list(t.shape)
    ['N', 'o']
    """

    dims: tuple[object, ...]
    name: str
    size: Size
    weight: Weight | str | None
    kind: ClassVar[str] = "FC"
    fields: ClassVar[tuple[Field, ...]] = (
        Field("dims", "refs"),
        Field("name", "name", keyword=True),
        Field("size", "size", keyword=True),
        Field("weight", "weight", keyword=True),
    )
    facts: ClassVar[frozenset[str]] = frozenset({DENSE})
    rank: ClassVar[int] = 4

    def __init__(self, *dims: object, name: str, size: object, weight: Weight | str | None = None) -> None:
        object.__setattr__(self, "dims", _refs(dims, "FC()"))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "weight", weight)

    @classmethod
    def from_values(cls, values: dict[str, object]) -> Primitive:
        return cls(*values["dims"], name=values["name"], size=values["size"], weight=values["weight"])  # type: ignore

    @property
    def consumes(self) -> tuple[str, ...]:
        return tuple(self.dims)  # type: ignore[arg-type]

    @property
    def produces(self) -> tuple[str, ...]:
        return (self.name,)

    def apply(self, live: Live, context: BuildContext) -> FC:
        role = f"FC({', '.join(map(str, self.dims))})"
        names = _resolve_all(live, self.dims, role)
        new_name = check_name(self.name, "FC output dim")
        size = check_size(self.size, f"{role}: the output dim {new_name}")
        weight = self.weight
        if isinstance(weight, Weight):
            weight_name = weight.name
        elif weight is None or isinstance(weight, str):
            weight_name = weight
        else:
            raise ShapeError(f"{role}: weight must be a weight name, got {weight!r:.80}")
        weight_name = check_name(weight_name or f"{new_name}_w", "weight")
        if context.taken(weight_name):
            raise ShapeError(f"{role}: a weight named {weight_name!r} is already shared; give each its own name")
        if new_name in names:
            # the weight [o, C, ...] would have two dims of one name
            raise ShapeError(
                f"{role}: the output dim is named {new_name}, like a dim it maps; give it a new name "
                f"(and Rename it back after the FC if a join needs the old one)"
            )
        first = names[0]
        consumed = [Dim(n, live.size(n)) for n in names]
        for name in names[1:]:
            live.remove(name)
        live.replace(first, [(new_name, size)], role)
        resolved = Weight(Dim(new_name, size), *consumed)._resolved(
            weight_name, (Dim(new_name, size), *consumed), (True,) + (False,) * len(consumed)
        )
        context.add(resolved)
        return FC(*names, name=new_name, size=size, weight=resolved)

    def requirements(self, before: Mapping[str, Size], after: Mapping[str, Size]) -> list[Requirement]:
        return [Requirement("integral", (self.size,), self.name, f"the FC output dim {self.name}: ")]

    def describe(self) -> str:
        return f"FC({', '.join(map(str, self.dims))} -> {self.name}: {self.size})"


@dataclass(frozen=True)
class Rename(Primitive):
    """``Rename("P", "Q")``: the same data with the dim ``P`` called ``Q``. Joins match dims by name,
    so this is how one branch's positions become another axis (the keys of attention)."""

    dim: object
    name: str
    kind: ClassVar[str] = "Rename"
    fields: ClassVar[tuple[Field, ...]] = (Field("dim", "ref"), Field("name", "name"))
    facts: ClassVar[frozenset[str]] = frozenset({RENAME})
    rank: ClassVar[int] = 4

    def apply(self, live: Live, context: BuildContext) -> Rename:
        role = f"Rename({self.dim}, {self.name!r:.40})"
        old = live.resolve(self.dim, role)
        new = check_name(self.name, "Rename")
        live.replace(old, [(new, live.size(old))], role, windowed=old in live.windowed)
        return Rename(old, new)

    def describe(self) -> str:
        return f"Rename({self.dim} -> {self.name})"


# ------------------------------------------------------------------------------------------------
# Joins: two branches in, one out
# ------------------------------------------------------------------------------------------------


class Join:
    """Base of the primitives that join two branches. ``combine`` is the shape rule: it takes the
    two branches' dims (in order) and returns the result's dims, or raises naming both."""

    kind: ClassVar[str]
    fields: ClassVar[tuple[Field, ...]]
    facts: ClassVar[frozenset[str]]
    choices: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    def combine(self, lhs: Sequence[Dim], rhs: Sequence[Dim]) -> tuple[Dim, ...]:
        raise NotImplementedError

    def values(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in self.fields}

    def describe(self) -> str:
        """``Blend(mul)``, ``Product(d)``: the kind and its parameters, for messages."""
        parts = []
        for f in self.fields:
            value = getattr(self, f.name)
            parts.extend(map(str, value) if f.kind == "refs" else [str(value)])
        return f"{self.kind}({', '.join(parts)})"


def _describe(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join(f"{d.name}: {d.size}" for d in dims) + "]"


def _matched(role: str, lhs: Sequence[Dim], rhs: Sequence[Dim]) -> tuple[dict[str, Size], dict[str, Size]]:
    """Both branches' sizes by dim name, after checking that a name both have has one size."""
    left = {d.name: d.size for d in lhs}
    right = {d.name: d.size for d in rhs}
    for name in left.keys() & right.keys():
        if left[name] != right[name]:
            free = left[name].dynamic_variables() + right[name].dynamic_variables()
            hint = f" (no free width among {', '.join(free)} can make them equal)" if free else ""
            raise ShapeError(
                f"{role}: the dim {name} has size {left[name]} in the left branch {_describe(lhs)} but "
                f"{right[name]} in the right branch {_describe(rhs)}{hint}"
            )
    return left, right


@dataclass(frozen=True)
class BlendJoin(Join):
    """``Blend("add", lhs, rhs)`` (also ``lhs + rhs``, ``lhs - rhs``, ``lhs * rhs``): the element-wise
    ``add``/``sub``/``mul``/``min``/``max`` of two branches. Dims match by name (and must have equal
    sizes); the branch whose dims are a subset of the other's is broadcast over the missing ones
    (Canvas's blending; the result has the larger branch's dims in its order, the left one's when
    both have the same dims).

    The ``lhs``/``rhs`` of the class are the op only; the branches are the node's arguments.
    """

    how: str
    kind: ClassVar[str] = "Blend"
    fields: ClassVar[tuple[Field, ...]] = (Field("how", "choice"),)
    facts: ClassVar[frozenset[str]] = frozenset({JOIN, NONLINEAR})
    choices: ClassVar[Mapping[str, tuple[str, ...]]] = {"how": BLEND_KINDS}

    def __post_init__(self) -> None:
        if self.how not in BLEND_KINDS:
            raise ShapeError(f"Blend({self.how!r:.40}): how must be one of {', '.join(BLEND_KINDS)}")

    def combine(self, lhs: Sequence[Dim], rhs: Sequence[Dim]) -> tuple[Dim, ...]:
        role = f"Blend({self.how!r})"
        left, right = _matched(role, lhs, rhs)
        if left.keys() <= right.keys() and len(right) > len(left):
            return tuple(rhs)
        if right.keys() <= left.keys():
            return tuple(lhs)
        missing_left = [n for n in right if n not in left]
        missing_right = [n for n in left if n not in right]
        raise ShapeError(
            f"{role}: the branches' dims do not match: the left branch {_describe(lhs)} lacks "
            f"{', '.join(missing_left)} and the right branch {_describe(rhs)} lacks {', '.join(missing_right)}; "
            f"one branch's dims must be a subset of the other's (Reduce, Fold or rename the extra ones)"
        )


@dataclass(frozen=True, init=False)
class ProductJoin(Join):
    """``Product(lhs, rhs, "d")``: ``out = sum over d of lhs * rhs``, two data branches multiplied.
    Dims with the same name index both branches; the result has the left branch's dims, then the
    right's that the left lacks, less the reduced ones (a batched matmul: the core of attention and
    involution).
    """

    reduce: tuple[str, ...]
    kind: ClassVar[str] = "Product"
    fields: ClassVar[tuple[Field, ...]] = (Field("reduce", "refs"),)
    facts: ClassVar[frozenset[str]] = frozenset({JOIN, NONLINEAR})

    def __init__(self, *reduce: str) -> None:
        for name in reduce:
            if not isinstance(name, str):
                raise ShapeError(f"Product: reduced dims are named by strings, got {name!r:.80}")
        object.__setattr__(self, "reduce", tuple(reduce))

    def combine(self, lhs: Sequence[Dim], rhs: Sequence[Dim]) -> tuple[Dim, ...]:
        role = f"Product({', '.join(self.reduce)})"
        left, right = _matched(role, lhs, rhs)
        if len(set(self.reduce)) != len(self.reduce):
            raise ShapeError(f"{role}: a reduced dim is listed twice")
        union = list(lhs) + [d for d in rhs if d.name not in left]
        for name in self.reduce:
            if name not in left and name not in right:
                raise ShapeError(
                    f"{role}: there is no dim {name} in either branch (left {_describe(lhs)}, right {_describe(rhs)})"
                )
        result = tuple(d for d in union if d.name not in self.reduce)
        if not result:
            raise ShapeError(f"{role}: reducing every dim leaves a scalar; keep at least one dim")
        return result


#: the Canvas primitives of a chain position (unary) and the joins, by kind: every backend table
#: has one rule per entry (a test checks it), like :data:`kdsl.lang.primitives.PRIMITIVES`
UNARY: dict[str, type[Primitive]] = {cls.kind: cls for cls in (Map, Fold, Softmax, FC, Rename)}
JOINS: dict[str, type[Join]] = {cls.kind: cls for cls in (BlendJoin, ProductJoin)}
reserve(*UNARY, *JOINS)

__all__ = [
    "BLEND_KINDS",
    "COMMUTATIVE_BLENDS",
    "DENSE",
    "ELEMENTWISE",
    "FC",
    "FOLD",
    "FOLD_KINDS",
    "JOIN",
    "JOINS",
    "MAP_FUNCTIONS",
    "NONLINEAR",
    "NORMALIZE",
    "UNARY",
    "ZERO_PRESERVING",
    "BlendJoin",
    "Fold",
    "Join",
    "Map",
    "ProductJoin",
    "RENAME",
    "Rename",
    "Softmax",
]
