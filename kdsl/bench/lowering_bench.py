"""``kdsl bench lowering``: how far each operator's PyTorch latency strays from what its FLOPs predict.

For each operator (the candidates of a results database, or named operators) it measures the
latency ratio to the baseline (conv2d) with the latency evaluator of ``kdsl discover``
(:class:`~kdsl.discover.evaluators.LatencyEvaluator`: interleaved with the baseline, holding the
machine's latency slot) and the FLOPs ratio with the analytic one, and reports their quotient

    lowering overhead = (latency ratio to conv2d) / (FLOPs ratio to conv2d)

1 means the generated code is exactly as efficient per FLOP as PyTorch's conv2d; 10 means each of
its FLOPs costs ten times as much (a blow-up in the lowering: a materialised product, a copy per
step, an einsum that cannot use a matrix product). :func:`summarize` gives the median and the
maximum over the operators, the numbers issue 14 tracks.

>>> rows = [{"key": "a", "latency_ratio": 0.5, "flops_ratio": 0.25}, {"key": "b", "latency_ratio": 3.0,
...         "flops_ratio": 0.1}, {"key": "c", "error": "LoweringError: ..."}]
>>> summary = summarize(rows)
>>> summary["median"], summary["max"], summary["worst"], summary["measured"], summary["failed"]
(16.0, 30.0, 'b', 2, 1)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from statistics import median
from typing import Any

from kdsl.bench.argument_types import positive_int
from kdsl.discover.evaluators import AnalyticEvaluator, Context, LatencyEvaluator
from kdsl.lang.errors import KdslError, printable
from kdsl.lang.library import load_operator
from kdsl.lang.parser import parse
from kdsl.runtime.timing import latency_slot
from kdsl.runtime.workers import WorkerPool
from kdsl.search.store import Store

__all__ = ["add_arguments", "bench_lowering", "measure", "overhead", "summarize"]


def overhead(latency_ratio: float, flops_ratio: float) -> float:
    """Latency ratio over FLOPs ratio (both to the baseline); infinite for an operator without FLOPs.

    >>> overhead(0.5, 0.25)
    2.0
    """
    return latency_ratio / flops_ratio if flops_ratio > 0 else math.inf


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median and maximum :func:`overhead` over the rows that were measured (a row with an
    ``error`` was not; one without FLOPs is counted apart, its overhead being infinite)."""
    measured = [row for row in rows if "error" not in row]
    finite = [(overhead(row["latency_ratio"], row["flops_ratio"]), row) for row in measured]
    finite = [(value, row) for value, row in finite if math.isfinite(value)]
    values = [value for value, _ in finite]
    worst = max(finite, key=lambda item: item[0])[1] if finite else None
    return {
        "measured": len(finite),
        "failed": len(rows) - len(measured),
        "without_flops": len(measured) - len(finite),
        "median": median(values) if values else None,
        "max": max(values) if values else None,
        "worst": worst["key"] if worst else None,
    }


def _candidates(db: str, top: int, include_all: bool) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(key, DSL text, widths) of the best ``top`` candidates of a results database."""
    store = Store(db, readonly=True)
    try:
        rows = store.top(top, status=None if include_all else "valid")
    finally:
        store.close()
    return [(row["key"], row["dsl"], (row.get("metrics") or {}).get("widths")) for row in rows]


def _named(refs: Sequence[str]) -> list[tuple[str, str, None]]:
    """(name, DSL text, None) of gallery operators or ``.dsl``/``.json`` files."""
    return [(Path(ref).stem if Path(ref).suffix else ref, load_operator(ref).to_dsl(), None) for ref in refs]


def _setup(layers: object, batch: int, latency: Mapping[str, Any]) -> tuple[AnalyticEvaluator, LatencyEvaluator]:
    return AnalyticEvaluator(layers=layers), LatencyEvaluator(layers=layers, batch=batch, **dict(latency))


def _measure_one(
    state: tuple[AnalyticEvaluator, LatencyEvaluator],
    item: tuple[str, str, dict[str, Any] | None],
    slot: Callable[[], AbstractContextManager[Any]] = latency_slot,
) -> dict[str, Any]:
    analytic, timer = state
    key, text, widths = item
    row: dict[str, Any] = {"key": key}
    try:
        op = parse(text)
        context = Context(widths=widths or None, latency_slot=slot)
        flops = analytic.evaluate(op, context)  # type: ignore[arg-type]
        times = timer.evaluate(op, context)  # type: ignore[arg-type]
    except Exception as error:  # one operator's failure (a backend's bug) must not hide the others
        first = str(error).splitlines()[0] if str(error) else ""
        row["error"] = f"{type(error).__name__}: {first}"[:300]
        return row
    row.update(
        flops_ratio=flops["flops_ratio"],
        latency_ratio=times["latency_ratio"],
        overhead=overhead(times["latency_ratio"], flops["flops_ratio"]),
        latency_ms=times["latency_ms"],
        baseline_latency_ms=times["baseline_latency_ms"],
        latency_spread=times["latency_spread"],
    )
    return row


def measure(
    items: Sequence[tuple[str, str, dict[str, Any] | None]],
    *,
    layers: object = "resnet18",
    batch: int = 1,
    latency: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per ``(key, DSL text, widths)``: ``key``, ``flops_ratio``, ``latency_ratio``,
    ``overhead``, ``latency_ms``, ``baseline_latency_ms``, ``latency_spread``; or ``key`` and
    ``error`` when the operator does not parse, bind or lower on a layer. ``latency``: more
    keyword arguments of :class:`LatencyEvaluator` (``repeats``, ``threads``, ...).

    With ``timeout`` (seconds) each operator runs in an isolated worker process that is killed
    after that long or when it runs out of memory (a blown-up lowering can need gigabytes), and
    its row says so; without, they run in this process."""
    setup = functools.partial(_setup, layers, batch, dict(latency or {}))
    rows: list[dict[str, Any]] = []
    if timeout is None:
        state = setup()
        for item in items:
            rows.append(_measure_one(state, item))
            if progress is not None:
                progress(rows[-1])
        return rows
    with WorkerPool(_measure_one, setup=setup, timeout=timeout, name="kdsl-bench-lowering") as pool:
        for item, outcome in pool.map(items, key=lambda item: item):
            if outcome.ok:
                row = outcome.value
            else:
                reason = outcome.error or outcome.status
                row = {"key": item[0], "error": f"{outcome.status}: {reason.splitlines()[0] if reason else ''}"[:300]}
            rows.append(row)
            if progress is not None:
                progress(row)
    return rows


