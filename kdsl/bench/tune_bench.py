"""``kdsl bench tune``: every tuner on matmul 512x1024x1024 (OpEvo's BERT shape), conv2d at ResNet-18's
conv3_x (N=1) and the gallery's ``syno_op1`` at the same layer, with equal trial budgets (64 by
default). Each tuner's best schedule (and the default schedule) is recompiled and re-measured at the
end in one measuring process, in alternation with PyTorch's native op
(:data:`kdsl.codegen.native.NATIVE`'s ``matmul`` and ``conv2d``; for ``syno_op1`` PyTorch's conv2d at
the same layer) timed in a worker process of its own, both in the machine's latency slot, for ``rounds``
rounds; each keeps its best median (these VMs slow everything down by up to 1.8x for seconds to
minutes, so a baseline timed once, minutes apart from the kernels, misleads).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from kdsl import gallery, solve
from kdsl.bench import target as bench_target
from kdsl.bench.argument_types import positive_int
from kdsl.codegen.native import native_function
from kdsl.codegen.tvm import lower
from kdsl.codegen.tvm.default_schedule import default_schedule
from kdsl.codegen.tvm.machine import current_machine
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.lang.errors import KdslError
from kdsl.runtime.progress import Progress
from kdsl.runtime.timing import median_seconds, round_order
from kdsl.runtime.units import duration, format_time, time_unit
from kdsl.runtime.workers import Slot, WorkerPool
from kdsl.tune.driver import TUNERS, tune
from kdsl.tune.measurer import Measurer, compile_module


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``kdsl bench tune``."""
    parser.add_argument("--trials", type=positive_int, default=None, help="trials per tuner (default 64, --quick 12)")
    parser.add_argument("--quick", action="store_true", help="small budgets (a few minutes)")
    parser.add_argument(
        "--tuners", nargs="+", choices=[*TUNERS, "random"], default=list(TUNERS), help="the tuners to compare"
    )
    parser.add_argument(
        "--cases", nargs="+", choices=["matmul", "conv2d", "syno_op1"], help="the operators to tune (default: all)"
    )
    parser.add_argument("--db", default=None, help="records database (default: a fresh temporary one)")
    parser.add_argument(
        "--rounds", type=positive_int, default=None, help="alternating re-measurement rounds (default 5, --quick 1)"
    )
    bench_target.add_mcpu_argument(parser)


def bench_cases() -> list[tuple[str, str, dict[str, int]]]:
    """``(label, gallery operator, layer)`` of ``kdsl bench tune``.

    >>> [label for label, _, _ in bench_cases()]
    ['matmul 512x1024x1024', 'conv2d conv3_x', 'syno_op1 conv3_x']
    """
    conv = {"N": 1, "Cin": 128, "Cout": 128, "H": 28, "W": 28}
    return [
        ("matmul 512x1024x1024", "matmul", {"M": 512, "Cin": 1024, "Cout": 1024}),
        ("conv2d conv3_x", "conv2d", conv),
        ("syno_op1 conv3_x", "syno_op1", conv),
    ]


def _torch_setup(threads: int) -> None:
    """The PyTorch baseline worker's setup: import torch once, with the kernels' thread count."""
    import torch

    torch.set_num_threads(threads)


def _torch_job(state: None, job: tuple[str, dict[str, Any], dict[str, int], int], slot: Slot) -> float:
    """Best of ``rounds`` medians of PyTorch's native op (:data:`kdsl.codegen.native.NATIVE`), timed
    in the machine's latency slot."""
    import torch

    name, shapes, sizes, rounds = job
    x = torch.randn(shapes["input"])
    weights = [torch.randn(shape) for shape in shapes["weights"].values()]
    function = native_function(name, x, weights, sizes)
    best = float("inf")
    with torch.no_grad(), slot():
        for _ in range(rounds):
            best = min(best, median_seconds(function, repeats=5, target=0.04, warmup=3))
    return best


