"""The import structure of ``kdsl/`` (DESIGN.md, "Layers"): no import cycles between modules, and no
import from a package to one above it.

The project's checker, ``../shared/hooks/import_structure.py``, lives outside the repository; where it
exists (a development checkout) it runs too. The same two properties are checked here with ``ast``
either way, so a clean clone in CI checks them as well. Imports inside functions count, and so do
imports of a package's ``__init__`` (``from kdsl import solve``), as in the hook.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HOOK = ROOT.parent / "shared" / "hooks" / "import_structure.py"

#: the layers, lowest first (DESIGN.md's table): a package may import its own modules and those of
#: packages of a lower rank; packages of one rank may import each other (no cycle between modules)
RANK = {
    "runtime": 0,
    "lang": 0,
    "solve": 1,
    "codegen": 2,
    "search": 3,
    "tune": 3,
    "discover": 4,
    "gallery": 4,
    "nn": 4,
    "testing": 4,
    "bench": 5,
    "cli": 6,
}
#: packages restricted further: the only kdsl modules they may import from other packages
ONLY = {
    "runtime": {"kdsl.lang.errors"},  # the standard library, numpy, psutil, and the error family
    "lang": set(),  # sympy only
}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (ROOT / "kdsl").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the kdsl modules it imports (a name imported from a module counts as that module)."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target) if target.startswith("kdsl") else None
                # kdsl's own __init__ (``from kdsl import __version__``) is above every layer: not an edge
                if found and found not in (mod, "kdsl") and not mod.startswith(found + "."):
                    edges[mod].add(found)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _upward(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, targets in sorted(edges.items()):
        source = mod.split(".")[1] if "." in mod else None
        for target in sorted(targets):
            dest = target.split(".")[1] if "." in target else None
            if source is None or dest is None or source == dest:
                continue
            if source not in RANK or dest not in RANK:
                bad.append(
                    f"{mod} -> {target}: kdsl/{source if source not in RANK else dest}/ is not in the layer table"
                )
            elif RANK[dest] > RANK[source]:
                bad.append(f"{mod} -> {target}: {dest} is above {source}")
            elif source in ONLY and target not in ONLY[source]:
                allowed = ", ".join(sorted(ONLY[source])) or "no module of another package"
                bad.append(f"{mod} -> {target}: {source} may import {allowed}")
    return bad


def test_no_import_cycles():
    assert _cycles(_edges(_modules())) == []


def test_no_upward_imports():
    assert _upward(_edges(_modules())) == []


def test_the_checks_find_what_they_look_for():
    edges = {"kdsl.a.x": {"kdsl.b.y"}, "kdsl.b.y": {"kdsl.a.x"}, "kdsl.c": set()}
    assert _cycles(edges) == [["kdsl.a.x", "kdsl.b.y"]]
    upward = {
        "kdsl.solve.x": {"kdsl.codegen.y", "kdsl.lang.z"},
        "kdsl.runtime.t": {"kdsl.lang.errors", "kdsl.lang.sizes"},
        "kdsl.lang.u": {"kdsl.runtime.t"},
    }
    assert _upward(upward) == [
        "kdsl.lang.u -> kdsl.runtime.t: lang may import no module of another package",
        "kdsl.runtime.t -> kdsl.lang.sizes: runtime may import kdsl.lang.errors",
        "kdsl.solve.x -> kdsl.codegen.y: codegen is above solve",
    ]


def test_every_package_is_in_the_layer_table():
    packages = {p.name for p in (ROOT / "kdsl").iterdir() if (p / "__init__.py").exists()}
    assert packages == set(RANK)


@pytest.mark.skipif(not HOOK.exists(), reason="the shared import-structure hook is not beside this checkout")
def test_the_shared_hook_finds_no_cycle_and_no_upward_import():
    result = subprocess.run(
        [sys.executable, str(HOOK)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    summary = re.search(r"(\d+) import cycles, (\d+) upward imports", result.stdout)
    assert summary, result.stdout + result.stderr
    assert summary.groups() == ("0", "0"), result.stdout
