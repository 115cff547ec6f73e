"""The API reference page of the docs site, read from the modules' own docstrings with :mod:`inspect`.

A module's public names are its ``__all__`` (else the public functions and classes it defines); each
gets its signature and docstring, a class its public methods and properties with docstrings too. The
caller imports the modules (this module imports none, so the layers stay as they are) and passes any
it could not import as a reason, which the page shows in their place.

>>> from kdsl import solve
>>> html = api_html([solve], {"kdsl.nn": "needs torch"})
>>> 'id="kdsl.solve.check"' in html and "<code>kdsl.nn</code>: needs torch" in html
True
>>> docstring_html("Sum ``x``; see :func:`check`.\\n\\n>>> 1 + 1\\n2")
'<p>Sum <code>x</code>; see <code>check</code>.</p>\\n<pre><code>&gt;&gt;&gt; 1 + 1\\n2</code></pre>'
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping, Sequence
from html import escape
from types import ModuleType
from typing import Any

__all__ = ["api_html", "docstring_html", "public_names"]

# ``code`` and Sphinx roles (:func:`kdsl.solve.check`) are both shown as code
_CODE = re.compile(r"``(.+?)``|:[a-z]+:`~?(.+?)`")


def _prose(text: str) -> str:
    parts, position = [], 0
    for match in _CODE.finditer(text):
        parts.append(escape(text[position : match.start()], quote=False))
        parts.append(f"<code>{escape(match.group(1) or match.group(2), quote=False)}</code>")
        position = match.end()
    parts.append(escape(text[position:], quote=False))
    return "".join(parts)


def docstring_html(doc: str | None) -> str:
    """A docstring as HTML: paragraphs (with ``code``), and its examples (``>>>`` lines and what they
    print, or an indented block) as code."""
    if not doc:
        return ""
    blocks = re.split(r"\n\s*\n", inspect.cleandoc(doc))
    html = []
    for block in blocks:
        lines = block.splitlines()
        if lines[0].lstrip().startswith(">>>") or all(line.startswith("    ") for line in lines):
            html.append(f"<pre><code>{escape(inspect.cleandoc(block), quote=False)}</code></pre>")
        else:
            html.append(f"<p>{_prose(' '.join(line.strip() for line in lines))}</p>")
    return "\n".join(html)


def public_names(module: ModuleType) -> list[str]:
    """``__all__``, else the public functions and classes the module itself defines, in file order."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isfunction(value) or inspect.isclass(value))
        and getattr(value, "__module__", None) == module.__name__
    ]


# a default's repr may hold a memory address (``<function f at 0x7f...>``): dropped, so that two builds
# of the site are the same files
_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-f]+")


def _signature(value: Any) -> str:
    try:
        return _ADDRESS.sub("", str(inspect.signature(value)))
    except (TypeError, ValueError):  # some builtins and C types have none
        return ""


def _members(cls: type) -> list[str]:
    """A class's own public methods and properties that have docstrings."""
    html = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        function = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        doc = inspect.getdoc(function) if (inspect.isfunction(function) or isinstance(member, property)) else None
        if not doc:
            continue
        signature = "" if isinstance(member, property) else _signature(function)
        html.append(
            f'<div class="member"><h4><code>{escape(name)}{escape(signature)}</code></h4>\n{docstring_html(doc)}</div>'
        )
    return html


def _entry(module_name: str, name: str, value: Any) -> str:
    anchor = f"{module_name}.{name}"
    if callable(value) and not inspect.isclass(value):
        value = inspect.unwrap(value)  # a cached function (functools.lru_cache) is documented as the function
    if inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value):
        kind = "class" if inspect.isclass(value) else "def"
        head = f"{kind} {name}{_signature(value)}"
        doc = inspect.getdoc(value) if (inspect.isclass(value) or value.__doc__) else None
        body = [docstring_html(doc), *(_members(value) if inspect.isclass(value) else [])]
    elif isinstance(value, ModuleType):
        head, body = f"module {value.__name__}", [docstring_html(_summary(value))]
    else:  # a constant or table: its type and a short repr (never the whole table)
        shown = _ADDRESS.sub("", _stable_repr(value))
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        head, body = f"{name}: {type(value).__name__} = {shown}", []
    return (
        f'<section class="api" id="{escape(anchor)}">\n<h3><code>{escape(head)}</code></h3>\n{"".join(body)}</section>'
    )


def _stable_repr(value: Any) -> str:
    """``repr``, with a set's items sorted (a set's order changes between runs with string hashing).

    >>> _stable_repr(frozenset({"b", "a"})), _stable_repr([2, 1])
    ("frozenset({'a', 'b'})", '[2, 1]')
    """
    if isinstance(value, (set, frozenset)) and value:
        items = "{" + ", ".join(sorted(map(repr, value))) + "}"
        return items if type(value) is set else f"{type(value).__name__}({items})"
    return repr(value)


def _summary(module: ModuleType) -> str:
    doc = inspect.getdoc(module) or ""
    return doc.split("\n\n", 1)[0]


def _homes(modules: Sequence[ModuleType]) -> dict[int, str]:
    """Where each exported class or function is documented: of the modules that export it, the one
    whose name is the longest prefix of the module that defines it (``kdsl.lang`` for ``kdsl.FC``)."""
    homes: dict[int, tuple[int, str]] = {}
    for module in modules:
        for name in public_names(module):
            value = getattr(module, name, None)
            if not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            defined = getattr(value, "__module__", "") or ""
            depth = len(module.__name__) if f"{defined}.".startswith(f"{module.__name__}.") else -1
            if depth > homes.get(id(value), (-2, ""))[0]:
                homes[id(value)] = (depth, f"{module.__name__}.{name}")
    return {key: anchor for key, (_, anchor) in homes.items()}


def api_html(modules: Sequence[ModuleType], missing: Mapping[str, str] | None = None) -> str:
    """The reference's body: a contents list, then per module its docstring and public names (a name
    documented under another module links there)."""
    contents = [f'<li><a href="#{escape(m.__name__)}"><code>{escape(m.__name__)}</code></a></li>' for m in modules]
    homes = _homes(modules)
    sections = []
    for module in modules:
        entries = []
        for name in public_names(module):
            if not hasattr(module, name):
                continue
            value = getattr(module, name)
            home = homes.get(id(value), f"{module.__name__}.{name}")
            if home != f"{module.__name__}.{name}":
                entries.append(
                    f'<p class="see"><code>{escape(name)}</code>: see <a href="#{escape(home)}">{escape(home)}</a></p>'
                )
            else:
                entries.append(_entry(module.__name__, name, value))
        name = escape(module.__name__)
        sections.append(
            f'<section class="module" id="{name}">\n<h2><code>{name}</code></h2>\n'
            f"{docstring_html(inspect.getdoc(module))}\n{''.join(entries)}\n</section>"
        )
    absent = "".join(f"<li><code>{escape(name)}</code>: {escape(why)}</li>" for name, why in (missing or {}).items())
    if absent:
        sections.append(
            f'<section class="module" id="not-imported"><h2>Not imported here</h2><ul>{absent}</ul></section>'
        )
    return f'<ul class="contents">{"".join(contents)}</ul>\n' + "\n".join(sections)
