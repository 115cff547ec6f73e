"""The gallery's branching operators on every backend, against hand-written PyTorch.

Each kernel runs through the NumPy reference, the PyTorch backend (``kdsl.codegen.torch.build``) and
the TVM backend (``kdsl.codegen.tvm.build``) in float64, and must equal the hand-written PyTorch of
:data:`kdsl.codegen.native.BRANCHING` (``F.max_pool2d``, ``x + F.conv2d``, squeeze-excitation with
``adaptive_avg_pool2d``/``linear``, involution with ``F.unfold``, attention with ``softmax`` and
``bmm``, Canvas's kernels with ``torch.roll`` and convolutions). The weights' layouts are spelled
out below: the kernel's weight order, dims and shapes, and the shapes PyTorch's functions receive.

Backends are chosen with ``KDSL_TEST_BACKENDS`` (default ``reference,torch,tvm``); a requested
backend that cannot be loaded fails the run instead of being skipped.
"""

import backends
import numpy as np
import pytest
from backends import backend

torch = backend("torch")
F = torch.nn.functional

from test_gallery import CASES  # noqa: E402

from kdsl import gallery, solve  # noqa: E402
from kdsl.codegen import reference  # noqa: E402
from kdsl.codegen.native import BRANCHING, NATIVE  # noqa: E402
from kdsl.lang.errors import DivisibilityError  # noqa: E402

BACKENDS = backends.listed()
# A requested backend that fails to import fails here, at collection, on purpose.
if "torch" in BACKENDS:
    kdsl_torch = backends.codegen("torch")
if "tvm" in BACKENDS:
    kdsl_tvm = backends.codegen("tvm")


KERNELS = sorted(BRANCHING)


def _fc(out, into):
    """An FC weight [out, in], given to PyTorch as a 1x1 conv's [out, in, 1, 1]."""
    return (out, into), (out, into, 1, 1)


