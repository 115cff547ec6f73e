"""The machine's measured peak and each kernel's roofline: the bound's arithmetic (compute- and
memory-bound kernels, the cache/DRAM bandwidth by footprint), the suite's roofline table, the refusals of
``kdsl bench peak``'s flags, and a tiny peak run whose kernels compute what NumPy does."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
from backends import backend

from kdsl import gallery, solve
from kdsl.bench import peak, peak_bench, roofline, tune_suite_bench
from kdsl.bench.tune_suites import suite_cases
from kdsl.cli import build_parser, main
from kdsl.lang.errors import KdslError
from kdsl.runtime.cpu import from_features

#: a made-up machine's ceilings: 200 GFLOP/s, 20 GB/s from DRAM, 80 GB/s from a 4 MiB cache
CEILINGS = roofline.Roofline(peak_gflops=200.0, dram_gbs=20.0, cache_gbs=80.0, cache_bytes=4 << 20)


def assert_bound(bound: roofline.Bound, macs: float, nbytes: float, bandwidth_gbs: float, limit: str) -> None:
    """``bound`` is the larger of the compute time at the peak and the data time at ``bandwidth_gbs``."""
    compute = 2 * macs / (CEILINGS.peak_gflops * 1e9)
    memory = nbytes / (bandwidth_gbs * 1e9)
    assert math.isclose(bound.seconds, max(compute, memory)) and bound.limit == limit
    assert math.isclose(bound.compute_seconds, compute) and math.isclose(bound.memory_seconds, memory)


def test_a_matmul_is_compute_bound_and_a_gemv_memory_bound():
    n = 1024
    matmul_bytes = 3 * 4 * n * n  # 12 MiB: beyond the cache, DRAM's bandwidth
    assert_bound(CEILINGS.bound(n**3, matmul_bytes), n**3, matmul_bytes, CEILINGS.dram_gbs, "compute")
    m = n // 2  # a 1 MiB weight: the cache holds it
    gemv_bytes = 4 * (m * m + 2 * m)  # every weight read once for 1 MAC each: 0.25 MAC per byte
    assert_bound(CEILINGS.bound(m * m, gemv_bytes), m * m, gemv_bytes, CEILINGS.cache_gbs, "memory")
    big = 64 * n * n  # a GEMV of 64 MiB of weights no longer fits the cache
    assert_bound(CEILINGS.bound(big / 4, big), big / 4, big, CEILINGS.dram_gbs, "memory")


def test_the_share_and_the_margin():
    bound = CEILINGS.bound(1e9, 1e6)
    assert math.isclose(bound.share(bound.seconds * 2), 0.5)
    assert roofline.within_margin(bound.share(bound.seconds * 1.05))
    assert not roofline.within_margin(bound.share(bound.seconds * 1.2))
    with pytest.raises(KdslError, match="positive number of seconds"):
        bound.share(0.0)
    with pytest.raises(KdslError, match="non-negative MACs"):
        CEILINGS.bound(-1, 10)
    with pytest.raises(KdslError, match="positive finite dram_gbs"):
        roofline.Roofline(100.0, float("nan"), 10.0, 1 << 20)


def test_the_minimum_bytes_count_every_tensor_once():
    op = gallery.load("conv2d")
    layer = {"N": 2, "Cin": 3, "Cout": 5, "H": 6, "W": 7, "K": 3}
    binding = solve.bind(op, layer)
    n, cin, cout, h, w, k = (layer[v] for v in ("N", "Cin", "Cout", "H", "W", "K"))
    expected = 4 * (n * cin * h * w + cout * cin * k * k + n * cout * h * w)
    assert roofline.minimum_bytes(op, binding) == expected


def fake_result(case, default: float | None, best: float | None) -> tune_suite_bench.CaseResult:
    op = gallery.load(case.operator)
    binding = solve.bind(op, case.layer)
    result = tune_suite_bench.CaseResult(case, solve.cost(op, binding)["macs"], roofline.minimum_bytes(op, binding))
    result.latencies = {"default schedule": [default], "opevo": [best, None]}
    return result


def test_the_suite_table_counts_the_defaults_near_their_bound():
    cases = suite_cases("opevo")[:3]
    bounds = [CEILINGS.bound(*(lambda r: (r.macs, r.nbytes))(fake_result(c, None, None))).seconds for c in cases]
    results = [
        fake_result(cases[0], bounds[0] * 1.05, bounds[0] * 1.02),  # within 10%
        fake_result(cases[1], bounds[1] * 2.0, bounds[1] * 1.5),  # a tuner has room
        fake_result(cases[2], None, None),  # no valid default: not counted
    ]
    columns = tune_suite_bench.columns(["opevo"], 8, [])
    lines = tune_suite_bench.roofline_table(results, columns, CEILINGS)
    rows = [line for line in lines if line.startswith("| opevo ")]
    assert len(rows) == 3
    cells = [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows]
    assert cells[0][6] == f"{1 / 1.05:.2f}" and cells[0][9] == f"{1 / 1.02:.2f}" and cells[0][7] == "opevo"
    assert cells[1][6] == f"{1 / 2.0:.2f}" and cells[2][6] == "-" and cells[2][7] == "-"
    assert any("on 1 of 2 cases" in line for line in lines), lines


def test_the_suite_table_raises_the_peak_to_a_kernel_that_ran_faster():
    case = suite_cases("opevo")[0]
    result = fake_result(case, None, None)
    bound = CEILINGS.bound(result.macs, result.nbytes)
    assert bound.limit == "compute"
    result.latencies = {"default schedule": [bound.seconds * 1.05], "opevo": [bound.seconds * 1.02]}
    result.torch = [bound.seconds / 1.5]  # PyTorch 1.5x faster than the measured peak allows
    lines = tune_suite_bench.roofline_table([result], tune_suite_bench.columns(["opevo"], 8, []), CEILINGS)
    raised = [line for line in lines if line.startswith("The FMA peak is raised")]
    assert len(raised) == 1 and f"to {CEILINGS.peak_gflops * 1.5:.0f} GFLOP/s" in raised[0], lines
    assert "PyTorch on opevo MM1" in raised[0]
    (row,) = [line for line in lines if line.startswith("| opevo ")]
    cells = [cell.strip() for cell in row.split("|")[1:-1]]
    # against the raised peak the default is at 1 / (1.05 * 1.5) of its bound: not within 10%, so not counted
    assert cells[6] == f"{1 / (1.05 * 1.5):.2f}" and any("on 0 of 1 cases" in line for line in lines), lines
    # without PyTorch's time the measured peak stands and the default counts as near its bound
    result.torch = []
    lines = tune_suite_bench.roofline_table([result], tune_suite_bench.columns(["opevo"], 8, []), CEILINGS)
    assert not any("raised" in line for line in lines) and any("on 1 of 1 cases" in line for line in lines)


def assert_refused(capsys: pytest.CaptureFixture[str], argv: list[str], flag: str) -> None:
    """``kdsl argv`` exits with code 2 and one ``error:`` line naming ``flag``, having measured nothing."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--repeats", "0"), ("--dram-mib", "-1"), ("--l2-kib", "0"), ("--depth", "x"), ("--dram-mib", "1"),
     ("--l2-kib", str(10**9)), ("--depth", "1000")],
)  # fmt: skip
def test_bench_peak_refuses_bad_sizes_naming_the_flag(capsys, monkeypatch, flag, value):
    def never(*args, **kwargs):
        raise AssertionError("measured before the flags were checked")

    monkeypatch.setattr(peak_bench, "measure_peak", never)
    try:
        assert_refused(capsys, ["bench", "peak", flag, value], flag)
    except SystemExit as stop:  # a type the parser refuses exits from inside main
        assert stop.code == 2
        err = capsys.readouterr().err
        assert flag in err and repr(value) in err, err


