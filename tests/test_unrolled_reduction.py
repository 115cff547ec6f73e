"""One long reduction and no window (a matmul, a batched matmul, a 1x1 convolution): the heuristic unrolls
:data:`~kdsl.codegen.tvm.schedule_space.UNROLL_REDUCTION` steps of it inside its rolled loop (the reduction's
tile ``(e // 4, 4)``, unroll bound 4), so that the loop's own work is spread over four register tiles of FMAs,
and accumulates in place where it writes the output's rows itself (``S.cache = "none"``: no workspace tile).
Stages with windows keep their reduction rolled whole and their local tile (a convolution's ``Cin`` around its
unrolled ``kh, kw``). The pick reads the block analysis (the stage's reduction axes), not the operator's name;
its kernels compute what the reference computes, for AVX-512's and AVX2's lane widths."""

from __future__ import annotations

import pytest
from backends import backend

backend("tvm")
backend("torch")

from test_tvm_schedule_forms import check_config  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen.tvm import lower  # noqa: E402
from kdsl.codegen.tvm.schedule_space import UNROLL_REDUCTION, ScheduleSpace  # noqa: E402
from kdsl.runtime.cpu import from_features  # noqa: E402

AVX512 = from_features("skylake-avx512", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=2.6)
AVX2 = from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0)
MACHINES = pytest.mark.parametrize("machine", [AVX512, AVX2], ids=["avx512", "haswell"])


def _reduction_tiles(name: str, layer: dict, machine, dtype: str = "float32") -> tuple[dict, ScheduleSpace]:
    """The heuristic's configuration of the operator's one reduction stage, and the space."""
    space = ScheduleSpace(lower(gallery.load(name), layer, dtype=dtype), machine)
    return space.heuristic(), space


@MACHINES
@pytest.mark.parametrize(
    ("name", "layer", "axis"),
    [
        ("matmul", {"M": 64, "Cin": 96, "Cout": 64}, "Cin"),
        ("linear", {"N": 64, "Cin": 96, "Cout": 64}, "Cin"),  # the weight [Cout, Cin]: same analysis
        ("bmm_tn", {"B": 2, "M": 32, "K": 48, "N": 32}, "K"),  # the transposed product reads K across rows
    ],
)
def test_one_long_reduction_is_unrolled_four_steps_inside_its_loop(machine, name, layer, axis):
    config, space = _reduction_tiles(name, layer, machine)
    (stage,) = [s for s in space.stages if s.kind == "reduce"]
    extent = dict(stage.reduced)[axis]
    assert config[f"{stage.name}.tile.{axis}"] == (extent // UNROLL_REDUCTION, UNROLL_REDUCTION), config
    assert config[f"{stage.name}.unroll"] >= UNROLL_REDUCTION and config[f"{stage.name}.reductions"] == "whole"
    # it writes the output's rows itself: accumulated in place (LLVM keeps the tile in registers)
    assert config[f"{stage.name}.cache"] == "none", config
    assert space.validate(config) == config  # a point of the space: tuners reach it and leave it
    check_config(space.lowered.op, layer, ScheduleSpace(lower(space.lowered.op, layer, dtype="float64"), machine),
                 config)  # fmt: skip


@MACHINES
@pytest.mark.parametrize(
    ("name", "layer", "why"),
    [
        ("conv2d", {"N": 1, "Cin": 16, "Cout": 32, "H": 8, "W": 8, "K": 3}, "windows: Cin stays rolled around kh, kw"),
        ("matmul", {"M": 64, "Cin": 30, "Cout": 64}, "30 steps are no multiple of 4"),
        ("matmul", {"M": 64, "Cin": 4, "Cout": 64}, "4 steps: a window, unrolled whole"),
    ],
)
def test_other_reductions_keep_their_tiles(machine, name, layer, why):
    config, space = _reduction_tiles(name, layer, machine)
    stage = next(s for s in space.stages if s.kind == "reduce")
    tiles = {a: config[f"{stage.name}.tile.{a}"] for a, e in stage.reduced if e > 1}
    assert name != "conv2d" or config[f"{stage.name}.cache"] == "local", config
    assert all(
        t in ((e, 1), (1, e)) for (a, e), t in zip([(a, e) for a, e in stage.reduced if e > 1], tiles.values())
    ), (
        why,
        tiles,
    )
