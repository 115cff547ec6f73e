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
from dataclasses import dataclass

from kdsl.bench.peak import MachinePeak
from kdsl.codegen import reference
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator

__all__ = ["FP32_BYTES", "MARGIN", "Bound", "Roofline", "minimum_bytes", "within_margin"]

FP32_BYTES = 4
#: "within 10% of the roofline": a time at most 1.1x the bound, so no schedule can be 1.1x faster
MARGIN = 0.10


@dataclass(frozen=True)
class Bound:
    """A kernel's lower-bound time (seconds): the larger of its compute time at the peak and its data
    time at the bandwidth, and which one it is."""

    compute_seconds: float
    memory_seconds: float

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
        return Bound(2.0 * macs / (self.peak_gflops * 1e9), nbytes / (bandwidth * 1e9))

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


def within_margin(share: float, margin: float = MARGIN) -> bool:
    """Whether a kernel at ``share`` of its roofline is within ``margin`` of it: its time at most
    ``1 + margin`` times the bound, so that no schedule can run ``1 + margin`` times faster.

    >>> within_margin(0.95), within_margin(0.9)
    (True, False)
    """
    return share * (1.0 + margin) >= 1.0
