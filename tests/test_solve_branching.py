"""The solver and the cost model on branching kernels (kdsl.lang.operator.Operator): constraints, checks
across layers, bindings, FLOPs/params/memory against hand counts.
"""

from __future__ import annotations

import math

import pytest
import sympy
from graph_kernels import attention, residual_conv, squeeze_excitation
from hypothesis import given, settings

from kdsl import gallery, solve
from kdsl.codegen import reference
from kdsl.lang import FC, Fold, Input, Map, Output, coefficient, primary
from kdsl.lang.errors import DivisibilityError, KdslError, LayerError, LoweringError
from kdsl.lang.nonlinear import JOINS, UNARY
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import Reduce, Split, Unfold
from kdsl.solve.cost import GRAPH_FLOPS
from kdsl.testing.strategies import graphs_with_layers

N, Cin, Cout, H, W, M = primary("N Cin Cout H W M")
K, s, G, J, t = coefficient("K s G J t")


# --------------------------------------------------------------------------------------------------
# Branching operators
# --------------------------------------------------------------------------------------------------


C, R, P, D = primary("C R P D")


n, c, h, w, r, p, d, k = sympy.symbols("N C H W R P D K", positive=True)


def grouped_squeeze_excitation() -> Operator:
    """Squeeze-excitation whose hidden width is C/G: an FC whose output size must be an integer."""
    x = Input(N, C, H, W)
    gate = (
        x
        >> Reduce(H, W, mean=True)
        >> FC(C, name="r", size=C / G, weight="down")
        >> Map("relu")
        >> FC("r", name="C", size=C, weight="up")
        >> Map("sigmoid")
    )
    kernel = (x * gate) >> Output(N, C, H, W, defaults={"G": 4})
    assert not kernel.is_linear
    return kernel


def max_pool() -> Operator:
    x = Input(N, C, H, W)
    kernel = x >> Unfold(H, K, "kh") >> Unfold(W, K, "kw") >> Fold("kh", "kw", how="max")
    kernel = kernel >> Output(N, C, H, W, defaults={"K": 3})
    assert not kernel.is_linear
    return kernel


def split_pool() -> Operator:
    """Max pooling over 2x2 blocks cut by Splits: H/2 and W/2 must be integers (a chain's constraint)."""
    x = Input(N, C, H, W)
    kernel = x >> Split(H, 2, "ho", "kh") >> Split(W, 2, "wo", "kw") >> Fold("kh", "kw") >> Output(N, C, "ho", "wo")
    assert not kernel.is_linear
    return kernel


LAYERS = [
    {"name": "wide", "N": 2, "C": 64, "H": 8, "W": 8, "R": 4, "P": 6, "D": 8},
    {"name": "narrow", "N": 1, "C": 6, "H": 4, "W": 6, "R": 2, "P": 3, "D": 2},
]


SYMBOLS = {"N": n, "C": c, "H": h, "W": w, "R": r, "P": p, "D": d, "K": k}


def assert_same_formula(actual: object, expected: sympy.Expr) -> None:
    formula = sympy.sympify(actual)
    # kdsl's symbols carry their own assumptions: match them to ours by name
    ours = formula.subs({symbol: SYMBOLS[symbol.name] for symbol in formula.free_symbols})
    assert sympy.expand(ours - expected) == 0, (actual, expected)


def at(expected: sympy.Expr, layer: dict[str, int], **coefficients: int) -> int:
    values = {SYMBOLS[name]: value for name, value in {**layer, **coefficients}.items() if name in SYMBOLS}
    return int(expected.subs(values))


def test_constraints_are_the_union_of_chains_unary_nodes_and_dims() -> None:
    found = {(c.kind, c.description) for c in solve.constraints(grouped_squeeze_excitation())}
    assert ("positive", "the coefficient G must be a positive integer") in found
    assert ("integral", "node 2 FC(C -> r: C/G): the FC output dim r: C/G must be a positive integer") in found
    windows = [c.description for c in solve.constraints(max_pool()) if c.kind == "window"]
    assert windows == [
        "node 1 chain: Unfold(H, K): the window K must be smaller than the dim H (H)",
        "node 1 chain: Unfold(W, K): the window K must be smaller than the dim W (W)",
    ]
    split = [c.description for c in solve.constraints(split_pool()) if c.kind == "integral"]
    assert "node 1 chain: Split(H, 2): the outer dim ho: H/2 must be a positive integer" in split
    assert "node 1 chain: Split(W, 2): the outer dim wo: W/2 must be a positive integer" in split


def test_check_binds_every_layer_of_a_table() -> None:
    report = solve.check(squeeze_excitation(), LAYERS)
    assert len(report) == 2
    assert report.binding("narrow") == {"C": 6, "H": 4, "N": 1, "R": 2, "W": 6}
    assert solve.check(attention(), LAYERS).binding("wide") == {"C": 64, "D": 8, "N": 2, "P": 6}


