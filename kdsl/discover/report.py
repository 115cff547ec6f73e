"""The output of a discovery run: a ranked table (Markdown and JSON), a Pareto plot of accuracy
against latency with the baseline marked, and one page per top candidate. What a record carries and
how records rank: :mod:`kdsl.discover.ranking`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdsl.codegen.render import svg
from kdsl.discover.ranking import (
    Record,
    family_counts,
    merged_strategy_counts,
    pareto,
    rank,
    top_families,
    usable_record,
    verdict,
)
from kdsl.gallery.pages import operator_page
from kdsl.lang.errors import printable
from kdsl.lang.parser import parse


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
            what = f": {best['provenance']}" if best.get("provenance") else ""
            line += (
                f"; {len(faster)} of them run faster than the baseline, the fastest {best['key']} "
                f"({1 / best['latency_ratio']:.2f}x faster, accuracy {best['accuracy']:.3f}{what})."
            )
        else:
            line += ", but none of them runs faster than the baseline."
        lines.append(line)
    if any(r.get("kind") for r in records):
        lines.append(families_text(records, baseline_accuracy=baseline_accuracy, margin=margin))
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


#: The columns of the ranked table, in order: ``results.md``, the terminal and ``kdsl results
#: --json`` show the same rows with these fields (:func:`table_rows`).
COLUMNS = (
    "rank",
    "key",
    "what it is",
    "found by",
    "accuracy",
    "latency ratio",
    "ms: candidate / paired conv2d",
    "TVM / PyTorch conv2d",
    "eager PyTorch / PyTorch conv2d",
    "eager PyTorch ms",
    "MACs ratio",
    "latency / MACs",
    "params",
    "verdict",
)


def table_rows(records: Sequence[Record], baseline: Record, *, margin: float = 0.02) -> list[dict[str, Any]]:
    """The ranked table's rows (records in their ranked order), one dict each with the fields of
    :data:`COLUMNS`: what every view of the ranking shows.

    >>> rows = table_rows([{"key": "a", "accuracy": 0.95, "latency_ratio": 0.5, "flops_ratio": 0.25,
    ...                     "provenance": "is `grouped_conv2d` (G=2)", "strategy": "neighbors"}],
    ...                   {"accuracy": 0.96}, margin=0.02)
    >>> rows[0]["what it is"], rows[0]["latency / MACs"], rows[0]["verdict"]
    ('is `grouped_conv2d` (G=2)', 2.0, 'usable: within 1.0 points, 2.00x faster')
    """
    base = baseline.get("accuracy") or 0.0
    rows = []
    for position, record in enumerate(records, start=1):
        overhead = lowering_overhead([record])
        rows.append(
            {
                "rank": position,
                "key": record["key"],
                "what it is": record.get("provenance"),
                "found by": record.get("strategy"),
                "accuracy": record.get("accuracy"),
                "latency ratio": record.get("latency_ratio"),
                "ms: candidate / paired conv2d": _paired_ms(record),
                "TVM / PyTorch conv2d": record.get("tvm_vs_torch_conv2d"),
                "eager PyTorch / PyTorch conv2d": record.get("torch_ratio"),
                "eager PyTorch ms": record.get("latency_ms"),
                "MACs ratio": record.get("flops_ratio"),
                "latency / MACs": overhead["median"] if overhead else None,
                "params": record.get("params"),
                "verdict": verdict(record, baseline_accuracy=base, margin=margin),
            }
        )
    return rows


def _markdown_cell(text: Any) -> str:
    return _cell(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(
    records: Sequence[Record],
    baseline: Record,
    *,
    links: Mapping[str, str] | None = None,
    margin: float = 0.02,
) -> str:
    """The ranked table as Markdown, the baseline in the first row, each row with what the
    candidate is (its provenance) and its verdict."""
    links = links or {}
    backend = _backend(records, baseline)
    own = baseline.get("tvm_latency_ms" if backend == "tvm" else "latency_ms")
    titles = [f"latency ratio ({RANKED[backend]})" if c == "latency ratio" else c for c in COLUMNS]
    lines = [
        "| " + " | ".join(titles) + " |",
        "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        f"| - | baseline | {baseline.get('name', 'conv2d')} | - | {_cell(baseline.get('accuracy'))} | 1.000 | "
        f"{_cell(own, 2)} (own evaluation) | {_cell(baseline.get('tvm_vs_torch_conv2d'))} | "
        f"{_cell(baseline.get('torch_ratio'))} | {_cell(baseline.get('latency_ms'), 2)} | 1.000 | "
        f"1.000 | {_cell(baseline.get('params'))} | the reference |",
    ]
    for row in table_rows(records, baseline, margin=margin):
        name = row["key"]
        label = f"[{name}]({links[name]})" if name in links else f"`{name}`"
        lines.append(
            f"| {row['rank']} | {label} | {_markdown_cell(row['what it is'])} | {_markdown_cell(row['found by'])} | "
            f"{_cell(row['accuracy'])} | {_cell(row['latency ratio'])} | {row['ms: candidate / paired conv2d']} | "
            f"{_cell(row['TVM / PyTorch conv2d'])} | {_cell(row['eager PyTorch / PyTorch conv2d'])} | "
            f"{_cell(row['eager PyTorch ms'], 2)} | {_cell(row['MACs ratio'])} | "
            f"{_cell(row['latency / MACs'], 2)} | {_cell(row['params'])} | {_markdown_cell(row['verdict'])} |"
        )
    return "\n".join(lines) + "\n"


#: What ``latency_ratio`` divides, per ``latency_backend``, in a table header's words.
RANKED = {"tvm": "TVM kernel / TVM conv2d", "torch": "eager PyTorch / PyTorch conv2d"}


def _backend(records: Sequence[Record], baseline: Record) -> str:
    """The backend ``latency_ratio`` was measured with (records before it was recorded: torch)."""
    for record in [baseline, *records]:
        if record.get("latency_backend") in RANKED:
            return str(record["latency_backend"])
    return "torch"


def _paired_ms(record: Record) -> str:
    """The ranked kernel's time and the baseline time measured beside it (what the ratio divides).

    >>> _paired_ms({"latency_backend": "tvm", "tvm_latency_ms": 3.0, "latency_baseline_ms": 11.8})
    '3.00 / 11.80'
    """
    mine = record.get("tvm_latency_ms" if record.get("latency_backend") == "tvm" else "latency_ms")
    paired = record.get("latency_baseline_ms")
    return "-" if mine is None or paired is None else f"{mine:.2f} / {paired:.2f}"


def text_table(records: Sequence[Record], baseline: Record, *, margin: float = 0.02) -> str:
    """The same ranking as plain text for a terminal (``kdsl results`` on a discovery database):
    a row per candidate, and under it what the candidate is and which strategy found it.
    ``latency`` is the ranked ratio (``latency_ratio``), ``vs torch`` the TVM kernel over PyTorch's
    conv2d, ``eager`` kdsl's eager PyTorch over PyTorch's conv2d."""
    rows = [
        f"latency = {RANKED[_backend(records, baseline)]} (conv2d timed beside each candidate); "
        f"vs torch = TVM kernel / PyTorch conv2d; eager = eager PyTorch / PyTorch conv2d",
        f"{'rank':>4}  {'candidate':<18}{'accuracy':>9}{'latency':>9}{'vs torch':>9}{'eager':>8}{'MACs':>8}  verdict",
    ]
    rows.append(
        f"{'-':>4}  {'baseline':<18}{_cell(baseline.get('accuracy')):>9}{'1.000':>9}"
        f"{_cell(baseline.get('tvm_vs_torch_conv2d')):>9}{_cell(baseline.get('torch_ratio')):>8}{'1.000':>8}  "
        f"the reference"
    )
    for row in table_rows(records, baseline, margin=margin):
        rows.append(
            f"{row['rank']:>4}  {printable(row['key'])[:16]:<18}{_cell(row['accuracy']):>9}"
            f"{_cell(row['latency ratio']):>9}{_cell(row['TVM / PyTorch conv2d']):>9}"
            f"{_cell(row['eager PyTorch / PyTorch conv2d']):>8}{_cell(row['MACs ratio'], 2):>8}  "
            f"{printable(row['verdict'])}"
        )
        if row["what it is"] or row["found by"]:
            found_by = f" [{printable(str(row['found by']))}]" if row["found by"] else ""
            rows.append(f"{'':>6}{printable(str(row['what it is'] or '-'))}{found_by}")
    return "\n".join(rows)


def families_text(records: Sequence[Record], *, baseline_accuracy: float, margin: float = 0.02) -> str:
    """The report's sentence on what the candidates are: known designs and new families apart."""
    counts = family_counts(records, baseline_accuracy=baseline_accuracy, margin=margin)

    def words(kinds: Mapping[str, int]) -> str:
        names = {"known": "known designs", "variant": "known designs with shifts inserted", "new": "new"}
        parts = [f"{n} {names.get(kind, kind)}" for kind, n in kinds.items()]
        return ", ".join(parts) if parts else "none"

    text = (
        f"What they are: of the trained, {words(counts['trained'])} ({counts['new families']} distinct new "
        f"families); of the usable (within {100 * margin:.1f} points and faster), {words(counts['usable'])} "
        f"({counts['usable new families']} distinct new families)."
    )
    new = [r for r in records if r.get("kind") in ("new", "uncompared") and usable_record(r, baseline_accuracy, margin)]
    if not new:
        return text + f" No new family came within {100 * margin:.1f} points of the baseline and ran faster."
    best = min(new, key=lambda r: r["latency_ratio"])
    return text + (
        f" The fastest usable new one: {best['key']} ({1 / best['latency_ratio']:.2f}x faster, accuracy "
        f"{best['accuracy']:.3f}): {best['provenance']}."
    )


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


