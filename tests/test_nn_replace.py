"""kdsl.nn.replace swaps an operator into a network: which convs it replaces and which it leaves (and
why), that the network computes the same where the operator is the conv itself, and that the result
trains, saves, loads, compiles and exports. kdsl's own ResNet-18s (kdsl.nn.resnet18, torchvision's
without torchvision, and the benchmark's kdsl.discover.network.resnet18) always; torchvision's
networks when torchvision is installed."""

from __future__ import annotations

import copy
import shutil
import time

import pytest
from backends import backend

backend("torch")

import torch  # noqa: E402
from torch import nn  # noqa: E402

import kdsl  # noqa: E402
from kdsl import gallery  # noqa: E402
from kdsl.discover import network  # noqa: E402
from kdsl.lang.errors import KdslError  # noqa: E402
from kdsl.nn import ConvSpec, fit, replace, resnet18  # noqa: E402

#: ResNet-18's convs that are not a stride-1 3x3 (7 of 20), by torchvision's names, and why
#: grouped_conv2d leaves each
NO_STRIDE = "stride 2, the operator keeps the resolution (it has no stride)"
LEFT = {
    "conv1": "kernel 7x7, the operator's K is 3",
    "layer2.0.conv1": NO_STRIDE,
    "layer3.0.conv1": NO_STRIDE,
    "layer4.0.conv1": NO_STRIDE,
    "layer2.0.downsample.0": f"kernel 1x1, the operator's K is 3; {NO_STRIDE}",
    "layer3.0.downsample.0": f"kernel 1x1, the operator's K is 3; {NO_STRIDE}",
    "layer4.0.downsample.0": f"kernel 1x1, the operator's K is 3; {NO_STRIDE}",
}


def small_resnet() -> nn.Module:
    torch.manual_seed(0)
    return resnet18(num_classes=10)


def check_resnet18_report(report) -> None:
    """13 stride-1 3x3 convs replaced; the 7 of :data:`LEFT` left, each for its reason."""
    assert len(report.replaced) == 13 and len(report.left) == 7, str(report)
    assert all("3x3 conv" in text and "(G=4, K=3)" in text for _, text in report.replaced)
    left = dict(report.left)
    assert set(left) == set(LEFT)
    for name, reason in LEFT.items():
        assert reason in left[name], (name, left[name])


def copy_weights(original: nn.Module, replaced: nn.Module, names: list[str], layout=lambda w: w) -> None:
    """Load each replaced conv's weight (re-laid out by ``layout``) and bias into its kdsl module."""
    with torch.no_grad():
        for name in names:
            conv, module = original.get_submodule(name), replaced.get_submodule(name)
            module.weight.copy_(layout(conv.weight))
            if conv.bias is not None:
                module.bias.copy_(conv.bias)


def test_grouped_conv2d_replaces_the_13_stride_1_3x3_convs_of_kdsls_resnet18_and_says_why_it_leaves_7():
    net, report = replace(small_resnet(), gallery.load("grouped_conv2d"), label="grouped_conv2d")
    check_resnet18_report(report)
    assert "Cin/G = 3/4 is not an integer" in dict(report.left)["conv1"]
    replaced = [type(net.get_submodule(name)).__name__ for name, _ in report.replaced]
    assert replaced == ["GroupedConv2d"] * 13
    assert all(isinstance(net.get_submodule(name), nn.Conv2d) for name in LEFT)
    assert str(report).splitlines()[0] == "replaced 13 of 20 Conv2d with grouped_conv2d"
    assert tuple(net(torch.randn(2, 3, 32, 32)).shape) == (2, 10)


def test_the_benchmarks_resnet18_gets_the_same_13_convs_replaced():
    net, report = replace(network.resnet18(classes=10, resolution=32), "grouped_conv2d")
    assert len(report.replaced) == 13 and len(report.left) == 7, str(report)
    assert [name for name, _ in report.left] == [
        "stem.0",
        "stages.1.0.conv1",
        "stages.1.0.shortcut.0",
        "stages.2.0.conv1",
        "stages.2.0.shortcut.0",
        "stages.3.0.conv1",
        "stages.3.0.shortcut.0",
    ]
    assert tuple(net(torch.randn(2, 3, 32, 32)).shape) == (2, 10)


def test_strided_conv2d_replaces_the_three_stride_2_3x3_convs():
    net, report = replace(small_resnet(), "strided_conv2d")
    assert [name for name, _ in report.replaced] == ["layer2.0.conv1", "layer3.0.conv1", "layer4.0.conv1"]
    assert "stride 1, the operator's s is 2" in dict(report.left)["layer1.0.conv1"]
    # the two calls compose: the rest of the 3x3 convs next, the kdsl modules are no Conv2d
    net, more = replace(net, "grouped_conv2d")
    assert len(more.replaced) == 13 and len(more.left) == 4


