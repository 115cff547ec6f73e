"""The solver: layer tables, constraints, check, assignments, bind, cost, shapes and budgets.

On branching kernels: tests/test_solve_branching.py.
"""

from __future__ import annotations

import itertools
import json
import time

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

import kdsl
from kdsl.lang import Input, Output, coefficient, primary
from kdsl.lang.errors import DivisibilityError, KdslError, LayerError
from kdsl.lang.primitives import Dim, Merge, Reduce, Share, Split, Stride, Unfold, Weight
from kdsl.solve import (
    Layer,
    assignments,
    bind,
    check,
    constraints,
    cost,
    load_layers,
    shapes,
    total_cost,
    within_budget,
)

N, Cin, Cout, H, W, M = primary("N Cin Cout H W M")
K, s, G, J, t = coefficient("K s G J t")


def conv2d(defaults: dict[str, int] | None = None) -> kdsl.Operator:
    weight = Weight(Cout, Cin, "kh", "kw", name="w")
    return (
        Input(N, Cin, H, W)
        >> Unfold(H, K, "kh")
        >> Unfold(W, K, "kw")
        >> Share(weight)
        >> Reduce(Cin, "kh", "kw")
        >> Output(N, Cout, H, W, defaults=defaults)
    )


def grouped_conv2d(*windows) -> kdsl.Operator:
    """A grouped conv (G groups) whose ``windows`` (Unfolds and Strides) cut its windows over H and W;
    without them K x K at stride 1, K = 3 by default. The output keeps the names H and W."""
    weight = Weight("g", Dim("co", Cout / G), "ci", "kh", "kw", name="w")
    kernel = Input(N, Cin, H, W) >> Split(Cin, Cin / G, "g", "ci")
    for window in windows or (Unfold(H, K, "kh"), Unfold(W, K, "kw")):
        kernel = kernel >> window
    kernel = kernel >> Share(weight) >> Reduce("ci", "kh", "kw") >> Merge("g", "co", "Cout")
    return kernel >> Output(N, Cout, "H", "W", defaults=None if windows else {"K": 3})


def strided_conv2d() -> kdsl.Operator:
    return (
        Input(N, Cin, H, W)
        >> Unfold(H, K, "kh")
        >> Unfold(W, K, "kw")
        >> Stride(H, s)
        >> Stride(W, s)
        >> Share(Weight(Cout, Cin, "kh", "kw", name="w"))
        >> Reduce(Cin, "kh", "kw")
        >> Output(N, Cout, "H", "W", defaults={"K": 3, "s": 2})
    )


def five_coefficients() -> kdsl.Operator:
    """A grouped conv with separate strides and windows per axis: coefficients G, J, K, s, t."""
    return grouped_conv2d(Unfold(H, K, "kh"), Stride(H, s), Unfold(W, J, "kw"), Stride(W, t))


def matmul() -> kdsl.Operator:
    return Input(M, Cin) >> Share(Weight(Cin, Cout, name="w")) >> Reduce(Cin) >> Output(M, Cout)


def linear() -> kdsl.Operator:
    return Input(N, Cin) >> Share(Weight(Cout, Cin, name="w")) >> Reduce(Cin) >> Output(N, Cout)


# ------------------------------------------------------------------------------------------------
# Layers
# ------------------------------------------------------------------------------------------------


def test_builtin_resnet18_table() -> None:
    table = load_layers("resnet18")
    assert [(x.name, x["Cin"], x["Cout"], x["H"], x["W"]) for x in table] == [
        ("conv2_x", 64, 64, 56, 56),
        ("conv3_x", 128, 128, 28, 28),
        ("conv4_x", 256, 256, 14, 14),
        ("conv5_x", 512, 512, 7, 7),
    ]
    assert all(x["N"] == 1 and x["M"] == x["N"] * x["H"] * x["W"] for x in table)


def test_builtin_stride2_table() -> None:
    table = load_layers("resnet18_stride2")
    assert [(x["Cin"], x["Cout"], x["H"]) for x in table] == [(64, 128, 56), (128, 256, 28), (256, 512, 14)]
    assert all(x["M"] == x["N"] * x["H"] * x["W"] for x in table)


