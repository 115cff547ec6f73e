"""Search: rediscovery of gallery operators, shape-distance admissibility, validity of results,
reproducible strategies, resumable runs, and clear errors."""

import itertools
import os
import random
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdsl import gallery
from kdsl.bench.rediscover import NO_VIEWS, REDISCOVERY, SLOW_RESTRICTED
from kdsl.codegen import reference
from kdsl.lang.errors import KdslError
from kdsl.lang.sizes import coefficient, primary
from kdsl.search.distance import shape_distance, state_distance
from kdsl.search.enumerate import Enumeration, count_by_depth
from kdsl.search.mcts import MCTS
from kdsl.search.run import search
from kdsl.search.sample import Sampling, rollout
from kdsl.search.space import Space, parse_budget
from kdsl.search.store import Store
from kdsl.search.synthesis import canonical_path, children, is_complete, root, spec_twin, to_operators
from kdsl.solve.constraints import check


def find(name):
    spec, options, depth = REDISCOVERY[name]
    space = Space(spec, "resnet18", max_depth=depth, **options)
    target = gallery.load(name).key
    start = time.perf_counter()
    for state in Enumeration(space).states():
        if state is None:
            continue
        for op in to_operators(space, state):
            if op.key == target:
                return op, state.depth, time.perf_counter() - start
    raise AssertionError(f"enumeration did not find {name}")


@pytest.mark.parametrize("name", sorted(REDISCOVERY))
def test_enumeration_rediscovers_gallery_operator(name):
    if name in SLOW_RESTRICTED and not os.environ.get("KDSL_SLOW_TESTS"):
        pytest.skip("slow rediscovery; set KDSL_SLOW_TESTS=1")
    op, depth, _ = find(name)
    assert depth == REDISCOVERY[name][2]
    assert op.key == gallery.load(name).key
    check(op, "resnet18")


@pytest.mark.parametrize("name", sorted(REDISCOVERY))
def test_gallery_targets_are_canonical(name):
    spec, options, depth = REDISCOVERY[name]
    space = Space(spec, "resnet18", max_depth=depth, **options)
    op = gallery.load(name)
    state = canonical_path(space, op)
    assert state.depth == depth
    assert [o.key for o in to_operators(space, state)] == [op.key]


# -- shape distance --------------------------------------------------------------------------------

Cin, Cout, H, W = primary("Cin Cout H W")
K, G, s = coefficient("K G s")
INPUT = [Cin, H, W]


@st.composite
def reverse_paths(draw):
    """A frontier reached from the input by k random helpful steps applied top-down (so the
    true distance back is at most k)."""
    frontier = list(INPUT)
    steps = draw(st.integers(0, 6))
    for _ in range(steps):
        kind = draw(st.sampled_from(["split", "merge", "unfold", "expand", "share", "stride"]))
        i = draw(st.integers(0, len(frontier) - 1))
        if kind == "split":  # top-down Split: one dim -> (outer, inner)
            block = draw(st.sampled_from([K, G, s]))
            frontier[i : i + 1] = [frontier[i] / block, block]
        elif kind == "merge" and len(frontier) >= 2:
            others = [j for j in range(len(frontier)) if j != i]
            j = draw(st.sampled_from(others))
            merged = frontier[i] * frontier[j]
            frontier = [d for n, d in enumerate(frontier) if n not in (i, j)] + [merged]
        elif kind == "unfold":
            frontier.append(draw(st.sampled_from([K, s])))
        elif kind == "expand":
            frontier.append(draw(st.sampled_from([K, Cout, G])))
        elif kind == "share":
            frontier.extend(draw(st.lists(st.sampled_from([Cout, K, Cout / G]), min_size=1, max_size=2)))
        elif kind == "stride":
            frontier[i] = frontier[i] / s
    return frontier, steps


@given(reverse_paths(), st.booleans())
def test_shape_distance_is_admissible_on_random_paths(path, strides):
    frontier, steps = path
    distance = shape_distance(frontier, INPUT, strides=True)
    assert distance <= steps, f"distance {distance} > {steps} for {[str(x) for x in frontier]}"
    if strides is False:
        assert shape_distance(frontier, INPUT, strides=False) >= distance


