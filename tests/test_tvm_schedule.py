"""The default TVM schedule computes exactly what the unscheduled lowering computes: every gallery operator
at sizes that exercise the register tiles (extents divisible by whole vectors) and at odd sizes (7x7,
H smaller than the window, primes), plus random operators from the public strategies. Kernels run in
float64 against the NumPy reference interpreter; conv2d and matmul must also get their fast schedule
(a register tile, no fallback)."""

import os

import numpy as np
import pytest
from backends import backend, data_inputs

backend("tvm")
torch = backend("torch")

from hypothesis import given, settings  # noqa: E402
from test_gallery import CASES  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen import reference  # noqa: E402
from kdsl.codegen.tvm import build, lower  # noqa: E402
from kdsl.codegen.tvm.default_schedule import default_schedule  # noqa: E402
from kdsl.testing.strategies import operators_with_layers  # noqa: E402

os.environ.setdefault("TVM_NUM_THREADS", "2")

# the layers of grouped_conv2d and of its shifted-window variant
GROUPED = [
    {"N": 1, "Cin": 32, "Cout": 64, "H": 7, "W": 7},
    {"N": 2, "Cin": 6, "Cout": 9, "H": 2, "W": 3, "G": 3, "K": 5},
]
# the layers of syno_op1 and syno_op2
SYNO = [{"N": 1, "Cin": 64, "Cout": 64, "H": 8, "W": 8}, {"N": 1, "Cin": 8, "Cout": 12, "H": 3, "W": 5, "G": 2, "s": 3}]

