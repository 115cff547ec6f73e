"""The noise ceiling of the cost model's held-out Spearman: how well one measurement ranks against another.

    PYTHONPATH=. python scripts/costmodel_noise.py --pairs DB ... --tasks costmodel8.db

Records hold one latency per configuration and tuner (MetaSchedule's are not read), so the repeated
timings are configurations of one task (same key, same schedule space version) found in two of the
``--pairs`` databases (two runs; a database that copies another's rows, like a resumed run's, gives
ratios of exactly 1 and is left out by ``--skip``). The log ratios of those pairs are the noise; each
measurement's error is one such ratio over sqrt(2), drawn at random. Applied to every task of
``--tasks`` with at least 6 measured configurations, it prints the mean Spearman of a measurement against
a re-measurement, and of the true order against one measurement (docs/tune/README.md, "Session 38").
Databases are opened read-only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sqlite3
import statistics
from collections import defaultdict

import numpy as np

from kdsl.codegen.tvm.schedule_space import VERSION
from kdsl.tune.transfer import rank_correlation


def _timings(path: str, space: str | None) -> dict[tuple[str, str], float]:
    """(task, configuration key) -> fastest latency in one database, of tasks of schedule space ``space``."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    out: dict[tuple[str, str], float] = {}
    for task, text in db.execute("SELECT task, description FROM tasks"):
        if space is not None and json.loads(text).get("space") != space:
            continue
        # MetaSchedule's rows are traces of its own schedules, not configurations of kdsl's space
        query = (
            "SELECT key, MIN(latency) FROM records WHERE task = ? AND latency > 0 AND tuner NOT LIKE 'metaschedule%'"
        )
        query += " GROUP BY key"
        for key, latency in db.execute(query, (task,)):
            out[(task, key)] = float(latency)
    return out


def log_ratios(paths: list[str], space: str | None) -> list[float]:
    """The log ratio of every pair of timings of one configuration in two of ``paths``."""
    seen: dict[tuple[str, str], list[float]] = defaultdict(list)
    for path in paths:
        for key, latency in _timings(path, space).items():
            seen[key].append(latency)
    out = [math.log(a / b) for timings in seen.values() for a, b in itertools.combinations(timings, 2)]
    assert all(math.isfinite(r) for r in out)
    return out


def ceiling(tasks: list[list[float]], ratios: list[float], draws: int, seed: int) -> tuple[float, float]:
    """Mean over ``tasks`` (latency lists) of (measurement vs re-measurement, true order vs measurement)."""
    rng = np.random.default_rng(seed)
    noise = np.asarray(ratios) / math.sqrt(2)
    again, truth = [], []
    for latencies in tasks:
        lat = np.asarray(latencies)
        for _ in range(draws):
            first = lat * np.exp(rng.choice(noise, len(lat)))
            second = lat * np.exp(rng.choice(noise, len(lat)))
            again.append(rank_correlation(list(first), list(second)))
            truth.append(rank_correlation(list(lat), list(first)))
    return statistics.mean(again), statistics.mean(truth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", nargs="+", required=True, help="records databases of runs on one machine")
    parser.add_argument("--skip", nargs="*", default=[], help="databases of --pairs that copy another's rows")
    parser.add_argument("--tasks", nargs="+", required=True, help="records databases whose tasks are scored")
    parser.add_argument(
        "--space", default=VERSION, help="schedule space version of the tasks read (default: this kdsl's)"
    )
    parser.add_argument("--draws", type=int, default=200, help="noise draws per task")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ratios = log_ratios([p for p in args.pairs if p not in set(args.skip)], args.space)
    if not ratios:
        raise SystemExit("no configuration was timed in two of the --pairs databases")
    magnitude = np.abs(ratios)
    print(
        f"{len(ratios)} pairs of timings: median |log ratio| {np.median(magnitude):.3f}, 90th percentile "
        f"{np.quantile(magnitude, 0.9):.3f}"
    )
    fastest: dict[tuple[str, str], float] = {}  # a configuration in several databases counts once
    for path in args.tasks:
        for key, latency in _timings(path, args.space).items():
            fastest[key] = min(latency, fastest.get(key, latency))
    tasks: dict[str, list[float]] = defaultdict(list)
    for (task, _), latency in fastest.items():
        tasks[task].append(latency)
    scored = [lat for lat in tasks.values() if len(lat) >= 6]
    again, truth = ceiling(scored, ratios, args.draws, args.seed)
    print(f"{len(scored)} tasks: measurement vs re-measurement {again:.3f}, true order vs one measurement {truth:.3f}")


if __name__ == "__main__":
    main()
