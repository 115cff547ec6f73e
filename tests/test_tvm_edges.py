"""The TVM backend at the edges: size-1 dims, configurations the tuners can draw, and bad inputs.

Every check compares against the NumPy reference interpreter in float64 (exact up to rounding), over
the unscheduled kernel, the default schedule, the schedule space's heuristic and random points of the
space. The hunt draws operators the way search does (random rollouts in the conv2d, stride-2 and
matmul spaces) and from :mod:`kdsl.testing.strategies`, and binds them to small layers in which
coefficients and primary dims are often 1. ``KDSL_SLOW_TESTS=1`` widens it.
"""

import os
import random

import numpy as np
import pytest
from backends import backend

backend("tvm")
torch = backend("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen import reference  # noqa: E402
from kdsl.codegen.tvm import build, invertible_copy, load_tvm, lower, source  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.lang import Expand, Input, Merge, Output, Reduce, Share, Split, Weight, coefficient, primary  # noqa: E402
from kdsl.lang.errors import KdslError, LoweringError  # noqa: E402
from kdsl.search.sample import Sampling  # noqa: E402
from kdsl.search.space import Space as SearchSpace  # noqa: E402
from kdsl.search.synthesis import to_operators  # noqa: E402
from kdsl.testing import strategies as kst  # noqa: E402

SLOW = os.environ.get("KDSL_SLOW_TESTS") == "1"

H, W = primary("H W")
K = coefficient("K")
#: The issue's reproducer: with K = 1 the default schedule left out[0] unwritten.
SPLIT_MERGE = Input(H, W) >> Reduce(W) >> Split(H, K, "o", "i") >> Merge("i", "o", "m") >> Output("m")


def run_tvm(op, layer, x, weights, schedule="default"):
    kernel = build(op, layer, dtype="float64", schedule=schedule)
    return kernel(torch.from_numpy(x), *(torch.from_numpy(w) for w in weights)).numpy()


def space_schedule(config):
    return lambda lowered: ScheduleSpace(lowered).apply(config)


def heuristic_schedule(lowered):
    space = ScheduleSpace(lowered)
    return space.apply(space.heuristic())


def assert_tvm_matches(op, layer, x, weights, schedule, label):
    """The TVM kernel under ``schedule`` computes the reference's output (float64, to rounding)."""
    expected = reference.run(op, layer, x, weights)
    got = run_tvm(op, layer, x, weights, schedule)
    assert got.shape == expected.shape, f"{label}: shape {got.shape} != {expected.shape}\n{op.to_dsl()}{layer}"
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9, err_msg=f"{label}\n{op.to_dsl()}{layer}")


# -- the size-1 reproducer ---------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["default", None, "heuristic"])
def test_split_merge_with_a_size_one_block_writes_every_output(schedule):
    layer = {"K": 1, "H": 2, "W": 3}
    x = np.arange(6.0).reshape(2, 3)
    chosen = heuristic_schedule if schedule == "heuristic" else schedule
    assert run_tvm(SPLIT_MERGE, layer, x, [], chosen).tolist() == [3.0, 12.0]


def test_every_configuration_of_the_reproducer_is_right_or_refused():
    layer = {"K": 1, "H": 2, "W": 3}
    x = np.arange(6.0).reshape(2, 3)
    space = ScheduleSpace(lower(SPLIT_MERGE, layer, "float64"))
    rng = random.Random(0)
    checked = 0
    for _ in range(12):
        config = space.random(rng)
        try:
            got = run_tvm(SPLIT_MERGE, layer, x, [], space_schedule(config))
        except LoweringError:
            continue
        assert got.tolist() == [3.0, 12.0], config
        checked += 1
    assert checked >= 6


def test_a_size_one_side_of_split_and_merge_is_lowered_without_div_or_mod():
    # the cause: m // 2 and m % 2 over a size-1 dim simplified to (m + 1) // 2, which TVM inverted wrongly
    text = source(SPLIT_MERGE, {"K": 1, "H": 2, "W": 3})
    assert "//" not in text and "%" not in text
    assert "//" in source(SPLIT_MERGE, {"K": 2, "H": 6, "W": 3})  # a real transposition keeps them


