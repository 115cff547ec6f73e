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
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdsl.codegen.render import svg
from kdsl.gallery.pages import operator_page
from kdsl.lang.errors import SearchError, printable
from kdsl.lang.parser import parse
from kdsl.storage import Database, json_object

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


def verdict(record: Record, *, baseline_accuracy: float, margin: float = 0.02) -> str:
    """What a user should read from one row, in words.

    >>> verdict({"accuracy": 0.97, "latency_ratio": 0.5}, baseline_accuracy=0.976, margin=0.01)
    'usable: within 0.6 points, 2.00x faster'
    >>> verdict({"accuracy": 0.90, "latency_ratio": 0.5}, baseline_accuracy=0.976, margin=0.01)
    'too inaccurate: 7.6 points below'
    """
    accuracy = record.get("accuracy")
    if accuracy is None:
        return f"failed: {str(record.get('error') or record.get('status') or 'no accuracy')[:60]}"
    gap = 100 * (baseline_accuracy - accuracy)
    if accuracy < baseline_accuracy - margin:
        return f"too inaccurate: {gap:.1f} points below"
    ratio = record.get("latency_ratio")
    # a gap that rounds to 0.0 points reads "as accurate", never "-0.0 points above"
    near = f"within {gap:.1f} points" if gap >= 0.05 else f"{-gap:.1f} points above" if gap <= -0.05 else "as accurate"
    if ratio is None:
        return f"accurate enough ({near}), latency not measured"
    if ratio < 1.0:
        return f"usable: {near}, {1 / ratio:.2f}x faster"
    return f"accurate but slower: {near}, {ratio:.2f}x the baseline's latency"


def lowering_overhead(records: Sequence[Record]) -> dict[str, float] | None:
    """Latency ratio divided by MACs ratio over the candidates that have both: how much slower a
    candidate runs than its MACs (multiply-accumulates) predict (1 = as predicted). ``None`` without such candidates.

    >>> lowering_overhead([{"latency_ratio": 0.5, "flops_ratio": 0.25}, {"latency_ratio": 1.0, "flops_ratio": 0.5}])
    {'median': 2.0, 'max': 2.0, 'count': 2}
    """
    found = [
        r["latency_ratio"] / r["flops_ratio"]
        for r in records
        if isinstance(r.get("latency_ratio"), (int, float)) and isinstance(r.get("flops_ratio"), (int, float))
        if r["flops_ratio"] > 0
    ]
    if not found:
        return None
    return {"median": statistics.median(found), "max": max(found), "count": len(found)}


def summary(records: Sequence[Record], *, baseline_accuracy: float, margin: float = 0.02) -> str:
    """The answer of a run in a few plain sentences: what met the margin, what is faster, or that
    nothing did, and the closest miss.

    >>> rows = [{"key": "a", "accuracy": 0.90, "latency_ratio": 0.5}]
    >>> for part in summary(rows, baseline_accuracy=0.976, margin=0.01).split("; "):
    ...     print(part)
    No candidate came within 1.0 points of the baseline's accuracy (0.976)
    the closest is a at 0.900 (7.6 points below).
    """
    accurate = [r for r in records if r.get("accuracy") is not None and r["accuracy"] >= baseline_accuracy - margin]
    faster = [r for r in accurate if r.get("latency_ratio") is not None and r["latency_ratio"] < 1.0]
    lines = []
    if not accurate:
        measured = [r for r in records if r.get("accuracy") is not None]
        line = (
            f"No candidate came within {100 * margin:.1f} points of the baseline's accuracy ({baseline_accuracy:.3f})"
        )
        if measured:
            best = max(measured, key=lambda r: r["accuracy"])
            line += (
                f"; the closest is {best['key']} at {best['accuracy']:.3f} "
                f"({100 * (baseline_accuracy - best['accuracy']):.1f} points below)"
            )
        lines.append(line + ".")
    else:
        line = (
            f"{len(accurate)} of {len(records)} candidates came within {100 * margin:.1f} points of the "
            f"baseline's accuracy"
        )
        if faster:
            best = min(faster, key=lambda r: r["latency_ratio"])
            line += (
                f"; {len(faster)} of them run faster than the baseline, the fastest {best['key']} "
                f"({1 / best['latency_ratio']:.2f}x faster, accuracy {best['accuracy']:.3f})."
            )
        else:
            line += ", but none of them runs faster than the baseline."
        lines.append(line)
    overhead = lowering_overhead(records)
    if overhead is not None:
        lines.append(
            f"Latency ratio / MACs ratio over {overhead['count']} candidates: median {overhead['median']:.2f}, "
            f"max {overhead['max']:.2f} (1 = as fast as the MACs predict)."
        )
    return "\n".join(lines)


