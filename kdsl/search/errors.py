"""Errors raised by search on bad input (unknown spec, bad budget, unusable database), and
:func:`printable`, which makes untrusted text (names from a database or a layer file) safe to
print on a terminal."""

from __future__ import annotations

from kdsl.lang.errors import KdslError


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


__all__ = ["SearchError", "printable"]
