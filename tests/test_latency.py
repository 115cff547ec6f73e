"""Repeatable latency ratios (issue 14): the estimator (median of interleaved pairs' ratios), the
number of rounds, how the latency evaluator aggregates layers and which ratio ranks; synthetic
times, except one tiny run of every lane."""

from __future__ import annotations

import math
from statistics import median

import pytest
import torch

from kdsl import gallery
from kdsl.discover import evaluators
from kdsl.discover.evaluators import LatencyEvaluator, check_device
from kdsl.lang.errors import LoweringError, SearchError
from kdsl.runtime.timing import ratio_of_pairs, ratio_spread

TABLE = [
    {"name": "small", "N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8},
    {"name": "large", "N": 1, "Cin": 8, "Cout": 8, "H": 16, "W": 16},
]


def test_ratio_of_pairs_ignores_load_that_hits_one_member_or_scales_both() -> None:
    # every pair says 2; a slow spell over rounds 3-5 scales both members
    a, b = [2.0, 2.0, 8.0, 8.0, 8.0], [1.0, 1.0, 4.0, 4.0, 4.0]
    assert ratio_of_pairs(a, b) == 2.0
    # a spell that starts between the two members of round 3: that pair alone is off
    a, b = [2.0, 2.0, 2.0, 10.0, 10.0], [1.0, 1.0, 5.0, 5.0, 5.0]
    assert ratio_of_pairs(a, b) == 2.0
    assert median(a) / median(b) == pytest.approx(0.4)  # the ratio of medians is fooled by it
    # bursts during single measurements are outvoted
    assert ratio_of_pairs([3.0, 30.0, 3.0, 3.0, 3.0], [1.0, 1.0, 1.0, 20.0, 1.0]) == 3.0


def test_ratio_of_pairs_and_spread_check_their_input() -> None:
    with pytest.raises(ValueError, match="equally long"):
        ratio_of_pairs([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="equally long"):
        ratio_of_pairs([], [])
    with pytest.raises(ValueError, match="positive"):
        ratio_of_pairs([1.0], [0.0])
    with pytest.raises(ValueError, match="at least one"):
        ratio_spread([], [])


def test_ratio_spread_measures_disagreement_between_rounds() -> None:
    steady = ratio_spread([2.0] * 9, [1.0] * 9)
    noisy = ratio_spread([1.0, 3.0, 2.0, 1.5, 2.5, 2.0, 1.0, 3.0, 2.0], [1.0] * 9)
    assert steady == 0.0 and noisy > 0.4
    assert ratio_spread([1.0, 1.2, 1.1], [1.0, 1.0, 1.0]) == pytest.approx(0.2 / 1.1)  # 3 rounds: range


def batches(*rounds: list[tuple[float, float]]):
    """A stand-in for interleaved_samples that returns the given rounds, one batch per call."""
    calls: list[int] = []

    def fake(functions, *, repeats, target, warmup=1, number=None):
        batch = rounds[len(calls)]
        assert len(batch) == repeats and len(functions) == 2
        calls.append(repeats)
        return [[a for a, _ in batch], [b for _, b in batch]]

    return fake, calls


def test_rounds_are_added_while_the_pairs_disagree(monkeypatch: pytest.MonkeyPatch) -> None:
    evaluator = LatencyEvaluator(layers=TABLE, repeats=3, max_repeats=7, spread=0.1)
    noisy = [(1.0, 1.0), (3.0, 1.0), (2.0, 1.0)]
    fake, calls = batches(noisy, noisy, [(2.0, 1.0)])
    monkeypatch.setattr(evaluators, "interleaved_samples", fake)
    a, b = evaluator.pairs(lambda: None, lambda: None)
    assert calls == [3, 3, 1] and len(a) == len(b) == 7  # capped at max_repeats
    steady = [(2.0, 1.0), (2.1, 1.0), (2.05, 1.0)]
    fake, calls = batches(steady)
    monkeypatch.setattr(evaluators, "interleaved_samples", fake)
    a, _ = evaluator.pairs(lambda: None, lambda: None)
    assert calls == [3] and len(a) == 3  # agreeing rounds: no more


def fixed_rounds(per_layer: list[dict[str, float]], lanes: list[str]):
    """A stand-in for LatencyEvaluator.rounds: five equal rounds per layer with the given seconds
    per lane (lanes in the order the evaluator times them)."""
    layers = iter(per_layer)

    def fake(self, functions, ratios):
        times = next(layers)
        assert len(functions) == len(lanes) and all(callable(f) for f in functions)
        return [[times[lane]] * 5 for lane in lanes]

    return fake


def no_kernels(self, lane, op, layer):
    """A stand-in for LatencyEvaluator._lane that builds nothing (its calls are never timed here)."""
    assert lane in ("torch", "native", "tvm", "tvm_base")
    return (lambda: None), False


def test_layers_are_weighted_by_the_baseline_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # the small layer: candidate 2x the baseline (1 ms); the large one: 0.5x (3 ms)
    times = [{"torch": 2e-3, "native": 1e-3}, {"torch": 1.5e-3, "native": 3e-3}]
    monkeypatch.setattr(LatencyEvaluator, "rounds", fixed_rounds(times, ["torch", "native"]))
    before = torch.get_num_threads()
    metrics = LatencyEvaluator(layers=TABLE).evaluate(gallery.load("depthwise_conv2d"))
    assert metrics["latency_ratio_by_layer"] == {"small": 2.0, "large": 0.5}
    assert metrics["latency_ratio"] == metrics["torch_ratio"] == pytest.approx((1 * 2.0 + 3 * 0.5) / (1 + 3))
    assert metrics["latency_ms"] == pytest.approx(3.5) and metrics["baseline_latency_ms"] == pytest.approx(4.0)
    assert metrics["latency_rounds"] == 10 and metrics["latency_spread"] == 0.0
    assert metrics["latency_backend"] == "torch" and metrics["latency_baseline_ms"] == pytest.approx(4.0)
    assert metrics["latency_threads"] == 1 and torch.get_num_threads() == before  # restored after


def test_with_tvm_the_deployable_kernel_ratio_ranks_and_the_others_are_beside_it(monkeypatch) -> None:
    # eager PyTorch 2x F.conv2d, the TVM kernel half of TVM conv2d and 0.8x F.conv2d
    lanes = ["torch", "native", "tvm", "tvm_base"]
    layer = {"torch": 4e-3, "native": 2e-3, "tvm": 1.6e-3, "tvm_base": 3.2e-3}
    monkeypatch.setattr(LatencyEvaluator, "rounds", fixed_rounds([layer, layer], lanes))
    monkeypatch.setattr(LatencyEvaluator, "_lane", no_kernels)
    metrics = LatencyEvaluator(layers=TABLE, backends=("torch", "tvm")).evaluate(gallery.load("grouped_conv2d"))
    assert metrics["latency_backend"] == "tvm"
    assert metrics["latency_ratio"] == metrics["tvm_latency_ratio"] == pytest.approx(0.5)
    assert metrics["torch_ratio"] == pytest.approx(2.0) and metrics["tvm_vs_torch_conv2d"] == pytest.approx(0.8)
    assert metrics["latency_baseline_ms"] == metrics["baseline_tvm_latency_ms"] == pytest.approx(6.4)
    assert metrics["tvm_latency_ms"] == pytest.approx(3.2) and metrics["latency_ms"] == pytest.approx(8.0)
    assert metrics["tvm_schedule"] == "default" and "tvm_error" not in metrics
    ranked_by_torch = LatencyEvaluator(layers=TABLE, backends=("torch", "tvm"), rank="torch")
    monkeypatch.setattr(LatencyEvaluator, "rounds", fixed_rounds([layer, layer], lanes))
    assert ranked_by_torch.evaluate(gallery.load("grouped_conv2d"))["latency_ratio"] == pytest.approx(2.0)


def test_a_candidate_whose_tvm_kernel_fails_gets_an_error_not_a_crash(monkeypatch) -> None:
    def lanes(self, lane, op, layer):
        if lane == "tvm":
            raise LoweringError("no TVM rule for this step")
        return no_kernels(self, lane, op, layer)

    monkeypatch.setattr(LatencyEvaluator, "_lane", lanes)
    times = {"torch": 1e-3, "native": 2e-3}
    monkeypatch.setattr(LatencyEvaluator, "rounds", fixed_rounds([times, times], ["torch", "native"]))
    metrics = LatencyEvaluator(layers=TABLE, backends=("torch", "tvm")).evaluate(gallery.load("grouped_conv2d"))
    assert "LoweringError: no TVM rule for this step" in metrics["tvm_error"]
    assert metrics["latency_ratio"] is None and "tvm_latency_ratio" not in metrics
    assert metrics["torch_ratio"] == pytest.approx(0.5)  # eager PyTorch is still measured


def test_the_lanes_run_and_a_tuned_schedule_is_used_where_the_lookup_finds_one(monkeypatch) -> None:
    from kdsl.codegen.tvm.default_schedule import default_schedule

    asked: list[str] = []

    def lookup(db, op, layer):
        asked.append(op.key)
        return default_schedule if op.key == gallery.load("grouped_conv2d").key else None

    monkeypatch.setattr(evaluators, "_schedule_lookup", lambda path: lookup)
    tiny = [{"name": "tiny", "N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8}]
    evaluator = LatencyEvaluator(
        layers=tiny,
        backends=("torch", "tvm"),
        repeats=1,
        max_repeats=1,
        warmup=0,
        target=1e-4,
        tuned={"db": "records.db", "lookup": "any:thing"},
    )
    metrics = evaluator.evaluate(gallery.load("grouped_conv2d"))
    assert metrics["tvm_schedule"].startswith("tuned on 1 of 1 layers") and len(asked) == 2  # candidate, conv2d
    for name in ("latency_ms", "baseline_latency_ms", "tvm_latency_ms", "baseline_tvm_latency_ms"):
        assert metrics[name] > 0, name
    for name in ("latency_ratio", "torch_ratio", "tvm_vs_torch_conv2d"):
        assert 0 < metrics[name] < math.inf, name


def test_cuda_needs_a_visible_device_and_the_torch_backend() -> None:
    if torch.cuda.is_available():
        pytest.skip("this test checks the error on a machine without a GPU")
    with pytest.raises(SearchError, match="no CUDA device is visible"):
        check_device("cuda")
    with pytest.raises(SearchError, match="PyTorch only"):
        LatencyEvaluator(layers=TABLE, backends=("torch", "tvm"), device="cuda")
    with pytest.raises(SearchError, match="ranking by 'tvm' needs it"):
        LatencyEvaluator(layers=TABLE, backends=("torch",), rank="tvm")


def test_bad_round_settings_are_search_errors() -> None:
    with pytest.raises(SearchError, match="max_repeats"):
        LatencyEvaluator(layers=TABLE, repeats=9, max_repeats=3)
    with pytest.raises(SearchError, match="spread"):
        LatencyEvaluator(layers=TABLE, spread=-1.0)