def test_fc_divisibility_failure_names_the_node_the_dim_and_the_layer() -> None:
    kernel = grouped_squeeze_excitation()
    assert solve.check(kernel, LAYERS[:1]).binding("wide")["G"] == 4
    with pytest.raises(DivisibilityError) as error:
        solve.check(kernel, LAYERS)
    message = str(error.value)
    assert message.startswith("layer narrow (C=6, G=4): node 2 FC(C -> r: C/G): the FC output dim r: C/G = 3/2")
    with pytest.raises(DivisibilityError, match="layer narrow.*node 2 FC"):
        solve.bind(kernel, LAYERS[1])


def test_chain_divisibility_failure_names_the_chain_node_and_the_layer() -> None:
    odd = {"name": "odd", "N": 1, "C": 2, "H": 7, "W": 8}
    with pytest.raises(DivisibilityError) as error:
        solve.check(split_pool(), [{"name": "even", "N": 1, "C": 2, "H": 8, "W": 8}, odd])
    assert "layer odd (H=7): node 1 chain: Split(H, 2): the outer dim ho: H/2 = 7/2 is not an integer" in str(
        error.value
    )


def test_windows_of_a_chain_are_checked_unless_allowed() -> None:
    tiny = {"name": "tiny", "N": 1, "C": 2, "H": 2, "W": 8}
    with pytest.raises(DivisibilityError, match="layer tiny .*node 1 chain: Unfold\\(H, K\\): the window K=3"):
        solve.check(max_pool(), [tiny])
    report = solve.check(max_pool(), [tiny], allow_large_windows=True)
    assert len(report.large_windows) == 1 and "node 1 chain" in report.large_windows[0]


def test_assignments_of_a_graph_keep_the_valid_coefficients() -> None:
    assert solve.assignments(grouped_squeeze_excitation(), LAYERS, {"G": range(1, 9)}) == [{"G": 1}, {"G": 2}]
    assert solve.assignments(grouped_squeeze_excitation(), LAYERS[:1], {"G": [3, 8, 16]}) == [{"G": 8}, {"G": 16}]


def test_unbound_variables_and_coefficients_name_the_layer() -> None:
    with pytest.raises(LayerError, match="layer resnet_like does not bind the variable R"):
        solve.check(squeeze_excitation(), [{"name": "resnet_like", "N": 1, "C": 8, "H": 4, "W": 4}])
    with pytest.raises(LayerError, match="the coefficient K has no value"):
        solve.bind(_no_default_pool(), {"N": 1, "C": 2, "H": 8, "W": 8})


def _no_default_pool() -> Operator:
    kernel = Input(N, C, H) >> Unfold(H, K, "k") >> Fold("k") >> Output(N, C, H)
    assert not kernel.is_linear and not kernel.defaults
    return kernel


def test_shapes_of_a_graph() -> None:
    found = solve.shapes(attention(), LAYERS[0])
    assert found == {
        "input": (2, 64, 6),
        "output": (2, 64, 6),
        "weights": {"wq": (8, 64), "wk": (8, 64), "wv": (64, 64)},
    }


def test_plan_points_to_chain_plans() -> None:
    with pytest.raises(LoweringError, match="chain_plans"):
        solve.plan(residual_conv())
    plans = solve.chain_plans(residual_conv(), LAYERS[0])
    assert list(plans) == [1]
    assert plans[1].flops(solve.bind(residual_conv(), LAYERS[0])) == 2 * 64 * 64 * 8 * 8 * 9


def test_every_node_kind_has_a_flops_rule() -> None:
    assert set(GRAPH_FLOPS) == {"Input", "Chain", *UNARY, *JOINS}


def test_squeeze_excitation_costs_match_a_hand_count() -> None:
    kernel = squeeze_excitation()
    # mean over H, W (one add per input element) + FC C->R + relu + FC R->C + sigmoid + the product
    flops = n * c * h * w + n * r * c + n * r + n * c * r + n * c + n * c * h * w
    params = r * c + c * r
    # input, the pooled [N, C], FC [N, R], relu, FC [N, C], sigmoid (the Rename aliases it), output
    memory = n * c * h * w + n * c + n * r + n * r + n * c + n * c + n * c * h * w
    # the input stays alive to the end (the product reads it), next to the gate and the output
    peak = 2 * n * c * h * w + n * c
    formulas = solve.cost(kernel)
    for key, expected in (("flops", flops), ("params", params), ("memory", memory), ("peak", peak)):
        assert_same_formula(formulas[key], expected)
    assert_same_formula(formulas["input"], n * c * h * w)
    assert_same_formula(formulas["output"], n * c * h * w)
    for layer in LAYERS:
        numbers = solve.cost(kernel, layer)
        for key, expected in (("flops", flops), ("params", params), ("memory", memory), ("peak", peak)):
            assert numbers[key] == at(expected, layer), (key, layer["name"])
    per_node = solve.node_flops(kernel, LAYERS[0])
    assert sum(per_node) == solve.cost(kernel, LAYERS[0])["flops"] and per_node[0] == per_node[6] == 0


