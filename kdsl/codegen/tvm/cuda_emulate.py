"""The CUDA schedule's arithmetic run on the CPU: every split, ``rfactor`` (split-K), cache and guard of the
GPU schedule applied as for the GPU, but the loops that would be bound to ``blockIdx``/``threadIdx`` left
as serial loops, compiled for LLVM and run on NumPy arrays.

What it checks: that the schedule computes the operator (the slices of a split-K, the chunks staged in
shared memory, the register tiles and their guarded write-back), against kdsl's NumPy reference. What it
cannot check: anything that depends on threads running at once (a race between two threads' stores runs
here one after the other); :mod:`kdsl.codegen.tvm.store_check` checks the stores' index arithmetic for that.

>>> import numpy as np
>>> from kdsl.lang import *
>>> M, C, O = primary("M C O")
>>> op = Input(M, C) >> Share(Weight(C, O, name="w")) >> Reduce(C) >> Output(M, O)
>>> x, w = np.ones((49, 512), "float32"), np.ones((512, 64), "float32")
>>> from kdsl.codegen.tvm.gpu_schedule import GpuConfig
>>> emulate(op, {"M": 49, "C": 512, "O": 64}, x, w, config=GpuConfig(split_k=4))[0, :3]  # 4 slices of 128
array([512., 512., 512.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from kdsl.codegen.tvm.gpu_schedule import GpuConfig, GpuSpace
from kdsl.codegen.tvm.lowering import lower
from kdsl.codegen.tvm.toolchain import load_tvm
from kdsl.lang.operator import Operator
from kdsl.runtime.gpu import DEFAULT_ARCH, from_arch

__all__ = ["emulate"]


def emulate(
    op: Operator,
    binding: Mapping[str, int],
    *arrays: np.ndarray,
    config: GpuConfig | None = None,
    arch: str = DEFAULT_ARCH,
) -> np.ndarray:
    """``op`` at ``binding`` on ``arrays`` (its inputs, then its weights), computed by the GPU schedule at
    ``config`` (default: the heuristic for ``arch``) with its loops serial, on the CPU. Use the config that a
    bundle records (``GpuConfig(**bundle["config"])``) to emulate that bundle's kernels."""
    tvm = load_tvm()
    lowered = lower(op, binding)
    space = GpuSpace(lowered, from_arch(arch), bound=False)
    sch = space.apply(config or space.heuristic())
    executable = tvm.compile(sch.mod, target=tvm.target.Target({"kind": "llvm"}))
    device = tvm.cpu(0)
    dtype = str(lowered.out.dtype)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a, dtype=dtype), device) for a in arrays]
    out = tvm.runtime.empty(lowered.output_shape, dtype, device)
    executable(*args, out)
    return out.numpy()
