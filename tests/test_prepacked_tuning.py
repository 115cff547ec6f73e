"""Tuning a kernel in the prepacked-weights signature a compiled network runs it in: the measurer compiles
each configuration without its packing copies, packs the weights once outside the timing and checks the
kernel against the reference as before; the task is keyed apart from the per-call one (whose key is
unchanged, so an old database still reads); ``kdsl tune --network`` tunes it and ``compile_network`` runs
its records; bad input is refused naming the flag."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from dataclasses import replace
from pathlib import Path

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

from kdsl.bench.network_tune import compile_network, network_tasks  # noqa: E402
from kdsl.codegen import tvm as kdsl_tvm  # noqa: E402
from kdsl.codegen.tvm import load_tvm, lower  # noqa: E402
from kdsl.codegen.tvm.prepack import WeightLayout, prepack_weights  # noqa: E402
from kdsl.codegen.tvm.schedule_space import VERSION, ScheduleSpace  # noqa: E402
from kdsl.discover.network import resnet18, resolve_ops  # noqa: E402
from kdsl.tune.driver import tune  # noqa: E402
from kdsl.tune.measurer import (  # noqa: E402
    Measurer,
    _arguments,
    _compile_job,
    _compile_setup,
    _measure_job,
    _measure_setup,
    layouts_path,
)
from kdsl.tune.tuned import best_record, tuned_schedule  # noqa: E402

#: a small conv2d whose default schedule packs its weight (Cout is the vector axis)
LAYER = {"N": 1, "Cin": 8, "Cout": 32, "H": 5, "W": 5}
RESOLUTION = 32


def valid_config(space: ScheduleSpace, seed: int) -> dict:
    """A random configuration of ``space`` that applies (not the default one), with short unrolls (fast compiles)."""
    rng = random.Random(seed)
    for _ in range(200):
        config = space.random(rng)
        config.update({k: min(v, 16) for k, v in config.items() if k.endswith(".unroll")})
        if config != space.heuristic() and space.rejection(config) is None:
            return config
    raise AssertionError("no valid random configuration in 200 draws")


# ------------------------------------------------------------------------------------------------
# The task


def test_a_prepacked_task_is_its_own_and_an_old_database_still_reads(tmp_path):
    op = gallery.load("conv2d")
    db = tmp_path / "t.db"
    binding, plain, store = open_task(op, LAYER, db)
    # the per-call key is the one kdsl always computed (recomputed here from its parts)
    old = hashlib.sha1(json.dumps([op.key, sorted(binding.items()), target_mcpu(), VERSION]).encode()).hexdigest()
    assert plain == old[:20] == task_key(op, binding, target_mcpu(), 0, False)
    _, packed, _ = open_task(op, LAYER, db, prepacked=True)
    _, blocked_packed, _ = open_task(op, LAYER, db, 8, True)
    assert len({plain, packed, blocked_packed, task_key(op, binding, target_mcpu(), 8)}) == 4
    descriptions = store.descriptions()
    assert descriptions[packed]["prepacked_weights"] is True and "prepacked_weights" not in descriptions[plain]
    assert descriptions[blocked_packed]["channel_block"] == 8
    # a database with per-call records only (as every one before): read as before, never as prepacked
    config = valid_config(ScheduleSpace(lower(op, binding)), 0)
    store.add(plain, Record(config, 1e-6, None, "opevo"))
    store.database.close()
    assert best_record(db, op, LAYER).config == Record(config, None, None, "x").config
    with pytest.raises(TuneError, match="no measured schedule with prepacked weights"):
        best_record(db, op, LAYER, prepacked=True)
    assert tuned_schedule(db, op, LAYER, prepacked=True) is None
    # ... unless asked to fall back to the per-call task's best (what compile_network does)
    assert tuned_schedule(db, op, LAYER, prepacked=True, fallback=True) is not None
    with pytest.raises(TuneError, match="prepacked flag of a task must be True or False, got 'yes'"):
        open_task(op, LAYER, db, prepacked="yes")


# ------------------------------------------------------------------------------------------------
# The measurer


def compiled(tmp_path, config: dict | None = None, prepacked: bool = True) -> tuple[dict, str, list]:
    """conv2d at LAYER compiled by the compile worker's job (in this process) with ``config`` (default: the
    heuristic); its binding, the library's path and the layouts written beside it (``None``: none)."""
    op = gallery.load("conv2d")
    binding = dict(solve.bind(op, LAYER))
    space = _compile_setup(op, binding)
    path = str(tmp_path / f"k{len(list(tmp_path.iterdir()))}.so")
    job = (config or space.heuristic(), path, False)
    assert _compile_job(space, job, contextlib.nullcontext, prepacked=prepacked) is None
    beside = Path(layouts_path(path))
    layouts = json.loads(beside.read_text()) if beside.exists() else None
    assert Path(path).is_file()
    return binding, path, layouts


