"""The records of a discovery and what ranks them: a *record* is a dict with at least ``key``,
``dsl``, ``accuracy``, ``latency_ratio``, ``flops_ratio``, ``params`` (as the evaluators return them);
the baseline record has the same fields for the baseline operator (its ratios are 1).

Latency fields (:class:`~kdsl.discover.evaluators.LatencyEvaluator`; every ratio is the median of
per-round ratios, the candidate and its denominator timed in the same interleaved rounds, weighted
over the layer table by the denominator's time; < 1 is faster):

- ``latency_ratio``: **what the ranking uses**: with ``latency_backend`` ``"tvm"`` (the default)
  the TVM kernel kdsl would deploy (default schedule, or tuned records where present) over conv2d's
  TVM kernel compiled the same way (= ``tvm_latency_ratio``); with ``"torch"`` = ``torch_ratio``;
- ``latency_baseline_ms``: the paired baseline time ``latency_ratio`` is relative to (summed medians
  over the layers, measured beside this candidate; the baseline record's own ``latency_ms`` /
  ``tvm_latency_ms`` were measured in its own evaluation and differ with the machine's load);
- ``torch_ratio``: kdsl's eager PyTorch module over PyTorch's ``F.conv2d``;
- ``tvm_vs_torch_conv2d``: the TVM kernel over PyTorch's ``F.conv2d``;
- ``latency_ms`` (eager PyTorch), ``tvm_latency_ms`` (TVM kernel), ``baseline_latency_ms``
  (``F.conv2d``, paired), ``baseline_tvm_latency_ms`` (conv2d's TVM kernel, paired): summed medians;
- ``tvm_schedule`` (default or tuned), ``tvm_error`` (why the TVM kernel did not build; the
  candidate then has no TVM ratios and, ranked by TVM, no ``latency_ratio``).

The baseline record says in ``baseline_cache`` when its evaluation came from this machine's cache
(:mod:`kdsl.discover.baseline_cache`).

>>> rows = [{"key": "a", "accuracy": 0.9, "latency_ratio": 0.5}, {"key": "b", "accuracy": 0.8, "latency_ratio": 0.6},
...         {"key": "c", "accuracy": 0.95, "latency_ratio": 0.9}]
>>> [r["key"] for r in pareto(rows)]
['a', 'c']
>>> [r["key"] for r in rank(rows, baseline_accuracy=0.96, margin=0.02)]
['c', 'a', 'b']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kdsl.discover.evaluation_store import Evaluations
from kdsl.discover.families import FamilyTable, annotate
from kdsl.lang.errors import SearchError
from kdsl.search.store import Store

Record = Mapping[str, Any]

#: The latency metrics a record carries (see the module's docstring).
LATENCY_FIELDS = (
    "latency_ratio",
    "latency_backend",
    "latency_baseline_ms",
    "torch_ratio",
    "tvm_vs_torch_conv2d",
    "latency_ms",
    "tvm_latency_ms",
    "baseline_latency_ms",
    "baseline_tvm_latency_ms",
    "tvm_schedule",
    "tvm_error",
)
#: What a record of a discovery database carries.
RECORD_FIELDS = ("accuracy", *LATENCY_FIELDS, "flops_ratio", "params")
#: What the baseline record carries.
BASELINE_FIELDS = ("accuracy", "params", *LATENCY_FIELDS, "baseline_cache")


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
        failed = record.get("tvm_error")
        return f"accurate enough ({near}), " + (f"no TVM kernel: {failed[:80]}" if failed else "latency not measured")
    if ratio < 1.0:
        return f"usable: {near}, {1 / ratio:.2f}x faster"
    return f"accurate but slower: {near}, {ratio:.2f}x the baseline's latency"


def usable_record(record: Record, baseline_accuracy: float, margin: float) -> bool:
    accuracy, ratio = record.get("accuracy"), record.get("latency_ratio")
    return accuracy is not None and accuracy >= baseline_accuracy - margin and ratio is not None and ratio < 1.0


def family_counts(records: Sequence[Record], *, baseline_accuracy: float, margin: float = 0.02) -> dict[str, Any]:
    """How many trained candidates are known designs (``known``), known designs with shifts
    inserted (``variant``) and new (``new``, ``uncompared``), in all and among the usable ones
    (within ``margin`` of the baseline's accuracy and faster); and how many distinct new families.

    >>> rows = [{"key": "a", "kind": "new", "family": "f", "accuracy": 0.95, "latency_ratio": 0.5},
    ...         {"key": "b", "kind": "new", "family": "f", "accuracy": 0.95, "latency_ratio": 0.6},
    ...         {"key": "c", "kind": "known", "family": "g", "accuracy": 0.95, "latency_ratio": 0.5}]
    >>> counts = family_counts(rows, baseline_accuracy=0.96)
    >>> counts["usable"], counts["new families"], counts["usable new families"]
    ({'known': 1, 'new': 2}, 1, 1)
    """
    trained = [r for r in records if r.get("accuracy") is not None]
    usable = [r for r in trained if usable_record(r, baseline_accuracy, margin)]

    def kinds(rows: Sequence[Record]) -> dict[str, int]:
        found: dict[str, int] = {}
        for row in rows:
            kind = str(row.get("kind") or "unclassified")
            found[kind] = found.get(kind, 0) + 1
        return dict(sorted(found.items()))

    def families(rows: Sequence[Record]) -> int:
        return len({r.get("family") for r in rows if r.get("kind") in ("new", "uncompared")})

    return {
        "trained": kinds(trained),
        "usable": kinds(usable),
        "new families": families(trained),
        "usable new families": families(usable),
    }


def strategy_counts(
    records: Sequence[Record], *, baseline_accuracy: float, margin: float = 0.02
) -> dict[str, dict[str, int]]:
    """Per search strategy: candidates trained, usable (within ``margin`` and faster), and the
    distinct new families among each.

    >>> rows = [{"key": "a", "strategy": "mcts", "kind": "new", "family": "f", "accuracy": 0.95, "latency_ratio": 0.5}]
    >>> strategy_counts(rows, baseline_accuracy=0.96)
    {'mcts': {'trained': 1, 'usable': 1, 'new families': 1, 'usable new families': 1}}
    """
    found: dict[str, dict[str, int]] = {}
    for strategy in sorted({str(r.get("strategy") or "unknown") for r in records}):
        mine = [r for r in records if str(r.get("strategy") or "unknown") == strategy]
        counts = family_counts(mine, baseline_accuracy=baseline_accuracy, margin=margin)
        found[strategy] = {
            "trained": sum(counts["trained"].values()),
            "usable": sum(counts["usable"].values()),
            "new families": counts["new families"],
            "usable new families": counts["usable new families"],
        }
    return found


def merged_strategy_counts(
    records: Sequence[Record],
    store_counts: Mapping[str, Mapping[str, Any]] | None,
    *,
    baseline_accuracy: float,
    margin: float = 0.02,
) -> dict[str, dict[str, Any]]:
    """:func:`strategy_counts` of the records, with what only the database knows (per strategy:
    ``stored``, ``screened``, ``failed``; :func:`kdsl.discover.turns.per_strategy`) beside it."""
    counts = {name: dict(row) for name, row in (store_counts or {}).items()}
    for name, row in strategy_counts(records, baseline_accuracy=baseline_accuracy, margin=margin).items():
        counts.setdefault(name, {}).update(row)
    for row in counts.values():
        row.setdefault("new families", 0)
        row.setdefault("usable new families", 0)
    return dict(sorted(counts.items()))


def top_families(
    records: Sequence[Record], *, baseline_accuracy: float, margin: float = 0.02, count: int = 3
) -> list[Record]:
    """The fastest usable candidate (within ``margin`` and faster) of each family, new families
    first, then known designs and variants; at most ``count``: what the report times end to end.

    >>> rows = [{"key": "a", "kind": "known", "family": "f", "accuracy": 0.95, "latency_ratio": 0.4},
    ...         {"key": "b", "kind": "new", "family": "g", "accuracy": 0.95, "latency_ratio": 0.6},
    ...         {"key": "c", "kind": "new", "family": "g", "accuracy": 0.95, "latency_ratio": 0.5}]
    >>> [r["key"] for r in top_families(rows, baseline_accuracy=0.96)]
    ['c', 'a']
    """
    usable = sorted(
        (r for r in records if usable_record(r, baseline_accuracy, margin)),
        key=lambda r: (r.get("kind") not in ("new", "uncompared"), r["latency_ratio"]),
    )
    chosen: list[Record] = []
    for record in usable:
        if all(record.get("family") != other.get("family") for other in chosen):
            chosen.append(record)
    return chosen[:count]


def load_records(path: str) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """The evaluated candidates of a discovery database and its baseline record, read-only, as
    :func:`write_report` takes them; ``None`` when the database holds no evaluations (a search
    database that :command:`kdsl discover` never used)."""
    evaluations = Evaluations(path, readonly=True)
    try:
        if not evaluations.present:
            return None
        try:
            store = Store(path, readonly=True)
        except SearchError:
            return None  # evaluations without a search store beside them: nothing to rank
        families = FamilyTable(path, readonly=True)
        try:
            return records_from(store, evaluations, families)
        finally:
            families.close()
            store.close()
    finally:
        evaluations.close()


def records_from(
    store: Store, evaluations: Evaluations, families: FamilyTable
) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """:func:`load_records` of an open search store, the evaluations and the provenance beside it."""
    evaluated = evaluations.rows()
    candidates = store.get_many(row["key"] for row in evaluated)
    stored = families.get(candidates)
    baseline: dict[str, Any] | None = None
    records = []
    for row in evaluated:
        metrics = row["metrics"]
        if row["role"] == "baseline":
            baseline = {"name": "conv2d", **{k: metrics.get(k) for k in BASELINE_FIELDS}}
            continue
        candidate = candidates.get(row["key"])
        if candidate is None:
            continue
        records.append(
            {
                "key": row["key"],
                "dsl": candidate["dsl"],
                "status": row["status"],
                "error": row["error"],
                **{k: metrics.get(k) for k in RECORD_FIELDS},
                "early_stopped": metrics.get("early_stopped"),
                "strategy": candidate.get("strategy"),
                "search_metrics": candidate.get("metrics") or {},
            }
        )
    if baseline is None:
        return None
    annotate(records, stored)
    return records, baseline
