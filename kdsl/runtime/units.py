"""Times as people read them: one unit per table column, chosen by the column's magnitude, and
seconds in progress lines rounded to what a reader can use.

Every table that prints times (``kdsl tune``, ``kdsl bench codegen``, ``kdsl bench tune``) goes through
:func:`time_column`, so a column never switches between ms and us from one row to the next, and a tiny
kernel never reads ``0.000 ms``.

>>> time_column([0.0021, 0.0153, None])
('ms', ['2.10', '15.30', '-'])
>>> time_column([3.2e-6, 4.1e-5])
('us', ['3.20', '41.00'])
>>> duration(0.000512), duration(2.6e-8), seconds(14.040596484000048), seconds(60.0)
('512 us', '26.0 ns', '14 s', '60 s')
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["TIME_UNITS", "duration", "faster_or_slower", "format_time", "seconds", "time_column", "time_unit"]

#: (name, seconds per unit), largest first
TIME_UNITS: tuple[tuple[str, float], ...] = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))


def time_unit(values: Iterable[float | None]) -> tuple[str, float, int]:
    """The unit (name, seconds per unit) in which the smallest positive value of ``values`` is at least
    1, and the decimals that give it three significant digits; ``("ms", 1e-3, 3)`` when there is none.

    >>> time_unit([0.5, 2.0]), time_unit([7e-5]), time_unit([None])
    (('ms', 0.001, 0), ('us', 1e-06, 1), ('ms', 0.001, 3))
    """
    # the smallest value decides: a unit chosen by the largest would print the small ones as 0.00
    positive = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not positive:
        return "ms", 1e-3, 3
    smallest = min(positive)
    for name, scale in TIME_UNITS:
        if smallest >= scale or name == TIME_UNITS[-1][0]:
            digits = math.floor(math.log10(smallest / scale)) if smallest >= scale else 0
            return name, scale, max(0, 2 - digits)
    raise AssertionError("unreachable: the last unit always matches")


def format_time(value: float | None, scale: float, decimals: int) -> str:
    """``value`` seconds in a unit of ``scale`` seconds with ``decimals`` decimals; ``-`` for none.

    >>> format_time(0.0153, 1e-3, 2), format_time(None, 1e-3, 2), format_time(float("inf"), 1.0, 1)
    ('15.30', '-', '-')
    """
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value / scale:.{decimals}f}"


def time_column(values: Iterable[float | None]) -> tuple[str, list[str]]:
    """A column of times in seconds as ``(unit, texts)``: one unit for all (:func:`time_unit`)."""
    values = list(values)
    name, scale, decimals = time_unit(values)
    return name, [format_time(value, scale, decimals) for value in values]


def duration(value: float | None) -> str:
    """One time in seconds, in its own unit with three significant digits (``0.512 ms`` -> ``512 us``)."""
    name, texts = time_column([value])
    return f"{texts[0]} {name}" if texts[0] != "-" else "-"


def seconds(value: float) -> str:
    """Elapsed seconds for a progress line: one decimal below 10 s, whole seconds above.

    >>> seconds(0.25), seconds(9.96), seconds(125.4)
    ('0.2 s', '10 s', '125 s')
    """
    return f"{value:.1f} s" if round(value, 1) < 10 else f"{value:.0f} s"


def faster_or_slower(saved: float, unit: str = "ms", decimals: int = 3) -> str:
    """How much faster the second of two runs was, in words: ``saved`` is the first's time minus the
    second's, in ``unit``. A negative saving reads "slower", never "-0.3 ms faster"; one that rounds
    to nothing at ``decimals`` reads "as fast".

    >>> faster_or_slower(0.25), faster_or_slower(-1.5), faster_or_slower(-0.0001)
    ('0.250 ms faster', '1.500 ms slower', 'as fast (within 0.001 ms)')
    >>> faster_or_slower(float("nan"))
    'not comparable (nan ms)'
    """
    if not math.isfinite(saved):
        return f"not comparable ({saved} {unit})"
    if round(abs(saved), decimals) == 0:
        return f"as fast (within {10.0**-decimals:.{decimals}f} {unit})"
    return f"{abs(saved):.{decimals}f} {unit} {'faster' if saved > 0 else 'slower'}"
