"""Measuring schedules: compile configurations in worker processes, time them in one measuring worker.

Both are :class:`~kdsl.runtime.workers.WorkerPool` processes (the pool the discover executor uses):
configurations of a batch are applied and compiled in parallel (each worker exports a shared library),
then timed one at a time in a measuring worker (median of repeated runs with TVM's ``time_evaluator``)
that holds the machine's latency slot (:func:`~kdsl.runtime.timing.latency_slot`) while it runs a
kernel, so tuning never times while a discover run (or another tuning run) does; waiting for the slot
does not count against :data:`MEASURE_TIMEOUT`. Every output is checked against the NumPy reference
backend before it is timed, from an output buffer filled with NaN first (an element the kernel does not
write fails the check). A crash or a hang of a worker costs that configuration only: it is recorded
as invalid and the worker is replaced.

A measurer made with ``block > 0`` measures the kernel with a channel-blocked signature
(:mod:`kdsl.codegen.tvm.signature_layout`): each configuration is applied, then its input and output
buffers are blocked, and the kernel is timed on blocked inputs and checked against the reference output
blocked the same way; what a network built blocked runs.

A measurer made with ``prepacked=True`` measures the kernel a compiled network runs with its weights
packed once (:mod:`kdsl.codegen.tvm.prepack`): each configuration is applied (and blocked, with
``block``), then :func:`~kdsl.codegen.tvm.prepack.prepack_weights` removes the copies that pack a weight
on every call and gives the signature those weights' packed layouts, which the compile worker writes
beside the library (:func:`layouts_path`); the measuring worker packs its weights into them once per
layout, outside the timing, and times only the kernel. A weight whose packing copy prepack refuses is
passed as it is, as a compiled network passes it. The check against the reference is the same.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kdsl.codegen import reference
from kdsl.codegen.tvm import default_target, load_tvm, lower
from kdsl.codegen.tvm.prepack import WeightLayout, prepack_weights
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.codegen.tvm.signature_layout import block_array, block_signature, blocked_shape
from kdsl.lang.errors import LoweringError
from kdsl.lang.operator import Operator
from kdsl.runtime.workers import Outcome, Slot, WorkerPool
from kdsl.tune.records import TuneError

#: Seconds one compile may take before its configuration is declared invalid.
COMPILE_TIMEOUT = 120.0
#: Seconds one measurement may take (not counting the wait for the latency slot) before the
#: measuring worker is killed and replaced.
MEASURE_TIMEOUT = 60.0
#: Target seconds of one timed repeat (``number`` calls); ``REPEATS`` repeats give the median.
REPEAT_SECONDS = 0.04
REPEATS = 5
#: Relative tolerance of the check against the reference (fp32 sums of thousands of products).
RTOL = 2e-3
#: A layer whose batch dim is larger than four times this is checked on its first and last this many rows.
CHECKED_ROWS = 2
#: A compile worker's job: a configuration, the library's path and whether stages that refuse their part of
#: the configuration fall back to the plain parallel schedule (the compiled default's rule).
CompileJob = tuple[dict[str, Any], str, bool]

#: Packed weights the measuring worker keeps, by layout (configurations of a task share a few layouts).
PACKED_KEPT = 8


# ------------------------------------------------------------------------------------------------
# In the worker processes


def _compile_setup(op: Operator, layer: dict[str, int]) -> ScheduleSpace:
    """A compile worker's state: the schedule space of the lowered operator."""
    return ScheduleSpace(lower(op, layer))


def signature_schedule(
    space: ScheduleSpace, config: Mapping[str, Any], block: int = 0, *, fallback: bool = False
) -> Any:
    """The schedule of ``config`` in ``space``, its signature channel-blocked by ``block`` (0: plain); a
    :class:`LoweringError` when either step refuses. With ``fallback``, a stage whose part of ``config``
    fails gets the plain parallel schedule, as the compiled default schedule does
    (:meth:`ScheduleSpace.apply`)."""
    sch = space.apply(config, fallback=fallback)
    return block_signature(sch, space.lowered, block) if block else sch


