"""Markdown to HTML for the docs site: the subset kdsl's pages use, with every character escaped.

Headings (with ids a code host would give them), paragraphs, ``-``/``*``/``1.`` lists (an indented
line continues the item above), fenced code blocks, pipe tables, blockquotes, inline code, links,
images, ``**strong**`` and ``*emphasis*``. Raw HTML in the text is shown as text, never passed through:
a page cannot inject markup. ``link`` rewrites each link target (e.g. ``page.md`` to ``page.html``); a
target it maps to ``None`` is shown as its text only (the site has no such file).

>>> print(to_html("# Hello *world*\\n\\nSee [the guide](guide.md) and `a < b`.", link=lambda t: "guide.html"))
<h1 id="hello-world">Hello <em>world</em></h1>
<p>See <a href="guide.html">the guide</a> and <code>a &lt; b</code>.</p>
>>> print(to_html("| a | b |\\n| --- | ---: |\\n| 1 | 2 |"))
<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td class="num">2</td></tr></tbody></table>
>>> print(to_html("```python\\n>>> 1 + 1\\n2\\n\\n```"))
<pre><code class="language-python">&gt;&gt;&gt; 1 + 1
2</code></pre>
>>> print(to_html("- one\\n  more\\n- <b>two</b>"))
<ul><li>one more</li><li>&lt;b&gt;two&lt;/b&gt;</li></ul>
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import escape

__all__ = ["headings", "slug", "to_html", "title"]

NUMERIC = ' class="num"'
Link = Callable[[str], "str | None"]

_FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)\s*$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_ITEM = re.compile(r"^\s{0,3}([-*+]|\d+[.)])\s+(.*)$")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
# one inline token: a code span, an image or a link (whose text may hold code spans), else plain text
_INLINE = re.compile(
    r"(?P<ticks>`+)(?P<code>.+?)(?P=ticks)|(?P<bang>!?)\[(?P<text>(?:[^\]`]|`[^`]*`)*)\]\((?P<href>[^)\s]*)\)"
)


# a link that would run code when followed is shown as its text
_UNSAFE = re.compile(r"^\s*(?:javascript|vbscript|data):", re.IGNORECASE)


def _same(target: str) -> str:
    return target


def slug(text: str) -> str:
    """The anchor a code host gives a heading: lower case, punctuation dropped, spaces as dashes.

    >>> slug("Search and the main job (kdsl discover)")
    'search-and-the-main-job-kdsl-discover'
    """
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _emphasis(escaped: str) -> str:
    """``**strong**`` and ``*emphasis*`` in already escaped text; a lone ``*`` (``g*Cin``) stays."""
    escaped = re.sub(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])", r"<em>\1</em>", escaped)


def inline(text: str, link: Link = _same) -> str:
    """One line or paragraph of inline Markdown as HTML. Code spans and links are set aside first, so
    emphasis may span them (``**a `b` c**``) and never looks inside them.

    >>> inline("**MACs** of `g*Cin` via [`kdsl check`](cli.md#check); g*Cin stays", link=lambda t: None)
    '<strong>MACs</strong> of <code>g*Cin</code> via <code>kdsl check</code>; g*Cin stays'
    >>> inline("**A `group` rewrite** and [*x* < y](a.md)")
    '<strong>A <code>group</code> rewrite</strong> and <a href="a.md"><em>x</em> &lt; y</a>'
    >>> inline('[click](javascript:alert(1)) <script>"x"</script>')
    'click) &lt;script&gt;"x"&lt;/script&gt;'
    """
    held: list[str] = []

    def hold(match: re.Match[str]) -> str:
        if match.group("ticks"):
            html = f"<code>{escape(match.group('code').strip(), quote=False)}</code>"
        else:
            label, href = match.group("text"), match.group("href")
            target = None if _UNSAFE.match(href) else link(href)
            if match.group("bang"):
                html = f'<img src="{escape(target)}" alt="{escape(label)}">' if target else escape(label)
            elif target is None:
                html = inline(label, link)
            else:
                html = f'<a href="{escape(target)}">{inline(label, link)}</a>'
        held.append(html)
        return f"\x00{len(held) - 1}\x00"

    marked = _emphasis(escape(_INLINE.sub(hold, text.replace("\x00", "")), quote=False))
    return re.sub("\x00(\\d+)\x00", lambda match: held[int(match.group(1))], marked)


def _cells(line: str) -> list[str]:
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") and not line.endswith("\\|") else line
    # a pipe inside a code span belongs to the cell (`a | b`), as on code hosts that honour \|
    cells, current, ticks = [], "", False
    for char in line:
        if char == "`":
            ticks = not ticks
        if char == "|" and not ticks and not current.endswith("\\"):
            cells.append(current)
            current = ""
        else:
            current += char
    return [cell.strip().replace("\\|", "|") for cell in [*cells, current]]


def _table(rows: list[str], link: Link) -> str:
    head, rule, body = _cells(rows[0]), _cells(rows[1]), [_cells(row) for row in rows[2:]]
    right = [cell.endswith(":") and not cell.startswith(":") for cell in rule]
    head_html = "".join(f"<th>{inline(cell, link)}</th>" for cell in head)
    body_html = []
    for cells in body:
        cells = (cells + [""] * len(head))[: len(head)]
        numeric = [index < len(right) and right[index] for index in range(len(cells))]
        tds = (
            f"<td{NUMERIC if right_aligned else ''}>{inline(cell, link)}</td>"
            for cell, right_aligned in zip(cells, numeric)
        )
        body_html.append(f"<tr>{''.join(tds)}</tr>")
    return f"<table><thead><tr>{head_html}</tr></thead><tbody>{''.join(body_html)}</tbody></table>"


def _starts_block(lines: list[str], index: int) -> bool:
    line = lines[index]
    table = line.lstrip().startswith("|") and index + 1 < len(lines) and _TABLE_RULE.match(lines[index + 1])
    return bool(_FENCE.match(line) or _HEADING.match(line) or _ITEM.match(line) or line.startswith(">") or table)


def to_html(text: str, link: Link = _same) -> str:
    """The HTML of a Markdown page (blocks joined by newlines); see the module's docstring."""
    lines = text.replace("\t", "    ").splitlines()
    blocks: list[str] = []
    used: dict[str, int] = {}
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.strip():
            index += 1
        elif fence := _FENCE.match(line):
            end = index + 1
            while end < len(lines) and not lines[end].startswith(fence.group(1)):
                end += 1
            code = "\n".join(lines[index + 1 : end]).rstrip()
            language = f' class="language-{fence.group(2)}"' if fence.group(2) else ""
            blocks.append(f"<pre><code{language}>{escape(code, quote=False)}</code></pre>")
            index = end + 1
        elif heading := _HEADING.match(line):
            level, words = len(heading.group(1)), heading.group(2)
            anchor = slug(re.sub(r"`|\[|\]\([^)]*\)", "", words))
            used[anchor] = used.get(anchor, -1) + 1
            anchor += f"-{used[anchor]}" if used[anchor] else ""
            blocks.append(f'<h{level} id="{escape(anchor)}">{inline(words, link)}</h{level}>')
            index += 1
        elif _starts_block(lines, index) and line.lstrip().startswith("|"):
            end = index + 2
            while end < len(lines) and lines[end].lstrip().startswith("|"):
                end += 1
            blocks.append(_table(lines[index:end], link))
            index = end
        elif line.startswith(">"):
            end = index
            while end < len(lines) and lines[end].startswith(">"):
                end += 1
            quoted = "\n".join(row[1:].removeprefix(" ") for row in lines[index:end])
            blocks.append(f"<blockquote>{to_html(quoted, link)}</blockquote>")
            index = end
        elif item := _ITEM.match(line):
            ordered = item.group(1)[0].isdigit()
            items: list[str] = []
            while index < len(lines) and (item := _ITEM.match(lines[index])):
                words = [item.group(2)]
                index += 1
                # an indented line that starts no item of its own continues this one
                while index < len(lines) and lines[index].startswith("  ") and not _ITEM.match(lines[index]):
                    words.append(lines[index].strip())
                    index += 1
                items.append(f"<li>{inline(' '.join(words), link)}</li>")
            tag = "ol" if ordered else "ul"
            blocks.append(f"<{tag}>{''.join(items)}</{tag}>")
        else:
            end = index + 1
            while end < len(lines) and lines[end].strip() and not _starts_block(lines, end):
                end += 1
            paragraph = " ".join(row.strip() for row in lines[index:end])
            blocks.append(f"<p>{inline(paragraph, link)}</p>")
            index = end
    return "\n".join(blocks)


def headings(text: str) -> list[tuple[int, str]]:
    """The page's headings outside code blocks, as (level, text).

    >>> headings("# A\\n```\\n# not a heading\\n```\\n## B")
    [(1, 'A'), (2, 'B')]
    """
    found, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (heading := _HEADING.match(line)):
            found.append((len(heading.group(1)), heading.group(2)))
    return found


def title(text: str, default: str = "kdsl") -> str:
    """The text of the page's first heading, without Markdown marks, else ``default``.

    >>> title("intro\\n# Writing an `Operator`\\n## more")
    'Writing an Operator'
    """
    for _, words in headings(text):
        return re.sub(r"[`*]|\]\([^)]*\)|\[", "", words)
    return default
