"""Time an earlier commit's heuristic configuration against this tree's, and PyTorch, side by side in one process.

A change to :meth:`ScheduleSpace.heuristic <kdsl.codegen.tvm.schedule_space.ScheduleSpace.heuristic>` is judged
by ratios measured in alternation (the machine is shared; absolute times drift by 30 %). The earlier commit's
configurations are read by a subprocess that imports that commit's tree (``git archive``), so both sides are
applied by this tree's code: the comparison isolates the heuristic's picks (parameters the earlier space lacks
take this space's identity value). Cases are tune-suite labels (``kdsl/bench/tune_suites.py``; ``opevo:C2``
where two suites share one, a bare ``C2`` is the last suite's) or those of
:data:`EXTRA` (ResNet-18's layers: ``conv3_x``, its 3x3 convolution at 128x28x28, N=1; ``stem_pool``, its
3x3 stride-2 max pooling, the kernel a compiled network runs; ``pool2x``, a 2x2 mean at conv2_x)::

    PYTHONPATH=. python scripts/heuristic_compare.py --old HEAD~1 U3 U2 M2 BMM2 MM1 conv3_x --rounds 4
    PYTHONPATH=. python scripts/heuristic_compare.py --old cf177ae P1 P2 P3 stem_pool pool2x --rounds 7

Each row prints the best of ``rounds`` medians of each side and the ratios old/new and new/PyTorch. With
``--processes P`` each case runs in ``P`` fresh processes, one after another, and the row prints medians over
them (per-process ratios): on a VM a kernel's time moves by up to 60% from one process to the next::

    PYTHONPATH=. python scripts/heuristic_compare.py --old HEAD~1 MM1 MM3 --rounds 4 --processes 5

``--prepacked`` adds the new default built with ``prepacked_weights=True`` and called with weights packed once
outside the call: the difference is what its packing copies cost on every call.

``--pairs N`` times the sides instead in ``N`` interleaved rounds of back-to-back calls
(:func:`~kdsl.runtime.timing.interleaved_samples`): each ratio is then the median of the rounds' ratios
(:func:`~kdsl.runtime.timing.ratio_of_pairs`), and a column gives the spread of ``new/torch``'s (interquartile
range over median, :func:`~kdsl.runtime.timing.ratio_spread`). Two calls a few milliseconds apart share the VM's
state, which best-of-rounds times taken minutes apart need not (this machine's PyTorch GEMM moved between 137 and
182 GFLOP/s from one second to the next with no steal time reported)::

    PYTHONPATH=. python scripts/heuristic_compare.py --old HEAD~1 MM1 GMM --pairs 15
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from typing import Any

os.environ.update(TVM_NUM_THREADS=os.environ.get("TVM_NUM_THREADS", "2"), TVM_BIND_THREADS="0")

#: The operator name of the network's max pooling, which is no gallery operator.
STEM_POOL = "network:max_pool"

#: Cases outside the tune suites: (gallery operator or :data:`STEM_POOL`, layer).
EXTRA = {
    "conv3_x": ("conv2d", {"N": 1, "Cin": 128, "Cout": 128, "H": 28, "W": 28, "K": 3}),
    "mm3136": ("matmul", {"M": 3136, "Cin": 64, "Cout": 64}),  # ResNet-18's 1x1 shapes as matmuls
    "mm784": ("matmul", {"M": 784, "Cin": 128, "Cout": 128}),
    "mm2048_4096": ("matmul", {"M": 2048, "Cin": 4096, "Cout": 2048}),  # K-blocked with data tasks, as M1 (8192^3)
    # around them, for where the thin-product rule (MemoryRules._rows_whole) pays and where it costs
    "mm784_64": ("matmul", {"M": 784, "Cin": 64, "Cout": 64}),
    "mm784_256": ("matmul", {"M": 784, "Cin": 256, "Cout": 256}),
    "mm3136_128": ("matmul", {"M": 3136, "Cin": 128, "Cout": 128}),
    "mm12544_64": ("matmul", {"M": 12544, "Cin": 64, "Cout": 64}),
    "syno2x": ("syno_op1", {"N": 1, "H": 56, "W": 56, "Cin": 64, "Cout": 64}),
    # the network's max pooling (kdsl.bench.network_strided.max_pool_op at max_pool_binding(1, 224)) and a mean
    "stem_pool": (STEM_POOL, {"N": 1, "Cin": 64, "H": 112, "W": 112, "K": 3, "s": 2}),
    "pool2x": ("avg_pool2d", {"N": 1, "Cin": 64, "H": 56, "W": 56, "K": 2}),
}

DUMP = """
import json, sys
from kdsl import gallery
from kdsl.codegen.tvm.lowering import lower
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
out = {}
for label, (name, layer) in json.loads(sys.argv[1]).items():
    if name == "network:max_pool":
        from kdsl.bench.network_strided import max_pool_op
        op = max_pool_op()
    else:
        op = gallery.load(name)
    out[label] = ScheduleSpace(lower(op, layer)).heuristic()