@given(st.integers(0, 10**6))
def test_shape_distance_never_exceeds_remaining_steps_of_search_paths(seed):
    # random bottom-up paths without distance pruning; on those that reach the input, every
    # prefix's distance is at most the number of steps that followed it
    space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [32]}, max_depth=6, use_distance=False)
    pruned = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [32]}, max_depth=6)
    rng = random.Random(seed)
    state, path = root(space), []
    while True:
        path.append(state)
        if is_complete(space, state) and rng.random() < 0.5:
            break
        options = [child for _, child in children(space, state)]
        if not options:
            break
        state = rng.choice(options)
    if not is_complete(space, state):
        return
    for depth, prefix in enumerate(path):
        assert state_distance(pruned, prefix) <= state.depth - depth


def test_shape_distance_paper_example():
    assert shape_distance([Cin, H / s, s * W, K], INPUT) == 3
    assert shape_distance(INPUT, INPUT) == 0
    assert shape_distance([Cout, H, W], INPUT) == float("inf")  # Cout never becomes Cin
    assert shape_distance([Cout, H, W], INPUT, reducing=True) == 2  # Reduce(Cin), drop Cout


# -- results are valid -----------------------------------------------------------------------------

TINY = [{"name": "tiny", "N": 2, "Cin": 4, "Cout": 6, "H": 5, "W": 5}]


def test_search_results_pass_the_solver_and_run_on_the_reference_backend():
    space = Space("conv2d", TINY, coefficients={"K": [3], "G": [2]}, max_depth=4)
    ops = {}
    for state in Enumeration(space).states():
        if state is not None:
            for op in to_operators(space, state):
                ops.setdefault(op.key, op)
    assert len(ops) > 20
    rng = random.Random(0)
    for op in rng.sample(sorted(ops.values(), key=lambda o: o.key), 30):
        report = check(op, space.layers, coefficients=op.default_coefficients)
        binding = report.binding("tiny")
        x, weights = reference.random_inputs(op, binding, seed=1)
        out = reference.run(op, binding, x, weights)
        assert out.shape == (2, 6, 5, 5)
        assert np.all(np.isfinite(out))


def test_counts_by_depth_are_exact_and_reproducible():
    space = Space("conv2d", "resnet18", coefficients={"K": [3]}, max_depth=5, reductions=["Cin", "K"], caps=NO_VIEWS)
    counts = count_by_depth(space)
    assert counts == count_by_depth(space)
    assert counts[2] == 1  # pointwise conv is the only depth-2 operator
    assert sum(counts.values()) > 10


def test_enumeration_is_shallow_first_and_a_short_run_returns_the_classics(tmp_path):
    # iterative deepening of each output goal: the first results are the shallow classics, not one
    # deep corner; every ResNet layer has Cout = Cin, so the depthwise conv is among them
    space = Space("conv2d", "resnet18", coefficients={"K": [3]}, max_depth=6)
    report = search(space, "enumerate", db=str(tmp_path / "r.db"), max_results=800)
    assert not report.finished
    rows = Store(str(tmp_path / "r.db")).top(10**6, status=None)
    keys = {r["key"] for r in rows}
    for name in ("conv2d", "pointwise_conv2d", "depthwise_conv2d"):
        assert gallery.load(name).key in keys, name
    same = Space("conv2d_same_channels", "resnet18", coefficients={"K": [3]}, max_depth=5)
    assert gallery.load("depthwise_conv2d").key in search(same, "enumerate", max_results=300).found
    by_goal: dict[int, list[int]] = {0: [], 1: []}
    for state in itertools.islice(Enumeration(space).states(), 600):
        if state is not None:
            by_goal[_goal(space, state)].append(state.depth)
    for depths in by_goal.values():
        assert depths == sorted(depths) and depths[-1] > depths[0]
    assert by_goal[0][0] == 2  # the pointwise conv


def _goal(space: Space, state) -> int:
    """Which output goal a state started from: the size of its first output dim says."""
    first = next(d for d in (*[d for step in state.steps for d in step.consumed], *state.frontier) if d.id == 0)
    goals = [goal[0] for goal in space.output_goals]
    assert first.size in goals
    return goals.index(first.size)


# -- strategies ------------------------------------------------------------------------------------


