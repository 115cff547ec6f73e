"""Free widths that must divide a size, and shape matching that takes a root (issue 27): a width that
splits a product of sizes (``C*K``) must be one of its divisors, and the solver fills it among them;
a join whose sizes differ by a width squared is matched by SymPy's root."""

from __future__ import annotations

import pytest

from kdsl import solve
from kdsl.cli import main
from kdsl.lang import FC, Expand, Input, Merge, Output, Reduce, Split, Unfold, coefficient, dynamic, primary
from kdsl.lang.sizes import unify
from kdsl.solve.widths import layer_rules

N, C, H, W, Cin = primary("N C H W Cin")
K = coefficient("K")
x1, x2 = dynamic("x1 x2")

LAYERS = [
    {"name": "a", "N": 1, "Cin": 64, "H": 14, "W": 14},
    {"name": "b", "N": 1, "Cin": 24, "H": 7, "W": 7},
]


def _grouped_by_a_width():
    """A template whose width x1 splits the window-and-channel product Cin*K (the other part summed)."""
    x = Input(N, Cin, H, W)
    return (
        x
        >> Unfold(H, K, "k")
        >> Merge(Cin, "k", "ck")
        >> Split("ck", x1, "g", "b")
        >> Reduce("g")
        >> FC("b", name="o", size=Cin, weight="mix")
        >> Output(N, "o", H, W, defaults={"K": 3})
    )


def test_a_width_that_splits_a_product_must_divide_it() -> None:
    op = _grouped_by_a_width()
    assert {name: [str(s) for s in sizes] for name, sizes in solve.divisor_bounds(op).items()} == {"x1": ["Cin*K"]}
    rule = layer_rules(op, {"N": 1, "Cin": 64, "H": 14, "W": 14, "K": 3})["x1"]
    assert [v for v in range(1, 200) if rule.valid(v)] == [d for d in range(1, 193) if 192 % d == 0]


def test_fill_chooses_divisors_of_cin_times_k_within_the_budget() -> None:
    op = _grouped_by_a_width()
    filled = solve.fill(op, LAYERS, max_params=30000)
    for layer, values in zip(filled.layers, filled.values):
        assert (layer["Cin"] * 3) % values["x1"] == 0, (layer.name, values)
    assert filled.total["params"] <= 30000
    assert any(values["x1"] > 1 for values in filled.values)  # the budget was used, not left at the base
    solve.check(op, filled.layers)  # every filled layer is valid as a whole


def test_kdsl_check_says_the_width_must_divide(tmp_path, capsys) -> None:
    path = tmp_path / "grouped_by_width.dsl"
    path.write_text(_grouped_by_a_width().to_dsl())
    assert main(["check", str(path), "--layers", "resnet18", "--max-params", "0.5x"]) == 0
    assert "x1 must divide Cin*K" in capsys.readouterr().out


def test_a_join_of_a_squared_width_is_matched_by_its_root() -> None:
    # x1**2 == C**2 * K**2 has a monomial root only SymPy takes here: monomial algebra solves exponents +-1
    assert unify(x1**2, C**2 * K**2) == ("x1", C * K)
    assert unify(x1**2, C * K) is None  # sqrt(C*K) is no size
    x = Input(N, C, H, W)
    left = x >> FC(C, name="z", size=x1, weight="g") >> Expand("e", x1) >> Merge("z", "e", "zz")
    right = (
        x
        >> Expand("c2", C)
        >> Merge(C, "c2", "cc")
        >> Unfold(H, K, "kh")
        >> Unfold(W, K, "kw")
        >> Merge("kh", "kw", "kk")
        >> Merge("cc", "kk", "zz")
    )
    op = (left + right) >> Output(N, "zz", H, W, defaults={"K": 3})
    assert [(m.variable, str(m.size)) for m in op.matches] == [("x1", "C*K")]
    assert not op.dynamic_variables
    assert solve.shapes(op, {"N": 1, "C": 2, "H": 4, "W": 4})["output"] == (1, 36, 4, 4)


@pytest.mark.parametrize("power", [2, 3])
def test_roots_of_higher_powers_are_monomials_or_nothing(power) -> None:
    assert unify(x2**power, (C * K) ** power * 8**power) == ("x2", 8 * C * K)
    assert unify(x2**power, 2 * C ** (power + 1)) is None


def test_the_filled_template_runs_the_same_on_pytorch_and_the_reference() -> None:
    import numpy as np
    from backends import backend
    from helpers import assert_module_matches_reference

    backend("torch")
    from kdsl.codegen import torch as kdsl_torch

    op = _grouped_by_a_width()
    small = [{"name": "s", "N": 2, "Cin": 4, "H": 5, "W": 5}]
    filled = solve.fill(op, small, max_params=200)
    layer = dict(filled.layers[0].values)
    assert 12 % layer["x1"] == 0
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 5, 5))
    module = kdsl_torch.build(op, layer).double()
    weights = [rng.standard_normal(tuple(w.shape)) for w in module.weights]
    assert_module_matches_reference(module, op, layer, x, weights, rtol=1e-9, atol=1e-9)
