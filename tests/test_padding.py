"""Padding (kdsl.solve.padding): sizes that do not divide a layer are rounded up, per layer, when
asked (pad=True), and every backend runs the padded operator the same way: zero-pad the input at
the end of each padded dim, run at the padded binding, crop each output dim.

Backends are chosen with ``KDSL_TEST_BACKENDS`` (default ``reference,torch,tvm``); a requested
backend that cannot be loaded fails the run instead of being skipped.

Tolerances: float64 throughout; the backends sum the same products in other orders (einsum,
native convolutions, TVM's loops), so they agree to rounding: 1e-10 relative to the largest
magnitude of the expected output is far above the few ulps per term of these short sums.
"""

from __future__ import annotations

import itertools
import re

import backends
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from graph_kernels import max_pool_3x3_stride_2
from hypothesis import given
from hypothesis import strategies as st

from kdsl import solve
from kdsl.cli import main
from kdsl.codegen import reference
from kdsl.codegen import torch as kdsl_torch
from kdsl.lang import Input, Map, Output, coefficient, library, primary
from kdsl.lang.errors import DivisibilityError, KdslError
from kdsl.lang.parser import parse
from kdsl.lang.primitives import Dim, Merge, Reduce, Share, Split, Unfold, Weight
from kdsl.search.analytic import evaluate
from kdsl.search.space import Space

BACKENDS = backends.listed()
# torch builds the expected values of the conv tests (F.conv2d), so it is imported whatever the
# backends; a requested TVM that fails to import fails here, at collection, on purpose
if "tvm" in BACKENDS:
    kdsl_tvm = backends.codegen("tvm")
    from kdsl.codegen.tvm.kernel import PaddedKernel

TOLERANCE = 1e-10
RESNET18 = {layer.name: layer for layer in solve.load_layers("resnet18")}
GROUPED = library.load("grouped_conv2d")
STRIDED = library.load("strided_conv2d")

N, C, L, H, W = primary("N C L H W")
K, G = coefficient("K G")


def _grouped_relu():
    """A branching kernel: a grouped channel mix (Split C by C/G) then a ReLU."""
    x = Input(N, C, L)
    w = Weight("g", Dim("o", C / G), "c", name="w")
    return (
        x
        >> Split(C, C / G, "g", "c")
        >> Share(w)
        >> Reduce("c")
        >> Merge("g", "o", "C")
        >> Map("relu")
        >> Output(N, C, L, defaults={"G": 3})
    )


def _merge_split():
    """Constraints over one primary (C/G) and over two (H*W/4)."""
    return (
        Input(C, H, W)
        >> Split(C, C / G, "g", "c")
        >> Merge(H, W, "hw")
        >> Split("hw", 4, "a", "b")
        >> Output("g", "c", "a", "b")
    )


#: (name, operator, layer): operators with a size that does not divide the layer
CASES = [
    ("grouped_g3", GROUPED, {"N": 2, "Cin": 7, "Cout": 5, "H": 5, "W": 4, "G": 3, "K": 3}),
    ("strided_s2", STRIDED, {"N": 2, "Cin": 3, "Cout": 4, "H": 7, "W": 5, "s": 2, "K": 3}),
    ("strided_s3", STRIDED, {"N": 1, "Cin": 2, "Cout": 3, "H": 8, "W": 7, "s": 3, "K": 3}),
    ("grouped_relu", _grouped_relu(), {"N": 2, "C": 7, "L": 3}),
    ("max_pool_s2", max_pool_3x3_stride_2(), {"N": 1, "C": 2, "H": 7, "W": 5}),
]


