"""The language: sizes, building with >>, validity errors, printing, parsing, JSON and keys.

Building branching kernels: the Tensor builder, the chain special case, shared branches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kdsl
from kdsl.lang import FC, Dilate, Fold, Input, Map, Output, Rename, Slide, Tensor, coefficient, primary
from kdsl.lang.errors import (
    AmbiguousDimError,
    KdslError,
    ParseError,
    ShapeError,
    SizeError,
    UnboundDimError,
    ValidityError,
)
from kdsl.lang.primitives import Dim, Expand, Merge, Reduce, Share, Shift, Split, Stride, Unfold, Weight
from kdsl.lang.sizes import Size
from kdsl.testing import strategies as kst

N, Cin, Cout, H, W = primary("N Cin Cout H W")
K, s, G = coefficient("K s G")


def conv2d(names: tuple[str, str] = ("kh", "kw")) -> kdsl.Operator:
    kh, kw = names
    weight = Weight(Cout, Cin, kh, kw, name="w")
    return (
        Input(N, Cin, H, W)
        >> Unfold(H, K, kh)
        >> Unfold(W, K, kw)
        >> Share(weight)
        >> Reduce(Cin, kh, kw)
        >> Output(N, Cout, H, W, defaults={"K": 3})
    )


# -- sizes ------------------------------------------------------------------------------------


def test_sizes_are_interned_monomials():
    assert (H / s) * s is H
    assert Cout / (G * s) is Cout * G**-1 * s**-1
    assert str(Cout / (G * s)) == "Cout/(G*s)"
    assert str(3 * K / 2) == "3*K/2"
    assert (Cin / G).evaluate({"Cin": 64, "G": 4}) == Fraction(16)
    assert Cin.variable_name == "Cin" and (2 * Cin).variable_name is None


def test_size_errors():
    with pytest.raises(SizeError):
        Size.of(0)
    with pytest.raises(SizeError):
        Size.of(-2)
    with pytest.raises(SizeError):
        primary("1bad")
    with pytest.raises(kdsl.lang.errors.LayerError, match="Cin"):
        (Cin / G).evaluate({"G": 2})


def test_to_sympy():
    import sympy

    expr = (Cout / (G * s)).to_sympy()
    assert (
        sympy.simplify(
            expr
            - sympy.Symbol("Cout", positive=True, integer=True)
            / (sympy.Symbol("G", positive=True, integer=True) * sympy.Symbol("s", positive=True, integer=True))
        )
        == 0
    )


# -- building ---------------------------------------------------------------------------------


def test_conv2d_shapes_and_weights():
    op = conv2d()
    assert [d.name for d in op.outputs] == ["N", "Cout", "H", "W"]
    assert [str(x) for x in op.weights[0].shape] == ["Cout", "Cin", "K", "K"]
    assert op.weights[0].new == (True, False, False, False)
    assert op.primary_variables == ("Cin", "Cout", "H", "N", "W")
    assert op.coefficient_variables == ("K",)
    assert op.default_coefficients == {"K": 3}


def test_pipelines_are_reusable_and_associative():
    window = Unfold(H, K, "kh") >> Unfold(W, K, "kw")
    contract = Share(Weight(Cout, Cin, "kh", "kw", name="w")) >> Reduce(Cin, "kh", "kw")
    out = Output(N, Cout, H, W, defaults={"K": 3})
    left = ((Input(N, Cin, H, W) >> window) >> contract) >> out
    right = Input(N, Cin, H, W) >> (window >> (contract >> out))
    assert left == right == conv2d()


def test_equal_sized_dims_stay_distinct_and_ambiguity_is_an_error():
    op = Input(N, H, W) >> Unfold(H, K, "a") >> Unfold(W, K, "b") >> Reduce("a") >> Output(N, H, W, "b")
    assert [d.name for d in op.outputs] == ["N", "H", "W", "b"]
    with pytest.raises(AmbiguousDimError, match="a, b"):
        Input(N, H, W) >> Unfold(H, K, "a") >> Unfold(W, K, "b") >> Reduce(K)
    with pytest.raises(ShapeError, match="never smaller"):
        Input(N, H) >> Unfold(H, K, "a") >> Unfold("a", K, "b")


def test_unbound_and_duplicate_dims():
    with pytest.raises(UnboundDimError, match="'kh'"):
        Input(N, H) >> Reduce("kh")
    with pytest.raises(UnboundDimError, match="size Cin"):
        Input(N, H) >> Reduce(Cin)
    with pytest.raises(ShapeError, match="already exists"):
        Input(N, H) >> Unfold(H, K, "N")
    with pytest.raises(ShapeError, match="twice"):
        Input(N, N)


def test_output_must_list_every_live_dim_exactly_once():
    with pytest.raises(ShapeError, match="still live.*kh"):
        Input(N, H) >> Unfold(H, K, "kh") >> Output(N, H)
    with pytest.raises(ShapeError, match="twice"):
        Input(N, H) >> Output(N, H, H)
    with pytest.raises(SizeError, match="not a coefficient"):
        Input(N, H) >> Output(N, H, defaults={"K": 3})


def test_primary_variables_never_in_denominators():
    with pytest.raises(SizeError, match="primary variable Cin in a denominator"):
        Input(N, H) >> Split(H, Cin, "a", "b")
    with pytest.raises(SizeError, match="size 1"):
        Input(N, H) >> Split(H, H, "a", "b")


def test_stride_needs_a_window():
    with pytest.raises(ValidityError, match="drop input elements"):
        Input(N, H) >> Stride(H, s)
    op = Input(N, H) >> Unfold(H, K, "k") >> Stride(H, s) >> Reduce("k") >> Output(N, H / s)
    assert str(op.outputs[1].size) == "H/s"


def test_weights_share_and_create_dims():
    w1 = Weight("g", "kw", Dim("c", Cout / (G * s)), name="W2")
    op = (
        Input(N, Cin, W)
        >> Unfold(W, K, "kw")
        >> Split(Cin, Cin / G, "g", "ci")
        >> Share(w1)
        >> Reduce("ci")
        >> Share(Weight("g", "kw", "c", Cout, name="W1"))
        >> Reduce("g", "kw", "c")
        >> Output(N, Cout, W)
    )
    assert [w.name for w in op.weights] == ["W2", "W1"]
    assert op.weights[0].new == (False, False, True)
    assert op.weights[1].new == (False, False, False, True)
    with pytest.raises(ShapeError, match="already shared"):
        Input(N, Cin) >> Share(Weight(Cin, name="w")) >> Share(Weight(Cin, name="w"))
    with pytest.raises(ShapeError, match="twice"):
        Input(N, Cin) >> Share(Weight(Cin, "Cin"))


def test_errors_quote_the_partial_program():
    with pytest.raises(KdslError) as info:
        Input(N, Cin, H) >> Unfold(H, K, "kh") >> Reduce("kw")
    assert "Unfold(H, K" in str(info.value)


def test_every_primitive_has_a_printer_json_form_and_key_rule():
    from kdsl.lang.primitives import PRIMITIVES

    op = (
        Input(N, Cin, H)
        >> Split(Cin, G, "c", "g")
        >> Merge("c", "g", "cg")
        >> Shift(H, -1)
        >> Expand("e", K)
        >> Unfold(H, K, "kh")
        >> Stride("kh", s)
        >> Share(Weight("cg", "kh", Dim("o", Cout), name="w"))
        >> Reduce("cg", "kh", mean=True)
        >> Output(N, "o", H, "e")
    )
    # the two primitives of windows without padding and transposed convolutions, on another input
    Hi, Ho = primary("Hi Ho")
    valid = (
        Input(N, Cin, Hi)
        >> Dilate(Cin, s)
        >> Slide(Hi, K, Ho, "kh", stride=s)
        >> Reduce("kh")
        >> Output(N, "Cin", "Hi", defaults={"s": 2})
    )
    steps = [*op.steps, *valid.steps]
    assert {type(step).__name__ for step in steps} == set(PRIMITIVES)
    for each in (op, valid):
        assert kdsl.parse(each.to_dsl()) == each
        assert kdsl.from_json(each.to_json()) == each
    assert 'Slide(Hi, K, Ho, "kh", stride=s)' in valid.to_dsl()


def test_slide_and_unfold_differ_in_the_content_key_and_check_their_sizes():
    """A window without padding is another operator than a same-padded one (the key tells them
    apart), and its number of windows is checked at every layer against PyTorch's floor rule."""
    from kdsl import solve
    from kdsl.lang.errors import DivisibilityError

    Ho = primary("Ho")
    w = Weight(Cout, Cin, "kh", name="w")
    same = Input(N, Cin, H) >> Unfold(H, K, "kh") >> Share(w) >> Reduce(Cin, "kh") >> Output(N, Cout, "H")
    valid = Input(N, Cin, H) >> Slide(H, K, Ho, "kh") >> Share(w) >> Reduce(Cin, "kh") >> Output(N, Cout, "H")
    strided = (
        Input(N, Cin, H) >> Slide(H, K, Ho, "kh", stride=s) >> Share(w) >> Reduce(Cin, "kh") >> Output(N, Cout, "H")
    )
    assert len({same.key, valid.key, strided.key}) == 3
    layer = {"N": 1, "Cin": 3, "Cout": 2, "H": 227, "Ho": 55, "K": 11, "s": 4}
    assert solve.bind(strided, layer)["Ho"] == 55  # (227 - 11) // 4 + 1
    assert solve.bind(strided, layer | {"H": 229})["Ho"] == 55  # floor: two rows left over, as in PyTorch
    with pytest.raises(DivisibilityError, match=r"\(227 - 11\) // 1 \+ 1 = 217 windows, not Ho=55"):
        solve.bind(valid, layer)
    with pytest.raises(DivisibilityError, match="the window K=11 does not fit in the dim H of size 7"):
        solve.bind(valid, layer | {"H": 7, "Ho": 1})
    with pytest.raises(ShapeError, match="the window 3 is larger than the dim H of size 2"):
        Input(Dim("H", Size.of(2))) >> Slide("H", 3, Ho, "k")


