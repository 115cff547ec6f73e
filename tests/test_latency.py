"""Repeatable latency ratios (issue 14): the estimator (median of interleaved pairs' ratios), the
number of rounds, and how the latency evaluator aggregates layers; synthetic times only (no test
here times anything)."""

from __future__ import annotations

from statistics import median

import pytest
import torch

from kdsl import gallery
from kdsl.codegen.measure import ratio_of_pairs, ratio_spread
from kdsl.discover import evaluators
from kdsl.discover.evaluators import LatencyEvaluator
from kdsl.lang.errors import SearchError

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


def test_layers_are_weighted_by_the_baseline_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # the small layer: candidate 2x the baseline (1 ms); the large one: 0.5x (3 ms)
    pairs = iter([([2e-3] * 5, [1e-3] * 5), ([1.5e-3] * 5, [3e-3] * 5)])
    monkeypatch.setattr(LatencyEvaluator, "pairs", lambda self, a, b: next(pairs))
    before = torch.get_num_threads()
    metrics = LatencyEvaluator(layers=TABLE).evaluate(gallery.load("depthwise_conv2d"))
    assert metrics["latency_ratio_by_layer"] == {"small": 2.0, "large": 0.5}
    assert metrics["latency_ratio"] == pytest.approx((1 * 2.0 + 3 * 0.5) / (1 + 3))
    assert metrics["latency_ms"] == pytest.approx(3.5) and metrics["baseline_latency_ms"] == pytest.approx(4.0)
    assert metrics["latency_rounds"] == 10 and metrics["latency_spread"] == 0.0
    assert metrics["latency_threads"] == 1 and torch.get_num_threads() == before  # restored after


def test_bad_round_settings_are_search_errors() -> None:
    with pytest.raises(SearchError, match="max_repeats"):
        LatencyEvaluator(layers=TABLE, repeats=9, max_repeats=3)
    with pytest.raises(SearchError, match="spread"):
        LatencyEvaluator(layers=TABLE, spread=-1.0)
