"""``kdsl bench proxy``: does the accuracy proxy tell good operators from weak ones, across seeds?

It trains the proxy network (:mod:`kdsl.discover.proxy`) with each of three gallery operators
(``conv2d``, ``grouped_conv2d``, ``depthwise_separable_conv2d``) and three deliberately weak ones
written below in the DSL (:data:`WEAK`: a pointwise-only conv, a 1-tap shift without weights, a
channel sum), once per seed, and prints per operator the mean accuracy and its standard deviation
over seeds, each seed's ranking, and whether the ranking is stable: the same order in every seed
(``ranking_stable``), and every gallery operator above every weak one in every seed
(``separated``). The gap between the weakest gallery operator's and the strongest weak
operator's mean (``gap``) set against the largest seed-to-seed standard deviation (``max_std``)
says how much the proxy discriminates beyond its noise.

>>> sorted(WEAK)
['channel_sum', 'pointwise', 'shift_1tap']
>>> spearman([1, 2, 3, 4], [10, 20, 40, 30])
0.8
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from kdsl import gallery
from kdsl.bench.argument_types import positive_float, positive_int
from kdsl.discover import prescreen
from kdsl.discover.loop import DiscoverConfig, discovery_space
from kdsl.discover.prescreen import spearman
from kdsl.discover.proxy import ProxyConfig, proxy_net, train
from kdsl.lang.errors import KdslError
from kdsl.lang.library import load_operator
from kdsl.lang.operator import Operator
from kdsl.lang.parser import parse
from kdsl.search.run import search
from kdsl.search.store import Store

__all__ = [
    "GALLERY",
    "WEAK",
    "add_arguments",
    "add_prescreen_arguments",
    "bench_prescreen",
    "bench_proxy",
    "fitting_operators",
    "operators",
    "proxy_spread",
    "stored_candidates",
]

#: Gallery operators the proxy should rate highly.
GALLERY = ("conv2d", "grouped_conv2d", "depthwise_separable_conv2d")

#: Deliberately weak operators (all map [N, C, H, W] to the same shape, as the proxy's blocks need).
WEAK = {
    # a channel mix at each pixel: no spatial context at all
    "pointwise": """
from kdsl.lang import *
N, Cin, H, W, Cout = primary("N Cin H W Cout")
w = Weight(Cout, Cin, name="w")
pointwise = Input(N, Cin, H, W) >> Share(w) >> Reduce(Cin) >> Output(N, Cout, H, W)
""",
    # every channel moved one row (cyclically), no weights: the block learns nothing
    "shift_1tap": """
from kdsl.lang import *
N, Cin, H, W = primary("N Cin H W")
shift_1tap = Input(N, Cin, H, W) >> Shift(H) >> Output(N, Cin, H, W)
""",
    # every output channel is the sum of the input channels: no weights, no spatial context
    "channel_sum": """
from kdsl.lang import *
N, Cin, H, W, Cout = primary("N Cin H W Cout")
channel_sum = Input(N, Cin, H, W) >> Reduce(Cin) >> Expand("Cout", Cout) >> Output(N, Cout, H, W)
""",
}


def operators(names: Sequence[str] | None = None) -> dict[str, Operator]:
    """The benchmark's operators by name (gallery names, .dsl/.json files, or keys of :data:`WEAK`)."""
    names = list(names) if names else [*GALLERY, *WEAK]
    return {name: parse(WEAK[name]) if name in WEAK else load_operator(name) for name in names}