LAYOUTS = {
    "max_pool2d": lambda v: [],
    "max_pool2d_2x2": lambda v: [],
    "residual_conv2d": lambda v: [("w", ("o", "Cin", "kh", "kw"), *[(v["Cin"], v["Cin"], v["K"], v["K"])] * 2)],
    "squeeze_excitation": lambda v: [  # F.linear takes the FC weights as they are
        ("squeeze", ("z", "Cin"), *[(v["Cin"] // v["r"], v["Cin"])] * 2),
        ("excite", ("c", "z"), *[(v["Cin"], v["Cin"] // v["r"])] * 2),
    ],
    "involution": lambda v: [
        ("reduce", ("z", "Cin"), *_fc(v["Cin"] // v["r"], v["Cin"])),
        ("span", ("q", "z"), *_fc(v["Cin"] // v["S"] * v["K"] ** 2, v["Cin"] // v["r"])),
    ],
    "spatial_attention": lambda v: [
        ("query", ("d", "Cin"), *_fc(v["Cin"] // v["r"], v["Cin"])),
        ("key", ("d", "Cin"), *_fc(v["Cin"] // v["r"], v["Cin"])),
        ("value", ("c", "Cin"), *_fc(v["Cin"], v["Cin"])),
    ],
    "shift_add": lambda v: [("w", ("Cin", "kh"), (v["Cin"], v["K"]), (v["Cin"], 1, v["K"], 1))],
    "canvas_resnet34": lambda v: [
        ("mix", ("c", "Cin"), *_fc(v["Cin"], v["Cin"])),
        ("depthwise", ("Cin", "kh", "kw"), (v["Cin"], v["K"], v["K"]), (v["Cin"], 1, v["K"], v["K"])),
    ],
}


CASE_IDS = [(name, index) for name in KERNELS for index in range(len(CASES[name][1]))]


def scaled_inputs(graph, layer, seed):
    """Inputs in [-1, 1] and weights of scale 1/sqrt(fan-in) (outputs of order one), float64."""
    rng = np.random.default_rng(seed)
    shapes = reference.shapes(graph, layer)
    x = rng.uniform(-1, 1, shapes.input)
    weights = [rng.uniform(-1, 1, shape) / np.sqrt(np.prod(shape[1:])) for shape in shapes.weights]
    return x, weights


def hand_written_branching(name, x, weights, binding):
    """The kernel's hand-written PyTorch on float64 tensors, weights laid out by BRANCHING's prepare."""
    prepare, call = BRANCHING[name]
    prepared = prepare([torch.from_numpy(w) for w in weights], binding)
    expected = [layout[3] for layout in LAYOUTS[name](binding)]
    assert [tuple(p.shape) for p in prepared] == expected, f"{name}: PyTorch's weights have the wrong layouts"
    return call(torch.from_numpy(x), prepared, binding).numpy()


def run_backend(backend, graph, layer, x, weights):
    if backend == "torch":  # the module takes every weight given (backends.output_or_error zips them)
        assert len(kdsl_torch.build(graph, layer).weights) == len(weights)
    return backends.run_backend(backend, graph, layer, x, weights)


def assert_backend_matches_hand_written(backend, name, layer, seed):
    graph = gallery.load(name)
    binding = reference.binding(graph, layer)
    x, weights = scaled_inputs(graph, layer, seed)
    expected = hand_written_branching(name, x, weights, binding)
    got = run_backend(backend, graph, layer, x, weights)
    assert got.shape == expected.shape, f"{backend} {name} at {layer}: shape {got.shape} vs {expected.shape}"
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-11, err_msg=f"{backend} {name} at {layer}")
    assert np.abs(expected).max() > 0  # the comparison is not vacuous


def test_the_branching_kernels_are_the_gallerys_graphs():
    # (the kernels of several inputs are checked against torch in tests/test_multi_input.py)
    graphs = sorted(
        name
        for name in gallery.names()
        if not gallery.load(name).is_linear and len(gallery.load(name).input_nodes) == 1
    )
    assert graphs == KERNELS
    assert set(LAYOUTS) == set(KERNELS)
    assert set(KERNELS) <= set(NATIVE)  # one table: kdsl bench codegen times against the same functions


@pytest.mark.parametrize(("name", "index"), CASE_IDS, ids=[f"{n}-{i}" for n, i in CASE_IDS])
def test_weight_layouts_are_as_documented(name, index):
    layer = CASES[name][1][index]
    graph = gallery.load(name)
    layouts = LAYOUTS[name](reference.binding(graph, layer))
    assert [w.name for w in graph.weights] == [layout[0] for layout in layouts]
    assert [tuple(d.name for d in w.dims) for w in graph.weights] == [layout[1] for layout in layouts]
    assert list(reference.shapes(graph, layer).weights) == [layout[2] for layout in layouts]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("name", "index"), CASE_IDS, ids=[f"{n}-{i}" for n, i in CASE_IDS])
def test_kernel_matches_hand_written_pytorch(backend, name, index):
    assert_backend_matches_hand_written(backend, name, CASES[name][1][index], seed=index)


def test_max_pool_padding_takes_no_part():
    # all-negative input: a zero from the window's padding would win the max at the border
    graph = gallery.load("max_pool2d")
    layer = {"N": 1, "Cin": 2, "H": 4, "W": 5}
    x = -1.0 - np.random.default_rng(0).uniform(0, 1, (1, 2, 4, 5))
    got = reference.run(graph, layer, x, [])
    expected = hand_written_branching("max_pool2d", x, [], reference.binding(graph, layer))
    assert (got < 0).all()
    np.testing.assert_array_equal(got, expected)


def test_unfold_and_stride_are_not_a_2x2_max_pool():
    # why max_pool2d_2x2 splits: Unfold's window is centred, so Unfold(H, 2) + Stride(H, 2) reads rows
    # 2i-1 and 2i, not 2i and 2i+1
    # (a Shift between them moves the window to 2i, 2i+1: the same pool as the gallery's Split)
    from kdsl.lang import Fold, Input, Output, Shift, Stride, Unfold, primary

    N, C, H, W = primary("N Cin H W")

    def strided(shift):
        built = Input(N, C, H, W)
        for dim, window in ((H, "kh"), (W, "kw")):
            built = built >> Unfold(dim, 2, window)
            built = built >> Shift(dim) if shift else built
            built = built >> Stride(dim, 2)
        return built >> Fold("kh", "kw") >> Output(N, C, H / 2, W / 2)

    layer = {"N": 1, "Cin": 2, "H": 4, "W": 6}
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 6))
    expected = hand_written_branching("max_pool2d_2x2", x, [], {"K": 2, **layer})
    got = reference.run(strided(False), layer, x, [])
    assert got.shape == expected.shape
    assert not np.allclose(got, expected)
    np.testing.assert_array_equal(reference.run(strided(True), layer, x, []), expected)
    np.testing.assert_array_equal(reference.run(gallery.load("max_pool2d_2x2"), layer, x, []), expected)


SERVES = {  # kernel -> (its table, the layers of resnet18 it is valid on with its defaults)
    "max_pool2d": ("resnet18", ["conv2_x", "conv3_x", "conv4_x", "conv5_x"]),
    "max_pool2d_2x2": ("resnet18_stride2", ["conv2_x", "conv3_x", "conv4_x"]),  # conv5_x: H = 7 is odd
    "residual_conv2d": ("resnet18", ["conv2_x", "conv3_x", "conv4_x", "conv5_x"]),
    "squeeze_excitation": ("resnet18", ["conv2_x", "conv3_x", "conv4_x", "conv5_x"]),
    "involution": ("resnet18", ["conv2_x", "conv3_x", "conv4_x", "conv5_x"]),
    "spatial_attention": ("resnet18", ["conv2_x", "conv3_x", "conv4_x", "conv5_x"]),
    "shift_add": ("resnet18", ["conv2_x", "conv3_x", "conv4_x", "conv5_x"]),
    "canvas_resnet34": ("resnet18", ["conv2_x", "conv3_x", "conv4_x", "conv5_x"]),
}


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_serves_the_resnet18_layers(name):
    table, layers = SERVES[name]
    assert gallery.layer_table(name) == table
    graph = gallery.load(name)
    valid = []
    for layer in solve.load_layers("resnet18"):
        try:
            shapes = reference.shapes(graph, layer.values)
        except DivisibilityError as error:
            assert "H" in str(error), error  # only the image's height may fail to divide
            continue
        assert shapes.output[1] == layer["Cin"] or name == "max_pool2d_2x2"
        valid.append(layer.name)
    assert valid == layers


def test_bench_codegen_takes_the_branching_kernels():
    from kdsl.bench.backends import _cases

    cases = _cases(["max_pool2d_2x2", "squeeze_excitation"], "resnet18", 8)
    layers = {
        name: [layer for n, layer, _, _ in cases if n == name] for name in ("max_pool2d_2x2", "squeeze_excitation")
    }
    assert layers == {
        "max_pool2d_2x2": SERVES["max_pool2d_2x2"][1],
        "squeeze_excitation": SERVES["squeeze_excitation"][1],
    }
    for name, _layer, binding, macs in cases:
        graph = gallery.load(name)
        assert binding["N"] == 8 and macs == solve.cost(graph, binding)["flops"] > 0
