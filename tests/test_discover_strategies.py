"""Discover's strategies: they take turns, each candidate records the strategy that found it, the
per-strategy counts, Canvas's kernels filled near the FLOPs budget, the space's FLOPs floor and the
reward of untrained candidates."""

from __future__ import annotations

import zlib

import pytest
from helpers import TINY_DISCOVERY

from kdsl import gallery
from kdsl.discover.turns import Turns
from kdsl.lang.errors import KdslError, SearchError
from kdsl.search.analytic import budget_reward, evaluate
from kdsl.search.canvas import CanvasSampler
from kdsl.search.space import Space

TINY = {**TINY_DISCOVERY, "time_limit": 10.0}


class InstantExecutor:
    """Scores every task at once from its key: a screening score, or a trained candidate's
    accuracy and latency ratio (the baseline: 0.9 at ratio 1), so that the loop runs without
    training anything."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.keys: list[str] = []

    def map(self, tasks):
        for task in tasks:
            self.keys.append(task.key)
            number = zlib.crc32(task.key.encode()) % 1000 / 1000
            if any(isinstance(spec, dict) and "method" in spec for spec in task.evaluators):
                metrics = {"prescreen": number}
            elif task.key == gallery.load("conv2d").key:
                metrics = {"accuracy": 0.9, "latency_ratio": 1.0, "latency_ms": 1.0, "params": 100}
            else:
                metrics = {"accuracy": 0.8 + 0.1 * number, "latency_ratio": 0.5 + number, "flops_ratio": 0.3}
            yield task, {"key": task.key, "status": "ok", "metrics": metrics, "error": None, "seconds": 0.0}

    def close(self) -> None:
        assert self.keys, "the executor ran no task"


def _run_discover(monkeypatch, tmp_path, **fields):
    from kdsl.discover import loop

    executors: list[InstantExecutor] = []

    def make(*args: object, **kwargs: object) -> InstantExecutor:
        executors.append(InstantExecutor())
        return executors[-1]

    def report(records, baseline, out, **options):
        return {name: out / name for name in ("table", "json", "plot", "pages")}

    monkeypatch.setattr(loop, "make_executor", make)
    monkeypatch.setattr(loop, "write_report", report)
    db = str(tmp_path / "runs.sqlite")
    config = loop.DiscoverConfig(**{**TINY, "db": db, "out": str(tmp_path / "out"), **fields})
    lines: list[str] = []

    class Lines:
        def write(self, text: str) -> None:
            lines.extend(text.splitlines())

        def flush(self) -> None:
            pass

    summary = loop.discover(config, progress=Lines())
    assert executors and summary["evaluated"] >= 1, lines
    return db, summary, lines


@pytest.mark.parametrize("prescreen", [None, "grad_norm"])
def test_strategies_take_turns_though_the_first_is_never_exhausted(monkeypatch, tmp_path, prescreen):
    from kdsl.discover.ranking import load_records
    from kdsl.discover.turns import per_strategy
    from kdsl.search.store import Store

    # no FLOPs floor on the tiny layers: MCTS's short turns there must find something to store
    fields = {"strategy": "canvas,mcts", "prescreen": prescreen, "min_flops": None, "time_limit": 14.0}
    db, summary, lines = _run_discover(monkeypatch, tmp_path, **fields)
    searched = [line.split(")")[0] for line in lines if line.startswith("search (")]
    assert "search (canvas" in searched and "search (mcts" in searched, searched
    assert searched[:2] == ["search (canvas", "search (mcts"], "the second strategy waited for the first"
    counts = per_strategy(db, margin=0.02)
    assert counts["canvas"]["stored"] >= 1 and counts["mcts"]["stored"] >= 1, counts
    assert counts["canvas"]["trained"] >= 1, counts
    # the summary's counts are the database's, with the new families beside them
    assert {name: {k: row[k] for k in counts[name]} for name, row in summary["strategies"].items()} == counts
    assert all("new families" in row for row in summary["strategies"].values())
    records, _ = load_records(db)
    store = Store(db)
    try:
        for record in records:  # each evaluated candidate says which strategy stored it
            assert record["strategy"] in ("canvas", "mcts")
            assert store.get(record["key"])["strategy"] == record["strategy"]
    finally:
        store.close()
    assert sum(c["trained"] for c in counts.values()) == len(records)
    assert any(line.startswith("strategy canvas: ") for line in lines) and any(
        line.startswith("strategy mcts: ") for line in lines
    )


def test_an_exhausted_strategy_leaves_the_turns_to_the_others(monkeypatch, tmp_path):
    from kdsl.discover.turns import per_strategy

    fields = {"strategy": "enumerate,canvas", "max_depth": 2, "time_limit": 8.0, "prescreen": None}
    db, _, lines = _run_discover(monkeypatch, tmp_path, **fields)
    enumerations = [line for line in lines if line.startswith("search (enumerate)")]
    canvas = [line for line in lines if line.startswith("search (canvas)")]
    assert len(enumerations) == 1, "an exhausted enumeration was searched again"
    assert len(canvas) >= 2, lines
    assert per_strategy(db)["canvas"]["trained"] >= 1


def test_per_strategy_counts_stored_screened_trained_and_usable(tmp_path):
    from kdsl.discover.loop import Evaluations
    from kdsl.discover.turns import per_strategy, strategy_lines
    from kdsl.search.store import Store

    db = str(tmp_path / "runs.sqlite")
    store = Store(db)
    lease = store.claim("space", "canvas", 0, "test")
    rows = [
        {"key": f"k{i}", "dsl": "...", "depth": 3, "status": "valid", "strategy": strategy}
        for i, strategy in enumerate(["canvas", "canvas", "canvas", "mcts"])
    ]
    rows.append({"key": "bad", "dsl": "...", "depth": 3, "status": "over_budget", "strategy": "mcts"})
    store.commit(lease, rows, {}, release=True)
    store.close()
    evaluations = Evaluations(db)
    try:
        evaluations.add({"key": "base", "status": "ok", "metrics": {"accuracy": 0.9}}, role="baseline")
        for key, accuracy, ratio in (("k0", 0.89, 0.5), ("k1", 0.89, 1.5), ("k2", 0.7, 0.5)):
            evaluations.add({"key": key, "status": "ok", "metrics": {"accuracy": accuracy, "latency_ratio": ratio}})
            evaluations.add_screen(key, 1.0, {})
        evaluations.add({"key": "k3", "status": "timeout", "metrics": {}, "error": "slow"})
    finally:
        evaluations.close()
    counts = per_strategy(db, margin=0.02)
    canvas = {"stored": 3, "screened": 3, "trained": 3, "failed": 0, "usable": 1, "best_accuracy": 0.89}
    assert counts == {
        "canvas": canvas,
        "mcts": {"stored": 1, "screened": 0, "trained": 0, "failed": 1, "usable": 0, "best_accuracy": None},
    }
    assert (
        strategy_lines(counts)[0] == "canvas: 3 stored, 3 screened, 3 trained (0 failed), 1 usable, best accuracy 0.890"
    )


def _discover_like_space(**options: object) -> Space:
    return Space("conv2d", "resnet18", coefficients={"K": [3], "G": [2, 4, 8], "s": [2]}, max_flops="0.5x", **options)


def test_canvas_kernels_are_filled_near_the_flops_budget():
    space = _discover_like_space()
    kernels = [k for k in (CanvasSampler(space, seed=0).draw(i) for i in range(150)) if k is not None]
    shares = [k.result["flops"] / space.max_flops for k in kernels]
    filled = [k.result["flops"] / space.max_flops for k in kernels if k.widths]
    assert len(kernels) >= 20 and len(filled) >= 5
    assert min(shares) >= 0.4, "a kernel far below the budget was kept"
    assert min(filled) >= 0.5, "the budget solver left a template's widths unfilled"
    # without the floor, kernels that cannot use the budget (no free width) come back
    loose = [CanvasSampler(space, seed=0, min_fill=0.0).draw(i) for i in range(150)]
    assert min(k.result["flops"] / space.max_flops for k in loose if k is not None) < 0.2


def test_canvas_keeps_a_free_width_for_the_budget_solver():
    space = _discover_like_space()

    def templates(keep_width: bool) -> int:
        sampler = CanvasSampler(space, seed=2, keep_width=keep_width, min_fill=0.0)
        return sum(1 for k in (sampler.draw(i) for i in range(150)) if k is not None and k.widths)

    kept, matched = templates(True), templates(False)
    assert kept > matched, (kept, matched)


@pytest.mark.parametrize("value", [-1, 1.5, "half", True])
def test_canvas_min_fill_out_of_range_is_refused(value):
    with pytest.raises(SearchError, match="min_fill"):
        CanvasSampler(_discover_like_space(), min_fill=value)


def test_min_flops_drops_operators_below_it():
    plain = _discover_like_space()
    floored = _discover_like_space(min_flops="0.2x")
    pointwise = gallery.load("pointwise_conv2d")  # 1x1: 1/9 of conv2d's FLOPs
    assert evaluate(plain, pointwise)["status"] == "valid"
    assert evaluate(floored, pointwise)["status"] == "over_budget"
    assert evaluate(floored, gallery.load("grouped_conv2d"))["status"] == "valid"
    assert floored.min_flops == int(0.2 * plain.baseline_cost("flops"))
    assert f"FLOPs >= {floored.min_flops}" in floored.describe()
    assert floored.fingerprint() != plain.fingerprint()
    # a space without the floor keeps the fingerprint stores were written with
    assert '"budgets": [' + str(plain.max_flops) + ", null, null]" in plain.fingerprint()


def test_min_flops_errors_say_what_to_change():
    with pytest.raises(KdslError, match="bad budget 'lots'"):
        _discover_like_space(min_flops="lots")
    with pytest.raises(SearchError, match=r"least FLOPs .* exceed the most FLOPs .*lower min_flops or raise max_flops"):
        _discover_like_space(min_flops="0.6x")
    with pytest.raises(SearchError, match="lower min_params or raise max_params"):
        Space("conv2d", "resnet18", min_params="0.5x", max_params="0.1x")


def test_budget_reward_leans_to_the_budget_and_stays_below_accurate_trained_candidates():
    from kdsl.discover.loop import measured_reward

    space = _discover_like_space(min_params="0.002x")
    names = ["pointwise_conv2d", "grouped_conv2d", "depthwise_separable_conv2d"]
    results = {name: evaluate(space, gallery.load(name)) for name in names}
    assert all(r["status"] == "valid" for r in results.values()), results
    rewards = {name: budget_reward(space, result) for name, result in results.items()}
    assert rewards["pointwise_conv2d"] < rewards["grouped_conv2d"]
    # an accurate trained candidate that is faster than the baseline earns more than any untrained one
    at_margin = measured_reward({"accuracy": 0.88, "latency_ratio": 0.95}, "ok", {"accuracy": 0.9}, margin=0.02)
    assert 0 < max(rewards.values()) <= 0.25 < at_margin
    assert budget_reward(space, {"status": "over_budget", "flops": 10, "params": 10}) == 0.0


def test_discover_command_line_refuses_a_bad_flops_floor(capsys, tmp_path):
    from kdsl.cli import main

    db, out = str(tmp_path / "runs.sqlite"), str(tmp_path / "out")
    with pytest.raises(SystemExit) as exit_info:
        main(["discover", "--min-flops", "lots", "--db", db, "--out", out])
    assert exit_info.value.code == 2 and "bad budget 'lots'" in capsys.readouterr().err
    code = main(["discover", "--min-flops", "0.6x", "--max-flops", "0.5x", "--db", db, "--out", out])
    assert code != 0 and "lower min_flops or raise max_flops" in capsys.readouterr().err


def test_mcts_reads_measured_rewards_back_when_it_rebuilds_its_tree(monkeypatch, tmp_path):
    from kdsl.search import run
    from kdsl.search.mcts import MCTS
    from kdsl.search.store import Store

    sent: list[float | None] = []

    class Recording(MCTS):
        """MCTS that records the reward the driver sends back for each state it yields."""

        def states(self):
            inner = super().states()
            state = next(inner)
            while True:
                reward = yield state
                sent.append(reward)
                try:
                    state = inner.send(reward)
                except StopIteration:
                    return

    monkeypatch.setitem(run.STRATEGIES, "mcts", Recording)
    space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [2]}, max_depth=4)
    db = str(tmp_path / "runs.sqlite")
    first = run.search(space, "mcts", db=db, seed=0, max_results=3)
    assert first.valid >= 1
    store = Store(db)
    try:
        keys = [row["key"] for row in store.top(k=100, status="valid")]
        for key in keys:  # what discover does once a candidate is trained
            store.set_reward(key, 0.875)
    finally:
        store.close()
    assert 0.875 not in sent
    sent.clear()
    run.search(space, "mcts", db=db, seed=0, max_results=1)  # replays the first run's iterations, then goes on
    assert 0.875 in sent, "the rebuilt tree did not get the measured reward"


def test_turns_go_to_the_strategy_whose_candidates_are_usable_and_starve_none():
    turns = Turns(["neighbors", "mcts", "canvas"])
    first = [turns.next() for _ in range(3)]
    assert first == ["neighbors", "mcts", "canvas"]  # each once, in order
    for _ in range(4):
        turns.record("neighbors", usable=True)
        turns.record("mcts", usable=False)
        turns.record("canvas", usable=False)
    names = [turns.next() for _ in range(60)]
    assert names.count("neighbors") > 30  # the productive one takes most turns
    # and the others at least half of an equal share each (60 + 3 turns, 3 strategies)
    assert min(turns.turns["mcts"], turns.turns["canvas"]) >= 0.5 * 63 / 3 - 1


def test_turns_resume_from_the_database_counts_and_skip_exhausted_strategies():
    counts = {"mcts": {"trained": 10, "usable": 5}, "canvas": {"trained": 10, "usable": 0}}
    turns = Turns(["canvas", "mcts"], counts=counts)
    assert turns.yield_of("mcts") > turns.yield_of("canvas")
    turns.next(), turns.next()  # one each first
    assert turns.next() == "mcts"
    turns.skip("mcts")
    assert {turns.next() for _ in range(5)} == {"canvas"}
    turns.skip("canvas")
    assert turns.next() is None


def test_turns_refuse_an_empty_list():
    with pytest.raises(SearchError, match="no strategy"):
        Turns([])
