"""K blocking (``S.rblock = "a:n"``, Goto's ``Kc``): a long reduction split into blocks of ``n`` steps, the
blocks at the axis's place in ``S.order`` and the steps within a block (then the inner tile) below every middle
loop, so that one block's operands are reused across the middle spatial tiles while they are in cache.

Checked here: which stages the space offers it to, the rule that a block holds whole inner tiles (listed,
repaired, refused with a reason), kernels that compute what the reference computes (in place and with a local
tile, a matmul and a convolution whose windows stay outside the block), the heuristic's pick (from the
machine's L1 and L2 and the stage's block analysis, never the operator's name) and Gensor's loop nest of it."""

from __future__ import annotations

import random

import pytest
from backends import backend

backend("tvm")
backend("torch")

from test_tvm_schedule_forms import check_config  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen.tvm import lower  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.codegen.tvm.space_rules import conflicts, repair  # noqa: E402
from kdsl.lang.errors import LoweringError  # noqa: E402
from kdsl.runtime.cpu import from_features  # noqa: E402
from kdsl.tune import gensor, gensor_model  # noqa: E402
from kdsl.tune.gensor_forms import level_times  # noqa: E402

CACHES = {"l1d": 32 << 10, "l2": 1 << 20, "l3": 32 << 20}
AVX512 = from_features("skylake-avx512", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=2.6, caches=CACHES)
AVX2 = from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0, caches=CACHES)
MACHINES = pytest.mark.parametrize("machine", [AVX512, AVX2], ids=["avx512", "haswell"])


def _space(name: str, layer: dict, machine=AVX512, dtype: str = "float32") -> ScheduleSpace:
    return ScheduleSpace(lower(gallery.load(name), layer, dtype=dtype), machine)


def _reduce_name(space: ScheduleSpace) -> str:
    (stage,) = [s for s in space.stages if s.kind == "reduce"]
    return stage.name


def test_the_space_offers_blocks_shorter_than_a_reduction_it_divides():
    space = _space("matmul", {"M": 64, "Cin": 384, "Cout": 64})
    s = _reduce_name(space)
    assert space.parameters[f"{s}.rblock"].choices == ("none", "Cin:64", "Cin:128")  # 256 does not divide 384
    # a reduction of 64 steps has no shorter block on offer
    assert f"{s}.rblock" not in _space("matmul", {"M": 64, "Cin": 64, "Cout": 64}).parameters
    conv = _space("conv2d", {"N": 1, "Cin": 128, "Cout": 32, "H": 8, "W": 8, "K": 3})
    assert conv.parameters[f"{_reduce_name(conv)}.rblock"].choices == ("none", "Cin:64")  # not the 3-step windows


def test_a_block_must_hold_whole_inner_tiles():
    space = _space("matmul", {"M": 64, "Cin": 512, "Cout": 64})
    s = _reduce_name(space)
    config = {**space.heuristic(), f"{s}.tile.Cin": (4, 128), f"{s}.rblock": "Cin:64"}
    assert conflicts(space, config) == [f"{s}: S.rblock Cin:64 needs the inner tile of Cin to divide 64"]
    repaired = repair(space, config)
    assert repaired[f"{s}.rblock"] == "Cin:128" and conflicts(space, repaired) == []  # the nearest that holds it
    with pytest.raises(LoweringError, match=r"S.rblock Cin:64 needs the inner tile of Cin \(128\) to divide 64"):
        space.apply(config)


@MACHINES
@pytest.mark.parametrize("cache", ["none", "local"])
@pytest.mark.parametrize("reductions", ["whole", "split"])
def test_blocked_matmuls_compute_the_reference(machine, cache, reductions):
    layer = {"M": 32, "Cin": 256, "Cout": 32}
    space = _space("matmul", layer, machine, dtype="float64")
    s = _reduce_name(space)
    config = {
        **space.heuristic(),
        f"{s}.tile.M": (2, 4, 4),
        f"{s}.tile.Cin": (64, 4),
        f"{s}.rblock": "Cin:64",
        f"{s}.order": (2, 0, 1),  # the blocks first: the middle data tiles below them
        f"{s}.reductions": reductions,
        f"{s}.cache": cache,
        f"{s}.block": "none",
    }
    config = space.validate(repair(space, config, keep={f"{s}.rblock", f"{s}.order"}))
    assert config[f"{s}.rblock"] == "Cin:64"
    check_config(space.lowered.op, layer, space, config)


