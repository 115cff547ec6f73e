"""No lowering blow-ups (issue 14): the stage planner never materialises a product that a fused
reduction avoids.

The case from the issue: search's candidate ``Unfold(H, G) >> Split(Cin, G*s) >> Share(w1) >>
Merge("d_2", "k") >> Merge("d", "g") >> Reduce("Cin_r")`` was lowered as one einsum producing the
7-D product ``[N, d_2, k, H, W, g, d]`` (Cin x Cout times the image) and summed afterwards,
because the Merges ended the contraction stage before its Reduce. The planner now folds a
reshape whose outputs are only summed into the sum (:func:`kdsl.solve.dependencies.folded`) and runs a
stage's ready Reduces before any view.

Building, printing and reading branching kernels takes time linear in their size (issue 25).

Each join used to walk the whole graph, so 2k joins took seconds and 10k minutes. The time
limits here are generous (several times what a busy laptop measures); the ratio checks catch a
quadratic regression (doubling the size would quadruple the time) where a slow machine does not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from math import prod

import pytest
from helpers import assert_module_matches_reference, assert_same_function
from hypothesis import given

import kdsl
from kdsl.bench import lowering_bench as lowering
from kdsl.codegen import reference
from kdsl.codegen import torch as kdsl_torch
from kdsl.lang import Blend, Input, Map, Output, Rename, ShapeError, coefficient, primary
from kdsl.lang.operator import Operator
from kdsl.lang.parser import MAX_SOURCE_CHARS
from kdsl.lang.primitives import Dim, Merge, Reduce, Share, Shift, Split, Unfold, Weight
from kdsl.lang.printer import CHUNK
from kdsl.lang.serialize import MAX_JSON_CHARS
from kdsl.solve import Stage, bind, cost, plan
from kdsl.solve.dependencies import folded
from kdsl.testing import strategies as kst

N, Cin, Cout, H, W, C, D = primary("N Cin Cout H W C D")
G, s = coefficient("G s")

#: a small layer of the issue's case: G=2 groups of the window, s=2, every size divides
SMALL = {"N": 2, "Cin": 8, "Cout": 6, "H": 5, "W": 3, "G": 2, "s": 2}
#: a ResNet-18-like layer (the sizes the issue measured at)
RESNET = {"N": 1, "Cin": 64, "Cout": 64, "H": 56, "W": 56, "G": 2, "s": 2}


def issue_case() -> Operator:
    """``5a9dd105044a4f31`` of the issue's demo run, as search stored it."""
    w1 = Weight(Dim("d", Cout / G), "g", "d_2", "k", name="w1")
    return (
        Input(N, Cin, H, W)
        >> Unfold(H, G, "g")
        >> Split(Cin, G * s, "d_2", "k")
        >> Share(w1)
        >> Merge("d_2", "k", "Cin_r")
        >> Merge("d", "g", "Cout")
        >> Reduce("Cin_r")
        >> Output(N, Cout, H, W, defaults={"G": 2, "s": 2})
    )


def elements(dims: tuple[tuple[str, object], ...], binding: dict[str, int]) -> int:
    return int(prod(size.evaluate(binding) for _, size in dims))  # type: ignore[attr-defined]


def test_the_issue_case_sums_inside_its_einsum() -> None:
    op = issue_case()
    binding = bind(op, RESNET)
    p = plan(op, binding)
    (stage,) = p.stages
    assert [type(step).__name__ for step in stage.steps] == ["Share", "Reduce", "Reduce"]
    assert set(stage.reduced) == {"d_2", "k"}
    # the only views after the stage are reshapes of its (output-sized) result
    assert all(not isinstance(item, Stage) for item in p.segments()[p.segments().index(stage) + 1 :])
    sizes = cost(op, binding)
    weights = sizes["params"]
    # every stage result fits in the largest of input, output and weights; the largest tensor of
    # all is the unfolded input (G copies of each pixel, the operator's own window, as conv2d's
    # im2col), never a product of data and weight dims
    bound = max(sizes["input"], sizes["output"], weights)
    assert all(elements(stage.result, binding) <= bound for stage in p.stages)
    assert p.largest_tensor(binding) <= max(bound, sizes["input"] * binding["G"])
    # the written order (no planner) materialises the Share's product: Cin*Cout/G times the image
    unplanned = plan(op, binding, reorder=False)
    assert unplanned.largest_tensor(binding) == RESNET["N"] * RESNET["H"] * RESNET["W"] * RESNET["Cin"] * RESNET["Cout"]
    assert unplanned.largest_tensor(binding) >= 10 * p.largest_tensor(binding)
    # and it no longer counts the sum of the product as a second pass over it
    assert p.flops(binding) == unplanned.flops(binding) // 2


