"""Session 45: run pack_order_compare.py (or $SCRIPT) in $PROCS fresh processes; print per-process times and the
medians over processes of each time, of its ratio to the first (the new order) and to PyTorch (last)."""

import json
import os
import statistics
import subprocess
import sys

P = int(os.environ.get("PROCS", 5))
rows = []
for p in range(P):
    out = subprocess.run(
        [
            sys.executable,
            os.environ.get("SCRIPT", os.path.join(os.path.dirname(__file__), "pack_order_compare.py")),
            *sys.argv[1:],
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, ROUNDS=os.environ.get("ROUNDS", "4")),
    )
    line = out.stdout.strip().splitlines()[-1]
    t = [float(x) for x in json.loads(line.replace("'", '"'))]
    rows.append(t)
    print(p, t, flush=True)
n = len(rows[0])
print("median ms      ", [round(statistics.median(r[i] for r in rows), 3) for i in range(n)])
print("median t/t0    ", [round(statistics.median(r[i] / r[0] for r in rows), 3) for i in range(n)])
print("median t/torch ", [round(statistics.median(r[i] / r[-1] for r in rows), 3) for i in range(n)])
