"""Rediscovery: search finds the gallery's hand-written operators (equal canonical keys).

By default each classic operator is looked for in the *default* search space of its spec
(``Space(spec, "resnet18", max_depth=d)``, with the space's default coefficients, caps and
reductions: what ``kdsl search SPEC`` explores), by exhaustive enumeration up to the depth ``d`` at
which the operator lies, within a time limit; a record says what was found, at which depth, after
how many nodes and seconds, or why not. Syno's operators (depth 10, grouped and strided
contractions) are looked for in the space a user after that kind of operator would set: the
coefficient choices, reducible sizes and caps listed in :data:`REDISCOVERY` (``restricted``), which
the records say. ``restricted=True`` uses those restricted spaces for every operator (seconds
instead of minutes).

>>> record = rediscover("pointwise_conv2d")
>>> record["found"], record["depth"], record["strategy"], record["space"]
(True, 2, 'enumerate', 'default')
"""

from __future__ import annotations

import time
from typing import Any

from kdsl import gallery
from kdsl.lang.primitives import PRIMITIVES, VIEW, WINDOWING
from kdsl.search.enumerate import Enumeration
from kdsl.search.space import Space
from kdsl.search.synthesis import to_operators

#: caps that leave out every view but the sliding window (read from the primitives' facts, so a new
#: view is left out of the restricted spaces too)
NO_VIEWS = {name: 0 for name, kind in PRIMITIVES.items() if VIEW in kind.facts and WINDOWING not in kind.facts}

#: Cin -> Cout operators: a restricted space leaves out the Cin -> Cin goal (``equal_variables``)
CIN_COUT = {"equal_variables": False}

#: operator -> (spec, the options of a space restricted to its kind, depth at which it lies)
REDISCOVERY: dict[str, tuple[str, dict[str, Any], int]] = {
    "pointwise_conv2d": ("conv2d", dict(coefficients={"K": [3]}, reductions=["Cin"], caps=NO_VIEWS, **CIN_COUT), 2),
    "shift_conv2d": (
        "conv2d",
        dict(coefficients={"K": [3]}, reductions=["Cin"], caps={**NO_VIEWS, "Shift": 2}, **CIN_COUT),
        4,
    ),
    # Cin -> Cin: found in conv2d's space, whose layers all have Cout = Cin (an extra output goal)
    "depthwise_conv2d": (
        "conv2d",
        dict(coefficients={"K": [3]}, reductions=["K"], caps={**NO_VIEWS, "Share": 1}),
        5,
    ),
    "conv2d": (
        "conv2d",
        dict(coefficients={"K": [3]}, reductions=["Cin", "K"], caps={**NO_VIEWS, "Share": 1}, **CIN_COUT),
        6,
    ),
    "depthwise_separable_conv2d": (
        "conv2d",
        dict(coefficients={"K": [3]}, reductions=["Cin", "K"], caps=NO_VIEWS, **CIN_COUT),
        7,
    ),
    "grouped_conv2d": (
        "conv2d",
        dict(
            coefficients={"K": [3], "G": [4]},
            reductions=["Cin/G", "K"],
            caps={**NO_VIEWS, "Merge": 1, "Split": 1, "Share": 1},
            **CIN_COUT,
        ),
        8,
    ),
    "conv2d_kx1_1xk": (
        "conv2d",
        dict(coefficients={"K": [3]}, reductions=["Cin", "Cout", "K"], caps={**NO_VIEWS, "Reduce": 4}, **CIN_COUT),
        8,
    ),
    "syno_op1": (
        "conv2d",
        dict(
            coefficients={"K": [3], "G": ([32], 3), "s": [2]},
            reductions=["G", "Cin/G", "K", "Cout/(G*s)"],
            caps={**NO_VIEWS, "Split": 1, "Reduce": 5},
            **CIN_COUT,
        ),
        10,
    ),
}
#: looked for in the space a user after such an operator would set, even by default (see above)
USER_SPACE = frozenset({"syno_op1"})
#: minutes rather than seconds in their default spaces: skipped by ``kdsl gallery rediscover --skip-slow``
SLOW = frozenset({"syno_op1", "depthwise_separable_conv2d", "grouped_conv2d", "conv2d_kx1_1xk"})
#: minutes even in their restricted spaces (``--restricted --skip-slow`` and the tests skip these)
SLOW_RESTRICTED = frozenset({"syno_op1"})
#: how long one operator is looked for by default (CPU seconds): the depth-8 classics of conv2d's
#: default space lie past 10 CPU minutes (conv2d_kx1_1xk at 1,849,085 nodes, 1,031 s; grouped_conv2d at
#: 2,217,764 nodes, 1,187 s, on the 2-core development machine; half of the nodes are the Cin -> Cin
#: goal's walk, which takes turns with the spec's)
TIME_LIMIT = 1800.0


