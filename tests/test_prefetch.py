"""``S.prefetch``: software prefetch of the next slab of the data a parallel loop's outermost axis slices
(:mod:`kdsl.codegen.tvm.prefetch`): where the space offers it, the rules that keep it valid, the kernels it makes
compute what the reference computes, every prefetched address lies in its buffer, and the heuristic's choice."""

from __future__ import annotations

import dataclasses
import random

import pytest
from backends import backend

backend("tvm")
backend("torch")

from test_tvm_schedule_forms import check_config  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen.tvm import lower  # noqa: E402
from kdsl.codegen.tvm.machine import current_machine  # noqa: E402
from kdsl.codegen.tvm.prefetch import evaluate_index  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.codegen.tvm.space_rules import conflicts, repair  # noqa: E402
from kdsl.lang.errors import LoweringError  # noqa: E402

LAYER = {"B": 6, "M": 16, "K": 8, "N": 16}


def _space(name: str = "bmm", layer: dict | None = None, machine=None, dtype: str = "float32") -> ScheduleSpace:
    return ScheduleSpace(lower(gallery.load(name), layer or LAYER, dtype=dtype), machine)


def _prefetches(sch) -> list:
    """The ``BufferLoad`` whose address each ``llvm.prefetch`` call of a scheduled kernel takes (the calls are
    ``call_llvm_intrin(id, address_of(load), rw, locality, cache)``; the id is LLVM's, so it is not compared)."""
    import tvm
    import tvm_ffi

    calls = []

    def visit(call) -> None:
        if call.op.name == "tirx.call_llvm_intrin" and len(call.args) == 5 and "address_of" in str(call.args[1]):
            calls.append(call)

    tvm_ffi.structural_walk(sch.mod, (tvm.ir.expr.Call, visit))
    loads = [call.args[1].args[0] for call in calls]
    assert all(type(load).__name__ in ("TensorLoad", "BufferLoad") for load in loads), loads
    return loads


@pytest.mark.parametrize("name", ["bmm", "bmm_tn"])
def test_a_batched_product_offers_the_prefetch_and_its_kernel_matches_the_reference(name):
    space = _space(name, dtype="float64")
    assert space.parameters["n2_product.prefetch"].choices == ("none", "next")
    config = {**space.heuristic(), "n2_product.prefetch": "next"}
    assert conflicts(space, config) == []
    report: list = []
    sch = space.apply(config, report=report)
    loads = _prefetches(sch)
    assert sorted({load.source.name for load in loads}) == ["x", "x_b"], loads
    assert any("prefetches x" in what for _, what in report), report
    check_config(gallery.load(name), LAYER, space, config)


def test_operators_without_a_data_slab_axis_do_not_offer_it():
    # a batch of 1 (conv2d's N, a GEMV's N) is no slab axis; at a batch of 2 the convolution's N is one
    for name, layer in [
        ("conv2d", {"N": 1, "Cin": 8, "Cout": 16, "H": 8, "W": 8, "K": 3}),
        ("linear", {"N": 1, "Cin": 64, "Cout": 32}),
    ]:
        assert not [n for n in _space(name, layer).parameters if n.endswith(".prefetch")], name
    batched = _space("conv2d", {"N": 2, "Cin": 8, "Cout": 16, "H": 8, "W": 8, "K": 3})
    assert [n for n in batched.parameters if n.endswith(".prefetch")] == ["stage0.prefetch"]


def test_cache_blocks_of_another_axis_conflict_and_are_repaired_off():
    space = _space()
    config = {**space.heuristic(), "n2_product.tile.M": (4, 1, 4), "n2_product.block": "M:2"}
    config["n2_product.prefetch"] = "next"
    reason = "n2_product: S.prefetch next needs S.block none or blocks of B (the blocks go first; it is M:2)"
    assert conflicts(space, config) == [reason]
    assert repair(space, config)["n2_product.prefetch"] == "none"
    with pytest.raises(LoweringError, match="blocks of B"):
        space.apply(config)


def test_a_weight_only_vector_axis_first_in_the_parallel_loop_conflicts():
    # matmul: M is the first axis and indexes x's first dim, but the heuristic's vector Cout (weight-only, two
    # outer tiles) goes first in the fused loop
    space = _space("matmul", {"M": 8, "Cin": 16, "Cout": 64})
    config = {**space.heuristic(), "stage0.tile.M": (8, 1, 1), "stage0.prefetch": "next"}
    config["stage0.tile.Cout"] = (2, 1, 32)
    assert any("weight-only vector Cout" in line for line in conflicts(space, config)), conflicts(space, config)


