"""The cross-operator cost model: its features, training per target, leave-one-operator-out scoring,
the tuners it ranks for and the driver's per-run report (kdsl.tune.features, kdsl.tune.transfer)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from backends import backend

from kdsl import gallery, solve
from kdsl.tune import gensor_model, transfer
from kdsl.tune.features import FEATURES, RELATIVE, as_applied, config_features
from kdsl.tune.records import Record, RecordStore, TuneError
from kdsl.tune.transfer import (
    Prefiltered,
    TaskData,
    TransferModel,
    leave_one_operator_out,
    load_tasks,
    other_versions,
    rank_correlation,
    run_ranking,
)

backend("tvm")

MATMUL = {"M": 16, "Cin": 32, "Cout": 32}
CONV = {"N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8}


def _space(name: str, layer: dict[str, int]):
    from kdsl.codegen.tvm import lower
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    op = gallery.load(name)
    return ScheduleSpace(lower(op, solve.bind(op, layer)))


def assert_features_sane(space, config) -> None:
    values = config_features(space, config)
    assert len(values) == len(FEATURES)
    assert all(math.isfinite(v) for v in values), dict(zip(FEATURES, values))
    named = dict(zip(FEATURES, values))
    assert 0 < named["vector_fill"] <= 1 and 0 < named["parallel_balance"] <= 1
    assert 0 <= named["gather_share"] <= 1


def test_features_are_finite_and_the_same_list_on_every_operator():
    rng = random.Random(0)
    lengths = set()
    for name, layer in (("matmul", MATMUL), ("conv2d", CONV), ("depthwise_conv2d", {"N": 1, "Cin": 8, "H": 8, "W": 8})):
        space = _space(name, layer)
        for config in [space.heuristic()] + [space.random(rng) for _ in range(20)]:
            assert_features_sane(space, config)
        lengths.add(len(space.parameters))
        heuristic = dict(zip(FEATURES, config_features(space, space.heuristic())))
        # measured against the heuristic: 0 for the heuristic itself, on every operator
        assert heuristic["estimate_vs_heuristic"] == 0.0
        # in units of the machine's peak time for the MACs: the estimate is never far below the peak
        assert heuristic["estimate_over_peak"] > -1.0
    assert len(lengths) > 1  # the spaces' own parameters differ; the features do not


def test_features_follow_the_configuration_not_the_parameter_names():
    space = _space("matmul", MATMUL)
    base = space.heuristic()
    stage = next(s for s in space.stages if s.kind == "reduce")
    vector = base[f"{stage.name}.vector"]
    whole = dict(base)
    scalar = dict(base)
    extent = dict(stage.spatial)[vector]
    scalar[f"{stage.name}.tile.{vector}"] = (extent, 1, 1)  # the vector axis' inner tile: one lane
    whole_named = dict(zip(FEATURES, config_features(space, whole)))
    scalar_named = dict(zip(FEATURES, config_features(space, scalar)))
    assert scalar_named["vector_log_length"] == 0.0 and scalar_named["vector_whole"] == 0.0
    assert whole_named["vector_log_length"] > 0.0
    assert scalar_named["vector_fill"] < whole_named["vector_fill"]


def test_a_lanes_configuration_is_read_as_the_schedule_that_runs():
    # S.lanes replaces the stage's tiling: configurations that differ only in the tiling it ignores are one
    # schedule and must get one set of features; without S.lanes the same tiling changes do change them
    space = _space("matmul", MATMUL)
    stage = next(s for s in space.stages if s.kind == "reduce")
    name = stage.name
    base = dict(space.heuristic(), **{f"{name}.lanes": False})
    other = dict(base)
    other.update({f"{name}.tile.M": (16, 1, 1), f"{name}.cache": "none", f"{name}.unroll": 64})
    assert config_features(space, base) != config_features(space, other)
    lanes = [dict(c, **{f"{name}.lanes": True}) for c in (base, other)]
    assert config_features(space, lanes[0]) == config_features(space, lanes[1])
    off, on = dict(zip(FEATURES, config_features(space, base))), dict(zip(FEATURES, config_features(space, lanes[0])))
    model = gensor_model.space_model(space)
    factor = space.lane_partials(stage)
    assert on["vector_log_length"] == math.log2(factor) and on["rfactor"] == 1.0
    assert on["accumulators_over_registers"] == 1 / model.accumulators and on["local_accumulator"] == 0.0
    assert on["extra_passes"] == off["extra_passes"] + 1  # the lanes' own reduction
    # one accumulator chain, every operand loaded per step: more loads per MAC than the heuristic's tile
    assert on["register_loads_per_mac"] > off["register_loads_per_mac"]
    assert as_applied(space, base) == base  # without S.lanes: the configuration itself
    # a GEMV's heuristic sums in lanes: measured against itself (both as applied) it is 0
    gemv = _space("matmul", {"M": 1, "Cin": 64, "Cout": 32})
    heuristic = gemv.heuristic()
    assert heuristic[f"{name}.lanes"] is True
    assert dict(zip(FEATURES, config_features(gemv, heuristic)))["estimate_vs_heuristic"] == 0.0


def test_a_lanes_stage_is_priced_by_the_nest_it_runs_and_the_layout_it_reads():
    # the analytic terms the features read: S.lanes' traffic is the tiled model's on the nest as_applied
    # describes (one measure for both), and a read stored across the reduction gathers the lanes' vectors
    space = _space("matmul", MATMUL)
    stage = next(s for s in space.stages if s.kind == "reduce")
    name = stage.name
    model = gensor_model.space_model(space)
    axis = len(stage.spatial) + len(stage.reduced) - 1  # the axis the lanes split
    gathered = dict(space.heuristic(), **{f"{name}.lanes": True})
    contiguous = dict(gathered)
    for buffer, dims in stage.reads:
        gathered[f"layout.{buffer}.perm"] = tuple(range(len(dims)))
        gathered[f"layout.{buffer}.tile"] = contiguous[f"layout.{buffer}.tile"] = "none"
        along = next(d for d, used in enumerate(dims) if axis in used)
        perm = (*(d for d in range(len(dims)) if d != along), along)  # the reduction's dim stored last
        assert perm in space.parameters[f"layout.{buffer}.perm"].values(), (buffer, perm)
        contiguous[f"layout.{buffer}.perm"] = perm
    assert gensor_model.lane_gathers(space, stage, contiguous) == 0
    assert gensor_model.lane_gathers(space, stage, gathered) == 1  # the weight, stored [Cin, Cout]
    fast = gensor_model.stage_terms_of(space, stage, contiguous, model)
    slow = gensor_model.stage_terms_of(space, stage, gathered, model)
    assert fast[0] < slow[0]
    tiled = dict(as_applied(space, gathered), **{f"{name}.lanes": False})
    assert slow[1] == pytest.approx(gensor_model.stage_terms_of(space, stage, tiled, model)[1], rel=1e-12)


def test_rank_correlation_against_its_definition():
    rng = random.Random(3)
    a = [rng.random() for _ in range(30)]
    b = [x + rng.random() for x in a]
    ra = [sorted(a).index(x) for x in a]
    rb = [sorted(b).index(x) for x in b]
    n = len(a)
    expected = 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))
    assert abs(rank_correlation(a, b) - expected) < 1e-3
    assert rank_correlation(a, a) == 1.0 and rank_correlation(a, [-x for x in a]) == -1.0
    with pytest.raises(TuneError):
        rank_correlation([1.0], [1.0, 2.0])


def _synthetic(operator: str, task: str, rng: random.Random, target: str = "t", n: int = 12) -> TaskData:
    """A task whose latency is a known function of two features (no TVM needed)."""
    features = np.array([[rng.random() for _ in FEATURES] for _ in range(n)])
    latencies = [float(2.0 ** (3 * row[1] - 2 * row[20])) for row in features]
    estimates = [float(2.0 ** row[1]) for row in features]
    return TaskData(task, operator, operator, target, {}, [{} for _ in range(n)], latencies, features, estimates)


def test_leave_one_operator_out_never_trains_on_the_held_out_operator(monkeypatch):
    rng = random.Random(0)
    tasks = [_synthetic(op, f"{op}{i}", rng) for op in ("a", "b", "c") for i in range(2)]
    fitted: list[set[str]] = []
    predicted: list[tuple[set[str], int]] = []
    fit, predict = TransferModel.fit, TransferModel.predict_features

    def spy_fit(self, train):
        fitted.append({t.operator for t in train})
        self._spied = fitted[-1]
        return fit(self, train)

    def spy_predict(self, features, estimates=None):
        row = next(i for i, t in enumerate(tasks) if t.features is features)
        predicted.append((self._spied, row))
        return predict(self, features, estimates)

    monkeypatch.setattr(TransferModel, "fit", spy_fit)
    monkeypatch.setattr(TransferModel, "predict_features", spy_predict)
    scores = leave_one_operator_out(tasks)
    assert len(scores) == len(tasks) and len(fitted) == 3
    for trained_on, row in predicted:
        assert tasks[row].operator not in trained_on and len(trained_on) == 2
    # the latencies follow the features the same way on every operator: the held-out ranking is good
    assert min(s.model for s in scores) > 0.5


def test_train_on_half_scores_each_task_only_with_models_that_never_saw_its_operator(monkeypatch):
    rng = random.Random(4)
    tasks = [_synthetic(op, f"{op}{i}", rng) for op in ("a", "b", "c", "d") for i in range(2)]
    fitted: list[set[str]] = []
    fit, predict = TransferModel.fit, TransferModel.predict_features
    seen: list[tuple[set[str], str]] = []

    def spy_fit(self, train):
        fitted.append({t.operator for t in train})
        self._spied = fitted[-1]
        return fit(self, train)

    def spy_predict(self, features, estimates=None):
        seen.append((self._spied, next(t.operator for t in tasks if t.features is features)))
        return predict(self, features, estimates)

    monkeypatch.setattr(TransferModel, "fit", spy_fit)
    monkeypatch.setattr(TransferModel, "predict_features", spy_predict)
    scores = transfer.train_on_half(tasks)
    assert len(fitted) == 6 and all(len(ops) == 2 for ops in fitted)  # every pair of the 4 operators
    assert all(operator not in trained_on for trained_on, operator in seen)
    assert len(seen) == 6 * 4 and sorted(s.task for s in scores) == sorted(t.task for t in tasks)
    assert min(s.model for s in scores) > 0.5  # the same rule on every operator: ranked well held out
    assert transfer.train_on_half(tasks[:2]) == []  # one operator: nothing to hold out


def test_the_estimates_weight_adds_its_log_to_the_trees_score():
    rng = random.Random(7)
    tasks = [_synthetic(op, f"{op}{i}", rng) for op in ("a", "b") for i in range(4)]
    held = _synthetic("c", "c0", rng)
    trees, weighted, ruled = (TransferModel("t", prior=p, learner="ranks") for p in (0.0, 0.3, 1e6))
    for model in (trees, weighted, ruled):
        model.fit(tasks)
    alone = trees.predict_features(held.features)
    assert alone == trees.predict_features(held.features, held.estimates)  # weight 0: the estimates unread
    expected = [v + 0.3 * math.log2(e) for v, e in zip(alone, held.estimates)]
    assert weighted.predict_features(held.features, held.estimates) == pytest.approx(expected, rel=1e-12)
    # a weight that dwarfs the trees' range (ranks in [-0.5, 0.5]) ranks as the estimate does
    assert rank_correlation(ruled.predict_features(held.features, held.estimates), held.estimates) == 1.0
    with pytest.raises(TuneError, match="need as many analytic estimates, got none"):
        weighted.predict_features(held.features)
    with pytest.raises(TuneError, match="need as many analytic estimates, got 3"):
        weighted.predict_features(held.features, held.estimates[:3])
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(TuneError, match="weight"):
            TransferModel("t", prior=bad)


def test_the_pairs_learner_starts_from_the_estimate_and_learns_where_it_is_wrong():
    rng = random.Random(3)
    tasks = [_synthetic(op, f"{op}{i}", rng) for op in ("a", "b", "c") for i in range(3)]
    held = _synthetic("d", "d0", rng)
    assert TransferModel("t").learner == "pairs" and TransferModel("t").prior == transfer.PAIR_PRIOR
    learnt = TransferModel("t", prior=0.0)
    learnt.fit(tasks)
    assert learnt.predict_features(held.features) == learnt.predict_features(held.features, held.estimates)
    # the latency falls with feature 20, which the estimate does not read: only the trees can rank by it
    estimate_alone = rank_correlation(held.estimates, held.latencies)
    assert rank_correlation(learnt.predict_features(held.features), held.latencies) > estimate_alone + 0.1
    # an estimate weighted far above what 200 small steps can move keeps the estimate's order
    ruled = TransferModel("t", prior=1e6)
    ruled.fit(tasks)
    scores = ruled.predict_features(held.features, held.estimates)
    assert all(math.isfinite(v) for v in scores) and rank_correlation(scores, held.estimates) == 1.0


def test_a_model_of_one_target_refuses_another_targets_tasks():
    rng = random.Random(1)
    model = TransferModel("haswell")
    with pytest.raises(TuneError, match="skylake-avx512"):
        model.fit([_synthetic("a", "x", rng, "haswell"), _synthetic("b", "y", rng, "skylake-avx512")])


def _store_task(store: RecordStore, op, layer, target: str, latencies, **described) -> str:
    from kdsl.tune.records import task_key

    binding = solve.bind(op, layer)
    key = task_key(op, binding, target)
    store.describe(key, {"op": op.key, "binding": binding, "target": target, "json": op.to_json(), **described})
    space = _space("matmul", layer)
    rng = random.Random(len(latencies))
    seen = set()
    for latency in latencies:
        config = space.random(rng)
        record = Record(config, latency, None, "random")
        if record.key not in seen:
            seen.add(record.key)
            store.add(key, record)
    return key


def test_load_tasks_reads_only_the_target_asked_for(tmp_path):
    store = RecordStore(tmp_path / "r.db")
    op = gallery.load("matmul")
    mine = _store_task(store, op, MATMUL, "haswell", [1e-3 * (i + 1) for i in range(8)])
    _store_task(store, op, MATMUL, "skylake-avx512", [1e-3 * (i + 1) for i in range(8)])
    _store_task(store, op, {"M": 32, "Cin": 32, "Cout": 32}, "haswell", [1e-3] * 3)  # too few to count
    tasks = load_tasks([tmp_path / "r.db"], "haswell")
    assert [t.task for t in tasks] == [mine]
    assert tasks[0].label == "matmul" and tasks[0].features.shape[1] == len(RELATIVE)
    assert load_tasks([tmp_path / "r.db"], "haswell", exclude=[mine]) == []
    with pytest.raises(TuneError, match="no records database"):
        load_tasks([tmp_path / "missing.db"], "haswell")


def test_tasks_of_another_space_version_are_skipped_and_counted(tmp_path):
    store = RecordStore(tmp_path / "r.db")
    op = gallery.load("matmul")
    mine = _store_task(store, op, MATMUL, "haswell", [1e-3 * (i + 1) for i in range(8)])
    latencies = [1e-3 * (i + 1) for i in range(8)]
    _store_task(store, op, {"M": 32, "Cin": 32, "Cout": 32}, "haswell", latencies, space="tvm-space-7")
    assert [t.task for t in load_tasks([tmp_path / "r.db"], "haswell")] == [mine]
    assert other_versions([tmp_path / "r.db", tmp_path / "missing.db"], "haswell") == {"tvm-space-7": 1}
    assert other_versions([tmp_path / "r.db"], "skylake-avx512") == {}


class _Proposer:
    name = "fake"

    def __init__(self, configs):
        self.configs = list(configs)
        self.updated: list = []

    def propose(self, n):
        out, self.configs = self.configs[:n], self.configs[n:]
        return out

    def update(self, records):
        self.updated.extend(records)


class _ByKey:
    """A stand-in model that predicts a configuration's ``score``."""

    trained = True
    tasks = ["x", "y"]
    operators = ["a", "b"]

    def predict(self, space, configs):
        return [c["score"] for c in configs]


