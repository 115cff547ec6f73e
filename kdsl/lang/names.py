"""The one rule for names and the bounds on numbers, shared by every way an operator is made.

Constructors (``primary``, ``Dim``, ``Weight``, the primitives, ``Output``), the DSL parser and
``from_json`` all end in these checks, so anything that can be built prints as DSL text and JSON
that read back to the same operator.

A name (of a variable, a dim, a weight or a coefficient default) is an ASCII identifier that
starts with a letter, at most :data:`MAX_NAME_LENGTH` characters long, and is neither a Python
keyword (hard or soft) nor a name the DSL itself binds (``Input``, ``primary``, ...). Names are
printed as Python identifiers in DSL text and generated code, which is why the rule is this strict:
a leading ``_`` would make printed DSL bind private names, a keyword would not parse at all.

>>> check_identifier("Cin", "variable")
'Cin'
>>> check_identifier("w\\n", "weight")
Traceback (most recent call last):
...
kdsl.lang.errors.NameRuleError: weight name 'w\\n' is not allowed: a name is an ASCII letter followed by ...
>>> check_identifier("lambda", "variable")
Traceback (most recent call last):
...
kdsl.lang.errors.NameRuleError: variable name 'lambda' is not allowed: it is a Python keyword; choose another name
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Collection

from kdsl.lang.errors import NameRuleError, SizeError

#: the longest name accepted (names appear in generated source, messages and file names)
MAX_NAME_LENGTH = 128
#: the largest numerator or denominator of a size constant, and the largest integer literal
MAX_CONSTANT = 10**12
#: the largest absolute exponent of a variable in a size
MAX_EXPONENT = 16
#: Shift offsets lie strictly between -MAX_OFFSET and MAX_OFFSET (a 32-bit signed index)
MAX_OFFSET = 2**31

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")

# Soft keywords are listed by hand: keyword.softkwlist differs between Python versions ('type'
# arrived in 3.12), and a name must be valid or not whatever Python reads the text.
PYTHON_KEYWORDS = frozenset(keyword.kwlist) | frozenset({"_", "case", "match", "type"})

#: names the DSL binds itself; a variable, dim or weight with one of them would shadow it in text.
#: The primitives add their own names when they are declared (:func:`reserve`).
DSL_NAMES: set[str] = {"primary", "coefficient", "dynamic", "Weight", "Dim", "Input", "Output"}


def reserve(*names: str) -> None:
    """Make ``names`` (a primitive's, as it is declared) unavailable to variables, dims and weights."""
    DSL_NAMES.update(names)


def check_identifier(name: object, what: str) -> str:
    """Return ``name`` if it is a valid kdsl name, else raise :class:`NameRuleError` saying why.

    ``what`` says whose name it is ("variable", "dim", "weight", ...), for the message.
    """
    if not isinstance(name, str):
        raise NameRuleError(f"{what} name must be a string, got {type(name).__name__} {name!r:.80}")
    # fullmatch, not match with $: '$' also matches before a trailing newline ("w\n")
    if len(name) > MAX_NAME_LENGTH or _NAME.fullmatch(name) is None:
        raise NameRuleError(
            f"{what} name {name[:MAX_NAME_LENGTH]!r} is not allowed: a name is an ASCII letter followed by "
            f"letters, digits or _ (at most {MAX_NAME_LENGTH} characters)"
        )
    if name in PYTHON_KEYWORDS:
        raise NameRuleError(f"{what} name {name!r} is not allowed: it is a Python keyword; choose another name")
    if name in DSL_NAMES:
        raise NameRuleError(f"{what} name {name!r} is not allowed: the DSL uses it; choose another name")
    return name


def check_constant(value: int, what: str) -> int:
    """An integer literal or size constant part: at most :data:`MAX_CONSTANT` in absolute value."""
    if abs(value) > MAX_CONSTANT:
        raise SizeError(f"{what}: the integer {value} is too large (at most {MAX_CONSTANT} in absolute value)")
    return value


def check_offset(value: object, what: str) -> int:
    """A Shift offset: a nonzero int with ``|offset| < MAX_OFFSET``."""
    if isinstance(value, bool) or not isinstance(value, int) or value == 0:
        raise SizeError(f"{what}: the offset must be a nonzero integer, got {value!r:.80}")
    if abs(value) >= MAX_OFFSET:
        raise SizeError(f"{what}: the offset {value} is too large (|offset| must be below 2**31 = {MAX_OFFSET})")
    return value


def unused_name(name: str, taken: Collection[str], separator: str = "_") -> str:
    """``name`` when ``taken`` does not hold it, else ``name``, ``separator`` and the least number from
    2 that is not taken (new dims and weights made by a rewrite or a plan take their names here).

    >>> unused_name("w", {"v"}), unused_name("w", {"w", "w_2"}), unused_name("g", {"g"}, separator="")
    ('w', 'w_3', 'g2')
    """
    if name not in taken:
        return name
    number = 2
    while f"{name}{separator}{number}" in taken:
        number += 1
    return f"{name}{separator}{number}"
