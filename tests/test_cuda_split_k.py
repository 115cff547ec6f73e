"""Split-K whose partial sums are written back safely, without a GPU: the kernels' stores evaluated over the
whole grid from the lowered TIR (:mod:`kdsl.codegen.tvm.store_check`), the check shown to fail on the old
unguarded write-back, and the split kernels' arithmetic emulated on the CPU against NumPy.
"""

from __future__ import annotations

from math import prod

import numpy as np
import pytest
from backends import backend

from kdsl import gallery, solve
from kdsl.codegen import reference
from kdsl.lang.errors import KdslError

backend("tvm")
cuda = pytest.importorskip("kdsl.codegen.tvm.cuda")
from kdsl.codegen.tvm.cuda_emulate import emulate  # noqa: E402
from kdsl.codegen.tvm.gpu_schedule import GpuConfig, GpuSpace, Tiles, _axes_split  # noqa: E402
from kdsl.codegen.tvm.lowering import lower  # noqa: E402
from kdsl.codegen.tvm.store_check import cover_problems, store_indices  # noqa: E402
from kdsl.runtime.gpu import from_arch  # noqa: E402

GPU = from_arch("sm_90")

#: the 9 default kernels whose split-K tiles run past the output's end: split since the write-back is guarded
RAGGED = [("matmul", "conv4_x"), ("matmul", "conv5_x"), ("conv1d", "conv3_x"), ("conv1d", "conv4_x"),
          ("conv1d", "conv5_x"), ("linear", "conv4_x"), ("linear", "conv5_x"), ("squeeze_excitation", "conv4_x"),
          ("squeeze_excitation", "conv5_x")]  # fmt: skip


def binding_of(name: str, layer: str) -> dict[str, int]:
    op = gallery.load(name)
    rows = {row.name: binding for row, binding in solve.check(op, gallery.layer_table(name) or "resnet18")}
    return rows[layer]


def split_kernel(name: str, layer: str):
    """The default GPU schedule of ``name`` at ``layer``: (space, scheduled module, device module, config used)."""
    lowered = lower(gallery.load(name), binding_of(name, layer))
    space = GpuSpace(lowered, GPU)
    sch, _, device, used, _ = cuda.schedule_verified(lowered, GPU, None, cuda.cuda_target("sm_90"))
    assert not cuda.verify(device, GPU), f"{name} {layer}: TVM's GPU verification fails"
    return space, sch.mod, device, used


def ragged_tiles(space: GpuSpace, config: GpuConfig) -> Tiles:
    """The tiles of a split-K stage of the space at ``config`` whose tiles run past its output's end (asserted
    to exist: the split kernels of ``RAGGED`` must stay ragged for the tests to check what they claim)."""
    ragged = []
    for name, info in space.blocks.items():
        tiles = space.tiles(name, config) if info.reduced else None
        if tiles is None or tiles.split == 1:
            continue
        data, weight, _ = _axes_split(info)
        extents = [extent for _, extent in info.spatial]
        m, n = prod(extents[i] for i in data), prod(extents[i] for i in weight) if weight else 1
        if m % (tiles.t_d * tiles.reg_d) or n % (tiles.t_o * tiles.reg_o):
            ragged.append(tiles)
    assert ragged, "no split-K stage whose tiles run past the output"
    return ragged[0]


@pytest.mark.parametrize(("name", "layer"), RAGGED)
def test_ragged_split_k_writes_each_partial_sum_exactly_once(name, layer):
    """Every (block, thread) of the grid evaluated: the partial-sum buffer is written once per element, none
    outside it; and the default schedule was used (not a fallback that the check forced)."""
    space, scheduled, device, used = split_kernel(name, layer)
    assert used == space.heuristic()
    tiles = ragged_tiles(space, used)
    partial_sums = [b for b in scheduled["main"].body.block.alloc_buffers if b.name.endswith(".rf")]
    assert tiles.split in [int(rf.shape[0]) for rf in partial_sums]
    for rf in partial_sums:
        stores = [store_indices(func, None, f"{rf.name}_local") for func in device.functions.values()]
        writes = np.sort(np.concatenate(stores))
        assert np.array_equal(writes, np.arange(prod(int(d) for d in rf.shape))), f"{name} {layer}: {rf.name}"
    assert cuda.partial_sum_problems(scheduled, device) == []


