"""One description of the NVIDIA GPU that CUDA kernels are compiled for: the GPU counterpart of
:mod:`kdsl.runtime.cpu`'s CPU :class:`~kdsl.runtime.cpu.Machine`.

The GPU schedule (:mod:`kdsl.codegen.tvm.gpu_schedule`) sizes its thread blocks, register tiles and
shared-memory tiles from here, and TVM's GPU verification checks every kernel against these limits.
Nothing here imports TVM (torch only inside :func:`current_gpu`): the CuPy launcher
(:mod:`kdsl.runtime.cuda_launch`) prints the same one-line description on a machine without it.

Where each fact comes from: on a machine with a GPU, the device (``torch.cuda.get_device_properties``);
without one, a table per compute capability (``arch``), from the vendor's figures for one product of
that architecture (see :data:`TABLE`). Bandwidth and fp32 peak are the vendor's datasheet figures in
either case (the device does not report them).

>>> gpu = from_arch("sm_90")
>>> gpu.name, gpu.sms, gpu.warp_size, gpu.max_threads_per_block
('NVIDIA H100 SXM5 (table)', 132, 32, 1024)
>>> gpu.static_shared_per_block
49152
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from kdsl.lang.errors import LoweringError

__all__ = ["ARCHES", "DEFAULT_ARCH", "TABLE", "Gpu", "GpuArchError", "check_arch", "current_gpu", "from_arch"]

DEFAULT_ARCH = "sm_90"

#: Static ``__shared__`` arrays (what TVM emits for ``cache_read(..., "shared")``) are limited to 48 KiB
#: per block on every architecture; more needs dynamic shared memory and an opt-in attribute per kernel
#: (cudaFuncSetAttribute), which the CuPy launcher does not set.
STATIC_SHARED_LIMIT = 48 * 1024


class GpuArchError(LoweringError):
    """A CUDA architecture (``sm_XX``) that kdsl has no description of, or that is malformed."""


@dataclass(frozen=True)
class Gpu:
    """An NVIDIA GPU: limits in threads, 32-bit registers and bytes; bandwidth in GB/s, peak in GFLOP/s."""

    name: str
    arch: str  # "sm_90"
    sms: int
    max_threads_per_block: int
    registers_per_block: int
    registers_per_sm: int
    shared_per_block: int  # the opt-in maximum (dynamic shared memory)
    shared_per_sm: int
    warp_size: int
    bandwidth_gbs: float
    fp32_gflops: float
    max_threads_per_sm: int = 2048

    @property
    def static_shared_per_block(self) -> int:
        """Shared memory a kernel with static ``__shared__`` arrays may use (see :data:`STATIC_SHARED_LIMIT`)."""
        return min(self.shared_per_block, STATIC_SHARED_LIMIT)

    def registers_per_thread(self, threads: int) -> int:
        """32-bit registers each of ``threads`` threads of one block may hold (the hardware's cap is 255).

        >>> from_arch("sm_80").registers_per_thread(256)
        255
        >>> from_arch("sm_80").registers_per_thread(1024)
        64
        """
        return min(255, self.registers_per_block // max(1, threads))

    def verify_constraints(self) -> dict[str, int]:
        """The limits in the form ``tvm.s_tir.analysis.verify_gpu_code`` takes."""
        return {
            "max_shared_memory_per_block": self.static_shared_per_block,
            "max_threads_per_block": self.max_threads_per_block,
            "max_thread_x": self.max_threads_per_block,
            "max_thread_y": self.max_threads_per_block,
            "max_thread_z": 64,
            # a thread's local arrays live in registers when small; bound them by what one thread of a
            # 128-thread block may hold, in bytes, so that a register tile never spills wholesale
            "max_local_memory_per_block": self.registers_per_thread(128) * 4,
            "max_vector_bytes": 16,
            "max_vthread": 8,
        }

    def describe(self) -> str:
        """One line for benchmark headers.

        >>> from_arch("sm_80").describe()  # doctest: +ELLIPSIS
        'NVIDIA A100 SXM4 80GB (table) sm_80: 108 SMs, warp 32, 1024 threads/block, ... 19500 GFLOP/s fp32'
        """
        return (
            f"{self.name} {self.arch}: {self.sms} SMs, warp {self.warp_size}, "
            f"{self.max_threads_per_block} threads/block, "
            f"{self.registers_per_block // 1024}K registers/block ({self.registers_per_sm // 1024}K/SM), shared "
            f"{self.shared_per_block // 1024} KiB/block ({self.shared_per_sm // 1024} KiB/SM), "
            f"{self.bandwidth_gbs:.0f} GB/s, {self.fp32_gflops:.0f} GFLOP/s fp32"
        )

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON-serializable dict (stored in CUDA kernel bundles)."""
        return dict(self.__dict__)


# Vendor figures (NVIDIA datasheets and the CUDA C Programming Guide's table "Technical Specifications per
# Compute Capability"): every listed architecture has a 32-thread warp, 1024 threads per block, 64K 32-bit
# registers per SM and per block.
#  sm_80 A100 SXM4 80GB: 108 SMs, 164 KiB shared/SM, 163 KiB/block opt-in, 2039 GB/s HBM2e,
#        19.5 TFLOP/s fp32 (A100 datasheet); 2048 threads/SM.
#  sm_86 GeForce RTX 3090: 82 SMs, 100 KiB shared/SM, 99 KiB/block, 936 GB/s GDDR6X, 35.6 TFLOP/s fp32
#        (Ampere GA102 whitepaper); 1536 threads/SM.
#  sm_89 GeForce RTX 4090: 128 SMs, 100 KiB shared/SM, 99 KiB/block, 1008 GB/s GDDR6X, 82.6 TFLOP/s fp32
#        (Ada AD102 whitepaper); 1536 threads/SM.
#  sm_90 H100 SXM5 80GB: 132 SMs, 228 KiB shared/SM, 227 KiB/block opt-in, 3350 GB/s HBM3, 67 TFLOP/s fp32
#        (H100 datasheet); 2048 threads/SM.


def _row(name: str, arch: str, sms: int, shared_kib: tuple[int, int], gbs: float, gflops: float, per_sm: int) -> Gpu:
    """A table row: 1024 threads/block, 64K registers per block and per SM, a 32-thread warp (all four arches)."""
    block, sm = shared_kib
    return Gpu(f"{name} (table)", arch, sms, 1024, 65536, 65536, block * 1024, sm * 1024, 32, gbs, gflops, per_sm)


TABLE: dict[str, Gpu] = {
    "sm_80": _row("NVIDIA A100 SXM4 80GB", "sm_80", 108, (163, 164), 2039, 19500, 2048),
    "sm_86": _row("NVIDIA GeForce RTX 3090", "sm_86", 82, (99, 100), 936, 35600, 1536),
    "sm_89": _row("NVIDIA GeForce RTX 4090", "sm_89", 128, (99, 100), 1008, 82600, 1536),
    "sm_90": _row("NVIDIA H100 SXM5", "sm_90", 132, (227, 228), 3350, 67000, 2048),
}
ARCHES = tuple(TABLE)


def check_arch(arch: str) -> str:
    """``arch`` if kdsl describes it, else a :class:`GpuArchError` naming the ones it does.

    >>> check_arch("sm_90")
    'sm_90'
    >>> check_arch("sm_100")
    Traceback (most recent call last):
    ...
    kdsl.runtime.gpu.GpuArchError: unknown CUDA arch 'sm_100': kdsl describes sm_80, sm_86, sm_89, sm_90
    """
    if not isinstance(arch, str) or not re.fullmatch(r"sm_\d+[a-z]?", arch) or arch.rstrip("a") not in TABLE:
        raise GpuArchError(f"unknown CUDA arch {arch!r}: kdsl describes {', '.join(ARCHES)}")
    return arch


def from_arch(arch: str = DEFAULT_ARCH) -> Gpu:
    """The table's description of ``arch`` (no GPU needed)."""
    return TABLE[check_arch(arch).rstrip("a")]


def from_properties(props: Any) -> Gpu:
    """The description of a device from its ``torch.cuda.get_device_properties`` (or any object with
    the same attribute names); what the device does not report comes from its arch's table row, and an
    arch newer than the table's takes sm_90's bandwidth and peak."""
    arch = f"sm_{props.major}{props.minor}"
    base = TABLE.get(arch, TABLE[DEFAULT_ARCH])

    def prop(name: str, default: int) -> int:
        value = getattr(props, name, None)
        return int(value) if value else default

    return replace(
        base,
        name=str(props.name),
        arch=arch,
        sms=prop("multi_processor_count", base.sms),
        registers_per_sm=prop("regs_per_multiprocessor", base.registers_per_sm),
        shared_per_block=prop("shared_memory_per_block_optin", base.shared_per_block),
        shared_per_sm=prop("shared_memory_per_multiprocessor", base.shared_per_sm),
        warp_size=prop("warp_size", base.warp_size),
        max_threads_per_sm=prop("max_threads_per_multi_processor", base.max_threads_per_sm),
    )


def current_gpu(arch: str | None = None) -> Gpu:
    """The GPU kernels are compiled for: the table's ``arch`` when one is named; else this machine's
    first CUDA device when torch sees one; else the table's :data:`DEFAULT_ARCH`."""
    if arch is not None:
        return from_arch(arch)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return from_arch()
    if torch.cuda.is_available():  # pragma: no cover - needs a GPU
        return from_properties(torch.cuda.get_device_properties(0))
    return from_arch()
