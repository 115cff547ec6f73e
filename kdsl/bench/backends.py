"""``kdsl bench codegen``: kdsl's generated code against PyTorch's own operators, side by side.

For every gallery operator and every layer of a table it measures, in one run: the forward and
forward+backward time of the kdsl->PyTorch module, of the native PyTorch function where one
exists (:mod:`kdsl.codegen.native`; for the branching kernels, max pooling, squeeze-excitation,
attention, Canvas's kernels, the hand-written PyTorch of its ``BRANCHING`` entries), and the
forward time of the kdsl->TVM kernel with its default schedule. Linear operators and branching
kernels (:class:`~kdsl.lang.operator.Operator`) go through the same calls: the solver binds and costs
both, and both backends build both. PyTorch and TVM are timed in separate worker processes, because TVM pins its threads
and then slows PyTorch down in the same process (see TVM.md); the timings of each case hold the
machine's latency slot (:func:`kdsl.runtime.timing.latency_slot`). Times are medians over repeats
(:func:`kdsl.runtime.timing.interleaved_medians`): the kdsl->PyTorch module and the native function
are timed in alternation, so that on a shared machine both see the same background load; ratios are
kdsl / native (lower is better; 1.0 means as fast).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from kdsl import gallery, solve
from kdsl.bench.target import (
    add_mcpu_argument,
    machine_line,
    measured_peak_gflops,
    percent_of_peak,
    pytorch_environment,
    pytorch_note,
    select_mcpu,
)
from kdsl.codegen import torch as kdsl_torch
from kdsl.codegen import tvm as kdsl_tvm
from kdsl.codegen.native import NATIVE
from kdsl.codegen.tvm.machine import current_machine
from kdsl.lang.errors import KdslError
from kdsl.lang.library import load_operator
from kdsl.runtime.progress import Progress
from kdsl.runtime.timing import interleaved_medians, latency_slot, median_seconds
from kdsl.runtime.units import format_time, time_unit
from kdsl.solve.layers import load_layers, with_batch


def _time(function: Callable[[], Any]) -> float:
    """Median seconds per call (kdsl's one timing helper), ~0.15 s per repeat, 5 repeats."""
    return median_seconds(function, repeats=5, target=0.15)


def _times(functions: Sequence[Callable[[], Any]]) -> list[float]:
    """Median seconds per call of each function, timed in alternation (same repeats as :func:`_time`)."""
    return interleaved_medians(functions, repeats=5, target=0.15)


def _layers(table: str, batch: int) -> list[tuple[str, dict[str, int]]]:
    return [(layer.name, with_batch(layer, batch).values) for layer in load_layers(table)]


def _cases(names: Sequence[str] | None, table: str, batch: int) -> list[tuple[str, str, dict[str, int], int]]:
    """(operator, layer name, binding, MACs) for every operator valid on the layer."""
    cases = []
    for name in names or gallery.names():
        op = load_operator(name)  # a gallery name or a .dsl/.json file, as every command takes
        for layer_name, values in _layers(table, batch):
            try:
                binding = solve.bind(op, values)
                macs = solve.cost(op, binding)["macs"]
            except KdslError:
                continue
            cases.append((name, layer_name, binding, macs))
        if names and not any(case[0] == name for case in cases):
            raise KdslError(f"{name} is valid on no layer of {table} (see kdsl check {name} --layers {table})")
    return cases


def _torch_case(name: str, layer_name: str, binding: dict[str, int]) -> dict[str, Any]:
    import torch

    op = load_operator(name)
    module = kdsl_torch.build(op, binding)
    x = torch.randn(tuple(int(d.size.evaluate(binding)) for d in op.inputs))
    x_grad = x.clone().requires_grad_(True)

    def train_step(forward: Callable[[Any], Any]) -> None:
        forward(x_grad).sum().backward()

    row: dict[str, Any] = {"op": name, "layer": layer_name}
    native: Callable[[Any], Any] | None = None
    if name in NATIVE:
        prepare, call = NATIVE[name]
        weights = [torch.nn.Parameter(w.detach().clone()) for w in prepare(list(module.weights), binding)]

        def native_call(data: Any) -> Any:
            return call(data, weights, binding)

        native = native_call

    # one timing at a time on the machine (discover, tuning, other benches); building stays outside
    forwards: list[Callable[[], Any]] = [lambda: module(x)]
    steps: list[Callable[[], Any]] = [lambda: train_step(module)]
    if native is not None:
        forwards.append(lambda: native(x))
        steps.append(lambda: train_step(native))
    with latency_slot():
        with torch.no_grad():
            forward_times = _times(forwards)
        step_times = _times(steps)
    row["kdsl_fwd"], row["kdsl_fwdbwd"] = forward_times[0], step_times[0]
    if native is not None:
        row["native_fwd"], row["native_fwdbwd"] = forward_times[1], step_times[1]
    return row


def _tvm_case(name: str, layer_name: str, binding: dict[str, int]) -> dict[str, Any]:
    import torch

    kernel = kdsl_tvm.build(load_operator(name), binding)
    x = torch.randn(kernel.input_shape)
    weights = [torch.randn(shape) for shape in kernel.weight_shapes]
    with latency_slot():
        return {"op": name, "layer": layer_name, "tvm_fwd": _time(lambda: kernel(x, *weights))}


#: the line a worker writes on stderr after each case, for the parent's progress bar
_DONE = "kdsl-bench-case-done"


def _run_worker(kind: str, args: argparse.Namespace, bar: Progress | None = None) -> list[dict[str, Any]]:
    command = [sys.executable, "-m", "kdsl.bench.backends", "--worker", kind, "--layers", args.layers]
    command += ["--batch", str(args.batch)]
    if args.ops:
        command += ["--ops", *args.ops]
    environment = dict(os.environ)
    environment.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))
    if kind == "torch":  # native PyTorch held to the ISA the TVM kernels are compiled for (--mcpu)
        environment.update(pytorch_environment())
    # stderr is read line by line: each finished case moves the bar, the rest is kept for an error
    # (stdout goes to a file: a full stdout pipe would block the worker while stderr is being read)
    with tempfile.TemporaryFile("w+") as out:
        with subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE, text=True, env=environment) as worker:
            assert worker.stderr is not None
            kept: list[str] = []
            for line in worker.stderr:
                if line.startswith(_DONE):
                    if bar is not None:
                        bar.update(1, last=f"{kind} {line[len(_DONE) :].strip()}")
                else:
                    kept = (kept + [line])[-200:]
            code = worker.wait()
        out.seek(0)
        stdout = out.read()
    if code != 0:
        raise KdslError(f"the {kind} benchmark worker failed:\n{''.join(kept)[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


#: the table's time columns: one unit for all of them (kdsl.runtime.units, chosen by the fastest)
_TIMES = ("kdsl_fwd", "native_fwd", "kdsl_fwdbwd", "native_fwdbwd", "tvm_fwd")


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:6.2f}" if a is not None and b else f"{'-':>6}"


