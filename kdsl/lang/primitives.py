"""The eight primitives of kdsl, each declared once: fields, shape rule, semantics.

Every primitive is an immutable value. Built by the user it may hold *references* (a dim name, or
a size that identifies a dim); applied to the live dims of a partial operator it is *resolved*
into a step whose fields are plain dim names. Both are the same class, so one declaration gives
the shape rule (:meth:`Primitive.apply`), the printed form and the JSON form.

Semantics are top-down (input to output); reads outside ``[0, n)`` give 0:

========  ======================  ================================================
Split     ``[G*B] -> [G, B]``     ``out[i, j] = in[B*i + j]``
Merge     ``[A, B] -> [A*B]``     ``out[i] = in[i // B, i % B]``
Shift     ``[N] -> [N]``          ``out[i] = in[(i + offset) mod N]``
Expand    ``[] -> [C]``           ``out[.., c] = in[..]``
Unfold    ``[N] -> [N, K]``       ``out[i, j] = in[i + j - K//2]`` (0 outside)
Stride    ``[S*K] -> [K]``        ``out[i] = in[S*i]``
Reduce    ``[N] -> []``           ``out = sum_i in[i]`` (or the mean)
Share     data ``[N]``, weight    ``out[i] = in[i] * w[i]``; weight-only dims
          ``[N]`` -> ``[N]``      become new dims of the result
========  ======================  ================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from kdsl.lang.errors import ShapeError, SizeError, ValidityError
from kdsl.lang.index import Const, Cyclic, Guard, Half, Index
from kdsl.lang.live import Live
from kdsl.lang.names import MAX_CONSTANT, MAX_EXPONENT, check_identifier, check_offset, reserve
from kdsl.lang.sizes import Size

#: A reference to a live dim: its name, or a size that only that dim has.
DimRef = str | Size


def check_name(name: object, what: str) -> str:
    """A dim or weight name, checked by the one naming rule (:func:`kdsl.lang.names.check_identifier`)."""
    return check_identifier(name, what)


def check_size(size: object, what: str) -> Size:
    """A created size must be a monomial with no primary variable in a denominator, and not 1.

    Its constant (numerator and denominator) and exponents are bounded as the DSL's literals are,
    so every size an operator holds prints as text that parses back.
    """
    try:
        size = Size.of(size)
    except SizeError as error:
        raise SizeError(f"{what}: {error.message}") from None
    bad = size.primaries_in_denominator()
    if bad:
        raise SizeError(
            f"{what} has size {size}, with the primary variable {bad[0]} in a denominator; primary "
            f"variables (layer sizes) may only be divided by coefficients"
        )
    if size == 1:
        raise SizeError(f"{what} has size 1; a dim of size 1 is redundant, leave it out")
    if max(size.constant.numerator, size.constant.denominator) > MAX_CONSTANT:
        raise SizeError(
            f"{what} has size {size}, whose constant {size.constant} is too large: numerator and "
            f"denominator may be at most {MAX_CONSTANT}"
        )
    for var, exponent in size.exponents:
        if abs(exponent) > MAX_EXPONENT:
            raise SizeError(
                f"{what} has size {size}, with {var.name} to the power {exponent}; exponents lie "
                f"between -{MAX_EXPONENT} and {MAX_EXPONENT}"
            )
    return size


@dataclass(frozen=True)
class Dim:
    """A named dim of a given size, for inputs and weight-only weight dims.

    >>> from kdsl.lang.sizes import primary
    >>> C, r = primary("C r")
    >>> Dim("C_in", C * r**2).size
    Size(C*r**2)
    """

    name: str
    size: Size

    def __post_init__(self) -> None:
        check_name(self.name, "dim")
        object.__setattr__(self, "size", check_size(self.size, f"dim {self.name}"))


class OperatorParts(Protocol):
    """What printing needs of an operator (a linear operator's :class:`kdsl.lang.chain.Chain` has it)."""

    inputs: tuple[Dim, ...]
    steps: tuple[Primitive, ...]
    outputs: tuple[Dim, ...]
    defaults: tuple[tuple[str, int], ...]


def dim_of(item: object, what: str) -> Dim:
    """A Dim from a Dim or a plain variable (whose name names the dim)."""
    if isinstance(item, Dim):
        return item
    if isinstance(item, Size):
        if item.variable_name is None:
            raise ShapeError(f"{what}: the size {item} needs a name; write Dim('name', {item})")
        return Dim(item.variable_name, item)
    raise ShapeError(f"{what}: expected a variable or Dim('name', size), got {item!r}")


@dataclass(frozen=True)
class Weight:
    """A weight tensor. Each entry is a dim of the data it shares (a name, or a size that
    identifies it) or a weight-only dim (``Dim(name, size)``, or a variable that names no live
    dim, like ``Cout`` in conv2d), which becomes a new dim of the result.

    Resolved by :class:`Share`: then ``dims`` holds every dim with its size and ``new`` says which
    are weight-only.
    """

    entries: tuple[object, ...]
    name: str | None = None
    dims: tuple[Dim, ...] = ()
    new: tuple[bool, ...] = ()

    def __init__(self, *entries: object, name: str | None = None) -> None:
        if not entries:
            raise ShapeError("a Weight needs at least one dim")
        if name is not None:
            check_name(name, "weight")
        object.__setattr__(self, "entries", tuple(entries))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "dims", ())
        object.__setattr__(self, "new", ())

    @property
    def resolved(self) -> bool:
        return bool(self.dims)

    @property
    def shape(self) -> tuple[Size, ...]:
        return tuple(d.size for d in self.dims)

    def _resolved(self, name: str, dims: tuple[Dim, ...], new: tuple[bool, ...]) -> Weight:
        clone = Weight(*dims, name=name)
        object.__setattr__(clone, "dims", dims)
        object.__setattr__(clone, "new", new)
        return clone


