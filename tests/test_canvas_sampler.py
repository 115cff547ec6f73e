"""Canvas's micro-DAG sampler (kdsl.search.canvas): reproducible, legal kernels within budget, its
pruning rules, the per-kind rescaling, the search driver and results store, and agreement of the
NumPy reference with PyTorch on the kernels it draws."""

from __future__ import annotations

import json
import math
import os
import random

import backends
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from kdsl import parse, solve
from kdsl.bench.search_throughput import run_bench
from kdsl.cli import main
from kdsl.codegen import reference
from kdsl.lang.errors import SearchError
from kdsl.lang.operator import Operator
from kdsl.search.canvas import KINDS, CanvasSampler, sample
from kdsl.search.canvas_choices import IDENTITY_ON_NONNEGATIVE, NONNEGATIVE
from kdsl.search.run import search
from kdsl.search.space import Space
from kdsl.search.store import Store
from kdsl.testing import strategies as kst

#: a small budget (half of conv2d's FLOPs) with two group counts and one window size
SPACE = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [2, 4]}, max_flops="0.5x", max_depth=6)
KERNELS = sample(SPACE, 40, seed=11)


def keys_of(seed: int, attempts: int, space: Space = SPACE) -> list[str | None]:
    sampler = CanvasSampler(space, seed=seed)
    found = [sampler.draw(i) for i in range(attempts)]
    keys = [s.key if s is not None else None for s in found]
    assert len(keys) == attempts
    return keys


def test_the_same_seed_gives_the_same_kernels_and_another_seed_others():
    first = keys_of(3, 60)
    assert first == keys_of(3, 60)
    assert sum(k is not None for k in first) >= 10
    assert set(first) - {None} != set(keys_of(4, 60)) - {None}


def test_an_attempt_depends_only_on_its_number():
    """A run resumed at attempt i draws what attempt i drew in a run from the start."""
    whole = CanvasSampler(SPACE, seed=7)
    found = [whole.draw(i) for i in range(40)]
    later = next(i for i in range(20, 40) if found[i] is not None)
    resumed = CanvasSampler(SPACE, seed=7, progress={"iteration": later})
    again = next(resumed.states())
    assert resumed.iteration == later + 1
    assert again is not None and again.key == found[later].key


def test_every_kernel_parses_back_from_its_text():
    assert len(KERNELS) == 40
    for kernel in KERNELS:
        text = kernel.op.to_dsl()
        again = parse(text)
        assert again == kernel.op and again.key == kernel.key, text


def test_kernels_are_distinct_by_content_key():
    assert len({k.key for k in KERNELS}) == len(KERNELS)


def test_every_kernel_checks_on_every_layer_after_filling_and_fits_the_budget():
    for kernel in KERNELS:
        assert kernel.op.outputs == SPACE.spec.outputs
        if kernel.op.dynamic_variables:
            assert set(kernel.widths) == {layer.name for layer in SPACE.layers}
            layers = [{**layer.values, **kernel.widths[layer.name]} for layer in SPACE.layers]
        else:
            assert kernel.widths == {}
            layers = [layer.values for layer in SPACE.layers]
        report = solve.check(kernel.op, layers, kernel.op.default_coefficients)
        assert len(report) == len(SPACE.layers)
        flops = sum(int(solve.cost(kernel.op, layer, kernel.op.default_coefficients)["flops"]) for layer in layers)
        assert flops == kernel.result["flops"] <= SPACE.max_flops
        assert kernel.result["status"] == "valid"


def _maps_in_a_row(graph: Operator) -> list[tuple[str, str]]:
    """(outer, inner) for every Map node whose argument is a Map node (or a Softmax: 'softmax')."""
    found = []
    for node in graph.nodes:
        if node.kind == "Map":
            inner = graph.nodes[node.args[0]]
            if inner.kind == "Map":
                found.append((node.step.fn, inner.step.fn))
            elif inner.kind == "Softmax":
                found.append((node.step.fn, "softmax"))
    return found