def _percent(macs: int, seconds: float | None, peak: float) -> str:
    """``macs`` in ``seconds`` as percent of ``peak`` GFLOP/s, or ``-``."""
    return f"{percent_of_peak(macs, seconds, peak):.0f}" if seconds and macs else "-"


def bench_codegen(args: argparse.Namespace) -> int:
    """Print the side-by-side table (and return 0)."""
    # before the workers start: they inherit KDSL_MCPU, which every TVM compile reads
    select_mcpu(getattr(args, "mcpu", None))
    cases = _cases(args.ops, args.layers, args.batch)
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    with Progress("bench codegen", total=2 * len(cases), unit="cases", stream=sys.stderr) as bar:
        for kind in ("torch", "tvm"):
            for row in _run_worker(kind, args, bar):
                merged.setdefault((row["op"], row["layer"]), {}).update(row)
    macs = {(name, layer): m for name, layer, _, m in cases}
    rows = []
    for key, row in merged.items():
        row["macs"] = macs[key]
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    machine = current_machine()  # what the TVM worker compiled for (the same KDSL_MCPU)
    peak = measured_peak_gflops(machine)  # after the workers: nothing else runs while it is timed
    unit, scale, decimals = time_unit(row.get(key) for row in rows for key in _TIMES)

    def _ms(value: float | None) -> str:  # a time cell in the table's unit
        return f"{format_time(value, scale, decimals):>9}"

    print(f"kdsl bench codegen: layers {args.layers}, batch {args.batch}; times in {unit} (median), ratios kdsl/native")
    print(machine_line(machine, measured=peak))
    print("native: PyTorch's own function, or hand-written PyTorch for a branching kernel (kdsl.codegen.native).")
    print("MMAC: millions of multiply-accumulates, GMAC/s: billions a second. PyTorch and TVM in separate processes.")
    print(
        "%pk: GFLOP/s (2 per MAC) as percent of the machine's measured FMA peak: native PyTorch's forward and TVM's.\n"
    )
    header = (
        f"{'operator':<27}{'layer':<9}{'MMAC':>9} | {'torch fwd':>9}{'native':>9}{'ratio':>6} | "
        f"{'torch f+b':>9}{'native':>9}{'ratio':>6} | {'tvm fwd':>9}{'vs nat':>7}{'GMAC/s':>8}{'%pk':>5}"
        f"{'nat %pk':>8}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        tvm_rate = row["macs"] / row["tvm_fwd"] / 1e9 if row.get("tvm_fwd") and row["macs"] else None
        tvm_peak = _percent(row["macs"], row.get("tvm_fwd"), peak)
        native_peak = _percent(row["macs"], row.get("native_fwd"), peak)
        print(
            f"{row['op']:<27}{row['layer']:<9}{row['macs'] / 1e6:9.1f} | {_ms(row.get('kdsl_fwd'))}"
            f"{_ms(row.get('native_fwd'))}{_ratio(row.get('kdsl_fwd'), row.get('native_fwd'))} | "
            f"{_ms(row.get('kdsl_fwdbwd'))}{_ms(row.get('native_fwdbwd'))}"
            f"{_ratio(row.get('kdsl_fwdbwd'), row.get('native_fwdbwd'))} | {_ms(row.get('tvm_fwd'))}"
            f"{_ratio(row.get('tvm_fwd'), row.get('native_fwd')):>7}"
            f"{(f'{tvm_rate:8.1f}' if tvm_rate else f'{chr(45):>8}')}{tvm_peak:>5}{native_peak:>8}"
        )
    failures = [(row, kind) for row in rows for kind in ("torch", "tvm") if row.get(f"{kind}_error")]
    if failures:
        print("\nNot measured (the backend failed on the case):")
    for row, kind in failures:
        print(f"  {row['op']} {row['layer']} {kind}: {row[f'{kind}_error']}")
    note = pytorch_note(machine)
    if note:
        print(f"\n({note})")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", default="resnet18", help="layer table (resnet18, resnet18_stride2, or a JSON file)")
    parser.add_argument("--batch", type=int, default=8, help="batch size N")
    parser.add_argument(
        "--ops",
        nargs="*",
        metavar="OP",
        help="gallery names or .dsl/.json files to measure (default: the whole gallery)",
    )
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON instead of a table")
    add_mcpu_argument(parser)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kdsl.bench.backends")
    add_arguments(parser)
    parser.add_argument("--worker", choices=["torch", "tvm"], required=True)
    args = parser.parse_args(argv)
    cases = _cases(args.ops, args.layers, args.batch)
    import torch

    torch.manual_seed(0)
    measure = _torch_case if args.worker == "torch" else _tvm_case
    rows = []
    for name, layer_name, binding, _ in cases:
        try:
            rows.append(measure(name, layer_name, binding))
        except Exception as error:  # one case's failure (a backend's bug) must not hide the others
            message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            rows.append({"op": name, "layer": layer_name, f"{args.worker}_error": message[:300]})
        print(f"{_DONE} {name} {layer_name}", file=sys.stderr, flush=True)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def gallery_latencies(names: Sequence[str], batch: int) -> dict[str, dict[str, float]]:
    """Median forward milliseconds of each gallery operator on its first layer, per backend,
    measured by the codegen benchmark's workers (each framework in its own process)."""
    import argparse

    measured: dict[str, dict[str, float]] = {}
    by_table: dict[str, list[str]] = {}
    for name in names:
        table = gallery.layer_table(name)
        if table is not None:
            by_table.setdefault(table, []).append(name)
    for table, members in by_table.items():
        args = argparse.Namespace(layers=table, batch=batch, ops=members, json=True)
        for kind in ("torch", "tvm"):
            for row in _run_worker(kind, args):
                entry = measured.setdefault(row["op"], {})
                for key in ("kdsl_fwd", "native_fwd", "tvm_fwd"):
                    if key in row:
                        entry.setdefault(f"{key}_ms", 0.0)
                        entry[f"{key}_ms"] += row[key] * 1e3
    return measured
