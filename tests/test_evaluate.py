"""Evaluators: analytic costs, latency, the accuracy proxy (reproducible, Canvas's early stop), reward."""

import itertools
import math

import pytest

from kdsl import gallery, solve
from kdsl.discover.evaluators import (
    AccuracyEvaluator,
    AnalyticEvaluator,
    LatencyEvaluator,
    evaluate_all,
    make_evaluator,
)
from kdsl.discover.proxy import BestCurve, ProxyConfig, early_stop_threshold, proxy_layers, should_stop, train
from kdsl.lang.errors import KdslError, SearchError
from kdsl.search.analytic import reward

# a proxy configuration small enough to train in about a second
TINY = {"widths": [8], "image_size": 8, "epochs": 2, "batch_size": 128}


def assert_same_training(first: dict, second: dict) -> None:
    """Everything but the wall time is bit-identical."""
    strip = {"train_seconds"}
    assert {k: v for k, v in first.items() if k not in strip} == {k: v for k, v in second.items() if k not in strip}


# ------------------------------------------------------------------------------------------------
# Canvas's early-stop rule


def test_threshold_grows_linearly_from_theta_to_one():
    epochs, best = 10, 0.8
    lambdas = [early_stop_threshold(e, epochs, best, theta=0.5) / best for e in range(1, epochs + 1)]
    assert lambdas == pytest.approx([0.5 + 0.5 * e / epochs for e in range(1, epochs + 1)])
    assert lambdas[-1] == pytest.approx(1.0)
    assert early_stop_threshold(3, 10, 0.8, theta=1.0) == pytest.approx(0.8)  # theta = 1: no slack at all


def test_should_stop_on_synthetic_curves():
    best = [0.4, 0.6, 0.8, 0.9]
    # lambda = 0.625, 0.75, 0.875, 1.0 -> thresholds 0.25, 0.45, 0.7, 0.9
    assert not should_stop([0.26], best, 4)
    assert should_stop([0.24], best, 4)
    assert not should_stop([0.3, 0.46], best, 4)
    assert should_stop([0.3, 0.44], best, 4)
    assert should_stop([0.3, 0.5, 0.69], best, 4)
    assert not should_stop([0.3, 0.5, 0.71, 0.9], best, 4)
    # a slow starter that catches up is never stopped
    slow = [0.26, 0.46, 0.71, 0.95]
    assert not any(should_stop(slow[: e + 1], best, 4) for e in range(4))
    # without a best curve, or past its end, never
    assert not should_stop([0.0], None, 4)
    assert not should_stop([0.0, 0.0], [0.9], 4)


def test_grace_epochs_are_never_cut_short():
    # conv2d's curve from a discover run, and a candidate that ended within 1 point of it: after
    # epoch 2 it stood below lambda * best, so Canvas's rule alone would have stopped it
    best = [0.43, 0.68, 0.88, 0.89, 0.92, 0.93, 0.95, 0.96, 0.95, 0.96, 0.96, 0.96]
    slow = [0.31, 0.38, 0.76, 0.84, 0.87, 0.91, 0.93, 0.94, 0.95, 0.96, 0.96, 0.96]
    assert should_stop(slow[:2], best, 12)
    assert not any(should_stop(slow[: e + 1], best, 12, grace=0.25) for e in range(12))
    # after the grace epochs the rule applies as before
    assert should_stop([0.31, 0.38, 0.4, 0.45], best, 12, grace=0.25)
    assert not should_stop([0.31, 0.38, 0.4], best, 12, grace=0.25)
    with pytest.raises(KdslError, match="grace"):
        ProxyConfig(grace=1.0)


def test_best_curve_keeps_the_best_completed_run():
    curve = BestCurve()
    assert curve.update([0.2, 0.5])
    assert not curve.update([0.9, 0.4])  # better early, worse at the end
    assert not curve.update([0.3, 0.99], early_stopped=True)  # early-stopped runs never become the best
    assert curve.update([0.1, 0.6])
    assert curve.history == [0.1, 0.6]


def test_training_stops_early_against_a_strong_curve():
    config = ProxyConfig(**{**TINY, "widths": (8,), "epochs": 3})
    result = train(gallery.load("conv2d"), config, best_history=[1.0, 1.0, 1.0])
    # epoch 1 threshold: (0.5 + 0.5/3) * 1.0 = 0.67, far above a 1-epoch tiny net
    assert result["early_stopped"] and result["epochs_run"] == 1
    assert len(result["accuracy_history"]) == 1


# ------------------------------------------------------------------------------------------------
# accuracy proxy


def test_proxy_layers_fit_the_gallery_convolutions():
    layers = proxy_layers()
    assert [(layer["Cin"], layer["Cout"], layer["H"], layer["W"]) for layer in layers] == [
        (32, 32, 16, 16),
        (64, 64, 8, 8),
    ]
    for name in ("conv2d", "depthwise_conv2d", "grouped_conv2d", "pointwise_conv2d"):
        assert len(solve.check(gallery.load(name), layers)) == 2


