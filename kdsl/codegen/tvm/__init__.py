"""The TVM backend: lowering to ``te.compute`` stages, the schedule space, the default schedule.

``lowering`` turns an operator bound to a layer into TE stages (one rule per node kind in
``node_rules.GRAPH_RULES``; a chain node lowers its linear chain by ``chain_stages``); ``toolchain``
loads TVM and makes the CPU target; ``blocks`` analyses each stage's
TIR block once for every schedule rule; ``schedule_space`` is the
space of schedules the tuners search (its typed ``parameters``; ``schedule_apply`` applies a configuration
as schedule primitives); ``default_schedule`` applies the space's rule-based
configuration; ``gpu_schedule`` and ``cuda`` are the CUDA path (GPU schedule and space, CUDA kernel
bundles; the GPU description is :mod:`kdsl.runtime.gpu`); ``kernel`` compiles a kernel callable on
torch tensors (``build``), and ``load`` makes one of the shared library that ``kdsl tune --apply
--out`` or ``Kernel.export`` writes.
"""

from kdsl.codegen.tvm.blocks import invertible_copy
from kdsl.codegen.tvm.chain_stages import StageInfo
from kdsl.codegen.tvm.cuda import cuda_bundle, cuda_source, cuda_target
from kdsl.codegen.tvm.kernel import Kernel, build, description_path, load, source, write_description
from kdsl.codegen.tvm.lowering import Lowered, lower
from kdsl.codegen.tvm.node_rules import GRAPH_RULES
from kdsl.codegen.tvm.toolchain import default_target, error_reason, load_tvm

__all__ = [
    "GRAPH_RULES",
    "Kernel",
    "Lowered",
    "StageInfo",
    "build",
    "cuda_bundle",
    "cuda_source",
    "cuda_target",
    "default_target",
    "description_path",
    "error_reason",
    "invertible_copy",
    "load",
    "load_tvm",
    "lower",
    "source",
    "write_description",
]
