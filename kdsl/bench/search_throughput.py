"""Search benchmark for the conv2d spec on ResNet-18's layers (compare Syno §9.4).

* enumeration at each depth up to ``max_depth``: nodes visited per second, distinct canonical
  operators, operators per second;
* random rollouts for ``seconds`` with and without canonicalization and shape distance: rollouts,
  distinct operators (by ``op.key``), valid ones, and the canonical rate (the share of sampled
  operators whose bottom-up path passes every exact, scale and approximate rule);
* Canvas's micro-DAG sampler (:mod:`kdsl.search.canvas`) for ``seconds`` in the same run, under
  half of conv2d's FLOPs (the budget its free widths are filled to) and without a budget: attempts
  and legal kernels per second, the share of the kernels it finished that are valid after solving
  (filled and checked on every layer, within budget), distinct canonical kernels per minute, and
  the mean milliseconds per legal kernel (sampling and solving apart);
* semantic duplicates among the results an enumeration of ``seconds`` stores, with the dedupe at
  insertion on and off (:func:`semantic_duplicates`).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from typing import Any, TextIO

from kdsl.lang.parser import parse
from kdsl.runtime.units import seconds as rounded_seconds
from kdsl.search.analytic import evaluate
from kdsl.search.canvas import CanvasSampler
from kdsl.search.enumerate import Enumeration
from kdsl.search.rules import trace
from kdsl.search.run import search
from kdsl.search.sample import rollout
from kdsl.search.semantic import EQUAL_CHANNEL_LAYERS, EQUAL_CHANNEL_RANK_LAYERS, duplicates, fingerprint
from kdsl.search.space import Space
from kdsl.search.store import Store
from kdsl.search.synthesis import to_operators

__all__ = [
    "canvas_rates",
    "enumeration_rates",
    "equal_channel_families",
    "rollout_rates",
    "run_bench",
    "semantic_duplicates",
]

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
    depth: int, seconds: float, *, canonicalize: bool, use_distance: bool, seed: int = 0, steer: bool = True
) -> dict[str, Any]:
    """Random rollouts in the conv2d space for ``seconds`` (``steer``: backtracking at dead ends and
    the shape distance steering the last steps, :func:`kdsl.search.sample.rollout`)."""
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
        state = rollout(space, rng, steer=steer)
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
        "steer": steer,
        "seconds": round(elapsed, 1),
        "trials": trials,
        "complete": complete,
        "canonical": canonical,
        "canonical_rate": round(canonical / complete, 3) if complete else None,
        "distinct": len(keys),
        "distinct_valid": len(valid),
    }


def canvas_rates(
    seconds: float, *, max_flops: str | None = "0.5x", max_depth: int = 6, seed: int = 0
) -> dict[str, Any]:
    """Canvas's sampler on the conv2d space for ``seconds`` (attempts ``0, 1, ...`` of ``seed``).

    ``valid_after_solving``: of the distinct kernels it finished, the share that the budget solver
    filled and the solver checked on every layer within budget (the rest: no valid widths, or
    even the least widths over budget). Every legal kernel is a distinct canonical one (the
    sampler drops a content key it has produced).

    >>> row = canvas_rates(0.3)
    >>> row["attempts"] > 0 and row["legal"] <= row["attempts"]
    True
    """
    space = Space("conv2d", "resnet18", max_depth=max_depth, max_flops=max_flops, **BENCH_SPACE)
    sampler = CanvasSampler(space, seed=seed)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        sampler.draw(sampler.iteration)
        sampler.iteration += 1
    elapsed = time.perf_counter() - start
    stats = sampler.stats
    legal = stats["legal"]
    solved = legal + stats["invalid"] + stats["over_budget"]
    return {
        "max_flops": max_flops,
        "seconds": round(elapsed, 1),
        "attempts": stats["attempts"],
        "legal": legal,
        "attempts_per_second": round(stats["attempts"] / elapsed, 1),
        "legal_per_second": round(legal / elapsed, 1),
        "valid_after_solving": round(legal / solved, 3) if solved else None,
        "distinct_per_minute": round(60 * legal / elapsed),
        "ms_per_legal": round(1000 * elapsed / legal, 2) if legal else None,
        "sample_ms_per_legal": round(1000 * sampler.seconds["sample"] / legal, 2) if legal else None,
        "solve_ms_per_legal": round(1000 * sampler.seconds["solve"] / legal, 2) if legal else None,
        "failures": {k: stats[k] for k in ("dead_ends", "duplicates", "invalid", "over_budget", "errors")},
    }


def run_bench(max_depth: int = 6, seconds: float = 60.0, seed: int = 0, stream: TextIO | None = None) -> dict[str, Any]:
    """All measurements; ``lines`` is a printable summary."""
    lines = ["kdsl bench search: conv2d spec, ResNet-18 layers, K=3 G=32 s=2"]

    def say(line: str) -> None:
        lines.append(line)
        if stream is not None:
            stream.write(line + "\n")

    enumeration = []
    for depth in range(2, max_depth + 1):
        row = enumeration_rates(depth, seconds)
        enumeration.append(row)
        say(
            f"  enumerate depth {depth}: {row['nodes']} nodes in {rounded_seconds(row['seconds'])} "
            f"({row['nodes_per_second']}/s), "
            f"{row['operators']} canonical operators ({row['valid']} valid; {row['operators_per_second']}/s)"
            + ("" if row["finished"] else "  [time limit]")
        )
        if not row["finished"]:
            break
    sampling = []
    variants = ((True, True, True), (True, True, False), (False, True, True), (True, False, True), (False, False, True))
    for canonicalize, distance, steer in variants:
        row = rollout_rates(
            max_depth, seconds, canonicalize=canonicalize, use_distance=distance, seed=seed, steer=steer
        )
        sampling.append(row)
        say(
            f"  random rollouts (canonicalization {'on' if canonicalize else 'off'}, shape distance "
            f"{'on' if distance else 'off'}, {'steered' if steer else 'plain'}): {row['trials']} trials in "
            f"{rounded_seconds(row['seconds'])}, {row['complete']} complete, "
            f"canonical {row['canonical']} ({row['canonical_rate']}), {row['distinct']} distinct, "
            f"{row['distinct_valid']} distinct valid"
        )
    syno = sampling[0]  # canonicalization and shape distance on: the search's own setting
    syno_per_minute = 60 * syno["distinct_valid"] / syno["seconds"] if syno["seconds"] else 0.0
    canvas = []
    for budget in ("0.5x", None):
        row = canvas_rates(seconds / 2, max_flops=budget, max_depth=max_depth, seed=seed)
        canvas.append(row)
        ratio = f"{row['distinct_per_minute'] / syno_per_minute:.2f}x" if syno_per_minute else "-"
        say(
            f"  canvas sampler ({'FLOPs <= 0.5x conv2d' if budget else 'no budget'}): {row['attempts']} attempts in "
            f"{rounded_seconds(row['seconds'])} ({row['attempts_per_second']}/s), {row['legal']} legal "
            f"({row['legal_per_second']}/s), "
            f"valid after solving {row['valid_after_solving']}, {row['distinct_per_minute']} distinct canonical/min "
            f"({ratio} the rollouts' distinct valid/min), {row['ms_per_legal']} ms per legal kernel "
            f"(sampling {row['sample_ms_per_legal']}, solving {row['solve_ms_per_legal']})"
        )
    dedupe = semantic_duplicates(seconds, max_depth=max_depth)
    say(
        f"  semantic dedupe (enumerate {rounded_seconds(dedupe['seconds'])}): {dedupe['stored']} results stored, "
        f"{dedupe['stored'] - dedupe['families']} of them re-parametrizations of another "
        f"({dedupe['duplicate_share']:.1%}); {dedupe['duplicates']} recorded as duplicates; "
        f"without dedupe {dedupe['plain_stored']} stored, {dedupe['plain_families']} distinct "
        f"({dedupe['plain_duplicate_share']:.1%} re-parametrizations); where Cout = Cin (every layer of "
        f"the space) {dedupe['stored'] - dedupe['equal_channel_families']} "
        f"({dedupe['equal_channel_duplicate_share']:.1%}), {dedupe['across_goals']} of them Cin -> Cin results "
        f"that re-parametrize a Cin -> Cout one"
    )
    return {"enumeration": enumeration, "sampling": sampling, "canvas": canvas, "dedupe": dedupe, "lines": lines}


#: A second pair of layers with Cout = Cin whose coinciding extents differ from
#: :data:`~kdsl.search.semantic.EQUAL_CHANNEL_LAYERS`' (there Cin/G = G; here G/s = K): two results
#: count as one family where Cout = Cin only when their fingerprints agree on both.
CHECK_LAYERS = ({"Cin": 12, "Cout": 12, "H": 6, "W": 6, "M": 6, "K": 3, "G": 6, "s": 2},)
CHECK_RANK_LAYERS = ({"Cin": 6, "Cout": 6, "H": 4, "W": 4, "M": 4, "K": 3, "G": 6, "s": 2},)


def equal_channel_families(space: Space, texts: list[str]) -> tuple[int, int]:
    """``(families, across_goals)`` of DSL ``texts`` where Cout = Cin, as on every layer of a space
    with that equality: a family is a pair of fingerprints, at :data:`EQUAL_CHANNEL_LAYERS` and at
    :data:`CHECK_LAYERS` (an operator without one is its own family); ``across_goals`` counts the
    texts that end at an extra output goal (Cin -> Cin) and share their family with one of the
    spec's own goal (what :func:`kdsl.search.synthesis.spec_twin` is to prevent)."""
    spec_goal = [str(size) for size in space.output_sizes]
    families: dict[object, set[bool]] = {}
    members: list[tuple[object, bool]] = []
    for i, text in enumerate(texts):
        op = parse(text)
        extra = [str(d.size) for d in op.outputs if d.name not in space.spec.batch] != spec_goal
        first = fingerprint(op, layers=EQUAL_CHANNEL_LAYERS, rank_layers=EQUAL_CHANNEL_RANK_LAYERS)
        second = fingerprint(op, layers=CHECK_LAYERS, rank_layers=CHECK_RANK_LAYERS)
        family = (first, second) if first is not None and second is not None else f"unknown {i}"
        families.setdefault(family, set()).add(extra)
        members.append((family, extra))
    across = sum(1 for family, extra in members if extra and False in families[family])
    return len(families), across


