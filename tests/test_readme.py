"""The README's Python examples run: each ```python block, in order, in one namespace (a later
block may use what an earlier one defined, as a reader would in one session)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks(text: str) -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    assert blocks, "the README has no ```python block"
    return blocks


def test_the_readme_python_examples_run():
    pytest.importorskip("torch")
    namespace: dict[str, object] = {"__name__": "readme"}
    blocks = python_blocks(README.read_text())
    for index, block in enumerate(blocks):
        try:
            exec(compile(block, f"README.md python block {index + 1}", "exec"), namespace)
        except Exception as error:  # say which block, then fail with the error itself
            raise AssertionError(f"README.md python block {index + 1} failed: {error!r}\n{block}") from error
    assert len(blocks) >= 4 and "module" in namespace