print("CONFIGS" + json.dumps(out))
"""


def case_table(labels: list[str]) -> dict[str, tuple[str, dict[str, int]]]:
    """``label -> (operator, layer)`` for tune-suite labels and :data:`EXTRA`."""
    from kdsl.bench.tune_suites import suite_cases, suite_names

    cases = [(s, c) for s in suite_names() for c in suite_cases(s)]
    known = {c.label: (c.operator, dict(c.layer)) for _, c in cases} | EXTRA  # a label two suites share: the last's
    known |= {f"{s}:{c.label}": (c.operator, dict(c.layer)) for s, c in cases}  # opevo:C2, gensor:C2
    missing = [label for label in labels if label not in known]
    assert not missing, f"unknown cases {missing}; known: {sorted(known)}"
    return {label: known[label] for label in labels}


def old_configs(ref: str, cases: dict[str, tuple[str, dict[str, int]]]) -> dict[str, dict[str, Any]]:
    """The heuristic configurations of commit ``ref``'s tree for ``cases`` (read in a subprocess)."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True)
    archive = subprocess.run(["git", "-C", root.stdout.strip(), "archive", ref, "kdsl", "gallery"], capture_output=True)
    assert archive.returncode == 0, archive.stderr.decode()
    with tempfile.TemporaryDirectory() as tree:
        with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
            tar.extractall(tree, filter="data")
        env = dict(os.environ, PYTHONPATH=tree)
        done = subprocess.run(
            [sys.executable, "-c", DUMP, json.dumps(cases)], env=env, cwd=tree, capture_output=True, text=True
        )
    line = next((x for x in done.stdout.splitlines() if x.startswith("CONFIGS")), None)
    assert line is not None, done.stderr[-3000:]
    return json.loads(line[len("CONFIGS") :])


def compare(
    label: str,
    name: str,
    layer: dict[str, int],
    old: dict[str, Any],
    rounds: int,
    prepacked: bool = False,
    pairs: int = 0,
) -> dict[str, float]:
    """Best-of-``rounds`` medians (seconds) of the old configuration, the new heuristic and PyTorch (and, with
    ``prepacked``, the new heuristic with its weights packed once outside the call: what its packing copies cost).
    With ``pairs``, each side's median over ``pairs`` interleaved rounds instead, and the ratios as medians of
    the rounds' ratios (``old/new``, ``new/torch``, ``packed/torch``) with ``spread``, ``new/torch``'s."""
    import torch

    from kdsl import gallery, solve
    from kdsl.codegen.native import has_native, native_function
    from kdsl.codegen.torch import build as torch_build
    from kdsl.codegen.tvm import build
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace
    from kdsl.runtime.timing import best_medians, interleaved_samples, ratio_of_pairs, ratio_spread

    if name == STEM_POOL:
        from kdsl.bench.network_strided import max_pool_op

        op = max_pool_op()
    else:
        op = gallery.load(name)

    def scheduler(pick: str) -> Any:
        def schedule(lowered: Any) -> Any:
            space = ScheduleSpace(lowered)
            config = space.heuristic()
            if pick == "old":
                config = {n: old[n] if n in old else space.identity_value(n) for n in space.parameters}
            return space.apply(config, fallback=True)

        return schedule

    kernels = {pick: build(op, layer, schedule=scheduler(pick)) for pick in ("old", "new")}
    if prepacked:
        kernels["packed"] = build(op, layer, schedule=scheduler("new"), prepacked_weights=True)
    torch.manual_seed(0)
    k = kernels["new"]
    inputs = [torch.randn(shape) for shape in k.input_shapes]
    x = inputs[0] if len(inputs) == 1 else tuple(inputs)
    ws = [torch.randn(shape) for shape in k.weight_shapes]
    outs = {pick: torch.empty(k.output_shape) for pick in kernels}
    args = (*inputs, *ws)
    packed_args = (*inputs, *kernels["packed"].pack_weights(*ws)) if prepacked else ()
    if name == STEM_POOL:  # nn.MaxPool2d(3, 2, 1), as torchvision's ResNet-18 has it
        torch_call = lambda: torch.nn.functional.max_pool2d(x, 3, 2, 1)
    elif has_native(name):
        torch_call = native_function(name, x, ws, dict(solve.bind(op, layer)))
    else:  # no PyTorch function of its own: kdsl's PyTorch backend stands in
        module = torch_build(op, layer)
        torch_call = lambda: module(*inputs)
    for pick, kernel in kernels.items():
        kernel.executable(*(packed_args if pick == "packed" else args), outs[pick])
    # PyTorch's own function computes the same thing from the same tensors; kdsl's PyTorch module has weights
    # of its own, so there the old schedule's result is the reference of the new one's
    with torch.no_grad():
        expected = torch_call().clone() if has_native(name) or name == STEM_POOL else outs["old"]
    for pick in kernels:
        error = float((outs[pick] - expected).abs().max())
        assert error < 1e-2 * max(1.0, float(expected.abs().max())), f"{label} {pick}: max error {error}"
    calls = {
        "old": lambda: kernels["old"].executable(*args, outs["old"]),
        "new": lambda: kernels["new"].executable(*args, outs["new"]),
        "torch": torch_call,
    }
    if prepacked:
        calls["packed"] = lambda: kernels["packed"].executable(*packed_args, outs["packed"])
    if pairs:
        with torch.no_grad():
            samples = dict(zip(calls, interleaved_samples(list(calls.values()), repeats=pairs, warmup=2)))
        out = {side: statistics.median(times) for side, times in samples.items()}
        out["old/new"] = ratio_of_pairs(samples["old"], samples["new"])
        out["new/torch"] = ratio_of_pairs(samples["new"], samples["torch"])
        out["spread"] = ratio_spread(samples["new"], samples["torch"])
        if prepacked:
            out["packed/torch"] = ratio_of_pairs(samples["packed"], samples["torch"])
        return out
    with torch.no_grad():
        best = best_medians(list(calls.values()), rounds=rounds, repeats=5, warmup=2)
    return dict(zip(calls, best))


