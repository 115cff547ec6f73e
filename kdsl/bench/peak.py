"""What this machine can do, measured: its fp32 FMA peak and its memory bandwidth (``kdsl bench peak``).

Three TVM kernels, each compiled for the machine kdsl's kernels are compiled for
(:func:`~kdsl.codegen.tvm.machine.current_machine`, which honours ``--mcpu``) and run on all its threads:

* **FMA peak**: per core, independent accumulator vectors (the machine's accumulator budget, and half as
  many again) each take a long chain of FMAs of one vector held in a register and a broadcast from a
  small table that stays in L1; vectorized to the machine's lanes, parallel over the cores. Counted as
  2 flops per lane per FMA.
* **read bandwidth**: a reduction that sums rows of a buffer into a few vector accumulators per part
  (parallel over parts, several independent accumulators to hide the add latency); counted as the
  buffer's bytes. A buffer the last-level cache holds is summed several times per call, so that the
  parallel launch does not count.
* **copy bandwidth**: a vectorized parallel copy; counted as the bytes read plus the bytes written
  (STREAM's convention: the write-allocate read of the destination is not counted).

Each bandwidth is measured over a buffer well beyond the last-level cache (256 MiB by default: DRAM)
and over one of half an L2 per core (what each core's L2 holds). Every kernel's output is checked
against NumPy before its timing counts (integer-valued inputs, so the float sums are exact), and
each rate is reported as the best and the median of its repeats. The best is the bound a roofline
uses (:mod:`kdsl.bench.roofline`); the median says how steady the machine was.

>>> Rate(best=4.0, median=3.0).text("GB/s")
'4.0 GB/s (median 3.0)'
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kdsl.codegen.tvm import default_target, load_tvm
from kdsl.codegen.tvm.machine import current_machine
from kdsl.lang.errors import KdslError
from kdsl.runtime.cpu import Machine, host_ghz

__all__ = [
    "DRAM_BYTES",
    "MIB",
    "PEAK_KERNELS_VERSION",
    "MachinePeak",
    "Rate",
    "clock_bound_gflops",
    "copy_kernel",
    "fma_kernel",
    "kernel_rate",
    "measure_bandwidth",
    "measure_fma",
    "measure_peak",
    "read_kernel",
    "read_shape",
    "sanity_problems",
    "size_text",
]

MIB = 1024 * 1024
#: the version of these kernels: a cached peak (kdsl.bench.peak_cache) measured by another is measured again
PEAK_KERNELS_VERSION = 1
#: the default DRAM buffer: 8x the 32 MiB last-level caches of the project's machines
DRAM_BYTES = 256 * MIB
#: the bytes one call of the read kernel streams over a buffer the caches hold (several passes)
PASS_BYTES = 32 * MIB


@dataclass(frozen=True)
class Rate:
    """A measured rate (GFLOP/s or GB/s): the best of the repeats and their median."""

    best: float
    median: float

    def text(self, unit: str) -> str:
        """``best unit (median m)``."""
        return f"{self.best:.1f} {unit} (median {self.median:.1f})"


def _rate(timer: Callable[..., Any], args: Sequence[Any], work: float, repeats: int, seconds: float = 0.05) -> Rate:
    """``work`` units per second of ``timer``'s kernel (``executable.mod.time_evaluator``'s factory),
    best and median over ``repeats`` repeats of enough calls each to last about ``seconds``."""
    once = min(timer(number=1, repeat=2)(*args).results)  # the first call also warms caches and threads
    number = max(1, min(1000, int(seconds / max(once, 1e-9))))
    results = timer(number=number, repeat=repeats)(*args).results
    rates = [work / s for s in results if s > 0]
    if not rates:
        raise KdslError("the peak kernels timed 0 seconds: the timer of this TVM build does not work")
    return Rate(best=max(rates), median=statistics.median(rates))


def _timer(executable: Any, dev: Any) -> Callable[..., Any]:
    return lambda number, repeat: executable.mod.time_evaluator("main", dev, number=number, repeat=repeat)


def kernel_rate(executable: Any, args: Sequence[Any], work: float, repeats: int = 10) -> Rate:
    """``work`` units per second of a compiled kernel's ``main`` on ``args`` (TVM tensors), best and median
    of ``repeats`` timings of about 50 ms each: how the peak kernels are timed, for a kernel to compare
    with them side by side. A timing."""
    return _rate(_timer(executable, load_tvm().cpu()), args, work, repeats)


# ------------------------------------------------------------------------------------------------
# FMA peak


def fma_kernel(machine: Machine, accumulators: int, depth: int, block: int) -> Any:
    """A kernel that is all FMAs: per core, ``accumulators`` vectors each take ``depth`` FMAs of one
    vector held in a register and a broadcast from a ``block``-row table that stays in L1.

    ``c[t, j, v] = sum_k a[t, v] * b[k % block, j]``: core ``t``'s ``accumulators x lanes`` outputs."""
    tvm = load_tvm()
    from tvm import te

    cores, lanes = machine.cores, machine.lanes()
    a = te.placeholder((cores, lanes), "float32", name="a")
    b = te.placeholder((block, accumulators), "float32", name="b")
    k = te.reduce_axis((0, depth), name="k")
    c = te.compute((cores, accumulators, lanes), lambda t, j, v: te.sum(a[t, v] * b[k % block, j], axis=k), name="c")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b, c]))
    block_rv = sch.get_sblock("c")
    t, j, v, reduction = sch.get_loops(block_rv)
    outer, inner = sch.split(reduction, [None, block])
    sch.reorder(t, outer, inner, j, v)
    return _compile_in_registers(sch, block_rv, (t, j, v, outer), machine)


