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

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from kdsl.lang.errors import AmbiguousDimError, ShapeError, SizeError, UnboundDimError
from kdsl.lang.sizes import Size

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: A reference to a live dim: its name, or a size that only that dim has.
DimRef = str | Size


def check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ShapeError(f"{what} name {name!r} must be an identifier (letters, digits and _)")
    return name


def check_size(size: object, what: str) -> Size:
    """A created size must be a monomial with no primary variable in a denominator, and not 1."""
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
    return size


class Live:
    """The dims alive at one point of a build, in order: name -> size, plus which ones come from a
    sliding window (Unfold) or a repetition (Expand), which Stride needs to be valid."""

    __slots__ = ("sizes", "windowed")

    def __init__(self, sizes: dict[str, Size], windowed: frozenset[str]) -> None:
        self.sizes = sizes
        self.windowed = windowed

    def describe(self) -> str:
        return "[" + ", ".join(f"{n}: {s}" for n, s in self.sizes.items()) + "]"

    def resolve(self, ref: object, role: str) -> str:
        """The name of the live dim ``ref`` refers to.

        A string refers by name. A size refers to the one live dim of that size; when several
        have it, to the one whose name is the size's variable name (``Cin`` -> dim ``Cin``);
        otherwise the reference is ambiguous and the user must name the dim.
        """
        if isinstance(ref, str):
            if ref in self.sizes:
                return ref
            raise UnboundDimError(f"{role}: there is no dim named {ref!r}; the live dims are {self.describe()}")
        if not isinstance(ref, Size):
            raise ShapeError(f"{role}: {ref!r} is neither a dim name nor a size")
        found = self.find(ref)
        if found is None:
            raise UnboundDimError(f"{role}: no live dim has size {ref}; the live dims are {self.describe()}")
        return found

    def find(self, ref: Size) -> str | None:
        """Resolve a size reference; ``None`` if no dim has that size (ambiguity raises)."""
        matches = [n for n, s in self.sizes.items() if s is ref]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            return None
        if ref.variable_name in matches:
            return ref.variable_name
        raise AmbiguousDimError(
            f"size {ref} matches the dims {', '.join(matches)}; refer to one of them by name (a string)"
        )

    def add(self, name: str, size: Size, role: str) -> None:
        if name in self.sizes:
            raise ShapeError(f"{role}: a dim named {name!r} already exists; choose another name")
        self.sizes[name] = size


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


class Primitive:
    """Base class: a primitive is a frozen dataclass with :meth:`apply` (its shape rule)."""

    kind: ClassVar[str]
    #: the resolved dims this step consumes and produces, used by every pass
    consumes: tuple[str, ...]
    produces: tuple[str, ...]

    def apply(self, live: Live, context: BuildContext) -> Primitive:
        """Resolve references against ``live``, update it in place, return the resolved step."""
        raise NotImplementedError

    def expand(self) -> tuple[Primitive, ...]:
        """The single-dim steps this primitive stands for (only Reduce has several)."""
        return (self,)

    def __rshift__(self, other: object) -> object:
        from kdsl.lang.build import Pipeline

        return Pipeline((self,)) >> other


@dataclass
class BuildContext:
    """What a build carries besides live dims: the weights shared so far."""

    weights: list[Weight] = field(default_factory=list)


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

    def apply(self, live: Live, context: BuildContext) -> Split:
        role = _role("Split", f"{self.dim}, {self.block}")
        name = live.resolve(self.dim, role)
        size = live.sizes[name]
        block = check_size(self.block, f"{role}: the block")
        outer = check_name(self.outer or f"{name}_o", "Split outer")
        inner = check_name(self.inner or f"{name}_i", "Split inner")
        outer_size = check_size(size / block, f"{role}: the outer dim {outer} ({size}/{block})")
        _replace(live, name, [(outer, outer_size), (inner, block)], role, windowed=name in live.windowed)
        return Split(name, block, outer, inner)

    @property
    def consumes(self) -> tuple[str, ...]:
        return (self.dim,)

    @property
    def produces(self) -> tuple[str, ...]:
        return (self.outer, self.inner)