def network_table(rows: Sequence[Mapping[str, Any]], records: Sequence[Record]) -> str:
    """The end-to-end section of ``results.md``: ResNet-18 with each of the top families in its
    stage convolutions (:func:`kdsl.discover.network.network_latency`'s rows), what each one is."""
    what = {str(r["key"]): r.get("provenance") for r in records}
    lines = [
        "## End to end: ResNet-18\n",
        "ResNet-18 (ImageNet shapes, 224x224, random weights) with its 13 stride-1 3x3 convolutions replaced "
        "(the stem, the stride-2 convolutions and the shortcuts stay conv2d); ratio to the original network on "
        "the same backend (torch: eager PyTorch modules against nn.Conv2d; tvm: kdsl's TVM kernels against conv2d "
        "lowered the same way), timed interleaved in one run (`kdsl bench network` times any operator).\n",
        "| operator | what it is | backend | batch | ms | ratio | vs PyTorch's network |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        key = str(row["op"]).split(" ")[0]
        lines.append(
            f"| {_markdown_cell(row['op'])} | {_markdown_cell(what.get(key, '-'))} | {row['backend']} | "
            f"{row['batch']} | {row['ms']:.1f} | {row['ratio']:.2f} | {row['vs_native']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def strategy_table(counts: Mapping[str, Mapping[str, Any]]) -> str:
    """Per strategy, what it produced (Markdown), from :func:`merged_strategy_counts`."""
    lines = [
        "## By strategy\n",
        "| strategy | stored | screened | trained | usable | new families | usable new families |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in counts.items():
        lines.append(
            f"| {_markdown_cell(name)} | {_cell(row.get('stored'))} | {_cell(row.get('screened'))} | "
            f"{_cell(row.get('trained', 0))} | {_cell(row.get('usable', 0))} | {row['new families']} | "
            f"{row['usable new families']} |"
        )
    return "\n".join(lines) + "\n"


def _families_note() -> str:
    return (
        "\n*What it is* is computed (kdsl.search.provenance): a candidate is a known design when its function "
        "family (equal up to a re-parametrization of its weights and a roll or flip of its spatial output) is a "
        "gallery operator's; a variant when only its Shift steps tell it from one; new otherwise. Discover trains "
        "one candidate per design and coefficients (repeats are recorded, not trained).\n"
    )


def write_report(
    records: Sequence[Record],
    baseline: Record,
    out: Path,
    *,
    baseline_accuracy: float,
    margin: float,
    top: int = 5,
    layers: object = "resnet18",
    store_counts: Mapping[str, Mapping[str, Any]] | None = None,
    network_rows: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Path]:
    """Write ``results.md``, ``results.json``, ``pareto.png`` and ``pages/<key>.md`` for the top
    candidates and every usable new family into ``out``; return the paths. ``store_counts``: the
    per-strategy counts only the database has (:func:`kdsl.discover.turns.per_strategy`),
    shown with the records' own;
    ``network_rows``: ResNet-18 end to end with the top families (:func:`top_families`)."""
    out.mkdir(parents=True, exist_ok=True)
    ranked = rank(records, baseline_accuracy=baseline_accuracy, margin=margin)
    links: dict[str, str] = {}
    pages = out / "pages"
    pages.mkdir(exist_ok=True)

    # pages for the top of the ranking and for every usable new family (its fastest candidate)
    paged = [r for r in ranked if r.get("accuracy") is not None][:top]
    families = top_families(records, baseline_accuracy=baseline_accuracy, margin=margin, count=len(records))
    paged += [r for r in families if r.get("kind") in ("new", "uncompared") and r not in paged]
    for record in paged:
        op = parse(record["dsl"])
        metrics = {"what it is": record.get("provenance"), "found by": record.get("strategy")}
        shown = ("accuracy", "latency_ratio", "latency_baseline_ms", "tvm_latency_ms", "tvm_vs_torch_conv2d")
        metrics |= {k: record.get(k) for k in (*shown, "torch_ratio", "latency_ms", "flops_ratio", "params")}
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
        f"a candidate runs than its MACs (multiply-accumulates) predict.\n\n{latency_note(records, baseline)}\n\n"
        f"![Pareto plot](pareto.png)\n\n"
    )
    strategies = merged_strategy_counts(records, store_counts, baseline_accuracy=baseline_accuracy, margin=margin)
    table.write_text(
        header
        + markdown_table(ranked, baseline, links=links, margin=margin)
        + "\n"
        + strategy_table(strategies)
        + _families_note()
        + ("\n" + network_table(network_rows, records) if network_rows else "")
    )
    results = {
        "baseline": baseline,
        "families": family_counts(records, baseline_accuracy=baseline_accuracy, margin=margin),
        "strategies": strategies,
        "table": table_rows(ranked, baseline, margin=margin),
        "network": list(network_rows or []),
        "candidates": ranked,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    plot = pareto_plot(records, baseline, out / "pareto.png")
    return {"table": table, "json": out / "results.json", "plot": plot, "pages": pages}


def latency_note(records: Sequence[Record], baseline: Record) -> str:
    """What the table's latency columns are relative to, and where the baseline came from.

    >>> print(latency_note([], {"latency_backend": "tvm", "baseline_cache": {"file": "f.json", "measured": "then"}}))
    ... # doctest: +NORMALIZE_WHITESPACE
    Latency: the ranking's *latency ratio* is the TVM kernel kdsl would deploy ...
    The baseline's evaluation was read from this machine's cache (f.json, measured then) ...
    """
    backend = _backend(records, baseline)
    if backend == "tvm":
        line = (
            "Latency: the ranking's *latency ratio* is the TVM kernel kdsl would deploy (default schedule, tuned "
            "records where present) over conv2d's TVM kernel compiled the same way"
        )
    else:
        line = "Latency: the ranking's *latency ratio* is kdsl's eager PyTorch module over PyTorch's conv2d (F.conv2d)"
    line += (
        ", each layer's candidate and conv2d timed in the same interleaved rounds at one thread (the median of "
        "the rounds' ratios, weighted over the layers by conv2d's time). *ms: candidate / paired conv2d* are "
        "those rounds' summed medians, so each ratio is relative to the conv2d time on its own row; the "
        "baseline row's time is from the baseline's own evaluation (conv2d against itself, at the start of the "
        "run or from the cache) and differs from the paired times as the machine's load does. *TVM / PyTorch "
        "conv2d* and *eager PyTorch / PyTorch conv2d* compare with PyTorch's own conv2d timed in the same rounds."
    )
    cache = baseline.get("baseline_cache")
    if isinstance(cache, Mapping):
        line += (
            f"\n\nThe baseline's evaluation was read from this machine's cache ({cache.get('file')}, measured "
            f"{cache.get('measured')}) for the same machine, layer table, evaluators, proxy and seed; "
            f"`kdsl discover --no-baseline-cache` measures it again."
        )
    return line
