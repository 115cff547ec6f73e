"""Zero and negative budgets of the tuning and timing benches (trials, runs, rounds, repeats, batch sizes,
threads, ...) are refused as the command line is parsed: one ``error:`` line naming the flag and the
value, exit code 2, before anything is compiled, tuned or timed."""

from __future__ import annotations

import pytest

from kdsl.cli import build_parser, main

#: (the command before the flag, the flag, the values it must refuse)
REFUSED = [
    (["bench", "tune"], "--trials", ["0", "-3"]),
    (["bench", "tune"], "--rounds", ["0", "-1"]),
    (["bench", "tune", "--suite", "smoke"], "--runs", ["0", "-2"]),
    (["bench", "tune", "--suite", "smoke"], "--metaschedule-trials", ["0", "64,0", "-8", "64,-1"]),
    (["tune", "conv2d", "--layers", "conv3_x"], "--trials", ["0", "-5"]),
    (["tune", "conv2d", "--layers", "conv3_x"], "--compile-batch", ["0"]),
    (["tune", "conv2d", "--network", "resnet18"], "--trials", ["0", "-1"]),
    (["tune", "conv2d", "--network", "resnet18"], "--repeats", ["0"]),
    (["tune", "conv2d", "--network", "resnet18"], "--batch", ["0", "-8"]),
    (["tune", "conv2d", "--network", "resnet18"], "--threads", ["0"]),
    (["tune", "conv2d", "--network", "resnet18"], "--block", ["0"]),
    (["tune", "conv2d", "--network", "resnet18"], "--resolution", ["0"]),
    (["bench", "network", "--ops", "conv2d"], "--repeats", ["0", "-1"]),
    (["bench", "network", "--ops", "conv2d"], "--max-repeats", ["0"]),
    (["bench", "network", "--ops", "conv2d"], "--batch", ["0"]),
    (["bench", "network", "--ops", "conv2d"], "--threads", ["0", "-2"]),
    (["bench", "network", "--ops", "conv2d"], "--resolution", ["0"]),
    (["bench", "network", "--ops", "conv2d"], "--classes", ["0"]),
    (["bench", "network", "--ops", "conv2d"], "--target", ["0", "-0.5", "nan"]),
    (["bench", "costmodel"], "--configs", ["0", "-4"]),
]
CASES = [(command, flag, value) for command, flag, values in REFUSED for value in values]


def assert_refused(capsys: pytest.CaptureFixture[str], argv: list[str], flag: str, value: str) -> None:
    """``kdsl argv`` exits with code 2 and one error line that names ``flag`` and ``value``, printing
    nothing on stdout. Only the parser runs (``kdsl.cli.main`` parses with it first): were a check
    lost, the test fails at once instead of starting a tuning run."""
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert exit_info.value.code == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert flag in lines[0] and repr(value) in lines[0], lines[0]
    assert captured.out == ""


@pytest.mark.parametrize(("command", "flag", "value"), CASES, ids=[f"{' '.join(c[:2])} {f}={v}" for c, f, v in CASES])
def test_a_budget_below_one_is_refused_naming_the_flag(capsys, command, flag, value):
    assert_refused(capsys, [*command, flag, value], flag, value)


def test_the_refused_values_are_accepted_once_positive():
    """The same flags take 1 (the checks above refuse the value, not the flag)."""
    for command, flag, _ in REFUSED:
        value = "0.5" if flag == "--target" else "1"
        args = build_parser().parse_args([*command, flag, value])
        destination = {"--batch": "batch_sizes" if command[0] == "tune" else "batch"}.get(
            flag, flag[2:].replace("-", "_")
        )
        parsed = getattr(args, destination)
        assert parsed in (1, 0.5, [1]), (command, flag, parsed)


# ------------------------------------------------------------------------------------------------
# kdsl bench tune --suite's case labels and options


def test_an_unknown_only_label_names_the_suites_labels(capsys):
    assert main(["bench", "tune", "--suite", "opevo", "--only", "MM1", "MM9", "C7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --only: no case C7, MM9 in the suite opevo; it has MM1, MM2, MM3, BMM1, BMM2, BMM3, C1, C2"]


def test_the_labels_of_the_all_suite_are_listed_suite_by_suite(capsys):
    assert main(["bench", "tune", "--suite", "all", "--only", "mm1"]) == 2  # labels are case-sensitive
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --only: no case mm1 in the suite all; it has opevo: MM1, MM2, MM3, BMM1,")
    # C1 is both OpEvo's and Gensor's: each under its suite, not twice in one list
    assert "; alt: C1D, C2D, C3D, GRP," in err and "; gensor: M1, M2, M3," in err and "P3" in err


@pytest.mark.parametrize(
    "extra", [["--only", "MM1"], ["--out", "results"], ["--only", "MM1", "--out", "x"], ["--remeasure-peak"]]
)
def test_the_suite_options_without_a_suite_are_refused(capsys, extra):
    assert main(["bench", "tune", *extra, "--trials", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    flags = [word for word in extra if word.startswith("--")]
    assert len(err) == 1 and all(flag in err[0] for flag in flags) and "--suite" in err[0], err


# ------------------------------------------------------------------------------------------------
# --tuner-option values, refused before the first compile (with --network: before every task's
# default schedule is measured, which takes minutes)

TUNER_OPTIONS = [
    ("opevo", "lambda=0", "lambda (parents) must be a positive integer, got 0"),
    ("opevo", "rho=-1", "rho (offspring) must be a positive integer or none (the batch), got -1"),
    ("alt", "pool=0", "alt: pool must be a positive integer, got 0"),
    ("alt", "layouts=-2", "alt: layouts must be a positive integer, got -2"),
    ("gensor", "walks=0", "gensor: walks must be a positive integer, got 0"),
    ("gensor", "steps=-5", "gensor: steps must be a positive integer, got -5"),
    ("gensor", "constructions=0", "gensor: constructions must be a positive integer, got 0"),
]


@pytest.mark.parametrize(("tuner", "option", "message"), TUNER_OPTIONS)
@pytest.mark.parametrize("where", [["--layers", "conv3_x"], ["--network", "resnet18", "--batch", "1"]])
def test_a_tuner_option_out_of_range_is_refused_up_front(capsys, monkeypatch, tmp_path, tuner, option, message, where):
    import kdsl.bench.network_tune
    import kdsl.tune.driver

    def never(*args, **kwargs):
        raise AssertionError("tuning started before the options were checked")

    monkeypatch.setattr(kdsl.bench.network_tune, "tune_network", never)  # --network's tuning
    monkeypatch.setattr(kdsl.tune.driver, "open_task", never)  # a layer's first step
    db = str(tmp_path / "t.db")
    argv = ["tune", "conv2d", *where, "--tuner", tuner, "--tuner-option", option, "--trials", "1", "--db", db]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_the_tuner_options_in_range_pass_the_check():
    from kdsl.tune.driver import check_options

    checked = [check_options(tuner, {option.split("=")[0]: 2}) for tuner, option, _ in TUNER_OPTIONS]
    assert checked == [None] * len(TUNER_OPTIONS)  # a refusal would have raised


@pytest.mark.parametrize(
    ("extra", "expected"),
    [([], (64, 5)), (["--quick"], (12, 1)), (["--quick", "--rounds", "3"], (12, 3)), (["--trials", "7"], (7, 5))],
)
def test_an_explicit_rounds_wins_over_quick(extra, expected):
    from kdsl.bench.tune_bench import budgets

    assert budgets(build_parser().parse_args(["bench", "tune", *extra])) == expected
