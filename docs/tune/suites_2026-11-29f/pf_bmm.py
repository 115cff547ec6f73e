"""Scratch (session 51): does software prefetch of the next batch close BMM1's wait on memory? The default
schedule's TIR (space version 15) by hand, "pf" with each task prefetching one row of x and of x_b of batch
b + AHEAD (LOC: llvm.prefetch's locality, 3 = L1 ... 0 = none), "pfw" also a row of the output (for writing).
The prototype of kdsl/codegen/tvm/prefetch.py. ASM=1 prints the code around the prefetches.
Run from the repository root: PYTHONPATH=. python docs/tune/suites_2026-11-29f/pf_bmm.py"""
import os, sys, statistics
os.environ.setdefault("TVM_NUM_THREADS", "2"); os.environ["TVM_BIND_THREADS"] = "0"
import numpy as np
import tvm
from tvm.script import ir as I, tirx as T
from kdsl.codegen.tvm.toolchain import default_target

LOC = int(os.environ.get("LOC", "2"))
AHEAD = int(os.environ.get("AHEAD", "1"))

def make(prefetch: bool, write_pf: bool):
    @I.ir_module
    class Module:
        @T.prim_func(s_tir=True)
        def main(x: T.Buffer((960, 128, 128), "float32"), x_b: T.Buffer((960, 128, 64), "float32"), out: T.Buffer((960, 128, 64), "float32")):
            T.func_attr({"tirx.noalias": True})
            for f in T.parallel(122880):
                if prefetch:
                    for c in range(8):
                        T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(x[T.min(f // 128 + AHEAD, 959), f % 128, c * 16]), 0, LOC, 1))
                    for c in range(4):
                        T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(x_b[T.min(f // 128 + AHEAD, 959), f % 128, c * 16]), 0, LOC, 1))
                    if write_pf:
                        for c in range(4):
                            T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(out[T.min(f // 128 + AHEAD, 959), f % 128, c * 16]), 1, LOC, 1))
                for i1_1_init in T.unroll(4):
                    for i2_1_init in T.vectorized(16):
                        with T.sblock("init"):
                            v_i0 = T.axis.spatial(960, f // 128)
                            v_i1 = T.axis.spatial(128, f % 128 // 4 * 4 + i1_1_init)
                            v_i2 = T.axis.spatial(64, f % 4 * 16 + i2_1_init)
                            T.reads()
                            T.writes(out[v_i0, v_i1, v_i2])
                            out[v_i0, v_i1, v_i2] = T.float32(0.0)
                for r_K_0 in range(32):
                    for r_K_1 in T.unroll(4):
                        for i1_1 in T.unroll(4):
                            for i2_1 in T.vectorized(16):
                                with T.sblock("update"):
                                    v_i0 = T.axis.spatial(960, f // 128)
                                    v_i1 = T.axis.spatial(128, f % 128 // 4 * 4 + i1_1)
                                    v_i2 = T.axis.spatial(64, f % 4 * 16 + i2_1)
                                    v_r_K = T.axis.reduce(128, r_K_0 * 4 + r_K_1)
                                    T.reads(out[v_i0, v_i1, v_i2], x[v_i0, v_i1, v_r_K], x_b[v_i0, v_r_K, v_i2])
                                    T.writes(out[v_i0, v_i1, v_i2])
                                    out[v_i0, v_i1, v_i2] = out[v_i0, v_i1, v_i2] + x[v_i0, v_i1, v_r_K] * x_b[v_i0, v_r_K, v_i2]
    return Module

target = default_target()
if os.environ.get("ASM"):
    asm = tvm.compile(make(True, False), target=target).mod.inspect_source("s")
    L = asm.splitlines(); idx = [i for i, l in enumerate(L) if "prefetch" in l]
    print(len(idx), "prefetch lines"); i0 = idx[0] if idx else 0
    print("\n".join(L[max(0, i0 - 30):i0 + 40])); sys.exit()
fs = {name: tvm.compile(make(p, w), target=target) for name, p, w in [("base", False, False), ("pf", True, False), ("pfw", True, True)]}
dev = tvm.cpu()
rng = np.random.default_rng(0)
a = rng.standard_normal((960, 128, 128), dtype=np.float32); b = rng.standard_normal((960, 128, 64), dtype=np.float32)
ta, tb = tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev)
outs = {n: tvm.runtime.tensor(np.zeros((960, 128, 64), np.float32), dev) for n in fs}
ref = a @ b
import time
times = {n: [] for n in fs}
for n, f in fs.items():
    f["main"](ta, tb, outs[n]); np.testing.assert_allclose(outs[n].numpy(), ref, rtol=1e-3, atol=1e-3)
for r in range(int(os.environ.get("ROUNDS", "15"))):
    for n, f in fs.items():
        t = time.perf_counter(); f["main"](ta, tb, outs[n]); times[n].append(time.perf_counter() - t)
for n in fs:
    print(n, f"{statistics.median(times[n])*1e3:.3f} ms", f"/base {statistics.median(times[n])/statistics.median(times['base']):.3f}")
