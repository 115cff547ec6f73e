"""The gallery as a static website: ``index.html`` (operators by category, as cards with their
drawing, a one-sentence summary, numbers and a badge saying whether search rediscovered them; a
search box filters them), one page per operator, the drawings as ``.svg`` files and ``style.css``.
Everything is local: no network resource, no script but the index's filter.

>>> import tempfile
>>> from kdsl import gallery
>>> from kdsl.gallery.content import Entry
>>> folder = Path(tempfile.mkdtemp())
>>> _ = write_site(folder, [Entry("conv2d", gallery.load("conv2d"), gallery.describe("conv2d"), "resnet18",
...                                "convolutions")])
>>> sorted(path.name for path in folder.iterdir())
['conv2d.html', 'conv2d.svg', 'index.html', 'style.css']
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from kdsl import solve
from kdsl.codegen.render import loop_nest, svg
from kdsl.codegen.torch import source
from kdsl.gallery.content import (
    CATEGORIES,
    GRAPH_LEGEND,
    LEGEND,
    Entry,
    description_blocks,
    first_sentence,
    metric_label,
    search_badge,
    search_rows,
    use_it,
)
from kdsl.lang.errors import KdslError

STYLE = """\
:root { --ink: #1d2433; --muted: #5b6475; --line: #d8dee9; --accent: #3a5a9a; --paper: #fbfcfe; }
* { box-sizing: border-box; }
body { margin: 0; font: 16px/1.55 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink);
       background: var(--paper); }