def test_the_prepacked_measurer_times_the_kernel_without_its_packing_copy_and_checks_it(tmp_path):
    op = gallery.load("conv2d")
    binding, path, layouts = compiled(tmp_path)
    assert layouts is not None and layouts[0] is not None  # the heuristic packs the weight: prepacked
    layout = WeightLayout.from_json(layouts[0])
    assert layout.packed_shape != layout.shape  # the signature takes the packed weight
    state = _measure_setup(op, binding, 0, True)
    latency, error = _measure_job(state, (path, True), contextlib.nullcontext)
    assert error is None and latency > 0
    # the library, on the weight the measurer packed, computes the float64 reference
    x, weights = state["x"], state["weights"]
    args = _arguments(state, path)
    assert tuple(args[1].shape) == layout.packed_shape and len(state["packed"]) == 1
    library = load_tvm().runtime.load_module(path)
    library["main"](*args, state["out"])
    expected = reference.run(op, binding, x.astype(np.float64), [w.astype(np.float64) for w in weights])
    assert np.allclose(state["out"].numpy(), expected, rtol=1e-4, atol=1e-4)
    # the same schedule packing per call gives the same output
    _, per_call, none = compiled(tmp_path, prepacked=False)
    assert none is None
    plain_state = _measure_setup(op, binding)
    assert _measure_job(plain_state, (per_call, True), contextlib.nullcontext)[1] is None
    assert np.allclose(plain_state["out"].numpy(), state["out"].numpy(), rtol=1e-5, atol=1e-5)
    # the check can fail: the weight passed unpacked is refused, one packed wrongly is a wrong result
    Path(layouts_path(path)).write_text(json.dumps([None]))
    latency, error = _measure_job(state, (path, True), contextlib.nullcontext)
    assert latency is None and "run failed" in error
    Path(layouts_path(path)).write_text(json.dumps(layouts))
    unpacked = weights[0].reshape(layout.packed_shape)  # the weight's memory read as packed: packing skipped
    state["packed"] = {json.dumps(layouts[0], sort_keys=True): state["tvm"].runtime.tensor(unpacked, state["dev"])}
    latency, error = _measure_job(state, (path, True), contextlib.nullcontext)
    assert latency is None and "wrong result" in error
    # a per-call library measured as prepacked: no layouts beside it, said so
    latency, error = _measure_job(state, (per_call, True), contextlib.nullcontext)
    assert latency is None and "not compiled with prepacked weights" in error


def test_a_weight_the_schedule_does_not_pack_is_passed_as_it_is(tmp_path):
    op = gallery.load("conv2d")
    space = _compile_setup(op, dict(solve.bind(op, LAYER)))
    unpacked = {**space.heuristic(), "layout.w.tile": "none", "layout.w.perm": (0, 1, 2, 3)}
    binding, path, layouts = compiled(tmp_path, unpacked)
    assert layouts == [None]
    state = _measure_setup(op, binding, 0, True)
    assert _arguments(state, path)[1] is state["args"][1]
    latency, error = _measure_job(state, (path, True), contextlib.nullcontext)
    assert error is None and latency > 0


