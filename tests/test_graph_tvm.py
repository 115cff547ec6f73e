"""The TVM backend on branching kernels (kdsl.lang.graph): every node kind, unscheduled and with the
default schedule, against the reference interpreter (kdsl.codegen.reference.run, the oracle).

Tolerances, relative to the largest magnitude of the expected output:

* float64: 1e-12. TVM computes the same formulas as the reference in another order (sums over the
  reduced dims, the softmax's sum) and with LLVM's libm calls for exp, sin, tanh, erf: rounding
  only, a few ulps (2e-16) per operation, times the at most ~100 terms of a sum here.
* float32: 2e-5. The same formulas in single precision: eps = 1.2e-7 per operation, a sum of n
  terms adds up to n * eps (n <= 100 here: 1.2e-5), and the float32 element-wise functions
  (exp, sigmoid, tanh, erf) may use TVM's fast polynomial forms, accurate to a few ulps.

Compiles dominate the runtime (~0.05-0.5 s each), so kernels are small and each is built once per
(dtype, schedule) pair.
"""

from __future__ import annotations

import numpy as np
import pytest
from backends import backend

from kdsl.codegen import reference
from kdsl.lang import (
    FC,
    Blend,
    Dim,
    Fold,
    Input,
    Map,
    Output,
    Product,
    Reduce,
    Rename,
    Share,
    Shift,
    Softmax,
    Split,
    Stride,
    Unfold,
    Weight,
    coefficient,
    primary,
)
from kdsl.lang.nonlinear import BLEND_KINDS, JOINS, MAP_FUNCTIONS, UNARY
from kdsl.lang.operator import Operator

torch = backend("torch")
kdsl_tvm = pytest.importorskip("kdsl.codegen.tvm")

TOLERANCE = {"float64": 1e-12, "float32": 2e-5}
N, C, H, W, R, P, D = primary("N C H W R P D")
K = coefficient("K")
LAYER = {"N": 2, "C": 4, "H": 6, "W": 8, "R": 3, "P": 5, "D": 3}


def check(graph: Operator, layer: dict[str, int], dtype: str, schedule: str | None, seed: int = 0) -> None:
    """Build ``graph`` and compare it with the reference on seeded random inputs."""
    x, weights = reference.random_inputs(graph, layer, seed=seed, dtype=np.dtype(dtype))
    expected = reference.run(graph, layer, x, weights)
    kernel = kdsl_tvm.build(graph, layer, dtype=dtype, schedule=schedule)
    got = kernel(torch.from_numpy(x), *[torch.from_numpy(w) for w in weights]).numpy()
    assert got.shape == expected.shape
    scale = max(1.0, float(np.abs(expected).max()))
    error = float(np.abs(got - expected).max()) / scale
    assert error <= TOLERANCE[dtype], f"{dtype} schedule={schedule}: relative error {error:.3g}\n{graph.to_dsl()}"


