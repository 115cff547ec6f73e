"""Weights packed once (:mod:`kdsl.codegen.tvm.prepack`): a kernel whose signature takes its packed weights
against the per-call packing kernel of the same schedule and the float64 NumPy reference, for conv2d,
grouped_conv2d and matmul, the default schedule and random configurations of the space (some packing a
weight, some not: then nothing changes); the packing against TVM's own index map; the fused and blocked
kernels; refusals."""

from __future__ import annotations

import random

import numpy as np
import pytest
from backends import backend

from kdsl import gallery
from kdsl.codegen import reference
from kdsl.lang.errors import LoweringError, ShapeError

backend("tvm")

import torch  # noqa: E402  (after the skip: the kernels need TVM)

from kdsl.codegen.tvm import build, load_tvm, lower  # noqa: E402
from kdsl.codegen.tvm.epilogue import Epilogue, build_fused  # noqa: E402
from kdsl.codegen.tvm.prepack import WeightLayout, _one_to_one, prepack_weights  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.codegen.tvm.signature_layout import build_blocked, from_blocked, to_blocked  # noqa: E402

LAYERS = {
    "conv2d": {"N": 1, "Cin": 8, "Cout": 32, "H": 5, "W": 6},
    "grouped_conv2d": {"N": 1, "Cin": 16, "Cout": 16, "H": 5, "W": 5, "G": 2},
    "matmul": {"M": 6, "Cin": 16, "Cout": 64},
}


def configurations(op, layer, count: int = 2) -> list[dict]:
    """The heuristic configuration, the heuristic with every weight left in its layout, and ``count``
    random valid configurations of the space (what tuned records hold)."""
    space = ScheduleSpace(lower(op, layer))
    heuristic = space.heuristic()
    unpacked = {**heuristic}
    for weight in op.weights:
        unpacked[f"layout.{weight.name}.tile"] = "none"
        unpacked[f"layout.{weight.name}.perm"] = tuple(range(len(weight.dims)))
    configs = [heuristic, unpacked]
    rng = random.Random(0)
    for _ in range(200):
        if len(configs) == count + 2:
            break
        config = space.random(rng)
        # short unrolls: they do not touch the layouts and keep the compiles of this test fast
        config.update({k: min(v, 16) for k, v in config.items() if k.endswith(".unroll")})
        config.update({k: False for k in config if k.endswith(".unroll_tile")})
        if space.rejection(config) is None:
            configs.append(config)
    assert len(configs) == count + 2, "too few valid random configurations"
    return configs


def assert_prepacked_matches(name: str, config: dict) -> list[bool]:
    op, layer = gallery.load(name), LAYERS[name]
    lowered = lower(op, layer, "float64")
    rng = np.random.default_rng(0)
    x = rng.standard_normal([int(d) for d in lowered.x.shape])
    weights = [rng.standard_normal([int(d) for d in w.shape]) for w in lowered.weights]
    expected = reference.run(op, layer, x, *weights)

    def schedule(low):
        return ScheduleSpace(low).apply(config)

    per_call = build(op, layer, dtype="float64", schedule=schedule)
    prepacked = build(op, layer, dtype="float64", schedule=schedule, prepacked_weights=True)
    tensors = [torch.from_numpy(w) for w in weights]
    with torch.no_grad():
        got = prepacked(torch.from_numpy(x), *prepacked.pack_weights(*tensors)).numpy()
        plain = per_call(torch.from_numpy(x), *tensors).numpy()
    assert np.array_equal(got, plain), float(np.abs(got - plain).max())  # the same loops, the same sums
    assert np.allclose(got, expected, rtol=1e-10, atol=1e-10), float(np.abs(got - expected).max())
    script, per_call_script = prepacked.schedule.mod.script(), per_call.schedule.mod.script()
    copied = []  # per weight: whether the per-call kernel packs it in a copy of its own
    for weight, array, layout, shape in zip(op.weights, weights, prepacked.weight_layouts, prepacked.weight_shapes):
        copied.append(f"{weight.name}_global" in per_call_script)
        if copied[-1]:  # the packing stage left the kernel: the signature takes the weight packed
            assert layout is not None and shape == layout.packed_shape  # (a permutation may keep the shape)
            assert f"{weight.name}_global" not in script
        else:  # nothing to prepack: the kernel is the per-call one
            assert layout is None and shape == array.shape
            assert script == per_call_script
    assert copied, "the operator has no weight"
    return copied


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_prepacked_kernel_computes_what_the_per_call_packing_kernel_does(name):
    op, layer = gallery.load(name), LAYERS[name]
    copied = [assert_prepacked_matches(name, config)[0] for config in configurations(op, layer)]
    assert copied[:2] == [True, False]  # the heuristic packs the weight; with its layout left alone, nothing
    assert any(copied[2:]), "no random configuration packs the weight: nothing prepacked there"


