"""Errors raised by search on bad input (unknown spec, bad budget, unusable database); it re-exports
:func:`kdsl.lang.errors.printable`, which makes untrusted text safe to print on a terminal."""

from __future__ import annotations

from kdsl.lang.errors import KdslError, printable


class SearchError(KdslError):
    """A search space, budget, strategy or results database that kdsl cannot use.

    >>> str(SearchError("unknown spec 'conv3d'"))
    "unknown spec 'conv3d'"
    """


__all__ = ["SearchError", "printable"]
