"""``kdsl discover``: the main job's command line (the loop itself is :mod:`kdsl.discover.loop`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kdsl.bench.argument_types import RESULTS_DB, TUNE_DB, count, optional_budget, positive_float, positive_int
from kdsl.discover import ranking
from kdsl.discover import report as discovery
from kdsl.discover.evaluators import check_device
from kdsl.discover.loop import NETS, DiscoverConfig, discover, discovery_space, strategy_sequence
from kdsl.discover.prescreen import METHODS
from kdsl.lang.errors import KdslError, printable
from kdsl.runtime.progress import Progress
from kdsl.search.run import STRATEGIES

__all__ = ["add_discover_command"]


def add_discover_command(subparsers: Any) -> None:
    """Register ``kdsl discover``."""
    parser = subparsers.add_parser("discover", help="search, evaluate and rank replacements for a network's convs")
    _add_space_arguments(parser)
    _add_run_arguments(parser)
    _add_proxy_arguments(parser)
    _add_timing_arguments(parser)
    parser.set_defaults(run=_command)


def _add_space_arguments(parser: Any) -> None:
    """What is searched: the network, the spec, the budgets, depth and strategies."""
    parser.add_argument(
        "--net", default="proxy-resnet", choices=NETS, help="the proxy network whose convs are replaced"
    )
    parser.add_argument(
        "--spec",
        default="conv2d",
        help="what candidates map; the proxy network takes [N, Cin, H, W] -> [N, Cout, H, W] "
        "(conv2d, conv2d_same_channels, or a JSON spec of that shape)",
    )
    parser.add_argument(
        "--max-macs",
        "--max-flops",
        dest="max_flops",
        metavar="BUDGET",
        type=optional_budget,
        default="0.5x",
        help="budget of MACs: a multiple of conv2d's (0.5x), a count (150M), or none; a plain 0.5 is refused; "
        "--max-flops is the same option",
    )
    parser.add_argument(
        "--min-params",
        type=optional_budget,
        metavar="BUDGET",
        default=DiscoverConfig.min_params,
        help="fewest parameters relative to conv2d (default 0.002x: a depthwise 3x3 conv passes, a per-channel "
        "scale does not), a count, or none; candidates below it are not trained",
    )
    parser.add_argument(
        "--min-macs",
        "--min-flops",
        dest="min_flops",
        metavar="BUDGET",
        type=optional_budget,
        default=DiscoverConfig.min_flops,
        help="fewest MACs relative to conv2d (default 0.1x: below it a candidate rarely trains to within a point "
        "of conv2d), a count, or none; candidates below it are not trained; --min-flops is the same option",
    )
    parser.add_argument(
        "--max-depth", type=positive_int, default=DiscoverConfig.max_depth, help="most primitives per operator"
    )
    parser.add_argument(
        "--strategy",
        type=_strategies,
        default=DiscoverConfig.strategy,
        help=f"strategies taking turns (one search, screen and train round each), comma-separated "
        f"({', '.join(sorted(STRATEGIES))}); default {DiscoverConfig.strategy}: gallery neighbours find known "
        f"designs and their rewrites, so they get one turn in three; MCTS and Canvas's sampler start from "
        f"nothing, where new families come from",
    )


def _add_run_arguments(parser: Any) -> None:
    """The run itself: time, database, report folder, executor, workers, seed."""
    parser.add_argument(
        "--time-limit", type=positive_float, default=300.0, metavar="SECONDS", help="seconds for the whole run"
    )
    parser.add_argument(
        "--db",
        default=RESULTS_DB,
        help="SQLite results database of the run (a run resumes from it; kdsl results reads it)",
    )
    parser.add_argument(
        "--out", default="out", metavar="DIR", help="folder for results.md, results.json, pareto.png and pages/"
    )
    parser.add_argument("--executor", default="local", help="local, ray or ray:ADDRESS")
    parser.add_argument("--workers", type=positive_int, default=1, help="candidates evaluated in parallel")
    parser.add_argument("--seed", type=int, default=0, help="seed of the search and of the proxy training")
    parser.add_argument("--json", action="store_true", help="print a JSON summary instead of a table")
    parser.add_argument(
        "--eval-timeout", type=positive_float, default=240.0, help="seconds per candidate before it is killed"
    )


def _add_proxy_arguments(parser: Any) -> None:
    """How candidates are trained: epochs, data, and the screen that picks them."""
    parser.add_argument("--epochs", type=positive_int, default=DiscoverConfig.epochs, help="proxy training epochs")
    parser.add_argument(
        "--data",
        default="digits",
        help="the proxy's data: digits (embedded, the default), cifar10:DIR or cifar100:DIR (torchvision's "
        "pickled batches), npz:FILE (arrays x [n, c, h, w] or [n, h, w] and y), folder:DIR (a sub-folder per class)",
    )
    parser.add_argument(
        "--prescreen",
        default=DiscoverConfig.prescreen,
        choices=[*METHODS, "none"],
        help="the cheap score that picks which candidates to train (see kdsl bench prescreen), or none",
    )
    parser.add_argument(
        "--screen-factor",
        type=positive_int,
        default=DiscoverConfig.screen_factor,
        help="candidates screened per trained",
    )


def _add_timing_arguments(parser: Any) -> None:
    """How candidates are timed: backend, device, tuned schedules, baseline cache, the network."""
    parser.add_argument(
        "--latency-backend",
        choices=("tvm", "torch"),
        default=None,
        help="what the ranking's latency ratio divides: tvm (default on the CPU) = the TVM kernel kdsl would "
        "deploy over conv2d's TVM kernel, with eager PyTorch and PyTorch's conv2d timed beside it; torch = "
        "kdsl's eager PyTorch module over PyTorch's conv2d (the default with --device cuda)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where candidates are timed: cpu, or cuda (PyTorch on the GPU; fails at once without one)",
    )
    parser.add_argument(
        "--tuned",
        default=None,
        metavar="DB",
        help="a kdsl tune records database: time TVM kernels with its best schedule where it has one for the "
        "operator at the layer (default: tune.db when it exists here; none: the default schedule)",
    )
    parser.add_argument(
        "--no-baseline-cache",
        action="store_true",
        help="measure the baseline again instead of reusing this machine's cached one ($KDSL_CACHE_DIR or "
        "~/.cache/kdsl)",
    )
    parser.add_argument(
        "--network-top",
        type=count,
        default=0,
        metavar="N",
        help="after the time limit, time ResNet-18 end to end (PyTorch and TVM, batch 1 and 8) with the top N "
        "families in its stage convolutions and add it to the report (a few minutes; default 0: not at all)",
    )


def _tuned(path: str | None) -> dict[str, str] | None:
    """The latency evaluator's tuned-schedule source of ``--tuned``: a records database and the
    function of :mod:`kdsl.tune.tuned` that finds a schedule in it."""
    if path is None:
        path = TUNE_DB if Path(TUNE_DB).is_file() else "none"
    if path == "none":
        return None
    if not Path(path).is_file():
        raise KdslError(f"--tuned {printable(path)}: no such records database; run kdsl tune --db {printable(path)}")
    return {"db": str(Path(path).resolve()), "lookup": "kdsl.tune.tuned:tuned_schedule"}


def _command(args: Any) -> int:
    config = DiscoverConfig(
        net=args.net,
        spec=args.spec,
        max_flops=args.max_flops,
        min_params=args.min_params,
        min_flops=args.min_flops,
        max_depth=args.max_depth,
        strategy=args.strategy,
        time_limit=args.time_limit,
        db=args.db,
        out=args.out,
        executor=args.executor,
        workers=args.workers,
        seed=args.seed,
        eval_timeout=args.eval_timeout,
        epochs=args.epochs,
        data=args.data,
        prescreen=None if args.prescreen == "none" else args.prescreen,
        screen_factor=args.screen_factor,
        network_top=args.network_top,
        latency_backend=args.latency_backend or ("torch" if args.device == "cuda" else "tvm"),
        device=args.device,
        tuned=_tuned(args.tuned),
        use_cache=not args.no_baseline_cache,
    )
    check_device(config.device)  # no GPU: one error line at once, before the search space is built
    discovery_space(config)  # a spec the network cannot use is one error line, before any progress
    # progress goes to stderr either way; stdout gets the answer: a table, or JSON with --json
    with Progress("discover", total=config.time_limit, unit="s", stream=sys.stderr, clock=True) as bar:
        summary = discover(config, progress=_Lines(bar))
    if args.json:
        print(json.dumps(summary, indent=1, sort_keys=True))
    else:
        _print_summary(summary, config)
    return 0


class _Lines:
    """The stream :func:`kdsl.discover.loop.discover` writes its events to, turned into notes above
    the bar, with the latest as the bar's ``doing`` field (so a plain periodic line says what the run is
    busy with: measuring the baseline, searching, training a candidate)."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.evaluated = 0

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                self.evaluated += line.startswith("evaluated ")
                self.bar.note(line)
                self.bar.update(0, evaluated=self.evaluated, doing=line.split(":")[0][:40])
        return len(text)

    def flush(self) -> None:
        """Nothing is buffered here (the bar writes its own stream)."""


