"""The schedule space's cross-parameter rules: random draws and repaired mutations apply, and the tuners
never send a configuration that fails to apply to the measurer."""

from __future__ import annotations

import random
import zlib

import pytest
from backends import backend

from kdsl import gallery
from kdsl.codegen.tvm.parameters import config_key
from kdsl.codegen.tvm.space_rules import block_choices, conflicts
from kdsl.lang.errors import LoweringError
from kdsl.tune.opevo import mutate

backend("tvm")

#: small layers whose spaces have S.block choices that some tiles rule out
CASES = {
    "matmul": {"M": 64, "Cin": 32, "Cout": 128},
    "conv2d": {"N": 1, "Cin": 16, "Cout": 32, "H": 8, "W": 8, "K": 3},
    "depthwise_conv2d": {"N": 1, "Cin": 32, "H": 8, "W": 8, "K": 3},
}
DRAWS = 20


def _space(name: str):
    from kdsl.codegen.tvm import lower
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    return ScheduleSpace(lower(gallery.load(name), CASES[name]))


def _applies(space, config) -> bool:
    try:
        space.apply(config)
    except LoweringError:
        return False
    return True


def _raw(space, rng: random.Random) -> dict:
    """A configuration with every parameter drawn on its own (what ``random`` drew before the rules)."""
    config = {name: param.random(rng) for name, param in space.parameters.items()}
    assert set(config) == set(space.parameters)
    return config


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_rules_refuse_exactly_what_apply_refuses_for_their_causes(name):
    space, rng = _space(name), random.Random(1)
    refused = 0
    for _ in range(DRAWS):
        config = _raw(space, rng)
        broken = conflicts(space, space.validate(config))
        applies = _applies(space, config)
        assert not (broken and applies), (broken, config)  # never refuses a configuration that applies
        refused += bool(broken)
        if applies:
            assert space.repair(config) == space.validate(config)  # a valid configuration is left alone
    assert refused > 0  # the draws do break the rules (else this test could not fail)


@pytest.mark.parametrize("name", sorted(CASES))
def test_random_draws_and_repaired_mutations_all_apply(name):
    space, rng = _space(name), random.Random(2)
    start = space.heuristic()
    assert conflicts(space, start) == [] and space.rejection(start) is None
    rate = 2 / len(space.parameters)
    drawn = [space.random(rng) for _ in range(DRAWS)]
    mutated = [space.repair(mutate(space.parameters, start, 0.5, rng, rate)) for _ in range(DRAWS)]
    reasons = [(c, space.rejection(c)) for c in drawn + mutated]
    assert [(c, r) for c, r in reasons if r is not None] == []
    # the draws reach the blocks: some S.block is not "none" where the tiles allow one
    blocks = [v for c in drawn for k, v in c.items() if k.endswith(".block")]
    assert blocks and any(v != "none" for v in blocks)


def test_a_block_the_tiles_rule_out_moves_to_the_nearest_allowed_one():
    space = _space("matmul")
    stage = next(s for s in space.stages if f"{s.name}.block" in space.parameters)
    s = stage.name
    # M = 64 tiled (8, 1, 8): 8 outer tiles, which blocks of 2 and 4 divide and are fewer than (8 is not fewer)
    config = {**space.heuristic(), f"{s}.tile.M": (8, 1, 8), f"{s}.block": "M:8"}
    offered = space.parameters[f"{s}.block"].choices
    expected = [f"M:{n}" for n in (2, 4) if f"M:{n}" in offered]
    assert "M:8" in offered and expected
    assert [c for c in block_choices(space, stage, config) if c.startswith("M:")] == expected
    assert not _applies(space, config)
    repaired = space.repair(config)
    assert repaired[f"{s}.block"] == "M:4" and _applies(space, repaired)
    assert space.repair(config, keep={f"{s}.block"})[f"{s}.block"] == "M:8"  # kept: apply still refuses it
    assert "S.block M:8" in (space.rejection(config) or "")


