"""Scratch: GEMM C[M,N] = A[M,K] @ W[K,N], W packed [N//16, K, 16], register tile R x 16 (R rows of A
broadcast, 2 ymm of W), tail rows by a non-dividing split + loop partition."""
import os, sys, time
os.environ.setdefault("TVM_NUM_THREADS", "2")
import numpy as np, tvm
from tvm import te
from tvm.s_tir import Schedule
from tvm.target import codegen
M, N, K = (int(x) for x in sys.argv[1:4])
rows_list = [int(x) for x in sys.argv[4].split(",")]
NV = 16
A = te.placeholder((M, K), "float32", name="A")
Wp = te.placeholder((N // NV, K, NV), "float32", name="Wp")
k = te.reduce_axis((0, K), name="k")
C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * Wp[j // NV, k, j % NV], axis=k), name="C")
f = te.create_prim_func([A, Wp, C])
tgt = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(), "num-cores": 2})

def build(R, KU=4):
    sch = Schedule(f); blk = sch.get_sblock("C"); i, j, kk = sch.get_loops(blk)
    i0, i1 = sch.split(i, [None, R])
    j0, j1 = sch.split(j, [None, NV])
    k0, k1 = sch.split(kk, [None, KU])
    sch.reorder(j0, i0, k0, k1, i1, j1)
    cw = sch.cache_write(blk, 0, "local"); sch.reverse_compute_at(cw, i0)
    sch.parallel(sch.fuse(j0, i0) if False else j0)
    sch.unroll(k1); sch.unroll(i1); sch.vectorize(j1)
    init = sch.decompose_reduction(blk, k0); sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(sch.get_loops(cw)[-1])
    with tvm.transform.PassContext(config={"s_tir.LoopPartition": {"partition_const_loop": True}}):
        return tvm.compile(sch.mod, target=tgt), sch

rng = np.random.default_rng(0)
a = rng.standard_normal((M, K), dtype=np.float32); w = rng.standard_normal((K, N), dtype=np.float32)
wp = np.ascontiguousarray(w.reshape(K, N // NV, NV).transpose(1, 0, 2))
ref = a @ w
dev = tvm.cpu()
ta, tw = tvm.runtime.tensor(a, dev), tvm.runtime.tensor(wp, dev)
res = {}
for R in rows_list:
    ex, sch = build(R)
    tc = tvm.runtime.tensor(np.zeros((M, N), np.float32), dev)
    ex["main"](ta, tw, tc)
    err = np.abs(tc.numpy() - ref).max(); assert err < 1e-2, (R, err)
    res[R] = (ex, tc)
import torch
at, wt = torch.from_numpy(a), torch.from_numpy(w)
calls = {R: (lambda e=e, c=c: e["main"](ta, tw, c)) for R, (e, c) in res.items()}
calls["torch"] = lambda: at @ wt
times = {n: [] for n in calls}
for _ in range(2):
    for c in calls.values(): c()
for _ in range(int(os.environ.get("PAIRS", 7))):
    for n, c in calls.items():
        t0 = time.perf_counter(); c(); times[n].append(time.perf_counter() - t0)
base = np.median(times[rows_list[0]])
for n, t in times.items():
    med = np.median(t); print(f"{n!s:6} {med*1e3:8.3f} ms  /{rows_list[0]} {med/base:.3f}  {2*M*N*K/med/1e9:6.1f} GFLOP/s")