def layouts_path(path: str) -> str:
    """Where a library compiled with prepacked weights has its weights' packed layouts: beside it.

    >>> layouts_path("/tmp/k1.so")
    '/tmp/k1.so.layouts.json'
    """
    return path + ".layouts.json"


def _compile_job(
    space: ScheduleSpace, job: CompileJob, slot: Slot, block: int = 0, prepacked: bool = False
) -> str | None:
    """Apply and compile a configuration (its signature blocked by ``block``; with ``prepacked``, its
    packing copies removed and the weights' layouts written to :func:`layouts_path`) into a shared
    library at a path; the reason on failure. A job is ``(config, path, fallback)`` (:func:`signature_schedule`'s
    ``fallback``)."""
    config, path, fallback = job
    tvm = load_tvm()
    try:
        sch = signature_schedule(space, config, block, fallback=fallback)
        layouts = None
        if prepacked:  # what compile_network builds: the weights the schedule packs are taken packed
            sch, layouts = prepack_weights(sch, space.lowered)
        executable = tvm.compile(sch.mod, target=default_target())
        executable.export_library(path)
        if layouts is not None:
            entries = [None if layout is None else layout.to_json() for layout in layouts]
            Path(layouts_path(path)).write_text(json.dumps(entries))
    except LoweringError as error:
        return str(error)
    except Exception as error:  # a compiler error is the configuration's fault: invalid
        return f"compile failed: {str(error).strip().splitlines()[-1][:300] if str(error).strip() else error!r}"
    return None


def compile_module(module: Any, path: str) -> None:
    """Compile an ``IRModule`` for this machine into a shared library at ``path``."""
    load_tvm().compile(module, target=default_target()).export_library(path)


def _measure_setup(op: Operator, layer: dict[str, int], block: int = 0, prepacked: bool = False) -> dict[str, Any]:
    """The measuring worker's state: TVM, random inputs (every data input of a kernel of several, in
    its input order) on its device, an output buffer; with ``block``, the data input and the output
    buffer channel-blocked (the reference is computed on the plain input and blocked after); with
    ``prepacked``, the weights are packed for each library by the layouts beside it (:func:`_arguments`)."""
    import numpy as np

    tvm = load_tvm()
    x, weights = reference.random_inputs(op, layer, dtype=np.float32)
    inputs = list(x) if isinstance(x, tuple) else [x]  # a kernel of several inputs: a tuple of them
    dev = tvm.cpu(0)
    output_shape = tuple(int(d) for d in lower(op, layer).output_shape)
    if block:
        inputs = [block_array(inputs[0], block)]  # one data input: the Measurer checked it
        output_shape = blocked_shape(output_shape, block, "the output")
    return {
        "tvm": tvm,
        "op": op,
        "layer": layer,
        "x": x,
        "weights": weights,
        "dev": dev,
        "args": [tvm.runtime.tensor(a, dev) for a in (*inputs, *weights)],  # the PrimFunc's order
        "out": tvm.runtime.empty(output_shape, "float32", dev),
        "expected": None,
        "sentinel": None,
        "block": block,
        "prepacked": prepacked,
        "packed": {},  # layout (as JSON) -> the weight packed in it, on the device
    }


