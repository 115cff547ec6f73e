"""Session 45: the whole default kernel with the new packing-copy order against version 14's order patched in
(the same configuration), and PyTorch: python pack_order_compare.py OPERATOR LAYER_JSON [OVERRIDES_JSON]; prints
the best median ms of [new, old order, PyTorch]. Run it through in_processes.py for fresh processes."""

# ruff: noqa: E402
import json
import os
import sys

os.environ.update(TVM_NUM_THREADS=os.environ.get("NT", "2"), TVM_BIND_THREADS="0")
import torch

torch.set_num_threads(int(os.environ.get("NT", "2")))
from kdsl import gallery, solve
from kdsl.codegen.native import native_function
from kdsl.codegen.tvm import build
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.runtime.timing import median_seconds, round_order

name = sys.argv[1]
layer = json.loads(sys.argv[2])
op = gallery.load(name)
overrides = [json.loads(s) for s in sys.argv[3:]]


def sched(over):
    def s(lowered):
        space = ScheduleSpace(lowered)
        c = space.heuristic()
        if True:
            print({k: v for k, v in c.items() if v != space.identity_value(k)})
        c.update(over or {})
        return space.apply(c, fallback=True)

    return s


import kdsl.codegen.tvm.pack_inside as pi

base = overrides[0] if overrides else {}
new_k = build(op, layer, schedule=sched(base))


def old_order(sch, by_dim, perm, tiled, inner):
    ordered = [by_dim[d] for d in perm if by_dim[d] is not None] + ([inner] if inner is not None else [])
    if len(ordered) > 1:
        sch.reorder(*ordered)
    return ordered


keep = pi.copy_order
pi.copy_order = old_order
old_k = build(op, layer, schedule=sched(base))
pi.copy_order = keep
kernels = [new_k, old_k]
k = kernels[0]
torch.manual_seed(0)
ins = [torch.randn(s) for s in k.input_shapes]
ws = [torch.randn(s) for s in k.weight_shapes]
outs = [torch.empty(k.output_shape) for _ in kernels]
x = ins[0] if len(ins) == 1 else tuple(ins)
tc = native_function(name, x, ws, dict(solve.bind(op, layer)))
calls = [lambda k=k, o=o: k.executable(*ins, *ws, o) for k, o in zip(kernels, outs)] + [tc]
for c in calls:
    c()
ref = tc()
for o in outs:
    assert torch.allclose(o, ref, atol=1e-2, rtol=1e-3), float((o - ref).abs().max())
best = [1e9] * len(calls)
for r in range(int(os.environ.get("ROUNDS", 4))):
    for i in round_order(len(calls), r):
        best[i] = min(best[i], median_seconds(calls[i], repeats=5, warmup=2))
print(["%.3f" % (b * 1e3) for b in best])
