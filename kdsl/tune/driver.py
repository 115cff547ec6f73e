"""Schedule tuning: the tuner interface, the tuning-records store, and measurement.

A *task* is one operator at one layer on this machine's target. Tuners search the schedule space of
:mod:`kdsl.codegen.tvm.schedule_space` through one interface (:class:`Tuner`): ``propose(n)`` returns up to ``n``
configurations never proposed before, ``update(records)`` feeds back their measured results, and so on.
:func:`tune` drives a tuner against a :class:`Measurer` and a :class:`RecordStore` (SQLite): re-running
with the same database continues from the stored records (the tuner sees them as its history) and never
measures a stored configuration again.

Measurement: configurations of a batch are applied and compiled in parallel in a small process pool
(each worker exports a shared library), then timed one at a time in a separate measuring process (median
of repeated runs with TVM's ``time_evaluator``), whose first run of each configuration *family* (the
configuration without its tile factors) is checked against the NumPy reference backend. A crash or a
hang of either process costs that configuration only: it is recorded as invalid and the process restarts.

>>> store = RecordStore(":memory:")
>>> store.add("task", Record({"a": 1}, 0.002, None, "opevo"))
>>> store.add("task", Record({"a": 2}, None, "invalid: no", "opevo"))
>>> [r.latency for r in store.records("task")], store.best("task").config
([0.002, None], {'a': 1})
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kdsl.codegen.tvm.schedule_space import VERSION, Space, config_key, normalize
from kdsl.lang.build import Operator
from kdsl.lang.errors import KdslError, LoweringError

#: Seconds one compile may take before its configuration is declared invalid.
COMPILE_TIMEOUT = 120.0
#: Seconds one measurement may take before the measuring process is restarted.
MEASURE_TIMEOUT = 60.0
#: Target seconds of one timed repeat (``number`` calls); ``REPEATS`` repeats give the median.
REPEAT_SECONDS = 0.04
REPEATS = 5
#: Relative tolerance of the check against the reference (fp32 sums of thousands of products).
RTOL = 2e-3


class TuneError(KdslError):
    """A tuning run that cannot go on (an unknown tuner, a broken records database, ...)."""


@dataclass
class Record:
    """One tried configuration: its latency in seconds, or the reason it is invalid."""

    config: dict[str, Any]
    latency: float | None
    error: str | None
    tuner: str
    key: str = ""
    at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.config = normalize(self.config)
        if not self.key:
            self.key = config_key(self.config)

    @property
    def fitness(self) -> float:
        """1 / latency, or 0 for an invalid configuration (OpEvo's rule)."""
        return 0.0 if self.latency is None or self.latency <= 0 else 1.0 / self.latency


# ------------------------------------------------------------------------------------------------
# The records store
# ------------------------------------------------------------------------------------------------


class RecordStore:
    """Tuning records in SQLite, one row per (task, configuration): adding a known one is a no-op."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        try:
            self.db = sqlite3.connect(self.path)
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS records (task TEXT NOT NULL, key TEXT NOT NULL, config TEXT NOT NULL, "
                "latency REAL, error TEXT, tuner TEXT NOT NULL, at REAL NOT NULL, seq INTEGER PRIMARY KEY, "
                "UNIQUE (task, tuner, key))"
            )
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS tasks (task TEXT PRIMARY KEY, description TEXT NOT NULL, at REAL NOT NULL)"
            )
            self.db.commit()
        except sqlite3.DatabaseError as error:
            raise TuneError(f"cannot open the tuning records {self.path}: {error}") from None

    def describe(self, task: str, description: Mapping[str, Any]) -> None:
        """Remember what a task key stands for (operator, layer, target)."""
        self.db.execute(
            "INSERT OR IGNORE INTO tasks VALUES (?, ?, ?)", (task, json.dumps(description, sort_keys=True), time.time())
        )
        self.db.commit()

    def add(self, task: str, record: Record) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO records (task, key, config, latency, error, tuner, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (task, record.key, json.dumps(record.config), record.latency, record.error, record.tuner, record.at),
        )
        self.db.commit()

    def confirm(self, task: str, key: str, tuner: str, latency: float) -> None:
        """Replace a record's latency by a re-measured one (the fastest of its timings)."""
        self.db.execute(
            "UPDATE records SET latency = ? WHERE task = ? AND key = ? AND tuner = ?", (latency, task, key, tuner)
        )
        self.db.commit()

    def records(self, task: str, tuner: str | None = None) -> list[Record]:
        """The task's records in the order they were added (of one tuner, if given)."""
        query = "SELECT config, latency, error, tuner, key, at FROM records WHERE task = ?"
        args: tuple[Any, ...] = (task,)
        if tuner is not None:
            query += " AND tuner = ?"
            args += (tuner,)
        rows = self.db.execute(query + " ORDER BY seq", args).fetchall()
        return [Record(json.loads(c), lat, err, t, k, at) for c, lat, err, t, k, at in rows]

    def known(self, task: str, key: str, tuner: str | None = None) -> Record | None:
        """The stored record of configuration ``key`` (by ``tuner``, if given; measured ones first)."""
        query = "SELECT config, latency, error, tuner, key, at FROM records WHERE task = ? AND key = ?"
        args: tuple[Any, ...] = (task, key)
        if tuner is not None:
            query += " AND tuner = ?"
            args += (tuner,)
        row = self.db.execute(query + " ORDER BY latency IS NULL, seq LIMIT 1", args).fetchone()
        return None if row is None else Record(json.loads(row[0]), row[1], row[2], row[3], row[4], row[5])

    def best(self, task: str, tuner: str | None = None) -> Record | None:
        """The fastest valid record of the task (of one tuner, if given)."""
        valid = [r for r in self.records(task, tuner) if r.latency is not None]
        return min(valid, key=lambda r: r.latency or 0.0) if valid else None


def task_key(op: Operator, binding: Mapping[str, int], target: str) -> str:
    """The key of a tuning task: the operator's structure, its sizes, the target and the space's version."""
    text = json.dumps([op.key, sorted(binding.items()), target, VERSION])
    return hashlib.sha1(text.encode()).hexdigest()[:20]


# ------------------------------------------------------------------------------------------------
# The tuner interface
# ------------------------------------------------------------------------------------------------


class Tuner(Protocol):
    """A search over one space: propose a batch, receive its records, propose again."""

    name: str

    def propose(self, n: int) -> list[dict[str, Any]]:
        """Up to ``n`` configurations, none proposed before (nor in the history it was given)."""
        ...

    def update(self, records: Sequence[Record]) -> None:
        """The results of proposed configurations (latency ``None``: invalid, fitness 0)."""
        ...


def make_tuner(name: str, space: Space, history: Sequence[Record], seed: int = 0, **options: Any) -> Tuner:
    """A tuner by name (``opevo``, ``gensor``, ``alt``, ``random``) over ``space``, resuming from ``history``.

    >>> make_tuner("nope", None, [])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kdsl.tune.driver.TuneError: unknown tuner 'nope'; choose one of alt, gensor, metaschedule, opevo, random
    """
    if name == "opevo":
        from kdsl.tune.opevo import OpEvo

        return OpEvo(space, history, seed=seed, **options)
    if name == "gensor":
        from kdsl.tune.gensor import Gensor

        return Gensor(space, history, seed=seed, **options)
    if name == "alt":
        from kdsl.tune.alt import Alt

        return Alt(space, history, seed=seed, **options)
    if name == "random":
        from kdsl.tune.opevo import RandomTuner

        return RandomTuner(space, history, seed=seed)
    raise TuneError(f"unknown tuner {name!r}; choose one of alt, gensor, metaschedule, opevo, random")


# ------------------------------------------------------------------------------------------------
# Measurement
# ------------------------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _lowered(op: Operator, layer: Mapping[str, int]) -> Any:
    from kdsl.codegen.tvm import lower

    return lower(op, layer)


def _compile_init(op: Operator, layer: dict[str, int]) -> None:
    os.environ.setdefault("TVM_NUM_THREADS", "2")
    _WORKER["space"] = Space(_lowered(op, layer))


def _compile_one(config: dict[str, Any], path: str) -> str | None:
    """Apply and compile ``config`` into a shared library at ``path``; the reason on failure."""
    from kdsl.codegen.tvm import default_target, load_tvm

    tvm = load_tvm()
    try:
        sch = _WORKER["space"].apply(config)
        executable = tvm.compile(sch.mod, target=default_target())
        executable.export_library(path)
    except LoweringError as error:
        return str(error)
    except Exception as error:  # a compiler error is the configuration's fault: invalid
        return f"compile failed: {str(error).strip().splitlines()[-1][:300] if str(error).strip() else error!r}"
    return None


def compile_module(module: Any, path: str) -> None:
    """Compile an ``IRModule`` for this machine into a shared library at ``path``."""
    from kdsl.codegen.tvm import default_target, load_tvm

    load_tvm().compile(module, target=default_target()).export_library(path)


def _measure_loop(conn: Any, op: Operator, layer: dict[str, int]) -> None:
    """The measuring process: reply to ``(path, check)`` with ``(seconds or None, error or None)``."""
    os.environ.setdefault("TVM_NUM_THREADS", "2")
    import numpy as np

    from kdsl.codegen import reference
    from kdsl.codegen.tvm import load_tvm

    tvm = load_tvm()
    x, weights = reference.random_inputs(op, layer, dtype=np.float32)
    expected = None
    dev = tvm.cpu(0)
    output_shape = tuple(int(d) for d in _lowered(op, layer).output_shape)
    args = [tvm.runtime.tensor(a, dev) for a in (x, *weights)]
    out = tvm.runtime.empty(output_shape, "float32", dev)
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        path, check = request
        try:
            module = tvm.runtime.load_module(path)
            start = time.perf_counter()
            module["main"](*args, out)
            first = time.perf_counter() - start
            if check:
                if expected is None:
                    expected = reference.run(op, layer, x.astype(np.float64), [w.astype(np.float64) for w in weights])
                got = out.numpy()
                scale = float(np.abs(expected).max()) or 1.0
                error = float(np.abs(got - expected).max()) / scale
                if not error <= RTOL:
                    conn.send((None, f"wrong result: max error {error:.2e} of the output's scale"))
                    continue
            if first > 1.0:
                conn.send((first, None))
                continue
            start = time.perf_counter()
            module["main"](*args, out)
            once = max(time.perf_counter() - start, 1e-6)
            number = max(1, int(REPEAT_SECONDS / once))
            timer = module.time_evaluator("main", dev, number=number, repeat=REPEATS)
            results = sorted(timer(*args, out).results)
            conn.send((results[len(results) // 2], None))
        except Exception as error:
            conn.send((None, f"run failed: {str(error).strip()[-300:]}"))


class Measurer:
    """Compiles configurations in a process pool and times them one at a time in a measuring process."""

    def __init__(self, op: Operator, layer: Mapping[str, int], workers: int = 2) -> None:
        self.op = op
        self.layer = dict(layer)
        self.workers = workers
        self.context = multiprocessing.get_context("spawn")
        self.tmp = tempfile.TemporaryDirectory(prefix="kdsl-tune-")
        self.pool: ProcessPoolExecutor | None = None
        self.process: Any = None
        self.conn: Any = None
        self.checked: set[str] = set()
        self.count = 0
        self.compile_seconds = 0.0
        self.measure_seconds = 0.0

    def _pool(self) -> ProcessPoolExecutor:
        if self.pool is None:
            self.pool = ProcessPoolExecutor(
                self.workers, mp_context=self.context, initializer=_compile_init, initargs=(self.op, self.layer)
            )
        return self.pool

    def _measurer(self) -> Any:
        if self.process is None or not self.process.is_alive():
            parent, child = self.context.Pipe()
            self.process = self.context.Process(target=_measure_loop, args=(child, self.op, self.layer), daemon=True)
            self.process.start()
            self.conn = parent
        return self.conn

    def _restart_measurer(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
        self.process = None

    def compile(self, configs: Sequence[dict[str, Any]]) -> list[tuple[str | None, str | None]]:
        """``(library path, None)`` or ``(None, reason)`` for every configuration, compiled in parallel."""
        jobs = []
        for config in configs:
            self.count += 1
            path = os.path.join(self.tmp.name, f"k{self.count}.so")
            jobs.append((path, self._pool().submit(_compile_one, dict(config), path)))
        results: list[tuple[str | None, str | None]] = []
        for path, job in jobs:
            try:
                error = job.result(timeout=COMPILE_TIMEOUT)
            except FutureTimeout:
                error = f"compile took more than {COMPILE_TIMEOUT:.0f} s"
                self._reset_pool(kill=True)
            except Exception as failure:  # a crashed worker: the pool is broken, start another
                error = f"compile worker crashed: {failure!r}"[:300]
                self._reset_pool()
            results.append((None, error) if error else (path, None))
        return results

    def _reset_pool(self, kill: bool = False) -> None:
        if self.pool is not None:
            if kill:  # a worker stuck in a compile: end it, or shutdown waits for it
                for process in list(getattr(self.pool, "_processes", {}).values()):
                    process.kill()
            self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = None

    def time_library(self, path: str, check: bool) -> tuple[float | None, str | None]:
        """Seconds per call of a compiled library (median of repeats), checked against the reference if asked."""
        conn = self._measurer()
        conn.send((path, check))
        if not conn.poll(MEASURE_TIMEOUT):
            self._restart_measurer()
            return None, f"measurement took more than {MEASURE_TIMEOUT:.0f} s"
        try:
            return conn.recv()
        except EOFError:
            self._restart_measurer()
            return None, "the kernel crashed the measuring process"

    def measure(self, space: Space, configs: Sequence[dict[str, Any]]) -> list[tuple[float | None, str | None]]:
        """Compile ``configs`` in parallel, then time each. Every output is checked against the reference
        (stricter than once per family: a check costs one comparison, and a layout that does not align with
        the tiles once produced a wrong kernel in a family whose first member was right)."""
        started = time.perf_counter()
        built = self.compile(configs)
        self.compile_seconds += time.perf_counter() - started
        started = time.perf_counter()
        results = []
        for config, (path, error) in zip(configs, built):
            if path is None:
                results.append((None, error))
                continue
            latency, error = self.time_library(path, check=True)
            if latency is not None:
                self.checked.add(space.family(config))
            results.append((latency, error))
            Path(path).unlink(missing_ok=True)
        self.measure_seconds += time.perf_counter() - started
        return results

    def close(self) -> None:
        self._reset_pool()
        if self.conn is not None and self.process is not None and self.process.is_alive():
            try:
                self.conn.send(None)
                self.process.join(5)
            except (OSError, BrokenPipeError):
                pass
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        self.process = None
        self.tmp.cleanup()

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------


@dataclass
class TuneResult:
    """The outcome of one tuning run: the best record and the best latency after each measured trial."""

    task: str
    tuner: str
    best: Record | None
    curve: list[float]  # best seconds so far after each measurement of this run (inf before a valid one)
    measured: int
    rejected: int
    seconds: float
    library: str | None = None  # a compiled library of the best schedule, when the tuner kept one


def open_task(
    op: Operator, layer: Mapping[str, int], db: str | os.PathLike[str]
) -> tuple[dict[str, int], str, RecordStore]:
    """The binding of ``op`` at ``layer``, its task key on this machine, and the records store (the task
    described in it)."""
    from kdsl import solve
    from kdsl.codegen.tvm import default_target

    binding = solve.bind(op, layer)
    mcpu = str(default_target().attrs.get("mcpu", ""))
    key = task_key(op, binding, mcpu)
    store = RecordStore(db)
    store.describe(key, {"op": op.key, "binding": binding, "target": mcpu})
    return binding, key, store


def tune(
    op: Operator,
    layer: Mapping[str, int],
    tuner: str = "opevo",
    trials: int = 64,
    db: str | os.PathLike[str] = "tune.db",
    *,
    batch: int = 8,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
    measurer: Measurer | None = None,
    options: Mapping[str, Any] | None = None,
    confirm: int = 3,
) -> TuneResult:
    """Tune ``op`` at ``layer`` with ``tuner`` for ``trials`` new measurements, storing every record in ``db``.

    Resumable: the records already in ``db`` for this task become the tuner's history and are never
    measured again. Configurations rejected before compiling (an invalid schedule) are recorded too but
    do not count as trials. At the end the ``confirm`` fastest configurations of this run are compiled again
    and timed twice more, a few seconds apart, and each keeps the fastest of its three timings: on these
    VMs a kernel runs up to 1.8x slower for seconds to minutes at a time (interference only ever slows a
    kernel down, so the fastest timing is the estimate), and a single timing decided the winner.
    ``tuner="metaschedule"`` runs TVM's MetaSchedule instead
    (:func:`kdsl.tune.metaschedule.tune_metaschedule`)."""
    if tuner == "metaschedule":
        from kdsl.tune.metaschedule import tune_metaschedule

        return tune_metaschedule(op, layer, trials, db, log=log, measurer=measurer)
    started = time.time()
    run_started = started
    binding, key, store = open_task(op, layer, db)
    space = Space(_lowered(op, binding))
    history = store.records(key, tuner)  # the tuner resumes from its own records
    search = make_tuner(tuner, space, history, seed=seed, **dict(options or {}))
    own = measurer or Measurer(op, binding)
    best = min((r.latency for r in history if r.latency is not None), default=float("inf"))
    curve: list[float] = []
    measured = rejected = 0
    stalls = 0
    try:
        while measured < trials and stalls < 50:
            proposals = search.propose(min(batch, trials - measured))
            if not proposals:
                stalls += 1
                continue
            fresh, records = [], []
            reused = 0
            for config in proposals:
                config = normalize(config)
                ckey = config_key(config)
                if store.known(key, ckey, tuner):
                    raise TuneError(f"tuner {tuner} proposed one of its stored configurations again")
                other = store.known(key, ckey)
                if other is not None:  # measured for another tuner: reuse, never measure twice
                    records.append(Record(config, other.latency, other.error, tuner))
                    if other.latency is not None:
                        measured += 1
                        reused += 1
                        best = min(best, other.latency)
                        curve.append(best)
                    continue
                try:
                    space.apply(config)
                    fresh.append(config)
                except LoweringError as error:
                    records.append(Record(config, None, str(error), tuner))
            rejected += len(records) - reused
            stalls = stalls + 1 if not fresh and not reused else 0
            for config, (latency, error) in zip(fresh, own.measure(space, fresh)):
                records.append(Record(config, latency, error, tuner))
                measured += 1
                if latency is not None:
                    best = min(best, latency)
                curve.append(best)
            for record in records:
                store.add(key, record)
            search.update(records)
            if log:
                log(
                    f"{tuner}: {measured}/{trials} measured, {rejected} rejected, best {best * 1e3:.3f} ms "
                    f"(compile {own.compile_seconds:.0f} s, measure {own.measure_seconds:.0f} s, "
                    f"{time.time() - started:.0f} s in all)"
                )
            if rejected > 20 * max(trials, 1):
                break
        if confirm > 0:
            _confirm(store, key, tuner, space, own, run_started, confirm, log)
    finally:
        if measurer is None:
            own.close()
    return TuneResult(key, tuner, store.best(key, tuner), curve, measured, rejected, time.time() - started)


def _confirm(
    store: RecordStore,
    task: str,
    tuner: str,
    space: Space,
    measurer: Measurer,
    since: float,
    count: int,
    log: Callable[[str], None] | None,
) -> None:
    """Re-time the ``count`` fastest records of this run twice (fresh compiles, in alternation) and store
    the fastest of each one's three timings."""
    fresh = [r for r in store.records(task, tuner) if r.latency is not None and r.at >= since]
    top = sorted(fresh, key=lambda r: r.latency or 0.0)[:count]
    if len(top) < 2:
        return
    timings = {r.key: [r.latency or 0.0] for r in top}
    built = measurer.compile([r.config for r in top])
    for _ in range(2):
        for record, (path, _) in zip(top, built):
            if path is not None:
                latency, _ = measurer.time_library(path, check=False)
                if latency is not None:
                    timings[record.key].append(latency)
    fastest = {}
    for record, (path, _) in zip(top, built):
        fastest[record.key] = min(timings[record.key])
        store.confirm(task, record.key, tuner, fastest[record.key])
        if path is not None:
            Path(path).unlink(missing_ok=True)
    if log:
        log(f"{tuner}: re-timed the {len(top)} fastest; best {min(fastest.values()) * 1e3:.3f} ms")