# ------------------------------------------------------------------------------------------------
# Primitives
# ------------------------------------------------------------------------------------------------


#: Algebraic facts, read by every pass instead of asking for a class (tinygrad's sets of ops).
VIEW = "view"  # rearranges, replicates or drops data; costs no arithmetic
HEAVY = "heavy"  # can make the data larger (the planner orders these to minimize FLOPs)
ONE_TO_MANY = "one-to-many"  # an input element reaches several output elements
WINDOWING = "windowing"  # reads outside the input are zero (a sliding window)
DROPS = "drops"  # skips input elements (valid only on windowed or repeated dims)
REDUCTION = "reduction"  # sums a dim away
CONTRACTION = "contraction"  # multiplies by a weight
LINEAR = "linear"  # linear in the data input (all eight primitives are)


@dataclass(frozen=True)
class Field:
    """One parameter of a primitive, as the DSL text, the JSON form and the content key see it.

    ``kind`` is ``"ref"`` (a live dim: a name, or a size that identifies it), ``"refs"`` (several,
    as ``*dims``), ``"name"`` (a new dim's name), ``"size"``, ``"int"``, ``"bool"``, ``"choice"`` (one
    of the primitive's ``choices``), ``"number"`` (a float) or ``"weight"``. An ``optional`` field may be left out
    when written by hand (and given as a keyword); the printer leaves a field out when it equals
    ``default``.
    """

    name: str
    kind: str
    optional: bool = False
    default: object = None
    #: printed as ``name=value`` (fields after a ``refs`` field, which takes ``*dims``)
    keyword: bool = False


@dataclass(frozen=True)
class Requirement:
    """One condition a step puts on sizes: ``"integral"`` (``sizes[0]`` is a positive integer) or
    ``"window"`` (a window ``sizes[0]`` smaller than the dim ``sizes[1]`` it slides over). ``dim``
    names the dim concerned; ``what`` prefixes the size in messages (``"the outer dim g: "``)."""

    kind: str
    sizes: tuple[Size, ...]
    dim: str | None
    what: str = ""


