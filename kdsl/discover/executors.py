"""Executors: evaluate candidates in worker processes, isolated, with a hard per-candidate timeout.

A :class:`Task` is plain data (the candidate's DSL text or JSON, its key, evaluator specs, a
context dict); a result is a plain dict::

    {"key": ..., "status": "ok" | "error" | "timeout" | "crashed", "metrics": {...},
     "error": None | "message", "seconds": wall seconds}

:class:`LocalExecutor` (the default) runs tasks on ``workers`` spawned processes of a
:class:`~kdsl.runtime.workers.WorkerPool`: a task that runs past ``timeout`` gets its worker killed
(SIGKILL) and replaced and is recorded as ``timeout``; a worker that dies (segfault, ``os._exit``,
out of memory) is recorded as ``crashed``; an exception in an evaluator is ``error`` with its
message; the run goes on.
Compilation runs in parallel, but latency measurements take the machine's one slot
(:func:`kdsl.runtime.timing.latency_slot`, an ``flock`` that the OS releases when a killed worker
dies); the timeout clock stops while a task waits for the slot.

:class:`RayExecutor` runs the same tasks as Ray tasks on a cluster (``pip install 'kdsl[ray]'``).

>>> from kdsl import gallery
>>> task = Task.of(gallery.load("conv2d"), ["analytic"])
>>> result = run_task(task)
>>> result["status"], result["metrics"]["flops_ratio"]
('ok', 1.0)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kdsl.discover.evaluators import Context, evaluate_all
from kdsl.lang.errors import KdslError, SearchError
from kdsl.lang.operator import Operator
from kdsl.lang.parser import parse
from kdsl.lang.serialize import from_json
from kdsl.runtime.threads import shared_process_environment
from kdsl.runtime.timing import latency_slot
from kdsl.runtime.workers import Outcome, Slot, WorkerError, WorkerPool, describe_exception

__all__ = [
    "STATUSES",
    "Executor",
    "LocalExecutor",
    "RayExecutor",
    "Task",
    "make_executor",
    "run_task",
]

#: Modules a local worker imports before taking tasks by default. Importing torch takes seconds;
#: add it (``preload=("torch",)``) when tasks have tight timeouts, at the price of slower restarts.
PRELOAD: tuple[str, ...] = ()

#: Every status a result can have.
STATUSES = ("ok", "error", "timeout", "crashed")


@dataclass(frozen=True)
class Task:
    """One candidate to evaluate: ``source`` is DSL text or the JSON form; ``evaluators`` are
    specs for :func:`kdsl.discover.evaluators.make_evaluator`; ``context`` a JSON-like dict (e.g.
    ``{"best_history": [...]}``). ``key`` identifies the task in results (the operator's key)."""

    key: str
    source: str
    evaluators: tuple[Any, ...] = ("analytic",)
    context: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls, op: Operator, evaluators: Sequence[Any] = ("analytic",), context: Mapping[str, Any] | None = None
    ) -> Task:
        """A task for ``op`` (shipped as its JSON form, keyed by ``op.key``)."""
        return cls(op.key, op.to_json(), tuple(evaluators), dict(context or {}))

    def operator(self) -> Operator:
        """The candidate, read back from ``source`` (JSON if it starts with ``{``, else DSL)."""
        text = self.source.lstrip()
        return from_json(text) if text.startswith("{") else parse(text)

    @property
    def uses_latency(self) -> bool:
        """Whether an evaluator of this task measures time (and so needs the machine's slot)."""
        return any(_spec_name(spec) == "latency" for spec in self.evaluators)


def _spec_name(spec: Any) -> str | None:
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Mapping):
        return spec.get("name")
    return getattr(spec, "name", None)


def _result(task: Task, status: str, metrics: Mapping[str, Any] | None, error: str | None, seconds: float) -> dict:
    return {"key": task.key, "status": status, "metrics": dict(metrics or {}), "error": error, "seconds": seconds}


