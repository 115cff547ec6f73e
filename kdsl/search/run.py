"""The search driver: runs a strategy over a space, evaluates each new operator once, and stores
results and progress together so that an interrupted search resumes with the same call.

>>> import tempfile, os
>>> from kdsl.search.space import Space
>>> space = Space("matmul", "resnet18", max_depth=2, caps={"Shift": 0, "Expand": 0})
>>> db = os.path.join(tempfile.mkdtemp(), "r.db")
>>> report = search(space, "enumerate", db=db)
>>> report.finished, report.new, report.valid
(True, 1, 1)
>>> search(space, "enumerate", db=db).new  # already done: nothing repeated
0
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from kdsl.lang.errors import SearchError
from kdsl.runtime.progress import Progress
from kdsl.search.analytic import analytic_reward, evaluate
from kdsl.search.canvas import CanvasSampler
from kdsl.search.enumerate import Enumeration
from kdsl.search.mcts import MCTS
from kdsl.search.neighbors import Neighbors
from kdsl.search.sample import Sampling
from kdsl.search.semantic import Families
from kdsl.search.space import Space
from kdsl.search.store import Lease, Store
from kdsl.search.synthesis import State, to_operators

__all__ = ["STRATEGIES", "Report", "search"]

STRATEGIES: dict[str, Callable[..., Any]] = {
    "enumerate": Enumeration,
    "random": Sampling,
    "mcts": MCTS,
    "canvas": CanvasSampler,
    "neighbors": Neighbors,
}


@dataclass
class Report:
    """What a search call did: counts, time, and the keys it found (new and known)."""

    strategy: str
    seed: int
    seconds: float = 0.0
    nodes: int = 0
    complete: int = 0
    new: int = 0
    valid: int = 0
    finished: bool = False
    duplicates: int = 0  # valid operators whose function family was already stored (not counted as new)
    found: dict[str, float] = field(default_factory=dict)  # key -> seconds into this call when first seen
    families: Families | None = None  # the function families stored (made on the first valid operator)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("found", "families")} | {
            "distinct": len(self.found)
        }


def search(
    space: Space,
    strategy: str = "enumerate",
    *,
    db: str | None = None,
    store: Store | None = None,
    seed: int = 0,
    time_limit: float | None = None,
    max_results: int | None = None,
    progress: TextIO | None = None,
    commit_every: float = 2.0,
    evaluator: Callable[[Space, dict], float] = analytic_reward,
    dedupe: bool = True,
) -> Report:
    """Run ``strategy`` (``enumerate``, ``random``, ``mcts``, ``canvas`` or ``neighbors``) on
    ``space``; store results in the SQLite database ``db`` (optional), resuming the run with the
    same space, strategy and seed if the database has one; or in ``store``, a store the caller
    opened and keeps open (a discovery's one store for its whole run). Stops when the strategy is exhausted,
    after ``time_limit`` seconds or ``max_results`` new distinct operators. ``progress``: a stream for
    progress (a bar on a terminal, a plain line every few seconds elsewhere; :mod:`kdsl.runtime.progress`).

    With ``dedupe`` (the default) a valid operator whose function family (its semantic
    fingerprint, :mod:`kdsl.search.semantic`) is already stored is recorded as a ``duplicate``:
    not evaluated, not counted as new, reward 0.

    Only one process at a time runs a given (space, strategy, seed) on one database: a second
    one is refused with a :class:`SearchError` naming the first (see :mod:`kdsl.search.store`).
    Ctrl-C stops after the current step, commits, and raises KeyboardInterrupt."""
    if strategy not in STRATEGIES:
        raise SearchError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    if time_limit is not None and time_limit <= 0:
        raise SearchError(f"the time limit must be positive, got {time_limit}")
    if store is not None and db is not None:
        raise SearchError("give search a database path (db) or an open store, not both")
    owned = store is None and db is not None  # a store this call opens, and so closes
    if owned:
        store = Store(db)
    lease: Lease | None = None
    if store is not None:
        try:
            # refuses while another live process runs the same (space, strategy, seed)
            lease = store.claim(space.fingerprint(), strategy, seed, space.describe())
        except BaseException:
            if owned:
                store.close()
            raise
    walker = STRATEGIES[strategy](space, seed=seed, progress=lease.progress if lease else {})
    report = Report(strategy, seed)
    rewards: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    start = last_commit = last_line = time.monotonic()
    # a bar on a terminal, a plain line every few seconds in a log (kdsl.runtime.progress)
    bar = Progress(f"search ({strategy})", unit="nodes", stream=progress) if progress is not None else None
    states = walker.states()
    reward: float | None = None
    with _ctrl_c_stops() as interrupted:
        try:
            while not interrupted():
                try:
                    state = states.send(reward) if reward is not None else next(states)
                except StopIteration:
                    report.finished = True
                    break
                reward = 0.0
                if state is not None:
                    report.complete += 1
                    reward = _handle(
                        space, state, strategy, seed, store, rewards, rows, report, evaluator, start, dedupe
                    )
                now = time.monotonic()
                if lease is not None and now - last_commit > commit_every and not getattr(walker, "replaying", False):
                    store.commit(lease, rows, walker.progress())
                    rows.clear()
                    last_commit = now
                if bar is not None and now - last_line > 0.5:
                    _line(bar, walker, report)
                    last_line = now
                if time_limit is not None and now - start > time_limit:
                    break
                if max_results is not None and report.new >= max_results:
                    break
        finally:
            report.seconds = time.monotonic() - start
            report.nodes = walker.nodes
            if store is not None:
                try:
                    store.commit(lease, rows, walker.progress(), finished=report.finished, release=True)
                finally:
                    if owned:
                        store.close()
            if bar is not None:
                _line(bar, walker, report)
                bar.close()
    if interrupted():
        # everything up to the last finished step is committed; the caller (kdsl's main) says so
        raise KeyboardInterrupt
    return report


@contextmanager
def _ctrl_c_stops() -> Iterator[Callable[[], bool]]:
    """While the search runs, Ctrl-C (SIGINT) only sets a flag that the loop checks between
    steps, so the interrupted search commits a consistent state (results and the walker's
    progress of the same step) and then raises KeyboardInterrupt. A second Ctrl-C interrupts at
    once. Only in the main thread with Python's default handler: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield lambda: False
        return
    hits: list[int] = []

    def handler(signum: int, frame: object) -> None:
        hits.append(signum)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, handler)
    try:
        yield lambda: bool(hits)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _candidates(space, state: Any) -> list[tuple[Any, Any]]:
    """The operators a strategy's step gives, each with its finished evaluation if the strategy
    made one: a Syno ``State`` gives its operators (evaluated here); Canvas's sampler yields a
    finished kernel (:class:`~kdsl.search.canvas.Sample`) with its widths filled and its costs."""
    if isinstance(state, State):
        return [(op, None) for op in to_operators(space, state)]
    return [(state.op, state)]