def proxy_spread(
    config: ProxyConfig,
    seeds: Sequence[int] = (0, 1, 2),
    names: Sequence[str] | None = None,
    stream: TextIO | None = None,
) -> dict[str, Any]:
    """Train every operator once per seed; per-operator mean and std, per-seed rankings, stability."""
    ops = operators(names)
    accuracy: dict[str, list[float]] = {name: [] for name in ops}
    seconds: dict[str, float] = dict.fromkeys(ops, 0.0)
    for seed in seeds:
        for name, op in ops.items():
            start = time.perf_counter()
            result = train(op, replace(config, seed=seed))
            seconds[name] += time.perf_counter() - start
            accuracy[name].append(result["accuracy"])
            if stream is not None:
                stream.write(f"seed {seed} {name}: {result['accuracy']:.3f}\n")
                stream.flush()
    rows = {
        name: {
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "accuracy": values,
            "seconds_per_run": seconds[name] / len(values),
        }
        for name, values in accuracy.items()
    }
    rankings = [sorted(ops, key=lambda n, i=i: -accuracy[n][i]) for i in range(len(seeds))]
    strong = [n for n in ops if n not in WEAK]
    weak = [n for n in ops if n in WEAK]
    separated = (
        all(min(accuracy[n][i] for n in strong) > max(accuracy[n][i] for n in weak) for i in range(len(seeds)))
        if strong and weak
        else None
    )
    pairs = [
        spearman([accuracy[n][i] for n in ops], [accuracy[n][j] for n in ops])
        for i in range(len(seeds))
        for j in range(i + 1, len(seeds))
    ]
    gap = (min(rows[n]["mean"] for n in strong) - max(rows[n]["mean"] for n in weak)) if strong and weak else None
    return {
        "config": config.to_dict(),
        "seeds": list(seeds),
        "operators": rows,
        "rankings": rankings,
        "ranking_stable": all(r == rankings[0] for r in rankings),
        "separated": separated,
        "seed_spearman_min": min(pairs) if pairs else None,
        "gap": gap,
        "max_std": max(row["std"] for row in rows.values()),
    }


def lines(result: Mapping[str, Any]) -> list[str]:
    """The result as a table a person reads."""
    config = result["config"]
    out = [
        f"proxy: data {config['data']}, epochs {config['epochs']}, train_samples {config['train_samples']}, "
        f"shift {config['shift']}, noise {config['noise']}, widths {config['widths']}; seeds {result['seeds']}",
        f"{'operator':30} {'mean':>6} {'std':>6}  per seed              s/run",
    ]
    for name, row in result["operators"].items():
        each = " ".join(f"{a:.3f}" for a in row["accuracy"])
        mark = " (weak)" if name in WEAK else ""
        out.append(f"{name + mark:30} {row['mean']:6.3f} {row['std']:6.3f}  {each:22} {row['seconds_per_run']:5.1f}")
    for seed, ranking in zip(result["seeds"], result["rankings"], strict=True):
        out.append(f"ranking, seed {seed}: {' > '.join(ranking)}")
    gap = result["gap"]
    out.append(
        f"ranking stable across seeds: {'yes' if result['ranking_stable'] else 'no'} "
        f"(least Spearman between two seeds {result['seed_spearman_min']}); gallery above every weak operator in "
        f"every seed: {'yes' if result['separated'] else 'no'}; gap (weakest gallery mean - strongest weak mean) "
        + (f"{gap:.3f}" if gap is not None else "n/a")
        + f" vs largest seed std {result['max_std']:.3f}"
    )
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``kdsl bench proxy``."""
    defaults = ProxyConfig()
    parser.add_argument(
        "--runs",
        dest="seeds",
        type=positive_int,
        metavar="N",
        default=3,
        help="runs per operator, seeds 0, 1, ... (as bench tune)",
    )
    parser.add_argument("--seeds", dest="seeds", type=positive_int, help=argparse.SUPPRESS)  # the old spelling
    parser.add_argument("--epochs", type=int, default=defaults.epochs, help="training epochs per run")
    parser.add_argument("--data", default=defaults.data, help="digits, cifar10:DIR, cifar100:DIR, npz:FILE, folder:DIR")
    parser.add_argument(
        "--train-samples", type=int, default=defaults.train_samples, help="training images drawn from the data"
    )
    parser.add_argument("--shift", type=int, default=defaults.shift, help="augmentation: random shifts up to this")
    parser.add_argument("--noise", type=float, default=defaults.noise, help="Gaussian noise on the images")
    parser.add_argument(
        "--ops",
        nargs="+",
        help="operators: gallery names, .dsl/.json files, or weak ones (" + ", ".join(WEAK) + "); default: a fixed set",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")


def bench_proxy(args: argparse.Namespace) -> int:
    """``kdsl bench proxy``: print the table of :func:`lines` (or the JSON of :func:`proxy_spread`)."""
    config = ProxyConfig(
        epochs=args.epochs,
        data=args.data,
        train_samples=args.train_samples,
        shift=args.shift,
        noise=args.noise,
    )
    result = proxy_spread(config, range(max(1, args.seeds)), args.ops, stream=sys.stderr)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print("\n".join(lines(result)))
    return 0


# ---------------------------------------------------------------------------------------------
# kdsl bench prescreen


def stored_candidates(db: str, count: int, seed: int = 0) -> list[tuple[str, Operator, dict | None]]:
    """``count`` valid candidates of a search store, drawn at random (seeded) so the sample spans
    good and bad ones, each as ``(key, operator, widths)``."""
    store = Store(db)
    try:
        rows = store.top(k=100_000, status="valid")
    finally:
        store.close()
    rows = sorted(rows, key=lambda row: row["key"])
    random.Random(seed).shuffle(rows)
    return [(row["key"], parse(row["dsl"]), (row.get("metrics") or {}).get("widths")) for row in rows[:count]]


def add_prescreen_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``kdsl bench prescreen``."""
    parser.add_argument("--db", help="a search or discovery database to draw candidates from (default: search first)")
    parser.add_argument("--count", type=int, default=16, help="candidates to score and train")
    parser.add_argument(
        "--gallery",
        action="store_true",
        help="score the gallery operators that fit the proxy and the weak ones instead",
    )
    parser.add_argument(
        "--time-limit",
        dest="search_seconds",
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
        help="without --db: seconds of search",
    )
    parser.add_argument("--search-seconds", dest="search_seconds", type=positive_float, help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="random", help="without --db: the search strategy")
    parser.add_argument("--seed", type=int, default=0, help="seed of the search and of the training runs")
    parser.add_argument("--epochs", type=int, default=ProxyConfig.epochs, help="epochs of the full proxy run")
    parser.add_argument("--short-epochs", type=int, default=1, help="epochs of the 'short' score's run")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")