def _print_summary(summary: dict[str, Any], config: DiscoverConfig) -> None:
    """The run's answer at a glance: the summary sentences, the top of the ranking, the files."""
    loaded = ranking.load_records(config.db) if Path(config.db).is_file() else None
    print(f"kdsl discover: {summary['evaluated']} candidates evaluated, {summary['screened']} screened")
    if loaded is not None:
        records, baseline = loaded
        accuracy = baseline.get("accuracy") or 0.0
        ranked = ranking.rank(records, baseline_accuracy=accuracy, margin=config.margin)
        # the summary's sentences are lines of their own: printable() alone shows each break as a literal \\n
        summary_text = discovery.summary(records, baseline_accuracy=accuracy, margin=config.margin)
        print(printable(summary_text, keep_newlines=True))
        print(discovery.text_table(ranked[: config.top], baseline, margin=config.margin))
    where = f"pages in {printable(summary['pages'])}, plot {printable(summary['plot'])}"
    print(f"report: {printable(summary['table'])} ({where})")
    print(f"all results: kdsl results --db {printable(config.db)}")


def _strategies(text: str) -> str:
    """argparse type of ``--strategy``: a comma-separated list of known strategies."""
    try:
        strategy_sequence(text)
    except KdslError as error:
        raise argparse.ArgumentTypeError(error.message) from None
    return text
