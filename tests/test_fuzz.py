"""Fuzzing the two ways operators come in from outside: DSL text and JSON documents.

Mutations of the gallery's DSL files and of their JSON forms (byte flips, truncations, token
swaps, random identifiers, keywords, huge numbers, unicode, newlines, deep nesting, very long
inputs), and of branching kernels' (the gallery's and drawn ones): their node arguments pointing
at themselves, later or missing nodes, nodes reordered, dropped, duplicated or changed in kind.
For every input: no exception but a KdslError, no input taking over a second, and every accepted
input reads back equal from its own DSL text and JSON.

A CI-sized sample always runs; ``KDSL_SLOW_TESTS=1`` runs 10,000 texts and 10,000 documents.
Everything is seeded, so a failure names an input that fails again.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import string
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kdsl
from kdsl.lang import Input, Map, Output, primary
from kdsl.lang.errors import KdslError
from kdsl.lang.names import MAX_CONSTANT, MAX_OFFSET
from kdsl.lang.nonlinear import BLEND_KINDS, MAP_FUNCTIONS
from kdsl.testing import strategies as kst

SLOW = bool(os.environ.get("KDSL_SLOW_TESTS"))
DSL_COUNT = 10_000 if SLOW else 800
JSON_COUNT = 10_000 if SLOW else 700
MAX_SECONDS = 1.0

GALLERY = Path(__file__).resolve().parent.parent / "gallery"
SOURCES = sorted(path.read_text() for path in GALLERY.glob("*.dsl"))
DOCUMENTS = [kdsl.parse(source).to_json() for source in SOURCES]

HUGE = [
    str(MAX_CONSTANT),
    str(MAX_CONSTANT + 1),
    str(MAX_OFFSET - 1),
    str(MAX_OFFSET),
    str(2**63),
    str(2**64 + 1),
    "9" * 400,
    "-" + str(2**63),
    "1e308",
    "1e999",
    "0",
    "-1",
    "0x10",
    "1_000",
    "3.5",
]
KEYWORDS = ["lambda", "None", "class", "True", "import", "def", "match", "case", "type", "_", "__import__"]
DSL_WORDS = ["Input", "Output", "Weight", "Dim", "primary", "coefficient", "Split", "Merge", "Shift"]
DSL_WORDS += ["Expand", "Unfold", "Stride", "Reduce", "Share", "op", "mean", "name", "defaults", "kdsl"]
# branching kernels: Canvas's steps, the joins, their keywords and choices
DSL_WORDS += ["Map", "Fold", "Softmax", "FC", "Rename", "Blend", "Product", "by", "how", "size", "weight"]
DSL_WORDS += [*MAP_FUNCTIONS, *BLEND_KINDS]
ODD_TEXT = [
    "\n",
    "\r",
    "\t",
    " ",
    "\x00",
    "é",
    "\u210c",
    "\U0001d511",
    "\u200b",
    "\ufeff",
    "٣",
    "²",
    '"',
    "'",
    "\\",
    "#",
]
PUNCTUATION = ["(", ")", ",", ">>", "*", "/", "**", "-", "=", ":", "{", "}", "[", "]", ".", "@", "<<", "|"]


def random_identifier(rng: random.Random) -> str:
    first = rng.choice(string.ascii_letters + "_")
    rest = "".join(rng.choice(string.ascii_letters + string.digits + "_") for _ in range(rng.randrange(0, 12)))
    name = first + rest
    return name if rng.random() < 0.9 else name * rng.randrange(10, 40)  # sometimes past the length bound


def random_token(rng: random.Random) -> str:
    pool = rng.choice([HUGE, KEYWORDS, DSL_WORDS, ODD_TEXT, PUNCTUATION, None])
    if pool is None:
        token = random_identifier(rng)
        return f'"{token}"' if rng.random() < 0.4 else token
    return rng.choice(pool)


_TOKENS = re.compile(r"\w+|\"[^\"\n]*\"|>>|\*\*|\S")


# -- DSL mutations ------------------------------------------------------------------------------


def flip(rng: random.Random, text: str) -> str:
    if not text:
        return random_token(rng)
    position = rng.randrange(len(text))
    replacement = rng.choice([chr(rng.randrange(32, 127)), rng.choice(ODD_TEXT), chr(rng.randrange(0x80, 0x3000))])
    return text[:position] + replacement + text[position + 1 :]


def truncate(rng: random.Random, text: str) -> str:
    return text[: rng.randrange(len(text) + 1)]


def delete(rng: random.Random, text: str) -> str:
    start = rng.randrange(len(text) + 1)
    return text[:start] + text[start + rng.randrange(1, 30) :]


def swap_tokens(rng: random.Random, text: str) -> str:
    spans = [m.span() for m in _TOKENS.finditer(text)]
    if len(spans) < 2:
        return text + random_token(rng)
    (a0, a1), (b0, b1) = sorted(rng.sample(spans, 2))
    return text[:a0] + text[b0:b1] + text[a1:b0] + text[a0:a1] + text[b1:]


def replace_token(rng: random.Random, text: str) -> str:
    spans = [m.span() for m in _TOKENS.finditer(text)]
    if not spans:
        return random_token(rng)
    start, end = rng.choice(spans)
    return text[:start] + random_token(rng) + text[end:]


def rename_everywhere(rng: random.Random, text: str) -> str:
    """Rename one name consistently (the mutation most likely to still parse)."""
    names = sorted(set(re.findall(r"\b[A-Za-z_]\w*\b", text)))
    if not names:
        return text
    old = rng.choice(names)
    new = rng.choice([random_identifier(rng), rng.choice(KEYWORDS), rng.choice(DSL_WORDS), old + "\n", "_" + old])
    return re.sub(rf"\b{re.escape(old)}\b", lambda _: new, text)


def insert_token(rng: random.Random, text: str) -> str:
    position = rng.randrange(len(text) + 1)
    return text[:position] + random_token(rng) + text[position:]


def nest_deeply(rng: random.Random, text: str) -> str:
    depth = rng.choice([50, 500, 5_000, 50_000])
    kind = rng.choice(["parens", "calls", "binops", "lists"])
    if kind == "parens":
        body = "(" * depth + "N" + ")" * depth
    elif kind == "calls":
        body = "Reduce(" * depth + "N" + ")" * depth
    elif kind == "binops":
        body = "N" + " * N" * depth
    else:
        body = "[" * depth + "]" * depth
    return text + f"\nx = {body}\n"


def make_long(rng: random.Random, text: str) -> str:
    lines = text.splitlines(keepends=True) or [text]
    line = rng.choice(lines)
    kind = rng.choice(["repeat_line", "long_name", "long_pipeline", "many_dims"])
    if kind == "repeat_line":
        return text + line * rng.randrange(100, 5_000)
    if kind == "long_name":
        return text.replace("op", "op" + "x" * rng.randrange(100, 100_000), 1)
    if kind == "long_pipeline":
        steps = " >> ".join(["Shift(N)"] * rng.randrange(100, 2_000))
        return text + f'\nN = primary("N")\nop = Input(N) >> {steps} >> Output(N)\n'
    names = [f"d{i}" for i in range(rng.randrange(100, 1_500))]
    return (
        f'{", ".join(names)} = primary("{" ".join(names)}")\n'
        f"op = Input({', '.join(names)}) >> Reduce({names[0]}) >> Output({', '.join(names[1:])})\n"
    )


DSL_MUTATIONS: list[Callable[[random.Random, str], str]] = [
    flip,
    truncate,
    delete,
    swap_tokens,
    replace_token,
    rename_everywhere,
    insert_token,
    nest_deeply,
    make_long,
]


def dsl_inputs(count: int, seed: int) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(count):
        text = rng.choice(SOURCES)
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            mutation = rng.choice(DSL_MUTATIONS)
            # the expensive mutations stay rare, so the sample is mostly near-valid programs
            if mutation in (nest_deeply, make_long) and rng.random() < 0.7:
                mutation = rename_everywhere
            text = mutation(rng, text)
        yield text


# -- JSON mutations -----------------------------------------------------------------------------


def random_value(rng: random.Random) -> Any:
    choice = rng.randrange(12)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False])
    if choice == 2:
        return rng.choice([0, 1, -1, 2, 3, MAX_CONSTANT, MAX_CONSTANT + 1, MAX_OFFSET, 2**63, -(2**63), 10**400])
    if choice == 3:
        return rng.choice([0.5, 1e308, -0.0, 3.0])
    if choice == 4:
        return random_identifier(rng)
    if choice == 5:
        return rng.choice(KEYWORDS + DSL_WORDS)
    if choice == 6:
        return random_identifier(rng) + rng.choice(ODD_TEXT)
    if choice == 7:
        return rng.choice(["N*K", "Cin/G", "Cout/(G*s)", "K**17", "N**-1", "2*N", "1", "0", "N/N", "x.y", "N(", ""])
    if choice == 8:
        return [random_value(rng) for _ in range(rng.randrange(3))]
    if choice == 9:
        return {random_identifier(rng): random_value(rng) for _ in range(rng.randrange(3))}
    if choice == 10:
        return {"op": rng.choice(DSL_WORDS), "dim": "N", "name": random_identifier(rng)}
    return rng.choice(HUGE)


def paths(node: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from paths(value, prefix + (index,))


def mutate_document(rng: random.Random, document: Any) -> Any:
    """Change one node of the parsed document: replace, delete, duplicate or rename it."""
    targets = [p for p in paths(document) if p]
    path = rng.choice(targets)
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    action = rng.randrange(6)
    if action == 0:
        parent[key] = random_value(rng)
    elif action == 1:
        del parent[key]
    elif action == 2 and isinstance(parent, list):
        parent.insert(key, json.loads(json.dumps(parent[key])))
    elif action == 3 and isinstance(parent, list) and len(parent) > 1:
        other = rng.randrange(len(parent))
        parent[key], parent[other] = parent[other], parent[key]
    elif action == 4 and isinstance(parent[key], str):
        old = parent[key]
        new = rng.choice([random_identifier(rng), rng.choice(KEYWORDS + DSL_WORDS), old + "\n", "_" + old])
        # renaming a name everywhere keeps the document consistent, so it may still be accepted
        return json.loads(json.dumps(document).replace(json.dumps(old), json.dumps(new)))
    else:
        parent[key] = random_value(rng)
    return document


def json_text_mutation(rng: random.Random, text: str) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        return flip(rng, text)
    if kind == 1:
        return truncate(rng, text)
    if kind == 2:
        depth = rng.choice([100, 10_000, 200_000])
        return text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    if kind == 3:
        return text + " " * rng.randrange(1, 1_100_000)  # past the size limit, or just under it
    return swap_tokens(rng, text)


def json_inputs(count: int, seed: int) -> Iterator[str | bytes]:
    rng = random.Random(seed)
    for _ in range(count):
        text = rng.choice(DOCUMENTS)
        if rng.random() < 0.75:
            document = json.loads(text)
            for _ in range(rng.choice([1, 1, 2, 3])):
                document = mutate_document(rng, document)
            text = json.dumps(document)
        else:
            text = json_text_mutation(rng, text)
        yield text.encode() if rng.random() < 0.05 else text


# -- checking -----------------------------------------------------------------------------------


class Tally:
    """What a fuzz run saw: accepted and refused inputs, the slowest, and any failures."""

    def __init__(self) -> None:
        self.accepted = 0
        self.refused = 0
        self.slowest = 0.0
        self.failures: list[str] = []

    @property
    def checked(self) -> int:
        return self.accepted + self.refused

    def check(self, read: Callable[[Any], kdsl.Operator], item: str | bytes) -> None:
        start = time.perf_counter()
        try:
            op = read(item)
        except KdslError:
            self.refused += 1
            op = None
        except Exception:  # anything but a KdslError is a bug: record the input that caused it
            self.failures.append(f"{traceback.format_exc(limit=-3)}\ninput: {item[:500]!r}")
            return
        try:
            if op is not None:
                self.accepted += 1
                if kdsl.parse(op.to_dsl()) != op:
                    self.failures.append(f"DSL round trip changed the operator\ninput: {item[:500]!r}")
                if kdsl.from_json(op.to_json()) != op:
                    self.failures.append(f"JSON round trip changed the operator\ninput: {item[:500]!r}")
        except Exception:  # an accepted operator whose own text does not read back
            self.failures.append(f"round trip raised\n{traceback.format_exc(limit=-3)}\ninput: {item[:500]!r}")
        elapsed = time.perf_counter() - start
        if elapsed > MAX_SECONDS:
            # timed once more: a pathological input is slow every time, a collector's pass over the full suite's
            # heap or a stalled VM is not (a 5 ms gallery mutant once took 1.09 s late in a full run on Zen 3)
            start = time.perf_counter()
            with contextlib.suppress(Exception):  # only timed: what it raises was recorded above
                again = read(item)
                kdsl.parse(again.to_dsl())
                kdsl.from_json(again.to_json())
            elapsed = min(elapsed, time.perf_counter() - start)
        self.slowest = max(self.slowest, elapsed)
        if elapsed > MAX_SECONDS:
            self.failures.append(f"took {elapsed:.2f} s\ninput: {item[:500]!r}")

    def assert_sound(self, target: int) -> None:
        assert not self.failures, f"{len(self.failures)} failures; first:\n" + "\n---\n".join(self.failures[:3])
        assert self.checked >= target
        # both outcomes must be common, or the sample tests one side only
        assert self.accepted >= target // 50, f"only {self.accepted} of {self.checked} inputs were accepted"
        # at least 2 in 5 refused: per gallery source the share refused is 38-59% (200 one-edit mutants
        # each, measured when attention_qk and bmm joined); the mix of sources moved the total just below a half
        assert self.refused >= target * 2 // 5, f"only {self.refused} of {self.checked} inputs were refused"
        assert self.slowest <= MAX_SECONDS


def test_gallery_sources_read_back():
    assert len(SOURCES) >= 10 and len(DOCUMENTS) == len(SOURCES)
    for source in SOURCES:
        op = kdsl.parse(source)
        assert kdsl.parse(op.to_dsl()) == op and kdsl.from_json(op.to_json()) == op


FORMATS = {  # each text format: what fuzzes it, how many inputs, what reads it
    "dsl": (dsl_inputs, DSL_COUNT, kdsl.parse),
    "json": (json_inputs, JSON_COUNT, kdsl.from_json),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("text_format", sorted(FORMATS))
def test_fuzzed_text_raises_only_kdsl_errors_and_round_trips(text_format, seed):
    inputs, count, read = FORMATS[text_format]
    tally = Tally()
    for text in inputs(count // 2, seed):
        tally.check(read, text)
    tally.assert_sound(count // 2)


def test_the_tally_catches_what_it_should():
    tally = Tally()
    tally.check(kdsl.parse, "op = 1")  # refused
    tally.check(kdsl.parse, SOURCES[0])  # accepted
    tally.check(lambda _: {}["missing"], "x")  # a KeyError is a failure
    assert (tally.accepted, tally.refused, len(tally.failures)) == (1, 1, 1)
    assert "KeyError" in tally.failures[0]


# -- any name, any number, through JSON ---------------------------------------------------------

NAMES = st.one_of(
    st.text(max_size=12),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True),
    st.sampled_from(KEYWORDS + DSL_WORDS),
)


@given(kst.operators(), st.data())
def test_any_renamed_operator_is_refused_or_round_trips(op, data):
    """Renaming one name of a valid operator to anything gives a KdslError or an operator that
    reads back equal from its DSL and JSON (the names' rule is the same on every path)."""
    document = json.loads(op.to_json())
    names = sorted({d["name"] for d in document["inputs"]} | set(document["variables"]))
    old = data.draw(st.sampled_from(names))
    new = data.draw(NAMES)
    text = json.dumps(document).replace(json.dumps(old), json.dumps(new))
    try:
        renamed = kdsl.from_json(text)
    except KdslError:
        return
    assert kdsl.parse(renamed.to_dsl()) == renamed
    assert kdsl.from_json(renamed.to_json()) == renamed


@given(kst.operators(), st.integers(), st.integers(-(2**70), 2**70))
def test_any_default_or_offset_is_refused_or_round_trips(op, default, offset):
    document = json.loads(op.to_json())
    document["defaults"] = {name: default for name in document["defaults"]}
    for step in document["steps"]:
        if step["op"] == "Shift":
            step["offset"] = offset
    try:
        changed = kdsl.from_json(json.dumps(document))
    except KdslError:
        return
    assert kdsl.parse(changed.to_dsl()) == changed
    assert kdsl.from_json(changed.to_json()) == changed


# -- branching kernels --------------------------------------------------------------------------

GRAPH_SOURCES = [source for source in SOURCES if not kdsl.parse(source).is_linear]
GRAPH_DOCUMENTS = [kdsl.parse(source).to_json() for source in GRAPH_SOURCES]
NODE_KINDS = ["Map", "Fold", "Softmax", "FC", "Rename", "Blend", "Product", "Chain", "Share", "Input", "Output"]
LIGHT_DSL_MUTATIONS = [flip, truncate, delete, swap_tokens, replace_token, rename_everywhere, insert_token]


def mutate_graph_node(rng: random.Random, document: Any) -> Any:
    """Change the graph structure of a kernel's JSON: a node's arguments (itself, a later node, a
    missing one, a bool, too few or too many), two nodes' order, a node dropped or duplicated (so
    that something is never used), a node's kind."""
    nodes = document.get("nodes") if isinstance(document, dict) else None
    if not isinstance(nodes, list) or not nodes:
        return mutate_document(rng, document) if isinstance(document, (dict, list)) and document else document
    index = rng.randrange(len(nodes))
    node = nodes[index]
    action = rng.randrange(5)
    if action == 0 and isinstance(node, dict):
        itself = index + 1  # node 0 is the input; nodes[i] is node i + 1
        node["args"] = rng.choice(
            [[itself], [itself + 1], [len(nodes) + 5], [-1], [True], [], [0, 0, 0], [0.5], ["0"], [2**70], [0, itself]]
        )
    elif action == 1 and len(nodes) > 1:
        other = rng.randrange(len(nodes))
        nodes[index], nodes[other] = nodes[other], nodes[index]
    elif action == 2:
        del nodes[index]
    elif action == 3:
        nodes.insert(index, json.loads(json.dumps(node)))
    elif isinstance(node, dict):
        node["op"] = rng.choice(NODE_KINDS)
    return document


def graph_dsl_mutants(rng: random.Random, text: str, count: int) -> Iterator[str]:
    for _ in range(count):
        mutated = text
        for _ in range(rng.choice([1, 1, 2])):
            mutated = rng.choice(LIGHT_DSL_MUTATIONS)(rng, mutated)
        yield mutated


def graph_json_mutants(rng: random.Random, text: str, count: int) -> Iterator[str]:
    for _ in range(count):
        document = json.loads(text)
        for _ in range(rng.choice([1, 1, 2])):
            document = rng.choice([mutate_graph_node, mutate_graph_node, mutate_document])(rng, document)
        yield json.dumps(document)


def test_the_gallery_has_branching_kernels_to_fuzz():
    assert len(GRAPH_SOURCES) >= 5
    assert all(json.loads(document)["format"] == "kdsl-graph" for document in GRAPH_DOCUMENTS)


@pytest.mark.parametrize("seed", [0, 1])
def test_fuzzed_graph_dsl_and_json_raise_only_kdsl_errors_and_round_trip(seed):
    rng = random.Random(seed)
    count = (DSL_COUNT + JSON_COUNT) // 4
    texts, documents = Tally(), Tally()
    for _ in range(count):
        source = rng.choice(range(len(GRAPH_SOURCES)))
        for text in graph_dsl_mutants(rng, GRAPH_SOURCES[source], 1):
            texts.check(kdsl.parse, text)
        for text in graph_json_mutants(rng, GRAPH_DOCUMENTS[source], 1):
            documents.check(kdsl.from_json, text)
    texts.assert_sound(count)
    documents.assert_sound(count)


@settings(max_examples=200 if SLOW else 40)
@given(kst.graphs(), st.randoms(use_true_random=False))
def test_fuzzed_drawn_kernels_raise_only_kdsl_errors_and_round_trip(graph, rng):
    """Mutants of drawn kernels' DSL and JSON: a KdslError, or a kernel that reads back equal."""
    tally = Tally()
    for text in graph_dsl_mutants(rng, graph.to_dsl(), 10):
        tally.check(kdsl.parse, text)
    for text in graph_json_mutants(rng, graph.to_json(), 10):
        tally.check(kdsl.from_json, text)
    assert not tally.failures, f"{len(tally.failures)} failures; first:\n" + "\n---\n".join(tally.failures[:3])
    assert tally.checked == 20 and tally.slowest <= MAX_SECONDS


def _graph_names(document: dict) -> list[str]:
    """Every name in a kernel's JSON: variables, input dims, and the names its nodes give (new
    dims, weights, renamed dims)."""
    names = {d["name"] for d in document["inputs"]} | set(document["variables"])

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("name", "weight") and isinstance(value, str):
                    names.add(value)
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(document["nodes"])
    return sorted(names)


@given(kst.graphs(), st.data())
def test_any_renamed_kernel_is_refused_or_round_trips(graph, data):
    """Renaming one name of a valid kernel (a variable, a dim, a weight) to anything — a DSL
    word, a keyword, the printer's own tensor names — gives a KdslError or a kernel that reads
    back equal from its DSL and JSON."""
    document = json.loads(graph.to_json())
    old = data.draw(st.sampled_from(_graph_names(document)))
    new = data.draw(st.one_of(NAMES, st.sampled_from(["x", "t1", "t2", "t3", "op", "w1", "x1", "N", "Blend"])))
    text = json.dumps(document).replace(json.dumps(old), json.dumps(new))
    try:
        renamed = kdsl.from_json(text)
    except KdslError:
        return
    assert kdsl.parse(renamed.to_dsl()) == renamed, renamed.to_dsl()
    assert kdsl.from_json(renamed.to_json()) == renamed


@given(st.one_of(st.floats(), st.integers(-(2**70), 2**70)))
def test_any_scale_factor_is_refused_or_round_trips(by):
    """Map("scale", by=...) with any float or int, through Python, DSL text and JSON: refused
    alike on every path, or read back equal (a float prints to the same float)."""
    N, C = primary("N C")
    x = Input(N, C)
    try:
        kernel = ((x >> Map("scale", by=by)) + x) >> Output(N, C)
    except KdslError:
        kernel = None
    document = json.loads((((x >> Map("scale", by=2.0)) + x) >> Output(N, C)).to_json())
    document["nodes"][0]["by"] = by
    try:
        stored = kdsl.from_json(json.dumps(document))
    except KdslError:
        stored = None
    assert (kernel is None) == (stored is None), f"by={by!r}: Python {kernel is not None}, JSON {stored is not None}"
    if kernel is not None:
        assert stored == kernel and kdsl.parse(kernel.to_dsl()) == kernel
