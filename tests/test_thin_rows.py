"""Thin products (a short reduction under a weight that fits in L2): the heuristic moves the weight-only vector
axis's tiles out of the fused parallel loop into the middle loops, so every task writes whole output rows
(:meth:`~kdsl.codegen.tvm.space_memory.MemoryRules._rows_whole`). The pick follows the block analysis and the
machine's caches, not the operator's name; its schedules compute what the NumPy reference computes for short
and ragged reductions, for AVX-512's and AVX2's lane widths. A register tile's vector wider than the packed
weights' tile along its axis is vectorized in pieces that each load one tile
(:meth:`~kdsl.codegen.tvm.schedule_apply._Applier._vectorize_packed`)."""

from __future__ import annotations

from math import gcd

import pytest
from backends import backend

backend("tvm")
backend("torch")

from test_tvm_schedule_forms import check_config  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen.tvm import lower  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.runtime.cpu import from_features  # noqa: E402

AVX512 = from_features("skylake-avx512", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=2.6)
AVX2 = from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0)


def _vector_tile(name: str, layer: dict, machine, dtype: str = "float32") -> tuple[tuple[int, int, int], ScheduleSpace]:
    """The heuristic's tile of the vector axis of the operator's one reduction stage, and the space."""
    space = ScheduleSpace(lower(gallery.load(name), layer, dtype=dtype), machine)
    config = space.heuristic()
    vector = config["stage0.vector"]
    assert vector == "Cout", config
    return config[f"stage0.tile.{vector}"], space


@pytest.mark.parametrize("machine", [AVX512, AVX2], ids=["avx512", "haswell"])
@pytest.mark.parametrize(
    ("name", "layer"), [("matmul", {"M": 512, "Cin": 6, "Cout": 128}), ("linear", {"N": 512, "Cin": 6, "Cout": 128})]
)  # Cin 6: no multiple of 4, so the in-place accumulation below is this rule's, not the unrolled reduction's
def test_a_thin_product_takes_its_weight_axis_out_of_the_parallel_loop(machine, name, layer):
    # matmul's weight is [Cin, Cout], linear's [Cout, Cin]: the same analysis, whatever the name or layout
    tile, space = _vector_tile(name, layer, machine)
    outer, middle, inner = tile
    assert outer == 1 and middle * inner == 128 and inner % machine.lanes() == 0, tile
    assert space.parameters["stage0.tile.Cout"].validate(tile) == tile  # a point of the space tuners reach
    assert space.heuristic()["stage0.block"] == "none"
    # accumulated in place: a local tile would live in a workspace buffer that every tile zeroes and stores to
    assert space.heuristic()["stage0.cache"] == "none"


@pytest.mark.parametrize(
    ("layer", "machine", "cache", "why"),
    [
        # Cin 1022 and 6, no multiples of 4: the unrolled reduction's rule (in place too) stays out
        ({"M": 512, "Cin": 1022, "Cout": 128}, AVX512, "local", "a long reduction: data rows over half of L1"),
        ({"M": 512, "Cin": 6, "Cout": 128}, from_features("x", {"avx2", "fma", "avx512f"}, cores=2, ghz=2.0,
                                                           caches={"l2": 4 * 1024}), "local", "weights over L2 / 2"),
        ({"M": 16, "Cin": 6, "Cout": 128}, AVX512, "local", "too few data tiles: fewer than 4 tasks a core"),
        ({"M": 512, "Cin": 1024, "Cout": 128}, AVX512, "none", "one long reduction: in place by its own rule"),
        # a thin product all in L2 keeps its panels but still accumulates in place (no workspace tile)
        ({"M": 784, "Cin": 128, "Cout": 128}, AVX512, "none", "all in L2 (848 KiB), weights 64 KiB: panels win"),
        ({"M": 784, "Cin": 128, "Cout": 128}, from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0,
                                                             caches={"l2": 1024 * 1024}), "none", "the same for AVX2"),
    ],
)  # fmt: skip
def test_the_weight_panels_stay_outermost_elsewhere(layer, machine, cache, why):
    tile, space = _vector_tile("matmul", layer, machine)
    assert tile[0] > 1, why
    assert space.heuristic()["stage0.cache"] == cache, why


