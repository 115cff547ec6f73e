"""Gensor's construction of the space's newer forms (:mod:`kdsl.tune.gensor_forms`): cache blocking where
the working set exceeds a cache level of the (synthetic) machine, channels on the lanes with the input
packed, partial sums in lanes for a GEMV, constructed kernels that compute what the reference computes, a
deterministic construction, and the tuners' moves along the same parameters (no timing)."""

from __future__ import annotations

import random

import pytest
from backends import backend

backend("tvm")
backend("torch")

from test_tvm_schedule_forms import check_config  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen.tvm import lower  # noqa: E402
from kdsl.codegen.tvm.parameters import config_key  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.runtime.cpu import from_features  # noqa: E402
from kdsl.tune import gensor, gensor_forms  # noqa: E402

AVX512 = {"avx", "avx2", "fma", "avx512f"}
# one core type with a small and a large cache hierarchy: only the caches differ
SMALL_L2 = from_features(
    "skylake-avx512", AVX512, cores=2, ghz=2.6, caches={"l1d": 32 << 10, "l2": 256 << 10, "l3": 4 << 20}
)
LARGE_L2 = from_features(
    "skylake-avx512", AVX512, cores=2, ghz=2.6, caches={"l1d": 32 << 10, "l2": 32 << 20, "l3": 64 << 20}
)
MATMUL_4M = {"M": 1024, "Cin": 512, "Cout": 1024}  # 2 MiB of data, 2 MiB of weights


def _space(name, layer, machine, dtype="float32"):
    return ScheduleSpace(lower(gallery.load(name), layer, dtype=dtype), machine=machine)


def _reduce(space):
    stage = next((s for s in space.stages if s.kind == "reduce"), None)
    assert stage is not None, "no reduction stage"
    return stage


def _unblocked_heuristic(space):
    """The rule-based tiles without the rule-based blocking: what the construction's blocking is asked about
    (neither ``S.block`` nor ``S.rblock``'s K blocking, whose data tiles go back to the parallel loop)."""
    config = space.heuristic()
    stage = _reduce(space)
    name = f"{stage.name}.block"
    assert name in config, f"no {name} parameter"
    if config.get(f"{stage.name}.rblock", "none") != "none":
        config[f"{stage.name}.rblock"] = "none"
        for axis, extent in stage.spatial:
            outer, middle, inner = config.get(f"{stage.name}.tile.{axis}", (extent, 1, 1))
            config[f"{stage.name}.tile.{axis}"] = (outer * middle, 1, inner)
    return {**config, name: "none"}


def _best(space, seed=0, count=24):
    """The best-estimated construction from the unscheduled program (no rule-based choice to start from)."""
    ranked = gensor.constructions(space, gensor.identity(space), random.Random(seed), count=count)
    assert ranked, "no construction"
    return ranked[0][1]


def test_a_small_l2_blocks_where_a_large_l2_does_not():
    small, large = _space("matmul", MATMUL_4M, SMALL_L2), _space("matmul", MATMUL_4M, LARGE_L2)
    block = gensor_forms.choose_block(small, _reduce(small), _unblocked_heuristic(small))
    assert block != "none"
    assert gensor_forms.blocking_benefit(small, _reduce(small), _unblocked_heuristic(small), block) > 0
    assert gensor_forms.choose_block(large, _reduce(large), _unblocked_heuristic(large)) == "none"
    # the same tiles on the large-L2 machine: the block saves nothing there
    assert gensor_forms.blocking_benefit(large, _reduce(large), _unblocked_heuristic(large), block) <= 0


def test_a_layer_that_fits_the_small_l2_is_not_blocked():
    space = _space("matmul", {"M": 128, "Cin": 128, "Cout": 128}, SMALL_L2)
    assert gensor_forms.choose_block(space, _reduce(space), _unblocked_heuristic(space)) == "none"


