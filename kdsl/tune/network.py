"""Tuning a whole network: its distinct (operator, layer) tasks share one trial budget, given out
round by round to the task expected to cut the network's end-to-end time the most.

A network of kdsl operators runs each distinct (operator, layer binding) pair — a :class:`NetworkTask` —
``weight`` times per forward pass (ResNet-18's ``conv3_x`` convolution runs 3 times). Tuning every
task with the same number of trials wastes most of them: a task that is fast, rare, or no longer
improving saves little. :class:`BudgetScheduler` follows the idea of Ansor's task scheduler (Zheng et
al. 2020, §6), in its own form: every task first gets its default schedule measured; then each round
gives ``round_trials`` trials to the task of largest *expected saving*

    weight x best latency so far x expected relative gain of one more round,

where the expected gain is the mean relative improvement of the task's last ``window`` rounds (rounds
not run yet count as ``prior``: a task never tuned expects ``prior``), and for a task that stalled at
least ``prior x decay ** stalled`` (``stalled``: the rounds in a row that did not improve), so a task
that stops improving is tried again less and less often instead of never. A task whose tuner has
nothing left to propose is dropped.

:func:`tune_network` runs the rounds with the real tuners (:func:`kdsl.tune.driver.tune`), every
record in one database (a second run resumes from it). A network built in two kernel signatures (plain
``NCHW``, and channel-blocked: :attr:`NetworkTask.block`) has each layer's kernel tuned in each, as two
tasks whose records never mix; the budget is then split evenly between the signatures (what one leaves
unused goes to the next), and each signature's share goes round by round to its own layers by its own
scheduler, so the plain and the blocked network are compared at equal trials. A task with
:attr:`NetworkTask.prepacked` is measured with its weights packed once, outside the timing (the
signature a compiled network runs its kernels in), a task of its own in the records too; a signature
is then a (channel block, prepacked) pair.

>>> scheduler = BudgetScheduler([2, 3], round_trials=8)
>>> scheduler.record_default(0, 0.002); scheduler.record_default(1, 0.001)
>>> scheduler.next_task()  # 2 x 2 ms beats 3 x 1 ms, both at the prior gain
0
>>> scheduler.record_round(0, trials=8, best=0.0019)
>>> round(scheduler.expected_gain(0), 3), scheduler.next_task()
(0.35, 1)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kdsl.codegen.tvm import lower
from kdsl.lang.errors import KdslError, LoweringError
from kdsl.lang.operator import Operator
from kdsl.runtime.progress import Progress
from kdsl.tune.driver import TUNERS, tune
from kdsl.tune.measurer import Measurer, signature_schedule
from kdsl.tune.records import Record, TuneError, open_task

__all__ = ["BudgetScheduler", "NetworkTask", "TaskSummary", "measure_default", "task_summary", "tune_network"]

#: the tuner name the default schedule's record is stored under
DEFAULT = "default"


@dataclass(frozen=True)
class NetworkTask:
    """One distinct (operator, layer binding) of a network and how many times a forward pass runs it.

    ``scale`` weighs the task's network in the shared objective: tasks of one network at several batch
    sizes take ``1 / batch``, so the budget goes where it saves the most time per image and a batch-8
    network (eight times the milliseconds) does not take every trial from the batch-1 one. ``block > 0``:
    the kernel is tuned (measured) with its data input and output channel-blocked by ``block``, the
    signature a blocked network runs it in. ``prepacked``: the kernel is tuned with the weights its
    schedule packs taken already packed (packed once by the measurer, not timed), as
    :func:`kdsl.bench.network_tune.compile_network` runs it by default."""

    label: str
    op: Operator
    layer: Mapping[str, int]
    weight: int
    scale: float = 1.0
    block: int = 0
    prepacked: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.weight, int) or self.weight < 1:
            raise KdslError(f"task {self.label}: its occurrence count must be a positive integer, got {self.weight!r}")
        if not self.scale > 0:
            raise KdslError(f"task {self.label}: its scale must be positive, got {self.scale!r}")
        if not isinstance(self.block, int) or self.block < 0:
            raise KdslError(f"task {self.label}: its channel block must be 0 (plain) or positive, got {self.block!r}")
        if not isinstance(self.prepacked, bool):
            raise KdslError(f"task {self.label}: its prepacked flag must be True or False, got {self.prepacked!r}")


@dataclass
class _TaskState:
    weight: float
    best: float | None = None  # seconds
    trials: int = 0
    improvements: list[float] = field(default_factory=list)  # relative improvement of each round
    stalled: int = 0  # rounds in a row without improvement
    done: bool = False  # the tuner had nothing left to propose


class BudgetScheduler:
    """Which task gets the next round of trials (see the module docstring): ``weights`` are the
    tasks' occurrence counts; ``window``, ``prior`` and ``decay`` shape the expected gain."""

    def __init__(
        self,
        weights: Sequence[float],
        *,
        round_trials: int = 8,
        window: int = 3,
        prior: float = 0.5,
        decay: float = 0.5,
    ) -> None:
        if not weights or any(not w > 0 for w in weights):
            raise KdslError(f"a network needs at least one task, each with a positive weight, got {list(weights)!r}")
        if not isinstance(round_trials, int) or round_trials < 1:
            raise KdslError(f"round_trials must be a positive integer, got {round_trials!r}")
        if not isinstance(window, int) or window < 1 or not 0 < prior <= 1 or not 0 <= decay < 1:
            raise KdslError(f"need window >= 1, 0 < prior <= 1 and 0 <= decay < 1; got {window}, {prior}, {decay}")
        self.round_trials, self.window, self.prior, self.decay = round_trials, window, prior, decay
        self.tasks = [_TaskState(float(w)) for w in weights]

    def record_default(self, index: int, latency: float | None) -> None:
        """The default schedule's latency of task ``index`` (``None``: it failed)."""
        self._improve(self.tasks[index], latency)

    def _improve(self, state: _TaskState, latency: float | None) -> float:
        """Take ``latency`` as a candidate best; the relative improvement it brings."""
        if latency is None:
            return 0.0
        if state.best is None:
            state.best = latency
            return 0.0
        gain = max(0.0, (state.best - latency) / state.best)
        state.best = min(state.best, latency)
        return gain

    def record_round(self, index: int, trials: int, best: float | None) -> None:
        """Task ``index`` was given ``trials`` trials and its best is now ``best``; ``trials == 0``
        means its tuner has nothing left to propose."""
        state = self.tasks[index]
        gain = self._improve(state, best)
        state.trials += trials
        state.improvements.append(gain)
        state.stalled = 0 if gain > 0 else state.stalled + 1
        if trials == 0:
            state.done = True

    def expected_gain(self, index: int) -> float:
        """The relative improvement one more round of task ``index`` is expected to bring."""
        state = self.tasks[index]
        # the floor only props up a stalled task (an improving one has its own mean): each round in a
        # row without improvement halves (decay) its chance to be tried again
        floor = self.prior * self.decay**state.stalled if state.stalled else 0.0
        recent = ([self.prior] * self.window + state.improvements)[-self.window :]
        return max(floor, sum(recent) / self.window)

    def expected_saving(self, index: int) -> float:
        """Seconds of one forward pass that one more round of task ``index`` is expected to save; a
        task without a valid latency yet counts as the slowest task's (it may well be slow)."""
        state = self.tasks[index]
        known = [t.best for t in self.tasks if t.best is not None]
        best = state.best if state.best is not None else max(known, default=1.0)
        return state.weight * best * self.expected_gain(index)

    def next_task(self) -> int | None:
        """The task of largest expected saving (the first on ties), or None when every one is done."""
        open_tasks = [i for i, t in enumerate(self.tasks) if not t.done]
        if not open_tasks:
            return None
        return max(open_tasks, key=lambda i: (self.expected_saving(i), -i))

    def allocate(
        self,
        total: int,
        run_round: Callable[[int, int], tuple[int, float | None]],
        on_round: Callable[[int, int, float | None], None] | None = None,
    ) -> int:
        """Give out ``total`` trials in rounds: ``run_round(task, n)`` tunes task ``task`` for up to ``n``
        trials and returns (trials measured, best latency now); ``on_round`` hears each round. Returns
        the trials given (less than ``total`` only when every task is done)."""
        given = 0
        while given < total:
            index = self.next_task()
            if index is None:
                break
            measured, best = run_round(index, min(self.round_trials, total - given))
            self.record_round(index, measured, best)
            given += measured
            if on_round is not None:
                on_round(index, measured, best)
        return given


