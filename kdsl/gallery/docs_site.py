"""The docs site: the guide's pages (``docs/guide/*.md``), the API reference and the gallery, one static
folder with one navigation bar and one style sheet, needing no network.

::

    out/index.html            the guide's index (docs/guide/index.md)
    out/<page>.html           one per guide page
    out/api.html              the API reference (kdsl.gallery.reference)
    out/gallery/              the gallery's site (kdsl.gallery.site), the same bar on top
    out/docs/<path>.html      the other docs pages a guide page links to (measured results)

A link between pages is rewritten to the page the site has for it (``search.md#spaces`` to
``search.html#spaces``, ``../../gallery/README.md`` to ``gallery/index.html``); a link to a file the
site does not hold is shown as its text, so every link of the site resolves.

>>> import tempfile
>>> from pathlib import Path
>>> guide = Path(tempfile.mkdtemp())
>>> _ = (guide / "index.md").write_text("# kdsl\\n\\nStart with [writing](writing.md#first).")
>>> _ = (guide / "writing.md").write_text("# Writing\\n\\n## First\\n\\nSee [the index](index.md) and [x](nowhere.py).")
>>> out = Path(tempfile.mkdtemp())
>>> sorted(p.name for p in write_docs(out, guide, "<p>api</p>", []).parent.iterdir())
['api.html', 'gallery', 'index.html', 'style.css', 'writing.html']
>>> 'href="writing.html#first"' in (out / "index.html").read_text()
True
>>> '<a href="index.html">← kdsl</a>' in (out / "writing.html").read_text()
True
>>> text = (out / "writing.html").read_text()
>>> "and x.</p>" in text, "nowhere.py" in text
(True, False)
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from html import escape
from pathlib import Path

from kdsl.gallery.content import Entry
from kdsl.gallery.markdown import title, to_html
from kdsl.gallery.site import STYLE, page_html, write_site
from kdsl.lang.errors import KdslError

__all__ = ["guide_order", "site_folder", "write_docs"]

_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def guide_order(guide: Path) -> list[Path]:
    """The guide's pages: ``index.md`` first, then the pages in the order the index links them, then
    any it does not link, by name."""
    pages = sorted(guide.glob("*.md"))
    index = guide / "index.md"
    if index not in pages:
        raise KdslError(f"the guide folder {guide} has no index.md (the site's home page)")
    linked = re.findall(r"\]\(([\w.-]+\.md)(?:#[^)]*)?\)", index.read_text())
    order = [index] + [guide / name for name in dict.fromkeys(linked) if (guide / name) in pages]
    return order + [page for page in pages if page not in order]


def _relative(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target, start)).as_posix()


def _banner(root: Path, here: Path, current: str) -> str:
    """The navigation bar on every page (links relative to ``here``'s folder)."""
    items = [
        ("kdsl", "index.html", "guide"),
        ("API reference", "api.html", "api"),
        ("Gallery", "gallery/index.html", "gallery"),
    ]
    links = []
    for label, target, section in items:
        mark = ' class="here"' if section == current else ""
        links.append(f'<a{mark} href="{_relative(root / target, here.parent)}">{escape(label)}</a>')
    return f'<nav class="site">{"".join(links)}</nav>\n'


class _Site:
    """Which source file becomes which page of the site, and the link rewriting between them."""

    def __init__(self, out: Path, guide: Path, entries: Sequence[Entry]) -> None:
        self.out, self.guide = out, guide.resolve()
        self.docs = self.guide.parent  # docs/: the measured-results pages live under it
        self.pages = {page.resolve(): out / f"{page.stem}.html" for page in guide_order(guide)}
        gallery = self.docs.parent / "gallery"
        self.pages[(gallery / "README.md").resolve()] = out / "gallery" / "index.html"
        for entry in entries:
            self.pages[(gallery / "pages" / f"{entry.name}.md").resolve()] = out / "gallery" / f"{entry.name}.html"

    def add_linked_docs(self) -> list[Path]:
        """The docs pages outside the guide that guide pages link to (one level: their own links to
        pages the site does not hold become text); return them."""
        added = []
        for source in [path for path in self.pages if path.parent == self.guide]:
            for target in re.findall(r"\]\(([^)\s#]+\.md)(?:#[^)]*)?\)", source.read_text()):
                path = (source.parent / target).resolve()
                if path not in self.pages and path.is_file() and path.is_relative_to(self.docs):
                    self.pages[path] = self.out / "docs" / path.relative_to(self.docs).with_suffix(".html")
                    added.append(path)
        return added

    def link(self, source: Path, target: str) -> str | None:
        """Where a link of ``source``'s page points in the site, or ``None`` if the site lacks it."""
        if _EXTERNAL.match(target) or target.startswith("#"):
            return target
        file, hash_mark, fragment = target.partition("#")
        resolved = (source.parent / file).resolve()
        if resolved.is_dir() and (resolved / "README.md").resolve() in self.pages:
            resolved = (resolved / "README.md").resolve()
        page = self.pages.get(resolved)
        if page is None:
            return None
        return _relative(page, self.pages[source].parent) + hash_mark + fragment

    def render(self, source: Path, current: str) -> None:
        page = self.pages[source]
        text = source.read_text()
        body = to_html(text, link=lambda target: self.link(source, target))
        if current == "guide":
            body = self._guide_pages(source) + body + self._next(source)
        page.parent.mkdir(parents=True, exist_ok=True)
        html = page_html(
            f"{title(text)} · kdsl",
            f"<main>\n{body}\n</main>",
            banner=_banner(self.out, page, current),
            stylesheet=_relative(self.out / "style.css", page.parent),
        )
        page.write_text(html)

    def _next(self, source: Path) -> str:
        """Links to the guide's previous and next pages, at the foot of a guide page."""
        guide = [path for path in self.pages if path.parent == self.guide]
        number = guide.index(source)
        links = []
        if number > 0:
            links.append(
                f'<a href="{self.pages[guide[number - 1]].name}">← {escape(title(guide[number - 1].read_text()))}</a>'
            )
        if number + 1 < len(guide):
            links.append(
                f'<a href="{self.pages[guide[number + 1]].name}">{escape(title(guide[number + 1].read_text()))} →</a>'
            )
        return f'\n<nav class="pages next">{" ".join(links)}</nav>' if links else ""

    def _guide_pages(self, source: Path) -> str:
        """The row of the guide's pages above each guide page (the current one not linked)."""
        links = []
        for path, page in self.pages.items():
            if path.parent != self.guide:
                continue
            name = escape(title(path.read_text(), path.stem))
            links.append(f"<strong>{name}</strong>" if path == source else f'<a href="{page.name}">{name}</a>')
        return f'<nav class="pages">{" ".join(links)}</nav>\n'


def site_folder(out: str | os.PathLike[str]) -> Path:
    """``out`` as the site's folder; a :class:`KdslError` if it is a file (checked before any work)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise KdslError(f"the docs site goes into a folder, and {out} is a file: choose another --out")
    return out


def write_docs(out: Path, guide: Path, api_body: str, entries: Sequence[Entry], *, batch: int = 1) -> Path:
    """Write the docs site into ``out``: the guide's pages from ``guide`` (Markdown), ``api_body`` (the
    API reference's HTML, :func:`kdsl.gallery.reference.api_html`) and the gallery's ``entries``; return
    ``out/index.html``."""
    out = site_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "style.css").write_text(STYLE)
    site = _Site(out, Path(guide), entries)
    linked = site.add_linked_docs()
    for source in site.pages:
        if source.parent == site.guide:
            site.render(source, "guide")
    for source in linked:
        site.render(source, "docs")
    api = page_html(
        "API reference · kdsl",
        f"<main>\n<h1>API reference</h1>\n{api_body}\n</main>",
        banner=_banner(out, out / "api.html", "api"),
    )
    (out / "api.html").write_text(api)
    write_site(out / "gallery", entries, batch=batch, banner=_banner(out, out / "gallery" / "index.html", "gallery"))
    return out / "index.html"
