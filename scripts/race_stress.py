"""Run a blocked kernel many times under load, comparing every output with the first, bit for bit.

    PYTHONPATH=. python scripts/race_stress.py --runs 200 --draws 3 --threads 2 4 8 --busy 2
    TVM_NUM_THREADS=4 PYTHONPATH=. python scripts/race_stress.py --measurers 15 --busy 2   # the tuner's path

The kernel is ResNet-18's ``conv2_x`` convolution (conv2d, N=1, C=64, 56x56, K=3) with the channel-blocked
signature (``NCHW16c``, :func:`~kdsl.codegen.tvm.signature_layout.block_signature`): its default schedule
and ``--draws`` random valid configurations of its schedule space, each compiled once to a shared library
as the tuner's compile workers do. For each ``--threads`` value a fresh process (``TVM_NUM_THREADS`` set:
more threads than cores is how a loaded machine looks to TVM's thread pool) loads every library and calls
it ``--runs`` times on two sets of the measurer's inputs in turn, the output buffer filled with NaN before
each call, while
``--busy`` processes spin on the cores. It counts the calls whose output differs from the first call's on the
same inputs in any bit, that hold a NaN (an element not written), and that fail the measurer's check against the float64
reference, and prints one line per (threads, kernel). ``--measurers N`` instead measures the default N times
through fresh :class:`~kdsl.tune.measurer.Measurer` objects, as ``kdsl tune --network`` does, and counts the
failed checks.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from kdsl import gallery
from kdsl.codegen import reference
from kdsl.codegen.tvm import load_tvm
from kdsl.codegen.tvm.signature_layout import block_array
from kdsl.tune.measurer import (
    Measurer,
    _compile_setup,
    _expected,
    _measure_setup,
    check_output,
    compile_module,
    signature_schedule,
)

OP = "conv2d"
LAYER = {"N": 1, "Cin": 64, "Cout": 64, "H": 56, "W": 56, "K": 3}
BLOCK = 16


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        sum(range(10000))


def compile_kernels(directory: str, draws: int, seed: int) -> list[tuple[str, str]]:
    """(label, library path) of the default schedule and ``draws`` random valid configurations, blocked."""
    space = _compile_setup(gallery.load(OP), dict(LAYER))
    rng = random.Random(seed)
    configs = [("default", space.heuristic())]
    while len(configs) < draws + 1:
        config = space.random(rng)
        try:
            signature_schedule(space, config, BLOCK)
        except Exception:  # a draw the blocked signature refuses: the tuner records it invalid, never runs it
            continue
        configs.append((f"draw {len(configs)}", config))
    kernels = []
    for label, config in configs:
        path = os.path.join(directory, f"k{len(kernels)}.so")
        compile_module(signature_schedule(space, config, BLOCK).mod, path)
        kernels.append((label, path))
    return kernels


def _input_sets(tvm: Any) -> list[dict[str, Any]]:
    """Two measuring-worker states of different random inputs (seeds 0 and 1), blocked as the measurer's."""
    sets = []
    for seed in (0, 1):
        state = _measure_setup(gallery.load(OP), dict(LAYER), BLOCK)
        x, weights = reference.random_inputs(state["op"], state["layer"], dtype=np.float32, seed=seed)
        state["x"], state["weights"] = x, weights
        plain = [block_array(x, BLOCK), *weights]
        state["args"] = [tvm.runtime.tensor(a, state["dev"]) for a in plain]
        _expected(state)
        sets.append(state)
    return sets


def child(kernels: list[tuple[str, str]], runs: int) -> None:
    """In a process with ``TVM_NUM_THREADS`` set: run each kernel ``runs`` times, alternating two input
    sets (so that a scratch buffer left from the call before holds the other set's data: a kernel that
    reads its packed weights before they are all written computes with the wrong ones, not with the
    same ones by luck); print a JSON line per kernel."""
    tvm = load_tvm()
    sets = _input_sets(tvm)
    out = sets[0]["out"]
    nan = np.full(tuple(int(d) for d in out.shape), np.nan, dtype=np.float32)
    for label, path in kernels:
        main = tvm.runtime.load_module(path)["main"]
        firsts: list[Any] = [None, None]
        differ = unwritten = wrong = 0
        started = time.perf_counter()
        for run in range(runs):
            state = sets[run % 2]
            out.copyfrom(nan)
            main(*state["args"], out)
            got = out.numpy()
            first = firsts[run % 2] = got.copy() if firsts[run % 2] is None else firsts[run % 2]
            differ += not np.array_equal(got.view(np.uint32), first.view(np.uint32))
            unwritten += bool(np.isnan(got).any())
            wrong += check_output(got, state["expected"][1]) is not None
        seconds = (time.perf_counter() - started) / runs
        row = {"kernel": label, "runs": runs, "differ": differ, "unwritten": unwritten, "wrong": wrong}
        print(json.dumps({**row, "ms": round(seconds * 1e3, 2)}), flush=True)


def through_measurers(count: int, busy: int) -> None:
    """The default configuration measured ``count`` times as ``kdsl tune --network`` measures it: each time
    by a fresh :class:`~kdsl.tune.measurer.Measurer` (compile workers, a measuring worker whose first
    library it is, the check on its first call), ``busy`` processes spinning; prints the failures."""
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,)) for _ in range(busy)]
    for spinner in spinners:
        spinner.start()
    failures = []
    try:
        for _ in range(count):
            with Measurer(gallery.load(OP), dict(LAYER), block=BLOCK) as measurer:
                space = _compile_setup(gallery.load(OP), dict(LAYER))
                ((latency, error),) = measurer.measure(space, [space.heuristic()])
            if latency is None:
                failures.append(error)
                print(error, flush=True)
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
    threads = os.environ.get("TVM_NUM_THREADS", "2")
    print(f"{count} fresh measurers, TVM_NUM_THREADS={threads}: {len(failures)} failed; load {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--busy", type=int, default=2, help="spinning processes during the runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--measurers", type=int, default=0, help="instead: the tuner's path, fresh each time")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child), args.runs)
        return
    if args.measurers:
        through_measurers(args.measurers, args.busy)
        return
    with tempfile.TemporaryDirectory(prefix="kdsl-race-") as directory:
        kernels = compile_kernels(directory, args.draws, args.seed)
        stop = multiprocessing.Event()
        spinners = [multiprocessing.Process(target=_spin, args=(stop,)) for _ in range(args.busy)]
        for spinner in spinners:
            spinner.start()
        try:
            for threads in args.threads:
                environment = {**os.environ, "TVM_NUM_THREADS": str(threads)}
                command = [sys.executable, __file__, "--runs", str(args.runs), "--child", json.dumps(kernels)]
                result = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
                for line in result.stdout.splitlines():
                    print(json.dumps({"threads": threads, **json.loads(line)}))
                if result.returncode:
                    print(f"threads {threads}: the child failed ({result.returncode}): {result.stderr[-500:]}")
        finally:
            stop.set()
            for spinner in spinners:
                spinner.join()
        print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
