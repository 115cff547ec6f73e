"""Markdown pages for operators: the browsable gallery and the pages of search's discoveries.

A page shows an operator's DSL text, a drawing of its primitive graph (SVG, written beside the
page), its loop nest, its FLOPs and parameter formulas and their values on a layer table, any
measured metrics, and optionally its PyTorch source. A branching kernel (a
:class:`~kdsl.lang.graph.Graph`) gets the same page: the solver's cost and the renderers take both.

Measured latencies are recorded in ``latencies.json`` beside the pages' index (with the batch they
were measured at), so rebuilding the pages without measuring, or measuring only some operators,
leaves the others' numbers as they were.

>>> from kdsl import gallery
>>> text = operator_page("conv2d", gallery.load("conv2d"), svg_name="conv2d.svg")
>>> "```python" in text and "Cin*Cout*H*K**2*N*W" in text
True
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdsl import gallery, solve
from kdsl.codegen.render import loop_nest, svg
from kdsl.codegen.torch import source
from kdsl.lang.build import Operator
from kdsl.lang.errors import KdslError
from kdsl.lang.graph import Graph

#: the file (in the gallery folder) that records measured latencies: {"batch": N, "operators": {name: {...}}}
LATENCIES = "latencies.json"


def _cost_rows(op: Operator | Graph, table: object) -> list[str]:
    if table is None:
        return []
    rows = ["| layer | input | output | M MACs | params |", "| --- | --- | --- | ---: | ---: |"]
    for layer in solve.load_layers(table):
        try:
            shapes = solve.shapes(op, layer)
            costs = solve.cost(op, layer)
        except KdslError as error:
            rows.append(f"| {layer.name} | not valid: {error.message} | | | |")
            continue
        rows.append(
            f"| {layer.name} | {list(shapes['input'])} | {list(shapes['output'])} | "
            f"{costs['flops'] / 1e6:.2f} | {costs['params']} |"
        )
    return rows


def operator_page(
    title: str,
    op: Operator | Graph,
    *,
    description: str = "",
    svg_name: str | None = None,
    table: object = "resnet18",
    metrics: Mapping[str, Any] | None = None,
    torch_source: bool = False,
) -> str:
    """The Markdown page of one operator."""
    formulas = solve.cost(op)
    lines = [f"# {title}", ""]
    if description:
        lines += [description.strip(), ""]
    lines += ["```python", op.to_dsl().rstrip(), "```", ""]
    if svg_name:
        lines += [f"![the primitive graph of {title}]({svg_name})", ""]
    lines += [
        "## Cost",
        "",
        f"- multiply-accumulates: `{formulas['flops']}`",
        f"- parameters: `{formulas['params']}`",
        f"- canonical key: `{op.key}`",
        "",
    ]
    cost_rows = _cost_rows(op, table)
    if cost_rows:
        name = table if isinstance(table, str) else "given"
        lines += [f"On the `{name}` layers:", "", *cost_rows, ""]
    lines += ["## Loop nest", "", "```", loop_nest(op), "```", ""]
    if metrics:
        lines += ["## Measured", "", "| metric | value |", "| --- | --- |"]
        lines += [f"| {key} | {_format(value)} |" for key, value in metrics.items()]
        lines.append("")
    if torch_source:
        lines += ["## PyTorch source", "", "```python", source(op).rstrip(), "```", ""]
    return "\n".join(lines)


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def build_gallery(
    out: Path | None = None,
    *,
    latencies: Mapping[str, Mapping[str, float]] | None = None,
    batch: int = 1,
    rediscovery: Mapping[str, Mapping[str, Any]] | None = None,
    discoveries: Sequence[tuple[str, Operator | Graph, Mapping[str, Any]]] = (),
) -> Path:
    """Write ``README.md`` (an index with thumbnails) and one page per gallery operator, plus pages
    for search's discoveries (marked new). ``latencies`` (per operator, from
    :func:`kdsl.bench.backends.gallery_latencies`) are summed over the operator's layer table; they
    join the ones recorded in ``out/latencies.json`` at the same batch (new measurements win), and
    the pages show the recorded ones of operators not measured this time."""
    out = Path(out) if out is not None else gallery.directory()
    pages = out / "pages"
    pages.mkdir(parents=True, exist_ok=True)
    names = gallery.names()
    recorded = load_latencies(out / LATENCIES, batch)
    if latencies:
        recorded.update({name: dict(values) for name, values in latencies.items()})
        _save_latencies(out / LATENCIES, batch, {name: recorded[name] for name in names if name in recorded})
    latencies = recorded
    rediscovery = rediscovery or {}
    index = [
        "# The kdsl gallery",
        "",
        "Operators written in the DSL (one `.dsl` file each in this folder) and operators that search found.",
        f"Latencies: forward, batch {batch}, milliseconds summed over the operator's ResNet-18 layer table,",
        "kdsl->PyTorch, native PyTorch, kdsl->TVM (default schedule), measured by `kdsl gallery build`.",
        "",
        "| operator | graph | layers | M MACs | params | torch ms | native ms | TVM ms | rediscovered by search |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]

    for name in names:
        op = gallery.load(name)
        table = gallery.layer_table(name)
        (pages / f"{name}.svg").write_text(svg(op))
        metrics: dict[str, Any] = dict(latencies.get(name, {}))
        record = rediscovery.get(name)
        if record:
            metrics.update({f"search {k}": v for k, v in record.items()})
        page = operator_page(
            name, op, description=gallery.describe(name), svg_name=f"{name}.svg", table=table, metrics=metrics
        )
        (pages / f"{name}.md").write_text(page)
        macs = params = 0
        if table is not None:
            for layer in solve.load_layers(table):
                cost = solve.cost(op, layer)
                macs += cost["flops"]
                params += cost["params"]
        found = _rediscovery_text(record)
        timing = latencies.get(name, {})
        index.append(
            f"| [{name}](pages/{name}.md) | <img src='pages/{name}.svg' width='120'> | {table or '-'} | "
            f"{macs / 1e6:.1f} | {params} | {_ms(timing.get('kdsl_fwd_ms'))} | {_ms(timing.get('native_fwd_ms'))} | "
            f"{_ms(timing.get('tvm_fwd_ms'))} | {found} |"
        )
    for title, op, metrics in discoveries:
        (pages / f"{title}.svg").write_text(svg(op))
        (pages / f"{title}.md").write_text(
            operator_page(f"{title} (new)", op, svg_name=f"{title}.svg", metrics=metrics, torch_source=True)
        )
        index.append(
            f"| [{title}](pages/{title}.md) **new** | <img src='pages/{title}.svg' width='120'> "
            "| - | - | - | - | - | - | found by search |"
        )
    (out / "README.md").write_text("\n".join(index) + "\n")
    return out


def _ms(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


def _rediscovery_text(record: Mapping[str, Any] | None) -> str:
    if not record:
        return "not searched yet"
    space = f"{record['space']} space, " if record.get("space") else ""
    if not record.get("found"):
        return f"not found ({record.get('strategy', '?')}, {space}depth <= {record.get('max_depth', '?')})"
    nodes = f"{record['nodes']} nodes, " if record.get("nodes") else ""
    return (
        f"found by search: {record.get('strategy')}, {space}depth {record.get('depth')}, {nodes}"
        f"{record.get('seconds', 0):.1f} s"
    )


def load_latencies(path: Path, batch: int) -> dict[str, dict[str, float]]:
    """The latencies recorded in ``path`` (``{name: {kdsl_fwd_ms, native_fwd_ms, tvm_fwd_ms}}``) if
    they were measured at ``batch``; none otherwise (numbers at another batch do not compare).

    >>> load_latencies(Path("no-such-file.json"), 1)
    {}
    """
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as error:
        raise KdslError(f"cannot read the latency records {path}: {error}") from None
    operators = data.get("operators") if isinstance(data, dict) else None
    if not isinstance(operators, dict) or not all(isinstance(v, dict) for v in operators.values()):
        raise KdslError(f"{path} must hold {{'batch': N, 'operators': {{name: {{metric: ms}}}}}}")
    if data.get("batch") != batch:
        return {}
    return {name: {k: float(v) for k, v in values.items()} for name, values in operators.items()}


def _save_latencies(path: Path, batch: int, operators: Mapping[str, Mapping[str, float]]) -> None:
    path.write_text(json.dumps({"batch": batch, "operators": operators}, indent=1, sort_keys=True) + "\n")


def load_rediscovery(path: Path) -> dict[str, dict[str, Any]]:
    """Rediscovery records written by search (``{name: {found, strategy, depth, seconds, key}}``)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as error:
        raise KdslError(f"cannot read the rediscovery records {path}: {error}") from None
    if not isinstance(data, dict):
        raise KdslError(f"{path} must hold an object of records by operator name")
    return data