def test_layer_is_hashable_and_reads_like_a_mapping() -> None:
    a = Layer("a", {"H": 4, "Cin": 2})
    b = Layer("a", [("Cin", 2), ("H", 4)])
    assert a == b and hash(a) == hash(b)
    assert a.values == {"Cin": 2, "H": 4} and list(a) == ["Cin", "H"] and len(a) == 2
    with pytest.raises(LayerError, match="does not bind the variable 'K'"):
        a["K"]


def test_load_layers_from_json_files(tmp_path) -> None:
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps([{"name": "l1", "Cin": 8, "H": 4}, {"Cin": 16, "H": 2}]))
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"layers": [{"name": "only", "Cin": 3}]}))
    assert [x.name for x in load_layers(str(listed))] == ["l1", "layer1"]
    assert load_layers(wrapped) == (Layer("only", {"Cin": 3}),)
    assert load_layers([Layer("x", {"H": 1}), {"name": "y", "H": 2}])[1]["H"] == 2


@pytest.mark.parametrize(
    "spec",
    [
        "no_such_table",
        42,
        None,
        [],
        [1, 2],
        [{"name": "a", "H": 0}],
        [{"name": "a", "H": -3}],
        [{"name": "a", "H": 2.5}],
        [{"name": "a", "H": True}],
        [{"name": "a", "H": "56"}],
        [{"name": 7, "H": 5}],
        [{"name": "", "H": 5}],
        [{"name": "a", "not an identifier": 5}],
        [{"name": "a", "H": 5}, {"name": "a", "H": 6}],
        {"layers": 3},
        {"layers": "resnet18"},
        b"bytes",
    ],
)
def test_malformed_layer_tables_raise_layer_error(spec: object) -> None:
    with pytest.raises(LayerError):
        load_layers(spec)


def test_malformed_json_files_raise_layer_error(tmp_path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("[{'name': ")
    with pytest.raises(LayerError, match="not valid JSON"):
        load_layers(broken)
    with pytest.raises(LayerError, match="unknown layer table"):
        load_layers(tmp_path / "missing.json")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 100) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=10,
)


@given(json_values)
def test_load_layers_fuzz_only_raises_layer_error(spec: object) -> None:
    try:
        table = load_layers(spec)
    except LayerError:
        return
    assert all(isinstance(x, Layer) for x in table) and table


# ------------------------------------------------------------------------------------------------
# Constraints and check
# ------------------------------------------------------------------------------------------------


def test_conv2d_checks_on_resnet18_with_k3() -> None:
    report = check(conv2d(), "resnet18", {"K": 3})
    assert len(report) == 4
    assert report.binding("conv5_x") == {"Cin": 512, "Cout": 512, "H": 7, "N": 1, "W": 7, "K": 3}
    assert [layer.name for layer, _ in report] == ["conv2_x", "conv3_x", "conv4_x", "conv5_x"]


def test_conv2d_constraints_are_windows_and_positivity() -> None:
    found = constraints(conv2d())
    assert [c.kind for c in found] == ["positive", "window", "window"]
    assert found[1].description == "Unfold(H, K): the window K must be smaller than the dim H (H)"
    assert found[1].variables == ("H", "K")


def test_grouped_conv_g3_fails_on_cin64_naming_g_and_layer() -> None:
    with pytest.raises(DivisibilityError) as caught:
        check(grouped_conv2d(), "resnet18", {"G": 3})
    message = str(caught.value)
    assert "layer conv2_x" in message and "G=3" in message and "Cin=64" in message
    assert "Split(Cin, Cin/G): Cin/G = 64/3 is not an integer" in message


def test_grouped_conv_constraint_descriptions() -> None:
    descriptions = [c.description for c in constraints(grouped_conv2d())]
    assert "Split(Cin, Cin/G): Cin/G must be a positive integer" in descriptions
    assert "Share(w): the weight dim co: Cout/G must be a positive integer" in descriptions


