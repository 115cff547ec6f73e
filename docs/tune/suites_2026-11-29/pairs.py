"""Paired timing of a gallery operator at a layer: the heuristic's kernel, kernels with configuration overrides
(JSON objects), and PyTorch's function, in REPS interleaved rounds of back-to-back calls (TARGET seconds of calls
each); prints each kernel's median ms and the quartiles of its rounds' ratios to PyTorch and to the heuristic::

    REPS=4 TARGET=0.01 PYTHONPATH=. python docs/tune/suites_2026-11-29/pairs.py matmul \
        '{"M": 8192, "Cin": 8192, "Cout": 8192}' '{"layout.x.tile": "none"}'

(session 46's M1 runs compared the heuristic of the commit before the rule against ``{"layout.x.tile": "0:8"}``;
after it, the heuristic packs and ``"none"`` is the old layout). NT sets the threads (2). As run in session 46
both thread pools spin after their calls (no ``TVM_THREAD_POOL_SPIN_COUNT=0``, ``OMP_WAIT_POLICY=PASSIVE``): its
ratios between kernels share that, its ratios to PyTorch are biased against the kernels (README.md, "Why the
pairs' pools sleep"); ``scripts/heuristic_compare.py --pairs`` sets both.
"""
import os, sys, json, statistics
os.environ.update(TVM_NUM_THREADS=os.environ.get("NT","2"), TVM_BIND_THREADS="0")
import torch; torch.set_num_threads(int(os.environ.get("NT","2")))
from kdsl import gallery, solve
from kdsl.codegen.tvm import build
from kdsl.codegen.native import native_function
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.runtime.timing import interleaved_samples
name = sys.argv[1]; layer = json.loads(sys.argv[2])
op = gallery.load(name)
overrides = [json.loads(s) for s in sys.argv[3:]]
def sched(over):
    def s(lowered):
        space = ScheduleSpace(lowered)
        c = space.heuristic(); c.update(over or {})
        return space.apply(c, fallback=True)
    return s
kernels = [build(op, layer, schedule=sched(None))] + [build(op, layer, schedule=sched(o)) for o in overrides]
k = kernels[0]
torch.manual_seed(0)
ins = [torch.randn(s) for s in k.input_shapes]; ws = [torch.randn(s) for s in k.weight_shapes]
outs = [torch.empty(k.output_shape) for _ in kernels]
x = ins[0] if len(ins) == 1 else tuple(ins)
tc = native_function(name, x, ws, dict(solve.bind(op, layer)))
calls = [lambda k=k, o=o: k.executable(*ins, *ws, o) for k, o in zip(kernels, outs)] + [tc]
for c in calls: c()
ref = tc()
for o in outs: assert torch.allclose(o, ref, atol=1e-2, rtol=1e-3), float((o-ref).abs().max())
S = interleaved_samples(calls, repeats=int(os.environ.get("REPS", 15)), target=float(os.environ.get("TARGET", 0.05)), warmup=2)
def q(v): v = sorted(v); n = len(v); return v[n//4], statistics.median(v), v[(3*n)//4]
print("median ms", ["%.3f" % (statistics.median(s)*1e3) for s in S])
for i in range(len(kernels)):
    r = [a/b for a, b in zip(S[i], S[-1])]; r0 = [a/b for a, b in zip(S[i], S[0])]
    print(i, "t/torch q1 med q3 %.3f %.3f %.3f" % q(r), "  t/heur %.3f %.3f %.3f" % q(r0))
