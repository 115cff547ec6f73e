"""Canonicalization rules: each exact (or scale) rule's uncanonical example computes the same
function as its canonical form on the reference backend, and the rule (traced alone) fires on the
uncanonical form and not on the canonical one.

Search, its canonicalization rules and the planner stay linear: none of them may commute a
linear step across a non-linear one.

Search synthesizes linear operators only; its rules are patterns over two adjacent *linear*
primitives, and the planner reorders the steps of one linear chain. A branching kernel holds
Canvas's steps between chains, so a rule or a plan sees a chain alone and never a Map, Fold or
Softmax inside it. The checks here:

* the search tables, the rules' kinds and search's output know only the linear primitives;
* every chain of a drawn kernel holds only linear primitives, and its plan is a reordering of its
  own steps (nothing from across a Canvas step);
* each exact rule's identity, with a ReLU put between its two primitives, is not an identity any
  more (the reference says so where the identity pairs a Share with a view) and the rule does
  not fire on either chain alone;
* concrete pairs that would be equal if a linear step could cross a non-linear one are different
  functions (reference) with different keys: a cyclic Shift against a zero-padded Unfold around a
  ReLU, a Map with f(0) != 0 before or after a zero-padded window, a Fold's padding seen through a
  Map, two contractions around a ReLU;
* an operator (a linear chain) that holds a Map is refused, so no plan can move one.
"""

import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given

from kdsl.codegen import reference
from kdsl.lang import Fold, Input, Map, Output, Rename, coefficient, primary
from kdsl.lang.errors import KdslError
from kdsl.lang.nonlinear import JOINS, MAP_FUNCTIONS, NONLINEAR, UNARY, ZERO_PRESERVING
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import (
    CONTRACTION,
    PRIMITIVES,
    Dim,
    Expand,
    Merge,
    Pipeline,
    Reduce,
    Share,
    Shift,
    Split,
    Unfold,
    Weight,
)
from kdsl.search import kinds
from kdsl.search.rules import RULES, trace
from kdsl.search.sample import rollout
from kdsl.search.space import Space
from kdsl.search.synthesis import canonical_path, to_operators
from kdsl.solve.plan import chain_plans, plan
from kdsl.testing import strategies as kst

N, C, D, H, A, E = primary("N C D H A E")
B, K = coefficient("B K")
# E = C: a layer where an output variable equals an input one (an extra output goal)
VALUES = {"N": 2, "C": 12, "D": 3, "H": 7, "A": 2, "B": 2, "K": 3, "E": 12}


def same(ws, v):
    return ws


def reshaped(ws, v, shapes):
    return [w.reshape(s) for w, s in zip(ws, shapes)]


