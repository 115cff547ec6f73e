"""Scratch (session 50): time one compiled Gensor C1 library (argv[1]) alone, by direct calls and TVM's
time_evaluator, the way the suite's measurer does; run in fresh processes under different TVM thread settings."""
import os, sys, time, numpy as np
os.environ.setdefault("TVM_NUM_THREADS", "2")
from kdsl import gallery
from kdsl.codegen.tvm.toolchain import load_tvm

tvm = load_tvm()
path = sys.argv[1]
layer = {"N": 128, "Cin": 256, "Cout": 256, "H": 30, "W": 30, "Ho": 14, "Wo": 14, "K": 3, "s": 2}
op = gallery.load("alexnet_c1")
from kdsl.codegen import reference
x, ws = reference.random_inputs(op, layer, dtype=np.float32)
dev = tvm.cpu(0)
args = [tvm.runtime.tensor(a, dev) for a in (x, *ws)]
out = tvm.runtime.empty((128, 256, 14, 14), "float32", dev)
m = tvm.runtime.load_module(path)
m["main"](*args, out)
for i in range(4):
    t = time.perf_counter(); m["main"](*args, out); print("call", round((time.perf_counter() - t) * 1e3, 1), "ms", flush=True)
ev = m.time_evaluator("main", dev, number=1, repeat=4)
print("time_evaluator", [round(r * 1e3, 1) for r in ev(*args, out).results])