def _compile_in_registers(sch: Any, block_rv: Any, loops: tuple[Any, Any, Any, Any], machine: Machine) -> Any:
    """Compile ``sch`` with ``block_rv``'s accumulators in registers: ``loops`` are (the parallel loop, the
    unrolled accumulator loop, the vectorized lane loop, the outermost reduction loop, where the
    accumulators are initialized), the result written back once per parallel part."""
    tvm = load_tvm()
    parallel, unrolled, lane, reduction = loops
    local = sch.cache_write(block_rv, 0, "local")  # the accumulators live in registers
    sch.reverse_compute_at(local, parallel)
    sch.parallel(parallel)
    sch.unroll(unrolled)
    sch.vectorize(lane)
    sch.decompose_reduction(block_rv, reduction)
    return tvm.compile(sch.mod, target=default_target(machine.mcpu))


def _small_integers(rng: Any, shape: tuple[int, ...], high: int) -> Any:
    """Integer-valued float32 in ``[0, high)``: sums of them stay exact below 2**24."""
    return rng.integers(0, high, size=shape, dtype="int8").astype("float32")


def measure_fma(machine: Machine | None = None, *, depth: int = 1 << 16, repeats: int = 15, block: int = 256) -> Rate:
    """The fp32 FMA throughput of all ``machine``'s cores in GFLOP/s (:func:`fma_kernel`): the best
    accumulator count of the machine's budget and half as many again. Each kernel's output is
    checked against NumPy first (a :class:`~kdsl.lang.errors.KdslError` if it is wrong). A timing."""
    import numpy as np

    if depth < block or depth % block:
        raise KdslError(f"the FMA chain depth {depth} must be a positive multiple of its table's {block} rows")
    machine = machine or current_machine()
    tvm = load_tvm()
    dev, rng, lanes = tvm.cpu(), np.random.default_rng(0), machine.lanes()
    best: Rate | None = None
    for accumulators in dict.fromkeys([machine.accumulators(), machine.accumulators() * 3 // 2]):
        executable = fma_kernel(machine, accumulators, depth, block)
        a = _small_integers(rng, (machine.cores, lanes), 4)
        b = _small_integers(rng, (block, accumulators), 2)
        args = [tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev)]
        args.append(tvm.runtime.tensor(np.zeros((machine.cores, accumulators, lanes), "float32"), dev))
        executable(*args)
        # every row of b is read depth / block times: c = a * (depth / block) * (the column sums of b)
        expected = a[:, None, :] * (depth // block) * b.sum(axis=0)[None, :, None]
        if not np.array_equal(args[2].numpy(), expected):
            raise KdslError(f"the FMA peak kernel ({accumulators} accumulators) computed a wrong result")
        flops = 2.0 * machine.cores * accumulators * lanes * depth
        rate = _rate(_timer(executable, dev), args, flops / 1e9, repeats)
        best = rate if best is None or rate.best > best.best else best
    assert best is not None  # the loop ran at least once
    return best


# ------------------------------------------------------------------------------------------------
# Bandwidth


def read_kernel(machine: Machine, parts: int, rows: int, vectors: int, passes: int = 1) -> Any:
    """``out[p, w] = sum_{s, r} x[p, r, w]`` over rows of ``vectors`` whole vectors, ``passes`` times
    over the buffer: each part's sum stays in ``vectors`` independent register accumulators while its
    rows stream in, parts in parallel. Several passes make one call of a cache-sized buffer long
    enough that the parallel launch does not count (1 MiB at 50 GB/s is 20 us, a launch some us)."""
    tvm = load_tvm()
    from tvm import te

    lanes = machine.lanes()
    x = te.placeholder((parts, rows, vectors * lanes), "float32", name="x")
    s = te.reduce_axis((0, passes), name="s")
    r = te.reduce_axis((0, rows), name="r")
    out = te.compute((parts, vectors * lanes), lambda p, w: te.sum(x[p, r, w], axis=[s, r]), name="out")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, out]))
    block_rv = sch.get_sblock("out")
    p, w, again, reduction = sch.get_loops(block_rv)
    vector, lane = sch.split(w, [vectors, lanes])
    sch.reorder(p, again, reduction, vector, lane)
    return _compile_in_registers(sch, block_rv, (p, vector, lane, again), machine)


