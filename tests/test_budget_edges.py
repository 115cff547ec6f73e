"""Budgets at their edges (issue 27): an overflowing or vanishing budget is a BudgetError naming it,
a width the layer gives is kept by ``fill``, and a kernel without free widths is held to the budget,
through the API and through ``kdsl check``'s exit code 2."""

from __future__ import annotations

import pytest

from kdsl.cli import main
from kdsl.lang import FC, Input, Map, Output, dynamic, primary
from kdsl.lang.errors import BudgetError
from kdsl.solve import budget_limits, fill
from kdsl.solve.dynamic import parse_budget, read_budget


@pytest.mark.parametrize(
    ("text", "baseline", "says"),
    [
        ("1e400", None, "too large"),
        ("1e400x", 1000, "too large"),
        ("1e-9x", 1000, "less than one"),
        (0.5, None, "less than one"),
        ("0x", 1000, "must be positive"),
        (float("inf"), None, "must be positive"),
    ],
)
def test_a_budget_that_overflows_or_vanishes_is_a_budget_error_naming_it(text, baseline, says) -> None:
    with pytest.raises(BudgetError, match=says) as caught:
        parse_budget(text, baseline)
    assert repr(text) in str(caught.value)


def test_a_relative_budget_is_read_before_its_baseline_is_known() -> None:
    assert read_budget(" 0.25x ") == (0.25, True)
    assert read_budget("2G") == (2e9, False)
    assert parse_budget("0.25x", baseline=8) == 2


def _mlp():
    N, Cin = primary("N Cin")
    x1 = dynamic("x1")
    return (
        Input(N, Cin)
        >> FC(Cin, name="z", size=x1, weight="up")
        >> Map("relu")
        >> FC("z", name="o", size=Cin, weight="down")
        >> Output(N, "o")
    )


def test_fill_keeps_a_width_the_layer_gives_and_fills_the_others() -> None:
    layers = [{"name": "a", "N": 1, "Cin": 8, "x1": 7}, {"name": "b", "N": 1, "Cin": 8}]
    filled = fill(_mlp(), layers, max_params=3000)
    assert filled.values[0] == {"x1": 7}
    assert filled.layers[0]["x1"] == 7
    assert filled.values[1]["x1"] > 7  # the free one still grows to the budget
    assert filled.total["params"] <= 3000


def test_budget_limits_count_a_relative_budget_against_the_baseline_over_the_layers() -> None:
    limits = budget_limits("resnet18", max_flops="0.5x")
    assert limits == {"flops": 4 * 115605504 // 2, "params": None}


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--max-macs", "1", "--max-params", "1"], "needs 462422016 MACs over the 4 layers, more than --max-macs 1"),
        (["--max-flops", "0.5x"], "more than --max-macs 0.5x = 231211008"),  # the old spelling, same option
        (["--max-params", "1M"], "parameters over the 4 layers, more than --max-params 1M = 1000000"),
        (["--max-flops", "1e400"], "too large to be a number"),
        (["--max-flops", "1e-9x"], "less than one"),
    ],
)
def test_kdsl_check_refuses_a_budget_it_cannot_meet_with_exit_code_2(argv, says, capsys) -> None:
    try:
        code = main(["check", "conv2d", *argv])
    except SystemExit as stop:  # argparse's own refusals
        code = stop.code
    assert code == 2
    assert says in capsys.readouterr().err


def test_kdsl_check_passes_a_fixed_kernel_within_its_budget(capsys) -> None:
    assert main(["check", "conv2d", "--max-flops", "2x", "--max-params", "4M"]) == 0
    assert "valid on all 4 layers" in capsys.readouterr().out
