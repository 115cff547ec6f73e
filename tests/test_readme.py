"""The README's Python examples run, each ```python block on its own in a fresh namespace (a reader
may copy any one of them into a new session), and the ones that name layer sizes use the names
the built-in layer tables bind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from backends import backend

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks(text: str) -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    assert blocks, "the README has no ```python block"
    return blocks


BLOCKS = python_blocks(README.read_text())


def run_block(index: int) -> dict[str, object]:
    """Run README block ``index`` (0-based) alone; fail naming the block, with the error itself."""
    namespace: dict[str, object] = {"__name__": "readme"}
    block = BLOCKS[index]
    try:
        exec(compile(block, f"README.md python block {index + 1}", "exec"), namespace)
    except Exception as error:  # say which block, then fail with the error itself
        raise AssertionError(f"README.md python block {index + 1} failed on its own: {error!r}\n{block}") from error
    assert len(namespace) > 1, f"README.md python block {index + 1} defined nothing"
    return namespace


def test_the_readme_has_its_examples():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_each_readme_python_example_runs_on_its_own(index):
    backend("torch")
    namespace = run_block(index)
    assert any(name in namespace for name in ("module", "y", "filled", "padding")), sorted(namespace)


def test_the_readme_examples_bind_channels_as_the_layer_tables_do():
    from kdsl import solve

    se = run_block(1)["squeeze_excitation"]
    solve.check(se, "resnet18")  # raises if a dim the tables do not bind (such as C) is left free
    assert "Cin" in se.to_dsl() and not re.search(r"\bC\b", se.to_dsl())
