"""Bad branching kernels: each raises a KdslError subclass whose message names the step and the
dims (or the node, the tensor, the weight) at fault and says what to do — built in Python, read
from DSL text and read from JSON."""

from __future__ import annotations

import json
import re

import pytest

import kdsl
from kdsl.lang import FC, Blend, Input, Map, Output, Product, Reduce, Rename, Share, Shift, Softmax, Weight, primary
from kdsl.lang.errors import KdslError, ParseError, ShapeError, SizeError, UnboundDimError
from kdsl.lang.nonlinear import Fold

N, C, H, W = primary("N C H W")
HEADER = 'from kdsl.lang import *\nN, C, H, W = primary("N C H W")\nx = Input(N, C, H)\n'


def raises(error: type[KdslError], build, *fragments: str) -> str:
    """``build()`` raises ``error`` (a KdslError subclass), and its message holds every fragment
    (a regular expression); the message."""
    assert issubclass(error, KdslError)
    with pytest.raises(error) as caught:
        build()
    message = str(caught.value)
    missing = [f for f in fragments if not re.search(f, message)]
    assert not missing, f"the message lacks {missing}:\n{message}"
    return message


def _x():
    return Input(N, C, H)


# -- built in Python ----------------------------------------------------------------------------------


def test_blending_branches_whose_dims_do_not_match():
    x = _x()
    raises(
        ShapeError,
        lambda: (x >> Reduce(H)) + (x >> Reduce(C)),
        r"Blend\('add'\)",
        r"\[N: N, C: C\] lacks H",
        r"\[N: N, H: H\] lacks C",
        "subset",
    )


def test_blending_a_dim_of_two_sizes():
    x = _x()
    raises(
        ShapeError,
        lambda: Blend("max", x >> Rename(H, "P"), x >> Rename(C, "P")),
        r"Blend\('max'\)",
        "the dim P has size H in the left branch",
        "but C in the right branch",
    )


def test_softmax_over_a_missing_dim():
    raises(UnboundDimError, lambda: _x() >> Softmax("Q"), r"Softmax\(Q\)", "no dim named 'Q'", r"\[N: N, C: C, H: H\]")


def test_softmax_over_dims_that_are_not_adjacent():
    raises(
        ShapeError,
        lambda: _x() >> Softmax(N, H),
        r"Softmax\(N, H\)",
        "not adjacent",
        r"\[N: N, C: C, H: H\]",
        "Merge or reorder",
    )


def test_product_reducing_a_dim_neither_branch_has():
    x = _x()
    raises(
        ShapeError,
        lambda: Product(x, x >> Rename(H, "P"), "Q"),
        r"Product\(Q\)",
        "no dim Q in either branch",
        r"left \[N: N, C: C, H: H\]",
        r"right \[N: N, C: C, P: H\]",
    )


def test_two_weights_with_one_name_in_two_branches():
    x = _x()
    for left, right, dims in [
        (
            x >> FC(C, name="o", size=C, weight="w"),
            x >> Shift(H) >> FC(C, name="o", size=C, weight="w"),
            r"\[o: C, C: C\] and \[o: C, C: C\]",
        ),
        (
            x >> Share(Weight(C, name="w")),
            x >> Shift(H) >> Share(Weight(C, H, name="w")),
            r"\[C: C\] and \[C: C, H: H\]",
        ),
    ]:
        raises(
            ShapeError,
            lambda left=left, right=right: left + right,
            "two branches share weights named 'w'",
            dims,
            "own name",
            r"Blend of the branches \[N: N, (o|C): C, H: H\]",
        )


def test_fold_over_every_dim():
    raises(ShapeError, lambda: _x() >> Fold(N, C, H), r"Fold\(N, C, H\)", "every dim", r"\[N: N, C: C, H: H\]")


def test_unknown_map_function():
    raises(
        ShapeError, lambda: _x() >> Map("swish"), r"Map\('swish'\)", "unknown function", "relu", r"\[N: N, C: C, H: H\]"
    )


@pytest.mark.parametrize("factor", [float("inf"), float("-inf"), float("nan")])
def test_map_scale_by_a_non_finite_factor(factor):
    raises(
        SizeError,
        lambda: _x() >> Map("scale", by=factor),
        r"Map\('scale'\)",
        "by must be a finite number",
        r"\[N: N, C: C, H: H\]",
    )


@pytest.mark.parametrize("by", [True, "2", 1e13])
def test_map_scale_by_something_else(by):
    raises(SizeError, lambda: _x() >> Map("scale", by=by), r"Map\('scale'\)", "by")


def test_a_factor_for_a_function_that_takes_none():
    raises(ShapeError, lambda: _x() >> Map("relu", by=2.0), r"Map\('relu'\)", "takes none")


