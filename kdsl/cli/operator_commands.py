"""``kdsl show``, ``kdsl check`` and ``kdsl demo``: commands about one operator or the
gallery, and :func:`load_operator`, which every command uses to read an operator named on the command line.

An operator may be a branching kernel (a :class:`~kdsl.lang.operator.Operator`): ``show`` then also lists its
nodes (step, arguments, dims, MACs) and its memory, and ``check`` counts MACs (a multiply-accumulate,
or an element-wise operation counted as one) and the peak of live elements per layer. Every count kdsl
prints is in MACs (multiply-accumulates), as :func:`kdsl.solve.cost` counts."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from pathlib import Path

from kdsl import gallery, solve
from kdsl.codegen.render import loop_nest, svg
from kdsl.lang import library
from kdsl.lang.errors import BudgetError, KdslError, LayerError, printable
from kdsl.lang.operator import Operator
from kdsl.search.store import Store, candidate


def load_operator(ref: str, db: str | None = None) -> Operator:
    """An operator from a gallery name, a DSL file, a JSON file, or (with ``db``) the canonical
    hash (or a unique prefix of it) of a candidate in a search results database."""
    if db is not None:
        return candidate(db, ref)
    return library.load_operator(ref)


_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([0-9]+)", re.ASCII)


def _parse_assignments(items: Sequence[str] | None, op: Operator, name: str) -> dict[str, int]:
    """``--set NAME=INT[,NAME=INT...]`` as a dict, checked against ``op``'s coefficients so that a
    typo (``k=5``, ``Q=3``) is an error rather than a value silently ignored. ``re.ASCII`` keeps
    ``int()`` from seeing digits it does not take (``²``) or signs (``--3``)."""
    values: dict[str, int] = {}
    coefficients = op.coefficient_variables
    for item in items or ():
        for part in item.split(","):
            if not part.strip():
                continue
            match = _ASSIGNMENT.fullmatch(part.strip())
            if match is None:
                raise KdslError(f"--set expects NAME=INT with a positive integer (like K=3), got {printable(part)!r}")
            variable, value = match.group(1), int(match.group(2))
            if variable not in coefficients:
                raise KdslError(_unknown_variable(variable, op, name))
            if value < 1:
                raise KdslError(f"--set {variable}={value}: a coefficient must be a positive integer")
            if variable in values and values[variable] != value:
                raise KdslError(f"--set gives {variable} twice ({values[variable]} and {value})")
            values[variable] = value
    return values


def _unknown_variable(variable: str, op: Operator, name: str) -> str:
    coefficients = op.coefficient_variables
    if variable in op.primary_variables:
        return (
            f"--set {variable}: {variable} is a primary variable of {name}; its sizes come from the layer table "
            f"(--layers), --set gives coefficients ({', '.join(coefficients) or 'it has none'})"
        )
    known = f"its coefficients are {', '.join(coefficients)}" if coefficients else "it has no coefficients"
    close = [c for c in coefficients if c.lower() == variable.lower()]
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"--set {variable}: {name} has no variable {variable}; {known}{hint}"


def _formula_lines(op: Operator) -> list[str]:
    formulas = solve.cost(op)
    keys = ("macs", "params", "input", "output", "memory", "peak")
    return [f"  {'MACs' if key == 'macs' else key:<13}{formulas[key]}" for key in keys if key in formulas]


def _node_lines(graph: Operator) -> list[str]:
    """One line per node: its number, its step, the nodes it reads, its dims and its MACs."""
    flops = solve.node_flops(graph)
    lines = []
    for index, node in enumerate(graph.nodes):
        reads = f" of {', '.join(map(str, node.args))}" if node.args else ""
        dims = ", ".join(f"{d.name}: {d.size}" for d in node.dims)
        lines.append(f"  {index:<3}{node.describe()}{reads} -> [{dims}]    MACs {flops[index]}")
    return lines


def command_show(args: argparse.Namespace) -> int:
    op = load_operator(args.operator, args.db)
    if getattr(args, "target", None) == "cuda":
        return _show_cuda(op, args)
    if getattr(args, "json", False):
        # the operator's own JSON form (kdsl.lang.serialize) with its checks and its cost formulas in MACs
        # "flops" is solve.cost's older name of the same count: the JSON says MACs only
        formulas = {k: str(v) for k, v in solve.cost(op).items() if k != "flops"}
        constraints = [c.description for c in solve.constraints(op)]
        extra = {"key": op.key, "dsl": op.to_dsl(), "constraints": constraints, "cost": formulas}
        print(json.dumps({"operator": json.loads(op.to_json()), **extra}))
        return 0
    print(op.to_dsl(), end="")
    print()
    print("shapes:")
    print(f"  input        [{', '.join(f'{d.name}: {d.size}' for d in op.inputs)}]")
    print(f"  output       [{', '.join(f'{d.name}: {d.size}' for d in op.outputs)}]")
    for weight in op.weights:
        dims = ", ".join(f"{d.name}: {d.size}" for d in weight.dims)
        print(f"  weight {weight.name:<6}[{dims}]")
    if not op.is_linear:
        print("nodes (number, step, the nodes it reads, result dims, MACs):")
        for line in _node_lines(op):
            print(line)
    constraints = solve.constraints(op)
    if constraints:
        print("constraints:")
        for constraint in constraints:
            print(f"  {constraint.description}")
    if not op.is_linear:
        print("cost (MACs: multiply-accumulates, an element-wise op counted as one; weights' and memory's elements):")
    else:
        print("cost (MACs: multiply-accumulates; params: weights' elements):")
    for line in _formula_lines(op):
        print(line)
    if not op.is_linear:
        print("loop nest (node by node; each chain's stage plan at a reference size):")
    else:
        print("loop nest (the stage plan at a reference size):")

    for line in loop_nest(op).splitlines():
        print(f"  {line}")
    print(f"key: {op.key}")
    if args.db and op.dynamic_variables:
        # a template from Canvas's sampler: its widths were filled per layer and stored with it
        store = Store(args.db, readonly=True)
        try:
            row = store.get(op.key) or {}
        finally:
            store.close()
        for layer, widths in sorted(((row.get("metrics") or {}).get("widths") or {}).items()):
            values = ", ".join(f"{name}={value}" for name, value in sorted(widths.items()))
            print(f"widths on {printable(layer)}: {printable(values)}")
    if args.svg:
        Path(args.svg).write_text(svg(op))
        print(f"wrote {args.svg}")
    return 0


def _show_cuda(op: Operator, args: argparse.Namespace) -> int:
    """``kdsl show OP --target cuda [--layers L] [--arch sm_90]``: the CUDA C of the default GPU schedule at
    one layer of the operator's table (the first by default), led by its launches and buffers."""
    from kdsl.codegen.tvm.cuda import cuda_source
    from kdsl.runtime.gpu import check_arch

    check_arch(args.arch)  # a bad arch fails before the (slow) lowering
    name = printable(args.operator)
    table, _, wanted = (args.layers or "").rpartition(":")
    table = table or gallery.layer_table(args.operator) or "resnet18"
    report = list(solve.check(op, table))
    found = [
        (layer, binding) for layer, binding in report if not wanted or getattr(layer, "name", str(layer)) == wanted
    ]
    if not found:
        names = ", ".join(getattr(layer, "name", str(layer)) for layer, _ in report)
        raise LayerError(f"{name} has no layer {printable(wanted)!r} in table {printable(table)!r} (it has {names})")
    layer, binding = found[0]
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(binding.items()))
    print(f"// {name} at {getattr(layer, 'name', layer)} ({sizes}), default GPU schedule")
    print(cuda_source(op, binding, arch=args.arch), end="")
    return 0


