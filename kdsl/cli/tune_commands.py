"""Command-line handlers: ``kdsl tune`` and ``kdsl bench tune``.

``add_tune_commands(subparsers)`` registers ``tune``; ``add_bench_arguments(parser)`` and
:func:`bench_tune` implement ``kdsl bench tune``: every tuner on matmul 512x1024x1024 (OpEvo's BERT
shape), conv2d at ResNet-18's conv3_x (N=1) and the gallery's ``syno_op1`` at the same layer, with equal
trial budgets (64 by default). Each tuner's best schedule (and the default schedule) is recompiled and
re-measured at the end in one measuring process, in alternation with PyTorch's native op
(:data:`kdsl.codegen.native.NATIVE`'s ``matmul`` and ``conv2d``; for ``syno_op1`` PyTorch's conv2d at
the same layer) timed in a worker process of its own, both in the machine's latency slot, for ``rounds``
rounds; each keeps its best median (these VMs slow everything down by up to 1.8x for seconds to
minutes, so a baseline timed once, minutes apart from the kernels, misleads).

>>> import argparse
>>> parser = argparse.ArgumentParser(); commands = parser.add_subparsers()
>>> add_tune_commands(commands)
>>> parser.parse_args(["tune", "conv2d", "--layers", "conv3_x", "--trials", "8"]).trials
8
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from kdsl import gallery, solve
from kdsl.bench.argument_types import positive_int
from kdsl.bench.target import (
    add_mcpu_argument,
    machine_line,
    measured_peak_gflops,
    percent_of_peak,
    pytorch_environment,
    pytorch_note,
    select_mcpu,
)
from kdsl.cli.operator_commands import load_operator
from kdsl.codegen.native import native_function
from kdsl.codegen.tvm.default_schedule import default_schedule
from kdsl.codegen.tvm.machine import current_machine
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.lang.errors import KdslError, printable
from kdsl.runtime.progress import Progress
from kdsl.runtime.timing import median_seconds
from kdsl.runtime.workers import Slot, WorkerPool
from kdsl.tune.driver import parse_option, tune
from kdsl.tune.measurer import Measurer, _lowered, compile_module
from kdsl.tune.tuned import apply, best_record, export, schedule_lines

TUNERS = ("opevo", "alt", "gensor", "metaschedule")


def parse_layer(text: str) -> dict[str, int]:
    """One layer: a layer name of the built-in ResNet-18 tables (``conv3_x``), a JSON object of sizes,
    or a layer-table file (a built-in table's format) that holds one layer, or ``FILE:NAME``.

    >>> parse_layer('{"M": 4, "Cin": 8}')
    {'M': 4, 'Cin': 8}
    >>> parse_layer("conv3_x")["Cin"]
    128
    """

    text = text.strip()
    if text.startswith("{"):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise KdslError(f"--layers: not a JSON object: {error}") from None
        if not isinstance(values, dict) or not all(isinstance(v, int) for v in values.values()):
            raise KdslError("--layers: expected a JSON object of integer sizes")
        return values
    for table in ("resnet18", "resnet18_stride2"):
        for layer in solve.load_layers(table):
            if layer.name == text:
                return dict(layer.values)
    table, _, name = text.rpartition(":") if not os.path.exists(text) and ":" in text else (text, "", "")
    if os.path.exists(table):
        layers = solve.load_layers(table)
        chosen = [layer for layer in layers if layer.name == name] if name else list(layers)
        if len(chosen) == 1:
            return dict(chosen[0].values)
        names = ", ".join(printable(layer.name) for layer in layers)
        what = f"no layer {printable(name)!r}" if name else f"{len(layers)} layers"
        raise KdslError(
            f"--layers: {printable(table)} has {what}; tuning needs one: write {printable(table)}:NAME ({names})"
        )
    raise KdslError(
        f"--layers: unknown layer {printable(text)!r}; name one of ResNet-18's (conv2_x..conv5_x), give JSON "
        f"sizes, or a layer file"
    )


def add_tune_commands(subparsers: Any) -> None:
    """Register ``kdsl tune``."""
    tune = subparsers.add_parser(
        "tune",
        help="tune the TVM schedule of an operator at one layer, or build a kernel from the records (--apply)",
    )
    tune.add_argument("operator", help="gallery name, .dsl or .json file")
    tune.add_argument(
        "--layers",
        metavar="LAYER",
        help="one layer (required): a ResNet-18 layer name (conv3_x), JSON sizes, or a layer file (FILE or FILE:NAME)",
    )
    # the old spelling, kept working for scripts that use it
    tune.add_argument("--layer", dest="layers", help=argparse.SUPPRESS)
    tune.add_argument(
        "--tuner",
        choices=[*TUNERS, "random"],
        help="the search over schedules (default: opevo; with --apply: the best record of any tuner)",
    )
    tune.add_argument("--trials", type=positive_int, default=64, help="new measurements in this run")
    tune.add_argument("--db", default="tune.db", help="SQLite tuning records (a run resumes from them)")
    tune.add_argument("--seed", type=int, default=0, help="seed of the tuner")
    tune.add_argument(
        "--tuner-option",
        action="append",
        default=[],
        type=parse_option,
        metavar="KEY=VALUE",
        help="an option of the tuner (repeatable): opevo q=0.5, lambda=8 (parents), rho=8 (offspring), walks=all, "
        "init=random, or setting=paper (OpEvo's paper: lambda=rho=8, q=0.5, every parameter walked, random start); "
        "alt per_layout=4, layouts=6, pool=512 (candidates its cost model ranks per round), explore=0.125, "
        "min_records=8, model=false (no cost model)",
    )
    tune.add_argument("--batch", type=positive_int, default=8, help="configurations compiled in parallel per round")
    tune.add_argument(
        "--apply",
        action="store_true",
        help="tune nothing: take the best record in --db (of --tuner if given), print its schedule, and build it "
        "(into --out if given)",
    )
    tune.add_argument("--out", metavar="FILE.so", help="also compile the best schedule into this shared library")
    tune.add_argument("--json", action="store_true", help="print the best record as JSON instead of lines")
    add_mcpu_argument(tune)  # records are kept per mcpu: --apply finds a run's records with the same --mcpu
    tune.set_defaults(run=command_tune)


def _duration(seconds: float) -> str:
    """``0.512 ms``, or ``3.2 us`` below a tenth of a millisecond (a tiny kernel is not ``0.000 ms``).

    >>> _duration(0.000512), _duration(0.0000032), _duration(2.6e-8)
    ('0.512 ms', '3.2 us', '26 ns')
    """
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-4 else f"{seconds * 1e3:.3f} ms"


def _print_best(op: Any, layer: dict[str, int], record: Any, what: str, args: argparse.Namespace) -> None:
    macs = solve.cost(op, solve.bind(op, layer))["flops"]
    if args.json:
        summary = {
            "latency_ms": record.latency * 1e3 if record.latency is not None else None,
            "gmacs_per_s": macs / record.latency / 1e9 if record.latency else None,
            "tuner": record.tuner,
            "db": args.db,
            "config": record.config,
            "out": args.out,
        }
        print(json.dumps(summary, sort_keys=True))
        return
    rate = ""
    if record.latency:
        percent = percent_of_peak(macs, record.latency, current_machine().peak_gflops())
        rate = f", {macs / record.latency / 1e9:.1f} GMAC/s ({percent:.0f}% of peak)"
    print(f"{what}: {_duration(record.latency)}{rate} ({record.tuner}, records in {printable(args.db)})")
    print("schedule (one parameter a line; kdsl.tune.apply builds it):")
    for line in schedule_lines(record.config):
        print(f"  {line}")
    if args.out:
        print(f"wrote {printable(args.out)}")
    else:
        again = f"kdsl tune {printable(args.operator)} --layers '{printable(args.layers)}' --db {printable(args.db)}"
        print(f"build it: {again} --apply --out kernel.so, or kdsl.tune.apply(db, op, layer) in Python")


def command_tune(args: argparse.Namespace) -> int:
    """``kdsl tune OP --layers L``: tune (resumably), or with ``--apply`` use the best stored record."""
    select_mcpu(args.mcpu)  # before anything compiles or a worker starts: they read KDSL_MCPU
    if not args.layers:  # not `required=True`: the hidden old spelling --layer fills it too
        raise KdslError("kdsl tune needs --layers LAYER: one layer's name (conv3_x), JSON sizes, or a layer file")
    op = load_operator(args.operator)
    layer = parse_layer(args.layers)
    if not args.apply:
        args.tuner = args.tuner or "opevo"
    if args.apply:
        record = best_record(args.db, op, layer, args.tuner)  # no --tuner: the best of any tuner
        if args.out:
            export(record, op, layer, args.out)
        else:
            apply(record, op, layer)  # compiled once, so that a schedule this TVM refuses is an error here
        _print_best(op, layer, record, "best record", args)
        return 0
    quiet = args.json
    with Progress(
        f"tune ({args.tuner})", total=args.trials, unit="trials", stream=None if quiet else sys.stderr
    ) as bar:
        log = bar.note if args.tuner == "metaschedule" else None
        result = tune(
            op,
            layer,
            args.tuner,
            args.trials,
            args.db,
            batch=args.batch,
            seed=args.seed,
            log=log,
            progress=bar,
            options=dict(args.tuner_option),
        )
    best = result.best
    if best is None or best.latency is None:
        print(f"no valid schedule found ({result.measured} measured, {result.rejected} rejected)")
        return 1
    if args.out:
        if args.tuner == "metaschedule":
            if not result.library:
                raise KdslError("MetaSchedule kept no library of its best schedule; nothing to write to --out")
            shutil.copyfile(result.library, args.out)
        else:
            export(best, op, layer, args.out)
    if args.tuner == "metaschedule" and not args.json:
        print(f"best {best.latency * 1e3:.3f} ms (metaschedule, records in {printable(args.db)})")
        return 0
    _print_best(op, layer, best, f"best of {result.measured} measured", args)
    return 0


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument("--rounds", type=positive_int, default=5, help="alternating re-measurement rounds")
    add_mcpu_argument(parser)


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


def torch_pool() -> WorkerPool:
    """A worker process for :func:`torch_seconds`: PyTorch timed apart from TVM, whose pinned threads
    would slow it down in the same process (TVM.md), with as many threads as the TVM kernels, held to
    the ISA they are compiled for (:func:`~kdsl.bench.target.pytorch_environment`)."""
    threads = os.environ.get("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    return WorkerPool(
        _torch_job,
        setup=functools.partial(_torch_setup, int(threads)),
        environment={"OMP_NUM_THREADS": threads, **pytorch_environment()},
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


def _at(curve: list[float], n: int) -> str:
    if not curve:
        return "-"
    value = curve[min(n, len(curve)) - 1]
    return "-" if value == float("inf") else f"{value * 1e3:.2f}"


def bench_tune(args: argparse.Namespace) -> int:
    """``kdsl bench tune``: every tuner on the bench cases, equal budgets, ratios to PyTorch."""
    select_mcpu(args.mcpu)  # before anything compiles or a worker starts: they read KDSL_MCPU
    trials = args.trials or (12 if args.quick else 64)
    rounds = 1 if args.quick else args.rounds
    folder = tempfile.mkdtemp(prefix="kdsl-bench-tune-")
    db = args.db or os.path.join(folder, "tune.db")
    cases = [c for c in bench_cases() if args.cases is None or c[1] in args.cases]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"kdsl bench tune: {trials} trials per tuner, records in {db}; load average {load:.2f} at start")
    machine = current_machine()  # the --mcpu one: what every kernel below is compiled for
    peak = measured_peak_gflops(machine)
    print(machine_line(machine, measured=peak))
    checkpoints = [n for n in (8, 16, 32, 64, 128, 256) if n < trials] + [trials]
    started = time.time()
    for label, name, layer in cases:
        op = gallery.load(name)
        binding = solve.bind(op, layer)
        macs = solve.cost(op, binding)["flops"]  # multiply-accumulates, the unit of every kdsl command
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
                        space = ScheduleSpace(_lowered(op, binding))
                    path = os.path.join(folder, f"{name}-{tuner}.so")
                    compile_module(space.apply(result.best.config).mod, path)
                    libraries[tuner] = path
            path = os.path.join(folder, f"{name}-default.so")
            compile_module(default_schedule(_lowered(op, binding)).mod, path)
            libraries["default schedule"] = path
            final: dict[str, float] = {}
            torch_s = float("inf")
            # alternate the kernels and PyTorch, keep each one's best median: these VMs drift by up to
            # 1.5x over minutes, so a baseline timed once, minutes away from the kernels, misleads
            for _ in range(rounds):
                for tuner, library in libraries.items():
                    latency, error = measurer.time_library(library, check=True)
                    if latency is not None:
                        final[tuner] = min(final.get(tuner, float("inf")), latency)
                    elif error:
                        print(f"  {tuner}: re-measurement failed: {error}")
                torch_s = min(torch_s, torch_seconds(name, binding, 1, torch_worker))
        print(
            f"\n### {label} ({macs / 1e9:.3f} GMAC); PyTorch {torch_s * 1e3:.3f} ms, {macs / torch_s / 1e9:.1f} GMAC/s "
            f"({percent_of_peak(macs, torch_s, peak):.0f}% of peak)"
        )
        head = " | ".join(f"best ms @{n}" for n in checkpoints)
        print(f"| tuner | trials | {head} | final ms | GMAC/s | % of peak | vs PyTorch (speed) | tuning s |")
        print("| --- | ---: | " + " | ".join("---:" for _ in checkpoints) + " | ---: | ---: | ---: | ---: | ---: |")
        for tuner in [*args.tuners, "default schedule"]:
            result = results.get(tuner)
            seconds = final.get(tuner)
            curve = " | ".join(_at(result.curve, n) if result else "-" for n in checkpoints)
            measured = str(result.measured) if result else "-"
            spent = f"{result.seconds:.0f}" if result else "-"
            if seconds is None:
                print(f"| {tuner} | {measured} | {curve} | - | - | - | - | {spent} |")
                continue
            print(
                f"| {tuner} | {measured} | {curve} | {seconds * 1e3:.3f} | {macs / seconds / 1e9:.1f} | "
                f"{percent_of_peak(macs, seconds, peak):.0f}% | {torch_s / seconds:.2f}x | {spent} |"
            )
        print(flush=True)
    print(
        f"(metaschedule's curve is its own reported times; final columns: every best schedule recompiled and "
        f"re-measured in one process, alternating with PyTorch for {rounds} rounds, best median of each; "
        f"% of peak: GFLOP/s (2 per MAC) against the measured FMA peak of the machine line; "
        f"{time.time() - started:.0f} s in all)"
    )
    note = pytorch_note(machine)
    if note:
        print(f"({note})")
    return 0


if __name__ == "__main__":  # python -m kdsl.cli.tune_commands [bench options]
    parser = argparse.ArgumentParser(prog="kdsl bench tune")
    add_bench_arguments(parser)
    sys.exit(bench_tune(parser.parse_args()))
