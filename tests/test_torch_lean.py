"""The generated PyTorch modules are lean: an operator that is exactly one of PyTorch's functions
dispatches that function and at most a few free views (on a GPU at small sizes every extra aten
operator is a kernel launch or Python time as long as the kernel itself), search-found variants
(shuffled channel groups) lower to one convolution plus one copy, the forward runs no einops,
and gradients equal those of PyTorch's own function.

The PyTorch backend on branching kernels (kdsl.lang.operator.Operator): every node kind against the
NumPy reference in float64, gradients against finite differences, native pooling where a fold is
exactly one, stand-alone source, and the KdslErrors of bad layers and bad inputs.
"""

from __future__ import annotations

import ast

import graph_kernels as shared_kernels
import numpy as np
import pytest
from backends import backend
from helpers import assert_generated_source_runs_without_kdsl, assert_module_matches_reference

from kdsl import parse
from kdsl.lang import FC, Blend, Fold, Input, Map, Output, Product, Rename, Softmax, coefficient, primary
from kdsl.lang.errors import DivisibilityError, KdslError, ShapeError
from kdsl.lang.nonlinear import BLEND_KINDS, MAP_FUNCTIONS
from kdsl.lang.primitives import Reduce, Share, Shift, Split, Stride, Unfold, Weight

torch = backend("torch")

import torch.nn.functional as F  # noqa: E402
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
    """torch.views.rearrange_code against einops.rearrange itself on random groupings and orders."""
    einops = pytest.importorskip("einops")
    import numpy as np

    from kdsl.codegen.torch.views import rearrange_code

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


# --------------------------------------------------------------------------------------------------
# Branching operators
# --------------------------------------------------------------------------------------------------


N, C, H, W, R, P, D = primary("N C H W R P D")


K = coefficient("K")


IMAGE = {"N": 2, "C": 3, "H": 6, "W": 8, "R": 2}


SEQUENCE = {"N": 2, "C": 4, "P": 5, "D": 3}


def max_pool_3x3():
    # F.max_pool2d(x, 3, 1, 1): the windows' zero padding takes no part
    x = Input(N, C, H, W)
    graph = x >> Unfold(H, K, "kh") >> Unfold(W, K, "kw") >> Fold("kh", "kw") >> Output(N, C, H, W, defaults={"K": 3})
    return graph, IMAGE


def max_pool_3x3_stride_2():
    return shared_kernels.max_pool_3x3_stride_2(), IMAGE


def max_pool_2x2_split():
    x = Input(N, C, H, W)
    graph = x >> Split(H, 2, "ho", "kh") >> Split(W, 2, "wo", "kw") >> Fold("kh", "kw") >> Output(N, C, "ho", "wo")
    return graph, IMAGE


def max_pool_even_window():
    # an even window pads K//2 on the left and K//2 - 1 on the right: not F.max_pool1d's own padding
    x = Input(N, C, W)
    graph = x >> Unfold(W, 4, "k") >> Fold("k") >> Output(N, C, W)
    return graph, IMAGE


def min_pool_1d():
    x = Input(N, C, W)
    graph = x >> Unfold(W, 3, "k") >> Fold("k", how="min") >> Output(N, C, W)
    return graph, IMAGE


def min_pool_split():
    x = Input(N, C, H, W)
    graph = x >> Split(W, 2, "wo", "k") >> Fold("k", how="min") >> Output(N, C, H, "wo")
    return graph, IMAGE


def max_pool_3d():
    x = Input(N, C, R, H, W)
    graph = (
        x
        >> Unfold(R, 3, "kr")
        >> Unfold(H, 3, "kh")
        >> Stride(H, 3)
        >> Split(W, 4, "wo", "kw")
        >> Fold("kr", "kh", "kw")
        >> Output(N, C, R, H / 3, "wo")
    )
    return graph, {**IMAGE, "R": 4}


def dilated_max():
    # a Stride on the window (a dilation) is no F.max_pool1d here: the mask keeps the padding out
    x = Input(N, C, W)
    graph = x >> Unfold(W, 6, "k") >> Stride("k", 2) >> Fold("k") >> Output(N, C, W)
    return graph, IMAGE