def bench_prescreen(args: argparse.Namespace) -> int:
    """``kdsl bench prescreen``: Spearman's rank correlation of each pre-screening score
    (:mod:`kdsl.discover.prescreen`) with the full proxy accuracy over candidates of a store."""
    config = ProxyConfig(epochs=args.epochs)
    if args.gallery:
        candidates = [(name, op, None) for name, op in fitting_operators(config).items()]
        result = prescreen.correlation(candidates, config, short_epochs=args.short_epochs, stream=sys.stderr)
        return _print_correlation(result, args.json)
    with tempfile.TemporaryDirectory() as folder:
        db = args.db
        if db is None:
            db = str(Path(folder) / "search.sqlite")
            space = discovery_space(DiscoverConfig())
            report = search(space, args.strategy, db=db, seed=args.seed, time_limit=args.search_seconds)
            sys.stderr.write(f"searched {report.seconds:.0f} s: {report.valid} valid candidates\n")
        candidates = stored_candidates(db, args.count, args.seed)
    result = prescreen.correlation(candidates, config, short_epochs=args.short_epochs, stream=sys.stderr)
    return _print_correlation(result, args.json)


def fitting_operators(config: ProxyConfig) -> dict[str, Operator]:
    """Every gallery operator that builds in the proxy network, and the weak ones."""
    ops = {}
    for name in gallery.names():
        try:
            op = gallery.load(name)
            proxy_net(op, config)
        except KdslError:
            continue
        ops[name] = op
    return ops | operators(list(WEAK))


def _print_correlation(result: Mapping[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(
        f"{result['candidates']} candidates ({len(result['failed'])} failed to build or train); full proxy "
        f"{result['full_seconds_per_candidate']:.2f} s per candidate"
    )
    for method, row in result["methods"].items():
        print(f"{method:10} Spearman {row['spearman']}  {row['seconds_per_candidate']:.2f} s per candidate")
    return 0