def command_check(args: argparse.Namespace) -> int:
    op = load_operator(args.operator)
    name = printable(args.operator)
    layers = solve.load_layers(args.layers)
    given = _parse_assignments(args.set, op, name)
    solving = bool(getattr(args, "solve", False))
    if op.dynamic_variables:
        if solving:
            raise KdslError(
                f"{name}: --solve derives coefficients of an operator without free widths; this one is a "
                f"template ({', '.join(op.dynamic_variables)}): check it without --solve, or pin them with --set"
            )
        return _check_template(args, op, name, layers, given)
    # --set pins a coefficient: the solver keeps only that value
    solved = solve.solve_coefficients(op, layers, bounds={k: [v] for k, v in given.items()}) if solving else None
    if solved is not None and not getattr(args, "json", False):
        print("\n".join(_solved_lines(solved, name, len(layers), printable(args.layers))))
    # only --set overrides: a coefficient the layer binds wins over the operator's default, so the
    # values printed below are the ones the check used (README: --set, else the layer, else default)
    pad = bool(getattr(args, "pad", False))
    report = solve.check(op, layers, coefficients=given, pad=pad)
    bindings = [(layer, binding) for layer, binding in report]
    used: list[str] = []
    for variable in op.coefficient_variables:
        values = {binding[variable] for _, binding in bindings}
        if len(values) == 1:
            used.append(f"{variable}={values.pop()}")
        else:
            used.append(
                ", ".join(f"{variable}={binding[variable]} on {printable(layer.name)}" for layer, binding in bindings)
            )
    paddings = {layer.name: padding for layer, padding in zip(report.layers, report.paddings) if padding is not None}
    branching = not op.is_linear
    rows = []
    for layer, binding in bindings:
        padding = paddings.get(layer.name)
        if padding is not None:
            # the shapes the caller passes and gets; the costs of the padded operator
            shapes = {"input": padding.input_shape, "output": padding.output_shape}
            binding = padding.padded_binding
        else:
            shapes = solve.shapes(op, binding)
        costs = solve.cost(op, binding)
        rows.append(
            {
                "layer": layer.name,
                "input": list(shapes["input"]),
                "output": list(shapes["output"]),
                "macs": costs["macs"],
                "params": costs["params"],
            }
            | ({"peak": costs["peak"]} if branching else {})
            | ({"padded": [str(v) for v in padding.variables]} if padding is not None else {})
        )
    _check_budgets(args, name, len(layers), rows)
    if getattr(args, "json", False):
        coefficients = {v: sorted({b[v] for _, b in bindings}) for v in op.coefficient_variables}
        summary = {"operator": args.operator, "layers": args.layers, "coefficients": coefficients, "rows": rows}
        if solved is not None:
            summary["solved"] = solved.as_dict()
        print(json.dumps(summary))  # json escapes control characters: the output stays inert
        return 0
    print(f"{name}: valid on all {len(layers)} layers of {printable(args.layers)}", end="")
    print(f" with {', '.join(used)}" if used else "")
    if paddings:
        # kdsl.solve.padding: zeros appended to the input, the output cropped, costs at the padded sizes
        print("padded (zeros appended to the input, the output cropped; costs at the padded sizes):")
        for layer_name, padding in paddings.items():
            print(f"  {printable(layer_name)}: {', '.join(str(v) for v in padding.variables)}")
    # one unit everywhere: a branching kernel's element-wise ops count as one MAC each (see kdsl show)
    header = f"  {'layer':<12}{'input':>22}{'output':>22}{'M MACs':>12}{'params':>12}"
    print(header + (f"{'peak elems':>14}" if branching else ""))
    for row in rows:
        peak = f"{row['peak']:>14}" if branching else ""
        print(
            f"  {printable(row['layer']):<12}{row['input']!s:>22}{row['output']!s:>22}"
            f"{row['macs'] / 1e6:>12.2f}{row['params']:>12}{peak}"
        )
    return 0