def test_a_tuner_with_a_model_proposes_the_best_predicted_of_its_pool():
    configs = [{"score": s} for s in (5.0, 1.0, 4.0, 0.5, 3.0, 2.0, 9.0, 8.0)]
    inner = _Proposer(configs)
    tuner = Prefiltered(inner, None, _ByKey(), factor=4)
    chosen = tuner.propose(2)
    assert [c["score"] for c in chosen] == [0.5, 1.0] and tuner.name == "fake" and tuner.ranked == 8
    tuner.update([Record({"a": 1}, 1e-3, None, "fake")])
    assert len(inner.updated) == 1
    with pytest.raises(TuneError, match="factor"):
        Prefiltered(inner, None, _ByKey(), factor=0)


def test_run_ranking_scores_the_model_beside_the_analytic_estimate():
    space = _space("matmul", MATMUL)
    rng = random.Random(2)
    configs = [space.random(rng) for _ in range(10)]
    latencies = [gensor_model.estimate(space, c) for c in configs]  # the estimate ranks perfectly
    records = [Record(c, t, None, "opevo") for c, t in zip(configs, latencies)]

    class Backwards(_ByKey):
        def predict(self, space, configs):
            return [-gensor_model.estimate(space, c) for c in configs]

    ranking = run_ranking(Backwards(), space, records)
    n = len({r.key for r in records})
    assert ranking is not None and ranking.configs == n
    assert ranking.analytic == 1.0 and ranking.model == -1.0
    assert ranking.line().startswith("cost model: held-out Spearman -1.00 (analytic 1.00, gain -2.00)")
    assert run_ranking(Backwards(), space, records[:2]) is None