def batch_rows(op: Operator, layer: Mapping[str, int]) -> tuple[int, ...] | None:
    """The output rows the reference check computes when the whole reference would be large: the first
    and last :data:`CHECKED_ROWS` of a leading batch dim (the first dim of every data input and of the
    output, named alike, that no weight's shape depends on), or ``None`` to check every row.

    The rows are independent by construction only if no step of the operator mixes them, so this is
    confirmed numerically on the reference itself: rows computed with ``CHECKED_ROWS + 1`` rows present
    must equal them computed alone. The last rows are checked too because a schedule's tail (a batch
    size its tile does not divide) lives there.

    >>> from kdsl.lang import library
    >>> batch_rows(library.load("conv2d"), {"N": 64, "Cin": 4, "Cout": 4, "H": 6, "W": 6})
    (0, 1, 62, 63)
    >>> batch_rows(library.load("conv2d"), {"N": 4, "Cin": 4, "Cout": 4, "H": 6, "W": 6}) is None
    True
    """
    import numpy as np

    firsts = {str(dims[0].size) if dims else None for dims in (*op.input_dims, op.outputs)}
    name = firsts.pop() if len(firsts) == 1 else None
    if name is None or name not in layer or layer[name] <= 4 * CHECKED_ROWS:
        return None
    full = reference.shapes(op, layer)
    small = reference.shapes(op, {**layer, name: CHECKED_ROWS + 1})
    if list(small.weights) != list(full.weights):
        return None  # a weight depends on the dim: not a batch
    x, weights = reference.random_inputs(op, {**layer, name: CHECKED_ROWS + 1})
    alone = reference.run(op, {**layer, name: CHECKED_ROWS}, _rows(x, range(CHECKED_ROWS)), weights)
    together = reference.run(op, {**layer, name: CHECKED_ROWS + 1}, x, weights)
    if not np.allclose(alone, together[:CHECKED_ROWS], rtol=1e-9, atol=1e-9):
        return None
    size = layer[name]
    return (*range(CHECKED_ROWS), *range(size - CHECKED_ROWS, size))


def _rows(x: Any, rows: Sequence[int]) -> Any:
    """The given leading rows of a data input (or of each of several)."""
    if isinstance(x, tuple):
        return tuple(a[list(rows)] for a in x)
    return x[list(rows)]


def _expected(state: dict[str, Any]) -> tuple[tuple[int, ...] | None, Any]:
    """The reference output (float64), computed once per worker, with the output rows it covers
    (``None``: all of them). A layer with a large batch dim is checked on its first and last rows
    (:func:`batch_rows`): the whole float64 reference of OpEvo's AlexNet layers at batch 512 would
    take gigabytes (its unfolded input)."""
    import numpy as np

    if state["expected"] is None:
        op, layer = state["op"], state["layer"]
        rows = batch_rows(op, layer)
        x, weights = state["x"], state["weights"]
        as64 = [w.astype(np.float64) for w in weights]
        x64 = tuple(a.astype(np.float64) for a in x) if isinstance(x, tuple) else x.astype(np.float64)
        if rows is not None:
            name = str(op.outputs[0].size)
            expected = reference.run(op, {**layer, name: len(rows)}, _rows(x64, rows), as64)
        else:
            expected = reference.run(op, layer, x64, as64)
        # the batch dim stays first in a blocked layout: the checked rows are the same rows of it
        block = state.get("block", 0)
        state["expected"] = (rows, block_array(expected, block) if block else expected)
    return state["expected"]


def _sentinel(state: dict[str, Any]) -> Any:
    """The measuring worker's output-sized array of NaN (made once)."""
    import numpy as np

    if state.get("sentinel") is None:
        state["sentinel"] = np.full(tuple(int(d) for d in state["out"].shape), np.nan, dtype=np.float32)
    return state["sentinel"]


def check_output(got: Any, expected: Any) -> str | None:
    """Why a kernel's output ``got`` (its buffer filled with NaN before the run) is wrong against the float64
    reference ``expected``, or ``None`` when it is right within :data:`RTOL` of the output's scale.

    >>> import numpy as np
    >>> expected = np.array([1.0, -2.0, 4.0])
    >>> check_output(np.array([1.0, -2.0, 4.001], np.float32), expected) is None
    True
    >>> check_output(np.array([1.0, np.nan, 4.0], np.float32), expected)
    'wrong result: 1 of 3 output elements are NaN (never written by the kernel, or computed as NaN)'
    >>> check_output(np.array([1.0, -2.0, 5.0], np.float32), expected)
    "wrong result: max error 2.50e-01 of the output's scale"
    """
    import numpy as np

    unwritten = int(np.count_nonzero(np.isnan(got)))
    if unwritten:
        return (
            f"wrong result: {unwritten} of {got.size} output elements are NaN (never written by the kernel, "
            "or computed as NaN)"
        )
    scale = float(np.abs(expected).max()) or 1.0
    error = float(np.abs(got - expected).max()) / scale
    return None if error <= RTOL else f"wrong result: max error {error:.2e} of the output's scale"