def test_attention_costs_match_a_hand_count() -> None:
    kernel = attention()
    # three FCs (q, k: C->D; v: C->C), scores (sum over d), softmax (3 per score), scores x v (sum over Q)
    flops = 2 * n * p * c * d + n * p * c * c + n * p * p * d + 3 * n * p * p + n * p * c * p
    params = 2 * d * c + c * c
    memory = n * c * p + 2 * n * d * p + 2 * n * p * p + n * c * p + n * p * c
    formulas = solve.cost(kernel)
    assert_same_formula(formulas["flops"], flops)
    assert_same_formula(formulas["params"], params)
    assert_same_formula(formulas["memory"], memory)
    for layer in LAYERS:
        numbers = solve.cost(kernel, layer)
        assert numbers["flops"] == at(flops, layer)
        assert numbers["params"] == at(params, layer)
        assert numbers["memory"] == at(memory, layer)
        # alive at once: x, q, k and the scores (x is read by v later) or, at the end, the softmax,
        # v and the output
        candidates = [
            n * c * p + 2 * n * d * p + n * p * p,
            n * c * p + 2 * n * p * p,
            2 * n * c * p + n * p * p,
        ]
        assert numbers["peak"] == max(at(e, layer) for e in candidates)
        assert numbers["intermediate"] == max(at(e, layer) for e in (n * c * p, n * d * p, n * p * p))


def test_max_pool_and_residual_conv_costs() -> None:
    pool = solve.cost(max_pool(), LAYERS[0])
    unfolded = 2 * 64 * 8 * 8 * 9
    assert pool["flops"] == unfolded  # one comparison per element of the unfolded windows
    assert pool["intermediate"] == unfolded and pool["memory"] == unfolded + 2 * (2 * 64 * 8 * 8)
    residual = solve.cost(residual_conv())
    assert_same_formula(residual["flops"], n * c * c * h * w * k**2 + n * c * h * w)
    assert_same_formula(residual["params"], c * c * k**2)


def test_total_cost_adds_flops_and_keeps_the_largest_peak() -> None:
    kernel = attention()
    each = [solve.cost(kernel, layer) for layer in LAYERS]
    total = solve.total_cost(kernel, LAYERS)
    assert total["flops"] == sum(e["flops"] for e in each)
    assert total["memory"] == sum(e["memory"] for e in each)
    assert total["peak"] == max(e["peak"] for e in each)
    assert solve.within_budget(kernel, LAYERS, max_flops=total["flops"])
    assert not solve.within_budget(kernel, LAYERS, max_flops=total["flops"] - 1)


def test_cost_of_a_bad_layer_is_a_kdsl_error() -> None:
    with pytest.raises(KdslError, match="layer narrow"):
        solve.cost(grouped_squeeze_excitation(), LAYERS[1])
    with pytest.raises(LayerError):
        solve.node_flops(max_pool(), {"N": 1})


@pytest.mark.parametrize("name", [name for name in gallery.names() if not gallery.load(name).is_linear])
def test_gallery_kernels_check_and_cost_consistently(name: str) -> None:
    kernel = gallery.load(name)
    table = gallery.layer_table(name) or "resnet18"
    report = solve.check(kernel, table)
    formulas = solve.cost(kernel)
    per_node_formulas = solve.node_flops(kernel)
    assert sympy.expand(sympy.Add(*per_node_formulas) - formulas["flops"]) == 0
    for layer, binding in report:
        numbers = solve.cost(kernel, layer)
        assert sum(solve.node_flops(kernel, layer)) == numbers["flops"]
        # sizes that do not depend on a plan's order equal their formulas at the layer
        for key in ("params", "input", "output", "memory"):
            assert numbers[key] == formulas[key].subs({s: binding[s.name] for s in formulas[key].free_symbols}), key
        # the solver's concrete shapes are the reference interpreter's
        found = solve.shapes(kernel, layer)
        oracle = reference.shapes(kernel, binding)
        assert (found["input"], tuple(found["weights"].values()), found["output"]) == (
            oracle.input,
            oracle.weights,
            oracle.output,
        )
        assert numbers["input"] <= numbers["peak"] <= numbers["memory"]


@given(graphs_with_layers())
@settings(max_examples=60)
def test_drawn_kernels_check_and_cost_consistently(case: tuple[Operator, dict[str, int]]) -> None:
    kernel, layer = case
    binding = solve.bind(kernel, layer)
    numbers = solve.cost(kernel, layer)
    per_node = solve.node_flops(kernel, layer)
    assert sum(per_node) == numbers["flops"] and all(value >= 0 for value in per_node)
    formulas = solve.cost(kernel)
    for key in ("params", "input", "output", "memory"):
        assert numbers[key] == formulas[key].subs({s: binding[s.name] for s in formulas[key].free_symbols}), key
    oracle = reference.shapes(kernel, layer)
    found = solve.shapes(kernel, layer)
    assert tuple(found["weights"].values()) == oracle.weights and found["output"] == oracle.output
    assert numbers["params"] == sum(math.prod(shape) for shape in oracle.weights)
    assert numbers["input"] <= numbers["peak"] <= numbers["memory"]