def masked_max_of_weighted_windows():
    # not only views before the fold: the padding mask comes from the chain run on ones
    x = Input(N, C, H, W)
    graph = (
        x >> Unfold(H, 3, "kh") >> Share(Weight(C, "kh", name="taps")) >> Fold("kh", how="max") >> Output(N, C, H, W)
    )
    return graph, IMAGE


def masked_min_through_rename():
    # a Rename between the windowed chain and the fold moves no data: the chain's mask still applies
    x = Input(N, C, W)
    graph = x >> Unfold(W, 3, "k") >> Shift(C) >> Rename("k", "window") >> Fold("window", how="min") >> Output(N, C, W)
    return graph, IMAGE


def fold_without_windows():
    x = Input(N, C, H, W)
    graph = (x >> Fold(C, how="max")) + (x >> Fold(C, how="min")) >> Output(N, H, W)
    return graph, IMAGE


def residual_conv():
    return shared_kernels.residual_conv(), IMAGE


def squeeze_excitation():
    return shared_kernels.squeeze_excitation(), IMAGE


def attention():
    return shared_kernels.attention(), SEQUENCE


def attention_over_two_dims():
    # every position (H, W) attends over all positions (h2, w2): a softmax over two adjacent dims
    x = Input(N, C, H, W)
    q = x >> FC(C, name="d", size=R, weight="wq")
    k = x >> FC(C, name="d", size=R, weight="wk") >> Rename(H, "h2") >> Rename(W, "w2")
    v = x >> FC(C, name="c", size=C, weight="wv") >> Rename(H, "h2") >> Rename(W, "w2")
    scores = Product(q, k, "d") >> Softmax("h2", "w2")
    return Product(scores, v, "h2", "w2") >> Output(N, "c", H, W), {"N": 2, "C": 3, "H": 3, "W": 4, "R": 2}


def fc_over_two_trailing_dims():
    x = Input(N, C, H, W)
    return x >> FC(H, W, name="o", size=R) >> Map("tanh") >> Output(N, C, "o"), IMAGE


def fc_over_two_inner_dims():
    x = Input(N, C, H, W)
    return x >> FC(C, H, name="o", size=R) >> Output(N, "o", W), IMAGE


def map_kernel(fn):
    x = Input(N, C, W)
    step = Map(fn, by=-0.75) if fn == "scale" else Map(fn)
    return x >> Shift(W) >> step >> Output(N, C, W), IMAGE


def blend_kernel(how, larger_left):
    # the branch without W broadcasts over it, whichever side it is on
    x = Input(N, C, W)
    small = x >> Reduce(W, mean=True)
    graph = Blend(how, x, small) if larger_left else Blend(how, small, x)
    return graph >> Output(N, C, W), IMAGE


def product_by_names():
    x = Input(N, C, W)
    return Product(x, x >> Rename(W, "V") >> Map("sin"), "C") >> Output(N, W, "V"), IMAGE


BRANCHING_KERNELS = {
    "max_pool_3x3": max_pool_3x3,
    "max_pool_3x3_stride_2": max_pool_3x3_stride_2,
    "max_pool_2x2_split": max_pool_2x2_split,
    "max_pool_even_window": max_pool_even_window,
    "min_pool_1d": min_pool_1d,
    "min_pool_split": min_pool_split,
    "max_pool_3d": max_pool_3d,
    "dilated_max": dilated_max,
    "masked_max_of_weighted_windows": masked_max_of_weighted_windows,
    "masked_min_through_rename": masked_min_through_rename,
    "fold_without_windows": fold_without_windows,
    "residual_conv": residual_conv,
    "squeeze_excitation": squeeze_excitation,
    "attention": attention,
    "attention_over_two_dims": attention_over_two_dims,
    "fc_over_two_trailing_dims": fc_over_two_trailing_dims,
    "fc_over_two_inner_dims": fc_over_two_inner_dims,
    "product_by_names": product_by_names,
    **{f"map_{fn}": (lambda fn=fn: map_kernel(fn)) for fn in MAP_FUNCTIONS},
    **{
        f"blend_{how}_{'left' if left else 'right'}_larger": (lambda how=how, left=left: blend_kernel(how, left))
        for how in BLEND_KINDS
        for left in (True, False)
    },
}


