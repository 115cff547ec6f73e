"""``kdsl bench peak``: this machine's measured FMA peak and memory bandwidth
(:func:`kdsl.bench.peak.measure_peak`) beside the figures kdsl assumes, and the sanity of both.

Bad sizes are refused before anything compiles, naming the flag:

>>> import argparse
>>> from kdsl.runtime.cpu import from_features
>>> machine = from_features("haswell", {"avx2", "fma"}, cores=2, ghz=3.0, caches={"l2": 1 << 20, "l3": 32 << 20})
>>> check_sizes(argparse.Namespace(dram_mib=256, l2_kib=None, depth=65536), machine)
(268435456, 1048576)
>>> check_sizes(argparse.Namespace(dram_mib=16, l2_kib=None, depth=65536), machine)
Traceback (most recent call last):
...
kdsl.lang.errors.KdslError: --dram-mib 16: the buffer fits the 32 MiB last-level cache, ... give more than 32
"""

from __future__ import annotations

import argparse
import json
import os

from kdsl.bench.argument_types import positive_int
from kdsl.bench.peak import DRAM_BYTES, MIB, measure_peak, size_text
from kdsl.bench.peak_cache import save_roofline
from kdsl.bench.roofline import Roofline
from kdsl.bench.target import add_mcpu_argument, machine_line, select_mcpu
from kdsl.codegen.tvm.machine import current_machine
from kdsl.lang.errors import KdslError
from kdsl.runtime.cpu import Machine

__all__ = ["add_arguments", "bench_peak", "check_sizes"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``kdsl bench peak``.

    >>> parser = argparse.ArgumentParser(); add_arguments(parser)
    >>> args = parser.parse_args(["--repeats", "3", "--dram-mib", "512"])
    >>> args.repeats, args.dram_mib, args.l2_kib, args.depth
    (3, 512, None, 65536)
    """
    parser.add_argument("--repeats", type=positive_int, default=10, help="timings of each kernel (best and median)")
    parser.add_argument(
        "--dram-mib",
        type=positive_int,
        default=DRAM_BYTES // MIB,
        help="the DRAM buffer in MiB: beyond the last-level cache",
    )
    parser.add_argument(
        "--l2-kib", type=positive_int, default=None, help="the L2 buffer in KiB (default: half an L2 per core)"
    )
    parser.add_argument(
        "--depth", type=positive_int, default=1 << 16, help="FMAs in each accumulator's chain (a multiple of 256)"
    )
    parser.add_argument("--no-copy", action="store_true", help="measure reads only, not the copy bandwidth")
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    parser.add_argument(
        "--save",
        action="store_true",
        help="store the FMA peak and read bandwidths as this machine's roofline for kdsl tune (kdsl.bench.peak_cache)",
    )
    add_mcpu_argument(parser)


def check_sizes(args: argparse.Namespace, machine: Machine) -> tuple[int, int]:
    """The DRAM and L2 buffers' bytes from ``args``, refused (naming the flag) where they would not
    measure what they say: a DRAM buffer the last-level cache holds, an L2 buffer the L2s do not."""
    dram = args.dram_mib * MIB
    if dram <= machine.l3:
        raise KdslError(
            f"--dram-mib {args.dram_mib}: the buffer fits the {size_text(machine.l3)} last-level cache, so it would "
            f"measure the cache; give more than {machine.l3 // MIB}"
        )
    l2_total = machine.cores * machine.l2
    l2 = args.l2_kib * 1024 if args.l2_kib is not None else l2_total // 2
    if l2 > l2_total:
        raise KdslError(
            f"--l2-kib {args.l2_kib}: the buffer exceeds the {machine.cores} cores' L2s ({l2_total // 1024} KiB "
            f"in all), so it would measure the next level; give at most {l2_total // 1024}"
        )
    if args.depth % 256:
        raise KdslError(f"--depth {args.depth}: the FMA chain must be a multiple of 256 (its table's rows)")
    return dram, l2


def bench_peak(args: argparse.Namespace) -> int:
    """``kdsl bench peak``: the measured FMA peak and bandwidths beside the assumed figures."""
    select_mcpu(args.mcpu)
    machine = current_machine()
    dram, l2 = check_sizes(args, machine)  # refused before anything compiles
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    peak = measure_peak(
        machine, repeats=args.repeats, dram_bytes=dram, l2_bytes=l2, depth=args.depth, copy=not args.no_copy
    )
    saved = save_roofline(machine, Roofline.from_peak(peak)) if args.save else None
    if args.json:
        print(json.dumps(peak.as_dict() | {"load_average": load, "saved": str(saved or "")}, sort_keys=True))
        return 0
    print(machine_line(machine))
    threads = f"{machine.cores} thread{'s' if machine.cores > 1 else ''}"
    print(f"{args.repeats} timings of each kernel on {threads}; load average {load:.2f} at start")
    print("\n".join(peak.lines()))
    if saved is not None:
        print(f"saved as this machine's roofline for kdsl tune and kdsl bench tune --suite: {saved}")
    return 0