# name -> layers: one with vector-friendly extents (whole AVX-512 vectors, tiles that divide),
# then odd ones (7x7, primes, H smaller than the window) that force small or no tiles.
LAYERS = {
    "avg_pool2d": [{"N": 2, "Cin": 16, "H": 8, "W": 32}, {"N": 1, "Cin": 3, "H": 9, "W": 3, "K": 3}],
    "conv1d": [{"N": 2, "Cin": 8, "Cout": 32, "L": 24}, {"N": 1, "Cin": 3, "Cout": 5, "L": 2, "K": 5}],
    "conv2d": [
        {"N": 2, "Cin": 8, "Cout": 32, "H": 8, "W": 8},
        {"N": 1, "Cin": 16, "Cout": 16, "H": 7, "W": 7},
        {"N": 1, "Cin": 3, "Cout": 5, "H": 2, "W": 3, "K": 5},
    ],
    "conv2d_kx1_1xk": [{"N": 1, "Cin": 8, "Cout": 16, "H": 6, "W": 8}, {"N": 2, "Cin": 3, "Cout": 2, "H": 2, "W": 7}],
    "depthwise_conv2d": [{"N": 1, "Cin": 16, "H": 8, "W": 16}, {"N": 2, "Cin": 3, "H": 1, "W": 3, "K": 5}],
    "depthwise_separable_conv2d": [
        {"N": 1, "Cin": 16, "Cout": 32, "H": 7, "W": 8},
        {"N": 1, "Cin": 3, "Cout": 1, "H": 3, "W": 2, "K": 5},
    ],
    "dilated_conv2d": [
        {"N": 1, "Cin": 8, "Cout": 16, "H": 7, "W": 8},
        {"N": 1, "Cin": 2, "Cout": 3, "H": 3, "W": 5, "d": 3},
    ],
    "grouped_conv2d": GROUPED,
    "grouped_conv2d_shifted_window": GROUPED,
    "syno_op2_input_shift": [
        {"N": 1, "Cin": 32, "Cout": 64, "H": 7, "W": 7},
        {"N": 2, "Cin": 6, "Cout": 6, "H": 2, "W": 3, "G": 3, "s": 1, "K": 5},
    ],
    "linear": [{"N": 24, "Cin": 40, "Cout": 48}, {"N": 3, "Cin": 5, "Cout": 7}],
    "matmul": [{"M": 56, "Cin": 24, "Cout": 64}, {"M": 49, "Cin": 13, "Cout": 17}, {"M": 1, "Cin": 3, "Cout": 1}],
    "pixel_shuffle": [{"N": 1, "Cin": 16, "H": 8, "W": 16}, {"N": 2, "Cin": 27, "H": 3, "W": 5, "r": 3}],
    "pixel_unshuffle": [{"N": 1, "Cin": 4, "H": 8, "W": 16}, {"N": 2, "Cin": 3, "H": 9, "W": 15, "r": 3}],
    "pointwise_conv2d": [
        {"N": 1, "Cin": 16, "Cout": 32, "H": 4, "W": 16},
        {"N": 2, "Cin": 3, "Cout": 5, "H": 3, "W": 1},
    ],
    "shift_conv2d": [{"N": 1, "Cin": 16, "Cout": 32, "H": 4, "W": 16}, {"N": 1, "Cin": 3, "Cout": 2, "H": 1, "W": 5}],
    "strided_conv2d": [
        {"N": 1, "Cin": 8, "Cout": 32, "H": 16, "W": 16},
        {"N": 1, "Cin": 2, "Cout": 2, "H": 9, "W": 3, "s": 3},
    ],
    "syno_op1": SYNO,
    "syno_op2": SYNO,
    "unfold2d": [{"N": 1, "Cin": 4, "H": 8, "W": 16}, {"N": 2, "Cin": 3, "H": 2, "W": 3, "K": 5}],
    # branching kernels (Canvas's primitives)
    "max_pool2d": [{"N": 1, "Cin": 8, "H": 7, "W": 16}, {"N": 2, "Cin": 3, "H": 2, "W": 3, "K": 5}],
    "max_pool2d_2x2": [{"N": 1, "Cin": 8, "H": 8, "W": 16}, {"N": 2, "Cin": 3, "H": 9, "W": 6, "K": 3}],
    "residual_conv2d": [{"N": 1, "Cin": 16, "H": 7, "W": 8}, {"N": 2, "Cin": 3, "H": 2, "W": 3, "K": 5}],
    "squeeze_excitation": [{"N": 2, "Cin": 32, "H": 7, "W": 8}, {"N": 1, "Cin": 6, "H": 3, "W": 1, "r": 3}],
    "involution": [
        {"N": 1, "Cin": 32, "H": 7, "W": 8},
        {"N": 2, "Cin": 6, "H": 3, "W": 2, "K": 3, "S": 3, "r": 2},
    ],
    "spatial_attention": [{"N": 1, "Cin": 16, "H": 4, "W": 6}, {"N": 2, "Cin": 6, "H": 3, "W": 1, "r": 2}],
    "shift_add": [{"N": 1, "Cin": 16, "H": 7, "W": 8}, {"N": 2, "Cin": 3, "H": 2, "W": 3, "K": 5}],
    "canvas_resnet34": [{"N": 1, "Cin": 16, "H": 7, "W": 8}, {"N": 2, "Cin": 3, "H": 2, "W": 3, "K": 5}],
    # windows without padding, zero insertion, and kernels of two data inputs: the gallery tests' layers
    **{
        name: CASES[name][1]
        for name in (
            "conv2d_valid",
            "alexnet_c1",
            "conv_transpose2d",
            "conv_transpose3d",
            "conv3d",
            "avg_pool2d_strided",
            "bmm",
            "bmm_tn",
        )
    },
    "attention_qk": CASES["attention_qk"][1],
}


def input_arrays(op, layer, seed=0):
    """Input and weights in float64, weights uniform(+-1/sqrt(fan_in)) so outputs stay O(1)."""
    shapes = reference.shapes(op, layer)
    rng = np.random.default_rng(seed)
    xs = tuple(rng.standard_normal(shape) for shape in shapes.inputs)
    weights = []
    for shape in shapes.weights:
        bound = 1 / np.sqrt(max(1, int(np.prod(shape[1:]))))
        weights.append(rng.uniform(-bound, bound, shape))
    return (xs[0] if len(xs) == 1 else xs), weights  # a kernel of several inputs takes a tuple


def check_scheduled(op, layer, dtype="float64"):
    """The default-scheduled kernel agrees with the reference interpreter; returns the schedule report."""
    x, weights = input_arrays(op, layer)
    expected = reference.run(op, layer, x, weights)
    report = []
    kernel = build(op, layer, dtype=dtype, schedule=lambda lowered: default_schedule(lowered, report))
    inputs = data_inputs(x)
    got = kernel(
        *(torch.from_numpy(a.astype(dtype)) for a in inputs), *(torch.from_numpy(w.astype(dtype)) for w in weights)
    )
    tolerance = 1e-9 if dtype == "float64" else 1e-4
    np.testing.assert_allclose(got.numpy(), expected, rtol=tolerance, atol=tolerance)
    assert got.shape == expected.shape
    return report