def test_packing_puts_every_element_where_the_index_map_says():
    tvm = load_tvm()
    index_map = tvm.tirx.IndexMap.from_func(lambda a, b, c: (b, a // 4, c, a % 4), ndim=3, index_dtype="int32")
    layout = WeightLayout("w", (8, 3, 2), (3, 2, 2, 4), index_map)
    weight = torch.randn(8, 3, 2, dtype=torch.float64)
    packed = layout.pack(weight)
    assert packed.shape == (3, 2, 2, 4) and packed.dtype == weight.dtype
    for index in np.ndindex(*layout.shape):  # TVM's own evaluation of the map, element by element
        target = tuple(int(i) for i in index_map.map_indices(list(index)))
        assert packed[target] == weight[index]
    assert layout.pack(weight.numpy()).equal(packed)
    # a map that repeats elements (and so leaves others unset) is no layout: prepacking declines it
    repeats = tvm.tirx.IndexMap.from_func(lambda a, b, c: (b, a // 4, b, a % 4), ndim=3, index_dtype="int32")
    assert _one_to_one(index_map, (8, 3, 2), (3, 2, 2, 4)) and not _one_to_one(repeats, (8, 3, 2), (3, 2, 2, 4))


@pytest.mark.parametrize("block", [0, 4])
def test_fused_and_blocked_kernels_take_prepacked_weights(block):
    op, layer = gallery.load("conv2d"), {"N": 1, "Cin": 8, "Cout": 16, "H": 4, "W": 5}
    x, w = torch.randn(1, 8, 4, 5, dtype=torch.float64), torch.randn(16, 8, 3, 3, dtype=torch.float64)
    scale, shift, res = (
        torch.rand(16, dtype=torch.float64),
        torch.randn(16, dtype=torch.float64),
        torch.randn(1, 16, 4, 5, dtype=torch.float64),
    )
    fused = {
        flag: build_fused(op, layer, Epilogue(residual=True), block=block, dtype="float64", prepacked_weights=flag)
        for flag in (False, True)
    }
    assert fused[True].prepacked and not fused[False].prepacked
    xb, resb = (to_blocked(x, block), to_blocked(res, block)) if block else (x, res)
    with torch.no_grad():
        outs = [
            kernel(xb, *kernel.pack_weights(w), scale=scale, shift=shift, residual=resb) for kernel in fused.values()
        ]
    assert outs[0].equal(outs[1])
    expected = torch.relu(
        torch.nn.functional.conv2d(x, w, padding=1) * scale[:, None, None] + shift[:, None, None] + res
    )
    assert torch.allclose(from_blocked(outs[1]) if block else outs[1], expected, atol=1e-10)
    if block:
        kernel = build_blocked(op, layer, block, dtype="float64", prepacked_weights=True)
        with torch.no_grad():
            got = from_blocked(kernel(xb, *kernel.pack_weights(w)))
        assert kernel.prepacked and torch.allclose(got, torch.nn.functional.conv2d(x, w, padding=1), atol=1e-10)


def test_an_unscheduled_kernel_or_one_that_packs_nothing_keeps_its_signature():
    op, layer = gallery.load("conv2d"), LAYERS["conv2d"]
    kernel = build(op, layer, schedule=None, prepacked_weights=True)
    assert kernel.weight_layouts == [None] and not kernel.prepacked
    w = torch.randn(32, 8, 3, 3)
    assert kernel.pack_weights(w)[0] is w
    lowered = lower(op, layer)
    sch, layouts = prepack_weights(ScheduleSpace(lowered).apply(configurations(op, layer, 0)[1]), lowered)
    assert layouts == [None] and "w_global" not in sch.mod.script()


def test_a_prepacked_kernel_refuses_plain_weights_gradients_and_export(tmp_path):
    op, layer = gallery.load("conv2d"), LAYERS["conv2d"]
    kernel = build(op, layer, prepacked_weights=True)
    x, w = torch.randn(1, 8, 5, 6), torch.randn(32, 8, 3, 3)
    with pytest.raises(ShapeError, match=r"weight w has shape \(32, 8, 3, 3\), expected .*pack_weights"):
        kernel(x, w)
    with pytest.raises(ShapeError, match=r"the weight w has shape \(8, 8, 3, 3\), expected \(32, 8, 3, 3\)"):
        kernel.pack_weights(torch.randn(8, 8, 3, 3))
    with pytest.raises(ShapeError, match="expected 1 weights to pack, got 2"):
        kernel.pack_weights(w, w)
    with pytest.raises(ShapeError, match="must be a torch tensor or a NumPy array"):
        kernel.pack_weights([[1.0]])
    with pytest.raises(LoweringError, match="forward only"):
        kernel(x.requires_grad_(), *kernel.pack_weights(w))
    with pytest.raises(LoweringError, match="for CPU kernels"):
        build(op, layer, target="cuda", prepacked_weights=True)


def test_a_prepacked_kernel_exports_and_loads_with_its_layouts(tmp_path):
    """The description beside the library carries each weight's packed layout: the loaded kernel packs
    weights as the built one does and computes the same; an older (version 1) description of it, or a layout
    of another shape, is refused by name."""
    import json

    from kdsl.codegen.tvm import description_path, load

    op, layer = gallery.load("conv2d"), LAYERS["conv2d"]
    built = build(op, layer, prepacked_weights=True)
    assert built.prepacked
    path = built.export(tmp_path / "k.so")
    text = json.loads(description_path(path).read_text())
    assert text["kdsl_kernel"] == 2 and len(text["weight_layouts"]) == 1 and text["weight_layouts"][0]["name"] == "w"
    loaded = load(path)
    assert loaded.prepacked and loaded.weight_shapes == built.weight_shapes
    x, w = torch.randn(1, 8, 5, 6), torch.randn(32, 8, 3, 3)
    expected = torch.nn.functional.conv2d(x, w, padding=1)
    torch.testing.assert_close(loaded(x, *loaded.pack_weights(w)), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(loaded(x, *loaded.pack_weights(w)), built(x, *built.pack_weights(w)))
    with pytest.raises(ShapeError, match="pack_weights"):
        loaded(x, w)  # unpacked weights are refused, not misread
    text["weight_layouts"][0]["shape"] = [32, 8, 3, 1]
    description_path(path).write_text(json.dumps(text))
    with pytest.raises(LoweringError, match=r"packed layout of weight w packs shape \(32, 8, 3, 1\)"):
        load(path)
    del text["weight_layouts"]
    description_path(path).write_text(json.dumps(text))
    with pytest.raises(LoweringError, match="gives no layout for each of its 1 weights"):
        load(path)
    # a plain kernel's description stays version 1, without layouts
    plain = build(op, layer).export(tmp_path / "plain.so")
    assert "weight_layouts" not in json.loads(description_path(plain).read_text())
    assert json.loads(description_path(plain).read_text())["kdsl_kernel"] == 1