def test_strided_conv_message_names_layer_values_and_step() -> None:
    with pytest.raises(DivisibilityError, match=r"^layer conv5_x \(H=7, s=2\): Stride\(H, s\): H/s = 7/2 is not"):
        check(strided_conv2d(), "resnet18")
    assert len(check(strided_conv2d(), "resnet18_stride2")) == 3


def test_unbound_coefficient_says_how_to_bind_it() -> None:
    with pytest.raises(LayerError, match=r"coefficient K has no value on layer conv2_x: pass coefficients=\{'K': 3\}"):
        check(conv2d(), "resnet18")
    assert len(check(conv2d({"K": 3}), "resnet18")) == 4


def test_unbound_primary_names_variable_and_layer() -> None:
    depthwise = Input(N, Cin, H) >> Unfold(H, K, "k") >> Reduce("k") >> Output(N, Cin, H)
    assert len(check(depthwise, "resnet18", {"K": 3})) == 4
    C = primary("C")
    op = Input(N, C) >> Reduce(C) >> Output(N)
    with pytest.raises(LayerError, match="layer conv2_x does not bind the variable C"):
        check(op, "resnet18")


def test_extra_layer_variables_are_ignored() -> None:
    layer = {"name": "fc", "N": 2, "Cin": 3, "Cout": 4, "H": 99, "unused": 1234}
    report = check(linear(), [layer])
    assert report.binding("fc") == {"Cin": 3, "Cout": 4, "N": 2}
    assert bind(linear(), layer) == {"Cin": 3, "Cout": 4, "N": 2}


def test_large_windows_fail_unless_allowed() -> None:
    with pytest.raises(DivisibilityError) as caught:
        check(conv2d(), "resnet18", {"K": 9})
    message = str(caught.value)
    assert "layer conv5_x" in message and "the window K=9 is not smaller than H=7" in message
    report = check(conv2d(), "resnet18", {"K": 9}, allow_large_windows=True)
    assert len(report) == 4 and any("conv5_x" in note for note in report.large_windows)
    assert bind(conv2d(), load_layers("resnet18")[3], {"K": 9})["K"] == 9


def test_bad_coefficient_values() -> None:
    with pytest.raises(DivisibilityError, match="the coefficient K = 0 is not a positive integer"):
        check(conv2d(), "resnet18", {"K": 0})
    with pytest.raises(LayerError, match="must be an integer"):
        check(conv2d(), "resnet18", {"K": 2.5})
    with pytest.raises(LayerError):
        check(conv2d(), "resnet18", [("K", 3)])  # type: ignore[arg-type]


def test_layer_coefficients_and_precedence() -> None:
    table = [{"name": "a", "N": 1, "Cin": 4, "Cout": 4, "H": 8, "W": 8, "K": 5}]
    assert check(conv2d({"K": 3}), table).binding("a")["K"] == 5  # the layer beats the defaults
    assert check(conv2d({"K": 3}), table, {"K": 7}).binding("a")["K"] == 7  # coefficients beat the layer


def test_rational_input_sizes_must_be_integral() -> None:
    op = Input(Dim("half", H / 2)) >> Output("half")
    assert [c.description for c in constraints(op)] == ["Input(half): H/2 must be a positive integer"]
    assert bind(op, {"H": 8}) == {"H": 8}
    with pytest.raises(DivisibilityError, match=r"layer conv5_x \(H=7\): Input\(half\): H/2 = 7/2"):
        check(op, "resnet18")


def test_check_of_a_single_layer_mapping() -> None:
    report = check(matmul(), {"M": 3, "Cin": 4, "Cout": 5})
    assert report.binding("layer") == {"Cin": 4, "Cout": 5, "M": 3}


# ------------------------------------------------------------------------------------------------
# Assignments
# ------------------------------------------------------------------------------------------------