def test_the_issue_case_generated_module_matches_the_reference() -> None:
    op = issue_case()
    text = kdsl_torch.source(op, SMALL)
    einsums = [line for line in text.splitlines() if "torch.einsum(" in line]  # its einops spec in a comment
    assert len(einsums) == 1 and "-> N H W g d" in einsums[0], einsums
    assert ".sum(" not in text.split("def forward")[1]  # no separate sum over a materialised product
    x, weights = reference.random_inputs(op, SMALL, seed=0)
    assert_module_matches_reference(kdsl_torch.build(op, SMALL).double(), op, SMALL, x, weights, rtol=1e-9, atol=1e-9)


def test_two_weights_are_contracted_with_each_other_first() -> None:
    """Search's b00aca54: one stage ``x * w1 * w2`` summed over d (in the weights only), k, d_2.
    torch.einsum goes left to right, so the data would first meet all of w1's dims; the module
    contracts the weights over d first, then the data once."""
    w1 = Weight(Cout, Dim("d", Cin / (G * s)), "k", name="w1")
    w2 = Weight("d", "k", "d_2", name="w2")
    op = (
        Input(N, Cin, H, W)
        >> Split(Cin, Cin * G / s, "k", "d_2")
        >> Share(w1)
        >> Share(w2)
        >> Merge("k", "d_2", "Cin_r")
        >> Reduce("d", "Cin_r")
        >> Output(N, Cout, H, W, defaults={"G": 2, "s": 2})
    )
    layer = {"N": 2, "Cin": 8, "Cout": 3, "H": 3, "W": 2, "G": 2, "s": 2}
    text = kdsl_torch.source(op, layer)
    # each torch.einsum's comment spells it with the DSL's dims
    assert "Cout d k, d k d_2 -> Cout k d_2" in text and "N k d_2 H W, Cout k d_2 -> N H W Cout" in text
    x, weights = reference.random_inputs(op, layer, seed=0)
    assert_module_matches_reference(kdsl_torch.build(op, layer).double(), op, layer, x, weights, rtol=1e-9, atol=1e-9)


def test_merge_before_reduce_reduces_first_then_reshapes() -> None:
    """A Merge written between a Share and the Reduce of another dim moves after the Reduce."""
    E = coefficient("E")
    op = (
        Input(N, C) >> Share(Weight(C, D, Dim("e", E), name="w")) >> Merge(D, "e", "De") >> Reduce(C) >> Output(N, "De")
    )
    p = plan(op)
    assert [type(item).__name__ for item in p.segments()] == ["Stage", "View"]
    assert p.stages[0].reduced == ("C",)
    assert plan(op, reorder=False).largest_tensor() > p.largest_tensor()
    assert_same_function(
        op, Operator.from_steps(op.inputs, p.steps, p.outputs, op.defaults), {"N": 2, "C": 3, "D": 2, "E": 2}, seed=3
    )


def test_folding_is_kept_only_when_it_costs_no_more() -> None:
    """Search's 87c41f5a: folding ``Merge("d", "k_2") ... Reduce`` lets the planner sum ``k_2``
    (of size G/s = 1 here) in a pass of its own before the window; the plan as written, which sums
    ``d`` and ``k_2`` together after it, is cheaper and is the one kept."""
    K = coefficient("K")
    op = (
        Input(N, Cin, H, W)
        >> Split(Cin, Cin * s / G, "k_2", "d")
        >> Unfold("d", K, "k")
        >> Share(Weight(Cout, "k", name="w1"))
        >> Merge("d", "k_2", "Cin_r")
        >> Reduce("Cin_r", "k")
        >> Output(N, Cout, H, W, defaults={"G": 2, "K": 3, "s": 2})
    )
    binding = bind(op, RESNET | {"K": 3})
    p = plan(op, binding)
    pixels = binding["N"] * binding["H"] * binding["W"]
    assert p.flops(binding) == pixels * 3 * (binding["Cin"] + binding["Cout"])  # one pass over the window each
    assert p.source is op
    more = {**binding, "G": 4, "s": 1}  # k_2 = 4: summing it before the window saves a pass
    assert plan(op, more).source is folded(op) and plan(op, more).flops(more) < pixels * 3 * (
        more["Cin"] + more["Cout"]
    )
    for point in (binding, more):
        assert_same_function(
            op, Operator.from_steps(op.inputs, plan(op, point).steps, op.outputs, op.defaults), SMALL | {"K": 3}, seed=3
        )


