"""Generated PyTorch modules behave like torch.nn ones: a network containing one trains, pickles,
deep-copies, saves and loads whole (in this process and a fresh one), compiles with torch.compile
and exports with torch.export; parameters carry the DSL's weight names; initialisation uses the
fan-in PyTorch uses for the equivalent layer; sizes no weight needs are read from the input."""

from __future__ import annotations

import copy
import gc
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from kdsl import gallery
from kdsl.codegen import reference
from kdsl.codegen import torch as kdsl_torch
from kdsl.codegen.torch import module_class
from kdsl.lang import Input, Output, Reduce, Share, Weight, primary
from kdsl.lang.errors import DivisibilityError, LayerError, ShapeError

DWS = {"Cin": 4, "Cout": 8}


def small_network(seed: int = 0) -> nn.Module:
    """A depthwise separable kdsl conv (N, H, W read from the input) in a tiny classifier."""
    torch.manual_seed(seed)
    conv = kdsl_torch.build(gallery.load("depthwise_separable_conv2d"), DWS, bias=True)
    return nn.Sequential(conv, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))


def train(net: nn.Module, steps: int = 5) -> list[float]:
    """A few SGD steps on fixed random data; the losses, first to last."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 4, 6, 6, generator=generator)
    labels = torch.randint(0, 3, (16,), generator=generator)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(net(x), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses)), losses
    return losses


def test_a_trained_network_saves_reloads_and_compiles_to_the_same_outputs(tmp_path):
    net = small_network()
    before = {name: p.detach().clone() for name, p in net.named_parameters()}
    losses = train(net)
    assert losses[-1] < losses[0], losses
    assert all(not torch.equal(before[name], p) for name, p in net.named_parameters()), "some weight did not train"
    x = torch.randn(2, 4, 5, 7)
    with torch.no_grad():
        expected = net(x)

    torch.save(net, tmp_path / "net.pt")
    loaded = torch.load(tmp_path / "net.pt", weights_only=False)
    with torch.no_grad():
        assert torch.equal(loaded(x), expected)
    assert list(loaded.state_dict()) == list(net.state_dict())

    # a fresh process: the class is regenerated from the pickled DSL text
    torch.save({"x": x, "expected": expected}, tmp_path / "data.pt")
    script = textwrap.dedent(
        f"""
        import torch
        net = torch.load({str(tmp_path / "net.pt")!r}, weights_only=False)
        data = torch.load({str(tmp_path / "data.pt")!r})
        with torch.no_grad():
            assert torch.equal(net(data["x"]), data["expected"]), "outputs differ"
        print(type(net[0]).__module__.split("_")[1], list(net[0].state_dict()))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "generated ['depthwise', 'pointwise', 'bias']", result.stdout

    compiled = torch.compile(loaded, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-6)


def test_torch_export_exports_a_network_containing_a_kdsl_module():
    net = small_network()
    x = torch.randn(2, 4, 5, 7)
    exported = torch.export.export(net, (x,))
    assert any(name.endswith("depthwise") for name in exported.state_dict)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x), net(x), rtol=1e-5, atol=1e-6)


def test_state_dict_keys_are_the_dsl_weight_names():
    op = gallery.load("depthwise_separable_conv2d")
    module = kdsl_torch.build(op, DWS)
    assert list(module.state_dict()) == ["depthwise", "pointwise"]
    assert [name for name, _ in module.named_parameters()] == ["depthwise", "pointwise"]
    assert module.weights == [module.depthwise, module.pointwise]
    assert tuple(module.depthwise.shape) == (4, 3, 3) and tuple(module.pointwise.shape) == (8, 4)
    other = kdsl_torch.build(op, DWS)
    other.load_state_dict(module.state_dict())
    x = torch.randn(2, 4, 5, 5)
    assert torch.equal(other(x), module(x))


def _same_module(copied: nn.Module, original: nn.Module, x: torch.Tensor) -> None:
    assert type(copied) is type(original)
    assert list(copied.state_dict()) == list(original.state_dict())
    for (name, a), (_, b) in zip(copied.named_parameters(), original.named_parameters(), strict=True):
        assert a is not b and torch.equal(a, b), name
    with torch.no_grad():
        assert torch.equal(copied(x), original(x))
    assert copied.kdsl_source == original.kdsl_source and repr(copied) == repr(original)


