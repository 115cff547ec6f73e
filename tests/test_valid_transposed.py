"""Windows without padding (Slide) and transposed convolutions (Dilate + Unfold) on every backend:
the gallery's conv2d_valid, alexnet_c1, conv_transpose2d and conv_transpose3d against PyTorch's own
F.conv2d(padding=0, stride), F.conv_transpose2d and F.conv_transpose3d, in float64, through the NumPy
reference, the PyTorch backend and the TVM backend, at small sizes."""

import numpy as np
import pytest
from backends import backend

torch = backend("torch")
tvm = backend("tvm")
F = torch.nn.functional

from kdsl.codegen import reference  # noqa: E402
from kdsl.codegen import torch as kdsl_torch  # noqa: E402
from kdsl.codegen import tvm as kdsl_tvm  # noqa: E402
from kdsl.lang import library  # noqa: E402


def conv_valid(x, weight, v):
    return F.conv2d(x, weight, stride=v.get("s", 1), padding=0)


def conv_transpose(x, weight, v):
    """PyTorch's transposed convolution of the gallery's weight: flipped in its windows, channels
    swapped; padding K - 1 - K//2 and the output padding that gives s times the input."""
    K, s = v["K"], v["s"]
    windows = weight.ndim - 2
    padding, size = K - 1 - K // 2, x.shape[-1]
    output_padding = s * size - ((size - 1) * s - 2 * padding + K)
    function = F.conv_transpose2d if windows == 2 else F.conv_transpose3d
    flipped = weight.flip(list(range(-windows, 0))).transpose(0, 1)
    return function(x, flipped, stride=s, padding=padding, output_padding=output_padding)


CASES = [
    ("conv2d_valid", conv_valid, {"N": 2, "Cin": 3, "Cout": 4, "H": 7, "W": 6, "Ho": 5, "Wo": 4}),
    ("conv2d_valid", conv_valid, {"N": 1, "Cin": 2, "Cout": 2, "H": 5, "W": 5, "Ho": 1, "Wo": 1, "K": 5}),
    # 27 = 4*4 + 11: no row left over; 23 = 4*3 + 11 + 1: one left over, dropped as PyTorch does
    ("alexnet_c1", conv_valid, {"N": 1, "Cin": 3, "Cout": 2, "H": 27, "W": 24, "Ho": 5, "Wo": 4}),
    ("conv_transpose2d", conv_transpose, {"N": 2, "Cin": 3, "Cout": 4, "H": 3, "W": 5}),
    ("conv_transpose2d", conv_transpose, {"N": 1, "Cin": 2, "Cout": 3, "H": 4, "W": 3, "K": 3, "s": 2}),
    ("conv_transpose2d", conv_transpose, {"N": 1, "Cin": 2, "Cout": 3, "H": 4, "W": 3, "K": 3, "s": 1}),
    ("conv_transpose3d", conv_transpose, {"N": 1, "Cin": 2, "Cout": 3, "D": 2, "H": 3, "W": 2}),
]


@pytest.mark.parametrize("backend_name", ["reference", "torch", "tvm"])
@pytest.mark.parametrize(("name", "function", "layer"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_gallery_entry_equals_pytorch_on_every_backend(name, function, layer, backend_name):
    op = library.load(name)
    values = dict(op.defaults) | layer
    shapes = reference.shapes(op, layer)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shapes.input)
    weights = [rng.standard_normal(shape) for shape in shapes.weights]
    expected = function(torch.from_numpy(x), torch.from_numpy(weights[0]), values).numpy()
    if backend_name == "reference":
        got = reference.run(op, layer, x, weights)
    elif backend_name == "torch":
        module = kdsl_torch.build(op, layer).double()
        with torch.no_grad():
            for parameter, weight in zip(module.parameters(), weights):
                parameter.copy_(torch.from_numpy(weight))
            got = module(torch.from_numpy(x)).numpy()
    else:
        got = np.asarray(kdsl_tvm.build(op, layer, dtype="float64")(x, *weights))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)


def test_alexnet_c1_checks_opevo_shape():
    """OpEvo's C1 binds: (227 - 11) // 4 + 1 = 55 windows; the output is (512, 64, 55, 55)."""
    from kdsl import solve

    op = library.load("alexnet_c1")
    (layer,) = solve.load_layers("opevo_alexnet")
    report = solve.check(op, "opevo_alexnet")
    assert len(report) == 1 and reference.shapes(op, layer.values).output == (512, 64, 55, 55)


def test_generated_pytorch_uses_tensor_unfold_and_zero_insertion():
    """The PyTorch source of a Slide is Tensor.unfold (no padding); a Dilate stacks zeros."""
    valid = kdsl_torch.source(
        library.load("alexnet_c1"), {"N": 1, "Cin": 3, "Cout": 2, "H": 27, "W": 27, "Ho": 5, "Wo": 5}
    )
    forward = valid.split("def forward")[1]  # the helpers above it may pad; the forward does not
    assert "x.unfold(2, K, s)" in forward and "x.unfold(3, K, s)" in forward and "_unfold(" not in forward
    transposed = kdsl_torch.source(library.load("conv_transpose2d"), {"N": 1, "Cin": 2, "Cout": 2, "H": 3, "W": 3})
    assert "torch.zeros_like" in transposed
