"""Tuning a kernel in the channel-blocked signature it runs in (``kdsl tune --network``'s blocked networks):
the task is keyed apart from the plain one, the measurer times blocked buffers and checks them against the
float64 reference blocked the same way, and a network's budget is split between the signatures
(``tests/test_network_tune.py`` checks that a blocked network runs the blocked records)."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import pytest
from backends import backend

from kdsl import gallery, solve
from kdsl.codegen import reference
from kdsl.lang.errors import KdslError, LoweringError
from kdsl.tune import network as tune_network_module
from kdsl.tune.network import NetworkTask, TaskSummary, tune_network
from kdsl.tune.records import Record, TuneError, TuneResult, open_task, target_mcpu, task_key

backend("tvm")

import torch  # noqa: E402  (after the skip: the kernels need TVM)

from kdsl.bench.network_tune import network_tasks  # noqa: E402
from kdsl.codegen.tvm import build, load_tvm, lower  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.codegen.tvm.signature_layout import build_blocked, from_blocked, to_blocked  # noqa: E402
from kdsl.discover.network import resolve_ops  # noqa: E402
from kdsl.tune.driver import tune  # noqa: E402
from kdsl.tune.measurer import (  # noqa: E402
    Measurer,
    _compile_job,
    _compile_setup,
    _measure_job,
    _measure_setup,
    signature_schedule,
)
from kdsl.tune.tuned import best_record, tuned_schedule  # noqa: E402

BLOCK = 8
#: small layers whose channels the block divides (grouped: 2 groups of 8 channels)
LAYERS = {
    "conv2d": {"N": 2, "Cin": 16, "Cout": 16, "H": 5, "W": 5},
    "grouped_conv2d": {"N": 2, "Cin": 16, "Cout": 16, "H": 5, "W": 5, "G": 2},
}


def blockable_config(op, binding, seed: int) -> dict:
    """A random configuration of the space (not the default one) that applies and whose signature blocks."""
    space = ScheduleSpace(lower(op, binding))
    rng = random.Random(seed)
    for _ in range(100):
        config = space.random(rng)
        try:
            signature_schedule(space, config, BLOCK)
        except LoweringError:
            continue
        assert config != space.heuristic()
        return config
    raise AssertionError("no random configuration of the space could be blocked in 100 draws")


# ------------------------------------------------------------------------------------------------
# The task


def test_the_blocked_signature_is_a_task_of_its_own_and_the_plain_key_is_unchanged(tmp_path):
    op, layer = gallery.load("conv2d"), LAYERS["conv2d"]
    binding, plain_key, store = open_task(op, layer, tmp_path / "t.db")
    _, blocked_key, _ = open_task(op, layer, tmp_path / "t.db", BLOCK)
    assert plain_key == task_key(op, binding, target_mcpu()) == task_key(op, binding, target_mcpu(), 0)
    assert len({plain_key, blocked_key, task_key(op, binding, target_mcpu(), 16)}) == 3
    assert store.descriptions()[blocked_key]["channel_block"] == BLOCK
    assert "channel_block" not in store.descriptions()[plain_key]
    # a record of one signature is never the other's best
    store.add(blocked_key, Record(blockable_config(op, binding, 0), 1e-6, None, "opevo"))
    store.database.close()
    assert tuned_schedule(tmp_path / "t.db", op, layer) is None
    assert tuned_schedule(tmp_path / "t.db", op, layer, BLOCK) is not None
    with pytest.raises(TuneError, match="no measured schedule with channel block 16"):
        best_record(tmp_path / "t.db", op, layer, block=16)
    with pytest.raises(TuneError, match="non-negative integer.*-1"):
        open_task(op, layer, tmp_path / "t.db", -1)


# ------------------------------------------------------------------------------------------------
# The measurer


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_kernel_tuned_blocked_computes_the_plain_kernel_after_the_transform(tmp_path, name):
    op = gallery.load(name)
    binding = dict(solve.bind(op, LAYERS[name]))
    config = blockable_config(op, binding, 1)
    # the measuring worker's steps, in this process: compile blocked, time on blocked buffers, check
    space = _compile_setup(op, binding)
    path = str(tmp_path / "k.so")
    assert _compile_job(space, (config, path, False), contextlib.nullcontext, block=BLOCK) is None
    state = _measure_setup(op, binding, BLOCK)
    latency, error = _measure_job(state, (path, True), contextlib.nullcontext)
    assert error is None and latency > 0
    # the blocked library on the worker's blocked input gives the float64 reference, blocked
    x, weights = state["x"], state["weights"]
    expected = reference.run(op, binding, x.astype(np.float64), [w.astype(np.float64) for w in weights])
    library = load_tvm().runtime.load_module(path)
    library["main"](*state["args"], state["out"])
    got = from_blocked(torch.from_numpy(state["out"].numpy()))
    assert np.allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4), float(np.abs(got.numpy() - expected).max())
    # and what the network builds from the record equals the plain kernel of the same schedule
    tuned = build_blocked(op, binding, BLOCK, lambda lowered: ScheduleSpace(lowered).apply(config))
    plain = build(op, binding, schedule=lambda lowered: ScheduleSpace(lowered).apply(config))
    tx, tw = torch.from_numpy(x), [torch.from_numpy(w) for w in weights]
    with torch.no_grad():
        assert torch.allclose(from_blocked(tuned(to_blocked(tx, BLOCK), *tw)), plain(tx, *tw), rtol=1e-5, atol=1e-5)


def test_the_blocked_check_fails_on_a_wrong_or_plain_kernel(tmp_path):
    op = gallery.load("conv2d")
    binding = dict(solve.bind(op, LAYERS["conv2d"]))
    space = _compile_setup(op, binding)
    blocked, plain = str(tmp_path / "b.so"), str(tmp_path / "p.so")
    assert _compile_job(space, (space.heuristic(), blocked, False), contextlib.nullcontext, block=BLOCK) is None
    assert _compile_job(space, (space.heuristic(), plain, False), contextlib.nullcontext) is None
    state = _measure_setup(op, binding, BLOCK)
    assert _measure_job(state, (blocked, True), contextlib.nullcontext)[1] is None
    # a plain kernel does not take the blocked buffers
    latency, error = _measure_job(state, (plain, True), contextlib.nullcontext)
    assert latency is None and "run failed" in error
    # a reference left in the plain layout, its memory read as blocked: the check must see the difference
    rows, expected = state["expected"]
    state["expected"] = (rows, from_blocked(torch.from_numpy(expected)).numpy().reshape(expected.shape))
    latency, error = _measure_job(state, (blocked, True), contextlib.nullcontext)
    assert latency is None and "wrong result" in error


def test_blocked_tuning_refuses_what_it_cannot_do(tmp_path):
    op, layer = gallery.load("conv2d"), LAYERS["conv2d"]
    with pytest.raises(LoweringError, match="input's channels .dim 1, size 16. cannot be blocked by 3"):
        Measurer(op, layer, block=3)
    with pytest.raises(TuneError, match="metaschedule tunes its own module in the plain signature"):
        tune(op, layer, "metaschedule", 1, tmp_path / "t.db", block=BLOCK)

    class PlainMeasurer:
        block = 0

    with pytest.raises(TuneError, match="measures channel block 0, the task's is 8"):
        tune(op, layer, "random", 1, tmp_path / "t.db", block=BLOCK, measurer=PlainMeasurer())
    with pytest.raises(KdslError, match="channel block must be 0 .plain. or positive"):
        NetworkTask("t", op, layer, 1, 1.0, -2)


def test_tune_stores_blocked_records_under_the_blocked_task_only(tmp_path):
    op, layer = gallery.load("conv2d"), LAYERS["conv2d"]
    db = tmp_path / "t.db"
    with Measurer(op, layer, workers=1, block=BLOCK) as measurer:
        result = tune(op, layer, "random", 1, db, block=BLOCK, measurer=measurer, confirm=0, cost_model=False)
    assert result.measured == 1 and result.best is not None and result.best.latency > 0
    _, blocked_key, store = open_task(op, layer, db, BLOCK)
    _, plain_key, _ = open_task(op, layer, db)
    assert result.task == blocked_key and store.records(plain_key) == []
    assert [r.error for r in store.records(blocked_key) if r.latency is None] == []  # every one checked valid
    store.database.close()


# ------------------------------------------------------------------------------------------------
# The network


def test_a_network_tuned_in_both_signatures_splits_the_budget_evenly(monkeypatch, tmp_path):
    rounds, opened = [], []

    class FakeMeasurer:
        def __init__(self, op, binding, block=0, prepacked=False):
            opened.append(block)
            self.block = block

        def close(self):
            pass

    def fake_tune(op, layer, tuner, trials, db, **kwargs):
        # the plain layers' tuner has nothing left after its first round: its rest goes to the blocked ones
        exhausted = kwargs["block"] == 0 and any(block == 0 for block, _ in rounds)
        rounds.append((kwargs["block"], 0 if exhausted else trials))
        assert kwargs["measurer"].block == kwargs["block"]
        return TuneResult("k", tuner, None, [], 0 if exhausted else trials, 0, 0.0)

    monkeypatch.setattr(tune_network_module, "Measurer", FakeMeasurer)
    monkeypatch.setattr(tune_network_module, "measure_default", lambda task, db, measurer: 0.001 * task.weight)
    monkeypatch.setattr(tune_network_module, "tune", fake_tune)
    monkeypatch.setattr(
        tune_network_module, "task_summary", lambda task, db, trials=0: TaskSummary(task.label, 1, trials, 1.0, 0.5)
    )
    item = resolve_ops(["conv2d"], resolution=32)[0]
    tasks = network_tasks(item, [1], 32, replace="3x3") + network_tasks(item, [1], 32, 16)
    assert [task.label for task in tasks[4:]] == [f"conv{i}_x N=1 NCHW16c" for i in range(2, 6)]
    summaries = tune_network(tasks, 32, str(tmp_path / "t.db"))
    given = {block: sum(n for b, n in rounds if b == block) for block in (0, 16)}
    assert given == {0: 8, 16: 24}  # 16 each, but the plain tuner ran dry after 8: its 8 left went on
    assert [block for block, _ in rounds] == sorted(block for block, _ in rounds)  # plain first, then blocked
    assert sum(s.trials for s in summaries[:4]) == 8 and sum(s.trials for s in summaries[4:]) == 24
    assert set(opened) == {0, 16}


def test_the_network_command_tunes_every_layer_in_both_signatures(monkeypatch, capsys, tmp_path):
    import kdsl.bench.network_tune as network_tune
    from kdsl.cli import main

    given = {}

    def fake_tune_network(tasks, trials, db, **kwargs):
        given["tasks"] = tasks
        return [TaskSummary(task.label, task.weight, 0, 1.0, 1.0) for task in tasks]

    monkeypatch.setattr(network_tune, "tune_network", fake_tune_network)
    monkeypatch.setattr(network_tune, "time_networks", lambda *args, **kwargs: [])
    argv = ["tune", "conv2d", "--network", "resnet18", "--batch", "1", "--resolution", "32", "--block", "32"]
    assert main([*argv, "--trials", "8", "--db", str(tmp_path / "t.db"), "--replace", "3x3"]) == 0
    tasks = given["tasks"]
    assert [task.block for task in tasks] == [0] * 4 + [32] * 4
    assert [(t.layer, t.weight, t.scale) for t in tasks[:4]] == [(t.layer, t.weight, t.scale) for t in tasks[4:]]
    out = capsys.readouterr().out
    assert "split evenly between the kernels' NCHW and NCHW32c signatures" in out and "conv5_x N=1 NCHW32c" in out
    # by default the plain signature also tunes the stem, the stride-2 convolutions and their shortcuts,
    # the max pooling and the head (average pooling and classifier)
    assert main([*argv, "--trials", "8", "--db", str(tmp_path / "t.db")]) == 0
    tasks = given["tasks"]
    assert [task.block for task in tasks] == [0] * 13 + [32] * 4
    assert all(task.prepacked for task in tasks)  # the network runs its weights packed once: so are they tuned
    assert [t.label for t in tasks[4:11]][:3] == ["stem 7x7/2 N=1", "conv3_x 3x3/2 N=1", "conv3_x 1x1/2 N=1"]
    assert [t.label for t in tasks[11:13]] == ["maxpool 3x3/2 N=1", "avgpool+fc N=1"]
    out = capsys.readouterr().out
    assert "strided_conv2d in the 7x7 stem" in out and "maxpool 3x3/2 N=1" in out and "avgpool+fc N=1" in out
    assert "weights packed once, outside the measured time" in out
