"""The gallery as people browse it: ``kdsl gallery build --no-measure`` writes the Markdown index
and pages and the HTML site; every local link and image resolves, every operator has its pages,
pages link back to the index, and no formula is mangled into Markdown emphasis."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from cli_process import run_kdsl

from kdsl import gallery
from kdsl.gallery import pages
from kdsl.gallery.content import description_blocks, first_sentence

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A gallery built by the ``kdsl`` command into a fresh folder, from copies of the recorded
    latencies and rediscovery records (read, never written: nothing is measured)."""
    out = tmp_path_factory.mktemp("gallery")
    for name in ("latencies.json", "rediscovery.json"):
        shutil.copy(gallery.directory() / name, out / name)
    printed = run_kdsl("gallery", "build", "--no-measure", "--out", str(out))
    assert str(out / "site" / "index.html") in printed
    return out


def _references(path: Path) -> list[str]:
    """Every link target and image source of a Markdown or HTML file."""
    text = path.read_text()
    found = re.findall(r"""(?:href|src)=["']([^"']+)["']""", text)
    if path.suffix == ".md":
        found += re.findall(r"\]\(([^)\s]+)\)", text)
    assert found, f"{path} links nowhere"
    return found


def _anchors(path: Path) -> set[str]:
    """The fragments a file offers: HTML ids, and the anchors a code host gives Markdown headings."""
    text = path.read_text()
    if path.suffix == ".md":
        headings = re.findall(r"(?m)^#+ (.+)$", text)
        return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
    return set(re.findall(r'\bid="([^"]+)"', text))


def _check_links(built: Path) -> int:
    """Check every link and image of a built gallery; return how many there are."""
    files = [built / "README.md", *(built / "pages").glob("*.md"), *(built / "site").glob("*.html")]
    checked = 0
    for path in files:
        for target in _references(path):
            assert not re.match(r"[a-z]+:", target), f"{path.name}: {target} is not local"
            file, _, fragment = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            assert resolved.is_file(), f"{path.name}: {target} does not exist"
            if fragment:
                assert fragment in _anchors(resolved), f"{path.name}: no #{fragment} in {resolved.name}"
            checked += 1
    assert checked > 0
    return checked


def test_every_local_link_and_image_resolves(built: Path) -> None:
    assert _check_links(built) >= 10 * len(gallery.names())


def test_discoveries_get_pages_marked_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gallery, "names", lambda: ["conv2d"])
    found = gallery.load("depthwise_conv2d")
    pages.build_gallery(tmp_path, discoveries=[("cand_1f2e", found, {"accuracy": 0.91, "latency_ms": None})])
    assert _check_links(tmp_path) >= 10
    index = (tmp_path / "site" / "index.html").read_text()
    assert 'id="discoveries"' in index and 'class="badge new"' in index
    page = (tmp_path / "pages" / "cand_1f2e.md").read_text()
    assert page.startswith("[← the gallery](../README.md)") and "# cand_1f2e (new)" in page
    assert "## PyTorch source" in page and "| latency (ms) | - |" in page


def test_every_operator_has_pages_linked_both_ways(built: Path) -> None:
    index_md, index_html = (built / "README.md").read_text(), (built / "site" / "index.html").read_text()
    for name in gallery.names():
        page_md = built / "pages" / f"{name}.md"
        page_html = built / "site" / f"{name}.html"
        for path in (page_md, page_html, built / "pages" / f"{name}.svg", built / "site" / f"{name}.svg"):
            assert path.is_file() and path.stat().st_size > 0, path
        assert f"(pages/{name}.md)" in index_md and f'href="{name}.html"' in index_html, name
        assert "(../README.md)" in page_md.read_text() and 'href="index.html"' in page_html.read_text(), name