def _copy_block(index):
    """The TIR block of ``out[i] = y[index(i)]`` (y of 8 elements, out of 8 unless ``index`` broadcasts)."""
    tvm = load_tvm()
    y = tvm.te.placeholder((8,), "float64", name="y")
    size = 4 if index == "stride" else 8
    rule = {"stride": lambda i: y[i * 2], "offset": lambda i: y[(i + 1) % 8], "split": lambda i: y[i % 4 * 2 + i // 4]}
    out = tvm.te.compute((size,), rule[index], name="out")
    sch = tvm.s_tir.Schedule(tvm.te.create_prim_func([y, out]))
    return sch.get(sch.get_sblock("out"))


@pytest.mark.parametrize("index, expected", [("split", True), ("offset", False), ("stride", False)])
def test_only_copies_with_trusted_inverses_are_folded_into_the_write_back(index, expected):
    assert invertible_copy(_copy_block(index)) is expected


def test_a_local_tile_across_a_layout_tile_is_refused():
    # a 6-wide accumulator in the layout [v // 4, v % 4] made the write-back copy elements no thread had
    # computed yet; aligned tiles are right
    layer = {"H": 12, "W": 3, "K": 4}
    x, _ = reference.random_inputs(SPLIT_MERGE, layer, seed=1)
    space = ScheduleSpace(lower(SPLIT_MERGE, layer, "float64"))
    config = space.heuristic() | {"stage0.cache": "local", "layout.stage0.tile": "0:4", "stage0.tile.H": (2, 1, 6)}
    with pytest.raises(LoweringError, match="do not align with the layout tile"):
        space.apply(config)
    for aligned in [(3, 1, 4), (1, 3, 4), (6, 1, 2)]:
        assert_tvm_matches(SPLIT_MERGE, layer, x, [], space_schedule(config | {"stage0.tile.H": aligned}), aligned)


def _broadcast_copy():
    M, Cin, Cout = primary("M Cin Cout")
    return Input(M, Cin) >> Expand("Cout", Cout) >> Reduce(Cin) >> Output(M, Cout)


def _matmul():
    M, Cin, Cout = primary("M Cin Cout")
    return Input(M, Cin) >> Share(Weight(Cout, Cin, name="w")) >> Reduce(Cin) >> Output(M, Cout)


@pytest.mark.parametrize(
    "make, layer",
    [(_broadcast_copy, {"M": 4, "Cin": 3, "Cout": 4}), (_matmul, {"M": 1, "Cin": 2, "Cout": 1})],
)
def test_the_heuristic_is_valid_for_broadcast_copies_and_reductions_to_one_value(make, layer):
    # it folded a broadcast copy into the write-back (TVM refused) and refused a stage without spatial loops
    op = make()
    x, weights = reference.random_inputs(op, layer, seed=0)
    assert_tvm_matches(op, layer, x, weights, heuristic_schedule, "heuristic")


# -- bad layers and inputs raise the reference's KdslError --------------------------------------------

GOOD = {"N": 1, "Cin": 4, "Cout": 6, "H": 4, "W": 4, "G": 2}


def _error(call):
    try:
        call()
    except KdslError as error:
        return type(error)
    return None


@pytest.mark.parametrize(
    "layer",
    [GOOD | {"H": 0}, GOOD | {"H": -2}, GOOD | {"H": True}, GOOD | {"W": 2.5}, GOOD | {"Cin": 3}, {"N": 1}, "conv"],
)
def test_a_bad_layer_raises_the_references_error(layer):
    op = gallery.load("grouped_conv2d")
    expected = _error(lambda: reference.random_inputs(op, layer))
    assert expected is not None
    assert _error(lambda: build(op, layer, dtype="float64")) is expected


@pytest.mark.parametrize("case", ["short dim", "missing axis", "no weights", "bad weight", "int input", "list input"])
def test_a_bad_input_raises_the_references_error(case):
    op = gallery.load("grouped_conv2d")
    x, weights = reference.random_inputs(op, GOOD)
    x, weights = {
        "short dim": (x[:, :, :3], weights),
        "missing axis": (x[0], weights),
        "no weights": (x, []),
        "bad weight": (x, [weights[0][:1]]),
        "int input": (x.astype(np.int64), weights),
        "list input": (x.tolist(), weights),
    }[case]
    expected = _error(lambda: reference.run(op, GOOD, x, weights))
    assert expected is not None
    kernel = build(op, GOOD, dtype="float64")
    as_torch = x if isinstance(x, list) else torch.from_numpy(x)
    assert _error(lambda: kernel(as_torch, *(torch.from_numpy(w) for w in weights))) is expected


def test_an_input_of_another_float_type_is_refused_with_a_kdsl_error():
    op = gallery.load("grouped_conv2d")
    x, weights = reference.random_inputs(op, GOOD, dtype=np.float32)
    kernel = build(op, GOOD, dtype="float64")
    with pytest.raises(LoweringError, match="compiled for float64"):
        kernel(torch.from_numpy(x), *(torch.from_numpy(w) for w in weights))
    numpy_in = kernel(x.astype(np.float64), *(w.astype(np.float64) for w in weights))  # NumPy arrays work too
    np.testing.assert_allclose(numpy_in.numpy(), reference.run(op, GOOD, x.astype(np.float64), weights), rtol=1e-5)


# -- the hunt: operators search emits, at small layers with size-1 dims --------------------------------

TINY_LAYERS = {
    "conv2d": [{"name": "tiny", "N": 2, "Cin": 4, "Cout": 4, "H": 4, "W": 4}],
    "conv2d_stride2": [{"name": "tiny", "N": 2, "Cin": 4, "Cout": 4, "H": 4, "W": 4}],
    "matmul": [{"name": "tiny", "M": 4, "Cin": 4, "Cout": 4}],
}
SEARCH_SPACES = [
    ("conv2d", {"K": [3], "G": [2]}, 5),
    ("conv2d_stride2", {"K": [3], "s": [2]}, 6),
    ("matmul", {"K": [2], "G": [2]}, 4),
]


def search_operators(spec, coefficients, depth, count, seed):
    """Up to ``count`` distinct operators from random rollouts of a search space (deterministic)."""
    space = SearchSpace(spec, TINY_LAYERS[spec], coefficients=coefficients, max_depth=depth)
    found = {}
    for attempt, state in enumerate(Sampling(space, seed=seed).states()):
        if state is not None:
            for op in to_operators(space, state):
                found.setdefault(op.key, op)
        if len(found) >= count or attempt > 400 * count:
            break
    assert found, f"no operator from the {spec} space"
    return [found[key] for key in sorted(found)][:count]


def small_layers(op, rng, count):
    """``count`` valid layers with every variable in 1..6; the first tries every coefficient and one primary at 1."""
    names = [v.name for v in op.variables]
    primaries = set(op.primary_variables)
    layers = []
    for attempt in range(300):
        layer = {n: rng.choice((1, 2, 3, 4, 6) if n in primaries else (1, 2, 3)) for n in names}
        if attempt == 0:
            layer |= {n: 1 for n in names if n not in primaries}
            if primaries:
                layer[rng.choice(sorted(primaries))] = 1
        try:
            shapes = reference.shapes(op, layer)
        except KdslError:
            continue
        if max([np.prod(shapes.input), *(np.prod(s) for s in shapes.weights)]) <= 4096:
            layers.append(layer)
        if len(layers) == count:
            break
    return layers


def compare_everywhere(op, layer, rng, configs, tally):
    """TVM agrees with the reference unscheduled, under the default schedule, the heuristic and ``configs``
    random points of the schedule space (a point may be refused with a LoweringError, never be wrong)."""
    x, weights = reference.random_inputs(op, layer, seed=rng.randrange(1000))
    for label, schedule in [("unscheduled", None), ("default", "default"), ("heuristic", heuristic_schedule)]:
        assert_tvm_matches(op, layer, x, weights, schedule, label)
    space = ScheduleSpace(lower(op, layer, "float64"))
    for _ in range(configs):
        config = space.random(rng)
        try:
            assert_tvm_matches(op, layer, x, weights, space_schedule(config), f"space {config}")
        except LoweringError:
            continue
        tally["configs"] += 1
    tally["compared"] += 1
    tally["size_one"] += any(v == 1 for v in layer.values())
    assert tally["compared"] >= 1


def test_search_operators_agree_with_the_reference_at_small_layers():
    per_space, layers, configs = (60, 3, 4) if SLOW else (12, 2, 2)
    rng = random.Random(10)
    tally = {"compared": 0, "configs": 0, "size_one": 0}
    for spec, coefficients, depth in SEARCH_SPACES:
        for op in search_operators(spec, coefficients, depth, per_space, seed=3):
            for layer in small_layers(op, rng, layers):
                compare_everywhere(op, layer, rng, configs, tally)
    assert tally["compared"] >= (250 if SLOW else 45), tally
    assert tally["size_one"] >= tally["compared"] // 3, tally
    assert tally["configs"] >= tally["compared"], tally


def test_strategy_operators_agree_with_the_reference_at_small_layers():
    examples = 150 if SLOW else 20
    rng = random.Random(11)
    tally = {"compared": 0, "configs": 0, "size_one": 0}

    @settings(
        max_examples=examples, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(kst.operators(max_steps=6))
    def hunt(op):
        for layer in small_layers(op, rng, 2):
            compare_everywhere(op, layer, rng, 2, tally)

    hunt()
    assert tally["compared"] >= (2 * examples * 3) // 4, tally
    assert tally["size_one"] >= tally["compared"] // 3, tally