def distinct_inputs(graph, layer, seed=0):
    """A random permutation of distinct values as the input (no ties in max/min), normal weights."""
    shapes = reference.shapes(graph, layer)
    rng = np.random.default_rng(seed)
    size = int(np.prod(shapes.input))
    x = (rng.permutation(size) / size * 4 - 2).reshape(shapes.input)
    weights = [rng.standard_normal(shape) for shape in shapes.weights]
    return x, weights


def forward_source(graph, layer):
    """The generated forward method's text (the helpers above it are the same in every module)."""
    text = kdsl_torch.source(graph, layer)
    assert "    def forward(self, x):" in text
    return text.split("    def forward(self, x):")[1]


def torch_run(graph, layer, x, weights):
    module = kdsl_torch.build(graph, layer).double()
    with torch.no_grad():
        for parameter, value in zip(module.weights, weights):
            parameter.copy_(torch.from_numpy(value))
        return module(torch.from_numpy(x)).numpy()


def assert_matches_reference(graph, layer, seed=0):
    x, weights = distinct_inputs(graph, layer, seed)
    expected = reference.run(graph, layer, x, weights)
    got = torch_run(graph, layer, x, weights)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_the_kernels_are_branching_graphs_that_cover_every_node_kind():
    kinds = set()
    for make in BRANCHING_KERNELS.values():
        graph, _ = make()
        assert not graph.is_linear
        kinds.update(node.kind for node in graph.nodes)
    assert kinds == {"Input"} | set(reference.GRAPH_RULES)


def test_graph_rules_has_one_rule_per_node_kind_of_the_reference():
    assert set(kdsl_torch.GRAPH_RULES) == set(reference.GRAPH_RULES)


@pytest.mark.parametrize("name", sorted(BRANCHING_KERNELS))
def test_torch_matches_the_reference(name):
    graph, layer = BRANCHING_KERNELS[name]()
    assert_matches_reference(graph, layer)


@pytest.mark.parametrize("name", sorted(BRANCHING_KERNELS))
def test_parsed_dsl_text_gives_the_same_source(name):
    graph, layer = BRANCHING_KERNELS[name]()
    assert kdsl_torch.source(parse(graph.to_dsl()), layer) == kdsl_torch.source(graph, layer)