def test_with_conv2d_and_its_weights_the_replaced_resnet18_computes_the_same():
    original = small_resnet().eval()
    net, report = replace(copy.deepcopy(original), "conv2d")
    assert len(report.replaced) == 13
    copy_weights(original, net, [name for name, _ in report.replaced])
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(net(x), original(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("op", "conv", "layout"),
    [
        ("conv2d", nn.Conv2d(4, 6, 3, padding=1), lambda w: w),
        ("conv2d", nn.Conv2d(4, 6, 5, padding="same", bias=False), lambda w: w),
        ("strided_conv2d", nn.Conv2d(4, 6, 3, stride=2, padding=1), lambda w: w),
        ("grouped_conv2d", nn.Conv2d(4, 6, 3, padding=1, groups=2), lambda w: w.reshape(2, 3, 2, 3, 3)),
        ("depthwise_conv2d", nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False), lambda w: w[:, 0]),
        ("dilated_conv2d", nn.Conv2d(4, 6, 3, padding=2, dilation=2), lambda w: w),
    ],
)
def test_an_operator_that_is_the_conv_computes_the_same_with_its_weights(op, conv, layout):
    coefficients = {"K": conv.kernel_size[0]} if "K" in gallery.load(op).coefficient_variables else None
    original = nn.Sequential(conv, nn.ReLU())
    net, report = replace(copy.deepcopy(original), op, coefficients=coefficients)
    assert [name for name, _ in report.replaced] == ["0"], str(report)
    copy_weights(original, net, ["0"], layout)
    x = torch.randn(2, 4, 8, 10)
    with torch.no_grad():
        torch.testing.assert_close(net(x), original(x), rtol=1e-4, atol=1e-5)


def test_the_pixels_each_output_reads_decide_when_the_shapes_match():
    # pointwise_conv2d has no K: it keeps a 3x3 conv's shape, and its outputs read one pixel each
    reasons = fit(gallery.load("depthwise_conv2d"), ConvSpec.of(nn.Conv2d(4, 4, 5, padding=2, groups=4))).reasons
    assert reasons == ("kernel 5x5, the operator's K is 3",)
    pointwise = fit(gallery.load("pointwise_conv2d"), ConvSpec.of(nn.Conv2d(8, 8, 3, padding=1)))
    assert pointwise.reasons == ("kernel 3x3, an output pixel of the operator reads a 1x1 window",)
    assert fit(gallery.load("pointwise_conv2d"), ConvSpec.of(nn.Conv2d(8, 16, 1))).serves
    # search-found stand-ins for a 3x3 conv read a shifted or sparse 3x3 window: they serve it
    conv3x3 = ConvSpec.of(nn.Conv2d(64, 64, 3, padding=1))
    for name in ("grouped_conv2d_shifted_window", "canvas_resnet34", "max_pool2d"):  # max_pool2d: no weight
        assert fit(gallery.load(name), conv3x3).serves, name
    assert fit(gallery.load("spatial_attention"), conv3x3).reasons == (
        "kernel 3x3, an output pixel of the operator reads a 8x8 window",
    )


def test_the_replacements_keep_dtype_device_training_mode_and_bias():
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1, bias=False)).double().eval()
    model, report = replace(model, "grouped_conv2d")
    assert len(report.replaced) == 2
    assert {p.dtype for p in model.parameters()} == {torch.float64}
    assert list(model[0].state_dict()) == ["weight", "bias"] and list(model[1].state_dict()) == ["weight"]
    assert not model[0].training
    assert model(torch.ones(1, 8, 6, 6, dtype=torch.float64)).dtype == torch.float64