class _FakeMeasurer:
    """Latency = the analytic estimate times noise: the driver runs without compiling anything."""

    compile_seconds = measure_seconds = 0.0

    def __init__(self):
        self.rng = random.Random(5)

    def measure(self, space, configs):
        return [(gensor_model.estimate(space, c) * (1 + 0.3 * self.rng.random()), None) for c in configs]

    def close(self):
        pass


def test_the_driver_ranks_with_a_model_of_other_tasks_and_reports_it(tmp_path, monkeypatch):
    from kdsl.tune import driver

    db = tmp_path / "t.db"
    op = gallery.load("matmul")
    measurer = _FakeMeasurer()
    for layer in ({"M": 32, "Cin": 32, "Cout": 32}, {"M": 16, "Cin": 64, "Cout": 32}):
        first = driver.tune(op, layer, "random", 8, db, batch=8, measurer=measurer, confirm=0)
        assert first.ranking is None  # fewer than MIN_TASKS other tasks: no model, no report
    wrapped = []
    monkeypatch.setattr(driver, "Prefiltered", lambda *a, **k: wrapped.append(a) or Prefiltered(*a, **k))
    lines: list[str] = []
    result = driver.tune(op, MATMUL, "random", 8, db, batch=8, measurer=measurer, confirm=0, log=lines.append)
    assert wrapped and result.ranking is not None and result.ranking.tasks == 2
    assert result.ranking.configs == 8 and any(line == result.ranking.line() for line in lines)
    assert wrapped[0][2].tasks and result.task not in wrapped[0][2].tasks  # trained without this task
    off = driver.tune(
        op, {"M": 8, "Cin": 32, "Cout": 32}, "random", 4, db, batch=4, measurer=measurer, confirm=0, cost_model=False
    )
    assert off.ranking is None


