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

import re
import statistics
import time
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
    "SourceBatch",
    "argument_slots",
    "batch_sources",
    "capture_graph",
    "compile_batches",
    "input_signature",
    "plan",
    "prefixed_kernels",
    "split_source",
    "time_cuda",
    "time_gpu_queue",
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
    # a kernel of several inputs lists them in its input order; a call passes them first, in that order
    if not roles["input"] or len(roles["output"]) != 1:
        raise BundleError(
            f"bundle: expected at least one input and one output buffer, got {roles['input']} and {roles['output']}"
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


_KERNEL_START = 'extern "C" __global__'


def split_source(source: str) -> tuple[str, str]:
    r"""A bundle's CUDA C as ``(preamble, kernels)``: TVM's headers, macros and helpers up to the first
    ``extern "C" __global__``, then the kernels' declarations and definitions.

    >>> split_source('#define uint unsigned int\nextern "C" __global__ void k() {}\n')
    ('#define uint unsigned int\n', 'extern "C" __global__ void k() {}\n')
    """
    index = source.find(_KERNEL_START)
    if index < 0:
        raise BundleError('bundle: the source has no extern "C" __global__ kernel')
    return source[:index], source[index:]


def prefixed_kernels(kernels: str, names: Sequence[str], prefix: str) -> str:
    """``kernels`` with every kernel name in ``names`` renamed ``prefix + name`` (whole identifiers only:
    ``main_kernel`` does not touch ``main_kernel_1``).

    >>> prefixed_kernels("void main_kernel(); void main_kernel_1();", ["main_kernel", "main_kernel_1"], "b3_")
    'void b3_main_kernel(); void b3_main_kernel_1();'
    """
    if not names:
        return kernels
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(set(names), key=len, reverse=True)) + r")\b")
    return pattern.sub(lambda m: prefix + m.group(1), kernels)


@dataclass(frozen=True)
class SourceBatch:
    """Several bundles' kernels in one CUDA source: one NVRTC compile instead of one per bundle (the
    headers TVM's preamble includes dominate a small kernel's compile time). ``prefixes[i]`` is what bundle
    ``i``'s kernel names are prefixed with in :attr:`source`."""

    source: str
    prefixes: list[str]


def batch_sources(bundles: Sequence[Mapping[str, Any]], *, tag: str = "b") -> list[tuple[list[int], SourceBatch]]:
    r"""Group ``bundles`` by their preamble and join each group's kernels into one source, every bundle's
    kernels renamed with its own prefix: ``[(indices of the bundles, batch)]``, pure (no GPU).

    >>> b = {"source": 'P\nextern "C" __global__ void main_kernel() {}', "launches": [{"kernel": "main_kernel"}]}
    >>> [(i, batch.prefixes) for i, batch in batch_sources([b, b])]
    [([0, 1], ['b0_', 'b1_'])]
    >>> print(batch_sources([b, b])[0][1].source)
    P
    extern "C" __global__ void b0_main_kernel() {}
    extern "C" __global__ void b1_main_kernel() {}
    """
    groups: dict[str, list[int]] = {}
    parts: list[str] = []
    for i, bundle in enumerate(bundles):
        preamble, kernels = split_source(bundle["source"])
        groups.setdefault(preamble, []).append(i)
        parts.append(kernels)
    out = []
    for preamble, indices in groups.items():
        prefixes = [f"{tag}{i}_" for i in indices]
        body = [
            prefixed_kernels(parts[i], [launch["kernel"] for launch in bundles[i]["launches"]], prefix).rstrip("\n")
            for i, prefix in zip(indices, prefixes)
        ]
        out.append((indices, SourceBatch(preamble + "\n".join(body) + "\n", prefixes)))
    return out