def test_layers_cover_the_gallery():
    assert set(LAYERS) == set(gallery.names())


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_gallery_operator_scheduled_equals_reference(name):
    op = gallery.load(name)
    for layer in LAYERS[name]:
        report = check_scheduled(op, layer)
        assert report, f"{name} at {layer}: no stage was reported"


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("conv2d", {"N": 1, "Cin": 16, "Cout": 64, "H": 7, "W": 7}),
        ("conv2d", {"N": 2, "Cin": 8, "Cout": 32, "H": 8, "W": 8}),
        ("matmul", {"M": 56, "Cin": 16, "Cout": 64}),
    ],
)
def test_conv2d_and_matmul_get_the_register_tile_in_float32(name, layer):
    report = dict(check_scheduled(gallery.load(name), layer, dtype="float32"))
    assert report["stage0"].startswith("register tile"), report
    if name == "conv2d":  # the vector axis is Cout: bounds checks on H, W stay outside the vector
        assert report["pad0"].startswith("inlined"), report
    assert not any("fallback" in what for what in report.values()), report


def test_conv2d_transpose_copy_is_folded_into_the_write_back():
    report = default_schedule(lower(gallery.load("conv2d"), {"N": 1, "Cin": 8, "Cout": 32, "H": 8, "W": 8}), [])
    text = report.mod.script()
    assert "stage0_local" in text and "sblock_alloc_buffer((1, 8, 8, 32))" not in text


def test_weight_is_packed_along_the_vector_axis():
    from kdsl.codegen.tvm.machine import current_machine

    sch = default_schedule(lower(gallery.load("conv2d"), {"N": 1, "Cin": 8, "Cout": 32, "H": 8, "W": 8}))
    tile = min(32, 2 * current_machine().lanes("float32"))  # two vectors of Cout: AVX-512's 32, AVX2's 16
    assert f"w_global = T.sblock_alloc_buffer(({32 // tile}, 8, 3, 3, {tile}))" in sch.mod.script()


def test_a_failing_stage_falls_back_and_stays_correct(monkeypatch):
    from kdsl.codegen.tvm import schedule_apply

    def broken(*args, **kwargs):
        raise RuntimeError("simulated schedule failure")

    monkeypatch.setattr(schedule_apply._Applier, "_reduce", broken)
    report = dict(check_scheduled(gallery.load("conv2d"), {"N": 1, "Cin": 4, "Cout": 16, "H": 5, "W": 5}))
    assert report["stage0"].startswith("fallback (simulated schedule failure)"), report


def test_float32_conv2d_resnet_like_odd_spatial_size():
    layer = {"N": 1, "Cin": 32, "Cout": 32, "H": 7, "W": 7}
    op = gallery.load("conv2d")
    x, weights = input_arrays(op, layer, seed=1)
    expected = reference.run(op, layer, x, weights)
    kernel = build(op, layer)
    got = kernel(torch.from_numpy(x.astype("float32")), *(torch.from_numpy(w.astype("float32")) for w in weights))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4)


@settings(max_examples=12)
@given(operators_with_layers(max_steps=5))
def test_random_operators_scheduled_equal_reference(case):
    op, layer = case
    report = check_scheduled(op, layer)
    assert len(report) >= 1


def test_windows_read_a_zero_padded_copy_unless_a_view_remaps_the_dim():
    conv = lower(gallery.load("conv2d"), {"N": 1, "Cin": 4, "Cout": 16, "H": 6, "W": 6})
    pads = [s for s in conv.stages if s.is_pad]
    assert [(s.name, s.padded, s.reads_from) for s in pads] == [("pad0", (2, 3), ("x",))]
    assert conv.stages[1].reads_from == ("pad0",)
    # a Shift before the Unfold: the guard is on the shifted coordinate, so L keeps its bounds check
    from kdsl.lang import Input, Output, Reduce, Share, Shift, Unfold, Weight, primary

    N, Cin, L, Cout = primary("N Cin L Cout")
    shifted = (
        Input(N, Cin, L)
        >> Shift(L)
        >> Unfold(L, 3, "k")
        >> Share(Weight(Cin, "k", Cout, name="w"))
        >> Reduce(Cin, "k")
        >> Output(N, Cout, L)
    )
    layer = {"N": 1, "Cin": 4, "Cout": 16, "L": 8}
    assert not any(s.is_pad for s in lower(shifted, layer).stages)
    check_scheduled(shifted, layer)


