"""The heuristic configuration of a phase form's reduction (kdsl.codegen.tvm.phases): its phase axes stay out
of the register tile, and every operator without a phase form keeps the configuration it had before that
rule (the fields below were computed once with the code of commit 39329ce, on the two machines here)."""

import pytest
from backends import backend

backend("tvm")

from kdsl import gallery  # noqa: E402
from kdsl.codegen.tvm import lower  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.runtime.cpu import from_features  # noqa: E402

CACHES = {"l1d": 32 << 10, "l2": 1 << 20}
MACHINES = {
    "avx2": from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0, caches=CACHES),
    "avx512": from_features("skylake-avx512", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=2.6, caches=CACHES),
}

BEFORE = [
    (
        "conv2d",
        {"N": 1, "Cin": 64, "Cout": 64, "H": 14, "W": 14},
        "avx2",
        {
            "stage0.tile.H": (7, 1, 2),
            "stage0.tile.W": (7, 1, 2),
            "stage0.tile.Cout": (4, 1, 16),
            "stage0.tile.Cin": (64, 1),
            "stage0.tile.kh": (1, 3),
            "stage0.tile.kw": (1, 3),
            "stage0.vector": "Cout",
            "layout.w.tile": "0:16",
        },
    ),
    (
        "conv2d",
        {"N": 1, "Cin": 64, "Cout": 64, "H": 14, "W": 14},
        "avx512",
        {
            "stage0.tile.H": (14, 1, 1),
            "stage0.tile.W": (2, 1, 7),
            "stage0.tile.Cout": (2, 1, 32),
            "stage0.tile.Cin": (64, 1),
            "stage0.tile.kh": (1, 3),
            "stage0.tile.kw": (1, 3),
            "stage0.vector": "Cout",
            "layout.w.tile": "0:32",
        },
    ),
    (
        "conv2d",
        {"N": 2, "Cin": 32, "Cout": 48, "H": 7, "W": 9},
        "avx2",
        {
            "stage0.tile.N": (2, 1, 1),
            "stage0.tile.H": (7, 1, 1),
            "stage0.tile.W": (3, 1, 3),
            "stage0.tile.Cout": (3, 1, 16),
            "stage0.tile.Cin": (32, 1),
            "stage0.tile.kh": (1, 3),
            "stage0.tile.kw": (1, 3),
            "stage0.vector": "Cout",
            "layout.w.tile": "0:16",
        },
    ),
    (
        "conv2d",
        {"N": 2, "Cin": 32, "Cout": 48, "H": 7, "W": 9},
        "avx512",
        {
            "stage0.tile.N": (2, 1, 1),
            "stage0.tile.H": (7, 1, 1),
            "stage0.tile.W": (1, 1, 9),
            "stage0.tile.Cout": (3, 1, 16),
            "stage0.tile.Cin": (32, 1),
            "stage0.tile.kh": (1, 3),
            "stage0.tile.kw": (1, 3),
            "stage0.vector": "Cout",
            "layout.w.tile": "0:16",
        },
    ),
    (
        "matmul",
        {"M": 64, "Cin": 96, "Cout": 80},
        "avx2",
        {
            "stage0.tile.M": (16, 1, 4),
            "stage0.tile.Cout": (5, 1, 16),
            "stage0.tile.Cin": (96, 1),
            "stage0.vector": "Cout",
            "layout.w.tile": "1:16",
        },
    ),
    (
        "matmul",
        {"M": 64, "Cin": 96, "Cout": 80},
        "avx512",
        {
            "stage0.tile.M": (4, 1, 16),
            "stage0.tile.Cout": (5, 1, 16),
            "stage0.tile.Cin": (96, 1),
            "stage0.vector": "Cout",
            "layout.w.tile": "1:16",
        },
    ),
    (
        "depthwise_conv2d",
        {"N": 1, "Cin": 32, "H": 14, "W": 14},
        "avx2",
        {
            "stage0.tile.Cin": (2, 1, 16),
            "stage0.tile.H": (7, 1, 2),
            "stage0.tile.W": (7, 1, 2),
            "stage0.tile.kh": (1, 3),
            "stage0.tile.kw": (1, 3),
            "stage0.vector": "Cin",
            "layout.w.tile": "0:16",
        },
    ),
    (
        "depthwise_conv2d",
        {"N": 1, "Cin": 32, "H": 14, "W": 14},
        "avx512",
        {
            "stage0.tile.Cin": (1, 1, 32),
            "stage0.tile.H": (14, 1, 1),
            "stage0.tile.W": (2, 1, 7),
            "stage0.tile.kh": (1, 3),
            "stage0.tile.kw": (1, 3),
            "stage0.vector": "Cin",
            "layout.w.tile": "0:32",
        },
    ),
    (
        "conv1d",
        {"N": 2, "Cin": 16, "Cout": 32, "L": 24},
        "avx2",
        {
            "stage0.tile.N": (2, 1, 1),
            "stage0.tile.L": (6, 1, 4),
            "stage0.tile.Cout": (2, 1, 16),
            "stage0.tile.Cin": (16, 1),
            "stage0.tile.k": (1, 3),
            "stage0.vector": "Cout",
            "layout.w.tile": "0:16",
        },
    ),
    (
        "conv1d",
        {"N": 2, "Cin": 16, "Cout": 32, "L": 24},
        "avx512",
        {
            "stage0.tile.N": (2, 1, 1),
            "stage0.tile.L": (3, 1, 8),
            "stage0.tile.Cout": (1, 1, 32),
            "stage0.tile.Cin": (16, 1),
            "stage0.tile.k": (1, 3),
            "stage0.vector": "Cout",
            "layout.w.tile": "0:32",
        },
    ),
]

