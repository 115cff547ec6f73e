"""Linear chains: the steps of a linear operator, and of each chain node of a branching one.

A :class:`Chain` is what ``Input(...) >> steps >> Output(...)`` closes when every step is one of the
eight linear primitives. It is internal to :mod:`kdsl.lang`: users see one type,
:class:`kdsl.lang.operator.Operator`, whose chain nodes hold chains (a linear operator is the
input and one chain node; ``op.chain`` gives it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

from kdsl.lang.canonical import instance_key, structural_key
from kdsl.lang.errors import KdslError, ShapeError, SizeError
from kdsl.lang.live import Live
from kdsl.lang.names import check_identifier
from kdsl.lang.primitives import PRIMITIVES, BuildContext, Dim, Output, Primitive, Weight
from kdsl.lang.printer import partial_dsl, to_dsl, to_json
from kdsl.lang.sizes import Size, Var


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
class Chain(Sized):
    """A linear chain: input dims, resolved steps (top-down), output dims, coefficient defaults.

    Internal to :mod:`kdsl.lang`: the public type is :class:`kdsl.lang.operator.Operator`, whose
    chain nodes hold a Chain (a linear operator is the Input and one chain node). Equal chains have
    equal fields; :attr:`key` is a content hash that is also the same for chains that differ only
    in dim names, weight-dim order or the order of independent steps.
    """

    inputs: tuple[Dim, ...]
    steps: tuple[Primitive, ...]
    outputs: tuple[Dim, ...]
    defaults: tuple[tuple[str, int], ...] = ()

    #: a chain is linear: passes that take an operator or one of its chains read this alike
    is_linear = True

    def __post_init__(self) -> None:
        for step in self.steps:
            if not isinstance(step, Primitive) or step.kind not in PRIMITIVES:
                # a linear chain: planning, search and its rules commute its steps, which a
                # non-linear step must never be part of (a branching kernel has it in a node of its own)
                raise ShapeError(
                    f"a chain holds only linear primitives ({', '.join(PRIMITIVES)}), not {step!r:.120}; "
                    f"build kernels with non-linear steps as Input(...) >> ... >> Output(...)"
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
        >>> [list(sizes) for sizes in op.chain.live]
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

        """
        return instance_key(self.design_key, dict(self.coefficient_values))

    def substituted(self, values: Mapping[str, Size | int]) -> Chain:
        """The same chain with the variables named in ``values`` replaced by those sizes."""
        sizes = {name: Size.of(value) for name, value in values.items()}
        return substitute_chain(self, sizes, {})

    def with_defaults(self, **values: int) -> Chain:
        """The same chain with other preferred coefficient values."""
        merged = dict(self.defaults)
        merged.update(values)
        live = Live({d.name: d.size for d in self.outputs}, ())
        return close_chain(self.inputs, self.steps, live, Output(*(d.name for d in self.outputs), defaults=merged))

    def __repr__(self) -> str:
        ins = ", ".join(f"{d.name}: {d.size}" for d in self.inputs)
        outs = ", ".join(f"{d.name}: {d.size}" for d in self.outputs)
        return f"<Chain [{ins}] -> [{outs}], {len(self.steps)} steps, key {self.key}>"


def substitute_chain(op: Chain, sizes: Mapping[str, Size], steps: dict[int, Primitive]) -> Chain:
    """``op`` with ``sizes`` substituted; ``steps`` maps a step's id to its substituted copy, so
    steps that several chains share (by identity, see kdsl.lang.branches) stay shared."""
    if not any(var.name in sizes for var in op.variables):
        return op
    inputs = tuple(Dim(d.name, d.size.substitute(sizes)) for d in op.inputs)
    new_steps = []
    for step in op.steps:
        if id(step) not in steps:
            steps[id(step)] = step.substituted(sizes)
        new_steps.append(steps[id(step)])
    defaults = {k: v for k, v in op.defaults if k not in sizes}
    resolved, live, _ = replay(inputs, tuple(new_steps))
    output = Output(*(d.name for d in op.outputs), defaults=defaults or None)
    return close_chain(inputs, resolved, live, output, partial_text(inputs, resolved))


def replay(inputs: tuple[Dim, ...], steps: tuple[Primitive, ...]) -> tuple[tuple[Primitive, ...], Live, BuildContext]:
    """The steps applied again to the input dims: the steps as they resolve there (an unchanged
    step stays the same object: chains share steps by identity), the live dims and weights after."""
    live = Live({d.name: d.size for d in inputs}, ())
    context = BuildContext()
    resolved = []
    for step in steps:
        again = step.apply(live, context)
        # a step replayed on other dims (a rewrite dropped the Unfold a weight shared) may resolve
        # differently
        resolved.append(step if again == step else again)
    return tuple(resolved), live, context


def output_names(live: Live, refs: Iterable[object], remedy: str) -> dict[str, None]:
    """The dim names ``Output(*refs)`` lists, in order, checked against the ``live`` dims: each
    listed once and none left out (``remedy`` says how to get rid of a live dim, e.g. "Reduce them")."""
    names: dict[str, None] = {}
    for ref in refs:
        name = live.resolve(ref, "Output")
        if name in names:
            raise ShapeError(f"Output: the dim {name} is listed twice")
        names[name] = None
    if len(names) != len(live):
        missing = [n for n in live.sizes if n not in names]
        raise ShapeError(
            f"Output: the dims {', '.join(missing)} are still live but not in the output; "
            f"{remedy} or list them (the live dims are {live.describe()})"
        )
    return names


def check_defaults(defaults: Iterable[tuple[str, int]], coefficients: set[str], what: str) -> None:
    """Refuse ``Output(defaults=...)`` naming a variable that is no coefficient of the ``what``."""
    for key, _ in defaults:
        if key not in coefficients:
            raise SizeError(
                f"Output(defaults=...): {key} is not a coefficient variable of this {what} "
                f"(its coefficients are {sorted(coefficients) or 'none'})"
            )


def close_chain(
    inputs: tuple[Dim, ...], steps: tuple[Primitive, ...], live: Live, output: Output, text: str | None = None
) -> Chain:
    """The chain of ``steps`` (whose live dims at the end are ``live``) with ``output``'s order and
    defaults; errors quote ``text`` (the partial build), if given."""
    try:
        names = output_names(live, output.refs, "Reduce them")
        chain = Chain(inputs, steps, tuple(Dim(n, live.size(n)) for n in names), output.defaults)
        coefficients = {v.name for v in chain.variables if v.kind == "coefficient"}
        check_defaults(output.defaults, coefficients, "operator")
    except KdslError as error:
        raise (error.with_context(text) if text is not None else error) from None
    return chain


def partial_text(inputs: tuple[Dim, ...], steps: tuple[Primitive, ...]) -> str:
    """The DSL text of a partial build, quoted by error messages."""
    return partial_dsl(inputs, steps)