# ------------------------------------------------------------------------------------------------
# With the real tuners


def measure_default(task: NetworkTask, db: str | os.PathLike[str], measurer: Measurer) -> float | None:
    """The default schedule's latency of ``task`` (stored in ``db`` under the tuner name ``default``,
    and read from there on a second run); None when it fails."""
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    binding, key, store = open_task(task.op, task.layer, db, task.block, task.prepacked)
    try:
        stored = store.records(key, DEFAULT)
        if stored:
            return stored[0].latency
        space = ScheduleSpace(lower(task.op, binding))
        config = space.heuristic()
        try:
            # as compile_network builds it: a stage that refuses its part falls back to the plain schedule
            signature_schedule(space, config, task.block, fallback=True)
            ((latency, error),) = measurer.measure(space, [config], fallback=True)
        except LoweringError as refused:
            latency, error = None, str(refused)
        store.add(key, Record(config, latency, error, DEFAULT))
        return latency
    finally:
        store.database.close()


@dataclass
class TaskSummary:
    """What tuning did for one task: its occurrences, trials given in this run, default and best ms."""

    label: str
    weight: int
    trials: int
    default_ms: float | None
    best_ms: float | None


def task_summary(task: NetworkTask, db: str | os.PathLike[str], trials: int = 0) -> TaskSummary:
    """The default schedule's and the best record's latency of ``task`` in ``db``."""
    _, key, store = open_task(task.op, task.layer, db, task.block, task.prepacked, describe=False)
    try:
        defaults = [r.latency for r in store.records(key, DEFAULT) if r.latency is not None]
        best = store.best(key)
    finally:
        store.database.close()
    default_ms = defaults[0] * 1e3 if defaults else None
    best_ms = best.latency * 1e3 if best is not None and best.latency is not None else None
    return TaskSummary(task.label, task.weight, trials, default_ms, best_ms)