def _cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(
    records: Sequence[Record],
    baseline: Record,
    *,
    links: Mapping[str, str] | None = None,
    margin: float = 0.02,
) -> str:
    """The ranked table as Markdown, the baseline in the first row, each row with its verdict."""
    links = links or {}
    base = baseline.get("accuracy") or 0.0
    lines = [
        "| rank | candidate | accuracy | latency ratio | MACs ratio | latency / MACs | params | verdict |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        f"| - | baseline ({baseline.get('name', 'conv2d')}) | {_cell(baseline.get('accuracy'))} | 1.000 | 1.000 | "
        f"1.000 | {_cell(baseline.get('params'))} | the reference |",
    ]
    for position, record in enumerate(records, start=1):
        name = record["key"]
        label = f"[{name}]({links[name]})" if name in links else f"`{name}`"
        overhead = lowering_overhead([record])
        lines.append(
            f"| {position} | {label} | {_cell(record.get('accuracy'))} | {_cell(record.get('latency_ratio'))} | "
            f"{_cell(record.get('flops_ratio'))} | {_cell(overhead['median'] if overhead else None, 2)} | "
            f"{_cell(record.get('params'))} | {verdict(record, baseline_accuracy=base, margin=margin)} |"
        )
    return "\n".join(lines) + "\n"


def text_table(records: Sequence[Record], baseline: Record, *, margin: float = 0.02) -> str:
    """The same ranking as plain text for a terminal (``kdsl results`` on a discovery database)."""
    base = baseline.get("accuracy") or 0.0
    rows = [f"{'rank':>4}  {'candidate':<18}{'accuracy':>9}{'latency':>9}{'MACs':>8}  verdict"]
    rows.append(
        f"{'-':>4}  {'baseline':<18}{_cell(baseline.get('accuracy')):>9}{'1.000':>9}{'1.000':>8}  the reference"
    )
    for position, record in enumerate(records, start=1):
        rows.append(
            f"{position:>4}  {printable(record['key'])[:16]:<18}{_cell(record.get('accuracy')):>9}"
            f"{_cell(record.get('latency_ratio')):>9}{_cell(record.get('flops_ratio'), 2):>8}  "
            f"{printable(verdict(record, baseline_accuracy=base, margin=margin))}"
        )
    return "\n".join(rows)


def _minor_ratio(value: float, _: object) -> str:
    """A minor tick's label on the log latency axis: only 2, 3 and 5 times a power of ten."""
    if value <= 0:
        return ""
    leading = value / 10 ** math.floor(math.log10(value))
    return f"{value:g}x" if round(leading, 6) in (2.0, 3.0, 5.0) else ""


