"""The gallery's conv3d and avg_pool2d_strided on every backend: against PyTorch's own F.conv3d and
F.avg_pool2d(x, K, stride=s) in float64, through the NumPy reference, the PyTorch backend and the TVM
backend (its default schedule and points of its schedule space), at small sizes whose odd rows and
columns a floor drops; a window larger than its dim is the same KdslError everywhere; conv3d loads an
nn.Conv3d's state dict."""

import random

import numpy as np
import pytest
from backends import backend, run_backend

torch = backend("torch")
tvm = backend("tvm")
F = torch.nn.functional

from kdsl import solve  # noqa: E402
from kdsl.codegen import reference  # noqa: E402
from kdsl.codegen import torch as kdsl_torch  # noqa: E402
from kdsl.codegen import tvm as kdsl_tvm  # noqa: E402
from kdsl.codegen.tvm.lowering import lower  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.lang import Input, Output, Reduce, Slide, Split, coefficient, library, primary  # noqa: E402
from kdsl.lang.errors import DivisibilityError, KdslError, LoweringError  # noqa: E402


def conv3d(x, weight, v):
    return F.conv3d(x, weight, padding=v["K"] // 2)


def avg_pool(x, weight, v):
    return F.avg_pool2d(x, v["K"], stride=v["s"])


CASES = [
    ("conv3d", conv3d, {"N": 2, "Cin": 3, "Cout": 4, "D": 3, "H": 5, "W": 4}),
    ("conv3d", conv3d, {"N": 1, "Cin": 2, "Cout": 3, "D": 7, "H": 6, "W": 7, "K": 5}),
    # P3's form: overlapping windows (K=3, s=2); 10 = 2*4 + 2: one column past the last window dropped
    ("avg_pool2d_strided", avg_pool, {"N": 2, "Cin": 3, "H": 9, "W": 10, "Ho": 4, "Wo": 4}),
    # P2's form: K = s = 2 on odd sizes, the last row and column dropped as PyTorch's floor does
    ("avg_pool2d_strided", avg_pool, {"N": 1, "Cin": 2, "H": 7, "W": 11, "Ho": 3, "Wo": 5, "K": 2, "s": 2}),
    # gaps between windows (s > K) and one window over the whole height (H = K)
    ("avg_pool2d_strided", avg_pool, {"N": 1, "Cin": 2, "H": 2, "W": 9, "Ho": 1, "Wo": 3, "K": 2, "s": 3}),
]
IDS = [f"{name}-{index}" for index, (name, _, _) in enumerate(CASES)]


def arrays(op, layer, seed=0):
    """Float64 input and weights of ``op`` at ``layer``."""
    shapes = reference.shapes(op, layer)
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shapes.input), [rng.standard_normal(shape) for shape in shapes.weights]


def expected_output(function, layer, op, x, weights):
    """PyTorch's own function of the case, on the gallery operator's weights as they are."""
    values = dict(op.defaults) | layer
    weight = torch.from_numpy(weights[0]) if weights else None
    expected = function(torch.from_numpy(x), weight, values).numpy()
    assert np.abs(expected).max() > 0  # the comparison below is not vacuous
    return expected


@pytest.mark.parametrize("backend_name", ["reference", "torch", "tvm"])
@pytest.mark.parametrize(("name", "function", "layer"), CASES, ids=IDS)
def test_every_backend_computes_pytorchs_function(name, function, layer, backend_name):
    op = library.load(name)
    x, weights = arrays(op, layer)
    expected = expected_output(function, layer, op, x, weights)
    got = run_backend(backend_name, op, layer, x, weights)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("name", "function", "layer"), [CASES[0], CASES[2]], ids=[IDS[0], IDS[2]])
def test_points_of_the_schedule_space_compute_pytorchs_function(name, function, layer):
    """What the tuners try: random points of the TVM schedule space (tiles, orders, unrolls, layouts)."""
    op = library.load(name)
    x, weights = arrays(op, layer, seed=1)
    expected = expected_output(function, layer, op, x, weights)
    space = ScheduleSpace(lower(op, layer, dtype="float64"))
    rng, checked = random.Random(0), 0
    for _ in range(20):
        config = space.random(rng)
        try:
            space.apply(config)
        except LoweringError:
            continue  # a point the space itself refuses; the tuners skip it too
        kernel = kdsl_tvm.build(op, layer, dtype="float64", schedule=lambda lowered, config=config: space.apply(config))
        got = kernel(*(torch.from_numpy(a) for a in (x, *weights))).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10, err_msg=str(config))
        checked += 1
        if checked == 3:
            break
    assert checked == 3, f"{name}: only {checked} points of 20 applied"