@pytest.mark.parametrize("mean", [False, True])
def test_folded_views(mean: bool) -> None:
    """Merge, Split (both parts) and Shift whose outputs are only summed fold into the sum."""
    layer = {"N": 2, "C": 6, "D": 3, "G": 2}
    merged = (
        Input(N, C)
        >> Split(C, G, "c", "g")
        >> Share(Weight("c", "g", D, name="w"))
        >> Merge("c", "g", "C2")
        >> Reduce("C2", mean=mean)
        >> Output(N, D)
    )
    split = (
        Input(N, C)
        >> Share(Weight(C, D, name="w"))
        >> Split(C, G, "c", "g")
        >> Reduce("c", "g", mean=mean)
        >> Output(N, D)
    )
    shifted = Input(N, C) >> Share(Weight(C, D, name="w")) >> Shift(C) >> Reduce(C, mean=mean) >> Output(N, D)
    expected = {
        merged: ["Split", "Share", "Reduce", "Reduce"],
        split: ["Share", "Reduce"],
        shifted: ["Share", "Reduce"],
    }
    for op, kinds in expected.items():
        result = folded(op)
        assert [step.kind for step in result.steps] == kinds
        assert all(step.mean == mean for step in result.steps if isinstance(step, Reduce))
        assert len(plan(op).stages) == 1
        assert_same_function(op, result, layer, seed=3)


def test_views_that_are_not_only_summed_stay() -> None:
    layer = {"N": 2, "C": 6, "D": 3, "G": 2}
    # one part of the split is kept
    partly = Input(N, C) >> Share(Weight(C, D, name="w")) >> Split(C, G, "c", "g") >> Reduce("g") >> Output(N, "c", D)
    # a mean over one part and a sum over the other is not one sum over the whole dim
    mixed = (
        Input(N, C)
        >> Share(Weight(C, D, name="w"))
        >> Split(C, G, "c", "g")
        >> Reduce("c", mean=True)
        >> Reduce("g")
        >> Output(N, D)
    )
    for op in (partly, mixed):
        assert folded(op) is op
        assert_same_function(
            op, Operator.from_steps(op.inputs, plan(op).steps, plan(op).outputs, op.defaults), layer, seed=3
        )


def assert_no_stage_ends_before_a_ready_sum(op: Operator, layer: dict[str, int]) -> None:
    """No Reduce-only stage sums a dim that the stage before it left as is: a stage with a Share
    runs its ready Reduces itself instead of materialising its product first."""
    p = plan(op, layer)
    segments = p.segments()
    for position, item in enumerate(segments):
        if not isinstance(item, Stage) or any(step.kind == "Share" for step in item.steps):
            continue
        previous = next((s for s in reversed(segments[:position]) if isinstance(s, Stage)), None)
        if previous is None or not any(step.kind == "Share" for step in previous.steps):
            continue
        touched = {
            name
            for s in p.steps[previous.stop : item.start]
            for name in (*s.consumes, *s.produces)  # views between the two stages
        }
        result = {name for name, _ in previous.result}
        untouched = [d for d in item.reduced if d in result and d not in touched]
        assert not untouched, f"{untouched} could be summed in the stage before:\n{p.describe()}"


