"""Stage plans (Syno's rfactor): dependency order, stages, FLOPs, renaming, and equal semantics."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

import kdsl
from kdsl.lang import Input, Output, coefficient, library, primary
from kdsl.lang.errors import DivisibilityError
from kdsl.lang.live import Live
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import BuildContext, Dim, Expand, Reduce, Share, Shift, Split, Unfold, Weight
from kdsl.solve import Plan, Stage, View, cost, load_layers, plan, reference_binding
from kdsl.testing import strategies as kst

N, C, D, E, L, A, B, P, Q = primary("N C D E L A B P Q")
Cin, Cout, H, W = primary("Cin Cout H W")
K, G, s = coefficient("K G s")


def sym(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, positive=True, integer=True)


def replay(op: Operator, p: Plan) -> Live:
    """Replay the plan's steps from the operator's input; they must all apply."""
    live = Live({d.name: d.size for d in op.inputs}, frozenset())
    context = BuildContext()
    for step in p.steps:
        step.apply(live, context)
    assert [d.size for d in p.outputs] == [d.size for d in op.outputs]
    assert set(live.sizes) == {d.name for d in p.outputs}
    assert all(live.sizes[d.name] is d.size for d in p.outputs)
    return live


def check_structure(op: Operator, p: Plan) -> None:
    """Order is a permutation, stages are Share*/Reduce* runs, segments cover every step once."""
    assert sorted(p.order) == list(range(len(p.source.steps)))
    assert len(p.live) == len(p.steps) + 1
    covered: list[int] = []
    for item in p.segments():
        if isinstance(item, Stage):
            kinds = [type(step).__name__ for step in item.steps]
            assert kinds and set(kinds) <= {"Share", "Reduce"}
            assert "Share" not in kinds[kinds.index("Reduce") :] if "Reduce" in kinds else True
            assert item.operand == p.live[item.start] and item.result == p.live[item.stop]
            assert {n for n, _ in item.result} | set(item.reduced) == {n for n, _ in item.iteration}
            covered.extend(range(item.start, item.stop))
        else:
            assert isinstance(item, View)
            assert type(item.step).__name__ not in ("Share", "Reduce")
            covered.append(item.index)
    assert covered == list(range(len(p.steps)))
    live = replay(op, p)
    assert len(live.sizes) == len(op.outputs)


def two_weights_fused() -> Operator:
    return (
        Input(N, C) >> Share(Weight(C, D, name="w1")) >> Share(Weight(D, E, name="w2")) >> Reduce(C, D) >> Output(N, E)
    )


def syno_op1() -> Operator:
    w2 = Weight(Cin, "kw", Dim("c", Cout / (G * s)), name="W2")
    w1 = Weight("g", "kh", "kw", Cout, "c", name="W1")
    return (
        Input(N, Cin, H, W)
        >> Unfold(H, K, "kh")
        >> Unfold(W, K, "kw")
        >> Share(w2)
        >> Split(Cin, Cin / G, "g", "ci")
        >> Reduce("ci")
        >> Share(w1)
        >> Reduce("g", "kh", "kw", "c")
        >> Output(N, Cout, H, W, defaults={"G": 32, "K": 3, "s": 2})
    )


def test_conv2d_is_one_stage_with_the_mac_count() -> None:
    op = library.load("conv2d")
    p = plan(op)
    check_structure(op, p)
    assert len(p.stages) == 1
    stage = p.stages[0]
    assert [w.name for w in stage.weights] == ["w"] and stage.reduced == ("Cin", "kh", "kw")
    assert {n for n, _ in stage.iteration} == {"N", "Cin", "Cout", "H", "W", "kh", "kw"}
    assert stage.cost == N * Cout * H * W * Cin * K**2
    n, cin, cout, h, w, k = (sym(x) for x in "N Cin Cout H W K".split())
    assert sympy.simplify(p.flops_formula() - n * cout * h * w * cin * k**2) == 0
    for layer in load_layers("resnet18"):
        assert p.flops(layer) == layer["N"] * layer["Cout"] * layer["H"] * layer["W"] * layer["Cin"] * 9


def test_early_reduce_splits_two_weights_into_two_stages() -> None:
    op = two_weights_fused()
    p = plan(op)
    check_structure(op, p)
    assert [type(step).__name__ for step in p.steps] == ["Share", "Reduce", "Share", "Reduce"]
    assert len(p.stages) == 2
    n, c, d, e = (sym(x) for x in "N C D E".split())
    assert sympy.simplify(p.flops_formula() - (n * c * d + n * d * e)) == 0
    written = plan(op, reorder=False)
    assert len(written.stages) == 1
    assert sympy.simplify(written.flops_formula() - n * c * d * e) == 0
    assert p.flops({"N": 2, "C": 3, "D": 4, "E": 5}) == 2 * 3 * 4 + 2 * 4 * 5


def test_an_already_two_stage_operator_keeps_its_stages() -> None:
    op = (
        Input(N, C)
        >> Share(Weight(C, D, name="w1"))
        >> Reduce(C)
        >> Share(Weight(D, E, name="w2"))
        >> Reduce(D)
        >> Output(N, E)
    )
    p = plan(op)
    check_structure(op, p)
    assert [stage.cost for stage in p.stages] == [N * C * D, N * D * E]
    assert p.order == (0, 1, 2, 3)


def test_reduce_is_hoisted_before_an_unrelated_unfold() -> None:
    op = Input(N, C, L) >> Unfold(L, K, "k") >> Reduce(C, "k") >> Output(N, L)
    p = plan(op)
    check_structure(op, p)
    assert p.steps[0] == Reduce("C")
    assert isinstance(p.steps[1], Unfold)
    assert [stage.cost for stage in p.stages] == [N * C * L, N * L * K]
    layer = {"N": 1, "C": 64, "L": 100, "K": 3}
    assert p.flops(layer) < plan(op, reorder=False).flops(layer)


def test_a_shift_that_only_the_output_reads_runs_last_on_the_output() -> None:
    # a depthwise-separable conv whose W is rolled right after it is unfolded (search emits it):
    # written order rolls the K**2-times unfolded data and ends the first stage there
    depthwise, pointwise = Weight(Cin, "kh", "kw", name="depthwise"), Weight(Cout, Cin, name="pointwise")
    op = (
        Input(N, Cin, H, W)
        >> Unfold(H, K, "kh")
        >> Unfold(W, K, "kw")
        >> Shift(W)
        >> Shift(H)
        >> Share(depthwise)
        >> Reduce("kh", "kw")
        >> Share(pointwise)
        >> Reduce(Cin)
        >> Output(N, Cout, H, W)
    )
    p = plan(op)
    check_structure(op, p)
    assert [type(step) for step in p.steps[-2:]] == [Shift, Shift]
    # the rolls permute the output [N, Cout, H, W], not the unfolded [N, Cin, H, W, kh, kw]
    rolls = [segment for segment in p.segments() if isinstance(segment, View) and isinstance(segment.step, Shift)]
    assert [sorted(name for name, _ in roll.before) for roll in rolls] == [sorted("N Cout H W".split())] * 2
    layer = {"N": 1, "Cin": 8, "Cout": 4, "H": 6, "W": 5, "K": 3}
    reference = pytest.importorskip("kdsl.codegen.reference")
    np = pytest.importorskip("numpy")
    reordered = Operator.from_steps(op.inputs, p.steps, p.outputs, op.defaults)
    x, weights = reference.random_inputs(op, layer, seed=3)
    assert np.allclose(reference.run(reordered, layer, x, weights), reference.run(op, layer, x, weights))


def test_heavy_order_depends_on_the_binding() -> None:
    op = (
        Input(N, A, B)
        >> Share(Weight(A, Dim("p", P), name="w1"))
        >> Share(Weight(B, Dim("q", Q), name="w2"))
        >> Reduce(A, B)
        >> Output(N, "p", "q")
    )
    wide_b = {"N": 1, "A": 2, "B": 64, "P": 64, "Q": 2}
    wide_a = {"N": 1, "A": 64, "B": 2, "P": 2, "Q": 64}
    first = plan(op, wide_b)
    second = plan(op, wide_a)
    check_structure(op, first)
    check_structure(op, second)
    assert first.steps[0].weight.name == "w2" and second.steps[0].weight.name == "w1"
    # each is the cheaper of the two orders
    for binding in (wide_b, wide_a):
        a, b, p_, q = binding["A"], binding["B"], binding["P"], binding["Q"]
        assert plan(op, binding).flops(binding) == min(a * b * p_ + b * p_ * q, a * b * q + a * p_ * q)
    # at the reference point the two orders tie, and the written order wins
    assert plan(op).order == (0, 2, 1, 3)


def test_syno_op1_reduces_against_the_first_weight_before_unfolding_h() -> None:
    op = syno_op1()
    p = plan(op)
    check_structure(op, p)
    first_heavy = [type(step).__name__ + ":" + getattr(step, "dim", "") for step in p.steps[:2]]
    assert first_heavy == ["Unfold:W", "Share:"]
    unfold_h = next(i for i, step in enumerate(p.steps) if isinstance(step, Unfold) and step.dim == "H")
    reduce_ci = p.steps.index(Reduce("ci"))
    assert reduce_ci < unfold_h
    binding = {"N": 1, "Cin": 64, "Cout": 64, "H": 56, "W": 56, "G": 32, "K": 3, "s": 2}
    assert p.flops(binding) < plan(op, reorder=False).flops(binding)
    assert cost(op, binding)["flops"] == plan(op, binding).flops(binding)


def test_renaming_when_a_reorder_makes_two_live_dims_share_a_name() -> None:
    op = (
        Input(N, A, B)
        >> Unfold(A, K, "k")
        >> Reduce("k")
        >> Share(Weight(B, Dim("k", E), name="w"))
        >> Reduce(B)
        >> Output(N, A, "k")
    )
    binding = {"N": 1, "A": 64, "B": 64, "E": 4, "K": 3}
    p = plan(op, binding)
    check_structure(op, p)
    assert p.order == (2, 3, 0, 1)
    assert p.steps[2] == Unfold("A", K, "k_2") and p.steps[3] == Reduce("k_2")
    assert [d.name for d in p.outputs] == ["N", "A", "k"]
    assert p.flops(binding) == 64 * 64 * 4 + 64 * 4 * 3
    assert p.flops(binding) < plan(op, binding, reorder=False).flops(binding)


def test_a_renamed_output_dim_is_reported_in_plan_outputs() -> None:
    op = (
        Input(N, B)
        >> Unfold(B, K, "k")
        >> Share(Weight("k", Dim("p", P), name="w3"))
        >> Reduce("k")
        >> Share(Weight(B, Dim("k", E), name="w2"))
        >> Reduce(B)
        >> Output(N, "p", "k")
    )
    p = plan(op)
    check_structure(op, p)
    assert p.order == (0, 3, 4, 1, 2)
    assert [d.name for d in p.outputs] == ["N", "p", "k_2"]
    assert [d.size for d in p.outputs] == [N, P, E]
    n, b, p_, e, k = (sym(x) for x in "N B P E K".split())
    assert sympy.simplify(p.flops_formula() - (n * b * k * e + n * k * e * p_)) == 0


def test_many_heavy_steps_use_the_greedy_order() -> None:
    names = [f"X{i}" for i in range(9)]
    dims = [primary(n) for n in names]
    builder = Input(*dims)
    for name in names:
        builder = builder >> Unfold(name, K, f"k{name}")
    for name in names:
        builder = builder >> Reduce(f"k{name}")
    op = builder >> Output(*names)
    began = time.perf_counter()
    p = plan(op)
    assert time.perf_counter() - began < 2.0
    check_structure(op, p)
    # each window is summed as soon as it exists
    assert [type(step).__name__ for step in p.steps] == ["Unfold", "Reduce"] * 9


def test_expand_and_share_of_its_dim() -> None:
    op = Input(N, C) >> Expand("e", K) >> Share(Weight(C, "e", name="w")) >> Reduce(C) >> Output(N, "e")
    p = plan(op)
    check_structure(op, p)
    assert p.flops({"N": 2, "C": 3, "K": 4}) == 2 * 3 * 4


def test_segments_walk_views_and_stages() -> None:
    p = plan(library.load("conv2d"))
    items = p.segments()
    assert [type(item).__name__ for item in items] == ["View", "View", "Stage"]
    first = items[0]
    assert isinstance(first, View) and first.before == p.live[0] and first.after == p.live[1]
    assert p.stage_at(0) is None and p.stage_at(2) is p.stages[0]
    assert "stage 1:" in p.describe()


def test_plans_are_deterministic_and_cached() -> None:
    op = syno_op1()
    assert plan(op) is plan(op)
    assert plan(op).binding == tuple(reference_binding(op).items())
    assert reference_binding(op) == {"Cin": 256, "Cout": 256, "H": 256, "N": 256, "W": 256, "G": 32, "K": 3, "s": 2}


def test_flops_at_an_invalid_binding_is_an_error() -> None:
    op = Input(N, C) >> Split(C, C / G, "g", "c") >> Reduce("c") >> Output(N, "g")
    p = plan(op)
    assert p.stages[0].cost == N * C
    assert p.flops({"N": 1, "C": 8, "G": 2}) == 8
    with pytest.raises(DivisibilityError):
        p.flops({"N": 1, "C": Fraction(7, 2), "G": 2})


def test_an_operator_without_steps_has_no_stages() -> None:
    op = Input(N, C) >> Output(C, N)
    p = plan(op)
    assert p.steps == () and p.stages == () and p.flops({"N": 1, "C": 2}) == 0
    assert p.flops_formula() == 0


@given(kst.operators_with_layers(max_steps=7), st.booleans())
def test_random_plans_are_valid_orders(op_and_layer: tuple[Operator, dict[str, int]], at_layer: bool) -> None:
    op, layer = op_and_layer
    p = plan(op, layer if at_layer else None)
    check_structure(op, p)
    total = sum((stage.cost.evaluate(layer) for stage in p.stages), Fraction(0))
    assert p.flops(layer) == total
    assert p.flops_formula().subs({sym(k): v for k, v in layer.items()}) == total


@given(kst.operators_with_layers(max_steps=7))
def test_random_plans_compute_the_same_function(op_and_layer: tuple[Operator, dict[str, int]]) -> None:
    pytest.importorskip("numpy")
    from helpers import assert_same_function  # the reference interpreter needs numpy

    op, layer = op_and_layer
    p = plan(op, layer)
    reordered = Operator.from_steps(op.inputs, p.steps, p.outputs, op.defaults)
    assert_same_function(op, reordered, layer, seed=1)


def test_gallery_style_operator_text_round_trip_keeps_the_plan() -> None:
    op = syno_op1()
    again = kdsl.parse(op.to_dsl())
    assert plan(again).flops_formula() == plan(op).flops_formula()
