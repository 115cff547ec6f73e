"""The library of named operators: the gallery's DSL source files, one per operator.

Each ``gallery/NAME.dsl`` file starts with a docstring that says which PyTorch function the
operator reproduces and how its weights map onto that function's weights. Files are read with
:func:`kdsl.parse`, which never executes them.

>>> "conv2d" in names()
True
>>> op = load("conv2d")
>>> [d.name for d in op.outputs]
['N', 'Cout', 'H', 'W']
>>> describe("conv2d").splitlines()[0]
'2-D convolution, "same" padding.'
"""

from __future__ import annotations

import ast
from pathlib import Path

from kdsl.lang.errors import KdslError, ParseError
from kdsl.lang.operator import Operator
from kdsl.lang.parser import parse
from kdsl.lang.serialize import from_json

__all__ = [
    "SUFFIX",
    "describe",
    "directory",
    "gallery_name",
    "load",
    "load_operator",
    "names",
    "path",
    "source",
]

SUFFIX = ".dsl"


def _candidates() -> list[Path]:
    package = Path(__file__).resolve().parents[1]  # kdsl/
    # a source checkout keeps the gallery at the repository root; an installed package may ship a copy
    return [package.parent / "gallery", package / "gallery_data"]


def directory() -> Path:
    """The folder holding the gallery's ``.dsl`` files.

    >>> directory().name
    'gallery'
    """
    for candidate in _candidates():
        if candidate.is_dir():
            return candidate
    looked = ", ".join(str(c) for c in _candidates())
    raise KdslError(
        f"the gallery folder is missing (looked in {looked}); run kdsl from a source checkout, or "
        f"install a kdsl build that ships gallery_data"
    )


def names() -> list[str]:
    """The gallery's operator names, sorted.

    >>> names()[:3]
    ['alexnet_c1', 'attention_qk', 'avg_pool2d']
    """
    return sorted(p.name[: -len(SUFFIX)] for p in directory().glob(f"*{SUFFIX}") if p.is_file())


def path(name: str) -> Path:
    """The file of the operator ``name``; an unknown name raises ``KdslError`` listing the names.

    >>> path("matmul").name
    'matmul.dsl'
    >>> path("no_such_op")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.KdslError: the gallery has no operator 'no_such_op'; available: alexnet_c1, ...
    """
    available = names()
    if name not in available:  # also keeps names like "../x" from reaching the file system
        raise KdslError(f"the gallery has no operator {name!r}; available: {', '.join(available)}")
    return directory() / f"{name}{SUFFIX}"


def source(name: str) -> str:
    """The DSL source text of the operator ``name``.

    >>> print(source("linear").split('\"\"\"')[2].strip())
    from kdsl.lang import *
    <BLANKLINE>
    N, Cin, Cout = primary("N Cin Cout")
    w = Weight(Cout, Cin, name="w")
    linear = (
        Input(N, Cin)
        >> Share(w)
        >> Reduce(Cin)
        >> Output(N, Cout)
    )
    """
    return path(name).read_text(encoding="utf-8")


def load(name: str) -> Operator:
    """Parse the gallery file of the operator ``name`` (linear, or a branching kernel: max pooling,
    squeeze-excitation, attention, Canvas's kernels).

    >>> load("matmul").weights[0].name
    'w'
    >>> [node.kind for node in load("residual_conv2d").nodes]
    ['Input', 'Chain', 'Rename', 'Blend']
    """
    file = path(name)
    try:
        return parse(file.read_text(encoding="utf-8"))
    except KdslError as error:
        where = f"the gallery file {file}"
        raise error.with_context(f"{where}\n{error.context}" if error.context else where) from None


#: (gallery folder, its modification time) -> design key -> the first gallery name of that design
_NAMES_BY_DESIGN: dict[tuple[str, int], dict[str, str]] = {}


def gallery_name(op: Operator) -> str | None:
    """The name of the gallery operator ``op`` is, at any coefficient values (its
    :attr:`~kdsl.lang.operator.Operator.design_key`), or ``None``: what a generated module's class
    is named after. The gallery is parsed once per process, and again when a file is added or
    removed (the folder's modification time changes); a file that does not parse is skipped.

    >>> gallery_name(load("grouped_conv2d").with_defaults(G=2)), gallery_name(load("max_pool2d"))
    ('grouped_conv2d', 'max_pool2d')
    """
    try:
        folder = directory()
        version = (str(folder), folder.stat().st_mtime_ns)  # one stat per call: builds call this often
    except (KdslError, OSError):
        return None  # no gallery shipped: modules are named from their structure
    found = _NAMES_BY_DESIGN.get(version)
    if found is None:
        found = {}
        for name in names():
            try:
                found.setdefault(load(name).design_key, name)
            except KdslError:
                continue
        _NAMES_BY_DESIGN.clear()  # only the current gallery is worth keeping
        _NAMES_BY_DESIGN[version] = found
    return found.get(op.design_key)


def load_operator(ref: str) -> Operator:
    """An operator named the way every ``kdsl`` command takes one: a gallery name, a ``.dsl`` (or
    ``.py``) file of DSL source, or a ``.json`` file of its JSON form.

    >>> load_operator("matmul").key == load("matmul").key
    True
    >>> load_operator("missing.dsl")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.ParseError: no such file: missing.dsl
    """
    file = Path(ref)
    if file.suffix in (".dsl", ".py", ".json") or file.exists():
        if not file.is_file():
            raise ParseError(f"no such file: {ref}")
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ParseError(f"cannot read {ref}: {error}") from None
        return from_json(text) if file.suffix == ".json" else parse(text)
    return load(ref)


def describe(name: str) -> str:
    """The docstring at the top of the operator's file ('' if it has none).

    >>> "F.linear" in describe("linear") or "functional.linear" in describe("linear")
    True
    """
    try:
        tree = ast.parse(source(name))
    except SyntaxError:
        return ""
    return ast.get_docstring(tree) or ""