def _check_budgets(args: argparse.Namespace, name: str, count: int, rows: list[dict[str, object]]) -> None:
    """A kernel without free widths has nothing to fill: ``--max-macs``/``--max-params`` then bound
    its total cost over the layers, and a kernel over a budget is a :class:`BudgetError`."""
    flops, params = getattr(args, "max_flops", None), getattr(args, "max_params", None)
    if flops is None and params is None:
        return
    baseline = getattr(args, "baseline", None) or "conv2d"
    limits = solve.budget_limits(args.layers, max_flops=flops, max_params=params, baseline=baseline)
    for metric, option, text, column, unit in (
        ("flops", "--max-macs", flops, "macs", "MACs"),
        ("params", "--max-params", params, "params", "parameters"),
    ):
        total = sum(int(row[column]) for row in rows)  # type: ignore[call-overload]
        limit = limits[metric]
        if limit is not None and total > limit:
            raise BudgetError(
                f"{name} needs {total} {unit} over the {count} layers, more than {option} {printable(str(text))} "
                f"= {limit}; the operator has no free width to shrink (raise the budget or pick a smaller operator)"
            )


def _solved_lines(solved: solve.CoefficientSolution, name: str, count: int, table: str) -> list[str]:
    """``kdsl check --solve``'s section: each coefficient's valid values and why, then the joint
    conditions (a product of coefficients that must divide a gcd)."""
    total = len(solved.assignments)
    lines = [f"{name}: coefficient values valid on all {count} layers of {table} ({total} assignments)"]
    for variable, values in solved.values.items():
        lines.append(f"  {variable} in {{{', '.join(map(str, values))}}}: {solved.reasons[variable]}")
    for condition in solved.divides:
        if len(condition.monomial.variables) > 1:
            lines.append(f"  jointly: {condition}")
    if not solved.names:
        lines.append("  (no coefficient to solve)")
    return lines


