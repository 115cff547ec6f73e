"""The CUDA path without a GPU: the GPU description, the GPU schedule (every gallery operator gets CUDA
source that passes TVM's GPU verification for sm_90), CUDA kernel bundles and their launch plans, the
CuPy launcher's pure parts, ``kdsl show --target cuda`` and ``scripts/gpu_check.py``'s build and dry run.

Nothing here runs a kernel: that is ``scripts/gpu_check.py run`` on a GPU machine. Each bundle compiles
in ~0.1-0.5 s (TVM's pipeline and CUDA codegen, no nvcc), so the sweep takes each operator at one layer
(the smallest of its table) and conv2d and one branching kernel at every layer.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from math import prod
from pathlib import Path
from types import SimpleNamespace

import pytest
from backends import backend

from kdsl import gallery, solve
from kdsl.cli import main
from kdsl.lang.errors import KdslError
from kdsl.runtime.cuda_launch import (
    BundleError,
    BundleKernel,
    CudaUnavailableError,
    argument_slots,
    batch_sources,
    input_signature,
    plan,
    prefixed_kernels,
    split_source,
)

backend("tvm")
cuda = pytest.importorskip("kdsl.codegen.tvm.cuda")
from kdsl.codegen.tvm.gpu_schedule import MIN_SLICE, GpuConfig, GpuSpace, contraction_tiles  # noqa: E402
from kdsl.codegen.tvm.lowering import lower  # noqa: E402
from kdsl.runtime import gpu as gpu_description  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def layers(name: str) -> list[tuple[str, dict[str, int]]]:
    op = gallery.load(name)
    return [(layer.name, binding) for layer, binding in solve.check(op, gallery.layer_table(name) or "resnet18")]


def check_bundle(bundle: dict) -> None:
    """A bundle's launch plan is consistent: every argument a listed buffer, every intermediate written
    by one launch and read by a later one, the output written, blocks within the GPU's limit."""
    launch_plan = plan(bundle)
    assert launch_plan.output in {a for launch in launch_plan.launches for a in launch.args}
    for name in launch_plan.intermediates:
        users = [i for i, launch in enumerate(launch_plan.launches) if name in launch.args]
        assert len(users) >= 2, f"intermediate {name} is used by launches {users}"
    for launch in launch_plan.launches:
        assert 32 <= prod(launch.block) <= 1024 or launch.threads >= 1
        assert f"void __launch_bounds__({prod(launch.block)}) {launch.kernel}(" in bundle["source"]
    assert json.loads(json.dumps(bundle)) == bundle  # JSON-serializable as is


# -- the GPU description ---------------------------------------------------------------------------------


def test_gpu_table_covers_four_arches_with_vendor_figures():
    assert gpu_description.ARCHES == ("sm_80", "sm_86", "sm_89", "sm_90")
    h100 = gpu_description.from_arch("sm_90")
    assert (h100.sms, h100.shared_per_sm, h100.bandwidth_gbs, h100.fp32_gflops) == (132, 228 * 1024, 3350, 67000)
    assert gpu_description.from_arch("sm_80").sms == 108
    for gpu in gpu_description.TABLE.values():
        assert gpu.warp_size == 32 and gpu.max_threads_per_block == 1024
        assert gpu.static_shared_per_block == 48 * 1024 <= gpu.shared_per_block
        assert "\n" not in gpu.describe() and gpu.arch in gpu.describe()
    with pytest.raises(gpu_description.GpuArchError, match="sm_75"):
        gpu_description.from_arch("sm_75")
    assert gpu_description.current_gpu("sm_86").arch == "sm_86"


def test_gpu_description_from_device_properties():
    props = SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, multi_processor_count=132, regs_per_multiprocessor=65536,
        shared_memory_per_block_optin=232448, shared_memory_per_multiprocessor=233472, warp_size=32,
        max_threads_per_multi_processor=2048,
    )  # fmt: skip
    gpu = gpu_description.from_properties(props)
    assert (gpu.name, gpu.arch, gpu.shared_per_block) == ("NVIDIA H200", "sm_90", 232448)
    assert gpu.bandwidth_gbs == 3350  # not reported by the device: the arch's table row


