"""The ``kdsl`` command.

    kdsl show NAME|FILE            DSL text, shapes, constraints, MACs/params formulas
    kdsl show --db PATH HASH       the same for a candidate of a search results database
    kdsl search SPEC|--spec SPEC --layers resnet18 [--set K=3] --strategy enumerate|random|mcts --max-depth D
    kdsl results [--db runs.sqlite] [--top K] [--json]
    kdsl check NAME|FILE --layers resnet18|FILE.json [--set K=3] [--pad] [--max-macs 0.5x]
    kdsl gallery [list|build|rediscover|add]   the operators; their pages; search's rediscovery records
    kdsl tune OP --layers conv3_x [conv4_x ...] --tuner opevo|gensor|alt|metaschedule --trials N [--out K.so]
    kdsl tune OP --layers LAYER ... --apply [--out K.so]   each layer's best record: its schedule, built
    kdsl discover --net proxy-resnet --spec conv2d --max-macs 0.5x --time-limit S --out DIR
    kdsl bench codegen|lowering|network|search|proxy|prescreen|tune|peak  ratios measured side by side
    kdsl demo                      a tour of the gallery on ResNet-18's layers
    kdsl docs build --out DIR      the docs site: guide, API reference and gallery

One word for one thing in every command: ``--spec``, ``--layers``, ``--set``, ``--db`` (always optional:
``runs.sqlite`` for search results, ``tune.db`` for tuning records), ``--time-limit`` (seconds),
``--seed``, ``--runs``, ``--out``, ``--json``. An operator is named by a gallery name (``conv2d``), a
``.dsl`` file, or a ``.json`` file. Every count is in MACs (multiply-accumulates, as
:func:`kdsl.solve.cost` counts under ``"macs"``; a branching kernel's element-wise operations count one
each); ``--max-macs`` budgets are in the same unit (``--max-flops`` is the same option).
tests/test_cli_vocabulary.py reads every command's ``--help`` and the README's list against this parser.
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from collections.abc import Sequence

from kdsl import __version__
from kdsl.bench import backends as codegen_bench
from kdsl.bench import costmodel_bench, lowering_bench, network_bench, peak_bench, proxy_bench, tune_suite_bench
from kdsl.bench.argument_types import budget
from kdsl.cli import search_commands, tune_commands
from kdsl.cli.discover_commands import add_discover_command
from kdsl.cli.docs_commands import add_docs_command
from kdsl.cli.gallery_commands import add_gallery_commands
from kdsl.cli.operator_commands import command_check, command_demo, command_show, load_operator
from kdsl.lang.errors import KdslError, printable

__all__ = ["build_parser", "load_operator", "main"]


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Help that shows each option's default (``(default: resnet18)``) where it has one that says
    something: not for flags (False) or options that are off unless given (None)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" not in text  # a help that already says its default (in its own words) is left alone
            and default is not None
            and default is not False  # identity: a default of 0 (--seed) is shown, a flag's False is not
            and default != []  # a repeatable option given no times: nothing to show
            and default != argparse.SUPPRESS
            and not isinstance(action, argparse._VersionAction)
            and (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
        ):
            shown = " ".join(map(str, default)) if isinstance(default, list) else "%(default)s"
            text += f" (default: {shown})"
        return text


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit code 2) like every other error;
    subcommands' parsers are of this class too (argparse gives them the parent's class), and all
    show defaults in their help."""

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {printable(message)} (see `{self.prog} --help`)\n")


def _describe_commands(parser: argparse.ArgumentParser) -> None:
    """Give every command's own ``--help`` a description: its one-line help from the list above it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, subparser in action.choices.items():
                if subparser.description is None and helps.get(name):
                    subparser.description = helps[name]
                _describe_commands(subparser)


def _add_show(commands: typing.Any) -> None:
    """``kdsl show``: an operator's DSL, shapes, constraints and cost formulas."""
    show = commands.add_parser("show", help="print an operator's DSL, shapes, constraints and cost formulas")
    show.add_argument("operator", help="gallery name, .dsl file or .json file (with --db: a candidate's hash)")
    show.add_argument("--svg", metavar="FILE", help="also draw the primitive graph as SVG")
    show.add_argument("--db", help="read the operator from this search results database (give its hash)")
    show.add_argument("--json", action="store_true", help="print the operator, constraints and cost formulas as JSON")
    show.add_argument("--target", choices=("cuda",), help="print the kernel's generated source for this target")
    show.add_argument("--layers", help="the layer to generate source for (with --target): LAYER or TABLE:LAYER")
    show.add_argument("--layer", dest="layers", help=argparse.SUPPRESS)  # the old spelling
    show.add_argument("--arch", default="sm_90", help="the CUDA architecture (with --target cuda)")
    show.set_defaults(run=command_show)


def _add_check(commands: typing.Any) -> None:
    """``kdsl check``: an operator on a table of layers."""
    check = commands.add_parser("check", help="check an operator on a table of layers")
    check.add_argument("operator", help="gallery name, .dsl file or .json file")
    check.add_argument("--layers", default="resnet18", help="built-in table (resnet18, resnet18_stride2) or JSON file")
    check.add_argument(
        "--set",
        action="append",
        metavar="NAME=INT",
        help="coefficient values, e.g. --set K=3,G=32 (default: the layer's, else the operator's)",
    )
    check.add_argument(
        "--max-macs",
        "--max-flops",
        dest="max_flops",
        type=budget,
        metavar="BUDGET",
        help="fill free widths to this budget of MACs (1e9, 150M, 0.5x); --max-flops is the same option",
    )
    check.add_argument("--max-params", type=budget, metavar="BUDGET", help="fill free widths to this parameter budget")
    check.add_argument("--baseline", default="conv2d", help="gallery operator that relative budgets (0.5x) refer to")
    check.add_argument("--pad", action="store_true", help="round sizes that do not divide up (zero padding), per layer")
    check.add_argument(
        "--solve",
        action="store_true",
        help="also list the coefficient values valid on every layer (divisors of the layers' gcds, window "
        "ranges); --set pins a coefficient",
    )
    check.add_argument("--json", action="store_true", help="print the shapes and costs as JSON instead of a table")
    check.set_defaults(run=command_check)