def brute_force(op: kdsl.Operator, table: object, choices: dict[str, list[int]]) -> list[dict[str, int]]:
    names = [n for n in op.coefficient_variables if n in choices]
    found = []
    for values in itertools.product(*(sorted(set(choices[n])) for n in names)):
        candidate = dict(zip(names, values))
        try:
            check(op, table, candidate)
        except DivisibilityError:
            continue
        found.append(candidate)
    assert all(set(a) == set(names) for a in found)
    return found


choice_lists = st.lists(st.sampled_from([0, 1, 2, 3, 4, 7, 8, 9, 14]), min_size=2, max_size=5)


random_tables = st.lists(
    st.fixed_dictionaries(
        {
            "N": st.just(1),
            "Cin": st.sampled_from([8, 12, 16, 18]),
            "Cout": st.sampled_from([4, 6, 8]),
            "H": st.integers(2, 30),
            "W": st.integers(2, 30),
        }
    ),
    min_size=1,
    max_size=3,
)


@given(
    st.fixed_dictionaries(
        {"G": choice_lists, "J": choice_lists, "K": choice_lists, "s": choice_lists, "t": choice_lists}
    ),
    st.sampled_from(["resnet18", "resnet18_stride2"]) | random_tables,
)
def test_assignments_agree_with_brute_force(choices: dict[str, list[int]], table: object) -> None:
    op = five_coefficients()
    assert assignments(op, table, choices) == brute_force(op, table, choices)


def test_assignments_examples() -> None:
    op = grouped_conv2d()
    assert assignments(op, "resnet18", {"G": range(1, 9)}) == [
        {"G": 1, "K": 3},
        {"G": 2, "K": 3},
        {"G": 4, "K": 3},
        {"G": 8, "K": 3},
    ]
    assert assignments(op, "resnet18", {"G": [1, 2], "K": [3, 9]}) == [{"G": 1, "K": 3}, {"G": 2, "K": 3}]
    large = assignments(op, "resnet18", {"G": [2], "K": [3, 9]}, allow_large_windows=True)
    assert large == [{"G": 2, "K": 3}, {"G": 2, "K": 9}]
    assert assignments(op, "resnet18", {"G": [0, -1, 3]}) == []
    assert assignments(op, "resnet18", {"G": [2], "unrelated": [5]}) == [{"G": 2, "K": 3}]


def test_assignments_errors() -> None:
    with pytest.raises(LayerError, match="the coefficient G has no choices"):
        assignments(grouped_conv2d(), "resnet18", {})
    with pytest.raises(LayerError, match="not an integer"):
        assignments(grouped_conv2d(), "resnet18", {"G": [1.5]})
    with pytest.raises(LayerError, match="list of ints"):
        assignments(grouped_conv2d(), "resnet18", {"G": 4})


def test_assignments_are_fast_for_five_coefficients_of_ten_values() -> None:
    op = five_coefficients()
    choices = {name: range(1, 11) for name in ("G", "J", "K", "s", "t")}
    began = time.perf_counter()
    found = assignments(op, "resnet18_stride2", choices)
    elapsed = time.perf_counter() - began
    assert found and {"G": 2, "J": 3, "K": 3, "s": 2, "t": 2} in found
    assert elapsed < 2.0, f"assignments took {elapsed:.2f}s"


# ------------------------------------------------------------------------------------------------
# Cost, shapes, budgets
# ------------------------------------------------------------------------------------------------


def test_conv2d_flops_formula_is_the_mac_count() -> None:
    formulas = cost(conv2d({"K": 3}))
    n, cin, cout, h, w, k = (sympy.Symbol(x, positive=True, integer=True) for x in "N Cin Cout H W K".split())
    assert sympy.simplify(formulas["flops"] - n * cout * h * w * cin * k**2) == 0
    assert sympy.simplify(formulas["params"] - cout * cin * k**2) == 0
    assert sympy.simplify(formulas["output"] - n * cout * h * w) == 0
    assert sympy.simplify(formulas["input"] - n * cin * h * w) == 0
    assert sympy.simplify(formulas["intermediate"] - n * cin * h * w * k**2 * cout) == 0


