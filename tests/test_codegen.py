"""Differential tests: the reference interpreter, the PyTorch backend and the TVM backend agree.

Backends are chosen with ``KDSL_TEST_BACKENDS`` (default ``reference,torch,tvm``); a requested
backend that cannot be loaded fails the run instead of being skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gallery import CASES

from kdsl import gallery, solve
from kdsl.codegen import reference
from kdsl.codegen.native import NATIVE
from kdsl.lang.errors import KdslError
from kdsl.testing import strategies as kst

BACKENDS = [b.strip() for b in os.environ.get("KDSL_TEST_BACKENDS", "reference,torch,tvm").split(",") if b.strip()]
UNKNOWN = set(BACKENDS) - {"reference", "torch", "tvm"}
assert not UNKNOWN, f"KDSL_TEST_BACKENDS names unknown backends: {UNKNOWN}"

# A requested backend that fails to import fails here, at collection, on purpose.
if "torch" in BACKENDS:
    import torch

    from kdsl.codegen import torch as kdsl_torch
if "tvm" in BACKENDS:
    from kdsl.codegen import tvm as kdsl_tvm

    kdsl_tvm.load_tvm()


def scaled_inputs(op, layer, seed, dtype=np.float64):
    """Inputs in [-1, 1] and weights scaled by 1/sqrt(fan-in), so outputs are of order one."""
    rng = np.random.default_rng(seed)
    shapes = reference.shapes(op, layer)
    x = rng.uniform(-1, 1, shapes.input).astype(dtype)
    weights = []
    for weight, shape in zip(op.weights, shapes.weights):
        fan_in = int(np.prod([s for s, new in zip(shape, weight.new) if not new] or [1]))
        weights.append((rng.uniform(-1, 1, shape) / np.sqrt(fan_in)).astype(dtype))
    return x, weights


def run_backend(backend, op, layer, x, weights):
    if backend == "reference":
        return reference.run(op, layer, x, weights)
    if backend == "torch":
        module = kdsl_torch.build(op, layer).to(torch.float64 if x.dtype == np.float64 else torch.float32)
        with torch.no_grad():
            for parameter, value in zip(module.weights, weights):
                parameter.copy_(torch.from_numpy(value))
            return module(torch.from_numpy(x)).numpy()
    kernel = kdsl_tvm.build(op, layer, dtype="float64" if x.dtype == np.float64 else "float32")
    return kernel(torch.from_numpy(x), *[torch.from_numpy(w) for w in weights]).numpy()


def assert_backends_agree(op, layer, seed=0, dtype=np.float32):
    """Every requested backend gives the float64 reference's answer (fp32: rtol 1e-4, atol 1e-5
    relative to the output's scale), or all raise the same KdslError."""
    outcomes = {}
    x64, weights64 = None, None
    try:
        x64, weights64 = scaled_inputs(op, layer, seed)
        expected = reference.run(op, layer, x64, weights64)
    except KdslError as error:
        expected = error
    for backend in BACKENDS:
        try:
            if isinstance(expected, KdslError):
                shapes = {"x": np.zeros(1)}  # the layer is bad: the backend must refuse it while building
                outcomes[backend] = run_backend(backend, op, layer, shapes["x"], [])
            else:
                x, weights = x64.astype(dtype), [w.astype(dtype) for w in weights64]
                outcomes[backend] = run_backend(backend, op, layer, x, weights)
        except KdslError as error:
            outcomes[backend] = error
    for backend, outcome in outcomes.items():
        if isinstance(expected, KdslError):
            assert isinstance(outcome, KdslError), f"{backend} did not raise; the reference raised {expected!r}"
            assert type(outcome) is type(expected), f"{backend} raised {outcome!r}, the reference {expected!r}"
        else:
            assert not isinstance(outcome, KdslError), f"{backend} raised {outcome!r}\n{op.to_dsl()}"
            scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
            np.testing.assert_allclose(outcome, expected, rtol=1e-4, atol=1e-5 * scale, err_msg=f"{backend}")
    assert outcomes


