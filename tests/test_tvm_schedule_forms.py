"""The schedule forms beyond the default's: a spatial level below the inner reductions (``S.spatial_below``),
unroll bounds of 512 and 1024, and a data input packed with the vector's dim last (depthwise channels on the
vector lanes). Random configurations that use them compute what the NumPy reference computes, the forms
are actually drawn, and the heuristic uses the packing only where its vector axis gathers."""

import os
import random

import numpy as np
import pytest
from backends import backend, data_inputs

backend("tvm")
torch = backend("torch")

from test_tvm_schedule import LAYERS, check_scheduled, input_arrays  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen import reference  # noqa: E402
from kdsl.codegen.tvm import build, lower  # noqa: E402
from kdsl.codegen.tvm.schedule_space import HEURISTIC_UNROLL, ScheduleSpace  # noqa: E402
from kdsl.lang.errors import LoweringError  # noqa: E402
from kdsl.runtime.cpu import from_features  # noqa: E402

#: Machines the heuristic is asked about by name (the kernels still run on this one).
AVX2 = from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0)
AVX512 = from_features("skylake-avx512", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=3.0)

os.environ.setdefault("TVM_NUM_THREADS", "2")

# small layers whose depthwise rows (7) take no whole vector: the heuristic vectorizes the channels
DEPTHWISE_7 = {"N": 1, "Cin": 32, "H": 7, "W": 7}


def _loop_names(sch, block):
    """The loop variables above ``block``, outermost first."""
    names = [str(sch.get(lp).loop_var) for lp in sch.get_loops(sch.get_sblock(block))]
    assert names, f"{block} has no loops"
    return names


def _spatial(space, stage):
    """The (axis, extent) of ``stage``'s spatial axes."""
    spatial = next(s.spatial for s in space.stages if s.name == stage)
    assert spatial, stage
    return spatial


def float32_heuristic(op, layer, machine):
    """The float32 space of ``op`` at ``layer`` for ``machine``, and its heuristic configuration."""
    space = ScheduleSpace(lower(op, layer, dtype="float32"), machine=machine)
    config = space.heuristic()
    assert config, f"{op} at {layer}: an empty configuration"
    return space, config


def check_config(op, layer, space, config, dtype="float64"):
    """The kernel of ``config`` (for ``space``, lowered in ``dtype``) agrees with the reference interpreter."""
    x, weights = input_arrays(op, layer)
    expected = reference.run(op, layer, x, weights)
    kernel = build(op, layer, dtype=dtype, schedule=lambda lowered: space.apply(config))
    tensors = [torch.from_numpy(a.astype(dtype)) for a in (*data_inputs(x), *weights)]
    got = kernel(*tensors)
    tolerance = 1e-9 if dtype == "float64" else 1e-4
    np.testing.assert_allclose(got.numpy(), expected, rtol=tolerance, atol=tolerance, err_msg=str(config))


