"""Isolated worker processes: one job at a time per process, a hard timeout per job, kill and restart.

A :class:`WorkerPool` runs jobs (picklable values) on ``size`` spawned processes. Each process runs
``setup()`` once before it says it is ready (imports, a lowered program, test inputs: none of it
counts against a job's timeout), then ``handler(state, job, slot)`` for every job it is given, where
``state`` is what ``setup`` returned and ``slot`` is a context-manager factory that holds the machine's
latency slot (:func:`kdsl.runtime.timing.latency_slot`). Every job ends in an :class:`Outcome`:

- ``ok``: the handler's return value is in ``value``;
- ``error``: the handler raised (``error`` has its type, message and the end of its traceback), or its
  value could not be sent back; the process goes on;
- ``timeout``: no result after ``timeout`` seconds; the process was killed (SIGKILL) and replaced;
- ``crashed``: the process died (segfault, ``os._exit``, out of memory) and was replaced.

The clock of a job stops while it waits for the latency slot (another process of the machine is
measuring), so a job is not killed for someone else's measurement; the slot is an ``flock`` that the
operating system releases when a killed process dies.

Handlers and ``setup`` must be importable by name (module-level functions, or ``functools.partial``
of them), since the processes are spawned.

>>> with WorkerPool(_negate, size=1, timeout=60) as pool:
...     [outcome.value for outcome in pool.run([1, 2])]
[-1, -2]
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, TypeVar

from kdsl.lang.errors import KdslError
from kdsl.runtime.timing import latency_slot

__all__ = ["OUTCOMES", "Outcome", "Slot", "WorkerError", "WorkerPool", "describe_exception"]

#: Every status an outcome can have.
OUTCOMES = ("ok", "error", "timeout", "crashed")

#: A factory of context managers that hold the latency slot.
Slot = Callable[[], contextlib.AbstractContextManager[Any]]

Job = TypeVar("Job")


class WorkerError(KdslError):
    """A worker process could not be started (an environment problem, not a job's fault)."""


@dataclass(frozen=True)
class Outcome:
    """How one job ended: ``status`` (one of :data:`OUTCOMES`), the handler's ``value`` when ``ok``,
    an ``error`` message otherwise, and the wall ``seconds`` the job took (clock pauses included)."""

    status: str
    value: Any = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _negate(state: Any, job: int, slot: Slot) -> int:
    """A handler for the module's doctest."""
    return -job


def describe_exception(error: BaseException, lines: int = 6) -> str:
    """``Type: message`` and the last ``lines`` lines of the traceback (what a failed job reports)."""
    formatted = traceback.format_exception(type(error), error, error.__traceback__)
    return f"{type(error).__name__}: {error}\n{''.join(formatted[-lines:])}"


# ---------------------------------------------------------------------------------------------
# The worker process


def _serve(
    conn: Connection,
    setup: Callable[[], Any] | None,
    handler: Callable[[Any, Any, Slot], Any],
    environment: Mapping[str, str],
    lock_path: str | None,
) -> None:
    """A worker's loop: run ``setup``, say ready, then answer ``(job_id, job)`` until ``None``."""
    # Ctrl-C reaches the whole process group; the parent stops and closes its workers, so a
    # worker must not die on it with a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(environment)
    try:
        state = setup() if setup is not None else None
    except Exception as error:
        conn.send(("failed", describe_exception(error)))
        return
    job_id = -1

    @contextlib.contextmanager
    def slot() -> Iterator[None]:
        # the parent stops the job's clock while it waits for another process's measurement
        conn.send(("pause", job_id))
        with latency_slot(lock_path):
            conn.send(("resume", job_id))
            yield

    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        job_id, job = message
        try:
            reply = ("done", job_id, handler(state, job, slot))
        except Exception as error:
            reply = ("error", job_id, describe_exception(error))
        try:
            conn.send(reply)
        except Exception as error:  # e.g. an unpicklable value in the result
            conn.send(("error", job_id, f"cannot send the result: {error}"))


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
    """The parent's handle on one worker process and the job it is running."""

    def __init__(self, context: Any, arguments: tuple[Any, ...], name: str) -> None:
        self.conn, child = context.Pipe(duplex=True)
        self.process = context.Process(target=_serve, args=(child, *arguments), daemon=True, name=name)
        self.process.start()
        child.close()
        self.ready = False
        self.failure: str | None = None  # setup's error, if it raised
        self.started = time.monotonic()
        self.job: Any = None
        self.busy = False
        self.job_id = -1
        self.deadline = float("inf")
        self.remaining: float | None = None  # set while the clock is paused
        self.job_started = 0.0

    def assign(self, job_id: int, item: Any, job: Any, timeout: float) -> None:
        """Send ``job`` to the process; ``item`` is what the pool yields back with its outcome."""
        self.job, self.job_id, self.busy = item, job_id, True
        self.job_started = time.monotonic()
        self.deadline = self.job_started + timeout
        self.remaining = None
        self.conn.send((job_id, job))

    def clear(self) -> None:
        self.job, self.job_id, self.busy, self.deadline, self.remaining = None, -1, False, float("inf"), None

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


# ---------------------------------------------------------------------------------------------
# The pool


class WorkerPool(Generic[Job]):
    """Run jobs on ``size`` spawned processes with a hard per-job ``timeout`` (seconds).

    ``handler(state, job, slot)`` answers a job in a worker; ``setup()`` (optional) runs once per
    process and gives ``state``; ``environment`` is set in the workers before ``setup``;
    ``lock_path`` overrides the machine's latency lock file; a process that takes longer than
    ``startup_timeout`` to become ready, or whose ``setup`` fails, raises :class:`WorkerError`.
    Processes start on first use and are replaced when killed or dead.
    """

    def __init__(
        self,
        handler: Callable[[Any, Job, Slot], Any],
        *,
        size: int = 1,
        setup: Callable[[], Any] | None = None,
        timeout: float = 600.0,
        environment: Mapping[str, str] | None = None,
        lock_path: str | None = None,
        startup_timeout: float = 120.0,
        name: str = "kdsl-worker",
    ) -> None:
        if size < 1:
            raise WorkerError(f"a worker pool needs at least 1 process, got {size}")
        if not timeout > 0:
            raise WorkerError(f"timeout must be positive seconds, got {timeout}")
        self.size, self.timeout, self.startup_timeout = size, float(timeout), float(startup_timeout)
        self._arguments = (setup, handler, dict(environment or {}), lock_path)
        self._name = name
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        self._next_id = 0

    def _spawn(self) -> _Worker:
        return _Worker(self._context, self._arguments, self._name)

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        fresh = self._spawn()
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    @property
    def waiting_for_slot(self) -> int:
        """How many running jobs are waiting for the latency slot (their clocks are stopped)."""
        return sum(1 for w in self._workers if w.busy and w.remaining is not None)

    def run(self, jobs: Iterable[Job]) -> list[Outcome]:
        """The outcomes of ``jobs``, in the order given."""
        jobs = list(jobs)
        outcomes = {index: outcome for (index, _), outcome in self.map(enumerate(jobs), key=lambda pair: pair[1])}
        return [outcomes[index] for index in range(len(jobs))]

    def call(self, job: Job) -> Outcome:
        """The outcome of one job."""
        return self.run([job])[0]

    def map(self, jobs: Iterable[Any], key: Callable[[Any], Job] | None = None) -> Iterator[tuple[Any, Outcome]]:
        """Run ``jobs`` (consumed lazily) and yield each with its outcome as it finishes.

        With ``key``, an item of ``jobs`` is yielded as given but the worker gets ``key(item)``.
        """
        source = iter(jobs)
        exhausted = False
        while len(self._workers) < self.size:
            self._workers.append(self._spawn())
        try:
            while True:
                for worker in self._workers:
                    if worker.ready and not worker.busy and not exhausted:
                        try:
                            item = next(source)
                        except StopIteration:
                            exhausted = True
                            continue
                        self._next_id += 1
                        try:
                            job = key(item) if key is not None else item
                            worker.assign(self._next_id, item, job, self.timeout)
                        except (OSError, BrokenPipeError):  # died while idle: retry the job on a fresh one
                            self._replace(worker)
                            source = _prepend(item, source)
                if exhausted and not any(w.busy for w in self._workers):
                    return
                yield from self._step()
        finally:
            # the consumer stopped early (or an error): abandon running jobs
            for index, worker in enumerate(self._workers):
                if worker.busy:
                    worker.kill()
                    self._workers[index] = self._spawn()

    def _step(self) -> Iterator[tuple[Any, Outcome]]:
        """Wait for one event (a message, a death, a deadline) and yield the finished jobs."""
        now = time.monotonic()
        deadlines = [w.deadline for w in self._workers if w.busy and w.remaining is None]
        deadlines += [w.started + self.startup_timeout for w in self._workers if not w.ready]
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        handles: list[Any] = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
        ready = set(wait(handles, timeout))
        finished: list[tuple[Any, Outcome]] = []
        for worker in list(self._workers):
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
        for worker in list(self._workers):
            if worker.busy and worker.remaining is None and now >= worker.deadline:
                job, seconds = worker.job, now - worker.job_started
                self._replace(worker)
                message = f"no result after {self.timeout:g} s; the worker was killed and replaced"
                finished.append((job, Outcome("timeout", error=message, seconds=seconds)))
            elif not worker.ready and now >= worker.started + self.startup_timeout:
                worker.kill()
                raise WorkerError(f"a worker process did not start within {self.startup_timeout:g} s")
        yield from finished

    def _message(self, worker: _Worker, message: tuple) -> list[tuple[Any, Outcome]]:
        kind = message[0]
        if kind == "ready":
            worker.ready = True
        elif kind == "failed":
            worker.failure = message[1]
        elif kind == "pause" and message[1] == worker.job_id:
            worker.remaining = max(0.0, worker.deadline - time.monotonic())
        elif kind == "resume" and message[1] == worker.job_id and worker.remaining is not None:
            worker.deadline = time.monotonic() + worker.remaining
            worker.remaining = None
        elif kind in ("done", "error") and message[1] == worker.job_id and worker.busy:
            job, seconds = worker.job, time.monotonic() - worker.job_started
            worker.clear()
            if kind == "done":
                return [(job, Outcome("ok", value=message[2], seconds=seconds))]
            return [(job, Outcome("error", error=message[2], seconds=seconds))]
        return []

    def _died(self, worker: _Worker) -> list[tuple[Any, Outcome]]:
        job, busy, seconds = worker.job, worker.busy, time.monotonic() - worker.job_started
        was_ready = worker.ready
        code = worker.kill()
        if worker.failure is not None:
            raise WorkerError(f"a worker process failed to start: {worker.failure}")
        if not was_ready and not busy:
            raise WorkerError(f"a worker process failed to start ({_exit_text(code)}); see its output above")
        self._replace(worker)
        if not busy:
            return []
        return [(job, Outcome("crashed", error=_exit_text(code), seconds=seconds))]

    def close(self) -> None:
        """Stop the worker processes (a later job starts new ones)."""
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def __enter__(self) -> WorkerPool[Job]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _prepend(item: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield item
    yield from rest