# -- printing, parsing, JSON, keys ------------------------------------------------------------


def test_dsl_round_trip_of_conv2d():
    op = conv2d()
    text = op.to_dsl()
    assert 'Unfold(H, K, "kh")' in text
    assert kdsl.parse(text) == op
    assert kdsl.from_json(op.to_json()) == op


def test_dsl_text_is_also_python():
    op = conv2d()
    namespace: dict[str, object] = {}
    exec(compile(op.to_dsl(), "<dsl>", "exec"), namespace)  # trusted: text we generated
    assert namespace["op"] == op


@given(kst.operators())
def test_random_operators_round_trip(op):
    assert kdsl.parse(op.to_dsl()) == op
    assert kdsl.from_json(op.to_json()) == op
    assert kdsl.from_json(op.to_json()).key == op.key


def test_key_ignores_names_weight_order_and_independent_step_order():
    a = conv2d(("kh", "kw"))
    b = conv2d(("r", "q"))
    c = (
        Input(N, Cin, H, W)
        >> Unfold(W, K, "kw")
        >> Unfold(H, K, "kh")
        >> Share(Weight("kw", Cin, Cout, "kh", name="v"))
        >> Reduce("kw", "kh", Cin)
        >> Output(N, Cout, H, W, defaults={"K": 3})
    )
    assert a.key == b.key == c.key
    assert a != b