def test_no_map_is_the_identity_on_its_argument():
    """No ReLU of a ReLU (nor abs or ReLU of a tensor that is never negative)."""
    seen = 0
    for kernel in sample(SPACE, 60, seed=21, weights={"map": 4.0, "softmax": 2.0}):
        if not kernel.op.is_linear:
            for outer, inner in _maps_in_a_row(kernel.op):
                seen += 1
                assert not (outer in IDENTITY_ON_NONNEGATIVE and (inner in NONNEGATIVE or inner == "softmax"))
    assert seen > 5  # maps in a row do occur: the rule was exercised


def test_no_join_reads_one_tensor_twice():
    joins = 0
    for kernel in KERNELS:
        if not kernel.op.is_linear:
            for node in kernel.op.nodes:
                if len(node.args) == 2:
                    joins += 1
                    assert node.args[0] != node.args[1]
    assert joins > 5


def test_a_width_solved_at_a_join_is_substituted_in_every_branch():
    """x -> FC(x1) -> relu; (FC + x) solves x1 = Cin; relu's branch must then see Cin too, or the
    last join would meet the FC's weight with two sizes (x1 and Cin) and fail."""
    sampler = CanvasSampler(SPACE, seed=0)
    attempt = sampler._start(random.Random(0))
    assert sampler._add(attempt, "fc", ((0,), ("Cin", ("Cin",))))  # node 1: [N, Cin: x1, H, W]
    assert sampler._add(attempt, "map", ((1,), ("relu",)))  # node 2
    assert str(attempt.nodes[2].dims["Cin"]) == "x1"
    assert sampler._add(attempt, "blend", ((1, 0), ("add", False)))  # node 3: x1 = Cin
    assert {name: str(size) for name, size in attempt.solved.items()} == {"x1": "Cin"}
    assert all(str(node.dims["Cin"]) == "Cin" for node in attempt.nodes)
    assert sampler._add(attempt, "blend", ((2, 3), ("mul", False)))  # node 4
    op = sampler._finish(attempt)
    assert op is not None and op.dynamic_variables == () and sampler.stats["errors"] == 0
    assert [node.kind for node in op.nodes].count("FC") == 2  # x1's FC, and the one to Cout


def test_groups_are_g_groups_and_a_split_is_never_pointless():
    """Split makes G groups (g: G) of channel/G; after steps that treat the groups as one channel
    (a Shift here), merging them back or finishing with an FC of g and cg would give what the same
    steps give without the Split: neither is offered, and such a tensor cannot be the output."""
    sampler = CanvasSampler(SPACE, seed=0)
    attempt = sampler._start(random.Random(0))
    assert sampler._add(attempt, "group", ((0,), ("split",)))
    assert {d: str(size) for d, size in attempt.nodes[1].dims.items()} == {
        "N": "N",
        "g": "G",
        "cg": "Cin/G",
        "H": "H",
        "W": "W",
    }
    assert sampler._add(attempt, "shift", ((1,), ("H", 1)))
    shifted = attempt.nodes[2]
    assert shifted.plain and sampler._group(shifted) == [] and not sampler._finishable(shifted)
    assert all(dims == ("cg",) for _, dims in sampler._fc(shifted))  # grouped FCs only
    assert sampler._add(attempt, "fc", ((2,), ("cg", ("cg",))))  # one FC per group: the groups differ now
    assert not attempt.nodes[3].plain and sampler._group(attempt.nodes[3]) == [("merge",)]
    splits = [
        step
        for kernel in KERNELS
        for node in getattr(kernel.op, "nodes", ())
        if node.kind == "Chain"
        for step in node.chain.steps
        if step.kind == "Split"
    ]
    assert splits and all(str(step.block).endswith("/G") for step in splits)