def copy_kernel(machine: Machine, parts: int, length: int, vectors: int) -> Any:
    """``y[p, i] = x[p, i]``: parts in parallel, ``vectors`` whole vectors a step."""
    tvm = load_tvm()
    from tvm import te

    lanes = machine.lanes()
    x = te.placeholder((parts, length), "float32", name="x")
    y = te.compute((parts, length), lambda p, i: x[p, i], name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    p, i = sch.get_loops(sch.get_sblock("y"))
    _, vector, lane = sch.split(i, [None, vectors, lanes])
    sch.parallel(p)
    sch.unroll(vector)
    sch.vectorize(lane)
    return tvm.compile(sch.mod, target=default_target(machine.mcpu))


def read_shape(machine: Machine, nbytes: int) -> tuple[int, int, int]:
    """``(parts, rows, vectors)`` of the read kernel over about ``nbytes``: 4 parts per core (a core that
    finishes early takes the next; static chunks stay balanced), half the accumulator budget of vectors
    a row, whole rows (at least one): 8 parts x 8192 rows of 4 vectors of 8 lanes are 8 MiB of float32.

    >>> from kdsl.runtime.cpu import from_features
    >>> read_shape(from_features("haswell", {"avx2", "fma"}, cores=2, ghz=3.0), 8 * 1024 * 1024)
    (8, 8192, 4)
    """
    parts, vectors = 4 * machine.cores, max(1, machine.accumulators() // 2)
    return parts, max(1, nbytes // (4 * parts * vectors * machine.lanes())), vectors


def measure_bandwidth(
    nbytes: int, machine: Machine | None = None, *, repeats: int = 10, copy: bool = True
) -> tuple[Rate, Rate | None]:
    """(read, copy) bandwidth in GB/s over a float32 buffer of about ``nbytes`` (rounded down to whole
    rows of every part; at least one), with all of ``machine``'s threads; ``copy=False``: read only.
    Outputs are checked against NumPy before the timings count. A timing."""
    import numpy as np

    machine = machine or current_machine()
    tvm = load_tvm()
    dev, lanes = tvm.cpu(), machine.lanes()
    parts, rows, vectors = read_shape(machine, nbytes)
    row = vectors * lanes
    # a buffer the last-level cache holds is read again in the same call: 32 MiB a call in all
    passes = max(1, PASS_BYTES // (4 * parts * rows * row)) if nbytes <= machine.l3 else 1
    x = _small_integers(np.random.default_rng(1), (parts, rows, row), 4)  # sums below 2**24: exact
    if passes * rows * 3 >= 1 << 24:
        raise KdslError(f"a bandwidth buffer of {nbytes} bytes is too large for an exact check of its sums")
    source = tvm.runtime.tensor(x, dev)
    out = tvm.runtime.tensor(np.zeros((parts, row), "float32"), dev)
    reader = read_kernel(machine, parts, rows, vectors, passes)
    reader(source, out)
    if not np.array_equal(out.numpy(), passes * x.sum(axis=1)):
        raise KdslError("the read-bandwidth kernel computed a wrong sum")
    total = float(x.nbytes)
    read = _rate(_timer(reader, dev), [source, out], passes * total / 1e9, repeats)
    if not copy:
        return read, None
    flat = tvm.runtime.tensor(x.reshape(parts, rows * row), dev)
    target = tvm.runtime.tensor(np.zeros((parts, rows * row), "float32"), dev)
    copier = copy_kernel(machine, parts, rows * row, vectors)
    copier(flat, target)
    if not np.array_equal(target.numpy(), x.reshape(parts, rows * row)):
        raise KdslError("the copy-bandwidth kernel computed a wrong copy")
    return read, _rate(_timer(copier, dev), [flat, target], 2 * total / 1e9, repeats)


# ------------------------------------------------------------------------------------------------
# Everything at once, and its sanity


@dataclass(frozen=True)
class MachinePeak:
    """What :func:`measure_peak` measured: the FMA peak (GFLOP/s) and the bandwidths (GB/s) over a
    DRAM-sized and an L2-sized buffer (copy ``None`` where it was not measured)."""

    machine: Machine
    fma: Rate
    dram_read: Rate
    l2_read: Rate
    dram_bytes: int
    l2_bytes: int
    dram_copy: Rate | None = None
    l2_copy: Rate | None = None

    def as_dict(self) -> dict[str, Any]:
        """The measurements as JSON-ready values (GFLOP/s, GB/s, bytes), beside the assumed peak."""
        rates = {"fma_gflops": self.fma, "dram_read_gbs": self.dram_read, "l2_read_gbs": self.l2_read}
        rates.update({"dram_copy_gbs": self.dram_copy, "l2_copy_gbs": self.l2_copy})
        out: dict[str, Any] = {
            name: {"best": rate.best, "median": rate.median} for name, rate in rates.items() if rate is not None
        }
        out.update(
            assumed_gflops=self.machine.peak_gflops(),
            clock_bound_gflops=clock_bound_gflops(self.machine),
            dram_bytes=self.dram_bytes,
            l2_bytes=self.l2_bytes,
            warnings=sanity_problems(self),
        )
        return out

    def lines(self) -> list[str]:
        """The measurements, one a line, each beside what kdsl assumes where it assumes something."""
        m = self.machine
        out = [
            f"FMA peak: {self.fma.text('GFLOP/s')}; assumed {m.peak_gflops():.0f} GFLOP/s "
            f"({m.cores} cores x {m.fma_units} FMA units x {m.lanes()} lanes x 2 x {m.ghz:.2f} GHz)",
        ]
        for what, size, read, copy in (
            ("DRAM", self.dram_bytes, self.dram_read, self.dram_copy),
            ("L2", self.l2_bytes, self.l2_read, self.l2_copy),
        ):
            copied = f"; copy {copy.text('GB/s')}" if copy is not None else ""
            out.append(f"{what} bandwidth ({size_text(size)} buffer): read {read.text('GB/s')}{copied}")
        bound = clock_bound_gflops(m)
        implied = self.fma.best / (m.cores * m.fma_units * m.lanes() * 2)
        fmas = f"{m.fma_units} FMA{'s' if m.fma_units > 1 else ''} a cycle"
        out.append(
            f"the FMA peak implies {implied:.2f} GHz at {fmas} of {m.lanes()} lanes per core "
            f"(bound from the reported clock: {bound:.0f} GFLOP/s)"
        )
        out += [f"warning: {problem}" for problem in sanity_problems(self)]
        return out


def size_text(nbytes: int) -> str:
    """``256 MiB`` / ``1024 KiB``."""
    return f"{nbytes / MIB:.0f} MiB" if nbytes >= 16 * MIB else f"{nbytes / 1024:.0f} KiB"


def clock_bound_gflops(machine: Machine, ghz: float | None = None) -> float:
    """cores x FMA units x lanes x 2 x the highest clock the host reports (sysfs' maximum frequency,
    else ``/proc/cpuinfo``'s MHz: :func:`~kdsl.runtime.cpu.host_ghz`): what the FMA peak cannot
    exceed unless the clock boosts beyond what the host reports or the core has more FMA units.

    >>> from kdsl.runtime.cpu import from_features
    >>> clock_bound_gflops(from_features("haswell", {"avx2", "fma"}, cores=2, ghz=1.0), ghz=3.0)
    192.0
    """
    clock = host_ghz() if ghz is None else ghz
    return machine.cores * machine.fma_units * machine.lanes() * 2 * clock


def sanity_problems(peak: MachinePeak, ghz: float | None = None) -> list[str]:
    """What looks wrong in ``peak``: an FMA peak above :func:`clock_bound_gflops`, a bandwidth outside
    1-200 GB/s, a non-finite or non-positive rate; empty when all is plausible."""
    problems = []
    rates = {"FMA peak": peak.fma, "DRAM read": peak.dram_read, "L2 read": peak.l2_read}
    rates.update({"DRAM copy": peak.dram_copy, "L2 copy": peak.l2_copy})
    for name, rate in rates.items():
        if rate is not None and not (math.isfinite(rate.best) and rate.best > 0):
            problems.append(f"{name} is {rate.best}: not a positive finite rate")
    bound = clock_bound_gflops(peak.machine, ghz)
    if peak.fma.best > bound:
        problems.append(
            f"the FMA peak {peak.fma.best:.0f} GFLOP/s exceeds {bound:.0f} GFLOP/s (the reported clock's "
            f"bound): the clock boosts beyond what the host reports"
        )
    for name in ("DRAM read", "DRAM copy"):
        rate = rates[name]
        if rate is not None and not 1.0 <= rate.best <= 200.0:
            problems.append(f"the {name} bandwidth {rate.best:.1f} GB/s is outside 1-200 GB/s")
    return problems


def measure_peak(
    machine: Machine | None = None,
    *,
    repeats: int = 10,
    dram_bytes: int = DRAM_BYTES,
    l2_bytes: int | None = None,
    depth: int = 1 << 16,
    copy: bool = True,
) -> MachinePeak:
    """Measure ``machine``'s FMA peak and its bandwidth over ``dram_bytes`` (beyond the last-level
    cache, which it must exceed) and ``l2_bytes`` (default: half an L2 per core), ``repeats`` timings
    each; ``copy=False`` measures reads only (what a roofline needs). A timing: a few seconds."""
    machine = machine or current_machine()
    if dram_bytes <= machine.l3:
        raise KdslError(
            f"a DRAM buffer of {size_text(dram_bytes)} fits the {size_text(machine.l3)} last-level cache: it would "
            f"measure the cache; give one beyond it"
        )
    l2_bytes = l2_bytes if l2_bytes is not None else machine.cores * machine.l2 // 2
    fma = measure_fma(machine, depth=depth, repeats=repeats)
    dram_read, dram_copy = measure_bandwidth(dram_bytes, machine, repeats=repeats, copy=copy)
    l2_read, l2_copy = measure_bandwidth(l2_bytes, machine, repeats=repeats, copy=copy)
    return MachinePeak(machine, fma, dram_read, l2_read, dram_bytes, l2_bytes, dram_copy, l2_copy)