def test_key_tells_coefficient_values_apart_and_design_key_does_not():
    # grouped conv at G = 2 and G = 4 are two functions of a layer, so two search candidates;
    # one design, which rediscovery and the gallery comparison match at any coefficient values
    three, five = conv2d(), conv2d().with_defaults(K=5)
    assert three.key != five.key
    assert three.design_key == five.design_key
    bare = Input(N, Cin, H, W) >> Unfold(H, K, "kh") >> Share(Weight(Cout, Cin, "kh", name="w"))
    bare = bare >> Reduce(Cin, "kh") >> Output(N, Cout, H, W)
    assert bare.key == bare.design_key  # no coefficient values: the design is the candidate


def test_key_changes_with_semantics():
    base = Input(N, H) >> Shift(H) >> Output(N, H)
    assert base.key != (Input(N, H) >> Shift(H, 2) >> Output(N, H)).key
    assert base.key != (Input(N, H) >> Shift(H) >> Output(H, N)).key
    mean = Input(N, H) >> Reduce(H, mean=True) >> Output(N)
    total = Input(N, H) >> Reduce(H) >> Output(N)
    assert mean.key != total.key
    split_a = Input(N, H) >> Split(H, K, "a", "b") >> Output(N, "a", "b")
    split_b = Input(N, H) >> Split(H, H / K, "a", "b") >> Output(N, "a", "b")
    assert split_a.key != split_b.key


def test_operators_are_hashable_values():
    assert hash(conv2d()) == hash(conv2d())
    assert len({conv2d(), conv2d(), conv2d(("a", "b"))}) == 2


# -- malformed input --------------------------------------------------------------------------