def pareto_plot(records: Sequence[Record], baseline: Record, path: Path) -> Path:
    """Accuracy against latency ratio for every evaluated candidate, the Pareto front joined, and
    the baseline marked; written as PNG with matplotlib's Agg backend (no display needed)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    usable = [
        r
        for r in records
        if r.get("accuracy") is not None and r.get("latency_ratio") is not None and r["latency_ratio"] > 0
    ]
    figure, axes = plt.subplots(figsize=(7.2, 4.8), dpi=120)
    if usable:
        axes.scatter(
            [r["latency_ratio"] for r in usable], [r["accuracy"] for r in usable], s=18, alpha=0.6, label="candidates"
        )
        # the front includes the baseline: a candidate on it beats conv2d on speed or on accuracy
        reference = {"key": "baseline", "accuracy": baseline.get("accuracy"), "latency_ratio": 1.0}
        front = pareto([*usable, reference] if baseline.get("accuracy") is not None else usable)
        # as steps: each point is the most accurate one can get at or below its latency
        axes.step(
            [r["latency_ratio"] for r in front],
            [r["accuracy"] for r in front],
            where="post",
            color="tab:green",
            label="Pareto front",
        )
        axes.plot([r["latency_ratio"] for r in front], [r["accuracy"] for r in front], "o", color="tab:green", ms=4)
        # label a front point only where it does not sit on a label already placed (a dense front
        # of near-equal candidates became one unreadable smear of keys)
        placed: list[tuple[float, float]] = []
        low, high = axes.get_ylim()
        for record in front:
            x = math.log10(max(record["latency_ratio"], 1e-9))
            y = (record["accuracy"] - low) / ((high - low) or 1.0)
            crowded = any(abs(x - px) < 0.2 and abs(y - py) < 0.06 for px, py in placed)
            if record["key"] != "baseline" and not crowded:
                placed.append((x, y))
                axes.annotate(
                    str(record["key"])[:8],
                    (record["latency_ratio"], record["accuracy"]),
                    textcoords="offset points",
                    xytext=(4, -10),
                    fontsize=7,
                )
        axes.set_xscale("log")
        # plain ratios (0.3x, 1x, 2x) read better than powers of ten
        axes.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}x"))
        axes.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_minor_ratio))
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
    axes.set_xlabel("latency relative to the baseline (log scale; lower is faster)")
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
        f"# kdsl discover: {len(records)} candidates evaluated\n\n"
        f"{summary(records, baseline_accuracy=baseline_accuracy, margin=margin)}\n\n"
        f"How the table is ranked: candidates within {100 * margin:.1f} points of the baseline's accuracy "
        f"({baseline_accuracy:.3f}) come first, fastest first (a latency ratio below 1 is faster than the baseline); "
        f"then the others, most accurate first; failed evaluations last. *latency / MACs* says how much slower "
        f"a candidate runs than its MACs (multiply-accumulates) predict.\n\n![Pareto plot](pareto.png)\n\n"
    )
    table.write_text(header + markdown_table(ranked, baseline, links=links, margin=margin))
    (out / "results.json").write_text(json.dumps({"baseline": baseline, "candidates": ranked}, indent=1, default=str))
    plot = pareto_plot(records, baseline, out / "pareto.png")
    return {"table": table, "json": out / "results.json", "plot": plot, "pages": pages}


def load_records(path: str) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """The evaluated candidates of a discovery database and its baseline record, read-only, as
    :func:`write_report` takes them; ``None`` when the database holds no evaluations (a search
    database that :command:`kdsl discover` never used)."""
    database = Database(path, readonly=True, what="results database", error=SearchError)
    try:
        tables = {row[0] for row in database.rows("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "evaluations" not in tables or "candidates" not in tables:
            return None
        rows = database.rows(
            "SELECT e.key, e.role, e.status, e.metrics, e.error, c.dsl, c.strategy FROM evaluations e "
            "LEFT JOIN candidates c ON c.key = e.key"
        )
    finally:
        database.close()
    baseline: dict[str, Any] | None = None
    records = []
    for key, role, status, text, error, dsl, strategy in rows:
        metrics = json_object(text, f"{printable(path)}: evaluations row {printable(repr(key)[:80])}", SearchError)
        if role == "baseline":
            baseline = {"name": "conv2d", **{k: metrics.get(k) for k in ("accuracy", "params", "latency_ms")}}
            continue
        if dsl is None:
            continue
        records.append(
            {
                "key": key,
                "dsl": dsl,
                "status": status,
                "error": error,
                **{k: metrics.get(k) for k in ("accuracy", "latency_ratio", "latency_ms", "flops_ratio", "params")},
                "early_stopped": metrics.get("early_stopped"),
                "strategy": strategy,  # the search strategy that found it (kdsl.discover.strategies)
            }
        )
    if baseline is None:
        return None
    return records, baseline