def torch_pool(job: Callable[..., float] = _torch_job) -> WorkerPool:
    """A worker process for :func:`torch_seconds` (or another timing ``job``): PyTorch timed apart from
    TVM, whose pinned threads would slow it down in the same process (TVM.md), with as many threads as
    the TVM kernels, held to the ISA they are compiled for (:func:`~kdsl.bench.target.pytorch_environment`)."""
    threads = os.environ.get("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    return WorkerPool(
        job,
        setup=functools.partial(_torch_setup, int(threads)),
        environment={"OMP_NUM_THREADS": threads, **bench_target.pytorch_environment()},
        name="kdsl-torch-baseline",
    )


def torch_seconds(op: str, layer: Mapping[str, int], rounds: int = 3, pool: WorkerPool | None = None) -> float:
    """PyTorch's native op (matmul, or conv2d for the convolutions) at ``layer``, timed in a worker
    process (``pool``, else a fresh one)."""
    native = "matmul" if op == "matmul" else "conv2d"
    baseline = gallery.load(native)
    sizes = {**dict(layer), **dict(solve.bind(baseline, layer))}
    shapes = solve.shapes(baseline, sizes)
    job = (native, {"input": shapes["input"], "weights": shapes["weights"]}, sizes, rounds)
    if pool is None:
        with torch_pool() as own:
            outcome = own.call(job)
    else:
        outcome = pool.call(job)
    if not outcome.ok:
        raise KdslError(f"timing PyTorch failed: {outcome.error}")
    return outcome.value


def remeasure(
    measurer: Measurer,
    libraries: Mapping[str, str],
    rounds: int,
    time_torch: Callable[[], float] | None,
    failed: Callable[[str, str], None],
) -> tuple[dict[str, float], float]:
    """Each compiled library's and PyTorch's (``time_torch``, when given) best median over ``rounds``
    rounds in alternation: these VMs drift by up to 1.5x over minutes, so a baseline timed once,
    minutes away from the kernels, misleads. ``failed(name, error)`` hears of a library that fails."""
    final: dict[str, float] = {}
    torch_s = float("inf")
    members: list[str | None] = [*libraries, *([None] if time_torch is not None else [])]
    for round_index in range(rounds):
        # rotated each round: the member timed right after PyTorch's parallel call runs slower while
        # PyTorch's OpenMP threads still spin, and a fixed order gave that cost to the same one
        for index in round_order(len(members), round_index):
            name = members[index]
            if name is None:
                if time_torch is not None:
                    torch_s = min(torch_s, time_torch())
                continue
            latency, error = measurer.time_library(libraries[name], check=True)
            if latency is not None:
                final[name] = min(final.get(name, float("inf")), latency)
            elif error:
                failed(name, error)
    return final, torch_s


def _at(curve: list[float], n: int) -> float | None:
    """The best time after ``n`` trials (None before the first valid one)."""
    if not curve:
        return None
    value = curve[min(n, len(curve)) - 1]
    return None if value == float("inf") else value


def budgets(args: argparse.Namespace) -> tuple[int, int]:
    """``(trials, rounds)`` of ``kdsl bench tune``: ``--trials`` and ``--rounds`` where given (an explicit
    value wins over ``--quick``), else 64 and 5, or 12 and 1 with ``--quick``.

    >>> budgets(argparse.Namespace(trials=None, rounds=3, quick=True))
    (12, 3)
    """
    return args.trials or (12 if args.quick else 64), args.rounds or (1 if args.quick else 5)