class Primitive:
    """Base class: a primitive is a frozen dataclass declaring, once, everything passes need.

    * :meth:`apply`, its shape rule (resolve references, update the live dims);
    * ``fields`` (text, JSON, content key), ``ports`` (names of its produced dims in the key);
    * ``facts`` (:data:`VIEW`, :data:`HEAVY`, ...) and ``rank`` (canonical order of independent
      adjacent steps: reductions, then 1-to-1 views, then contractions, then 1-to-many views);
    * :meth:`coordinate`, its bottom-up coordinate rule over :mod:`kdsl.lang.index` (views only).

    Backends and search keep one table each, with one entry per primitive kind
    (:data:`PRIMITIVES`); a test checks that no table has a gap.
    """

    kind: ClassVar[str]
    fields: ClassVar[tuple[Field, ...]]
    ports: ClassVar[tuple[str, ...]] = ()
    facts: ClassVar[frozenset[str]]
    rank: ClassVar[int]
    #: whether the dims it refers to live on as new versions (a shifted, strided or unfolded dim)
    keeps: ClassVar[bool] = False

    @property
    def consumes(self) -> tuple[str, ...]:
        """The resolved dims this step consumes: its ``ref`` fields."""
        return tuple(getattr(self, f.name) for f in self.fields if f.kind == "ref")

    @property
    def produces(self) -> tuple[str, ...]:
        """The dims it produces: the ones it keeps (as new versions), then its ``name`` fields."""
        kept = self.consumes if self.keeps else ()
        return kept + tuple(getattr(self, f.name) for f in self.fields if f.kind == "name")

    def apply(self, live: Live, context: BuildContext) -> Primitive:
        """Resolve references against ``live``, update it in place, return the resolved step."""
        raise NotImplementedError

    def expand(self) -> tuple[Primitive, ...]:
        """The single-dim steps this primitive stands for (only Reduce has several)."""
        return (self,)

    def describe(self) -> str:
        """A short form of a resolved step for messages: its dims, sizes and numbers, and a
        weight's name, e.g. ``Split(Cin, Cin/G)``, ``Share(w)`` or ``Fold(kh, kw, max)``."""
        parts = []
        for f in self.fields:
            value = getattr(self, f.name)
            if f.kind in ("ref", "size", "int", "choice"):
                parts.append(str(value))
            elif f.kind == "refs":
                parts.extend(str(v) for v in value)
            elif f.kind == "number" and value != f.default:
                parts.append(repr(value))
            elif f.kind == "weight":
                parts.append(str(value.name))
        return f"{self.kind}({', '.join(parts)})"

    def renamed(self, consumed: Mapping[str, str], produced: Mapping[str, str]) -> Primitive:
        """The same resolved step with its consumed dims and its produced dims renamed (a dim it
        both consumes and produces, like a Shift's, is looked up in ``consumed``)."""
        values = self.values()
        for f in self.fields:
            value = values[f.name]
            if f.kind == "ref":
                values[f.name] = consumed[value]  # type: ignore[index]
            elif f.kind == "name":
                values[f.name] = produced[value]  # type: ignore[index]
            elif f.kind == "weight":
                assert isinstance(value, Weight) and value.name is not None
                dims = tuple(Dim(produced[d.name], d.size) for d in value.dims)
                values[f.name] = value._resolved(value.name, dims, value.new)
        return type(self).from_values(values)

    def at(self, binding: Mapping[str, int]) -> Primitive:
        """The same step with its sizes evaluated at ``binding`` (constant sizes): backends that lower
        at one layer walk coordinates over these, so identities of size-1 dims apply."""
        values = self.values()
        for f in self.fields:
            if f.kind == "size":
                values[f.name] = Size.of(int(values[f.name].evaluate(binding)))  # type: ignore[union-attr]
        return type(self).from_values(values)

    def substituted(self, values: Mapping[str, Size]) -> Primitive:
        """The same resolved step with the variables named in ``values`` replaced in its sizes and
        its weights' dims (shape matching solves a dynamic variable this way)."""
        if not any(name in values for size in self.sizes() for name in (v.name for v in size.variables)):
            return self  # unchanged steps keep their identity (chains share steps by identity)
        fields = self.values()
        for f in self.fields:
            value = fields[f.name]
            if f.kind == "size":
                fields[f.name] = value.substitute(values)  # type: ignore[union-attr]
            elif f.kind == "weight" and isinstance(value, Weight) and value.resolved:
                dims = tuple(Dim(d.name, d.size.substitute(values)) for d in value.dims)
                fields[f.name] = value._resolved(value.name or "", dims, value.new)
        return type(self).from_values(fields)

    def values(self) -> dict[str, object]:
        """The resolved step's field values, by field name."""
        return {f.name: getattr(self, f.name) for f in self.fields}

    @classmethod
    def from_values(cls, values: dict[str, object]) -> Primitive:
        """The primitive with these field values (the inverse of :meth:`values`)."""
        return cls(**values)

    def weights(self) -> tuple[Weight, ...]:
        """The weights the step shares (its ``weight`` fields)."""
        return tuple(getattr(self, f.name) for f in self.fields if f.kind == "weight")

    def sizes(self) -> tuple[Size, ...]:
        """The sizes a resolved step mentions (its variables are the operator's)."""
        found = [getattr(self, f.name) for f in self.fields if f.kind == "size"]
        for weight in self.weights():
            found.extend(d.size for d in weight.dims)
        return tuple(found)

    def requirements(self, before: Mapping[str, Size], after: Mapping[str, Size]) -> list[Requirement]:
        """What the sizes must satisfy at every layer for this step to be valid (the solver's
        constraints): ``before``/``after`` are the live sizes around the step."""
        return []

    def coordinate(self, coords: dict[str, Index], sizes: Mapping[str, Size]) -> Guard | None:
        """Bottom-up: replace the coordinates of the dims this view produces by those of the dims it
        consumes (``sizes``: the live sizes before the step). Returns the guard of a windowed read."""
        raise TypeError(f"{self.kind} is not a view; it has no coordinate rule")

    def __rshift__(self, other: object) -> object:
        return Pipeline((self,)) >> other


