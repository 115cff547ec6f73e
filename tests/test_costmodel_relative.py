"""The cross-operator model's features taken against the task's heuristic configuration
(kdsl.tune.features.features_matrix's "relative" kind), the refusals of unknown kinds, and the layers
``kdsl bench costmodel --collect`` measures."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from backends import backend

from kdsl import gallery, solve
from kdsl.bench import costmodel_bench
from kdsl.cli import main as cli_main
from kdsl.lang.errors import KdslError
from kdsl.tune import gensor_model
from kdsl.tune.features import FEATURES, KINDS, RELATIVE, TASK_CONSTANT, config_features, features_matrix
from kdsl.tune.transfer import TaskData, TransferModel, load_tasks, space_for

backend("tvm")

TASKS = (
    ("matmul", {"M": 16, "Cin": 32, "Cout": 32}),
    ("matmul", {"M": 64, "Cin": 128, "Cout": 64}),
    ("conv2d", {"N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8}),
)


def _space(name: str, layer: dict[str, int]):
    from kdsl.codegen.tvm import lower
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    op = gallery.load(name)
    return ScheduleSpace(lower(op, solve.bind(op, layer)))


def test_the_heuristic_is_the_origin_of_every_task_whatever_its_size():
    # absolute features of the heuristic differ between tasks (sizes, peak distance); relative ones are 0 in all
    absolute, relative = [], []
    for name, layer in TASKS:
        space = _space(name, layer)
        absolute.append(features_matrix(space, [space.heuristic()], "absolute")[0])
        relative.append(features_matrix(space, [space.heuristic()])[0])
    assert len({tuple(row) for row in absolute}) == len(TASKS)
    assert all(row == [0.0] * len(RELATIVE) for row in relative)
    assert not set(RELATIVE) & TASK_CONSTANT and set(RELATIVE) | TASK_CONSTANT == set(FEATURES)


def test_relative_features_are_the_absolute_ones_less_the_heuristics():
    space = _space(*TASKS[0])
    configs = [space.random(random.Random(seed)) for seed in range(6)]
    heuristic = dict(zip(FEATURES, config_features(space, space.heuristic())))
    for config, row in zip(configs, features_matrix(space, configs)):
        named = dict(zip(FEATURES, config_features(space, config)))
        assert row == [named[name] - heuristic[name] for name in RELATIVE]


def test_relative_features_do_not_change_with_the_machines_speed():
    # a machine twice as fast everywhere (clock and every bandwidth) runs every schedule in half the time:
    # each configuration's place against the task's heuristic stays where it was
    name, layer = TASKS[2]
    configs = None
    rows = []
    for speed in (1.0, 2.0):
        space = _space(name, layer)
        model = gensor_model.space_model(space)
        fields = ("hz", "bw_l1", "bw_l2", "bw_l3", "bw_mem")
        space.__dict__["_gensor_model"] = dataclasses.replace(model, **{f: getattr(model, f) * speed for f in fields})
        configs = configs or [space.random(random.Random(seed)) for seed in range(5)]
        rows.append(np.array(features_matrix(space, configs)))
    assert np.abs(rows[0]).max() > 0
    np.testing.assert_allclose(rows[0], rows[1], atol=0.02)


def test_configurations_that_run_different_schedules_get_different_features():
    space = _space(*TASKS[1])
    stage = next(s for s in space.stages if s.kind == "reduce")
    base = dict(space.heuristic(), **{f"{stage.name}.lanes": False})
    vector = base[f"{stage.name}.vector"]
    extent = dict(stage.spatial)[vector]
    scalar = dict(base, **{f"{stage.name}.tile.{vector}": (extent, 1, 1)})  # one lane, same tiles elsewhere
    lanes = dict(base, **{f"{stage.name}.lanes": True})
    rows = features_matrix(space, [base, scalar, lanes])
    named = [dict(zip(RELATIVE, row)) for row in rows]
    assert named[1]["vector_log_length"] < named[0]["vector_log_length"]
    assert named[1]["estimate_over_peak"] > named[0]["estimate_over_peak"]
    assert named[2]["rfactor"] != named[0]["rfactor"] and named[2]["extra_passes"] > named[0]["extra_passes"]
    assert len({tuple(row) for row in rows}) == 3


def test_unknown_feature_kinds_and_mixed_kinds_are_refused(tmp_path):
    space = _space(*TASKS[0])
    with pytest.raises(KdslError, match="no kind 'rank'"):
        features_matrix(space, [space.heuristic()], "rank")
    with pytest.raises(KdslError, match="no features of kind 'rank'"):
        TransferModel("t", kind="rank")
    with pytest.raises(KdslError, match="no features of kind 'rank'"):
        load_tasks([tmp_path / "none.db"], "t", kind="rank")
    rng = np.random.default_rng(0)
    tasks = [
        TaskData(
            f"t{i}", f"op{i}", f"op{i}", "t", {}, [{}] * 8, list(rng.random(8)), rng.random((8, 3)), [1.0] * 8, kind
        )
        for i, kind in enumerate(("relative", "absolute"))
    ]
    with pytest.raises(KdslError, match="absolute features"):
        TransferModel("t").fit(tasks)
    assert TransferModel("t", kind="absolute").fit(tasks[1:]) == 8
    with pytest.raises(SystemExit):  # argparse's refusal of a choice it does not offer
        cli_main(["bench", "costmodel", "--db", str(tmp_path / "x.db"), "--features", "rank"])


def test_a_model_predicts_the_width_of_its_kind():
    space = _space(*TASKS[0])
    configs = [space.heuristic()] + [space.random(random.Random(seed)) for seed in range(9)]
    latencies = [float(i + 1) for i in range(10)]
    for kind, names in KINDS.items():
        rows = np.array(features_matrix(space, configs, kind))
        assert rows.shape == (10, len(names))
        task = TaskData("a", "op", "op", "t", {}, configs, latencies, rows, latencies, kind)
        model = TransferModel("t", kind=kind)
        model.fit([task])
        assert len(model.predict(space, configs)) == 10


@pytest.mark.parametrize("name", ["bmm", "linear", "strided_conv2d", "conv_transpose2d", "avg_pool2d_strided"])
def test_every_new_collect_layer_builds_a_schedule_space(name):
    # --collect measures these: a layer that does not bind or lower would stop the lead's collection midway
    op = gallery.load(name)
    for layer in costmodel_bench.LAYERS[name].values():
        space = space_for(op, layer, "znver4")
        assert any(stage.kind == "reduce" for stage in space.stages)
        assert np.isfinite(np.array(features_matrix(space, [space.heuristic()]))).all()
    assert set(costmodel_bench.DEFAULT_OPS) <= set(costmodel_bench.LAYERS)
