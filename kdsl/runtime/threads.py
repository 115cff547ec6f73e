"""Thread settings for a worker process in which TVM's kernels and PyTorch share the cores.

TVM and PyTorch each keep a pool of threads. By default TVM pins its threads to cores, which slows
PyTorch in the same process (``TVM.md``), and after a parallel kernel TVM's idle threads spin, waiting for
the next one, while PyTorch's operators between the kernels want the same cores. In a ResNet-18 of kdsl's
conv2d kernels with PyTorch's glue (``kdsl tune --network``, 2 threads on 2 cores, batch 1) the network
took 2.8x PyTorch's time with both pools spinning and 1.7x with TVM's threads sleeping at once
(``TVM_THREAD_POOL_SPIN_COUNT=0``); docs/network.md has the runs.

>>> env = shared_process_environment(2, base={})
>>> env["TVM_NUM_THREADS"], env["OMP_NUM_THREADS"], env["TVM_BIND_THREADS"], env["TVM_THREAD_POOL_SPIN_COUNT"]
('2', '2', '0', '0')
>>> shared_process_environment(1, base={"TVM_THREAD_POOL_SPIN_COUNT": "1000"})["TVM_THREAD_POOL_SPIN_COUNT"]
'1000'
>>> "TVM_THREAD_POOL_SPIN_COUNT" in shared_process_environment(1, base={}, sleeping=False)
False
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["shared_process_environment"]


def shared_process_environment(
    threads: int, base: Mapping[str, str] | None = None, *, sleeping: bool = True
) -> dict[str, str]:
    """The environment (``base``, default ``os.environ``) of a worker that runs TVM kernels among PyTorch
    operators on ``threads`` threads each: TVM's threads unpinned and, with ``sleeping``, sleeping as soon
    as a kernel ends (a spin count the caller's environment sets is kept). The kernel benches keep TVM's
    spinning (``sleeping=False``): their alternating ratios showed no bias from it (docs/network.md)."""
    environment = dict(os.environ if base is None else base)
    environment.update(TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads), TVM_BIND_THREADS="0")
    if sleeping:
        environment.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
    return environment
