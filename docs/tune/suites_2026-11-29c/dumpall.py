"""Scratch: heuristic configs of every suite case, EXTRA, and every gallery op on each layer of its table.
usage: PYTHONPATH=. python dumpall.py OUT.json [--l2 BYTES]"""
import json, sys, os
sys.path.insert(0, "/work/main/scripts")
from kdsl import gallery, solve
from kdsl.solve.layers import load_layers
from kdsl.codegen.tvm.lowering import lower
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.bench.tune_suites import suite_cases, suite_names
import heuristic_compare as hc
if os.environ.get("DUMP_CL"):  # Cascade Lake's caches and model name (the host's are read otherwise)
    import dataclasses, kdsl.codegen.tvm.machine as km
    _orig = km._machine
    def _cl(mcpu, cores):
        return dataclasses.replace(_orig(mcpu, cores), l2=1 << 20, l3=35 << 20, model="Intel(R) Xeon(R) Gold 6248", l3_bytes_per_cycle=16)
    km._machine = _cl
    from kdsl.codegen.tvm import machine as _m2
    assert _m2.current_machine().l2 == 1 << 20, _m2.current_machine()
cases = {}
for s in suite_names():
    for c in suite_cases(s):
        cases[f"{s}:{c.label}"] = (c.operator, dict(c.layer))
for k, (n, l) in hc.EXTRA.items():
    if n != hc.STEM_POOL: cases[k] = (n, l)
for name in gallery.names():
    t = gallery.layer_table(name)
    if t is None: continue
    try:
        for i, layer in enumerate(load_layers(t)):
            cases[f"{name}@{t}#{i}"] = (name, layer)
    except Exception as e:
        print("skip", name, e, file=sys.stderr)
out = {}
for k, (n, l) in cases.items():
    try:
        op = gallery.load(n)
        out[k] = ScheduleSpace(lower(op, l)).heuristic()
    except Exception as e:
        out[k] = f"ERR {type(e).__name__}: {e}"[:200]
json.dump(out, open(sys.argv[1], "w"), indent=0, sort_keys=True, default=str)
print(len(out), "configs")
