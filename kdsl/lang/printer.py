"""Printing operators as DSL source that :func:`kdsl.parse` reads back to an equal operator.

The text is also valid Python (``from kdsl.lang import *`` at the top), so it can be pasted into
a script. Dims are referred to by their variable when that is unambiguous (``Cin``), else by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from kdsl.lang.errors import KdslError
from kdsl.lang.primitives import (
    BuildContext,
    Dim,
    Expand,
    Live,
    Merge,
    Primitive,
    Reduce,
    Share,
    Shift,
    Split,
    Stride,
    Unfold,
    Weight,
)
from kdsl.lang.sizes import Size, Var

if TYPE_CHECKING:
    from kdsl.lang.build import Operator

HEADER = "from kdsl.lang import *"
DSL_NAMES = frozenset(
    "primary coefficient Weight Dim Input Output Split Merge Shift Expand Unfold Stride Reduce Share".split()
)


def step_sizes(step: Primitive) -> list[Size]:
    """The sizes a resolved step mentions (for collecting variables)."""
    if isinstance(step, Split):
        return [step.block]
    if isinstance(step, Unfold):
        return [step.window]
    if isinstance(step, Stride):
        return [step.stride]
    if isinstance(step, Expand):
        return [step.size]
    if isinstance(step, Share):
        assert isinstance(step.weight, Weight)
        return [d.size for d in step.weight.dims]
    return []


def _q(name: str) -> str:
    """A dim or weight name as a string literal (names are identifiers, so no escaping)."""
    return f'"{name}"'


def _ref(name: str, live: Live) -> str:
    """The shortest reference that resolves to the live dim ``name``."""
    size = live.sizes[name]
    if size.variable_name == name:
        try:
            if live.find(size) == name:
                return name
        except KdslError:
            pass
    return _q(name)


def _dim_text(dim: Dim) -> str:
    if dim.size.variable_name == dim.name:
        return dim.name
    return f"Dim({_q(dim.name)}, {dim.size})"


def _weight_entries(weight: Weight, live: Live) -> list[str]:
    entries = []
    for dim, is_new in zip(weight.dims, weight.new):
        if not is_new:
            entries.append(_ref(dim.name, live))
            continue
        try:
            taken = live.find(dim.size)
        except KdslError:
            taken = "ambiguous"
        if dim.size.variable_name == dim.name and taken is None:
            entries.append(dim.name)
        else:
            entries.append(f"Dim({_q(dim.name)}, {dim.size})")
    return entries


def _step_text(step: Primitive, live: Live, weight_vars: dict[str, str]) -> str:
    if isinstance(step, Split):
        return f"Split({_ref(step.dim, live)}, {step.block}, {_q(step.outer)}, {_q(step.inner)})"
    if isinstance(step, Merge):
        return f"Merge({_ref(step.outer, live)}, {_ref(step.inner, live)}, {_q(step.name)})"
    if isinstance(step, Shift):
        offset = "" if step.offset == 1 else f", {step.offset}"
        return f"Shift({_ref(step.dim, live)}{offset})"
    if isinstance(step, Expand):
        return f"Expand({_q(step.name)}, {step.size})"
    if isinstance(step, Unfold):
        return f"Unfold({_ref(step.dim, live)}, {step.window}, {_q(step.name)})"
    if isinstance(step, Stride):
        return f"Stride({_ref(step.dim, live)}, {step.stride})"
    if isinstance(step, Share):
        assert isinstance(step.weight, Weight) and step.weight.name is not None
        return f"Share({weight_vars[step.weight.name]})"
    raise TypeError(f"no printer for {step!r}")  # unreachable: every primitive is handled above


def _replay(inputs: tuple[Dim, ...], steps: tuple[Primitive, ...]) -> Iterable[tuple[Primitive, Live]]:
    """Yield each step with the live dims just before it."""
    live = Live({d.name: d.size for d in inputs}, frozenset())
    context = BuildContext()
    for step in steps:
        before = Live(dict(live.sizes), live.windowed)
        step.apply(live, context)
        yield step, before


def _variables(sizes: Iterable[Size]) -> list[Var]:
    seen: dict[str, Var] = {}
    for size in sizes:
        for var in size.variables:
            seen.setdefault(var.name, var)
    return list(seen.values())


def _pipeline_lines(
    inputs: tuple[Dim, ...], steps: tuple[Primitive, ...], weight_vars: dict[str, str]
) -> tuple[list[str], list[str], Live]:
    """(weight declarations, pipeline lines, live dims at the end)."""
    declarations: list[str] = []
    lines = [f"Input({', '.join(_dim_text(d) for d in inputs)})"]
    pending_reduce: list[str] = []
    pending_mean = False

    def flush() -> None:
        nonlocal pending_reduce
        if pending_reduce:
            mean = ", mean=True" if pending_mean else ""
            lines.append(f"Reduce({', '.join(pending_reduce)}{mean})")
            pending_reduce = []

    for step, before in _replay(inputs, steps):
        if isinstance(step, Reduce):
            if pending_reduce and pending_mean != step.mean:
                flush()
            pending_mean = step.mean
            pending_reduce.append(_ref(step.dim, before))
        else:
            flush()
            if isinstance(step, Share):
                assert isinstance(step.weight, Weight) and step.weight.name is not None
                entries = ", ".join(_weight_entries(step.weight, before))
                variable = weight_vars[step.weight.name]
                declarations.append(f"{variable} = Weight({entries}, name={_q(step.weight.name)})")
            lines.append(_step_text(step, before, weight_vars))
    flush()
    # the live dims after the last step
    end = Live({d.name: d.size for d in inputs}, frozenset())
    context = BuildContext()
    for step in steps:
        step.apply(end, context)
    return declarations, lines, end


def _weight_variables(steps: tuple[Primitive, ...], taken: set[str]) -> dict[str, str]:
    names: dict[str, str] = {}
    for step in steps:
        if isinstance(step, Share):
            assert isinstance(step.weight, Weight) and step.weight.name is not None
            variable = step.weight.name
            while variable in taken or variable in DSL_NAMES:
                variable += "_w"
            taken.add(variable)
            names[step.weight.name] = variable
    return names


def _render(op_name: str, declarations: list[str], variables: list[Var], lines: list[str]) -> str:
    out = [HEADER, ""]
    for kind in ("primary", "coefficient"):
        names = [v.name for v in variables if v.kind == kind]
        if names:
            targets = ", ".join(names)
            out.append(f'{targets} = {kind}("{" ".join(names)}")')
    out.extend(declarations)
    out.append(f"{op_name} = (")
    out.append(f"    {lines[0]}")
    out.extend(f"    >> {line}" for line in lines[1:])
    out.append(")")
    return "\n".join(out) + "\n"


def to_dsl(op: Operator, op_name: str = "op") -> str:
    """The DSL source of ``op``, binding it to ``op_name``."""
    variables = _variables(
        [d.size for d in op.inputs] + [s for step in op.steps for s in step_sizes(step)] + [d.size for d in op.outputs]
    )
    taken = {v.name for v in variables} | {op_name}
    weight_vars = _weight_variables(op.steps, taken)
    declarations, lines, end = _pipeline_lines(op.inputs, op.steps, weight_vars)
    refs = ", ".join(_ref(d.name, end) for d in op.outputs)
    defaults = ""
    if op.defaults:
        defaults = ", defaults={" + ", ".join(f"{_q(k)}: {v}" for k, v in op.defaults) + "}"
    lines.append(f"Output({refs}{defaults})")
    return _render(op_name, declarations, variables, lines)


def partial_dsl(inputs: tuple[Dim, ...], steps: tuple[Primitive, ...]) -> str:
    """The DSL text of a partial build (for error messages); never raises."""
    try:
        variables = _variables([d.size for d in inputs] + [s for step in steps for s in step_sizes(step)])
        weight_vars = _weight_variables(steps, {v.name for v in variables})
        declarations, lines, _ = _pipeline_lines(inputs, steps, weight_vars)
        return "\n".join(declarations + [" >> ".join(lines)])
    except Exception:  # a message helper must not hide the original error
        return " >> ".join(repr(s) for s in steps)
