"""Search benchmark for the conv2d spec on ResNet-18's layers (compare Syno §9.4).

* enumeration at each depth up to ``max_depth``: nodes visited per second, distinct canonical
  operators, operators per second;
* random rollouts for ``seconds`` with and without canonicalization and shape distance: rollouts,
  distinct operators (by ``op.key``), valid ones, and the canonical rate (the share of sampled
  operators whose bottom-up path passes every exact, scale and approximate rule).
"""

from __future__ import annotations

import random
import time
from typing import Any, TextIO

from kdsl.search.analytic import evaluate
from kdsl.search.enumerate import Enumeration
from kdsl.search.rules import trace
from kdsl.search.sample import rollout
from kdsl.search.space import Space
from kdsl.search.synthesis import to_operators

__all__ = ["enumeration_rates", "rollout_rates", "run_bench"]

BENCH_SPACE: dict[str, Any] = {"coefficients": {"K": [3], "G": [32], "s": [2]}}


def enumeration_rates(depth: int, seconds: float) -> dict[str, Any]:
    """Enumerate the conv2d space to ``depth`` (stopping after ``seconds``), checking each distinct
    operator with the solver on every layer (the time includes the checks)."""
    space = Space("conv2d", "resnet18", max_depth=depth, **BENCH_SPACE)
    walk = Enumeration(space)
    keys: set[str] = set()
    valid = 0
    start = time.perf_counter()
    for state in walk.states():
        if state is not None:
            for op in to_operators(space, state):
                if op.key not in keys:
                    keys.add(op.key)
                    valid += evaluate(space, op)["status"] == "valid"
        if time.perf_counter() - start > seconds:
            break
    elapsed = time.perf_counter() - start
    return {
        "depth": depth,
        "finished": walk.finished,
        "seconds": round(elapsed, 2),
        "nodes": walk.nodes,
        "nodes_per_second": round(walk.nodes / elapsed, 1),
        "operators": len(keys),
        "valid": valid,
        "operators_per_second": round(len(keys) / elapsed, 2),
    }


def rollout_rates(
    depth: int, seconds: float, *, canonicalize: bool, use_distance: bool, seed: int = 0
) -> dict[str, Any]:
    """Random rollouts in the conv2d space for ``seconds``."""
    space = Space(
        "conv2d", "resnet18", max_depth=depth, canonicalize=canonicalize, use_distance=use_distance, **BENCH_SPACE
    )
    checker = Space("conv2d", "resnet18", max_depth=depth, **BENCH_SPACE)
    rng = random.Random(seed)
    trials = complete = canonical = 0
    keys: set[str] = set()
    valid: set[str] = set()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        trials += 1
        state = rollout(space, rng)
        if state is None:
            continue
        complete += 1
        if not trace(checker, state.steps, exactness=("exact", "scale", "approximate")):
            canonical += 1
        for op in to_operators(space, state):
            if op.key not in keys:
                keys.add(op.key)
                if evaluate(space, op)["status"] == "valid":
                    valid.add(op.key)
    elapsed = time.perf_counter() - start
    return {
        "canonicalize": canonicalize,
        "shape_distance": use_distance,
        "seconds": round(elapsed, 1),
        "trials": trials,
        "complete": complete,
        "canonical": canonical,
        "canonical_rate": round(canonical / complete, 3) if complete else None,
        "distinct": len(keys),
        "distinct_valid": len(valid),
    }


def run_bench(max_depth: int = 6, seconds: float = 60.0, seed: int = 0, stream: TextIO | None = None) -> dict[str, Any]:
    """All measurements; ``lines`` is a printable summary."""
    lines = ["kdsl bench search: conv2d spec, ResNet-18 layers, K=3 G=32 s=2"]
    enumeration = []
    for depth in range(2, max_depth + 1):
        row = enumeration_rates(depth, seconds)
        enumeration.append(row)
        lines.append(
            f"  enumerate depth {depth}: {row['nodes']} nodes in {row['seconds']}s ({row['nodes_per_second']}/s), "
            f"{row['operators']} canonical operators ({row['valid']} valid; {row['operators_per_second']}/s)"
            + ("" if row["finished"] else "  [time limit]")
        )
        if stream is not None:
            stream.write(lines[-1] + "\n")
        if not row["finished"]:
            break
    sampling = []
    for canonicalize, distance in ((True, True), (False, True), (True, False), (False, False)):
        row = rollout_rates(max_depth, seconds, canonicalize=canonicalize, use_distance=distance, seed=seed)
        sampling.append(row)
        lines.append(
            f"  random rollouts (canonicalization {'on' if canonicalize else 'off'}, shape distance "
            f"{'on' if distance else 'off'}): {row['trials']} trials in {row['seconds']}s, {row['complete']} complete, "
            f"canonical {row['canonical']} ({row['canonical_rate']}), {row['distinct']} distinct, "
            f"{row['distinct_valid']} distinct valid"
        )
        if stream is not None:
            stream.write(lines[-1] + "\n")
    return {"enumeration": enumeration, "sampling": sampling, "lines": lines}