class WeightNames(Protocol):
    """Weights shared before a build, as the build needs them: how many, and whether a name is
    taken (a branching kernel's tensor hands its weights over so, without copying them)."""

    def __len__(self) -> int: ...

    def __contains__(self, name: object) -> bool: ...


@dataclass
class BuildContext:
    """What a build carries besides live dims: the weights shared so far (and their names, so
    that a duplicate is found in O(1)), after the ``earlier`` ones (the weights a branching
    kernel's tensor already reads: copying them into every chain and step built on the tensor
    made a kernel of many weighted blocks quadratic to build)."""

    weights: list[Weight] = field(default_factory=list)
    earlier: WeightNames | None = None
    names: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.names = {w.name for w in self.weights if w.name is not None}

    def count(self) -> int:
        """How many weights are shared so far, the earlier ones included (numbers ``w1, w2, ...``)."""
        return len(self.weights) + (len(self.earlier) if self.earlier is not None else 0)

    def taken(self, name: str) -> bool:
        return name in self.names or (self.earlier is not None and name in self.earlier)

    def add(self, weight: Weight) -> None:
        self.weights.append(weight)
        if weight.name is not None:
            self.names.add(weight.name)

    def copy(self) -> BuildContext:
        return BuildContext(list(self.weights), self.earlier)


def _role(step: str, detail: str) -> str:
    return f"{step}({detail})"


@dataclass(frozen=True)
class Split(Primitive):
    """``[G*B] -> [G, B]``: ``out[i, j] = in[B*i + j]``. ``block`` is B, the inner size.

    >>> from kdsl.lang.sizes import primary, coefficient
    >>> Cin = primary("Cin"); G = coefficient("G")
    >>> Split(Cin, Cin / G, "g", "ci").block
    Size(Cin/G)
    """

    dim: DimRef
    block: Size
    outer: str | None = None
    inner: str | None = None
    kind: ClassVar[str] = "Split"
    fields: ClassVar[tuple[Field, ...]] = (
        Field("dim", "ref"),
        Field("block", "size"),
        Field("outer", "name", optional=True),
        Field("inner", "name", optional=True),
    )
    ports: ClassVar[tuple[str, ...]] = ("outer", "inner")
    facts: ClassVar[frozenset[str]] = frozenset({VIEW, LINEAR})
    rank: ClassVar[int] = 1

    def apply(self, live: Live, context: BuildContext) -> Split:
        role = _role("Split", f"{self.dim}, {self.block}")
        name = live.resolve(self.dim, role)
        size = live.size(name)
        block = check_size(self.block, f"{role}: the block")
        outer = check_name(self.outer or f"{name}_o", "Split outer")
        inner = check_name(self.inner or f"{name}_i", "Split inner")
        outer_size = check_size(size / block, f"{role}: the outer dim {outer} ({size}/{block})")
        live.replace(name, [(outer, outer_size), (inner, block)], role, windowed=name in live.windowed)
        return Split(name, block, outer, inner)

    def coordinate(self, coords: dict[str, Index], sizes: Mapping[str, Size]) -> Guard | None:
        outer, inner = coords.pop(self.outer), coords.pop(self.inner)
        # a side of size 1 has the coordinate 0 (exact; at a binding, backends then emit no dead index
        # arithmetic: TVM 0.27 inverted `o*1 + i` forms wrongly when inlining copies)
        if self.block == 1:
            coords[self.dim] = outer
        elif sizes[self.dim] == self.block:
            coords[self.dim] = inner
        else:
            coords[self.dim] = outer * self.block + inner
        return None

    def requirements(self, before: Mapping[str, Size], after: Mapping[str, Size]) -> list[Requirement]:
        return [
            Requirement("integral", (self.block,), self.inner),
            Requirement("integral", (after[self.outer],), self.outer, f"the outer dim {self.outer}: "),
        ]


