"""Printing operators as DSL source that :func:`kdsl.parse` reads back to an equal operator.

The text is also valid Python (``from kdsl.lang import *`` at the top), so it can be pasted into
a script. Dims are referred to by their variable when that is unambiguous (``Cin``), else by name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from kdsl.lang.live import Live
from kdsl.lang.names import DSL_NAMES, check_identifier
from kdsl.lang.primitives import REDUCTION, BuildContext, Dim, OperatorParts, Primitive, Reduce, Weight
from kdsl.lang.sizes import KINDS, Size, Var

HEADER = "from kdsl.lang import *"

#: The JSON form: its format tag and version (``kdsl.lang.serialize`` reads it back).
FORMAT = "kdsl-operator"
VERSION = 1


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
    """``Kind(arg, ...)`` from the step's declared fields: positional in order, an optional field
    left out while it has its default (the later ones then by keyword), booleans and ``keyword``
    fields by keyword."""
    args: list[str] = []
    by_keyword = False
    for f in step.fields:
        value = getattr(step, f.name)
        if f.optional and value == f.default:
            by_keyword = True
            continue
        if f.kind == "ref":
            text = _ref(value, live)
        elif f.kind == "refs":
            text = ", ".join(_ref(v, live) for v in value)
        elif f.kind in ("name", "choice"):
            text = _q(value)
        elif f.kind == "weight" and f.keyword:
            text = _q(value.name)  # a weight the step makes itself (FC): only its name
        elif f.kind == "weight":
            text = weight_vars[value.name]
        elif f.kind == "number":
            text = repr(float(value))
        else:  # size, int, bool
            text = str(value)
        args.append(f"{f.name}={text}" if by_keyword or f.keyword or f.kind == "bool" else text)
    return f"{step.kind}({', '.join(args)})"


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
    live = Live({d.name: d.size for d in inputs}, ())
    _step_lines(live, BuildContext(), steps, weight_vars, declarations, lines)
    return declarations, lines, live


def _step_lines(
    live: Live,
    context: BuildContext,
    steps: Iterable[Primitive],
    weight_vars: dict[str, str],
    declarations: list[str],
    lines: list[str],
) -> None:
    """Append the lines of ``steps`` (and their weights' declarations), applying them to ``live``."""
    pending_reduce: list[str] = []
    pending_mean = False

    def flush() -> None:
        nonlocal pending_reduce
        if pending_reduce:
            mean = ", mean=True" if pending_mean else ""
            lines.append(f"Reduce({', '.join(pending_reduce)}{mean})")
            pending_reduce = []

    for step in steps:
        if REDUCTION in step.facts:  # consecutive reductions print as one Reduce(a, b, ...)
            assert isinstance(step, Reduce)
            if pending_reduce and pending_mean != step.mean:
                flush()
            pending_mean = step.mean
            pending_reduce.append(_ref(step.dim, live))
        else:
            flush()
            for f in step.fields:
                if f.kind != "weight" or f.keyword:
                    continue
                weight = getattr(step, f.name)
                assert weight.name is not None
                entries = ", ".join(_weight_entries(weight, live))
                declarations.append(f"{weight_vars[weight.name]} = Weight({entries}, name={_q(weight.name)})")
            lines.append(_step_text(step, live, weight_vars))
        step.apply(live, context)
    flush()


def _weight_variables(steps: Iterable[Primitive], taken: set[str]) -> dict[str, str]:
    names: dict[str, str] = {}
    for step in steps:
        for f in step.fields:
            if f.kind != "weight" or f.keyword:
                continue
            weight = getattr(step, f.name)
            assert weight.name is not None
            variable = weight.name
            while variable in taken or variable in DSL_NAMES:
                variable += "_w"
            taken.add(variable)
            names[weight.name] = variable
    return names


#: pipeline lines per statement: Python's parser nests ``a >> b >> ...`` one level per ``>>`` and
#: gives up near 3,000 levels, so longer pipelines are printed as several statements
CHUNK = 100


def _render(op_name: str, declarations: list[str], variables: list[Var], lines: list[str], taken: set[str]) -> str:
    out = [HEADER, ""]
    for kind in KINDS:
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


def to_dsl(op: OperatorParts, op_name: str = "op") -> str:
    """The DSL source of ``op``, binding it to ``op_name`` (a name by :mod:`kdsl.lang.names`' rule)."""
    check_identifier(op_name, "operator")
    variables = _variables(
        [d.size for d in op.inputs] + [s for step in op.steps for s in step.sizes()] + [d.size for d in op.outputs]
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
        variables = _variables([d.size for d in inputs] + [s for step in steps for s in step.sizes()])
        weight_vars = _weight_variables(steps, {v.name for v in variables})
        declarations, lines, _ = _pipeline_lines(inputs, steps, weight_vars)
        return "\n".join(declarations + [" >> ".join(lines)])
    except Exception:  # a message helper must not hide the original error
        return " >> ".join(repr(s) for s in steps)


# -- JSON ---------------------------------------------------------------------------------------


def _step_dict(step: Primitive) -> dict[str, Any]:
    """A step as JSON, from its declared fields (sizes as strings, dims by name)."""
    data: dict[str, Any] = {"op": step.kind}
    for f in step.fields:
        value = getattr(step, f.name)
        if f.kind == "size":
            data[f.name] = str(value)
        elif f.kind == "refs":
            data[f.name] = list(value)
        elif f.kind == "number":
            data[f.name] = float(value)
        elif f.kind == "weight" and f.keyword:
            data[f.name] = value.name  # a weight the step makes itself (FC): its name is enough
        elif f.kind == "weight":
            data["weight"] = value.name
            data["dims"] = [{"name": d.name, "size": str(d.size), "new": n} for d, n in zip(value.dims, value.new)]
        else:  # ref, name, int, bool, choice
            data[f.name] = value
    return data


def to_dict(op: OperatorParts) -> dict[str, Any]:
    """The JSON-ready dict of ``op`` (sizes as strings, every dim by name)."""
    variables: dict[str, Var] = {}
    for size in [d.size for d in op.inputs] + [s for step in op.steps for s in step.sizes()]:
        for var in size.variables:
            variables.setdefault(var.name, var)
    return {
        "format": FORMAT,
        "version": VERSION,
        "variables": {v.name: v.kind for v in sorted(variables.values(), key=Var.sort_key)},
        "inputs": [{"name": d.name, "size": str(d.size)} for d in op.inputs],
        "steps": [_step_dict(step) for step in op.steps],
        "outputs": [d.name for d in op.outputs],
        "defaults": dict(op.defaults),
    }


def to_json(op: OperatorParts) -> str:
    """``op`` as a JSON string (sorted keys, so equal operators give equal text)."""
    return json.dumps(to_dict(op), sort_keys=True)


# -- branching kernels (kdsl.lang.branches) --------------------------------------------------------

#: The JSON form of a branching kernel.
GRAPH_FORMAT = "kdsl-graph"
GRAPH_VERSION = 1


def _graph_statement_nodes(graph: Any) -> set[int]:
    """The nodes that get a statement (a variable) of their own: the input, any node read more than
    once, and the branches of a join; a node read once by a unary step is written inline."""
    named = {0}
    for index, node in enumerate(graph.nodes):
        if node.kind == "Input":
            named.add(index)
        if len(graph.consumers[index]) > 1:
            named.add(index)
        if len(node.args) > 1:
            named.update(node.args)
    return named


def graph_to_dsl(graph: Any, op_name: str = "op") -> str:
    """The DSL source of a branching kernel: one statement per shared tensor or branch, joins as
    ``Blend(...)``/``Product(...)``, and ``op = ... >> Output(...)``."""
    check_identifier(op_name, "operator")
    variables = _variables(
        [d.size for d in graph.inputs] + [d.size for node in graph.nodes for d in node.dims] + list(_graph_sizes(graph))
    )
    taken = {v.name for v in variables} | {op_name, "op"}
    chain_steps = [step for node in graph.nodes if node.kind == "Chain" for step in node.step.steps]
    weight_vars = _weight_variables(chain_steps, taken)
    named = _graph_statement_nodes(graph)
    tensor_vars: dict[int, str] = {}
    counter = 0

    def fresh(base: str) -> str:
        nonlocal counter
        while True:
            counter += 1
            candidate = f"{base}{counter}" if base != "x" or counter > 1 else "x"
            if candidate not in taken and candidate not in DSL_NAMES:
                taken.add(candidate)
                return candidate

    declarations: list[str] = []
    statements: list[str] = []
    expressions: dict[int, list[str]] = {}
    for index, node in enumerate(graph.nodes):
        if node.kind == "Input":
            name = "" if node.name is None else f", name={_q(node.name)}"
            lines = [f"Input({', '.join(_dim_text(d) for d in node.dims)}{name})"]
        elif node.kind in ("Blend", "Product"):
            left, right = (tensor_vars[a] for a in node.args)
            if node.kind == "Blend":
                lines = [f"Blend({_q(node.step.how)}, {left}, {right})"]
            else:
                reduce = "".join(f", {_q(r)}" for r in node.step.reduce)
                lines = [f"Product({left}, {right}{reduce})"]
        else:
            (arg,) = node.args
            lines = [tensor_vars[arg]] if arg in tensor_vars else expressions.pop(arg)
            arg_dims = graph.nodes[arg].dims
            live = Live({d.name: d.size for d in arg_dims}, ())
            steps = node.step.steps if node.kind == "Chain" else (node.step,)
            lines = list(lines)
            _step_lines(live, BuildContext(), steps, weight_vars, declarations, lines)
        if index in named or index == len(graph.nodes) - 1:
            if index == len(graph.nodes) - 1:
                expressions[index] = lines
                break
            lines = _split_pipeline(lines, fresh, statements)
            # a named input is bound to its own name where that is free (q = Input(..., name="q"))
            own = node.name if node.kind == "Input" and node.name not in taken | DSL_NAMES else None
            variable = own or fresh("x" if index == 0 else "t")
            taken.add(variable)
            tensor_vars[index] = variable
            statements.append(_statement(variable, lines))
        else:
            expressions[index] = lines
    last = len(graph.nodes) - 1
    end = Live({d.name: d.size for d in graph.nodes[last].dims}, ())
    refs = ", ".join(_ref(d.name, end) for d in graph.outputs)
    defaults = ""
    if graph.defaults:
        defaults = ", defaults={" + ", ".join(f"{_q(k)}: {v}" for k, v in graph.defaults) + "}"
    final = [tensor_vars[last]] if last in tensor_vars else expressions[last]
    final = _split_pipeline([*final, f"Output({refs}{defaults})"], fresh, statements)
    statements.append(_statement(op_name, final))
    out = [HEADER, ""]
    for kind in KINDS:
        names = [v.name for v in variables if v.kind == kind]
        if names:
            out.append(f'{", ".join(names)} = {kind}("{" ".join(names)}")')
    out.extend(declarations)
    out.extend(statements)
    return "\n".join(out) + "\n"


def _split_pipeline(lines: list[str], fresh: Callable[[str], str], statements: list[str]) -> list[str]:
    """The last ``CHUNK`` lines (at most) of a long pipeline; the lines before them go into
    statements of their own, each binding a fresh ``t`` variable that the next one continues.
    Python's parser nests one level per ``>>``, so one statement of thousands of steps (a chain of
    3,000 Maps) would print text that :func:`kdsl.parse` refuses; a tensor bound to a name and
    extended later is the same value, so the kernel read back is equal. Short pipelines (every
    kernel of the gallery) print as before."""
    while len(lines) > CHUNK:
        variable = fresh("t")
        statements.append(_statement(variable, lines[:CHUNK]))
        lines = [variable, *lines[CHUNK:]]
    return lines


def _statement(target: str, lines: list[str]) -> str:
    if len(lines) == 1:
        return f"{target} = {lines[0]}"
    return "\n".join([f"{target} = (", f"    {lines[0]}", *(f"    >> {line}" for line in lines[1:]), ")"])


def _graph_sizes(graph: Any) -> Iterable[Size]:
    for node in graph.nodes:
        if node.kind == "Chain":
            for step in node.step.steps:
                yield from step.sizes()
        elif node.kind not in ("Input", "Blend", "Product"):
            yield from node.step.sizes()


def graph_to_dict(graph: Any) -> dict[str, Any]:
    """The JSON-ready dict of a branching kernel: nodes in order, each with its arguments' indices."""
    variables: dict[str, Var] = {}
    for size in [d.size for dims in graph.input_dims for d in dims] + list(_graph_sizes(graph)):
        for var in size.variables:
            variables.setdefault(var.name, var)
    nodes: list[dict[str, Any]] = []
    for node in graph.nodes[1:]:
        if node.kind == "Input":  # a second input: its name and dims
            entry = {"op": "Input", "name": node.name, "inputs": _dims_dicts(node.dims)}
        elif node.kind == "Chain":
            entry: dict[str, Any] = {"op": "Chain", "steps": [_step_dict(step) for step in node.step.steps]}
        else:
            entry = _step_dict(node.step)
        entry["args"] = list(node.args)
        nodes.append(entry)
    return {
        "format": GRAPH_FORMAT,
        "version": GRAPH_VERSION,
        "variables": {v.name: v.kind for v in sorted(variables.values(), key=Var.sort_key)},
        "inputs": _dims_dicts(graph.inputs),
        **({"input_name": graph.nodes[0].name} if graph.nodes[0].name is not None else {}),
        "nodes": nodes,
        "outputs": [d.name for d in graph.outputs],
        "defaults": dict(graph.defaults),
    }


def _dims_dicts(dims: Iterable[Any]) -> list[dict[str, str]]:
    return [{"name": d.name, "size": str(d.size)} for d in dims]


def graph_to_json(graph: Any) -> str:
    return json.dumps(graph_to_dict(graph), sort_keys=True)