def _kernels() -> dict[str, tuple[Operator, dict[str, int]]]:
    x = Input(N, C, H, W)
    kernels: dict[str, tuple[Operator, dict[str, int]]] = {}
    kernels["max_pool_3x3_s1_p1"] = (
        x >> Unfold(H, K, "kh") >> Unfold(W, K, "kw") >> Fold("kh", "kw") >> Output(N, C, H, W, defaults={"K": 3}),
        LAYER,
    )
    kernels["max_pool_3x3_s2_p1"] = (
        x
        >> Unfold(H, 3, "kh")
        >> Stride(H, 2)
        >> Unfold(W, 3, "kw")
        >> Stride(W, 2)
        >> Fold("kh", "kw")
        >> Output(N, C, H / 2, W / 2),
        LAYER,
    )
    kernels["max_pool_2x2_s2_split"] = (
        x >> Split(H, 2, "ho", "kh") >> Split(W, 2, "wo", "kw") >> Fold("kh", "kw") >> Output(N, C, "ho", "wo"),
        LAYER,
    )
    kernels["min_pool_3x3"] = (
        x >> Unfold(H, 3, "kh") >> Unfold(W, 3, "kw") >> Fold("kh", "kw", how="min") >> Output(N, C, H, W),
        LAYER,
    )
    # a fold over the contiguous trailing dims: the schedule keeps vector lanes of partial maxima
    kernels["global_max_pool"] = (x >> Fold(H, W) >> Output(N, C), LAYER)
    # folding the data dim of a wide window over a short dim: some outputs read only padding (-> 0)
    kernels["fold_with_empty_windows"] = (
        Input(N, C, H) >> Unfold(H, 5, "k") >> Fold(H) >> Output(N, C, "k"),
        {"N": 2, "C": 3, "H": 2},
    )
    # a window, a contraction, then a fold over the window: the mask is the chain run on ones
    kernels["fold_after_windowed_contraction"] = (
        Input(N, C, H)
        >> Unfold(H, 5, "k")
        >> Share(Weight(C, name="w"))
        >> Reduce(C)
        >> Fold(H, how="min")
        >> Output(N, "k"),
        {"N": 2, "C": 3, "H": 2},
    )
    # a window read by a fold and by a Map: the chain is materialized, the fold still masks
    window = Input(N, C, H) >> Unfold(H, 3, "k")
    kernels["fold_of_a_shared_window"] = (
        ((window >> Fold("k")) + (window >> Map("neg") >> Reduce("k"))) >> Output(N, C, H),
        {"N": 2, "C": 3, "H": 7},
    )
    # a Map between the window and the fold: the padding's zeros take part (the reference's rule)
    kernels["fold_after_a_map"] = (
        Input(N, C, H) >> Unfold(H, 3, "k") >> Map("neg") >> Fold("k") >> Output(N, C, H),
        {"N": 2, "C": 3, "H": 7},
    )
    conv = (
        x
        >> Unfold(H, K, "kh")
        >> Unfold(W, K, "kw")
        >> Share(Weight(Dim("o", C), C, "kh", "kw", name="w"))
        >> Reduce(C, "kh", "kw")
    )
    kernels["residual_conv"] = ((x + (conv >> Rename("o", "C"))) >> Output(N, C, H, W, defaults={"K": 3}), LAYER)
    gate = (
        x
        >> Reduce(H, W, mean=True)
        >> FC(C, name="r", size=R, weight="squeeze")
        >> Map("relu")
        >> FC("r", name="c", size=C, weight="excite")
        >> Map("sigmoid")
        >> Rename("c", "C")
    )
    kernels["squeeze_excitation"] = ((x * gate) >> Output(N, C, H, W), LAYER)
    seq = Input(N, C, P)
    query = seq >> FC(C, name="d", size=D, weight="wq")
    key = seq >> FC(C, name="d", size=D, weight="wk") >> Rename(P, "Q")
    value = seq >> FC(C, name="c", size=C, weight="wv") >> Rename(P, "Q")
    scores = Product(query, key, "d") >> Softmax("Q")
    kernels["attention"] = (Product(scores, value, "Q") >> Output(N, "c", P), LAYER)
    # attention over an image: keys indexed by two dims, softmax over both
    q2 = x >> FC(C, name="d", size=D, weight="wq")
    k2 = x >> FC(C, name="d", size=D, weight="wk") >> Rename(H, "h2") >> Rename(W, "w2")
    v2 = x >> Rename(H, "h2") >> Rename(W, "w2")
    att2 = Product(q2, k2, "d") >> Softmax("h2", "w2")
    kernels["attention_2d_softmax"] = (Product(att2, v2, "h2", "w2") >> Output(N, C, H, W), {**LAYER, "H": 3, "W": 4})
    kernels["fc_over_two_dims"] = (
        Input(N, C, H) >> FC(C, H, name="o", size=D, weight="w") >> Map("tanh") >> Output(N, "o"),
        LAYER,
    )
    # a reduction read by a chain's copy and by a Blend: the copy must not take over its write-back
    # (found by tests/test_graph_differential.py: "Buffer n3_product is used before its definition")
    vec = Input(N, C)
    mixed = Blend("add", vec, vec >> Map("relu"))
    gram = Product(mixed, mixed, "N")
    kernels["reduction_read_twice"] = (Blend("add", gram, gram >> Shift(C)) >> Output(C), {"N": 3, "C": 4})
    # a Product and an FC read a window through its views (never materialized), zero padding included
    seq3 = Input(N, C, H)
    kernels["involution_like_product_of_a_window"] = (
        Product(seq3 >> Unfold(H, 3, "k"), seq3 >> FC(C, name="k", size=3, weight="g"), "k") >> Output(N, C, H),
        {"N": 2, "C": 3, "H": 7},
    )
    kernels["fc_over_a_window"] = (
        Input(N, C, H) >> Unfold(H, 3, "k") >> FC(C, "k", name="o", size=D, weight="w") >> Output(N, "o", H),
        {"N": 2, "C": 3, "H": 7, "D": 4},
    )
    kernels["softmax_transposed_output"] = (x >> Softmax(H, W) >> Output(W, H, N, C), LAYER)
    kernels["rename_only"] = (x >> Rename(C, "c") >> Output(N, "c", H, W), LAYER)
    return kernels