def test_a_blocked_convolution_keeps_its_windows_and_computes_the_reference():
    layer = {"N": 1, "Cin": 128, "Cout": 16, "H": 6, "W": 6, "K": 3}
    space = _space("conv2d", layer, dtype="float64")
    s = _reduce_name(space)
    stage = next(st for st in space.stages if st.name == s)
    labels = [a for a, e in stage.spatial + stage.reduced if e > 1]  # S.order's middle loops
    first = labels.index("Cin")
    order = (first, *(i for i in range(len(labels)) if i != first))  # the blocks above the middle data tiles
    config = {**space.heuristic(), f"{s}.rblock": "Cin:64", f"{s}.order": order}
    assert config[f"{s}.tile.kh"] == (1, 3) and config[f"{s}.reductions"] == "whole"  # windows unrolled in place
    config = space.validate(repair(space, config, keep={f"{s}.rblock"}))
    assert config[f"{s}.rblock"] == "Cin:64"
    check_config(space.lowered.op, layer, space, config)


def test_the_heuristic_blocks_a_long_reduction_by_the_l1_and_the_l2():
    space = _space("matmul", {"M": 512, "Cin": 4096, "Cout": 1024})
    s = _reduce_name(space)
    config = space.heuristic()
    vf = config[f"{s}.tile.Cout"][2]
    depth = int(config[f"{s}.rblock"].split(":")[1])
    # one register tile's weight panel of a block fills L1, no more
    assert depth * vf * 4 <= CACHES["l1d"] < 2 * depth * vf * 4, (depth, vf)
    outer, middle, rows = config[f"{s}.tile.M"]
    assert middle > 1 and middle * rows * depth * 4 <= CACHES["l2"] // 2, config  # the block's data rows: half of L2
    panels_outer, panels, _ = config[f"{s}.tile.Cout"]
    # each task packs one block of its weight panels (pack_inside), as many panels as half of L2 holds while
    # two tasks a core remain: here the tasks bound them, 4 tasks of 8 panels of 32 columns, 256 KiB a block
    assert config["layout.w.pack"] == "block" and config["layout.w.tile"] == "1:32", config
    assert panels == 8 and depth * vf * panels * 4 <= CACHES["l2"] // 2, config
    assert outer * panels_outer == 2 * 2, config
    assert config[f"{s}.order"][0] == 2 and config[f"{s}.cache"] == "none"  # the blocks first, in place
    check_config(space.lowered.op, {"M": 512, "Cin": 4096, "Cout": 1024}, space, config, dtype="float32")


def test_the_heuristic_packs_the_data_rows_of_a_blocked_product_with_many_columns():
    # 2048 columns: the copy of the data rows is cheap beside the multiply-adds, so each register tile's rows of
    # a K block are packed into one contiguous panel ([M, K] -> [M/8, K, 8], Goto's packed A)
    layer = {"M": 64, "Cin": 4096, "Cout": 2048}
    space = _space("matmul", layer)
    s = _reduce_name(space)
    config = space.heuristic()
    rows = config[f"{s}.tile.M"][2]
    assert config[f"{s}.rblock"] != "none" and config["layout.x.tile"] == f"0:{rows}", config
    assert config["layout.x.perm"] == (0, 1) and rows > 1
    check_config(space.lowered.op, layer, space, config, dtype="float32")
    # 1024 columns (OpEvo's MM3): blocked, but the rows stay as they are; unblocked, too
    assert _space("matmul", {"M": 512, "Cin": 4096, "Cout": 1024}).heuristic()["layout.x.tile"] == "none"
    unblocked = _space("matmul", {"M": 256, "Cin": 2048, "Cout": 2048}).heuristic()
    assert unblocked.get(f"{s}.rblock", "none") == "none" and unblocked["layout.x.tile"] == "none"


@pytest.mark.parametrize(
    ("name", "layer", "why"),
    [
        ("matmul", {"M": 16384, "Cin": 64, "Cout": 32}, "a reduction as short as a block"),
        ("matmul", {"M": 512, "Cin": 1024, "Cout": 1024}, "a register tile's operands fit half of L2 (160 KiB)"),
        ("matmul", {"M": 4096, "Cin": 512, "Cout": 32}, "a thin product: its rows whole in one task"),
        ("conv2d", {"N": 1, "Cin": 512, "Cout": 64, "H": 14, "W": 14, "K": 3}, "windows: a local tile"),
    ],
)
def test_the_heuristic_leaves_other_reductions_unblocked(name, layer, why):
    space = _space(name, layer)
    assert space.heuristic().get(f"{_reduce_name(space)}.rblock", "none") == "none", why