def keys_of(walker, space, n):
    found = []
    states = walker.states()
    state = next(states)
    while len(found) < n:
        if state is not None:
            found.extend(op.key for op in to_operators(space, state))
        state = states.send(1.0 if state is not None else 0.0)
    return found[:n]


def test_random_sampling_is_seeded():
    space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [32]}, max_depth=5)
    assert keys_of(Sampling(space, seed=5), space, 5) == keys_of(Sampling(space, seed=5), space, 5)
    resumed = Sampling(space, seed=5, progress={"iteration": 3})
    first = Sampling(space, seed=5)
    states = first.states()
    for _ in range(3):
        next(states)
    assert [k for k in keys_of(resumed, space, 4)] == [k for k in keys_of(first, space, 4)]


def test_steered_rollouts_complete_at_least_one_in_ten():
    # count-based (no timing): the same seeded rollouts, steered and plain
    space = Space("conv2d", "resnet18", max_depth=6, coefficients={"K": [3], "G": [32], "s": [2]})
    steered = sum(rollout(space, random.Random(f"0:{i}")) is not None for i in range(200))
    plain = sum(rollout(space, random.Random(f"0:{i}"), steer=False) is not None for i in range(200))
    assert steered >= 20 and steered > 3 * plain


def test_mcts_is_seeded_and_finds_operators():
    space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [32]}, max_depth=6)
    a = keys_of(MCTS(space, seed=2), space, 10)
    assert a == keys_of(MCTS(space, seed=2), space, 10)
    assert len(set(a)) >= 2


# -- store and resume ------------------------------------------------------------------------------


def test_interrupted_enumeration_resumes_without_losing_or_repeating(tmp_path):
    space = Space("conv2d", "resnet18", coefficients={"K": [3]}, max_depth=6, reductions=["Cin", "K"], caps=NO_VIEWS)
    once = search(space, "enumerate", db=str(tmp_path / "once.db"))
    assert once.finished
    db = str(tmp_path / "parts.db")
    parts = 0
    while True:
        report = search(space, "enumerate", db=db, max_results=7, commit_every=0.0)
        parts += 1
        if report.finished:
            break
    assert parts > 2
    a, b = Store(str(tmp_path / "once.db")), Store(db)

    def keys(store):
        return sorted(r["key"] for r in store.top(10**6, status=None))

    assert keys(a) == keys(b)
    assert len(keys(b)) == len(set(keys(b))) == once.new + once.duplicates


def test_killed_search_resumes(tmp_path):
    import sqlite3
    import subprocess
    import sys

    db = str(tmp_path / "k.db")
    options = f"coefficients={{'K': [3]}}, max_depth=6, reductions=['Cin', 'K'], caps={NO_VIEWS!r}"
    code = (
        "from kdsl.search.space import Space; from kdsl.search.run import search;"
        f"space = Space('conv2d', 'resnet18', {options});"
        f"search(space, 'enumerate', db={db!r}, commit_every=0.0)"
    )
    process = subprocess.Popen([sys.executable, "-c", code])
    stored = 0
    deadline = time.monotonic() + 60
    while stored < 3 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
        try:
            with sqlite3.connect(db) as connection:
                stored = connection.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
        except sqlite3.Error:
            pass
    process.kill()  # kill -9, mid-run
    process.wait()
    space = Space("conv2d", "resnet18", coefficients={"K": [3]}, max_depth=6, reductions=["Cin", "K"], caps=NO_VIEWS)
    assert not Store(db).runs()[0]["finished"]
    search(space, "enumerate", db=db)
    fresh = search(space, "enumerate", db=str(tmp_path / "fresh.db"))
    store = Store(db)
    assert sorted(r["key"] for r in store.top(10**6, status=None)) == sorted(fresh.found)
    assert store.runs()[0]["finished"] == 1


# -- errors ----------------------------------------------------------------------------------------


def test_bad_input_raises_kdsl_errors(tmp_path):
    with pytest.raises(KdslError, match="unknown spec"):
        Space("conv3d")
    with pytest.raises(KdslError, match="bad budget"):
        Space("conv2d", max_flops="lots")
    with pytest.raises(KdslError, match="does not exist"):
        Store(str(tmp_path / "missing" / "r.db"))
    with pytest.raises(KdslError, match="unknown strategy"):
        search(Space("matmul", max_depth=2), "annealing")
    (tmp_path / "junk.db").write_text("not a database" * 100)
    with pytest.raises(KdslError, match="results database"):
        Store(str(tmp_path / "junk.db"))
    assert parse_budget("2G") == 2_000_000_000