def _unguarded(guard: bool):
    """A split-K write-back as TVM made it before the fix, on a small scale: 2 slices of 49 partial sums, each
    written by 2 blocks of 32 threads (tiles of 32: the second runs 15 past the end), with or without the
    tile's bounds guard."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def write_back(rf_ptr: T.handle("float32", "global")):
        rf = T.decl_buffer((98,), data=rf_ptr)
        with T.launch_thread("blockIdx.x", 4) as bx:  # noqa: SIM117 (TVMScript's launch scopes)
            with T.launch_thread("threadIdx.x", 32) as tx:
                position: T.let[T.int32] = bx % 2 * 32 + tx
                if position < 49 or not guard:
                    rf[bx // 2 * 49 + position] = T.float32(1)

    return write_back


def test_store_check_fails_on_the_old_unguarded_write_back():
    bad = cover_problems(store_indices(_unguarded(False), "rf"), "rf", 98)
    # slice 0's tile past the end overwrites the first 15 sums of slice 1; slice 1's runs past the allocation
    assert bad == [
        "rf: 15 stores outside its 98 elements (indices 98..112)",
        "rf: 15 elements written more than once (element 49: 2 times)",
    ]
    assert cover_problems(store_indices(_unguarded(True), "rf"), "rf", 98) == []
    assert cover_problems(store_indices(_unguarded(True), "rf"), "rf", 100) == [
        "rf: 2 elements never written (element 98)"
    ]


@pytest.mark.parametrize(
    ("name", "layer"),
    [("matmul", "conv5_x"), ("conv1d", "conv5_x"), ("linear", "conv5_x"), ("squeeze_excitation", "conv5_x")],
)
def test_emulated_split_k_kernels_match_numpy(name, layer):
    """The split kernels' arithmetic (slices, chunks, register tiles, guarded write-back, the sum of the
    slices) on the CPU, loops serial, against kdsl's NumPy reference."""
    op, binding = gallery.load(name), binding_of(name, layer)
    space, _, _, used = split_kernel(name, layer)
    ragged_tiles(space, used)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype("float32") for shape in _shapes(op, binding)]
    got = emulate(op, binding, *arrays, config=used)
    want = reference.run(op, binding, *(a.astype("float64") for a in arrays))
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), f"{name} {layer}"


def _shapes(op, binding) -> list[tuple[int, ...]]:
    shapes = reference.shapes(op, binding)
    out = [*(tuple(s) for s in shapes.inputs), *(tuple(s) for s in shapes.weights)]
    assert all(out), out
    return out


def test_schedule_verified_refuses_split_kernels_that_the_store_check_rejects(monkeypatch):
    """The gate: a candidate whose partial sums the check rejects is not used, however well it verifies."""
    refused = []

    def reject(scheduled, device):
        names = [b.name for b in scheduled["main"].body.block.alloc_buffers if b.name.endswith(".rf")]
        refused.extend(names)
        return [f"{name}: rejected by the test" for name in names]

    monkeypatch.setattr(cuda, "partial_sum_problems", reject)
    lowered = lower(gallery.load("matmul"), binding_of("matmul", "conv5_x"))
    sch, _, _, used, _ = cuda.schedule_verified(lowered, GPU, None, cuda.cuda_target("sm_90"))
    assert refused, "the default at conv5_x splits K: the check must have been asked"
    assert not [b for b in sch.mod["main"].body.block.alloc_buffers if b.name.endswith(".rf")]
    assert used != GpuSpace(lowered, GPU).heuristic()


def test_store_check_needs_a_buffer_to_look_for():
    with pytest.raises(KdslError, match="name the buffer"):
        store_indices(_unguarded(True), None)
