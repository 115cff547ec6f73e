"""``kdsl.codegen.tvm.load`` makes a kernel of the shared library that ``kdsl tune --apply --out``
and ``Kernel.export`` write (issue 29), called like the one ``build`` returns; a kernel and the
reference interpreter take each other's call shapes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from backends import backend

backend("tvm")
torch = backend("torch")

from kdsl import gallery  # noqa: E402
from kdsl.codegen import reference  # noqa: E402
from kdsl.codegen import tvm as kdsl_tvm  # noqa: E402
from kdsl.lang import Input, Output, Product, primary  # noqa: E402
from kdsl.lang.errors import LoweringError, ShapeError  # noqa: E402

LAYER = {"N": 1, "Cin": 4, "Cout": 8, "H": 6, "W": 5}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The gallery's conv2d compiled at LAYER, written with Kernel.export."""
    path = tmp_path_factory.mktemp("kernels") / "conv2d.so"
    kernel = kdsl_tvm.build(gallery.load("conv2d"), LAYER)
    assert kernel.export(path) == path and path.is_file()
    return kernel, path


def test_a_loaded_kernel_computes_what_the_built_one_does(exported):
    built, path = exported
    loaded = kdsl_tvm.load(path)
    x, w = torch.randn(1, 4, 6, 5), torch.randn(8, 4, 3, 3)
    torch.testing.assert_close(loaded(x, w), torch.nn.functional.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-5)
    assert torch.equal(loaded(x, w), built(x, w)) and torch.equal(loaded(x, [w]), loaded(x, w))
    out = torch.empty(1, 8, 6, 5)
    assert loaded(x, w, out=out) is out and torch.equal(out, built(x, w))
    with pytest.raises(ShapeError, match="expected 1 weights, got 0"):
        loaded(x)
    with pytest.raises(ShapeError, match=r"the input has shape \(1, 4, 6, 6\)"):
        loaded(torch.randn(1, 4, 6, 6), w)


def test_the_description_says_what_the_library_computes(exported):
    _, path = exported
    text = json.loads(kdsl_tvm.description_path(path).read_text())
    assert text["binding"] == {**LAYER, "K": 3} and text["dtype"] == "float32" and "Unfold(H, K" in text["operator"]


def test_a_library_without_its_description_loads_given_the_operator_and_layer(exported, tmp_path):
    _, path = exported
    bare = tmp_path / "bare.so"
    bare.write_bytes(path.read_bytes())
    with pytest.raises(LoweringError, match=r"no description beside it \(bare.so.json"):
        kdsl_tvm.load(bare)
    loaded = kdsl_tvm.load(bare, gallery.load("conv2d"), LAYER)
    x, w = torch.randn(1, 4, 6, 5), torch.randn(8, 4, 3, 3)
    torch.testing.assert_close(loaded(x, w), torch.nn.functional.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-5)


def test_what_is_no_kernel_library_is_a_kdsl_error(tmp_path):
    with pytest.raises(LoweringError, match="no kernel library at"):
        kdsl_tvm.load(tmp_path / "missing.so")
    junk = tmp_path / "junk.so"
    junk.write_text("not a library")
    kdsl_tvm.write_description(junk, gallery.load("conv2d"), LAYER, "float32")
    with pytest.raises(LoweringError, match="TVM cannot load"):
        kdsl_tvm.load(junk)
    kdsl_tvm.description_path(junk).write_text("{}")
    with pytest.raises(LoweringError, match="no kernel description kdsl wrote"):
        kdsl_tvm.load(junk)


def test_a_kernel_of_several_inputs_and_the_reference_take_each_others_call_shapes():
    B, M, K, N = primary("B M K N")
    bmm = Product(Input(B, M, K, name="a"), Input(B, K, N, name="b"), "K") >> Output(B, M, N)
    layer = {"B": 2, "M": 3, "K": 4, "N": 5}
    kernel = kdsl_tvm.build(bmm, layer)
    (a, b), _ = reference.random_inputs(bmm, layer, dtype=np.float32)
    expected = a @ b
    for result in (kernel(a, b), kernel((a, b)), kernel((a, b), []), kernel(a, b, [])):
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-5, atol=1e-5)
    for result in (
        reference.run(bmm, layer, a, b),
        reference.run(bmm, layer, (a, b), []),
        reference.run(bmm, layer, a, b, []),
    ):
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match=r"takes 2 inputs \(a, b\) before its weights, got 1"):
        reference.run(bmm, layer, a)
    with pytest.raises(ShapeError, match=r"takes 2 inputs \(a, b\) before its weights, got 1"):
        reference.run(bmm, layer, a, [])  # the list is the weights, not the input b