def test_accuracy_is_bit_reproducible_with_a_seed():
    evaluator = AccuracyEvaluator(compare_baseline=False, **TINY)
    op = gallery.load("conv2d")
    first = evaluator.evaluate(op)
    second = evaluator.evaluate(op)
    assert_same_training(first, second)
    assert len(first["accuracy_history"]) == 2 and 0.0 <= first["accuracy"] <= 1.0
    other_seed = AccuracyEvaluator(compare_baseline=False, seed=1, **TINY).evaluate(op)
    assert other_seed["accuracy_history"] != first["accuracy_history"]


def test_accuracy_reports_the_baseline_measured_by_the_same_code():
    evaluator = AccuracyEvaluator(**TINY)
    metrics = evaluator.evaluate(gallery.load("conv2d"))
    # the baseline is conv2d itself: same code, same seed, same numbers
    assert metrics["baseline_accuracy"] == metrics["accuracy"]
    assert metrics["baseline_accuracy_history"] == metrics["accuracy_history"]
    assert metrics["accuracy_delta"] == 0.0


def test_a_candidate_that_does_not_fit_the_proxy_is_a_kdsl_error():
    from kdsl.lang.errors import KdslError

    evaluator = AccuracyEvaluator(compare_baseline=False, **TINY)
    with pytest.raises(KdslError, match=r"needs \[N, Cin, H, W\]"):
        evaluator.evaluate(gallery.load("pixel_shuffle"))


# ------------------------------------------------------------------------------------------------
# analytic and latency


def test_analytic_ratios_against_conv2d():
    metrics = AnalyticEvaluator("resnet18").evaluate(gallery.load("depthwise_conv2d"))
    channels, sizes = [64, 128, 256, 512], [56, 28, 14, 7]
    conv_flops = sum(c * c * 9 * s * s for c, s in zip(channels, sizes))
    depthwise_flops = sum(c * 9 * s * s for c, s in zip(channels, sizes))
    assert metrics["baseline_flops"] == conv_flops and metrics["flops"] == depthwise_flops
    assert metrics["flops_ratio"] == depthwise_flops / conv_flops
    assert set(metrics["flops_by_layer"]) == {"conv2_x", "conv3_x", "conv4_x", "conv5_x"}
    assert AnalyticEvaluator("resnet18").evaluate(gallery.load("conv2d"))["params_ratio"] == 1.0


def test_latency_compares_with_the_baseline_on_each_layer():
    table = [{"name": "tiny", "N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8}]
    evaluator = LatencyEvaluator(layers=table, batch=2, repeats=3, target=0.002)
    metrics = evaluator.evaluate(gallery.load("depthwise_conv2d"))
    assert metrics["latency_ms"] > 0 and metrics["baseline_latency_ms"] > 0
    # one layer: the total ratio is that layer's (the median of the interleaved pairs' ratios)
    assert metrics["latency_ratio"] == pytest.approx(metrics["latency_ratio_by_layer"]["tiny"])
    assert metrics["latency_rounds"] >= 3 and metrics["latency_threads"] == 1
    assert set(metrics["latency_ms_by_layer"]) == {"tiny"}


def test_evaluators_merge_and_specs_are_checked():
    metrics = evaluate_all(gallery.load("conv2d"), ["analytic"])
    assert metrics["flops_ratio"] == 1.0
    with pytest.raises(SearchError, match="unknown evaluator"):
        make_evaluator("speed")
    with pytest.raises(SearchError, match="bad parameters"):
        make_evaluator({"name": "analytic", "layer": "resnet18"})
    with pytest.raises(SearchError, match="both report"):
        evaluate_all(gallery.load("conv2d"), ["analytic", {"name": "analytic", "layers": "resnet18_stride2"}])


# ------------------------------------------------------------------------------------------------
# reward


def test_reward_is_monotone_and_bounded():
    baseline = {"accuracy": 0.9}
    accuracies = [0.0, 0.5, 0.87, 0.879, 0.88, 0.89, 0.9, 0.95, 1.0]
    ratios = [0.05, 0.2, 0.5, 1.0, 2.0, 10.0]
    grid = {
        (a, r): reward({"accuracy": a, "latency_ratio": r}, baseline) for a, r in itertools.product(accuracies, ratios)
    }
    assert all(0.0 <= value <= 1.0 for value in grid.values())
    for a, r in grid:
        assert (grid[(a, r)] == 0.0) == (a < 0.88)  # below baseline - margin earns nothing, above it something
    for r in ratios:  # non-decreasing in accuracy
        values = [grid[(a, r)] for a in accuracies]
        assert values == sorted(values)
    for a in accuracies:  # non-increasing in the latency ratio, strictly once accurate enough
        values = [grid[(a, r)] for r in ratios]
        assert values == sorted(values, reverse=True)
        if a >= 0.88:
            assert len(set(values)) == len(values)
    assert reward({"accuracy": 0.9, "latency_ratio": 1.0}, baseline) == pytest.approx(
        (1 + 0.02 / 0.12) / 2 * (1 / (1 + 1.0))
    )


def test_reward_fallbacks_and_failures():
    assert reward({"status": "timeout"}) == 0.0
    assert reward({"flops_ratio": 1.0}) == 0.5  # no accuracy: speed alone, from FLOPs
    assert reward({"accuracy": 0.95, "baseline_accuracy": 0.97, "latency_ratio": 1.0}) > 0  # within the margin
    assert reward({"accuracy": 0.9, "latency_ratio": math.nan}, {"accuracy": 0.9}) == 0.0