@dataclass(frozen=True)
class Merge(Primitive):
    """``[A, B] -> [A*B]``: ``out[i] = in[i // B, i % B]`` (``outer`` is A, ``inner`` is B)."""

    outer: DimRef
    inner: DimRef
    name: str | None = None
    kind: ClassVar[str] = "Merge"
    fields: ClassVar[tuple[Field, ...]] = (
        Field("outer", "ref"),
        Field("inner", "ref"),
        Field("name", "name", optional=True),
    )
    facts: ClassVar[frozenset[str]] = frozenset({VIEW, LINEAR})
    rank: ClassVar[int] = 1

    def apply(self, live: Live, context: BuildContext) -> Merge:
        role = _role("Merge", f"{self.outer}, {self.inner}")
        outer = live.resolve(self.outer, role)
        inner = live.resolve(self.inner, role)
        if outer == inner:
            raise ShapeError(f"{role}: cannot merge the dim {outer} with itself")
        name = check_name(self.name or f"{outer}_{inner}", "Merge")
        size = live.size(outer) * live.size(inner)
        windowed = outer in live.windowed or inner in live.windowed
        live.merge(outer, inner, name, size, role, windowed=windowed)
        return Merge(outer, inner, name)

    def coordinate(self, coords: dict[str, Index], sizes: Mapping[str, Size]) -> Guard | None:
        merged, block = coords.pop(self.name), sizes[self.inner]
        if block == 1:  # the inner dim has one element: the merged coordinate is the outer one
            coords[self.outer], coords[self.inner] = merged, Const(0)
        elif sizes[self.outer] == 1:
            coords[self.outer], coords[self.inner] = Const(0), merged
        else:
            coords[self.outer] = merged // block
            coords[self.inner] = merged % block
        return None


@dataclass(frozen=True)
class Shift(Primitive):
    """``[N] -> [N]``: ``out[i] = in[(i + offset) mod N]`` (a cyclic shift; offset 1 by default)."""

    dim: DimRef
    offset: int = 1
    kind: ClassVar[str] = "Shift"
    keeps: ClassVar[bool] = True
    fields: ClassVar[tuple[Field, ...]] = (Field("dim", "ref"), Field("offset", "int", optional=True, default=1))
    facts: ClassVar[frozenset[str]] = frozenset({VIEW, LINEAR})
    rank: ClassVar[int] = 1

    def apply(self, live: Live, context: BuildContext) -> Shift:
        role = _role("Shift", f"{self.dim}")
        check_offset(self.offset, role)
        name = live.resolve(self.dim, role)
        return Shift(name, self.offset)

    def coordinate(self, coords: dict[str, Index], sizes: Mapping[str, Size]) -> Guard | None:
        coords[self.dim] = Cyclic(coords[self.dim], self.offset, sizes[self.dim])
        return None


