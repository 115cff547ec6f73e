"""Schedule tuning: parameter topologies, the q-random walk, tuners, and resumable records."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from backends import backend

from kdsl.codegen.tvm.parameters import (
    Categorical,
    Discrete,
    Factorization,
    Permutation,
    config_key,
    q_random_walk,
    q_walk_distribution,
)

backend("tvm")

SMALL = {"M": 16, "Cin": 32, "Cout": 32}  # a matmul small enough to compile and run in milliseconds


def assert_symmetric(param) -> None:
    for value in param.values():
        for other in param.neighbours(value):
            assert value in param.neighbours(other), (param, value, other)


def test_neighbour_relations_are_symmetric():
    for param in (
        Factorization("f", 12, 3),
        Factorization("g", 16, 2),
        Permutation("p", 4),
        Discrete("d", (1, 4, 16, 64)),
        Categorical("c", ("a", "b", "c")),
    ):
        assert_symmetric(param)


def test_space_relations_are_symmetric():
    space = _space()
    for param in space.parameters.values():
        values = param.values() if not isinstance(param, Permutation) or param.n <= 5 else []
        for value in values[:50]:
            for other in param.neighbours(value):
                assert value in param.neighbours(other)


def test_q_random_walk_matches_its_definition():
    param = Factorization("t", 12, 3)
    start, q, n = (12, 1, 1), 0.6, 40000
    exact = q_walk_distribution(param, start, q)
    assert abs(sum(exact.values()) - 1) < 1e-9
    rng = random.Random(1)
    counts = Counter(q_random_walk(param, start, q, rng) for _ in range(n))
    for value, p in exact.items():
        tolerance = 4 * np.sqrt(p * (1 - p) / n) + 1e-3
        assert abs(counts[value] / n - p) <= tolerance, (value, counts[value] / n, p)
    # the start keeps the mass of stopping at once, 1 - q, plus returns
    assert exact[start] >= 1 - q


def _space(name="matmul", layer=SMALL):
    from kdsl import gallery
    from kdsl.codegen.tvm import lower
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    return ScheduleSpace(lower(gallery.load(name), layer))


def test_invalid_configurations_are_rejected_with_a_reason():
    from kdsl.lang.errors import LoweringError

    space = _space()
    config = space.heuristic()
    with pytest.raises(LoweringError, match="product"):
        space.apply({**config, "stage0.tile.M": [3, 1, 1]})
    with pytest.raises(LoweringError, match="unknown"):
        space.apply({**config, "bogus": 1})
    rng = random.Random(0)
    outcomes = Counter()
    for _ in range(30):  # random configurations apply or raise LoweringError, nothing else
        try:
            space.apply(space.random(rng))
            outcomes["ok"] += 1
        except LoweringError:
            outcomes["rejected"] += 1
    assert outcomes["ok"] > 0


@pytest.mark.parametrize("tuner", ["opevo", "gensor", "alt", "random"])
def test_tuners_never_propose_duplicates(tuner):
    from kdsl.tune.driver import make_tuner
    from kdsl.tune.records import Record

    space = _space()
    options = {"steps": 60, "walks": 2} if tuner == "gensor" else {}
    search = make_tuner(tuner, space, [], seed=3, **options)
    seen: set[str] = set()
    rng = random.Random(0)
    for _ in range(4):
        batch = search.propose(6)
        keys = [config_key(c) for c in batch]
        assert len(set(keys)) == len(keys) and not seen & set(keys)
        seen |= set(keys)
        search.update([Record(c, rng.uniform(1e-4, 1e-3), None, tuner) for c in batch])
    assert seen


@pytest.fixture(scope="module")
def measurer():
    from kdsl import gallery
    from kdsl.tune.measurer import Measurer

    with Measurer(gallery.load("matmul"), SMALL) as m:
        yield m


def test_tuned_configurations_compile_and_match_the_reference(tmp_path, measurer):
    from kdsl import gallery
    from kdsl.codegen import reference
    from kdsl.codegen.tvm import build
    from kdsl.tune.driver import tune

    op = gallery.load("matmul")
    db = tmp_path / "t.db"
    if True:
        for tuner in ("opevo", "gensor", "alt"):
            options = {"steps": 60, "walks": 2} if tuner == "gensor" else {}
            result = tune(op, SMALL, tuner, 4, db, batch=4, measurer=measurer, options=options)
            assert result.best is not None and result.best.latency is not None
            space = _space()
            kernel = build(op, SMALL, schedule=lambda lowered, c=result.best.config, s=space: s.apply(c))
            import torch

            x, weights = reference.random_inputs(op, SMALL, dtype=np.float32)
            got = kernel(torch.from_numpy(x), *[torch.from_numpy(w) for w in weights]).numpy()
            expected = reference.run(op, SMALL, x.astype(np.float64), [w.astype(np.float64) for w in weights])
            assert np.allclose(got, expected, rtol=1e-3, atol=1e-3)


def test_records_resume_without_remeasuring(tmp_path, measurer):
    from kdsl import gallery
    from kdsl.tune.driver import tune
    from kdsl.tune.records import RecordStore

    op = gallery.load("matmul")
    db = tmp_path / "r.db"
    if True:
        first = tune(op, SMALL, "opevo", 4, db, batch=4, measurer=measurer, confirm=0)
        store = RecordStore(db)
        before = {r.key for r in store.records(first.task)}
        compiled = measurer.count
        second = tune(op, SMALL, "opevo", 4, db, batch=4, measurer=measurer, confirm=0)
    after = store.records(second.task)
    new = [r for r in after if r.key not in before]
    assert len(after) == len({(r.tuner, r.key) for r in after})  # no configuration stored twice
    assert second.measured == 4 and len([r for r in new if r.latency is not None]) == 4
    assert measurer.count - compiled == len([r for r in new if r.error is None or "compile" in (r.error or "")])


def test_the_fastest_records_are_re_timed_and_keep_their_fastest_timing(tmp_path, measurer, monkeypatch):
    from kdsl import gallery
    from kdsl.tune.driver import _confirm, tune
    from kdsl.tune.records import RecordStore

    db = tmp_path / "c.db"
    run = tune(gallery.load("matmul"), SMALL, "opevo", 6, db, batch=6, measurer=measurer, confirm=0)
    store = RecordStore(db)
    before = {r.key: r.latency for r in store.records(run.task) if r.latency is not None}
    top = sorted(before, key=before.get)[:3]
    retimes = iter([1.0, 2e-9, 1.0, 1.0, 1.0, 3e-9])  # round 1 then round 2, each over the three in order
    monkeypatch.setattr(measurer, "time_library", lambda path, check: (next(retimes), None))
    compiled = measurer.count
    _confirm(store, run.task, "opevo", _space(), measurer, 0.0, 3, None)
    after = {r.key: r.latency for r in store.records(run.task) if r.latency is not None}
    assert measurer.count - compiled == 3  # the three fastest compiled again
    assert all(after[k] == before[k] for k in before if k not in top)  # the others untouched
    assert [after[k] for k in top] == [before[top[0]], 2e-9, 3e-9]  # each keeps its fastest timing


def test_tuning_measurements_wait_for_the_latency_slot(tmp_path):
    """While another process times (the test holds the slot), the measuring worker runs no kernel;
    it times once the slot is free, and the wait does not count against its timeout."""
    import threading
    import time

    from kdsl import gallery
    from kdsl.runtime.timing import latency_slot
    from kdsl.tune.measurer import Measurer, compile_module

    lock = str(tmp_path / "latency.lock")
    space = _space()
    path = str(tmp_path / "k.so")
    compile_module(space.apply(space.heuristic()).mod, path)
    results: list = []
    with Measurer(gallery.load("matmul"), SMALL, lock_path=lock) as measurer:
        with latency_slot(lock):
            thread = threading.Thread(target=lambda: results.append(measurer.time_library(path, check=True)))
            thread.start()
            deadline = time.monotonic() + 300  # the worker starts and imports TVM first
            while not measurer.waiting_for_slot and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert measurer.waiting_for_slot, results  # it asked for the slot ...
            thread.join(1.0)
            assert thread.is_alive() and not results  # ... and has not timed while the slot is held
            assert measurer.waiting_for_slot
        thread.join(300)
    assert not thread.is_alive()
    [(latency, error)] = results
    assert error is None and latency > 0


def test_metaschedule_gets_the_program_with_its_pads_inlined():
    import torch

    from kdsl import gallery
    from kdsl.codegen import reference
    from kdsl.codegen.tvm import Kernel, default_target, load_tvm, lower
    from kdsl.tune.metaschedule import without_pads

    op, layer = gallery.load("syno_op1"), {"N": 1, "Cin": 64, "Cout": 64, "H": 5, "W": 5}
    lowered = lower(op, layer)
    assert any(s.is_pad for s in lowered.stages)
    module = without_pads(lowered)
    assert "pad0" not in module.script() and "pad1" not in module.script()
    kernel = Kernel(load_tvm().compile(module, target=default_target()), lowered, None)
    x, weights = reference.random_inputs(op, layer, dtype=np.float32)
    got = kernel(torch.from_numpy(x), *[torch.from_numpy(w) for w in weights]).numpy()
    expected = reference.run(op, layer, x.astype(np.float64), [w.astype(np.float64) for w in weights])
    assert np.allclose(got, expected, rtol=1e-3, atol=1e-3)


def test_packing_copies_vectorize_at_most_two_vectors():
    import re

    from kdsl.lang.errors import LoweringError

    space = _space("matmul", {"M": 64, "Cin": 256, "Cout": 128})
    config = {**space.heuristic(), "layout.x.perm": (1, 0), "layout.w.perm": (1, 0)}
    rng = random.Random(1)
    checked = 0
    layouts = space.layout_parameters()
    randomized = [{**config, **{n: space.parameters[n].random(rng) for n in layouts}} for _ in range(20)]
    for candidate in [config, *randomized]:  # loops as the heuristic's (its vector tile is 32), layouts at random
        try:
            script = space.apply(candidate).mod.script()
        except LoweringError:
            continue
        widths = [int(w) for w in re.findall(r"T\.vectorized\((\d+)\)", script)]
        assert all(w <= 2 * space.lanes for w in widths), widths  # wider vectors take LLVM minutes
        checked += 1
    assert checked > 1


def test_a_large_batch_is_checked_on_its_first_and_last_rows(tmp_path):
    import contextlib

    from kdsl import gallery
    from kdsl.lang import Input, Output, Reduce, Share, Unfold, Weight, primary
    from kdsl.tune.measurer import _compile_job, _compile_setup, _measure_job, _measure_setup, batch_rows

    layer = {"M": 40, "Cin": 8, "Cout": 16}
    op = gallery.load("matmul")
    assert batch_rows(op, layer) == (0, 1, 38, 39)
    # a window along the leading dim mixes its rows: every row is checked
    L, Cin, Cout = primary("L Cin Cout")
    along = Input(L, Cin) >> Unfold(L, 3, "k") >> Share(Weight(Cin, "k", Cout, name="w")) >> Reduce(Cin, "k")
    assert batch_rows(along >> Output(L, Cout), {"L": 40, "Cin": 4, "Cout": 4}) is None

    space = _compile_setup(op, layer)
    path = str(tmp_path / "k.so")
    assert _compile_job(space, (space.heuristic(), path, False), contextlib.nullcontext) is None
    state = _measure_setup(op, layer)
    latency, error = _measure_job(state, (path, True), contextlib.nullcontext)
    assert error is None and latency > 0
    for row in (0, 39):  # the kernel now reads a row the reference did not: the check must see it
        changed = _measure_setup(op, layer)
        changed["expected"] = state["expected"]
        data = changed["args"][0].numpy()
        data[row] += 1.0
        changed["args"][0].copyfrom(data)
        latency, error = _measure_job(changed, (path, True), contextlib.nullcontext)
        assert latency is None and "wrong result" in error


def test_a_compile_job_with_fallback_compiles_what_the_default_schedule_compiles(tmp_path, monkeypatch):
    """The network's default-schedule measurement passes ``fallback``: a stage whose part of the configuration
    refuses gets the plain schedule, as in the compiled default, instead of failing the measurement."""
    import contextlib

    from kdsl import gallery
    from kdsl.codegen.tvm import schedule_apply
    from kdsl.tune.measurer import _compile_job, _compile_setup, _measure_job, _measure_setup

    def broken(*args, **kwargs):
        raise RuntimeError("simulated schedule failure")

    monkeypatch.setattr(schedule_apply._Applier, "_reduce", broken)
    op, layer = gallery.load("conv2d"), {"N": 1, "Cin": 4, "Cout": 16, "H": 5, "W": 5}
    space = _compile_setup(op, layer)
    path = str(tmp_path / "k.so")
    error = _compile_job(space, (space.heuristic(), path, False), contextlib.nullcontext)
    assert error is not None and "simulated schedule failure" in error
    assert _compile_job(space, (space.heuristic(), path, True), contextlib.nullcontext) is None
    latency, error = _measure_job(_measure_setup(op, layer), (path, True), contextlib.nullcontext)
    assert error is None and latency > 0
