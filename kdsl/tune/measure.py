"""Measuring schedules: compile configurations in a small process pool, time them in one measuring process.

Configurations of a batch are applied and compiled in parallel (each worker exports a shared library),
then timed one at a time in a separate measuring process (median of repeated runs with TVM's
``time_evaluator``), whose first run of each configuration *family* (the configuration without its tile
factors) is checked against the NumPy reference backend. A crash or a hang of either process costs that
configuration only: it is recorded as invalid and the process restarts.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from kdsl.codegen.tvm.schedule_space import Space
from kdsl.lang.build import Operator
from kdsl.lang.errors import LoweringError

#: Seconds one compile may take before its configuration is declared invalid.
COMPILE_TIMEOUT = 120.0
#: Seconds one measurement may take before the measuring process is restarted.
MEASURE_TIMEOUT = 60.0
#: Target seconds of one timed repeat (``number`` calls); ``REPEATS`` repeats give the median.
REPEAT_SECONDS = 0.04
REPEATS = 5
#: Relative tolerance of the check against the reference (fp32 sums of thousands of products).
RTOL = 2e-3


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
