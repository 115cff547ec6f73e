"""Markdown pages for operators: the browsable gallery and the pages of search's discoveries.

A page shows an operator's DSL text, a drawing of its primitive graph (SVG, written beside the
page), its loop nest, its FLOPs and parameter formulas and their values on a layer table, any
measured metrics, and optionally its PyTorch source. A branching kernel (a
:class:`~kdsl.lang.operator.Operator`) gets the same page: the solver's cost and the renderers take both.

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
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdsl import gallery, solve
from kdsl.codegen.render import loop_nest, svg
from kdsl.codegen.torch import source
from kdsl.gallery.content import (
    CATEGORIES,
    GRAPH_LEGEND,
    LEGEND,
    Entry,
    category,
    description_blocks,
    first_sentence,
    markdown_prose,
    metric_label,
    search_badge,
    search_rows,
    use_it,
)
from kdsl.gallery.site import write_site
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator

#: the file (in the gallery folder) that records measured latencies: {"batch": N, "operators": {name: {...}}}
LATENCIES = "latencies.json"


def _cost_rows(op: Operator, table: object) -> list[str]:
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
    op: Operator,
    *,
    description: str = "",
    svg_name: str | None = None,
    table: object = "resnet18",
    metrics: Mapping[str, Any] | None = None,
    torch_source: bool = False,
    search: Mapping[str, Any] | None = None,
    nav: str = "",
    usage: str = "",
) -> str:
    """The Markdown page of one operator: ``nav`` (links to the index and neighbours) on top, the
    description (formulas in code blocks, prose escaped so no ``*`` turns into emphasis),
    ``usage`` (Python that builds it), its DSL, drawing, costs, loop nest, measured numbers (with
    their labels, :func:`~kdsl.gallery.content.metric_label`) and search's rediscovery record."""
    formulas = solve.cost(op)
    lines = [nav, ""] if nav else []
    lines += [f"# {title}", ""]
    for kind, text in description_blocks(description) if description.strip() else []:
        if kind == "record":
            lines += [f"- {markdown_prose(row)}" for row in text.splitlines()] + [""]
            continue
        lines += (["```text", text, "```"] if kind == "formula" else [markdown_prose(text)]) + [""]
    if usage:
        lines += ["## Use it", "", "```python", usage, "```", ""]
    lines += ["## DSL", "", "```python", op.to_dsl().rstrip(), "```", ""]
    if svg_name:
        lines += [
            f"![the primitive graph of {title}]({svg_name})",
            "",
            GRAPH_LEGEND if not op.is_linear else LEGEND,
            "",
        ]
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
        lines += [f"| {markdown_prose(metric_label(key))} | {_format(value)} |" for key, value in metrics.items()]
        lines.append("")
    if search:
        lines += ["## Rediscovery by search", "", f"Search: {search_badge(search)[1]}.", "", "| | |", "| --- | --- |"]
        lines += [f"| {label} | {markdown_prose(value)} |" for label, value in search_rows(search)]
        lines.append("")
    if torch_source:
        lines += ["## PyTorch source", "", "```python", source(op).rstrip(), "```", ""]
    return "\n".join(lines)


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def gallery_entries(
    latencies: Mapping[str, Mapping[str, float]],
    rediscovery: Mapping[str, Mapping[str, Any]],
    discoveries: Sequence[tuple[str, Operator, Mapping[str, Any]]] = (),
) -> list[Entry]:
    """Every gallery operator (then search's discoveries) with what its pages show, in index order
    (by category, then name)."""
    entries = []
    for name in gallery.names():
        op = gallery.load(name)
        description = gallery.describe(name)
        table = gallery.layer_table(name)
        macs = params = 0.0
        if table is not None:
            for layer in solve.load_layers(table):
                cost = solve.cost(op, layer)
                macs += cost["flops"]
                params += cost["params"]
        entries.append(
            Entry(
                name,
                op,
                description,
                table,
                category(name, op, description),
                macs,
                params,
                dict(latencies.get(name, {})),
                rediscovery.get(name),
                new=description.startswith(gallery.DISCOVERED),
            )
        )
    for title, op, metrics in discoveries:
        entries.append(Entry(title, op, category="discoveries", metrics=dict(metrics), new=True))
    order = {slug: number for number, (slug, _, _) in enumerate(CATEGORIES)}
    return sorted(entries, key=lambda entry: (order[entry.category], entry.name))