def test_relative_budget_prunes_by_flops(tmp_path):
    space = Space(
        "conv2d",
        "resnet18",
        coefficients={"K": [3]},
        max_depth=6,
        max_flops="0.5x",
        reductions=["Cin", "K"],
        caps=NO_VIEWS,
    )
    report = search(space, "enumerate", db=str(tmp_path / "b.db"))
    rows = Store(str(tmp_path / "b.db")).top(10**6, status="valid")
    assert rows and all(r["flops"] <= space.max_flops for r in rows)
    assert gallery.load("conv2d").key not in {r["key"] for r in rows}
    assert report.finished


def test_cli_search_and_results(tmp_path, capsys):
    import argparse

    from kdsl.cli.search_commands import add_search_commands

    parser = argparse.ArgumentParser(prog="kdsl")
    add_search_commands(parser.add_subparsers(dest="command"))
    db = str(tmp_path / "c.db")
    args = parser.parse_args(
        ["search", "conv2d", "--max-depth", "4", "--coefficient", "K=3", "--cap", "Expand=0", "--db", db, "--json"]
    )
    assert args.run(args) == 0
    args = parser.parse_args(["results", "--db", db, "--top", "3"])
    assert args.run(args) == 0
    out = capsys.readouterr().out
    assert "distinct" in out and "#1" in out


def test_the_baselines_reductions_come_first_so_enumeration_reaches_conv2d_early():
    space = Space("conv2d", "resnet18", max_depth=6)
    assert [str(size) for size in space.reductions[:2]] == ["K", "Cin"]
    assert str(Space("conv2d_same_channels", "resnet18").reductions[0]) == "K"  # depthwise conv reduces K
    target = gallery.load("conv2d").key
    walk = Enumeration(space)
    for state in walk.states():
        if state is not None and any(op.key == target for op in to_operators(space, state)):
            break
    # 17,933 nodes with the alphabetical order (G before K), 7,252 with the baseline's first (in
    # the walk of the spec's own output goal; the Cin -> Cin goal's walk takes turns with it)
    assert walk.walks[0].nodes <= 8000


def test_no_step_creates_a_dim_of_size_one():
    # discover's space (G in 2, 4, 8; s = 2): bottom-up Split(G/s, s/G) joined G/s and s/G into a
    # dim of size 1, the Unfold over it became Unfold(Cout, 1), and converting the state raised a
    # SizeError that ended a 30-minute discover run
    from kdsl.discover.loop import DiscoverConfig, discovery_space

    space = discovery_space(DiscoverConfig())
    state = root(space)
    for want in ["Reduce(Cin)", "Merge(H; H*s/G)", "Merge(H*s/G; s/G)"]:
        state = {str(step): child for step, child in children(space, state)}[want]
    kids = list(children(space, state))
    assert "Split(G/s, s/G)" not in {str(step) for step, _ in kids} and kids
    assert all(d.size != 1 for _, child in kids for d in child.frontier)


# -- output goals: Cin -> Cin operators where every layer has Cout = Cin ---------------------------


