"""Time MetaSchedule's compiled best schedules against kdsl's default and PyTorch, side by side in one process.

``kdsl bench tune --tuners metaschedule`` leaves MetaSchedule's top schedules compiled beside its database
(``<out>/records/<case>-metaschedule-256.db.ms/<task>/top<rank>.so``). Schedules found in different sessions
were each timed on the machine of their day; this times them in alternation with this tree's default schedule
and PyTorch's function, on the same tensors, after checking every output against PyTorch's::

    PYTHONPATH=. python scripts/metaschedule_side_by_side.py matmul '{"M": 512, "Cin": 4096, "Cout": 1024}' \\
        RUN1/top3.so RUN2/top0.so --rounds 4

It prints the best of ``rounds`` medians in ms: the default, each library in the order given, then PyTorch.
Run it in several fresh processes (a VM moves a kernel's time between processes: see
``scripts/heuristic_compare.py``).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.update(TVM_NUM_THREADS=os.environ.get("TVM_NUM_THREADS", "2"), TVM_BIND_THREADS="0")


def main() -> None:
    import torch

    from kdsl import gallery, solve
    from kdsl.codegen.native import native_function
    from kdsl.codegen.tvm import build, load_tvm
    from kdsl.runtime.timing import best_medians

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("operator", help="a gallery operator with a PyTorch function of its own")
    parser.add_argument("layer", help="its layer as JSON")
    parser.add_argument("libraries", nargs="+", help="MetaSchedule's compiled schedules (top<rank>.so)")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    tvm = load_tvm()
    op, layer = gallery.load(args.operator), json.loads(args.layer)
    kernel = build(op, layer)
    torch.manual_seed(0)
    inputs = [torch.randn(shape) for shape in kernel.input_shapes]
    weights = [torch.randn(shape) for shape in kernel.weight_shapes]
    x = inputs[0] if len(inputs) == 1 else tuple(inputs)
    reference = native_function(args.operator, x, weights, dict(solve.bind(op, layer)))
    functions = [tvm.runtime.load_module(path)["main"] for path in args.libraries]
    outs = [torch.empty(kernel.output_shape) for _ in range(len(functions) + 1)]
    calls = [lambda: kernel.executable(*inputs, *weights, outs[0])]
    calls += [lambda f=f, out=out: f(*inputs, *weights, out) for f, out in zip(functions, outs[1:])]
    calls.append(reference)
    with torch.no_grad():
        expected = reference().clone()
        for call, out in zip(calls, outs):
            call()
            error = float((out - expected).abs().max())
            assert error < 1e-2 * max(1.0, float(expected.abs().max())), f"max error {error}"
        best = best_medians(calls, rounds=args.rounds, repeats=5, warmup=2)
    labels = ["default", *(os.path.basename(os.path.dirname(p)) + "/" + os.path.basename(p) for p in args.libraries)]
    print("  ".join(f"{label} {b * 1e3:.3f}" for label, b in zip([*labels, "torch"], best)))


if __name__ == "__main__":
    main()
