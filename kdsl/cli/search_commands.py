"""Command-line handlers for search: ``kdsl search``, ``kdsl results`` and ``kdsl bench search``.

``kdsl/cli.py`` registers them with :func:`add_search_commands` (and calls :func:`bench_search`
for ``kdsl bench search``).

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="kdsl")
>>> add_search_commands(parser.add_subparsers(dest="command"))
>>> args = parser.parse_args(["search", "conv2d", "--max-depth", "4", "--db", "r.db"])
>>> args.strategy, args.max_depth, args.layers
('enumerate', 4, 'resnet18')
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kdsl.bench.argument_types import RESULTS_DB, budget, positive_float, positive_int
from kdsl.bench.search_throughput import run_bench
from kdsl.discover import ranking
from kdsl.discover import report as discovery
from kdsl.lang.errors import SearchError, printable
from kdsl.search.run import STRATEGIES, search
from kdsl.search.space import Space
from kdsl.search.store import Store

__all__ = [
    "add_search_commands",
    "bench_search",
    "command_results",
    "command_search",
    "space_from_args",
    "spec_from_args",
]


def _coefficients(items: list[str] | None) -> dict[str, Any] | None:
    if not items:
        return None
    found: dict[str, Any] = {}
    for item in items:
        name, sep, values = item.partition("=")
        allowance = None
        if ":" in values:
            values, _, text = values.partition(":")
            if not text.strip().isdigit():
                raise SearchError(f"--set {item!r}: the allowance after ':' must be an integer")
            allowance = int(text)
        parts = [v.strip() for v in values.split(",") if v.strip()]
        if sep and name.strip() and parts == ["solve"]:
            # the values come from the layers (kdsl.search.space.Space._solved_values)
            found[name.strip()] = (None, allowance) if allowance is not None else None
            continue
        if not sep or not name.strip() or not parts or not all(p.isdigit() for p in parts):
            raise SearchError(
                f"--set expects NAME=V1,V2[:ALLOWANCE] or NAME=solve (like K=3, G=2,4:3 or G=solve), got {item!r}"
            )
        ints = [int(p) for p in parts]
        found[name.strip()] = (ints, allowance) if allowance is not None else ints
    return found


def _caps(items: list[str] | None) -> dict[str, int] | None:
    if not items:
        return None
    caps: dict[str, int] = {}
    for item in items:
        for part in item.split(","):
            name, sep, value = part.partition("=")
            if not sep or not value.strip().isdigit():
                raise SearchError(f"--cap expects KIND=INT (like Share=2), got {part!r}")
            caps[name.strip()] = int(value)
    return caps


def spec_from_args(args: argparse.Namespace) -> str:
    """``kdsl search``'s spec: the positional SPEC or ``--spec SPEC`` (kdsl discover's spelling), one of
    them, the same if both.

    >>> import argparse
    >>> spec_from_args(argparse.Namespace(spec=None, spec_option="matmul"))
    'matmul'
    >>> spec_from_args(argparse.Namespace(spec="conv2d", spec_option="matmul"))
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.SearchError: kdsl search got two specs, conv2d and --spec matmul; give one
    """
    positional, option = args.spec, getattr(args, "spec_option", None)
    if positional is not None and option is not None and positional != option:
        raise SearchError(
            f"kdsl search got two specs, {printable(positional)} and --spec {printable(option)}; give one"
        )
    spec = positional if positional is not None else option
    if spec is None:
        raise SearchError("kdsl search needs a spec: kdsl search conv2d, or --spec conv2d (or a JSON spec file)")
    return spec


def space_from_args(args: argparse.Namespace):
    """The :class:`~kdsl.search.space.Space` the command-line arguments describe."""
    return Space(
        spec_from_args(args),
        args.layers,
        coefficients=_coefficients(args.coefficient),
        max_depth=args.max_depth,
        caps=_caps(args.cap),
        max_flops=args.max_flops,
        max_params=args.max_params,
        min_params=args.min_params,
        min_flops=args.min_flops,
        reductions=args.reduction or None,
        equal_variables=not args.spec_outputs_only,
    )


def command_search(args: argparse.Namespace) -> int:
    """``kdsl search SPEC ...``: run (or resume) a search and store its results."""
    space = space_from_args(args)
    report = search(
        space,
        args.strategy,
        db=args.db,
        seed=args.seed,
        time_limit=args.time_limit,
        max_results=args.max_results,
        progress=None if args.json or args.quiet else sys.stderr,
    )
    summary = report.as_dict() | {"space": space.describe(), "db": args.db}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        state = "finished" if report.finished else "stopped (run the same command to resume)"
        print(printable(space.describe()))  # a spec file's names are untrusted text
        print(
            f"{args.strategy} {state}: {report.nodes} nodes in {report.seconds:.1f}s, {len(report.found)} distinct "
            f"operators ({report.new} new, {report.valid} valid) -> {printable(args.db)}"
        )
    return 0


def command_results(args: argparse.Namespace) -> int:
    """``kdsl results --db PATH``: the best stored candidates (the database is opened read-only).

    On a database that ``kdsl discover`` evaluated, the candidates are ranked as its
    ``results.md`` ranks them (:func:`kdsl.discover.ranking.rank`), with each one's verdict and what
    it is; ``--json`` prints the same rows with the same fields (:func:`kdsl.discover.report.table_rows`)."""
    evaluated = ranking.load_records(args.db)
    if evaluated is not None:
        records, baseline = evaluated
        accuracy = baseline.get("accuracy") or 0.0
        ranked = ranking.rank(records, baseline_accuracy=accuracy, margin=args.margin)
        if args.json:  # the table's rows and fields (discovery.COLUMNS), as JSON
            counts = ranking.family_counts(records, baseline_accuracy=accuracy, margin=args.margin)
            print(
                json.dumps(
                    {
                        "baseline": baseline,
                        "columns": list(discovery.COLUMNS),
                        "families": counts,
                        "table": discovery.table_rows(ranked[: args.top], baseline, margin=args.margin),
                    },
                    sort_keys=True,
                    default=str,
                )
            )
            return 0
        # escaped line by line: the summary's own line breaks stay line breaks
        for line in discovery.summary(records, baseline_accuracy=accuracy, margin=args.margin).splitlines():
            print(printable(line))
        print(discovery.text_table(ranked[: args.top], baseline, margin=args.margin))
        return 0
    store = Store(args.db, readonly=True)
    try:
        rows = store.top(args.top, status=None if args.all else "valid")
        counts = store.counts()
    finally:
        store.close()
    if args.json:
        # json.dumps writes control characters as \u escapes: the output stays inert
        print(json.dumps({"counts": counts, "top": rows}, sort_keys=True, default=str))
        return 0
    # anything may have written the database: every text from it is escaped before printing
    summary = ", ".join(f"{n} {printable(s)}" for s, n in sorted(counts.items()))
    print(f"{sum(counts.values())} candidates: {summary}")
    if not rows:
        return 0
    # a table first (the store's "flops" column counts multiply-accumulates, as kdsl check prints),
    # then each operator's DSL under its rank
    print(f"\n{'rank':>4}  {'key':<18}{'depth':>6}{'M MACs':>12}{'params':>12}{'reward':>9}  status")
    for rank, row in enumerate(rows, 1):
        macs = f"{row['flops'] / 1e6:.2f}" if row["flops"] is not None else "-"
        params = row["params"] if row["params"] is not None else "-"
        print(
            f"{rank:>4}  {printable(row['key'])[:16]:<18}{row['depth']!s:>6}{macs:>12}{params!s:>12}"
            f"{row['reward'] or 0.0:>9.3f}  {printable(str(row.get('status', '')))}"
        )
    for rank, row in enumerate(rows, 1):
        print(f"\n#{rank}  key {printable(row['key'])}")
        print(printable(row["dsl"].rstrip(), keep_newlines=True))
    return 0


def add_search_commands(subparsers: Any) -> None:
    """Register ``search`` and ``results`` on an argparse subparsers object."""
    search = subparsers.add_parser("search", help="synthesize operators for a spec (resumable)")
    specs = "conv2d, conv2d_stride2, conv2d_same_channels, matmul, or a JSON spec file"
    search.add_argument("spec", nargs="?", help=f"what operators map: {specs} (or --spec, as kdsl discover)")
    search.add_argument("--spec", dest="spec_option", metavar="SPEC", help="the same as the positional SPEC")
    search.add_argument("--layers", default="resnet18", help="layer table: resnet18, resnet18_stride2 or a JSON file")
    search.add_argument("--strategy", choices=sorted(STRATEGIES), default="enumerate", help="how the space is walked")
    search.add_argument("--max-depth", type=positive_int, default=6, help="most primitives per operator")
    search.add_argument(
        "--max-macs",
        "--max-flops",
        dest="max_flops",
        metavar="BUDGET",
        type=budget,
        help="budget of MACs (multiply-accumulates) over all layers: a count (150M, 2G) or a multiple of the "
        "spec's baseline operator (0.5x); a plain number below 1 is refused (write 0.5x); --max-flops is the "
        "same option",
    )
    search.add_argument(
        "--max-params", type=budget, metavar="BUDGET", help="parameter budget (a count or relative, e.g. 0.5x)"
    )
    search.add_argument("--min-params", type=budget, metavar="BUDGET", help="fewest parameters (a count or relative)")
    search.add_argument(
        "--min-macs",
        "--min-flops",
        dest="min_flops",
        metavar="BUDGET",
        type=budget,
        help="fewest MACs (a count or relative, like 0.1x); --min-flops is the same option",
    )
    search.add_argument(
        "--set",
        action="append",
        dest="coefficient",
        metavar="NAME=V1,V2[:ALLOWANCE]",
        help="coefficient values the search may use, e.g. K=3 or G=2,4:3 (as kdsl check's --set, with a list); "
        "G=solve takes every value above 1 that divides a layer size on all layers (a coefficient of the spec's "
        "own sizes, like s in conv2d_stride2, is solved when --set leaves it out)",
    )
    # the old spelling, kept working for scripts that use it
    search.add_argument("--coefficient", action="append", dest="coefficient", help=argparse.SUPPRESS)
    search.add_argument("--cap", action="append", metavar="KIND=INT", help="per-primitive caps, e.g. Share=2,Expand=0")
    search.add_argument("--reduction", action="append", metavar="SIZE", help="allowed reduced sizes, e.g. Cin/G")
    search.add_argument(
        "--spec-outputs-only",
        action="store_true",
        help="only operators that end at the spec's output as written: by default, where every layer binds an "
        "output variable to an input one's value (ResNet's Cout = Cin), operators may also map Cin to Cin "
        "(a depthwise conv for conv2d)",
    )
    search.add_argument(
        "--time-limit", type=positive_float, metavar="SECONDS", help="seconds before stopping (resume later)"
    )
    search.add_argument("--max-results", type=positive_int, help="stop after this many new operators")
    search.add_argument("--seed", type=int, default=0, help="seed of the sampling strategies (a run resumes per seed)")
    search.add_argument(
        "--db",
        default=RESULTS_DB,
        help="SQLite results database (created if missing; kdsl results reads it); one process at a time runs "
        "a given spec, strategy and seed on it, a second one is refused",
    )
    search.add_argument("--json", action="store_true", help="print a JSON summary instead of lines")
    search.add_argument("--quiet", action="store_true", help="no progress on stderr")
    search.set_defaults(run=command_search)

    results = subparsers.add_parser("results", help="the best operators in a results database")
    results.add_argument(
        "--db", default=RESULTS_DB, help="results database of kdsl search or kdsl discover (only read, never written)"
    )
    results.add_argument("--top", type=positive_int, default=10, help="how many candidates to list")
    results.add_argument("--all", action="store_true", help="include invalid and over-budget candidates")
    results.add_argument("--json", action="store_true", help="print the counts and rows as JSON instead of a table")
    results.add_argument(
        "--margin", type=float, default=0.02, help="accuracy margin of a discovery's ranking (as kdsl discover's)"
    )
    results.set_defaults(run=command_results)


def bench_search(args: argparse.Namespace) -> int:
    """``kdsl bench search``: enumeration and sampling rates for the conv2d spec (see
    :mod:`kdsl.bench.search_throughput`)."""
    results = run_bench(
        max_depth=getattr(args, "max_depth", None) or 6,
        seconds=getattr(args, "seconds", None) or 60.0,
        seed=getattr(args, "seed", 0) or 0,
        stream=sys.stderr,
    )
    if getattr(args, "json", False):
        print(json.dumps(results, sort_keys=True))
    else:
        for line in results["lines"]:
            print(line)
    return 0
