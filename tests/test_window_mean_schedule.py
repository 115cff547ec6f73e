"""The default schedule of a window mean (average pooling: a plain operator's reduction that reads no
weight): its vector runs along the rows it reads, whole where no whole vector divides them, its input is
read as it lies (no packing pass), a window mean read by another is computed at its reader's parallel
loop, and the result equals PyTorch's F.avg_pool2d in float64 at strided, overlapping, gapped and floor
shapes. Convolutions (whose stages read a weight) keep their configurations."""

import os
import random

import numpy as np
import pytest
from backends import backend

backend("tvm")
torch = backend("torch")
F = torch.nn.functional

from test_tvm_schedule import LAYERS  # noqa: E402
from test_tvm_schedule_forms import check_config  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen.tvm import build, lower  # noqa: E402
from kdsl.codegen.tvm.default_schedule import default_schedule  # noqa: E402
from kdsl.codegen.tvm.schedule_space import RAGGED_VECTORS, ScheduleSpace  # noqa: E402
from kdsl.lang.errors import LoweringError  # noqa: E402
from kdsl.runtime.cpu import from_features  # noqa: E402

os.environ.setdefault("TVM_NUM_THREADS", "2")

AVX512 = from_features("skylake-avx512", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=3.0)
AVX2 = from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0)


def _pool_layer(n, c, size, window, stride, width=None):
    """A layer of the gallery's ``avg_pool2d_strided`` with PyTorch's floor for the output size."""
    width = size if width is None else width
    ho, wo = (size - window) // stride + 1, (width - window) // stride + 1
    return {"N": n, "Cin": c, "H": size, "W": width, "Ho": ho, "Wo": wo, "K": window, "s": stride}


#: rows of no whole vector (prime 13, 83; 21), overlapping windows (K=3, s=2), a dropped last row and
#: column (the floor: 83 = 2*41 + 1), gaps between windows (s > K), one window over the whole height
SHAPES = [
    _pool_layer(16, 3, 13, 3, 2),
    _pool_layer(2, 3, 83, 2, 2),
    _pool_layer(4, 5, 21, 3, 2),
    _pool_layer(3, 2, 11, 2, 3, width=17),
    _pool_layer(2, 4, 3, 3, 1, width=40),
]


def _default_output(layer, dtype):
    """The default-scheduled kernel's output at ``layer`` and PyTorch's F.avg_pool2d of the same input."""
    op = gallery.load("avg_pool2d_strided")
    x = torch.from_numpy(
        np.random.default_rng(layer["H"]).standard_normal((layer["N"], layer["Cin"], layer["H"], layer["W"]))
    )
    x = x.to(getattr(torch, dtype))
    report = []
    kernel = build(op, layer, dtype=dtype, schedule=lambda lowered: default_schedule(lowered, report))
    got, expected = kernel(x), F.avg_pool2d(x, layer["K"], stride=layer["s"])
    assert got.shape == expected.shape and not any("fallback" in what for _, what in report), report
    # the first sums, computed at the second's parallel loop, run on vectors (of what the second reads of a row)
    attached = [what for stage, what in report if what.startswith("computed at stage1's parallel loop, vector ")]
    assert len(attached) == 1 and int(attached[0].rsplit(" ", 1)[1]) > 1, report
    return got, expected


@pytest.mark.parametrize("machine", [AVX512, AVX2], ids=["avx512", "avx2"])
def test_a_strided_window_mean_vectorizes_its_rows_and_reads_its_input_unpacked(machine):
    # W = 13 takes no whole vector: the old rule put N's 16 images on the lanes and packed x with N last,
    # a transposing pass over the whole input for a stage that reads each element at most twice
    space = ScheduleSpace(lower(gallery.load("avg_pool2d_strided"), SHAPES[0]), machine=machine)
    config = space.heuristic()
    assert [s.name for s in space.stages] == ["stage0", "stage1"]  # rows (kh), then columns (kw)
    assert config["stage0.vector"] == "W" and config["stage0.tile.W"] == (1, 1, 13), config
    # the columns' windows read stage0 with a stride of 2 along W: a serial row that LLVM vectorizes
    # (ScheduleSpace.strided_rows; tests/test_window_schedules.py)
    assert config["stage1.vector"] == "W" and config["stage1.tile.W"] == (1, 6, 1), config
    assert config["layout.x.perm"] == (0, 1, 2, 3), config
    assert config["stage0.attach"] == "outer", config  # the rows' sums are read back from cache


def test_a_row_longer_than_the_ragged_bound_keeps_the_old_choice():
    # beyond RAGGED_VECTORS vectors a whole prime row would be one very long vector: the rule leaves it
    lanes = AVX2.lanes("float32")
    width = next(
        w for w in range(RAGGED_VECTORS * lanes + 1, 10 * RAGGED_VECTORS * lanes) if all(w % d for d in (2, 3))
    )
    layer = _pool_layer(8, 2, 5, 3, 2, width=width)
    config = ScheduleSpace(lower(gallery.load("avg_pool2d_strided"), layer), machine=AVX2).heuristic()
    assert config["stage0.tile.W"][2] != width, config


@pytest.mark.parametrize("layer", SHAPES, ids=[f"{s['H']}x{s['W']}-K{s['K']}-s{s['s']}" for s in SHAPES])
def test_the_default_window_mean_equals_pytorch_in_float64(layer):
    got, expected = _default_output(layer, "float64")
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12, atol=1e-12)


def test_the_default_window_mean_equals_pytorch_in_float32_on_a_prime_row():
    got, expected = _default_output(SHAPES[1], "float32")
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name, layer",
    [
        ("conv2d", {"N": 1, "Cin": 16, "Cout": 16, "H": 7, "W": 7}),
        ("depthwise_conv2d", {"N": 1, "Cin": 32, "H": 7, "W": 7}),
        ("avg_pool2d", {"N": 2, "Cin": 16, "H": 8, "W": 32}),
    ],
)
def test_only_reductions_without_weights_stream(name, layer):
    # convolutions read a weight (their rules stay); the tile pooling avg_pool2d streams, and its row of
    # 16 outputs (a stride of 2 along x's rows) was already its vector axis: its configuration is unchanged
    space = ScheduleSpace(lower(gallery.load(name), layer))
    reductions = [s for s in space.stages if s.kind == "reduce"]
    streams = [space._streams(s) for s in reductions]
    assert reductions and streams == [name == "avg_pool2d"] * len(reductions), streams
    if name == "avg_pool2d":
        assert space.heuristic()["stage0.vector"] == "Wo"


@pytest.mark.parametrize("name", ["avg_pool2d_strided", "depthwise_separable_conv2d", "squeeze_excitation"])
def test_random_configurations_with_an_attached_reduction_match_the_reference(name):
    """What the tuners try with ``S.attach = "outer"``: the attached reduction's reductions above its vectorized
    innermost loop, unrolled within ``S.unroll``, compute what the reference computes."""
    op = gallery.load(name)
    layer = LAYERS[name][0]
    space = ScheduleSpace(lower(op, layer, dtype="float64"))
    attach = [n for n in space.parameters if n.endswith(".attach")]
    assert attach, f"{name} has no stage to attach"
    rng, checked = random.Random(3), 0
    for _ in range(30):
        config = {**space.random(rng), **dict.fromkeys(attach, "outer")}
        try:
            space.apply(config)
        except LoweringError:
            continue  # a point the space refuses (the tuners skip it too)
        check_config(op, layer, space, config)
        checked += 1
        if checked == 3:
            break
    assert checked == 3, f"{name}: only {checked} of 30 attached configurations applied"
