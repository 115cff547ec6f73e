"""Element-wise math on the TVM backend (kdsl.codegen.tvm.elementwise), float32 and float64:

* NaN (and +-inf) go through every Map, Blend, Fold and Softmax as they go through PyTorch, and the
  NumPy reference agrees with PyTorch on the same inputs;
* every float32 Map is within its stated ulp bound (``ULP_BOUNDS``, the table in the module's
  docstring) of a float64 truth, swept over the whole float32 range in one kernel per map;
* the values that issue 26 found wrong (sin(1e9), sin(3e9), exp(88.5));
* the map and fold kernels build for CUDA (sm_90) on this machine, which has no GPU.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from backends import backend

from kdsl.codegen import reference
from kdsl.lang import Blend, Fold, Input, Map, Output, Softmax, Unfold, primary
from kdsl.lang.nonlinear import MAP_FUNCTIONS
from kdsl.lang.operator import Operator

torch = backend("torch")
kdsl_tvm = pytest.importorskip("kdsl.codegen.tvm")
elementwise = pytest.importorskip("kdsl.codegen.tvm.elementwise")

N, C, L = primary("N C L")
NAN, INF = math.nan, math.inf
SCALE_BY = 0.37  # Map("scale")'s factor in these tests (not a power of two: its float32 rounding shows)
#: inputs every NaN test runs: NaN in several places, both infinities, zeros of both signs
SPECIALS = [NAN, 1.0, -2.0, 3.0, INF, -INF, 0.0, -0.0, 5.0, NAN, -7.5, 2.5]


def _map_graph(fn: str) -> Operator:
    return Input(N, C) >> Map(fn, by=SCALE_BY) if fn == "scale" else Input(N, C) >> Map(fn)


def _torch_map(fn: str, x: torch.Tensor) -> torch.Tensor:
    calls = {
        "relu": torch.relu,
        "abs": torch.abs,
        "neg": torch.neg,
        "sin": torch.sin,
        "exp": torch.exp,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "gelu": torch.nn.functional.gelu,
        "scale": lambda t: t * SCALE_BY,
    }
    return calls[fn](x)


def assert_same_nans_and_infinities(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    """NaN exactly where ``expected`` is NaN, and the same infinities where it is infinite."""
    assert got.shape == expected.shape, what
    assert np.array_equal(np.isnan(got), np.isnan(expected)), f"{what}: NaN at {np.isnan(got)} not {np.isnan(expected)}"
    infinite = np.isinf(expected)
    assert np.array_equal(got[infinite], expected[infinite]), f"{what}: {got[infinite]} != {expected[infinite]}"
    assert not np.isinf(got[~infinite]).any(), f"{what}: infinite where PyTorch is finite"


def _run_tvm(graph: Operator, layer: dict[str, int], x: np.ndarray, schedule: str | None) -> np.ndarray:
    kernel = kdsl_tvm.build(graph, layer, dtype=str(x.dtype), schedule=schedule)
    return kernel(torch.from_numpy(x)).numpy()


def check_like_torch(graph: Operator, layer: dict[str, int], x: np.ndarray, expected: torch.Tensor) -> None:
    """TVM (unscheduled and default schedule) and the reference give PyTorch's NaNs and infinities,
    and agree with it elsewhere to float32 rounding."""
    want = expected.numpy()
    results = {"reference": reference.run(graph, layer, x, [])}
    for schedule in (None, "default"):
        results[f"tvm schedule={schedule}"] = _run_tvm(graph, layer, x, schedule)
    for what, got in results.items():
        assert_same_nans_and_infinities(got, want, f"{what} ({x.dtype})")
        finite = np.isfinite(want)
        assert np.allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6), f"{what}: {got} vs {want}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fn", sorted(MAP_FUNCTIONS))
def test_every_map_propagates_nan_as_pytorch(fn: str, dtype: str) -> None:
    """PyTorch's float64 result, rounded: its float32 F.gelu gives NaN for +inf in its vector loop and
    inf in its scalar tail (F.gelu(torch.full((64,), inf))[0] vs F.gelu(torch.tensor([inf]))); kdsl
    gives inf, as float64 does."""
    x = np.array([SPECIALS], dtype=dtype)
    expected = _torch_map(fn, torch.from_numpy(x).double()).to(getattr(torch, dtype))
    check_like_torch(_map_graph(fn) >> Output(N, C), {"N": 1, "C": x.shape[1]}, x, expected)


def _nan_rows(dtype: str) -> np.ndarray:
    """Rows of 8: NaN first, NaN last, NaN among infinities, all -inf, all +inf, no NaN."""
    rows = [
        [NAN, 1, 2, 3, 4, 5, 6, 7],
        [1, 2, 3, 4, 5, 6, 7, NAN],
        [INF, -INF, NAN, INF, 0, 0, 0, 0],
        [-INF] * 8,
        [INF] * 8,
        [3, -1, 4, -1, 5, -9, 2, 6],
    ]
    return np.array(rows, dtype=dtype)


@pytest.mark.parametrize("how", ["max", "min"])
def test_folds_propagate_nan_as_amax_and_amin(how: str) -> None:
    x = _nan_rows("float32")
    expected = (torch.amax if how == "max" else torch.amin)(torch.from_numpy(x), dim=1)
    check_like_torch(Input(N, C) >> Fold(C, how=how) >> Output(N), {"N": x.shape[0], "C": 8}, x, expected)


def test_a_windowed_max_fold_propagates_nan_as_max_pool() -> None:
    """A max over a padded window read through the views, against F.max_pool1d with its padding."""
    x = _nan_rows("float32")[:, None, :]  # [N, C=1, L=8]
    graph = Input(N, C, L) >> Unfold(L, 3, "k") >> Fold("k") >> Output(N, C, L)
    expected = torch.nn.functional.max_pool1d(torch.from_numpy(x), 3, 1, 1)
    check_like_torch(graph, {"N": x.shape[0], "C": 1, "L": 8}, x, expected)


@pytest.mark.parametrize("how", ["max", "min"])
def test_blends_propagate_nan_as_maximum_and_minimum(how: str) -> None:
    """NaN on either side (the kernel blends each row with its reversal)."""
    from kdsl.lang import Shift  # a view that pairs each element with another

    x = _nan_rows("float64")
    graph = Blend(how, Input(N, C), Input(N, C) >> Shift(C)) >> Output(N, C)
    shifted = np.roll(x, -1, axis=1)
    expected = (torch.maximum if how == "max" else torch.minimum)(torch.from_numpy(x), torch.from_numpy(shifted))
    check_like_torch(graph, {"N": x.shape[0], "C": 8}, x, expected)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_propagates_nan_as_pytorch(dtype: str) -> None:
    """A NaN or +inf in a row makes it all NaN, a row of -inf is NaN (F.softmax's running max)."""
    x = _nan_rows(dtype)
    expected = torch.nn.functional.softmax(torch.from_numpy(x), dim=1)
    check_like_torch(Input(N, C) >> Softmax(C) >> Output(N, C), {"N": x.shape[0], "C": 8}, x, expected)


# ------------------------------------------------------------------------------------------------
# Accuracy in float32 ulps over the whole range
# ------------------------------------------------------------------------------------------------

SMALLEST_SUBNORMAL = 2.0**-149
LARGEST = float(np.finfo(np.float32).max)
#: edges where a map's float32 result overflows, underflows or changes form
EDGES = [88.72283, 88.72284, 88.5, 89.0, -87.33654, -103.27893, -103.97208, -104.0, 9.0, -9.0, 3 * math.sqrt(2)]


def sweep_inputs(count: int = 200_000, seed: int = 0) -> np.ndarray:
    """``count`` float32 values log-uniform in magnitude over [2**-149, FLT_MAX], both signs, plus
    +-0, +-inf, NaN, the overflow/underflow edges, a dense run over [-110, 110], and the float32s
    nearest to multiples of pi/2."""
    rng = np.random.default_rng(seed)
    magnitudes = np.exp2(rng.uniform(-149.0, 128.0, count))
    spread = (magnitudes * rng.choice([-1.0, 1.0], count)).astype(np.float32)
    dense = np.linspace(-110.0, 110.0, 50_001, dtype=np.float32)
    edges = np.array(EDGES, dtype=np.float32)
    near_edges = np.concatenate([np.nextafter(edges, np.float32(INF)), np.nextafter(edges, np.float32(-INF))])
    special = np.array([0.0, -0.0, INF, -INF, NAN, SMALLEST_SUBNORMAL, -SMALLEST_SUBNORMAL, LARGEST, -LARGEST])
    # float32 values next to multiples of pi/2 (sin's argument reduction loses the most there)
    multiples = np.round(np.exp2(rng.uniform(0.0, 126.0, 2_000))) * (math.pi / 2)
    near_multiples = multiples.astype(np.float32)
    values = np.concatenate(
        [spread, dense, edges, -edges, near_edges, special.astype(np.float32), near_multiples, -near_multiples]
    )
    assert values.dtype == np.float32 and np.isnan(values).any() and (values == 0).any()
    return values


def _elementwise_math(function: object, x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(function, 1, 1)(x).astype(np.float64)


def _sigmoid64(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _gelu64(x: np.ndarray) -> np.ndarray:
    # x * Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2: math.erfc keeps its relative accuracy in the tail
    finite = np.where(np.isfinite(x), x, 0.0)
    phi = _elementwise_math(lambda v: math.erfc(-v / math.sqrt(2)) / 2, finite)
    result = x * phi
    return np.where(np.isfinite(x), result, np.where(x > 0, x, NAN))  # gelu(inf) = inf; -inf: torch's NaN


def _sin64(x: np.ndarray) -> np.ndarray:
    finite = np.where(np.isfinite(x), x, 0.0)
    return np.where(np.isfinite(x), _elementwise_math(math.sin, finite), NAN)


#: the float64 truth of each map at float32 inputs (held in float64)
TRUTH = {
    "relu": lambda x: np.where(x < 0, 0.0, x),
    "abs": np.abs,
    "neg": np.negative,
    "sin": _sin64,
    "exp": np.exp,
    "sigmoid": _sigmoid64,
    "tanh": np.tanh,
    "gelu": _gelu64,
    "scale": lambda x: x * SCALE_BY,
}


def ulp_errors(got: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """|got - truth| in float32 ulps of the truth (2**(e - 23) for 2**e <= |truth| < 2**(e+1), the
    subnormals' 2**-149 below 2**-126); inf where their NaNs differ or the truth rounds to an infinity
    that ``got`` is not; 0 where both are the same NaN or infinity."""
    with np.errstate(all="ignore"):
        truth32 = truth.astype(np.float32).astype(np.float64)
        exponent = np.floor(np.log2(np.maximum(np.abs(truth), 2.0**-126)))
        ulp = np.exp2(np.clip(exponent, -126, 127) - 23)
        errors = np.abs(got - truth) / ulp
    same_special = (np.isnan(got) & np.isnan(truth)) | (np.isinf(truth32) & (got == truth32))
    mismatched = (np.isnan(got) != np.isnan(truth)) | (np.isinf(truth32) & (got != truth32))
    errors = np.where(same_special, 0.0, np.where(mismatched | np.isnan(errors), INF, errors))
    assert errors.shape == got.shape and not np.isnan(errors).any()
    return errors


def max_ulp_error(fn: str, values: np.ndarray) -> tuple[float, float]:
    """The map's float32 kernel (default schedule) on ``values``: its largest ulp error and where."""
    graph = _map_graph(fn) >> Output(N, C)
    got = _run_tvm(graph, {"N": 1, "C": values.size}, values[None], "default")[0].astype(np.float64)
    with np.errstate(all="ignore"):
        truth = TRUTH[fn](values.astype(np.float64))
    errors = ulp_errors(got, truth)
    worst = int(np.argmax(errors))
    assert errors.shape == values.shape
    return float(errors[worst]), float(values[worst])


swept = sweep_inputs()  # built once: every sweep test reads it


@pytest.mark.parametrize("fn", sorted(MAP_FUNCTIONS))
def test_float32_maps_are_within_their_ulp_bound_over_the_whole_range(fn: str) -> None:
    bound, lowest = elementwise.ULP_BOUNDS[fn]
    values = swept[~(swept < lowest)]  # NaN stays in
    error, at = max_ulp_error(fn, values)
    assert error <= bound, f"{fn}: {error:.3g} ulps at x = {at!r} (bound {bound} from x = {lowest})"


def test_every_map_has_a_stated_bound() -> None:
    assert set(elementwise.ULP_BOUNDS) == set(MAP_FUNCTIONS)
    for fn, (bound, _lowest) in elementwise.ULP_BOUNDS.items():
        # the docstring's table states the same bound
        assert re.search(rf"^{fn}\s+{bound:g}\s", elementwise.__doc__, re.MULTILINE), fn


@pytest.mark.parametrize(
    ("fn", "x"),
    [
        ("sin", 1e9),
        ("sin", 3e9),
        ("exp", 88.5),
        ("exp", -100.0),
        ("sigmoid", -95.0),
        ("tanh", 2.3e-38),
        ("gelu", -10.0),
    ],
)
def test_values_issue_26_found_wrong(fn: str, x: float) -> None:
    """sin(1e9) was 0.395 (true 0.546), sin(3e9) 4.4e19, exp(88.5) inf (true 2.72e38)."""
    values = np.array([x], dtype=np.float32)
    error, _ = max_ulp_error(fn, values)
    assert error <= 1.5, f"{fn}({x}): {error:.3g} ulps"


# ------------------------------------------------------------------------------------------------
# CUDA: the same expressions build for sm_90 without a GPU
# ------------------------------------------------------------------------------------------------


def _cuda_source(graph: Operator, layer: dict[str, int]) -> str:
    """Compile ``graph`` for CUDA, each stage its own kernel: its spatial loops fused, split by 32 and
    bound to blocks and threads (a reduction runs serially in its thread)."""
    tvm = kdsl_tvm.load_tvm()
    lowered = kdsl_tvm.lower(graph, layer, "float32")
    sch = tvm.s_tir.Schedule(lowered.module())
    for info in lowered.stages:
        block = sch.get_sblock(info.name)
        loops = sch.get_loops(block)
        spatial = loops[: len(loops) - len(info.reduced)]
        outer, inner = sch.split(sch.fuse(*spatial) if len(spatial) > 1 else spatial[0], [None, 32])
        sch.bind(outer, "blockIdx.x")
        sch.bind(inner, "threadIdx.x")
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"}, host={"kind": "llvm"})
    source = tvm.compile(sch.mod, target=target).mod.imports[0].inspect_source()
    assert "__global__" in source and "main_kernel" in source
    return source


def test_maps_and_folds_build_for_cuda() -> None:
    maps = Input(N, C)
    for fn in sorted(MAP_FUNCTIONS):
        maps = maps >> (Map(fn, by=SCALE_BY) if fn == "scale" else Map(fn))
    source = _cuda_source(maps >> Output(N, C), {"N": 4, "C": 64})
    assert "isnan" in source or "!=" in source  # the NaN guards reach the device code
    # sin's 2/pi digits scale by dividing by 2**24: CUDA's float64 literals have 15 decimals only
    assert "16777216" in source
    for how in ("max", "min"):
        _cuda_source(Input(N, C) >> Fold(C, how=how) >> Output(N), {"N": 64, "C": 8})
    _cuda_source(Input(N, C) >> Softmax(C) >> Output(N, C), {"N": 64, "C": 8})