@pytest.mark.parametrize("name", ["conv2d", "matmul", "depthwise_conv2d", "grouped_conv2d"])
def test_random_configurations_with_the_new_forms_match_the_reference(name):
    op, layer = gallery.load(name), LAYERS[name][0]
    space = ScheduleSpace(lower(op, layer, dtype="float64"))
    below = [n for n in space.parameters if n.endswith(".spatial_below")]
    assert below, f"{name}: no spatial_below parameter"
    rng, checked, drawn_below, drawn_unroll, drawn_block = random.Random(0), 0, 0, 0, 0
    for _ in range(60):
        if checked == 4:
            break
        config = space.random(rng)
        # every draw uses the spatial level; every second one the large unroll bounds
        for param in below:
            config[param] = rng.choice(space.parameters[param].choices[1:])
        if checked % 2 == 0:
            config.update({n: rng.choice((512, 1024)) for n in config if n.endswith(".unroll")})
        else:  # cache blocks of 2 outer tiles (an outer tile of 2 rows, so that 2 divides their count)
            for n in [n for n in config if n.endswith(".block")]:
                stage = n.split(".")[0]
                axis, extent = next((a, e) for a, e in _spatial(space, stage) if e % 4 == 0 and e >= 8)
                config[f"{stage}.tile.{axis}"] = (extent // 2, 1, 2)
                config[n] = f"{axis}:2"
        try:
            space.apply(config)
        except LoweringError:
            continue
        check_config(op, layer, space, config)
        checked += 1
        drawn_below += any(config[p] != "none" for p in below)
        drawn_unroll += any(config[n] >= 512 for n in config if n.endswith(".unroll"))
        drawn_block += any(config[n] != "none" for n in config if n.endswith(".block"))
    assert checked == 4, f"{name}: only {checked} valid configurations in 60 draws"
    assert drawn_below == 4 and drawn_unroll >= 2 and drawn_block >= 1


def test_the_random_walk_reaches_the_new_forms():
    # the tuners draw and mutate parameters generically: plain random draws must hit the new values
    space = ScheduleSpace(lower(gallery.load("conv2d"), LAYERS["conv2d"][0]))
    rng = random.Random(1)
    draws = [space.random(rng) for _ in range(200)]
    assert {c["stage0.spatial_below"] for c in draws} == set(space.parameters["stage0.spatial_below"].choices)
    assert {512, 1024} <= {c["stage0.unroll"] for c in draws}


def test_spatial_below_puts_the_middle_tile_between_the_inner_reductions_and_the_register_tile():
    op, layer = gallery.load("matmul"), {"M": 32, "Cin": 16, "Cout": 32}
    space = ScheduleSpace(lower(op, layer, dtype="float64"))
    config = space.heuristic()
    config.update(
        {
            "stage0.tile.M": (2, 4, 4),
            "stage0.tile.Cin": (4, 4),
            "stage0.reductions": "split",
            "stage0.spatial_below": "M",
            "stage0.order": (2, 0, 1),  # the outer reduction tile above the other middle loops
        }
    )
    names = _loop_names(space.apply(config), "stage0_update")
    # [fused parallel, Cout middle .., r_0 (outer Cin), r_1 (inner Cin), M middle, M register, Cout vector]
    reductions = [i for i, n in enumerate(names) if n.startswith("r_")]
    middle_m = len(names) - 3
    assert reductions and max(reductions) < middle_m, names
    assert names[middle_m].startswith("i0"), names
    check_config(op, layer, space, config)


def test_the_heuristic_keeps_the_default_forms():
    # its schedules stay those of the space before the new parameters (their first, neutral values)
    for name in ("conv2d", "matmul", "grouped_conv2d", "syno_op1"):
        space = ScheduleSpace(lower(gallery.load(name), LAYERS[name][0]))
        config = space.heuristic()
        assert all(config[n] == "none" for n in config if n.endswith(".spatial_below")), name
        assert all(config[n] <= HEURISTIC_UNROLL for n in config if n.endswith(".unroll")), name


def test_depthwise_channels_go_on_the_lanes_with_the_input_packed_channels_last():
    space = ScheduleSpace(lower(gallery.load("depthwise_conv2d"), DEPTHWISE_7))
    config = space.heuristic()
    assert config["stage0.vector"] == "Cin"
    assert config["layout.x.perm"] == (0, 2, 3, 1)
    assert config["pad0.inline"] is True  # the pad's checks along H, W stay outside the channel vector
    report = dict(check_scheduled(gallery.load("depthwise_conv2d"), DEPTHWISE_7))
    assert "vector axis Cin" in report["stage0"], report


@pytest.mark.parametrize("machine", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_depthwise_rows_of_w_accumulate_in_place(machine):
    # rows of the output on the lanes: the register tile accumulates in the output (Zen 3: 1.9x faster than
    # a local tile at 128x28x28); with the channels on the lanes (7x7) it keeps its local tile
    op = gallery.load("depthwise_conv2d")
    layer = {"N": 1, "Cin": 128, "H": 28, "W": 28, "K": 3}
    space, config = float32_heuristic(op, layer, machine)
    assert config["stage0.vector"] == "W" and config["stage0.cache"] == "none", config
    check_config(op, layer, space, config, dtype="float32")
    channels = ScheduleSpace(lower(op, DEPTHWISE_7, dtype="float32"), machine=machine).heuristic()
    assert channels["stage0.vector"] == "Cin" and channels["stage0.cache"] == "local", channels


@pytest.mark.parametrize(
    "name, layer",
    [
        ("conv2d", LAYERS["conv2d"][1]),
        ("depthwise_conv2d", LAYERS["depthwise_conv2d"][0]),
        ("matmul", LAYERS["matmul"][0]),
    ],
)
def test_inputs_keep_their_layout_where_the_vector_reads_them_contiguously(name, layer):
    # conv2d vectorizes Cout (a broadcast of x), depthwise at W=16 its rows, matmul Cout: nothing to pack
    space = ScheduleSpace(lower(gallery.load(name), layer))
    config = space.heuristic()
    perm = config.get("layout.x.perm")
    assert perm == tuple(range(len(perm))), (name, perm)


def test_a_short_row_is_vectorized_whole_rather_than_by_half_vectors():
    # AVX2's 8 lanes: a depthwise row of 28 whole (8 + 8 + 8 + 4 lanes), not 7 vectors of 4 lanes
    op, layer = gallery.load("depthwise_conv2d"), {"N": 1, "Cin": 8, "H": 8, "W": 28}
    space, config = float32_heuristic(op, layer, AVX2)
    assert config["stage0.vector"] == "W" and config["stage0.tile.W"] == (1, 1, 28), config
    check_config(op, layer, space, config, dtype="float32")
    space64 = ScheduleSpace(lower(op, layer, dtype="float64"), machine=AVX2)  # 4 lanes: 28 is 7 vectors
    assert space64.heuristic()["stage0.tile.W"][2] == 4
    check_config(op, layer, space64, space64.heuristic())


def test_one_vector_where_several_leave_the_register_tile_only_a_weight_indexed_axis():
    # AVX2, 16 channels a group: 2 vectors x 4 groups (a weight load per row) -> 1 vector x W of 7 (rows
    # share each weight vector); AVX-512's one vector of 16 keeps its tile
    op, layer = gallery.load("grouped_conv2d"), {"N": 1, "Cin": 64, "Cout": 64, "H": 7, "W": 7, "G": 4}
    space, config = float32_heuristic(op, layer, AVX2)
    assert config["stage0.tile.co"] == (2, 1, 8) and config["stage0.tile.W"] == (1, 1, 7), config
    assert config["layout.w.tile"].endswith(":8"), config  # the packed weight follows the vector tile
    check_config(op, layer, space, config, dtype="float32")


def test_one_vector_where_several_leave_the_register_tile_no_row():
    # conv5_x at batch 1 for AVX2: 2 vectors of Cout left a budget of 4 rows, which no divisor of 7 fits (a tile of
    # 2 accumulators, each weight vector used once); 1 vector x W of 7 keeps 7 accumulators sharing each weight load
    op, layer = gallery.load("conv2d"), {"N": 1, "Cin": 16, "Cout": 32, "H": 7, "W": 7}
    space, config = float32_heuristic(op, layer, AVX2)
    assert config["stage0.tile.Cout"] == (4, 1, 8) and config["stage0.tile.W"] == (1, 1, 7), config
    assert config["layout.w.tile"] == "0:8", config
    check_config(op, layer, space, config, dtype="float32")
    # AVX-512's budget of 8 rows for 2 vectors takes W's 7 (14 accumulators) and keeps both vectors
    wide = ScheduleSpace(lower(op, layer, dtype="float32"), machine=AVX512).heuristic()
    assert wide["stage0.tile.Cout"] == (1, 1, 32) and wide["stage0.tile.W"] == (1, 1, 7), wide
    # a branching kernel's convolution too (residual_conv2d at conv5_x: 2.42x)
    residual = gallery.load("residual_conv2d")
    small = {"N": 1, "Cin": 16, "H": 7, "W": 7}
    graph, tiles = float32_heuristic(residual, small, AVX2)
    assert tiles["n1_stage0.tile.o"] == (2, 1, 8) and tiles["n1_stage0.tile.W"] == (1, 1, 7), tiles
    check_config(residual, small, graph, tiles, dtype="float32")


def test_a_branching_kernel_fills_the_budget_from_a_second_axis():
    # residual_conv2d at 14 x 14 for AVX2: 2 vectors and W's 2 rows (4 accumulators), then H's 2 rows fill the
    # budget of 8, as in a plain conv2d (residual_conv2d at conv4_x 1.31x faster, Zen 3, pairs)
    residual = gallery.load("residual_conv2d")
    middle = {"N": 1, "Cin": 16, "H": 14, "W": 14}
    graph, tiles = float32_heuristic(residual, middle, AVX2)
    assert tiles["n1_stage0.tile.o"] == (1, 1, 16), tiles
    assert tiles["n1_stage0.tile.W"] == (7, 1, 2) and tiles["n1_stage0.tile.H"] == (7, 1, 2), tiles
    check_config(residual, middle, graph, tiles, dtype="float32")


def test_a_short_innermost_axis_gives_the_register_tile_to_one_that_fills_more_accumulators():
    # a transposed conv2d as phases: W_p (2) is the innermost data axis; W_p 2 x W_o 2 filled 4 of AVX2's 8
    # accumulators, W_o 7 alone fills 7 (ALT's T2D 1.42x faster, Zen 3, 2 threads, in pairs)
    op, layer = gallery.load("conv_transpose2d"), {"N": 1, "Cin": 16, "Cout": 8, "H": 14, "W": 14}
    space, config = float32_heuristic(op, layer, AVX2)
    assert config["stage0.tile.W_o"] == (2, 1, 7) and config["stage0.tile.W_p"] == (2, 1, 1), config
    check_config(op, layer, space, config, dtype="float32")
    # a tile that fills more than half the budget keeps the preferred axes (W 7 x 1 of 8 for a conv2d at 7 x 7)
    conv = gallery.load("conv2d")
    small = {"N": 1, "Cin": 8, "Cout": 8, "H": 7, "W": 7}
    kept = ScheduleSpace(lower(conv, small, dtype="float32"), machine=AVX2).heuristic()
    assert kept["stage0.tile.W"] == (1, 1, 7), kept


def test_a_register_tile_short_of_the_fma_latency_widens_past_the_half_file_budget():
    # L = 250 under AVX2's budget of 4 rows of 2 vectors: 2 rows, 4 accumulators for the 8 that 2 FMA units of
    # latency 4 keep busy; 5 rows (10 of 16 ymm) were 1.58x faster (Zen 3, 2 threads, pairs)
    op, layer = gallery.load("conv1d"), {"N": 1, "Cin": 16, "Cout": 16, "L": 250, "K": 3}
    space, config = float32_heuristic(op, layer, AVX2)
    assert config["stage0.tile.L"] == (50, 1, 5) and config["stage0.tile.Cout"] == (1, 1, 16), config
    check_config(op, layer, space, config, dtype="float32")
    # AVX-512 (16 lanes: one vector of Cout) takes 10 rows within its budget of 16 accumulators
    wide = ScheduleSpace(lower(op, layer, dtype="float32"), machine=AVX512).heuristic()
    assert wide["stage0.tile.L"] == (25, 1, 10) and wide["stage0.tile.Cout"] == (1, 1, 16), wide
    # a tile that already keeps 8 accumulators stays within the budget (L = 256: 4 rows of 2 vectors)
    even = ScheduleSpace(lower(op, {**layer, "L": 256}, dtype="float32"), machine=AVX2).heuristic()
    assert even["stage0.tile.L"] == (64, 1, 4), even


def test_a_strided_convolution_over_data_beyond_l2_takes_32_lanes_over_rows_of_h():
    # AVX2: 4 vectors of Cout over 2 rows of H (not 2 vectors over 2 x 2 of W and H, strided along W) where the
    # input exceeds BLOCK_ABOVE_L2 L2 caches; a small input keeps the default's tiles; AVX-512 keeps its 2 vectors
    caches = {"l1d": 32 * 1024, "l2": 512 * 1024}
    avx2 = from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0, caches=caches)
    avx512 = from_features("skylake-avx512", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=3.0, caches=caches)
    op = gallery.load("alexnet_c1")
    big = {"N": 16, "Cin": 64, "Cout": 64, "H": 30, "W": 30, "Ho": 14, "Wo": 14, "K": 3, "s": 2}  # 3.5 MiB of input
    space, config = float32_heuristic(op, big, avx2)
    assert config["stage0.tile.Cout"] == (2, 1, 32) and config["stage0.tile.H"] == (7, 1, 2), config
    assert config["stage0.tile.W"] == (14, 1, 1), config
    check_config(op, big, space, config, dtype="float32")
    small = {**big, "N": 2}  # 450 KiB: in L2
    assert ScheduleSpace(lower(op, small, dtype="float32"), machine=avx2).heuristic()["stage0.tile.Cout"][2] == 16
    assert ScheduleSpace(lower(op, big, dtype="float32"), machine=avx512).heuristic()["stage0.tile.Cout"][2] == 32


def test_weight_panels_stream_from_a_fast_l3_instead_of_k_blocks():
    # a long reduction whose tile operands exceed half of L2 is K-blocked, unless the whole weight fits in half
    # of L3 and the L3 serves a core twice the tile's 16 bytes a cycle: Zen's 32 does, Intel's 16 does not
    caches = {"l1d": 32 * 1024, "l2": 64 * 1024, "l3": 2 * 1024 * 1024}
    op, layer = gallery.load("matmul"), {"M": 64, "Cin": 2048, "Cout": 128}  # a 1 MiB weight

    def heuristic(mcpu, model="", **more):
        machine = from_features(mcpu, {"avx", "avx2", "fma"}, cores=2, ghz=3.0, caches={**caches, **more}, model=model)
        return ScheduleSpace(lower(op, layer, dtype="float32"), machine=machine)

    zen = heuristic("znver3")
    config = zen.heuristic()
    assert zen.machine.l3_bytes_per_cycle == 32 and config["stage0.rblock"] == "none", config
    assert config["layout.w.pack"] == "pass" and config["stage0.block"] == "none", config
    check_config(op, layer, zen, config, dtype="float32")
    # the host's model name decides, not the mcpu the code is compiled for
    assert heuristic("haswell", "AMD EPYC 7B13").heuristic()["stage0.rblock"] == "none"
    assert heuristic("znver3", "Intel(R) Xeon(R) Gold 6248").heuristic()["stage0.rblock"] == "Cin:512"
    assert heuristic("znver3", l3=1024 * 1024).heuristic()["stage0.rblock"] == "Cin:512"  # the weight fills L3


@pytest.mark.parametrize("layer", [{"N": 1, "Cin": 40, "Cout": 24}, {"N": 1, "Cin": 12, "Cout": 5}])
def test_a_gemv_sums_in_vector_lanes_and_leaves_its_weight_unpacked(layer):
    op = gallery.load("linear")
    space = ScheduleSpace(lower(op, layer, dtype="float64"))
    config = space.heuristic()
    assert config["stage0.lanes"] is True and config["layout.w.tile"] == "none", config
    assert config.get("stage0.lane_rows", 1) == (4 if layer["Cout"] % 4 == 0 else 1), config  # 4 streams where 4 divide
    check_config(op, layer, space, config)
    # with more than one row the weights are reused: the register tile stays
    rows = ScheduleSpace(lower(op, {**layer, "N": 4}, dtype="float64")).heuristic()
    assert rows["stage0.lanes"] is False, rows


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("linear", {"N": 1, "Cin": 40, "Cout": 24}),
        ("linear", {"N": 3, "Cin": 32, "Cout": 8}),  # rows fused across N and Cout
        ("spatial_attention", {"N": 1, "Cin": 16, "H": 4, "W": 6}),  # a softmax's row max and sum
        ("squeeze_excitation", {"N": 2, "Cin": 32, "H": 7, "W": 8}),  # a global mean
    ],
)
def test_lanes_over_several_rows_at_once_match_the_reference(name, layer):
    op = gallery.load(name)
    space = ScheduleSpace(lower(op, layer, dtype="float64"))
    names = [n.removesuffix(".lane_rows") for n in space.parameters if n.endswith(".lane_rows")]
    assert names, f"{name}: no S.lane_rows"
    for rows in (2, 4, 8):
        config = space.heuristic()
        for s in names:
            if rows in space.parameters[f"{s}.lane_rows"].choices:
                config.update({f"{s}.lanes": True, f"{s}.lane_rows": rows})
        sch = space.apply(config)
        for s in names:  # the rows' loop sits inside the reduction, right above the vector lanes
            if config[f"{s}.lane_rows"] == rows:
                loops = sch.get_loops(
                    sch.get_sblock(f"{s}_rf_update" if f"{s}_rf_update" in sch.mod.script() else f"{s}_rf")
                )
                assert int(sch.get(loops[-2]).extent) == rows, (s, rows)
        check_config(op, layer, space, config)