@settings(max_examples=25)
@given(kst.operators_with_layers(max_steps=6))
def test_random_operators_agree_on_every_backend(op_and_layer):
    op, layer = op_and_layer
    assert_backends_agree(op, layer)


GALLERY_CASES = [(name, index) for name, (_, layers) in CASES.items() for index in range(len(layers))]


@pytest.mark.parametrize(("name", "index"), GALLERY_CASES)
def test_gallery_operators_agree_on_every_backend(name, index):
    assert_backends_agree(gallery.load(name), CASES[name][1][index], seed=index)


@pytest.mark.parametrize("name", ["grouped_conv2d", "strided_conv2d", "avg_pool2d", "syno_op1"])
def test_a_layer_that_does_not_divide_is_refused_by_every_backend(name):
    op = gallery.load(name)
    layer = {"N": 1, "Cin": 6, "Cout": 6, "H": 5, "W": 5, "G": 4, "s": 2, "K": 2}
    assert_backends_agree(op, layer)


@pytest.mark.skipif("torch" not in BACKENDS, reason="PyTorch backend not requested")
@pytest.mark.parametrize("name", sorted(NATIVE))
def test_torch_backend_matches_native_pytorch(name):
    op = gallery.load(name)
    layer = CASES[name][1][0]
    binding = solve.bind(op, layer)
    x, weights = scaled_inputs(op, layer, seed=3)
    module = kdsl_torch.build(op, layer).double()
    with torch.no_grad():
        for parameter, value in zip(module.weights, weights):
            parameter.copy_(torch.from_numpy(value))
        prepare, call = NATIVE[name]
        native = call(torch.from_numpy(x), prepare([torch.from_numpy(w) for w in weights], binding), binding)
        ours = module(torch.from_numpy(x))
    np.testing.assert_allclose(ours.numpy(), native.numpy(), rtol=1e-10, atol=1e-12)


def assert_gradients_match_finite_differences(op, layer, seed=0, probes=4):
    """d(sum(out * R))/d(input and weights) of the PyTorch module equals central differences of the
    reference interpreter (float64) at a few random coordinates."""
    rng = np.random.default_rng(seed)
    x, weights = scaled_inputs(op, layer, seed)
    probe = rng.standard_normal(reference.run(op, layer, x, weights).shape)

    def objective(x_value, weight_values):
        return float((reference.run(op, layer, x_value, weight_values) * probe).sum())

    module = kdsl_torch.build(op, layer).double()
    with torch.no_grad():
        for parameter, value in zip(module.weights, weights):
            parameter.copy_(torch.from_numpy(value))
    x_tensor = torch.from_numpy(x.copy()).requires_grad_(True)
    (module(x_tensor) * torch.from_numpy(probe)).sum().backward()
    tensors = [(x, x_tensor.grad.numpy())] + [(w, p.grad.numpy()) for w, p in zip(weights, module.weights)]
    step = 1e-6
    checked = 0
    for which, (value, gradient) in enumerate(tensors):
        for _ in range(probes):
            index = tuple(int(rng.integers(0, n)) for n in value.shape)
            arrays = [x] + list(weights)
            plus = [a.copy() for a in arrays]
            minus = [a.copy() for a in arrays]
            plus[which][index] += step
            minus[which][index] -= step
            numeric = (objective(plus[0], plus[1:]) - objective(minus[0], minus[1:])) / (2 * step)
            assert abs(numeric - gradient[index]) <= 1e-6 * max(1.0, abs(numeric)), (which, index, numeric)
            checked += 1
    assert checked == probes * len(tensors)


@pytest.mark.skipif("torch" not in BACKENDS, reason="PyTorch backend not requested")
@pytest.mark.parametrize("name", gallery.names())
def test_gallery_gradients_match_finite_differences(name):
    assert_gradients_match_finite_differences(gallery.load(name), CASES[name][1][0])