def test_the_weights_are_initialised_as_pytorch_initialises_a_grouped_conv():
    torch.manual_seed(0)
    model, _ = replace(nn.Sequential(nn.Conv2d(256, 256, 3, padding=1)), "grouped_conv2d")
    bound = 1 / (256 // 4 * 9) ** 0.5  # kaiming-uniform(a=sqrt(5)) over the fan-in Cin/G * K * K
    weight = model[0].weight
    assert weight.abs().max() <= bound and weight.abs().max() > 0.95 * bound
    assert abs(weight.std().item() - bound / 3**0.5) < 0.05 * bound


def test_where_picks_the_convs_by_name_or_predicate():
    names = ["layer1.0.conv1", "layer4.1.conv2"]
    _, report = replace(small_resnet(), "grouped_conv2d", where=names)
    assert [name for name, _ in report.replaced] == names
    assert sum("not chosen by where=" in text for _, text in report.left) == 18
    _, report = replace(small_resnet(), "grouped_conv2d", where=lambda name, conv: conv.in_channels == 64)
    assert len(report.replaced) == 4
    with pytest.raises(KdslError, match="where= names 'layer1.0.conv9', no Conv2d of the model"):
        replace(small_resnet(), "grouped_conv2d", where=["layer1.0.conv9"])


def test_coefficients_set_values_for_every_conv_or_per_conv():
    _, report = replace(small_resnet(), "grouped_conv2d", coefficients={"G": 2})
    assert "(G=2, K=3)" in report.replaced[0][1]
    _, report = replace(small_resnet(), "grouped_conv2d", coefficients=lambda name, conv: {"K": conv.kernel_size[0]})
    # the 1x1 shortcuts are kernel-matched now and left for their stride alone; the stem for its 3 channels
    assert len(report.replaced) == 13
    assert dict(report.left)["layer2.0.downsample.0"] == f"1x1 conv 64->128, stride 2: {NO_STRIDE}"
    with pytest.raises(KdslError, match="the operator has no coefficient Q"):
        replace(small_resnet(), "grouped_conv2d", coefficients={"Q": 2})


def test_bad_input_is_a_kdsl_error_and_an_operator_serving_nothing_is_a_report():
    with pytest.raises(KdslError, match="takes a torch.nn.Module, got str"):
        replace("resnet", "conv2d")
    with pytest.raises(KdslError, match="takes an Operator or a gallery name, got int"):
        replace(nn.Conv2d(3, 3, 3), 3)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1))
    same, report = replace(model, "matmul")
    assert same is model and not report.replaced
    assert "a Conv2d [N, C, H, W] -> [N, C, H, W]" in report.left[0][1]
    assert "pixel_shuffle" in str(replace(model, "pixel_shuffle", label="pixel_shuffle")[1])


def test_a_model_that_is_one_conv_is_replaced_whole():
    model, report = replace(nn.Conv2d(8, 8, 3, padding=1), "grouped_conv2d")
    assert report.replaced[0][0] == "" and not isinstance(model, nn.Conv2d)


def test_the_replaced_resnet18_trains_saves_loads_compiles_and_exports(tmp_path):
    net, report = replace(small_resnet().train(), "grouped_conv2d")
    kdsl_weights = [f"{name}.weight" for name, _ in report.replaced]  # torch.nn's name for a layer's weight
    assert len(kdsl_weights) == 13 and set(kdsl_weights) <= {name for name, _ in net.named_parameters()}
    before = {name: p.detach().clone() for name, p in net.named_parameters()}
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    assert all(not torch.equal(before[name], p) for name, p in net.named_parameters() if name in kdsl_weights)

    net.eval()
    with torch.no_grad():
        expected = net(x)
    torch.save(net, tmp_path / "net.pt")
    loaded = torch.load(tmp_path / "net.pt", weights_only=False)
    torch.save(net.state_dict(), tmp_path / "state.pt")
    rebuilt, _ = replace(small_resnet(), "grouped_conv2d")
    rebuilt.load_state_dict(torch.load(tmp_path / "state.pt"))
    with torch.no_grad():
        assert torch.equal(loaded(x), expected)
        assert torch.equal(rebuilt.eval()(x), expected)

    # dynamo captures the whole network in one graph (aot_eager: no C compiler, seconds on a CPU)
    compiled = torch.compile(loaded, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-5)
    exported = torch.export.export(loaded, (x,))
    assert sum(name in kdsl_weights for name in exported.state_dict) == 13
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="inductor needs a C compiler")
def test_torch_compile_with_inductor_compiles_a_replaced_conv():
    torch.manual_seed(0)
    model, _ = replace(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()), "grouped_conv2d")
    x = torch.randn(2, 8, 6, 6)
    start = time.perf_counter()
    compiled = torch.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    assert time.perf_counter() - start < 300


def test_kdsl_nn_loads_lazily():
    assert kdsl.nn.replace is replace


# --------------------------------------------------------------------------------------------------
# torchvision's networks (optional: skipped when torchvision is not installed)


def _torchvision():
    return pytest.importorskip("torchvision", reason="torchvision is not installed (optional)")


def test_torchvision_resnet18_gets_the_13_stride_1_3x3_convs_replaced():
    models = _torchvision().models
    net, report = replace(models.resnet18(), gallery.load("grouped_conv2d"))
    check_resnet18_report(report)
    assert tuple(net(torch.randn(1, 3, 64, 64)).shape) == (1, 1000)


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "vgg16"])
def test_torchvision_networks_run_after_replacing(name):
    models = _torchvision().models
    net, report = replace(getattr(models, name)().eval(), "grouped_conv2d")
    assert report.replaced, str(report)
    with torch.no_grad():
        assert tuple(net(torch.randn(1, 3, 64, 64)).shape) == (1, 1000)