def test_the_floor_drops_what_a_last_window_does_not_reach():
    """Every input element beyond the last window leaves the output unchanged, as in PyTorch."""
    op = library.load("avg_pool2d_strided")
    layer = {"N": 1, "Cin": 1, "H": 7, "W": 7, "Ho": 3, "Wo": 3}  # windows at 0, 2, 4: rows 0-6 read
    dropped = {"N": 1, "Cin": 1, "H": 8, "W": 8, "Ho": 3, "Wo": 3}  # (8 - 3) // 2 + 1 = 3: row 7 never read
    x = np.random.default_rng(2).standard_normal((1, 1, 8, 8))
    small = reference.run(op, layer, x[:, :, :7, :7], [])
    for backend_name in ("reference", "torch", "tvm"):
        np.testing.assert_allclose(run_backend(backend_name, op, dropped, x, []), small, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend_name", ["solver", "reference", "torch", "tvm"])
def test_a_window_larger_than_its_dim_is_one_error_naming_dim_and_sizes(backend_name):
    op = library.load("avg_pool2d_strided")
    layer = {"N": 1, "Cin": 2, "H": 2, "W": 9, "Ho": 1, "Wo": 4}  # K=3 does not fit in H=2
    # the solver names the window's variable (K=3); the reference, which shares no code with it, its value
    pattern = r"the window (K=)?3 does not fit in the dim H of size 2; choose a window no larger than the dim H"
    with pytest.raises(DivisibilityError, match=pattern):
        if backend_name == "solver":
            solve.bind(op, layer)
        else:
            run_backend(backend_name, op, layer, np.zeros((1, 2, 2, 9)), [])


def test_a_wrong_number_of_windows_says_the_right_one():
    op = library.load("avg_pool2d_strided")
    with pytest.raises(KdslError, match=r"\(83 - 2\) // 2 \+ 1 = 41 windows, not Ho=42"):
        solve.bind(op, {"N": 1, "Cin": 1, "H": 83, "W": 83, "Ho": 42, "Wo": 41, "K": 2})


def test_conv3d_loads_an_nn_conv3d_state_dict_and_reads_like_it():
    conv = torch.nn.Conv3d(4, 6, 3, padding=1)
    module = kdsl_torch.build(library.load("conv3d"), {"Cin": 4, "Cout": 6}, bias=True)
    assert str(module.load_state_dict(conv.state_dict())) == "<All keys matched successfully>"
    assert repr(module) == "Conv3d(4, 6, kernel_size=3, bias=True)"
    assert (module.kernel_size, module.stride, module.groups) == ((3, 3, 3), (1, 1, 1), 1)
    x = torch.randn(2, 4, 3, 5, 4)
    with torch.no_grad():
        torch.testing.assert_close(module(x), conv(x), rtol=1e-4, atol=1e-5)


def test_the_pooling_has_no_nn_convolution_facts():
    module = kdsl_torch.build(library.load("avg_pool2d_strided"), {"N": 1, "Cin": 2, "H": 9, "W": 9, "Ho": 4, "Wo": 4})
    assert not hasattr(module, "kernel_size") and list(module.state_dict()) == []


@pytest.mark.parametrize(("name", "table"), [("avg_pool2d_strided", "gensor_pool"), ("conv3d", "r3d18")])
def test_the_gallery_pages_use_it_snippet_runs(name, table):
    """The page's snippet builds at its table's first layer, coefficients the layer binds included (P1: K=2)."""
    from kdsl import gallery
    from kdsl.gallery.content import use_it

    assert gallery.layer_table(name) == table
    snippet = use_it(name, library.load(name), table)
    namespace: dict[str, object] = {}
    exec(snippet, namespace)  # the page's own code: load, build, run once
    (layer,) = solve.load_layers(table)[:1]
    assert list(namespace["y"].shape) == list(reference.shapes(library.load(name), layer.values).output)


def test_a_module_reading_its_sizes_from_the_input_checks_the_count_of_windows():
    """Built with Ho, Wo only (the page's snippet), the module reads H, W at each call: an input that
    gives another count of windows, or is smaller than the window, is a ShapeError, not another output."""
    module = kdsl_torch.build(library.load("avg_pool2d_strided"), {"Ho": 4, "Wo": 4})
    x = torch.randn(1, 2, 9, 10)  # (9 - 3) // 2 + 1 = (10 - 3) // 2 + 1 = 4
    torch.testing.assert_close(module(x), F.avg_pool2d(x, 3, stride=2))
    with pytest.raises(KdslError, match=r"the dim H of size 11 has \(N - K\) // s \+ 1 = 5 windows, not Ho=4"):
        module(torch.randn(1, 2, 11, 9))
    with pytest.raises(KdslError, match=r"the window K=3 does not fit in the dim W of size 2, for the input of shape"):
        module(torch.randn(1, 2, 9, 2))


# -- the PyTorch backend's native pooling over windows without padding -------------------------------

A, B, C, D, P, Q = primary("A B C D P Q")
K, s = coefficient("K s")
_X = Input(A, B, C, D)
_LAYER = {"A": 6, "B": 9, "C": 7, "D": 9}
#: poolings the planner cuts into one stage per window, each with its layer: a mean over Slide windows
#: (with strides) at several positions of the data, and over Split tiles in two stages
POOLINGS = [
    (
        _X
        >> Slide("D", K, P, "k", stride=s)
        >> Reduce("k", mean=True)
        >> Output("A", "B", "C", "D", defaults={"s": 2}),
        {**_LAYER, "K": 2, "P": 4},  # (9 - 2) // 2 + 1: the last column dropped
    ),
    (
        _X
        >> Slide("B", K, P, "k", stride=s)
        >> Reduce("k", mean=True)
        >> Output("A", "B", "C", "D", defaults={"s": 1}),
        {**_LAYER, "K": 3, "P": 7},
    ),
    (
        _X
        >> Slide("A", K, P, "k1", stride=s)
        >> Slide("C", K, Q, "k2", stride=s)
        >> Reduce("k1", "k2", mean=True)
        >> Output("A", "B", "C", "D", defaults={"s": 2}),
        {**_LAYER, "K": 3, "P": 2, "Q": 3},
    ),
    (  # two Split poolings in two stages, neither over the last dims
        _X
        >> Split("A", K, "P", "k1")
        >> Reduce("k1", mean=True)
        >> Split("B", K, "Q", "k2")
        >> Reduce("k2", mean=True)
        >> Output("P", "Q", "C", "D"),
        {**_LAYER, "K": 3},
    ),
]


@pytest.mark.parametrize("index", range(len(POOLINGS)))
def test_poolings_lower_to_avg_pool_and_equal_the_reference(index):
    from kdsl.bench.overhead import count_aten_ops

    op, layer = POOLINGS[index]
    x = np.random.default_rng(index).standard_normal(reference.shapes(op, layer).input)
    module = kdsl_torch.build(op, layer).double()
    got = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, reference.run(op, layer, x, []), rtol=1e-12, atol=1e-12)
    counts = count_aten_ops(lambda: module(torch.from_numpy(x)))
    assert any(name.startswith("aten.avg_pool") for name in counts), counts
    assert not any(name.startswith(("aten.mean", "aten.sum", "aten.unfold")) for name in counts), counts


