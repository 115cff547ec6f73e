"""Rediscovery: enumeration finds the gallery's hand-written operators (equal canonical keys).

Each entry restricts the search space the way a user looking for that kind of operator would
(coefficient choices, the sizes that may be reduced, primitive caps, depth), so that exhaustive
enumeration reaches it in seconds (``syno_op1``, at depth 10, takes minutes).

>>> record = rediscover("pointwise_conv2d")
>>> record["found"], record["depth"], record["strategy"]
(True, 2, 'enumerate')
"""

from __future__ import annotations

import time
from typing import Any

from kdsl import gallery
from kdsl.search.enumerate import Enumeration
from kdsl.search.space import Space
from kdsl.search.synthesis import to_operators

NO_VIEWS = {"Merge": 0, "Split": 0, "Shift": 0, "Stride": 0, "Expand": 0}

#: operator -> (spec, space options, depth at which enumeration finds it)
REDISCOVERY: dict[str, tuple[str, dict[str, Any], int]] = {
    "pointwise_conv2d": ("conv2d", dict(coefficients={"K": [3]}, reductions=["Cin"], caps=NO_VIEWS), 2),
    "shift_conv2d": ("conv2d", dict(coefficients={"K": [3]}, reductions=["Cin"], caps={**NO_VIEWS, "Shift": 2}), 4),
    "depthwise_conv2d": (
        "conv2d_same_channels",
        dict(coefficients={"K": [3]}, reductions=["K"], caps={**NO_VIEWS, "Share": 1}),
        5,
    ),
    "conv2d": ("conv2d", dict(coefficients={"K": [3]}, reductions=["Cin", "K"], caps={**NO_VIEWS, "Share": 1}), 6),
    "depthwise_separable_conv2d": ("conv2d", dict(coefficients={"K": [3]}, reductions=["Cin", "K"], caps=NO_VIEWS), 7),
    "grouped_conv2d": (
        "conv2d",
        dict(
            coefficients={"K": [3], "G": [4]},
            reductions=["Cin/G", "K"],
            caps={**NO_VIEWS, "Merge": 1, "Split": 1, "Share": 1},
        ),
        8,
    ),
    "conv2d_kx1_1xk": (
        "conv2d",
        dict(coefficients={"K": [3]}, reductions=["Cin", "Cout", "K"], caps={**NO_VIEWS, "Reduce": 4}),
        8,
    ),
    "syno_op1": (
        "conv2d",
        dict(
            coefficients={"K": [3], "G": ([32], 3), "s": [2]},
            reductions=["G", "Cin/G", "K", "Cout/(G*s)"],
            caps={**NO_VIEWS, "Split": 1, "Reduce": 5},
        ),
        10,
    ),
}
SLOW = frozenset({"syno_op1"})


def space_for(name: str) -> Any:
    """The restricted search space in which ``name`` is rediscovered."""
    spec, options, depth = REDISCOVERY[name]
    return Space(spec, "resnet18", max_depth=depth, **options)


def rediscover(name: str, time_limit: float | None = None) -> dict[str, Any]:
    """Enumerate ``name``'s space until an operator with the gallery operator's key appears;
    return the record (found, strategy, depth, seconds, key, max_depth)."""
    space = space_for(name)
    target = gallery.load(name).key
    start = time.perf_counter()
    record: dict[str, Any] = {"found": False, "strategy": "enumerate", "key": target, "max_depth": space.max_depth}
    for state in Enumeration(space).states():
        if time_limit is not None and time.perf_counter() - start > time_limit:
            break
        if state is None:
            continue
        for op in to_operators(space, state):
            if op.key == target:
                record.update(found=True, depth=state.depth, seconds=round(time.perf_counter() - start, 3))
                return record
    record["seconds"] = round(time.perf_counter() - start, 3)
    return record
