"""Differential tests at the edges: operators that search itself emits, and the strategies'
operators with several weight-only dims, agree on the reference interpreter, PyTorch and TVM.

Search-drawn operators come from random rollouts of the search engine (``children`` /
``is_complete`` / ``to_operators`` of :mod:`kdsl.search.synthesis`) in the conv2d, stride-2 and
matmul spaces, and run at small layers where some coefficients are 1. The CI-sized run checks at
least 300 of them on all three backends; ``KDSL_SLOW_TESTS=1`` checks at least 3,000. Every
operator is compared in float64; where one backend raises, all must raise the same KdslError.

Also here: the PyTorch backend's own edges (user names that Python or einops would confuse with
the generated code's names, and inputs of the wrong shape).
"""

from __future__ import annotations

import ast
import itertools
import os
import random
import subprocess
import sys
import textwrap
from fractions import Fraction
from math import lcm, prod

import numpy as np
import pytest
import torch
from backends import output_or_error
from hypothesis import assume, find, given, settings

from kdsl import gallery
from kdsl.codegen import reference
from kdsl.codegen import torch as kdsl_torch
from kdsl.codegen import tvm as kdsl_tvm
from kdsl.lang import Dim, Input, Merge, Output, Reduce, Share, Split, Unfold, Weight, primary
from kdsl.lang.errors import KdslError, ShapeError
from kdsl.lang.operator import Operator
from kdsl.lang.sizes import Size
from kdsl.search.space import Space
from kdsl.search.synthesis import State, children, is_complete, root, to_operators
from kdsl.testing import strategies as kst

SLOW = bool(os.environ.get("KDSL_SLOW_TESTS"))
kdsl_tvm.load_tvm()

#: (spec, layer table the space is searched on, distinct operators to draw: CI, slow). The
#: stride-2 space holds only about 200 distinct operators at this depth (rollouts find 150 of them
#: quickly, the last ones slowly), so the slow run takes
#: more from the other two.
SEARCH_SPACES = [
    ("conv2d", "resnet18", 130, 1550),
    ("conv2d_stride2", "resnet18_stride2", 60, 150),
    ("matmul", "resnet18", 130, 1550),
]
DEPTH = 6
MIN_CHECKED = 3000 if SLOW else 300

#: Operators on which TVM still disagrees with the reference, by (spec, content key). Empty: every
#: disagreement fails the test. (Fill only with a tracked TVM bug, and say which in a comment.)
TVM_KNOWN_FAILURES: dict[tuple[str, str], str] = {}


# -- drawing operators from search ----------------------------------------------------------------


def _rollout(space: Space, rng: random.Random, start: State, expanded: dict[int, tuple]) -> tuple:
    """One random rollout from ``start`` (search's own rule: a uniformly random child, stop at a
    complete state with probability 1/2); returns (complete state or None, the path)."""
    path = [start]
    state = start
    while True:
        complete = is_complete(space, state)
        if complete and rng.random() < 0.5:
            return state, path
        if id(state) not in expanded:  # the state is kept in the value, so its id stays unique
            expanded[id(state)] = (state, [child for _, child in children(space, state)])
        options = expanded[id(state)][1]
        if not options:
            return (state if complete else None), path
        state = rng.choice(options)
        path.append(state)


def search_drawn(spec: str, layers: str, count: int, seed: int) -> list[Operator]:
    """``count`` distinct operators (by content key) that random rollouts of search emit in the
    ``spec`` space. Most plain rollouts from the root die in a dead end in these deep spaces, so
    three of four start from a state on the path of an earlier successful rollout: still search's
    own moves, at a rate a test can afford. Rollouts start from the root of every output goal (the
    spec's output and, where every layer has Cout = Cin, the Cin -> Cin one that enumeration walks
    too), so the Cin -> Cin operators are drawn as well."""
    space = Space(spec, layers, max_depth=DEPTH)
    rng = random.Random(f"{spec}:{seed}")
    found: dict[str, Operator] = {}
    productive: list[State] = []
    expanded: dict[int, tuple] = {}
    starts = [root(space, goal) for goal in range(len(space.output_goals))]
    for _ in range(max(400 * count, 200_000)):  # a bound, reached only in an exhausted space
        if len(found) >= count:
            break
        state, path = _rollout(
            space,
            rng,
            rng.choice(starts) if not productive or rng.random() < 0.25 else rng.choice(productive),
            expanded,
        )
        if state is None:
            continue
        new = [op for op in to_operators(space, state) if op.key not in found]
        for op in new:
            found[op.key] = op
        if new:
            productive.extend(path[1:-1])
    assert len(found) == count, f"search drew {len(found)} distinct {spec} operators, wanted {count}"
    return list(found.values())


# -- small layers ---------------------------------------------------------------------------------