def test_the_block_size_is_chosen_per_layer():
    blocks = {}
    for cin in (512, 1024):
        space = _space("matmul", {"M": 1024, "Cin": cin, "Cout": 1024}, SMALL_L2)
        blocks[cin] = gensor_forms.choose_block(space, _reduce(space), _unblocked_heuristic(space))
    assert "none" not in blocks.values(), blocks
    # a longer reduction makes each row of data longer: fewer rows fit the same L2
    rows = {cin: int(block.split(":")[1]) for cin, block in blocks.items()}
    assert rows[1024] < rows[512], blocks


def test_finishing_a_schedule_blocks_it_where_the_cache_is_small_and_it_still_applies():
    for machine, blocked in ((SMALL_L2, True), (LARGE_L2, False)):
        space = _space("matmul", {"M": 4096, "Cin": 512, "Cout": 1024}, machine)
        config = gensor_forms.finish(space, _unblocked_heuristic(space))
        assert (config[f"{_reduce(space).name}.block"] != "none") == blocked, (machine.l2, config)
        space.apply(config)  # a schedule of the space: the blocks divide the outer tiles


def test_depthwise_gets_its_channels_on_the_lanes_with_the_input_packed():
    space = _space("depthwise_conv2d", {"N": 1, "Cin": 512, "H": 7, "W": 7, "K": 3}, SMALL_L2)
    stage = _reduce(space)
    config = _best(space)
    assert config[f"{stage.name}.vector"] == "Cin"
    x = next(t for t in space.tensors if t.kind == "input")
    perm = config[f"layout.{x.name}.perm"]
    assert perm[-1] == 1, perm  # [N, C, H, W] packed as [N, H, W, C]: a vector of channels is one load
    pads = [s.name for s in space.stages if s.kind == "pad"]
    assert pads and all(config[f"{p}.inline"] is True for p in pads)  # read from the packed input
    # the same vector axis without the packing gathers: the model ranks it below
    forms = gensor_forms.vector_forms(space, stage, gensor.untiled(space, config))
    gathered = [f for f in forms if f[f"{stage.name}.vector"] == "Cin" and f[f"layout.{x.name}.perm"] == (0, 1, 2, 3)]
    assert gathered, "no unpacked channel form"


def test_a_gemv_sums_in_lanes():
    space = _space("linear", {"N": 1, "Cin": 4096, "Cout": 1024}, SMALL_L2)
    config = _best(space)
    assert config[f"{_reduce(space).name}.lanes"] is True


def test_a_matmul_does_not_sum_in_lanes():
    space = _space("matmul", {"M": 256, "Cin": 256, "Cout": 256}, SMALL_L2)
    config = _best(space)
    stage = _reduce(space)
    assert config.get(f"{stage.name}.lanes", False) is False
    assert config[f"{stage.name}.cache"] == "local"


@pytest.mark.parametrize(
    "name, layer",
    [
        ("matmul", {"M": 64, "Cin": 48, "Cout": 64}),
        ("depthwise_conv2d", {"N": 1, "Cin": 32, "H": 7, "W": 7}),
        ("conv2d", {"N": 1, "Cin": 8, "Cout": 16, "H": 8, "W": 8}),
        ("linear", {"N": 1, "Cin": 64, "Cout": 24}),
    ],
)
def test_constructed_kernels_match_the_reference(name, layer):
    op = gallery.load(name)
    space = ScheduleSpace(lower(op, layer, dtype="float64"), machine=SMALL_L2)
    ranked = gensor.constructions(space, gensor.identity(space), random.Random(1), count=12)
    checked = set()
    for _, config in ranked:  # one kernel per vector form, best first
        form = gensor.signature(space, config)
        if form in checked or len(checked) >= 3:
            continue
        checked.add(form)
        check_config(op, layer, space, config)
    assert checked


