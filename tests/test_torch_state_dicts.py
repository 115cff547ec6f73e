"""A kdsl module loads the state dict of the torch.nn layer it stands for (issue 29): ``weight`` is
taken as the operator's one weight where the layouts agree (an ``nn.Conv2d`` into the gallery's
conv2d, an ``nn.Linear`` into linear), and PyTorch's own checks refuse what does not fit."""

from __future__ import annotations

import copy

import pytest
from backends import backend

torch = backend("torch")

from kdsl import gallery  # noqa: E402
from kdsl.codegen import torch as kdsl_torch  # noqa: E402


@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_loads_an_nn_conv2d_state_dict_and_computes_the_same(bias: bool) -> None:
    conv = torch.nn.Conv2d(16, 8, 3, padding=1, bias=bias)
    module = kdsl_torch.build(gallery.load("conv2d"), {"Cin": 16, "Cout": 8}, bias=bias)
    assert str(module.load_state_dict(conv.state_dict())) == "<All keys matched successfully>"
    x = torch.randn(2, 16, 7, 9)
    torch.testing.assert_close(module(x), conv(x), rtol=1e-5, atol=1e-5)
    assert list(module.state_dict()) == (["weight", "bias"] if bias else ["weight"])  # torch.nn's names


def test_linear_loads_an_nn_linear_state_dict() -> None:
    linear = torch.nn.Linear(12, 5)
    module = kdsl_torch.build(gallery.load("linear"), {"Cin": 12, "Cout": 5}, bias=True)
    module.load_state_dict(linear.state_dict())
    x = torch.randn(3, 12)
    torch.testing.assert_close(module(x), linear(x))


def test_a_weight_of_another_layout_is_refused_by_pytorchs_size_check() -> None:
    module = kdsl_torch.build(gallery.load("conv2d"), {"Cin": 16, "Cout": 8})
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        module.load_state_dict(torch.nn.Conv2d(16, 8, 5, padding=2, bias=False).state_dict())


def test_operators_of_several_weights_and_their_own_names_load_as_before() -> None:
    op = gallery.load("depthwise_separable_conv2d")
    one = kdsl_torch.build(op, {"Cin": 8, "Cout": 16})
    other = kdsl_torch.build(op, {"Cin": 8, "Cout": 16})
    other.load_state_dict(one.state_dict())
    x = torch.randn(1, 8, 5, 5)
    torch.testing.assert_close(other(x), one(x))
    with pytest.raises(RuntimeError, match="weight"):  # two weights: "weight" names neither
        other.load_state_dict({"weight": torch.zeros(1), **one.state_dict()})
    torch.testing.assert_close(copy.deepcopy(other)(x), one(x))  # still pickles as its recipe
