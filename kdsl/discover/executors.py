"""Executors: evaluate candidates in worker processes, isolated, with a hard per-candidate timeout.

A :class:`Task` is plain data (the candidate's DSL text or JSON, its key, evaluator specs, a
context dict); a result is a plain dict::

    {"key": ..., "status": "ok" | "error" | "timeout" | "crashed", "metrics": {...},
     "error": None | "message", "seconds": wall seconds}

:class:`LocalExecutor` (the default) runs tasks on ``workers`` spawned processes that it manages
itself: a task that runs past ``timeout`` gets its worker killed (SIGKILL) and replaced and is
recorded as ``timeout``; a worker that dies (segfault, ``os._exit``, out of memory) is recorded as
``crashed``; an exception in an evaluator is ``error`` with its message; the run goes on.
Compilation runs in parallel, but latency measurements take the machine's one slot
(:func:`kdsl.codegen.measure.latency_slot`, an ``flock`` that the OS releases when a killed worker
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
import importlib
import json
import multiprocessing
import os
import signal
import sys
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from kdsl.codegen.measure import latency_slot
from kdsl.lang.build import Operator
from kdsl.lang.errors import KdslError
from kdsl.search.errors import SearchError

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
        from kdsl.lang.parser import parse
        from kdsl.lang.serialize import from_json

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


def run_task(task: Task, slot: Callable[[], contextlib.AbstractContextManager[Any]] | None = None) -> dict[str, Any]:
    """Evaluate ``task`` in this process; every exception becomes an ``error`` result.

    ``slot`` is the latency-slot factory the evaluators use (default: the machine's flock).
    """
    from kdsl.discover.evaluators import Context, evaluate_all

    start = time.perf_counter()
    try:
        op = task.operator()
        context = Context.of(task.context)
        context.latency_slot = slot or latency_slot
        metrics = _plain(evaluate_all(op, task.evaluators, context))
    except KdslError as error:
        return _result(task, "error", None, f"{type(error).__name__}: {error}", time.perf_counter() - start)
    except Exception as error:  # a candidate or evaluator bug must not end the run
        lines = traceback.format_exception(type(error), error, error.__traceback__)
        message = f"{type(error).__name__}: {error}\n{''.join(lines[-6:])}"
        return _result(task, "error", None, message, time.perf_counter() - start)
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


def _worker_main(
    conn: Connection, environment: Mapping[str, str], lock_path: str | None, preload: Sequence[str] = ()
) -> None:
    """A worker's loop: receive ``(task_id, task)``, send ``("done", task_id, result)``."""
    # Ctrl-C reaches the whole process group; the parent stops the run and closes its workers,
    # so a worker must not die on it with a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(environment)
    # import before saying ready, so that a task's timeout does not pay for the imports
    for module in ("kdsl.discover.evaluators", *preload):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)

    @contextlib.contextmanager
    def slot() -> Iterator[None]:
        # the parent stops the task's clock while it waits for another process's measurement
        conn.send(("pause", task_id))
        with latency_slot(lock_path):
            conn.send(("resume", task_id))
            yield

    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, task = message
        result = run_task(task, slot)
        try:
            conn.send(("done", task_id, result))
        except Exception as error:  # e.g. an unpicklable value slipped into the metrics
            conn.send(("done", task_id, _result(task, "error", None, f"cannot send the result: {error}", 0.0)))


def _exit_text(code: int | None) -> str:
    if code is None:
        return "the worker stopped responding"
    if code < 0:
        try:
            return f"the worker was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the worker was killed by signal {-code}"
    return f"the worker exited with code {code}"