# -- the GPU schedule: every gallery operator verifies ------------------------------------------------


@pytest.mark.parametrize("name", gallery.names())
def test_every_gallery_operator_gets_verified_cuda(name):
    table = gallery.layer_table(name)
    if table is None:
        pytest.skip(f"{name} fits no ResNet-18 table")
    _, binding = layers(name)[-1]
    bundle = cuda.cuda_bundle(gallery.load(name), binding)  # raises unless TVM's GPU verification passes
    check_bundle(bundle)
    assert all(rule in ("inlined", "shared", "tiled", "plain") for _, rule in bundle["schedule"])


@pytest.mark.parametrize("name", ["conv2d", "matmul", "squeeze_excitation", "conv1d", "linear"])
def test_every_layer_verifies(name):
    for _, binding in layers(name)[:-1]:
        check_bundle(cuda.cuda_bundle(gallery.load(name), binding))


def test_contractions_get_the_tiled_shared_memory_form():
    _, binding = layers("conv2d")[1]
    bundle = cuda.cuda_bundle(gallery.load("conv2d"), binding)
    assert ["stage0", "shared"] in bundle["schedule"]
    assert "__shared__" in bundle["source"] and "__syncthreads()" in bundle["source"]


@pytest.mark.parametrize("name", ["conv2d", "matmul"])
def test_contractions_get_the_gemm_schedule_at_every_layer(name):
    """The default schedule of conv2d and matmul at every ResNet-18 layer: shared-memory tiles, a register tile
    of reg_d x reg_o accumulators per thread, the tiled kernel's grid and block as contraction_tiles planned
    them, and a split-K (a partial-sum intermediate with one slice per split, a second kernel adding them)
    exactly when the grid would otherwise be under one wave of SMs."""
    gpu = gpu_description.from_arch("sm_90")
    for label, binding in layers(name):
        op = gallery.load(name)
        space = GpuSpace(lower(op, binding), gpu)
        tiles = space.tiles("stage0", space.heuristic())
        bundle = cuda.cuda_bundle(op, binding)
        check_bundle(bundle)
        assert ["stage0", "shared"] in bundle["schedule"], label
        source, launch_plan = bundle["source"], plan(bundle)
        assert "__shared__" in source and "__syncthreads()" in source
        accumulators = "stage0_rf_local_ptr" if tiles.split > 1 else "stage0_local_ptr"
        assert f"float {accumulators}[{tiles.reg_d * tiles.reg_o}];" in source, label
        assert (tiles.reg_d, tiles.reg_o) != (1, 1) and tiles.threads <= gpu.max_threads_per_block
        first = launch_plan.launches[0]
        assert (first.grid[0], prod(first.block)) == (tiles.blocks, tiles.threads), label
        # split-K fills the SMs, tiles that run past the output's end included (their write-back is guarded)
        assert tiles.blocks >= gpu.sms, f"{label}: {tiles.blocks} blocks, {gpu.sms} SMs"
        if tiles.split > 1:
            # TVM names rfactor's buffer "stage0.rf" (the source's pointer is stage0_rf_ptr)
            assert len(launch_plan.launches) == 2 and launch_plan.intermediates == ["stage0.rf"]
            rf_shape = launch_plan.shapes["stage0.rf"]
            assert prod(rf_shape) == tiles.split * prod(launch_plan.shapes[launch_plan.output])
            assert launch_plan.launches[1].args[0] == launch_plan.output
        else:
            assert len(launch_plan.launches) == 1  # conv2d's NHWC -> NCHW copy folded into the write-back
    # conv2d at conv5_x: 49 outputs a channel and a 4608-long reduction: split-K
    _, binding = layers("conv2d")[-1]
    assert GpuSpace(lower(gallery.load("conv2d"), binding), gpu).tiles("stage0", GpuConfig()).split > 1