def test_pretrained_needs_enough_tasks(tmp_path):
    store = RecordStore(tmp_path / "p.db")
    op = gallery.load("matmul")
    key = _store_task(store, op, MATMUL, "haswell", [1e-3 * (i + 1) for i in range(8)])
    assert transfer.pretrained([tmp_path / "p.db"], "haswell", exclude="other") is None  # one task only
    assert transfer.pretrained([tmp_path / "p.db"], "haswell", exclude=key) is None


def test_a_cost_model_db_that_is_not_there_or_not_used_is_an_error(tmp_path):
    from kdsl.tune.driver import tune

    op = gallery.load("matmul")
    with pytest.raises(TuneError, match="nope.db"):
        tune(op, MATMUL, "random", 1, tmp_path / "t.db", cost_model_db=[tmp_path / "nope.db"], measurer=_FakeMeasurer())
    RecordStore(tmp_path / "m.db")
    with pytest.raises(TuneError, match="metaschedule"):
        tune(op, MATMUL, "metaschedule", 1, tmp_path / "t.db", cost_model_db=[tmp_path / "m.db"])


def test_bench_costmodel_scores_each_held_out_task_and_prints_the_summary(tmp_path, capsys):
    from kdsl.cli import main
    from kdsl.tune.driver import tune

    db = tmp_path / "cm.db"
    measurer = _FakeMeasurer()
    for name, layer in (("matmul", MATMUL), ("matmul", {"M": 32, "Cin": 32, "Cout": 32}), ("conv2d", CONV)):
        tune(gallery.load(name), layer, "random", 8, db, batch=8, measurer=measurer, confirm=0, cost_model=False)
    assert main(["bench", "costmodel", "--db", str(db)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("3 tasks of 2 operators (conv2d, matmul)")
    rows = [line for line in out if line.startswith(("matmul ", "conv2d "))]
    assert len(rows) == 3 and all(len(line.split()) >= 4 for line in rows)
    summary = out[-1].split()
    assert out[-1].startswith("held-out Spearman: model")
    model, analytic, gain = float(summary[3].rstrip(",")), float(summary[5].rstrip(",")), float(summary[7])
    assert abs(model - analytic - gain) < 0.011
    assert analytic > 0.5  # the fake latencies follow the estimate, up to noise
    assert main(["bench", "costmodel", "--db", str(db), "--split", "half"]) == 0
    half = capsys.readouterr().out.splitlines()
    assert len([line for line in half if line.startswith(("matmul ", "conv2d "))]) == 3
    assert half[-1].startswith("held-out Spearman: model") and half[-1].split()[5] == out[-1].split()[5]
    with pytest.raises(SystemExit):  # a negative weight would rank by the estimate backwards
        main(["bench", "costmodel", "--db", str(db), "--prior", "-0.5"])
    assert "--prior" in capsys.readouterr().err


def test_descriptions_skip_rows_that_are_not_json_objects(tmp_path):
    store = RecordStore(tmp_path / "d.db")
    store.describe("good", {"op": "k", "binding": {}, "target": "haswell"})
    store.db.execute("INSERT INTO tasks VALUES ('bad', 'not json', 0.0)")
    store.db.execute("INSERT INTO tasks VALUES ('list', '[1, 2]', 0.0)")
    assert list(store.descriptions()) == ["good"]


def test_pair_trees_rank_a_monotone_task_and_refuse_bad_settings():
    from kdsl.tune.pair_trees import PairTrees

    rng = np.random.default_rng(2)
    x = rng.random((60, 3))
    # three groups whose latency rises with column 0 at three scales: only the order within a group is shared
    groups = [range(0, 20), range(20, 40), range(40, 60)]
    latencies = [[scale * (1 + x[i, 0]) for i in rows] for rows, scale in zip(groups, (1e-3, 5.0, 2e4))]
    trees = PairTrees(trees=100, leaf=2, features=1.0, seed=0).fit(x, groups, latencies)
    fresh = rng.random((30, 3))
    # a sum of depth-3 steps learnt from 60 rows: close to the order, not exact (backwards would be -1)
    assert rank_correlation(list(trees.predict(fresh)), list(fresh[:, 0])) > 0.85
    assert list(PairTrees(trees=3).fit(x[:2], [[0, 1]], [[1.0, 1.0]]).predict(x[:2])) == [0.0, 0.0]  # ties: no order
    with pytest.raises(TuneError, match="rate > 0"):
        PairTrees(rate=float("nan"))
    with pytest.raises(TuneError, match="a group of 2 rows has 3 latencies"):
        PairTrees().fit(x[:2], [[0, 1]], [[1.0, 2.0, 3.0]])


def test_confirm_on_trains_without_the_held_out_operator(monkeypatch):
    rng = random.Random(9)
    train = [_synthetic(op, f"{op}{i}", rng) for op in ("a", "b", "c") for i in range(2)]
    held = [_synthetic("a", "a-new", rng), _synthetic("z", "z-new", rng)]
    fitted: list[set[str]] = []
    fit = TransferModel.fit
    monkeypatch.setattr(
        TransferModel, "fit", lambda self, tasks: fitted.append({t.operator for t in tasks}) or fit(self, tasks)
    )
    scores = transfer.confirm_on(train, held)
    assert sorted(s.task for s in scores) == ["a-new", "z-new"]
    assert sorted(map(sorted, fitted)) == [["a", "b", "c"], ["b", "c"]]  # a's new layer: never a's records
    assert min(s.model for s in scores) > 0.5  # the same rule on every operator
    assert transfer.confirm_on([], held) == []


def test_metaschedule_records_are_not_read_as_configurations(tmp_path):
    store = RecordStore(tmp_path / "r.db")
    op = gallery.load("matmul")
    key = _store_task(store, op, MATMUL, "haswell", [1e-3 * (i + 1) for i in range(8)])
    for i in range(10):
        store.add(key, Record({"trace": f"sch{i}"}, 1e-4, None, "metaschedule:reported"))
    (task,) = load_tasks([tmp_path / "r.db"], "haswell")
    assert len(task.configs) == 8 and all("trace" not in c for c in task.configs)


def test_bench_costmodel_layers_and_confirm(tmp_path, capsys):
    from kdsl.bench import costmodel_bench
    from kdsl.cli import main
    from kdsl.lang.errors import KdslError
    from kdsl.tune.driver import tune

    assert all(set(layers) == set(costmodel_bench.LAYER_NAMES) for layers in costmodel_bench.LAYERS.values())
    for name, layers in costmodel_bench.LAYERS.items():  # confirm layers are new sizes, not a copy of one
        assert layers["confirm"] not in (layers["small"], layers["medium"]), name
    with pytest.raises(SystemExit):
        main(["bench", "costmodel", "--layers", "large", "--db", str(tmp_path / "x.db")])
    assert "--layers: no layer 'large'; choose from small, medium, confirm" in capsys.readouterr().err
    with pytest.raises(KdslError, match="operator 'conv2d' has no layer 'huge'"):
        costmodel_bench.collect(["conv2d"], ["huge"], 2, str(tmp_path / "x.db"), log=False)
    db, confirm = tmp_path / "cm.db", tmp_path / "new.db"
    measurer = _FakeMeasurer()
    for path, name, layer in (
        (db, "matmul", MATMUL),
        (db, "conv2d", CONV),
        (confirm, "matmul", {"M": 24, "Cin": 32, "Cout": 16}),
        (confirm, "conv2d", CONV),  # the same task as --db's: scored there, not here
    ):
        tune(gallery.load(name), layer, "random", 8, path, batch=8, measurer=measurer, confirm=0, cost_model=False)
    assert main(["bench", "costmodel", "--db", str(db), "--confirm", str(confirm), "--learner", "ranks"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("held-out Spearman: model")  # the summary of --db stays last
    assert out[-2].startswith("confirmed on 1 tasks of 1 operators nothing was chosen on: model")
    (row,) = [line for line in out if "M=24" in line]
    assert row.startswith("matmul ") and row.split()[4] == "8"