def test_each_kind_is_drawn_about_as_often_as_its_chance_says():
    """The rescaling: a kind is drawn with probability 1/(kinds available) at every step, however
    many instances it has (blends' O(n^2) pairs do not crowd out the unary steps). Over ~3000
    steps each kind's count is within 4 standard deviations of its expected count."""
    sampler = CanvasSampler(SPACE, seed=5)
    for i in range(600):
        sampler.draw(i)
    for kind in KINDS:
        expected = sampler.offered[kind]
        # a sum of Bernoulli draws: variance <= expected
        assert abs(sampler.chosen[kind] - expected) <= 4 * math.sqrt(expected) + 5, (kind, sampler.chosen, expected)
    # every kind of the space was drawn, and no kind had more than twice another's chances
    offered = [sampler.offered[k] for k in KINDS if k != "fold"]  # fold needs a window first
    assert min(offered) > 0 and max(offered) < 2 * min(offered)


def test_weights_rescale_the_kinds():
    sampler = CanvasSampler(SPACE, seed=5, weights={"map": 3.0, "shift": 0.0})
    for i in range(200):
        sampler.draw(i)
    assert sampler.chosen["shift"] == 0
    assert sampler.chosen["map"] > 2 * sampler.chosen["unfold"]


def test_bad_options_are_search_errors():
    with pytest.raises(SearchError, match="unknown kinds"):
        CanvasSampler(SPACE, weights={"conv": 1.0})
    with pytest.raises(SearchError, match="maps"):
        CanvasSampler(SPACE, maps=("relu", "softplus"))
    with pytest.raises(SearchError, match="node count"):
        CanvasSampler(SPACE, nodes=1)
    with pytest.raises(SearchError, match="batch and spatial"):
        CanvasSampler(Space("conv2d_stride2", "resnet18_stride2"))


def test_the_stats_account_for_every_attempt():
    sampler = CanvasSampler(SPACE, seed=9)
    legal = sum(sampler.draw(i) is not None for i in range(100))
    stats = sampler.stats
    assert stats["attempts"] == 100 and stats["legal"] == legal
    failed = ("dead_ends", "unfinished", "duplicates", "over_budget", "underfilled", "invalid")
    assert stats["legal"] + sum(stats[k] for k in failed) == stats["attempts"]


def test_a_tight_budget_rejects_kernels_whose_least_widths_exceed_it():
    tight = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [4]}, max_flops="0.05x")
    sampler = CanvasSampler(tight, seed=2)
    found = [s for s in (sampler.draw(i) for i in range(150)) if s is not None]
    assert sampler.stats["over_budget"] > 0
    assert all(s.result["flops"] <= tight.max_flops for s in found)


def test_padding_lets_groups_that_do_not_divide_the_channels_through():
    """G=3 divides none of ResNet-18's channel counts: without padding only a Split of a free width
    (filled to a multiple of 3) is legal; with ``space.pad`` a Split of the input's channels is too."""
    counts = {}
    for pad in (False, True):
        space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [3]}, pad=pad)
        sampler = CanvasSampler(space, seed=0)
        kernels = [k for k in (sampler.draw(i) for i in range(120)) if k is not None]
        fixed = [k for k in kernels if "Split" in k.op.to_dsl() and not k.op.dynamic_variables]
        counts[pad] = len(fixed)
        if pad:
            assert all(k.result["padded"] for k in fixed)
    assert counts == {False: 0, True: counts[True]} and counts[True] > 3


def test_a_matmul_spec_without_spatial_dims():
    space = Space("matmul", "resnet18", max_params="0.5x", max_depth=5)
    kernels = sample(space, 5, seed=1)
    assert len(kernels) == 5
    assert all([d.name for d in k.op.outputs] == ["M", "Cout"] for k in kernels)
    assert all(k.result["params"] <= space.max_params for k in kernels)


def test_search_stores_canvas_kernels_and_resumes_without_repeating(tmp_path):
    db = str(tmp_path / "r.db")
    first = search(SPACE, "canvas", db=db, seed=1, max_results=6)
    assert first.new == 6 and first.valid == 6
    second = search(SPACE, "canvas", db=db, seed=1, max_results=4)
    assert second.new == 4
    store = Store(db, readonly=True)
    try:
        rows = store.top(50, status=None)
        progress = [run["progress"] for run in store.runs()]
    finally:
        store.close()
    assert len(rows) == 10 and len({row["key"] for row in rows}) == 10
    assert all(row["strategy"] == "canvas" and row["status"] == "valid" for row in rows)
    for row in rows:
        op = parse(row["dsl"])
        assert op.key == row["key"]
        widths = row["metrics"]["widths"]
        assert set(widths) == (set() if not op.dynamic_variables else {layer.name for layer in SPACE.layers})
    # the second call went on from the first's attempt counter
    assert progress[0]["iteration"] >= 10


