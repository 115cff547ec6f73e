"""``kdsl gallery``: its sub-commands, each with its own parser and ``--help`` (``list``, ``build``,
``rediscover``, ``add``); ``kdsl gallery`` alone lists the operators.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="kdsl")
>>> add_gallery_commands(parser.add_subparsers(dest="command"))
>>> args = parser.parse_args(["gallery", "rediscover", "conv2d", "--time-limit", "60"])
>>> args.name, args.time_limit, args.run.__name__
('conv2d', 60.0, 'command_rediscover')
>>> parser.parse_args(["gallery"]).run.__name__
'command_list'
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from kdsl import gallery
from kdsl.bench.argument_types import RESULTS_DB, positive_float, positive_int
from kdsl.bench.backends import gallery_latencies
from kdsl.bench.rediscover import REDISCOVERY, SLOW, SLOW_RESTRICTED, rediscover
from kdsl.bench.rediscover import TIME_LIMIT as REDISCOVERY_TIME_LIMIT
from kdsl.discover import ranking
from kdsl.gallery.content import first_sentence
from kdsl.gallery.pages import build_gallery, load_rediscovery
from kdsl.lang.errors import KdslError, printable
from kdsl.lang.parser import parse
from kdsl.runtime.progress import Progress
from kdsl.search.store import Store

__all__ = ["add_gallery_commands", "command_add", "command_build", "command_list", "command_rediscover"]

_OUT = "folder for README.md, pages/, site/ and rediscovery.json (default: the gallery folder)"


def add_gallery_commands(commands: Any) -> None:
    """Register ``kdsl gallery`` and its sub-commands."""
    parser = commands.add_parser("gallery", help="the gallery of named operators: list, build, rediscover, add")
    parser.set_defaults(run=command_list)  # `kdsl gallery` alone: the list
    actions = parser.add_subparsers(dest="action", metavar="ACTION", help="(kdsl gallery ACTION --help)")

    listing = actions.add_parser("list", help="the operators, each with its first sentence")
    listing.set_defaults(run=command_list)

    build = actions.add_parser("build", help="write the gallery's README.md, a page per operator and the website")
    build.add_argument("--out", metavar="DIR", help=_OUT)
    build.add_argument("--no-measure", action="store_true", help="skip the latency measurements")
    build.add_argument("--batch", type=positive_int, default=1, help="batch size of the latency measurements")
    build.set_defaults(run=command_build)

    again = actions.add_parser(
        "rediscover", help="record when enumeration of each operator's default space finds it (CPU seconds)"
    )
    again.add_argument("name", nargs="?", help="only this operator (default: every rediscovery target)")
    again.add_argument(
        "--time-limit",
        type=positive_float,
        default=REDISCOVERY_TIME_LIMIT,
        metavar="SECONDS",
        help="CPU seconds per operator",
    )
    again.add_argument("--restricted", action="store_true", help="search spaces restricted to each kind (seconds)")
    again.add_argument("--skip-slow", action="store_true", help="skip the operators that take minutes to reach")
    again.add_argument("--out", metavar="DIR", help=_OUT)
    again.set_defaults(run=command_rediscover)

    add = actions.add_parser("add", help="a discovered operator becomes a gallery file, with where it came from")
    add.add_argument("name", help="the new entry's name (a Python identifier)")
    add.add_argument("--key", required=True, help="the candidate's key, or a unique prefix (see kdsl results)")
    add.add_argument("--db", default=RESULTS_DB, help="the search or discovery results database that holds it")
    add.add_argument("--out", metavar="DIR", help="folder to write the file to (default: the gallery folder)")
    add.set_defaults(run=command_add)


def command_list(args: argparse.Namespace) -> int:
    """``kdsl gallery [list]``: every operator's name and first sentence."""
    names = gallery.names()
    column = max([28, *(len(name) + 2 for name in names)])  # a long name never runs into its text
    for name in names:  # the whole first sentence, wrapped under the name
        lines = textwrap.wrap(first_sentence(gallery.describe(name)), 90) or [""]
        print(f"{name:<{column}}{lines[0]}")
        for line in lines[1:]:
            print(" " * column + line)
    return 0


