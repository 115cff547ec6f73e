"""Executors: isolation (timeouts, crashes, errors), the latency slot, and Ray against local; and the
worker pool underneath (:mod:`kdsl.runtime.workers`, which schedule tuning shares).

The spawned workers import this module by name (``tests/`` is on ``sys.path`` under pytest and
spawn passes ``sys.path`` on), so :class:`Misbehave` below is a test-only evaluator they can load.
"""

import functools
import itertools
import os
import signal
import sys
import time

import pytest

from kdsl import gallery
from kdsl.discover.evaluators import Context, Evaluator
from kdsl.discover.executors import LocalExecutor, Task, make_executor, run_task
from kdsl.lang.errors import KdslError
from kdsl.runtime.workers import WorkerError, WorkerPool

OPS = ["conv2d", "depthwise_conv2d", "grouped_conv2d", "pointwise_conv2d", "dilated_conv2d", "shift_conv2d"]
TINY_ACCURACY = {"name": "accuracy", "compare_baseline": False, "widths": [8], "image_size": 8, "epochs": 1}


class Misbehave(Evaluator):
    """Hangs, crashes, segfaults or raises on the operators with the given keys; else reports its pid."""

    name = "misbehave"

    def __init__(self, hang=None, exit=None, segfault=None, fail=None, hold_slot=0.0):
        self.hang, self.exit, self.segfault, self.fail, self.hold_slot = hang, exit, segfault, fail, hold_slot

    def evaluate(self, op, context=None):
        context = Context.of(context)
        if op.key == self.hang:
            time.sleep(3600)
        if op.key == self.exit:
            os._exit(1)
        if op.key == self.segfault:
            os.kill(os.getpid(), signal.SIGSEGV)
        if op.key == self.fail:
            raise ValueError("deliberate failure")
        metrics = {"pid": os.getpid()}
        if self.hold_slot:
            with context.latency_slot():
                metrics["slot_start"] = time.time()
                time.sleep(self.hold_slot)
                metrics["slot_end"] = time.time()
        return metrics


def keyed(names):
    return {name: gallery.load(name) for name in names}


def assert_statuses(results, expected):
    """``results``: (task, result) pairs; ``expected``: key -> status."""
    statuses = {task.key: result["status"] for task, result in results}
    assert statuses == expected
    for task, result in results:
        assert result["key"] == task.key
        assert (result["error"] is None) == (result["status"] == "ok")


def assert_same_metrics(first, second):
    """Metric dicts equal apart from wall times."""

    def strip(result):
        return {k: v for k, v in result["metrics"].items() if k not in ("train_seconds", "pid")}

    assert [r["status"] for r in first] == [r["status"] for r in second]
    assert [strip(r) for r in first] == [strip(r) for r in second]


def test_hanging_and_crashing_candidates_are_isolated(tmp_path):
    ops = keyed(OPS)
    spec = {
        "class": "test_executors:Misbehave",
        "hang": ops["depthwise_conv2d"].key,
        "exit": ops["grouped_conv2d"].key,
        "segfault": ops["pointwise_conv2d"].key,
        "fail": ops["dilated_conv2d"].key,
    }
    tasks = [Task.of(op, ["analytic", spec]) for op in ops.values()]
    start = time.monotonic()
    with LocalExecutor(workers=2, timeout=3, lock_path=str(tmp_path / "lock")) as executor:
        results = list(executor.map(tasks))
        # the run goes on after the failures: the replaced workers take new tasks
        again = executor.run([Task.of(ops["conv2d"], ["analytic", spec])])
    assert time.monotonic() - start < 30
    assert_statuses(
        results,
        {
            ops["conv2d"].key: "ok",
            ops["depthwise_conv2d"].key: "timeout",
            ops["grouped_conv2d"].key: "crashed",
            ops["pointwise_conv2d"].key: "crashed",
            ops["dilated_conv2d"].key: "error",
            ops["shift_conv2d"].key: "ok",
        },
    )
    by_key = {task.key: result for task, result in results}
    assert "SIGSEGV" in by_key[ops["pointwise_conv2d"].key]["error"]
    assert "exited with code 1" in by_key[ops["grouped_conv2d"].key]["error"]
    assert "deliberate failure" in by_key[ops["dilated_conv2d"].key]["error"]
    assert by_key[ops["conv2d"].key]["metrics"]["flops_ratio"] == 1.0
    assert again[0]["status"] == "ok"


