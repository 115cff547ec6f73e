"""The output of a discovery run: a ranked table (Markdown and JSON), a Pareto plot of accuracy
against latency with the baseline marked, and one page per top candidate.

A *record* is a dict with at least ``key``, ``dsl``, ``accuracy``, ``latency_ratio``,
``flops_ratio``, ``params`` (as the evaluators return them); the baseline record has the same
fields for the baseline operator (its ratios are 1).

>>> rows = [{"key": "a", "accuracy": 0.9, "latency_ratio": 0.5}, {"key": "b", "accuracy": 0.8, "latency_ratio": 0.6},
...         {"key": "c", "accuracy": 0.95, "latency_ratio": 0.9}]
>>> [r["key"] for r in pareto(rows)]
['a', 'c']
>>> [r["key"] for r in rank(rows, baseline_accuracy=0.96, margin=0.02)]
['c', 'a', 'b']
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdsl.codegen.render import svg
from kdsl.gallery.pages import operator_page
from kdsl.lang.parser import parse

Record = Mapping[str, Any]


def pareto(records: Sequence[Record]) -> list[Record]:
    """The records no other record beats on both accuracy (higher) and latency ratio (lower),
    sorted by latency ratio."""
    usable = [r for r in records if r.get("accuracy") is not None and r.get("latency_ratio") is not None]
    front = []
    for record in usable:
        dominated = any(
            other["accuracy"] >= record["accuracy"]
            and other["latency_ratio"] <= record["latency_ratio"]
            and (other["accuracy"] > record["accuracy"] or other["latency_ratio"] < record["latency_ratio"])
            for other in usable
        )
        if not dominated:
            front.append(record)
    return sorted(front, key=lambda r: r["latency_ratio"])


def rank(records: Sequence[Record], *, baseline_accuracy: float, margin: float = 0.02) -> list[Record]:
    """Candidates within ``margin`` of the baseline's accuracy first, fastest first; then the rest
    by accuracy. Records without an accuracy (failed evaluations) come last."""

    def key(record: Record) -> tuple:
        accuracy = record.get("accuracy")
        if accuracy is None:
            return (2, 0.0, 0.0)
        ratio = record.get("latency_ratio")
        ratio = float("inf") if ratio is None else ratio
        if accuracy >= baseline_accuracy - margin:
            return (0, ratio, -accuracy)
        return (1, -accuracy, ratio)

    return sorted(records, key=key)


def _cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(records: Sequence[Record], baseline: Record, *, links: Mapping[str, str] | None = None) -> str:
    """The ranked table as Markdown, the baseline in the first row."""
    links = links or {}
    lines = [
        "| rank | candidate | accuracy | latency ratio | FLOPs ratio | params | status |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- |",
        f"| - | baseline ({baseline.get('name', 'conv2d')}) | {_cell(baseline.get('accuracy'))} | 1.000 | 1.000 | "
        f"{_cell(baseline.get('params'))} | ok |",
    ]
    for position, record in enumerate(records, start=1):
        name = record["key"]
        label = f"[{name}]({links[name]})" if name in links else f"`{name}`"
        lines.append(
            f"| {position} | {label} | {_cell(record.get('accuracy'))} | {_cell(record.get('latency_ratio'))} | "
            f"{_cell(record.get('flops_ratio'))} | {_cell(record.get('params'))} | {record.get('status', 'ok')} |"
        )
    return "\n".join(lines) + "\n"


def pareto_plot(records: Sequence[Record], baseline: Record, path: Path) -> Path:
    """Accuracy against latency ratio for every evaluated candidate, the Pareto front joined, and
    the baseline marked; written as PNG with matplotlib's Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    usable = [r for r in records if r.get("accuracy") is not None and r.get("latency_ratio") is not None]
    figure, axes = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    if usable:
        axes.scatter(
            [r["latency_ratio"] for r in usable], [r["accuracy"] for r in usable], s=18, alpha=0.6, label="candidates"
        )
        front = pareto(usable)
        axes.plot(
            [r["latency_ratio"] for r in front],
            [r["accuracy"] for r in front],
            "-o",
            color="tab:green",
            markersize=4,
            label="Pareto front",
        )
    if baseline.get("accuracy") is not None:
        axes.scatter(
            [1.0],
            [baseline["accuracy"]],
            marker="*",
            s=160,
            color="tab:red",
            zorder=5,
            label=f"baseline ({baseline.get('name', 'conv2d')})",
        )
    axes.set_xlabel("latency relative to the baseline (lower is faster)")
    axes.set_ylabel("validation accuracy (proxy task)")
    axes.set_title("kdsl discover: accuracy vs latency")
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def write_report(
    records: Sequence[Record],
    baseline: Record,
    out: Path,
    *,
    baseline_accuracy: float,
    margin: float,
    top: int = 5,
    layers: object = "resnet18",
) -> dict[str, Path]:
    """Write ``results.md``, ``results.json``, ``pareto.png`` and ``pages/<key>.md`` for the top
    candidates into ``out``; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    ranked = rank(records, baseline_accuracy=baseline_accuracy, margin=margin)
    links: dict[str, str] = {}
    pages = out / "pages"
    pages.mkdir(exist_ok=True)

    for record in [r for r in ranked if r.get("accuracy") is not None][:top]:
        op = parse(record["dsl"])
        metrics = {k: record.get(k) for k in ("accuracy", "latency_ratio", "flops_ratio", "params", "latency_ms")}
        metrics["baseline accuracy"] = baseline.get("accuracy")
        (pages / f"{record['key']}.svg").write_text(svg(op))
        page = operator_page(
            f"candidate {record['key']}",
            op,
            svg_name=f"{record['key']}.svg",
            table=layers,
            metrics=metrics,
            torch_source=True,
        )
        (pages / f"{record['key']}.md").write_text(page)
        links[record["key"]] = f"pages/{record['key']}.md"
    table = out / "results.md"
    header = (
        f"# kdsl discover: {len(records)} candidates evaluated\n\nRanked: within {margin:.0%} of the baseline's "
        f"accuracy ({baseline_accuracy:.3f}) first, fastest first.\n\n![Pareto plot](pareto.png)\n\n"
    )
    table.write_text(header + markdown_table(ranked, baseline, links=links))
    (out / "results.json").write_text(json.dumps({"baseline": baseline, "candidates": ranked}, indent=1, default=str))
    plot = pareto_plot(records, baseline, out / "pareto.png")
    return {"table": table, "json": out / "results.json", "plot": plot, "pages": pages}