class _Worker:
    """One spawned worker process and the task it is running."""

    def __init__(
        self, context: Any, environment: Mapping[str, str], lock_path: str | None, preload: Sequence[str]
    ) -> None:
        self.conn, child = context.Pipe(duplex=True)
        arguments = (child, dict(environment), lock_path, tuple(preload))
        self.process = context.Process(target=_worker_main, args=arguments, daemon=True, name="kdsl-worker")
        self.process.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()
        self.task: Task | None = None
        self.task_id = -1
        self.deadline = float("inf")
        self.remaining: float | None = None  # set while the clock is paused
        self.task_started = 0.0

    def assign(self, task_id: int, task: Task, timeout: float) -> None:
        self.task, self.task_id = task, task_id
        self.task_started = time.monotonic()
        self.deadline = self.task_started + timeout
        self.remaining = None
        self.conn.send((task_id, task))

    def clear(self) -> None:
        self.task, self.task_id, self.deadline, self.remaining = None, -1, float("inf"), None

    def kill(self) -> int | None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        with contextlib.suppress(OSError):
            self.conn.close()
        return self.process.exitcode

    def stop(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(None)
        self.process.join(2)
        self.kill()


class LocalExecutor(Executor):
    """Evaluate tasks on ``workers`` spawned processes with a hard per-task ``timeout`` (seconds).

    ``threads`` (default: cores / workers) sets ``OMP_NUM_THREADS`` in the workers;
    ``lock_path`` overrides the machine's latency lock file; ``startup_timeout`` bounds how long a
    new worker may take to start before the executor gives up (an environment problem); a worker
    imports the modules in ``preload`` before it takes tasks (missing ones are skipped).
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
        self.environment = {
            "OMP_NUM_THREADS": str(threads),
            "TVM_NUM_THREADS": str(threads),
            "TVM_BIND_THREADS": "0",  # TVM's pinned threads would slow PyTorch in the same worker
        }
        self._context = multiprocessing.get_context("spawn")
        self._pool: list[_Worker] = []
        self._next_id = 0

    def _spawn(self) -> _Worker:
        return _Worker(self._context, self.environment, self.lock_path, self.preload)

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        fresh = self._spawn()
        self._pool[self._pool.index(worker)] = fresh
        return fresh

    def map(self, tasks: Iterable[Task]) -> Iterator[tuple[Task, dict[str, Any]]]:
        source = iter(tasks)
        exhausted = False
        while len(self._pool) < self.workers:
            self._pool.append(self._spawn())
        try:
            while True:
                for worker in self._pool:
                    if worker.ready and worker.task is None and not exhausted:
                        task = next(source, None)
                        if task is None:
                            exhausted = True
                        else:
                            self._next_id += 1
                            try:
                                worker.assign(self._next_id, task, self.timeout)
                            except (OSError, BrokenPipeError):  # died while idle: retry the task on a fresh one
                                self._replace(worker)
                                source = _prepend(task, source)
                busy = [w for w in self._pool if w.task is not None]
                if exhausted and not busy:
                    return
                yield from self._step()
        finally:
            # the consumer stopped early (or an error): abandon running tasks
            for index, worker in enumerate(self._pool):
                if worker.task is not None:
                    worker.kill()
                    self._pool[index] = self._spawn()

    def _step(self) -> Iterator[tuple[Task, dict[str, Any]]]:
        """Wait for one event (a message, a death, a deadline) and yield the finished tasks."""
        now = time.monotonic()
        deadlines = [w.deadline for w in self._pool if w.task is not None and w.remaining is None]
        deadlines += [w.started + self.startup_timeout for w in self._pool if not w.ready]
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        handles: list[Any] = [w.conn for w in self._pool] + [w.process.sentinel for w in self._pool]
        ready = set(wait(handles, timeout))
        finished: list[tuple[Task, dict[str, Any]]] = []
        for worker in list(self._pool):
            dead = False
            if worker.conn in ready:
                try:
                    while worker.conn.poll():
                        finished.extend(self._message(worker, worker.conn.recv()))
                except (EOFError, OSError):
                    dead = True
            if dead or (worker.process.sentinel in ready and not worker.process.is_alive()):
                finished.extend(self._died(worker))
        now = time.monotonic()
        for worker in list(self._pool):
            if worker.task is not None and worker.remaining is None and now >= worker.deadline:
                task, seconds = worker.task, now - worker.task_started
                self._replace(worker)
                message = f"no result after {self.timeout:g} s; the worker was killed and replaced"
                finished.append((task, _result(task, "timeout", None, message, seconds)))
            elif not worker.ready and now >= worker.started + self.startup_timeout:
                worker.kill()
                raise SearchError(f"a worker process did not start within {self.startup_timeout:g} s")
        yield from finished

    def _message(self, worker: _Worker, message: tuple) -> list[tuple[Task, dict[str, Any]]]:
        kind = message[0]
        if kind == "ready":
            worker.ready = True
        elif kind == "pause" and message[1] == worker.task_id:
            worker.remaining = max(0.0, worker.deadline - time.monotonic())
        elif kind == "resume" and message[1] == worker.task_id and worker.remaining is not None:
            worker.deadline = time.monotonic() + worker.remaining
            worker.remaining = None
        elif kind == "done" and message[1] == worker.task_id and worker.task is not None:
            task, result = worker.task, message[2]
            worker.clear()
            return [(task, result)]
        return []

    def _died(self, worker: _Worker) -> list[tuple[Task, dict[str, Any]]]:
        task, seconds = worker.task, time.monotonic() - worker.task_started
        was_ready = worker.ready
        code = worker.kill()
        if not was_ready and task is None:
            raise SearchError(f"a worker process failed to start ({_exit_text(code)}); see its output above")
        self._replace(worker)
        if task is None:
            return []
        return [(task, _result(task, "crashed", None, _exit_text(code), seconds))]

    def close(self) -> None:
        for worker in self._pool:
            worker.stop()
        self._pool = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _prepend(item: Task, rest: Iterator[Task]) -> Iterator[Task]:
    yield item
    yield from rest


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
    :func:`~kdsl.codegen.measure.latency_slot` enforces the same. At most ``max_in_flight`` tasks
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
    kdsl.search.errors.SearchError: unknown executor 'slurm'; use 'local', 'ray' or 'ray:ADDRESS'
    """
    if kind == "local":
        return LocalExecutor(workers=workers, timeout=timeout, **options)
    if kind == "ray" or kind.startswith("ray:"):
        address = kind.partition(":")[2] or None
        return RayExecutor(address=address, timeout=timeout, **options)
    raise SearchError(f"unknown executor {kind!r}; use 'local', 'ray' or 'ray:ADDRESS'")
