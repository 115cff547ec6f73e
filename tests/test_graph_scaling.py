"""Building, printing and reading branching kernels takes time linear in their size (issue 25).

Each join used to walk the whole graph, so 2k joins took seconds and 10k minutes. The time
limits here are generous (several times what a busy laptop measures); the ratio checks catch a
quadratic regression (doubling the size would quadruple the time) where a slow machine does not.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

import kdsl
from kdsl.lang import (
    Blend,
    Dim,
    Input,
    Map,
    Operator,
    Output,
    Reduce,
    Rename,
    ShapeError,
    Share,
    Shift,
    Weight,
    primary,
)
from kdsl.lang.parser import MAX_SOURCE_CHARS
from kdsl.lang.printer import CHUNK
from kdsl.lang.serialize import MAX_JSON_CHARS

N, C, L = primary("N C L")


def _joins(count: int) -> Operator:
    """``count`` joins: mostly a tensor added to itself, every 50th a gated branch (the shapes of
    the issue's measurements: a DSL file under the size limit, a JSON file of Blend nodes)."""
    x = Input(N, C, L)
    t: object = x
    for index in range(count):
        t = t * (t >> Map("sigmoid")) if index % 50 == 49 else t + t  # type: ignore[operator]
    graph = t >> Output(N, C, L)  # type: ignore[operator]
    assert not graph.is_linear
    return graph


def _seconds(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def _round_trip_dsl(graph: Operator) -> Operator:
    text = graph.to_dsl()
    assert len(text) <= MAX_SOURCE_CHARS
    back = kdsl.parse(text)
    assert not back.is_linear
    return back


def test_five_thousand_joins_build_print_and_parse_back_in_linear_time() -> None:
    graph: list[Operator] = []
    build = _seconds(lambda: graph.append(_joins(5000)))
    back: list[Operator] = []
    text_time = _seconds(lambda: back.append(_round_trip_dsl(graph[0])))
    assert len(graph[0].nodes) == 5000 + 5000 // 50 + 1
    assert back[0] == graph[0] and back[0].key == graph[0].key
    assert build < 2.0, f"building 5,000 joins took {build:.2f} s"
    assert text_time < 4.0, f"printing and parsing 5,000 joins took {text_time:.2f} s"
    # doubling the joins at most about doubles the time (a quadratic build would quadruple it)
    small = [_seconds(lambda: _joins(1250)) for _ in range(2)]
    large = [_seconds(lambda: _joins(2500)) for _ in range(2)]
    assert min(large) < 3 * min(small) + 0.1, (small, large)
    small_graph, large_graph = _joins(1250), _joins(2500)
    small_text = min(_seconds(lambda: _round_trip_dsl(small_graph)) for _ in range(2))
    large_text = min(_seconds(lambda: _round_trip_dsl(large_graph)) for _ in range(2))
    assert large_text < 3 * small_text + 0.2, (small_text, large_text)


def test_ten_thousand_joins_round_trip_through_json_in_linear_time() -> None:
    graph = _joins(10_000)
    text = graph.to_json()
    assert len(text) <= MAX_JSON_CHARS
    back: list[object] = []
    seconds = _seconds(lambda: back.append(kdsl.from_json(text)))
    assert back[0] == graph and back[0].key == graph.key  # type: ignore[union-attr]
    assert seconds < 4.0, f"reading 10,000 joins from JSON took {seconds:.2f} s"
    small, large = _joins(2500).to_json(), _joins(5000).to_json()
    small_time = min(_seconds(lambda: kdsl.from_json(small)) for _ in range(2))
    large_time = min(_seconds(lambda: kdsl.from_json(large)) for _ in range(2))
    assert large_time < 3 * small_time + 0.2, (small_time, large_time)


def test_a_chain_of_three_thousand_maps_prints_as_statements_that_parse_back() -> None:
    t: object = Input(N, C)
    for _ in range(3000):
        t = t >> Map("relu")  # type: ignore[operator]
    graph = t >> Output(N, C)  # type: ignore[operator]
    text = graph.to_dsl()
    # no statement holds more than CHUNK steps (Python's parser nests one level per >>)
    assert max(len(statement.split("\n    >> ")) for statement in text.split("\n)\n")) <= CHUNK
    back = kdsl.parse(text)
    assert back == graph and back.key == graph.key


def test_a_long_linear_chain_inside_a_kernel_stays_one_chain_when_printed_in_pieces() -> None:
    x = Input(N, C, L)
    branch: object = x
    for _ in range(3 * CHUNK + 7):
        branch = branch >> Shift(L)  # type: ignore[operator]
    branch = branch >> Map("abs")  # type: ignore[operator]
    graph = (x * branch) >> Output(N, C, L)  # type: ignore[operator]
    assert [node.kind for node in graph.nodes] == ["Input", "Chain", "Map", "Blend"]
    back = kdsl.parse(graph.to_dsl())
    assert back == graph and back.key == graph.key


def _block(t: object, name: str) -> object:
    weight = Weight(Dim("o", C), C, name=name)
    return t >> Share(weight) >> Reduce(C) >> Rename("o", "C")  # type: ignore[operator]


def test_weights_stay_numbered_and_distinct_across_many_joins() -> None:
    x = Input(N, C)
    t: object = x
    for index in range(300):
        # a residual block (numbered w1, w2, ... after the weights t already reads) and, every
        # 10th join, a named branch from the input: both sides of that join bring weights
        t = t + _block(t, None) if index % 10 else t + _block(x, f"side{index}")  # type: ignore[operator,arg-type]
    graph = t >> Output(N, C)  # type: ignore[operator]
    names = [w.name for w in graph.weights]
    assert len(names) == len(set(names)) == 300
    assert kdsl.from_json(graph.to_json()) == graph
    assert kdsl.parse(graph.to_dsl()).key == graph.key
    # a weight name read through two different vertices is still an error, however deep
    with pytest.raises(ShapeError, match="side0"):
        _ = t + _block(x, "side0")  # type: ignore[operator]


def test_a_blend_of_many_branches_of_the_input() -> None:
    x = Input(N, C, L)
    t: object = x
    for _ in range(2000):
        t = Blend("max", t, x >> Map("abs"))
    graph = t >> Output(N, C, L)  # type: ignore[operator]
    assert kdsl.from_json(graph.to_json()) == graph


def _weighted(blocks: int) -> object:
    t: object = Input(N, C)
    for _ in range(blocks):
        t = t + _block(t, None)  # type: ignore[operator,arg-type]
    return t >> Output(N, C)  # type: ignore[operator]


def test_a_kernel_of_many_weighted_blocks_builds_in_linear_time() -> None:
    # each block's chain and join see every weight before it (for numbering and duplicates): a
    # copy of them per block was quadratic
    small = min(_seconds(lambda: _weighted(600)) for _ in range(2))
    large = min(_seconds(lambda: _weighted(1200)) for _ in range(2))
    assert large < 3 * small + 0.1, (small, large)