def _arguments(state: dict[str, Any], path: str) -> list[Any]:
    """The measuring worker's arguments for the library at ``path`` (before its output): the data inputs,
    then the weights; with prepacked weights each weight the library takes packed is packed by the layout
    its compile wrote beside it (:func:`layouts_path`), once per layout (the last :data:`PACKED_KEPT` are
    kept), never inside the timing."""
    args = state["args"]
    if not state.get("prepacked"):
        return args
    try:
        entries = json.loads(Path(layouts_path(path)).read_text())
    except (OSError, ValueError):
        raise LoweringError(f"no weight layouts beside {path}: it was not compiled with prepacked weights") from None
    weights = state["weights"]
    if not isinstance(entries, list) or len(entries) != len(weights):
        raise LoweringError(f"the weight layouts beside {path} are not one per weight ({len(weights)})")
    first = len(args) - len(weights)
    out = list(args[:first])
    packed = state["packed"]
    for weight, given, entry in zip(weights, args[first:], entries):
        if entry is None:  # not packed by the schedule, or prepack refused its copy: passed as it is
            out.append(given)
            continue
        key = json.dumps(entry, sort_keys=True)
        if key not in packed:
            if len(packed) >= PACKED_KEPT:
                packed.pop(next(iter(packed)))  # the oldest layout
            packed[key] = state["tvm"].runtime.tensor(WeightLayout.from_json(entry).pack_array(weight), state["dev"])
        out.append(packed[key])
    return out