def test_index_groups_by_category_with_search_badges(built: Path) -> None:
    index = (built / "site" / "index.html").read_text()
    sections = re.findall(r'<section class="category" id="([^"]+)">', index)
    assert {"convolutions", "pooling", "papers"} <= set(sections)
    conv = index[index.index('id="convolutions"') : index.index('id="pooling"')]
    assert 'href="conv2d.html"' in conv and 'href="max_pool2d.html"' not in conv
    records = gallery.directory() / "rediscovery.json"
    found = [name for name, record in json.loads(records.read_text()).items() if record.get("found")]
    assert found, "the records hold no rediscovered operator"
    for name in found:
        card = index[index.index(f'href="{name}.html"') :].split("</a>", 1)[0]
        assert 'class="badge found"' in card, name


def _unescaped_emphasis(markdown: str) -> list[str]:
    """Characters outside code that a code host would take for emphasis: any unescaped ``*``, and
    an unescaped ``_`` that is not inside a word."""
    text = re.sub(r"(?ms)^```.*?^```", "", markdown)  # fenced blocks
    text = re.sub(r"(`+).+?\1", "", text)  # code spans
    text = re.sub(r"<[^>]+>|\]\([^)]*\)", "", text)  # tags and link targets
    text = text.replace("\\\\", "")
    bad = [m.group() for m in re.finditer(r"(?<!\\)\*", text)]
    bad += [m.group() for m in re.finditer(r"(?<![\\\w])_|(?<!\\)_(?!\w)", text)]
    return bad


def test_markdown_formulas_are_never_emphasis(built: Path) -> None:
    assert _unescaped_emphasis("a `g*Cin` b \\* c \\_d\n```\n*x*\n```\nW2_formula") == []
    assert _unescaped_emphasis("g*Cin/G + ci, c < Cout/(G*s)") == ["*", "*"]
    for path in [built / "README.md", *(built / "pages").glob("*.md")]:
        assert _unescaped_emphasis(path.read_text()) == [], path.name
    # syno_op1's formulas are kept whole in code blocks, as the .dsl file writes them
    page = (built / "pages" / "syno_op1.md").read_text()
    formulas = [text for kind, text in description_blocks(gallery.describe("syno_op1")) if kind == "formula"]
    assert len(formulas) == 3 and all(f"```text\n{formula}\n```" in page for formula in formulas)
    assert "x[n, g*Cin/G + ci, h + kh - K//2" in (built / "site" / "syno_op1.html").read_text()


def test_measured_numbers_have_labels_not_keys(built: Path) -> None:
    for path in [*(built / "pages").glob("*.md"), *(built / "site").glob("*.html")]:
        assert "kdsl_fwd_ms" not in path.read_text(), path.name
    assert "kdsl → PyTorch, forward (ms)" in (built / "pages" / "conv2d.md").read_text()


def test_the_use_it_snippet_builds_the_module(built: Path) -> None:
    page = (built / "pages" / "depthwise_separable_conv2d.md").read_text()
    snippet = page.split("## Use it\n\n```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, object] = {}
    exec(snippet, namespace)  # the page's own code: load, build, run once
    shape = [int(n) for n in re.findall(r"\d+", snippet.rsplit("# y:", 1)[1])]
    assert list(namespace["y"].shape) == shape and type(namespace["module"]).__name__ != "function"


def test_diagrams_name_the_dims_they_act_on(built: Path) -> None:
    picture = (built / "site" / "conv2d.svg").read_text()
    assert ">Unfold(H, K)<" in picture and ">Reduce(Cin)<" in picture and ">Unfold<" not in picture


def test_gallery_list_prints_whole_first_sentences() -> None:
    printed = " ".join(run_kdsl("gallery", "list").split())
    for name in gallery.names():
        assert f"{name} {first_sentence(gallery.describe(name))}" in printed, name
    assert "plus a light depth-wise branch. conv1d" in printed  # the sentence that spans three lines


def test_a_discoverys_provenance_is_one_item_per_line(built: Path) -> None:
    # seen in a screenshot: the provenance lines (command, search, accuracy, ...) ran together
    name = "syno_op2_input_shift"
    page = (built / "pages" / f"{name}.md").read_text()
    html = (built / "site" / f"{name}.html").read_text()
    assert "\n- accuracy: 0.9557\n" in page and "\n- MACs ratio to conv2d: 0.25\n" in page
    assert '<ul class="record">' in html and "<li>params: 783360</li>" in html