def test_conv2d_costs_on_each_layer() -> None:
    op = conv2d({"K": 3})
    for layer in load_layers("resnet18"):
        numbers = cost(op, layer)
        c, h = layer["Cin"], layer["H"]
        assert numbers["flops"] == layer["N"] * c * h * h * c * 9
        assert numbers["params"] == c * c * 9
        assert numbers["output"] == numbers["input"] == c * h * h


def test_grouped_conv_costs_divide_by_g() -> None:
    op = grouped_conv2d()
    layer = load_layers("resnet18")[1]
    assert cost(op, layer, {"G": 4})["flops"] * 4 == cost(conv2d({"K": 3}), layer)["flops"]
    assert cost(op, layer, {"G": 4})["params"] == 128 * 128 * 9 // 4


def test_cost_rejects_invalid_bindings() -> None:
    with pytest.raises(DivisibilityError):
        cost(grouped_conv2d(), load_layers("resnet18")[0], {"G": 3})


def test_shapes_follow_declared_orders() -> None:
    layer = {"N": 2, "Cin": 8, "Cout": 6, "H": 5, "W": 7}
    found = shapes(grouped_conv2d(), layer, {"G": 2})
    assert found == {"input": (2, 8, 5, 7), "output": (2, 6, 5, 7), "weights": {"w": (2, 3, 4, 3, 3)}}


def test_matmul_and_linear_share_the_table() -> None:
    table = load_layers("resnet18")
    assert [cost(matmul(), x)["flops"] for x in table] == [x["M"] * x["Cin"] * x["Cout"] for x in table]
    assert [cost(linear(), x)["flops"] for x in table] == [x["Cin"] * x["Cout"] for x in table]


def test_budgets_sum_over_layers() -> None:
    op = conv2d({"K": 3})
    totals = total_cost(op, "resnet18")
    expected_flops = sum(x["Cin"] * x["Cout"] * x["H"] * x["W"] * 9 for x in load_layers("resnet18"))
    assert totals["flops"] == expected_flops
    assert within_budget(op, "resnet18", max_flops=expected_flops)
    assert not within_budget(op, "resnet18", max_flops=expected_flops - 1)
    assert within_budget(op, "resnet18", max_params=totals["params"], max_flops=None)
    assert not within_budget(op, "resnet18", max_params=totals["params"] - 1)
    with pytest.raises(LayerError):
        within_budget(op, "resnet18", max_flops="lots")  # type: ignore[arg-type]


def test_every_solver_error_is_a_kdsl_error() -> None:
    calls = [
        lambda: check(conv2d(), 17),
        lambda: check(conv2d(), "resnet18"),
        lambda: bind(conv2d({"K": 3}), "conv2_x"),
        lambda: cost(conv2d(), {"N": 1}),
        lambda: shapes(conv2d({"K": 3}), 5),  # type: ignore[arg-type]
        lambda: assignments(conv2d(), "resnet18", None),  # type: ignore[arg-type]
    ]
    for call in calls:
        with pytest.raises(KdslError):
            call()
    assert len(calls) == 6


def test_a_check_report_prints_as_the_cli_table():
    report = kdsl.solve.check(kdsl.gallery.load("grouped_conv2d"), "resnet18", {"G": 3}, pad=True)
    lines = str(report).splitlines()
    assert lines[0] == "valid on 4 layers (padded where the paddings say)"
    assert lines[1].split() == ["layer", "G", "K", "input", "output", "M", "MACs", "params"]
    # the caller's shapes (64 channels), the padded operator's costs (66 channels: G=3 divides 66)
    conv2 = lines[2].split()
    assert conv2[:5] == ["conv2_x", "3", "3", "1x64x56x56", "1x64x56x56"]
    padded = report.padded_binding("conv2_x")
    assert int(conv2[6]) == kdsl.solve.cost(kdsl.gallery.load("grouped_conv2d"), padded)["params"]
    assert report.binding("conv2_x")["Cin"] == 64 and isinstance(report, kdsl.solve.CheckReport)
