"""The GPU check of kdsl's CUDA kernels: build bundles here (with TVM), run them on a GPU machine (without TVM).

    python scripts/gpu_check.py build --out gpu_bundles/            # here: TVM, no GPU needed
    python scripts/gpu_check.py run --bundles gpu_bundles/ --out $OUT  # there: torch CUDA + CuPy, no TVM
    python scripts/gpu_check.py run --bundles gpu_bundles/ --out /tmp/x --dry-run   # plan only, no GPU

``build`` writes one CUDA kernel bundle (:mod:`kdsl.codegen.tvm.cuda`) per gallery operator and layer of
its ResNet-18 layer table (batch 1) with the default GPU schedule, and for conv2d and matmul at every layer
63 further points near the default (:meth:`kdsl.codegen.tvm.gpu_schedule.GpuSpace.around`, each a distinct
kernel; ``--variants`` at ``--variant-layer``, ``--other-variants`` elsewhere): measuring them on the GPU and
keeping the best is the tuning.

``run`` compiles the bundles with NVRTC in batches (:func:`kdsl.runtime.cuda_launch.compile_batches`),
checks every bundle against kdsl's PyTorch module of the same operator on CUDA (relative error <= 1e-4 of
the largest magnitude, float32, TF32 off; every operator's default first), then times conv2d's and
matmul's defaults and variants, then the other defaults, each "per call" and "GPU" (a CUDA graph of the
calls), against PyTorch native (cuDNN's F.conv2d, cuBLAS's torch.matmul, :mod:`kdsl.codegen.native`) and
kdsl's PyTorch module measured the same way; ResNet-18 end to end comes last. It writes ``gpu_check.md``
and ``gpu_check.json``. A bundle that fails (NVRTC error, launch failure, wrong result) is a row of the
table; the run goes on. Timing stops (rows marked) and the network is skipped when ``--budget-s`` is
spent, so the whole run fits its time slot.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kdsl.lang.errors import KdslError
from kdsl.runtime.cuda_launch import (
    BundleKernel,
    argument_slots,
    batch_sources,
    compile_batches,
    input_signature,
    plan,
    time_cuda,
)

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-4
TUNED = ("conv2d", "matmul")
#: bundles compiled together in one NVRTC call (the headers of TVM's preamble cost most of a compile)
COMPILE_BATCH = 32
#: the share of --budget-s that compiling and checking may take before the variants still unchecked are
#: skipped (the defaults never are), and the share after which the network is not started
CHECK_SHARE = 0.6
NETWORK_SHARE = 0.75


# -- build (here, with TVM) ------------------------------------------------------------------------------


def build(
    out: Path,
    *,
    variants: int,
    variant_layer: str,
    other_variants: int,
    seed: int,
    only: list[str] | None,
    arch: str,
) -> int:
    from kdsl import gallery, solve
    from kdsl.codegen.tvm.cuda import cuda_bundle
    from kdsl.codegen.tvm.gpu_schedule import GpuSpace
    from kdsl.codegen.tvm.lowering import lower
    from kdsl.runtime.gpu import from_arch

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*__*.json"):  # a rebuild replaces the last build's bundles, never mixes with them
        old.unlink()
    rng = random.Random(seed)
    errors: list[dict[str, str]] = []
    written = 0
    start = time.time()

    def write(name: str, layer: str, variant: str, bundle: dict[str, Any]) -> None:
        nonlocal written
        bundle.update({"operator": name, "layer": layer, "variant": variant})
        (out / f"{name}__{layer}__{variant}.json").write_text(json.dumps(bundle, separators=(",", ":")))
        written += 1

    def kernel_key(bundle: dict[str, Any]) -> str:
        return bundle["source"] + json.dumps(bundle["launches"])

    for name in only or gallery.names():
        table = gallery.layer_table(name)
        if table is None:
            errors.append({"operator": name, "error": "valid on no ResNet-18 layer table"})
            continue
        op = gallery.load(name)
        for layer, binding in solve.check(op, table):
            label = layer.name if hasattr(layer, "name") else str(layer)
            try:
                default = cuda_bundle(op, binding, arch=arch)
            except KdslError as error:
                errors.append({"operator": name, "layer": label, "error": str(error)})
                continue
            write(name, label, "default", default)
            if name not in TUNED:
                continue
            # points near the default schedule (GpuSpace.around), each a different kernel: a point whose tiles
            # clamp to one already built is drawn again (at most 4 draws a variant)
            space = GpuSpace(lower(op, binding), from_arch(arch))
            seen = {kernel_key(default)}
            wanted = (variants if label == variant_layer else other_variants) - 1
            index = draws = 0
            while index < wanted and draws < 4 * wanted:
                draws += 1
                config = space.around(rng)
                try:
                    bundle = cuda_bundle(op, binding, arch=arch, config=config)
                except KdslError as error:
                    errors.append({"operator": name, "layer": label, "variant": str(index), "error": str(error)})
                    continue
                if kernel_key(bundle) in seen:
                    continue
                seen.add(kernel_key(bundle))
                write(name, label, f"v{index:02d}", bundle)
                index += 1
        print(f"{name}: done ({time.time() - start:.0f} s)", flush=True)
    (out / "build_errors.json").write_text(json.dumps(errors, indent=1))
    size = sum(p.stat().st_size for p in out.glob("*.json"))
    print(
        f"wrote {written} bundles ({size / 1e6:.1f} MB) to {out} in {time.time() - start:.0f} s; {len(errors)} errors"
    )
    return 0


# -- run (there: torch CUDA + CuPy, no TVM) -------------------------------------------------------------


def _bundles(folder: Path) -> list[dict[str, Any]]:
    bundles = []
    for path in sorted(folder.glob("*__*.json")):
        bundle = json.loads(path.read_text())
        bundle["file"] = path.name
        bundles.append(bundle)
    return bundles


def _native(name: str, tensors: list[Any], binding: dict[str, int]) -> Any:
    """PyTorch's own function of a gallery operator on ``tensors`` (input, then weights in the
    operator's layouts) as a call without arguments: cuDNN's F.conv2d for conv2d, cuBLAS for matmul,
    and :mod:`kdsl.codegen.native`'s entry for every other operator that has one; None where none."""
    from kdsl.codegen.native import NATIVE, native_function

    if name not in NATIVE:
        return None
    return native_function(name, tensors[0], tensors[1:], binding)


