"""Launching CUDA kernel bundles (:func:`kdsl.codegen.tvm.cuda.cuda_bundle`) with CuPy, without TVM.

A bundle is plain JSON: CUDA C, the buffers (inputs, weights, output, intermediates between kernels)
and the kernel launches in order. :func:`plan` checks a bundle and turns it into a :class:`LaunchPlan`
(pure Python: no GPU needed, and what the tests check); :class:`BundleKernel` compiles the source with
NVRTC through CuPy and runs the plan on torch CUDA tensors, passed zero-copy through DLPack;
:func:`time_cuda` times any callable with CUDA events.

Nothing here imports TVM, and CuPy and torch are imported on first use: a machine with PyTorch (CUDA)
and CuPy runs bundles built elsewhere. Without CuPy or a GPU, :class:`CudaUnavailableError` says so.

>>> bundle = {
...     "format": "kdsl-cuda-bundle/1", "source": "...",
...     "buffers": [{"name": "x", "role": "input", "shape": [4], "dtype": "float32"},
...                 {"name": "t", "role": "intermediate", "shape": [4], "dtype": "float32"},
...                 {"name": "out", "role": "output", "shape": [4], "dtype": "float32"}],
...     "launches": [{"kernel": "k0", "grid": [1, 1, 1], "block": [32, 1, 1], "args": ["t", "x"]},
...                  {"kernel": "k1", "grid": [1, 1, 1], "block": [32, 1, 1], "args": ["out", "t"]}]}
>>> p = plan(bundle)
>>> p.inputs, p.intermediates, p.output, [launch.kernel for launch in p.launches]
(['x'], ['t'], 'out', ['k0', 'k1'])
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from kdsl.lang.errors import KdslError, LoweringError

__all__ = [
    "BUNDLE_FORMAT",
    "BundleError",
    "BundleKernel",
    "CudaUnavailableError",
    "Launch",
    "LaunchPlan",
    "plan",
    "time_cuda",
]

BUNDLE_FORMAT = "kdsl-cuda-bundle/1"
_DTYPES = ("float32", "float64", "float16", "int32", "int64")


class CudaUnavailableError(LoweringError):
    """CuPy, a CUDA build of PyTorch or a GPU is missing: CUDA bundles cannot run here."""


class BundleError(KdslError):
    """A CUDA kernel bundle that is malformed: a missing field, an unknown buffer, a bad launch size."""


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``kernel<<<grid, block, shared_bytes>>>(*args)`` (args: buffer names)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[str, ...]
    shared_bytes: int = 0

    @property
    def threads(self) -> int:
        """Threads the launch starts: grid x block."""
        return prod(self.grid) * prod(self.block)


@dataclass(frozen=True)
class LaunchPlan:
    """What to allocate and launch for a bundle: the caller gives :attr:`inputs` (the data input, then
    the weights, in order), the plan allocates :attr:`intermediates` and :attr:`output`."""

    inputs: list[str]
    intermediates: list[str]
    output: str
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]
    launches: list[Launch]


def _field(mapping: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(mapping, Mapping) or key not in mapping:
        raise BundleError(f"{where}: missing field {key!r}")
    value = mapping[key]
    if not isinstance(value, kind):
        raise BundleError(f"{where}: field {key!r} is {type(value).__name__}, expected {kind}")
    return value


def _dims(value: Any, where: str) -> tuple[int, int, int]:
    if not (isinstance(value, list) and 1 <= len(value) <= 3 and all(isinstance(v, int) and v >= 1 for v in value)):
        raise BundleError(f"{where}: expected 1 to 3 positive integers, got {value!r}")
    return tuple([*value, 1, 1][:3])  # type: ignore[return-value]


def plan(bundle: Mapping[str, Any]) -> LaunchPlan:
    """Check ``bundle`` and plan its launches (see the module docstring).

    A malformed bundle is a :class:`BundleError` naming the field, buffer or launch."""
    if _field(bundle, "format", str, "bundle") != BUNDLE_FORMAT:
        raise BundleError(f"bundle: format {bundle['format']!r} is not {BUNDLE_FORMAT!r}")
    _field(bundle, "source", str, "bundle")
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    roles: dict[str, list[str]] = {"input": [], "weight": [], "output": [], "intermediate": []}
    for i, buffer in enumerate(_field(bundle, "buffers", list, "bundle")):
        where = f"bundle buffer {i}"
        name = _field(buffer, "name", str, where)
        role = _field(buffer, "role", str, where)
        shape = _field(buffer, "shape", list, where)
        dtype = _field(buffer, "dtype", str, where)
        if name in shapes:
            raise BundleError(f"{where}: buffer {name!r} is listed twice")
        if role not in roles:
            raise BundleError(f"{where}: role {role!r} is not one of {', '.join(roles)}")
        if not all(isinstance(d, int) and d >= 1 for d in shape):
            raise BundleError(f"{where}: shape {shape!r} of {name!r} is not a list of positive integers")
        if dtype not in _DTYPES:
            raise BundleError(f"{where}: dtype {dtype!r} of {name!r} is not one of {', '.join(_DTYPES)}")
        shapes[name], dtypes[name] = tuple(shape), dtype
        roles[role].append(name)
    if len(roles["input"]) != 1 or len(roles["output"]) != 1:
        raise BundleError(
            f"bundle: expected one input and one output buffer, got {roles['input']} and {roles['output']}"
        )
    launches = []
    for i, launch in enumerate(_field(bundle, "launches", list, "bundle")):
        where = f"bundle launch {i}"
        args = _field(launch, "args", list, where)
        for arg in args:
            if arg not in shapes:
                raise BundleError(f"{where}: argument {arg!r} is not a listed buffer")
        block = _dims(_field(launch, "block", list, where), f"{where} block")
        if prod(block) > 1024:
            raise BundleError(f"{where}: a block of {prod(block)} threads is more than CUDA's 1024")
        launches.append(
            Launch(
                _field(launch, "kernel", str, where),
                _dims(_field(launch, "grid", list, where), f"{where} grid"),
                block,
                tuple(args),
                int(launch.get("shared_bytes", 0)),
            )
        )
    if not launches:
        raise BundleError("bundle: no kernel launches")
    if not any(roles["output"][0] in launch.args for launch in launches):
        raise BundleError(f"bundle: no launch writes the output {roles['output'][0]!r}")
    return LaunchPlan(
        roles["input"] + roles["weight"], roles["intermediate"], roles["output"][0], shapes, dtypes, launches
    )


def _cuda() -> tuple[Any, Any]:
    """``(cupy, torch)``, or a :class:`CudaUnavailableError` saying what is missing."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        raise CudaUnavailableError("launching CUDA bundles needs PyTorch with CUDA: pip install torch") from None
    if not torch.cuda.is_available():
        raise CudaUnavailableError("launching CUDA bundles needs a CUDA GPU, and torch sees none")
    try:
        import cupy
    except ImportError:
        raise CudaUnavailableError(
            "launching CUDA bundles needs CuPy: pip install cupy-cuda12x (or the build for your CUDA)"
        ) from None
    return cupy, torch