def test_gensors_nest_puts_the_blocks_in_the_middle_and_their_steps_below():
    space = _space("matmul", {"M": 64, "Cin": 512, "Cout": 64})
    stage = next(st for st in space.stages if st.kind == "reduce")
    s = stage.name
    config = {
        **space.heuristic(),
        f"{s}.tile.M": (2, 4, 8),
        f"{s}.tile.Cout": (2, 1, 32),
        f"{s}.tile.Cin": (128, 4),
        f"{s}.order": (2, 0, 1),
        f"{s}.reductions": "whole",
        f"{s}.rblock": "Cin:128",
    }
    nest, _ = gensor_model.stage_nest(stage, config)
    cin = 2  # axis index: M, Cout, then the reduction
    reductions = [(k, e) for k, e in nest if k == cin]
    assert reductions == [(cin, 4), (cin, 32), (cin, 4)], nest  # 4 blocks, 32 steps of 4 within each
    m_middle = next(i for i, (k, e) in enumerate(nest) if (k, e) == (0, 4))
    assert nest.index((cin, 4)) < m_middle < nest.index((cin, 32)), nest
    # the model prices the reuse: a long matmul blocked moves less between L2 and L1 than its tiles unblocked,
    # the data tiles back in the parallel loop and the reduction in the middle loops' identity order
    long = _space("matmul", {"M": 512, "Cin": 4096, "Cout": 1024})
    blocked = long.heuristic()
    outer, middle, rows = blocked[f"{s}.tile.M"]
    unblocked = {**blocked, f"{s}.rblock": "none", f"{s}.tile.M": (outer * middle, 1, rows), f"{s}.order": (0, 1, 2)}
    model, stage = gensor_model.space_model(long), long.stages[0]
    times = {name: level_times(long, stage, c, model) for name, c in (("blocked", blocked), ("unblocked", unblocked))}
    assert times["blocked"]["L2"] < times["unblocked"]["L2"] / 2, times


def test_gensors_constructions_block_their_own_tiles_and_are_never_refused():
    # the heuristic blocks this long matmul and puts the blocks first in S.order; Gensor's constructions start
    # from its choices with the tiles undone, and before they chose their own blocks, every one was refused:
    # the start's blocks did not hold the built inner tiles, and the register-level accumulator, below
    # reductions outside the middle tiles, spanned those tiles
    space = _space("matmul", {"M": 512, "Cin": 4096, "Cout": 1024})
    s = _reduce_name(space)
    assert space.heuristic()[f"{s}.rblock"] != "none"
    built = [config for _, config in gensor.constructions(space, space.heuristic(), random.Random(0), count=8)]
    assert all(conflicts(space, config) == [] for config in built), [conflicts(space, c) for c in built]
    tiled = [c for c in built if c[f"{s}.tile.Cin"][0] > 1]  # not a lanes form
    blocked = [c for c in tiled if c[f"{s}.rblock"] != "none"]
    assert blocked, [(c[f"{s}.vector"], c[f"{s}.tile.M"], c[f"{s}.tile.Cout"]) for c in tiled]
    for config in blocked:  # the rule's depth for the built tile: its weight panel fills L1
        vf = config[f"{s}.tile.Cout"][2]
        depth = int(config[f"{s}.rblock"].split(":")[1])
        assert config[f"{s}.vector"] == "Cout" and config[f"{s}.cache"] == "none"
        assert depth * vf * 4 <= CACHES["l1d"] < 2 * depth * vf * 4 or depth == 1024, (depth, vf)


def test_block_reduction_applies_the_rule_to_given_tiles_only_where_it_holds():
    space = _space("matmul", {"M": 512, "Cin": 4096, "Cout": 1024})
    stage = space.stages[0]
    s = stage.name
    # a register tile of 8 rows x 32 columns over 4096 steps: 640 KiB of operands, over half of L2, and 8 data
    # tiles in the middle loops to read each block's weight panels again
    given = {
        **space.heuristic(),
        f"{s}.rblock": "none",
        f"{s}.tile.M": (8, 8, 8),
        f"{s}.tile.Cout": (2, 16, 32),
        f"{s}.tile.Cin": (128, 32),
    }
    blocked = space.block_reduction(stage, given)
    assert blocked[f"{s}.rblock"] == "Cin:256" and blocked[f"{s}.tile.M"] == (8, 8, 8)  # 16 tasks: none moved
    assert given[f"{s}.rblock"] == "none"  # a copy
    # one data tile in the middle and 64 tasks: two move into each block, the tasks stay at 16 a core
    alone = space.block_reduction(stage, {**given, f"{s}.tile.M": (64, 1, 8), f"{s}.tile.Cout": (1, 32, 32)})
    assert alone[f"{s}.tile.M"] == (32, 2, 8) and alone[f"{s}.rblock"] == "Cin:256"
    # a local accumulator: the rule is for a stage that accumulates in place
    assert space.block_reduction(stage, {**given, f"{s}.cache": "local"})[f"{s}.rblock"] == "none"