def _torch_module(bundle: dict[str, Any], device: str) -> Any:
    import kdsl
    from kdsl.codegen.torch import build as build_torch

    return build_torch(kdsl.parse(bundle["dsl"]), bundle["binding"]).to(device)


def _data_inputs(bundle: dict[str, Any]) -> int:
    """How many of the bundle's inputs are the operator's data inputs (bmm's two, attention's q and k)."""
    import kdsl

    return len(kdsl.parse(bundle["dsl"]).input_names)


def ordered(bundles: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The order of the work: conv2d's and matmul's defaults, every other operator's defaults, then the
    conv2d/matmul variants, v00 of every operator and layer, then v01, ...: a run cut short has checked
    every operator, and as many variants at each layer."""

    def rank(bundle: dict[str, Any]) -> tuple[int, str, str]:
        tuned, default = bundle.get("operator") in TUNED, bundle.get("variant") == "default"
        group = 0 if tuned and default else 1 if default else 2
        return (group, "" if default else str(bundle.get("variant")), bundle["file"])

    return sorted(bundles, key=rank)


def dry_run(bundles: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plan every bundle, batch the sources as NVRTC will compile them, and build every PyTorch module on
    the CPU: what ``run`` does short of the GPU."""
    rows = []
    modules: dict[tuple[str, str], Any] = {}
    batches = 0
    for start in range(0, len(bundles), COMPILE_BATCH):
        batches += len(batch_sources(bundles[start : start + COMPILE_BATCH]))
    for bundle in bundles:
        row = {"file": bundle["file"], "operator": bundle.get("operator"), "layer": bundle.get("layer")}
        try:
            launch_plan = plan(bundle)
            argument_slots(launch_plan)
            input_signature(launch_plan)
            key = (bundle["dsl"], json.dumps(bundle["binding"], sort_keys=True))
            if key not in modules:
                modules[key] = _torch_module(bundle, "cpu")
            arguments = len(inspect.signature(modules[key].forward).parameters)
            if arguments != _data_inputs(bundle):  # the run calls the module with the data inputs alone
                raise TypeError(f"the module takes {arguments} inputs, the operator has {_data_inputs(bundle)}")
            row.update(
                status="planned", kernels=len(launch_plan.launches), intermediates=len(launch_plan.intermediates)
            )
        except Exception as error:  # the dry run reports every bundle, whatever breaks
            row.update(status="error", error=f"{type(error).__name__}: {error}"[:300])
        rows.append(row)
    print(f"{len(bundles)} bundles in {batches} NVRTC compiles of up to {COMPILE_BATCH} bundles")
    return rows


def _error(expected: Any, got: Any) -> float:
    scale = float(expected.abs().max()) or 1.0
    return float((got.reshape(expected.shape) - expected).abs().max()) / scale


class References:
    """Per operator and binding: the inputs, kdsl's PyTorch module's output, and (timed on demand, once)
    the module's and PyTorch native's times per call and on the GPU."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.cache: dict[tuple[str, str], dict[str, Any]] = {}

    def get(self, bundle: dict[str, Any]) -> dict[str, Any]:
        torch = self.torch
        key = (bundle["dsl"], json.dumps(bundle["binding"], sort_keys=True))
        if key in self.cache:
            return self.cache[key]
        module = _torch_module(bundle, "cuda")
        data = _data_inputs(bundle)  # the operator's data inputs lead the kernel's arguments, weights follow
        gen = torch.Generator(device="cpu").manual_seed(0)
        launch_plan = plan(bundle)
        tensors = [torch.randn(launch_plan.shapes[name], generator=gen).cuda() for name in launch_plan.inputs]
        with torch.no_grad():
            for param, weight in zip(module.weights, tensors[data:]):
                param.copy_(weight.reshape(param.shape))
            expected = module(*tensors[:data])
            native = _native(bundle.get("operator"), tensors, bundle["binding"])
            native_error = None
            if native is not None:  # kdsl's PyTorch module against PyTorch's own function
                reference = native()
                if reference.numel() == expected.numel():
                    native_error = _error(reference.reshape(expected.shape), expected)
        entry = {"tensors": tensors, "data": data, "expected": expected, "module": module, "native": native}
        entry["native_error"] = native_error
        self.cache[key] = entry
        return entry

    def times(self, entry: dict[str, Any]) -> dict[str, float | None]:
        """The module's and native's milliseconds per call and on the GPU, measured as the kernels are."""
        if "times" not in entry:
            module, tensors, native = entry["module"], entry["tensors"], entry["native"]
            data = entry["data"]
            with self.torch.no_grad():
                call = lambda: module(*tensors[:data])
                entry["times"] = {
                    "module_ms": time_cuda(call),
                    "module_gpu_ms": time_cuda(call, gpu_only=True),
                    "native_ms": time_cuda(native) if native is not None else None,
                    "native_gpu_ms": time_cuda(native, gpu_only=True) if native is not None else None,
                }
        return entry["times"]


def run(bundles: list[dict[str, Any]], budget_s: float) -> tuple[str, list[dict[str, Any]]]:
    """Every bundle checked against kdsl's PyTorch module, then timed (see the module docstring)."""
    import torch

    from kdsl.runtime.gpu import from_properties

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    device_line = f"{torch.cuda.get_device_name(0)}; {from_properties(torch.cuda.get_device_properties(0)).describe()}"
    start = time.time()
    bundles = ordered(bundles)
    references = References(torch)
    compiled: dict[int, tuple[Any, str] | None] = {}
    rows: list[dict[str, Any]] = []
    kernels: dict[int, Any] = {}

    def compiled_for(index: int) -> tuple[Any, str] | None:
        if index not in compiled:  # the batch of COMPILE_BATCH bundles around it, in one NVRTC call
            first = index - index % COMPILE_BATCH
            chunk = bundles[first : first + COMPILE_BATCH]
            compiled.update(zip(range(first, first + len(chunk)), compile_batches(chunk, size=COMPILE_BATCH)))
        return compiled[index]

    def failed(row: dict[str, Any], error: Exception) -> None:
        row.update(status="error", ok=False, error=f"{type(error).__name__}: {error}"[:400])
        traceback.print_exc(limit=2)
        try:
            torch.cuda.synchronize()
        except Exception:  # a launch failure may poison the context: say so, go on
            row["error"] += " (CUDA context lost)"

    # 1. correctness of every bundle (defaults of every operator first)
    for index, bundle in enumerate(bundles):
        row: dict[str, Any] = {key: bundle.get(key) for key in ("operator", "layer", "variant")}
        row["file"] = bundle["file"]
        rows.append(row)
        if bundle.get("variant") != "default" and time.time() - start > CHECK_SHARE * budget_s:
            # the defaults of every operator are checked whatever it costs; variants only within their share
            row["status"] = "not run (budget spent)"
            continue
        try:
            entry = references.get(bundle)
            row["native_error"] = entry["native_error"]
            kernel = BundleKernel(bundle, compiled=compiled_for(index))
            with torch.no_grad():
                got = kernel(*entry["tensors"])
            torch.cuda.synchronize()
            row["rel_error"] = _error(entry["expected"], got)
            row["ok"] = bool(row["rel_error"] <= TOLERANCE)
            row["status"] = "ok" if row["ok"] else "WRONG"
            if row["ok"] and (bundle.get("operator") in TUNED or bundle.get("variant") == "default"):
                kernels[index] = kernel
        except Exception as error:  # one failing bundle is a row of the table; the run goes on
            failed(row, error)
        print(f"{row['file']}: {row.get('status')} {row.get('rel_error', '')}", flush=True)
    print(f"correctness: {len(rows)} bundles in {time.time() - start:.0f} s", flush=True)

    # 2. timing: conv2d/matmul defaults and variants, then every other operator's default
    timing = sorted(kernels, key=lambda i: (bundles[i].get("operator") not in TUNED, i))
    for index in timing:
        bundle, row, kernel = bundles[index], rows[index], kernels.pop(index)
        if time.time() - start > budget_s:
            row["status"] = "ok, not timed (budget spent)"
            continue
        try:
            entry = references.get(bundle)
            row.update(references.times(entry))
            tensors = entry["tensors"]
            with torch.no_grad():
                call = lambda k=kernel, t=tensors: k(*t)
                row["kdsl_ms"] = time_cuda(call)
                row["kdsl_gpu_ms"] = time_cuda(call, gpu_only=True)
                if bundle.get("variant") == "default" and bundle.get("operator") in TUNED:
                    graphed = BundleKernel(bundle, compiled=compiled_for(index), graph=True)
                    row["kdsl_graph_ms"] = time_cuda(lambda k=graphed, t=tensors: k(*t))
                    row["graph_error"] = _error(entry["expected"], graphed(*tensors))
                    if row["graph_error"] > TOLERANCE:
                        row["status"] = "WRONG under graph replay"
        except Exception as error:  # a timing failure is a row's error too
            failed(row, error)
        del kernel
        print(f"{row['file']}: {row.get('kdsl_ms', '')} ms/call, {row.get('kdsl_gpu_ms', '')} ms GPU", flush=True)
    return device_line, rows


#: the shuffled grouped convolutions the main job found (issue 24, docs/discover): G = 2 groups whose
#: output channels are interleaved (2e1932e99324e944) or that read interleaved input channels
#: (4cecb098febbe433)
SHUFFLED = {
    "grouped G=2, output interleaved (2e1932e9)": ("Split(Cin, Cin/G, 'g', 'ci')", "Merge('co', 'g', 'Cout')"),
    "grouped G=2, input interleaved (4cecb098)": ("Split(Cin, G, 'ci', 'g')", "Merge('g', 'co', 'Cout')"),
}
GROUPED = """from kdsl.lang import *
N, Cin, H, W, Cout = primary("N Cin H W Cout")
G, K = coefficient("G K")
w = Weight("g", Dim("co", Cout/G), "ci", "kh", "kw", name="w")
op = (Input(N, Cin, H, W) >> {split} >> Unfold(H, K, "kh") >> Unfold(W, K, "kw") >> Share(w)
      >> Reduce("ci", "kh", "kw") >> {merge} >> Output(N, Cout, H, W, defaults={{"G": 2, "K": 3}}))
"""


def network(out: Path) -> str:
    """ResNet-18 end to end on the GPU (PyTorch, batch 1 and 8) with its stride-1 3x3 convolutions
    replaced by conv2d, grouped conv and the two shuffled grouped convs: ``kdsl bench network --device
    cuda``'s table."""
    import kdsl
    from kdsl.bench.network_bench import format_table
    from kdsl.discover.network import NetworkOp, network_latency

    ops: list[Any] = ["conv2d", "grouped_conv2d:G=2", "syno_op2:G=2"]
    for label, (split, merge) in SHUFFLED.items():
        ops.append(NetworkOp(label, kdsl.parse(GROUPED.format(split=split, merge=merge))))
    # the worker processes import kdsl from this checkout
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    rows = network_latency(ops, (1, 8), ("torch",), threads=4, repeats=5, max_repeats=10, target=0.2, device="cuda")
    table = format_table(rows)
    (out / "network_cuda.json").write_text(json.dumps(rows, indent=1))
    return table


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def _ms(value: float | None) -> str:
    return f"{value:.4f}" if value else "-"


def report(device_line: str, rows: list[dict[str, Any]], out: Path, seconds: float, network_table: str = "") -> None:
    """``gpu_check.md`` and ``gpu_check.json``. Times are "per call" (back-to-back Python calls: what a
    caller sees, host overhead included) and "GPU" (20 calls captured in a CUDA graph and replayed: the
    kernels alone), measured the same way for kdsl's kernels, kdsl's PyTorch modules and PyTorch native."""
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# kdsl GPU check", "", f"device: {device_line}", f"run time: {seconds:.0f} s", ""]
    lines += [
        "Times in ms. *per call*: back-to-back calls from Python, host cost included; *GPU*: the same calls "
        "captured in a CUDA graph and replayed (the GPU's time only; per-call queueing if capture fails).",
        "",
    ]
    lines += ["## Agreement and time per operator and layer (default GPU schedule)", ""]
    lines += [
        "| operator | layer | status | rel. error | kdsl per call | kdsl GPU | module per call | module GPU "
        "| GPU ratio kdsl/module |"
    ]
    lines += ["| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        if row.get("variant") != "default":
            continue
        err = f"{row['rel_error']:.1e}" if "rel_error" in row else row.get("error", "")[:80]
        lines.append(
            f"| {row['operator']} | {row['layer']} | {row.get('status')} | {err} | {_ms(row.get('kdsl_ms'))} "
            f"| {_ms(row.get('kdsl_gpu_ms'))} | {_ms(row.get('module_ms'))} | {_ms(row.get('module_gpu_ms'))} "
            f"| {_ratio(row.get('kdsl_gpu_ms'), row.get('module_gpu_ms'))} |"
        )
    lines += ["", "## Default schedule vs cuDNN (conv2d) / cuBLAS (matmul), TF32 off", ""]
    lines += [
        "| operator | layer | kdsl per call | kdsl per call, CUDA graph | native per call | ratio per call "
        "| kdsl GPU | native GPU | ratio GPU |"
    ]
    lines += ["| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        if row.get("operator") in TUNED and row.get("variant") == "default":
            lines.append(
                f"| {row['operator']} | {row['layer']} | {_ms(row.get('kdsl_ms'))} | {_ms(row.get('kdsl_graph_ms'))} "
                f"| {_ms(row.get('native_ms'))} | {_ratio(row.get('kdsl_ms'), row.get('native_ms'))} "
                f"| {_ms(row.get('kdsl_gpu_ms'))} | {_ms(row.get('native_gpu_ms'))} "
                f"| {_ratio(row.get('kdsl_gpu_ms'), row.get('native_gpu_ms'))} |"
            )
    lines += ["", "## Best of the schedule variants vs cuDNN / cuBLAS (by GPU time)", ""]
    lines += [
        "| operator | layer | variants ok/run | best variant | best GPU | default GPU | native GPU | best/native GPU "
        "| best per call | native per call |"
    ]
    lines += ["| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in TUNED:
        layers = sorted({r["layer"] for r in rows if r.get("operator") == name and r.get("variant") != "default"})
        for layer in layers:
            group = [r for r in rows if r.get("operator") == name and r.get("layer") == layer]
            good = [r for r in group if r.get("ok") and r.get("kdsl_gpu_ms")]
            best = min(good, key=lambda r: r["kdsl_gpu_ms"], default=None)
            default = next((r for r in group if r.get("variant") == "default"), {})
            native = (best or default).get("native_gpu_ms")
            lines.append(
                f"| {name} | {layer} | {len(good)}/{len(group)} | {best['variant'] if best else '-'} "
                f"| {_ms(best and best['kdsl_gpu_ms'])} | {_ms(default.get('kdsl_gpu_ms'))} | {_ms(native)} "
                f"| {_ratio(best and best['kdsl_gpu_ms'], native)} | {_ms(best and best.get('kdsl_ms'))} "
                f"| {_ms((best or default).get('native_ms'))} |"
            )
    lines += ["", "## kdsl's PyTorch module on CUDA vs PyTorch's own function (kdsl.codegen.native), TF32 off", ""]
    lines += ["| operator | layer | module GPU | native GPU | module/native GPU | module per call | native per call "]
    lines[-1] += "| rel. error vs native |"
    lines += ["| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        if row.get("variant") == "default" and row.get("native_ms"):
            error = row.get("native_error")
            shown = "-" if error is None else f"{error:.1e}"
            lines.append(
                f"| {row['operator']} | {row['layer']} | {_ms(row.get('module_gpu_ms'))} "
                f"| {_ms(row.get('native_gpu_ms'))} | {_ratio(row.get('module_gpu_ms'), row.get('native_gpu_ms'))} "
                f"| {_ms(row.get('module_ms'))} | {_ms(row['native_ms'])} | {shown} |"
            )
    if network_table:
        lines += ["", "## ResNet-18 end to end on the GPU (PyTorch eager; kdsl bench network --device cuda)", ""]
        lines += ["```", network_table, "```"]
    bad = [r for r in rows if not str(r.get("status")).startswith(("ok", "planned", "not run"))]
    skipped = [r for r in rows if str(r.get("status")).startswith("not run")]
    if skipped:
        lines += ["", f"{len(skipped)} variants not run: the check's share of the time budget was spent."]
    lines += ["", f"## Failures ({len(bad)})", ""]
    lines += [f"- {r['file']}: {r.get('status')} {r.get('error', '')}" for r in bad]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")
    (out / "gpu_check.json").write_text(json.dumps({"device": device_line, "seconds": seconds, "rows": rows}, indent=1))
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="write CUDA kernel bundles (needs TVM, not a GPU)")
    b.add_argument("--out", type=Path, default=Path("gpu_bundles"))
    b.add_argument(
        "--variants",
        type=int,
        default=64,
        help="schedules of conv2d and matmul at --variant-layer, the default included",
    )
    b.add_argument("--variant-layer", default="conv3_x")
    b.add_argument("--other-variants", type=int, default=64, help="schedules of conv2d and matmul at every other layer")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--arch", default="sm_90")
    b.add_argument("--only", nargs="*", help="these gallery operators only")
    r = commands.add_parser("run", help="launch bundles with CuPy and compare (needs a GPU, not TVM)")
    r.add_argument("--bundles", type=Path, default=Path("gpu_bundles"))
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    r.add_argument(
        "--budget-s", type=float, default=240.0, help="stop timing (and skip the network) after this many seconds"
    )
    r.add_argument("--dry-run", action="store_true", help="parse and plan every bundle, launch nothing")
    r.add_argument("--no-network", action="store_true", help="skip ResNet-18 end to end on the GPU")
    args = parser.parse_args(argv)
    if args.command == "build":
        return build(args.out, variants=args.variants, variant_layer=args.variant_layer,
                     other_variants=args.other_variants, seed=args.seed, only=args.only, arch=args.arch)  # fmt: skip
    bundles = _bundles(args.bundles)
    if not bundles:
        print(f"no bundles in {args.bundles}: run `python scripts/gpu_check.py build --out {args.bundles}` first")
        return 1
    start = time.time()
    if args.dry_run:
        rows = dry_run(ordered(bundles))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check_dry_run.json").write_text(json.dumps(rows, indent=1))
        failed = [r for r in rows if r["status"] != "planned"]
        print(f"planned {len(rows) - len(failed)} of {len(rows)} bundles in {time.time() - start:.1f} s")
        for row in failed:
            print(f"  {row['file']}: {row['error']}")
        return 1 if failed else 0
    args.out.mkdir(parents=True, exist_ok=True)
    device_line, rows = run(bundles, args.budget_s)
    network_table = ""
    if args.no_network:
        pass
    elif time.time() - start > NETWORK_SHARE * args.budget_s:
        network_table = "not run: the time budget was spent on the kernels"
    else:  # last: the kernels' check matters more than the network's table
        try:
            network_table = network(args.out)
            print(network_table, flush=True)
        except Exception as error:  # the report goes on without the network's table
            network_table = f"network timing failed: {type(error).__name__}: {error}"[:2000]
            traceback.print_exc(limit=3)
    report(device_line, rows, args.out, time.time() - start, network_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
