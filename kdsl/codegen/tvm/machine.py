"""The CPU description of a TVM target: LLVM's features for the target's ``mcpu``, read through TVM,
plus the host's clock, caches and model, made into a :class:`kdsl.runtime.cpu.Machine`.

Everything that needs no TVM (the :class:`~kdsl.runtime.cpu.Machine` dataclass, the tables, the host
probing, :func:`~kdsl.runtime.cpu.from_features`) is in :mod:`kdsl.runtime.cpu`; this module is the
one TVM-reading function on top of it.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from kdsl.codegen.tvm.toolchain import default_target, load_tvm
from kdsl.runtime.cpu import Machine, from_features, host_caches, host_ghz, host_model

__all__ = ["current_machine"]


@functools.lru_cache(maxsize=16)
def _machine(mcpu: str, cores: int) -> Machine:
    tvm = load_tvm()
    from tvm.target import codegen

    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": cores})
    features = {str(name) for name in codegen.llvm_get_cpu_features(target)}
    return from_features(mcpu, features, cores=cores, ghz=host_ghz(), caches=host_caches(), model=host_model())


def current_machine(target: Any = None) -> Machine:
    """The machine of ``target`` (an LLVM target), by default :func:`~kdsl.codegen.tvm.toolchain.default_target`'s:
    the host, or the ``mcpu`` that ``KDSL_MCPU`` names. Cached per ``mcpu`` and core count."""
    if target is None:
        target = default_target()
    mcpu = str(target.attrs.get("mcpu", "")) or "generic"
    cores = int(target.attrs.get("num-cores", 0) or os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))
    return _machine(mcpu, cores)
