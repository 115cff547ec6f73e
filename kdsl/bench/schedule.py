"""The default TVM schedule against PyTorch: conv2d at ResNet-18's layers, matmul, a few gallery operators.

:func:`measure` alternates the two in one fresh process with ``TVM_BIND_THREADS=0`` (``TVM.md`` explains
why); ``python -m kdsl.bench.schedule [--quick]`` prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from kdsl import gallery, solve
from kdsl.codegen.native import NATIVE, native_function
from kdsl.codegen.torch import build as torch_build
from kdsl.codegen.tvm import build
from kdsl.runtime.threads import shared_process_environment
from kdsl.runtime.timing import best_medians


def measure_cases(batches: Sequence[int] = (1, 8), extra: bool = True) -> list[tuple[str, str, dict[str, int]]]:
    """``(label, gallery operator, layer)`` for conv2d at ResNet-18's conv2_x..conv5_x, matmul, and others."""
    cases: list[tuple[str, str, dict[str, int]]] = []
    layers = solve.load_layers("resnet18")
    for n in batches:
        for layer in layers:
            v = dict(layer.values)
            cases.append(
                (f"conv2d {layer.name} N={n}", "conv2d", {k: v[k] for k in ("Cin", "Cout", "H", "W")} | {"N": n})
            )
    for layer in layers[:2]:
        v = dict(layer.values)
        cases.append(
            (f"matmul {v['M']}x{v['Cin']}x{v['Cout']}", "matmul", {"M": v["M"], "Cin": v["Cin"], "Cout": v["Cout"]})
        )
    for m in (512, 1024):
        cases.append((f"matmul {m}^3", "matmul", {"M": m, "Cin": m, "Cout": m}))
    if extra:
        v = dict(layers[0].values)
        hw = {"N": 1, "H": v["H"], "W": v["W"]}
        cases.append(("depthwise_conv2d conv2_x", "depthwise_conv2d", hw | {"Cin": v["Cin"]}))
        cases.append(("grouped_conv2d conv2_x", "grouped_conv2d", hw | {"Cin": v["Cin"], "Cout": v["Cout"]}))
        cases.append(("avg_pool2d conv2_x", "avg_pool2d", hw | {"Cin": v["Cin"]}))
        cases.append(("syno_op1 conv2_x", "syno_op1", hw | {"Cin": v["Cin"], "Cout": v["Cout"]}))
    return cases


def _measure_worker(cases: list[tuple[str, str, dict[str, int]]], number: int, repeat: int, rounds: int) -> None:
    """Print one JSON line per case: the best of ``rounds`` medians of TVM and of PyTorch, timed in
    alternation in this process (started with ``TVM_BIND_THREADS=0`` so TVM's threads leave PyTorch's
    alone), so that both see the same background load."""
    import torch

    torch.manual_seed(0)
    for label, name, layer in cases:
        op = gallery.load(name)
        binding = solve.bind(op, layer)
        macs = solve.cost(op, binding)["macs"]  # a branching kernel has no single plan; cost takes both
        kernel = build(op, layer)
        x = torch.randn(kernel.input_shape)
        ws = [torch.randn(shape) for shape in kernel.weight_shapes]
        out = torch.empty(kernel.output_shape)
        if name in NATIVE:
            torch_call = native_function(name, x, ws, dict(binding))
        else:  # no PyTorch function of its own: kdsl's PyTorch backend stands in
            module = torch_build(op, layer)
            torch_call = lambda module=module, x=x: module(x)
        with torch.no_grad():
            tvm_call = lambda kernel=kernel, args=(x, *ws, out): kernel.executable(*args)
            # who goes first alternates: the call right after PyTorch's pays its spinning threads
            times = best_medians([torch_call, tvm_call], rounds=rounds, number=number, repeats=repeat, warmup=2)
            best = {"tvm": times[1], "torch": times[0]}
        print(json.dumps({"label": label, "macs": macs, **best}), flush=True)


def measure(
    cases: Sequence[tuple[str, str, dict[str, int]]] | None = None,
    *,
    number: int = 10,
    repeat: int = 5,
    rounds: int = 3,
) -> list[dict[str, Any]]:
    """Median forward time of the default TVM schedule and of native PyTorch (or kdsl's PyTorch backend
    where PyTorch has no such function), 2 threads each. Both run in one fresh process with
    ``TVM_BIND_THREADS=0`` (else TVM pins its threads and slows PyTorch, ``TVM.md``), timed in
    alternation ``rounds`` times per case, keeping each one's best median: on a shared machine the
    background load comes and goes, and alternating exposes both frameworks to it alike.
    Returns one row per case: label, tvm_ms, torch_ms, tvm_gmacs, torch_gmacs (GMAC/s), ratio (tvm / torch time)."""
    cases = list(cases if cases is not None else measure_cases())
    code = (
        "import json, sys\nfrom kdsl.bench.schedule import _measure_worker\n"
        "c = json.loads(sys.argv[1])\n_measure_worker(c['cases'], c['number'], c['repeat'], c['rounds'])\n"
    )
    env = shared_process_environment(int(os.environ.get("TVM_NUM_THREADS", "2")), sleeping=False)
    payload = json.dumps({"cases": cases, "number": number, "repeat": repeat, "rounds": rounds})
    done = subprocess.run([sys.executable, "-c", code, payload], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr[-3000:]}")
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            results[row["label"]] = row
    rows = []
    for label, _, _ in cases:
        r = results[label]
        rows.append(
            {
                "label": label,
                "tvm_ms": r["tvm"] * 1e3,
                "torch_ms": r["torch"] * 1e3,
                "tvm_gmacs": r["macs"] / r["tvm"] / 1e9,
                "torch_gmacs": r["macs"] / r["torch"] / 1e9,
                "ratio": r["tvm"] / r["torch"],
            }
        )
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of :func:`measure`'s rows."""
    lines = [
        "| case | TVM default ms | PyTorch ms | TVM GMAC/s | PyTorch GMAC/s | TVM / PyTorch time |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['tvm_ms']:.3f} | {r['torch_ms']:.3f} | {r['tvm_gmacs']:.1f} | "
            f"{r['torch_gmacs']:.1f} | {r['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    """``python -m kdsl.bench.schedule [--quick]``: measure and return the Markdown table (``--help``
    prints the usage; an unknown flag is refused by argparse rather than ignored).

    >>> main(["--bogus"])
    Traceback (most recent call last):
    ...
    SystemExit: 2
    """
    parser = argparse.ArgumentParser(
        prog="python -m kdsl.bench.schedule",
        description="The default TVM schedule against PyTorch, alternated in one fresh process: conv2d at "
        "ResNet-18's layers (batch 1 and 8), matmul and a few gallery operators; prints a Markdown table.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="leave out the extra gallery operators and time one round, not 3"
    )
    args = parser.parse_args(argv)
    return format_table(measure(measure_cases(extra=not args.quick), rounds=1 if args.quick else 3))


if __name__ == "__main__":
    print(main())