PHASED = [  # (operator, layer, its phased dims)
    ("conv_transpose2d", {"N": 1, "Cin": 16, "Cout": 32, "H": 7, "W": 8, "K": 4, "s": 2}, 2),
    ("conv_transpose2d", {"N": 1, "Cin": 8, "Cout": 16, "H": 6, "W": 6, "K": 3, "s": 2}, 2),
    ("conv_transpose3d", {"N": 1, "Cin": 8, "Cout": 16, "D": 3, "H": 4, "W": 4, "K": 4, "s": 2}, 3),
]


@pytest.mark.parametrize(("name", "layer", "machine", "expected"), BEFORE)
def test_operators_without_a_phase_form_keep_their_heuristic(name, layer, machine, expected):
    space = ScheduleSpace(lower(gallery.load(name), layer), machine=MACHINES[machine])
    assert not any(stage.phases for stage in space.stages)
    config = space.heuristic()
    got = {k: v for k, v in config.items() if k in expected or (k.endswith(".tile") and v != "none")}
    assert got == expected


@pytest.mark.parametrize("machine", sorted(MACHINES))
@pytest.mark.parametrize(("name", "layer", "dims"), PHASED)
def test_phase_axes_stay_out_of_the_register_tile(name, layer, dims, machine):
    space = ScheduleSpace(lower(gallery.load(name), layer), machine=MACHINES[machine])
    stage = next(s for s in space.stages if s.kind == "reduce")
    assert len(stage.phases) == dims  # one phase axis per phased dim
    config = space.heuristic()
    for phase in stage.phases:
        extent = dict(stage.spatial)[phase]
        assert config[f"{stage.name}.tile.{phase}"] == (extent, 1, 1), phase  # whole in the parallel loop
        assert config[f"{stage.name}.vector"] != phase
    # the tile's room goes to an axis outside the phases and the vector
    vector = config[f"{stage.name}.vector"]
    rows = [a for a, e in stage.spatial if e > 1 and a != vector and a not in stage.phases]
    assert any(config[f"{stage.name}.tile.{a}"][2] > 1 for a in rows), config
