"""What every primitive is made of: dims and weights (:class:`Dim`, :class:`Weight`), the
:class:`Primitive` base class with its fields and the facts the passes read (:data:`VIEW`,
:data:`REDUCTION`, ...), and the build context a primitive applies in. The primitives
themselves are declared in :mod:`kdsl.lang.primitives`, each once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from kdsl.lang.errors import ShapeError, SizeError
from kdsl.lang.index import Guard, Index
from kdsl.lang.live import Live
from kdsl.lang.names import MAX_CONSTANT, MAX_EXPONENT, check_identifier
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
LINEAR = "linear"  # linear in the data input (all primitives are)


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
    """One condition a step puts on sizes: ``"integral"`` (``sizes[0]`` is a positive integer),
    ``"window"`` (a window ``sizes[0]`` smaller than the dim ``sizes[1]`` it slides over) or
    ``"slide"`` (``sizes = (N, K, P, s)``: ``P = (N - K) // s + 1``, a Slide's windows). ``dim``
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


def step_role(step: str, detail: str) -> str:
    """How messages name a step: ``Split(Cin, Cin/G)``."""
    return f"{step}({detail})"


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