def _handle(space, state: Any, strategy, seed, store, rewards, rows, report, evaluator, start, dedupe) -> float:
    best = 0.0
    for op, finished in _candidates(space, state):
        key = op.key
        if key not in report.found:
            report.found[key] = time.monotonic() - start
        if key in rewards:
            best = max(best, rewards[key])
            continue
        known = store.get(key) if store is not None else None
        if known is not None:
            rewards[key] = known["reward"] or 0.0
            best = max(best, rewards[key])
            continue
        semantic, rank, duplicate_of = None, None, None
        if dedupe:
            # one stored operator per function family: a re-parametrization of a stored valid
            # operator is recorded, not evaluated (most of an enumeration's operators are such)
            if report.families is None:
                report.families = Families(store, space.spec.batch)
            semantic, rank, duplicate_of = report.families.lookup(op)
        if duplicate_of is not None:
            result = {"status": "duplicate", "error": None, "coefficients": None}
            status, value = "duplicate", 0.0
            report.duplicates += 1
        else:
            result = evaluate(space, op) if finished is None else finished.result
            status = result["status"]
            value = evaluator(space, result)
            report.new += 1
            report.valid += status == "valid"
            if status == "valid" and semantic is not None:
                report.families.add(key, semantic, rank, op)  # type: ignore[union-attr]
        rewards[key] = value
        rows.append(
            {
                "key": key,
                "dsl": op.to_dsl(),
                "depth": len(op.steps) if finished is None else finished.depth,
                "status": status,
                "error": result["error"],
                "flops": result.get("flops"),
                "params": result.get("params"),
                "flops_per_layer": result.get("flops_per_layer"),
                "params_per_layer": result.get("params_per_layer"),
                "reward": value,
                "strategy": strategy,
                "seed": seed,
                "metrics": {"coefficients": result["coefficients"], "layers": [layer.name for layer in space.layers]}
                | (finished.metrics if finished is not None else {})
                | ({"duplicate_of": duplicate_of} if duplicate_of is not None else {}),
                "semantic": semantic,
                "semantic_rank": rank,
            }
        )
        best = max(best, value)
    return best


def _line(bar: Progress, walker, report: Report) -> None:
    bar.set(
        walker.nodes,
        complete=report.complete,
        distinct=len(report.found),
        new=report.new,
        valid=report.valid,
        duplicates=report.duplicates,
    )


if __name__ == "__main__":  # pragma: no cover
    print(search(Space(), "random", time_limit=5, progress=sys.stderr).as_dict())
