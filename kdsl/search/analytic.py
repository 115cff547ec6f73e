"""Checking and scoring search results: the solver's check on every layer, FLOPs and parameters
per layer, and the analytic reward MCTS uses (high for low FLOPs with enough parameters).

>>> from kdsl import gallery
>>> from kdsl.search.space import Space
>>> space = Space("conv2d", "resnet18", coefficients={"K": [3]})
>>> result = evaluate(space, gallery.load("pointwise_conv2d"))
>>> result["status"], result["flops"] == sum(result["flops_per_layer"])
('valid', True)
>>> 0 < analytic_reward(space, result) <= 1
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kdsl.lang.build import Operator
from kdsl.lang.errors import KdslError
from kdsl.solve import check, cost

__all__ = ["analytic_reward", "evaluate"]


def evaluate(space, op: Operator) -> dict[str, Any]:
    """Check ``op`` on the space's layers (with its default coefficients) and measure it.

    Returns ``status`` (``valid``, ``invalid`` or ``over_budget``), ``error``, per-layer and total
    ``flops`` and ``params``."""
    coefficients = op.default_coefficients
    result: dict[str, Any] = {"status": "valid", "error": None, "coefficients": coefficients}
    try:
        check(op, space.layers, coefficients=coefficients)
        per_layer = [cost(op, layer, coefficients) for layer in space.layers]
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
    return result


def analytic_reward(space, result: Mapping[str, Any]) -> float:
    """A reward in [0, 1]: ``1 / (1 + FLOPs/baseline FLOPs)`` scaled down when the operator has
    fewer parameters than ``min_params`` (default: 5% of the baseline's). Invalid: 0."""
    if result.get("status") not in ("valid",) or not result.get("flops"):
        return 0.0
    try:
        base_flops = space._baseline("flops")
        base_params = space._baseline("params")
    except KdslError:
        base_flops, base_params = result["flops"], result["params"] or 1
    enough = space.min_params if space.min_params is not None else max(1, base_params // 20)
    capacity = min(1.0, (result["params"] or 0) / enough)
    return capacity / (1.0 + result["flops"] / base_flops)
