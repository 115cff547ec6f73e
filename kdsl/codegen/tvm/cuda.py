"""CUDA kernels from TVM without a GPU: an operator lowered, scheduled for the GPU
(:mod:`kdsl.codegen.tvm.gpu_schedule`), verified against the GPU's limits, and generated as CUDA C
with everything a launcher needs, as a JSON-serializable *CUDA kernel bundle*.

TVM compiles a scheduled module in two halves: device kernels (one per stage that is not inlined, named
``main_kernel``, ``main_kernel_1``, ...) and a host function that allocates the intermediate buffers and
calls the kernels in order with their grid and block sizes. The bundle reads both from TVM's own
pipeline (:func:`lower_to_device`): the host function's ``call_ffi_kernel`` calls give the launch order,
each kernel's arguments and its launch values; its buffer declarations give every buffer's name, shape
and dtype. A machine without TVM launches the bundle with CuPy (:mod:`kdsl.runtime.cuda_launch`).

Bundle format (``format: kdsl-cuda-bundle/1``)::

    source      CUDA C of every kernel (compiled on the GPU machine, e.g. by NVRTC)
    buffers     [{name, role: input|weight|output|intermediate, shape, dtype}], inputs in call order
    launches    [{kernel, grid: [x, y, z], block: [x, y, z], shared_bytes, args: [buffer names]}]
    dsl, binding, arch, gpu, config, schedule   what it computes and how it was scheduled

>>> from kdsl.lang import *
>>> M, C, O = primary("M C O")
>>> op = Input(M, C) >> Share(Weight(C, O, name="w")) >> Reduce(C) >> Output(M, O)
>>> bundle = cuda_bundle(op, {"M": 64, "C": 32, "O": 64})
>>> [b["name"] for b in bundle["buffers"]], bundle["launches"][0]["kernel"]
(['x', 'w', 'stage0'], 'main_kernel')
>>> "__global__" in bundle["source"]
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from math import prod
from typing import Any

import numpy as np

from kdsl.codegen.tvm.gpu_schedule import GpuConfig, GpuSpace
from kdsl.codegen.tvm.lowering import Lowered, lower
from kdsl.codegen.tvm.store_check import cover_problems, store_indices
from kdsl.codegen.tvm.toolchain import error_reason, load_tvm
from kdsl.lang.errors import LoweringError
from kdsl.lang.operator import Operator
from kdsl.runtime.cuda_launch import BUNDLE_FORMAT
from kdsl.runtime.gpu import DEFAULT_ARCH, Gpu, check_arch, from_arch

__all__ = [
    "BUNDLE_FORMAT",
    "SHRINK",
    "candidates",
    "cuda_bundle",
    "cuda_source",
    "cuda_target",
    "lower_to_device",
    "partial_sum_problems",
    "schedule_verified",
]


def cuda_target(arch: str = DEFAULT_ARCH) -> Any:
    """The TVM target of CUDA code for ``arch`` (``sm_80``, ``sm_86``, ``sm_89``, ``sm_90``), host code for LLVM.

    A name kdsl has no description of is a :class:`~kdsl.runtime.gpu.GpuArchError`."""
    tvm = load_tvm()
    check_arch(arch)
    return tvm.target.Target({"kind": "cuda", "arch": arch}, host={"kind": "llvm"})


def lower_to_device(module: Any, target: Any) -> tuple[Any, Any]:
    """``module`` (scheduled) through TVM's default pipeline for ``target``: ``(host module, device module)``,
    the device functions before their finalizing passes (as ``tvm.compile`` makes them)."""
    tvm = load_tvm()
    from tvm.tirx.build import split_host_device_mods

    bound = tvm.tirx.transform.BindTarget(target.with_host(target.host))(module)
    pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(target)
    host, devices = split_host_device_mods(pipeline(bound))
    if len(devices) != 1:
        raise LoweringError(f"expected one CUDA device module, TVM made {len(devices)} (is every stage bound?)")
    return host, next(iter(devices.values()))


def verify(device: Any, gpu: Gpu) -> list[str]:
    """The device kernels that break ``gpu``'s limits (TVM's ``verify_gpu_code``), by name; empty when all pass."""
    tvm = load_tvm()
    constraints = gpu.verify_constraints()
    return [
        gv.name_hint
        for gv, func in device.functions.items()
        if not tvm.s_tir.analysis.verify_gpu_code(func, constraints)
    ]


def _unbound(host: Any) -> bool:
    """Whether the host function still holds loops over buffers that a kernel should compute (a stage no
    kernel covers would run on the host and read device memory)."""
    tvm = load_tvm()
    found = []

    def walk(node: Any) -> None:
        if isinstance(node, tvm.tirx.SeqStmt):
            for child in node.seq:
                walk(child)
            return
        if isinstance(node, tvm.tirx.BufferStore):
            found.append(node)
        for attr in ("body", "then_case", "else_case"):
            child = getattr(node, attr, None)
            if isinstance(child, tvm.tirx.Stmt):
                walk(child)

    walk(host["main"].body)
    return bool(found)


def partial_sum_problems(scheduled: Any, device: Any) -> list[str]:
    """What is wrong with the stores into every split-K partial-sum buffer (``rfactor``'s ``*.rf``
    intermediates) of a kernel, ``scheduled`` (its schedule's module) lowered to ``device``: each element of
    the buffer's logical shape must be written exactly once over the whole grid and nothing past it
    (:func:`~kdsl.codegen.tvm.store_check.cover_problems`; a tile's write-back past the output's end once
    overwrote the next slice's sums). TVM may give the buffer a larger allocation that other intermediates
    share, so the shape is the scheduled module's, not the host's. Empty when every one is an exact cover."""
    problems = []
    for buffer in scheduled["main"].body.block.alloc_buffers:
        if not buffer.name.endswith(".rf"):
            continue
        name, size = buffer.name, prod(int(d) for d in buffer.shape)
        try:
            # the write-back of the slices' register tiles (the cache_write of rfactor's block, "<name>_local"), by
            # its source: TVM shares one allocation between intermediates of different kernels under one name
            stores = [store_indices(func, None, f"{name}_local") for func in device.functions.values()]
            written = [indices for indices in stores if indices.size]
            if len(written) != 1:
                problems.append(f"{name}: {len(written)} kernels write the partial sums back, not one")
            problems.extend(cover_problems(np.concatenate(stores), name, size))
        except LoweringError as error:  # stores the check cannot evaluate: not shown safe, so not used
            problems.append(f"{name}: {error}")
    return problems


#: smaller variants of a configuration tried at its level before stepping down one: a shorter reduction
#: chunk, then smaller block tiles shrink the shared tiles and the register tile (conv1d's 32-deep chunk
#: stages 100 KB, an 8-deep one 25 KB; operators whose input region is not row-aligned need small tiles)
SHRINK = (
    {"k_chunk": 8},
    {"k_chunk": 8, "threads": 128, "reg_d": 2, "reg_o": 2},
    {"k_chunk": 4, "threads": 64, "reg_d": 1, "reg_o": 2},
)


def candidates(config: GpuConfig) -> list[GpuConfig]:
    """What :func:`schedule_verified` tries, in order: ``config``, its :data:`SHRINK` variants, then the same
    one rule level down, ... , ``plain`` last (variants that change nothing are left out).

    >>> [(c.level, c.k_chunk, c.threads) for c in candidates(GpuConfig(k_chunk=8, level="tiled"))]
    [('tiled', 8, 256), ('tiled', 8, 128), ('tiled', 4, 64), ('plain', 8, 256)]
    """
    out: list[GpuConfig] = []
    current: GpuConfig | None = config
    while current is not None:
        options = [current] if current.level == "plain" else [current, *(replace(current, **s) for s in SHRINK)]
        out.extend(c for c in options if c not in out)
        current = current.lower_level()
    return out


def schedule_verified(
    lowered: Lowered, gpu: Gpu, config: GpuConfig | None = None, target: Any | None = None
) -> tuple[Any, Any, Any, GpuConfig, list[tuple[str, str]]]:
    """The GPU schedule of ``lowered`` at ``config`` (default: the heuristic), or else the first of its
    :func:`candidates` (smaller tiles, then a rule level down, :data:`~kdsl.codegen.tvm.gpu_schedule.LEVELS`)
    that TVM's GPU verification passes and whose split-K partial sums are each written exactly once
    (:func:`partial_sum_problems`): ``(schedule, host module, device module, the config used, report)``."""
    space = GpuSpace(lowered, gpu)
    target = target or cuda_target(gpu.arch if gpu.arch in ("sm_80", "sm_86", "sm_89", "sm_90") else DEFAULT_ARCH)
    failures = []
    fallback: tuple[Any, Any, Any, GpuConfig, list[tuple[str, str]]] | None = None
    for current in candidates(config or space.heuristic()):
        report: list[tuple[str, str]] = []
        try:
            sch = space.apply(current, report)
            host, device = lower_to_device(sch.mod, target)
        except LoweringError:
            raise
        except Exception as error:  # a TVM pass refused the schedule: the next candidate
            failures.append(f"{current.level}: {error_reason(error)}")
            continue
        bad = verify(device, gpu)
        overlaps = partial_sum_problems(sch.mod, device)
        if overlaps:  # a split-K whose partial sums are not written exactly once: never used, however fast
            failures.append(f"{current.level}: {'; '.join(overlaps)}")
            continue
        if not bad and not _unbound(host):
            dropped = [n for n, rule in report if rule == "plain" and space.blocks[n].reduced]
            if not dropped or current.level == "plain":
                return sch, host, device, current, report
            # a reduction stage fell to the plain rule at these knobs (too few threads to tile it): kept in
            # case nothing better verifies, but a later candidate that tiles every reduction comes first
            fallback = fallback or (sch, host, device, current, report)
            continue
        failures.append(f"{current.level}: kernels {', '.join(bad) or '(host loops)'} fail GPU verification")
    if fallback is not None:
        return fallback
    raise LoweringError(f"no GPU schedule verifies for {gpu.arch}: {'; '.join(failures)}")


def _launches(host: Any) -> tuple[list[dict[str, Any]], dict[str, tuple[str, list[int], str, bool]]]:
    """The kernel calls of the host function in order, and every buffer it declares by its data var."""
    tvm = load_tvm()
    tirx = tvm.tirx
    calls: list[Any] = []
    # printed data pointer ("x.data") -> (name, shape, dtype, allocated). In 0.27 ``buffer.data`` and a kernel
    # call's arguments are expressions, not one shared Var, so they are matched by their text (names are unique)
    buffers: dict[str, tuple[str, list[int], str, bool]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, tirx.SeqStmt):
            for child in node.seq:
                walk(child)
            return
        if isinstance(node, (tirx.AllocBuffer, tirx.DeclBuffer)):
            buf = node.buffer
            if str(buf.data) not in buffers:  # the first declaration of a parameter has its real shape
                buffers[str(buf.data)] = (
                    buf.name,
                    [int(d) for d in buf.shape],
                    str(buf.dtype),
                    isinstance(node, tirx.AllocBuffer),
                )
        if isinstance(node, tirx.Evaluate) and isinstance(node.value, tvm.ir.Call):
            op = node.value.op
            if isinstance(op, tvm.ir.Op) and op.name == "tirx.call_ffi_kernel":
                calls.append(node.value)
        for attr in ("body", "then_case", "else_case"):
            child = getattr(node, attr, None)
            if isinstance(child, tirx.Stmt):
                walk(child)

    walk(host["main"].body)
    launches = []
    for call in calls:
        params = [str(p) for p in call.attrs.launch_params]
        values = list(call.args[len(call.args) - len(params) :])
        args = call.args[1 : len(call.args) - len(params)]
        grid, block, shared = [1, 1, 1], [1, 1, 1], 0
        for tag, value in zip(params, values):
            if not isinstance(value, tirx.IntImm):
                raise LoweringError(f"kernel {call.args[0].value}: launch value {tag} = {value} is not a constant")
            if tag.startswith("blockIdx."):
                grid["xyz".index(tag[-1])] = int(value.value)
            elif tag.startswith("threadIdx."):
                block["xyz".index(tag[-1])] = int(value.value)
            elif "dyn_shared" in tag:
                shared = int(value.value)
        names = []
        for arg in args:
            if str(arg) not in buffers:
                raise LoweringError(
                    f"kernel {call.args[0].value}: argument {arg} is not a buffer (only buffers are launched)"
                )
            names.append(buffers[str(arg)][0])
        launches.append(
            {"kernel": str(call.args[0].value), "grid": grid, "block": block, "shared_bytes": shared, "args": names}
        )
    return launches, buffers


def _source(device: Any, target: Any) -> str:
    tvm = load_tvm()
    from tvm.tirx.build import codegen_build

    _, _, finalize = tvm.tirx.get_default_tir_pipeline(target)
    return str(codegen_build(finalize()(device), target).inspect_source())


def cuda_bundle(
    op: Operator,
    binding: Mapping[str, int],
    *,
    arch: str = DEFAULT_ARCH,
    config: GpuConfig | None = None,
    dtype: str = "float32",
    gpu: Gpu | None = None,
) -> dict[str, Any]:
    """The CUDA kernel bundle (see the module docstring) of ``op`` at ``binding``, scheduled with
    ``config`` (default: the GPU space's heuristic) for ``arch``'s description (or ``gpu``'s)."""
    gpu = gpu or from_arch(arch)
    target = cuda_target(check_arch(arch))
    lowered = lower(op, binding, dtype)
    _, host, device, used, report = schedule_verified(lowered, gpu, config, target)
    launches, declared = _launches(host)
    roles = {t.op.name: "input" for t in lowered.inputs}
    roles[lowered.out.op.name] = "output"
    roles.update({w.op.name: "weight" for w in lowered.weights})
    buffers = []
    # the inputs (several: in the kernel's order), the weights, the output
    ordered = [*(t.op.name for t in lowered.inputs), *(w.op.name for w in lowered.weights), lowered.out.op.name]
    by_name = {name: (shape, dt, allocated) for name, shape, dt, allocated in declared.values()}
    for name in ordered:
        if name not in by_name:
            raise LoweringError(f"the host code does not declare the buffer {name}")
    used_names = {name for launch in launches for name in launch["args"]}
    for name in ordered + sorted(n for n, (_, _, allocated) in by_name.items() if allocated and n in used_names):
        shape, dt, _ = by_name[name]
        buffers.append({"name": name, "role": roles.get(name, "intermediate"), "shape": shape, "dtype": dt})
    return {
        "format": BUNDLE_FORMAT,
        "dsl": op.to_dsl(),
        "binding": {k: int(v) for k, v in lowered.binding.items()},
        "arch": arch,
        "gpu": gpu.describe(),
        "config": used.to_json(),
        "schedule": [list(item) for item in report],
        "source": _source(device, target),
        "buffers": buffers,
        "launches": launches,
    }


def cuda_source(
    op: Operator, binding: Mapping[str, int], *, arch: str = DEFAULT_ARCH, config: GpuConfig | None = None
) -> str:
    """The CUDA C of ``op`` at ``binding`` with the default GPU schedule, led by a comment per kernel
    launch (name, grid, block, buffers): what :func:`cuda_bundle` stores, for reading."""
    bundle = cuda_bundle(op, binding, arch=arch, config=config)
    lines = [f"// {bundle['gpu']}"]
    for launch in bundle["launches"]:
        lines.append(
            f"// launch {launch['kernel']}<<<grid {tuple(launch['grid'])}, block {tuple(launch['block'])}>>>"
            f"({', '.join(launch['args'])})"
        )
    for buffer in bundle["buffers"]:
        lines.append(f"// {buffer['role']:<12} {buffer['name']}: {buffer['dtype']}{buffer['shape']}")
    return "\n".join(lines) + "\n" + bundle["source"]