def command_build(args: argparse.Namespace) -> int:
    """``kdsl gallery build``: the gallery's README.md, pages and website."""
    out = Path(args.out) if args.out else gallery.directory()
    # the gallery's own records are the source; a record kept in --out DIR (an earlier build or
    # `gallery rediscover --out DIR`) overrides the gallery's for the same operator
    records = load_rediscovery(gallery.directory() / "rediscovery.json")
    if out.resolve() != gallery.directory().resolve():
        records |= load_rediscovery(out / "rediscovery.json")
    latencies = None if args.no_measure else gallery_latencies(gallery.names(), args.batch)
    written = build_gallery(
        out, latencies=latencies, batch=args.batch, rediscovery=records, recorded=gallery.directory()
    )
    print(f"wrote {written / 'README.md'} and {len(gallery.names())} pages in {written / 'pages'}")
    print(f"wrote the website {written / 'site' / 'index.html'} (open it in a browser)")
    return 0


def command_rediscover(args: argparse.Namespace) -> int:
    """``kdsl gallery rediscover [NAME]``: search's rediscovery records, written to rediscovery.json."""
    out = Path(args.out) if args.out else gallery.directory()
    if args.name is not None and args.name not in REDISCOVERY:
        raise KdslError(
            f"kdsl gallery rediscover: no rediscovery target {printable(args.name)!r}; "
            f"choose from {', '.join(sorted(REDISCOVERY))}"
        )
    names = [args.name] if args.name is not None else sorted(REDISCOVERY)
    if args.skip_slow and args.name is None:
        names = [n for n in names if n not in (SLOW_RESTRICTED if args.restricted else SLOW)]
    records = {}
    # a bar over the operators (a slow one searches for up to --time-limit CPU seconds)
    with Progress("rediscover", total=len(names), unit="operators", stream=sys.stderr) as bar:
        for name in names:
            bar.update(0, searching=name)
            records[name] = found = rediscover(name, args.time_limit, restricted=args.restricted)
            text = (
                f"depth {found.get('depth')}, {found['nodes']} nodes, {found['seconds']:.2f} s ({found['space']} space)"
                if found["found"]
                else f"not found: {found['why']}"
            )
            print(f"{name:<28}{printable(text)}", flush=True)
            bar.update(1, searching="-")
    if args.name is not None:  # one operator: its record replaces its old one, the others stay
        records = load_rediscovery(out / "rediscovery.json") | records
    (out / "rediscovery.json").write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out / 'rediscovery.json'}")
    return 0


def command_add(args: argparse.Namespace) -> int:
    """``kdsl gallery add NAME --key HASH [--db RUNS]``: a discovered operator becomes a gallery file
    whose docstring records where it came from and what it measured."""
    if not Path(args.db).is_file():
        raise KdslError(f"kdsl gallery add: no results database {printable(args.db)}; name one with --db")
    store = Store(args.db, readonly=True)
    try:
        found = store.find(args.key)
        if len(found) != 1:
            what = "no candidate" if not found else f"{len(found)} candidates"
            raise KdslError(f"{what} in {printable(args.db)} has a key starting with {printable(args.key)!r}")
        row = store.get(found[0][0]) or {}
    finally:
        store.close()
    op = parse(row["dsl"])
    evaluated = ranking.load_records(args.db)
    record = next((r for r in evaluated[0] if r["key"] == row["key"]), {}) if evaluated else {}
    baseline = evaluated[1] if evaluated else {}
    provenance = {
        "key": row["key"],
        "command": f"kdsl gallery add {args.name} --db {args.db} --key {args.key}",
        "search": f"strategy {row.get('strategy')}, seed {row.get('seed')}, depth {row.get('depth')}",
        "accuracy": record.get("accuracy"),
        "baseline accuracy (conv2d)": baseline.get("accuracy"),
        "latency ratio to conv2d": record.get("latency_ratio"),
        "MACs ratio to conv2d": record.get("flops_ratio"),
        "params": record.get("params"),
    }
    folder = Path(args.out) if args.out else None
    written = gallery.add(op, args.name, provenance, folder)
    print(f"wrote {printable(str(written))}; kdsl gallery build adds its page")
    return 0