class BundleKernel:
    """A bundle compiled for this machine's GPU: ``kernel(x, *weights) -> out`` on torch CUDA tensors.

    Intermediate buffers are allocated once and reused by every call (a kernel is not re-entrant
    across CUDA streams)."""

    def __init__(self, bundle: Mapping[str, Any], *, options: Sequence[str] = ("-std=c++17",)) -> None:
        self.plan = plan(bundle)
        cupy, torch = _cuda()
        self._cupy, self._torch = cupy, torch
        self.module = cupy.RawModule(code=bundle["source"], backend="nvrtc", options=tuple(options))
        self.functions = {launch.kernel: self.module.get_function(launch.kernel) for launch in self.plan.launches}
        self._scratch = {name: self._empty(name) for name in self.plan.intermediates}

    def _empty(self, name: str) -> Any:
        torch = self._torch
        return torch.empty(self.plan.shapes[name], dtype=getattr(torch, self.plan.dtypes[name]), device="cuda")

    def __call__(self, *tensors: Any, out: Any | None = None) -> Any:
        """Run every launch in order on ``tensors`` (the data input, then the weights); returns the output."""
        if len(tensors) != len(self.plan.inputs):
            raise BundleError(
                f"expected {len(self.plan.inputs)} tensors ({', '.join(self.plan.inputs)}), got {len(tensors)}"
            )
        torch, cupy = self._torch, self._cupy
        buffers: dict[str, Any] = dict(self._scratch)
        for name, tensor in zip(self.plan.inputs, tensors):
            if tuple(tensor.shape) != self.plan.shapes[name] or str(tensor.dtype) != f"torch.{self.plan.dtypes[name]}":
                raise BundleError(
                    f"buffer {name}: got {tuple(tensor.shape)} {tensor.dtype}, expected "
                    f"{self.plan.shapes[name]} {self.plan.dtypes[name]}"
                )
            if not tensor.is_cuda:
                raise BundleError(f"buffer {name} must be a CUDA tensor (call .cuda())")
            buffers[name] = tensor.contiguous()
        buffers[self.plan.output] = out if out is not None else self._empty(self.plan.output)
        arrays = {name: cupy.from_dlpack(value) for name, value in buffers.items()}
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            for launch in self.plan.launches:
                self.functions[launch.kernel](
                    launch.grid, launch.block, tuple(arrays[a] for a in launch.args), shared_mem=launch.shared_bytes
                )
        return buffers[self.plan.output]


def time_cuda(fn: Callable[[], Any], *, warmup: int = 3, number: int = 20, repeat: int = 5) -> float:
    """Median milliseconds per call of ``fn`` (``repeat`` batches of ``number`` calls, timed with CUDA events)."""
    _, torch = _cuda()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / number)
    return statistics.median(times)
