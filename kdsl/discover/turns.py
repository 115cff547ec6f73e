"""What each search strategy of a discovery produced: per strategy, how many candidates it stored,
how many were screened and trained, and how many are *usable* (within the margin of the
baseline's accuracy and faster, as :func:`kdsl.discover.ranking.verdict` says).

The strategy of a candidate is the one that stored it first (the search store keeps one row per
candidate, with the strategy that found it: ``Store.get(key)["strategy"]``); the records of
:func:`kdsl.discover.ranking.load_records` carry it as ``strategy``.

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

from collections.abc import Mapping, Sequence
from typing import Any

from kdsl.discover.evaluation_store import Evaluations
from kdsl.discover.ranking import verdict
from kdsl.lang.errors import SearchError
from kdsl.search.store import Store

__all__: Sequence[str] = ["Turns", "count_per_strategy", "per_strategy", "strategy_lines", "usable"]

#: the counts of one strategy, in the order they are printed
FIELDS = ("stored", "screened", "trained", "failed", "usable", "best_accuracy")


def per_strategy(path: str, *, margin: float = 0.02) -> dict[str, dict[str, Any]]:
    """Per strategy (the name the store records; ``"unknown"`` where a row has none): ``stored``
    valid candidates, ``screened``, ``trained`` (evaluated with an accuracy), ``failed``
    (evaluations without one), ``usable`` (within ``margin`` of the baseline's accuracy and faster)
    and ``best_accuracy`` of its trained candidates. Read-only; a database without evaluations
    counts only what was stored."""
    try:
        store = Store(path, readonly=True)
    except SearchError:
        return {}  # no candidates table: nothing was stored
    try:
        evaluations = Evaluations(path, readonly=True)
        try:
            return count_per_strategy(store, evaluations, margin=margin)
        finally:
            evaluations.close()
    finally:
        store.close()


def count_per_strategy(store: Store, evaluations: Evaluations, *, margin: float = 0.02) -> dict[str, dict[str, Any]]:
    """:func:`per_strategy` of an open search store and the evaluations beside it."""
    counts: dict[str, dict[str, Any]] = {}

    def entry(strategy: str | None) -> dict[str, Any]:
        return counts.setdefault(strategy or "unknown", dict.fromkeys(FIELDS, 0) | {"best_accuracy": None})

    for strategy, count in store.strategy_counts("valid").items():
        entry(strategy)["stored"] = count
    screened = evaluations.screened()
    evaluated = evaluations.rows()
    found_by = store.strategies_of([*screened, *(row["key"] for row in evaluated)])
    for key in screened:
        if key in found_by:  # a screen of a candidate the store does not hold is nobody's
            entry(found_by[key])["screened"] += 1
    baseline = next((row["metrics"] for row in evaluated if row["role"] == "baseline"), {})
    base = baseline.get("accuracy")
    for row in evaluated:
        if row["role"] == "baseline":
            continue
        metrics = row["metrics"]
        counts_of = entry(found_by.get(row["key"]))
        accuracy = metrics.get("accuracy")
        if not isinstance(accuracy, (int, float)):
            counts_of["failed"] += 1
            continue
        counts_of["trained"] += 1
        best = counts_of["best_accuracy"]
        counts_of["best_accuracy"] = accuracy if best is None else max(best, accuracy)
        counts_of["usable"] += usable(metrics, base, margin)
    return counts


def usable(metrics: Mapping[str, Any], baseline_accuracy: object, margin: float = 0.02) -> bool:
    """Whether a trained candidate's ``metrics`` make it usable: an accuracy within ``margin`` of the
    baseline's and faster (:func:`kdsl.discover.ranking.verdict`); False without both accuracies.

    >>> usable({"accuracy": 0.95, "latency_ratio": 0.5}, 0.96), usable({"accuracy": 0.9, "latency_ratio": 0.5}, 0.96)
    (True, False)
    """
    accuracy = metrics.get("accuracy")
    if not isinstance(accuracy, (int, float)) or not isinstance(baseline_accuracy, (int, float)):
        return False
    return verdict(metrics, baseline_accuracy=baseline_accuracy, margin=margin).startswith("usable")


def strategy_lines(counts: dict[str, dict[str, Any]]) -> list[str]:
    """One line per strategy, as the terminal shows them (with the new families where counted,
    :func:`kdsl.discover.ranking.merged_strategy_counts`).

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


class Turns:
    """Which strategy takes the next turn of a discovery: each in order once, then the one whose
    trained candidates were most often usable, so that the time goes where usable designs come from.

    A strategy's yield is ``(usable + 1) / (trained + 2)`` (Laplace's rule: an untried strategy
    counts as a coin flip, one lucky candidate does not make a favourite). No strategy is starved:
    one whose share of the turns fell below ``floor`` of an equal share goes first, so a strategy
    that produced nothing yet keeps ``floor / len(names)`` of the turns (1/6 each of three at
    the default 0.5) and can still come back.

    >>> turns = Turns(["neighbors", "mcts"])
    >>> [turns.next() for _ in range(2)]
    ['neighbors', 'mcts']
    >>> turns.record("neighbors", usable=True); turns.record("mcts", usable=False)
    >>> [turns.next() for _ in range(8)].count("neighbors")
    6
    """

    def __init__(self, names: Sequence[str], floor: float = 0.5, counts: dict[str, dict[str, Any]] | None = None):
        if not names:
            raise SearchError("no strategy to take turns")
        self.names = list(names)
        self.floor = floor
        self.turns = dict.fromkeys(self.names, 0)
        # a resumed discovery starts from what its database says each strategy produced
        self.trained = {name: int((counts or {}).get(name, {}).get("trained", 0)) for name in self.names}
        self.usable = {name: int((counts or {}).get(name, {}).get("usable", 0)) for name in self.names}
        self.skipped: set[str] = set()

    def yield_of(self, name: str) -> float:
        """The share of ``name``'s trained candidates that were usable, smoothed (see the class doc)."""
        return (self.usable[name] + 1) / (self.trained[name] + 2)

    def record(self, name: str, usable: bool) -> None:
        """One trained candidate of ``name``, usable or not."""
        if name in self.trained:
            self.trained[name] += 1
            self.usable[name] += bool(usable)

    def skip(self, name: str) -> None:
        """``name`` has nothing left to give: it takes no more turns."""
        self.skipped.add(name)

    def next(self) -> str | None:
        """The strategy of the next turn (None when every one is skipped)."""
        live = [name for name in self.names if name not in self.skipped]
        if not live:
            return None
        total = sum(self.turns[name] for name in live)
        untried = [name for name in live if self.turns[name] == 0]
        starved = [name for name in live if self.turns[name] < self.floor * total / len(live)]
        if untried:
            name = untried[0]
        elif starved:
            name = min(starved, key=lambda n: (self.turns[n], self.names.index(n)))
        else:
            name = max(live, key=lambda n: (self.yield_of(n), -self.turns[n]))
        self.turns[name] += 1
        return name

    def shares(self) -> dict[str, str]:
        """Per strategy, its turns and yield, for the terminal: ``{"mcts": "3 turns, 1/4 usable"}``."""
        return {n: f"{self.turns[n]} turns, {self.usable[n]}/{self.trained[n]} usable" for n in self.names}
