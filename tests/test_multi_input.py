"""Kernels of several data inputs: building, text, JSON, the key, errors, and every backend against
PyTorch's own ``torch.bmm``, ``torch.matmul`` and ``F.scaled_dot_product_attention``.

Backends are chosen with ``KDSL_TEST_BACKENDS`` (default ``reference,torch,tvm``); a requested
backend that cannot be loaded fails the run instead of being skipped.
"""

import os

import numpy as np
import pytest
from backends import backend

torch = backend("torch")
F = torch.nn.functional

import kdsl  # noqa: E402
from kdsl import gallery, solve  # noqa: E402
from kdsl.codegen import reference  # noqa: E402
from kdsl.lang import FC, Dim, Input, Map, Output, Product, Reduce, Rename, Softmax, primary  # noqa: E402
from kdsl.lang.errors import LoweringError, ParseError, SearchError, ShapeError  # noqa: E402

BACKENDS = [b.strip() for b in os.environ.get("KDSL_TEST_BACKENDS", "reference,torch,tvm").split(",") if b.strip()]
if "torch" in BACKENDS:
    from kdsl.codegen import torch as kdsl_torch
if "tvm" in BACKENDS:
    backend("tvm")  # a requested TVM that cannot load fails here, at collection
    from kdsl.codegen.tvm import kernel as tvm_kernel

B, M, N, D, K = primary("B M N D K")


def scores():
    return Product(Input(B, M, D, name="q"), Input(B, N, D, name="k"), "D") >> Output(B, M, N)


def run(name, op, layer, xs, weights=()):
    """``op`` on the backend ``name``, float64, inputs in the kernel's order."""
    if name == "reference":
        return reference.run(op, layer, tuple(xs), list(weights))
    tensors = [torch.from_numpy(x) for x in xs]
    if name == "torch":
        module = kdsl_torch.build(op, layer).double()
        with torch.no_grad():
            for parameter, value in zip(module.weights, weights):
                parameter.copy_(torch.from_numpy(value))
            return module(*tensors).numpy()
    kernel = tvm_kernel.build(op, layer, dtype="float64")
    return kernel(*tensors, *[torch.from_numpy(w) for w in weights]).numpy()


# -- the language ------------------------------------------------------------------------------


def test_two_inputs_round_trip_through_text_and_json():
    op = scores()
    assert op.input_names == ("q", "k") and op.input_nodes == (0, 1)
    assert 'q = Input(B, M, D, name="q")' in op.to_dsl()
    assert kdsl.parse(op.to_dsl()) == op
    assert kdsl.from_json(op.to_json()) == op
    assert kdsl.parse(op.to_dsl()).key == op.key


def test_the_input_order_is_first_appearance_and_part_of_the_key():
    q, k = Input(B, M, D, name="q"), Input(B, N, D, name="k")
    swapped = Product(k, q, "D") >> Output(B, M, N)
    assert swapped.input_names == ("k", "q")
    assert swapped.key != scores().key
    # names are not part of the key: the same kernel with other input names
    renamed = Product(Input(B, M, D, name="a"), Input(B, N, D, name="b"), "D") >> Output(B, M, N)
    assert renamed.key == scores().key and renamed != scores()


def test_one_input_keeps_no_name():
    named = Input(B, M, name="q") >> Reduce(M) >> Output(B)
    plain = Input(B, M) >> Reduce(M) >> Output(B)
    assert named == plain and named.input_names == ("x",)
    branching = (Input(B, M, name="q") >> Map("relu")) >> Output(B, M)
    assert branching.nodes[0].name is None and "name=" not in branching.to_dsl()


def test_bad_inputs_raise_naming_the_input():
    q = Input(B, M, D, name="q")
    with pytest.raises(ShapeError, match=r"two inputs are named 'q'"):
        Product(q, Input(B, N, D, name="q"), "D")
    with pytest.raises(ShapeError, match=r"names each one"):
        Product(q, Input(B, N, D), "D")
    with pytest.raises(ShapeError, match=r"input's name must be a Python identifier"):
        Input(B, M, name="not a name")
    # one dim name, two sizes, in two inputs that never meet on it
    k = Input(B, M, Dim("D", K), name="k")
    with pytest.raises(ShapeError, match=r"the dim D is D in the input 'q' but K in the input 'k'"):
        Product(q >> Reduce(D), k >> Reduce("D")) >> Output(B, M)
    text = 'from kdsl.lang import *\nB, M, D = primary("B M D")\nq = Input(B, M, D, name="q")\n'
    with pytest.raises(ParseError, match=r"the input k .* is never used"):
        kdsl.parse(text + 'k = Input(B, M, D, name="k")\nop = q >> Reduce(D) >> Output(B, M)\n')
    with pytest.raises(ParseError):
        kdsl.parse(text + 'k = Input(B, M, D, name=__import__("os"))\nop = q >> Reduce(D) >> Output(B, M)\n')


