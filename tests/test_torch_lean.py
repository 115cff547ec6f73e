"""The generated PyTorch modules are lean: an operator that is exactly one of PyTorch's functions
dispatches that function and at most a few free views (on a GPU at small sizes every extra aten
operator is a kernel launch or Python time as long as the kernel itself), search-found variants
(shuffled channel groups) lower to one convolution plus one copy, the forward runs no einops,
and gradients equal those of PyTorch's own function."""

from __future__ import annotations

import pytest
from backends import backend

torch = backend("torch")

from graph_kernels import interleaved_grouped  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.bench.overhead import VIEW_OPS, count_aten_ops, tiny_binding  # noqa: E402
from kdsl.codegen import reference  # noqa: E402
from kdsl.codegen import torch as kdsl_torch  # noqa: E402
from kdsl.codegen.native import NATIVE  # noqa: E402

#: operator -> the aten operators (by name, views left out) its forward may run at the tiny binding;
#: every one that PyTorch's own function runs, and for a few a copy or a pad more (said why).
KERNELS: dict[str, list[str]] = {
    "conv1d": ["convolution"],
    "conv2d": ["convolution"],
    "pointwise_conv2d": ["convolution"],
    "depthwise_conv2d": ["convolution"],
    "grouped_conv2d": ["convolution"],
    "dilated_conv2d": ["convolution"],
    "strided_conv2d": ["convolution"],  # its asymmetric padding folds into the convolution's own
    "depthwise_separable_conv2d": ["convolution", "convolution"],
    "conv2d_kx1_1xk": ["convolution", "convolution"],
    "shift_conv2d": ["convolution", "roll"],  # both shifts in one roll
    "avg_pool2d": ["avg_pool2d"],
    "max_pool2d": ["max_pool2d_with_indices"],
    "max_pool2d_2x2": ["max_pool2d_with_indices"],
    "pixel_shuffle": ["pixel_shuffle"],  # found from the rearrangement's pattern
    "pixel_unshuffle": ["pixel_unshuffle"],
    "unfold2d": ["im2col"],  # F.unfold itself (odd windows)
    "linear": ["mm"],
    "matmul": ["mm"],
    "residual_conv2d": ["convolution", "add"],
    "shift_add": ["convolution", "roll", "add"],
    "squeeze_excitation": ["mean", "mm", "relu", "mm", "sigmoid", "mul"],
    "canvas_resnet34": ["roll", "add", "convolution", "convolution", "add"],
}

#: at most this many views around the kernels (reshape, permute, unsqueeze: no data moves)
MAX_VIEWS = 4


def _kernels(counts):
    names = []
    for op, count in counts.items():
        name = op.split(".")[1]
        if name not in VIEW_OPS and name != "lift_fresh":
            names += [name] * count
    return sorted(names)


def _views(counts):
    return sum(count for op, count in counts.items() if op.split(".")[1] in VIEW_OPS)


def _module_and_input(op, binding, seed=0):
    module = kdsl_torch.build(op, binding).double()
    x, weights = reference.random_inputs(op, binding, seed=seed)
    with torch.no_grad():
        for parameter, value in zip(module.weights, weights):
            parameter.copy_(torch.from_numpy(value))
    return module, torch.from_numpy(x), x, weights


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_native_equivalent_operators_dispatch_only_the_native_kernels(name):
    op = gallery.load(name)
    module, x, _, _ = _module_and_input(op, tiny_binding(op))
    with torch.no_grad():
        counts = count_aten_ops(lambda: module(x))
    assert _kernels(counts) == sorted(KERNELS[name]), counts
    assert _views(counts) <= MAX_VIEWS, counts


def test_the_table_covers_every_native_operator_but_the_product_kernels():
    # involution and attention multiply two data branches: einsum's permutes are views around bmm
    assert set(NATIVE) - set(KERNELS) == {"involution", "spatial_attention"}


@pytest.mark.parametrize("name", sorted(set(NATIVE) & set(gallery.names())))
def test_no_einops_in_the_forward(name):
    """einops parses its pattern on every call: the forward spells views as reshape/permute."""
    op = gallery.load(name)
    text = kdsl_torch.source(op, tiny_binding(op))
    forward = text[text.index("    def forward") :]
    assert "rearrange(" not in forward and " einsum(" not in forward and "reduce(" not in forward


