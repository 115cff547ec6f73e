"""Dynamic variables (Canvas §6.2): free widths, shape matching at joins, substitution."""

from __future__ import annotations

import pytest
from test_fill import involution

from kdsl import from_json, parse, solve
from kdsl.lang import (
    FC,
    Input,
    Merge,
    Output,
    Rename,
    SizeError,
    Split,
    coefficient,
    dynamic,
    primary,
    unify,
)
from kdsl.lang.errors import DivisibilityError, LayerError, ShapeError

N, Cin, H, W = primary("N Cin H W")
S, K, G = coefficient("S K G")
x1, x2 = dynamic("x1 x2")


def free_involution():
    """Involution with both of its FC widths free: span's output x2 is matched at the Product."""
    return involution(hidden=x1, span=x2)


def test_shape_matching_solves_the_span_width_at_the_product():
    op = free_involution()
    assert op.dynamic_variables == ("x1",)
    span = next(node for node in op.nodes if node.kind == "FC" and node.step.weight.name == "span")
    assert str(span.step.size) == "Cin*K**2/S"
    assert parse(op.to_dsl()) == op and from_json(op.to_json()) == op


def test_unify_prefers_to_keep_the_earlier_variable_free():
    assert unify(x1, x2 * K) == ("x2", x1 / K)
    name, size = unify(x2 / G, Cin * K**2 / G)
    assert (name, size) == ("x2", Cin * K**2)
    assert unify(Cin, H) is None
    assert unify(x1 * Cin, H) is None  # x1 = H/Cin would put a layer size in a denominator


def test_sizes_that_no_variable_can_match_are_still_a_shape_error():
    x = Input(N, Cin, H, W)
    a = x >> FC(Cin, name="c", size=x1 * x2, weight="a") >> Rename("c", "Cin")
    with pytest.raises(ShapeError, match="no free width among x1, x2"):
        # x1*x2 = Cin has two free widths in one dim: solved for x2 = Cin/x1, which is no width
        (a + (x >> Split(H, 2, "h2", "hh") >> Merge("h2", "hh", "H"))) >> Output(N, Cin, H, W)


def test_a_dynamic_variable_never_divides():
    with pytest.raises(SizeError, match="x1"):
        Input(N, Cin) >> Split(Cin, Cin / x1, "a", "b") >> Output(N, "a", "b")


def test_a_template_needs_values_for_its_free_widths():
    op = free_involution()
    with pytest.raises(LayerError, match="x1.*fill"):
        solve.check(op, "resnet18")
    report = solve.check(op, "resnet18", {"x1": 16})
    assert report.binding("conv2_x")["x1"] == 16


def test_substituted_replaces_a_width_everywhere():
    op = free_involution()
    filled = op.substituted({"x1": Cin / 4})
    assert filled.dynamic_variables == ()
    reduce = next(node for node in filled.nodes if node.kind == "FC" and node.step.weight.name == "reduce")
    assert str(reduce.step.size) == "Cin/4"
    assert [str(d.size) for d in reduce.step.weight.dims] == ["Cin/4", "Cin"]
    assert filled.key != op.key


def test_a_matched_width_that_does_not_divide_names_both_dims_and_the_layer():
    op = free_involution()
    assert [m.variable for m in op.matches] == ["x2"]
    layer = {"name": "odd", "N": 1, "Cin": 48, "H": 8, "W": 8, "x1": 4}
    message = "layer odd .*shape matching at Product\\(kh, kw\\): the dim g is Cin/S in the left branch and x2/K\\*\\*2"
    with pytest.raises(DivisibilityError, match=message + ".*x2 = Cin\\*K\\*\\*2/S = 27/2"):
        solve.check(op, [layer], {"S": 32})
    # the record is for messages only: the text and JSON need not keep it to be equal
    assert parse(op.to_dsl()) == op and not parse(op.to_dsl()).matches


def test_an_fc_output_may_not_take_the_name_of_a_dim_it_maps():
    with pytest.raises(ShapeError, match="like a dim it maps"):
        Input(N, Cin) >> FC("Cin", name="Cin", size=2 * Cin) >> Output(N, Cin)
