"""Gensor: the level-by-level construction against each machine's register file, its benefit formulas,
the calibration of its model, and a deterministic tuner (no timing)."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from backends import backend

from kdsl.runtime.cpu import from_features

backend("tvm")

AVX2 = from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0, caches={"l1d": 32 << 10, "l2": 1 << 20})
AVX512 = from_features(
    "skylake-avx512", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=2.6, caches={"l1d": 48 << 10, "l2": 2 << 20}
)
MATMUL = ("matmul", {"M": 64, "Cin": 64, "Cout": 64})
CONV2D = ("conv2d", {"N": 1, "Cin": 16, "Cout": 32, "H": 8, "W": 8})


def _space(case, machine):
    from kdsl import gallery
    from kdsl.codegen.tvm import lower
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    name, layer = case
    return ScheduleSpace(lower(gallery.load(name), layer), machine=machine)


def _reduce(space):
    return next(s for s in space.stages if s.kind == "reduce")


def _accumulators(space, config):
    from kdsl.tune import gensor_model

    stage = _reduce(space)
    tile = gensor_model.level_tile(stage, config, "register")
    labels = [a for a, _ in stage.spatial]
    return gensor_model._register_footprint(stage, tile, labels.index(config[f"{stage.name}.vector"]), space.lanes)


@pytest.mark.parametrize("machine", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize("case", [MATMUL, CONV2D], ids=["matmul", "conv2d"])
def test_the_register_level_fills_the_machines_registers(case, machine):
    from kdsl.tune import gensor

    space = _space(case, machine)
    stage = _reduce(space)
    start = gensor.untiled(space, space.heuristic())
    assert _accumulators(space, start) == 1 and start[f"{stage.name}.cache"] == "none"
    rng = random.Random(0)
    built = [gensor.build(space, start, rng) for _ in range(12)]
    counts = [_accumulators(space, config) for config in built]
    budget = machine.accumulators()
    assert all(c <= budget for c in counts), (counts, budget)
    # filled: the largest tiles have no room for another doubling (the extents here are powers of 2)
    assert 2 * max(counts) > budget, (counts, budget)
    for config in built:
        assert config[f"{stage.name}.cache"] == "local"  # the caching action at the register level
        vector = config[f"{stage.name}.vector"]
        inner = config[f"{stage.name}.tile.{vector}"][2]
        assert inner % space.lanes == 0 and inner <= 2 * space.lanes, (vector, inner)
        space.apply(config)  # a schedule of the space, not only of the model


def test_the_wider_machine_gets_the_wider_register_tile():
    from kdsl.tune import gensor, gensor_model

    largest = {}
    for machine in (AVX2, AVX512):
        space = _space(MATMUL, machine)
        rng = random.Random(1)
        start = gensor.untiled(space, space.heuristic())
        tiles = [
            gensor_model.level_tile(_reduce(space), gensor.build(space, start, rng), "register") for _ in range(12)
        ]
        largest[machine.isa] = max(t[0] * t[1] for t in tiles)
    assert largest["avx512"] > largest["avx2"], largest


def test_the_levels_nest_and_respect_the_caches():
    from kdsl.tune import gensor, gensor_model

    space = _space(("matmul", {"M": 256, "Cin": 512, "Cout": 256}), AVX2)
    stage = _reduce(space)
    model = gensor_model.Model.of(AVX2)
    rng = random.Random(2)
    for _ in range(6):
        config = gensor.build(space, gensor.untiled(space, space.heuristic()), rng)
        tiles = [gensor_model.level_tile(stage, config, level) for level in gensor_model.LEVELS]
        for inner, outer in itertools.pairwise(tiles):
            assert all(a <= b for a, b in zip(inner, outer)), tiles
        for level in gensor_model.LEVELS:
            assert gensor_model.capacity(space, stage, config, level, model), (level, tiles)
        chunks = 1
        for axis, _ in stage.spatial:
            chunks *= config[f"{stage.name}.tile.{axis}"][0]
        assert chunks >= AVX2.cores  # parallel chunks for every core


def test_tiling_benefit_is_monotonic():
    from kdsl.tune.gensor_model import FLOOR_BENEFIT, FREE_BENEFIT, tiling_benefit

    # more traffic saved for the same footprint: more benefit; more footprint for the same saving: less
    saved = [tiling_benefit(100, after, 10, 20) for after in (90, 70, 50, 30)]
    assert saved == sorted(saved) and len(set(saved)) == len(saved)
    grown = [tiling_benefit(100, 50, 10, f) for f in (12, 15, 20, 40)]
    assert grown == sorted(grown, reverse=True) and len(set(grown)) == len(grown)
    assert tiling_benefit(100, 110, 10, 5) == FLOOR_BENEFIT  # an inverse tiling: possible, unlikely
    assert tiling_benefit(100, 60, 10, 10) == FREE_BENEFIT


def test_caching_benefit_grows_with_the_next_levels_cost():
    from kdsl.tune.gensor_model import Model, caching_benefit

    model = Model.of(AVX2)
    slower = [caching_benefit(dataclasses.replace(model, bw_l3=model.bw_l3 / k), "L2", 1 << 16) for k in (1, 2, 4)]
    assert slower == sorted(slower) and len(set(slower)) == 3
    assert all(0 < b < 1 for b in slower)
    # the register level: the benefit of accumulating in registers rather than reloading from L1
    assert 0 < caching_benefit(model, "register", 512) < 1


def test_parallel_benefit_penalizes_idle_cores():
    from kdsl.tune.gensor_model import parallel_benefit

    assert parallel_benefit(16, 8, 2) == 1.0
    assert parallel_benefit(16, 3, 2) < parallel_benefit(16, 4, 2)
    assert parallel_benefit(16, 1, 2) == 0.0


def test_the_model_reads_the_machine():
    from kdsl.tune.gensor_model import Model

    two, four = Model.of(AVX2), Model.of(dataclasses.replace(AVX2, cores=4, ghz=1.5))
    assert (two.lanes, two.accumulators, two.l1, two.l2) == (8, AVX2.accumulators(), 32 << 10, 1 << 20)
    assert four.peak == two.peak  # twice the cores at half the clock
    assert four.bw_l2 == two.bw_l2 / 2  # per core, per cycle times the clock
    assert Model.of(AVX512).peak == 2 * 2 * 16 * 2.6e9


def test_calibration_recovers_a_scaled_machine():
    from kdsl.tune import gensor, gensor_model
    from kdsl.tune.records import Record

    space = _space(MATMUL, AVX2)
    model = gensor_model.Model.of(AVX2)
    rng = random.Random(3)
    start = gensor.untiled(space, space.heuristic())
    configs = [gensor.build(space, start, rng) for _ in range(8)] + [space.heuristic(), gensor.identity(space)]
    # "measurements" of a machine whose FMAs run at a quarter of the model's peak, memory as modelled
    truth = dataclasses.replace(model, compute_scale=4.0)
    records = [Record(c, gensor_model.estimate(space, c, truth), None, "gensor") for c in configs]
    fitted = gensor_model.calibrate(space, model, records)
    assert fitted.compute_scale == pytest.approx(4.0)
    for record in records:
        assert gensor_model.estimate(space, record.config, fitted) == pytest.approx(record.latency)
    assert gensor_model.calibrate(space, model, records[:3]) == model  # too few measurements: unchanged


def _run(seed):
    from kdsl.codegen.tvm.parameters import config_key
    from kdsl.tune.gensor import Gensor
    from kdsl.tune.records import Record

    space = _space(MATMUL, AVX2)
    tuner = Gensor(space, seed=seed, walks=2, steps=40, constructions=8)
    keys = []
    for round_ in range(3):
        batch = tuner.propose(4)
        keys.append([config_key(c) for c in batch])
        # a deterministic "measurement": a new best in every round, so that it walks again
        tuner.update([Record(c, 1e-3 / (round_ + 1) / (i + 1), None, "gensor") for i, c in enumerate(batch)])
    return keys


def test_the_tuner_is_deterministic_for_a_seed():
    first = _run(5)
    assert first == _run(5)
    assert all(len(batch) == 4 for batch in first)
    flat = [k for batch in first for k in batch]
    assert len(set(flat)) == len(flat)


def test_the_tuner_proposes_distinct_register_tiles_first():
    from kdsl.tune import gensor

    space = _space(MATMUL, AVX2)
    tuner = gensor.Gensor(space, seed=0, walks=2, steps=40, constructions=8)
    batch = tuner.propose(6)
    assert batch[0] == space.heuristic()  # the rule-based start is measured first
    signatures = [gensor.signature(space, c) for c in batch]
    assert len(set(signatures)) == len(signatures)  # no near-copies in the first batch


def test_after_a_new_best_it_proposes_the_next_states_of_the_best():
    from kdsl.codegen.tvm.parameters import normalize
    from kdsl.tune.gensor import Gensor
    from kdsl.tune.records import Record

    space = _space(MATMUL, AVX2)
    tuner = Gensor(space, seed=0, walks=2, steps=40, constructions=8)
    batch = tuner.propose(4)
    best = normalize(batch[2])
    tuner.update([Record(c, 1e-4 if normalize(c) == best else 1e-3, None, "gensor") for c in batch])
    following = [normalize(c) for c in tuner.propose(4)]
    assert len(following) == 4
    for config in following:
        changed = [name for name in config if config[name] != best[name]]
        assert len(changed) == 1 and ".tile." in changed[0], changed  # one tiling action from the best


CASCADE_LAKE = from_features(
    "cascadelake", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=2.5, caches={"l1d": 32 << 10, "l2": 1 << 20}
)


@pytest.mark.parametrize("machine", [AVX2, AVX512, CASCADE_LAKE], ids=["haswell", "avx512-2MiB", "cascadelake"])
def test_constructions_for_every_suite_case_pass_the_spaces_rules(machine):
    # a construction the space refuses is skipped by the tuner without a word: 221 of 768 once were (24 a case,
    # Cascade Lake), on 28 of the 32 cases, where the levels' order put the register-level accumulator below
    # reductions outside the middle tiles, and every tiled one of OpEvo's MM3 and Gensor's M1 (the start's K
    # blocks kept for the built tiles). Now those accumulate in place along the output's rows, the others
    # (in place they would scatter every step) are left out, and most of each case's constructions remain.
    from kdsl.bench.tune_suites import SUITES
    from kdsl.codegen.tvm.space_rules import conflicts
    from kdsl.tune.gensor import constructions

    refused, few = {}, {}
    for suite, cases in SUITES.items():
        for case in cases:
            space = _space((case.operator, case.layer), machine)
            built = constructions(space, space.heuristic(), random.Random(0), count=8)
            if len(built) < 4:
                few[f"{suite} {case.label}"] = len(built)
            for _, config in built:
                why = conflicts(space, config) or space.rejection(config)
                if why:
                    refused[f"{suite} {case.label}"] = why
    assert refused == {} and few == {}, (refused, few)