@dataclass(frozen=True)
class Merge(Primitive):
    """``[A, B] -> [A*B]``: ``out[i] = in[i // B, i % B]`` (``outer`` is A, ``inner`` is B)."""

    outer: DimRef
    inner: DimRef
    name: str | None = None
    kind: ClassVar[str] = "Merge"

    def apply(self, live: Live, context: BuildContext) -> Merge:
        role = _role("Merge", f"{self.outer}, {self.inner}")
        outer = live.resolve(self.outer, role)
        inner = live.resolve(self.inner, role)
        if outer == inner:
            raise ShapeError(f"{role}: cannot merge the dim {outer} with itself")
        name = check_name(self.name or f"{outer}_{inner}", "Merge")
        size = live.sizes[outer] * live.sizes[inner]
        windowed = outer in live.windowed or inner in live.windowed
        position = list(live.sizes).index(outer)
        del live.sizes[inner]
        _replace(live, outer, [(name, size)], role, windowed=windowed, position=position)
        live.windowed = live.windowed - {inner}
        return Merge(outer, inner, name)

    @property
    def consumes(self) -> tuple[str, ...]:
        return (self.outer, self.inner)

    @property
    def produces(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class Shift(Primitive):
    """``[N] -> [N]``: ``out[i] = in[(i + offset) mod N]`` (a cyclic shift; offset 1 by default)."""

    dim: DimRef
    offset: int = 1
    kind: ClassVar[str] = "Shift"

    def apply(self, live: Live, context: BuildContext) -> Shift:
        role = _role("Shift", f"{self.dim}")
        if isinstance(self.offset, bool) or not isinstance(self.offset, int) or self.offset == 0:
            raise ShapeError(f"{role}: the offset must be a nonzero integer, got {self.offset!r}")
        name = live.resolve(self.dim, role)
        return Shift(name, self.offset)

    @property
    def consumes(self) -> tuple[str, ...]:
        return (self.dim,)

    @property
    def produces(self) -> tuple[str, ...]:
        return (self.dim,)


@dataclass(frozen=True)
class Expand(Primitive):
    """``[] -> [C]``: a new dim of size C along which the data repeats."""

    name: str
    size: Size
    kind: ClassVar[str] = "Expand"

    def apply(self, live: Live, context: BuildContext) -> Expand:
        name = check_name(self.name, "Expand")
        size = check_size(self.size, f"Expand({name})")
        live.add(name, size, f"Expand({name})")
        live.windowed = live.windowed | {name}
        return Expand(name, size)

    @property
    def consumes(self) -> tuple[str, ...]:
        return ()

    @property
    def produces(self) -> tuple[str, ...]:
        return (self.name,)


@dataclass(frozen=True)
class Unfold(Primitive):
    """``[N] -> [N, K]``: ``out[i, j] = in[i + j - K//2]``, zero where that is outside ``[0, N)``.

    The dim keeps its name; the window is a new dim called ``name`` (default ``{dim}_{K}``).
    """

    dim: DimRef
    window: Size
    name: str | None = None
    kind: ClassVar[str] = "Unfold"

    def apply(self, live: Live, context: BuildContext) -> Unfold:
        role = _role("Unfold", f"{self.dim}, {self.window}")
        dim = live.resolve(self.dim, role)
        window = check_size(self.window, f"{role}: the window")
        ratio = window / live.sizes[dim]
        if ratio.is_constant and ratio.constant >= 1:
            raise ShapeError(
                f"{role}: the window {window} is never smaller than the dim {dim} of size {live.sizes[dim]}"
            )
        default = f"{dim}_{window}" if window.variable_name else f"{dim}_win"
        name = check_name(self.name or default, "Unfold window")
        live.add(name, window, role)
        live.windowed = live.windowed | {dim, name}
        return Unfold(dim, window, name)

    @property
    def consumes(self) -> tuple[str, ...]:
        return (self.dim,)

    @property
    def produces(self) -> tuple[str, ...]:
        return (self.dim, self.name)


@dataclass(frozen=True)
class Stride(Primitive):
    """``[S*K] -> [K]``: ``out[i] = in[S*i]``. It skips data, so it must act on a dim that comes
    from an Unfold (its window or its sliding dim) or an Expand."""

    dim: DimRef
    stride: Size
    kind: ClassVar[str] = "Stride"

    def apply(self, live: Live, context: BuildContext) -> Stride:
        from kdsl.lang.errors import ValidityError

        role = _role("Stride", f"{self.dim}, {self.stride}")
        name = live.resolve(self.dim, role)
        stride = check_size(self.stride, f"{role}: the stride")
        if name not in live.windowed:
            raise ValidityError(
                f"{role}: striding the dim {name} would drop input elements; Stride must act on a dim "
                f"that comes from an Unfold (window or sliding dim) or an Expand"
            )
        new_size = check_size(live.sizes[name] / stride, f"{role}: the strided dim {name}")
        live.sizes[name] = new_size
        return Stride(name, stride)

    @property
    def consumes(self) -> tuple[str, ...]:
        return (self.dim,)

    @property
    def produces(self) -> tuple[str, ...]:
        return (self.dim,)


@dataclass(frozen=True, init=False)
class Reduce(Primitive):
    """``[N] -> []``: sum over the dim (``mean=True`` divides by its size).

    ``Reduce(Cin, "kh", "kw")`` is shorthand for three Reduces, one per dim, in that order.
    """

    dims: tuple[DimRef, ...]
    mean: bool
    kind: ClassVar[str] = "Reduce"

    def __init__(self, *dims: DimRef, mean: bool = False) -> None:
        if not dims:
            raise ShapeError("Reduce() needs at least one dim")
        object.__setattr__(self, "dims", tuple(dims))
        object.__setattr__(self, "mean", mean)

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
        del live.sizes[name]
        live.windowed = live.windowed - {name}
        return Reduce(name, mean=self.mean)

    @property
    def consumes(self) -> tuple[str, ...]:
        return (self.dim,)

    @property
    def produces(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class Share(Primitive):
    """Multiply the data by a weight: dims the weight shares with the data index both
    (``out[i] = in[i] * w[i]``); the weight's own dims become new dims of the result."""

    weight: Weight | str
    kind: ClassVar[str] = "Share"

    def apply(self, live: Live, context: BuildContext) -> Share:
        weight = self.weight
        if isinstance(weight, str):
            raise ShapeError(f"Share({weight!r}): Share takes a Weight(...), not a name")
        if not isinstance(weight, Weight):
            raise ShapeError(f"Share: expected a Weight(...), got {weight!r}")
        name = weight.name or f"w{len(context.weights) + 1}"
        role = f"Share({name})"
        if any(w.name == name for w in context.weights):
            raise ShapeError(f"{role}: a weight named {name!r} is already shared; give each weight its own name")
        dims: list[Dim] = []
        new: list[bool] = []
        for entry in weight.entries:
            if isinstance(entry, Dim):
                if entry.name in live.sizes:
                    if live.sizes[entry.name] is not entry.size:
                        raise ShapeError(
                            f"{role}: Dim({entry.name!r}, {entry.size}) names the live dim {entry.name} "
                            f"of size {live.sizes[entry.name]}; use another name for a weight-only dim"
                        )
                    dims.append(entry)
                    new.append(False)
                else:
                    dims.append(entry)
                    new.append(True)
            elif isinstance(entry, str):
                shared = live.resolve(entry, role)
                dims.append(Dim(shared, live.sizes[shared]))
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
        names = [d.name for d in dims]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ShapeError(f"{role}: the weight lists the dim {duplicated[0]} twice")
        for dim, is_new in zip(dims, new):
            if is_new:
                live.add(dim.name, check_size(dim.size, f"{role}: weight dim {dim.name}"), role)
        resolved = weight._resolved(name, tuple(dims), tuple(new))
        context.weights.append(resolved)
        return Share(resolved)

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


def _replace(
    live: Live,
    name: str,
    produced: Sequence[tuple[str, Size]],
    role: str,
    *,
    windowed: bool,
    position: int | None = None,
) -> None:
    """Replace the dim ``name`` by ``produced`` at the same position (order is only cosmetic)."""
    items = list(live.sizes.items())
    index = position if position is not None else [n for n, _ in items].index(name)
    items = [(n, s) for n, s in items if n != name]
    remaining = {n for n, _ in items}
    for new_name, _ in produced:
        if new_name in remaining:
            raise ShapeError(f"{role}: a dim named {new_name!r} already exists; choose another name")
    if len({n for n, _ in produced}) != len(produced):
        raise ShapeError(f"{role}: the new dims need distinct names")
    items[index:index] = list(produced)
    live.sizes = dict(items)
    marks = live.windowed - {name}
    if windowed:
        marks = marks | {n for n, _ in produced}
    live.windowed = marks


PRIMITIVES: dict[str, type[Primitive]] = {
    cls.kind: cls for cls in (Split, Merge, Shift, Expand, Unfold, Stride, Reduce, Share)
}

__all__ = [
    "PRIMITIVES",
    "Dim",
    "DimRef",
    "Expand",
    "Live",
    "Merge",
    "Primitive",
    "Reduce",
    "Share",
    "Shift",
    "Split",
    "Stride",
    "Unfold",
    "Weight",
]