def test_the_solver_gives_every_input_shape():
    op = scores()
    layer = {"B": 2, "M": 3, "N": 4, "D": 5}
    shapes = solve.shapes(op, layer)
    assert shapes["input"] == (2, 3, 5) and shapes["inputs"] == {"q": (2, 3, 5), "k": (2, 4, 5)}
    assert "inputs" not in solve.shapes(gallery.load("matmul"), {"M": 2, "Cin": 3, "Cout": 4})
    assert reference.shapes(op, layer).inputs == ((2, 3, 5), (2, 4, 5))
    assert solve.cost(op, layer)["flops"] == 2 * 3 * 4 * 5
    assert len(solve.check(gallery.load("bmm"), "opevo_bmm")) == 3


def test_padding_and_bad_arrays_say_what_is_wrong():
    op = scores()
    layer = {"B": 1, "M": 2, "N": 2, "D": 2}
    with pytest.raises(LoweringError, match=r"several inputs \(q, k\)"):
        reference.run(op, layer, (np.ones((1, 2, 2)),) * 2, [], pad=True)
    with pytest.raises(ShapeError, match=r"takes 2 inputs \(q, k\)"):
        reference.run(op, layer, np.ones((1, 2, 2)), [])
    with pytest.raises(ShapeError, match=r"the input k: the dim N has size 3"):
        reference.run(op, layer, (np.ones((1, 2, 2)), np.ones((1, 3, 2))), [])


def test_search_stays_single_input():
    from kdsl.search.space import load_spec

    spec = {"primary": ["B"], "inputs": [[["B", "B"]], [["B", "B"]]], "output": [["B", "B"]]}
    with pytest.raises(SearchError, match=r"one data input"):
        load_spec(spec)


# -- every backend against PyTorch's functions --------------------------------------------------

SHAPES = [{"B": 3, "M": 4, "K": 5, "N": 2}, {"B": 2, "M": 1, "K": 3, "N": 6}]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("layer", SHAPES)
def test_bmm_is_torch_bmm(name, layer):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((layer["B"], layer["M"], layer["K"]))
    b = rng.standard_normal((layer["B"], layer["K"], layer["N"]))
    expected = torch.bmm(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(run(name, gallery.load("bmm"), layer, (a, b)), expected, rtol=1e-10, atol=1e-12)
    at = np.ascontiguousarray(a.transpose(0, 2, 1))  # stored [B, K, M]: OpEvo's BMM2 and BMM3
    got = run(name, gallery.load("bmm_tn"), layer, (at, b))
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", BACKENDS)
def test_attention_scores_are_the_scores_of_scaled_dot_product_attention(name):
    layer = {"B": 2, "M": 3, "N": 4, "D": 5}
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, n, 5)) for n in (3, 4, 4))
    got = run(name, gallery.load("attention_qk"), layer, (q, k))
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    np.testing.assert_allclose(got, torch.matmul(tq, tk.transpose(-2, -1)).numpy(), rtol=1e-10, atol=1e-12)
    # softmax of the scores times v is SDPA at scale 1 (the scale is left to the caller)
    attended = torch.softmax(torch.from_numpy(got), -1) @ tv
    expected = F.scaled_dot_product_attention(tq, tk, tv, scale=1.0)
    np.testing.assert_allclose(attended.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", BACKENDS)
def test_attention_with_a_weighted_branch_and_a_softmax(name):
    # a third input v and an FC on k: several inputs mix with weights and unary steps
    q, k, v = Input(B, M, D, name="q"), Input(B, N, D, name="k"), Input(B, N, K, name="v")
    keys = k >> FC(D, name="e", size=D, weight="proj") >> Rename("e", "D")
    op = Product(Product(q, keys, "D") >> Softmax(N), v, "N") >> Output(B, M, K)
    assert op.input_names == ("q", "k", "v")
    layer = {"B": 2, "M": 3, "N": 4, "D": 5, "K": 2}
    xs, weights = reference.random_inputs(op, layer, seed=2)
    expected = reference.run(op, layer, xs, weights)
    tq, tk, tv = (torch.from_numpy(x) for x in xs)
    projected = tk @ torch.from_numpy(weights[0]).T
    sdpa = F.scaled_dot_product_attention(tq, projected, tv, scale=1.0).numpy()
    np.testing.assert_allclose(expected, sdpa, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(run(name, op, layer, xs, weights), expected, rtol=1e-9, atol=1e-12)


@pytest.mark.skipif("tvm" not in BACKENDS, reason="TVM not requested")
def test_tvm_kernel_differentiates_every_input():
    op = gallery.load("bmm")
    kernel = tvm_kernel.build(op, {"B": 2, "M": 3, "K": 4, "N": 2}, dtype="float64")
    a = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 4, 2, dtype=torch.float64, requires_grad=True)
    kernel(a, b).sum().backward()
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    torch.bmm(a2, b2).sum().backward()
    assert torch.allclose(a.grad, a2.grad) and torch.allclose(b.grad, b2.grad)
    with pytest.raises(ShapeError, match=r"takes 2 inputs \(a, b\)"):
        kernel(a)