def _close(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    scale = max(1.0, float(np.abs(expected).max()))
    error = float(np.abs(got - expected).max()) / scale
    assert error <= TOLERANCE, f"{what}: relative error {error:.3g}"


def _torch_run(op, layer, x: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
    module = kdsl_torch.build(op, layer, pad=True).to(torch.float64)
    with torch.no_grad():
        for parameter, value in zip(module.weights, weights):
            parameter.copy_(torch.from_numpy(value))
        return module(torch.from_numpy(x)).numpy()


def _tvm_run(op, layer, x: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
    kernel = kdsl_tvm.build(op, layer, dtype="float64", pad=True)
    assert isinstance(kernel, PaddedKernel)
    return kernel(torch.from_numpy(x), *[torch.from_numpy(w) for w in weights]).numpy()


def _run(backend: str, op, layer, x: np.ndarray, weights: list[np.ndarray]) -> np.ndarray:
    if backend == "reference":
        return reference.run(op, layer, x, weights, pad=True)
    if backend == "torch":
        return _torch_run(op, layer, x, weights)
    return _tvm_run(op, layer, x, weights)


# ------------------------------------------------------------------------------------------------
# The solver
# ------------------------------------------------------------------------------------------------


def test_without_pad_the_usual_error_suggests_pad():
    for op, coefficients, text in [(GROUPED, {"G": 3}, "Cin/G = 64/3"), (STRIDED, None, "H/s = 7/2")]:
        with pytest.raises(DivisibilityError, match=re.escape(text)) as error:
            solve.check(op, "resnet18", coefficients)
        assert "pad=True" in str(error.value) and "kdsl check --pad" in str(error.value)


def test_grouped_g3_pads_cin_and_cout_on_every_resnet18_layer():
    report = solve.check(GROUPED, "resnet18", {"G": 3}, pad=True)
    assert len(report.paddings) == 4
    for layer, padding in zip(report.layers, report.paddings):
        assert padding is not None
        least = -(-layer["Cin"] // 3) * 3  # the next multiple of G
        padded = padding.padded_binding
        assert padded["Cin"] == padded["Cout"] == least
        assert report.binding(layer.name)["Cin"] == layer["Cin"]  # the report's binding stays the original
        assert report.padded_binding(layer.name) == padded
        texts = {v.name: str(v) for v in padding.variables}
        if least != layer["Cin"]:
            assert texts["Cin"] == f"Cin {layer['Cin']} -> {least} (Split(Cin, Cin/G))"
            assert texts["Cout"] == f"Cout {layer['Cout']} -> {least} (Share(w): the weight dim co: Cout/G)"
        # the output keeps the original channels; the input is zero-padded up to the padded ones
        assert {d.name: (d.original, d.padded) for d in padding.outputs}["Cout"] == (layer["Cout"], least)
        assert {d.name: (d.original, d.padded) for d in padding.inputs}["Cin"] == (layer["Cin"], least)


def test_strided_pads_only_the_seven_pixel_layer_and_crops_nothing():
    report = solve.check(STRIDED, "resnet18", pad=True)
    padded = {layer.name: padding for layer, padding in zip(report.layers, report.paddings) if padding is not None}
    assert list(padded) == ["conv5_x"]
    padding = padded["conv5_x"]
    assert [str(v) for v in padding.variables] == ["H 7 -> 8 (Stride(H, s): H/s)", "W 7 -> 8 (Stride(W, s): W/s)"]
    # ceil(7/2) = 4 = 8/2 rows are kept: no crop
    assert all(d.amount == 0 for d in padding.outputs)
    assert padding.output_shape == (1, 512, 4, 4)


def test_costs_of_a_padded_layer_are_the_costs_at_the_padded_sizes():
    padding = solve.pad_binding(GROUPED, RESNET18["conv2_x"], {"G": 3})
    padded_cost = solve.cost(GROUPED, padding.padded_binding)
    p = padding.padded_binding
    assert padded_cost["flops"] == p["N"] * p["Cout"] * p["H"] * p["W"] * (p["Cin"] // 3) * 9
    assert padded_cost["params"] == p["Cout"] * (p["Cin"] // 3) * 9


def test_a_constraint_over_coefficients_only_cannot_be_padded():
    op = Input(N, L) >> Unfold(L, K, "k") >> Split("k", 2, "a", "b") >> Reduce("a", "b") >> Output(N, L)
    with pytest.raises(DivisibilityError, match=r"K/2 = 3/2 .*padding cannot fix it") as error:
        solve.pad_binding(op, {"N": 1, "L": 5, "K": 3})
    assert "the layer (K=3)" in str(error.value)
    with pytest.raises(DivisibilityError, match="padding cannot fix it"):
        solve.check(op, [{"name": "tiny", "N": 1, "L": 5}], {"K": 3}, pad=True)


def test_a_layer_that_divides_is_not_padded():
    report = solve.check(GROUPED, "resnet18", {"G": 4}, pad=True)
    assert report.paddings == (None, None, None, None)
    padding = solve.pad_binding(GROUPED, RESNET18["conv2_x"], {"G": 4})
    assert not padding.needed and padding.padded == padding.original and padding.describe() == ""


def _integral(op):
    return [c for c in solve.constraints(op) if c.kind == "integral"]


def _assert_least(op, layer: dict[str, int], padding) -> None:
    """Every integral constraint holds at the padded binding, and no padded primary could be
    smaller (with the others padded): each value from the original one up fails a constraint."""
    padded = padding.padded_binding
    integral = _integral(op)
    assert all(c.holds(padded) for c in integral)
    primaries = [v.name for v in op.variables if v.kind == "primary"]
    for name in primaries:
        assert padded[name] >= layer[name]
        for smaller in range(layer[name], padded[name]):
            assert not all(c.holds({**padded, name: smaller}) for c in integral), (name, smaller, padded)


@given(
    cin=st.integers(1, 24), cout=st.integers(1, 24), groups=st.integers(1, 5), h=st.integers(1, 9), s=st.integers(1, 4)
)
def test_padding_is_the_least_that_makes_every_size_an_integer(cin, cout, groups, h, s):
    grouped = {"N": 1, "Cin": cin, "Cout": cout, "H": 4, "W": 4, "G": groups, "K": 3}
    strided = {"N": 1, "Cin": 2, "Cout": 2, "H": h, "W": h + 1, "s": s, "K": 3}
    for op, layer in [(GROUPED, grouped), (STRIDED, strided)]:
        padding = solve.pad_binding(op, layer)
        _assert_least(op, layer, padding)
        # one primary per constraint: the padding is below every valid binding in a box above the layer
        # (the primaries that some integral constraint names; the others never pad)
        primaries = [
            v.name for v in op.variables if v.kind == "primary" and any(v.name in c.variables for c in _integral(op))
        ]
        ranges = [range(layer[n], layer[n] + 2 * max(groups, s)) for n in primaries]
        for values in itertools.product(*ranges):
            candidate = {**layer, **dict(zip(primaries, values))}
            if all(c.holds(candidate) for c in _integral(op)):
                assert all(padding.padded_binding[n] <= candidate[n] for n in primaries), (candidate, padding)
        # the caller's shapes: the original input, the output cropped to ceil(size at the layer)
        assert padding.input_shape == reference.shapes(op, layer, pad=True).input
        for dim in padding.outputs:
            size = dim_size(op, dim.name)
            assert dim.original == -(-size.evaluate(layer).numerator // size.evaluate(layer).denominator)


def dim_size(op, name: str):
    found = [d.size for d in op.outputs if d.name == name]
    assert len(found) == 1
    return found[0]


@given(c=st.integers(1, 12), h=st.integers(1, 9), w=st.integers(1, 9), groups=st.integers(1, 4))
def test_padding_over_several_primaries_is_least_in_each(c, h, w, groups):
    op = _merge_split()
    layer = {"C": c, "H": h, "W": w, "G": groups}
    _assert_least(op, layer, solve.pad_binding(op, layer))


# ------------------------------------------------------------------------------------------------
# Backends
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, op, layer", CASES, ids=[c[0] for c in CASES])
def test_padded_backends_agree_with_the_operator_on_the_zero_padded_input(name, op, layer):
    padding = solve.pad_binding(op, layer)
    assert padding.needed
    x, weights = reference.random_inputs(op, layer, seed=3, pad=True)
    assert x.shape == padding.input_shape
    # the definition: the unpadded operator at the padded binding, on the zero-padded input, cropped
    zero_padded = np.pad(x, [(0, d.amount) for d in padding.inputs])
    full = reference.run(op, padding.padded_binding, zero_padded, weights)
    expected = full[tuple(slice(0, d.original) for d in padding.outputs)]
    assert expected.shape == padding.output_shape
    for backend in BACKENDS:
        _close(_run(backend, op, layer, x, weights), expected, f"{name} on {backend}")


@pytest.mark.parametrize("name, op, layer", CASES, ids=[c[0] for c in CASES])
def test_without_pad_every_backend_raises_the_divisibility_error(name, op, layer):
    x, weights = reference.random_inputs(op, layer, seed=0, pad=True)
    with pytest.raises(DivisibilityError):
        reference.run(op, layer, x, weights)
    with pytest.raises(DivisibilityError):
        kdsl_torch.build(op, layer)
    if "tvm" in BACKENDS:
        with pytest.raises(DivisibilityError):
            kdsl_tvm.build(op, layer)


def test_grouped_g3_on_resnet18_conv2_x_equals_torch_grouped_conv_on_zero_padded_channels():
    layer = {**RESNET18["conv2_x"].values, "G": 3}
    x, weights = reference.random_inputs(GROUPED, layer, seed=1, pad=True)
    (w,) = weights
    assert x.shape == (1, 64, 56, 56) and w.shape == (3, 22, 22, 3, 3)
    # pad Cin to 66 with zeros, a grouped conv with weights [66, 22, 3, 3], keep 64 output channels
    x_t, w_t = torch.from_numpy(x), torch.from_numpy(w).reshape(66, 22, 3, 3)
    expected = F.conv2d(F.pad(x_t, (0, 0, 0, 0, 0, 2)), w_t, padding=1, groups=3)[:, :64].numpy()
    for backend in BACKENDS:
        _close(_run(backend, GROUPED, layer, x, weights), expected, f"grouped G=3 on {backend}")


def test_strided_conv2d_on_the_seven_pixel_layer_equals_torch_strided_conv():
    layer = {**RESNET18["conv5_x"].values, "Cin": 16, "Cout": 8}  # the 7x7 map, fewer channels
    x, weights = reference.random_inputs(STRIDED, layer, seed=2, pad=True)
    (w,) = weights
    assert x.shape == (1, 16, 7, 7) and w.shape == (8, 16, 3, 3)
    x_t, w_t = torch.from_numpy(x), torch.from_numpy(w)
    on_padded = F.conv2d(F.pad(x_t, (0, 1, 0, 1)), w_t, stride=2, padding=1).numpy()
    # the 8th row and column are zeros, as PyTorch's own padding of the 7x7 map reads them
    unpadded = F.conv2d(x_t, w_t, stride=2, padding=1).numpy()
    _close(on_padded, unpadded, "zero-padded vs unpadded F.conv2d")
    for backend in BACKENDS:
        _close(_run(backend, STRIDED, layer, x, weights), unpadded, f"strided at 7 px on {backend}")


def test_padded_torch_source_pads_and_crops_and_unpadded_source_is_unchanged():
    layer = {"N": 1, "Cin": 64, "Cout": 64, "H": 7, "W": 7, "G": 3}
    text = kdsl_torch.source(GROUPED, layer, pad=True)
    assert "x = F.pad(x, (0, 0, 0, 0, 0, 2))  # Cin 64 -> 66" in text
    assert "return y[:, :64]  # Cout 66 -> 64" in text
    padding = solve.pad_binding(GROUPED, layer)
    plain = kdsl_torch.source(GROUPED, padding.padded_binding)
    head, tail = plain.split("\n    def forward(self, x):\n")
    assert text.endswith("\n    def padded_forward(self, x):\n" + tail)
    # the same weights; the torch.nn attributes only where they hold (no nn.Conv2d has 64 channels in 3 groups)
    weights = [line for line in head.splitlines() if "nn.Parameter(" in line]
    assert weights and all(line in text for line in weights)
    assert "self.in_channels = Cin" in plain and "self.in_channels" not in text
    # a layer that divides: the padded source is the source itself
    divides = {**layer, "Cin": 66, "Cout": 66}
    assert kdsl_torch.source(GROUPED, divides, pad=True) == kdsl_torch.source(GROUPED, divides)


def test_padded_modules_check_the_callers_shapes():
    layer = {"N": 1, "Cin": 7, "Cout": 5, "H": 4, "W": 4, "G": 3}
    module = kdsl_torch.build(GROUPED, layer, pad=True)
    with pytest.raises(KdslError, match=r"Cin=7"):
        module(torch.ones(1, 9, 4, 4))  # the padded shape is not the caller's
    with pytest.raises(KdslError, match="has size 9 but this layer needs 7"):
        reference.run(GROUPED, layer, np.ones((1, 9, 4, 4)), [np.ones((3, 3, 3, 3, 3))], pad=True)
    if "tvm" in BACKENDS:
        kernel = kdsl_tvm.build(GROUPED, layer, dtype="float64", pad=True)
        with pytest.raises(KdslError, match=r"expected \(1, 7, 4, 4\)"):
            kernel(torch.ones(1, 9, 4, 4, dtype=torch.float64), torch.ones(3, 3, 3, 3, 3, dtype=torch.float64))


# ------------------------------------------------------------------------------------------------
# The command line and search
# ------------------------------------------------------------------------------------------------


def test_cli_check_pad_prints_the_padded_variables_and_padded_costs(capsys):
    code = main(["check", "grouped_conv2d", "--layers", "resnet18", "--set", "G=3", "--pad"])
    out = capsys.readouterr().out
    assert code == 0
    assert "conv2_x: Cin 64 -> 66 (Split(Cin, Cin/G)), Cout 64 -> 66 (Share(w): the weight dim co: Cout/G)" in out
    padding = solve.pad_binding(GROUPED, RESNET18["conv2_x"], {"G": 3})
    costs = solve.cost(GROUPED, padding.padded_binding)
    row = re.search(r"conv2_x\s+\[1, 64, 56, 56\]\s+\[1, 64, 56, 56\]\s+([\d.]+)\s+(\d+)", out)
    assert row is not None, out
    assert float(row.group(1)) == pytest.approx(costs["flops"] / 1e6, abs=0.005)
    assert int(row.group(2)) == costs["params"]


def test_cli_check_without_pad_suggests_it(capsys):
    code = main(["check", "strided_conv2d", "--layers", "resnet18"])
    err = capsys.readouterr().err
    assert code == 2
    assert "conv5_x" in err and "H/s = 7/2" in err and "--pad" in err


def test_a_space_with_padding_checks_candidates_padded():
    # grouped_conv2d with G=3 by default: invalid on resnet18 unless padded
    op = parse(GROUPED.to_dsl().replace('"G": 4', '"G": 3'))
    assert op.default_coefficients["G"] == 3
    assert evaluate(Space("conv2d", "resnet18"), op)["status"] == "invalid"
    space = Space("conv2d", "resnet18", pad=True)
    assert space.pad and space.describe().endswith(", padded")
    assert space.fingerprint() != Space("conv2d", "resnet18").fingerprint()
    result = evaluate(space, op)
    assert result["status"] == "valid" and result["padded"] == ["conv2_x", "conv3_x", "conv4_x", "conv5_x"]
    report = solve.check(op, "resnet18", pad=True)
    assert result["flops_per_layer"] == [
        solve.cost(op, report.padded_binding(layer.name))["flops"] for layer in report.layers
    ]