@given(kst.operators_with_layers(max_steps=7))
def test_random_operators_fold_soundly_and_sum_inside_stages(op_and_layer: tuple[Operator, dict[str, int]]) -> None:
    op, layer = op_and_layer
    assert_same_function(op, folded(op), layer, seed=3)
    assert folded(folded(op)) == folded(op)  # idempotent (the cache may give back an equal twin)
    assert_no_stage_ends_before_a_ready_sum(op, layer)
    assert_no_stage_ends_before_a_ready_sum(issue_case(), SMALL)


# ------------------------------------------------------------------------------------------------
# kdsl bench lowering: latency ratio / FLOPs ratio


def test_lowering_summary_takes_median_and_max_of_the_measured() -> None:
    rows = [
        {"key": "a", "latency_ratio": 1.0, "flops_ratio": 0.5},  # 2
        {"key": "b", "latency_ratio": 0.3, "flops_ratio": 0.1},  # 3
        {"key": "c", "latency_ratio": 7.6, "flops_ratio": 0.1},  # 76
        {"key": "d", "error": "LoweringError: ..."},
        {"key": "e", "latency_ratio": 0.2, "flops_ratio": 0.0},  # a pure view: no FLOPs
    ]
    summary = lowering.summarize(rows)
    assert summary["median"] == pytest.approx(3.0) and summary["max"] == pytest.approx(76.0)
    assert (summary["worst"], summary["measured"], summary["failed"], summary["without_flops"]) == ("c", 3, 1, 1)
    assert lowering.summarize([])["median"] is None


def test_lowering_measures_operators_and_reports_failures() -> None:
    table = [{"name": "tiny", "N": 1, "Cin": 8, "Cout": 8, "H": 4, "W": 4}]
    items = [("issue", issue_case().to_dsl(), None), ("broken", "op = Input(", None)]
    rows = lowering.measure(items, layers=table, latency={"repeats": 1, "max_repeats": 1, "warmup": 0})
    measured, broken = rows
    # one fused stage of N*Cin*Cout*H*W multiply-adds against conv2d's 3x3 window: 1/9
    assert measured["key"] == "issue" and measured["flops_ratio"] == pytest.approx(1 / 9)
    assert measured["overhead"] == pytest.approx(measured["latency_ratio"] / measured["flops_ratio"])
    assert broken["key"] == "broken" and broken["error"].startswith("ParseError")


# --------------------------------------------------------------------------------------------------
# Branching operators
# --------------------------------------------------------------------------------------------------


L = primary("L")


def _joins(count: int) -> Operator:
    """``count`` joins: mostly a tensor added to itself, every 50th a gated branch (the shapes of
    the issue's measurements: a DSL file under the size limit, a JSON file of Blend nodes)."""
    x = Input(N, C, L)
    t: object = x
    for index in range(count):
        t = t * (t >> Map("sigmoid")) if index % 50 == 49 else t + t  # type: ignore[operator]
    graph = t >> Output(N, C, L)  # type: ignore[operator]
    assert not graph.is_linear
    return graph