def compile_batches(
    bundles: Sequence[Mapping[str, Any]], *, size: int = 32, options: Sequence[str] = ("-std=c++17",)
) -> list[tuple[Any, str] | None]:
    """For each bundle, ``(CuPy RawModule, kernel name prefix)`` to pass to :class:`BundleKernel` as
    ``compiled``: bundles compiled ``size`` at a time in one NVRTC call. A batch that fails to compile is
    retried one bundle at a time, so one bad kernel costs only its own bundle (``None`` there)."""
    cupy, _ = _cuda()
    result: list[tuple[Any, str] | None] = [None] * len(bundles)
    for start in range(0, len(bundles), size):
        chunk = list(bundles[start : start + size])
        for indices, batch in batch_sources(chunk, tag=f"b{start}_"):
            try:
                module = cupy.RawModule(code=batch.source, backend="nvrtc", options=tuple(options))
                first = chunk[indices[0]]["launches"][0]["kernel"]
                module.get_function(batch.prefixes[0] + first)  # compiles the whole source now
                for i, prefix in zip(indices, batch.prefixes):
                    result[start + i] = (module, prefix)
            except Exception:  # a compile error in the batch: compile its bundles alone
                for i in indices:
                    try:
                        module = cupy.RawModule(code=chunk[i]["source"], backend="nvrtc", options=tuple(options))
                        module.get_function(chunk[i]["launches"][0]["kernel"])
                        result[start + i] = (module, "")
                    except Exception:  # this bundle's own error shows when BundleKernel compiles it
                        result[start + i] = None
    return result


#: torch dtype names of the bundle dtypes (what ``str(tensor.dtype)`` prints), for the cheap per-call check
_TORCH_DTYPES = {name: f"torch.{name}" for name in _DTYPES}


def argument_slots(launch_plan: LaunchPlan) -> list[tuple[int, ...]]:
    """For each launch, the position of each of its arguments in the plan's buffer order (inputs, then
    intermediates, then the output): what :class:`BundleKernel` indexes its per-call pointer list with, so
    that a call builds each launch's arguments by position instead of by name.

    >>> p = LaunchPlan(["x", "w"], ["t"], "out", {}, {}, [Launch("k0", (1, 1, 1), (32, 1, 1), ("t", "x", "w")),
    ...                                                 Launch("k1", (1, 1, 1), (32, 1, 1), ("out", "t"))])
    >>> argument_slots(p)
    [(2, 0, 1), (3, 2)]
    """
    order = {name: i for i, name in enumerate([*launch_plan.inputs, *launch_plan.intermediates, launch_plan.output])}
    return [tuple(order[arg] for arg in launch.args) for launch in launch_plan.launches]


def input_signature(launch_plan: LaunchPlan) -> tuple[tuple[tuple[int, ...], str], ...]:
    """``((shape, "torch.dtype"), ...)`` of the inputs in call order: one tuple compared per call.

    >>> input_signature(LaunchPlan(["x"], [], "y", {"x": (2, 3), "y": (6,)}, {"x": "float32", "y": "float32"}, []))
    (((2, 3), 'torch.float32'),)
    """
    return tuple((launch_plan.shapes[name], _TORCH_DTYPES[launch_plan.dtypes[name]]) for name in launch_plan.inputs)