class _FakeMeasurer:
    """Times nothing: a latency from the configuration's key; remembers what it was asked to measure."""

    compile_seconds = measure_seconds = 0.0

    def __init__(self) -> None:
        self.measured: list[dict] = []

    def measure(self, space, configs):
        self.measured += list(configs)
        return [(1e-4 * (1 + zlib.crc32(config_key(c).encode()) % 97), None) for c in configs]

    def close(self) -> None:
        assert True  # nothing to release


@pytest.mark.parametrize("tuner", ["opevo", "random", "alt", "gensor"])
def test_the_tuners_never_spend_a_trial_on_a_configuration_that_fails_to_apply(tmp_path, tuner):
    from kdsl.tune.driver import tune

    measurer = _FakeMeasurer()
    options = {"steps": 40, "walks": 2} if tuner == "gensor" else {"min_records": 8} if tuner == "alt" else {}
    op = gallery.load("conv2d")
    result = tune(
        op,
        CASES["conv2d"],
        tuner,
        16,
        tmp_path / "t.db",
        batch=8,
        measurer=measurer,
        options=options,
        confirm=0,
        cost_model=False,
    )
    space = _space("conv2d")
    assert result.rejected == 0
    assert len(measurer.measured) == result.measured == 16
    assert all(space.rejection(c) is None for c in measurer.measured)


def test_the_space_names_its_stages_and_tensors_and_the_producer_a_stage_folds_into():
    from kdsl.codegen.tvm import lower
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    space = ScheduleSpace(lower(gallery.load("residual_conv2d"), {"N": 1, "Cin": 8, "H": 6, "W": 6, "K": 3}))
    kinds = {stage.name: stage.kind for stage in space.stages}
    blend = next(stage for stage in space.stages if stage.elementwise)
    conv = next(stage for stage in space.stages if stage.kind == "reduce")
    assert space.stage_named(blend.name) is blend and kinds[conv.name] == "reduce"
    # the residual addition folds into the convolution's write-back; the convolution itself folds nowhere
    assert space.inline_producer(blend) == conv.name
    assert space.inline_producer(conv) is None
    assert space.tensor_named("x").kind == "input" and space.tensor_named("w").kind == "weight"
    assert space.lane_partials(conv) >= 1
    with pytest.raises(LoweringError, match="no stage 'nope'"):
        space.stage_named("nope")
    with pytest.raises(LoweringError, match="no tensor 'nope'.*x, w"):
        space.tensor_named("nope")


def test_an_accumulator_over_the_limit_goes_in_place_only_along_its_buffers_rows():
    from kdsl.codegen.tvm import lower
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace
    from kdsl.codegen.tvm.space_rules import scatters_in_place

    space = ScheduleSpace(lower(gallery.load("matmul"), {"M": 256, "Cin": 256, "Cout": 256}))
    s = next(st for st in space.stages if st.kind == "reduce").name
    # the reductions outside the middle tiles: the local accumulator spans 128 x 128 outputs, over the limit
    big = {
        **space.heuristic(),
        f"{s}.tile.M": (2, 8, 16),
        f"{s}.tile.Cout": (2, 8, 16),
        f"{s}.tile.Cin": (64, 4),
        f"{s}.order": (2, 0, 1),
        f"{s}.rblock": "none",
        f"{s}.cache": "local",
    }
    along_rows = {**big, f"{s}.vector": "Cout"}
    assert conflicts(space, along_rows) and space.repair(along_rows)[f"{s}.cache"] == "none"
    assert space.rejection(space.repair(along_rows)) is None
    # M on the lanes: in place, every step would gather and scatter a column of the output (measured 7-125x
    # slower), so the repair leaves the accumulator, and the space refuses it before any measurement
    across = {**big, f"{s}.vector": "M"}
    assert scatters_in_place(space.stages[0], across) and not scatters_in_place(space.stages[0], along_rows)
    assert space.repair(across)[f"{s}.cache"] == "local" and conflicts(space, space.repair(across))