def _measure_job(state: dict[str, Any], job: tuple[str, bool], slot: Slot) -> tuple[float | None, str | None]:
    """Time the library at a path (checked against the reference if asked): ``(seconds, None)`` or
    ``(None, reason)``. Everything that runs the kernel runs inside the latency slot; packing prepacked
    weights (:func:`_arguments`) runs before it."""
    path, check = job
    tvm, dev, out = state["tvm"], state["dev"], state["out"]
    try:
        module = tvm.runtime.load_module(path)
        args = _arguments(state, path)
        rows, expected = _expected(state) if check else (None, None)  # before the slot: nothing to time here
        if expected is not None:
            # NaN in every element first: one the kernel never writes then fails the check every time,
            # instead of passing when the buffer still holds an earlier configuration's right answer
            out.copyfrom(_sentinel(state))
        with slot():
            start = time.perf_counter()
            module["main"](*args, out)
            first = time.perf_counter() - start
            if expected is not None:
                reason = check_output(out.numpy() if rows is None else out.numpy()[list(rows)], expected)
                if reason is not None:
                    return None, reason
            if first > 1.0:
                return first, None
            start = time.perf_counter()
            module["main"](*args, out)
            once = max(time.perf_counter() - start, 1e-6)
            number = max(1, int(REPEAT_SECONDS / once))
            timer = module.time_evaluator("main", dev, number=number, repeat=REPEATS)
            results = sorted(timer(*args, out).results)
        return results[len(results) // 2], None
    except Exception as error:
        return None, f"run failed: {str(error).strip()[-300:]}"


# ------------------------------------------------------------------------------------------------
# In the tuning process


class Measurer:
    """Compiles configurations on ``workers`` compile workers and times them one at a time in a
    measuring worker that takes the machine's latency slot (``lock_path`` overrides its lock file);
    ``block > 0``: of the kernel whose data input and output are channel-blocked by ``block``;
    ``prepacked``: of the kernel that takes the weights its schedule packs already packed (the module's text)."""

    def __init__(
        self,
        op: Operator,
        layer: Mapping[str, int],
        workers: int = 2,
        *,
        lock_path: str | None = None,
        block: int = 0,
        prepacked: bool = False,
    ) -> None:
        if not isinstance(prepacked, bool):
            raise TuneError(f"a measurer's prepacked flag must be True or False, got {prepacked!r}")
        self.op = op
        self.layer = dict(layer)
        self.block = block
        self.prepacked = prepacked
        if block:  # refused here, naming the dim, rather than as every configuration's compile error
            lowered = lower(op, self.layer)
            if lowered.extra_inputs:
                raise LoweringError("a channel-blocked signature is for kernels of one data input")
            blocked_shape(tuple(int(d) for d in lowered.x.shape), block, "the input")
            blocked_shape(tuple(int(d) for d in lowered.output_shape), block, "the output")
        self.workers = workers
        self.lock_path = lock_path
        self.tmp = tempfile.TemporaryDirectory(prefix="kdsl-tune-")
        # compile and measure with 2 TVM threads unless told otherwise (TVM's default here is 1)
        environment = {"TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS", "2")}
        # the processes start on first use, so a measurer that only compiles never starts a measuring one
        self.compilers: WorkerPool[CompileJob] = WorkerPool(
            functools.partial(_compile_job, block=block, prepacked=prepacked),
            size=workers,
            setup=functools.partial(_compile_setup, op, self.layer),
            timeout=COMPILE_TIMEOUT,
            environment=environment,
            lock_path=lock_path,
            name="kdsl-compile",
        )
        self.timer: WorkerPool[tuple[str, bool]] = WorkerPool(
            _measure_job,
            size=1,
            setup=functools.partial(_measure_setup, op, self.layer, block, prepacked),
            timeout=MEASURE_TIMEOUT,
            environment=environment,
            lock_path=lock_path,
            name="kdsl-measure",
        )
        self.checked: set[str] = set()
        self.count = 0
        self.compile_seconds = 0.0
        self.measure_seconds = 0.0

    def compile(
        self, configs: Sequence[dict[str, Any]], *, fallback: bool = False
    ) -> list[tuple[str | None, str | None]]:
        """``(library path, None)`` or ``(None, reason)`` for every configuration, compiled in parallel (with
        ``fallback``, as :func:`signature_schedule` says)."""
        jobs: list[CompileJob] = []
        for config in configs:
            self.count += 1
            jobs.append((dict(config), os.path.join(self.tmp.name, f"k{self.count}.so"), fallback))
        results: list[tuple[str | None, str | None]] = []
        for (_, path, _), outcome in zip(jobs, self.compilers.run(jobs)):
            error = _compile_error(outcome)
            results.append((None, error) if error else (path, None))
        return results

    @property
    def waiting_for_slot(self) -> bool:
        """Whether the measuring worker is waiting for the latency slot (another process is timing)."""
        return self.timer.waiting_for_slot > 0

    def time_library(self, path: str, check: bool) -> tuple[float | None, str | None]:
        """Seconds per call of a compiled library (median of repeats), checked against the reference if asked."""
        outcome = self.timer.call((path, check))
        if outcome.status == "ok":
            return outcome.value
        if outcome.status == "timeout":
            return None, f"measurement took more than {MEASURE_TIMEOUT:.0f} s"
        if outcome.status == "crashed":
            return None, "the kernel crashed the measuring process"
        return None, f"run failed: {outcome.error}"[:300]

    def measure(
        self, space: ScheduleSpace, configs: Sequence[dict[str, Any]], *, fallback: bool = False
    ) -> list[tuple[float | None, str | None]]:
        """Compile ``configs`` in parallel (with ``fallback``, as :func:`signature_schedule` says), then time
        each. Every output is checked against the reference (stricter than once per family: a check costs
        one comparison, and a layout that does not align with the tiles once produced a wrong kernel in a
        family whose first member was right)."""
        started = time.perf_counter()
        built = self.compile(configs, fallback=fallback)
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
            Path(layouts_path(path)).unlink(missing_ok=True)
        self.measure_seconds += time.perf_counter() - started
        return results

    def close(self) -> None:
        self.compilers.close()
        self.timer.close()
        self.tmp.cleanup()

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _compile_error(outcome: Outcome) -> str | None:
    """The reason a compile job failed, or None when it gave a library."""
    if outcome.status == "ok":
        return outcome.value
    if outcome.status == "timeout":
        return f"compile took more than {COMPILE_TIMEOUT:.0f} s"
    if outcome.status == "crashed":
        return f"compile worker crashed: {outcome.error}"[:300]
    return f"compile failed: {outcome.error}"[:300]