def test_one_measurement_at_a_time_and_waiting_does_not_count(tmp_path):
    ops = keyed(OPS[:3])
    # each task holds the slot 1.5 s; with a 4 s timeout the last one survives (it finishes about
    # 4.5 s after it started) only because the clock stops while it waits for the slot
    spec = {"class": "test_executors:Misbehave", "hold_slot": 1.5}
    tasks = [Task.of(op, [spec]) for op in ops.values()]
    with LocalExecutor(workers=3, timeout=4.0, lock_path=str(tmp_path / "lock")) as executor:
        results = [result for _, result in executor.map(tasks)]
    assert [r["status"] for r in results] == ["ok"] * 3, results
    spans = sorted((r["metrics"]["slot_start"], r["metrics"]["slot_end"]) for r in results)
    for (_, end), (next_start, _) in itertools.pairwise(spans):
        assert next_start >= end
    assert len({r["metrics"]["pid"] for r in results}) == 3  # they did run in parallel workers


@pytest.fixture(scope="module")
def proxy_tasks():
    return [Task.of(op, ["analytic", TINY_ACCURACY]) for op in keyed(OPS[:3]).values()]


@pytest.fixture(scope="module")
def local_results(proxy_tasks, tmp_path_factory):
    lock = tmp_path_factory.mktemp("lock") / "lock"
    with LocalExecutor(workers=2, timeout=120, lock_path=str(lock)) as executor:
        return executor.run(proxy_tasks)


def test_worker_results_equal_in_process_results(proxy_tasks, local_results):
    in_process = [run_task(task) for task in proxy_tasks]
    assert_same_metrics(local_results, in_process)
    assert all(r["status"] == "ok" for r in local_results)
    assert len(local_results[0]["metrics"]["accuracy_history"]) == 1


def test_tasks_round_trip_dsl_and_json():
    op = gallery.load("depthwise_conv2d")
    assert Task(op.key, op.to_dsl()).operator() == op
    assert Task.of(op).operator() == op
    bad = run_task(Task("x", "op = Input(N) >> Nonsense()"))
    assert bad["status"] == "error" and "ParseError" in bad["error"]


def test_ray_is_optional(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(KdslError, match=r"pip install 'kdsl\[ray\]'"):
        make_executor("ray")


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'kdsl[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_gives_the_local_results(ray_session, proxy_tasks, local_results):
    on_ray = make_executor("ray", timeout=120).run(proxy_tasks)
    assert_same_metrics(on_ray, local_results)
    assert all(r["status"] == "ok" for r in on_ray)


def test_ray_isolates_hangs_and_crashes(ray_session):
    ops = keyed(OPS[:3])
    spec = {"class": "test_executors:Misbehave", "hang": ops["depthwise_conv2d"].key, "exit": ops["grouped_conv2d"].key}
    tasks = [Task.of(op, ["analytic", spec]) for op in ops.values()]
    results = list(make_executor("ray", timeout=3).map(tasks))
    assert_statuses(
        results,
        {ops["conv2d"].key: "ok", ops["depthwise_conv2d"].key: "timeout", ops["grouped_conv2d"].key: "crashed"},
    )


def pool_job(state, job, slot):
    """A worker-pool handler that misbehaves on request, else echoes its setup's state and the job."""
    if job == "hang":
        time.sleep(3600)
    if job == "exit":
        os._exit(3)
    if job == "fail":
        raise ValueError("deliberate failure")
    if job == "unpicklable":
        return lambda: None
    return state, job


def failing_setup():
    raise RuntimeError("no such library")


def test_worker_pool_isolates_jobs_and_reports_each_outcome():
    with WorkerPool(pool_job, size=2, setup=functools.partial(str, "set up"), timeout=3) as pool:
        outcomes = pool.run(["a", "hang", "exit", "fail", "unpicklable", "b"])
        again = pool.call("c")  # replaced workers take new jobs
    assert [o.status for o in outcomes] == ["ok", "timeout", "crashed", "error", "error", "ok"]
    assert outcomes[0].value == ("set up", "a") and again.value == ("set up", "c")
    assert "exited with code 3" in outcomes[2].error
    assert "deliberate failure" in outcomes[3].error and "cannot send the result" in outcomes[4].error


def test_worker_pool_setup_failure_is_a_clear_error():
    with WorkerPool(pool_job, setup=failing_setup) as pool, pytest.raises(WorkerError, match="no such library"):
        pool.call("a")