def test_contraction_tiles_plan():
    gpu = gpu_description.from_arch("sm_90")

    def tiles(**kwargs):
        base = {"config": GpuConfig(), "gpu": gpu, "last_weight": kwargs.get("weight_extent", 1)}
        return contraction_tiles(**{**base, **kwargs})

    # a big matmul: the classic 64x64 tile of 4x4 register tiles on 256 threads, no split
    big = tiles(data_extent=4096, weight_extent=4096, last_data=4096, reduce_extents=[4096])
    assert (big.t_d, big.t_o, big.reg_d, big.reg_o, big.split, big.chunk) == (16, 16, 4, 4, 1, 32)
    assert big.outputs == 64 * 64 and big.blocks == 64 * 64
    # conv3_x: whole rows of the 28-wide image per block (7 threads x 4 registers a row, two rows), split-K 8
    conv = tiles(data_extent=784, weight_extent=128, last_data=28, reduce_extents=[128, 3, 3], rows=True)
    assert (conv.t_d, conv.reg_d, conv.t_o, conv.reg_o) == (14, 4, 16, 4)
    assert conv.split == 8 and conv.blocks == 224 and conv.chunk == 4  # 4 channels x 9 = 36 elements a step
    # split-K keeps a slice of at least MIN_SLICE elements, a fixed factor is a divisor of the axis
    short = tiles(data_extent=49, weight_extent=512, last_data=49, reduce_extents=[512])
    assert 512 // short.split >= MIN_SLICE
    fixed = tiles(data_extent=64, weight_extent=512, last_data=64, reduce_extents=[96], config=GpuConfig(split_k=5))
    assert fixed.split == 4
    # no fill: the tile is what the knobs say, however few blocks
    lone = tiles(data_extent=64, weight_extent=64, last_data=64, reduce_extents=[64], config=GpuConfig(fill=False))
    assert (lone.blocks, lone.split, lone.outputs) == (1, 1, 64 * 64)
    with pytest.raises(KdslError, match="split_k"):
        GpuConfig(split_k=-1)


def test_random_points_of_the_gpu_space_verify():
    rng = random.Random(1)
    for name in ("conv2d", "matmul", "squeeze_excitation"):
        _, binding = layers(name)[-1]
        op = gallery.load(name)
        space = GpuSpace(lower(op, binding))
        for _ in range(4):
            config = space.random(rng) if rng.random() < 0.5 else space.around(rng)
            bundle = cuda.cuda_bundle(op, binding, config=config)
            check_bundle(bundle)
            # what was used: the point, or a smaller or lower candidate of it when verification refused the point
            assert GpuConfig(**bundle["config"]) in cuda.candidates(config)


def test_plain_schedule_threads_cover_the_output():
    _, binding = layers("conv2d")[-1]
    bundle = cuda.cuda_bundle(gallery.load("conv2d"), binding, config=GpuConfig(level="plain", inline=False))
    launch_plan = plan(bundle)
    numel = prod(launch_plan.shapes[launch_plan.output])
    writer = launch_plan.launches[-1]
    assert writer.args[0] == launch_plan.output and writer.threads >= numel
    assert [b["role"] for b in bundle["buffers"]] == ["input", "weight", "output", "intermediate", "intermediate"]


def test_bad_gpu_knobs_and_arches_are_kdsl_errors():
    with pytest.raises(KdslError, match="level"):
        GpuConfig(level="fast")
    with pytest.raises(KdslError, match="threads"):
        GpuConfig(threads=0)
    with pytest.raises(gpu_description.GpuArchError):
        cuda.cuda_target("sm_7")


# -- the launcher's pure parts -----------------------------------------------------------------------------


def test_launch_plan_rejects_malformed_bundles():
    _, binding = layers("matmul")[-1]
    good = cuda.cuda_bundle(gallery.load("matmul"), binding)
    assert plan(good).inputs == ["x", "w"]
    for breakage, message in [
        (lambda b: b.pop("source"), "source"),
        (lambda b: b.update(format="other/1"), "format"),
        (lambda b: b["launches"][0]["args"].append("ghost"), "ghost"),
        (lambda b: b["launches"][0].update(block=[2048, 1, 1]), "1024"),
        (lambda b: b["buffers"][0].update(dtype="float7"), "float7"),
        (lambda b: b.update(launches=[]), "no kernel launches"),
    ]:
        bundle = json.loads(json.dumps(good))
        breakage(bundle)
        with pytest.raises(BundleError, match=message):
            plan(bundle)


