"""Canonicalization rules: each exact (or scale) rule's uncanonical example computes the same
function as its canonical form on the reference backend, and the rule (traced alone) fires on the
uncanonical form and not on the canonical one."""

import numpy as np
import pytest

from kdsl.codegen import reference
from kdsl.lang import (
    Dim,
    Expand,
    Input,
    Merge,
    Output,
    Reduce,
    Share,
    Shift,
    Split,
    Unfold,
    Weight,
    coefficient,
    primary,
)
from kdsl.search.rules import RULES, trace
from kdsl.search.space import Space
from kdsl.search.synthesis import canonical_path

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