def test_cache_blocking_where_the_data_exceeds_the_l2():
    # a 32 KiB L2 makes a small matmul's 256 KiB input "large": the rows come in blocks of at most 16 KiB
    from kdsl.runtime.cpu import from_features

    small_l2 = from_features("x", {"avx2", "fma", "avx512f"}, cores=2, ghz=2.0, caches={"l2": 32 * 1024})
    op, layer = gallery.load("matmul"), {"M": 1024, "Cin": 64, "Cout": 128}
    space, config = float32_heuristic(op, layer, small_l2)
    axis, n = config["stage0.block"].split(":")
    rows = int(n) * config["stage0.tile.M"][1] * config["stage0.tile.M"][2]
    assert axis == "M" and rows * 64 * 4 <= 16 * 1024, config
    assert 64 * config["stage0.tile.Cout"][2] * 4 <= 32 * 1024 // 4, config  # the panel within a quarter of L2
    check_config(op, layer, space, config, dtype="float32")
    # 32 KiB of input is within 4 L2s: no blocks
    narrow = ScheduleSpace(lower(op, {**layer, "M": 128}, dtype="float32"), machine=small_l2).heuristic()
    assert narrow["stage0.block"] == "none"
    # with a 16 KiB L2 the 8 KiB weight panel fills more than a quarter of it: no room for blocks beside it
    tiny_l2 = from_features("x", {"avx2", "fma", "avx512f"}, cores=2, ghz=2.0, caches={"l2": 16 * 1024})
    crowded = ScheduleSpace(lower(op, layer, dtype="float32"), machine=tiny_l2).heuristic()
    assert crowded["stage0.tile.Cout"][0] > 1, crowded  # the vector axis still runs over tasks
    assert 64 * crowded["stage0.tile.Cout"][2] * 4 > 16 * 1024 // 4, crowded
    assert crowded["stage0.block"] == "none", crowded