@dataclass(frozen=True)
class Expand(Primitive):
    """``[] -> [C]``: a new dim of size C along which the data repeats."""

    name: str
    size: Size
    kind: ClassVar[str] = "Expand"
    fields: ClassVar[tuple[Field, ...]] = (Field("name", "name"), Field("size", "size"))
    facts: ClassVar[frozenset[str]] = frozenset({VIEW, HEAVY, ONE_TO_MANY, LINEAR})
    rank: ClassVar[int] = 3

    def apply(self, live: Live, context: BuildContext) -> Expand:
        name = check_name(self.name, "Expand")
        size = check_size(self.size, f"Expand({name})")
        live.add(name, size, f"Expand({name})")
        live.windowed.add(name)
        return Expand(name, size)

    def coordinate(self, coords: dict[str, Index], sizes: Mapping[str, Size]) -> Guard | None:
        coords.pop(self.name)  # the data does not vary along a repeated dim
        return None

    def requirements(self, before: Mapping[str, Size], after: Mapping[str, Size]) -> list[Requirement]:
        return [Requirement("integral", (self.size,), self.name)]


@dataclass(frozen=True)
class Unfold(Primitive):
    """``[N] -> [N, K]``: ``out[i, j] = in[i + j - K//2]``, zero where that is outside ``[0, N)``.

    The dim keeps its name; the window is a new dim called ``name`` (default ``{dim}_{K}``).
    """

    dim: DimRef
    window: Size
    name: str | None = None
    kind: ClassVar[str] = "Unfold"
    keeps: ClassVar[bool] = True
    fields: ClassVar[tuple[Field, ...]] = (
        Field("dim", "ref"),
        Field("window", "size"),
        Field("name", "name", optional=True),
    )
    ports: ClassVar[tuple[str, ...]] = ("main", "window")
    facts: ClassVar[frozenset[str]] = frozenset({VIEW, HEAVY, ONE_TO_MANY, WINDOWING, LINEAR})
    rank: ClassVar[int] = 3

    def apply(self, live: Live, context: BuildContext) -> Unfold:
        role = _role("Unfold", f"{self.dim}, {self.window}")
        dim = live.resolve(self.dim, role)
        window = check_size(self.window, f"{role}: the window")
        ratio = window / live.size(dim)
        if ratio.is_constant and ratio.constant >= 1:
            raise ShapeError(
                f"{role}: the window {window} is never smaller than the dim {dim} of size {live.size(dim)}"
            )
        default = f"{dim}_{window}" if window.variable_name else f"{dim}_win"
        name = check_name(self.name or default, "Unfold window")
        live.add(name, window, role)
        live.windowed.update((dim, name))
        return Unfold(dim, window, name)

    def coordinate(self, coords: dict[str, Index], sizes: Mapping[str, Size]) -> Guard | None:
        offset = coords.pop(self.name)
        if self.window == 1:  # a window of one reads in place: always in range, nothing to guard
            return None
        source = coords[self.dim] + offset - Half(self.window)
        coords[self.dim] = source
        # bounded by the size of the dim being unfolded, never by the window's
        return Guard(source, sizes[self.dim], self.dim, self.window)

    def requirements(self, before: Mapping[str, Size], after: Mapping[str, Size]) -> list[Requirement]:
        return [
            Requirement("integral", (self.window,), self.name),
            Requirement("window", (self.window, before[self.dim]), self.dim),
        ]


@dataclass(frozen=True)
class Stride(Primitive):
    """``[S*K] -> [K]``: ``out[i] = in[S*i]``. It skips data, so it must act on a dim that comes
    from an Unfold (its window or its sliding dim) or an Expand."""

    dim: DimRef
    stride: Size
    kind: ClassVar[str] = "Stride"
    keeps: ClassVar[bool] = True
    fields: ClassVar[tuple[Field, ...]] = (Field("dim", "ref"), Field("stride", "size"))
    facts: ClassVar[frozenset[str]] = frozenset({VIEW, DROPS, LINEAR})
    rank: ClassVar[int] = 3

    def apply(self, live: Live, context: BuildContext) -> Stride:
        role = _role("Stride", f"{self.dim}, {self.stride}")
        name = live.resolve(self.dim, role)
        stride = check_size(self.stride, f"{role}: the stride")
        if name not in live.windowed:
            raise ValidityError(
                f"{role}: striding the dim {name} would drop input elements; Stride must act on a dim "
                f"that comes from an Unfold (window or sliding dim) or an Expand"
            )
        new_size = check_size(live.size(name) / stride, f"{role}: the strided dim {name}")
        live.resize(name, new_size)
        return Stride(name, stride)

    def coordinate(self, coords: dict[str, Index], sizes: Mapping[str, Size]) -> Guard | None:
        coords[self.dim] = coords[self.dim] * self.stride
        return None

    def requirements(self, before: Mapping[str, Size], after: Mapping[str, Size]) -> list[Requirement]:
        return [Requirement("integral", (after[self.dim],), self.dim)]


