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

from kdsl import gallery, solve
from kdsl.cli import main
from kdsl.codegen.cuda_launch import BundleError, BundleKernel, CudaUnavailableError, plan
from kdsl.lang.errors import KdslError

pytest.importorskip("tvm")
cuda = pytest.importorskip("kdsl.codegen.tvm.cuda")
from kdsl.codegen.tvm import gpu as gpu_description  # noqa: E402
from kdsl.codegen.tvm.gpu_schedule import GpuConfig, GpuSpace  # noqa: E402
from kdsl.codegen.tvm.graph_lowering import lower  # noqa: E402

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


@pytest.mark.parametrize("name", ["conv2d", "squeeze_excitation"])
def test_every_layer_verifies(name):
    for _, binding in layers(name)[:-1]:
        check_bundle(cuda.cuda_bundle(gallery.load(name), binding))


def test_contractions_get_the_tiled_shared_memory_form():
    _, binding = layers("conv2d")[1]
    bundle = cuda.cuda_bundle(gallery.load("conv2d"), binding)
    assert ["stage0", "shared"] in bundle["schedule"]
    assert "__shared__" in bundle["source"] and "__syncthreads()" in bundle["source"]


def test_random_points_of_the_gpu_space_verify():
    rng = random.Random(1)
    for name in ("conv2d", "matmul", "squeeze_excitation"):
        _, binding = layers(name)[-1]
        op = gallery.load(name)
        space = GpuSpace(lower(op, binding))
        for _ in range(4):
            config = space.random(rng)
            bundle = cuda.cuda_bundle(op, binding, config=config)
            check_bundle(bundle)
            assert GpuConfig(**bundle["config"]).threads == config.threads  # what was used, maybe a level down


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


def test_launcher_says_what_is_missing_without_a_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    _, binding = layers("matmul")[-1]
    with pytest.raises(CudaUnavailableError, match="GPU"):
        BundleKernel(cuda.cuda_bundle(gallery.load("matmul"), binding))


# -- the CLI and the GPU check script ----------------------------------------------------------------------


def test_show_target_cuda_prints_source_and_launches(capsys):
    assert main(["show", "matmul", "--target", "cuda", "--layer", "conv5_x"]) == 0
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
         "--variant-layer", "conv5_x"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    files = sorted(p.name for p in bundles.glob("matmul__*.json"))
    assert len(files) == 4 + 2 and "matmul__conv5_x__v01.json" in files
    # the run side on a machine without TVM: block `import tvm` and plan every bundle
    blocked = (
        "import sys, runpy; sys.modules['tvm'] = None; "
        f"sys.argv = ['gpu_check.py', 'run', '--bundles', {str(bundles)!r}, '--out', {str(tmp_path / 'out')!r}, "
        "'--dry-run']; runpy.run_path(" + repr(script) + ", run_name='__main__')"
    )
    dry = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "planned 6 of 6 bundles" in dry.stdout