def test_launcher_pure_parts_plan_arguments_and_batch_sources():
    """What BundleKernel precomputes (argument positions, the input signature) and how bundles are compiled
    together (one preamble, every bundle's kernels renamed with its own prefix)."""
    _, binding = layers("conv2d")[-1]
    bundle = cuda.cuda_bundle(gallery.load("conv2d"), binding)
    launch_plan = plan(bundle)
    order = [*launch_plan.inputs, *launch_plan.intermediates, launch_plan.output]
    for launch, slots in zip(launch_plan.launches, argument_slots(launch_plan)):
        assert tuple(order[i] for i in slots) == launch.args
    assert input_signature(launch_plan) == (((1, 512, 7, 7), "torch.float32"), ((512, 512, 3, 3), "torch.float32"))
    preamble, kernels = split_source(bundle["source"])
    assert "__global__" not in preamble and kernels.startswith('extern "C" __global__')
    names = [launch.kernel for launch in launch_plan.launches]
    assert names == ["main_kernel", "main_kernel_1"]
    renamed = prefixed_kernels(kernels, names, "v7_")
    assert "v7_main_kernel(" in renamed and "v7_main_kernel_1(" in renamed and " main_kernel" not in renamed
    _, matmul_binding = layers("matmul")[0]
    other = cuda.cuda_bundle(gallery.load("matmul"), matmul_binding)
    [(indices, batch)] = batch_sources([bundle, other, bundle])
    assert indices == [0, 1, 2] and batch.prefixes == ["b0_", "b1_", "b2_"]
    assert batch.source.count(preamble) == 1 and batch.source.startswith(preamble)
    for prefix, item in zip(batch.prefixes, (bundle, other, bundle)):
        for launch in item["launches"]:
            assert f"void __launch_bounds__({prod(launch['block'])}) {prefix}{launch['kernel']}(" in batch.source
    with pytest.raises(BundleError, match="no extern"):
        split_source("int x;")


class _FakeTensor:
    """What BundleKernel reads of a torch CUDA tensor."""

    next_address = 4096

    def __init__(self, shape, dtype="torch.float32"):
        self.shape, self.dtype, self.is_cuda = tuple(shape), dtype, True
        self.address = _FakeTensor.next_address
        _FakeTensor.next_address += 4096

    def data_ptr(self):
        return self.address

    def is_contiguous(self):
        return True


def test_launcher_call_passes_pointers_in_launch_order(monkeypatch):
    """BundleKernel's call path with CuPy and torch stood in for: each launch gets the device pointers of its
    buffers in its own argument order, batched kernels are looked up by their prefix, inputs are checked."""
    import numpy as np

    from kdsl.runtime import cuda_launch

    launched = []

    class Module:
        def __init__(self, code="", backend="", options=()):
            self.code = code

        def get_function(self, name):
            return lambda grid, block, args, shared_mem=0: launched.append((name, grid, block, args))

    fake_cupy = SimpleNamespace(
        RawModule=Module,
        uint64=np.uint64,
        cuda=SimpleNamespace(get_current_stream=lambda: SimpleNamespace(ptr=0)),
    )
    fake_torch = SimpleNamespace(
        float32="torch.float32",
        empty=lambda shape, dtype, device: _FakeTensor(shape, dtype),
        cuda=SimpleNamespace(current_stream=lambda: SimpleNamespace(cuda_stream=0)),
    )
    monkeypatch.setattr(cuda_launch, "_cuda", lambda: (fake_cupy, fake_torch))
    _, binding = layers("conv2d")[-1]
    bundle = cuda.cuda_bundle(gallery.load("conv2d"), binding)
    kernel = BundleKernel(bundle, compiled=(Module(), "b7_"))
    x, w = _FakeTensor((1, 512, 7, 7)), _FakeTensor((512, 512, 3, 3))
    out = kernel(x, w)
    address = {"x": x.address, "w": w.address, "out": out.address, "stage0.rf": kernel._scratch[0].address}
    assert [name for name, *_ in launched] == ["b7_main_kernel", "b7_main_kernel_1"]
    for (_, grid, block, args), launch in zip(launched, kernel.plan.launches):
        assert (grid, block) == (launch.grid, launch.block)
        assert [int(a) for a in args] == [address[name] for name in launch.args]
        assert all(isinstance(a, np.uint64) for a in args)
    assert kernel(x, w) is out  # the output buffer belongs to the kernel
    with pytest.raises(BundleError, match="buffer w: got"):
        kernel(x, _FakeTensor((512, 512, 1, 1)))
    with pytest.raises(BundleError, match="expected 2 tensors"):
        kernel(x)


