"""Checking and scoring search results: the solver's check on every layer, FLOPs and parameters
per layer, and the analytic reward MCTS uses (high for low FLOPs with enough parameters).

>>> from kdsl.lang import library
>>> from kdsl.search.space import Space
>>> space = Space("conv2d", "resnet18", coefficients={"K": [3]})
>>> result = evaluate(space, library.load("pointwise_conv2d"))
>>> result["status"], result["flops"] == sum(result["flops_per_layer"])
('valid', True)
>>> 0 < analytic_reward(space, result) <= 1
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator
from kdsl.solve import check, cost
from kdsl.solve.dynamic import BUDGETS

__all__ = ["analytic_reward", "budget_reward", "evaluate"]


def evaluate(space, op: Operator) -> dict[str, Any]:
    """Check ``op`` on the space's layers (with its default coefficients) and measure it.

    Returns ``status`` (``valid``, ``invalid`` or ``over_budget``), ``error``, per-layer and total
    ``flops`` and ``params``. Under ``space.pad`` a size that does not divide a layer is padded
    there (costs at the padded sizes) and ``padded`` lists the layers where it was."""
    coefficients = op.default_coefficients
    result: dict[str, Any] = {"status": "valid", "error": None, "coefficients": coefficients}
    try:
        report = check(op, space.layers, coefficients=coefficients, pad=space.pad)
        if space.pad:
            padded = [layer.name for layer, padding in zip(report.layers, report.paddings) if padding is not None]
            result["padded"] = padded
            per_layer = [cost(op, report.padded_binding(layer.name), metrics=BUDGETS) for layer in space.layers]
        else:
            per_layer = [cost(op, layer, coefficients, metrics=BUDGETS) for layer in space.layers]
    except KdslError as error:
        result.update(status="invalid", error=error.message, flops=None, params=None)
        result.update(flops_per_layer=None, params_per_layer=None)
        return result
    result["flops_per_layer"] = [int(c["flops"]) for c in per_layer]
    result["params_per_layer"] = [int(c["params"]) for c in per_layer]
    result["flops"] = sum(result["flops_per_layer"])
    result["params"] = sum(result["params_per_layer"])
    if space.max_flops is not None and result["flops"] > space.max_flops:
        result["status"] = "over_budget"
    if space.max_params is not None and result["params"] > space.max_params:
        result["status"] = "over_budget"
    if space.min_params is not None and result["params"] < space.min_params:
        result["status"] = "over_budget"
    if space.min_flops is not None and result["flops"] < space.min_flops:
        result["status"] = "over_budget"
    return result


def _baseline_and_capacity(space, result: Mapping[str, Any]) -> tuple[int, float]:
    """The spec baseline's FLOPs (the operator's own where the space has no baseline) and the
    operator's capacity: its parameters over ``min_params`` (default 5% of the baseline's), at most 1."""
    try:
        base_flops = space.baseline_cost("flops")
        base_params = space.baseline_cost("params")
    except KdslError:
        base_flops, base_params = result["flops"], result["params"] or 1
    enough = space.min_params if space.min_params is not None else max(1, base_params // 20)
    return base_flops, min(1.0, (result["params"] or 0) / enough)


def analytic_reward(space, result: Mapping[str, Any]) -> float:
    """:func:`reward` before anything is measured: the speed ratio is the FLOPs ratio to the spec's
    baseline, scaled down when the operator has fewer parameters than ``min_params`` (default: 5%
    of the baseline's). Invalid: 0."""
    if result.get("status") not in ("valid",) or not result.get("flops"):
        return 0.0
    base_flops, capacity = _baseline_and_capacity(space, result)
    return reward({"status": "valid", "flops_ratio": result["flops"] / base_flops, "capacity": capacity})


def budget_reward(space, result: Mapping[str, Any]) -> float:
    """The reward of a candidate that is not trained yet, where trained ones earn a measured,
    accuracy-first reward (``kdsl discover``): ``0.25 * u * capacity``, with ``u`` the share of the
    FLOPs budget it uses (of the baseline's FLOPs without a budget), at most 1. Invalid: 0.

    :func:`analytic_reward` favours few FLOPs, so MCTS steered by it finds operators far below
    the budget, which rarely learn what the baseline learns. This one favours operators that use
    the budget (more work and weights, more capacity), and stays at most 0.25: what an accurate
    trained candidate earns at the baseline's speed, less than a faster one earns
    (:func:`kdsl.discover.loop.measured_reward`: at least ``0.5 / (1 + r)`` at the accuracy
    margin), so measured accuracy and speed lead the search.

    >>> from kdsl.lang import library
    >>> from kdsl.search.space import Space
    >>> space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [2, 8]}, max_flops="0.5x")
    >>> grouped = evaluate(space, library.load("grouped_conv2d"))  # its default G: half the budget
    >>> pointwise = evaluate(space, library.load("pointwise_conv2d"))  # 1x1: 0.11x
    >>> round(budget_reward(space, grouped), 3), budget_reward(space, pointwise) < budget_reward(space, grouped)
    (0.125, True)
    """
    if result.get("status") != "valid" or not result.get("flops"):
        return 0.0
    base_flops, capacity = _baseline_and_capacity(space, result)
    ceiling = space.max_flops if space.max_flops is not None else base_flops
    return 0.25 * min(1.0, result["flops"] / ceiling) * capacity


def reward(metrics: Mapping[str, Any], baseline: Mapping[str, Any] | None = None, *, margin: float = 0.02) -> float:
    """The one reward of a candidate in [0, 1] (Syno §7.2: accuracy first, then speed), used by the
    search on analytic metrics (:func:`analytic_reward`) and by the main job on measured ones.

    With ``a`` the candidate's accuracy, ``b`` the baseline's (``baseline["accuracy"]``, else
    ``metrics["baseline_accuracy"]``), ``floor = b - margin`` and ``r`` the speed ratio
    (``latency_ratio``, else ``flops_ratio``, else 1; lower is faster)::

        reward = 0                                     if a < floor, or the candidate failed
        reward = (1 + q) / 2 * 1 / (1 + r)             otherwise, q = (a - floor) / (1 - floor) in [0, 1]

    So a candidate that is not accurate enough earns nothing; among accurate ones the reward
    rises with accuracy and falls with the latency ratio (0.5 * 1/(1+r) at the floor, 1/(1+r) at
    perfect accuracy; at the baseline's speed ``r = 1`` it is at most 0.5). A candidate without
    an accuracy is rated by speed alone (``q = 1``, no floor).

    >>> reward({"accuracy": 0.97, "latency_ratio": 1.0}, {"accuracy": 0.97}) < reward(
    ...     {"accuracy": 0.97, "latency_ratio": 0.5}, {"accuracy": 0.97})
    True
    >>> reward({"accuracy": 0.90, "latency_ratio": 0.1}, {"accuracy": 0.97})
    0.0
    """
    if metrics.get("status", "ok") not in ("ok", "valid"):
        return 0.0
    ratio = metrics.get("latency_ratio", metrics.get("flops_ratio", 1.0))
    if not isinstance(ratio, (int, float)) or math.isnan(ratio) or ratio < 0:
        return 0.0
    # an operator with too few weights to learn earns less (``capacity`` in [0, 1], 1 if not given)
    speed = metrics.get("capacity", 1.0) / (1.0 + ratio)
    accuracy = metrics.get("accuracy")
    if accuracy is None:
        return speed
    base = (baseline or {}).get("accuracy", metrics.get("baseline_accuracy"))
    floor = (base - margin) if base is not None else 0.0
    if accuracy < floor:
        return 0.0
    quality = min(1.0, max(0.0, (accuracy - floor) / (1.0 - floor))) if floor < 1 else 1.0
    return (1.0 + quality) / 2.0 * speed
