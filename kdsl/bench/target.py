"""The target option (``--mcpu``) of ``kdsl bench codegen``, ``kdsl bench tune`` and ``kdsl tune``, and
the lines that name the machine a benchmark's kernels were compiled for.

Every TVM compile goes through :func:`~kdsl.codegen.tvm.default_target`, which reads ``KDSL_MCPU``;
:func:`select_mcpu` checks the name and sets that variable in the command's process before any worker
starts, and the workers (spawned processes and subprocesses) inherit it. So ``--mcpu haswell`` on an
AVX-512 machine measures AVX2 code end to end: the default schedule, every tuner, the re-measurements.

Speeds are reported as percent of the FMA peak measured on that machine (:func:`measured_peak_gflops`;
the line also gives the peak its nominal clock implies,
:meth:`~kdsl.runtime.cpu.Machine.peak_gflops`); a multiply-accumulate is two flops:

>>> percent_of_peak(macs=1e9, seconds=0.01, peak_gflops=400.0)  # 1 GMAC in 10 ms: 200 GFLOP/s
50.0
"""

from __future__ import annotations

import argparse
import os

from kdsl.bench.peak import measure_fma
from kdsl.codegen.tvm import default_target, load_tvm
from kdsl.codegen.tvm.machine import current_machine
from kdsl.runtime.cpu import Machine

__all__ = [
    "MCPU_HELP",
    "add_mcpu_argument",
    "host_mcpu",
    "machine_line",
    "measured_peak_gflops",
    "percent_of_peak",
    "pytorch_environment",
    "pytorch_note",
    "select_mcpu",
]

MCPU_HELP = (
    "compile for this LLVM CPU (haswell, znver3: AVX2; skylake-avx512: AVX-512); default: this machine's "
    "(an AVX-512 machine runs AVX2 code, so an AVX2 mcpu measures the AVX2 case here)"
)


def add_mcpu_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--mcpu NAME`` (:data:`MCPU_HELP`); the command calls :func:`select_mcpu` with it.

    >>> parser = argparse.ArgumentParser(); add_mcpu_argument(parser)
    >>> parser.parse_args(["--mcpu", "haswell"]).mcpu
    'haswell'
    """
    parser.add_argument("--mcpu", metavar="NAME", help=MCPU_HELP)


def select_mcpu(mcpu: str | None) -> None:
    """Compile for ``mcpu`` from now on, in this process and in every worker it starts afterwards.

    A name LLVM does not know raises :class:`~kdsl.lang.errors.LoweringError` naming it, before anything
    is set (so a command refuses it before it tunes or measures anything); ``None`` changes nothing.
    """
    if mcpu is None:
        return
    default_target(mcpu)  # raises on an unknown name
    os.environ["KDSL_MCPU"] = mcpu


def host_mcpu() -> str:
    """LLVM's name for this machine's CPU (what the kernels are compiled for without ``--mcpu``)."""
    load_tvm()
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu())


def percent_of_peak(macs: float, seconds: float, peak_gflops: float) -> float:
    """``macs`` multiply-accumulates in ``seconds``, as percent of ``peak_gflops`` (two flops per MAC)."""
    return 100.0 * 2.0 * macs / seconds / 1e9 / peak_gflops


def machine_line(machine: Machine | None = None, measured: float | None = None) -> str:
    """A benchmark's header line: the machine its kernels are compiled for (by default
    :func:`~kdsl.codegen.tvm.machine.current_machine`'s, which honours ``--mcpu``), the peak it
    assumes from its nominal clock and, when given, the FMA peak measured on it
    (:func:`measured_peak_gflops`), which the "% of peak" columns then refer to."""
    line = f"machine: {(machine or current_machine()).describe()}"
    if measured is not None:
        line += f"; measured FMA peak {measured:.0f} GFLOP/s (the % of peak columns use it)"
    return line


def measured_peak_gflops(machine: Machine | None = None, repeats: int = 15) -> float:
    """The fp32 FMA throughput of ``machine``'s cores as measured here (GFLOP/s): the best of
    ``repeats`` timings of kernels that do nothing but independent FMAs in registers
    (:func:`kdsl.bench.peak.measure_fma`). Turbo clocks make it differ from
    :meth:`~kdsl.runtime.cpu.Machine.peak_gflops`, which assumes the nominal clock, so
    benchmarks report percent of this practical ceiling instead. It is a measurement, not a bound: the
    clock boosts differently from run to run, and a tuned conv2d has timed 2% above it (each FMA here
    waits for a broadcast load; a kernel reusing loaded values leaves the load ports freer). A timing:
    benchmarks call it, tests do not."""
    return measure_fma(machine or current_machine(), repeats=repeats).best


#: what PyTorch's libraries are told to use at most, per kdsl ISA: oneDNN (convolutions), MKL (matmul)
#: and ATen's own vectorized kernels each read their own variable
PYTORCH_ISA = {
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "avx": {"ONEDNN_MAX_CPU_ISA": "AVX", "MKL_ENABLE_INSTRUCTIONS": "AVX", "ATEN_CPU_CAPABILITY": "default"},
    "sse": {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ATEN_CPU_CAPABILITY": "default"},
}


def pytorch_environment(machine: Machine | None = None) -> dict[str, str]:
    """Environment variables that hold PyTorch's baseline to the ISA the kernels are compiled for, when
    that is narrower than this machine's (``--mcpu haswell`` on an AVX-512 machine: PyTorch runs its
    AVX2 kernels too, so the ratio compares like with like); empty otherwise.

    >>> from kdsl.runtime.cpu import from_features
    >>> pytorch_environment(from_features("haswell", {"avx2", "fma"}, cores=2, ghz=3.0))["ONEDNN_MAX_CPU_ISA"]
    'AVX2'
    """
    return dict(PYTORCH_ISA.get((machine or current_machine()).isa, {}))  # AVX-512: not capped


def pytorch_note(machine: Machine | None = None) -> str | None:
    """When the kernels are compiled for another CPU than this machine's: how PyTorch's baseline was held
    to the same ISA (:func:`pytorch_environment`), or why it could not be; else ``None``."""
    machine = machine or current_machine()
    host = host_mcpu()
    if machine.mcpu == host:
        return None
    capped = pytorch_environment(machine)
    if capped:
        told = ", ".join(f"{k}={v}" for k, v in capped.items())
        return (
            f"kdsl's kernels are compiled for mcpu {machine.mcpu} on this {host} machine; PyTorch's baseline "
            f"ran with {told}, so it too uses {machine.isa.upper()} kernels"
        )
    return (
        f"kdsl's kernels are compiled for mcpu {machine.mcpu} on this {host} machine; PyTorch picks its own "
        f"kernels for this machine's ISA whatever --mcpu says, so its % of peak (against the same "
        f"{machine.mcpu} peak) may exceed what {machine.mcpu}'s ISA allows"
    )
