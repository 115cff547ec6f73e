"""The primitives of kdsl, each declared once: fields, shape rule, semantics.

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
Slide     ``[N] -> [P, K]``       ``out[i, j] = in[s*i + j]``, ``P = (N-K)//s + 1`` (no padding)
Dilate    ``[N] -> [s*N]``        ``out[i] = in[i / s]`` where s divides i, else 0
Reduce    ``[N] -> []``           ``out = sum_i in[i]`` (or the mean)
Share     data ``[N]``, weight    ``out[i] = in[i] * w[i]``; weight-only dims
          ``[N]`` -> ``[N]``      become new dims of the result
========  ======================  ================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from kdsl.lang.errors import KdslError, ShapeError, ValidityError
from kdsl.lang.index import Const, Cyclic, Guard, Half, Index
from kdsl.lang.live import Live
from kdsl.lang.names import check_offset, reserve

# the base of every primitive, re-exported: the vocabulary users import from here
from kdsl.lang.primitive_base import (
    CONTRACTION,
    DROPS,
    HEAVY,
    LINEAR,
    ONE_TO_MANY,
    REDUCTION,
    VIEW,
    WINDOWING,
    BuildContext,
    Dim,
    DimRef,
    Field,
    OperatorParts,
    Output,
    Pipeline,
    Primitive,
    Requirement,
    Weight,
    check_name,
    check_size,
    dim_of,
    step_role,
)
from kdsl.lang.sizes import Size

#: the size 1 (sizes are interned: this is the one object every ``Size.of(1)`` gives)
_ONE = Size.of(1)


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
        role = step_role("Split", f"{self.dim}, {self.block}")
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
        role = step_role("Merge", f"{self.outer}, {self.inner}")
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
        role = step_role("Shift", f"{self.dim}")
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
        role = step_role("Unfold", f"{self.dim}, {self.window}")
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
        role = step_role("Stride", f"{self.dim}, {self.stride}")
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


@dataclass(frozen=True)
class Slide(Primitive):
    """``[N] -> [P, K]``: a window without padding (PyTorch's ``padding=0``, a "valid" convolution):
    ``out[i, j] = in[s*i + j]`` for ``i < P``, ``j < K``, every read inside ``[0, N)``.

    ``size`` is P, the number of windows, named by the user (a monomial like ``Ho``, since ``N-K+1``
    is no monomial); the solver checks ``P = (N - K) // s + 1`` at every layer, PyTorch's floor rule,
    so a stride that does not divide ``N - K`` drops the last rows as PyTorch does. The sliding dim
    keeps its name with the size P; the window is a new dim called ``name`` (default ``{dim}_{K}``).

    >>> from kdsl.lang.sizes import primary, coefficient
    >>> H, Ho = primary("H Ho"); K, s = coefficient("K s")
    >>> Slide(H, K, Ho, "kh", stride=s).describe()
    'Slide(H, K, Ho, s)'
    """

    dim: DimRef
    window: Size
    size: Size
    name: str | None = None
    stride: Size = _ONE
    kind: ClassVar[str] = "Slide"
    keeps: ClassVar[bool] = True
    fields: ClassVar[tuple[Field, ...]] = (
        Field("dim", "ref"),
        Field("window", "size"),
        Field("size", "size"),
        Field("name", "name", optional=True),
        Field("stride", "size", optional=True, default=_ONE, keyword=True),
    )
    ports: ClassVar[tuple[str, ...]] = ("main", "window")
    # no WINDOWING: it never reads outside the input, so nothing is zero-padded
    facts: ClassVar[frozenset[str]] = frozenset({VIEW, HEAVY, ONE_TO_MANY, LINEAR})
    rank: ClassVar[int] = 3

    def apply(self, live: Live, context: BuildContext) -> Slide:
        role = step_role("Slide", f"{self.dim}, {self.window}, {self.size}")
        dim = live.resolve(self.dim, role)
        window = check_size(self.window, f"{role}: the window")
        size = check_size(self.size, f"{role}: the number of windows")
        try:
            stride = Size.of(self.stride)
        except KdslError as error:
            raise ShapeError(f"{role}: the stride: {error.message}") from None
        if stride != 1:
            stride = check_size(stride, f"{role}: the stride")
        ratio = window / live.size(dim)
        if ratio.is_constant and ratio.constant > 1:
            raise ShapeError(f"{role}: the window {window} is larger than the dim {dim} of size {live.size(dim)}")
        default = f"{dim}_{window}" if window.variable_name else f"{dim}_win"
        name = check_name(self.name or default, "Slide window")
        live.resize(dim, size)
        live.add(name, window, role)
        live.windowed.update((dim, name))
        return Slide(dim, window, size, name, stride)

    def coordinate(self, coords: dict[str, Index], sizes: Mapping[str, Size]) -> Guard | None:
        # s*i + j: inside [0, N) whenever P = (N-K)//s + 1 (the solver's check), so no guard
        offset = coords.pop(self.name)
        coords[self.dim] = coords[self.dim] * self.stride + offset
        return None

    def requirements(self, before: Mapping[str, Size], after: Mapping[str, Size]) -> list[Requirement]:
        found = [
            Requirement("integral", (self.window,), self.name),
            Requirement("integral", (self.size,), self.dim, "the number of windows "),
        ]
        if self.stride != 1:
            found.append(Requirement("integral", (self.stride,), self.dim, "the stride "))
        found.append(Requirement("slide", (before[self.dim], self.window, self.size, self.stride), self.dim))
        return found


@dataclass(frozen=True)
class Dilate(Primitive):
    """``[N] -> [s*N]``: ``out[i] = in[i / s]`` where ``s`` divides ``i``, else 0: ``s - 1`` zeros after
    every element (the zero insertion of a transposed convolution, which a window then slides over).

    >>> from kdsl.lang.sizes import primary, coefficient
    >>> H = primary("H"); s = coefficient("s")
    >>> Dilate(H, s).describe()
    'Dilate(H, s)'
    """

    dim: DimRef
    factor: Size
    kind: ClassVar[str] = "Dilate"
    keeps: ClassVar[bool] = True
    fields: ClassVar[tuple[Field, ...]] = (Field("dim", "ref"), Field("factor", "size"))
    facts: ClassVar[frozenset[str]] = frozenset({VIEW, HEAVY, LINEAR})
    rank: ClassVar[int] = 3

    def apply(self, live: Live, context: BuildContext) -> Dilate:
        role = step_role("Dilate", f"{self.dim}, {self.factor}")
        name = live.resolve(self.dim, role)
        factor = check_size(self.factor, f"{role}: the factor")
        live.resize(name, check_size(live.size(name) * factor, f"{role}: the dilated dim {name}"))
        return Dilate(name, factor)

    def coordinate(self, coords: dict[str, Index], sizes: Mapping[str, Size]) -> Guard | None:
        if self.factor == 1:  # at a binding with s = 1: a plain copy
            return None
        spread = coords[self.dim]
        coords[self.dim] = spread // self.factor
        # a read between two elements is one of the inserted zeros
        return Guard(spread, sizes[self.dim] * self.factor, self.dim, Size.of(1), False, self.factor)

    def requirements(self, before: Mapping[str, Size], after: Mapping[str, Size]) -> list[Requirement]:
        return [Requirement("integral", (self.factor,), self.dim, "the factor ")]


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
        role = step_role("Reduce", f"{self.dim}")
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


PRIMITIVES: dict[str, type[Primitive]] = {
    cls.kind: cls for cls in (Split, Merge, Shift, Expand, Unfold, Stride, Slide, Dilate, Reduce, Share)
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
    "Dilate",
    "Expand",
    "OperatorParts",
    "Merge",
    "Primitive",
    "Requirement",
    "Reduce",
    "Share",
    "Shift",
    "Slide",
    "Split",
    "Stride",
    "Unfold",
    "Weight",
]
