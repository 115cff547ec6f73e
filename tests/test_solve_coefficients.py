"""Solving coefficients (kdsl.solve.coefficients): divisor sets from the gcd over layers, window
ranges, bounds, and agreement with brute force over kdsl.solve.assignments."""

from __future__ import annotations

import pytest

from kdsl.lang import Dim, Input, Output, Reduce, Share, Split, Stride, Unfold, Weight, coefficient, library, primary
from kdsl.lang.errors import DivisibilityError, KdslError, LayerError
from kdsl.solve import assignments, solve_coefficients
from kdsl.solve.coefficients import divides, divisors

#: the largest value brute force tries per coefficient (64 = the gcd of ResNet-18's channels, so every
#: divisor set the solver derives on these tables is inside it)
BRUTE_BOUND = 64


def assert_matches_brute_force(op, layers, bound=BRUTE_BOUND, **bounds):
    """The solver, bounded by ``bound`` (and ``bounds``), gives exactly the assignments that
    kdsl.solve.assignments finds over 1..bound."""
    caps = {name: bounds.get(name, bound) for name in op.coefficient_variables}
    solved = solve_coefficients(op, layers, bounds=caps)
    choices = {name: range(1, cap + 1) if isinstance(cap, int) else cap for name, cap in caps.items()}
    brute = assignments(op, layers, choices)
    assert list(solved.assignments) == brute, (op, layers)
    assert solved.values == {n: tuple(sorted({a[n] for a in brute})) for n in solved.names}


@pytest.mark.parametrize(
    "name",
    ["grouped_conv2d", "syno_op1", "conv2d", "depthwise_conv2d", "pixel_shuffle", "avg_pool2d", "dilated_conv2d"],
)
@pytest.mark.parametrize("layers", ["resnet18", "resnet18_stride2"])
def test_agrees_with_brute_force_on_gallery_operators(name, layers):
    op = library.load(name)
    bound = 16 if len(op.coefficient_variables) > 2 else BRUTE_BOUND  # keeps three-way products fast
    assert_matches_brute_force(op, layers, bound)


def test_strided_conv2d_agrees_with_brute_force():
    assert_matches_brute_force(library.load("strided_conv2d"), "resnet18_stride2", 32)


def test_group_count_divides_the_gcd_of_the_channels():
    solved = solve_coefficients(library.load("grouped_conv2d"), "resnet18")
    assert solved.values["G"] == divisors(64) == (1, 2, 4, 8, 16, 32, 64)
    table = [
        {"name": "a", "N": 1, "Cin": 48, "Cout": 48, "H": 9, "W": 9},
        {"name": "b", "N": 1, "Cin": 32, "Cout": 32, "H": 9, "W": 9},
    ]
    # Canvas §6.2's example: channels 32 and 48, gcd 16
    assert solve_coefficients(library.load("grouped_conv2d"), table).values["G"] == (1, 2, 4, 8, 16)


def test_joint_divisor_set_of_a_product():
    solved = solve_coefficients(library.load("syno_op1"), "resnet18", bounds={"K": [3]})
    assert [str(d.monomial) for d in solved.divides] == ["G", "G*s"]
    pairs = {(a["G"], a["s"]) for a in solved.assignments}
    assert pairs == {(g, s) for g in divisors(64) for s in divisors(64) if 64 % (g * s) == 0}
    assert len(pairs) == 28


def test_stride_must_divide_the_height_on_every_layer():
    H = primary("H")
    s, K = coefficient("s K")
    op = Input(H) >> Unfold(H, K, "k") >> Stride(H, s) >> Reduce("k") >> Output("H")
    solved = solve_coefficients(op, "resnet18_stride2", bounds={"K": [3]})
    assert solved.values == {"K": (3,), "s": (1, 2, 7, 14)}  # gcd(56, 28, 14)
    assert solved.reasons["s"] == "s divides 14 (Stride(H, s): H/s)"
    assert solve_coefficients(op, "resnet18", bounds={"K": [3]}).values["s"] == (1, 7)  # gcd(56, 28, 14, 7)
    assert solve_coefficients(library.load("strided_conv2d"), "resnet18_stride2").values["s"] == (1, 2, 7, 14)


def test_window_is_bounded_by_the_smallest_dim():
    solved = solve_coefficients(library.load("conv2d"), "resnet18")
    assert solved.values == {"K": (1, 2, 3, 4, 5, 6)}  # K < H = 7 on conv5_x
    assert "K <= 6" in solved.reasons["K"]


