"""The argparse types of kdsl's command-line options, shared by the commands ``kdsl bench``
registers (:mod:`kdsl.bench`) and the rest of the CLI (:mod:`kdsl.cli`): each refuses bad text with
a message naming what it expected.

>>> positive_int("4"), positive_float("2.5"), count("0"), optional_budget("none")
(4, 2.5, 0, None)
"""

from __future__ import annotations

import argparse

from kdsl.lang.errors import KdslError
from kdsl.solve.dynamic import read_budget

__all__ = ["RESULTS_DB", "TUNE_DB", "budget", "count", "optional_budget", "positive_float", "positive_int"]

#: ``--db``'s one rule: every command that keeps or reads results defaults to the same file in the
#: working folder, so that ``kdsl search`` (or ``kdsl discover``) and then ``kdsl results`` need no
#: ``--db``; a search results database (:class:`kdsl.search.store.Store`, written by search and
#: discover, read by results, ``gallery add`` and the benches that take ``--db``) ...
RESULTS_DB = "runs.sqlite"
#: ... and a tuning records database (``kdsl tune``; ``kdsl discover --tuned`` reads it when it exists)
TUNE_DB = "tune.db"


def budget(text: str) -> str:
    """argparse type of the budget options: the text itself, once :func:`~kdsl.solve.dynamic.read_budget` accepts it.

    A plain number is an absolute count, so ``0.5`` (no ``x``) would be a budget of 0 FLOPs that
    nothing fits; it is refused with a pointer to ``0.5x``.

    >>> budget("0.5x"), budget("150M")
    ('0.5x', '150M')
    >>> budget("0.5")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '0.5' is an absolute count below 1; write 0.5x for a multiple of ...
    """
    try:
        # the syntax and sign now; a relative budget's baseline comes from the spec later
        value, relative = read_budget(text)
    except KdslError as error:
        raise argparse.ArgumentTypeError(error.message) from None
    if not relative and value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is an absolute count below 1; write {text.strip()}x for a multiple of the baseline "
            f"operator's, or a count like 150M or 2G"
        )
    return text


def optional_budget(text: str) -> str | None:
    """:func:`budget`, or None for ``none`` (no limit)."""
    return None if text.strip().lower() == "none" else budget(text)


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number above 0 (seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def count(text: str) -> int:
    """argparse type: an integer of at least 0.

    >>> count("3")
    3
    >>> count("-1")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected a count (0 or more), got '-1'
    """
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a count (0 or more), got {text!r}")
    return value
