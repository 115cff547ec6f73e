"""A kernel with an epilogue (:mod:`kdsl.codegen.tvm.epilogue`) against the NumPy reference's operator
followed by the same affine, residual add and ReLU in float64: conv2d and grouped_conv2d, with and
without the residual, the default schedule and a tuned-style random schedule of the plain kernel's
space, plain and channel-blocked; the fallback pass; refusals."""

from __future__ import annotations

import random

import numpy as np
import pytest
from backends import backend

from kdsl import gallery
from kdsl.codegen import reference
from kdsl.lang import Input, Output, Reduce, Share, Unfold, Weight, coefficient, primary
from kdsl.lang.errors import KdslError, LoweringError, ShapeError

backend("tvm")

import torch  # noqa: E402  (after the skip: the kernels need TVM)

from kdsl.codegen.tvm import build, load_tvm, lower  # noqa: E402
from kdsl.codegen.tvm.epilogue import Epilogue, build_fused  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.codegen.tvm.signature_layout import from_blocked, to_blocked  # noqa: E402

LAYERS = {
    "conv2d": {"N": 2, "Cin": 8, "Cout": 8, "H": 5, "W": 6},
    "grouped_conv2d": {"N": 1, "Cin": 8, "Cout": 8, "H": 5, "W": 5, "G": 2},
}


def random_schedule(op, layer, seed: int):
    """A schedule function of a random valid configuration of the plain operator's space: what a tuned
    record of the plain kernel (its task key, its space) gives."""
    space = ScheduleSpace(lower(op, layer))
    rng = random.Random(seed)
    for _ in range(50):
        config = space.random(rng)
        if space.rejection(config) is None:
            return lambda lowered: ScheduleSpace(lowered).apply(config)
    raise AssertionError("no valid random configuration in 50 draws")


def arguments(op, layer, residual: bool, seed: int = 0):
    """float64 inputs, weights, scale, shift and residual, and the expected result: the reference's
    operator output, then ``* scale + shift``, ``+ residual``, ``relu``, in NumPy."""
    rng = np.random.default_rng(seed)
    lowered = lower(op, layer, "float64")
    x = rng.standard_normal([int(d) for d in lowered.x.shape])
    weights = [rng.standard_normal([int(d) for d in w.shape]) for w in lowered.weights]
    channels = lowered.output_shape[1]
    scale, shift = rng.random(channels) + 0.5, rng.standard_normal(channels)
    res = rng.standard_normal(lowered.output_shape) if residual else None
    per_channel = (channels,) + (1,) * (len(lowered.output_shape) - 2)  # broadcast along the dims after C
    expected = reference.run(op, layer, x, *weights) * scale.reshape(per_channel) + shift.reshape(per_channel)
    expected = np.maximum(expected + (res if residual else 0.0), 0.0)
    tensors = [torch.from_numpy(a) for a in (x, *weights)]
    return tensors, torch.from_numpy(scale), torch.from_numpy(shift), res, expected


def assert_fused_matches(op, layer, epilogue: Epilogue, schedule, block: int) -> None:
    (x, *weights), scale, shift, res, expected = arguments(op, layer, epilogue.residual)
    kernel = build_fused(op, layer, epilogue, schedule, block=block, dtype="float64")
    residual = None if res is None else torch.from_numpy(res)
    if block:
        x, residual = to_blocked(x, block), None if residual is None else to_blocked(residual, block)
    with torch.no_grad():
        got = kernel(x, *weights, scale=scale, shift=shift, residual=residual)
    got = from_blocked(got) if block else got
    assert kernel.folded, "the epilogue should fold into the convolution's write-back"
    assert np.allclose(got.numpy(), expected, rtol=1e-10, atol=1e-10), float(np.abs(got.numpy() - expected).max())


@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("residual", [False, True])
def test_a_fused_kernel_is_the_operator_then_affine_residual_and_relu(name, residual):
    op, layer = gallery.load(name), LAYERS[name]
    epilogue = Epilogue(residual=residual)
    assert_fused_matches(op, layer, epilogue, None, block=0)  # the default schedule
    # a record of the plain kernel applies to the fused one, here in the blocked signature too
    assert_fused_matches(op, layer, epilogue, random_schedule(op, layer, seed=len(name)), block=4)