@pytest.mark.parametrize("inline", [False, True])
def test_pads_inlined_or_materialized_match_the_reference(inline):
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    op, layer = gallery.load("syno_op1"), {"N": 1, "Cin": 64, "Cout": 64, "H": 6, "W": 6}
    x, weights = input_arrays(op, layer)
    expected = reference.run(op, layer, x, weights)
    space = ScheduleSpace(lower(op, layer, dtype="float64"))
    config = space.heuristic()
    config.update({name: inline for name in config if name.startswith("pad") and name.endswith(".inline")})
    kernel = build(op, layer, dtype="float64", schedule=lambda lowered: space.apply(config))
    got = kernel(torch.from_numpy(x), *(torch.from_numpy(w) for w in weights))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-9)


def test_the_heuristic_materializes_a_pad_only_where_the_vector_reads_it():
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    config = ScheduleSpace(
        lower(gallery.load("syno_op1"), {"N": 1, "Cin": 128, "Cout": 128, "H": 28, "W": 28})
    ).heuristic()
    # stage0 vectorizes W, which pad0 pads; stage1 vectorizes Cout and pad1 pads H
    assert (config["stage0.vector"], config["pad0.inline"]) == ("W", False)
    assert (config["stage1.vector"], config["pad1.inline"]) == ("Cout", True)


def test_a_copy_that_reads_through_a_window_keeps_its_bounds_checks():
    # materializing the pad would add a pass over memory to a stage that is one pass already
    report = dict(check_scheduled(gallery.load("unfold2d"), {"N": 1, "Cin": 16, "H": 6, "W": 6}))
    assert report["pad0"].startswith("inlined"), report


def test_the_heuristic_keeps_reductions_in_block_order_and_unrolls_only_short_ones():
    # c = Cout / (G * s) = 8 is longer than UNROLL_REDUCTION and follows the windows kh, kw in the block:
    # it stays inside them, serial, while g, kh, kw are unrolled (with c outside kh, kw syno_op1 ran
    # 15-20% slower at conv5_x)
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    space = ScheduleSpace(lower(gallery.load("syno_op1"), {"N": 1, "Cin": 64, "Cout": 64, "H": 7, "W": 7, "G": 4}))
    config = space.heuristic()
    assert config["stage1.reductions"] == "whole"
    sch = space.apply(config)
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("stage1_update"))]
    reductions = [(str(lp.loop_var), int(lp.kind)) for lp in loops if str(lp.loop_var).startswith("r_")]
    unrolled, serial = 3, 0  # tirx.ForKind
    assert reductions == [("r_g", unrolled), ("r_kh", unrolled), ("r_kw", unrolled), ("r_c", serial)]


@pytest.mark.parametrize("name", ["syno_op1", "conv2d"])
def test_random_configurations_with_whole_or_split_reductions_match_the_reference(name):
    import random

    from kdsl.codegen.tvm.schedule_space import ScheduleSpace
    from kdsl.lang.errors import LoweringError

    op, layer = gallery.load(name), LAYERS[name][0]
    x, weights = input_arrays(op, layer)
    expected = reference.run(op, layer, x, weights)
    space = ScheduleSpace(lower(op, layer, dtype="float64"))
    rng, checked = random.Random(0), 0
    while checked < 4:
        config = space.random(rng)
        mode = ("whole", "split")[checked % 2]
        config.update({n: mode for n in config if n.endswith(".reductions")})
        try:
            space.apply(config)
        except LoweringError:
            continue
        kernel = build(op, layer, dtype="float64", schedule=lambda lowered, config=config: space.apply(config))
        inputs = data_inputs(x)
        got = kernel(*(torch.from_numpy(a) for a in inputs), *(torch.from_numpy(w) for w in weights))
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-9, err_msg=str(config))
        checked += 1