def test_launcher_says_what_is_missing_without_a_gpu():
    torch = backend("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    _, binding = layers("matmul")[-1]
    with pytest.raises(CudaUnavailableError, match="GPU"):
        BundleKernel(cuda.cuda_bundle(gallery.load("matmul"), binding))


# -- the CLI and the GPU check script ----------------------------------------------------------------------


def test_show_target_cuda_prints_source_and_launches(capsys):
    assert main(["show", "matmul", "--target", "cuda", "--layers", "conv5_x"]) == 0
    out = capsys.readouterr().out
    assert "// launch main_kernel<<<grid" in out and 'extern "C" __global__' in out and "M=49" in out
    assert main(["show", "matmul", "--target", "cuda", "--arch", "sm_75"]) != 0
    err = capsys.readouterr().err
    assert "unknown CUDA arch 'sm_75'" in err and len(err.strip().splitlines()) == 1


def test_gpu_check_builds_bundles_and_dry_runs_them_without_tvm(tmp_path):
    bundles = tmp_path / "bundles"
    script = str(ROOT / "scripts" / "gpu_check.py")
    built = subprocess.run(
        [sys.executable, script, "build", "--out", str(bundles), "--only", "matmul", "--variants", "3",
         "--variant-layer", "conv5_x", "--other-variants", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    files = sorted(p.name for p in bundles.glob("matmul__*.json"))
    assert len(files) == 4 + 2 + 3 and "matmul__conv5_x__v01.json" in files and "matmul__conv2_x__v00.json" in files
    # the run side on a machine without TVM: block `import tvm` and plan every bundle
    blocked = (
        "import sys, runpy; sys.modules['tvm'] = None; "
        f"sys.argv = ['gpu_check.py', 'run', '--bundles', {str(bundles)!r}, '--out', {str(tmp_path / 'out')!r}, "
        "'--dry-run']; runpy.run_path(" + repr(script) + ", run_name='__main__')"
    )
    dry = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "planned 9 of 9 bundles" in dry.stdout and "9 bundles in 1 NVRTC compiles" in dry.stdout


def test_split_k_also_where_the_tiles_do_not_divide_the_output():
    # conv1d at conv5_x: 49 positions in data tiles of 32; split-K again (the write-back is guarded since), each
    # slice at least MIN_SLICE elements long, the grid at least one block per SM
    gpu = gpu_description.from_arch("sm_90")
    for data, weight, reduce in ((49, 512, [512, 3]), (49, 512, [512]), (196, 256, [256])):
        tiles = contraction_tiles(
            data_extent=data, weight_extent=weight, last_data=data, last_weight=weight, reduce_extents=reduce,
            config=GpuConfig(), gpu=gpu,
        )  # fmt: skip
        assert data % (tiles.t_d * tiles.reg_d) != 0, "not a ragged case: the test checks nothing"
        assert tiles.split > 1 and tiles.blocks >= gpu.sms, tiles
        assert reduce[0] // tiles.split * prod(reduce[1:]) >= MIN_SLICE