def test_tune_stores_prepacked_records_under_the_prepacked_task_only(tmp_path):
    op = gallery.load("conv2d")
    db = tmp_path / "t.db"
    with Measurer(op, LAYER, workers=1, prepacked=True) as measurer:
        result = tune(
            op, LAYER, "random", 2, db, batch=2, measurer=measurer, confirm=0, cost_model=False, prepacked=True
        )
    assert result.measured == 2 and result.best is not None and result.best.latency > 0
    _, packed, store = open_task(op, LAYER, db, prepacked=True)
    _, plain, _ = open_task(op, LAYER, db)
    assert result.task == packed and store.records(plain) == []
    assert [r.error for r in store.records(packed)] == [None, None]  # every one checked valid
    store.database.close()


def test_prepacked_tuning_refuses_what_it_cannot_do(tmp_path):
    op = gallery.load("conv2d")
    with pytest.raises(TuneError, match="measurer's prepacked flag must be True or False, got 1"):
        Measurer(op, LAYER, prepacked=1)
    with pytest.raises(TuneError, match="tune a prepacked-weights one with opevo"):
        tune(op, LAYER, "metaschedule", 1, tmp_path / "t.db", prepacked=True)

    class PerCallMeasurer:
        block, prepacked = 0, False

    with pytest.raises(TuneError, match="measures prepacked=False .*the task's is prepacked=True"):
        tune(op, LAYER, "random", 1, tmp_path / "t.db", prepacked=True, measurer=PerCallMeasurer())
    with pytest.raises(KdslError, match="task t: its prepacked flag must be True or False, got 'no'"):
        NetworkTask("t", op, LAYER, 1, 1.0, 0, "no")
    with pytest.raises(LoweringError, match="not a packed weight layout"):
        WeightLayout.from_json({"name": "w", "shape": [2], "packed_shape": [2], "map": "not json"})


# ------------------------------------------------------------------------------------------------
# The network


def test_the_network_budget_is_split_between_the_per_call_and_prepacked_signatures(monkeypatch, tmp_path):
    # (that the command makes every task prepacked: tests/test_blocked_tuning.py, with its other tasks)
    opened, rounds = [], []

    class FakeMeasurer:
        def __init__(self, op, binding, block=0, prepacked=False):
            opened.append((block, prepacked))
            self.block, self.prepacked = block, prepacked

        def close(self):
            pass

    def fake_tune(op, layer, tuner, trials, db, **kwargs):
        assert kwargs["measurer"].prepacked == kwargs["prepacked"]
        rounds.append((kwargs["block"], kwargs["prepacked"]))
        return TuneResult("k", tuner, None, [], trials, 0, 0.0)

    monkeypatch.setattr(tune_network_module, "Measurer", FakeMeasurer)
    monkeypatch.setattr(tune_network_module, "measure_default", lambda task, db, measurer: 0.001 * task.weight)
    monkeypatch.setattr(tune_network_module, "tune", fake_tune)
    monkeypatch.setattr(
        tune_network_module, "task_summary", lambda task, db, trials=0: TaskSummary(task.label, 1, trials, 1.0, 0.5)
    )
    item = resolve_ops(["conv2d"], resolution=RESOLUTION)[0]
    per_call = [replace(t, label=f"{t.label} per call") for t in network_tasks(item, [1], RESOLUTION, replace="3x3")]
    packed = network_tasks(item, [1], RESOLUTION, replace="3x3", prepacked=True)
    summaries = tune_network(per_call + packed, 32, str(tmp_path / "t.db"))
    # per call and prepacked are two signatures: the budget is split evenly between them
    assert sorted(set(opened)) == [(0, False), (0, True)] and rounds.count((0, False)) == rounds.count((0, True)) == 2
    assert sum(s.trials for s in summaries[:4]) == sum(s.trials for s in summaries[4:]) == 16


