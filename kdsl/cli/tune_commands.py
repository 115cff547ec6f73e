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
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from typing import Any

from kdsl import solve
from kdsl.bench.argument_types import TUNE_DB, positive_int
from kdsl.bench.network_tune import add_network_arguments, command_tune_network
from kdsl.bench.peak_cache import roofline_for
from kdsl.bench.roofline import Roofline, default_latency, minimum_bytes, program_macs, room_line
from kdsl.bench.target import (
    add_mcpu_argument,
    percent_of_peak,
    select_mcpu,
)
from kdsl.cli.operator_commands import load_operator
from kdsl.codegen.tvm import write_description
from kdsl.codegen.tvm.machine import current_machine
from kdsl.lang.errors import KdslError, printable
from kdsl.runtime.progress import Progress
from kdsl.runtime.units import duration, time_column
from kdsl.tune.driver import TUNERS, check_options, parse_option, tune
from kdsl.tune.tuned import apply, best_record, export, schedule_lines


def parse_layer(text: str) -> dict[str, int]:
    """One layer: a layer name of the built-in ResNet-18 tables (``conv3_x``), a JSON object of sizes,
    or a layer-table file (a built-in table's format) that holds one layer, or ``FILE:NAME``.

    >>> parse_layer('{"M": 4, "Cin": 8}')
    {'M': 4, 'Cin': 8}
    >>> parse_layer("conv3_x")["Cin"]
    128
    """
    layers = parse_layers([text])
    if len(layers) != 1:
        names = ", ".join(name for name, _ in layers)
        raise KdslError(f"--layers {printable(text)}: {len(layers)} layers ({names}); one is needed here")
    return layers[0][1]


