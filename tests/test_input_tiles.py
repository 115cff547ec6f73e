"""The heuristic tiles a data input larger than L2 along the channels its reduction walks
(``MemoryRules._input_reduced_tiles``: ``[N, C, H, W] -> [N, C/v, H, W, v]``), or the zero-padded copy it is
read through (then made in a pass of its own, so that the reader has no bounds checks), and the kernels it
makes compute what the NumPy reference computes."""

from __future__ import annotations

import pytest
from backends import backend

backend("tvm")
backend("torch")

from test_tvm_schedule_forms import check_config  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen.tvm import lower  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.runtime.cpu import from_features  # noqa: E402


def _machine(l2: int):
    """An AVX-512 core with an L2 of ``l2`` bytes (the rule reads only the L2 and the lanes)."""
    machine = from_features(
        "cascadelake", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=2.5, caches={"l1d": 32 << 10, "l2": l2}
    )
    assert machine.l2 == l2
    return machine


CONVS = [
    ("conv2d", {"N": 2, "Cin": 32, "Cout": 32, "H": 12, "W": 12, "K": 3}, "pad0"),  # x 36 KiB, read through a pad
    ("conv3d", {"N": 1, "Cin": 16, "Cout": 16, "D": 4, "H": 10, "W": 10, "K": 3}, "pad0"),
    ("alexnet_c1", {"N": 2, "Cin": 32, "Cout": 16, "H": 13, "W": 13, "Ho": 6, "Wo": 6, "K": 3, "s": 2}, "x"),  # strided
]


@pytest.mark.parametrize(("name", "layer", "tiled"), CONVS)
def test_an_input_beyond_l2_is_tiled_along_its_channels_and_computes_the_reference(name, layer, tiled):
    op = gallery.load(name)
    lowered = lower(op, layer, dtype="float64")
    space = ScheduleSpace(lowered, machine=_machine(16 << 10))
    config = space.heuristic()
    lanes = space.lanes  # 8 doubles on AVX-512
    assert config[f"layout.{tiled}.tile"] == f"1:{lanes}", config
    if tiled != "x":  # the padded copy is tiled instead of the input, and made in a pass of its own
        assert config["layout.x.tile"] == "none" and config[f"{tiled}.inline"] is False, config
        update = space.apply(config).mod.script().split('T.sblock("stage0_update")')[1].split("T.sblock")[0]
        assert "if_then_else" not in update, update  # no bounds checks left in the multiply-adds
    check_config(op, layer, space, config)
    # within L2 the input keeps its layout, and its pad is inlined
    within = ScheduleSpace(lowered, machine=_machine(1 << 20)).heuristic()
    assert within["layout.x.tile"] == within.get("layout.pad0.tile", "none") == "none", within
    assert within.get("pad0.inline", True) is True, within


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("matmul", {"M": 64, "Cin": 64, "Cout": 64}),  # the reduction walks x's last dim: already contiguous
        ("depthwise_conv2d", {"N": 2, "Cin": 32, "H": 12, "W": 12, "K": 3}),  # no reduction over channels
        ("conv_transpose2d", {"N": 2, "Cin": 32, "Cout": 16, "H": 12, "W": 12, "K": 4, "s": 2}),  # the phase copy
    ],
)
def test_inputs_the_reduction_reads_contiguously_or_through_another_copy_keep_their_layout(name, layer):
    space = ScheduleSpace(lower(gallery.load(name), layer, dtype="float64"), machine=_machine(4 << 10))
    config = space.heuristic()
    assert config.get("layout.x.tile", "none") == "none", config
