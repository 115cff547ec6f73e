"""``kdsl discover``: the main job's command line (the loop itself is :mod:`kdsl.discover.loop`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kdsl.cli.search_commands import optional_budget, positive_float, positive_int
from kdsl.discover.loop import NETS, DiscoverConfig, discover, strategy_sequence
from kdsl.discover.prescreen import METHODS
from kdsl.lang.errors import KdslError
from kdsl.search.run import STRATEGIES

__all__ = ["add_discover_command"]


def add_discover_command(subparsers: Any) -> None:
    """Register ``kdsl discover``."""
    parser = subparsers.add_parser("discover", help="search, evaluate and rank replacements for a network's convs")
    parser.add_argument("--net", default="proxy-resnet", choices=NETS)
    parser.add_argument(
        "--spec",
        default="conv2d",
        help="what candidates map; the proxy network takes [N, Cin, H, W] -> [N, Cout, H, W] "
        "(conv2d, conv2d_same_channels, or a JSON spec of that shape)",
    )
    parser.add_argument(
        "--max-flops",
        type=optional_budget,
        default="0.5x",
        help="FLOPs budget: a multiple of conv2d's (0.5x), a count (150M), or none; a plain 0.5 is refused",
    )
    parser.add_argument(
        "--min-params",
        type=optional_budget,
        default=DiscoverConfig.min_params,
        help="fewest parameters relative to conv2d (default 0.002x: a depthwise 3x3 conv passes, a per-channel "
        "scale does not), a count, or none; candidates below it are not trained",
    )
    parser.add_argument("--max-depth", type=positive_int, default=6)
    parser.add_argument(
        "--strategy",
        type=_strategies,
        default=DiscoverConfig.strategy,
        help=f"strategies in turn, comma-separated ({', '.join(sorted(STRATEGIES))}); default: known designs "
        f"and their rewrites, then MCTS",
    )
    parser.add_argument("--time-limit", type=positive_float, default=300.0, help="seconds for the whole run")
    parser.add_argument("--db", default="runs.sqlite")
    parser.add_argument("--out", default="out")
    parser.add_argument("--executor", default="local", help="local, ray or ray:ADDRESS")
    parser.add_argument("--workers", type=positive_int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--eval-timeout", type=positive_float, default=240.0, help="seconds per candidate before it is killed"
    )
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
    parser.set_defaults(run=_command)


def _command(args: Any) -> int:
    config = DiscoverConfig(
        net=args.net,
        spec=args.spec,
        max_flops=args.max_flops,
        min_params=args.min_params,
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
    )
    summary = discover(config)
    print(json.dumps(summary, indent=1))
    return 0


def _strategies(text: str) -> str:
    """argparse type of ``--strategy``: a comma-separated list of known strategies."""
    try:
        strategy_sequence(text)
    except KdslError as error:
        raise argparse.ArgumentTypeError(error.message) from None
    return text
