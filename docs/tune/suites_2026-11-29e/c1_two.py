"""Scratch (session 50): build()'s Gensor C1 kernel against a compiled library (argv[1]), interleaved pairs.
scripts/metaschedule_side_by_side.py does the same for any libraries (best-of-rounds medians, PyTorch beside
them); use it rather than this file, which records the ratio-of-pairs run quoted in measurements.txt."""
import os, sys, statistics
os.environ.setdefault("TVM_NUM_THREADS", "2"); os.environ["TVM_BIND_THREADS"] = "0"
import torch
from kdsl import gallery
from kdsl.codegen.tvm import build, load_tvm
from kdsl.runtime.timing import interleaved_samples, ratio_of_pairs
tvm = load_tvm()
layer = {"N": 128, "Cin": 256, "Cout": 256, "H": 30, "W": 30, "Ho": 14, "Wo": 14, "K": 3, "s": 2}
op = gallery.load("alexnet_c1")
k = build(op, layer)
f = tvm.runtime.load_module(sys.argv[1])["main"]
torch.manual_seed(0)
xs = [torch.randn(s) for s in k.input_shapes]; ws = [torch.randn(s) for s in k.weight_shapes]
o1, o2 = torch.empty(k.output_shape), torch.empty(k.output_shape)
calls = [lambda: k.executable(*xs, *ws, o1), lambda: f(*xs, *ws, o2)]
calls[0](); calls[1](); print("max diff", float((o1 - o2).abs().max()))
s = interleaved_samples(calls, repeats=6, warmup=1)
print("build()", round(statistics.median(s[0]) * 1e3, 1), "suite .so", round(statistics.median(s[1]) * 1e3, 1), "ratio so/build", round(ratio_of_pairs(s[1], s[0]), 3))
