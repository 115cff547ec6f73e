"""The TVM backend: lowering to ``te.compute`` stages, the schedule space, the default schedule.

``lowering`` turns an operator bound to a layer into TE stages; ``schedule_space`` is the typed
space of schedules the tuners search; ``default_schedule`` applies the space's rule-based
configuration. ``build`` compiles a kernel callable on torch tensors.
"""

from kdsl.codegen.tvm.lowering import (
    Kernel,
    Lowered,
    StageInfo,
    build,
    default_target,
    error_reason,
    load_tvm,
    lower,
    source,
)

__all__ = ["Kernel", "Lowered", "StageInfo", "build", "default_target", "error_reason", "load_tvm", "lower", "source"]