def test_the_gallerys_strided_pooling_is_two_avg_pool2d_calls_on_the_data_as_it_lies():
    text = kdsl_torch.source(library.load("avg_pool2d_strided"), {"Ho": 4, "Wo": 4})
    forward = text.split("def forward")[1]
    assert "F.avg_pool2d(x, (K, 1,), (s, 1,))" in forward and "F.avg_pool2d(x, (1, K,), (1, s,))" in forward
    assert "permute" not in forward and "unfold" not in forward


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("avg_pool2d_strided", {"N": 2, "Cin": 7, "H": 21, "W": 22, "Ho": 10, "Wo": 10}),  # P3's windows
        ("conv3d", {"N": 1, "Cin": 16, "Cout": 16, "D": 4, "H": 7, "W": 9}),
    ],
)
def test_the_cuda_bundles_schedule_computes_the_operator_emulated_on_the_cpu(name, layer):
    """No GPU here: the CUDA bundle's schedule (its recorded config) with its thread loops serial, on LLVM."""
    from kdsl.codegen.tvm import cuda
    from kdsl.codegen.tvm.cuda_emulate import emulate
    from kdsl.codegen.tvm.gpu_schedule import GpuConfig

    op = library.load(name)
    bundle = cuda.cuda_bundle(op, layer)
    assert "__global__" in bundle["source"]
    x, weights = arrays(op, layer, seed=3)
    arrays32 = [a.astype("float32") for a in (x, *weights)]
    got = emulate(op, layer, *arrays32, config=GpuConfig(**bundle["config"]))
    np.testing.assert_allclose(got, reference.run(op, layer, x, weights), rtol=1e-4, atol=1e-3)
