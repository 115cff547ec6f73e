"""The native PyTorch baselines that write into a preallocated output (``kdsl.codegen.native.INTO``):
the same numbers as the allocating calls, one buffer reused across calls, no allocating ATen op, and
the allocating form where autograd tracks an input (out= refuses it)."""

from __future__ import annotations

import pytest
from backends import backend

from kdsl import gallery, solve
from kdsl.codegen import reference
from kdsl.codegen.native import INTO, NATIVE, WINDOWS_AND_PRODUCTS, native_function

torch = backend("torch")

from kdsl.bench.overhead import VIEW_OPS, count_aten_ops  # noqa: E402  (needs torch)

#: a small layer of every operator whose baseline writes into its output; a GEMV among them
LAYERS = {
    "linear": {"N": 1, "Cin": 7, "Cout": 5},
    "matmul": {"M": 6, "Cin": 7, "Cout": 5},
    "bmm": {"B": 3, "M": 4, "K": 5, "N": 2},
    "bmm_tn": {"B": 3, "M": 4, "K": 5, "N": 2},
    "avg_pool2d": {"N": 2, "Cin": 3, "H": 8, "W": 6, "K": 2},
}


def _inputs(name: str, seed: int = 0) -> tuple[object, list[object], dict[str, int]]:
    """Random inputs and weights of the gallery operator ``name`` at its layer in :data:`LAYERS`."""
    op = gallery.load(name)
    binding = dict(solve.bind(op, LAYERS[name]))
    shapes = reference.shapes(op, binding)
    generator = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(tuple(shape), generator=generator) for shape in shapes.inputs]
    weights = [torch.randn(tuple(shape), generator=generator) for shape in shapes.weights]
    assert inputs, name
    return (inputs[0] if len(inputs) == 1 else tuple(inputs)), weights, binding


def _allocating(name: str, x: object, weights: list[object], binding: dict[str, int]) -> object:
    """The table's own call of ``name``, which allocates its output."""
    prepare, call = NATIVE[name] if name in NATIVE else WINDOWS_AND_PRODUCTS[name]
    result = call(x, prepare(weights, binding), binding)
    assert isinstance(result, torch.Tensor)
    return result


def test_every_out_form_has_an_allocating_form():
    assert set(INTO) <= set(NATIVE) | set(WINDOWS_AND_PRODUCTS)
    assert set(INTO) == set(LAYERS)  # a new entry gets a layer here, and so a test


@pytest.mark.parametrize("name", sorted(INTO))
def test_the_out_form_computes_what_the_allocating_form_does(name):
    x, weights, binding = _inputs(name)
    expected = _allocating(name, x, weights, binding)
    function = native_function(name, x, weights, binding)
    first = function()
    pointer = first.data_ptr()
    assert torch.equal(first, expected)  # bit for bit: the same ATen kernel
    second = function()
    assert second is first and second.data_ptr() == pointer  # the one buffer, reused
    assert torch.equal(second, expected)


@pytest.mark.parametrize("name", sorted(INTO))
def test_the_out_form_dispatches_no_allocating_op(name):
    x, weights, binding = _inputs(name, seed=1)
    function = native_function(name, x, weights, binding)
    counts = count_aten_ops(function)
    allocating = [op for op in counts if not op.endswith(".out") and op.split(".")[1] not in VIEW_OPS]
    assert counts and not allocating, counts


def test_a_new_input_changes_the_result_in_the_same_buffer():
    x, weights, binding = _inputs("matmul", seed=2)
    function = native_function("matmul", x, weights, binding)
    before = function().clone()
    x.mul_(2.0)  # the call reads its input anew every time
    after = function()
    assert torch.equal(after, 2.0 * before)


def test_an_input_autograd_tracks_gets_the_allocating_form():
    x, weights, binding = _inputs("linear", seed=3)
    x.requires_grad_(True)
    function = native_function("linear", x, weights, binding)
    first, second = function(), function()
    assert first is not second and first.grad_fn is not None  # out= would have raised
    second.sum().backward()
    assert x.grad is not None and torch.allclose(x.grad, weights[0].sum(0).expand_as(x))
