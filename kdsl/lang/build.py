"""Building operators with ``>>``: pipelines, partial operators and the finished Operator.

``Split(...) >> Merge(...)`` is a :class:`Pipeline`, a reusable fragment (composition is
associative). ``Input(...) >> fragment`` checks each primitive as it is applied and gives a
:class:`Builder` (a partial operator); ``>> Output(...)`` declares the output order and gives an
:class:`Operator`, an immutable, hashable value.

>>> from kdsl.lang import *
>>> N, Cin, Cout, H, W = primary("N Cin Cout H W"); K = coefficient("K")
>>> window = Unfold(H, K, "kh") >> Unfold(W, K, "kw")
>>> w = Weight(Cout, Cin, "kh", "kw", name="w")
>>> conv = Input(N, Cin, H, W) >> window >> Share(w) >> Reduce(Cin, "kh", "kw") >> Output(N, Cout, H, W)
>>> [str(d.size) for d in conv.outputs]
['N', 'Cout', 'H', 'W']
>>> [str(s) for s in conv.weights[0].shape]
['Cout', 'Cin', 'K', 'K']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any

from kdsl.lang.canonical import instance_key, structural_key
from kdsl.lang.errors import KdslError, ShapeError, SizeError
from kdsl.lang.live import Live
from kdsl.lang.names import check_identifier
from kdsl.lang.primitives import PRIMITIVES, BuildContext, Dim, Output, Pipeline, Primitive, Weight, WeightNames, dim_of
from kdsl.lang.printer import partial_dsl, to_dsl, to_json
from kdsl.lang.sizes import Size, Var

#: Set by :mod:`kdsl.lang.graph`: what a linear build does with a Canvas step (``"step"``) or an
#: arithmetic join of two tensors (``"blend"``). This module knows nothing of graphs.
GRAPH_HOOKS: dict[str, Callable[..., Any]] = {}


class _Joinable:
    """``a + b``, ``a - b`` and ``a * b`` of inputs and partial builds: blends (a branching kernel)."""

    __slots__ = ()

    def __add__(self, other: object) -> Any:
        return GRAPH_HOOKS["blend"](self, "add", other)

    def __sub__(self, other: object) -> Any:
        return GRAPH_HOOKS["blend"](self, "sub", other)

    def __mul__(self, other: object) -> Any:
        return GRAPH_HOOKS["blend"](self, "mul", other)


@dataclass(frozen=True, init=False)
class Input(_Joinable):
    """The data input: its dims in order (variables, or ``Dim(name, size)``)."""

    dims: tuple[Dim, ...]

    def __init__(self, *dims: object) -> None:
        if not dims:
            raise ShapeError("Input() needs at least one dim")
        made = tuple(dim_of(d, "Input") for d in dims)
        seen: set[str] = set()
        for dim in made:
            if dim.name in seen:
                raise ShapeError(f"Input: the dim name {dim.name!r} appears twice; name each dim differently")
            seen.add(dim.name)
        object.__setattr__(self, "dims", made)

    def __rshift__(self, other: object) -> Any:
        return Builder.start(self.dims) >> other


class Builder(_Joinable):
    """A partial operator: the input, the resolved steps so far and the live dims.

    A Builder is a value: ``b >> x`` and ``b >> y`` both extend the same ``b``. The live dims are
    handed on to the first extension instead of copied (a chain of n steps over d dims costs
    O(n + d), not O(n * d)); a builder extended a second time replays its steps to get them back.
    """

    __slots__ = ("inputs", "steps", "_live", "_context", "closed_vertex")

    def __init__(
        self,
        inputs: tuple[Dim, ...],
        steps: tuple[Primitive, ...],
        live: Live | None,
        weights: list[Weight],
        earlier: WeightNames | None = None,
    ) -> None:
        self.inputs = inputs
        self.steps = steps
        self._live = live
        self._context: BuildContext | None = BuildContext(list(weights), earlier) if live is not None else None
        #: the graph vertex this build closes into when it branches (kdsl.lang.graph), made once
        self.closed_vertex: Any = None

    @staticmethod
    def start(inputs: tuple[Dim, ...]) -> Builder:
        return Builder(inputs, (), Live({d.name: d.size for d in inputs}, ()), [])

    def _state(self) -> tuple[Live, BuildContext]:
        """The live dims and weights after the steps, replayed if they were handed on."""
        if self._live is None or self._context is None:
            live = Live({d.name: d.size for d in self.inputs}, ())
            context = BuildContext()
            steps = []
            for step in self.steps:
                resolved = step.apply(live, context)
                # a step replayed on other dims (a rewrite dropped the Unfold a weight shared) may
                # resolve differently; an unchanged one stays the same object (chains share steps
                # by identity)
                steps.append(step if resolved == step else resolved)
            self.steps = tuple(steps)
            self._live, self._context = live, context
        return self._live, self._context

    @property
    def live(self) -> Live:
        """The live dims after the steps (do not change them)."""
        return self._state()[0]

    @property
    def weights(self) -> list[Weight]:
        """The weights shared so far, in order."""
        return list(self._state()[1].weights)

    @property
    def shape(self) -> dict[str, Size]:
        """The live dims, name -> size."""
        return dict(self.live.sizes)

    def _apply(self, primitive: Primitive) -> Builder:
        return self._apply_all((primitive,))

    def _apply_all(self, primitives: tuple[Primitive, ...]) -> Builder:
        live, context = self._state()
        # hand the state on: this builder replays its steps if it is ever extended again
        self._live = self._context = None
        steps = list(self.steps)
        try:
            for primitive in primitives:
                for single in primitive.expand():
                    steps.append(single.apply(live, context))
        except KdslError as error:
            raise error.with_context(partial_text(self.inputs, tuple(steps))) from None
        built = Builder(self.inputs, tuple(steps), None, [])
        built._live, built._context = live, context
        return built

    def _text_so_far(self) -> str:
        return partial_text(self.inputs, self.steps)

    def finish(self, output: Output) -> Operator:
        try:
            live = self.live
            names: dict[str, None] = {}
            for ref in output.refs:
                name = live.resolve(ref, "Output")
                if name in names:
                    raise ShapeError(f"Output: the dim {name} is listed twice")
                names[name] = None
            if len(names) != len(live):
                missing = [n for n in live.sizes if n not in names]
                raise ShapeError(
                    f"Output: the dims {', '.join(missing)} are still live but not in the output; "
                    f"Reduce them or list them (the live dims are {live.describe()})"
                )
            op = Operator(self.inputs, self.steps, tuple(Dim(n, live.size(n)) for n in names), output.defaults)
            coefficients = {v.name for v in op.variables if v.kind == "coefficient"}
            for key, _ in output.defaults:
                if key not in coefficients:
                    raise SizeError(
                        f"Output(defaults=...): {key} is not a coefficient variable of this operator "
                        f"(its coefficients are {sorted(coefficients) or 'none'})"
                    )
        except KdslError as error:
            raise error.with_context(self._text_so_far()) from None
        return op

    def __rshift__(self, other: object) -> Any:
        if isinstance(other, Primitive) and other.kind not in PRIMITIVES:
            return GRAPH_HOOKS["step"](self, other)  # a Canvas step: the build branches off into a graph
        if isinstance(other, Pipeline) and any(p.kind not in PRIMITIVES for p in other.primitives):
            return GRAPH_HOOKS["step"](self, other)
        if isinstance(other, Primitive):
            return self._apply(other)
        if isinstance(other, Pipeline):
            built = self._apply_all(other.primitives)
            return built.finish(other.output) if other.output is not None else built
        if isinstance(other, Output):
            return self.finish(other)
        raise ShapeError(f"cannot apply {other!r}; expected a primitive, a pipeline or Output(...)")

    def __repr__(self) -> str:
        return f"Builder({self.live.describe()})"


class Sized:
    """What operators and branching kernels share: the variables their sizes mention, their
    coefficient defaults, and their text as ``str()``."""

    defaults: tuple[tuple[str, int], ...]

    def _all_sizes(self) -> list[Size]:
        raise NotImplementedError

    def to_dsl(self, name: str = "op") -> str:
        raise NotImplementedError

    def _check_variables(self) -> None:
        """A variable has one kind; default names follow the name rule; a dynamic variable (a
        free width) is never in a denominator (Canvas's Theorem 1: the solvers rely on it)."""
        by_name: dict[str, Var] = {}
        for var in self.variables:
            seen = by_name.setdefault(var.name, var)
            if seen.kind != var.kind:
                raise SizeError(f"variable {var.name} is used both as {seen.kind} and as {var.kind}")
        if any(var.kind == "dynamic" for var in self.variables):
            for size in self._all_sizes():
                for var, exp in size.exponents:
                    if var.kind == "dynamic" and exp < 0:
                        raise SizeError(
                            f"the size {size} divides by the dynamic variable {var.name}; a free width may "
                            f"only multiply (split the dim it sizes instead of dividing by it)"
                        )
        for name, _ in self.defaults:
            check_identifier(name, "coefficient")

    @cached_property
    def variables(self) -> tuple[Var, ...]:
        """Every variable the sizes mention, primaries first, then by name."""
        found: set[Var] = set()
        for size in self._all_sizes():
            found.update(size.variables)
        return tuple(sorted(found, key=Var.sort_key))

    @property
    def primary_variables(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.variables if v.kind == "primary")

    @property
    def coefficient_variables(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.variables if v.kind == "coefficient")

    @property
    def dynamic_variables(self) -> tuple[str, ...]:
        """The free widths (``dynamic("x1")``) still in the sizes: while there are any, the
        operator is a template that :func:`kdsl.solve.fill` completes per layer."""
        return tuple(v.name for v in self.variables if v.kind == "dynamic")

    def substituted(self, values: Mapping[str, Size | int]) -> Sized:
        """The same operator with the variables named in ``values`` replaced by those sizes."""
        raise NotImplementedError

    @property
    def coefficient_values(self) -> tuple[tuple[str, int], ...]:
        """The coefficient values the operator is built at: its defaults for the coefficients its
        sizes mention, by name (what tells ``grouped_conv2d`` at G = 2 from G = 4)."""
        used = set(self.coefficient_variables)
        return tuple(sorted((name, int(value)) for name, value in self.defaults if name in used))

    @property
    def default_coefficients(self) -> dict[str, int]:
        return dict(self.defaults)

    def __str__(self) -> str:
        return self.to_dsl()


@dataclass(frozen=True, eq=True)
class Operator(Sized):
    """A finished operator: input dims, resolved steps (top-down), output dims, coefficient defaults.

    Equal operators have equal fields; :attr:`key` is a content hash that is also the same for
    operators that differ only in dim names, weight-dim order or the order of independent steps.
    """

    inputs: tuple[Dim, ...]
    steps: tuple[Primitive, ...]
    outputs: tuple[Dim, ...]
    defaults: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        for step in self.steps:
            if not isinstance(step, Primitive) or step.kind not in PRIMITIVES:
                # a linear chain: planning, search and its rules commute its steps, which a
                # non-linear step must never be part of (a branching kernel is a Graph)
                raise ShapeError(
                    f"an Operator holds only linear primitives ({', '.join(PRIMITIVES)}), not {step!r:.120}; "
                    f"build kernels with non-linear steps as Input(...) >> ... >> Output(...), which gives a Graph"
                )
        self._check_variables()

    @cached_property
    def weights(self) -> tuple[Weight, ...]:
        """The weights in the order they are shared (the declaration order)."""
        return tuple(weight for step in self.steps for weight in step.weights())

    def __reduce__(self) -> tuple[object, ...]:
        # pickled (to worker processes) as its fields only: the derived values cached on it (live
        # dims as read-only mappings, the key, the plan) are recomputed on the other side
        return (type(self), (self.inputs, self.steps, self.outputs, self.defaults))

    @cached_property
    def live(self) -> tuple[Mapping[str, Size], ...]:
        """The live dims (name -> size, in order) before each step, then after the last one.

        Computed once per operator and shared by every pass that needs the dims at a step (printing
        messages, constraints, plans, lowering, rendering) instead of each replaying the build.

        >>> from kdsl.lang import *
        >>> N, C = primary("N C")
        >>> op = Input(N, C) >> Reduce(C) >> Output(N)
        >>> [list(sizes) for sizes in op.live]
        [['N', 'C'], ['N']]
        """
        live = Live({d.name: d.size for d in self.inputs}, ())
        context = BuildContext()
        found: list[Mapping[str, Size]] = [MappingProxyType(dict(live.sizes))]
        for step in self.steps:
            step.apply(live, context)
            found.append(MappingProxyType(dict(live.sizes)))
        return tuple(found)

    def views(self, start: int = 0, stop: int | None = None) -> list[tuple[Primitive, Mapping[str, Size]]]:
        """The steps ``start:stop`` paired with the live dims before each (what a bottom-up walk
        with :func:`kdsl.lang.index.walk_up` takes)."""
        stop = len(self.steps) if stop is None else stop
        return [(self.steps[i], self.live[i]) for i in range(start, stop)]

    def _all_sizes(self) -> list[Size]:
        sizes = [d.size for d in self.inputs] + [d.size for d in self.outputs]
        for step in self.steps:
            sizes.extend(step.sizes())
        return sizes

    def to_dsl(self, name: str = "op") -> str:
        """DSL source that :func:`kdsl.parse` reads back to an equal operator."""
        return to_dsl(self, name)

    def to_json(self) -> str:
        """The versioned JSON form; :func:`kdsl.from_json` reads it back."""
        return to_json(self)

    @cached_property
    def design_key(self) -> str:
        """A stable content hash of the operator's structure, its coefficients left symbolic (names
        and step order do not matter): equal for ``grouped_conv2d`` at every G."""
        return structural_key(self)

    @cached_property
    def key(self) -> str:
        """The content hash of the operator at its default coefficient values: :attr:`design_key` when
        it has no coefficients, else that and the values (the identity of a search candidate).

        >>> from kdsl import gallery
        >>> grouped = gallery.load("grouped_conv2d")
        >>> grouped.with_defaults(G=2).key == grouped.with_defaults(G=4).key
        False
        >>> grouped.with_defaults(G=2).design_key == grouped.with_defaults(G=4).design_key
        True
        """
        return instance_key(self.design_key, dict(self.coefficient_values))

    def substituted(self, values: Mapping[str, Size | int]) -> Operator:
        """The same operator with the variables named in ``values`` replaced by those sizes (a
        dynamic variable by what shape matching or the budget solver found for it).

        >>> from kdsl.lang import *
        >>> N, C = primary("N C"); x1 = dynamic("x1")
        >>> op = Input(N, C) >> Share(Weight(C, Dim("z", x1), name="w")) >> Reduce(C) >> Output(N, "z")
        >>> op.dynamic_variables, str(op.substituted({"x1": 2 * C}).outputs[1].size)
        (('x1',), '2*C')
        """
        sizes = {name: Size.of(value) for name, value in values.items()}
        return substitute_operator(self, sizes, {})

    def with_defaults(self, **values: int) -> Operator:
        """The same operator with other preferred coefficient values."""
        merged = dict(self.defaults)
        merged.update(values)
        return Builder(self.inputs, self.steps, _live_after(self), list(self.weights)).finish(
            Output(*(d.name for d in self.outputs), defaults=merged)
        )

    def __repr__(self) -> str:
        ins = ", ".join(f"{d.name}: {d.size}" for d in self.inputs)
        outs = ", ".join(f"{d.name}: {d.size}" for d in self.outputs)
        return f"<Operator [{ins}] -> [{outs}], {len(self.steps)} steps, key {self.key}>"


def substitute_operator(op: Operator, sizes: Mapping[str, Size], steps: dict[int, Primitive]) -> Operator:
    """``op`` with ``sizes`` substituted; ``steps`` maps a step's id to its substituted copy, so
    steps that several chains share (by identity, see kdsl.lang.graph) stay shared."""
    if not any(var.name in sizes for var in op.variables):
        return op
    inputs = tuple(Dim(d.name, d.size.substitute(sizes)) for d in op.inputs)
    new_steps = []
    for step in op.steps:
        if id(step) not in steps:
            steps[id(step)] = step.substituted(sizes)
        new_steps.append(steps[id(step)])
    defaults = {k: v for k, v in op.defaults if k not in sizes}
    built = Builder(inputs, tuple(new_steps), None, [])
    return built.finish(Output(*(d.name for d in op.outputs), defaults=defaults or None))


def _live_after(op: Operator) -> Live:
    return Live({d.name: d.size for d in op.outputs}, ())


def partial_text(inputs: tuple[Dim, ...], steps: tuple[Primitive, ...]) -> str:
    """The DSL text of a partial build, quoted by error messages."""
    return partial_dsl(inputs, steps)
