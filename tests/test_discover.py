"""The main job: a small discovery run writes its outputs, and a run killed with SIGKILL resumes
without losing or repeating any finished evaluation."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import TINY_DISCOVERY

from kdsl.discover.families import FamilyTable
from kdsl.search.store import Store

TINY = {**TINY_DISCOVERY, "time_limit": 40.0, "eval_timeout": 120.0}


def _script(db: Path, out: Path, **overrides) -> str:
    config = {**TINY, "db": str(db), "out": str(out), **overrides}
    return textwrap.dedent(
        f"""
        import json, sys
        from kdsl.discover.loop import DiscoverConfig, discover
        summary = discover(DiscoverConfig(**json.loads({json.dumps(config)!r})), progress=sys.stdout)
        print("SUMMARY", json.dumps(summary))
        """
    )


def _run_to_the_end(db: Path, out: Path, time_limit: float) -> subprocess.CompletedProcess:
    """A discovery run in a fresh Python that ends within five minutes, and ends well."""
    result = subprocess.run(
        [sys.executable, "-c", _script(db, out, time_limit=time_limit)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _evaluations(db: Path) -> dict[str, tuple[str, float]]:
    connection = sqlite3.connect(db)
    try:
        return {
            key: (status, created)
            for key, status, created in connection.execute("SELECT key, status, created FROM evaluations")
        }
    finally:
        connection.close()


def test_discover_writes_table_plot_and_pages(tmp_path):
    result = _run_to_the_end(tmp_path / "runs.sqlite", tmp_path / "out", time_limit=25.0)
    summary = json.loads(result.stdout.split("SUMMARY", 1)[1])
    assert summary["evaluated"] >= 1
    # candidates are pre-screened, and only screened ones are trained
    assert summary["screened"] >= summary["evaluated"]
    assert "screened" in result.stdout and "[trained 1, screened" in result.stdout
    out = tmp_path / "out"
    assert (out / "results.md").read_text().startswith("# kdsl discover")
    ranked = json.loads((out / "results.json").read_text())
    assert ranked["baseline"]["accuracy"] > 0.2
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((out / "pages").glob("*.md"))
    # ranked by the deployable (TVM) kernel, with eager PyTorch and PyTorch's conv2d beside it
    measured = [row for row in ranked["candidates"] if row.get("latency_ratio") is not None]
    assert measured and all(row["latency_backend"] == "tvm" for row in measured)
    for row in measured:
        assert row["latency_ratio"] > 0 and row["torch_ratio"] > 0 and row["tvm_vs_torch_conv2d"] > 0
        assert row["latency_baseline_ms"] == pytest.approx(row["baseline_tvm_latency_ms"])
    assert "measuring the baseline" in result.stdout and ranked["baseline"].get("baseline_cache") is None
    # a second run on this machine with the same settings reuses the baseline (a fresh database)
    again = _run_to_the_end(tmp_path / "again.sqlite", tmp_path / "again", time_limit=5.0)
    assert "using the cached baseline" in again.stdout and "measuring the baseline" not in again.stdout
    reused = json.loads((tmp_path / "again" / "results.json").read_text())["baseline"]
    assert reused["accuracy"] == ranked["baseline"]["accuracy"] and reused["baseline_cache"]["file"]
    assert "read from this machine's cache" in (tmp_path / "again" / "results.md").read_text()


@pytest.mark.skipif(sys.platform != "linux", reason="uses SIGKILL on a process group")
def test_killed_run_resumes_without_losing_or_repeating_evaluations(tmp_path):
    db = tmp_path / "runs.sqlite"
    process = subprocess.Popen(
        [sys.executable, "-c", _script(db, tmp_path / "out", time_limit=120.0)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    before: dict[str, tuple[str, float]] = {}
    try:
        while time.monotonic() < deadline:
            time.sleep(1.0)
            if db.exists():
                try:
                    before = _evaluations(db)
                except sqlite3.Error:
                    continue
                if sum(1 for k in before if k) >= 3:  # the baseline and two candidates
                    break
            assert process.poll() is None, "the run ended before it could be killed"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert len(before) >= 3, "no evaluation finished before the deadline"
    before = _evaluations(db)  # everything committed before the kill
    resumed = subprocess.run(
        [sys.executable, "-c", _script(db, tmp_path / "out", time_limit=20.0)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _evaluations(db)
    for key, (status, created) in before.items():
        assert after[key] == (status, created), f"the evaluation of {key} was lost or repeated"
    repeated = [line for line in resumed.stdout.splitlines() if any(f"evaluated {k}:" in line for k in before)]
    assert not repeated, repeated
    assert "measuring the baseline" not in resumed.stdout


def test_discover_evaluates_a_canvas_template_with_its_filled_widths(tmp_path):
    from kdsl.discover import loop
    from kdsl.discover.executors import Task, run_task
    from kdsl.lang.parser import parse
    from kdsl.search.run import search
    from kdsl.search.store import Store

    db = str(tmp_path / "runs.sqlite")
    config = loop.DiscoverConfig(**{**TINY, "db": db, "out": str(tmp_path / "out"), "strategy": "canvas"})
    search(loop._space(config), "canvas", db=db, seed=0, max_results=60)
    store = Store(db)
    try:
        rows = store.top(k=1000, status="valid")
    finally:
        store.close()
    row = next(r for r in rows if "dynamic(" in r["dsl"])  # a template: its widths are per layer
    template = parse(row["dsl"])
    assert template.dynamic_variables
    result = run_task(Task.of(template, config.evaluators(), loop._widths(row)))
    assert result["status"] == "ok", result["error"]
    assert 0.0 <= result["metrics"]["accuracy"] <= 1.0 and result["metrics"]["latency_ratio"] > 0
    bare = run_task(Task.of(template, config.evaluators()))
    assert bare["status"] == "error" and "free widths" in bare["error"]


def test_screening_trains_the_best_scored_and_never_screens_twice(tmp_path):
    from kdsl.discover import loop
    from kdsl.search.run import search

    db = str(tmp_path / "runs.sqlite")
    config = loop.DiscoverConfig(**{**TINY, "db": db, "out": str(tmp_path / "out"), "batch": 2, "screen_factor": 3})
    search(loop.discovery_space(config), "enumerate", db=db, seed=0, max_results=30)

    class Scripted:
        """An executor that scores candidates by their key, failing one of them."""

        def __init__(self):
            self.seen = []

        def map(self, tasks):
            for task in tasks:
                self.seen.append(task.key)
                assert task.evaluators == (config.screener(),)
                if len(self.seen) == 2:
                    yield task, {"key": task.key, "status": "error", "metrics": {}, "error": "boom", "seconds": 0.0}
                else:
                    yield task, {"key": task.key, "status": "ok", "metrics": {"prescreen": int(task.key[:6], 16)}}

    executor = Scripted()
    store, evaluations, families = Store(db), loop.Evaluations(db), FamilyTable(db)
    try:
        batch, failed = loop._screen(config, executor, store, evaluations, families, None)
        assert len(executor.seen) == 6 and [r["key"] for r in failed] == [executor.seen[1]]
        scored = [k for k in executor.seen if k != executor.seen[1]]
        kinds = {k: row["kind"] for k, row in families.get(scored).items()}
        # new designs first, then by score
        ordered = sorted(scored, key=lambda k: (kinds[k] in loop.KNOWN_KINDS, -int(k[:6], 16)))
        assert [row["key"] for row in batch] == ordered[:2]
        first = list(executor.seen)
        batch_again, _ = loop._screen(config, executor, store, evaluations, families, None)
        assert not set(executor.seen[6:]) & set(first), "a candidate was screened twice"
        # untrained candidates screened earlier compete with the new ones
        pool = {k: s for k, s in evaluations.screened().items() if s is not None}
        kinds = {k: row["kind"] for k, row in families.get(pool).items()}
        expected = sorted(pool, key=lambda k: (kinds[k] in loop.KNOWN_KINDS, -pool[k]))[:2]
        assert [row["key"] for row in batch_again] == expected
    finally:
        store.close()
        evaluations.close()
        families.close()


def test_screening_trains_neighbours_that_dropped_a_window_or_weight_last(tmp_path):
    from kdsl.discover import loop
    from kdsl.search.neighbors import takes_capacity
    from kdsl.search.run import search

    db = str(tmp_path / "runs.sqlite")
    settings = {**TINY, "db": db, "out": str(tmp_path / "out"), "batch": 3, "screen_factor": 10}
    config = loop.DiscoverConfig(**{**settings, "coefficients": {"K": [3], "G": [2, 4], "s": [2]}})
    # the walk is cheapest first: the designs that dropped a window or weight come after the rest
    search(loop.discovery_space(config), "neighbors", db=db, seed=0, max_results=200)

    class Scored:
        """An executor that scores every candidate it screens by its key."""

        def map(self, tasks):
            for task in tasks:
                yield task, {"key": task.key, "status": "ok", "metrics": {"prescreen": int(task.key[:6], 16)}}

    store, evaluations, families = Store(db), loop.Evaluations(db), FamilyTable(db)
    try:
        batch, _ = loop._screen(config, Scored(), store, evaluations, families, None)
        rows = list(store.get_many(k for k, s in evaluations.screened().items() if s is not None).values())
        kinds = {k: row["kind"] for k, row in families.get(r["key"] for r in rows).items()}
        new = [r for r in rows if kinds.get(r["key"]) not in loop.KNOWN_KINDS]
        whole = [r for r in new if not takes_capacity(r["metrics"].get("rewrites"))]
        cut = [r for r in new if takes_capacity(r["metrics"].get("rewrites"))]
        assert cut and len(whole) >= len(batch) == 3  # both kinds waiting, enough of the whole ones
        assert not any(takes_capacity(row["metrics"].get("rewrites")) for row in batch)
    finally:
        store.close()
        evaluations.close()
        families.close()


def test_measured_reward_climbs_with_accuracy_below_the_margin_and_keeps_accuracy_first():
    from kdsl.discover.loop import measured_reward

    base = {"accuracy": 0.9}
    for ratio in (0.1, 0.5, 1.0, 3.0):
        below = [measured_reward({"accuracy": a / 100, "latency_ratio": ratio}, "ok", base) for a in range(10, 88)]
        assert all(0 < x < y for x, y in itertools.pairwise(below)), "no gradient below the margin"
        within = measured_reward({"accuracy": 0.88, "latency_ratio": ratio}, "ok", base)
        assert within > below[-1] * 1.9
    assert measured_reward({"accuracy": 0.5, "latency_ratio": 0.5}, "timeout", base) == 0.0


def test_the_seed_seeds_the_proxy_training_too():
    from kdsl.discover.loop import DiscoverConfig

    config = DiscoverConfig(seed=4)
    accuracy = next(spec for spec in config.evaluators() if spec["name"] == "accuracy")
    assert accuracy["seed"] == config.screener()["seed"] == config.proxy_config().seed == 4
    # a proxy setting of its own wins
    assert DiscoverConfig(seed=4, proxy={"seed": 7}).proxy_config().seed == 7