class BundleKernel:
    """A bundle compiled for this machine's GPU: ``kernel(x, *weights) -> out`` on torch CUDA tensors.

    The launch path is planned once: the intermediates and the output are allocated at construction,
    and a call passes raw device pointers (``tensor.data_ptr()`` as ``uint64``, which CuPy hands to the
    kernel as the 8-byte pointer argument) instead of wrapping every buffer with DLPack, so that its Python
    cost stays below the GPU time of a small kernel. Inputs are checked by comparing one precomputed tuple
    of shapes and dtypes.

    The output buffer belongs to the kernel: the next call overwrites it (pass ``out=`` to write elsewhere,
    or clone the result). A kernel is not re-entrant across CUDA streams (its intermediates are shared).

    ``graph=True`` captures the launches of a call in a CUDA graph (``torch.cuda.CUDAGraph``, CuPy launching
    on torch's capture stream) the first time it sees a set of buffer addresses, and replays it for later
    calls with the same addresses: one launch of the driver per call instead of one per kernel.

    ``modules`` is a cache of compiled sources shared between kernels (bundles of one operator often share
    their CUDA source; NVRTC then compiles it once); ``compiled`` is a module already compiled with other
    bundles and this bundle's kernel name prefix (:func:`compile_batches`)."""

    def __init__(
        self,
        bundle: Mapping[str, Any],
        *,
        options: Sequence[str] = ("-std=c++17",),
        graph: bool = False,
        modules: dict[str, Any] | None = None,
        compiled: tuple[Any, str] | None = None,
    ) -> None:
        self.plan = plan(bundle)
        cupy, torch = _cuda()
        self._cupy, self._torch = cupy, torch
        prefix = ""
        if compiled is not None:  # compiled with other bundles (compile_batches): its kernels carry a prefix
            self.module, prefix = compiled
        else:
            key = bundle["source"] + "\0" + " ".join(options)
            cache = modules if modules is not None else {}
            if key not in cache:
                cache[key] = cupy.RawModule(code=bundle["source"], backend="nvrtc", options=tuple(options))
            self.module = cache[key]
        self.functions = {
            launch.kernel: self.module.get_function(prefix + launch.kernel) for launch in self.plan.launches
        }
        self.graph = graph
        self._signature = input_signature(self.plan)
        self._scratch = [self._empty(name) for name in self.plan.intermediates]
        self._output = self._empty(self.plan.output)
        # the pointers of the buffers the kernel owns, as kernel arguments, made once
        self._owned = [cupy.uint64(t.data_ptr()) for t in self._scratch]
        self._steps = [
            (self.functions[launch.kernel], launch.grid, launch.block, slots, launch.shared_bytes)
            for launch, slots in zip(self.plan.launches, argument_slots(self.plan))
        ]
        self._streams: dict[int, Any] = {}
        self._graphs: dict[tuple[int, ...], Any] = {}

    def _empty(self, name: str) -> Any:
        torch = self._torch
        return torch.empty(self.plan.shapes[name], dtype=getattr(torch, self.plan.dtypes[name]), device="cuda")

    def _check(self, tensors: tuple[Any, ...]) -> list[Any]:
        """The inputs as contiguous CUDA tensors, or a :class:`BundleError` naming the first that does not fit."""
        got = tuple((tuple(t.shape), str(t.dtype)) for t in tensors)
        if got != self._signature:
            if len(tensors) != len(self.plan.inputs):
                raise BundleError(
                    f"expected {len(self.plan.inputs)} tensors ({', '.join(self.plan.inputs)}), got {len(tensors)}"
                )
            for name, have, want in zip(self.plan.inputs, got, self._signature):
                if have != want:
                    raise BundleError(f"buffer {name}: got {have[0]} {have[1]}, expected {want[0]} {want[1]}")
        out = []
        for name, tensor in zip(self.plan.inputs, tensors):
            if not tensor.is_cuda:
                raise BundleError(f"buffer {name} must be a CUDA tensor (call .cuda())")
            out.append(tensor if tensor.is_contiguous() else tensor.contiguous())
        return out

    def _launch(self, pointers: list[Any], stream: int) -> None:
        """Every launch in order on CUDA stream ``stream`` (torch's current one)."""
        cupy = self._cupy
        if stream == 0 and cupy.cuda.get_current_stream().ptr == 0:
            self._launch_all(pointers)  # both on the legacy default stream: no stream switch to pay for
            return
        external = self._streams.get(stream)
        if external is None:
            external = self._streams[stream] = cupy.cuda.ExternalStream(stream)
        with external:
            self._launch_all(pointers)

    def _launch_all(self, pointers: list[Any]) -> None:
        for function, grid, block, slots, shared in self._steps:
            function(grid, block, tuple(pointers[i] for i in slots), shared_mem=shared)

    def __call__(self, *tensors: Any, out: Any | None = None) -> Any:
        """Run every launch in order on ``tensors`` (the data inputs in order, then the weights); returns the
        output."""
        torch, cupy = self._torch, self._cupy
        inputs = self._check(tensors)
        result = self._output if out is None else out
        addresses = [t.data_ptr() for t in inputs]
        pointers = [*map(cupy.uint64, addresses), *self._owned, cupy.uint64(result.data_ptr())]
        if not self.graph:
            self._launch(pointers, torch.cuda.current_stream().cuda_stream)
            return result
        key = (*addresses, result.data_ptr())
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._capture(pointers)
        graph.replay()
        return result

    def _capture(self, pointers: list[Any]) -> Any:
        """A CUDA graph of one call's launches at these buffer addresses (the kernels were compiled at
        construction, so nothing in the capture allocates or synchronizes)."""
        torch = self._torch
        if len(self._graphs) >= 8:  # addresses churn (fresh tensors per call): keep the newest few
            self._graphs.pop(next(iter(self._graphs)))
        self._launch(pointers, torch.cuda.current_stream().cuda_stream)  # warm: module loads happen outside
        torch.cuda.synchronize()
        return capture_graph(lambda: self._launch(pointers, torch.cuda.current_stream().cuda_stream))