def _add_search_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-depth", type=int, default=6, help="most primitives per operator")
    parser.add_argument(
        "--time-limit",
        "--seconds",
        dest="seconds",
        metavar="SECONDS",
        type=float,
        default=60.0,
        help="seconds per measurement; --seconds is the same option",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling strategies")
    parser.add_argument("--json", action="store_true", help="print the rates as JSON instead of lines")


#: ``kdsl bench`` BENCH: (name, help, what registers its arguments, what runs it), in --help's order
BENCHES: tuple[tuple[str, str, typing.Callable[..., None], typing.Callable[..., int]], ...] = (
    (
        "codegen",
        "kdsl->PyTorch and kdsl->TVM against native PyTorch",
        codegen_bench.add_arguments,
        codegen_bench.bench_codegen,
    ),
    (
        "lowering",
        "latency ratio / MACs ratio to conv2d of stored candidates",
        lowering_bench.add_arguments,
        lowering_bench.bench_lowering,
    ),
    (
        "network",
        "ResNet-18 end to end with its stage 3x3 convs replaced: PyTorch and TVM, against conv2d",
        network_bench.add_arguments,
        network_bench.bench_network,
    ),
    (
        "search",
        "enumeration and sampling rates (conv2d spec)",
        _add_search_bench_arguments,
        search_commands.bench_search,
    ),
    (
        "proxy",
        "the accuracy proxy's seed-to-seed spread against operators' gaps",
        proxy_bench.add_arguments,
        proxy_bench.bench_proxy,
    ),
    (
        "prescreen",
        "how well cheap scores predict the proxy accuracy (Spearman)",
        proxy_bench.add_prescreen_arguments,
        proxy_bench.bench_prescreen,
    ),
    (
        "tune",
        "schedule tuners side by side against PyTorch (--suite: the papers' suites, several runs)",
        tune_suite_bench.add_arguments,
        tune_suite_bench.bench_tune,
    ),
    (
        "peak",
        "this machine's measured FMA peak and memory bandwidth, beside the assumed figures",
        peak_bench.add_arguments,
        peak_bench.bench_peak,
    ),
    (
        "costmodel",
        "collect tuning records across operators (--collect) and score the cross-operator cost model held out",
        costmodel_bench.add_arguments,
        costmodel_bench.bench_costmodel,
    ),
)


def _add_bench(commands: typing.Any) -> None:
    """``kdsl bench``: the benchmarks, each printing ratios measured side by side."""
    bench = commands.add_parser("bench", help="benchmarks that print ratios measured side by side")
    bench_kinds = bench.add_subparsers(dest="bench", required=True, metavar="BENCH", help="(kdsl bench BENCH --help)")
    for name, help_text, add_arguments, run in BENCHES:
        parser = bench_kinds.add_parser(name, help=help_text)
        add_arguments(parser)
        parser.set_defaults(run=run)


def build_parser() -> argparse.ArgumentParser:
    """The ``kdsl`` argument parser: one vocabulary across commands (``--layers``, ``--set``,
    ``--db``, ``--out``, ``--seed``, ``--json``), defaults shown in every ``--help``.

    >>> args = build_parser().parse_args(["search", "conv2d", "--set", "K=3", "--db", "r.db"])
    >>> args.coefficient, args.layers
    (['K=3'], 'resnet18')
    """
    parser = _Parser(
        prog="kdsl",
        description="kdsl: a DSL for neural tensor operators. An operator is named by a gallery name "
        "(conv2d), a .dsl file or a .json file; costs are counted in multiply-accumulates (MACs).",
    )
    parser.add_argument("--version", action="version", version=f"kdsl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="(kdsl COMMAND --help)")

    _add_show(commands)
    _add_check(commands)
    add_gallery_commands(commands)
    _add_bench(commands)
    search_commands.add_search_commands(commands)
    tune_commands.add_tune_commands(commands)
    add_discover_command(commands)
    add_docs_command(commands)
    demo = commands.add_parser("demo", help="a tour of kdsl")
    demo.set_defaults(run=command_demo)
    _describe_commands(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kdsl`` console script.

    Every error on bad input (a :class:`KdslError`) is one line on stderr and exit code 2; Ctrl-C is
    one line and exit code 130. ``KDSL_DEBUG=1`` shows the traceback instead."""
    debug = os.environ.get("KDSL_DEBUG") == "1"
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except KdslError as error:
        if debug:
            raise
        # the message only (no quoted context), escaped: it may quote names read from a database
        print(f"error: {printable(error.message)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        # only the resumable commands have something to keep
        db = getattr(args, "db", None) if getattr(args, "command", None) in ("search", "discover", "tune") else None
        kept = f"; what was committed to {printable(db)} is kept and the same command resumes" if db else ""
        print(f"interrupted{kept}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kdsl show x | head`
        # point stdout at /dev/null so that flushing it at exit does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
