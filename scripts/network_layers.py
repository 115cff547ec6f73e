"""Where a ResNet-18 forward pass spends its time, layer by layer: each convolution as kdsl's fused
kernel (the convolution with its batch norm, ReLU and residual add in the epilogue) against PyTorch's
``conv2d`` on the same layer and PyTorch's glue after it, the max pooling and the head (global average
pooling and the classifier; kdsl's kernels and PyTorch's), every function timed in the same interleaved
rounds (median ms per call). Run it with one thread so the two thread pools do not wait for each other:

    TVM_NUM_THREADS=1 TVM_BIND_THREADS=0 PYTHONPATH=. python scripts/network_layers.py [--batch 1] [--db records.db]

``--db``: the kernels run the best records of that database (``kdsl tune --network``'s), else their
default schedules.
"""

from __future__ import annotations

import argparse
from statistics import median

import torch
import torch.nn.functional as F

from kdsl import gallery
from kdsl.bench.network_head import head_binding, head_op
from kdsl.bench.network_strided import max_pool_binding, max_pool_op, strided_layers, strided_op
from kdsl.codegen.tvm import build
from kdsl.codegen.tvm.epilogue import Epilogue, build_fused
from kdsl.discover.network import STAGES, stage_layers
from kdsl.runtime.timing import interleaved_samples
from kdsl.solve import bind
from kdsl.tune.tuned import tuned_schedule


def rows_of(batch: int, resolution: int) -> list[tuple]:
    """(label, runs a pass, op, binding, epilogue, PyTorch stride, padding, input shape, weight shape)."""
    conv2d = gallery.load("conv2d")
    strided = {layer.name: (layer, k) for layer, k in strided_layers(batch, resolution)}
    rows = []
    layer, k = strided["stem 7x7/2"]
    rows.append(("stem 7x7/2", 1, strided_op(), bind(strided_op(), layer, {"K": k, "s": 2}), Epilogue(), 2, k, layer))
    for index, stage in enumerate(stage_layers(batch, resolution)):
        name = STAGES[index][0]
        if index:
            for kind, epilogue in (("3x3/2", Epilogue()), ("1x1/2", Epilogue(relu=False))):
                layer, k = strided[f"{name} {kind}"]
                binding = bind(strided_op(), layer, {"K": k, "s": 2})
                rows.append((f"{name} {kind}", 1, strided_op(), binding, epilogue, 2, k, layer))
        runs = 4 if index == 0 else 3
        rows.append((f"{name} 3x3", runs, conv2d, bind(conv2d, stage, {}), Epilogue(residual=True), 1, 3, stage))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--db")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    functions, labels = [], []
    with torch.no_grad():
        for label, runs, op, binding, epilogue, stride, k, layer in rows_of(args.batch, args.resolution):
            schedule = tuned_schedule(args.db, op, binding) if args.db else None
            kernel = build_fused(op, binding, epilogue, schedule)
            x = torch.randn(layer["N"], layer["Cin"], layer["H"], layer["W"])
            w = torch.randn(layer["Cout"], layer["Cin"], k, k)
            scale, shift = torch.rand(layer["Cout"]) + 0.5, torch.randn(layer["Cout"])
            out = F.conv2d(x, w, stride=stride, padding=k // 2)
            residual = torch.randn_like(out) if epilogue.residual else None
            got = kernel(x, w, scale=scale, shift=shift, residual=residual)
            expected = out * scale[:, None, None] + shift[:, None, None] + (0 if residual is None else residual)
            expected = torch.relu(expected) if epilogue.relu else expected
            assert torch.allclose(got, expected, rtol=1e-3, atol=1e-3), label

            def glue(out=out, scale=scale, shift=shift, residual=residual, relu=epilogue.relu):
                y = out * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)
                y = y if residual is None else y + residual
                return torch.relu(y) if relu else y

            functions += [
                lambda kernel=kernel, x=x, w=w, s=scale, t=shift, r=residual: kernel(
                    x, w, scale=s, shift=t, residual=r
                ),
                lambda x=x, w=w, stride=stride, k=k: F.conv2d(x, w, stride=stride, padding=k // 2),
                glue,
            ]
            labels.append((label, runs))
        size = args.resolution // 2
        stem_out = torch.randn(args.batch, 64, size, size)
        last = torch.randn(args.batch, 512, args.resolution // 32, args.resolution // 32)
        fc = torch.nn.Linear(512, 1000)
        binding = max_pool_binding(args.batch, args.resolution)
        schedule = tuned_schedule(args.db, max_pool_op(), binding) if args.db else None
        pool = build(max_pool_op(), binding, schedule=schedule or "default")
        assert torch.equal(pool(stem_out), F.max_pool2d(stem_out, 3, 2, 1))
        functions += [lambda: pool(stem_out), lambda: F.max_pool2d(stem_out, 3, 2, 1)]
        # the head: the average pooling and the classifier in one kernel, the bias its epilogue's shift
        binding = head_binding(args.batch, args.resolution, 1000)
        schedule = tuned_schedule(args.db, head_op(), binding) if args.db else None
        head = build_fused(head_op(), binding, Epilogue(relu=False), schedule, prepacked_weights=True)
        packed, ones, bias = head.pack_weights([fc.weight.detach()]), torch.ones(1000), fc.bias.detach()
        got = head(last, *packed, scale=ones, shift=bias)
        assert torch.allclose(got, fc(last.mean(dim=(2, 3))), rtol=1e-3, atol=1e-3)
        functions += [lambda: head(last, *packed, scale=ones, shift=bias), lambda: fc(last.mean(dim=(2, 3)))]
        rounds = interleaved_samples(functions, repeats=args.repeats, target=0.2, warmup=2)
    ms = [median(samples) * 1e3 for samples in rounds]
    print(f"{'layer':<16} {'runs':>4} {'kdsl fused':>10} {'torch conv':>10} {'torch glue':>10} {'kdsl/torch':>10}")
    totals = [0.0, 0.0, 0.0]
    for index, (label, runs) in enumerate(labels):
        kdsl, conv, glue = ms[3 * index : 3 * index + 3]
        totals = [totals[0] + runs * kdsl, totals[1] + runs * conv, totals[2] + runs * glue]
        print(f"{label:<16} {runs:>4} {kdsl:10.3f} {conv:10.3f} {glue:10.3f} {kdsl / (conv + glue):10.2f}")
    print(f"{'per pass':<16} {'':>4} {totals[0]:10.3f} {totals[1]:10.3f} {totals[2]:10.3f}")
    print(
        f"max pooling: kdsl {ms[-4]:.3f} ms, PyTorch {ms[-3]:.3f} ms; "
        f"average pooling + classifier: kdsl {ms[-2]:.3f} ms, PyTorch {ms[-1]:.3f} ms"
    )


if __name__ == "__main__":
    main()
