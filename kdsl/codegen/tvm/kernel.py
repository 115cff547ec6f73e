"""Compiled TVM kernels: an operator lowered (:mod:`.lowering`), scheduled (:mod:`.default_schedule`
or a function of the caller's), compiled, and called on torch tensors through DLPack. A call takes
part in autograd when an input requires grad: forward by TVM, backward by the PyTorch lowering's
vector-Jacobian product (see :func:`_autograd_function`).

>>> import numpy as np, torch
>>> from kdsl.lang import *
>>> N, C, L = primary("N C L"); K = coefficient("K")
>>> op = Input(N, C, L) >> Unfold(L, K, "k") >> Share(Weight("k", name="w")) >> Reduce("k") >> Output(N, C, L)
>>> kernel = build(op, {"N": 1, "C": 1, "L": 4, "K": 3})
>>> kernel(torch.tensor([[[1.0, 2.0, 3.0, 4.0]]]), torch.tensor([1.0, 0.0, 0.0])).tolist()
[[[0.0, 1.0, 2.0, 3.0]]]
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from kdsl.codegen.torch import build as build_torch
from kdsl.codegen.torch import load_torch
from kdsl.codegen.tvm.cuda import cuda_source, cuda_target, schedule_verified
from kdsl.codegen.tvm.default_schedule import default_schedule
from kdsl.codegen.tvm.lowering import Lowered, lower
from kdsl.codegen.tvm.prepack import WeightLayout, pack_weights, prepack_weights
from kdsl.codegen.tvm.toolchain import default_target, load_tvm
from kdsl.lang.errors import KdslError, LoweringError, ShapeError
from kdsl.lang.operator import Operator
from kdsl.lang.parser import parse
from kdsl.runtime.gpu import from_arch
from kdsl.solve.constraints import pad_binding
from kdsl.solve.padding import Padding

#: The version of the description :func:`write_description` writes beside a kernel's library: 1 for a
#: kernel that takes its weights as the operator has them, 2 when the description carries the packed
#: layouts of a kernel with prepacked weights (an older kdsl refuses it rather than call it with unpacked
#: weights).
DESCRIPTION_VERSION = 1
PREPACKED_DESCRIPTION_VERSION = 2

#: TVM assumes its buffers start at this byte alignment and emits aligned vector loads and stores
#: (a misaligned AVX-512 access segfaults); torch's allocator aligns to 64, torch.from_numpy may not.
ALIGNMENT = 64


#: while true (:func:`outputs_filled_with_nan`), a kernel call that allocates its output fills it with NaN
_NAN_OUTPUTS: contextvars.ContextVar[bool] = contextvars.ContextVar("kdsl_nan_outputs", default=False)


@contextlib.contextmanager
def outputs_filled_with_nan() -> Iterator[None]:
    """Within it, every kernel call that allocates its output (no ``out=``) starts from NaN instead of
    whatever the allocator's memory held, so an element the kernel never writes shows as NaN in a check
    rather than as a value left there by an earlier call (a right one, when the same memory held the same
    tensor). For checks: the fill costs a pass over the output.

    >>> import torch
    >>> from kdsl import gallery
    >>> kernel = build(gallery.load("matmul"), {"M": 2, "Cin": 3, "Cout": 4})
    >>> with outputs_filled_with_nan():
    ...     bool(torch.isnan(kernel(torch.ones(2, 3), torch.ones(3, 4))).any())
    False
    """
    token = _NAN_OUTPUTS.set(True)
    try:
        yield
    finally:
        _NAN_OUTPUTS.reset(token)


def _aligned(tensor: Any) -> Any:
    """``tensor``, or an aligned copy when its data does not start on an :data:`ALIGNMENT` boundary."""
    return tensor if tensor.data_ptr() % ALIGNMENT == 0 else tensor.clone()


def _call_arguments(inputs: int, x: Any, weights: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
    """A call's first argument and weights in the kernel's own shape (the inputs one by one, then the
    weights one by one) from either shape :func:`kdsl.codegen.reference.run` takes too: the inputs
    of several as one tuple first, the weights as one list."""
    if weights and isinstance(weights[-1], (tuple, list)):  # kernel(x, [w]), kernel(a, b, [w])
        weights = (*weights[:-1], *weights[-1])
    if inputs > 1 and isinstance(x, (tuple, list)):
        x, weights = x[0], (*x[1:], *weights)
    return x, weights


class Kernel:
    """A compiled operator: ``kernel(x, *weights) -> out`` on torch tensors (zero-copy via DLPack); a
    kernel of several inputs takes them first, in its input order: ``kernel(q, k, *weights)``.

    ``weight_layouts``: per weight, the packed layout its signature takes (:mod:`.prepack`; ``None``:
    the operator's own); such a kernel is called with :meth:`pack_weights`'s tensors and runs forward only."""

    def __init__(
        self,
        executable: Any,
        lowered: Lowered,
        schedule: Any | None,
        weight_layouts: Sequence[WeightLayout | None] | None = None,
    ) -> None:
        self.executable = executable
        self.lowered = lowered
        self.schedule = schedule
        self.input_shapes = [tuple(int(d) for d in t.shape) for t in lowered.inputs]
        self.input_shape = self.input_shapes[0]
        self.weight_layouts: list[WeightLayout | None] = (
            list(weight_layouts) if weight_layouts is not None else [None] * len(lowered.weights)
        )
        self.weight_shapes = [
            tuple(int(d) for d in w.shape) if layout is None else layout.packed_shape
            for w, layout in zip(lowered.weights, self.weight_layouts)
        ]
        self.output_shape = lowered.output_shape

    @property
    def prepacked(self) -> bool:
        """Whether the signature takes any weight packed (:meth:`pack_weights` makes them)."""
        return any(layout is not None for layout in self.weight_layouts)

    def pack_weights(self, *weights: Any) -> list[Any]:
        """The weights as this kernel's signature takes them: each one whose layout the schedule packs,
        packed once (a new tensor), the others as they are (:func:`.prepack.pack_weights`); the weights
        may also come as one list. Call it once per set of weights, not per call."""
        if len(weights) == 1 and isinstance(weights[0], (tuple, list)):
            weights = tuple(weights[0])
        return pack_weights(self.weight_layouts, weights)

    @property
    def dtype(self) -> str:
        """The element type the kernel was compiled for (its inputs must have it)."""
        return str(self.lowered.x.dtype)

    def _split(self, tensors: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """A call's positional tensors as (the inputs, the weights)."""
        count = len(self.input_shapes)
        if len(tensors) < count:
            names = ", ".join(self.lowered.op.input_names)
            raise ShapeError(
                f"the kernel takes {count} inputs ({names}) before its weights, got {len(tensors)} tensors"
            )
        return list(tensors[:count]), list(tensors[count:])

    def _inputs(self, xs: Sequence[Any], weights: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """Every input and the weights as torch tensors, checked (:meth:`_tensors`)."""
        names = self.lowered.op.input_names
        checked, checked_weights = [], []
        for position, (x, shape) in enumerate(zip(xs, self.input_shapes)):
            what = "" if len(names) == 1 else f"{names[position]}: "
            try:
                tensor, found = self._tensors(x, weights, shape, weighted=position == 0)
                checked_weights = found if position == 0 else checked_weights
            except KdslError as error:
                raise type(error)(what + str(error)) from None
            checked.append(tensor)
        for x in checked[1:]:
            if x.dtype != checked[0].dtype:
                raise LoweringError(f"the inputs have dtypes {[str(t.dtype) for t in checked]}; pass one dtype")
        return checked, checked_weights

    def _tensors(
        self, x: Any, weights: Sequence[Any], input_shape: tuple[int, ...] | None = None, weighted: bool = True
    ) -> tuple[Any, list[Any]]:
        """``x`` and ``weights`` as torch tensors, checked the way the reference interpreter checks its
        arrays (the same :class:`KdslError` subclasses), so that no bad input reaches TVM's own checks."""
        import numpy as np
        import torch

        input_shape = self.input_shape if input_shape is None else input_shape

        def tensor(value: Any, what: str) -> Any:
            if isinstance(value, np.ndarray):
                return torch.from_numpy(value)
            if not isinstance(value, torch.Tensor):
                raise ShapeError(f"{what} must be a torch tensor or a NumPy array, got {type(value).__name__}")
            return value

        x = tensor(x, "the input x")
        if tuple(x.shape) != input_shape:
            raise ShapeError(f"the input has shape {tuple(x.shape)}, expected {input_shape}")
        if not (x.dtype.is_floating_point or x.dtype.is_complex):
            raise LoweringError(
                f"the input x has dtype {x.dtype}; pass a floating tensor, e.g. x.to(torch.{self.dtype})"
            )
        if str(x.dtype).removeprefix("torch.") != self.dtype:
            # TVM would refuse it with a TypeError; a silent cast would change the precision
            raise LoweringError(
                f"the input x has dtype {x.dtype} but this kernel was compiled for {self.dtype}: "
                f"pass x.to(torch.{self.dtype}) or build with dtype={str(x.dtype).removeprefix('torch.')!r}"
            )
        if not weighted:
            return x, []  # another input of several: the weights are checked with the first
        if len(weights) != len(self.weight_shapes):
            raise ShapeError(f"expected {len(self.weight_shapes)} weights, got {len(weights)}")
        checked = []
        for weight, shape, spec in zip(weights, self.weight_shapes, self.lowered.op.weights):
            weight = tensor(weight, f"the weight {spec.name}")
            if tuple(weight.shape) != shape:
                layout = self.weight_layouts[len(checked)]
                hint = "" if layout is None else " (packed: this kernel takes kernel.pack_weights(...)'s weights)"
                raise ShapeError(f"weight {spec.name} has shape {tuple(weight.shape)}, expected {shape}{hint}")
            checked.append(weight)
        return x, checked

    def __call__(self, x: Any, *weights: Any, out: Any | None = None) -> Any:
        """``out = op(x, *weights)``. Differentiable: when grad mode is on and ``x`` or a weight
        requires grad, the result takes part in autograd (see :func:`_autograd_function`).

        The call shapes :func:`kdsl.codegen.reference.run` takes work too: the weights as one list,
        ``kernel(x, [w])``, and the inputs of a kernel of several as one tuple, ``kernel((a, b), w)``."""
        import torch

        x, weights = _call_arguments(len(self.input_shapes), x, weights)

        if len(self.input_shapes) == 1:
            x, weights = self._tensors(x, weights)
            xs = [x]
        else:
            xs, weights = self._inputs(*self._split((x, *weights)))
            x = xs[0]
        if out is not None and (
            not isinstance(out, torch.Tensor) or tuple(out.shape) != self.output_shape or out.dtype != x.dtype
        ):
            raise ShapeError(f"out must be a {self.dtype} torch tensor of shape {self.output_shape}")
        if torch.is_grad_enabled() and any(t.requires_grad for t in [*xs, *weights]):
            if self.prepacked:
                raise LoweringError(
                    "a kernel with prepacked weights runs forward only (its backward pass would need the "
                    "weights in the operator's layout): call it under torch.no_grad() (or detach the inputs)"
                )
            if out is not None:
                raise LoweringError("out= writes in place and cannot take part in autograd: call without out=")
            return _autograd_function().apply(self, *xs, *weights)
        return self._forward(xs, weights, out)

    def _forward(self, xs: Any, weights: Sequence[Any], out: Any | None = None) -> Any:
        import torch

        xs = list(xs) if isinstance(xs, (list, tuple)) else [xs]
        dtype = xs[0].dtype
        inputs = [_aligned(x.contiguous()).detach() for x in xs]
        args = [_aligned(w.detach().to(dtype).contiguous()) for w in weights]
        result = torch.empty(self.output_shape, dtype=dtype) if out is None else _aligned(out)
        if out is None and _NAN_OUTPUTS.get():
            result.fill_(float("nan"))
        self.executable(*inputs, *args, result)
        if out is not None and result is not out:
            out.copy_(result)
            return out
        return result

    def time(self, x: Any, *weights: Any, number: int = 10, repeat: int = 5) -> list[float]:
        """Seconds per call, ``repeat`` medians of ``number`` calls (TVM's time_evaluator)."""
        import torch

        tvm = load_tvm()
        # several inputs come first among the tensors, as a call takes them
        args = [_aligned(t.contiguous()) for t in (x, *weights)]
        out = torch.empty(self.output_shape, dtype=x.dtype)
        timer = self.executable.mod.time_evaluator("main", tvm.cpu(0), number=number, repeat=repeat)
        return list(timer(*[tvm.runtime.from_dlpack(a.detach()) for a in args], tvm.runtime.from_dlpack(out)).results)

    def export(self, path: str | os.PathLike[str]) -> Path:
        """Write the compiled kernel as a shared library at ``path`` and its description beside it
        (:func:`description_path`, with the packed weights' layouts of a prepacked kernel): :func:`load`
        makes it a :class:`Kernel` again."""
        self.executable.export_library(str(path))
        layouts = self.weight_layouts if self.prepacked else None
        return write_description(path, self.lowered.op, self.lowered.binding, self.dtype, layouts)

    def torch_module(self) -> Any:
        """The PyTorch lowering of the same operator at the same binding and dtype (built once): what
        the backward pass differentiates."""
        module = self.__dict__.get("_torch_module")
        if module is None:
            torch = load_torch()
            module = build_torch(self.lowered.op, self.lowered.binding).to(getattr(torch, self.dtype))
            self.__dict__["_torch_module"] = module
        return module


@lru_cache(maxsize=1)
def _autograd_function() -> Any:
    """The ``torch.autograd.Function`` behind a differentiable kernel call.

    Forward runs the compiled TVM kernel. Backward is the vector-Jacobian product of the PyTorch
    lowering of the same operator (:func:`kdsl.codegen.torch.build`, same binding and dtype),
    re-run on the saved input and weights: the operator is linear in ``x`` and multilinear in its
    weights, so its gradients are plain einsums that torch's autograd already derives, and the
    two lowerings compute the same function (the property tests hold them to the reference).
    """
    torch = load_torch()

    class KernelFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, kernel: Kernel, *tensors: Any) -> Any:
            # tensors: the inputs (one, or several in the kernel's order), then the weights
            ctx.kernel = kernel
            ctx.save_for_backward(*tensors)
            count = len(kernel.input_shapes)
            return kernel._forward([t.detach() for t in tensors[:count]], [w.detach() for w in tensors[count:]])

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            tensors = ctx.saved_tensors
            count = len(ctx.kernel.input_shapes)
            module = ctx.kernel.torch_module()
            needs = ctx.needs_input_grad[1:]
            dtype = tensors[0].dtype
            with torch.enable_grad():
                leaves = [t.detach().to(dtype).requires_grad_(need) for t, need in zip(tensors, needs)]
                names = [name for name, _ in module.named_parameters()][: len(tensors) - count]
                y = torch.func.functional_call(module, dict(zip(names, leaves[count:])), tuple(leaves[:count]))
                wanted = [leaf for leaf in leaves if leaf.requires_grad]
                grads = iter(torch.autograd.grad(y, wanted, grad) if wanted else ())
            return (None, *(next(grads).to(t.dtype) if need else None for t, need in zip(tensors, needs)))

    return KernelFunction


class PaddedKernel:
    """A kernel compiled at a padded binding (:mod:`kdsl.solve.padding`), called at the layer's own
    shapes: ``kernel(x, *weights) -> out`` zero-pads ``x`` at the end of each padded dim on the host
    (``F.pad``), runs the compiled kernel (:attr:`kernel`, the operator at the padded sizes) and
    crops each output dim to the elements it keeps. ``weights`` have the padded shapes.

    The padding is done on the host rather than as a stage inside the kernel so that the compiled
    kernel is exactly the operator at the padded binding: the schedule space, the default schedule
    and the tuners' records apply to it unchanged, and the unpadded lowering stays as it is. The
    cost is one copy of the input (and of the cropped output) per call.
    """

    def __init__(self, kernel: Kernel, padding: Padding) -> None:
        self.kernel = kernel
        self.padding = padding
        self.input_shape = padding.input_shape
        self.weight_shapes = kernel.weight_shapes
        self.output_shape = padding.output_shape
        self.pack_weights = kernel.pack_weights  # the compiled kernel's layouts (of the padded weights)

    @property
    def dtype(self) -> str:
        return self.kernel.dtype

    @property
    def lowered(self) -> Lowered:
        return self.kernel.lowered

    @property
    def schedule(self) -> Any | None:
        return self.kernel.schedule

    def __call__(self, x: Any, *weights: Any, out: Any | None = None) -> Any:
        import numpy as np
        import torch
        import torch.nn.functional as F

        x, weights = _call_arguments(1, x, weights)
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(x)
        if not isinstance(x, torch.Tensor):
            raise ShapeError(f"the input x must be a torch tensor or a NumPy array, got {type(x).__name__}")
        if tuple(x.shape) != self.input_shape:
            raise ShapeError(f"the input has shape {tuple(x.shape)}, expected {self.input_shape}")
        if out is not None and (
            not isinstance(out, torch.Tensor) or tuple(out.shape) != self.output_shape or out.dtype != x.dtype
        ):
            raise ShapeError(f"out must be a {self.dtype} torch tensor of shape {self.output_shape}")
        # F.pad takes (left, right) pairs from the last dim backwards
        pads = [amount for d in reversed(self.padding.inputs) for amount in (0, d.amount)]
        padded = F.pad(x, pads) if any(pads) else x
        result = self.kernel(padded, *weights)
        cropped = result[tuple(slice(0, d.original) for d in self.padding.outputs)]
        if out is not None:
            return out.copy_(cropped)
        return cropped.contiguous()


def build(
    op: Operator,
    layer: Mapping[str, int],
    target: Any | None = None,
    *,
    dtype: str = "float32",
    schedule: str | Callable[[Lowered], Any] | None = "default",
    pad: bool = False,
    arch: str = "sm_90",
    prepacked_weights: bool = False,
) -> Kernel | PaddedKernel:
    """Compile ``op`` (an operator or a branching kernel) at the sizes of ``layer``; ``schedule`` is
    ``"default"`` (derived from the operator's structure), ``None`` (unscheduled), or a function
    ``Lowered -> s_tir.Schedule``. ``target="cuda"`` compiles for the GPU ``arch`` with the default GPU
    schedule (:mod:`.gpu_schedule`; running it needs TVM's CUDA runtime and a GPU; see
    :func:`.cuda.cuda_bundle` for kernels that run without TVM).

    With ``pad=True`` a size that does not divide the layer is padded (:mod:`kdsl.solve.padding`):
    the result is a :class:`PaddedKernel`, compiled at the padded sizes and called at the layer's.

    With ``prepacked_weights=True`` (CPU) each weight that the schedule packs in a copy of its own
    (``layout.<weight>.*``) is taken packed by the signature instead and the copy is removed
    (:mod:`.prepack`): pack the weights once with ``kernel.pack_weights(*weights)`` and call
    ``kernel(x, *packed)``; the kernel runs forward only.

    >>> import torch
    >>> from kdsl.lang import *
    >>> L = primary("L"); s = coefficient("s")
    >>> strided = Input(L) >> Unfold(L, 3, "k") >> Stride(L, s) >> Reduce("k") >> Output("L", defaults={"s": 2})
    >>> padded = build(strided, {"L": 5}, pad=True)
    >>> padded(torch.arange(1.0, 6.0)).tolist()
    [3.0, 9.0, 9.0]
    >>> padded.kernel.input_shape
    (6,)
    """
    if pad:
        if len(op.input_nodes) > 1:
            raise LoweringError(
                f"padding (pad=True) is not supported for a kernel of several inputs ({', '.join(op.input_names)}) "
                f"yet; pass sizes that divide"
            )
        padding = pad_binding(op, layer)
        kernel = build(
            op, padding.padded_binding, target, dtype=dtype, schedule=schedule, prepacked_weights=prepacked_weights
        )
        return PaddedKernel(kernel, padding)
    tvm = load_tvm()
    lowered = lower(op, layer, dtype)
    if isinstance(target, str) and target == "cuda":
        if prepacked_weights:
            raise LoweringError("prepacked_weights=True is for CPU kernels: the GPU schedule packs no weights")
        gpu_target = cuda_target(arch)
        sch, *_ = schedule_verified(lowered, from_arch(arch), target=gpu_target)
        return Kernel(tvm.compile(sch.mod, target=gpu_target), lowered, sch)
    module = lowered.module()
    sch = None
    if schedule == "default":
        sch = default_schedule(lowered)
        module = sch.mod
    elif callable(schedule):
        sch = schedule(lowered)
        module = sch.mod
    elif schedule is not None:
        raise LoweringError(f"unknown schedule {schedule!r}; use 'default', None or a function")
    layouts = None
    if prepacked_weights and sch is not None:  # unscheduled, a kernel packs nothing: its signature stays
        sch, layouts = prepack_weights(sch, lowered)
        module = sch.mod
    executable = tvm.compile(module, target=target or default_target())
    return Kernel(executable, lowered, sch, layouts)


def source(
    op: Operator,
    layer: Mapping[str, int],
    *,
    scheduled: bool = False,
    target: str = "llvm",
    arch: str = "sm_90",
) -> str:
    """TVMScript text of the lowered operator (before scheduling unless ``scheduled``); with
    ``target="cuda"``, the CUDA C of the default GPU schedule for ``arch`` (:func:`.cuda.cuda_source`)."""
    if target == "cuda":
        return cuda_source(op, layer, arch=arch)
    if target != "llvm":
        raise LoweringError(f"unknown target {target!r} for kernel source; use 'llvm' or 'cuda'")
    lowered = lower(op, layer)
    if scheduled:
        return default_schedule(lowered).mod.script()
    return lowered.module().script()


def description_path(path: str | os.PathLike[str]) -> Path:
    """Where the description of the kernel library at ``path`` is kept: ``kernel.so`` ->
    ``kernel.so.json``."""
    return Path(f"{os.fspath(path)}.json")


def write_description(
    path: str | os.PathLike[str],
    op: Operator,
    layer: Mapping[str, int],
    dtype: str,
    weight_layouts: Sequence[WeightLayout | None] | None = None,
) -> Path:
    """Write beside the kernel library at ``path`` what :func:`load` needs to call it: the operator's
    DSL text, its binding and the dtype (a library holds only machine code: not which tensors its
    ``main`` takes), and for a kernel with prepacked weights each weight's packed layout (``None``: taken
    as it is). Returns ``path``."""
    binding = {name: int(value) for name, value in dict(layer).items() if value is not None}
    text: dict[str, Any] = {"kdsl_kernel": DESCRIPTION_VERSION, "operator": op.to_dsl(), "binding": binding}
    text["dtype"] = dtype
    if weight_layouts is not None and any(layout is not None for layout in weight_layouts):
        text["kdsl_kernel"] = PREPACKED_DESCRIPTION_VERSION
        text["weight_layouts"] = [None if layout is None else layout.to_json() for layout in weight_layouts]
    description_path(path).write_text(json.dumps(text, indent=1) + "\n", encoding="utf-8")
    return Path(path)


def _described_layouts(described: Path, text: Mapping[str, Any], lowered: Lowered) -> list[WeightLayout | None]:
    """The packed weight layouts a description carries (none for version 1), each checked against the
    weight of the operator it packs."""
    entries = text.get("weight_layouts")
    if text["kdsl_kernel"] == DESCRIPTION_VERSION:
        return [None] * len(lowered.weights)
    if not isinstance(entries, list) or len(entries) != len(lowered.weights):
        raise LoweringError(
            f"{described} describes a kernel with prepacked weights but gives no layout for each of its "
            f"{len(lowered.weights)} weights"
        )
    layouts: list[WeightLayout | None] = []
    for weight, entry in zip(lowered.weights, entries):
        layout = None if entry is None else WeightLayout.from_json(entry)
        shape = tuple(int(d) for d in weight.shape)
        if layout is not None and layout.shape != shape:
            raise LoweringError(
                f"{described}: the packed layout of weight {weight.name} packs shape {layout.shape}, but the "
                f"operator's weight has shape {shape}"
            )
        layouts.append(layout)
    return layouts


class _Library:
    """A loaded kernel library as :class:`Kernel` calls its executable: ``library(*tensors)`` runs
    ``main``; ``.mod`` is the runtime module (for ``time_evaluator``)."""

    def __init__(self, module: Any) -> None:
        self.mod = module
        self.main = module["main"]

    def __call__(self, *tensors: Any) -> Any:
        return self.main(*tensors)

    def export_library(self, path: str) -> None:
        self.mod.export_library(path)


def load(
    path: str | os.PathLike[str],
    op: Operator | None = None,
    layer: Mapping[str, int] | None = None,
    *,
    dtype: str | None = None,
) -> Kernel:
    """The kernel in the shared library at ``path`` (what ``kdsl tune OP --apply --out FILE.so``,
    :func:`kdsl.tune.export` and :meth:`Kernel.export` write) as a :class:`Kernel`: called like the
    one :func:`build` returns, ``kernel(x, *weights, out=None) -> out`` on torch tensors (inputs
    checked, output allocated, autograd through the PyTorch lowering). What it computes is read from
    the description written beside the library (``FILE.so.json``); for a library without one, pass
    the operator and the layer (and ``dtype`` when it is not float32) it was compiled for. A kernel
    with prepacked weights (``build(..., prepacked_weights=True)``) keeps its weights' packed layouts in
    its description: load it without ``op`` and ``layer``, then call it with :meth:`Kernel.pack_weights`'s
    tensors.

    An example (not a doctest: it compiles)::

        import torch
        from kdsl import gallery
        from kdsl.codegen import tvm as kdsl_tvm

        op, layer = gallery.load("conv2d"), {"N": 1, "Cin": 8, "Cout": 16, "H": 14, "W": 14}
        kdsl_tvm.build(op, layer).export("conv2d.so")  # or: kdsl tune conv2d --layers ... --apply --out conv2d.so
        kernel = kdsl_tvm.load("conv2d.so")
        out = kernel(torch.randn(1, 8, 14, 14), torch.randn(16, 8, 3, 3))  # x, then the weights
    """
    file = Path(path)
    if not file.is_file():
        raise LoweringError(f"no kernel library at {file}; write one with kdsl tune OP --apply --out {file.name}")
    described = description_path(file)
    text: dict[str, Any] | None = None  # the description, when one was read
    if op is None or layer is None:
        if not described.is_file():
            raise LoweringError(
                f"{file} has no description beside it ({described.name}, which kdsl tune --apply --out and "
                f"Kernel.export write): pass the operator and layer it was compiled for, load(path, op, layer)"
            )
        try:
            text = json.loads(described.read_text(encoding="utf-8"))
            version, source, binding = text["kdsl_kernel"], text["operator"], text["binding"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise LoweringError(f"{described} is no kernel description kdsl wrote ({error})") from None
        if version not in (DESCRIPTION_VERSION, PREPACKED_DESCRIPTION_VERSION):
            raise LoweringError(
                f"{described} has description version {version}; this kdsl reads {DESCRIPTION_VERSION} and "
                f"{PREPACKED_DESCRIPTION_VERSION}"
            )
        op = parse(source) if op is None else op
        layer = binding if layer is None else layer
        dtype = dtype or text.get("dtype")
    lowered = lower(op, layer, dtype or "float32")
    layouts = _described_layouts(described, text, lowered) if text is not None else None
    try:
        module = load_tvm().runtime.load_module(str(file))
    except Exception as error:  # TVM raises its own error types for a file that is no library
        raise LoweringError(f"TVM cannot load {file} as a kernel library: {error}") from None
    return Kernel(_Library(module), lowered, None, layouts)
