"""Pre-screening scores (kdsl.discover.prescreen): values on known operators, the rank
correlation, the evaluator the main job runs in its workers."""

from __future__ import annotations

import math
import random

import pytest
from scipy.stats import spearmanr

from kdsl import gallery
from kdsl.bench.proxy_bench import operators
from kdsl.discover import prescreen
from kdsl.discover.evaluators import make_evaluator
from kdsl.discover.proxy import ProxyConfig
from kdsl.lang.errors import SearchError

TINY = ProxyConfig(widths=(8,), image_size=8, epochs=1, train_samples=200)


def test_zero_cost_scores_of_weightless_and_real_operators():
    weak = operators(["channel_sum", "shift_1tap"])
    conv = prescreen.zero_cost(gallery.load("conv2d"), TINY)
    for op in weak.values():
        scores = prescreen.zero_cost(op, TINY)
        # no candidate weights: no gradient to measure, no synaptic flow through them
        assert scores["grad_norm"] == 0.0 and scores["synflow"] == 0.0
    assert conv["grad_norm"] > 0.0 and math.isfinite(conv["synflow"]) and conv["synflow"] != 0.0
    assert math.isfinite(conv["naswot"])


def test_zero_cost_is_reproducible_and_depends_on_the_seed():
    op = gallery.load("grouped_conv2d")
    first, again = prescreen.zero_cost(op, TINY), prescreen.zero_cost(op, TINY)
    assert first == again
    other = prescreen.zero_cost(op, ProxyConfig(**{**TINY.to_dict(), "widths": (8,), "seed": 1}))
    assert other["grad_norm"] != first["grad_norm"]


def test_naswot_ranks_a_collapsing_operator_below_conv2d():
    # the channel sum maps every channel to the same value: ReLU codes repeat, the kernel shrinks
    sums = prescreen.zero_cost(operators(["channel_sum"])["channel_sum"], TINY)["naswot"]
    assert sums < prescreen.zero_cost(gallery.load("conv2d"), TINY)["naswot"]


def test_spearman_matches_scipy_with_ties():
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(2, 12)
        a = [rng.randint(0, 4) for _ in range(n)]
        b = [rng.random() for _ in range(n)]
        expected = spearmanr(a, b).statistic
        got = prescreen.spearman(a, b)
        if math.isnan(expected):
            assert got == 0.0
        else:
            assert got == pytest.approx(expected, abs=1e-6)
    with pytest.raises(SearchError, match="one length"):
        prescreen.spearman([1.0], [2.0])


def test_the_evaluator_runs_from_its_class_path():
    spec = {"class": "kdsl.discover.prescreen:PrescreenEvaluator", "method": "grad_norm", **TINY.to_dict()}
    metrics = make_evaluator(spec).evaluate(gallery.load("conv2d"))
    assert metrics["prescreen_method"] == "grad_norm" and metrics["prescreen"] > 0
    with pytest.raises(SearchError, match="unknown pre-screening method 'magic'"):
        prescreen.PrescreenEvaluator(method="magic")


def test_correlation_over_candidates():
    ops = operators(["conv2d", "pointwise", "channel_sum"])
    result = prescreen.correlation([(n, op, None) for n, op in ops.items()], TINY, methods=("grad_norm", "short"))
    assert result["candidates"] == 3 and not result["failed"]
    accuracy = [row["accuracy"] for row in result["rows"]]
    for method in ("grad_norm", "short"):
        values = [row[method] for row in result["rows"]]
        assert result["methods"][method]["spearman"] == prescreen.spearman(values, accuracy)
        assert -1.0 <= result["methods"][method]["spearman"] <= 1.0