def _every_size(op: Operator) -> list[Size]:
    sizes = [d.size for d in op.inputs] + [d.size for d in op.outputs]
    for step, after in zip(op.steps, op.live[1:]):
        sizes += step.sizes()
        sizes += list(after.values())
    return sizes


def _coefficient_part(size: Size) -> Size:
    return Size.make(size.constant, {v: e for v, e in size.exponents if v.kind == "coefficient"})


def small_layers(op: Operator, rng: random.Random) -> list[dict[str, int]]:
    """Two bindings with tiny sizes: the first sets as many coefficients to 1 as it can (size-1
    windows, groups and strides), the second draws each from 1-3. Primaries are small multiples
    of every denominator the coefficients leave (1 where none is left)."""
    names = op.coefficient_variables
    sizes = _every_size(op)
    pure = [s for s in sizes if all(v.kind == "coefficient" for v in s.variables)]
    valid = []
    for values in itertools.product((1, 2, 3), repeat=len(names)):
        binding = dict(zip(names, values))
        if all(s.evaluate(binding).denominator == 1 for s in pure):
            valid.append(binding)
    assert valid, f"no coefficient values in 1-3 make every size an integer:\n{op.to_dsl()}"
    chosen = [min(valid, key=lambda b: (sum(v != 1 for v in b.values()), sorted(b.items()))), rng.choice(valid)]
    layers = []
    for coefficients in chosen:
        denominator = 1
        for size in sizes:
            denominator = lcm(denominator, Fraction(_coefficient_part(size).evaluate(coefficients)).denominator)
        binding = dict(coefficients)
        for name in op.primary_variables:
            binding[name] = denominator * rng.choice((1, 2))
        layers.append(binding)
    return layers


# -- running and comparing ------------------------------------------------------------------------


def _inputs(op: Operator, layer: dict[str, int], seed: int) -> tuple[object, list[np.ndarray]]:
    """float64 inputs in [-1, 1] and weights scaled by 1/sqrt(fan-in) (outputs of order one)."""
    rng = np.random.default_rng(seed)
    shapes = reference.shapes(op, layer)
    xs = tuple(rng.uniform(-1, 1, shape) for shape in shapes.inputs)
    weights = []
    for weight, shape in zip(op.weights, shapes.weights):
        fan_in = prod(s for s, new in zip(shape, weight.new) if not new)
        weights.append(rng.uniform(-1, 1, shape) / np.sqrt(fan_in))
    return (xs[0] if len(xs) == 1 else xs), weights  # several inputs: a tuple, as the backends take them


def disagreement(op: Operator, layer: dict[str, int], backends: tuple[str, ...], seed: int = 0) -> str | None:
    """None when every backend gives the reference's output (float64: rtol 1e-9, atol 1e-9 times
    the output's scale) or all raise the same KdslError; else what differs."""
    try:
        x, weights = _inputs(op, layer, seed)
    except KdslError:  # the layer does not fit: every backend must refuse it the same way
        x, weights = np.zeros(1), []
    outcomes = {backend: output_or_error(backend, op, layer, x, weights) for backend in ("reference",) + backends}
    expected = outcomes["reference"]
    problems = []
    for backend, outcome in outcomes.items():
        if isinstance(outcome, Exception) and not isinstance(outcome, KdslError):
            problems.append(f"{backend} crashed: {type(outcome).__name__}: {str(outcome)[:300]}")
            continue
        if isinstance(expected, KdslError) or isinstance(outcome, KdslError):
            if type(outcome) is not type(expected):
                problems.append(f"{backend}: {outcome!r}, reference: {expected!r}")
            continue
        assert isinstance(outcome, np.ndarray) and isinstance(expected, np.ndarray)
        scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
        if outcome.shape != expected.shape or not np.allclose(outcome, expected, rtol=1e-9, atol=1e-9 * scale):
            worst = np.abs(outcome - expected).max() if outcome.shape == expected.shape else "shape"
            problems.append(f"{backend}: differs from the reference ({outcome.shape} vs {expected.shape}, {worst})")
    return "; ".join(problems) or None


def _report(failures: list[str]) -> str:
    return f"{len(failures)} disagreements:\n\n" + "\n\n".join(failures[:20])


# -- search-drawn operators agree -----------------------------------------------------------------


def test_search_drawn_operators_agree_on_every_backend():
    """Each operator on all three backends at its first (size-1 coefficients) layer, and on the
    reference and PyTorch at its second."""
    checked_on_all = 0
    failures = []
    for spec, layers, ci, slow in SEARCH_SPACES:
        rng = random.Random(spec)
        for op in search_drawn(spec, layers, slow if SLOW else ci, seed=0):
            first, second = small_layers(op, rng)
            known = (spec, op.key) in TVM_KNOWN_FAILURES
            on_all = disagreement(op, first, ("torch",) if known else ("torch", "tvm"))
            on_torch = disagreement(op, second, ("torch",), seed=1)
            checked_on_all += on_all is None and not known
            for layer, problem in ((first, on_all), (second, on_torch)):
                if problem is not None:
                    failures.append(f"{spec}: {problem}\nlayer {layer}\n{op.to_dsl()}")
    assert not failures, _report(failures)
    assert checked_on_all >= MIN_CHECKED, f"only {checked_on_all} operators were checked on all three backends"