@pytest.mark.parametrize(
    ("name", "layer", "pad", "shape"),
    [
        ("depthwise_separable_conv2d", DWS, False, (2, 4, 5, 5)),
        ("grouped_conv2d", {"N": 1, "Cin": 6, "Cout": 6, "H": 5, "W": 5, "G": 4}, True, (1, 6, 5, 5)),
        ("squeeze_excitation", {"N": 2, "Cin": 32, "H": 4, "W": 4}, False, (2, 32, 4, 4)),
    ],
)
def test_pickle_and_deepcopy_rebuild_the_module_without_touching_the_random_state(name, layer, pad, shape):
    module = kdsl_torch.build(gallery.load(name), layer, pad=pad)
    x = torch.randn(shape)
    state = torch.get_rng_state()
    restored = pickle.loads(pickle.dumps(module))
    duplicate = copy.deepcopy(module)
    assert torch.equal(torch.get_rng_state(), state), "restoring a module initialised weights"
    _same_module(restored, module, x)
    _same_module(duplicate, module, x)
    assert (restored.padding is None) == (not pad)
    with torch.no_grad():
        duplicate.weights[0].add_(1.0)
    assert not torch.equal(duplicate.weights[0], module.weights[0])


#: Gallery convolutions and the PyTorch layers they equal (on [N, C, H, W] input, C = 32).
CONV_FAMILY = {
    "conv2d": ({"Cin": 32, "Cout": 32}, lambda: nn.Conv2d(32, 32, 3, padding=1, bias=False)),
    "depthwise_conv2d": ({"Cin": 32}, lambda: nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False)),
    "depthwise_separable_conv2d": (
        {"Cin": 32, "Cout": 32},
        lambda: nn.Sequential(nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False), nn.Conv2d(32, 32, 1, bias=False)),
    ),
    "grouped_conv2d": ({"Cin": 32, "Cout": 32, "G": 4}, lambda: nn.Conv2d(32, 32, 3, padding=1, groups=4, bias=False)),
    "pointwise_conv2d": ({"Cin": 32, "Cout": 32}, lambda: nn.Conv2d(32, 32, 1, bias=False)),
    "dilated_conv2d": ({"Cin": 32, "Cout": 32}, lambda: nn.Conv2d(32, 32, 3, padding=2, dilation=2, bias=False)),
    "strided_conv2d": ({"Cin": 32, "Cout": 32}, lambda: nn.Conv2d(32, 32, 3, stride=2, padding=1, bias=False)),
    "conv2d_kx1_1xk": (
        {"Cin": 32, "Cout": 32},
        lambda: nn.Sequential(
            nn.Conv2d(32, 32, (3, 1), padding=(1, 0), bias=False), nn.Conv2d(32, 32, (1, 3), padding=(0, 1), bias=False)
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(CONV_FAMILY))
def test_fan_ins_are_pytorchs_for_the_equivalent_layers(name):
    layer, make = CONV_FAMILY[name]
    op = gallery.load(name)
    binding = {**op.default_coefficients, **layer}
    ours = [int(f.evaluate(binding)) for f in kdsl_torch.fan_ins(op)]
    theirs = [nn.init._calculate_fan_in_and_fan_out(p)[0] for p in make().parameters()]
    assert ours == theirs


@pytest.mark.parametrize("name", sorted(CONV_FAMILY))
def test_initial_output_std_is_within_20_percent_of_the_equivalent_pytorch_layers(name):
    layer, make = CONV_FAMILY[name]
    x = torch.randn(16, 32, 16, 16, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    ours = kdsl_torch.build(gallery.load(name), layer)
    torch.manual_seed(2)
    theirs = make()
    with torch.no_grad():
        ours_out, theirs_out = ours(x), theirs(x)
    assert ours_out.shape == theirs_out.shape
    ratio = float(ours_out.std() / theirs_out.std())
    assert 0.8 <= ratio <= 1.2, (
        f"{name}: output std {float(ours_out.std()):.3f} vs PyTorch's {float(theirs_out.std()):.3f}"
    )


def test_sizes_no_weight_needs_are_read_from_the_input_at_each_call():
    op = gallery.load("conv2d")
    lazy = kdsl_torch.build(op, {"Cin": 4, "Cout": 6})
    assert lazy.sizes == {"Cin": 4, "Cout": 6, "H": None, "N": None, "W": None, "K": 3}
    for shape in [(2, 4, 5, 7), (3, 4, 9, 4)]:
        x = torch.randn(shape, dtype=torch.float64)
        layer = {"N": shape[0], "Cin": 4, "Cout": 6, "H": shape[2], "W": shape[3]}
        full = kdsl_torch.build(op, layer).double()
        full.load_state_dict(lazy.state_dict())
        with torch.no_grad():
            got = lazy.double()(x)
            assert torch.equal(got, full(x))
        weights = [w.detach().numpy() for w in lazy.weights]
        np.testing.assert_allclose(got.numpy(), reference.run(op, layer, x.numpy(), weights), rtol=1e-10, atol=1e-12)
    with pytest.raises(ShapeError, match=r"Cin=4"):
        lazy(torch.zeros(2, 5, 5, 5, dtype=torch.float64))


def test_a_size_that_does_not_divide_is_a_shape_error_at_the_call():
    module = kdsl_torch.build(gallery.load("strided_conv2d"), {"Cin": 4, "Cout": 4})
    assert module(torch.zeros(1, 4, 8, 6)).shape == (1, 4, 4, 3)
    with pytest.raises(ShapeError, match=r"H/s.*H=7, s=2.*\[1, 4, 7, 6\]"):
        module(torch.zeros(1, 4, 7, 6))


def test_a_missing_size_a_weight_needs_is_a_layer_error_naming_it():
    with pytest.raises(LayerError, match=r"does not give the size Cout: the weight pointwise\[Cout, Cin\] needs it"):
        kdsl_torch.build(gallery.load("depthwise_separable_conv2d"), {"Cin": 4})
    with pytest.raises(DivisibilityError, match=r"Cin=6"):
        kdsl_torch.build(gallery.load("grouped_conv2d"), {"Cin": 6, "Cout": 8, "G": 4})


def test_bias_is_one_value_per_output_channel_initialised_like_pytorchs():
    op = gallery.load("depthwise_separable_conv2d")
    torch.manual_seed(0)
    plain = kdsl_torch.build(op, {"Cin": 16, "Cout": 64})
    torch.manual_seed(0)
    biased = kdsl_torch.build(op, {"Cin": 16, "Cout": 64}, bias=True)
    assert list(biased.state_dict()) == ["depthwise", "pointwise", "bias"] and plain.bias is None
    assert tuple(biased.bias.shape) == (64,)
    bound = 1 / np.sqrt(16)  # the pointwise weight's fan-in, as nn.Conv2d's bias uses its weight's
    largest = float(biased.bias.detach().abs().max())
    assert 0.8 * bound <= largest <= bound
    plain.load_state_dict({k: v for k, v in biased.state_dict().items() if k != "bias"})
    x = torch.randn(2, 16, 3, 3)
    with torch.no_grad():
        torch.testing.assert_close(biased(x), plain(x) + biased.bias[:, None, None])


def test_repr_is_one_short_line_of_the_sizes_and_the_operator_is_an_attribute():
    module = kdsl_torch.build(gallery.load("depthwise_separable_conv2d"), DWS, bias=True)
    assert repr(module) == "DepthwiseSeparableConv2d(Cin=4, Cout=8, K=3, bias=True)"
    assert "Share(depthwise) >> Reduce(kh) >> Reduce(kw) >> Share(pointwise) >> Reduce(Cin)" in module.operator


@pytest.mark.parametrize("weight", ["training", "weights", "bias", "forward", "sizes", "state_dict"])
def test_a_weight_named_like_a_module_attribute_gets_another_one(weight):
    N, Cin, Cout = primary("N Cin Cout")
    scale = Weight(Cin, name="scale")  # two weights: each keeps its DSL name where it is free
    op = Input(N, Cin) >> Share(scale) >> Share(Weight(Cout, Cin, name=weight)) >> Reduce(Cin) >> Output(N, Cout)
    layer = {"N": 2, "Cin": 3, "Cout": 4}
    module = kdsl_torch.build(op, layer, bias=True).double()
    assert list(module.state_dict()) == ["scale", weight + "_", "bias"]
    assert f"{weight} -> {weight}_" in module.kdsl_source
    x = np.random.default_rng(0).standard_normal((2, 3))
    weights = [w.detach().numpy() for w in module.weights]
    expected = reference.run(op, layer, x, weights) + module.bias.detach().numpy()
    with torch.no_grad():
        np.testing.assert_allclose(module(torch.from_numpy(x)).numpy(), expected, rtol=1e-12)
    assert module.training is True and module.eval().training is False


def test_reserved_attributes_cover_every_nn_module_attribute():
    public = {n for n in dir(nn.Module) if not n.startswith("_")} | {
        n for n in vars(nn.Module()) if not n.startswith("_")
    }
    assert public <= kdsl_torch.NN_MODULE_ATTRIBUTES


def test_generated_classes_do_not_pile_up_in_sys_modules(monkeypatch):
    monkeypatch.setattr(module_class, "CACHED_CLASSES", 2)  # where build reads it
    op = gallery.load("pointwise_conv2d")
    kept = kdsl_torch.build(op, {"Cin": 2, "Cout": 3})
    names = set()
    for cout in range(4, 9):  # five more classes: the cache holds two
        module = kdsl_torch.build(op, {"Cin": 2, "Cout": cout})
        names.add(type(module).__module__)
        del module
    gc.collect()
    kdsl_torch.build(op, {"Cin": 2, "Cout": 9})  # past the limit: unused ones are unregistered
    assert type(kept).__module__ in sys.modules, "a live module's class must stay importable"
    assert sum(name in sys.modules for name in names) <= 2
    restored = pickle.loads(pickle.dumps(kept))  # an unregistered class is made again on demand
    assert restored.weights[0].shape == (3, 2) and type(restored).__module__ in sys.modules
