"""TVM kernels take part in autograd: forward by TVM, backward by the PyTorch lowering's
vector-Jacobian product. Checked on every gallery operator in float64 against PyTorch's own
gradients and against central differences of the TVM forward itself."""

from __future__ import annotations

import numpy as np
import pytest
from backends import backend, data_inputs

torch = backend("torch")
kdsl_tvm = pytest.importorskip("kdsl.codegen.tvm")
kdsl_torch = pytest.importorskip("kdsl.codegen.torch")

from test_codegen import scaled_inputs  # noqa: E402
from test_gallery import CASES  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.lang.errors import LoweringError  # noqa: E402


def assert_tvm_gradients_match(name: str, probes: int = 2) -> None:
    """Gradients of sum(kernel(x, *w) * R) through the TVM kernel equal the PyTorch module's, and
    central differences of the TVM forward at a few coordinates."""
    op = gallery.load(name)
    layer = CASES[name][1][0]
    x, weights = scaled_inputs(op, layer, seed=5)
    inputs = list(data_inputs(x))  # a kernel of several inputs takes each in order
    kernel = kdsl_tvm.build(op, layer, dtype="float64")
    leaves = [torch.from_numpy(a.copy()).requires_grad_(True) for a in [*inputs, *weights]]
    out = kernel(*leaves)
    assert out.requires_grad
    probe = torch.from_numpy(np.random.default_rng(1).standard_normal(tuple(out.shape)))
    (out * probe).sum().backward()

    module = kdsl_torch.build(op, layer).double()
    with torch.no_grad():
        for parameter, value in zip(module.weights, weights):
            parameter.copy_(torch.from_numpy(value))
    x_torch = [torch.from_numpy(a.copy()).requires_grad_(True) for a in inputs]
    (module(*x_torch) * probe).sum().backward()
    expected = [t.grad for t in x_torch] + [p.grad for p in module.weights]
    for leaf, want in zip(leaves, expected):
        np.testing.assert_allclose(leaf.grad.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)

    def objective(arrays: list[np.ndarray]) -> float:
        with torch.no_grad():
            return float((kernel(*[torch.from_numpy(a) for a in arrays]) * probe).sum())

    rng = np.random.default_rng(2)
    arrays = [*inputs, *weights]
    step = 1e-6
    for which, leaf in enumerate(leaves):
        for _ in range(probes):
            index = tuple(int(rng.integers(0, n)) for n in arrays[which].shape)
            plus, minus = [a.copy() for a in arrays], [a.copy() for a in arrays]
            plus[which][index] += step
            minus[which][index] -= step
            numeric = (objective(plus) - objective(minus)) / (2 * step)
            assert abs(numeric - float(leaf.grad[index])) <= 1e-6 * max(1.0, abs(numeric)), (name, which, index)


@pytest.mark.parametrize("name", gallery.names())
def test_tvm_forward_and_backward_agree_with_pytorch(name):
    assert_tvm_gradients_match(name)


def test_no_grad_inputs_stay_forward_only_and_out_refuses_autograd():
    op = gallery.load("depthwise_separable_conv2d")
    layer = CASES["depthwise_separable_conv2d"][1][0]
    x, weights = scaled_inputs(op, layer, seed=0)
    kernel = kdsl_tvm.build(op, layer, dtype="float64")
    plain = kernel(torch.from_numpy(x), *[torch.from_numpy(w) for w in weights])
    assert not plain.requires_grad
    leaf = torch.from_numpy(weights[0].copy()).requires_grad_(True)
    with torch.no_grad():
        assert not kernel(torch.from_numpy(x), leaf, torch.from_numpy(weights[1])).requires_grad
    # only the weight requires grad: the input gets none, the weight one
    out = kernel(torch.from_numpy(x), leaf, torch.from_numpy(weights[1]))
    out.sum().backward()
    assert leaf.grad is not None and leaf.grad.shape == leaf.shape
    with pytest.raises(LoweringError, match="out= writes in place"):
        kernel(torch.from_numpy(x), leaf, torch.from_numpy(weights[1]), out=torch.empty_like(plain))