# -- strategies-drawn operators agree -------------------------------------------------------------


def test_strategies_can_give_a_weight_several_new_dims():
    op = find(kst.operators(max_steps=4), lambda op: any(sum(w.new) >= 2 for w in op.weights))
    assert any(sum(w.new) >= 2 for w in op.weights)


@settings(max_examples=300 if SLOW else 30, deadline=None)
@given(kst.operators_with_layers(max_steps=6))
def test_strategy_operators_agree_on_every_backend(op_and_layer):
    op, layer = op_and_layer
    problem = disagreement(op, layer, ("torch", "tvm"))
    assert problem is None, f"{problem}\nlayer {layer}\n{op.to_dsl()}"


@settings(max_examples=120 if SLOW else 20, deadline=None)
@given(kst.graphs_with_layers(max_actions=4, max_elements=600, inputs=2))
def test_strategy_kernels_of_two_inputs_agree_on_every_backend(graph_and_layer):
    """Drawn branching kernels that read two named inputs (first joined by a Product, as Q·Kᵀ): the
    reference, PyTorch and TVM agree (or all raise the same error)."""
    graph, layer = graph_and_layer
    assert len(graph.input_names) == 2
    problem = disagreement(graph, layer, ("torch", "tvm"))
    assert problem is None, f"{problem}\nlayer {layer}\n{graph.to_dsl()}"


@settings(max_examples=120 if SLOW else 25, deadline=None)
@given(kst.operators_with_layers(max_steps=5))
def test_strategy_operators_with_valid_windows_or_zero_insertion_agree(op_and_layer):
    """Drawn operators with a window without padding (Slide) or a zero insertion (Dilate): the
    reference, PyTorch and TVM agree (or all raise the same error)."""
    op, layer = op_and_layer
    assume(any(step.kind in ("Slide", "Dilate") for step in op.steps))
    problem = disagreement(op, layer, ("torch", "tvm"))
    assert problem is None, f"{problem}\nlayer {layer}\n{op.to_dsl()}"


def test_the_issues_two_weight_example_agrees():
    N, Cin, Cout, L, D = primary("N Cin Cout L D")
    w1 = Weight(Dim("a", Cin), D, Cin, name="w1")
    w2 = Weight(Cout, "a", D, name="w2")
    op = Input(N, Cin, L) >> Share(w1) >> Share(w2) >> Reduce(D, "a", Cin) >> Output(N, Cout, L)
    problem = disagreement(op, {"N": 1, "Cin": 4, "Cout": 4, "L": 3, "D": 2}, ("torch", "tvm"))
    assert problem is None, problem


# -- PyTorch: user names --------------------------------------------------------------------------

#: names the generated module uses that a user's variable may also have (the issue's list first)
CLASHING = ["F", "torch", "nn", "dict", "super", "shapes", "fan_ins", "self", "x", "w", "weights", "math"]
CLASHING += sorted(n for n in kdsl_torch.OWN_NAMES if n[0].isalpha()) + ["F_", "list", "int", "zip", "shape"]


def _linear(name: str) -> Operator:
    N, Cout = primary("N Cout")
    V = primary(name)
    return Input(N, V) >> Share(Weight(Cout, V, name="w")) >> Reduce(V) >> Output(N, Cout)


@pytest.mark.parametrize("name", sorted(set(CLASHING)))
def test_a_variable_named_like_generated_code_cannot_break_it(name):
    op = _linear(name)
    layer = {"N": 2, name: 3, "Cout": 2}
    assert disagreement(op, layer, ("torch",)) is None
    module = kdsl_torch.build(op, layer)
    assert module.sizes[name] == 3


def test_a_variable_and_its_renamed_identifier_both_work():
    N, F, F_ = primary("N F F_")
    op = Input(N, F, F_) >> Share(Weight("F", "F_", name="w")) >> Reduce("F_") >> Output(N, "F")
    layer = {"N": 2, "F": 3, "F_": 2}
    assert disagreement(op, layer, ("torch",)) is None
    assert "F -> F__" in kdsl_torch.source(op, layer)  # F_ is taken by the other variable