header, main, footer { max-width: 1180px; margin: 0 auto; padding: 0 24px; }
header { padding-top: 20px; }
a { color: var(--accent); }
h1 { font-size: 2rem; margin: 0.3em 0 0.2em; }
h2 { font-size: 1.35rem; margin: 1.6em 0 0.5em; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
code, pre { font: 13.5px/1.45 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }
pre { background: #f2f5fa; border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px;
      overflow-x: auto; }
pre.formula { background: #fffdf4; border-color: #eadfb8; }
p code { background: #eef2f8; padding: 1px 4px; border-radius: 4px; }
nav.crumbs { font-size: 0.95rem; color: var(--muted); display: flex; gap: 14px; flex-wrap: wrap; }
.lead { color: var(--muted); max-width: 60em; }
.toc { display: flex; flex-wrap: wrap; gap: 8px; margin: 12px 0; }
.toc a { text-decoration: none; border: 1px solid var(--line); border-radius: 999px; padding: 3px 12px;
         background: white; }
#filter { width: 100%; max-width: 420px; padding: 8px 12px; font-size: 1rem; border: 1px solid var(--line);
          border-radius: 8px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(340px, 1fr)); gap: 18px; }
.card { background: white; border: 1px solid var(--line); border-radius: 12px; padding: 12px 14px;
        display: flex; flex-direction: column; gap: 6px; text-decoration: none; color: inherit; }
.card:hover { border-color: var(--accent); box-shadow: 0 2px 10px rgba(58, 90, 154, 0.15); }
.card h3 { margin: 0; font-size: 1.05rem; font-family: ui-monospace, "DejaVu Sans Mono", monospace;
           overflow-wrap: anywhere; }
.thumb { height: 250px; display: flex; align-items: center; justify-content: center; background: #f7f9fc;
         border-radius: 8px; overflow: hidden; }
.thumb img { max-width: 100%; max-height: 100%; }
.card p { margin: 0; font-size: 0.92rem; }
.card code.formula { font-size: 12px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis;
                     background: #fffdf4; border: 1px solid #eadfb8; border-radius: 6px; padding: 3px 6px; }
figure.diagram img { max-width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: 0.88rem; margin-top: 6px; text-align: left; }
.numbers { color: var(--muted); font-size: 0.85rem; }
.badge { display: inline-block; font-size: 0.78rem; padding: 1px 9px; border-radius: 999px; white-space: nowrap; }
.badge.found { background: #e3f5e6; color: #1d6b2c; border: 1px solid #9fd3a9; }
.badge.missed { background: #fbeee6; color: #8a4414; border: 1px solid #e9bb98; }
.badge.unsearched { background: #eef0f4; color: #5b6475; border: 1px solid #d3d8e2; }
.badge.new { background: #fff2c2; color: #7a5a00; border: 1px solid #e6cf73; }
figure.diagram { margin: 0; background: white; border: 1px solid var(--line); border-radius: 8px; padding: 8px;
                 overflow-x: auto; text-align: center; }
table { border-collapse: collapse; margin: 8px 0; font-size: 0.93rem; }
th, td { border-bottom: 1px solid var(--line); padding: 5px 12px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
footer { margin: 40px auto; color: var(--muted); font-size: 0.9rem; }
.hidden { display: none; }
nav.site { background: var(--ink); padding: 10px 24px; display: flex; gap: 22px; flex-wrap: wrap; }
nav.site a { color: white; text-decoration: none; }
nav.site a.here { border-bottom: 2px solid #9fb6e8; }
nav.pages { display: flex; flex-wrap: wrap; gap: 6px 14px; font-size: 0.92rem; margin: 10px 0; }
nav.pages.next { justify-content: space-between; margin: 32px 0; border-top: 1px solid var(--line); padding-top: 12px; }
blockquote { margin: 0; padding: 2px 14px; border-left: 4px solid var(--line); color: var(--muted); }
section.api { margin: 14px 0 22px; }
section.api h3 { font-size: 1rem; margin: 0 0 4px; overflow-wrap: anywhere; }
section.module > h2 code, h1 code, h2 code, h3 code { font-size: inherit; }
section.api h3 code { font-size: 0.95rem; font-weight: 600; }
p.see { margin: 2px 0; font-size: 0.92rem; }
div.member { margin-left: 18px; }
div.member h4 { font-size: 0.92rem; margin: 8px 0 2px; overflow-wrap: anywhere; }
"""

# the index's filter: hides the cards (and then empty sections) whose text does not hold the query;
# ``index.html?q=word`` opens the index filtered
_FILTER = """\
<script>
const box = document.getElementById("filter");
function filter() {
  const query = box.value.trim().toLowerCase();
  for (const card of document.querySelectorAll(".card")) {
    card.classList.toggle("hidden", !card.dataset.text.includes(query));
  }
  for (const section of document.querySelectorAll("section.category")) {
    section.classList.toggle("hidden", !section.querySelector(".card:not(.hidden)"));
  }
}
box.addEventListener("input", filter);
box.value = new URLSearchParams(location.search).get("q") || "";  // index.html?q=pool opens filtered
filter();
</script>
"""


def page_html(title: str, body: str, *, banner: str = "", stylesheet: str = "style.css") -> str:
    """A whole HTML page: ``banner`` (the docs site's navigation, HTML) above ``body``."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<title>{escape(title)}</title>\n<link rel="stylesheet" href="{escape(stylesheet)}">\n</head>\n<body>\n'
        f"{banner}{body}\n</body>\n</html>\n"
    )


def prose_html(text: str) -> str:
    """Prose as HTML: escaped, with ``double-backquoted`` spans as code.

    >>> prose_html("Reproduces ``F.conv2d(x, w)`` for g*Cin < K.")
    'Reproduces <code>F.conv2d(x, w)</code> for g*Cin &lt; K.'
    """
    parts = re.split(r"``(.+?)``", text)
    return "".join(f"<code>{escape(part)}</code>" if odd else escape(part) for odd, part in _alternate(parts))


def _alternate(parts: Sequence[str]) -> list[tuple[bool, str]]:
    return [(index % 2 == 1, part) for index, part in enumerate(parts)]


def _badges(entry: Entry) -> str:
    kind, text = search_badge(entry.search)
    badges = f'<span class="badge {kind}">{escape(text)}</span>'
    if entry.new:
        badges = '<span class="badge new">new: found by search</span> ' + badges * bool(entry.search)
    return badges


def _formula_line(entry: Entry) -> str:
    """The first line of the operator's first formula (cards of look-alike drawings differ here)."""
    formulas = [text for kind, text in description_blocks(entry.description) if kind == "formula"]
    if not formulas:
        return ""
    line = formulas[0].splitlines()[0]
    return f'<code class="formula" title="{escape(line)}">{escape(line)}</code>\n'


def _numbers(entry: Entry) -> str:
    """The card's numbers: cost on its layer table, then forward latencies (HTML)."""
    lines = []
    if entry.macs is not None and entry.params is not None and entry.table:
        lines.append(f"{entry.macs / 1e6:,.1f} M MACs · {entry.params:,.0f} params on {entry.table}")
    times = [
        f"{short} {entry.metrics[key]:.3f}"
        for key, short in (("kdsl_fwd_ms", "kdsl→PyTorch"), ("native_fwd_ms", "native"), ("tvm_fwd_ms", "kdsl→TVM"))
        if key in entry.metrics
    ]
    if times:
        lines.append("forward ms: " + " · ".join(times))
    return "<br>".join(escape(line) for line in lines)


def _index(entries: Sequence[Entry], batch: int, banner: str = "") -> str:
    present = [c for c in CATEGORIES if any(e.category == c[0] for e in entries)]
    toc = "".join(f'<a href="#{slug}">{escape(title)}</a>' for slug, title, _ in present)
    sections = []
    for slug, title, blurb in present:
        cards = []
        for entry in (e for e in entries if e.category == slug):
            summary = first_sentence(entry.description) if entry.description else "Found by search."
            text = f"{entry.name} {summary} {title}".lower()
            cards.append(
                f'<a class="card" href="{entry.name}.html" data-text="{escape(text)}">\n'
                f"<h3>{escape(entry.name)}</h3>\n<div>{_badges(entry)}</div>\n"
                f'<div class="thumb"><img src="{entry.name}.svg" alt="the primitive graph of {escape(entry.name)}" '
                'loading="lazy"></div>\n'
                f"<p>{prose_html(summary)}</p>\n{_formula_line(entry)}"
                f'<div class="numbers">{_numbers(entry)}</div>\n</a>'
            )
        sections.append(
            f'<section class="category" id="{slug}">\n<h2>{escape(title)}</h2>\n'
            f'<p class="lead">{prose_html(blurb[0].upper() + blurb[1:])}.</p>\n'
            f'<div class="cards">\n{chr(10).join(cards)}\n</div>\n</section>'
        )
    body = f"""<header>
<h1>The kdsl gallery</h1>
<p class="lead">Operators written in kdsl's DSL and operators that search found, by category. Each page
has the operator's formula, a drawing of its primitive graph, Python that builds it as a PyTorch module,
its cost, its loop nest and its measured latencies (forward, batch {batch}, milliseconds summed over
the operator's ResNet-18 layers). The badges say whether <code>kdsl gallery rediscover</code>'s search
found the operator again from its input and output shapes.</p>
<nav class="toc">{toc}</nav>
<input id="filter" type="search" placeholder="filter: a name, a word of the summary" aria-label="filter">
</header>
<main>
{chr(10).join(sections)}
</main>
<footer>Built by <code>kdsl gallery build</code>. The same pages in Markdown: <code>README.md</code> and
<code>pages/</code> beside this folder.</footer>
{_FILTER}"""
    return page_html("The kdsl gallery", body, banner=banner)


def _cost_table(entry: Entry) -> str:
    if entry.table is None:
        return ""
    rows = []
    for layer in solve.load_layers(entry.table):
        try:
            shapes = solve.shapes(entry.op, layer)
            costs = solve.cost(entry.op, layer)
        except KdslError as error:
            rows.append(f"<tr><td>{escape(layer.name)}</td><td colspan=4>not valid: {escape(error.message)}</td></tr>")
            continue
        rows.append(
            f"<tr><td>{escape(layer.name)}</td><td>{list(shapes['input'])}</td><td>{list(shapes['output'])}</td>"
            f'<td class="num">{costs["flops"] / 1e6:.2f}</td><td class="num">{costs["params"]}</td></tr>'
        )
    head = "<tr><th>layer</th><th>input</th><th>output</th><th>M MACs</th><th>params</th></tr>"
    return f"<p>On the <code>{escape(entry.table)}</code> layers:</p>\n<table>{head}{''.join(rows)}</table>"


def _rows(pairs: Sequence[tuple[str, str]], *, code: bool = False) -> str:
    """A two-column table of labels and values (``code``: the values in monospace)."""
    cell = "<td><code>{}</code></td>" if code else "<td>{}</td>"
    return "<table>" + "".join(f"<tr><th>{escape(a)}</th>{cell.format(escape(b))}</tr>" for a, b in pairs) + "</table>"


def _operator(
    entry: Entry, previous: Entry | None, following: Entry | None, titles: Mapping[str, str], banner: str = ""
) -> str:
    crumbs = [
        '<a href="index.html">← the gallery</a>',
        f'<a href="index.html#{entry.category}">{escape(titles[entry.category])}</a>',
    ]
    if previous:
        crumbs.append(f'<a href="{previous.name}.html">previous: {escape(previous.name)}</a>')
    if following:
        crumbs.append(f'<a href="{following.name}.html">next: {escape(following.name)}</a>')
    nav = f'<nav class="crumbs">{"".join(crumbs)}</nav>'
    described = []
    for kind, text in description_blocks(entry.description) if entry.description.strip() else []:
        if kind == "record":
            items = "".join(f"<li>{prose_html(row)}</li>" for row in text.splitlines())
            described.append(f'<ul class="record">{items}</ul>')
            continue
        described.append(
            f'<pre class="formula">{escape(text)}</pre>' if kind == "formula" else f"<p>{prose_html(text)}</p>"
        )
    formulas = solve.cost(entry.op)
    parts = [f"<header>{nav}\n<h1>{escape(entry.name)}</h1>\n<div>{_badges(entry)}</div>\n</header>\n<main>"]
    parts += described
    if entry.table or not entry.new:
        parts += ["<h2>Use it</h2>", f"<pre><code>{escape(use_it(entry.name, entry.op, entry.table))}</code></pre>"]
    parts += [
        "<h2>Primitive graph</h2>",
        f'<figure class="diagram"><img src="{entry.name}.svg" alt="the primitive graph of {escape(entry.name)}">'
        f"<figcaption>{escape(GRAPH_LEGEND if not entry.op.is_linear else LEGEND)}</figcaption></figure>",
        "<h2>DSL</h2>",
        f"<pre><code>{escape(entry.op.to_dsl().rstrip())}</code></pre>",
        "<h2>Cost</h2>",
        _rows(
            [
                ("multiply-accumulates", str(formulas["flops"])),
                ("parameters", str(formulas["params"])),
                ("canonical key", entry.op.key),
            ],
            code=True,
        ),
        _cost_table(entry),
        "<h2>Loop nest</h2>",
        f"<pre><code>{escape(loop_nest(entry.op))}</code></pre>",
    ]
    if entry.metrics:
        parts += ["<h2>Measured</h2>", _rows([(metric_label(k), _format(v)) for k, v in entry.metrics.items()])]
    if entry.search:
        parts += ["<h2>Rediscovery by search</h2>", _rows(search_rows(entry.search))]
    if entry.new:
        parts += ["<h2>PyTorch source</h2>", f"<pre><code>{escape(source(entry.op).rstrip())}</code></pre>"]
    parts.append(f"</main>\n<footer>{nav}</footer>")
    return page_html(f"{entry.name} · kdsl gallery", "\n".join(parts), banner=banner)


def _format(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "-" if value is None else str(value)


def write_site(folder: Path, entries: Sequence[Entry], *, batch: int = 1, banner: str = "") -> Path:
    """Write the site for ``entries`` (in index order) into ``folder``; return ``folder/index.html``.
    ``banner``: HTML put at the top of every page (the docs site's navigation)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "style.css").write_text(STYLE)
    titles = {slug: title for slug, title, _ in CATEGORIES}
    for number, entry in enumerate(entries):
        previous = entries[number - 1] if number else None
        following = entries[number + 1] if number + 1 < len(entries) else None
        (folder / f"{entry.name}.svg").write_text(svg(entry.op))
        (folder / f"{entry.name}.html").write_text(_operator(entry, previous, following, titles, banner))
    (folder / "index.html").write_text(_index(entries, batch, banner))
    return folder / "index.html"