INJECTIONS = [
    "__import__('os').system('touch /tmp/kdsl_pwned')",
    "op = __import__('os').system('touch /tmp/kdsl_pwned')",
    "import os\nop = os.system('touch /tmp/kdsl_pwned')",
    "op = Input.__class__",
    "op = (lambda: 1)()",
    "op = [x for x in ()]",
    "op = Input(N)[0]",
    "from os import system",
    "op = open('/etc/passwd')",
    "exec('1')",
    "op = primary('N').__dict__",
    "def f():\n    pass",
    "class A:\n    pass",
    "op = f'{1}'",
    "op = 10**10**10",
    "op = 2**100000",
    "N = primary('N')\nop = N * 1.5",
    "op = Input(primary('N')) >> print",
    "primary = 1",
    "_x = 1",
    "N = primary('N')\nop = Input(N) >> Output(N, defaults={'N': 2})",
    "N = primary('N')\nop = Input(N) >> Unfold(N, N, 'k') >> Reduce('k') >> Output(N)",
    "N = primary('N')\nop = Input(N) >> Split(N, 0, 'a', 'b') >> Output('a', 'b')",
    "N = primary('N')\nop = Input(N) >> Split(N, -2, 'a', 'b') >> Output('a', 'b')",
    "N = primary('N')\nop = Input(N) >> Reduce('M') >> Output(N)",
    "N = primary('N')\nK = coefficient('K')\nop = Input(N) >> Unfold(N, K / N) >> Output(N)",
    "N = primary('N')\nop = Input(N) >> Output(N)\nop2 = Input(N) >> Output(N)\nop = 3",
    "N = primary('N')\nop = Input(N)",
    "N = primary('N')\nop = Input(N) >> Weight(N)",
    "N = primary('N')\nop = Input(N) >> Split(N, 2, 5, 'b')",
    "N = primary('N')\nop = Input(N) >> Share('w')",
    "N = primary('N')\nop = Input(N) >> Shift(N, 'x')",
    "N, M = primary('N')",
    "N = primary('N')\nop = Input(N) >> Reduce(N, mean=3) >> Output(N)",
    "N = primary('N')\nop = Input(N) >> Split(N, 2, 'a', 'b', 'c')",
    "(",
    "",
    "\x00",
]


@pytest.mark.parametrize("source", INJECTIONS)
def test_malformed_programs_raise_kdsl_errors_and_run_nothing(source):
    if os.path.exists("/tmp/kdsl_pwned"):
        os.remove("/tmp/kdsl_pwned")
    with pytest.raises(KdslError):
        kdsl.parse(source)
    assert not os.path.exists("/tmp/kdsl_pwned")


_VALID = conv2d().to_dsl()


@given(st.data())
def test_mutated_programs_raise_only_kdsl_errors(data):
    text = _VALID
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(text)))
        action = data.draw(st.sampled_from(["delete", "insert", "replace", "truncate"]))
        if action == "truncate":
            text = text[:position]
        elif action == "delete":
            text = text[:position] + text[position + data.draw(st.integers(1, 8)) :]
        else:
            snippet = data.draw(
                st.sampled_from(["K", "Cin", '"kh"', ">>", "(", ")", ",", "*", "/", "2", "-1", "0", "Reduce(", "__"])
            )
            end = position + (1 if action == "replace" else 0)
            text = text[:position] + snippet + text[end:]
    try:
        result = kdsl.parse(text)
    except KdslError:
        return
    assert isinstance(result, kdsl.Operator)


@given(st.data())
def test_mutated_json_raises_only_kdsl_errors(data):
    document = json.loads(conv2d().to_json())
    path_choice = data.draw(st.sampled_from(["inputs", "steps", "outputs", "variables", "defaults", "version"]))
    replacement = data.draw(
        st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=5), st.lists(st.integers(), max_size=2), st.just({}))
    )
    if path_choice == "steps" and data.draw(st.booleans()):
        index = data.draw(st.integers(0, len(document["steps"]) - 1))
        field = data.draw(st.sampled_from(sorted(document["steps"][index])))
        document["steps"][index][field] = replacement
    else:
        document[path_choice] = replacement
    text = json.dumps(document)
    if data.draw(st.booleans()):
        text = text[: data.draw(st.integers(0, len(text)))]
    try:
        result = kdsl.from_json(text)
    except KdslError:
        return
    assert isinstance(result, kdsl.Operator)


def test_json_has_a_schema_version():
    document = json.loads(conv2d().to_json())
    assert document["format"] == "kdsl-operator" and document["version"] == 1
    document["version"] = 99
    with pytest.raises(ParseError, match="version 99"):
        kdsl.from_json(json.dumps(document))