@pytest.mark.parametrize("machine", [AVX512, AVX2], ids=["avx512", "haswell"])
@pytest.mark.parametrize("cin", [1, 3, 4, 7, 32])
def test_thin_rows_match_the_reference(machine, cin):
    # short and ragged reductions (1, 3, 7: no vector of them) in float64 (8 lanes for AVX-512, 4 for AVX2)
    op, layer = gallery.load("matmul"), {"M": 96, "Cin": cin, "Cout": 48}
    tile, space = _vector_tile("matmul", layer, machine, dtype="float64")
    assert tile[0] == 1 and tile[1] > 1, tile
    check_config(op, layer, space, space.heuristic())


def _vector_loop(schedule, block: str) -> int:
    """The extent of ``block``'s innermost loop, which must be vectorized (the block's vector width)."""
    from tvm.tirx import ForKind

    loop = schedule.get(schedule.get_loops(schedule.get_sblock(block))[-1])
    assert loop.kind == ForKind.VECTORIZED, loop.kind
    return int(loop.extent)


@pytest.mark.parametrize("machine", [AVX512, AVX2], ids=["avx512", "haswell"])
@pytest.mark.parametrize(("vectors", "packed"), [(4, 2), (2, 1), (3, 2)])
def test_a_vector_wider_than_its_packed_weight_tile_reads_whole_tiles(machine, vectors, packed):
    # a register tile of `vectors` vectors along Cout under weights packed [Cout // f, Cin, Cout % f] with f of
    # `packed` vectors: one load of the whole tile would cross f (TVM then loaded it lane by lane, 7x slower on
    # U3); it is split into pieces of gcd(tile, f) lanes, each one tile's contiguous run, and stays exact
    lanes = machine.lanes("float64")
    width, factor = vectors * lanes, packed * lanes
    op, layer = gallery.load("matmul"), {"M": 32, "Cin": 5, "Cout": 4 * 3 * lanes}
    space = ScheduleSpace(lower(op, layer, dtype="float64"), machine)
    config = {**space.heuristic(), "stage0.tile.Cout": (1, layer["Cout"] // width, width)}
    config.update({"stage0.tile.M": (16, 1, 2), "layout.w.perm": (1, 0), "layout.w.tile": f"1:{factor}"})
    assert space.parameters["stage0.tile.Cout"].validate(config["stage0.tile.Cout"]) == config["stage0.tile.Cout"]
    assert space.parameters["layout.w.tile"].validate(config["layout.w.tile"]) == config["layout.w.tile"]
    assert _vector_loop(space.apply(config), "stage0_update") == gcd(width, factor)
    check_config(op, layer, space, config)


@pytest.mark.parametrize(
    ("layer", "caches", "why"),
    [
        ({"M": 784, "Cin": 64, "Cout": 64}, {}, "in L2, but its 16 KiB of weights fit in half of L1"),
        ({"M": 784, "Cin": 128, "Cout": 128}, {"l2": 512 * 1024}, "848 KiB of inputs, weights and output exceed L2"),
        ({"M": 784, "Cin": 256, "Cout": 256}, {}, "1.75 MiB exceed L2 (1.18x faster with whole rows, Cascade Lake)"),
    ],
)
@pytest.mark.parametrize("features", [{"avx2", "fma", "avx512f"}, {"avx2", "fma"}], ids=["avx512", "avx2"])
def test_whole_rows_where_the_kernel_leaves_l2_or_its_weights_fit_l1(layer, caches, why, features):
    # the narrowing of the rule reads the machine's caches: the same 784x128x128 keeps its panels outermost with
    # a 1 MiB L2 (the case above) and takes whole rows with half of that
    machine = from_features("x", features, cores=2, ghz=2.0, caches=caches)
    tile, _ = _vector_tile("matmul", layer, machine)
    assert tile[0] == 1 and tile[1] > 1, (tile, why)


@pytest.mark.parametrize("features", [{"avx2", "fma", "avx512f"}, {"avx2", "fma"}], ids=["avx512", "avx2"])
def test_a_resident_thin_product_in_place_with_its_panels_matches_the_reference(features):
    # a 4 KiB L1 makes 64x32x64 in float64 the 784x128x128 case in small: all in L2, weights (16 KiB) over half
    # of L1, so the weight panels stay outermost, and the tile still accumulates in place
    machine = from_features("x", features, cores=2, ghz=2.0, caches={"l1d": 4 * 1024})
    op, layer = gallery.load("matmul"), {"M": 64, "Cin": 32, "Cout": 64}
    tile, space = _vector_tile("matmul", layer, machine, dtype="float64")
    config = space.heuristic()
    assert tile[0] > 1 and config["stage0.cache"] == "none", (tile, config["stage0.cache"])
    check_config(op, layer, space, config)
