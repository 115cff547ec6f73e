"""What each search strategy of a discovery produced: per strategy, how many candidates it stored,
how many were screened and trained, and how many are *usable* (within the margin of the
baseline's accuracy and faster, as :func:`kdsl.discover.report.verdict` says).

The strategy of a candidate is the one that stored it first (the search store keeps one row per
candidate, with the strategy that found it: ``Store.get(key)["strategy"]``); the records of
:func:`kdsl.discover.report.load_records` carry it as ``strategy``.

>>> import os, tempfile
>>> from kdsl.search.store import Store
>>> db = os.path.join(tempfile.mkdtemp(), "run.sqlite")
>>> store = Store(db)
>>> lease = store.claim("space", "canvas", 0, "demo")
>>> store.commit(lease, [{"key": "k1", "dsl": "...", "depth": 3, "status": "valid", "strategy": "canvas"}], {})
>>> store.close()
>>> per_strategy(db)
{'canvas': {'stored': 1, 'screened': 0, 'trained': 0, 'failed': 0, 'usable': 0, 'best_accuracy': None}}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kdsl.discover.report import verdict
from kdsl.lang.errors import SearchError, printable
from kdsl.storage import Database, json_object

__all__: Sequence[str] = ["per_strategy", "strategy_lines"]

#: the counts of one strategy, in the order they are printed
FIELDS = ("stored", "screened", "trained", "failed", "usable", "best_accuracy")


def per_strategy(path: str, *, margin: float = 0.02) -> dict[str, dict[str, Any]]:
    """Per strategy (the name the store records; ``"unknown"`` where a row has none): ``stored``
    valid candidates, ``screened``, ``trained`` (evaluated with an accuracy), ``failed``
    (evaluations without one), ``usable`` (within ``margin`` of the baseline's accuracy and faster)
    and ``best_accuracy`` of its trained candidates. Read-only; a database without evaluations
    counts only what was stored."""
    database = Database(path, readonly=True, what="results database", error=SearchError)
    try:
        tables = {row[0] for row in database.rows("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "candidates" not in tables:
            return {}
        stored = database.rows("SELECT strategy, COUNT(*) FROM candidates WHERE status = 'valid' GROUP BY strategy")
        screened = (
            database.rows(
                "SELECT c.strategy, COUNT(*) FROM screens s JOIN candidates c ON c.key = s.key GROUP BY c.strategy"
            )
            if "screens" in tables
            else []
        )
        evaluated = (
            database.rows(
                "SELECT e.role, c.strategy, e.metrics FROM evaluations e LEFT JOIN candidates c ON c.key = e.key"
            )
            if "evaluations" in tables
            else []
        )
    finally:
        database.close()
    counts: dict[str, dict[str, Any]] = {}

    def entry(strategy: str | None) -> dict[str, Any]:
        return counts.setdefault(strategy or "unknown", dict.fromkeys(FIELDS, 0) | {"best_accuracy": None})

    for strategy, count in stored:
        entry(strategy)["stored"] = count
    for strategy, count in screened:
        entry(strategy)["screened"] = count
    where = f"{printable(path)}: an evaluations row's metrics"
    baseline = next((json_object(text, where, SearchError) for role, _, text in evaluated if role == "baseline"), {})
    base = baseline.get("accuracy")
    for role, strategy, text in evaluated:
        if role == "baseline":
            continue
        metrics = json_object(text, where, SearchError)
        counts_of = entry(strategy)
        accuracy = metrics.get("accuracy")
        if not isinstance(accuracy, (int, float)):
            counts_of["failed"] += 1
            continue
        counts_of["trained"] += 1
        best = counts_of["best_accuracy"]
        counts_of["best_accuracy"] = accuracy if best is None else max(best, accuracy)
        if isinstance(base, (int, float)) and verdict(metrics, baseline_accuracy=base, margin=margin).startswith(
            "usable"
        ):
            counts_of["usable"] += 1
    return counts


def strategy_lines(counts: dict[str, dict[str, Any]]) -> list[str]:
    """One line per strategy, as the terminal shows them (with the new families where counted,
    :func:`kdsl.discover.report.merged_strategy_counts`).

    >>> strategy_lines({"mcts": {"stored": 9, "screened": 8, "trained": 2, "failed": 0, "usable": 1,
    ...                          "best_accuracy": 0.95}})
    ['mcts: 9 stored, 8 screened, 2 trained (0 failed), 1 usable, best accuracy 0.950']
    """
    lines = []
    for name, each in sorted(counts.items()):
        best = each.get("best_accuracy")
        families = each.get("new families")
        lines.append(
            f"{name}: {each.get('stored', 0)} stored, {each.get('screened', 0)} screened, {each.get('trained', 0)} "
            f"trained ({each.get('failed', 0)} failed), {each.get('usable', 0)} usable"
            + (f", best accuracy {best:.3f}" if best is not None else "")
            + (
                f", {families} new families ({each.get('usable new families', 0)} usable)"
                if families is not None
                else ""
            )
        )
    return lines
