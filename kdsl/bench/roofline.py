"""A kernel's roofline: the least time this machine needs for its arithmetic and its data, and how close
a measured kernel comes to it.

The bound of a kernel of ``macs`` multiply-accumulates that must move ``nbytes`` (every input and weight
read once and the output written once, fp32: :func:`minimum_bytes`) is

    max(2 * macs / peak FLOP/s, nbytes / bandwidth)

with the FMA peak and the read bandwidth that :func:`kdsl.bench.peak.measure_peak` measured (their
best repeats). The bandwidth is DRAM's where the data exceed the last-level cache, else the one
measured over L2-sized buffers: a kernel whose data stay in the caches between runs is not held to
DRAM's rate, and the L2 rate is at least the L3's, so the time stays a lower bound. A kernel's
*share* of its roofline is bound / measured time (1: at the machine's bound). A default schedule whose
time is within 10% of its bound (share >= 1 / 1.1) leaves no tuner room to make it 1.1x faster.

>>> roofline = Roofline(peak_gflops=100.0, dram_gbs=10.0, cache_gbs=50.0, cache_bytes=1 << 20)
>>> matmul = roofline.bound(macs=512**3, nbytes=3 * 4 * 512**2)  # 3 MiB of data, 0.27 GFLOP
>>> matmul.limit, round(matmul.seconds * 1e3, 2)
('compute', 2.68)
>>> copy = roofline.bound(macs=0, nbytes=1e9)
>>> copy.limit, copy.seconds, round(copy.share(0.125), 2)
('memory', 0.1, 0.8)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kdsl.bench.peak import DRAM_BYTES, MachinePeak, measure_peak
from kdsl.codegen import reference
from kdsl.codegen.tvm import lower
from kdsl.codegen.tvm.machine import current_machine
from kdsl.codegen.tvm.parameters import config_key, normalize
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator
from kdsl.runtime.cpu import Machine
from kdsl.runtime.units import duration
from kdsl.tune.records import RecordStore

__all__ = [
    "FP32_BYTES",
    "MARGIN",
    "Bound",
    "Roofline",
    "default_latency",
    "measure_roofline",
    "minimum_bytes",
    "program_macs",
    "room_line",
    "within_margin",
]

FP32_BYTES = 4
#: "within 10% of the roofline": a time at most 1.1x the bound, so no schedule can be 1.1x faster
MARGIN = 0.10


@dataclass(frozen=True)
class Bound:
    """A kernel's lower-bound time (seconds): the larger of its compute time at the peak and its data
    time at the bandwidth, and which one it is."""

    compute_seconds: float
    memory_seconds: float
    bandwidth_gbs: float = 0.0  # the bandwidth the memory time assumes

    @property
    def seconds(self) -> float:
        """The bound: no schedule of the kernel runs faster on this machine."""
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def limit(self) -> str:
        """``compute`` or ``memory``: what the bound is made of."""
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"

    def share(self, kernel_seconds: float) -> float:
        """The share of the bound a kernel of ``kernel_seconds`` reaches: bound / its time (1 = at it)."""
        if not (kernel_seconds > 0 and math.isfinite(kernel_seconds)):
            raise KdslError(f"a kernel time must be a positive number of seconds, got {kernel_seconds}")
        return self.seconds / kernel_seconds


@dataclass(frozen=True)
class Roofline:
    """The machine's measured ceilings: FMA peak (GFLOP/s), read bandwidth from DRAM and from the
    caches (GB/s), and the footprint (bytes, the last-level cache) up to which the caches' applies."""

    peak_gflops: float
    dram_gbs: float
    cache_gbs: float
    cache_bytes: int

    def __post_init__(self) -> None:
        for name in ("peak_gflops", "dram_gbs", "cache_gbs"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise KdslError(f"a roofline needs a positive finite {name}, got {value}")

    @classmethod
    def from_peak(cls, peak: MachinePeak) -> Roofline:
        """The ceilings :func:`~kdsl.bench.peak.measure_peak` measured (best repeats; reads, not copies:
        the larger rate gives the smaller, still valid, bound)."""
        cache = max(peak.l2_read.best, peak.dram_read.best)
        return cls(peak.fma.best, peak.dram_read.best, cache, peak.machine.l3)

    def bound(self, macs: float, nbytes: float) -> Bound:
        """The bound of a kernel of ``macs`` multiply-accumulates moving at least ``nbytes``."""
        if macs < 0 or nbytes < 0:
            raise KdslError(f"a roofline needs non-negative MACs and bytes, got {macs} MACs, {nbytes} bytes")
        bandwidth = self.cache_gbs if nbytes <= self.cache_bytes else self.dram_gbs
        return Bound(2.0 * macs / (self.peak_gflops * 1e9), nbytes / (bandwidth * 1e9), bandwidth)

    def raised_to(self, rates: Mapping[str, float]) -> tuple[Roofline, str | None]:
        """This roofline with its FMA peak raised to the highest of ``rates`` (GFLOP/s, keyed by who reached
        it) where one is above it, and a sentence saying so; else itself and ``None``. A kernel that ran at
        a rate shows the machine can: a peak measured lower (on a busy or throttled moment: the same 2-core
        VM measured 148 and, two hours later, 259 GFLOP/s) would put kernels "within 10% of their bound" that
        have room, so a table's bound takes the larger figure.

        >>> roofline = Roofline(peak_gflops=100.0, dram_gbs=10.0, cache_gbs=50.0, cache_bytes=1 << 20)
        >>> raised, why = roofline.raised_to({"PyTorch on MM1": 150.0, "the default on MM1": 90.0})
        >>> raised.peak_gflops, why
        (150.0, 'the FMA peak is raised from the measured 100 to 150 GFLOP/s, the rate PyTorch on MM1 ran at')
        >>> roofline.raised_to({"PyTorch on MM1": 99.0})[1] is None
        True
        """
        who, rate = max(rates.items(), key=lambda item: item[1], default=("", 0.0))
        if rate <= self.peak_gflops:
            return self, None
        why = (
            f"the FMA peak is raised from the measured {self.peak_gflops:.0f} to {rate:.0f} GFLOP/s, "
            f"the rate {who} ran at"
        )
        return replace(self, peak_gflops=rate), why

    def line(self) -> str:
        """One line for a benchmark's header."""
        return (
            f"roofline: measured FMA peak {self.peak_gflops:.0f} GFLOP/s, read bandwidth {self.dram_gbs:.1f} GB/s "
            f"from DRAM ({self.cache_gbs:.1f} GB/s where the data fit the {self.cache_bytes >> 20} MiB "
            f"last-level cache)"
        )


def minimum_bytes(op: Operator, layer: Mapping[str, int], dtype_bytes: int = FP32_BYTES) -> int:
    """The bytes any kernel of ``op`` at ``layer`` moves at least: every input and weight read once,
    the output written once.

    >>> from kdsl import gallery, solve
    >>> op = gallery.load("matmul")
    >>> minimum_bytes(op, solve.bind(op, {"M": 2, "Cin": 3, "Cout": 4}))  # (2x3 + 3x4 + 2x4) x 4 bytes
    104
    """
    shapes = reference.shapes(op, layer)
    tensors = [*shapes.inputs, *shapes.weights, shapes.output]
    return dtype_bytes * sum(math.prod(shape) for shape in tensors)


def program_macs(op: Operator, layer: Mapping[str, int]) -> int:
    """The multiply-adds of the program kdsl runs for ``op`` at ``layer``: every reduction stage's
    iterations. The roofline's arithmetic is this, not the operator's formula: a transposed convolution
    written over the zero-dilated input counts the zeros, which its phase form
    (:mod:`kdsl.codegen.tvm.phases`) and PyTorch's kernel both skip (ALT's T2D: 0.411 GMAC written,
    0.103 run), and a bound from the written count would be one the kernel beats.

    >>> from kdsl import gallery, solve
    >>> op = gallery.load("matmul")
    >>> program_macs(op, solve.bind(op, {"M": 2, "Cin": 3, "Cout": 4}))  # 2 x 3 x 4
    24
    """
    stages = ScheduleSpace(lower(op, layer)).stages
    return sum(math.prod(e for _, e in (*stage.spatial, *stage.reduced)) for stage in stages if stage.kind == "reduce")


def within_margin(share: float, margin: float = MARGIN) -> bool:
    """Whether a kernel at ``share`` of its roofline is within ``margin`` of it: its time at most
    ``1 + margin`` times the bound, so that no schedule can run ``1 + margin`` times faster.

    >>> within_margin(0.95), within_margin(0.9)
    (True, False)
    """
    return share * (1.0 + margin) >= 1.0


def measure_roofline(machine: Machine | None = None, repeats: int = 10) -> Roofline:
    """The roofline of ``machine`` (default: the one kernels are compiled for), measured now: the FMA
    peak and the read bandwidths (DRAM over at least 4 last-level caches, and L2) of
    :func:`~kdsl.bench.peak.measure_peak`, ``repeats`` timings each. A timing: a few seconds."""
    machine = machine or current_machine()
    return Roofline.from_peak(
        measure_peak(machine, repeats=repeats, dram_bytes=max(DRAM_BYTES, 4 * machine.l3), copy=False)
    )


def default_latency(db: str, task: str, op: Operator, binding: Mapping[str, int]) -> float | None:
    """The default schedule's latency among ``task``'s records in ``db``: the record of the space's
    heuristic configuration (what :func:`~kdsl.codegen.tvm.default_schedule.default_schedule` applies),
    which OpEvo and ALT measure first; ``None`` where no tuner measured it (MetaSchedule, Gensor's
    walks that never met it)."""
    space = ScheduleSpace(lower(op, binding))
    record = RecordStore(db).known(task, config_key(normalize(space.heuristic())))
    return record.latency if record is not None else None


def room_line(name: str, bound: Bound, roofline: Roofline, default: float | None, best: float | None) -> str:
    """One line for ``kdsl tune``: the layer's roofline and the default schedule's (and the best
    record's) share of it, so a user sees whether tuning can pay.

    >>> roofline = Roofline(peak_gflops=100.0, dram_gbs=10.0, cache_gbs=50.0, cache_bytes=1 << 20)
    >>> for part in room_line("conv3_x", roofline.bound(5e6, 1e5), roofline, 1.25e-4, 1.1e-4).split("; "):
    ...     print(part)
    roofline of conv3_x: 100 us (compute-bound at the measured 100 GFLOP/s)
    default schedule 125 us, 0.80 of it: a tuner can make it at most 1.25x faster
    best 110 us, 0.91 of it
    >>> room_line("copy", roofline.bound(0, 2e6), roofline, 1.9e-4, None).split(": ", 1)[1]
    '200 us (memory-bound at the measured 10.0 GB/s); default schedule 190 us, 1.05 of it: above the bound, ...'
    """
    if bound.limit == "compute":
        what = f"compute-bound at the measured {roofline.peak_gflops:.0f} GFLOP/s"
    else:
        what = f"memory-bound at the measured {bound.bandwidth_gbs:.1f} GB/s"
    line = f"roofline of {name}: {duration(bound.seconds)} ({what}); "
    if default is None:
        line += "the default schedule is not among this run's records (its tuner did not measure it)"
    else:
        share = bound.share(default)
        line += f"default schedule {duration(default)}, {share:.2f} of it: "
        if share > 1.0:
            line += "above the bound, so the peak or bandwidth measured low (a busy machine?): measure it quietly"
        elif within_margin(share):
            line += f"within {MARGIN:.0%} of the bound, no tuner can make it {1 + MARGIN:.1f}x faster"
        else:
            line += f"a tuner can make it at most {1 / share:.2f}x faster"
    if best is not None:
        line += f"; best {duration(best)}, {bound.share(best):.2f} of it"
    return line
