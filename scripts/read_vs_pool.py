"""The read-bandwidth kernel of ``kdsl bench peak`` beside a memory-bound kernel it should bound, in one process.

    PYTHONPATH=. python scripts/read_vs_pool.py                      # Gensor's P3 pooling, 5 rounds
    PYTHONPATH=. python scripts/read_vs_pool.py --case V3 --rounds 9  # the GEMV V3 instead

A roofline's memory bound is only a bound if the read kernel moves bytes at least as fast as any kernel
kdsl runs. Timings taken minutes apart (``kdsl bench peak``, then a suite) can differ by what the
machine's neighbours did in between; this script times both kernels in alternating rounds in the same
process, each round its best of a few repeats: the read kernel over the DRAM buffer of
:func:`kdsl.bench.peak.measure_bandwidth` (checked against NumPy) and the case's default schedule
(inputs as the tuners' measurer draws them), counted as its minimum bytes
(:func:`kdsl.bench.roofline.minimum_bytes`). It prints each round's GB/s and read / case; a ratio
below 1 means the read kernel measures low. On a busy machine compare the ratios, not the rates.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from kdsl import gallery, solve
from kdsl.bench import peak
from kdsl.bench.roofline import minimum_bytes
from kdsl.bench.tune_suites import suite_cases
from kdsl.codegen import reference
from kdsl.codegen.tvm import default_target, load_tvm, lower
from kdsl.codegen.tvm.machine import current_machine
from kdsl.codegen.tvm.schedule_space import ScheduleSpace


def case_kernel(label: str, machine):
    """The gensor suite case ``label``'s default schedule, compiled, with its arguments and byte count."""
    tvm = load_tvm()
    case = next(c for c in suite_cases("gensor") if c.label == label)
    op = gallery.load(case.operator)
    binding = solve.bind(op, case.layer)
    lowered = lower(op, binding)
    space = ScheduleSpace(lowered, machine=machine)
    executable = tvm.compile(space.apply(space.heuristic()).mod, target=default_target(machine.mcpu))
    x, weights = reference.random_inputs(op, binding, dtype=np.float32)
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in (x, *weights)]
    args.append(tvm.runtime.empty(tuple(int(d) for d in lowered.output_shape), "float32", dev))
    executable(*args)
    return executable, args, minimum_bytes(op, binding)


def read_kernel(machine, nbytes: int):
    """The read kernel over a DRAM buffer of about ``nbytes``, shaped as measure_bandwidth shapes it."""
    tvm = load_tvm()
    dev, lanes = tvm.cpu(), machine.lanes()
    parts, rows, vectors = peak.read_shape(machine, nbytes)
    x = np.random.default_rng(1).integers(0, 4, size=(parts, rows, vectors * lanes), dtype="int8").astype("float32")
    source, out = tvm.runtime.tensor(x, dev), tvm.runtime.tensor(np.zeros((parts, vectors * lanes), "float32"), dev)
    executable = peak.read_kernel(machine, parts, rows, vectors)
    executable(source, out)
    assert np.array_equal(out.numpy(), x.sum(axis=1)), "the read kernel computed a wrong sum"
    return executable, [source, out], x.nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", default="P3", help="a gensor suite case (default P3)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dram-mib", type=int, default=peak.DRAM_BYTES // peak.MIB)
    args = parser.parse_args()
    machine = current_machine()
    kernels = {"read": read_kernel(machine, args.dram_mib * peak.MIB), args.case: case_kernel(args.case, machine)}
    rates: dict[str, list[float]] = {name: [] for name in kernels}
    print(f"| round | read GB/s | {args.case} GB/s | read / {args.case} |\n| ---: | ---: | ---: | ---: |")
    for round_ in range(args.rounds):
        for name, (executable, call_args, nbytes) in kernels.items():
            rates[name].append(peak.kernel_rate(executable, call_args, nbytes / 1e9, 5).best)
        read, case = rates["read"][-1], rates[args.case][-1]
        print(f"| {round_ + 1} | {read:.1f} | {case:.1f} | {read / case:.2f} |")
    ratios = [r / c for r, c in zip(rates["read"], rates[args.case])]
    print(f"median ratio {statistics.median(ratios):.2f}; best read {max(rates['read']):.1f} GB/s, "
          f"best {args.case} {max(rates[args.case]):.1f} GB/s")  # fmt: skip


if __name__ == "__main__":
    main()