def bench_tune(args: argparse.Namespace) -> int:
    """``kdsl bench tune``: every tuner on the bench cases, equal budgets, ratios to PyTorch."""
    bench_target.select_mcpu(args.mcpu)  # before anything compiles or a worker starts: they read KDSL_MCPU
    trials, rounds = budgets(args)
    folder = tempfile.mkdtemp(prefix="kdsl-bench-tune-")
    db = args.db or os.path.join(folder, "tune.db")
    cases = [c for c in bench_cases() if args.cases is None or c[1] in args.cases]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"kdsl bench tune: {trials} trials per tuner, records in {db}; load average {load:.2f} at start")
    machine = current_machine()  # the --mcpu one: what every kernel below is compiled for
    peak = bench_target.measured_peak_gflops(machine)
    print(bench_target.machine_line(machine, measured=peak))
    checkpoints = [n for n in (8, 16, 32, 64, 128, 256) if n < trials] + [trials]
    started = time.time()
    for label, name, layer in cases:
        op = gallery.load(name)
        binding = solve.bind(op, layer)
        macs = solve.cost(op, binding)["macs"]  # multiply-accumulates, the unit of every kdsl command
        results = {}
        libraries: dict[str, str] = {}
        with Measurer(op, binding) as measurer, torch_pool() as torch_worker:
            space = None
            for tuner in args.tuners:
                with Progress(f"{label}: {tuner}", total=trials, unit="trials", stream=sys.stderr) as bar:
                    # a bar per tuner on stderr (plain lines in a log), each round's line above it
                    result = tune(op, binding, tuner, trials, db, measurer=measurer, log=bar.note, progress=bar)
                results[tuner] = result
                if tuner == "metaschedule":
                    if result.library:
                        libraries[tuner] = result.library
                elif result.best is not None and result.best.latency is not None:
                    if space is None:
                        space = ScheduleSpace(lower(op, binding))
                    path = os.path.join(folder, f"{name}-{tuner}.so")
                    compile_module(space.apply(result.best.config).mod, path)
                    libraries[tuner] = path
            path = os.path.join(folder, f"{name}-default.so")
            compile_module(default_schedule(lower(op, binding)).mod, path)
            libraries["default schedule"] = path
            final, torch_s = remeasure(
                measurer,
                libraries,
                rounds,
                functools.partial(torch_seconds, name, binding, 1, torch_worker),
                lambda tuner, error: print(f"  {tuner}: re-measurement failed: {error}"),
            )
        print(
            f"\n### {label} ({macs / 1e9:.3f} GMAC); PyTorch {duration(torch_s)}, {macs / torch_s / 1e9:.1f} GMAC/s "
            f"({bench_target.percent_of_peak(macs, torch_s, peak):.0f}% of peak)"
        )
        # one unit for the table's times, chosen by the fastest (runtime.units)
        times = [_at(r.curve, n) for r in results.values() for n in checkpoints] + list(final.values())
        unit, scale, decimals = time_unit(times)
        head = " | ".join(f"best {unit} @{n}" for n in checkpoints)
        print(f"| tuner | trials | {head} | final {unit} | GMAC/s | % of peak | vs PyTorch (speed) | tuning s |")
        print("| --- | ---: | " + " | ".join("---:" for _ in checkpoints) + " | ---: | ---: | ---: | ---: | ---: |")
        for tuner in [*args.tuners, "default schedule"]:
            result = results.get(tuner)
            seconds = final.get(tuner)
            curve = " | ".join(
                format_time(_at(result.curve, n) if result else None, scale, decimals) for n in checkpoints
            )
            measured = str(result.measured) if result else "-"
            spent = f"{result.seconds:.0f}" if result else "-"
            if seconds is None:
                print(f"| {tuner} | {measured} | {curve} | - | - | - | - | {spent} |")
                continue
            print(
                f"| {tuner} | {measured} | {curve} | {format_time(seconds, scale, decimals)} | "
                f"{macs / seconds / 1e9:.1f} | "
                f"{bench_target.percent_of_peak(macs, seconds, peak):.0f}% | {torch_s / seconds:.2f}x | {spent} |"
            )
        print(flush=True)
    print(
        f"(metaschedule's curve is its own reported times; final columns: every best schedule recompiled and "
        f"re-measured in one process, alternating with PyTorch for {rounds} rounds, best median of each; "
        f"% of peak: GFLOP/s (2 per MAC) against the measured FMA peak of the machine line; "
        f"{time.time() - started:.0f} s in all)"
    )
    note = bench_target.pytorch_note(machine)
    if note:
        print(f"({note})")
    return 0


if __name__ == "__main__":  # python -m kdsl.bench.tune_bench [bench options]
    parser = argparse.ArgumentParser(prog="kdsl bench tune")
    add_arguments(parser)
    sys.exit(bench_tune(parser.parse_args()))
