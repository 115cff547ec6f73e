"""The one error family of kdsl.

Every problem caused by user input (a malformed program, a size that does not divide, a dim that
is not there) raises a subclass of :class:`KdslError`. Messages name the dim, size, constraint or
layer involved and say what to do. Public entry points may attach the operator's DSL text with
:meth:`KdslError.with_context`.
"""

from __future__ import annotations

import importlib
from typing import Any


class KdslError(Exception):
    """Base class of every error kdsl raises on bad input."""

    def __init__(self, message: str, *, context: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def with_context(self, context: str) -> KdslError:
        """Return a copy of this error that also quotes ``context`` (usually the DSL text)."""
        clone = type(self).__new__(type(self))
        KdslError.__init__(clone, self.message, context=context)
        clone.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("message", "context")})
        return clone

    def __str__(self) -> str:
        if self.context:
            indented = "\n".join("    " + line for line in self.context.strip().splitlines())
            return f"{self.message}\n  in:\n{indented}"
        return self.message


class SizeError(KdslError):
    """A size expression is malformed (non-positive, a primary variable in a denominator, ...)."""


class ShapeError(KdslError):
    """Dimensions do not fit together: a missing, extra, dangling or mis-sized dim."""


class DivisibilityError(KdslError):
    """A size does not divide, or a created size is not a positive integer, on some layer."""


class UnboundDimError(ShapeError):
    """A primitive refers to a dim that does not exist at that point."""


class AmbiguousDimError(ShapeError):
    """A reference matches several dims; the user must name the one they mean."""


class ValidityError(KdslError):
    """The operator breaks a quality rule (drops input data, Stride without a window, ...)."""


class NameRuleError(ShapeError, SizeError):
    """A name (of a variable, dim or weight) breaks the naming rule of :mod:`kdsl.lang.names`.

    It is both a ShapeError and a SizeError: dim and weight names were checked as shapes, variable
    names as sizes, and code catching either keeps working.
    """


class ParseError(KdslError):
    """DSL text or JSON that kdsl cannot read."""


class LoweringError(KdslError):
    """A backend cannot lower or run an operator (missing dependency, unsupported shape)."""


class LayerError(KdslError):
    """A layer table is malformed or does not bind a variable the operator needs."""


class BudgetError(KdslError):
    """A FLOPs or parameter budget that cannot be read, or that no valid choice of widths meets."""


class SearchError(KdslError):
    """A search space, budget, strategy or results database that kdsl cannot use.

    >>> str(SearchError("unknown spec 'conv3d'"))
    "unknown spec 'conv3d'"
    """


def printable(text: object, *, keep_newlines: bool = False) -> str:
    """``text`` with every character a terminal would act on (ANSI/OSC escapes, other control
    characters, bidirectional overrides) written as a Python escape, so that a name read from a
    database or a file can neither recolour, retitle nor rewrite the user's terminal, nor break
    one-line output. ``keep_newlines`` keeps line breaks (for multi-line DSL text).

    >>> printable("conv\\x1b[31m2d\\x1b]0;pwned\\x07")
    'conv\\\\x1b[31m2d\\\\x1b]0;pwned\\\\x07'
    >>> printable("a\\nb"), printable("a\\nb", keep_newlines=True)
    ('a\\\\nb', 'a\\nb')
    """
    out = []
    for char in str(text):
        if char.isprintable() or (keep_newlines and char == "\n"):
            out.append(char)
        else:
            # repr() spells a non-printable character as \xNN, \uNNNN or \n: visible, inert
            out.append(repr(char)[1:-1])
    return "".join(out)


def import_or_explain(module: str, error: type[KdslError], needs: str, install: str) -> Any:
    """``module`` imported, or ``error`` saying ``needs`` (what needs which package) and how to ``install``
    it: how kdsl loads an optional dependency on first use, so that ``import kdsl`` pays for none of them."""
    try:
        return importlib.import_module(module)
    except ImportError as cause:  # pragma: no cover - depends on the environment
        raise error(f"{needs} ({cause}); install it with: {install}") from None