KERNELS = _kernels()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("schedule", [None, "default"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_matches_the_reference(name: str, schedule: str | None, dtype: str) -> None:
    graph, layer = KERNELS[name]
    assert not graph.is_linear
    check(graph, layer, dtype, schedule)


@pytest.mark.parametrize("fn", sorted(MAP_FUNCTIONS))
def test_every_map_function(fn: str) -> None:
    by = {"scale": {"by": -1.5}}.get(fn, {})
    # Unfold then Map: a chain of views before a branch-free element-wise stage
    graph = Input(N, C, H) >> Unfold(H, 3, "k") >> Map(fn, **by) >> Reduce("k") >> Output(N, C, H)
    layer = {"N": 2, "C": 3, "H": 7}
    check(graph, layer, "float64", None, seed=1)
    check(graph, layer, "float32", "default", seed=1)


@pytest.mark.parametrize("how", BLEND_KINDS)
def test_every_blend_kind_broadcasting_both_ways(how: str) -> None:
    x = Input(N, C, H, W)
    pooled = x >> Reduce(H, mean=True)
    for graph in (Blend(how, x, pooled) >> Output(N, C, H, W), Blend(how, pooled, x) >> Output(N, C, H, W)):
        check(graph, LAYER, "float64", None, seed=2)
        check(graph, LAYER, "float32", "default", seed=2)


def test_stages_have_unique_names_and_the_signature_is_x_weights_out() -> None:
    graph, layer = KERNELS["attention"]
    lowered = kdsl_tvm.lower(graph, layer)
    names = [s.name for s in lowered.stages]
    assert len(names) == len(set(names))
    params = lowered.prim_func().params
    assert [p.name for p in params] == ["x", "wq", "wk", "wv", lowered.out.op.name]
    shapes = reference.shapes(graph, layer)
    assert [tuple(int(n) for n in w.shape) for w in lowered.weights] == list(shapes.weights)
    assert lowered.output_shape == shapes.output


#: stages that the default schedule leaves to its fallback today, by kernel: a max fold reads its floats
#: back from order keys (kdsl.codegen.tvm.elementwise.order_key) in an element-wise stage, which the
#: schedule space folds into its producer's write-back, and a lane reduction (rfactor) has none; it
#: runs as a parallel pass over the fold's output (512 elements here). The fix belongs in
#: schedule_space's choice for a reader of a lane reduction.
KNOWN_FALLBACKS = {"global_max_pool": {"n1_fold"}}


@pytest.mark.parametrize(
    ("name", "inlined"),
    [
        # the Maps after each FC fold into the FC's write-back; the gate's broadcast Blend is a pass
        ("squeeze_excitation", {"n3_map": "n2_fc's write-back", "n5_map": "n4_fc's write-back"}),
        # the residual addition folds into the convolution's write-back
        ("residual_conv", {"n3_blend": "n1_stage0's write-back"}),
        # the fold reads each element of the Map's once: the Map is computed inside the fold
        ("fold_after_a_map", {"n2_map": "n3_fold_key"}),
        ("global_max_pool", {}),
    ],
)
def test_the_default_schedule_inlines_and_parallelizes_the_new_stages(name: str, inlined: dict[str, str]) -> None:
    """Not the naive schedule: every stage scheduled (no fallback), element-wise stages folded away."""
    graph, layer = KERNELS[name]
    report: list[tuple[str, str]] = []
    kdsl_tvm.default_schedule.default_schedule(kdsl_tvm.lower(graph, layer), report=report)
    got = dict(report)
    allowed = KNOWN_FALLBACKS.get(name, set())
    unscheduled = [s for s, what in got.items() if what.startswith("fallback") or what == "unscheduled"]
    assert not set(unscheduled) - allowed, report
    for stage, where in inlined.items():
        assert got[stage] == f"inlined into {where}", report
    if name == "global_max_pool":
        assert got["n1_fold_key"].startswith("lanes: 16 partial results along H, W"), report  # one run of 48
    script = kdsl_tvm.source(graph, layer, scheduled=True)
    assert "T.parallel" in script


def test_every_node_kind_has_a_lowering_rule() -> None:
    assert set(kdsl_tvm.GRAPH_RULES) == {"Chain", *UNARY, *JOINS}


def test_a_fold_reading_views_pads_with_infinity_not_zero() -> None:
    """All-negative data: a max over windows that reads the zero padding would return 0 at the edges."""
    graph, layer = KERNELS["max_pool_3x3_s1_p1"]
    x = -1.0 - np.random.default_rng(3).random((2, 4, 6, 8))
    expected = torch.nn.functional.max_pool2d(torch.from_numpy(x), 3, 1, 1).numpy()
    for schedule in (None, "default"):
        got = kdsl_tvm.build(graph, layer, dtype="float64", schedule=schedule)(torch.from_numpy(x)).numpy()
        assert np.array_equal(got, expected)


@pytest.mark.parametrize("fn", ["exp", "sin", "tanh", "sigmoid", "gelu"])
def test_float32_polynomial_forms_are_accurate(fn: str) -> None:
    """float32 exp, sin, tanh, erf are polynomials (kdsl.codegen.tvm.elementwise): within 16 float32 eps
    (2e-6) of the float64 function, relative to max(|f(x)|, 1), over [-30, 30] and the clamped ends."""
    values = np.concatenate([np.linspace(-30, 30, 60001), [0.0, 1e-8, -1e-8, 80.0, -80.0, 200.0, -200.0]])
    graph = Input(N, C) >> Map(fn) >> Output(N, C)
    layer = {"N": 1, "C": len(values)}
    x32 = values.astype(np.float32)[None]
    got = kdsl_tvm.build(graph, layer)(torch.from_numpy(x32)).numpy().astype(np.float64)
    expected = reference.run(graph, layer, x32.astype(np.float64), [])
    finite = np.isfinite(expected) & (expected < 1e38)  # exp(200) overflows float32 on both sides
    error = np.abs(got - expected)[finite] / np.maximum(np.abs(expected[finite]), 1.0)
    assert error.max() <= 2e-6, f"{fn}: {error.max():.3g} at x = {x32[finite][np.argmax(error)]}"


@pytest.mark.parametrize("name", ["involution_like_product_of_a_window", "fc_over_a_window", "max_pool_3x3_s1_p1"])
def test_reductions_read_a_window_through_its_views(name: str) -> None:
    """The window chain (node 1) is not materialized: no copy stage K times the input's size."""
    graph, layer = KERNELS[name]
    names = [stage.name for stage in kdsl_tvm.lower(graph, layer).stages]
    assert not [n for n in names if n.startswith("n1_")], names


@pytest.mark.parametrize(("size", "vector"), [(14, 4), (7, 49)])
def test_a_gate_over_short_rows_is_vectorized_over_the_fused_rows(size: int, vector: int) -> None:
    """Squeeze-excitation's gate broadcast over H, W: rows of 14 or 7 hold no whole vector, but H and W
    are contiguous in x and in the output (the gate does not index them), so they fuse into one run."""
    graph, _ = KERNELS["squeeze_excitation"]
    layer = {**LAYER, "H": size, "W": size}
    report: list[tuple[str, str]] = []
    kdsl_tvm.default_schedule.default_schedule(kdsl_tvm.lower(graph, layer), report=report)
    assert dict(report)["n7_blend"] == f"parallel, vector {vector} over 2 fused loops", report
    check(graph, layer, "float32", "default", seed=4)


def test_a_product_vectorized_along_a_ragged_row_keeps_one_register_row() -> None:
    """Scores of attention over a 28-wide image: a vector of 28 lanes is 16 + 8 + 4, and under the
    rolled loop over d (8 > 4, not unrolled) rows of a register tile would start off vector boundaries
    (LLVM then assembles them lane by lane): the Product's register tile is one row."""
    graph, _ = KERNELS["attention_2d_softmax"]
    layer = {**LAYER, "N": 1, "H": 2, "W": 28, "D": 8}
    report: list[tuple[str, str]] = []
    kdsl_tvm.default_schedule.default_schedule(kdsl_tvm.lower(graph, layer), report=report)
    scores = [what for stage, what in report if stage.endswith("_product") and "vector axis w2" in what]
    assert scores == ["register tile 28 (vector axis w2), packed 0"], report
    check(graph, layer, "float32", "default", seed=5)