def _plain(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics as plain JSON values (numpy or torch scalars become floats)."""

    def convert(value: Any) -> Any:
        if hasattr(value, "item"):
            return value.item()
        return str(value)

    return json.loads(json.dumps(dict(metrics), default=convert))


def run_task(task: Task, slot: Slot | None = None) -> dict[str, Any]:
    """Evaluate ``task`` in this process; every exception becomes an ``error`` result.

    ``slot`` is the latency-slot factory the evaluators use (default: the machine's flock).
    """
    start = time.perf_counter()
    try:
        op = task.operator()
        context = Context.of(task.context)
        context.latency_slot = slot or latency_slot
        metrics = _plain(evaluate_all(op, task.evaluators, context))
    except KdslError as error:
        return _result(task, "error", None, f"{type(error).__name__}: {error}", time.perf_counter() - start)
    except Exception as error:  # a candidate or evaluator bug must not end the run
        return _result(task, "error", None, describe_exception(error), time.perf_counter() - start)
    return _result(task, "ok", metrics, None, time.perf_counter() - start)


class Executor(ABC):
    """Runs tasks and yields ``(task, result)`` as they finish (in completion order)."""

    @abstractmethod
    def map(self, tasks: Iterable[Task]) -> Iterator[tuple[Task, dict[str, Any]]]:
        """Evaluate ``tasks`` (consumed lazily) and yield each with its result as it finishes."""

    def run(self, tasks: Iterable[Task]) -> list[dict[str, Any]]:
        """Results of ``tasks`` in the order given."""
        tasks = list(tasks)
        results = {id(task): result for task, result in self.map(tasks)}
        return [results[id(task)] for task in tasks]

    def close(self) -> None:  # noqa: B027 - optional to override
        """Stop the workers (nothing to stop by default)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Local worker processes


def _preload(modules: Sequence[str]) -> None:
    """A worker's setup: import before saying ready, so that a task's timeout does not pay for it."""
    for module in ("kdsl.discover.evaluators", *modules):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)


def _serve_task(state: None, task: Task, slot: Slot) -> dict[str, Any]:
    """A worker's handler: evaluate ``task`` with the slot that stops its clock while it waits."""
    return run_task(task, slot)


class LocalExecutor(Executor):
    """Evaluate tasks on ``workers`` spawned processes with a hard per-task ``timeout`` (seconds).

    The processes are a :class:`~kdsl.runtime.workers.WorkerPool` (the one isolated worker pool of
    kdsl, which schedule tuning uses too). ``threads`` (default: cores / workers) sets
    ``OMP_NUM_THREADS`` in the workers; ``lock_path`` overrides the machine's latency lock file;
    ``startup_timeout`` bounds how long a new worker may take to start before the executor gives up
    (an environment problem); a worker imports the modules in ``preload`` before it takes tasks
    (missing ones are skipped).
    """

    def __init__(
        self,
        workers: int = 2,
        timeout: float = 600.0,
        *,
        threads: int | None = None,
        lock_path: str | None = None,
        startup_timeout: float = 120.0,
        preload: Sequence[str] = PRELOAD,
    ) -> None:
        if workers < 1:
            raise SearchError(f"workers must be at least 1, got {workers}")
        if not timeout > 0:
            raise SearchError(f"timeout must be positive seconds, got {timeout}")
        self.workers, self.timeout, self.startup_timeout = workers, float(timeout), startup_timeout
        self.lock_path, self.preload = lock_path, tuple(preload)
        threads = threads or max(1, (os.cpu_count() or 1) // workers)
        # TVM's pinned threads would slow PyTorch in the same worker
        self.environment = shared_process_environment(threads, base={}, sleeping=False)
        self._pool: WorkerPool[Task] = WorkerPool(
            _serve_task,
            size=workers,
            setup=functools.partial(_preload, self.preload),
            timeout=self.timeout,
            environment=self.environment,
            lock_path=lock_path,
            startup_timeout=startup_timeout,
        )

    def map(self, tasks: Iterable[Task]) -> Iterator[tuple[Task, dict[str, Any]]]:
        try:
            for task, outcome in self._pool.map(tasks):
                yield task, _task_result(task, outcome)
        except WorkerError as error:
            raise SearchError(str(error)) from None

    def close(self) -> None:
        self._pool.close()


def _task_result(task: Task, outcome: Outcome) -> dict[str, Any]:
    """A task's result dict from its outcome in the pool (``run_task``'s own result when it ran)."""
    if outcome.ok:
        return outcome.value
    return _result(task, outcome.status, None, outcome.error, outcome.seconds)


# ---------------------------------------------------------------------------------------------
# Ray


def _load_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise KdslError(
            "the Ray executor needs ray, which is not installed; install it with: pip install 'kdsl[ray]'"
        ) from None
    return ray


def _ray_task(task: Task, paths: Sequence[str] = ()) -> dict[str, Any]:
    """The body of a Ray task: run it like a local worker, holding the node's flock for timing.

    ``paths`` are the driver's ``sys.path`` entries; those that exist on this node and are missing
    are appended, so evaluator classes the driver can import load here too (as with spawn).
    """
    for path in paths:
        if path not in sys.path and os.path.isdir(path):
            sys.path.append(path)
    return run_task(task)


class RayExecutor(Executor):
    """Evaluate tasks as Ray tasks on a cluster (``address``: ``None`` for a local Ray or the one
    already initialized, ``"auto"`` or ``"ray://host:10001"`` for a cluster).

    A task that runs past ``timeout`` is cancelled with ``ray.cancel(force=True)`` (its worker
    process is killed); one whose worker dies is ``crashed``. Tasks with a latency evaluator ask
    for the custom resource ``latency_slot`` when the cluster has one (start each node with
    ``ray start --resources='{"latency_slot": 1}'``; a local Ray started here gets it), so one
    measurement runs per node; on every node the flock of
    :func:`~kdsl.runtime.timing.latency_slot` enforces the same. At most ``max_in_flight`` tasks
    (default: the cluster's CPUs) are submitted at a time, so the timeout clock of a task starts
    about when it starts running.
    """

    def __init__(self, address: str | None = None, timeout: float = 600.0, max_in_flight: int | None = None) -> None:
        ray = _load_ray()
        self.ray = ray
        if not ray.is_initialized():
            if address is None:
                ray.init(resources={"latency_slot": 1}, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        self.timeout = float(timeout)
        resources = ray.cluster_resources()
        self.max_in_flight = max_in_flight or max(1, int(resources.get("CPU", 1)))
        self.latency_slots = int(resources.get("latency_slot", 0))
        self._remote = ray.remote(max_retries=0, num_cpus=1)(_ray_task)
        self._paths = [path for path in sys.path if path]

    def _submit(self, task: Task) -> Any:
        if task.uses_latency and self.latency_slots:
            return self._remote.options(resources={"latency_slot": 1}).remote(task, self._paths)
        return self._remote.remote(task, self._paths)

    def map(self, tasks: Iterable[Task]) -> Iterator[tuple[Task, dict[str, Any]]]:
        ray = self.ray
        source = iter(tasks)
        running: dict[Any, tuple[Task, float]] = {}
        exhausted = False
        try:
            while True:
                while not exhausted and len(running) < self.max_in_flight:
                    task = next(source, None)
                    if task is None:
                        exhausted = True
                        break
                    running[self._submit(task)] = (task, time.monotonic())
                if not running:
                    return
                now = time.monotonic()
                wait_for = max(0.0, min(start + self.timeout for _, start in running.values()) - now)
                done, _ = ray.wait(list(running), num_returns=1, timeout=wait_for)
                for ref in done:
                    task, start = running.pop(ref)
                    yield task, self._outcome(ref, task, time.monotonic() - start)
                now = time.monotonic()
                for ref, (task, start) in list(running.items()):
                    if now - start >= self.timeout:
                        ray.cancel(ref, force=True)
                        del running[ref]
                        message = f"no result after {self.timeout:g} s; the Ray task was cancelled"
                        yield task, _result(task, "timeout", None, message, now - start)
        finally:
            for ref in running:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)

    def _outcome(self, ref: Any, task: Task, seconds: float) -> dict[str, Any]:
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            return _result(task, "timeout", None, "the Ray task was cancelled", seconds)
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError) as error:
            return _result(task, "crashed", None, f"{type(error).__name__}: {error}", seconds)
        except ray.exceptions.RayError as error:
            return _result(task, "error", None, f"{type(error).__name__}: {error}", seconds)

    def close(self) -> None:
        """Leave Ray running (it may be shared); call ``ray.shutdown()`` to stop a local one."""


def make_executor(kind: str = "local", *, workers: int = 2, timeout: float = 600.0, **options: Any) -> Executor:
    """An executor by name: ``"local"``, ``"ray"`` (local or already-initialized Ray) or
    ``"ray:ADDRESS"``.

    >>> make_executor("slurm")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.SearchError: unknown executor 'slurm'; use 'local', 'ray' or 'ray:ADDRESS'
    """
    if kind == "local":
        return LocalExecutor(workers=workers, timeout=timeout, **options)
    if kind == "ray" or kind.startswith("ray:"):
        address = kind.partition(":")[2] or None
        return RayExecutor(address=address, timeout=timeout, **options)
    raise SearchError(f"unknown executor {kind!r}; use 'local', 'ray' or 'ray:ADDRESS'")