def parse_layers(items: Sequence[str]) -> list[tuple[str, dict[str, int]]]:
    """``kdsl tune --layers``: every layer the items name, as (name, sizes), in order. An item is a
    ResNet-18 layer name (``conv3_x``), a built-in table (``resnet18``: all its layers), a JSON object
    of sizes, a layer-table file (all its layers) or ``FILE:NAME`` (one of them).

    >>> [name for name, _ in parse_layers(["conv2_x", "conv4_x"])]
    ['conv2_x', 'conv4_x']
    >>> len(parse_layers(["resnet18"])), parse_layers(['{"M": 4}'])
    (4, [('{"M": 4}', {'M': 4})])
    """
    found: list[tuple[str, dict[str, int]]] = []
    for item in items:
        found.extend(_layers_of(item.strip()))
    names = [name for name, _ in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise KdslError(f"--layers names {', '.join(map(printable, twice))} twice")
    return found


def _layers_of(text: str) -> list[tuple[str, dict[str, int]]]:
    if text.startswith("{"):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise KdslError(f"--layers: not a JSON object: {error}") from None
        if not isinstance(values, dict) or not all(isinstance(v, int) for v in values.values()):
            raise KdslError("--layers: expected a JSON object of integer sizes")
        return [(text, values)]
    if text in ("resnet18", "resnet18_stride2"):
        return [(layer.name, dict(layer.values)) for layer in solve.load_layers(text)]
    for table in ("resnet18", "resnet18_stride2"):
        for layer in solve.load_layers(table):
            if layer.name == text:
                return [(layer.name, dict(layer.values))]
    table, _, name = text.rpartition(":") if not os.path.exists(text) and ":" in text else (text, "", "")
    if os.path.exists(table):
        layers = solve.load_layers(table)
        chosen = [layer for layer in layers if layer.name == name] if name else list(layers)
        if not chosen:
            names = ", ".join(printable(layer.name) for layer in layers)
            raise KdslError(f"--layers: {printable(table)} has no layer {printable(name)!r} (it has {names})")
        return [(layer.name, dict(layer.values)) for layer in chosen]
    raise KdslError(
        f"--layers: unknown layer {printable(text)!r}; name one of ResNet-18's (conv2_x..conv5_x) or a table "
        f"(resnet18), give JSON sizes, or a layer file (FILE or FILE:NAME)"
    )


def add_tune_commands(subparsers: Any) -> None:
    """Register ``kdsl tune``."""
    tune = subparsers.add_parser(
        "tune",
        help="tune the TVM schedule of an operator at one or more layers, or build kernels from the records (--apply)",
    )
    tune.add_argument(
        "operator",
        nargs="?",
        help="gallery name, .dsl or .json file (with --network: the operator in its 3x3 convolutions, default "
        "conv2d, NAME:G=2 setting a coefficient)",
    )
    tune.add_argument(
        "--layers",
        nargs="+",
        action="extend",
        metavar="LAYER",
        help="the layers to tune, each in turn (required): ResNet-18 layer names (conv3_x conv4_x), a table "
        "(resnet18: all its layers), JSON sizes, or a layer file (FILE: all its layers, FILE:NAME: one)",
    )
    # the old spelling, kept working for scripts that use it
    tune.add_argument("--layer", dest="layers", nargs="+", action="extend", help=argparse.SUPPRESS)
    tune.add_argument(
        "--tuner",
        choices=[*TUNERS, "random"],
        help="the search over schedules (default: opevo; with --apply: the best record of any tuner)",
    )
    tune.add_argument("--trials", type=positive_int, default=64, help="new measurements in this run")
    tune.add_argument("--db", default=TUNE_DB, help="SQLite tuning records (a run resumes from them)")
    tune.add_argument("--seed", type=int, default=0, help="seed of the tuner")
    tune.add_argument(
        "--tuner-option",
        action="append",
        default=[],
        type=parse_option,
        metavar="KEY=VALUE",
        help="an option of the tuner (repeatable): opevo q=0.5, lambda=8 (parents=8), rho=8 (offspring=8), walks=all, "
        "init=random, or setting=paper (OpEvo's paper: lambda=rho=8, q=0.5, every parameter walked, random start); "
        "alt per_layout=4, layouts=6, pool=512 (candidates its cost model ranks per round), explore=0.125, "
        "min_records=8, model=false (no cost model)",
    )
    tune.add_argument(
        "--compile-batch",
        type=positive_int,
        default=8,
        metavar="N",
        help="configurations compiled in parallel per round (--batch is a batch size, as in every command)",
    )
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
        "--prepacked",
        action="store_true",
        help="tune (or with --apply, read) the kernel that takes the weights its schedule packs already packed, as "
        "a compiled network runs it: packed once, outside the measured time; records of a task of their own "
        "(--network always tunes so)",
    )
    tune.add_argument(
        "--apply",
        action="store_true",
        help="tune nothing: take the best record in --db (of --tuner if given), print its schedule, and build it "
        "(into --out if given)",
    )
    tune.add_argument(
        "--out",
        metavar="FILE.so",
        help="also compile the best schedule into this shared library (several layers: FILE_LAYER.so each)",
    )
    tune.add_argument("--json", action="store_true", help="print the best record as JSON instead of lines")
    tune.add_argument(
        "--no-roofline",
        action="store_true",
        help="skip measuring the machine's peak (seconds) for the line that says how far the default schedule "
        "is from its roofline",
    )
    tune.add_argument(
        "--remeasure-peak",
        action="store_true",
        help="measure the machine's peak for the roofline line now, not from the week-old-at-most cache "
        "(kdsl.bench.peak_cache)",
    )
    add_mcpu_argument(tune)  # records are kept per mcpu: --apply finds a run's records with the same --mcpu
    add_network_arguments(tune)  # kdsl tune --network resnet18: every layer of a network, one budget
    tune.set_defaults(run=command_tune)


def _print_best(op: Any, layer: dict[str, int], record: Any, what: str, args: argparse.Namespace) -> None:
    macs = solve.cost(op, solve.bind(op, layer))["macs"]
    if args.json:
        print(json.dumps(_summary(op, layer, record, args), sort_keys=True))
        return
    rate = ""
    if record.latency:
        percent = percent_of_peak(macs, record.latency, current_machine().peak_gflops())
        rate = f", {macs / record.latency / 1e9:.1f} GMAC/s ({percent:.0f}% of peak)"
    print(f"{what}: {duration(record.latency)}{rate} ({record.tuner}, records in {printable(args.db)})")
    print("schedule (one parameter a line; kdsl.tune.apply builds it):")
    for line in schedule_lines(record.config):
        print(f"  {line}")
    if args.out:
        print(f"wrote {printable(args.out)}")
    else:
        layers = " ".join(shlex.quote(item) for item in args.layers)
        again = f"kdsl tune {printable(args.operator)} --layers {printable(layers)} --db {printable(args.db)}"
        if args.prepacked:  # its loaded kernel takes the weights packed: say how to pack them
            print(
                f"build it: {again} --prepacked --apply --out kernel.so, then kernel = kdsl.codegen.tvm.load("
                f"'kernel.so') and kernel(x, *kernel.pack_weights(*weights)) (pack once), or "
                f"kdsl.tune.apply(db, op, layer, prepacked=True) in Python"
            )
        else:
            print(f"build it: {again} --apply --out kernel.so, or kdsl.tune.apply(db, op, layer) in Python")