def test_dim_names_map_to_distinct_einops_axes():
    N, C = primary("N C")
    op = (
        Input(N, Dim("a_", C))
        >> Unfold("a_", 3, "d_a")
        >> Merge("a_", "d_a", "a")
        >> Split("a", 3, "axis", "tensor")
        >> Reduce("tensor")
        >> Output(N, "axis")
    )
    layer = {"N": 2, "C": 4}
    assert disagreement(op, layer, ("torch",)) is None
    code = kdsl_torch.source(op, layer)
    assert "a_ -> a2" in code and "tensor -> tensor2" in code


def _free_names(code: str, class_name: str) -> set[str]:
    """Every name the generated class's __init__ and forward bind or read."""
    tree = ast.parse(code)
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name]
    names = set()
    for method in cls.body:
        if isinstance(method, ast.FunctionDef) and method.name in ("__init__", "forward"):
            # the body only: annotations and defaults are evaluated outside, where no size is a name
            names |= {node.id for stmt in method.body for node in ast.walk(stmt) if isinstance(node, ast.Name)}
            names |= {arg.arg for arg in method.args.args}
    return names


@pytest.mark.parametrize("name", ["syno_op1", "grouped_conv2d", "avg_pool2d", "pixel_shuffle", "linear"])
def test_generated_methods_use_only_own_names_and_size_variables(name):
    op = gallery.load(name)
    code = kdsl_torch.source(op, name="Generated")
    variables = {v.name for v in op.variables}
    assert _free_names(code, "Generated") - variables <= kdsl_torch.OWN_NAMES


# -- PyTorch: inputs of the wrong shape -----------------------------------------------------------

CONV = {"N": 2, "Cin": 4, "Cout": 6, "H": 5, "W": 7, "K": 3}


@pytest.mark.parametrize("shape", [(2, 5, 7, 4), (4, 5, 7), (2, 4, 5, 7, 1), ()])
def test_torch_and_tvm_refuse_an_input_of_the_wrong_shape(shape):
    op = gallery.load("conv2d")
    module = kdsl_torch.build(op, CONV)
    with pytest.raises(ShapeError, match=r"Cin=4, H=5, W=7.*got \[") as caught:
        module(torch.zeros(shape))
    assert str(list(shape)) in str(caught.value)
    kernel = kdsl_tvm.build(op, CONV)
    weights = [torch.zeros(s) for s in reference.shapes(op, CONV).weights]
    with pytest.raises(ShapeError):
        kernel(torch.zeros(shape), *weights)


def test_the_batch_may_differ_from_the_layer():
    module = kdsl_torch.build(gallery.load("conv2d"), CONV)
    assert module(torch.zeros(3, 4, 5, 7)).shape == (3, 6, 5, 7)


def test_shape_error_without_kdsl_is_a_value_error(tmp_path):
    (tmp_path / "generated.py").write_text(kdsl_torch.source(_linear("F"), {"N": 2, "F": 3, "Cout": 2}, name="G"))
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["kdsl"] = None  # any `import kdsl` now fails
        sys.path.insert(0, {str(tmp_path)!r})
        import torch
        from generated import G
        module = G(N=2, F_=3, Cout=2)
        assert module(torch.zeros(5, 3)).shape == (5, 2)
        try:
            module(torch.zeros(5, 4))
        except ValueError as error:
            print(type(error).__name__, error)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ShapeError the input must have shape [N, F=3]"), result.stdout


def test_a_layer_that_does_not_divide_names_the_layer_once():
    with pytest.raises(KdslError) as caught:
        kdsl_torch.build(gallery.load("grouped_conv2d"), {"N": 1, "Cin": 6, "Cout": 6, "H": 5, "W": 5, "G": 4, "K": 3})
    assert "layer layer" not in str(caught.value) and "the layer (Cin=6, G=4)" in str(caught.value)


# -- gallery-neighbour operators agree ------------------------------------------------------------


def test_gallery_neighbours_with_grouped_and_interleaved_weights_agree_on_every_backend():
    """The neighbours walk (kdsl.search.neighbors) builds operators no synthesis rollout reaches:
    weights grouped by its ``group`` rewrite, merges and splits interleaved by ``transpose``.
    The first of them it emits, on all three backends at a small layer."""
    from kdsl.search.neighbors import Neighbors

    space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [2, 4], "s": [2]}, max_flops="0.5x")
    rng = random.Random(7)
    chosen, failures = [], []
    for found in Neighbors(space, seed=0).states():
        kinds = {text.split(" ", 1)[0] for text in found.metrics["rewrites"]}
        if "group" in kinds and len(chosen) < 10:
            chosen.append(found.op)
        if len(chosen) == 10:
            break
    assert len(chosen) == 10 and any(len(op.weights) > 1 for op in chosen)  # two-stage designs too
    for op in chosen:
        first, _ = small_layers(op, rng)
        problem = disagreement(op, first, ("torch", "tvm"))
        if problem is not None:
            failures.append(f"{problem}\nlayer {first}\n{op.to_dsl()}")
    assert not failures, _report(failures)