def test_kdsl_search_and_results_on_the_command_line(capsys, tmp_path):
    db = str(tmp_path / "r.db")
    argv = ["search", "conv2d", "--strategy", "canvas", "--max-flops", "0.5x", "--coefficient", "G=4"]
    assert main([*argv, "--max-results", "3", "--db", db, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["strategy"] == "canvas" and summary["new"] == 3 and summary["valid"] == 3
    assert main(["results", "--db", db, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["counts"] == {"valid": 3} and len(listed["top"]) == 3
    assert all(parse(row["dsl"]).key == row["key"] for row in listed["top"])


def test_the_search_bench_prints_the_sampler_beside_the_rollouts():
    results = run_bench(max_depth=3, seconds=0.4)
    assert [row["max_flops"] for row in results["canvas"]] == ["0.5x", None]
    for row in results["canvas"]:
        assert row["attempts"] >= row["legal"] > 0 and 0 < row["valid_after_solving"] <= 1
        assert row["ms_per_legal"] >= row["sample_ms_per_legal"]
    canvas_lines = [line for line in results["lines"] if "canvas sampler" in line]
    rollout_lines = [line for line in results["lines"] if "random rollouts" in line]
    assert len(canvas_lines) == 2 and len(rollout_lines) == 5
    assert all("ms per legal kernel" in line and "distinct canonical/min" in line for line in canvas_lines)


# -- the reference and PyTorch agree on sampled kernels ----------------------------------------------

DRAWS = int(os.environ.get("KDSL_CANVAS_DRAWS", "12"))
TVM_DRAWS = int(os.environ.get("KDSL_CANVAS_TVM_DRAWS", "8"))


def assert_agrees_with_the_reference(backend: str, kernel) -> None:
    """The backend's float64 output of a sampled kernel has the space's output shape and is the
    reference's output: the same formulas in other orders, rounding only (as in test_codegen.py)."""
    op, layer = kernel
    x, weights = reference.random_inputs(op, layer)
    expected = reference.run(op, layer, x, weights)
    got = backends.output_or_error(backend, op, layer, x, weights)
    if isinstance(got, Exception):
        raise got
    assert got.shape == expected.shape == tuple(layer[d.name] for d in SPACE.spec.outputs)
    scale = max(1.0, float(np.abs(expected).max()))
    assert np.abs(got - expected).max() <= 1e-9 * scale, op.to_dsl()


@settings(max_examples=DRAWS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kst.canvas_kernels())
def test_reference_and_pytorch_agree_on_sampled_kernels(kernel):
    assert_agrees_with_the_reference("torch", kernel)


@settings(max_examples=TVM_DRAWS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kst.canvas_kernels())
def test_tvm_agrees_with_the_reference_on_sampled_kernels(kernel):
    """Every kernel search can emit lowers on every backend: TVM too, drawn from the sampler itself."""
    assert_agrees_with_the_reference("tvm", kernel)


def test_kdsl_show_prints_a_stored_templates_widths_per_layer(capsys, tmp_path):
    from kdsl.cli import main

    db = str(tmp_path / "c.sqlite")
    search(
        Space("conv2d", "resnet18", coefficients={"K": [3], "G": [4]}, max_flops="0.5x"),
        "canvas",
        db=db,
        max_results=20,
    )
    store = Store(db)
    try:
        row = next(r for r in store.top(100) if "dynamic(" in r["dsl"])
    finally:
        store.close()
    assert main(["show", "--db", db, row["key"]]) == 0
    out = capsys.readouterr().out
    for layer, widths in row["metrics"]["widths"].items():
        for name, value in widths.items():
            assert f"widths on {layer}: " in out and f"{name}={value}" in out
