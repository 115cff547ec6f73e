"""Session 45: one packing copy alone (a weight [K, N] into [N/T, K, T]) in several loop orders, timed in
alternation: python pack_pass_orders.py K N [T]."""

import os
import sys
import time

os.environ.setdefault("TVM_NUM_THREADS", "2")
import numpy as np
import tvm
from tvm import te
from tvm.s_tir import Schedule
from tvm.target import codegen

K, N, T = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 32
tgt = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(), "num-cores": 2})
W = te.placeholder((K, N), "float32", name="w")
P = te.compute((N // T, K, T), lambda a, k, t: W[k, a * T + t], name="P")


def build(order, rb=8):
    sch = Schedule(te.create_prim_func([W, P]))
    b = sch.get_sblock("P")
    a, k, t = sch.get_loops(b)
    if order == "panel":  # a outer, k inner (current)
        sch.parallel(sch.fuse(a, k))
        sch.vectorize(t)
    elif order == "row":  # k outer, a inner
        sch.reorder(k, a, t)
        sch.parallel(sch.fuse(k, a))
        sch.vectorize(t)
    elif order == "block":  # k in blocks of rb rows; within a block all panels
        k0, k1 = sch.split(k, [None, rb])
        sch.reorder(k0, a, k1, t)
        sch.parallel(k0)
        sch.vectorize(t)
    elif order == "block2":
        k0, k1 = sch.split(k, [None, rb])
        sch.reorder(k0, k1, a, t)
        sch.parallel(k0)
        sch.vectorize(t)
    return tvm.compile(sch.mod, target=tgt)


w = tvm.runtime.tensor(np.random.randn(K, N).astype("float32"))
p = tvm.runtime.tensor(np.zeros((N // T, K, T), "float32"))
res = {}
kinds = [("panel", 0), ("row", 0), ("block", 8), ("block", 32), ("block", 128), ("block2", 16)]
fs = {f"{o}{rb or ''}": build(o, rb) for o, rb in kinds}
for f in fs.values():
    f(w, p)
    assert np.array_equal(p.numpy()[1, :, 3], w.numpy()[:, T + 3])
for _r in range(5):
    for name, f in fs.items():
        t0 = time.perf_counter()
        for _ in range(50):
            f(w, p)
        res[name] = min(res.get(name, 9), (time.perf_counter() - t0) / 50)
print({k: "%.3f ms" % (v * 1e3) for k, v in res.items()})
