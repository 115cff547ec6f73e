"""``kdsl bench tune --suite``: the suite tables resolve, the options parse, PyTorch's baselines of the
issue-27 operators compute what the gallery operators do, the measurer takes kernels of several inputs,
and one tiny case runs end to end (2 trials, 2 runs, 1 tuner: about 30 s) writing its table and curves."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from backends import backend

from kdsl import gallery, solve
from kdsl.bench import tune_suite_bench
from kdsl.bench.tune_suites import NOT_EXPRESSIBLE, SUITES, baseline_reason, blocked_reason, suite_cases, suite_of
from kdsl.cli import build_parser, main
from kdsl.codegen import reference
from kdsl.lang.errors import KdslError

#: the cases that cannot run yet, each with its reason in the table (or its operator's error): none now
BLOCKED: set[tuple[str, str]] = set()


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_every_case_resolves_or_says_why_not(suite):
    for case in SUITES[suite]:
        reason = blocked_reason(case)
        if (suite, case.label) in BLOCKED:
            assert reason, case
            continue
        assert reason is None, (case, reason)
        op = gallery.load(case.operator)
        binding = solve.bind(op, case.layer)
        assert all(binding[name] == value for name, value in case.layer.items())  # nothing ignored
        assert solve.cost(op, binding)["flops"] > 0
        assert baseline_reason(case) is None, case  # PyTorch has a baseline for every runnable case
    assert set(NOT_EXPRESSIBLE) <= BLOCKED


def test_the_suites_hold_the_papers_cases():
    labels = {name: [c.label for c in cases] for name, cases in SUITES.items()}
    assert labels["opevo"] == ["MM1", "MM2", "MM3", "BMM1", "BMM2", "BMM3", "C1", "C2"]
    assert labels["alt"] == ["C1D", "C2D", "C3D", "GRP", "DEP", "DIL", "GMM", "T2D", "T3D"]
    assert labels["gensor"][-3:] == ["P1", "P2", "P3"]
    operators = {(name, c.label): c.operator for name, cases in SUITES.items() for c in cases}
    assert operators["alt", "C3D"] == "conv3d"
    assert operators["gensor", "P2"] == operators["gensor", "P3"] == "avg_pool2d_strided"
    assert {"M2", "V1", "V2", "V3"} <= set(labels["gensor"])
    assert [suite_of(c) for c in suite_cases("all")][:1] == ["opevo"] and len(suite_cases("all")) == 8 + 9 + 14


def test_an_unknown_suite_lists_the_known_ones():
    with pytest.raises(KdslError, match="unknown suite 'mlperf'; the suites are alt, gensor, opevo, smoke, all"):
        suite_cases("mlperf")


def test_the_cli_parses_the_suite_options():
    args = build_parser().parse_args(
        ["bench", "tune", "--suite", "opevo", "--runs", "2", "--metaschedule-trials", "8,16"]
    )
    assert (args.suite, args.runs, args.metaschedule_trials, args.out) == ("opevo", 2, [8, 16], None)
    default = build_parser().parse_args(["bench", "tune"])
    assert default.suite is None and default.metaschedule_trials == [64, 256]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "tune", "--suite", "opevo", "--metaschedule-trials", "0"])
    bad = argparse.Namespace(suite="nope", only=None, db=None)
    with pytest.raises(KdslError, match="the suites are"):
        tune_suite_bench.bench_suite(bad)


#: small layers of the operators that got their PyTorch baselines with the suites
SMALL = {
    "conv2d_valid": {"N": 2, "Cin": 3, "Cout": 4, "H": 7, "W": 6, "Ho": 5, "Wo": 4},
    "alexnet_c1": {"N": 1, "Cin": 3, "Cout": 2, "H": 27, "W": 24, "Ho": 5, "Wo": 4},
    "conv_transpose2d": {"N": 2, "Cin": 3, "Cout": 4, "H": 3, "W": 5},
    "conv_transpose3d": {"N": 1, "Cin": 2, "Cout": 3, "D": 2, "H": 3, "W": 2},
    "conv3d": {"N": 1, "Cin": 2, "Cout": 3, "D": 3, "H": 2, "W": 4},
    "avg_pool2d_strided": {"N": 2, "Cin": 3, "H": 7, "W": 9, "Ho": 3, "Wo": 4},  # (9 - 3) // 2 + 1 = 4
    "bmm": {"B": 3, "M": 4, "K": 5, "N": 2},
    "bmm_tn": {"B": 3, "M": 4, "K": 5, "N": 2},
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_new_native_baselines_compute_the_gallery_operators(name):
    torch = backend("torch")
    from kdsl.codegen.native import native_function

    op = gallery.load(name)
    binding = solve.bind(op, SMALL[name])
    x, weights = reference.random_inputs(op, binding, seed=1)
    expected = reference.run(op, binding, x, weights)
    data = tuple(torch.from_numpy(a) for a in x) if isinstance(x, tuple) else torch.from_numpy(x)
    with torch.no_grad():
        got = native_function(name, data, [torch.from_numpy(w) for w in weights], dict(binding))()
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_the_measurer_times_a_kernel_of_two_inputs(tmp_path):
    backend("tvm")
    from kdsl.codegen.tvm import lower
    from kdsl.codegen.tvm.default_schedule import default_schedule
    from kdsl.tune.measurer import _measure_job, _measure_setup, compile_module

    op = gallery.load("bmm_tn")
    binding = dict(solve.bind(op, {"B": 2, "M": 8, "K": 4, "N": 8}))
    path = str(tmp_path / "bmm.so")
    compile_module(default_schedule(lower(op, binding)).mod, path)
    state = _measure_setup(op, binding)
    latency, error = _measure_job(state, (path, True), _no_slot)
    assert error is None and latency is not None and latency > 0


def _no_slot():
    import contextlib

    return contextlib.nullcontext()


def test_one_tiny_case_end_to_end_writes_the_table_and_the_curves(tmp_path, capsys):
    backend("tvm")
    backend("torch")
    out = tmp_path / "suite"
    argv = ["bench", "tune", "--suite", "smoke", "--tuners", "opevo", "--trials", "2", "--runs", "2"]
    assert main([*argv, "--rounds", "1", "--out", str(out)]) == 0
    table = (out / "results.md").read_text()
    assert "| opevo | 2 |" in table and "± " in table and "| PyTorch |" in table
    assert "| 2/2 |" in table  # both runs gave a valid schedule
    assert "roofline: measured FMA peak" in table and "| smoke MM-tiny | " in table.split("## Roofline")[1]
    rows = (out / "curves.csv").read_text().splitlines()
    assert rows[0] == "suite,case,column,run,trial,best_ms" and len(rows) == 1 + 2 * 2
    plotted = list(out.glob("*.png"))
    assert plotted or "matplotlib is not installed" in table
    assert "MM-tiny" in capsys.readouterr().out
    # a second suite into the same --out is refused before any work: its tuners would continue from these
    # records (MetaSchedule warm-starts from its database), past their budget; nothing is deleted
    before = sorted(p.name for p in (out / "records").iterdir())
    assert main([*argv, "--rounds", "1", "--out", str(out)]) != 0
    error = capsys.readouterr().err
    assert f"--out {out} holds records of an earlier run" in error and "smoke-mm-tiny-run0-opevo.db" in error
    assert sorted(p.name for p in (out / "records").iterdir()) == before