@pytest.mark.parametrize(
    ("layer", "overrides"),
    [
        ({"B": 3, "M": 8, "K": 4, "N": 8}, {}),  # a slab of 2 lines over more tasks: offsets clamped to the slab
        ({"B": 4, "M": 32, "K": 64, "N": 8}, {}),  # 8 KiB slabs of x over 8 tasks: several lines a task
        ({"B": 5, "M": 4, "K": 4, "N": 16}, {}),  # one task a batch: the whole next slab in one task
        ({"B": 6, "M": 16, "K": 8, "N": 16}, {"n2_product.tile.B": (3, 2, 1)}),  # slabs of 2 batches
        ({"B": 8, "M": 16, "K": 8, "N": 16}, {"n2_product.tile.B": (8, 1, 1), "n2_product.block": "B:2"}),
    ],
)
def test_every_prefetched_address_lies_in_the_next_slab(layer, overrides):
    from kdsl.codegen.tvm.prefetch import slab_rows

    space = _space("bmm", layer)
    config = repair(space, {**space.heuristic(), **overrides, "n2_product.prefetch": "next"})
    assert config["n2_product.prefetch"] == "next" and all(config[k] == v for k, v in overrides.items())
    sch = space.apply(config)
    [loop] = _parallel_loops(sch)
    loads = _prefetches(sch)
    assert {load.source.name for load in loads} == {"x", "x_b"}
    rows = slab_rows(space.stages[0], "B", config)
    values = layer["B"] // rows
    per_value = int(loop.extent) // values
    lines = _serial_prefetch_loops(sch) or [(None, 1)]
    for task in range(int(loop.extent)):
        slab = min(task // per_value + 1, values - 1)
        for var, extent in lines:
            for line in range(int(extent)):
                names = {loop.loop_var.name: task, **({var.name: line} if var is not None else {})}
                for load in loads:
                    indices = [evaluate_index(index, names) for index in load.indices]
                    shape = [int(d) for d in load.source.shape]
                    assert all(0 <= i < d for i, d in zip(indices, shape)), (load, task, line, indices, shape)
                    assert indices[0] // rows == slab, (load, task, line, indices, rows)
    check_config(gallery.load("bmm"), layer, space, config, dtype="float32")


def _parallel_loops(sch) -> list:
    import tvm
    import tvm_ffi

    found = []
    tvm_ffi.structural_walk(
        sch.mod, (tvm.tirx.For, lambda f: found.append(f) if f.kind == tvm.tirx.ForKind.PARALLEL else None)
    )
    return found


def _serial_prefetch_loops(sch) -> list:
    import tvm
    import tvm_ffi

    found = []
    tvm_ffi.structural_walk(
        sch.mod,
        (tvm.tirx.For, lambda f: found.append((f.loop_var, f.extent)) if f.loop_var.name == "prefetch_line" else None),
    )
    return found


def test_random_configurations_with_the_prefetch_apply_and_match_the_reference():
    space = _space(dtype="float64")
    rng, checked = random.Random(1), 0
    for _ in range(40):
        config = space.random(rng)
        config["n2_product.tile.B"] = (6, 1, 1)
        config = repair(space, {**config, "n2_product.prefetch": "next"})
        if config["n2_product.prefetch"] != "next":
            continue
        check_config(gallery.load("bmm"), LAYER, space, config)
        checked += 1
        if checked == 3:
            break
    assert checked == 3


def test_the_heuristic_prefetches_only_reads_beyond_the_last_level_cache():
    machine = dataclasses.replace(current_machine(), l2=512 * 1024, l3=256 * 1024)
    small = _space(layer={"B": 8, "M": 32, "K": 32, "N": 32}, machine=machine)  # 64 KiB of operands
    large = _space(layer={"B": 64, "M": 32, "K": 32, "N": 32}, machine=machine)  # 512 KiB
    assert small.heuristic()["n2_product.prefetch"] == "none"
    assert large.heuristic()["n2_product.prefetch"] == "next"
    # two slabs (here 2 x 8 KiB: 4 KiB of x and of x_b a batch) must fit in L2
    tight = dataclasses.replace(machine, l2=8 * 1024)
    assert (
        _space(layer={"B": 64, "M": 32, "K": 32, "N": 32}, machine=tight).heuristic()["n2_product.prefetch"] == "none"
    )
