"""The docs: every guide page's examples run (doctest, the same flags as the modules' doctests), the site
builds with ``kdsl docs build``, every local link and image of it resolves, and a headless browser
renders the index, a tutorial and a gallery page (skipped, saying why, when no Chromium is installed:
``scripts/ensure_browser.sh`` installs it where apt-get can)."""

from __future__ import annotations

import doctest
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from backends import backend
from cli_process import run_kdsl

from kdsl import gallery
from kdsl.gallery.docs_site import guide_order
from kdsl.gallery.markdown import headings, slug

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide"
PAGES = sorted(GUIDE.glob("*.md"))
FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS  # pyproject's doctest_optionflags
#: the backends a page's examples load, read from their code
NEEDS = {"torch": re.compile(r"import torch|codegen import torch|kdsl\.nn|kdsl_torch"), "tvm": re.compile(r"tvm")}


def test_the_guide_has_its_pages() -> None:
    names = {page.stem for page in PAGES}
    expected = {"index", "writing-an-operator", "branching-kernels", "checking-layers", "search", "discover"}
    expected |= {"tuning", "pytorch-and-tvm", "testing-backends", "gpu"}
    assert expected <= names, sorted(expected - names)
    linked = [page.stem for page in guide_order(GUIDE)]
    assert set(linked) == names and linked[0] == "index"


@pytest.mark.parametrize("page", PAGES, ids=[page.stem for page in PAGES])
def test_each_guide_page_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = "\n".join(re.findall(r"(?m)^(?:>>>|\.\.\.) (.*)$", page.read_text()))
    for name, pattern in NEEDS.items():
        if pattern.search(code):
            backend(name)  # skips when KDSL_TEST_BACKENDS leaves it out
    monkeypatch.chdir(tmp_path)  # files the examples write (databases, kernels) land here
    failed, attempted = doctest.testfile(
        str(page), module_relative=False, optionflags=FLAGS, globs={"__name__": page.stem}, report=True
    )
    if page.stem != "index":
        assert attempted >= 3, f"{page.name} has {attempted} examples; a tutorial page runs its code"
    assert failed == 0, f"{failed} of {attempted} examples of {page.name} failed (printed above)"


def test_examples_end_before_their_closing_fence() -> None:
    # doctest reads a ``` right after an output as part of the expected output: a blank line ends it
    for page in PAGES:
        for block in re.findall(r"(?ms)^```python\n(.*?)^```", page.read_text()):
            if ">>>" in block:
                assert block.endswith("\n\n"), f"{page.name}: end the block with a blank line:\n{block}"


def test_the_guides_and_the_readmes_links_resolve_in_the_repository() -> None:
    # read on a code host, the Markdown links its own files: each must exist, with the heading it names
    checked = 0
    for page in [*PAGES, ROOT / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, fragment = target.partition("#")
            resolved = (page.parent / file).resolve() if file else page
            assert resolved.exists(), f"{page.name}: {target} does not exist"
            if fragment:
                anchors = {slug(words) for _, words in headings(resolved.read_text())}
                assert fragment in anchors, f"{page.name}: no heading #{fragment} in {resolved.name}"
            checked += 1
    assert checked >= 2 * len(PAGES)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    printed = run_kdsl("docs", "build", "--out", str(out))
    assert str(out / "index.html") in printed
    return out


def test_a_site_folder_that_is_a_file_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "site").write_text("not a folder")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "kdsl.cli", "docs", "build", "--out", str(tmp_path / "site")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 2 and "is a file: choose another --out" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def _ids(path: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', path.read_text()))


def test_every_local_link_and_image_of_the_site_resolves(site: Path) -> None:
    checked = 0
    for path in site.rglob("*.html"):
        for target in re.findall(r"""(?:href|src)=["']([^"']+)["']""", path.read_text()):
            if re.match(r"[a-z]+:", target):
                assert target.startswith(("http://", "https://")), f"{path.name}: {target}"
                continue
            file, _, fragment = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            assert resolved.is_file(), f"{path.relative_to(site)}: {target} does not exist"
            if fragment and resolved.suffix == ".html":
                assert fragment in _ids(resolved), f"{path.relative_to(site)}: no #{fragment} in {resolved.name}"
            checked += 1
    assert checked >= 10 * len(gallery.names())


def test_the_site_has_every_page_and_one_navigation(site: Path) -> None:
    for page in PAGES:
        html = site / f"{page.stem}.html"
        assert html.is_file(), html
        assert '<nav class="site">' in html.read_text() and 'href="gallery/index.html"' in html.read_text()
    gallery_page = (site / "gallery" / "conv2d.html").read_text()
    assert 'href="../api.html"' in gallery_page and 'href="../style.css"' not in gallery_page
    api = (site / "api.html").read_text()
    for anchor in ("kdsl.solve.check", "kdsl.codegen.torch.build", "kdsl.search.search", "kdsl.lang.Unfold"):
        assert f'id="{anchor}"' in api, anchor
    assert "Not imported here" not in api, "an API module failed to import in the test environment"
    assert not re.search(r" at 0x[0-9a-f]+", api), "a memory address makes two builds differ"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _rendered(url: str) -> str:
    """The DOM of ``url`` after its scripts ran, from a headless Chromium."""
    binary = _chromium()
    if binary is None:
        pytest.skip("no chromium binary on PATH (scripts/ensure_browser.sh installs one with apt-get)")
    command = [binary, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--dump-dom", url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "</html>" in result.stdout, result.stderr[-2000:]
    return result.stdout


def test_a_browser_renders_the_index_a_tutorial_and_a_gallery_page(site: Path) -> None:
    index = _rendered((site / "index.html").as_uri())
    assert "<h1" in index and 'href="writing-an-operator.html"' in index and 'href="api.html"' in index
    tutorial = _rendered((site / "writing-an-operator.html").as_uri())
    assert re.search(r"<h1[^>]*>Writing an operator</h1>", tutorial) and "<pre><code" in tutorial
    # the gallery's filter script ran: ?q=pool leaves the pooling cards shown and hides conv2d's
    cards = _rendered((site / "gallery" / "index.html").as_uri() + "?q=pool")
    shown = re.findall(r'<a class="card" href="([\w]+)\.html"', cards)
    hidden = re.findall(r'<a class="card hidden" href="([\w]+)\.html"', cards)
    assert "max_pool2d" in shown and "avg_pool2d" in shown and "conv2d" in hidden, (shown, hidden)
    page = _rendered((site / "gallery" / "conv2d.html").as_uri())
    assert "<h1>conv2d</h1>" in page and "Cin*Cout*H*K**2*N*W" in page
