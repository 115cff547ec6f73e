"""Time a TVM kernel that only writes a float32 output against PyTorch's ``fill_`` of it, side by side in one process.

The output write bounds thin products (Gensor's U3: 16384x1024 float32, 64 MiB, after a reduction of 32). Each
variant fills the same tensor with a constant: ``pT xL`` runs ``T`` parallel tasks (contiguous row blocks) that
store ``L``-lane vectors; ``il`` interleaves the rows between the tasks. Rounds alternate the order; the best
median of each is printed with its ratio to ``fill_``::

    PYTHONPATH=. python scripts/write_probe.py --rows 16384 --cols 1024 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TVM_NUM_THREADS", "2")
os.environ.setdefault("TVM_BIND_THREADS", "0")


def fill_kernel(tvm, rows: int, cols: int, lanes: int, tasks: int, interleave: bool, mcpu: str):
    """A compiled ``f(b)`` that sets every element of ``b`` (``rows x cols`` float32) to 2."""
    from tvm.script import tirx as T

    block = rows // tasks

    @T.prim_func
    def fill(b: T.Buffer((rows, cols), "float32")):
        T.func_attr({"global_symbol": "f", "tir.noalias": True})
        for task in T.parallel(tasks):
            for i in range(block):
                for j in range(cols // lanes):
                    row = i * tasks + task if interleave else task * block + i
                    b[row, T.Ramp(j * lanes, 1, lanes)] = T.Broadcast(T.float32(2), lanes)

    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": int(os.environ["TVM_NUM_THREADS"])})
    return tvm.compile(tvm.IRModule({"f": fill}), target=target)["f"]


def main() -> None:
    """Parse the sizes, build the variants, time them against ``fill_`` in alternation and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default="p2x8,p2x16,p2x32,p64x8,p64x16,p2x16il,p1x16")
    args = parser.parse_args()
    import numpy as np
    import torch
    import tvm
    from tvm.target import codegen

    torch.set_num_threads(int(os.environ["TVM_NUM_THREADS"]))
    mcpu = codegen.llvm_get_system_cpu()
    out = torch.empty(args.rows, args.cols)
    calls = {}
    for name in args.variants.split(","):
        tasks, lanes = name[1:].removesuffix("il").split("x")
        kernel = fill_kernel(tvm, args.rows, args.cols, int(lanes), int(tasks), name.endswith("il"), mcpu)
        calls[name] = lambda kernel=kernel: kernel(out)
        calls[name]()
        assert bool((out == 2).all()), name
        out.zero_()
    calls["torch.fill_"] = lambda: out.fill_(2.0)
    best = dict.fromkeys(calls, float("inf"))
    for r in range(args.rounds):
        for name in list(calls) if r % 2 == 0 else list(calls)[::-1]:
            times = []
            for _ in range(10):
                start = time.perf_counter()
                calls[name]()
                times.append(time.perf_counter() - start)
            best[name] = min(best[name], float(np.median(times)))
    size = args.rows * args.cols * 4
    print(f"{mcpu}, {os.environ['TVM_NUM_THREADS']} threads, torch {torch.backends.cpu.get_cpu_capability()}")
    for name, seconds in best.items():
        ratio = seconds / best["torch.fill_"]
        print(f"{name:12s} {seconds * 1e3:7.2f} ms {size / seconds / 1e9:6.1f} GB/s  /fill_ {ratio:.2f}")


if __name__ == "__main__":
    main()