def test_a_plain_kernels_record_schedules_the_fused_kernel_as_it_does_the_plain_one():
    # the task key and the space stay the plain kernel's: the fused schedule is the plain schedule's
    # trace, primitive for primitive, then the epilogue folded into the write-back
    op, layer = gallery.load("conv2d"), LAYERS["conv2d"]
    schedule = random_schedule(op, layer, seed=3)
    plain = build(op, layer, schedule=schedule)
    fused = build_fused(op, layer, Epilogue(residual=True), schedule)
    plain_lines = str(plain.schedule.trace).splitlines()
    fused_lines = str(fused.schedule.trace).splitlines()
    assert fused_lines[: len(plain_lines)] == plain_lines
    assert [line.split("(")[0].split(".")[-1] for line in fused_lines[len(plain_lines) :]] == [
        "get_sblock",
        "reverse_compute_inline",
    ]


def test_without_relu_the_epilogue_keeps_negative_values():
    op, layer = gallery.load("conv2d"), LAYERS["conv2d"]
    (x, w), scale, shift, _, _ = arguments(op, layer, residual=False)
    kernel = build_fused(op, layer, Epilogue(relu=False), dtype="float64")
    expected = (
        reference.run(op, layer, x.numpy(), w.numpy()) * scale.numpy()[:, None, None] + shift.numpy()[:, None, None]
    )
    got = kernel(x, w, scale=scale, shift=shift).numpy()
    assert (got < 0).any()
    assert np.allclose(got, expected, rtol=1e-10, atol=1e-10)


def test_an_epilogue_that_cannot_fold_runs_as_a_pass_of_its_own():
    # a 1-D convolution whose reduction writes the output itself: unscheduled, the epilogue's producer is
    # a reduction block, which reverse_compute_inline refuses
    op = conv1d()
    layer = {"N": 2, "C": 3, "L": 40, "K": 3}
    (x, w), scale, shift, res, expected = arguments(op, layer, residual=True)
    residual = torch.from_numpy(res)
    for block in (0, 3):  # the pass of its own in the channel-blocked signature too
        kernel = build_fused(op, layer, Epilogue(residual=True), _unscheduled, block=block, dtype="float64")
        assert not kernel.folded
        if block:
            got = from_blocked(kernel(to_blocked(x, 3), w, scale=scale, shift=shift, residual=to_blocked(residual, 3)))
        else:
            got = kernel(x, w, scale=scale, shift=shift, residual=residual)
        assert np.allclose(got.numpy(), expected, rtol=1e-10, atol=1e-10)


def conv1d(weight: str = "w"):
    """A depthwise 1-D window with one weight per tap, whose reduction stage writes the output."""
    N, C, L = primary("N C L")
    K = coefficient("K")
    return Input(N, C, L) >> Unfold(L, K, "k") >> Share(Weight("k", name=weight)) >> Reduce("k") >> Output(N, C, L)


def _unscheduled(lowered):
    return load_tvm().s_tir.Schedule(lowered.module())


def test_bad_calls_and_operators_are_refused_with_what_is_wrong():
    op, layer = gallery.load("conv2d"), {"N": 1, "Cin": 4, "Cout": 4, "H": 3, "W": 3}
    kernel = build_fused(op, layer, Epilogue(residual=True))
    x, w, res = torch.randn(1, 4, 3, 3), torch.randn(4, 4, 3, 3), torch.randn(1, 4, 3, 3)
    scale, shift = torch.ones(4), torch.zeros(4)
    with pytest.raises(ShapeError, match="scale has shape \\(3,\\), expected \\(4,\\)"):
        kernel(x, w, scale=torch.ones(3), shift=shift, residual=res)
    with pytest.raises(ShapeError, match="residual must be a torch tensor"):
        kernel(x, w, scale=scale, shift=shift)
    with pytest.raises(LoweringError, match="shift has dtype torch.float64"):
        kernel(x, w, scale=scale, shift=shift.double(), residual=res)
    with pytest.raises(LoweringError, match="forward only"):
        kernel(x, w.requires_grad_(), scale=scale, shift=shift, residual=res)
    with pytest.raises(ShapeError, match="adds no residual"):
        build_fused(op, layer, Epilogue())(x, w.detach(), scale=scale, shift=shift, residual=res)
    with pytest.raises(LoweringError, match="cannot be exported"):
        kernel.export("fused.so")
    with pytest.raises(LoweringError, match="timed by calling it"):
        kernel.time(x, w.detach())
    with pytest.raises(KdslError, match="cannot be blocked by 3"):
        build_fused(op, layer, Epilogue(), block=3)
    with pytest.raises(LoweringError, match="epilogue_scale"):
        build_fused(conv1d("epilogue_scale"), {"N": 1, "C": 2, "L": 8, "K": 3}, Epilogue())
    with pytest.raises(LoweringError, match="expected an Epilogue"):
        build_fused(op, layer, "relu")