# rule -> (uncanonical, canonical, canonical weights -> uncanonical weights, scale factor)
EXAMPLES = {
    "split_before_share": (
        Input(N, C)
        >> Share(Weight(C, Dim("o", D), name="w"))
        >> Split(C, B, "a", "b")
        >> Reduce("b")
        >> Output(N, "a", "o"),
        Input(N, C)
        >> Split(C, B, "a", "b")
        >> Share(Weight("a", "b", Dim("o", D), name="w"))
        >> Reduce("b")
        >> Output(N, "a", "o"),
        lambda ws, v: [ws[0].reshape(v["C"], v["D"])],
        1,
    ),
    "merge_after_share": (
        Input(N, C, D) >> Merge(C, D, "m") >> Share(Weight("m", name="w")) >> Output(N, "m"),
        Input(N, C, D) >> Share(Weight(C, D, name="w")) >> Merge(C, D, "m") >> Output(N, "m"),
        lambda ws, v: [ws[0].reshape(-1)],
        1,
    ),
    "shift_after_share": (
        Input(N, H) >> Shift(H) >> Share(Weight(H, name="w")) >> Output(N, H),
        Input(N, H) >> Share(Weight(H, name="w")) >> Shift(H) >> Output(N, H),
        lambda ws, v: [np.roll(ws[0], -1)],
        1,
    ),
    "split_not_above_reduces": (
        Input(N, C) >> Split(C, B, "a", "b") >> Reduce("a", "b") >> Output(N),
        Input(N, C) >> Reduce(C) >> Output(N),
        same,
        1,
    ),
    "merge_not_above_reduce": (
        Input(N, C, D) >> Merge(C, D, "m") >> Reduce("m") >> Output(N),
        Input(N, C, D) >> Reduce(C, D) >> Output(N),
        same,
        1,
    ),
    "no_shift_before_reduce": (
        Input(N, H) >> Shift(H) >> Reduce(H) >> Output(N),
        Input(N, H) >> Reduce(H) >> Output(N),
        same,
        1,
    ),
    "no_expand_before_reduce": (
        Input(N, C) >> Expand("e", D) >> Reduce("e") >> Output(N, C),
        Input(N, C) >> Shift(C) >> Shift(C, -1) >> Output(N, C),  # the identity
        same,
        "D",
    ),
    "right_leaning_splits": (
        Input(N, C) >> Split(C, B, "ab", "c") >> Split("ab", K, "a", "b") >> Output(N, "a", "b", "c"),
        Input(N, C) >> Split(C, K * B, "a", "bc") >> Split("bc", B, "b", "c") >> Output(N, "a", "b", "c"),
        same,
        1,
    ),
    "right_leaning_merges": (
        Input(N, A, Dim("b", B), Dim("c", K)) >> Merge(A, "b", "ab") >> Merge("ab", "c", "abc") >> Output(N, "abc"),
        Input(N, A, Dim("b", B), Dim("c", K)) >> Merge("b", "c", "bc") >> Merge(A, "bc", "abc") >> Output(N, "abc"),
        same,
        1,
    ),
    "merge_above_split": (
        Input(N, Dim("o", C), Dim("i", K * B))
        >> Merge("o", "i", "m")
        >> Split("m", B, "p", "q")
        >> Output(N, "p", "q"),
        Input(N, Dim("o", C), Dim("i", K * B))
        >> Split("i", B, "i1", "q")
        >> Merge("o", "i1", "p")
        >> Output(N, "p", "q"),
        same,
        1,
    ),
    "weight_dims_direct": (
        Input(N, C)
        >> Share(Weight(C, Dim("d", D * B), name="w"))
        >> Split("d", B, "a", "b")
        >> Reduce(C)
        >> Output(N, "a", "b"),
        Input(N, C) >> Share(Weight(C, Dim("a", D), Dim("b", B), name="w")) >> Reduce(C) >> Output(N, "a", "b"),
        lambda ws, v: [ws[0].reshape(v["C"], -1)],
        1,
    ),
    "weight_dim_not_summed": (
        Input(N, C) >> Share(Weight(C, Dim("e", D), name="w")) >> Reduce(C, "e") >> Output(N),
        Input(N, C) >> Share(Weight(C, name="w")) >> Reduce(C) >> Output(N),
        lambda ws, v: [np.repeat(ws[0][:, None], v["D"], 1) / v["D"]],
        1,
    ),
    "weights_not_redundant": (
        Input(N, C)
        >> Share(Weight(C, name="w1"))
        >> Share(Weight(C, Dim("o", D), name="w2"))
        >> Reduce(C)
        >> Output(N, "o"),
        Input(N, C) >> Share(Weight(C, Dim("o", D), name="w")) >> Reduce(C) >> Output(N, "o"),
        lambda ws, v: [np.ones(v["C"]), ws[0]],
        1,
    ),
    "expand_not_shared": (
        Input(N, C) >> Expand("o", D) >> Share(Weight(C, "o", name="w")) >> Reduce(C) >> Output(N, "o"),
        Input(N, C) >> Share(Weight(C, Dim("o", D), name="w")) >> Reduce(C) >> Output(N, "o"),
        same,
        1,
    ),
    "split_absorbed_by_weight": (
        Input(N, C)
        >> Split(C, B, "a", "b")
        >> Share(Weight("a", "b", Dim("o", D), name="w"))
        >> Reduce("a", "b")
        >> Output(N, "o"),
        Input(N, C) >> Share(Weight(C, Dim("o", D), name="w")) >> Reduce(C) >> Output(N, "o"),
        lambda ws, v: [ws[0].reshape(v["C"] // v["B"], v["B"], v["D"])],
        1,
    ),
    "window_absorbed_by_weight": (
        Input(N, C)
        >> Unfold(C, K, "k")
        >> Share(Weight(C, "k", Dim("o", D), name="w"))
        >> Reduce(C, "k")
        >> Output(N, "o"),
        Input(N, C) >> Share(Weight(C, Dim("o", D), name="w")) >> Reduce(C) >> Output(N, "o"),
        # the canonical weight as the window's centre tap (zero elsewhere)
        lambda ws, v: [np.stack([ws[0] if k == v["K"] // 2 else 0 * ws[0] for k in range(v["K"])], axis=1)],
        1,
    ),
    "split_undoes_merge": (
        Input(N, C) >> Split(C, B, "a", "b") >> Merge("a", "b", "c") >> Output(N, "c"),
        Input(N, C) >> Shift(C) >> Shift(C, -1) >> Output(N, C),  # the identity
        same,
        1,
    ),
    "expand_meets_data": (
        Input(N, C)
        >> Expand("e", K * B)
        >> Split("e", B, "a", "b")
        >> Share(Weight(C, "a", Dim("o", D), name="w"))
        >> Reduce(C, "a", "b")
        >> Output(N, "o"),
        Input(N, C) >> Share(Weight(C, Dim("o", D), name="w")) >> Reduce(C) >> Output(N, "o"),
        # each window entry a K-th of the canonical weight; the B copies of "b" make the factor
        lambda ws, v: [np.repeat(ws[0][:, None, :], v["K"], 1) / v["K"]],
        "B",
    ),
    "goal_dim_not_owned": (
        # [N, C] -> [N, E] on a layer with E = C: the weight's own output dim may be sized C or E
        Input(N, C) >> Share(Weight(C, Dim("o", C), name="w")) >> Reduce(C) >> Output(N, "o"),
        Input(N, C) >> Share(Weight(C, Dim("o", E), name="w")) >> Reduce(C) >> Output(N, "o"),
        same,
        1,
    ),
}


def test_every_exact_rule_has_an_example():
    exact = {name for name, rule in RULES.items() if rule.exactness in ("exact", "scale")}
    assert exact <= set(EXAMPLES), f"exact rules without a soundness example: {sorted(exact - set(EXAMPLES))}"
    assert all(RULES[name].exactness in ("exact", "scale") for name in EXAMPLES)


def test_approximate_rules_are_marked():
    assert RULES["merge_unfold_approximate"].exactness == "approximate"
    assert RULES["window_reduced_once"].exactness == "approximate"
    assert RULES["unfold_chain_order"].exactness == "approximate"
    assert all(rule.identity and rule.kinds for rule in RULES.values())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_exact_rule_is_sound(name):
    uncanonical, canonical, weights_for, scale = EXAMPLES[name]
    x, weights = reference.random_inputs(canonical, VALUES, seed=3)
    expected = reference.run(canonical, VALUES, x, weights)
    got = reference.run(uncanonical, VALUES, x, weights_for(weights, VALUES))
    factor = VALUES[scale] if isinstance(scale, str) else scale
    np.testing.assert_allclose(got, factor * expected, rtol=1e-10, atol=1e-10)


def _space_for(op, twin):
    kinds = {v.name: v.kind for v in op.variables + twin.variables}
    data = {
        "primary": [n for n, k in kinds.items() if k == "primary"],
        "coefficients": [n for n, k in kinds.items() if k == "coefficient"],
        "input": [[d.name, str(d.size)] for d in op.inputs],
        # the canonical form's output: the spec's (an uncanonical form may end at an extra goal)
        "output": [[d.name, str(d.size)] for d in twin.outputs],
        "batch": ["N"],
    }
    layer = {k: v for k, v in VALUES.items() if kinds.get(k) == "primary"} | {"name": "l"}
    coefficients = {k: [v] for k, v in VALUES.items() if kinds.get(k) == "coefficient"} or {"K": [3]}
    reductions = set()
    for each in (op, twin):
        reductions.update(each.live[i][step.dim] for i, step in enumerate(each.steps) if isinstance(step, Reduce))
    return Space(data, [layer], coefficients=coefficients, max_depth=8, reductions=sorted(reductions, key=str) or None)


APPROXIMATE = {
    "unfold_chain_order": (
        Input(N, H) >> Unfold(H, K, "k1") >> Unfold(H, B, "k2") >> Output(N, H, "k1", "k2"),
        Input(N, H) >> Unfold(H, B, "k2") >> Unfold(H, K, "k1") >> Output(N, H, "k1", "k2"),
        same,
        1,
    ),
}


def test_unfold_chain_order_is_exact_away_from_the_borders():
    uncanonical, canonical, _, _ = APPROXIMATE["unfold_chain_order"]
    x, weights = reference.random_inputs(canonical, VALUES, seed=3)
    expected = reference.run(canonical, VALUES, x, weights)
    got = reference.run(uncanonical, VALUES, x, weights)
    np.testing.assert_allclose(got[:, 2:-2], expected[:, 2:-2])
    assert not np.allclose(got, expected)  # but not everywhere: the rule is rightly marked approximate


@pytest.mark.parametrize("name", sorted(EXAMPLES) + sorted(APPROXIMATE))
def test_rule_fires_alone(name):
    uncanonical, canonical, _, _ = {**EXAMPLES, **APPROXIMATE}[name]
    space = _space_for(uncanonical, canonical)
    fired = {rule for _, rule in trace(space, canonical_path(space, uncanonical, check=False).steps)}
    assert name in fired, f"{name} did not fire on its uncanonical example (fired: {sorted(fired)})"
    fired = {rule for _, rule in trace(space, canonical_path(space, canonical, check=False).steps)}
    assert name not in fired, f"{name} fired on its canonical form"


# --------------------------------------------------------------------------------------------------
# x
# --------------------------------------------------------------------------------------------------


def _differ(first: Operator, second: Operator, layer: dict[str, int], weights=None) -> bool:
    """Whether the reference gives different outputs for one input (and the same weights)."""
    x, drawn = reference.random_inputs(first, layer, seed=5)
    weights = drawn if weights is None else weights
    one = reference.run(first, layer, x, weights)
    other = reference.run(second, layer, x, weights)
    assert one.shape == other.shape
    return not np.allclose(one, other, rtol=1e-9, atol=1e-9)


def test_search_tables_and_rules_know_only_linear_primitives():
    canvas = set(UNARY) | set(JOINS)
    assert set(kinds.SEARCH_RULES) == set(PRIMITIVES)
    watched = {kind for rule in RULES.values() for kind in rule.kinds}
    assert watched <= set(PRIMITIVES), f"rules watch {sorted(watched - set(PRIMITIVES))}"
    assert not (set(kinds.SEARCH_RULES) | watched | set(kst.DRAWS)) & canvas
    assert all(NONLINEAR not in cls.facts for cls in PRIMITIVES.values())


def test_search_emits_only_linear_operators():
    emitted = {}
    for spec, depth in (("matmul", 4), ("conv2d", 6)):
        space = Space(spec, "resnet18", max_depth=depth)
        rng = random.Random(7)
        for _ in range(200):
            state = rollout(space, rng)
            if state is not None:
                emitted.update((op.key, op) for op in to_operators(space, state))
    assert len(emitted) >= 10
    for op in emitted.values():
        assert isinstance(op, Operator) and {step.kind for step in op.steps} <= set(PRIMITIVES), op.to_dsl()


@given(kst.graphs())
def test_chains_hold_linear_primitives_and_plans_reorder_only_their_own_steps(graph):
    plans = chain_plans(graph)
    chains = [i for i, node in enumerate(graph.nodes) if node.kind == "Chain"]
    assert sorted(plans) == chains
    for index in chains:
        chain = graph.nodes[index].chain
        assert {step.kind for step in chain.steps} <= set(PRIMITIVES), graph.to_dsl()
        assert Counter(step.kind for step in plans[index].steps) == Counter(step.kind for step in chain.steps)
    for node in graph.nodes:
        if node.kind not in ("Input", "Chain"):
            assert node.kind in UNARY or node.kind in JOINS


def test_an_operator_holding_a_map_is_refused():
    """A linear chain with a Map inside would let the planner move the Map (it has no dims of its
    own, so nothing orders it against the Share): relu(x) * w instead of relu(x * w). Building one
    by hand must raise a KdslError, as must planning or lowering it."""
    linear = Input(N, C) >> Share(Weight(C, Dim("d", D), name="w")) >> Reduce(C) >> Output(N, "d")
    share, reduce = linear.steps
    with pytest.raises(KdslError):
        op = Operator.from_steps(linear.inputs, (share, Map("relu"), reduce), linear.outputs)
        plan(op)


def _with_relu(op: Operator, cut: int) -> Operator:
    """``op`` with Map("relu") between its steps ``cut - 1`` and ``cut``."""
    built = Input(*op.inputs) >> Pipeline(op.steps[:cut]) >> Map("relu")
    if cut < len(op.steps):
        built = built >> Pipeline(op.steps[cut:])
    graph = built >> Output(*(d.name for d in op.outputs), defaults=dict(op.defaults) or None)
    assert not graph.is_linear
    return graph


#: exact rules whose identity moves a Share across a view: a ReLU between them breaks it, since
#: relu(x) * w != relu(x * w) where w < 0
SHARE_AGAINST_VIEW = ("merge_after_share", "shift_after_share", "split_before_share")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_an_exact_rule_does_not_fire_across_a_relu(name):
    """With a ReLU after the uncanonical example's first step, the kernel's chains are two linear
    operators that the rule, traced alone on each, does not reject."""
    uncanonical = EXAMPLES[name][0]
    if len(uncanonical.steps) < 2:
        pytest.skip("a one-step example has no two primitives to separate")
    graph = _with_relu(uncanonical, 1)
    chains = [node.chain for node in graph.nodes if node.kind == "Chain"]
    assert len(chains) == 2 and all({s.kind for s in c.steps} <= set(PRIMITIVES) for c in chains)
    fired_on_chains = set()
    for chain in chains:
        space = _space_for(chain, chain)
        fired_on_chains |= {rule for _, rule in trace(space, canonical_path(space, chain, check=False).steps)}
    assert name not in fired_on_chains


@pytest.mark.parametrize("name", SHARE_AGAINST_VIEW)
def test_a_share_does_not_commute_with_a_view_across_a_relu(name):
    uncanonical, canonical, weights_for, _ = EXAMPLES[name]
    assert len(uncanonical.steps) >= 2 and len(canonical.steps) >= 2
    x, weights = reference.random_inputs(canonical, VALUES, seed=3)
    mapped = weights_for(weights, VALUES)
    # without the ReLU the rule's identity holds (test_search_rules checks it too) ...
    same = reference.run(uncanonical, VALUES, x, mapped)
    np.testing.assert_allclose(same, reference.run(canonical, VALUES, x, weights), rtol=1e-10, atol=1e-10)
    # ... with it between the two primitives, the two forms compute different functions
    left, right = _with_relu(uncanonical, 1), _with_relu(canonical, 1)
    assert not np.allclose(reference.run(left, VALUES, x, mapped), reference.run(right, VALUES, x, weights))
    assert left.key != right.key


def test_shift_and_unfold_do_not_commute_across_relu():
    x = Input(N, C, H)
    first = x >> Shift(H) >> Map("relu") >> Unfold(H, 3, "k") >> Output(N, C, H, "k")
    second = x >> Unfold(H, 3, "k") >> Map("relu") >> Shift(H) >> Output(N, C, H, "k")
    layer = {"N": 2, "C": 3, "H": 5}
    assert _differ(first, second, layer)
    assert first.key != second.key


@pytest.mark.parametrize("fn", sorted(MAP_FUNCTIONS))
def test_a_map_moves_across_a_zero_padded_window_only_if_it_keeps_zero(fn):
    """Unfold pads with zeros: f before the window leaves the padding 0, f after it makes it f(0).
    So the two orders agree exactly for the functions declared ZERO_PRESERVING, and differ (with
    different keys) for the others (sigmoid(0) = 1/2, exp(0) = 1)."""
    step = Map(fn, by=0.5) if fn == "scale" else Map(fn)
    before = Input(N, H) >> step >> Unfold(H, 3, "k") >> Output(N, H, "k")
    after = Input(N, H) >> Unfold(H, 3, "k") >> step >> Output(N, H, "k")
    layer = {"N": 2, "H": 4}
    zero = reference.MAP_RULES[fn](np.zeros(1), step.by)[0]
    assert (zero == 0) == (fn in ZERO_PRESERVING)
    if fn in ZERO_PRESERVING:
        assert not _differ(before, after, layer)
    else:
        assert _differ(before, after, layer)
        assert before.key != after.key


def test_a_fold_after_a_map_sees_the_padding_as_a_value():
    """Fold ignores a window's padding only when it reads the chain that made the window
    (through Renames): a Map in between turns the padding into f(0), a value that takes part.
    With tanh, the border windows whose data are all negative fold to tanh(0) = 0 instead of
    tanh of their maximum."""
    x = Input(N, H)
    window = x >> Unfold(H, 3, "k")
    mapped_then_folded = window >> Map("tanh") >> Fold("k") >> Output(N, H)
    folded_then_mapped = window >> Fold("k") >> Map("tanh") >> Output(N, H)
    renamed = window >> Rename("k", "j") >> Fold("j") >> Map("tanh") >> Output(N, H)
    layer = {"N": 1, "H": 3}
    values = np.array([[-0.5, -0.25, -0.75]])
    results = [reference.run(g, layer, values, []) for g in (mapped_then_folded, folded_then_mapped, renamed)]
    np.testing.assert_allclose(results[1], np.tanh([[-0.25, -0.25, -0.25]]))
    np.testing.assert_allclose(results[0], [[0.0, np.tanh(-0.25), 0.0]])
    np.testing.assert_allclose(results[2], results[1])  # a Rename is no barrier to the padding mask
    assert mapped_then_folded.key != folded_then_mapped.key


def test_two_contractions_do_not_merge_across_a_relu():
    """Without the ReLU the planner may contract w1 and w2 in any order (one chain); with it the
    kernel has two chains, each planned alone, and computes another function."""
    x = Input(N, C)
    first = Share(Weight(C, Dim("d", D), name="w1")), Reduce(C)
    second = Share(Weight("d", Dim("e", E), name="w2")), Reduce("d")
    linear = x >> Pipeline(first) >> Pipeline(second) >> Output(N, "e")
    identity = x >> Pipeline(first) >> Map("scale", by=1.0) >> Pipeline(second) >> Output(N, "e")
    relu = x >> Pipeline(first) >> Map("relu") >> Pipeline(second) >> Output(N, "e")
    assert isinstance(linear, Operator) and not relu.is_linear
    plans = chain_plans(relu)
    for index, chain_plan in plans.items():
        chain = relu.nodes[index].chain
        assert sum(CONTRACTION in s.facts for s in chain_plan.steps) == 1 == len(chain.weights)
    layer = {"N": 3, "C": 4, "D": 3, "E": 2}
    x_value, weights = reference.random_inputs(relu, layer, seed=1)
    np.testing.assert_allclose(
        reference.run(identity, layer, x_value, weights), reference.run(linear, layer, x_value, weights)
    )
    assert _differ(relu, identity, layer, weights)
    assert relu.key != identity.key


def test_a_rename_inside_a_chain_does_not_change_what_a_fold_ignores():
    """Rename moves no data, so putting one between two linear steps must not change the kernel's
    function, though it closes the chain: the Fold's mask follows its linear region back through
    both chains (else the border windows of all-negative data would fold to the padding's 0)."""
    x = Input(N, H)
    whole = x >> Unfold(H, 3, "k") >> Shift(N) >> Rename("k", "j") >> Fold("j") >> Output(N, H)
    split = x >> Unfold(H, 3, "k") >> Rename("k", "j") >> Shift(N) >> Fold("j") >> Output(N, H)
    assert [node.kind for node in split.nodes] == ["Input", "Chain", "Rename", "Chain", "Fold"]
    values = -np.arange(1.0, 7.0).reshape(2, 3)
    layer = {"N": 2, "H": 3}
    np.testing.assert_allclose(reference.run(split, layer, values, []), reference.run(whole, layer, values, []))
