"""The gallery: every operator parses, round-trips, and computes (through the NumPy reference
interpreter, in float64) exactly what the PyTorch function named in its docstring computes, with the
weight mapping the docstring states. Syno's operators are checked against direct NumPy versions of
their published formulas; the branching kernels against the hand-written PyTorch of
:data:`kdsl.codegen.native.BRANCHING` (tests/test_gallery_branching.py runs them on every backend).
"""

import ast

import numpy as np
import pytest
from backends import backend

torch = backend("torch")
F = torch.nn.functional

import kdsl  # noqa: E402
from kdsl import gallery  # noqa: E402
from kdsl.codegen import reference  # noqa: E402
from kdsl.codegen.native import BRANCHING  # noqa: E402
from kdsl.lang import library  # noqa: E402
from kdsl.lang.errors import KdslError  # noqa: E402


def t(array):
    return torch.from_numpy(np.ascontiguousarray(array))


# -- each operator's PyTorch (or NumPy) equivalent, called with the documented weight mapping ----
# Each takes the input, the weights (in op.weights order) and the variable values of the layer.


def torch_conv1d(x, ws, v):
    return F.conv1d(t(x), t(ws[0]), padding=v["K"] // 2)


def torch_conv2d(x, ws, v):
    return F.conv2d(t(x), t(ws[0]), padding=v["K"] // 2)


def torch_pointwise_conv2d(x, ws, v):
    return F.conv2d(t(x), t(ws[0])[:, :, None, None])


def torch_depthwise_conv2d(x, ws, v):
    return F.conv2d(t(x), t(ws[0])[:, None], padding=v["K"] // 2, groups=v["Cin"])


def torch_grouped_conv2d(x, ws, v):
    K, G = v["K"], v["G"]
    weight = t(ws[0]).reshape(v["Cout"], v["Cin"] // G, K, K)
    return F.conv2d(t(x), weight, padding=K // 2, groups=G)


def torch_depthwise_separable_conv2d(x, ws, v):
    depthwise, pointwise = (t(w) for w in ws)
    mid = F.conv2d(t(x), depthwise[:, None], padding=v["K"] // 2, groups=v["Cin"])
    return F.conv2d(mid, pointwise[:, :, None, None])


def torch_dilated_conv2d(x, ws, v):
    K, d = v["K"], v["d"]
    return F.conv2d(t(x), t(ws[0]), padding=d * (K - 1) // 2, dilation=d)


def torch_strided_conv2d(x, ws, v):
    return F.conv2d(t(x), t(ws[0]), stride=v["s"], padding=v["K"] // 2)


def torch_conv2d_valid(x, ws, v):
    return F.conv2d(t(x), t(ws[0]), stride=v.get("s", 1), padding=0)


def torch_conv_transpose(x, ws, v):
    """F.conv_transpose{2,3}d with the gallery's weight flipped in its windows and its channels
    swapped, padding K - 1 - K//2 and the output padding that makes the output s times the input."""
    K, s = v["K"], v["s"]
    windows = ws[0].ndim - 2
    weight = t(ws[0]).flip(list(range(-windows, 0))).transpose(0, 1)
    padding, size = K - 1 - K // 2, x.shape[-1]
    output_padding = s * size - ((size - 1) * s - 2 * padding + K)
    function = F.conv_transpose2d if windows == 2 else F.conv_transpose3d
    return function(t(x), weight, stride=s, padding=padding, output_padding=output_padding)


def torch_conv2d_kx1_1xk(x, ws, v):
    K = v["K"]
    w_kx1, w_1xk = (t(w) for w in ws)
    mid = F.conv2d(t(x), w_kx1[..., None], padding=(K // 2, 0))
    return F.conv2d(mid, w_1xk[:, :, None, :], padding=(0, K // 2))


def torch_avg_pool2d(x, ws, v):
    return F.avg_pool2d(t(x), v["K"])


def torch_pixel_shuffle(x, ws, v):
    return F.pixel_shuffle(t(x), v["r"])


def torch_pixel_unshuffle(x, ws, v):
    return F.pixel_unshuffle(t(x), v["r"])


def torch_unfold2d(x, ws, v):
    return F.unfold(t(x), v["K"], padding=v["K"] // 2)


def torch_linear(x, ws, v):
    return F.linear(t(x), t(ws[0]))


def torch_matmul(x, ws, v):
    return torch.matmul(t(x), t(ws[0]))


def torch_shift_conv2d(x, ws, v):
    shifted = torch.roll(t(x), shifts=(-1, -1), dims=(2, 3))
    return F.conv2d(shifted, t(ws[0])[:, :, None, None])


def numpy_syno_op1(x, ws, v):
    """out[n,o,h,w] = sum x[n, g*Cin/G+ci, h+kh-K//2, w+kw-K//2] * W1[g,kh,kw,o,c] * W2[g*Cin/G+ci, kw, c]."""
    W2, W1 = ws
    K, G = v["K"], v["G"]
    n, cin, height, width = x.shape
    pad = K // 2
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))  # padded[.., h + pad, w + pad] = x[.., h, w]
    grouped = padded.reshape(n, G, cin // G, height + 2 * pad, width + 2 * pad)
    W2g = W2.reshape(G, cin // G, K, -1)
    out = np.zeros((n, W1.shape[3], height, width))
    for kh in range(K):
        for kw in range(K):
            patch = grouped[:, :, :, kh : kh + height, kw : kw + width]  # x[.., h + kh - pad, w + kw - pad]
            out += np.einsum("ngihw,gic,goc->nohw", patch, W2g[:, :, kw, :], W1[:, kh, kw, :, :])
    return out


def numpy_syno_op2(x, ws, v):
    """out[n,o,h,w] = sum x[n, g*Cin/G+ci, ((h+kh-K//2)+1) mod H, w+kw-K//2] * W1[g,kh,o,c] * W2[g*Cin/G+ci, kw, c],
    zero where h+kh-K//2 is outside [0, H) (and where w+kw-K//2 is outside [0, W))."""
    W2, W1 = ws
    K, G = v["K"], v["G"]
    n, cin, height, width = x.shape
    pad = K // 2
    W2g = W2.reshape(G, cin // G, K, -1)
    out = np.zeros((n, W1.shape[2], height, width))
    for kh in range(K):
        rows = np.arange(height) + kh - pad
        inside = (rows >= 0) & (rows < height)
        picked = x[:, :, (rows + 1) % height, :] * inside[None, None, :, None]
        padded = np.pad(picked, ((0, 0), (0, 0), (0, 0), (pad, pad)))
        for kw in range(K):
            patch = padded[:, :, :, kw : kw + width].reshape(n, G, cin // G, height, width)
            out += np.einsum("ngihw,gic,goc->nohw", patch, W2g[:, :, kw, :], W1[:, kh, :, :])
    return out


def torch_grouped_conv2d_shifted_window(x, ws, v):
    """grouped_conv2d read two columns to the right, cyclically: out[..., w] = grouped(x)[..., (w + 2) mod W]."""
    return torch.roll(torch_grouped_conv2d(x, ws, v), shifts=-2, dims=3)


def numpy_syno_op2_input_shift(x, ws, v):
    """syno_op2 of the input rolled one row up: x'[:, :, h] = x[:, :, (h + 1) mod H]."""
    return numpy_syno_op2(np.roll(x, -1, axis=2), ws, v)


def hand_written(name):
    """The branching kernel's hand-written PyTorch (the one copy, in kdsl.codegen.native), called with
    the kernel's weights, which its ``prepare`` lays out as PyTorch's functions take them."""
    prepare, call = BRANCHING[name]

    def equivalent(x, ws, v):
        return call(t(x), prepare([t(w) for w in ws], v), v)

    return equivalent


# the layers of grouped_conv2d and of its shifted-window variant
GROUPED_LAYERS = [
    {"N": 1, "Cin": 8, "Cout": 4, "H": 5, "W": 5},
    {"N": 2, "Cin": 6, "Cout": 9, "H": 2, "W": 3, "G": 3, "K": 5},
]

# name -> (equivalent function, layers to check it on: batch 1, odd sizes, H smaller than the window)
CASES = {
    "conv1d": (
        torch_conv1d,
        [
            {"N": 1, "Cin": 3, "Cout": 4, "L": 7},
            {"N": 2, "Cin": 2, "Cout": 3, "L": 2, "K": 5},
            {"N": 2, "Cin": 1, "Cout": 1, "L": 9, "K": 1},
        ],
    ),
    "conv2d": (
        torch_conv2d,
        [{"N": 1, "Cin": 3, "Cout": 2, "H": 5, "W": 7}, {"N": 2, "Cin": 2, "Cout": 3, "H": 2, "W": 3, "K": 5}],
    ),
    "pointwise_conv2d": (
        torch_pointwise_conv2d,
        [{"N": 1, "Cin": 3, "Cout": 5, "H": 3, "W": 1}, {"N": 2, "Cin": 1, "Cout": 2, "H": 4, "W": 5}],
    ),
    "depthwise_conv2d": (
        torch_depthwise_conv2d,
        [
            {"N": 1, "Cin": 3, "H": 5, "W": 4},
            {"N": 2, "Cin": 2, "H": 1, "W": 3},
            {"N": 1, "Cin": 1, "H": 3, "W": 6, "K": 5},
        ],
    ),
    "grouped_conv2d": (
        torch_grouped_conv2d,
        GROUPED_LAYERS,
    ),
    "depthwise_separable_conv2d": (
        torch_depthwise_separable_conv2d,
        [{"N": 1, "Cin": 3, "Cout": 4, "H": 5, "W": 6}, {"N": 2, "Cin": 2, "Cout": 1, "H": 3, "W": 2, "K": 5}],
    ),
    "dilated_conv2d": (
        torch_dilated_conv2d,
        [
            {"N": 1, "Cin": 2, "Cout": 3, "H": 7, "W": 6},
            {"N": 2, "Cin": 2, "Cout": 2, "H": 3, "W": 5, "d": 3},
            {"N": 1, "Cin": 1, "Cout": 2, "H": 4, "W": 9, "K": 5, "d": 2},
            {"N": 1, "Cin": 2, "Cout": 1, "H": 2, "W": 11, "K": 5, "d": 3},
        ],
    ),
    "strided_conv2d": (
        torch_strided_conv2d,
        [
            {"N": 1, "Cin": 3, "Cout": 2, "H": 6, "W": 8},
            {"N": 2, "Cin": 2, "Cout": 3, "H": 2, "W": 6, "K": 5},
            {"N": 1, "Cin": 2, "Cout": 2, "H": 9, "W": 3, "s": 3},
            # ResNet-18's stem (7x7, stride 2, padding 3, 3 input channels) and its 1x1 stride-2 shortcuts
            {"N": 1, "Cin": 3, "Cout": 2, "H": 10, "W": 8, "K": 7, "s": 2},
            {"N": 2, "Cin": 3, "Cout": 2, "H": 6, "W": 4, "K": 1, "s": 2},
        ],
    ),
    "conv2d_valid": (
        torch_conv2d_valid,
        [
            {"N": 1, "Cin": 3, "Cout": 2, "H": 6, "W": 8, "Ho": 4, "Wo": 6},
            {"N": 2, "Cin": 2, "Cout": 3, "H": 5, "W": 7, "Ho": 1, "Wo": 3, "K": 5},
        ],
    ),
    "alexnet_c1": (
        torch_conv2d_valid,
        [
            {"N": 1, "Cin": 3, "Cout": 2, "H": 27, "W": 23, "Ho": 5, "Wo": 4},  # (23 - 11) // 4 + 1: floor
            {"N": 2, "Cin": 2, "Cout": 3, "H": 7, "W": 9, "Ho": 3, "Wo": 4, "K": 3, "s": 2},
        ],
    ),
    "conv_transpose2d": (
        torch_conv_transpose,
        [
            {"N": 1, "Cin": 3, "Cout": 2, "H": 3, "W": 4},  # K=4, s=2, padding 1: output 2H
            {"N": 2, "Cin": 2, "Cout": 3, "H": 2, "W": 3, "K": 3, "s": 2},  # output_padding 1
            {"N": 1, "Cin": 2, "Cout": 2, "H": 4, "W": 3, "K": 3, "s": 1},
        ],
    ),
    "conv_transpose3d": (
        torch_conv_transpose,
        [
            {"N": 1, "Cin": 2, "Cout": 3, "D": 2, "H": 3, "W": 2},
            {"N": 1, "Cin": 2, "Cout": 2, "D": 3, "H": 2, "W": 2, "K": 3, "s": 1},
        ],
    ),
    "conv3d": (  # tests/test_conv3d_pooling.py runs it on every backend
        lambda x, ws, v: F.conv3d(t(x), t(ws[0]), padding=v["K"] // 2),
        [
            {"N": 1, "Cin": 2, "Cout": 3, "D": 3, "H": 4, "W": 5},
            {"N": 2, "Cin": 3, "Cout": 2, "D": 1, "H": 3, "W": 2, "K": 1},
        ],
    ),
    "conv2d_kx1_1xk": (
        torch_conv2d_kx1_1xk,
        [{"N": 1, "Cin": 3, "Cout": 4, "H": 5, "W": 7}, {"N": 2, "Cin": 2, "Cout": 2, "H": 2, "W": 3, "K": 5}],
    ),
    "avg_pool2d": (
        torch_avg_pool2d,
        [{"N": 1, "Cin": 3, "H": 4, "W": 6}, {"N": 2, "Cin": 2, "H": 9, "W": 3, "K": 3}],
    ),
    "avg_pool2d_strided": (  # odd sizes: PyTorch's floor drops the last row or column (P2's form, K=s=2)
        lambda x, ws, v: F.avg_pool2d(t(x), v["K"], stride=v["s"]),
        [
            {"N": 1, "Cin": 3, "H": 9, "W": 8, "Ho": 4, "Wo": 3},
            {"N": 2, "Cin": 2, "H": 7, "W": 5, "Ho": 3, "Wo": 2, "K": 2},
        ],
    ),
    "pixel_shuffle": (
        torch_pixel_shuffle,
        [{"N": 1, "Cin": 12, "H": 2, "W": 3}, {"N": 2, "Cin": 9, "H": 3, "W": 1, "r": 3}],
    ),
    "pixel_unshuffle": (
        torch_pixel_unshuffle,
        [{"N": 1, "Cin": 3, "H": 4, "W": 6}, {"N": 2, "Cin": 1, "H": 3, "W": 9, "r": 3}],
    ),
    "unfold2d": (
        torch_unfold2d,
        [{"N": 1, "Cin": 2, "H": 3, "W": 4}, {"N": 2, "Cin": 1, "H": 2, "W": 5, "K": 5}],
    ),
    "linear": (torch_linear, [{"N": 1, "Cin": 3, "Cout": 5}, {"N": 4, "Cin": 1, "Cout": 2}]),
    "matmul": (torch_matmul, [{"M": 3, "Cin": 4, "Cout": 2}, {"M": 1, "Cin": 1, "Cout": 3}]),
    # two data inputs: x is the tuple of them (tests/test_multi_input.py runs them on every backend)
    "bmm": (
        lambda x, ws, v: torch.bmm(t(x[0]), t(x[1])),
        [{"B": 3, "M": 4, "K": 5, "N": 2}, {"B": 1, "M": 1, "K": 1, "N": 3}],
    ),
    "bmm_tn": (
        lambda x, ws, v: torch.bmm(t(x[0]).transpose(1, 2), t(x[1])),
        [{"B": 3, "M": 4, "K": 5, "N": 2}, {"B": 2, "M": 1, "K": 3, "N": 1}],
    ),
    "attention_qk": (
        lambda x, ws, v: torch.matmul(t(x[0]), t(x[1]).transpose(-2, -1)),
        [{"B": 2, "M": 3, "N": 4, "D": 5}, {"B": 1, "M": 2, "N": 1, "D": 3}],
    ),
    "shift_conv2d": (
        torch_shift_conv2d,
        [{"N": 1, "Cin": 3, "Cout": 2, "H": 4, "W": 5}, {"N": 2, "Cin": 2, "Cout": 3, "H": 1, "W": 3}],
    ),
    "syno_op1": (
        numpy_syno_op1,
        [
            {"N": 1, "Cin": 4, "Cout": 8, "H": 5, "W": 6, "G": 2, "s": 2},
            {"N": 2, "Cin": 6, "Cout": 6, "H": 2, "W": 3, "G": 3, "s": 1, "K": 5},
            {"N": 1, "Cin": 64, "Cout": 128, "H": 4, "W": 3},  # the ResNet-18 defaults K=3, G=32, s=2
        ],
    ),
    "grouped_conv2d_shifted_window": (
        torch_grouped_conv2d_shifted_window,
        GROUPED_LAYERS,
    ),
    "syno_op2_input_shift": (
        numpy_syno_op2_input_shift,
        [
            {"N": 1, "Cin": 4, "Cout": 8, "H": 5, "W": 6},
            {"N": 2, "Cin": 6, "Cout": 6, "H": 2, "W": 3, "G": 3, "s": 1, "K": 5},
        ],
    ),
    "syno_op2": (
        numpy_syno_op2,
        [
            {"N": 1, "Cin": 4, "Cout": 8, "H": 5, "W": 6, "G": 2, "s": 2},
            {"N": 2, "Cin": 6, "Cout": 6, "H": 2, "W": 3, "G": 3, "s": 1, "K": 5},
            {"N": 1, "Cin": 4, "Cout": 4, "H": 3, "W": 4, "G": 2, "s": 1, "K": 7},
            {"N": 1, "Cin": 64, "Cout": 128, "H": 4, "W": 3},
        ],
    ),
}

# branching operators, each checked against its hand-written PyTorch; ResNet-like channel counts where
# a default coefficient divides them
BRANCHING_LAYERS = {
    "max_pool2d": [{"N": 1, "Cin": 3, "H": 5, "W": 7}, {"N": 2, "Cin": 2, "H": 2, "W": 3, "K": 5}],
    "max_pool2d_2x2": [{"N": 1, "Cin": 3, "H": 4, "W": 6}, {"N": 2, "Cin": 2, "H": 9, "W": 3, "K": 3}],
    "residual_conv2d": [{"N": 1, "Cin": 3, "H": 5, "W": 7}, {"N": 2, "Cin": 2, "H": 2, "W": 3, "K": 5}],
    "squeeze_excitation": [{"N": 2, "Cin": 32, "H": 3, "W": 5}, {"N": 1, "Cin": 6, "H": 4, "W": 1, "r": 3}],
    "involution": [
        {"N": 1, "Cin": 32, "H": 5, "W": 4},  # the defaults: 2 groups of 16, hidden width 8
        {"N": 2, "Cin": 6, "H": 2, "W": 3, "S": 3, "r": 2, "K": 5},
        {"N": 1, "Cin": 4, "H": 3, "W": 3, "S": 1, "r": 4, "K": 1},
    ],
    "spatial_attention": [{"N": 1, "Cin": 16, "H": 3, "W": 4}, {"N": 2, "Cin": 3, "H": 1, "W": 5, "r": 3}],
    "shift_add": [{"N": 1, "Cin": 3, "H": 5, "W": 4}, {"N": 2, "Cin": 2, "H": 2, "W": 1, "K": 5}],
    "canvas_resnet34": [{"N": 1, "Cin": 4, "H": 5, "W": 6}, {"N": 2, "Cin": 3, "H": 1, "W": 3, "K": 5}],
}
CASES.update({name: (hand_written(name), layers) for name, layers in BRANCHING_LAYERS.items()})

EQUIVALENCE = [(name, index) for name, (_, layers) in CASES.items() for index in range(len(layers))]


def assert_matches_equivalent(name, layer, seed):
    op = gallery.load(name)
    equivalent, _ = CASES[name]
    x, weights = reference.random_inputs(op, layer, seed=seed)
    got = reference.run(op, layer, x, weights)
    expected = equivalent(x, weights, reference.binding(op, layer))
    expected = expected.numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
    assert got.dtype == np.float64
    assert got.shape == expected.shape, f"{name} at {layer}: shape {got.shape} vs {expected.shape}"
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10, err_msg=f"{name} at {layer}")
    assert np.abs(expected).max() > 0  # the comparison is not vacuous


def test_every_gallery_operator_has_an_equivalence_check():
    assert sorted(CASES) == gallery.names()


@pytest.mark.parametrize(("name", "index"), EQUIVALENCE, ids=[f"{n}-{i}" for n, i in EQUIVALENCE])
def test_gallery_operator_matches_its_equivalent(name, index):
    assert_matches_equivalent(name, CASES[name][1][index], seed=index)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gallery_operator_round_trips(name):
    op = gallery.load(name)
    assert kdsl.parse(op.to_dsl()) == op
    assert kdsl.from_json(op.to_json()) == op
    # the file is exactly the printed form of its operator, under a leading docstring
    assert gallery.source(name).endswith(op.to_dsl(name))


@pytest.mark.parametrize("name", sorted(CASES))
def test_gallery_docstring_says_what_it_reproduces(name):
    text = gallery.describe(name)
    assert len(text.splitlines()) >= 3, f"{name} has no real docstring"
    assert "out[" in text, f"{name}'s docstring does not give the formula"
    if name.startswith("syno_"):
        assert "Weights:" in text
    else:
        assert "Reproduces" in text and ("torch" in text or "F." in text)
        assert ("Weights:" in text) == bool(gallery.load(name).weights), f"{name}: weight mapping"
    assert isinstance(ast.parse(gallery.source(name)).body[0], ast.Expr)


@pytest.mark.parametrize("name", sorted(CASES))
def test_gallery_defaults_bind_every_coefficient(name):
    op = gallery.load(name)
    assert set(op.coefficient_variables) <= set(op.default_coefficients)


def test_resnet18_channels_fit_the_default_groups():
    for name in ("grouped_conv2d", "syno_op1", "syno_op2"):
        op = gallery.load(name)
        for width in (64, 128, 256, 512):
            layer = {"N": 1, "Cin": width, "Cout": width, "H": 8, "W": 8}
            shapes = reference.shapes(op, layer)
            assert shapes.output == (1, width, 8, 8)


def test_dilated_conv2d_needs_another_shift_for_dilation_4():
    # documented limit: the Shift offset 1 is right for d = 2, 3; d = 4 would need offset 2
    layer = {"N": 1, "Cin": 1, "Cout": 1, "H": 9, "W": 9, "d": 4}
    op = gallery.load("dilated_conv2d")
    x, weights = reference.random_inputs(op, layer)
    got = reference.run(op, layer, x, weights)
    expected = torch_dilated_conv2d(x, weights, reference.binding(op, layer)).numpy()
    assert got.shape == expected.shape
    assert not np.allclose(got, expected)


# -- the loader ----------------------------------------------------------------------------------


def test_names_are_sorted_and_match_the_files():
    listed = gallery.names()
    assert listed == sorted(listed)
    assert listed == sorted(p.stem for p in gallery.directory().glob("*.dsl"))
    assert all(gallery.path(n).is_file() for n in listed)


@pytest.mark.parametrize("bad", ["no_such_op", "../pyproject", "conv2d.dsl", ""])
def test_unknown_names_raise_and_list_the_gallery(bad):
    with pytest.raises(KdslError, match=r"available: alexnet_c1, attention_qk, avg_pool2d, avg_pool2d_strided, bmm"):
        gallery.load(bad)
    with pytest.raises(KdslError):
        gallery.describe(bad)


def test_a_broken_gallery_file_names_itself(tmp_path, monkeypatch):
    (tmp_path / "broken.dsl").write_text('"""A broken operator."""\nop = Input(N) >> Reduce(N)\n')
    monkeypatch.setattr(library, "_candidates", lambda: [tmp_path])
    assert gallery.names() == ["broken"]
    assert gallery.describe("broken") == "A broken operator."
    with pytest.raises(KdslError, match=r"not defined") as raised:
        gallery.load("broken")
    assert str(tmp_path / "broken.dsl") in str(raised.value)


def test_a_missing_gallery_folder_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(library, "_candidates", lambda: [tmp_path / "absent"])
    with pytest.raises(KdslError, match=r"gallery folder is missing \(looked in .*absent\)"):
        gallery.names()


@pytest.mark.parametrize("name", gallery.names())
def test_gallery_operator_is_valid_on_resnet18_layers(name):
    from kdsl import solve

    table = gallery.layer_table(name)
    assert table is not None, f"{name} is valid on no built-in table with its defaults"
    expected = {"strided_conv2d", "avg_pool2d", "pixel_unshuffle", "max_pool2d_2x2"}
    assert (table == "resnet18_stride2") == (name in expected)
    # windows without padding need tables that bind their output sizes; 3-D ones a depth
    others = {"conv2d_valid": "valid3x3", "alexnet_c1": "opevo_alexnet", "conv_transpose3d": "transposed3d"}
    others |= {"conv3d": "r3d18", "avg_pool2d_strided": "gensor_pool"}
    assert table == others.get(name, table)
    report = solve.check(gallery.load(name), table)
    assert len(report) == len(solve.load_layers(table))


def test_syno_operators_cost_what_the_paper_reports():
    """Syno reports Operator 1 at about half a conv2d's FLOPs (2x speedup) in ResNet-18."""
    from kdsl import solve

    conv = sum(solve.cost(gallery.load("conv2d"), layer)["flops"] for layer in solve.load_layers("resnet18"))
    op1 = sum(solve.cost(gallery.load("syno_op1"), layer)["flops"] for layer in solve.load_layers("resnet18"))
    assert 0.49 < op1 / conv < 0.52
    import sympy

    N, Cin, Cout, H, W, K, G, s = sympy.symbols("N Cin Cout H W K G s", positive=True, integer=True)
    formula = solve.cost(gallery.load("syno_op1"))["flops"]
    assert sympy.simplify(formula - (N * H * W * Cin * Cout * K / (G * s) + N * H * W * Cout**2 * K**2 / s)) == 0


# -- pages -----------------------------------------------------------------------------------------


def test_pages_keep_recorded_latencies_and_merge_new_ones(tmp_path, monkeypatch):
    import json

    from kdsl.gallery import pages

    monkeypatch.setattr(gallery, "names", lambda: ["conv2d", "linear"])
    recorded = {"batch": 1, "operators": {"conv2d": {"kdsl_fwd_ms": 5.25, "tvm_fwd_ms": 4.5}}}
    (tmp_path / "latencies.json").write_text(json.dumps(recorded))
    pages.build_gallery(tmp_path, batch=1)  # nothing measured: the recorded numbers stay on the page
    label = pages.markdown_prose(pages.metric_label("kdsl_fwd_ms"))  # a person's words, not the record's key
    assert f"| {label} | 5.25 |" in (tmp_path / "pages" / "conv2d.md").read_text()
    assert "| [conv2d](pages/conv2d.md)" in (tmp_path / "README.md").read_text()
    assert "| 5.250 | - | 4.500 |" in (tmp_path / "README.md").read_text()
    assert json.loads((tmp_path / "latencies.json").read_text()) == recorded
    pages.build_gallery(tmp_path, batch=1, latencies={"linear": {"kdsl_fwd_ms": 0.125}})
    merged = json.loads((tmp_path / "latencies.json").read_text())["operators"]
    assert merged == {"conv2d": {"kdsl_fwd_ms": 5.25, "tvm_fwd_ms": 4.5}, "linear": {"kdsl_fwd_ms": 0.125}}
    assert f"| {label} | 0.125 |" in (tmp_path / "pages" / "linear.md").read_text()
    pages.build_gallery(tmp_path, batch=8)  # numbers at another batch do not compare: none shown
    assert label not in (tmp_path / "pages" / "conv2d.md").read_text()


def test_recorded_latencies_that_are_not_records_raise(tmp_path):
    from kdsl.gallery import pages

    (tmp_path / "latencies.json").write_text('{"batch": 1, "operators": [1, 2]}')
    with pytest.raises(KdslError, match="latencies.json must hold"):
        pages.load_latencies(tmp_path / "latencies.json", 1)
    (tmp_path / "latencies.json").write_text("{")
    with pytest.raises(KdslError, match="cannot read the latency records"):
        pages.load_latencies(tmp_path / "latencies.json", 1)


def test_the_recorded_latencies_are_the_gallery_pages_numbers():
    from kdsl.gallery import pages

    recorded = pages.load_latencies(gallery.directory() / pages.LATENCIES, 1)
    assert set(recorded) <= set(gallery.names()) and recorded
    for name, values in recorded.items():
        page = (gallery.directory() / "pages" / f"{name}.md").read_text()
        for metric, value in values.items():
            assert f"| {pages.markdown_prose(pages.metric_label(metric))} | {value:.4g} |" in page, (name, metric)
