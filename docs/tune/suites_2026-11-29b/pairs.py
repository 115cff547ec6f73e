"""Scratch: time the heuristic default against variants (config overrides) and PyTorch, in interleaved pairs.
usage: python pairs.py LABEL [--pairs N] [--variant 'k=v;k2=v2' ...] [--show]
values are JSON (fall back to string). LABEL: a suite case, `op@table#i`, or `op@{"dim": size, ...}` (session 48);
a variant `PATCH=module:Class.method` computes the heuristic with that method a no-op (session 48)."""
import argparse, json, os, statistics, sys
os.environ.setdefault("TVM_NUM_THREADS", "2"); os.environ["TVM_BIND_THREADS"] = "0"
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0"); os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, "/work/main/scripts"); sys.path.insert(0, os.getcwd())
import heuristic_compare as hc
import torch
from kdsl import gallery, solve
from kdsl.codegen.native import has_native, native_function
from kdsl.codegen.tvm import build
from kdsl.codegen.tvm.lowering import lower
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.runtime.timing import interleaved_samples, ratio_of_pairs

p = argparse.ArgumentParser()
p.add_argument("label"); p.add_argument("--pairs", type=int, default=10)
p.add_argument("--variant", action="append", default=[]); p.add_argument("--show", action="store_true")
a = p.parse_args()
if "@{" in a.label:
    name, js = a.label.split("@", 1); layer = json.loads(js)
elif "@" in a.label:
    from kdsl.solve.layers import load_layers
    name, rest = a.label.split("@"); table, i = rest.split("#"); layer = load_layers(table)[int(i)]
else:
    name, layer = hc.case_table([a.label])[a.label]
op = gallery.load(name)
space = ScheduleSpace(lower(op, layer))
base = space.heuristic()
if a.show:
    for k, v in base.items():
        if v != space.identity_value(k): print(f"  {k} = {v!r}")
def parse(s):
    out = {}
    for part in filter(None, s.split(";")):
        k, v = part.split("=", 1)
        try: out[k.strip()] = json.loads(v)
        except Exception: out[k.strip()] = v.strip()
    return out
variants = [("default", {})] + [(v, parse(v)) for v in a.variant]
def sched(over):
    def s(lowered):
        over2 = dict(over); patch = over2.pop("PATCH", None)
        sp = ScheduleSpace(lowered)
        if patch:  # PATCH=module:Class.method -> a no-op while the heuristic is computed
            import importlib, unittest.mock as um
            mod, attr = patch.split(":"); cls, meth = attr.split(".")
            with um.patch.object(getattr(importlib.import_module(mod), cls), meth, lambda *a, **k: None):
                c = dict(sp.heuristic())
        else:
            c = dict(sp.heuristic())
        c.update(over2)
        if a.show and over: print("  variant", {k: v for k, v in c.items() if v != base.get(k)})
        return sp.apply(c, fallback=False)
    return s
kernels = [build(op, layer, schedule=sched(o)) for _, o in variants]
torch.manual_seed(0)
k = kernels[0]
inputs = [torch.randn(s) for s in k.input_shapes]; ws = [torch.randn(s) for s in k.weight_shapes]
x = inputs[0] if len(inputs) == 1 else tuple(inputs)
args = (*inputs, *ws)
outs = [torch.empty(k.output_shape) for _ in kernels]
from kdsl.codegen.torch import build as torch_build
if has_native(name):
    torch_call = native_function(name, x, ws, dict(solve.bind(op, layer)))
else:
    _m = torch_build(op, layer); torch_call = lambda: _m(*inputs)
with torch.no_grad(): ref = torch_call().clone()
if not has_native(name):
    kernels[0].executable(*args, outs[0]); ref = outs[0].clone()
for kern, o, (n, _) in zip(kernels, outs, variants):
    kern.executable(*args, o); err = float((o - ref).abs().max())
    assert err < 1e-2 * max(1, float(ref.abs().max())), (n, err)
calls = [(lambda kk=kk, o=o: kk.executable(*args, o)) for kk, o in zip(kernels, outs)] + [torch_call]
with torch.no_grad():
    samples = interleaved_samples(calls, repeats=a.pairs, warmup=2)
t = samples[-1]
for (n, _), s in zip(variants, samples):
    print(f"{a.label:10s} {n[:70]:70s} {statistics.median(s)*1e3:9.3f} ms  /default {ratio_of_pairs(s, samples[0]):.3f}  /torch {ratio_of_pairs(s, t):.3f}", flush=True)
print(f"{a.label:10s} torch {statistics.median(t)*1e3:.3f} ms")