def semantic_duplicates(seconds: float, *, max_depth: int = 6) -> dict[str, Any]:
    """Semantic duplicates among a search's stored results: enumerate the conv2d space for
    ``seconds`` into a temporary database with dedupe on and again off, and count, among the valid
    results each stored, those whose full fingerprint (:func:`kdsl.search.semantic.duplicates`,
    pattern and rank for every operator) another stored result has.

    >>> row = semantic_duplicates(0.5, max_depth=2)
    >>> row["stored"] >= row["families"] >= 1
    True
    """
    space = Space("conv2d", "resnet18", max_depth=max_depth, **BENCH_SPACE)
    found: dict[str, Any] = {"seconds": seconds}
    with tempfile.TemporaryDirectory() as folder:
        for prefix, dedupe in (("", True), ("plain_", False)):
            db = os.path.join(folder, f"{prefix or 'dedupe'}.db")
            report = search(space, "enumerate", db=db, time_limit=seconds, dedupe=dedupe)
            store = Store(db, readonly=True)
            try:
                texts = [row["dsl"] for row in store.top(10**9)]
            finally:
                store.close()
            stored, families = duplicates(texts)
            found[f"{prefix}stored"] = stored
            found[f"{prefix}families"] = families
            found[f"{prefix}duplicate_share"] = (stored - families) / stored if stored else 0.0
            if dedupe:
                found["duplicates"] = report.duplicates
                # the same results fingerprinted where Cout = Cin, as on every layer of the space, and
                # how many of those re-parametrize a result of the other output goal
                equal, found["across_goals"] = equal_channel_families(space, texts)
                found["equal_channel_families"] = equal
                found["equal_channel_duplicate_share"] = (stored - equal) / stored if stored else 0.0
    return found