def _summary(op: Any, layer: dict[str, int], record: Any, args: argparse.Namespace, out: str | None = None) -> dict:
    """One layer's best record as ``--json`` prints it."""
    macs = solve.cost(op, solve.bind(op, layer))["macs"]
    latency = record.latency if record is not None else None
    return {
        "latency_ms": latency * 1e3 if latency is not None else None,
        "gmacs_per_s": macs / latency / 1e9 if latency else None,
        "tuner": record.tuner if record is not None else args.tuner,
        "db": args.db,
        "config": record.config if record is not None else None,
        "out": out if out is not None else args.out,
    }


def _out_path(out: str | None, name: str, index: int, several: bool) -> str | None:
    """``--out`` for one of several layers: ``FILE_LAYER.so`` (a JSON layer: ``FILE_layerN.so``).

    >>> _out_path("k.so", "conv3_x", 1, True), _out_path("k.so", '{"M": 4}', 2, True), _out_path("k.so", "x", 1, False)
    ('k_conv3_x.so', 'k_layer2.so', 'k.so')
    """
    if out is None or not several:
        return out
    stem, suffix = os.path.splitext(out)
    label = name if re.fullmatch(r"[A-Za-z0-9_.-]+", name) else f"layer{index}"
    return f"{stem}_{label}{suffix}"


def command_tune(args: argparse.Namespace) -> int:
    """``kdsl tune OP --layers L [L ...]``: tune each layer in turn (resumably), or with ``--apply`` build
    each layer's best stored record; several layers end with one summary table."""
    select_mcpu(args.mcpu)  # before anything compiles or a worker starts: they read KDSL_MCPU
    if args.network:
        return command_tune_network(args)
    if not args.operator:
        raise KdslError("kdsl tune needs an OPERATOR (a gallery name, .dsl or .json file), or --network NAME")
    if args.batch_sizes:
        raise KdslError(
            "kdsl tune --batch is the batch size of --network's networks; the configurations compiled per round "
            "are --compile-batch"
        )
    if not args.layers:  # not `required=True`: the hidden old spelling --layer fills it too
        raise KdslError("kdsl tune needs --layers LAYER: a layer's name (conv3_x), JSON sizes, or a layer file")
    op = load_operator(args.operator)
    layers = parse_layers(args.layers)
    if not args.apply:
        args.tuner = args.tuner or "opevo"
        check_options(args.tuner, dict(args.tuner_option))  # before the first layer's run starts
    several = len(layers) > 1
    rows = []
    for index, (name, layer) in enumerate(layers, 1):
        out = _out_path(args.out, name, index, several)
        if args.apply:
            # no --tuner: the best of any tuner
            record = best_record(args.db, op, layer, args.tuner, prepacked=args.prepacked)
            if out:
                export(record, op, layer, out, prepacked=args.prepacked)
            else:
                apply(record, op, layer)  # compiled once, so that a schedule this TVM refuses is an error here
            rows.append((name, layer, record, out, None))
        else:
            record, result = _tune_layer(op, name, layer, out, args, several)
            rows.append((name, layer, record, out, result))
    if several:
        code = _print_table(op, rows, args)
        _print_rooflines(op, rows, args)
        return code
    name, layer, record, out, result = rows[0]
    if record is None or record.latency is None:
        counts = f"{result.measured} measured, {result.rejected} rejected, {result.refused} candidates refused"
        print(f"no valid schedule found ({counts})")
        return 1
    if args.tuner == "metaschedule" and not args.apply and not args.json:
        print(f"best {duration(record.latency)} (metaschedule, records in {printable(args.db)})")
        _print_rooflines(op, rows, args)
        return 0
    _print_best(op, layer, record, "best record" if args.apply else f"best of {result.measured} measured", args)
    _print_rooflines(op, rows, args)
    return 0