def test_import_kdsl_loads_no_backend():
    code = "import sys, kdsl, kdsl.lang, kdsl.solve; print('torch' in sys.modules, 'tvm' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


def test_subpackages_load_on_first_access_without_a_backend():
    # the README's `import kdsl` then `kdsl.gallery.load(...)`, with no `import kdsl.gallery` first
    code = (
        "import sys, kdsl; op = kdsl.gallery.load('conv2d'); report = kdsl.solve.check(op, 'resnet18'); "
        "print(len(report), 'torch' in sys.modules, 'tvm' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["4", "False", "False"]
    with pytest.raises(AttributeError, match="no attribute 'galery'"):
        kdsl.galery  # noqa: B018


def test_an_operator_pickles_after_its_derived_values_are_cached():
    """Worker processes receive operators by pickle; cached live dims (read-only mappings) must not
    stop that (kdsl bench tune failed so)."""
    import pickle

    from kdsl import gallery, solve

    op = gallery.load("syno_op1")
    assert op.live and op.key and solve.plan(op)  # fill the caches
    copy = pickle.loads(pickle.dumps(op))
    assert copy == op and copy.key == op.key and list(copy.live[-1]) == list(op.live[-1])


# --------------------------------------------------------------------------------------------------
# Branching operators
# --------------------------------------------------------------------------------------------------


C, R = primary("C R")


def _conv(x: object, name: str) -> object:
    weight = Weight(Dim("o", C), C, "kh", "kw", name=name)
    return x >> Unfold(H, K, "kh") >> Unfold(W, K, "kw") >> Share(weight) >> Reduce(C, "kh", "kw") >> Rename("o", "C")


def test_a_linear_build_stays_an_operator() -> None:
    op = Input(N, C, H, W) >> Unfold(H, K, "kh") >> Reduce("kh") >> Output(N, C, H, W)
    assert type(op).__name__ == "Operator"
    # the same build through a Tensor is the same operator
    assert Tensor.of(Input(N, C, H, W), "test") >> Unfold(H, K, "kh") >> Reduce("kh") >> Output(N, C, H, W) == op


def test_a_non_linear_step_makes_a_graph_whose_chains_are_linear() -> None:
    graph = Input(N, C, H, W) >> Unfold(H, K, "kh") >> Fold("kh") >> Map("relu") >> Output(N, C, H, W)
    assert not graph.is_linear
    assert [node.kind for node in graph.nodes] == ["Input", "Chain", "Fold", "Map"]
    assert [node.args for node in graph.nodes] == [(), (0,), (1,), (2,)]
    chain = graph.nodes[1].chain
    assert [step.kind for step in chain.steps] == ["Unfold"]
    assert [d.name for d in chain.outputs] == ["N", "C", "H", "W", "kh"]  # a window dim comes last


def test_a_tensor_read_twice_is_one_node() -> None:
    x = Input(N, C, H, W)
    branch = x >> Unfold(H, K, "kh") >> Reduce("kh")
    graph = (branch + (branch >> Map("relu"))) >> Output(N, C, H, W)
    assert [node.kind for node in graph.nodes] == ["Input", "Chain", "Map", "Blend"]
    assert graph.consumers[1] == (2, 3)
    # two separate builds of the input are one input node
    again = (Input(N, C, H, W) + (Input(N, C, H, W) >> Map("abs"))) >> Output(N, C, H, W)
    assert [node.kind for node in again.nodes] == ["Input", "Map", "Blend"]


def test_weights_are_numbered_across_chains_and_must_be_distinct() -> None:
    x = Input(N, C)
    first = x >> Share(Weight(Dim("o", R), C)) >> Reduce(C) >> Map("relu")
    second = first >> Share(Weight(Dim("p", C), "o")) >> Reduce("o")
    graph = second >> Output(N, "p")
    assert [w.name for w in graph.weights] == ["w1", "w2"]
    twice = x >> Share(Weight(Dim("o", C), C)) >> Reduce(C) >> Rename("o", "C")
    with pytest.raises(ShapeError, match="w1"):
        _ = twice + (x >> Share(Weight(Dim("o", C), C)) >> Reduce(C) >> Rename("o", "C"))


def test_text_json_and_key_of_a_residual_convolution() -> None:
    x = Input(N, C, H, W)
    residual = (x + _conv(x, "w")) >> Output(N, C, H, W, defaults={"K": 3})
    swapped = (_conv(x, "w") + x) >> Output(N, C, H, W, defaults={"K": 3})
    assert kdsl.parse(residual.to_dsl()) == residual
    assert kdsl.from_json(residual.to_json()) == residual
    assert residual.key == swapped.key  # the order of a commutative blend's branches is not content
    difference = (x - _conv(x, "w")) >> Output(N, C, H, W, defaults={"K": 3})
    reversed_difference = (_conv(x, "w") - x) >> Output(N, C, H, W, defaults={"K": 3})
    assert len({residual.key, difference.key, reversed_difference.key}) == 3


def test_one_shared_branch_and_two_equal_branches_have_different_keys() -> None:
    x = Input(N, C)
    shared = x >> Share(Weight(Dim("o", C), C, name="a")) >> Reduce(C) >> Rename("o", "C")
    once = (shared + shared) >> Output(N, C)
    other = x >> Share(Weight(Dim("o", C), C, name="b")) >> Reduce(C) >> Rename("o", "C")
    twice = (shared + other) >> Output(N, C)
    assert len(once.weights) == 1 and len(twice.weights) == 2
    assert once.key != twice.key


def test_pipelines_with_canvas_steps_are_values() -> None:
    gate = Reduce(H, W, mean=True) >> FC(C, name="r", size=R) >> Map("relu") >> FC("r", name="C2", size=C)
    x = Input(N, C, H, W)
    graph = (x * (x >> gate >> Map("sigmoid") >> Rename("C2", "C"))) >> Output(N, C, H, W)
    assert [node.kind for node in graph.nodes] == ["Input", "Chain", "FC", "Map", "FC", "Map", "Rename", "Blend"]
    assert [w.name for w in graph.weights] == ["r_w", "C2_w"]
    assert [str(s) for s in graph.weights[0].shape] == ["R", "C"]


def test_a_weighted_chain_extended_in_two_branches_is_one_shared_node() -> None:
    # h is extended by >> in one branch (copying its steps) and closed in the other; its weight
    # is still one parameter, read by both branches
    x = Input(N, C, H, W)
    weight = Weight(Dim("o", C), C, "kh", "kw", name="w")
    h = x >> Unfold(H, K, "kh") >> Unfold(W, K, "kw") >> Share(weight) >> Reduce(C, "kh", "kw")
    graph = ((h >> Map("relu")) + (h >> Unfold(H, K, "k2") >> Reduce("k2"))) >> Output(N, "o", H, W)
    assert [node.kind for node in graph.nodes] == ["Input", "Chain", "Map", "Chain", "Blend"]
    assert [w.name for w in graph.weights] == ["w"]
    assert graph.nodes[3].args == (1,) and graph.nodes[2].args == (1,)
    assert [step.kind for step in graph.nodes[3].chain.steps] == ["Unfold", "Reduce"]


# --------------------------------------------------------------------------------------------------
# One operator type
# --------------------------------------------------------------------------------------------------


def test_a_linear_operator_is_its_input_and_one_chain_node() -> None:
    from kdsl.lang.chain import Chain

    op = kdsl.gallery.load("conv2d")
    assert [node.kind for node in op.nodes] == ["Input", "Chain"] and op.is_linear
    assert isinstance(op.chain, Chain) and op.steps == op.chain.steps and op.weights == op.chain.weights
    assert op.chain.outputs == op.outputs and op.chain.defaults == op.defaults
    # the keys stored databases and the gallery use stay what they were (a linear operator's is its chain's)
    assert op.key == op.chain.key == "8633e1ac8b3e7977"
    assert kdsl.Operator.from_steps(op.inputs, op.steps, op.outputs, op.defaults) == op


def test_a_branching_operator_has_no_steps_and_its_design_key_is_its_key() -> None:
    import pickle

    op = kdsl.gallery.load("squeeze_excitation")
    assert not op.is_linear and op.chain is None
    with pytest.raises(ShapeError, match="steps is defined for a linear operator"):
        op.steps  # noqa: B018
    assert op.design_key == op.key == "066d9f96afc6b675"
    copy = pickle.loads(pickle.dumps(op))
    assert copy == op and copy.key == op.key and copy.to_dsl() == op.to_dsl()


def test_with_defaults_and_substituted_keep_a_linear_operator_linear() -> None:
    grouped = kdsl.gallery.load("grouped_conv2d")
    other = grouped.with_defaults(G=2)
    assert other.is_linear and other.defaults == other.chain.defaults and dict(other.defaults)["G"] == 2
    assert other.substituted({"G": 2}).is_linear