def _check_template(
    args: argparse.Namespace, op: Operator, name: str, layers: tuple[solve.Layer, ...], given: dict[str, int]
) -> int:
    """A template (free widths): what each width must be a multiple of, then the widths filled
    per layer to the budgets (or their least channel-scaled values without one)."""
    widths = ", ".join(op.dynamic_variables)
    print(f"{name}: a template with the free widths {widths} (dynamic variables), filled per layer")
    for match in getattr(op, "matches", ()):
        print(f"  shape matching: {match.variable} = {match.size}  ({match.describe()})")
    bounds = solve.divisor_bounds(op)
    for variable, multiple in solve.freedom(op).items():
        if variable in bounds:  # matching by factors left it in a denominator: it must divide those sizes
            of = f" that is a multiple of {multiple}" if multiple != 1 else ""
            print(f"  {variable} must divide {' and '.join(map(str, bounds[variable]))}{of}")
        else:
            print(
                f"  {variable} must be a multiple of {multiple}" if multiple != 1 else f"  {variable} may be any width"
            )
    filled = solve.fill(
        op,
        layers,
        max_flops=args.max_flops,
        max_params=args.max_params,
        baseline=args.baseline,
        coefficients=given,
    )
    budgets = [
        f"{'MACs' if metric == 'flops' else metric} <= {limit}" for metric, limit in filled.budgets.items() if limit
    ]
    print(f"valid on all {len(layers)} layers of {printable(args.layers)}", end="")
    print(f" within {', '.join(budgets)}" if budgets else " (no budget: the least channel-scaled widths)")
    print(filled.report())
    return 0


def command_demo(args: argparse.Namespace) -> int:
    print("kdsl tour: every gallery operator, checked on ResNet-18's layers with its default coefficients")
    print("(stride-1 3x3 layers: table resnet18; operators that halve the image: table resnet18_stride2)\n")
    for name in gallery.names():
        op = gallery.load(name)
        print(f"== {name}  (key {op.key})")
        for line in gallery.describe(name).strip().splitlines()[:1]:
            print(f"   {line}")
        table = gallery.layer_table(name)
        if table is None:
            print("   not valid on the ResNet-18 tables with its defaults")
        else:
            layers = solve.load_layers(table)
            macs = sum(solve.cost(op, layer)["macs"] for layer in layers)
            params = sum(solve.cost(op, layer)["params"] for layer in layers)
            defaults = ", ".join(f"{k}={v}" for k, v in op.defaults) or "no coefficients"
            print(
                f"   valid on the {len(layers)} layers of {table} ({defaults}): "
                f"{macs / 1e6:.1f} M MACs, {params} params"
            )
        for line in _formula_lines(op)[:2]:
            print(f" {line}")
        print()
    return 0
