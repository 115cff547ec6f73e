"""The ``kdsl`` command.

    kdsl show NAME|FILE            DSL text, shapes, constraints, FLOPs/params formulas
    kdsl show --db PATH HASH       the same for a candidate of a search results database
    kdsl search SPEC --layers resnet18 --strategy enumerate|random|mcts --max-depth D --db PATH
    kdsl results --db PATH [--top K] [--json]
    kdsl bench search
    kdsl check NAME|FILE --layers resnet18|FILE.json [--set K=3]
    kdsl gallery list|build|rediscover   the operators; their pages; search's rediscovery records
    kdsl bench codegen [--layers resnet18] [--batch 8] [--ops conv2d ...]
    kdsl tune OP --layer NAME --tuner opevo|gensor|alt|metaschedule --trials N --db PATH
    kdsl bench tune [--trials N] [--quick]
    kdsl discover --net proxy-resnet --spec conv2d --max-flops 0.5x --time-limit S --db F --out DIR
    kdsl demo                      a tour of the gallery on ResNet-18's layers

An operator is named by a gallery name (``conv2d``), a ``.dsl`` file, or a ``.json`` file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kdsl.lang.build import Operator
from kdsl.lang.errors import KdslError, ParseError


def load_operator(ref: str, db: str | None = None) -> Operator:
    """An operator from a gallery name, a DSL file, a JSON file, or (with ``db``) the canonical
    hash (or a unique prefix of it) of a candidate in a search results database."""
    if db is not None:
        return _from_results(ref, db)
    from kdsl import gallery
    from kdsl.lang.parser import parse
    from kdsl.lang.serialize import from_json

    path = Path(ref)
    if path.suffix in (".dsl", ".py", ".json") or path.exists():
        if not path.is_file():
            raise ParseError(f"no such file: {ref}")
        text = path.read_text()
        return from_json(text) if path.suffix == ".json" else parse(text)
    return gallery.load(ref)


def _from_results(key: str, db: str) -> Operator:
    import sqlite3

    from kdsl.lang.parser import parse

    if not Path(db).is_file():
        raise KdslError(f"no results database at {db}")
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = connection.execute("SELECT key, dsl FROM candidates WHERE key LIKE ?", (key + "%",)).fetchall()
    except sqlite3.Error as error:
        raise KdslError(f"{db} is not a kdsl results database: {error}") from None
    finally:
        connection.close()
    if len(rows) != 1:
        found = "no candidate" if not rows else f"{len(rows)} candidates"
        raise KdslError(f"{found} in {db} has a key starting with {key!r}; give more of the hash")
    return parse(rows[0][1])


def _parse_assignments(items: Sequence[str] | None) -> dict[str, int]:
    values: dict[str, int] = {}
    for item in items or ():
        for part in item.split(","):
            name, sep, value = part.partition("=")
            if not sep or not value.strip().lstrip("-").isdigit():
                raise KdslError(f"--set expects NAME=INT (like K=3), got {part!r}")
            values[name.strip()] = int(value)
    return values


def _formula_lines(op: Operator) -> list[str]:
    from kdsl import solve

    formulas = solve.cost(op)
    return [f"  {key:<13}{formulas[key]}" for key in ("flops", "params", "input", "output") if key in formulas]


def command_show(args: argparse.Namespace) -> int:
    from kdsl import solve

    op = load_operator(args.operator, args.db)
    print(op.to_dsl(), end="")
    print()
    print("shapes:")
    print(f"  input        [{', '.join(f'{d.name}: {d.size}' for d in op.inputs)}]")
    print(f"  output       [{', '.join(f'{d.name}: {d.size}' for d in op.outputs)}]")
    for weight in op.weights:
        dims = ", ".join(f"{d.name}: {d.size}" for d in weight.dims)
        print(f"  weight {weight.name:<6}[{dims}]")
    constraints = solve.constraints(op)
    if constraints:
        print("constraints:")
        for constraint in constraints:
            print(f"  {constraint.description}")
    print("cost (multiply-accumulates, weights' elements):")
    for line in _formula_lines(op):
        print(line)
    print("loop nest (the stage plan at a reference size):")
    from kdsl.codegen.render import loop_nest, svg

    for line in loop_nest(op).splitlines():
        print(f"  {line}")
    print(f"key: {op.key}")
    if args.svg:
        Path(args.svg).write_text(svg(op))
        print(f"wrote {args.svg}")
    return 0


def command_check(args: argparse.Namespace) -> int:
    from kdsl import solve

    op = load_operator(args.operator)
    layers = solve.load_layers(args.layers)
    coefficients = {**op.default_coefficients, **_parse_assignments(args.set)}
    solve.check(op, layers, coefficients=coefficients)
    print(f"{args.operator}: valid on all {len(layers)} layers of {args.layers}", end="")
    used = {k: v for k, v in coefficients.items() if k in op.coefficient_variables}
    print(f" with {', '.join(f'{k}={v}' for k, v in sorted(used.items()))}" if used else "")
    header = f"  {'layer':<12}{'input':>22}{'output':>22}{'M MACs':>12}{'params':>12}"
    print(header)
    for layer in layers:
        binding = {**dict(layer.values), **coefficients}
        shapes = solve.shapes(op, binding)
        costs = solve.cost(op, binding)
        print(
            f"  {layer.name:<12}{list(shapes['input'])!s:>22}{list(shapes['output'])!s:>22}"
            f"{costs['flops'] / 1e6:>12.2f}{costs['params']:>12}"
        )
    return 0


def command_gallery(args: argparse.Namespace) -> int:
    from kdsl import gallery

    if args.action == "rediscover":
        import json

        from kdsl.bench.rediscover import REDISCOVERY, SLOW, rediscover

        out = Path(args.out) if args.out else gallery.directory()
        records = {}
        for name in sorted(REDISCOVERY):
            if args.skip_slow and name in SLOW:
                continue
            records[name] = rediscover(name)
            found = records[name]
            text = f"depth {found.get('depth')}, {found['seconds']:.2f} s" if found["found"] else "not found"
            print(f"{name:<28}{text}")
        (out / "rediscovery.json").write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
        print(f"wrote {out / 'rediscovery.json'}")
        return 0
    if args.action == "build":
        from kdsl.bench.backends import gallery_latencies
        from kdsl.gallery.pages import build_gallery, load_rediscovery

        out = Path(args.out) if args.out else gallery.directory()
        records = load_rediscovery(out / "rediscovery.json")
        latencies = None if args.no_measure else gallery_latencies(gallery.names(), args.batch)
        written = build_gallery(out, latencies=latencies, batch=args.batch, rediscovery=records)
        print(f"wrote {written / 'README.md'} and {len(gallery.names())} pages in {written / 'pages'}")
        return 0
    for name in gallery.names():
        summary = gallery.describe(name).strip().splitlines()
        print(f"{name:<28}{summary[0] if summary else ''}")
    return 0


def command_demo(args: argparse.Namespace) -> int:
    from kdsl import gallery, solve

    print("kdsl tour: every gallery operator, checked on ResNet-18's layers with its default coefficients")
    print("(stride-1 3x3 layers: table resnet18; operators that halve the image: table resnet18_stride2)\n")
    for name in gallery.names():
        op = gallery.load(name)
        print(f"== {name}  (key {op.key})")
        for line in gallery.describe(name).strip().splitlines()[:1]:
            print(f"   {line}")
        table = gallery.layer_table(name)
        if table is None:
            print("   not valid on the ResNet-18 tables with its defaults")
        else:
            layers = solve.load_layers(table)
            macs = sum(solve.cost(op, layer)["flops"] for layer in layers)
            params = sum(solve.cost(op, layer)["params"] for layer in layers)
            defaults = ", ".join(f"{k}={v}" for k, v in op.defaults) or "no coefficients"
            print(
                f"   valid on the {len(layers)} layers of {table} ({defaults}): "
                f"{macs / 1e6:.1f} M MACs, {params} params"
            )
        for line in _formula_lines(op)[:2]:
            print(f" {line}")
        print()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kdsl", description="kdsl: a DSL for neural tensor operators")
    commands = parser.add_subparsers(dest="command", required=True)

    show = commands.add_parser("show", help="print an operator's DSL, shapes, constraints and cost formulas")
    show.add_argument("operator", help="gallery name, .dsl file or .json file")
    show.add_argument("--svg", metavar="FILE", help="also draw the primitive graph as SVG")
    show.add_argument("--db", help="read the operator from this search results database (give its hash)")
    show.set_defaults(run=command_show)

    check = commands.add_parser("check", help="check an operator on a table of layers")
    check.add_argument("operator", help="gallery name, .dsl file or .json file")
    check.add_argument("--layers", default="resnet18", help="built-in table (resnet18, resnet18_stride2) or JSON file")
    check.add_argument("--set", action="append", metavar="NAME=INT", help="coefficient values, e.g. --set K=3,G=32")
    check.set_defaults(run=command_check)

    gallery = commands.add_parser("gallery", help="the gallery of named operators")
    gallery.add_argument("action", choices=["list", "build", "rediscover"], nargs="?", default="list")
    gallery.add_argument("--skip-slow", action="store_true", help="rediscover: skip syno_op1 (minutes)")
    gallery.add_argument("--out", help="folder for README.md and pages/ (default: the gallery folder)")
    gallery.add_argument("--no-measure", action="store_true", help="skip the latency measurements")
    gallery.add_argument("--batch", type=int, default=1, help="batch size of the latency measurements")
    gallery.set_defaults(run=command_gallery)

    bench = commands.add_parser("bench", help="benchmarks that print ratios measured side by side")
    bench_kinds = bench.add_subparsers(dest="bench", required=True)
    from kdsl.bench import backends as codegen_bench

    codegen = bench_kinds.add_parser("codegen", help="kdsl->PyTorch and kdsl->TVM against native PyTorch")
    codegen_bench.add_arguments(codegen)
    codegen.set_defaults(run=codegen_bench.bench_codegen)

    search_bench = bench_kinds.add_parser("search", help="enumeration and sampling rates (conv2d spec)")
    search_bench.add_argument("--max-depth", type=int, default=6)
    search_bench.add_argument("--seconds", type=float, default=60.0, help="time per measurement")
    search_bench.add_argument("--seed", type=int, default=0)
    search_bench.add_argument("--json", action="store_true")
    from kdsl.cli import search_commands

    search_bench.set_defaults(run=search_commands.bench_search)
    search_commands.add_search_commands(commands)

    from kdsl.cli import tune_commands

    tune_bench = bench_kinds.add_parser("tune", help="schedule tuners side by side against PyTorch")
    tune_commands.add_bench_arguments(tune_bench)
    tune_bench.set_defaults(run=tune_commands.bench_tune)
    tune_commands.add_tune_commands(commands)

    from kdsl.discover.loop import add_discover_command

    add_discover_command(commands)

    demo = commands.add_parser("demo", help="a tour of kdsl")
    demo.set_defaults(run=command_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kdsl`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KdslError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `kdsl show x | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