@pytest.mark.parametrize(
    ("name", "native"),
    [
        ("max_pool_3x3", lambda x: F.max_pool2d(x, 3, 1, 1)),
        ("max_pool_3x3_stride_2", lambda x: F.max_pool2d(x, 3, 2, 1)),
        ("max_pool_2x2_split", lambda x: F.max_pool2d(x, 2, 2)),
        ("min_pool_1d", lambda x: -F.max_pool1d(-x, 3, 1, 1)),
        ("max_pool_3d", lambda x: F.max_pool3d(x, (3, 3, 4), (1, 3, 4), (1, 1, 0))),
    ],
)
def test_pooling_folds_lower_to_max_pool_and_equal_torch(name, native):
    graph, layer = BRANCHING_KERNELS[name]()
    text = forward_source(graph, layer)
    assert "_pool(" in text and "_masked_fold(" not in text and "_unfold(" not in text
    x, weights = distinct_inputs(graph, layer)
    expected = native(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(torch_run(graph, layer, x, weights), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", ["masked_max_of_weighted_windows", "masked_min_through_rename", "dilated_max"])
def test_other_windowed_folds_use_the_padding_mask(name):
    graph, layer = BRANCHING_KERNELS[name]()
    assert "_masked_fold(" in forward_source(graph, layer) and "torch.no_grad()" in forward_source(graph, layer)
    text = kdsl_torch.source(graph, layer)
    # the mask matters here: a plain max/min over the zero-padded windows differs at the borders
    x, weights = distinct_inputs(graph, layer)
    plain = text.replace("_masked_fold(", "_plain_fold(")
    namespace: dict = {}
    exec(compile(plain, "<plain>", "exec"), namespace)
    namespace["_plain_fold"] = lambda t, mask, dims, how: (torch.amax if how == "max" else torch.amin)(t, dim=dims)
    module = namespace["KdslOperator"](**{v.name: reference.binding(graph, layer)[v.name] for v in graph.variables})
    module = module.double()
    with torch.no_grad():
        for parameter, value in zip(module.weights, weights):
            parameter.copy_(torch.from_numpy(value))
        unmasked = module(torch.from_numpy(x)).numpy()
    assert not np.allclose(unmasked, reference.run(graph, layer, x, weights))


def test_a_chain_read_by_a_pooling_and_by_another_branch_is_computed_once_for_the_other():
    x = Input(N, C, W)
    windows = x >> Unfold(W, 3, "k")
    graph = (windows >> Fold("k")) + (windows >> Reduce("k")) >> Output(N, C, W)
    text = forward_source(graph, IMAGE)
    assert text.count("_unfold(x") == 1 and "_pool(x" in text
    assert_matches_reference(graph, IMAGE)


GRADIENT_KERNELS = [
    "max_pool_3x3",
    "max_pool_even_window",
    "min_pool_split",
    "masked_max_of_weighted_windows",
    "squeeze_excitation",
    "attention_over_two_dims",
    "blend_max_right_larger",
    "fc_over_two_inner_dims",
    "map_gelu",
]


@pytest.mark.parametrize("name", GRADIENT_KERNELS)
def test_gradients_match_finite_differences(name):
    graph, layer = BRANCHING_KERNELS[name]()
    layer = {**layer, "N": 1}
    x, weights = distinct_inputs(graph, layer, seed=3)
    module = kdsl_torch.build(graph, layer).double()
    names = [n for n, _ in module.named_parameters()]

    def forward(data, *parameters):
        return torch.func.functional_call(module, dict(zip(names, parameters)), (data,))

    tensors = [torch.from_numpy(x).requires_grad_()] + [torch.from_numpy(w).requires_grad_() for w in weights]
    assert torch.autograd.gradcheck(forward, tuple(tensors), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_weights_follow_graph_order_with_reference_shapes_and_fan_in_init():
    graph, layer = attention()
    module = kdsl_torch.build(graph, layer)
    shapes = reference.shapes(graph, layer).weights
    assert [tuple(w.shape) for w in module.weights] == list(shapes)
    assert [w.name for w in graph.weights] == ["wq", "wk", "wv"]
    bound = 1 / np.sqrt(SEQUENCE["C"])  # every FC weight here has fan-in C
    assert all(0 < float(w.detach().abs().max()) <= bound for w in module.weights)


def test_forward_returns_the_declared_output_order():
    graph, layer = attention()  # the last Product gives [N, P, c]; the output is [N, c, P]
    assert [d.name for d in graph.nodes[-1].dims] != [d.name for d in graph.outputs]
    x, weights = distinct_inputs(graph, layer)
    assert torch_run(graph, layer, x, weights).shape == reference.shapes(graph, layer).output


def test_any_batch_size_runs_like_the_operators_modules():
    graph, layer = squeeze_excitation()
    module = kdsl_torch.build(graph, layer).double()
    bigger = {**layer, "N": 5}
    x, weights = distinct_inputs(graph, bigger)
    assert_module_matches_reference(module, graph, bigger, x, weights, rtol=1e-10, atol=1e-12)


def test_a_padding_mask_is_computed_once_per_input_shape():
    graph, layer = masked_max_of_weighted_windows()
    module = kdsl_torch.build(graph, layer).double()
    for batch in (2, 2, 5):  # the second call reuses the mask; a new batch size gets a new one
        sizes = {**layer, "N": batch}
        x, weights = distinct_inputs(graph, sizes)
        assert_module_matches_reference(module, graph, sizes, x, weights, rtol=1e-10, atol=1e-12)
        (mask,) = module.masks.values()
        assert mask.dtype == torch.bool and mask.shape[0] == batch and not bool(mask.all())


@pytest.mark.parametrize("shape", [(2, 3, 6), (2, 3, 6, 9), (2, 3, 5, 8), (6,)])
def test_bad_inputs_raise_shape_error(shape):
    graph, layer = residual_conv()  # N is free (any batch); the others are fixed
    module = kdsl_torch.build(graph, layer)
    with pytest.raises(ShapeError, match=r"the input must have shape \[N, C=3, H=6, W=8\]"):
        module(torch.zeros(shape))


def test_a_layer_that_does_not_divide_raises_the_references_error():
    graph, _ = max_pool_3x3_stride_2()
    layer = {**IMAGE, "H": 7}
    with pytest.raises(DivisibilityError) as expected:
        reference.shapes(graph, layer)
    with pytest.raises(DivisibilityError):
        kdsl_torch.build(graph, layer)
    assert isinstance(expected.value, KdslError)


def test_an_fc_size_that_is_not_an_integer_raises_divisibility_error():
    x = Input(N, C)
    graph = (x + (x >> FC(C, name="h", size=C / 2) >> FC("h", name="C", size=C))) >> Output(N, C)
    with pytest.raises(DivisibilityError):
        reference.shapes(graph, {"N": 2, "C": 3})
    with pytest.raises(DivisibilityError, match=r"\(C=3\): node 1 FC\(C -> h: C/2\): the FC output dim h: C/2 = 3/2"):
        kdsl_torch.build(graph, {"N": 2, "C": 3})
    assert_matches_reference(graph, {"N": 2, "C": 4})


def test_size_variables_named_like_the_forwards_own_variables_are_renamed():
    x2, ones, mask3 = primary("x2 ones mask3")  # the forward uses x2 (node 2) and ones (the mask's weights)
    x = Input(x2, ones, mask3)
    graph = x >> Unfold(mask3, 3, "k") >> Share(Weight(ones, "k", name="w")) >> Fold("k") >> Output(x2, ones, mask3)
    layer = {"x2": 2, "ones": 3, "mask3": 5}
    text = kdsl_torch.source(graph, layer)
    assert "ones -> ones_, x2 -> x2_" in text and "mask3 ->" not in text  # three nodes: mask0 to mask2
    assert_matches_reference(graph, layer)


def forward_names(code: str) -> set[str]:
    """Every name the generated forward binds or reads."""
    tree = ast.parse(code)
    (forward,) = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "forward"]
    names = {node.id for stmt in forward.body for node in ast.walk(stmt) if isinstance(node, ast.Name)}
    assert "x" in names and "self" in names
    return names


@pytest.mark.parametrize("name", ["masked_max_of_weighted_windows", "max_pool_3d", "attention", "residual_conv"])
def test_graph_forwards_use_only_own_names_and_size_variables(name):
    graph, _ = BRANCHING_KERNELS[name]()
    names = forward_names(kdsl_torch.source(graph))
    variables = {v.name for v in graph.variables}
    assert names - variables <= kdsl_torch.OWN_NAMES | kdsl_torch.own_names(graph)


@pytest.mark.parametrize("name", ["x1", "x2", "x3", "x4", "ones", "mask2", "mask3", "w", "weights", "F", "torch"])
def test_a_variable_named_like_a_graph_forwards_own_names_cannot_break_it(name):
    V = primary(name)
    x = Input(N, V, W)
    windows = x >> Unfold(W, 3, "k") >> Share(Weight(V, "k", name="taps")) >> Fold("k")
    graph = (x + windows) >> Map("relu") >> Output(N, V, W)
    layer = {"N": 2, name: 3, "W": 5}
    assert_matches_reference(graph, layer)
    assert kdsl_torch.build(graph, layer).sizes[name] == 3


@pytest.mark.parametrize("name", ["max_pool_3x3", "masked_min_through_rename", "squeeze_excitation", "attention"])
def test_generated_source_runs_without_kdsl(tmp_path, name):
    graph, layer = BRANCHING_KERNELS[name]()
    x, weights = distinct_inputs(graph, layer, seed=1)
    assert_generated_source_runs_without_kdsl(tmp_path, graph, layer, reference.binding(graph, layer), x, weights)