def _tune_layer(
    op: Any, name: str, layer: dict[str, int], out: str | None, args: argparse.Namespace, several: bool
) -> tuple[Any, Any]:
    """Tune one layer; write ``out`` from its best record. Returns (best record or None, the run's result)."""
    title = f"tune ({args.tuner}, {name})" if several else f"tune ({args.tuner})"
    with Progress(title, total=args.trials, unit="trials", stream=None if args.json else sys.stderr) as bar:
        log = bar.note if args.tuner == "metaschedule" else None
        result = tune(
            op,
            layer,
            args.tuner,
            args.trials,
            args.db,
            batch=args.compile_batch,
            seed=args.seed,
            log=log,
            progress=bar,
            options=dict(args.tuner_option),
            cost_model_db=args.cost_model_db,
            cost_model=not args.no_cost_model,
            prepacked=args.prepacked,
        )
    if result.ranking is not None and not args.json:
        print(result.ranking.line())
    best = result.best
    if best is None or best.latency is None:
        return None, result
    if out:
        if args.tuner == "metaschedule":
            if not result.library:
                raise KdslError("MetaSchedule kept no library of its best schedule; nothing to write to --out")
            shutil.copyfile(result.library, out)
            write_description(out, op, solve.bind(op, layer), "float32")  # what kdsl.codegen.tvm.load reads
        else:
            export(best, op, layer, out, prepacked=args.prepacked)
    return best, result


def _print_rooflines(op: Any, rows: list[tuple], args: argparse.Namespace) -> None:
    """A line per tuned layer: its roofline (the machine's peak, measured once here) and the default
    schedule's share of it, from the run's records (:func:`kdsl.bench.roofline.room_line`; the peak from the
    cache, :func:`kdsl.bench.peak_cache.roofline_for`, unless ``--remeasure-peak``); nothing with
    ``--apply``, ``--json`` or ``--no-roofline``."""
    if args.apply or args.json or args.no_roofline:
        return
    roofline: Roofline | None = None
    for name, layer, record, _, result in rows:
        if result is None:
            continue
        if roofline is None:
            roofline, source = roofline_for(remeasure=getattr(args, "remeasure_peak", False))
            print(f"{roofline.line()} ({source})")
        try:
            binding = solve.bind(op, layer)
            bound = roofline.bound(program_macs(op, binding), minimum_bytes(op, binding))
            default = default_latency(args.db, result.task, op, binding)
        except KdslError as error:  # the tuning is done and reported: a layer without a bound says why
            print(f"roofline of {printable(name)}: not computed ({error.message})")
            continue
        best = record.latency if record is not None else None
        print(room_line(printable(name), bound, roofline, default, best))


def _print_table(op: Any, rows: list[tuple], args: argparse.Namespace) -> int:
    """Several layers: one table (a row per layer, one time unit for the column), or ``--json``."""
    if args.json:
        summaries = [_summary(op, layer, record, args, out) | {"layer": name} for name, layer, record, out, _ in rows]
        print(json.dumps({"layers": summaries}, sort_keys=True))
        return 0 if all(record is not None for _, _, record, _, _ in rows) else 1
    unit, times = time_column([record.latency if record is not None else None for _, _, record, _, _ in rows])
    peak = current_machine().peak_gflops()
    width = max(12, *(len(printable(name)) + 2 for name, *_ in rows))
    print(f"{'layer':<{width}}{'best ' + unit:>10}{'GMAC/s':>9}{'% peak':>8}  {'tuner':<13}{'measured':>9}  out")
    for (name, layer, record, out, result), time_text in zip(rows, times):
        macs = solve.cost(op, solve.bind(op, layer))["macs"]
        latency = record.latency if record is not None else None
        rate = f"{macs / latency / 1e9:.1f}" if latency else "-"
        percent = f"{percent_of_peak(macs, latency, peak):.0f}" if latency else "-"
        measured = str(result.measured) if result is not None else "-"
        tuner = record.tuner if record is not None else "-"
        print(
            f"{printable(name):<{width}}{time_text:>10}{rate:>9}{percent:>8}  {tuner:<13}{measured:>9}  "
            f"{printable(out or '-')}"
        )
    print(f"records in {printable(args.db)}")
    return 0 if all(record is not None for _, _, record, _, _ in rows) else 1