def test_the_size_checks_take_sane_sizes():
    machine = from_features("haswell", {"avx2", "fma"}, cores=2, ghz=3.0, caches={"l2": 1 << 20, "l3": 32 << 20})
    args = build_parser().parse_args(["bench", "peak", "--dram-mib", "64", "--l2-kib", "512"])
    assert peak_bench.check_sizes(args, machine) == (64 << 20, 512 << 10)
    with pytest.raises(KdslError, match="--l2-kib 4096"):
        peak_bench.check_sizes(argparse.Namespace(dram_mib=64, l2_kib=4096, depth=256), machine)


def test_the_sanity_checks_flag_what_cannot_be():
    machine = from_features("haswell", {"avx2", "fma"}, cores=2, ghz=3.0)
    bound = peak.clock_bound_gflops(machine, ghz=3.0)
    plausible, bad = peak.Rate(bound / 2, bound / 3), peak.Rate(bound * 2, bound)
    sane = peak.MachinePeak(machine, plausible, peak.Rate(10.0, 9.0), peak.Rate(50.0, 40.0), 1 << 28, 1 << 20)
    assert peak.sanity_problems(sane, ghz=3.0) == []
    fast = peak.MachinePeak(machine, bad, peak.Rate(500.0, 9.0), peak.Rate(50.0, 40.0), 1 << 28, 1 << 20)
    problems = peak.sanity_problems(fast, ghz=3.0)
    assert len(problems) == 2 and "FMA peak" in problems[0] and "DRAM read" in problems[1], problems


# ------------------------------------------------------------------------------------------------
# A tiny measurement: TVM compiles the three kernels


