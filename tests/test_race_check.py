"""Races and unwritten outputs in lowered TIR (kdsl.codegen.tvm.race_check), and the measurer's NaN-filled check."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from backends import backend

from kdsl import gallery

backend("tvm")  # the kernels need TVM: this asks for the backend, or skips as the other TVM tests do

from tvm.script import tirx as T  # noqa: E402

from kdsl.codegen.tvm import lower  # noqa: E402
from kdsl.codegen.tvm.default_schedule import default_schedule  # noqa: E402
from kdsl.codegen.tvm.epilogue import Epilogue, build_fused  # noqa: E402
from kdsl.codegen.tvm.race_check import find_races, lowered_function, races_of_schedule, unwritten  # noqa: E402
from kdsl.codegen.tvm.signature_layout import block_signature  # noqa: E402
from kdsl.tune.measurer import _compile_job, _compile_setup, _measure_job, _measure_setup, compile_module  # noqa: E402

CONV = {"N": 1, "Cin": 16, "Cout": 16, "H": 8, "W": 8, "K": 3}
MATMUL = {"M": 8, "Cin": 8, "Cout": 8}


@T.prim_func(s_tir=True)
def _shared_scratch(a: T.Buffer((64,), "float32"), out: T.Buffer((64,), "float32")):
    tmp = T.alloc_buffer((4,), "float32")  # above the parallel loop: every thread writes the same 4 elements
    for i in T.parallel(16):
        for j in range(4):
            tmp[j] = a[i * 4 + j] * T.float32(2)
        for j in range(4):
            out[i * 4 + j] = tmp[j]


@T.prim_func(s_tir=True)
def _overlapping(a: T.Buffer((64,), "float32"), out: T.Buffer((64,), "float32")):
    for i in T.parallel(16):
        for j in T.vectorized(8):  # iteration i writes 8 elements from 4 * i: neighbours share 4
            out[(i * 4 + j) % 64] = a[i * 4 + j % 4]


@T.prim_func(s_tir=True)
def _skips_one(x: T.Buffer((8, 8), "float32"), w: T.Buffer((8, 8), "float32"), out: T.Buffer((8, 8), "float32")):
    for i in T.parallel(8):
        for j in range(8):
            if i + j > 0:  # out[0, 0] is never written
                out[i, j] = T.float32(0)
                for k in range(8):
                    out[i, j] = out[i, j] + x[i, k] * w[k, j]


def test_a_scratch_buffer_above_the_parallel_loop_is_a_race():
    (race,) = find_races(lowered_function(_shared_scratch))
    assert (race.buffer, race.loop, race.kind, race.elements) == ("tmp", "i", "same elements", 4)
    assert "16 iterations" in str(race)


def test_iterations_whose_stores_overlap_are_a_race():
    (race,) = find_races(lowered_function(_overlapping))
    assert (race.buffer, race.kind) == ("out", "overlap")
    assert race.elements == 64  # every element: 16 windows of 8 from steps of 4 cover it twice


@T.prim_func(s_tir=True)
def _past_the_end(a: T.Buffer((16,), "float32"), out: T.Buffer((16,), "float32")):
    for i in T.parallel(16):
        out[i + 1] = a[i]  # the last iteration writes one element past the output


def test_a_store_past_the_end_is_out_of_bounds():
    (race,) = find_races(lowered_function(_past_the_end))
    assert (race.buffer, race.kind, race.elements) == ("out", "out of bounds", 1)
    assert "indices 16..16 of 16" in str(race)


def test_an_element_no_store_writes_is_counted():
    func = lowered_function(_skips_one)
    assert find_races(func) == []  # each iteration i writes its own row
    assert unwritten(func, "out") == 1


@pytest.mark.parametrize("form", ["plain", "blocked"])
def test_the_default_schedules_have_no_race(form):
    for name, layer in (("conv2d", CONV), ("depthwise_conv2d", {"N": 1, "Cin": 16, "H": 8, "W": 8, "K": 3})):
        lowered = lower(gallery.load(name), layer)
        sch = default_schedule(lowered)
        if form == "blocked":
            block_signature(sch, lowered, 16)
        func = lowered_function(sch)
        assert find_races(func) == [], name
        assert unwritten(func, lowered.out.name) == 0, name


def test_a_fused_blocked_kernel_has_no_race():
    kernel = build_fused(gallery.load("conv2d"), CONV, Epilogue(residual=True, relu=True), block=16)
    assert races_of_schedule(kernel.schedule) == []
    assert unwritten(lowered_function(kernel.schedule), kernel.lowered.result.name) == 0


def test_the_measurer_check_fails_an_unwritten_element_even_after_a_right_answer(tmp_path):
    op = gallery.load("matmul")
    space = _compile_setup(op, MATMUL)
    right, skipping = str(tmp_path / "right.so"), str(tmp_path / "skips.so")
    assert _compile_job(space, (space.heuristic(), right, False), contextlib.nullcontext) is None
    compile_module(_skips_one, skipping)
    state = _measure_setup(op, MATMUL)
    assert _measure_job(state, (right, True), contextlib.nullcontext)[1] is None
    # the output buffer now holds the right answer; the kernel that skips out[0, 0] must still fail
    latency, error = _measure_job(state, (skipping, True), contextlib.nullcontext)
    assert latency is None and "1 of 64 output elements are NaN" in error
    # and the right kernel passes again after it (the NaN fill does not stick)
    latency, error = _measure_job(state, (right, True), contextlib.nullcontext)
    assert error is None and latency > 0
    assert np.isfinite(state["out"].numpy()).all()


def test_a_kernel_call_in_a_check_starts_from_nan():
    import torch

    from kdsl.codegen.tvm import load_tvm
    from kdsl.codegen.tvm.kernel import Kernel, outputs_filled_with_nan
    from kdsl.codegen.tvm.toolchain import default_target

    executable = load_tvm().compile(_skips_one, target=default_target())
    kernel = Kernel(executable, lower(gallery.load("matmul"), MATMUL), None)
    x, w = torch.rand(8, 8), torch.rand(8, 8)
    with outputs_filled_with_nan():
        got = kernel(x, w)
    assert torch.isnan(got).nonzero().tolist() == [[0, 0]]  # the one element the kernel skips
    torch.testing.assert_close(got[0, 1:], (x @ w)[0, 1:])
