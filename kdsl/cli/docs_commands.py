"""``kdsl docs build``: the docs site (guide, API reference, gallery) as one static folder.

The API reference reads the public modules below with :mod:`inspect`; this is the one place that
imports them all (the cli is the top layer), and a module whose library is missing (torch, TVM,
Hypothesis) is listed as not imported instead of failing the build. Nothing is measured: the gallery's
pages show the latencies and rediscovery records kept in the gallery folder.

>>> args = build_docs_parser().parse_args(["build", "--out", "site"])
>>> args.out, args.run is command_docs
('site', True)
"""

from __future__ import annotations

import argparse
import importlib
import json
import typing
from pathlib import Path
from types import ModuleType

from kdsl import gallery
from kdsl.gallery.docs_site import site_folder, write_docs
from kdsl.gallery.pages import gallery_entries, load_latencies, load_rediscovery
from kdsl.gallery.reference import api_html
from kdsl.lang.errors import KdslError, printable

__all__ = ["API_MODULES", "add_docs_command", "build_docs_parser", "command_docs", "guide_folder"]

#: the modules the API reference documents, in reading order (each one's ``__all__``)
API_MODULES = (
    "kdsl",
    "kdsl.lang",
    "kdsl.solve",
    "kdsl.codegen.reference",
    "kdsl.codegen.torch",
    "kdsl.codegen.tvm",
    "kdsl.nn",
    "kdsl.search",
    "kdsl.discover.loop",
    "kdsl.tune",
    "kdsl.gallery",
    "kdsl.testing.strategies",
)


def guide_folder() -> Path:
    """``docs/guide`` of the checkout kdsl runs from (the guide is not installed with the package)."""
    folder = Path(__file__).resolve().parents[2] / "docs" / "guide"
    if not folder.is_dir():
        raise KdslError(f"no guide pages at {folder}: kdsl docs build runs from a checkout of kdsl (pip install -e .)")
    return folder


def _modules() -> tuple[list[ModuleType], dict[str, str]]:
    modules, missing = [], {}
    for name in API_MODULES:
        try:
            modules.append(importlib.import_module(name))
        except ImportError as error:  # an optional library (torch, tvm, hypothesis) is not installed
            missing[name] = f"not imported ({error}); install kdsl[dev] to document it"
    return modules, missing


def command_docs(args: argparse.Namespace) -> int:
    """Build the site into ``--out`` and print the path of its index."""
    out = site_folder(args.out)
    recorded = gallery.directory() / "latencies.json"
    batch = json.loads(recorded.read_text()).get("batch", 1) if recorded.is_file() else 1
    entries = gallery_entries(
        load_latencies(recorded, batch), load_rediscovery(gallery.directory() / "rediscovery.json")
    )
    modules, missing = _modules()
    index = write_docs(out, guide_folder(), api_html(modules, missing), entries, batch=batch)
    pages = len(list(out.rglob("*.html")))
    print(f"wrote {pages} pages: {printable(str(index))}")
    return 0


def _add_build(kinds: typing.Any) -> None:
    build = kinds.add_parser("build", help="write the guide, the API reference and the gallery as one site")
    build.add_argument("--out", default="out/docs", help="folder for the site (its index.html)")
    build.set_defaults(run=command_docs)


def add_docs_command(commands: typing.Any) -> None:
    """``kdsl docs build --out DIR``."""
    docs = commands.add_parser("docs", help="the docs site: guide, API reference and gallery")
    kinds = docs.add_subparsers(dest="docs", required=True, metavar="ACTION", help="(kdsl docs ACTION --help)")
    _add_build(kinds)


def build_docs_parser() -> argparse.ArgumentParser:
    """A parser of ``kdsl docs`` alone (what the docstring's example and the tests read)."""
    parser = argparse.ArgumentParser(prog="kdsl docs")
    kinds = parser.add_subparsers(dest="docs", required=True)
    _add_build(kinds)
    return parser