SHUFFLED = {
    "input channels shuffled": interleaved_grouped(True, False),
    "output channels shuffled": interleaved_grouped(False, True),
}


@pytest.mark.parametrize("label", sorted(SHUFFLED))
def test_a_grouped_conv_with_shuffled_channels_is_one_conv_and_one_copy(label):
    op = SHUFFLED[label]
    layer = {"N": 2, "Cin": 8, "Cout": 12, "H": 5, "W": 6}
    module, x, x_array, weights = _module_and_input(op, layer, seed=1)
    with torch.no_grad():
        counts = count_aten_ops(lambda: module(x))
        got = module(x).numpy()
    assert _kernels(counts) == ["clone", "convolution"], counts  # the channel shuffle's copy
    assert _views(counts) <= MAX_VIEWS, counts
    expected = reference.run(op, layer, x_array, weights)
    assert abs(got - expected).max() < 1e-10


@pytest.mark.parametrize("name", sorted(set(NATIVE) & set(gallery.names())))
def test_gradients_equal_the_native_functions(name):
    """d(sum(out * R)) by the input and every weight, through the module and through PyTorch's own
    function given the same weights (its ``prepare`` re-lays them out differentiably), float64."""
    op = gallery.load(name)
    binding = tiny_binding(op)
    module, x, _, _ = _module_and_input(op, binding, seed=2)
    ours_x = x.clone().requires_grad_(True)
    out = module(ours_x)
    probe = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    (out * probe).sum().backward()
    leaves = [w.detach().clone().requires_grad_(True) for w in module.weights]
    native_x = x.clone().requires_grad_(True)
    prepare, call = NATIVE[name]
    (call(native_x, prepare(leaves, binding), binding) * probe).sum().backward()
    torch.testing.assert_close(ours_x.grad, native_x.grad, rtol=1e-9, atol=1e-11)
    for parameter, leaf in zip(module.weights, leaves):
        torch.testing.assert_close(parameter.grad, leaf.grad, rtol=1e-9, atol=1e-11)


def _random_grouping(rng, names):
    """``names`` cut into consecutive groups, each written with parentheses or (alone) without."""
    groups, at = [], 0
    while at < len(names):
        take = int(rng.integers(1, len(names) - at + 1))
        groups.append(names[at : at + take])
        at += take
    return groups


def _pattern(groups, bare):
    return " ".join(g[0] if len(g) == 1 and bare else "(" + " ".join(g) + ")" for g in groups)


@pytest.mark.parametrize("seed", range(60))
def test_rearrange_code_does_what_einops_does(seed):
    """torch_views.rearrange_code against einops.rearrange itself on random groupings and orders."""
    einops = pytest.importorskip("einops")
    import numpy as np

    from kdsl.codegen.torch_views import rearrange_code

    rng = np.random.default_rng(seed)
    names = ["a", "b", "c", "d", "e"][: int(rng.integers(1, 6))]
    sizes = {n: int(rng.integers(1, 4)) for n in names}
    source = _random_grouping(rng, list(rng.permutation(names)))
    target = _random_grouping(rng, list(rng.permutation(names)))
    lengths = {}
    for group in source:  # einops needs all but one length of a group; give some more at random
        for name in group[1:] if len(group) > 1 else []:
            lengths[name] = str(sizes[name])
        if rng.random() < 0.3:
            lengths[group[0]] = str(sizes[group[0]])
    bare = bool(rng.random() < 0.5)
    source_text, target_text = _pattern(source, bare), _pattern(target, not bare)
    shape = [int(np.prod([sizes[n] for n in g])) for g in source]
    x = torch.arange(int(np.prod(shape))).reshape(shape)
    code = rearrange_code("x", source_text, target_text, lengths)
    got = x if code is None else eval(code, {"torch": torch, "F": torch.nn.functional, "x": x})
    expected = einops.rearrange(x, f"{source_text} -> {target_text}", **{k: int(v) for k, v in lengths.items()})
    assert torch.equal(got, expected), (source_text, target_text, lengths, code)
