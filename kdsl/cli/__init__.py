"""The ``kdsl`` command.

    kdsl show NAME|FILE            DSL text, shapes, constraints, MACs/params formulas
    kdsl show --db PATH HASH       the same for a candidate of a search results database
    kdsl search SPEC --layers resnet18 [--set K=3] --strategy enumerate|random|mcts --max-depth D --db PATH
    kdsl results --db PATH [--top K] [--json]
    kdsl bench search
    kdsl bench proxy [--seeds 3]     the accuracy proxy's noise against gallery and weak operators
    kdsl bench prescreen [--db F]    how well zero-cost scores and a 1-epoch run predict the proxy
    kdsl check NAME|FILE --layers resnet18|FILE.json [--set K=3] [--pad]
    kdsl gallery list|build|rediscover   the operators; their pages; search's rediscovery records
    kdsl bench codegen [--layers resnet18] [--batch 8] [--ops conv2d ...] [--mcpu NAME]
    kdsl bench network [--ops conv2d grouped_conv2d OP[:G=2]] [--batch 1 8] [--db PATH]   ResNet-18 end to end
    kdsl bench lowering --db RUNS [--top N]   latency ratio / MACs ratio to conv2d (median, max)
    kdsl tune OP --layers NAME --tuner opevo|gensor|alt|metaschedule --trials N --db PATH [--out K.so]
    kdsl tune OP --layers NAME --db PATH --apply [--out K.so]   the best record: its schedule, built
    kdsl bench tune [--trials N] [--quick] [--mcpu NAME]   (--mcpu: compile for that LLVM CPU, e.g. haswell)
    kdsl bench costmodel [--collect] [--ops conv2d matmul ...] [--configs 40] [--db costmodel.db]
    kdsl discover --net proxy-resnet --spec conv2d --max-macs 0.5x --time-limit S --db F --out DIR
    kdsl demo                      a tour of the gallery on ResNet-18's layers

An operator is named by a gallery name (``conv2d``), a ``.dsl`` file, or a ``.json`` file. Every count is
in MACs (multiply-accumulates, as :func:`kdsl.solve.cost` counts; a branching kernel's element-wise
operations count one each); ``--max-macs`` budgets are in the same unit (``--max-flops`` is the same option).
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from collections.abc import Sequence

from kdsl import __version__
from kdsl.bench import backends as codegen_bench
from kdsl.bench import costmodel_bench, lowering_bench, network_bench, proxy_bench, tune_suite_bench
from kdsl.bench.argument_types import budget
from kdsl.bench.rediscover import TIME_LIMIT as REDISCOVERY_TIME_LIMIT
from kdsl.cli import search_commands, tune_commands
from kdsl.cli.discover_commands import add_discover_command
from kdsl.cli.operator_commands import command_check, command_demo, command_gallery, command_show, load_operator
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


def _add_gallery(commands: typing.Any) -> None:
    """``kdsl gallery``: list, build, rediscover or add to the gallery."""
    gallery = commands.add_parser("gallery", help="the gallery of named operators")
    gallery.add_argument(
        "action",
        choices=["list", "build", "rediscover", "add"],
        nargs="?",
        default="list",
        help="list the operators, build their pages, rediscover them by search, or add a discovered one",
    )
    gallery.add_argument(
        "name", nargs="?", help="add: the new entry's name (a Python identifier); rediscover: only this operator"
    )
    gallery.add_argument("--db", help="add: the discovery database that holds the candidate")
    gallery.add_argument("--key", help="add: the candidate's key (or a unique prefix)")
    gallery.add_argument(
        "--skip-slow", action="store_true", help="rediscover: skip the operators that take minutes to reach"
    )
    gallery.add_argument(
        "--restricted", action="store_true", help="rediscover: in spaces restricted to each kind (seconds)"
    )
    gallery.add_argument(
        "--time-limit", type=float, default=REDISCOVERY_TIME_LIMIT, help="rediscover: CPU seconds per operator"
    )
    gallery.add_argument(
        "--out", help="folder for README.md, pages/ and the website site/ (default: the gallery folder)"
    )
    gallery.add_argument("--no-measure", action="store_true", help="skip the latency measurements")
    gallery.add_argument("--batch", type=int, default=1, help="batch size of the latency measurements")
    gallery.set_defaults(run=command_gallery)


def _add_search_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-depth", type=int, default=6, help="most primitives per operator")
    parser.add_argument(
        "--time-limit",
        "--seconds",
        dest="seconds",
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
    _add_gallery(commands)
    _add_bench(commands)
    search_commands.add_search_commands(commands)
    tune_commands.add_tune_commands(commands)
    add_discover_command(commands)
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
