"""Command-line handler of ``kdsl tune`` (``kdsl bench tune`` is :mod:`kdsl.bench.tune_bench`).

>>> import argparse
>>> parser = argparse.ArgumentParser(); commands = parser.add_subparsers()
>>> add_tune_commands(commands)
>>> parser.parse_args(["tune", "conv2d", "--layers", "conv3_x", "--trials", "8"]).trials
8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any

from kdsl import solve
from kdsl.bench.argument_types import positive_int
from kdsl.bench.target import (
    add_mcpu_argument,
    percent_of_peak,
    select_mcpu,
)
from kdsl.cli.operator_commands import load_operator
from kdsl.codegen.tvm.machine import current_machine
from kdsl.lang.errors import KdslError, printable
from kdsl.runtime.progress import Progress
from kdsl.tune.driver import TUNERS, parse_option, tune
from kdsl.tune.tuned import apply, best_record, export, schedule_lines


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
        "--cost-model-db",
        action="append",
        default=[],
        metavar="DB",
        help="records databases (repeatable) whose tasks on this target train the cross-operator cost model that "
        "ranks opevo/alt/random candidates, beside --db's other tasks (kdsl bench costmodel --collect makes one)",
    )
    tune.add_argument("--no-cost-model", action="store_true", help="never rank candidates with the cost model")
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
            cost_model_db=args.cost_model_db,
            cost_model=not args.no_cost_model,
        )
    if result.ranking is not None and not args.json:
        print(result.ranking.line())
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