def test_layers_with_equal_channels_add_the_same_channels_goal():
    space = Space("conv2d", "resnet18")
    assert space.equalities == (("Cout", "Cin"),)
    assert [str(size) for size in space.output_goals[1]] == ["Cin", "H", "W"]
    assert "Cout = Cin on every layer" in space.describe()
    # a table with a channel-changing layer has no such goal, and the switch turns it off
    layers = [{"name": "a", "N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8}, {"name": "b", "N": 1, "Cin": 8, "Cout": 16}]
    layers[1] |= {"H": 8, "W": 8}
    assert Space("conv2d", layers).output_goals == (Space("conv2d", layers).output_sizes,)
    assert len(Space("conv2d", "resnet18", equal_variables=False).output_goals) == 1
    assert Space("conv2d", "resnet18").fingerprint() != Space("conv2d", "resnet18", equal_variables=False).fingerprint()


def _goal_one_complete(space, depth):
    """Every complete state of the space's second output goal up to ``depth`` (no twin filter)."""
    found, stack = [], [root(space, 1)]
    while stack:
        state = stack.pop()
        if state.depth and is_complete(space, state):
            found.append(state)
        if state.depth < depth:
            stack.extend(child for _, child in children(space, state, limit=depth))
    assert found
    return found


def test_a_twin_computes_what_its_state_computes_and_the_rest_need_the_equality():
    space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [2]}, max_depth=4, canonicalize=False)
    layer = {"N": 1, "Cin": 4, "Cout": 4, "H": 5, "W": 5, "K": 3, "G": 2}
    twins = kept = 0
    for state in _goal_one_complete(space, 4):
        twin = spec_twin(space, state)
        op = to_operators(space, state)[0]
        if twin is None:
            kept += 1
            assert [str(d.size) for d in op.outputs] == ["N", "Cin", "H", "W"]
            continue
        twins += 1
        other = to_operators(space, twin)[0]
        assert [str(d.size) for d in other.outputs] == ["N", "Cout", "H", "W"]
        x, weights = reference.random_inputs(op, layer, seed=1)
        np.testing.assert_allclose(reference.run(other, layer, x, weights), reference.run(op, layer, x, weights))
    assert twins > 10 and kept > 10


def test_the_enumeration_yields_no_twin_and_finds_depthwise_in_the_conv2d_spec():
    space = Space("conv2d", "resnet18", coefficients={"K": [3]}, max_depth=5)
    walk = Enumeration(space)
    keys = set()
    for state in walk.states():
        if state is not None:
            assert spec_twin(space, state) is None
            keys.update(op.key for op in to_operators(space, state))
    assert gallery.load("depthwise_conv2d").key in keys and gallery.load("pointwise_conv2d").key in keys
    assert walk.stats["twin"] > 0 and walk.finished


def test_search_solves_coefficients_given_without_a_list():
    # G without a list: every value above 1 that divides a gcd over the layers (64 for the channels, 7 for H, W)
    spec, options, depth = REDISCOVERY["grouped_conv2d"]
    solved = Space(spec, "resnet18", max_depth=depth, **{**options, "coefficients": {"K": [3], "G": None}})
    assert {c.name: c.values for c in solved.coefficients} == {"G": (2, 4, 7, 8, 16, 32, 64), "K": (3,)}
    assert len(solved.assignments) == 7
    # found operators default to their first valid assignment (G=2); the gallery's defaults to G=4
    target = gallery.load("grouped_conv2d").with_defaults(G=2)
    found = None
    for state in Enumeration(solved).states():
        if state is not None:
            found = next((op for op in to_operators(solved, state) if op.key == target.key), None)
            if found is not None:
                break
    assert found is not None
    check(found, "resnet18", {"G": 64})  # valid with the largest solved G too


def test_a_coefficient_of_the_spec_is_solved_when_left_out():
    # conv2d_stride2's output H/s, W/s: s divides gcd(56, 28, 14) = 14 on resnet18_stride2
    space = Space("conv2d_stride2", "resnet18_stride2", coefficients={"K": [3]}, max_depth=2)
    assert {c.name: c.values for c in space.coefficients} == {"K": (3,), "s": (2, 7, 14)}
    pinned = Space("conv2d_stride2", "resnet18_stride2", coefficients={"K": [3], "s": [2]}, max_depth=2)
    assert pinned.assignments == ({"K": 3, "s": 2},)  # a list still pins
    with pytest.raises(KdslError, match="coefficient s: no value above 1"):
        Space(
            "conv2d_stride2", [{"name": "odd", "N": 1, "Cin": 8, "Cout": 8, "H": 9, "W": 10}], coefficients={"K": [3]}
        )


def test_cli_search_solves_a_coefficient(tmp_path, capsys):
    import argparse
    import json

    from kdsl.cli.search_commands import add_search_commands

    parser = argparse.ArgumentParser(prog="kdsl")
    add_search_commands(parser.add_subparsers(dest="command"))
    db = str(tmp_path / "s.db")
    argv = ["search", "conv2d", "--max-depth", "3", "--set", "K=3", "--set", "G=solve", "--db", db, "--json"]
    args = parser.parse_args(argv)
    assert args.run(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "G in (2, 4, 7, 8, 16, 32, 64)" in summary["space"]