def _seconds(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def _round_trip_dsl(graph: Operator) -> Operator:
    text = graph.to_dsl()
    assert len(text) <= MAX_SOURCE_CHARS
    back = kdsl.parse(text)
    assert not back.is_linear
    return back


def test_five_thousand_joins_build_print_and_parse_back_in_linear_time() -> None:
    graph: list[Operator] = []
    build = _seconds(lambda: graph.append(_joins(5000)))
    back: list[Operator] = []
    text_time = _seconds(lambda: back.append(_round_trip_dsl(graph[0])))
    assert len(graph[0].nodes) == 5000 + 5000 // 50 + 1
    assert back[0] == graph[0] and back[0].key == graph[0].key
    assert build < 2.0, f"building 5,000 joins took {build:.2f} s"
    assert text_time < 4.0, f"printing and parsing 5,000 joins took {text_time:.2f} s"
    # doubling the joins at most about doubles the time (a quadratic build would quadruple it)
    small = [_seconds(lambda: _joins(1250)) for _ in range(2)]
    large = [_seconds(lambda: _joins(2500)) for _ in range(2)]
    assert min(large) < 3 * min(small) + 0.1, (small, large)
    small_graph, large_graph = _joins(1250), _joins(2500)
    small_text = min(_seconds(lambda: _round_trip_dsl(small_graph)) for _ in range(2))
    large_text = min(_seconds(lambda: _round_trip_dsl(large_graph)) for _ in range(2))
    assert large_text < 3 * small_text + 0.2, (small_text, large_text)


def test_ten_thousand_joins_round_trip_through_json_in_linear_time() -> None:
    graph = _joins(10_000)
    text = graph.to_json()
    assert len(text) <= MAX_JSON_CHARS
    back: list[object] = []
    seconds = _seconds(lambda: back.append(kdsl.from_json(text)))
    assert back[0] == graph and back[0].key == graph.key  # type: ignore[union-attr]
    assert seconds < 4.0, f"reading 10,000 joins from JSON took {seconds:.2f} s"
    small, large = _joins(2500).to_json(), _joins(5000).to_json()
    small_time = min(_seconds(lambda: kdsl.from_json(small)) for _ in range(2))
    large_time = min(_seconds(lambda: kdsl.from_json(large)) for _ in range(2))
    assert large_time < 3 * small_time + 0.2, (small_time, large_time)


def test_a_chain_of_three_thousand_maps_prints_as_statements_that_parse_back() -> None:
    t: object = Input(N, C)
    for _ in range(3000):
        t = t >> Map("relu")  # type: ignore[operator]
    graph = t >> Output(N, C)  # type: ignore[operator]
    text = graph.to_dsl()
    # no statement holds more than CHUNK steps (Python's parser nests one level per >>)
    assert max(len(statement.split("\n    >> ")) for statement in text.split("\n)\n")) <= CHUNK
    back = kdsl.parse(text)
    assert back == graph and back.key == graph.key


def test_a_long_linear_chain_inside_a_kernel_stays_one_chain_when_printed_in_pieces() -> None:
    x = Input(N, C, L)
    branch: object = x
    for _ in range(3 * CHUNK + 7):
        branch = branch >> Shift(L)  # type: ignore[operator]
    branch = branch >> Map("abs")  # type: ignore[operator]
    graph = (x * branch) >> Output(N, C, L)  # type: ignore[operator]
    assert [node.kind for node in graph.nodes] == ["Input", "Chain", "Map", "Blend"]
    back = kdsl.parse(graph.to_dsl())
    assert back == graph and back.key == graph.key


def _block(t: object, name: str) -> object:
    weight = Weight(Dim("o", C), C, name=name)
    return t >> Share(weight) >> Reduce(C) >> Rename("o", "C")  # type: ignore[operator]


def test_weights_stay_numbered_and_distinct_across_many_joins() -> None:
    x = Input(N, C)
    t: object = x
    for index in range(300):
        # a residual block (numbered w1, w2, ... after the weights t already reads) and, every
        # 10th join, a named branch from the input: both sides of that join bring weights
        t = t + _block(t, None) if index % 10 else t + _block(x, f"side{index}")  # type: ignore[operator,arg-type]
    graph = t >> Output(N, C)  # type: ignore[operator]
    names = [w.name for w in graph.weights]
    assert len(names) == len(set(names)) == 300
    assert kdsl.from_json(graph.to_json()) == graph
    assert kdsl.parse(graph.to_dsl()).key == graph.key
    # a weight name read through two different vertices is still an error, however deep
    with pytest.raises(ShapeError, match="side0"):
        _ = t + _block(x, "side0")  # type: ignore[operator]


def test_a_blend_of_many_branches_of_the_input() -> None:
    x = Input(N, C, L)
    t: object = x
    for _ in range(2000):
        t = Blend("max", t, x >> Map("abs"))
    graph = t >> Output(N, C, L)  # type: ignore[operator]
    assert kdsl.from_json(graph.to_json()) == graph


def _weighted(blocks: int) -> object:
    t: object = Input(N, C)
    for _ in range(blocks):
        t = t + _block(t, None)  # type: ignore[operator,arg-type]
    return t >> Output(N, C)  # type: ignore[operator]


def test_a_kernel_of_many_weighted_blocks_builds_in_linear_time() -> None:
    # each block's chain and join see every weight before it (for numbering and duplicates): a
    # copy of them per block was quadratic
    small = min(_seconds(lambda: _weighted(600)) for _ in range(2))
    large = min(_seconds(lambda: _weighted(1200)) for _ in range(2))
    assert large < 3 * small + 0.1, (small, large)
