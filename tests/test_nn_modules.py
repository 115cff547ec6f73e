"""kdsl's PyTorch modules follow torch.nn (issue 29): the one weight is ``weight``, a state dict of
``nn.Conv2d`` or one saved under the DSL name loads, a convolution-like operator carries
``nn.Conv2d``'s attributes (and they are right: an ``F.conv2d`` called with them computes the same),
the class is named after the gallery operator, the repr is one short line, and the renamed modules
pickle and compile."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from backends import backend
from hypothesis import given, settings
from hypothesis import strategies as st

torch = backend("torch")

from kdsl import gallery  # noqa: E402
from kdsl.codegen import reference  # noqa: E402
from kdsl.codegen import torch as kdsl_torch  # noqa: E402
from kdsl.codegen.torch.layer_facts import nn_layer, weight_attributes  # noqa: E402
from kdsl.lang import Input, Output, Reduce, Share, Stride, Unfold, Weight, coefficient, primary  # noqa: E402
from kdsl.testing import strategies as kst  # noqa: E402

F = torch.nn.functional


def test_the_gallerys_conv2d_loads_an_nn_conv2d_state_dict_and_reads_like_it():
    conv = torch.nn.Conv2d(64, 64, 3, padding=1)
    module = kdsl_torch.build(gallery.load("conv2d"), {"Cin": 64, "Cout": 64}, bias=True)
    assert str(module.load_state_dict(conv.state_dict())) == "<All keys matched successfully>"
    x = torch.randn(2, 64, 6, 5)
    with torch.no_grad():
        torch.testing.assert_close(module(x), conv(x), rtol=1e-4, atol=1e-5)
    assert repr(module) == "Conv2d(64, 64, kernel_size=3, bias=True)"
    assert type(module).__name__ == "Conv2d" and list(module.state_dict()) == ["weight", "bias"]


#: gallery name, layer, the padding F.conv{1,2}d needs to compute the same, the repr
CONVOLUTIONS = [
    ("conv2d", {"Cin": 4, "Cout": 6}, 1, "Conv2d(4, 6, kernel_size=3)"),
    ("grouped_conv2d", {"Cin": 64, "Cout": 64, "G": 2}, 1, "GroupedConv2d(64, 64, kernel_size=3, groups=2)"),
    ("depthwise_conv2d", {"Cin": 6}, 1, "DepthwiseConv2d(6, 6, kernel_size=3, groups=6)"),
    ("strided_conv2d", {"Cin": 4, "Cout": 6}, 1, "StridedConv2d(4, 6, kernel_size=3, stride=2)"),
    ("dilated_conv2d", {"Cin": 4, "Cout": 6}, 2, "DilatedConv2d(4, 6, kernel_size=3, dilation=2)"),
    ("pointwise_conv2d", {"Cin": 4, "Cout": 6}, 0, "PointwiseConv2d(4, 6, kernel_size=1)"),
    ("conv1d", {"Cin": 4, "Cout": 6}, 1, "Conv1d(4, 6, kernel_size=3)"),
    ("conv2d_valid", {"Cin": 4, "Cout": 6, "H": 8, "W": 8, "Ho": 6, "Wo": 6}, 0, "Conv2dValid(4, 6, kernel_size=3)"),
]


@pytest.mark.parametrize(("name", "layer", "padding", "text"), CONVOLUTIONS)
def test_the_nn_attributes_are_those_of_the_nn_convolution_that_computes_the_same(name, layer, padding, text):
    module = kdsl_torch.build(gallery.load(name), layer)
    assert repr(module) == text
    spatial = len(module.kernel_size)
    shape = (2, module.in_channels, *([8] * spatial))
    x = torch.randn(shape)
    # the documented mapping: the weight is nn's [Cout, Cin/groups, *kernel] in the same element order
    nn_weight = module.weight.reshape(module.out_channels, module.in_channels // module.groups, *module.kernel_size)
    conv = (F.conv1d, F.conv2d)[spatial - 1]
    expected = conv(x, nn_weight, stride=module.stride, padding=padding, dilation=module.dilation, groups=module.groups)
    with torch.no_grad():
        torch.testing.assert_close(module(x), expected, rtol=1e-4, atol=1e-5)


def test_a_linear_layer_has_nn_linears_attributes_and_loads_its_state_dict():
    linear = torch.nn.Linear(12, 5)
    module = kdsl_torch.build(gallery.load("linear"), {"Cin": 12, "Cout": 5}, bias=True)
    module.load_state_dict(linear.state_dict())
    assert (module.in_features, module.out_features) == (12, 5) and not hasattr(module, "kernel_size")
    assert repr(module) == "Linear(in_features=12, out_features=5, bias=True)"
    x = torch.randn(3, 12)
    with torch.no_grad():
        torch.testing.assert_close(module(x), linear(x))


@pytest.mark.parametrize(
    ("name", "layer", "why"),
    [
        ("depthwise_separable_conv2d", {"Cin": 4, "Cout": 8}, "two weights"),
        ("conv_transpose2d", {"Cin": 4, "Cout": 8}, "its stride inserts zeros (Dilate)"),
        ("max_pool2d", {}, "no weight"),
        ("squeeze_excitation", {"Cin": 32}, "branching"),
    ],
)
def test_an_operator_that_is_not_convolution_like_has_no_nn_attributes_and_a_short_repr(name, layer, why):
    op = gallery.load(name)
    module = kdsl_torch.build(op, layer)
    assert nn_layer(op) is None, why
    assert not any(hasattr(module, a) for a in ("in_channels", "kernel_size", "groups", "in_features"))
    text = repr(module)
    assert "\n" not in text and len(text) < 80 and ">>" not in text, text
    assert text.startswith(type(module).__name__ + "(") and all(f"{k}=" in text for k in layer)


@pytest.mark.parametrize(("name", "groups"), [("grouped_conv2d", 2), ("depthwise_conv2d", 8)])
def test_an_nn_conv2d_of_groups_loads_into_a_weight_laid_out_by_group(name, groups):
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=groups, bias=False)
    module = kdsl_torch.build(gallery.load(name), {"Cin": 8, "Cout": 8, "G": groups})
    assert tuple(module.weight.shape) != tuple(conv.weight.shape)
    module.load_state_dict(conv.state_dict())
    x = torch.randn(1, 8, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(module(x), conv(x), rtol=1e-5, atol=1e-6)


def test_the_documented_mappings_of_operators_of_other_layouts_compute_what_torch_nn_does():
    first, second = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4), torch.nn.Conv2d(4, 8, 1)
    separable = kdsl_torch.build(gallery.load("depthwise_separable_conv2d"), {"Cin": 4, "Cout": 8}, bias=True)
    separable.load_state_dict(
        {"depthwise": first.weight[:, 0], "pointwise": second.weight[:, :, 0, 0], "bias": second.bias}
    )
    with torch.no_grad():  # first's bias is left out: the operator has one bias, after both
        first.bias.zero_()
    linear = torch.nn.Linear(6, 3, bias=False)
    matmul = kdsl_torch.build(gallery.load("matmul"), {"Cin": 6, "Cout": 3})
    matmul.load_state_dict({"w": linear.weight.T})
    transposed = torch.nn.ConvTranspose2d(4, 8, 4, stride=2, padding=1, bias=False)
    conv_transpose = kdsl_torch.build(gallery.load("conv_transpose2d"), {"Cin": 4, "Cout": 8})
    conv_transpose.load_state_dict({"w": transposed.weight.transpose(0, 1).flip(-1, -2)})
    x, rows = torch.randn(2, 4, 5, 5), torch.randn(2, 6)
    with torch.no_grad():
        torch.testing.assert_close(separable(x), second(first(x)), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(matmul(rows), linear(rows), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(conv_transpose(x), transposed(x), rtol=1e-5, atol=1e-5)


def test_a_saved_state_dict_under_the_dsl_weight_name_still_loads():
    op = gallery.load("grouped_conv2d")
    one = kdsl_torch.build(op, {"Cin": 8, "Cout": 8}, bias=True)
    other = kdsl_torch.build(op, {"Cin": 8, "Cout": 8}, bias=True)
    old = {"w" if key == "weight" else key: value for key, value in one.state_dict().items()}
    assert list(old) == ["w", "bias"]  # what a module of this operator saved before it was `weight`
    assert str(other.load_state_dict(old)) == "<All keys matched successfully>"
    assert torch.equal(other.weight, one.weight)
    nested = torch.nn.Sequential(other)
    nested.load_state_dict({f"0.{key}": torch.zeros_like(value) for key, value in old.items()})  # under a prefix
    assert not other.weight.any()


def test_class_names_come_from_the_gallery_then_from_the_operators_shape():
    N, Cin, Cout, H, W = primary("N Cin Cout H W")
    K = coefficient("K")
    windows = Input(N, Cin, H, W) >> Unfold(H, K, "kh") >> Unfold(W, K, "kw")
    # conv2d with its weight's dims in another order: not the gallery's conv2d, still convolution-like
    own = windows >> Share(Weight(Cin, Cout, "kh", "kw", name="k")) >> Reduce(Cin, "kh", "kw") >> Output(N, Cout, H, W)
    scale = windows >> Share(Weight(Cin, "kh", name="s")) >> Reduce("kh") >> Output(N, Cin, H, W, "kw")
    layer = {"Cin": 4, "Cout": 8, "K": 3}
    assert type(kdsl_torch.build(gallery.load("grouped_conv2d"), layer)).__name__ == "GroupedConv2d"
    assert type(kdsl_torch.build(scale, layer)).__name__ == "KdslOperator"
    assert type(kdsl_torch.build(own, layer, name="my block")).__name__ == "MyBlock"
    # a weight [Cin, Cout, kh, kw] is no nn.Conv2d weight: it keeps its name, and nn's does not load into it
    module = kdsl_torch.build(own, {"Cin": 8, "Cout": 8, "K": 3})
    assert type(module).__name__ == "Conv2d" and list(module.state_dict()) == ["k"]  # the gallery's design
    with pytest.raises(RuntimeError, match="Missing key"):
        module.load_state_dict(torch.nn.Conv2d(8, 8, 3, bias=False).state_dict())
    # a strided conv1d: no gallery operator has its design
    mine = Input(N, Cin, H) >> Unfold(H, 3, "k") >> Stride(H, 2) >> Share(Weight(Cout, Cin, "k", name="taps"))
    mine = mine >> Reduce(Cin, "k") >> Output(N, Cout, "H")
    assert "class KdslConv1d(nn.Module):" in kdsl_torch.source(mine, {"Cin": 4, "Cout": 2})
    assert repr(kdsl_torch.build(mine, {"Cin": 4, "Cout": 2})) == "KdslConv1d(4, 2, kernel_size=3, stride=2)"


def test_a_weight_named_like_an_nn_attribute_gets_another_one():
    N, Cin, Cout = primary("N Cin Cout")
    op = Input(N, Cin) >> Share(Weight(Cin, name="groups")) >> Share(Weight(Cout, Cin, name="stride"))
    module = kdsl_torch.build(op >> Reduce(Cin) >> Output(N, Cout), {"Cin": 3, "Cout": 4})
    assert list(module.state_dict()) == ["groups_", "stride_"]


@pytest.mark.parametrize("name", ["grouped_conv2d", "squeeze_excitation"])
def test_renamed_modules_pickle_deep_copy_and_compile(name):
    layer = {"Cin": 32, "Cout": 32, "G": 2}
    module = kdsl_torch.build(gallery.load(name), layer, bias=True).eval()
    x = torch.randn(2, 32, 5, 5)
    with torch.no_grad():
        expected = module(x)
        for copied in (pickle.loads(pickle.dumps(module)), copy.deepcopy(module)):
            assert type(copied) is type(module) and repr(copied) == repr(module)
            assert list(copied.state_dict()) == list(module.state_dict())
            assert torch.equal(copied(x), expected)
        compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-6)


def test_a_module_pickled_with_the_old_class_name_still_loads():
    module = kdsl_torch.build(gallery.load("conv2d"), {"Cin": 4, "Cout": 4}, name="KdslOperator")
    copied = pickle.loads(pickle.dumps(module))
    assert type(copied).__name__ == "KdslOperator" and list(copied.state_dict()) == ["weight"]
    assert torch.equal(copied.weight, module.weight)


def test_a_whole_module_pickled_when_its_weight_had_the_dsl_name_unpickles_with_weight():
    module = kdsl_torch.build(gallery.load("conv2d"), {"Cin": 4, "Cout": 4}, bias=True)
    restore, arguments, state = module.__reduce_ex__(2)
    parameters = state["_parameters"]
    state["_parameters"] = {"w": parameters["weight"], "bias": parameters["bias"]}  # what an older kdsl pickled
    old = pickle.loads(pickle.dumps((restore, arguments, state)))
    copied = old[0](*old[1])
    copied.__setstate__(old[2])
    assert list(copied.state_dict()) == ["weight", "bias"] and torch.equal(copied.weight, module.weight)
    x = torch.randn(1, 4, 5, 5)
    with torch.no_grad():
        assert torch.equal(copied(x), module(x))


def check_nn_facts(op, layer) -> None:
    """Where ``op`` is convolution-like, its facts at ``layer`` are positive integers, the groups
    divide both channel counts, and the weight holds nn's number of elements; else no weight is
    ``weight`` that the DSL did not name so."""
    facts = nn_layer(op)
    if facts is None:
        assert "weight" not in weight_attributes(op) or any(w.name == "weight" for w in op.weights)
        return
    values = reference.binding(op, layer)
    numbers = [s.evaluate(values) for s in (facts.in_channels, facts.out_channels, facts.groups, *facts.kernel_size)]
    assert all(n.denominator == 1 and n > 0 for n in numbers), numbers
    channels_in, channels_out, groups = numbers[:3]
    assert channels_in % groups == 0 and channels_out % groups == 0
    kernel = int(np.prod([int(n) for n in numbers[3:]]))
    assert np.prod(reference.shapes(op, layer).weights[0]) == channels_out * channels_in // groups * kernel
    assert weight_attributes(op) == ["weight"]


@settings(max_examples=40, deadline=None)
@given(kst.operators_with_layers(max_steps=6))
def test_the_nn_facts_of_a_drawn_operator_never_crash_and_fit(case):
    check_nn_facts(*case)  # search's operators are rarely convolution-like: this checks that nothing raises


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(gallery.names())), st.data())
def test_the_nn_facts_of_gallery_operators_fit_every_layer_drawn(name, data):
    op = gallery.load(name)
    check_nn_facts(op, data.draw(kst.layers(op)))


def test_a_padded_module_has_no_nn_attributes_its_layer_would_not_have():
    op, layer = gallery.load("grouped_conv2d"), {"N": 1, "Cin": 64, "Cout": 64, "H": 7, "W": 7}
    padded = kdsl_torch.build(op, {**layer, "G": 3}, pad=True)  # 64 channels in 3 groups: padded to 66
    assert not hasattr(padded, "groups") and "Cin=66" in repr(padded) and list(padded.state_dict()) == ["weight"]
    exact = kdsl_torch.build(op, {**layer, "G": 2}, pad=True)  # nothing to pad
    assert (exact.in_channels, exact.groups) == (64, 2)