def space_for(name: str, *, restricted: bool = False) -> Any:
    """The search space in which ``name`` is looked for: its spec's default space to its depth,
    or (``restricted``, and always for Syno's operators) the restricted one of :data:`REDISCOVERY`."""
    spec, options, depth = REDISCOVERY[name]
    if restricted or name in USER_SPACE:
        return Space(spec, "resnet18", max_depth=depth, **options)
    return Space(spec, "resnet18", max_depth=depth)


def rediscover(name: str, time_limit: float | None = TIME_LIMIT, *, restricted: bool = False) -> dict[str, Any]:
    """Enumerate ``name``'s space until an operator with the gallery operator's key appears;
    return the record: found, strategy, space (``default`` or ``restricted``), spec, depth, nodes
    (the search tree's nodes visited, every walk of the iterative deepening counted; ``goal_nodes``
    splits them by output goal where the space has several), seconds (CPU
    seconds of the search: the time limit counts them too, so a busy machine neither cuts a search
    short nor inflates its record), wall_seconds, key, max_depth, and ``why`` when it was not
    found."""
    space = space_for(name, restricted=restricted)
    kind = "restricted" if restricted or name in USER_SPACE else "default"
    target = gallery.load(name).design_key  # a design at any coefficient values
    start, wall = time.process_time(), time.perf_counter()
    record: dict[str, Any] = {
        "found": False,
        "strategy": "enumerate",
        "space": kind,
        "spec": space.spec.name,
        "key": target,
        "max_depth": space.max_depth,
    }
    walk = Enumeration(space)
    for state in walk.states():
        if time_limit is not None and time.process_time() - start > time_limit:
            record["why"] = (
                f"not reached within {time_limit:.0f} CPU seconds: enumeration of the {kind} space of "
                f"{space.spec.name} to depth {space.max_depth} visited {walk.nodes} nodes first (walking depth "
                f"{walk.limit})"
            )
            break
        if state is None:
            continue
        for op in to_operators(space, state):
            if op.design_key == target:
                record.update(found=True, depth=state.depth, nodes=walk.nodes, **_seconds(start, wall))
                if len(walk.walks) > 1:  # the walks of the goals take turns: the nodes of each
                    record["goal_nodes"] = [w.nodes for w in walk.walks]
                return record
    else:
        record["why"] = (
            f"the {kind} space of {space.spec.name} to depth {space.max_depth} holds no operator with its key "
            f"({walk.nodes} nodes enumerated): its caps, reductions or coefficient choices exclude it"
        )
    record.update(nodes=walk.nodes, **_seconds(start, wall))
    return record


def _seconds(cpu_start: float, wall_start: float) -> dict[str, float]:
    """``seconds``: CPU seconds of this process (the search's cost, whatever else the machine
    runs); ``wall_seconds``: elapsed time."""
    return {
        "seconds": round(time.process_time() - cpu_start, 3),
        "wall_seconds": round(time.perf_counter() - wall_start, 3),
    }
