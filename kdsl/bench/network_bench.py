"""``kdsl bench network``: the command around :func:`kdsl.discover.network.network_latency`
(ResNet-18 end to end with its stage 3x3 convolutions replaced, PyTorch and TVM, side by side).

>>> print(format_table([{"op": "conv2d", "backend": "torch", "batch": 1, "ms": 20.0, "ratio": 1.0,
...     "vs_native": 1.0, "spread": 0.01, "rounds": 5}]).splitlines()[0].split())
['operator', 'backend', 'batch', 'ms', 'ratio', 'vs', 'torch', 'spread', 'rounds']
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kdsl.bench.argument_types import positive_float, positive_int
from kdsl.discover.evaluators import check_device
from kdsl.discover.network import BACKENDS, network_latency
from kdsl.lang.errors import printable

__all__ = ["add_arguments", "bench_network", "format_table"]


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows of :func:`network_latency` as a text table.

    >>> print(format_table([{"op": "conv2d", "backend": "torch", "batch": 1, "ms": 20.0, "ratio": 1.0,
    ...     "vs_native": 1.0, "spread": 0.01, "rounds": 5}]))
    operator                                 backend  batch         ms   ratio  vs torch  spread rounds
    ---------------------------------------------------------------------------------------------------
    conv2d                                   torch        1     20.000    1.00      1.00    0.01      5
    """
    header = (
        f"{'operator':<40} {'backend':<8} {'batch':>5} {'ms':>10} {'ratio':>7} {'vs torch':>9} {'spread':>7} "
        f"{'rounds':>6}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{printable(str(row['op'])):<40} {row['backend']:<8} {row['batch']:>5} {row['ms']:10.3f} "
            f"{row['ratio']:7.2f} {row['vs_native']:9.2f} {row['spread']:7.2f} {row['rounds']:>6}"
        )
    return "\n".join(lines)


def bench_network(args: argparse.Namespace) -> int:
    """Print the table (or JSON) of :func:`network_latency` for the command's arguments."""
    start = time.perf_counter()
    load_before = _load_average()
    if args.device == "cuda":
        check_device("cuda")  # one clear line where no GPU is present, before any work
    rows = network_latency(
        args.ops,
        args.batch,
        args.backends or (["torch"] if args.device == "cuda" else list(BACKENDS)),
        db=args.db,
        resolution=args.resolution,
        classes=args.classes,
        threads=args.threads,
        repeats=args.repeats,
        max_repeats=args.max_repeats,
        target=args.target,
        seed=args.seed,
        device=args.device,
        progress=lambda line: print(f"bench network: {line}", file=sys.stderr, flush=True),
    )
    wall = time.perf_counter() - start
    if args.json:
        print(json.dumps({"rows": rows, "wall_s": wall, "resolution": args.resolution}, indent=1))
        return 0
    print(
        f"kdsl bench network: ResNet-18, {args.resolution}x{args.resolution} input, {args.classes} classes, "
        f"random weights, forward (no grad), {args.threads} threads"
        + (f", on {_gpu_name()} (each call synchronized)" if args.device == "cuda" else "")
    )
    print(
        "Replaced: the 13 stride-1 3x3 convolutions with Cin = Cout (the resnet18 layer table). Kept as PyTorch "
        "conv2d: the 7x7 stem, the three stride-2 3x3 convolutions and their 1x1 projection shortcuts."
    )
    print(
        "torch: kdsl's generated PyTorch modules (eager); ratio to the original network with nn.Conv2d.\n"
        "tvm: kdsl's TVM kernels (default schedule), the rest PyTorch; ratio to the same network with conv2d "
        "lowered through kdsl's TVM.\n"
        "vs torch: to PyTorch's native original network, timed in the same rounds. ms: median over "
        "the interleaved rounds; ratio: median of the rounds' ratios (a time over the other's: below 1 is "
        "faster); spread: their IQR / median; rounds: "
        f"{args.repeats}, more (up to {max(args.repeats, args.max_repeats)}) while a spread exceeds 0.15.\n"
        "Each backend in its own process (TVM_BIND_THREADS=0 in the TVM one).\n"
    )
    print(format_table(rows))
    print(f"\nwall time {wall:.0f} s")
    loads = [load for load in (load_before, _load_average()) if load is not None]
    cores = os.cpu_count() or 1
    if loads:
        print(
            f"load average {' and '.join(f'{load:.1f}' for load in loads)} (before and after) on {cores} cores", end=""
        )
        if max(loads) > cores and args.threads > 1:
            print(
                f": other processes competed for the cores, which slows {args.threads}-thread runs (their threads "
                "wait for each other) and makes times and ratios noisy; compare with --threads 1",
                end="",
            )
        elif max(loads) > cores:
            print(": other processes competed for the cores (times are inflated and noisier)", end="")
        print()
    return 0


def _gpu_name() -> str:
    import torch

    return str(torch.cuda.get_device_name(0))


def _load_average() -> float | None:
    """The machine's 1-minute load average (None where the OS does not tell)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - Windows
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``kdsl bench network``: every count and size is refused below 1 as it is parsed,
    naming the flag (``--classes 0`` once reached the worker and failed there with a traceback)."""
    parser.add_argument(
        "--ops",
        nargs="+",
        default=["conv2d", "grouped_conv2d"],
        metavar="OP",
        help="gallery names, .dsl/.json files or (with --db) candidate keys; NAME:G=2 overrides a coefficient",
    )
    parser.add_argument("--db", help="a search or discover results database to read candidate keys from")
    parser.add_argument("--batch", type=positive_int, nargs="+", default=[1, 8], help="batch sizes")
    parser.add_argument(
        "--backends", nargs="+", choices=BACKENDS, help="backends to time (default: all; torch with --device cuda)"
    )
    parser.add_argument(
        "--threads", type=positive_int, default=2, help="threads of PyTorch and TVM (this machine: 2 cores)"
    )
    parser.add_argument(
        "--resolution", type=positive_int, default=224, help="input size (224: ImageNet; a multiple of 32)"
    )
    parser.add_argument("--classes", type=positive_int, default=1000, help="classes of the classifier")
    parser.add_argument("--repeats", type=positive_int, default=5, help="interleaved rounds per batch size (at least)")
    parser.add_argument(
        "--max-repeats",
        type=positive_int,
        default=15,
        help="more rounds, up to this many, while a ratio's spread exceeds 0.15",
    )
    parser.add_argument(
        "--target", type=positive_float, default=0.3, help="seconds each network runs per round (about)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and input")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the PyTorch networks run (cuda: a GPU PyTorch sees; with --backends torch)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
