"""Gensor's analytic model (:mod:`kdsl.tune.gensor_model`) on an operator with almost no reuse: a depthwise
convolution orders its configurations the way they measured, for reasons that hold for any operator (a
gather along the lanes, a gathered vector reused across the register tile, data that stays in cache
between the timed calls). No timing: the measurements the docstrings quote are the quiet records of
``kdsl bench costmodel`` (costmodel7) and of ``kdsl bench tune --suite alt`` (suites_2026-11-27b), znver4,
2 cores."""

from __future__ import annotations

import random

import pytest
from backends import backend

from kdsl import gallery
from kdsl.codegen.tvm import lower
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.runtime.cpu import from_features
from kdsl.tune import gensor, gensor_model

backend("tvm")

# the caches of the machine that measured the records (AMD EPYC, znver4): 16 lanes, 1 MiB L2, 32 MiB L3
AVX512 = from_features(
    "skylake-avx512",
    {"avx", "avx2", "fma", "avx512f"},
    cores=2,
    ghz=2.6,
    caches={"l1d": 32 << 10, "l2": 1 << 20, "l3": 32 << 20},
)


def _space(layer):
    return ScheduleSpace(lower(gallery.load("depthwise_conv2d"), {"N": 1, "K": 3, **layer}), machine=AVX512)


def _stage(space):
    stage = next((s for s in space.stages if s.kind == "reduce"), None)
    assert stage is not None, "no reduction stage"
    return stage


def _rows_on_the_lanes(space, **choices):
    """The heuristic's tiles with the rows (``W``) on the lanes, the zero-padded copy a pass of its own."""
    stage = _stage(space)
    config = {**space.heuristic(), f"{stage.name}.vector": "W", **choices}
    pads = [s.name for s in space.stages if s.kind == "pad"]
    assert pads, "depthwise_conv2d lowers with a zero-padded copy"
    for pad in pads:
        config[f"{pad}.inline"] = False
    space.apply(config)  # a schedule of the space
    return config


def _compute(space, config):
    """The compute seconds of the reduction stage (the model's unscaled term)."""
    terms = gensor_model.stage_terms_of(space, _stage(space), config, gensor_model.space_model(space))
    assert terms[0] > 0, terms
    return terms[0]


def test_rows_read_through_a_channel_tiled_layout_gather_and_cost_more():
    """A layout tile moves its dim last (``layout.T.tile = "d:f"``): with the channels of the zero-padded copy
    tiled by 8, a vector along ``W`` reads elements 8 apart, a gather. The same tiles with contiguous rows
    measured 17.5 us and with the channel tile 88.6 us (64x28x28); the model counted both contiguous and
    estimated them alike."""
    space = _space({"Cin": 64, "H": 28, "W": 28})
    pad = next(s.name for s in space.stages if s.kind == "pad")
    contiguous = _rows_on_the_lanes(space)
    tiled = {**contiguous, f"layout.{pad}.tile": "1:8"}
    assert f"layout.{pad}.tile" in space.parameters and "1:8" in space.parameters[f"layout.{pad}.tile"].choices
    assert gensor_model.stored_last(tiled, pad, 4) == 1
    assert _compute(space, tiled) > _compute(space, contiguous)
    assert gensor_model.estimate(space, tiled) > gensor_model.estimate(space, contiguous)


