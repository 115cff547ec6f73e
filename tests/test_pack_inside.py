"""Packing copies inside their reader (``layout.T.pack``): correct per task and per K block, refused where no copy
or no block exists, and prepacked like a pass."""

from __future__ import annotations

import random

import numpy as np
import pytest
from backends import backend

torch = backend("torch")
backend("tvm")

from test_tvm_schedule_forms import check_config  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen.tvm import build, lower  # noqa: E402
from kdsl.codegen.tvm.pass_stages import MAX_VECTORS  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.codegen.tvm.space_rules import conflicts, repair  # noqa: E402
from kdsl.lang.errors import LoweringError  # noqa: E402

MATMUL = {"M": 64, "Cin": 256, "Cout": 64}


def _matmul_space() -> tuple[ScheduleSpace, dict]:
    space = ScheduleSpace(lower(gallery.load("matmul"), MATMUL, dtype="float64"))
    config = {
        **space.heuristic(),
        "stage0.tile.M": (2, 4, 8),
        "stage0.tile.Cout": (2, 2, 16),
        "stage0.tile.Cin": (64, 4),
        "stage0.order": (2, 0, 1),
        "stage0.rblock": "Cin:64",
        "stage0.cache": "none",
        "layout.w.perm": (1, 0),
        "layout.w.tile": "1:16",
    }
    assert not conflicts(space, config), conflicts(space, config)
    return space, config


@pytest.mark.parametrize("place", ["pass", "task", "block"])
def test_a_weight_packed_per_task_or_block_computes_the_product(place):
    space, config = _matmul_space()
    config["layout.w.pack"] = place
    assert not conflicts(space, config)
    check_config(gallery.load("matmul"), MATMUL, space, config)


def test_the_copy_per_block_is_inside_the_block_loop_and_stores_whole_vectors():
    space, config = _matmul_space()
    script = space.apply({**config, "layout.w.pack": "block"}).mod.script()
    lines = script.splitlines()
    blocks = next(i for i, line in enumerate(lines) if "for r_Cin_0 in range(4)" in line)
    copy = next(i for i, line in enumerate(lines) if 'T.sblock("w_global")' in line)
    update = next(i for i, line in enumerate(lines) if 'T.sblock("stage0_update")' in line)
    assert blocks < copy < update, script  # the copy under the blocks' loop, before the multiply-adds
    # the copy loops in the packed order, its last loop (the layout's tile of 16 columns) vectorized: whole up to
    # two of this machine's vectors (AVX-512's 8 float64 lanes: 16), else by two vectors (AVX2's 4 lanes: 8)
    width = min(16, MAX_VECTORS * space.lanes)
    assert f"T.vectorized({width})" in lines[copy - 1], lines[copy - 3 : copy + 1]


def test_inside_a_reader_needs_a_packed_tensor_and_per_block_needs_blocks():
    space, config = _matmul_space()
    plain = {**config, "layout.w.perm": (0, 1), "layout.w.tile": "none", "layout.w.pack": "task"}
    assert conflicts(space, plain) == ["layout.w.pack task: w is not packed, or stage0 is not a tiled reduction"]
    with pytest.raises(LoweringError, match="w is not packed"):
        space.apply(plain)
    assert repair(space, plain)["layout.w.pack"] == "pass"
    unblocked = {**config, "stage0.rblock": "none", "layout.w.pack": "block"}
    assert conflicts(space, unblocked) == ["layout.w.pack block: w is not packed, or stage0 has no S.rblock"]
    with pytest.raises(LoweringError, match="needs stage0.rblock"):
        space.apply(unblocked)
    repaired = repair(space, unblocked)
    assert repaired["layout.w.pack"] == "task" and not conflicts(space, repaired)
    check_config(gallery.load("matmul"), MATMUL, space, repaired)


def test_random_draws_with_copies_inside_match_the_reference():
    op = gallery.load("conv2d")
    layer = {"N": 1, "Cin": 8, "Cout": 16, "H": 6, "W": 6, "K": 3}
    space = ScheduleSpace(lower(op, layer, dtype="float64"))
    assert space.parameters["layout.w.pack"].choices[:2] == ("pass", "task")
    rng, checked = random.Random(3), 0
    for _ in range(200):
        config = space.random(rng)
        config["layout.w.perm"] = tuple(rng.sample(range(4), 4))
        config["layout.w.pack"] = rng.choice(space.parameters["layout.w.pack"].choices[1:])
        config = repair(space, config, keep={"layout.w.pack", "layout.w.perm"})
        if conflicts(space, config) or space.rejection(config) is not None:
            continue
        check_config(op, layer, space, config)
        checked += 1
        if checked == 4:
            break
    assert checked == 4, checked


def test_a_weight_packed_per_block_is_prepacked_like_a_pass():
    space, config = _matmul_space()
    config = {**config, "layout.w.pack": "block"}
    op = gallery.load("matmul")
    kernel = build(op, MATMUL, dtype="float64", schedule=lambda lowered: space.apply(config), prepacked_weights=True)
    assert kernel.weight_layouts[0] is not None and "w_global" not in kernel.schedule.mod.script()
    x, w = torch.randn(64, 256, dtype=torch.float64), torch.randn(256, 64, dtype=torch.float64)
    with torch.no_grad():
        got = kernel(x, *kernel.pack_weights(w))
    np.testing.assert_allclose(got.numpy(), (x @ w).numpy(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    ("rows", "columns", "expected"),
    [
        (64, 64, [8, 4, 8, 16]),  # blocks of PASS_ROWS rows around the column tiles
        (12, 64, [3, 4, 4, 16]),  # 8 does not divide 12: blocks of 4
        (7, 64, [4, 7, 16]),  # no block divides 7: the packed layout's own order
    ],
)
def test_a_pass_tiling_the_last_dim_reads_rows_in_blocks_and_copies_exactly(rows, columns, expected):
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule

    from kdsl.codegen.tvm.pack_inside import pass_order

    source = te.placeholder((rows, columns), "float32", name="w")
    packed = te.compute((columns // 16, rows, 16), lambda a, k, t: source[k, a * 16 + t], name="packed")
    sch = Schedule(te.create_prim_func([source, packed]))
    ordered = pass_order(sch, sch.get_loops(sch.get_sblock("packed")), ((1, 0), 1, 16))
    assert [int(sch.get(loop).extent) for loop in ordered] == expected
    assert [sch.get(loop) for loop in ordered] == [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("packed"))]
    sch.vectorize(ordered[-1])
    executable = tvm.compile(sch.mod, target="llvm")
    data = np.arange(rows * columns, dtype="float32").reshape(rows, columns)
    out = tvm.runtime.tensor(np.zeros((columns // 16, rows, 16), "float32"))
    executable(tvm.runtime.tensor(data), out)
    np.testing.assert_array_equal(out.numpy(), data.reshape(rows, columns // 16, 16).transpose(1, 0, 2))