def test_the_peak_kernels_compute_what_numpy_does():
    tvm = backend("tvm")
    from kdsl.codegen.tvm.machine import current_machine

    machine = current_machine()
    lanes, rng, dev = machine.lanes(), np.random.default_rng(3), tvm.cpu()
    accumulators, depth, block = 3, 64, 16
    a = rng.standard_normal((machine.cores, lanes)).astype("float32")
    b = rng.standard_normal((block, accumulators)).astype("float32")
    c = tvm.runtime.tensor(np.zeros((machine.cores, accumulators, lanes), "float32"), dev)
    peak.fma_kernel(machine, accumulators, depth, block)(tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
    expected = np.einsum("tv,kj->tjv", a.astype("float64"), b[np.arange(depth) % block].astype("float64"))
    np.testing.assert_allclose(c.numpy(), expected, rtol=1e-4, atol=1e-4)

    x = rng.standard_normal((4, 5, 2 * lanes)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((4, 2 * lanes), "float32"), dev)
    for passes in (1, 3):  # a cache-sized buffer is read several times in one call
        peak.read_kernel(machine, 4, 5, 2, passes)(tvm.runtime.tensor(x, dev), out)
        np.testing.assert_allclose(out.numpy(), passes * x.sum(axis=1), rtol=1e-5, atol=1e-5)

    flat = x.reshape(4, -1)
    copied = tvm.runtime.tensor(np.zeros_like(flat), dev)
    peak.copy_kernel(machine, 4, flat.shape[1], 2)(tvm.runtime.tensor(flat, dev), copied)
    assert np.array_equal(copied.numpy(), flat)


def test_a_tiny_peak_run_gives_positive_finite_rates():
    backend("tvm")
    fma = peak.measure_fma(depth=512, repeats=2)
    read, copy = peak.measure_bandwidth(64 << 10, repeats=2)
    for rate in (fma, read, copy):
        assert rate is not None and math.isfinite(rate.best) and 0 < rate.median <= rate.best, rate


def test_kdsl_tune_prints_the_default_schedules_share_of_its_roofline(capsys, monkeypatch, tmp_path):
    """The line comes from the record of the space's heuristic configuration (the default schedule's),
    which OpEvo proposes first: no tuning here, a records database written by hand."""
    backend("tvm")
    from kdsl.cli import tune_commands
    from kdsl.codegen.tvm import lower
    from kdsl.codegen.tvm.parameters import config_key, normalize
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace
    from kdsl.tune.driver import make_tuner
    from kdsl.tune.records import Record, open_task

    op, layer, db = gallery.load("matmul"), {"M": 8, "Cin": 16, "Cout": 16}, str(tmp_path / "t.db")
    binding, task, store = open_task(op, layer, db)
    space = ScheduleSpace(lower(op, binding))
    first = make_tuner("opevo", space, []).propose(1)[0]
    assert config_key(normalize(first)) == config_key(normalize(space.heuristic()))  # measured first
    store.add(task, Record(normalize(first), 3e-6, None, "opevo"))
    assert roofline.default_latency(db, task, op, binding) == 3e-6

    measured = []
    monkeypatch.setattr(
        tune_commands, "roofline_for", lambda remeasure=False: measured.append(remeasure) or (CEILINGS, "cached")
    )
    best = Record({}, 2e-6, None, "opevo")
    rows = [("tiny", layer, best, None, argparse.Namespace(task=task)), ("other", layer, None, None, None)]
    args = argparse.Namespace(no_roofline=False, json=False, apply=False, db=db)
    tune_commands._print_rooflines(op, rows, args)
    bound = CEILINGS.bound(solve.cost(op, binding)["macs"], roofline.minimum_bytes(op, binding))
    header = f"{CEILINGS.line()} (cached)"  # where the peak came from, once
    assert capsys.readouterr().out.splitlines() == [header, roofline.room_line("tiny", bound, CEILINGS, 3e-6, 2e-6)]
    tune_commands._print_rooflines(op, [("bad", {"M": 8}, best, None, argparse.Namespace(task=task))], args)
    assert (
        capsys.readouterr()
        .out.splitlines()[1]
        .startswith("roofline of bad: not computed (the layer does not bind the variable")
    )
    for flag in ("no_roofline", "json", "apply"):  # nothing measured, nothing printed
        tune_commands._print_rooflines(op, rows, argparse.Namespace(**(vars(args) | {flag: True})))
    assert capsys.readouterr().out == "" and measured == [False, False]  # once per command that prints a line
    tune_commands._print_rooflines(op, rows, argparse.Namespace(**(vars(args) | {"remeasure_peak": True})))
    assert measured[-1] is True  # --remeasure-peak reaches the cache


def test_the_bound_counts_the_multiply_adds_the_program_runs():
    """A transposed convolution written over the zero-dilated input counts the zeros; its phase form runs
    a quarter of them at stride 2 with K = 4 (every tap meets whole phases), so the roofline's arithmetic
    must be the program's or the kernel would beat its own bound. Plain operators run what they write."""
    op = gallery.load("conv_transpose2d")
    binding = solve.bind(op, {"N": 1, "Cin": 16, "Cout": 8, "H": 6, "W": 6})
    written = solve.cost(op, binding)["macs"]
    assert binding["s"] == 2 and binding["K"] == 4
    assert roofline.program_macs(op, binding) * 4 == written
    conv = gallery.load("conv2d")
    conv_binding = solve.bind(conv, {"N": 1, "Cin": 8, "Cout": 8, "H": 6, "W": 6})
    assert roofline.program_macs(conv, conv_binding) == solve.cost(conv, conv_binding)["macs"]