def test_a_gathered_weight_costs_less_the_more_outputs_reuse_it():
    """With the channels on the lanes and the weight stored ``[C, kh, kw]``, each weight vector is a gather;
    the register tile's positions along ``W`` all use the same one, so its cost is shared among them. Packed
    weights measured 18.4 us and gathered ones 22.4 us (128x14x14, 7 positions per vector), where a gather
    per FMA would have cost 20x the FMAs: the gather's extra time falls with the positions that reuse it."""
    space = _space({"Cin": 128, "H": 14, "W": 14})
    stage = _stage(space)
    x = next(t.name for t in space.tensors if t.kind == "input")
    extra = {}
    for positions in (1, 7):
        packed = {
            **space.heuristic(),
            f"{stage.name}.vector": "Cin",
            f"{stage.name}.cache": "local",
            f"{stage.name}.tile.Cin": (4, 1, 32),
            f"{stage.name}.tile.H": (14, 1, 1),
            f"{stage.name}.tile.W": (14 // positions, 1, positions),
            f"layout.{x}.perm": (0, 2, 3, 1),
            "layout.w.perm": (0, 1, 2),
            "layout.w.tile": "0:32",
        }
        gathered = {**packed, "layout.w.tile": "none"}
        for config in (packed, gathered):
            space.apply(config)
        assert gensor_model.estimate(space, gathered) > gensor_model.estimate(space, packed)
        extra[positions] = _compute(space, gathered) - _compute(space, packed)
    # a gathered vector per 7 FMAs instead of one per FMA: a seventh of the extra time, whatever the FMAs cost
    assert extra[7] > 0 and extra[1] == pytest.approx(7 * extra[7]), extra


def test_data_that_stays_in_cache_does_not_put_a_floor_under_every_schedule():
    """Timed call after call, a kernel whose data fits the last-level cache does not fetch it from DRAM again.
    Two of Gensor's schedules at ALT's DEP layer (128x28x28; the only differences are spelled out below):
    rows on the lanes measured 27.3 us, channels on the lanes with the input packed ``[N, H, W, C]`` 53.5 us.
    Counted at DRAM's bandwidth, the 860 KB they move was one floor (58 us) under both, and the channel
    form's packing pass, cheaper than the row form's zero-padding pass, ranked it 2% ahead."""
    space = _space({"Cin": 128, "H": 28, "W": 28})
    stage = _stage(space)
    assert gensor_model.resident_levels(stage, gensor_model.space_model(space))[2]
    s, x = stage.name, next(t.name for t in space.tensors if t.kind == "input")
    pad = next(p.name for p in space.stages if p.kind == "pad")
    common = {f"{s}.cache": "local", f"{s}.order": (3, 4, 0, 1, 2), f"{s}.reductions": "split", f"{s}.unroll": 16}
    common |= {f"{s}.unroll_tile": True, f"{s}.block": "none", f"{s}.spatial_below": "none", f"{s}.tile.kh": (1, 3)}
    rows = {
        **space.heuristic(),
        **common,
        f"{s}.vector": "W",
        f"{pad}.inline": False,
        f"{s}.tile.Cin": (128, 1, 1),
        f"{s}.tile.H": (1, 4, 7),
        f"{s}.tile.W": (1, 1, 28),
        f"{s}.tile.kw": (1, 3),
        f"layout.{x}.perm": (0, 1, 2, 3),
        "layout.w.tile": "none",
    }
    channels = {
        **rows,
        f"{s}.vector": "Cin",
        f"{pad}.inline": True,
        f"{s}.tile.Cin": (4, 2, 16),
        f"{s}.tile.H": (1, 7, 4),
        f"{s}.tile.W": (7, 2, 2),
        f"{s}.tile.kw": (3, 1),
        f"layout.{x}.perm": (0, 2, 3, 1),
        "layout.w.tile": "0:16",
    }
    for config in (rows, channels):
        space.apply(config)
    assert gensor_model.estimate(space, rows) < gensor_model.estimate(space, channels)


def test_the_construction_puts_rows_on_the_lanes_at_alts_depthwise_layer():
    """ALT's DEP layer (128x28x28): Gensor's constructions with the channels on the lanes (the input packed
    ``[N, H, W, C]``) measured 53-85 us and those with the rows on the lanes 25-33 us; the model ranked the
    channels 2% ahead, both under one DRAM floor. Its best construction now has the rows on the lanes,
    and its best channel form is estimated slower."""
    space = _space({"Cin": 128, "H": 28, "W": 28})
    stage = _stage(space)
    ranked = gensor.constructions(space, space.heuristic(), random.Random(0), count=12)
    best = {}
    for cost, config in ranked:
        best.setdefault(config[f"{stage.name}.vector"], cost)
    assert {"W", "Cin"} <= set(best), best
    assert ranked[0][1][f"{stage.name}.vector"] == "W"
    assert best["W"] < best["Cin"], best