def in_processes(
    label: str, old: str, rounds: int, processes: int, prepacked: bool = False, pairs: int = 0
) -> dict[str, float]:
    """:func:`compare` of one case in ``processes`` fresh processes, one after another: each side's median over
    them of its best-of-``rounds`` time, and the medians of the per-process ratios (``old/new``,
    ``new/torch``). A process's tensors land on pages of its own, and on a VM the same kernel's time moves by
    up to 60% from one process to the next, unevenly between schedules (matmul 512x1024x1024, 6 processes on
    Cascade Lake: a new default from 1.20x faster than the old one to 1.16x slower)."""
    runs = []
    for _ in range(processes):
        argv = [sys.executable, __file__, label, "--old", old, "--rounds", str(rounds), "--json"]
        argv += (["--prepacked"] if prepacked else []) + (["--pairs", str(pairs)] if pairs else [])
        done = subprocess.run(argv, capture_output=True, text=True, env=os.environ)
        line = next((x for x in done.stdout.splitlines() if x.startswith("TIMES")), None)
        assert line is not None, done.stderr[-3000:]
        runs.append(json.loads(line[len("TIMES") :]))
        print(
            f"  {label} process {len(runs)}: "
            + " ".join(
                f"{k} {v:.2f}" if "/" in k or k == "spread" else f"{k} {v * 1e3:.3f}" for k, v in runs[-1].items()
            ),
            flush=True,
        )
    out = {side: statistics.median(r[side] for r in runs) for side in runs[0]}
    if pairs:  # each process's ratios are medians of its rounds' ratios already
        return out
    out["old/new"] = statistics.median(r["old"] / r["new"] for r in runs)
    out["new/torch"] = statistics.median(r["new"] / r["torch"] for r in runs)
    if prepacked:
        out["packed/torch"] = statistics.median(r["packed"] / r["torch"] for r in runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--old", default="HEAD", help="the commit whose heuristic is the baseline")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--processes", type=int, default=1, help="fresh processes per case (medians over them)")
    parser.add_argument(
        "--prepacked", action="store_true", help="also time the new default with its weights packed once, outside"
    )
    parser.add_argument(
        "--pairs", type=int, default=0, help="time N interleaved rounds of back-to-back calls; ratios of pairs"
    )
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one process's times, for the above
    args = parser.parse_args()
    if args.pairs:
        # calls back to back: neither pool may spin into the other's call (TVM's threads after a kernel, PyTorch's
        # OpenMP threads after an operator), which slowed one side of every pair in some processes (MM1: PyTorch
        # 2x slower in one of two processes); both sleep as soon as their call ends, as in a network's worker
        os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    cases = case_table(args.cases)
    if args.json:
        olds = old_configs(args.old, cases)
        for label, (name, layer) in cases.items():
            times = compare(label, name, layer, olds[label], args.rounds, args.prepacked, args.pairs)
            print("TIMES" + json.dumps(times), flush=True)
        return
    olds = old_configs(args.old, cases) if args.processes == 1 else {}
    extra = f" {'packed ms':>9} {'packed/torch':>12}" if args.prepacked else ""
    extra += f" {'spread':>6}" if args.pairs else ""
    print(f"{'case':8} {'old ms':>9} {'new ms':>9} {'torch ms':>9} {'old/new':>8} {'new/torch':>9}{extra}", flush=True)
    for label, (name, layer) in cases.items():
        if args.processes > 1:
            t = in_processes(label, args.old, args.rounds, args.processes, args.prepacked, args.pairs)
        else:
            t = compare(label, name, layer, olds[label], args.rounds, args.prepacked, args.pairs)
            if not args.pairs:
                t.update({"old/new": t["old"] / t["new"], "new/torch": t["new"] / t["torch"]})
                if args.prepacked:
                    t["packed/torch"] = t["packed"] / t["torch"]
        extra = f" {t['packed'] * 1e3:9.3f} {t['packed/torch']:12.2f}" if args.prepacked else ""
        extra += f" {t['spread']:6.2f}" if args.pairs else ""
        print(
            f"{label:8} {t['old'] * 1e3:9.3f} {t['new'] * 1e3:9.3f} {t['torch'] * 1e3:9.3f} "
            f"{t['old/new']:8.2f} {t['new/torch']:9.2f}{extra}",
            flush=True,
        )


if __name__ == "__main__":
    main()