@pytest.mark.skipif("torch" not in BACKENDS, reason="PyTorch backend not requested")
@settings(max_examples=10)
@given(kst.operators_with_layers(max_steps=5))
def test_random_gradients_match_finite_differences(op_and_layer):
    op, layer = op_and_layer
    assert_gradients_match_finite_differences(op, layer, probes=2)


@pytest.mark.skipif("torch" not in BACKENDS, reason="PyTorch backend not requested")
@pytest.mark.parametrize("name", ["syno_op1", "grouped_conv2d", "pixel_shuffle"])
def test_generated_source_runs_without_kdsl(tmp_path, name):
    op = gallery.load(name)
    layer = CASES[name][1][0]
    binding = solve.bind(op, layer)
    x, weights = scaled_inputs(op, layer, seed=1)
    expected = reference.run(op, layer, x, weights)
    (tmp_path / "generated.py").write_text(kdsl_torch.source(op, binding, name="Generated"))
    np.savez(tmp_path / "data.npz", *weights, x=x, expected=expected)
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["kdsl"] = None  # any `import kdsl` now fails
        sys.path.insert(0, {str(tmp_path)!r})
        import numpy as np, torch
        from generated import Generated
        data = np.load({str(tmp_path / "data.npz")!r})
        module = Generated(**{dict(binding)!r}).double()
        with torch.no_grad():
            for i, parameter in enumerate(module.weights):
                parameter.copy_(torch.from_numpy(data[f"arr_{{i}}"]))
            out = module(torch.from_numpy(data["x"])).numpy()
        assert np.allclose(out, data["expected"], rtol=1e-10, atol=1e-12), "mismatch"
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.skipif("torch" not in BACKENDS, reason="PyTorch backend not requested")
def test_module_has_weights_in_declaration_order_and_fan_in_init():
    op = gallery.load("syno_op1")
    layer = {"N": 1, "Cin": 64, "Cout": 64, "H": 4, "W": 4}
    module = kdsl_torch.build(op, layer)
    assert [tuple(w.shape) for w in module.weights] == [(32, 2, 3, 1), (32, 3, 3, 64, 1)]
    # W2 sums ci (Cin/G = 2); g, kw and c are summed after W1 is shared, so they count for W1
    # (G * K * K * Cout/(G*s) = 32 * 3 * 3 * 1), as for a pair of PyTorch convolutions
    for weight, fan_in in zip(module.weights, [2, 32 * 3 * 3 * 1], strict=True):
        largest = float(weight.detach().abs().max())
        assert 0.9 / np.sqrt(fan_in) <= largest <= 1 / np.sqrt(fan_in)
    # a batch other than the one it was built for still runs
    assert module(torch.zeros(3, 64, 4, 4)).shape == (3, 64, 4, 4)


@pytest.mark.skipif("tvm" not in BACKENDS, reason="TVM backend not requested")
def test_tvm_source_is_tvmscript():
    text = kdsl_tvm.source(gallery.load("conv2d"), {"N": 1, "Cin": 4, "Cout": 4, "H": 5, "W": 5})
    assert "T.prim_func" in text and "T.if_then_else" in text


def _search_results():
    from kdsl.search.enumerate import Enumeration
    from kdsl.search.space import Space
    from kdsl.search.synthesis import to_operators

    space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [2], "s": [2]}, max_depth=5)
    found = {}
    walker = Enumeration(space, seed=0, progress={})
    for state in walker.states():
        if state is not None:
            for op in to_operators(space, state):
                found.setdefault(op.key, op)
        if len(found) >= 80:
            break
    assert len(found) >= 20
    return [found[key] for key in sorted(found)]


SEARCH_RESULTS = _search_results()


@settings(max_examples=20)
@given(st.data())
def test_search_results_pass_the_solver_and_agree_on_every_backend(data):
    op = data.draw(st.sampled_from(SEARCH_RESULTS))
    solve.check(op, "resnet18")
    assert_backends_agree(op, data.draw(kst.layers(op)))