@dataclass(frozen=True, init=False)
class Reduce(Primitive):
    """``[N] -> []``: sum over the dim (``mean=True`` divides by its size).

    ``Reduce(Cin, "kh", "kw")`` is shorthand for three Reduces, one per dim, in that order.
    """

    dims: tuple[DimRef, ...]
    mean: bool
    kind: ClassVar[str] = "Reduce"
    fields: ClassVar[tuple[Field, ...]] = (Field("dim", "ref"), Field("mean", "bool", optional=True, default=False))
    facts: ClassVar[frozenset[str]] = frozenset({REDUCTION, LINEAR})
    rank: ClassVar[int] = 0

    def __init__(self, *dims: DimRef, mean: bool = False) -> None:
        if not dims:
            raise ShapeError("Reduce() needs at least one dim")
        object.__setattr__(self, "dims", tuple(dims))
        object.__setattr__(self, "mean", mean)

    @classmethod
    def from_values(cls, values: dict[str, object]) -> Primitive:
        return cls(values["dim"], mean=values.get("mean", False))  # type: ignore[arg-type]

    def expand(self) -> tuple[Primitive, ...]:
        return tuple(Reduce(d, mean=self.mean) for d in self.dims)

    @property
    def dim(self) -> DimRef:
        return self.dims[0]

    def apply(self, live: Live, context: BuildContext) -> Reduce:
        role = _role("Reduce", f"{self.dim}")
        if not isinstance(self.mean, bool):
            raise ShapeError(f"{role}: mean must be True or False, got {self.mean!r}")
        name = live.resolve(self.dim, role)
        live.remove(name)
        return Reduce(name, mean=self.mean)


@dataclass(frozen=True)
class Share(Primitive):
    """Multiply the data by a weight: dims the weight shares with the data index both
    (``out[i] = in[i] * w[i]``); the weight's own dims become new dims of the result."""

    weight: Weight | str
    kind: ClassVar[str] = "Share"
    fields: ClassVar[tuple[Field, ...]] = (Field("weight", "weight"),)
    facts: ClassVar[frozenset[str]] = frozenset({CONTRACTION, HEAVY, LINEAR})
    rank: ClassVar[int] = 2

    def apply(self, live: Live, context: BuildContext) -> Share:
        weight = self.weight
        if isinstance(weight, str):
            raise ShapeError(f"Share({weight!r}): Share takes a Weight(...), not a name")
        if not isinstance(weight, Weight):
            raise ShapeError(f"Share: expected a Weight(...), got {weight!r}")
        name = weight.name or f"w{context.count() + 1}"
        role = f"Share({name})"
        if context.taken(name):
            raise ShapeError(f"{role}: a weight named {name!r} is already shared; give each weight its own name")
        dims: list[Dim] = []
        new: list[bool] = []
        for entry in weight.entries:
            if isinstance(entry, Dim):
                if entry.name in live:
                    if live.size(entry.name) is not entry.size:
                        raise ShapeError(
                            f"{role}: Dim({entry.name!r}, {entry.size}) names the live dim {entry.name} "
                            f"of size {live.size(entry.name)}; use another name for a weight-only dim"
                        )
                    dims.append(entry)
                    new.append(False)
                else:
                    dims.append(entry)
                    new.append(True)
            elif isinstance(entry, str):
                shared = live.resolve(entry, role)
                dims.append(Dim(shared, live.size(shared)))
                new.append(False)
            elif isinstance(entry, Size):
                shared = live.find(entry)
                if shared is None:
                    dims.append(dim_of(entry, role))
                    new.append(True)
                else:
                    dims.append(Dim(shared, entry))
                    new.append(False)
            else:
                raise ShapeError(f"{role}: a weight dim must be a name, a size or Dim(name, size), got {entry!r}")
        duplicated = sorted(n for n, count in Counter(d.name for d in dims).items() if count > 1)
        if duplicated:
            raise ShapeError(f"{role}: the weight lists the dim {duplicated[0]} twice")
        for dim, is_new in zip(dims, new):
            if is_new:
                live.add(dim.name, check_size(dim.size, f"{role}: weight dim {dim.name}"), role)
        resolved = weight._resolved(name, tuple(dims), tuple(new))
        context.add(resolved)
        return Share(resolved)

    def requirements(self, before: Mapping[str, Size], after: Mapping[str, Size]) -> list[Requirement]:
        weight = self.weight
        assert isinstance(weight, Weight)
        return [
            Requirement("integral", (d.size,), d.name, f"the weight dim {d.name}: ")
            for d, new in zip(weight.dims, weight.new)
            if new
        ]

    @property
    def consumes(self) -> tuple[str, ...]:
        weight = self.weight
        assert isinstance(weight, Weight)
        return tuple(d.name for d, is_new in zip(weight.dims, weight.new) if not is_new)

    @property
    def produces(self) -> tuple[str, ...]:
        weight = self.weight
        assert isinstance(weight, Weight)
        return tuple(d.name for d in weight.dims)