def test_coefficient_bounded_only_by_the_caller():
    # with large windows allowed, nothing bounds K: the bound, else the default, else an error
    conv = library.load("conv2d")
    solved = solve_coefficients(conv, "resnet18", bounds={"K": 9}, allow_large_windows=True)
    assert solved.values == {"K": tuple(range(1, 10))}
    assert "no constraint bounds it" in solved.reasons["K"]
    with_list = solve_coefficients(conv, "resnet18", bounds={"K": [3, 5, 11]}, allow_large_windows=True)
    assert with_list.values == {"K": (3, 5, 11)}
    defaulted = solve_coefficients(conv, "resnet18", allow_large_windows=True)
    assert defaulted.values == {"K": (dict(conv.defaults)["K"],)}


def test_unbounded_coefficient_without_default_names_it():
    N, Cin, Cout = primary("N Cin Cout")
    K = coefficient("K")
    w = Weight(Cin, Dim("o", Cout * K), name="w")
    op = Input(N, Cin) >> Share(w) >> Reduce(Cin) >> Output(N, "o")
    with pytest.raises(LayerError, match="the coefficient K is bounded by no constraint"):
        solve_coefficients(op, "resnet18")
    assert solve_coefficients(op, "resnet18", bounds={"K": 4}).values == {"K": (1, 2, 3, 4)}


def test_no_valid_value_is_a_clear_error():
    N, Cin = primary("N Cin")
    G = coefficient("G")
    # Cin/(3G) is an integer on no ResNet-18 layer (64, 128, 256, 512 are not multiples of 3)
    op = Input(N, Cin) >> Split(Cin, Cin / (3 * G), "g", "c") >> Reduce("g", "c") >> Output(N)
    with pytest.raises(DivisibilityError, match="no value of the coefficient G") as caught:
        solve_coefficients(op, "resnet18")
    assert isinstance(caught.value, KdslError) and "Cin/(3*G) is not an integer" in str(caught.value)
    # a bound that excludes every divisor: the message names the coefficient, its condition and the bound
    with pytest.raises(DivisibilityError, match="no value of the coefficient G") as bounded:
        solve_coefficients(library.load("grouped_conv2d"), "resnet18", bounds={"G": [3, 5]})
    assert "G divides 64" in str(bounded.value) and "within the bound {3, 5}" in str(bounded.value)
    # each value allowed alone, no pair jointly: the first layer that rejects the pair is named
    with pytest.raises(DivisibilityError, match="no assignment of the coefficients") as joint:
        solve_coefficients(library.load("syno_op1"), "resnet18", bounds={"G": [64], "s": [2], "K": [3]})
    assert "layer conv2_x" in str(joint.value) and "Cout/(G*s) = 1/2" in str(joint.value)


def test_layer_bound_coefficients_are_not_solved():
    table = [{"name": "a", "N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8, "K": 3}]
    solved = solve_coefficients(library.load("grouped_conv2d"), table)
    assert solved.names == ("G",)
    assert solved.values == {"G": (1, 2, 4, 8)}


def test_bad_bounds_raise_layer_error():
    for bad in ({"K": 0}, {"K": "3"}, {"K": [3, "x"]}, {"K": True}):
        with pytest.raises(LayerError, match="bounds"):
            solve_coefficients(library.load("conv2d"), "resnet18", bounds=bad)


def test_divides_of_sizes():
    Cin, H = primary("Cin H")
    G, K = coefficient("G K")
    layers = [{"Cin": 64, "H": 6}, {"Cin": 96, "H": 9}]
    assert str(divides(Cin / G**2, layers)) == "G**2 divides 32"
    assert divides(Cin / G**2, layers).values("G") == (1, 2, 4)  # G**2 | 32
    assert divides(Cin * K / G, layers) is None  # K in the numerator: no divisor condition
    assert divides(Cin, layers) is None
    assert divides(H / (2 * G), layers).gcd == 0  # 9/2 is no integer: no value works
    assert divides(H / (2 * G), layers).values("G") == ()


def test_json_form():
    data = solve_coefficients(library.load("grouped_conv2d"), "resnet18", bounds={"K": [3]}).as_dict()
    assert data["values"] == {"G": [1, 2, 4, 8, 16, 32, 64], "K": [3]}
    assert len(data["assignments"]) == 7 and data["divides"][0] == {"monomial": "G", "gcd": 64, "size": "Cin/G"}