def build_gallery(
    out: Path | None = None,
    *,
    latencies: Mapping[str, Mapping[str, float]] | None = None,
    batch: int = 1,
    rediscovery: Mapping[str, Mapping[str, Any]] | None = None,
    discoveries: Sequence[tuple[str, Operator, Mapping[str, Any]]] = (),
    site: bool = True,
    recorded: Path | None = None,
) -> Path:
    """Write ``README.md`` (an index by category with thumbnails) and one page per gallery
    operator, plus pages for search's discoveries (marked new), and with ``site`` the same as a
    static HTML site in ``out/site`` (:func:`kdsl.gallery.site.write_site`). ``latencies`` (per
    operator, from :func:`kdsl.bench.backends.gallery_latencies`) are summed over the operator's
    layer table; they join the ones recorded in ``out/latencies.json`` at the same batch (new
    measurements win), and the pages show the recorded ones of operators not measured this time.
    ``recorded``: a folder whose ``latencies.json`` to start from (the gallery's own, when the site
    is built elsewhere; those in ``out`` win over them); the merged records are written to ``out``."""
    out = Path(out) if out is not None else gallery.directory()
    pages = out / "pages"
    pages.mkdir(parents=True, exist_ok=True)
    names = gallery.names()
    known = load_latencies(Path(recorded) / LATENCIES, batch) if recorded is not None else {}
    elsewhere = recorded is not None and Path(recorded).resolve() != out.resolve()
    known.update(load_latencies(out / LATENCIES, batch))
    if latencies:
        known.update({name: dict(values) for name, values in latencies.items()})
    if latencies or (elsewhere and known):
        _save_latencies(out / LATENCIES, batch, {name: known[name] for name in names if name in known})
    entries = gallery_entries(known, rediscovery or {}, discoveries)
    index = [
        "# The kdsl gallery",
        "",
        "Operators written in the DSL (one `.dsl` file each in this folder) and operators that search found,",
        "by category. Each page has the operator's formula, a drawing of its primitive graph, Python that",
        "builds it as a PyTorch module, its cost formulas, its loop nest and its measured latencies.",
        "The same pages as a website: `site/index.html` (built by `kdsl gallery build`; open it in a browser).",
        "",
        f"Latencies: forward, batch {batch}, milliseconds summed over the operator's ResNet-18 layer table",
        "(`resnet18`, the stride-1 3x3 layers, unless a row says `resnet18_stride2`): PyTorch is kdsl's PyTorch",
        "code, native the PyTorch function, TVM kdsl's TVM kernel (default schedule); measured by",
        "`kdsl gallery build`. M MACs: millions of multiply-accumulates, summed over the same layers.",
        "",
    ]
    present = [c for c in CATEGORIES if any(e.category == c[0] for e in entries)]
    index += [" · ".join(f"[{title}](#{_anchor(title)})" for _, title, _ in present), ""]
    for number, entry in enumerate(entries):
        previous = entries[number - 1] if number else None
        following = entries[number + 1] if number + 1 < len(entries) else None
        title = dict((slug, title) for slug, title, _ in CATEGORIES)[entry.category]
        nav = f"[← the gallery](../README.md) · [{title}](../README.md#{_anchor(title)})"
        if previous:
            nav += f" · previous: [{previous.name}]({previous.name}.md)"
        if following:
            nav += f" · next: [{following.name}]({following.name}.md)"
        (pages / f"{entry.name}.svg").write_text(svg(entry.op))
        usage = use_it(entry.name, entry.op, entry.table) if not entry.new or entry.table else ""
        page = operator_page(
            entry.name + (" (new)" if entry.new else ""),
            entry.op,
            description=entry.description,
            svg_name=f"{entry.name}.svg",
            table=entry.table,
            metrics=entry.metrics,
            search=entry.search,
            nav=nav,
            usage=usage,
            torch_source=entry.new,
        )
        (pages / f"{entry.name}.md").write_text(page)
    for slug, title, blurb in present:
        index += [
            f"## {title}",
            "",
            markdown_prose(blurb[0].upper() + blurb[1:]) + ".",
            "",
            "| operator | graph | M MACs | params | PyTorch ms | native ms | TVM ms | search |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for entry in (e for e in entries if e.category == slug):
            timing = entry.metrics
            badge = "new: found by search" if entry.new else search_badge(entry.search)[1]
            layers = f" (on `{entry.table}`)" if entry.table not in ("resnet18", None) else ""
            summary = first_sentence(entry.description) if entry.description else "Found by search."
            index.append(
                f"| [{entry.name}](pages/{entry.name}.md)<br>{markdown_prose(summary)}"
                f"{layers} | <img src='pages/{entry.name}.svg' width='200'> | "
                f"{_number(entry.macs, 1e6)} | {_number(entry.params)} | {_ms(timing.get('kdsl_fwd_ms'))} | "
                f"{_ms(timing.get('native_fwd_ms'))} | {_ms(timing.get('tvm_fwd_ms'))} | {badge} |"
            )
        index.append("")
    (out / "README.md").write_text("\n".join(index))
    if site:
        write_site(out / "site", entries, batch=batch)
    return out


def _anchor(title: str) -> str:
    """The anchor a code host gives a ``## title`` heading (lower case, spaces to ``-``, most
    punctuation dropped)."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _number(value: float | None, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    return f"{value / scale:.1f}" if scale != 1.0 else f"{value:.0f}"


def _ms(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"


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