def time_cuda(
    fn: Callable[[], Any], *, warmup: int = 3, number: int = 20, repeat: int = 5, gpu_only: bool = False
) -> float:
    """Median milliseconds per call of ``fn`` (``repeat`` batches of ``number`` calls, timed with CUDA events).

    By default this is the time *per call*: the calls are issued back to back from Python, so a call whose
    host cost (Python, argument packing, launch) exceeds its GPU time measures the host. ``gpu_only=True``
    measures the GPU: ``number`` calls are captured once in a CUDA graph and the graph's replays are timed,
    so the queue never waits for Python; a ``fn`` that cannot be captured (it synchronizes, allocates
    outside torch, copies to the host) falls back to :func:`time_gpu_queue`."""
    _, torch = _cuda()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if gpu_only:
        graph = _capture_calls(fn, number)
        if graph is None:
            return time_gpu_queue(fn, repeat=repeat)
        return _median_ms(graph.replay, 1, repeat) / number
    return _median_ms(fn, number, repeat)


def _median_ms(fn: Callable[[], Any], number: int, repeat: int, before: Callable[[], Any] | None = None) -> float:
    """Median milliseconds per call over ``repeat`` batches of ``number`` calls between two CUDA events;
    ``before`` is enqueued ahead of each batch, outside the events (a GPU-side sleep, say)."""
    _, torch = _cuda()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if before is not None:
            before()
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / number)
    return statistics.median(times)


def _capture_calls(fn: Callable[[], Any], number: int) -> Any | None:
    """A CUDA graph of ``number`` calls of ``fn``, or None when ``fn`` cannot be captured."""
    _, torch = _cuda()

    def calls() -> None:
        for _ in range(number):
            fn()

    try:
        graph = capture_graph(calls)
        graph.replay()
        torch.cuda.synchronize()
    except Exception:  # capture refused (a sync, a host copy, an uncapturable library call): the caller falls back
        torch.cuda.synchronize()
        return None
    return graph


_CAPTURE_STREAM: list[Any] = []  # one side stream for every capture, made on first use


def capture_graph(body: Callable[[], None]) -> Any:
    """A ``torch.cuda.CUDAGraph`` of what ``body`` enqueues on torch's current stream, captured on a side
    stream. ``torch.cuda.graph`` would do the same but also runs ``gc.collect()`` and empties the caching
    allocator at every capture: tens of milliseconds, hundreds of times in a GPU check."""
    _, torch = _cuda()
    if not _CAPTURE_STREAM:
        _CAPTURE_STREAM.append(torch.cuda.Stream())
    stream = _CAPTURE_STREAM[0]
    graph = torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            body()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


def time_gpu_queue(fn: Callable[[], Any], *, repeat: int = 5, target_ms: float = 2.0) -> float:
    """GPU milliseconds per call without a graph: each batch of calls is queued behind a GPU-side sleep
    (``torch.cuda._sleep``) that lasts longer than the host takes to issue the batch, so the events around
    the batch time the GPU's work, not the host's. A batch is sized to about ``target_ms`` of GPU work."""
    _, torch = _cuda()
    number, issue_s = 20, 0.0
    for _ in range(2):  # estimates of the GPU time and the host time per call, then the batch size
        host = time.perf_counter()
        per_call = _median_ms(fn, number, 1)
        issue_s = (time.perf_counter() - host) / number
        number = max(20, min(2000, int(target_ms / max(per_call, 1e-4))))
    # cycles of the sleep: twice the host's issue time at 2 GHz (about the clock of current data-centre GPUs)
    cycles = int(2 * issue_s * number * 2e9)
    return _median_ms(fn, number, repeat, before=lambda: torch.cuda._sleep(cycles))
