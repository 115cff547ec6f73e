"""Printing operators as DSL source that :func:`kdsl.parse` reads back to an equal operator.

The text is also valid Python (``from kdsl.lang import *`` at the top), so it can be pasted into
a script. Dims are referred to by their variable when that is unambiguous (``Cin``), else by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from kdsl.lang.names import DSL_NAMES, check_identifier
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
    size = live.size(name)
    # a dim named like its size's variable is what that variable refers to (Live.find's rule)
    if size.variable_name == name:
        return name
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
        # a bare variable makes a new weight dim only when no live dim has its size
        if dim.size.variable_name == dim.name and not live.has_size(dim.size):
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


def _variables(sizes: Iterable[Size]) -> list[Var]:
    seen: dict[str, Var] = {}
    for size in sizes:
        for var in size.variables:
            seen.setdefault(var.name, var)
    return list(seen.values())


def _pipeline_lines(
    inputs: tuple[Dim, ...], steps: tuple[Primitive, ...], weight_vars: dict[str, str]
) -> tuple[list[str], list[str], Live]:
    """(weight declarations, pipeline lines, live dims at the end).

    Each step is printed against the live dims just before it and then applied to them, in one
    pass with no copies (so printing is linear in the number of steps and dims).
    """
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

    live = Live({d.name: d.size for d in inputs}, ())
    context = BuildContext()
    for step in steps:
        if isinstance(step, Reduce):
            if pending_reduce and pending_mean != step.mean:
                flush()
            pending_mean = step.mean
            pending_reduce.append(_ref(step.dim, live))
        else:
            flush()
            if isinstance(step, Share):
                assert isinstance(step.weight, Weight) and step.weight.name is not None
                entries = ", ".join(_weight_entries(step.weight, live))
                variable = weight_vars[step.weight.name]
                declarations.append(f"{variable} = Weight({entries}, name={_q(step.weight.name)})")
            lines.append(_step_text(step, live, weight_vars))
        step.apply(live, context)
    flush()
    return declarations, lines, live


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


#: pipeline lines per statement: Python's parser nests ``a >> b >> ...`` one level per ``>>`` and
#: gives up near 3,000 levels, so longer pipelines are printed as several statements
CHUNK = 100


def _render(op_name: str, declarations: list[str], variables: list[Var], lines: list[str], taken: set[str]) -> str:
    out = [HEADER, ""]
    for kind in ("primary", "coefficient"):
        names = [v.name for v in variables if v.kind == kind]
        if names:
            targets = ", ".join(names)
            out.append(f'{targets} = {kind}("{" ".join(names)}")')
    out.extend(declarations)
    # the partial pipeline gets a name of its own: op_name may also be a variable still needed
    partial = op_name + "_part"
    while partial in taken or partial in DSL_NAMES:
        partial += "_"
    chunks = [lines[start : start + CHUNK] for start in range(0, len(lines), CHUNK)]
    for index, chunk in enumerate(chunks):
        target = op_name if index == len(chunks) - 1 else partial
        first = chunk[0] if index == 0 else f"{partial}\n    >> {chunk[0]}"
        out.append(f"{target} = (")
        out.append(f"    {first}")
        out.extend(f"    >> {line}" for line in chunk[1:])
        out.append(")")
    return "\n".join(out) + "\n"


def to_dsl(op: Operator, op_name: str = "op") -> str:
    """The DSL source of ``op``, binding it to ``op_name`` (a name by :mod:`kdsl.lang.names`' rule)."""
    check_identifier(op_name, "operator")
    variables = _variables(
        [d.size for d in op.inputs] + [s for step in op.steps for s in step_sizes(step)] + [d.size for d in op.outputs]
    )
    # "op" is always taken: parse() reads the operator bound to `op` and refuses an `op` that is
    # something else (a weight named "op" printed under another operator name)
    taken = {v.name for v in variables} | {op_name, "op"}
    weight_vars = _weight_variables(op.steps, taken)
    declarations, lines, end = _pipeline_lines(op.inputs, op.steps, weight_vars)
    refs = ", ".join(_ref(d.name, end) for d in op.outputs)
    defaults = ""
    if op.defaults:
        defaults = ", defaults={" + ", ".join(f"{_q(k)}: {v}" for k, v in op.defaults) + "}"
    lines.append(f"Output({refs}{defaults})")
    return _render(op_name, declarations, variables, lines, taken)


def partial_dsl(inputs: tuple[Dim, ...], steps: tuple[Primitive, ...]) -> str:
    """The DSL text of a partial build (for error messages); never raises."""
    try:
        variables = _variables([d.size for d in inputs] + [s for step in steps for s in step_sizes(step)])
        weight_vars = _weight_variables(steps, {v.name for v in variables})
        declarations, lines, _ = _pipeline_lines(inputs, steps, weight_vars)
        return "\n".join(declarations + [" >> ".join(lines)])
    except Exception:  # a message helper must not hide the original error
        return " >> ".join(repr(s) for s in steps)