def test_two_inputs_with_different_dims():
    raises(
        ShapeError,
        lambda: _x() + Input(N, C, W),
        "Blend",
        "different inputs",
        r"\[N: N, C: C, H: H\] and \[N: N, C: C, W: W\]",
        "one data input",
    )
    raises(ShapeError, lambda: Product(_x(), Input(N, H, C), "C"), "Product", r"\[N: N, H: H, C: C\]")


def test_a_branch_that_reduces_every_dim_away():
    x = _x()
    raises(ShapeError, lambda: x + (x >> Reduce(N, C, H)), "reduces every dim away", "scalar", r"Reduce\(N, C, H\)")
    raises(ShapeError, lambda: (x >> Reduce(N, C, H)) >> Map("relu"), "reduces every dim away")


def test_an_unknown_blend_kind():
    raises(ShapeError, lambda: Blend("pow", _x(), _x()), r"Blend\('pow'\)", "add, sub, mul, min, max")


# -- DSL text ---------------------------------------------------------------------------------------


def test_a_tensor_bound_to_a_name_and_never_used():
    source = HEADER + 't = x >> Map("relu")\nop = x >> Shift(H) >> Map("abs") >> Output(N, C, H)\n'
    raises(ParseError, lambda: kdsl.parse(source), "the tensor t", "never used", "joined")


def test_dsl_errors_name_the_line():
    cases = {
        "op = (x >> Reduce(H)) + (x >> Reduce(C)) >> Output(N, C, H)": (ShapeError, "lacks H", "line 4"),
        "op = x >> Softmax(N, H) >> Output(N, C, H)": (ShapeError, "not adjacent", "line 4"),
        'op = x >> Map("scale", by=1e999) >> Output(N, C, H)': (ParseError, "inf", "line 4"),
        "op = (x + Input(N, C, W)) >> Output(N, C, H, W)": (ShapeError, "different inputs", "line 4"),
        't = t >> Map("relu")\nop = (x + t) >> Output(N, C, H)': (ParseError, "'t' is not defined", "line 4"),
        'op = Product(x, x, "Q") >> Output(N, C, H)': (ShapeError, r"Product\(Q\)", "line 4"),
    }
    for line, (error, *fragments) in cases.items():
        raises(error, lambda line=line: kdsl.parse(HEADER + line + "\n"), *fragments)


# -- JSON ---------------------------------------------------------------------------------------------


def _document() -> dict:
    x = _x()
    kernel = ((x >> Map("relu")) + (x >> Shift(H))) >> Output(N, C, H)
    document = json.loads(kernel.to_json())
    assert [node["op"] for node in document["nodes"]] == ["Map", "Chain", "Blend"]
    return document


# node i of the JSON list is node i + 1 of the kernel (0 is the input): [1] on nodes[0] is itself
@pytest.mark.parametrize("node, args", [(0, [1]), (0, [3]), (1, [2]), (2, [3, 1]), (2, [1, 5]), (0, [-1])])
def test_a_cycle_or_a_later_node_in_json(node, args):
    document = _document()
    document["nodes"][node]["args"] = args
    raises(
        ParseError, lambda: kdsl.from_json(json.dumps(document)), rf"nodes\[{node}\]", "not an earlier node", "cycle"
    )


def test_a_json_node_never_used():
    document = _document()
    document["nodes"].insert(2, {"op": "Map", "fn": "abs", "by": 1.0, "args": [0]})
    document["nodes"][3]["args"] = [1, 2]  # the Blend reads the Map and the Chain, not the new node 3
    raises(ParseError, lambda: kdsl.from_json(json.dumps(document)), r"nodes\[2\] is never used", "joined")


@pytest.mark.parametrize(
    "change, error, fragments",
    [
        ({"args": [1]}, ParseError, (r"nodes\[2\]", "takes 2 argument")),
        ({"args": [True, 2]}, ParseError, (r"nodes\[2\]", "True")),
        ({"how": "pow"}, ShapeError, (r"Blend\('pow'\)",)),
        ({"op": "Sparkle"}, ParseError, ("Sparkle",)),
    ],
)
def test_malformed_json_joins(change, error, fragments):
    document = _document()
    document["nodes"][2].update(change)
    raises(error, lambda: kdsl.from_json(json.dumps(document)), *fragments)


@pytest.mark.parametrize("by", [float("inf"), float("nan"), "1.5", None, True, 10**400, -(10**400)])
def test_a_non_finite_or_non_numeric_factor_in_json(by):
    document = _document()
    document["nodes"][0].update(fn="scale", by=by)
    raises(KdslError, lambda: kdsl.from_json(json.dumps(document)), r"Map\('scale'\)|by")