def tune_network(
    tasks: Sequence[NetworkTask],
    trials: int,
    db: str | os.PathLike[str],
    *,
    tuner: str = "opevo",
    round_trials: int = 8,
    batch: int = 8,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    log: Callable[[str], None] | None = None,
    progress: Progress | None = None,
) -> list[TaskSummary]:
    """Measure every task's default schedule, then share ``trials`` new trials among ``tasks`` with a
    :class:`BudgetScheduler`, each round a :func:`~kdsl.tune.driver.tune` run of ``tuner`` on the
    chosen task (records in ``db``; a second run resumes). Tasks of several signatures
    (:attr:`NetworkTask.block` and :attr:`NetworkTask.prepacked`) split ``trials`` evenly, a scheduler
    each, in the order they first appear (the module's text). Returns one :class:`TaskSummary` per task."""
    if tuner not in TUNERS or tuner == "metaschedule":
        raise TuneError(f"--network tunes with opevo, alt or gensor (kdsl's schedule space), got {tuner!r}")
    labels = [task.label for task in tasks]
    if len(set(labels)) != len(labels):
        raise TuneError(f"two network tasks share a label: {labels}")
    signatures: dict[tuple[int, bool], list[int]] = {}  # (channel block, prepacked) -> its tasks' indices
    for index, task in enumerate(tasks):
        signatures.setdefault((task.block, task.prepacked), []).append(index)
    schedulers = {
        signature: BudgetScheduler([tasks[i].weight * tasks[i].scale for i in members], round_trials=round_trials)
        for signature, members in signatures.items()
    }
    # where each task's budget state lives: its signature's scheduler and its index there
    place = {i: (schedulers[key], members.index(i)) for key, members in signatures.items() for i in members}
    measurers: dict[int, Measurer] = {}

    def measurer(index: int) -> Measurer:
        # one task's worker processes at a time: switching tasks costs a process start, keeping every
        # task's workers alive would hold a TVM import per task on a shared machine
        if index not in measurers:
            for other in list(measurers):
                measurers.pop(other).close()
            task = tasks[index]
            binding, _, store = open_task(task.op, task.layer, db, task.block, task.prepacked)
            store.database.close()
            measurers[index] = Measurer(task.op, binding, block=task.block, prepacked=task.prepacked)
        return measurers[index]

    def run_round(index: int, count: int) -> tuple[int, float | None]:
        task = tasks[index]
        scheduler, local = place[index]
        result = tune(
            task.op,
            task.layer,
            tuner,
            count,
            db,
            batch=min(batch, count),
            seed=seed + scheduler.tasks[local].trials,
            measurer=measurer(index),
            options=options,
            confirm=0,
            block=task.block,
            prepacked=task.prepacked,
        )
        best = task_summary(task, db).best_ms
        return result.measured, None if best is None else best / 1e3

    def heard(index: int, measured: int, best: float | None) -> None:
        if log is not None:
            shown = "none valid" if best is None else f"best {best * 1e3:.3f} ms"
            log(f"{tasks[index].label}: {measured} trials, {shown}")
        if progress is not None:
            given = sum(t.trials for each in schedulers.values() for t in each.tasks)
            progress.set(given, best=tasks[index].label)

    try:
        for index, task in enumerate(tasks):
            latency = measure_default(task, db, measurer(index))
            scheduler, local = place[index]
            scheduler.record_default(local, latency)
            if log is not None:
                shown = "failed" if latency is None else f"{latency * 1e3:.3f} ms"
                log(f"{task.label}: default schedule {shown}")
        left = trials
        for position, (signature, members) in enumerate(signatures.items()):
            # an even share of what is left: a signature whose tuners run dry leaves its rest to the next
            share = left // (len(signatures) - position)
            left -= schedulers[signature].allocate(
                share,
                lambda local, count, members=members: run_round(members[local], count),
                lambda local, measured, best, members=members: heard(members[local], measured, best),
            )
    finally:
        for each in measurers.values():
            each.close()
    return [task_summary(tasks[i], db, place[i][0].tasks[place[i][1]].trials) for i in range(len(tasks))]