def test_compile_network_runs_the_prepacked_records_and_the_per_call_row_its_own(tmp_path):
    item = resolve_ops(["conv2d"], resolution=RESOLUTION)[0]
    net = resnet18(item, batch=1, resolution=RESOLUTION, classes=10, seed=1)
    task = network_tasks(item, [1], RESOLUTION, replace="3x3")[0]  # conv2_x
    db = str(tmp_path / "records.db")
    binding, _, store = open_task(task.op, task.layer, db)
    store.database.close()
    space = ScheduleSpace(lower(task.op, binding))
    configs = {packed: valid_config(space, seed) for seed, packed in enumerate((False, True))}
    assert configs[False] != configs[True]
    for packed, config in configs.items():
        _, key, store = open_task(task.op, task.layer, db, prepacked=packed)
        store.add(key, Record(config, 1e-9, None, "opevo"))
        store.database.close()
    kernels: dict = {}
    x = torch.randn(1, 3, RESOLUTION, RESOLUTION, generator=torch.Generator().manual_seed(0))
    for prepack in (True, False):
        network = compile_network(net, "plain", db=db, kernels=kernels, fuse=False, prepack=prepack, replace="3x3")
        kernel = network.blocks[0][0][0]  # conv2_x's first convolution
        expected = ScheduleSpace(kernel.lowered).apply(configs[prepack])
        if prepack:
            expected, _ = prepack_weights(expected, kernel.lowered)
        assert kernel.schedule.mod.script() == expected.mod.script()
        with torch.no_grad():
            got, want = network(x), net(x)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), float((got - want).abs().max())


def test_the_cost_model_trains_on_the_per_call_task_and_skips_the_prepacked_one(tmp_path):
    from kdsl.tune.transfer import load_tasks

    op = gallery.load("matmul")
    layer = {"M": 4, "Cin": 8, "Cout": 16}
    db = tmp_path / "t.db"
    keys = {}
    for packed in (False, True):
        binding, keys[packed], store = open_task(op, layer, db, prepacked=packed)
        store.add(keys[packed], Record(ScheduleSpace(lower(op, binding)).heuristic(), 1e-6, None, "opevo"))
        store.database.close()
    assert [task.task for task in load_tasks([db], target_mcpu(), min_configs=1)] == [keys[False]]


def test_kdsl_tune_prepacked_tunes_and_reads_the_prepacked_task(monkeypatch, capsys, tmp_path):
    from kdsl.cli import main, tune_commands

    # a layer whose heuristic schedule packs the weight: the exported kernel takes it packed
    op, layer, db = gallery.load("matmul"), {"M": 16, "Cin": 32, "Cout": 64}, str(tmp_path / "t.db")

    def fake_tune(op, layer, tuner, trials, db, **kwargs):
        # what a run stores: a measured record under the task of the signature asked for
        binding, key, store = open_task(op, layer, db, prepacked=kwargs["prepacked"])
        record = Record(ScheduleSpace(lower(op, binding)).heuristic(), 1e-6, None, tuner)
        store.add(key, record)
        store.database.close()
        return TuneResult(key, tuner, record, [1e-6], 1, 0, 0.0)

    monkeypatch.setattr(tune_commands, "tune", fake_tune)
    argv = ["tune", "matmul", "--layers", json.dumps(layer), "--db", db, "--no-roofline"]
    assert main([*argv, "--prepacked", "--trials", "1"]) == 0
    assert "--prepacked --apply --out" in capsys.readouterr().out  # how to build it, and to pack its weights
    assert main([*argv, "--apply", "--prepacked"]) == 0
    assert main([*argv, "--apply"]) == 2  # nothing tuned per call: an error
    assert "no measured schedule" in capsys.readouterr().err
    library = tmp_path / "k.so"
    assert main([*argv, "--apply", "--prepacked", "--out", str(library)]) == 0
    kernel = kdsl_tvm.load(library)  # the prepacked kernel, its weights' layouts from the description
    assert kernel.prepacked and kernel.weight_shapes != [(32, 64)]
    x, w = np.random.default_rng(0).standard_normal((16, 32)), np.random.default_rng(1).standard_normal((32, 64))
    got = kernel(torch.tensor(x, dtype=torch.float32), *kernel.pack_weights(torch.tensor(w, dtype=torch.float32)))
    np.testing.assert_allclose(got.numpy(), reference.run(op, layer, x, [w]), rtol=1e-4, atol=1e-4)
    assert best_record(db, op, layer, prepacked=True).tuner == "opevo"