def _line(row: Mapping[str, Any]) -> str:
    if "error" in row:
        return f"{printable(row['key']):<18} not measured: {printable(row['error'])}"
    return (
        f"{printable(row['key']):<18}{row['flops_ratio']:>8.3f}{row['latency_ratio']:>9.3f}{row['overhead']:>10.2f}"
        f"{row['latency_ms']:>10.2f}{row['baseline_latency_ms']:>10.2f}{row['latency_spread']:>8.2f}"
    )


def bench_lowering(args: argparse.Namespace) -> int:
    """``kdsl bench lowering --db RUNS [--top N]`` or ``--ops NAME|FILE.dsl ...``: the table and the
    median and maximum overhead (latency ratio / FLOPs ratio)."""
    if bool(args.db) == bool(args.ops):
        raise KdslError("kdsl bench lowering needs either --db RUNS or --ops NAME|FILE.dsl ... (not both)")
    items = _candidates(args.db, args.top, args.all) if args.db else _named(args.ops)
    latency = {"threads": args.threads or None, "repeats": args.repeats, "max_repeats": 3 * args.repeats}
    if not args.json:
        print(
            f"kdsl bench lowering: {len(items)} operators, layers {args.layers}, batch {args.batch}, "
            f"threads {args.threads or 'as the process has'}; ratios to conv2d (latency: median of interleaved pairs)"
        )
        print("overhead = latency ratio / MACs ratio (1: as efficient per MAC as PyTorch's conv2d)\n")
        print(f"{'operator':<18}{'MACs':>8}{'latency':>9}{'overhead':>10}{'ms':>10}{'conv ms':>10}{'spread':>8}")
    rows = measure(
        items,
        layers=args.layers,
        batch=args.batch,
        latency=latency,
        timeout=args.timeout,
        progress=(lambda row: print(_line(row), file=sys.stderr if args.json else sys.stdout, flush=True)),
    )
    summary = summarize(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, sort_keys=True, default=str))
        return 0
    if summary["median"] is None:
        print("\nno operator was measured")
        return 0
    print(
        f"\noverhead over {summary['measured']} operators: median {summary['median']:.2f}, "
        f"max {summary['max']:.2f} ({printable(summary['worst'])})"
        + (f"; {summary['failed']} not measured" if summary["failed"] else "")
        + (f"; {summary['without_flops']} without MACs" if summary["without_flops"] else "")
    )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", help="results database (read only): measure its best candidates")
    parser.add_argument("--top", type=positive_int, default=30, help="how many candidates of --db")
    parser.add_argument("--all", action="store_true", help="include candidates that are not 'valid'")
    parser.add_argument("--ops", nargs="*", help="gallery names or .dsl/.json files to measure instead of --db")
    parser.add_argument("--layers", default="resnet18", help="layer table: resnet18, resnet18_stride2 or a JSON file")
    parser.add_argument("--batch", type=positive_int, default=1, help="batch size N (1, as discover)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads while timing (0: keep)")
    parser.add_argument("--repeats", type=positive_int, default=9, help="interleaved rounds per layer (at least)")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per operator before its worker is killed (default 300)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print rows and summary as JSON instead of a table (progress on stderr)"
    )
