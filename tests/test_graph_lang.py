"""Building branching kernels: the Tensor builder, the chain special case, shared branches."""

from __future__ import annotations

import pytest

import kdsl
from kdsl.lang import (
    FC,
    Dim,
    Fold,
    Input,
    Map,
    Output,
    Reduce,
    Rename,
    ShapeError,
    Share,
    Tensor,
    Unfold,
    Weight,
    coefficient,
    primary,
)

N, C, H, W, R = primary("N C H W R")
K = coefficient("K")


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