# ------------------------------------------------------------------------------------------------
# Pipelines
# ------------------------------------------------------------------------------------------------


class Pipeline:
    """A sequence of primitives, composable with ``>>`` and applicable to an Input."""

    __slots__ = ("primitives", "output")

    def __init__(self, primitives: tuple[Primitive, ...], output: Output | None = None) -> None:
        self.primitives = primitives
        self.output = output

    def __rshift__(self, other: object) -> Pipeline:
        if self.output is not None:
            raise ShapeError("nothing can follow Output(...) in a pipeline")
        if isinstance(other, Primitive):
            return Pipeline(self.primitives + (other,))
        if isinstance(other, Pipeline):
            return Pipeline(self.primitives + other.primitives, other.output)
        if isinstance(other, Output):
            return Pipeline(self.primitives, other)
        raise ShapeError(f"cannot compose a pipeline with {other!r}; expected a primitive, pipeline or Output")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pipeline) and (self.primitives, self.output) == (other.primitives, other.output)

    def __hash__(self) -> int:
        return hash(self.primitives)

    def __repr__(self) -> str:
        return " >> ".join(repr(p) for p in self.primitives) or "Pipeline()"


@dataclass(frozen=True, init=False)
class Output:
    """Declares the output dims in order; every live dim must be listed exactly once.

    ``defaults`` gives preferred values of coefficient variables (``{"K": 3}``), used when a layer
    does not bind them.
    """

    refs: tuple[object, ...]
    defaults: tuple[tuple[str, int], ...]

    def __init__(self, *refs: object, defaults: Mapping[str, int] | None = None) -> None:
        if not refs:
            raise ShapeError("Output() needs the output dims in order")
        items: tuple[tuple[str, int], ...] = ()
        if defaults is not None:
            if not isinstance(defaults, Mapping):
                raise ShapeError(f"Output(defaults=...) must be a dict of coefficient values, got {defaults!r}")
            for key, value in defaults.items():
                check_identifier(key, "Output(defaults=...): coefficient")
                if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_CONSTANT:
                    raise SizeError(
                        f"Output(defaults=...): {key}: {value!r:.80} must be a positive int at most {MAX_CONSTANT}"
                    )
            items = tuple(sorted(defaults.items()))
        object.__setattr__(self, "refs", tuple(refs))
        object.__setattr__(self, "defaults", items)


PRIMITIVES: dict[str, type[Primitive]] = {
    cls.kind: cls for cls in (Split, Merge, Shift, Expand, Unfold, Stride, Reduce, Share)
}
reserve(*PRIMITIVES)  # a name the DSL binds cannot also name a dim, weight or variable

__all__ = [
    "CONTRACTION",
    "DROPS",
    "HEAVY",
    "LINEAR",
    "ONE_TO_MANY",
    "PRIMITIVES",
    "REDUCTION",
    "VIEW",
    "WINDOWING",
    "Field",
    "Output",
    "Pipeline",
    "Dim",
    "DimRef",
    "Expand",
    "OperatorParts",
    "Merge",
    "Primitive",
    "Requirement",
    "Reduce",
    "Share",
    "Shift",
    "Split",
    "Stride",
    "Unfold",
    "Weight",
]