def test_the_construction_is_deterministic():
    space = _space("depthwise_conv2d", {"N": 1, "Cin": 64, "H": 14, "W": 14, "K": 3}, SMALL_L2)

    def keys(seed):
        ranked = gensor.constructions(space, space.heuristic(), random.Random(seed), count=12)
        return [config_key(c) for _, c in ranked]

    assert keys(4) == keys(4)
    assert gensor.construct(space, seed=2, walks=1, steps=20) == gensor.construct(space, seed=2, walks=1, steps=20)


def test_the_forms_are_tunable_parameters_with_neighbours():
    from kdsl.tune.alt import Alt
    from kdsl.tune.opevo import mutate

    space = _space("depthwise_conv2d", {"N": 1, "Cin": 64, "H": 14, "W": 14, "K": 3}, SMALL_L2)
    stage = _reduce(space).name
    x = next(t for t in space.tensors if t.kind == "input").name
    names = [f"{stage}.block", f"{stage}.spatial_below", f"{stage}.vector", f"layout.{x}.perm"]
    for name in names:
        assert name in space.parameters, name
        start = space.heuristic()[name]
        assert space.parameters[name].neighbours(start), name
    # OpEvo's mutation walks each of them away from the rule-based value
    rng, start = random.Random(0), space.heuristic()
    moved = set()
    for _ in range(200):
        child = mutate(space.parameters, start, 0.5, rng, rate=0.2)
        moved |= {n for n in names if child[n] != start[n]}
    assert moved == set(names), set(names) - moved
    # ALT searches the data input's dim order among its layouts (channels last) and tunes the rest as loops
    alt = Alt(space, seed=0)
    assert (0, 2, 3, 1) in alt.template[f"layout.{x}.perm"]
    assert {f"{stage}.block", f"{stage}.spatial_below", f"{stage}.vector"} <= set(alt.loops)


def test_a_gemv_space_offers_lanes_to_the_tuners():
    from kdsl.tune.alt import Alt

    space = _space("linear", {"N": 1, "Cin": 256, "Cout": 64}, SMALL_L2)
    name = f"{_reduce(space).name}.lanes"
    assert name in space.parameters
    assert space.parameters[name].neighbours(True) == [False]
    assert name in Alt(space, seed=0).loops


@pytest.mark.parametrize(
    "name",
    [
        "conv2d_valid",
        "alexnet_c1",
        "max_pool2d",
        "squeeze_excitation",
        "attention_qk",
        "conv_transpose2d",
        "conv_transpose3d",
    ],
)
def test_constructions_of_other_operators_are_schedules_of_the_space(name):
    from test_tvm_schedule import LAYERS

    space = ScheduleSpace(lower(gallery.load(name), LAYERS[name][0]), machine=SMALL_L2)
    for base in (gensor.identity(space), space.heuristic()):
        space.apply(base)  # the unscheduled program and the rule-based one are configurations of the space
        ranked = gensor.constructions(space, base, random.Random(0), count=6)
        assert len(ranked) == 6
        for _, config in ranked[:2]:
            space.apply(config)


def test_an_output_bound_matmul_keeps_its_vector_along_the_stored_dim():
    # 64 MiB of output: with M on the lanes every element written back is a line of its own
    space = _space("matmul", {"M": 16384, "Cin": 32, "Cout": 1024}, SMALL_L2)
    stage = _reduce(space)
    ranked = gensor.constructions(space, gensor.identity(space), random.Random(0), count=24)
    by_vector = {}
    for cost, config in ranked:
        by_vector.setdefault(config[f"{stage.name}.vector"], []).append(cost)
    assert set(by_vector) == {"M", "Cout"}, by_vector.keys()
    assert min(by_vector["M"]) > max(by_vector["Cout"])  # every M form ranks below every Cout form
    config = ranked[0][1]
    from kdsl.tune import gensor_model

    assert not gensor_model.scattered(stage, config)
    assert gensor_model.scattered(stage, {**config, f"{stage.name}.vector": "M"})
