"""TVM itself: importing it with this machine's thread settings (or saying how to install it), the
LLVM target of this CPU, and the one informative line of a TVM error."""

from __future__ import annotations

import os
from typing import Any

from kdsl.lang.errors import LoweringError, import_or_explain


def load_tvm() -> Any:
    """Import tvm with this machine's thread settings, or explain how to install it."""
    os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    # Unpinned threads: pinned TVM workers slow PyTorch in the same process (TVM.md), and pinning bought
    # nothing here (syno_op1 at conv3_x timed the same either way; on these VMs a kernel's time drifts
    # by up to 1.5x between processes and minutes whatever the setting: compare alternated runs only).
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    import_or_explain(
        "tvm.te",
        LoweringError,
        "the TVM backend needs apache-tvm",
        "pip install 'kdsl[tvm]' (apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1)",
    )
    import tvm  # imported above, with the te that every caller uses

    return tvm


def error_reason(error: Exception) -> str:
    """The informative line of a (possibly very long) TVM error, at most 300 characters."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Error message:") or ("Error:" in line and "schedule primitive" not in line):
            return line[:300]
    return (lines[-1] if lines else type(error).__name__)[:300]


def default_target(mcpu: str | None = None) -> Any:
    """An LLVM target naming ``mcpu`` (else LLVM emits SSE2 code) and the cores ``TVM_NUM_THREADS`` gives.

    ``mcpu``: an LLVM CPU name (``haswell``, ``znver3``, ``skylake-avx512``); by default the one that
    ``KDSL_MCPU`` names, else this machine's. Code for an older CPU runs here (an AVX-512 machine runs
    ``haswell``'s AVX2 code), so the option measures another ISA's case on one machine; a name LLVM
    does not know is a :class:`~kdsl.lang.errors.LoweringError` naming it."""
    tvm = load_tvm()
    from tvm.target import codegen

    mcpu = mcpu or os.environ.get("KDSL_MCPU") or str(codegen.llvm_get_system_cpu())
    if not codegen.llvm_is_valid_cpu(mcpu, str(codegen.llvm_get_system_triple())):
        raise LoweringError(
            f"mcpu {mcpu!r} is not a CPU LLVM knows for {codegen.llvm_get_system_triple()} "
            f"(e.g. haswell, znver3, skylake-avx512, sapphirerapids; this machine is {codegen.llvm_get_system_cpu()})"
        )
    return tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": int(os.environ["TVM_NUM_THREADS"])})
