"""A network layer's glue computed inside its kernel: ``relu(out * scale[c] + shift[c] + residual)``.

In a network every convolution is followed by batch norm (in eval mode a per-channel scale and shift),
often a ReLU, and at the end of a residual block the shortcut's tensor added before the ReLU. Run as
PyTorch operators after a TVM kernel, that glue hands the cores from TVM's thread pool to PyTorch's and
back at every layer; on two cores the hand-overs cost more than the glue (``docs/network.md``).

:func:`build_fused` compiles an operator with an :class:`Epilogue`: one element-wise stage
(``epilogue``) after the operator's output, which reads the output one element per iteration, the
channel's scale and shift (output dim 1 is the channel, as in :mod:`.signature_layout`), the residual's
element at the same coordinate, and writes the kernel's result. The operator's own stages are
scheduled by the schedule given (a tuned record's, or the default schedule) exactly as they are for
the plain operator: the schedule space is the plain operator's (:class:`FusedLowered` describes the
operator's stages, only its TIR function has the epilogue too), so a record tuned for the plain kernel
applies unchanged and the task key of tuning stays the plain kernel's. Then the epilogue is folded
into the block that writes the operator's output (``reverse_compute_inline``: the write-back of a
local accumulator, or a copy's pass) and costs no pass over memory; where no such block exists (a
reduction that accumulates in place, an rfactor) it is a parallel pass of its own inside the kernel.
``block > 0`` gives the kernel a channel-blocked signature (``NCHW[b]c`` input, residual and result;
:mod:`.signature_layout`), as a network that propagates blocked activations runs it.

>>> import torch
>>> from kdsl import gallery
>>> op, layer = gallery.load("conv2d"), {"N": 1, "Cin": 8, "Cout": 8, "H": 4, "W": 4}
>>> kernel = build_fused(op, layer, Epilogue(residual=True, relu=True))
>>> kernel.folded
True
>>> x, w, res = torch.randn(1, 8, 4, 4), torch.randn(8, 8, 3, 3), torch.randn(1, 8, 4, 4)
>>> scale, shift = torch.rand(8) + 0.5, torch.randn(8)
>>> conv = torch.nn.functional.conv2d(x, w, padding=1)
>>> expected = torch.relu(conv * scale[:, None, None] + shift[:, None, None] + res)
>>> torch.allclose(kernel(x, w, scale=scale, shift=shift, residual=res), expected, atol=1e-4)
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kdsl.codegen.tvm.default_schedule import default_schedule
from kdsl.codegen.tvm.elementwise import relu
from kdsl.codegen.tvm.kernel import Kernel
from kdsl.codegen.tvm.lowering import Lowered, lower
from kdsl.codegen.tvm.machine import current_machine
from kdsl.codegen.tvm.prepack import WeightLayout, prepack_weights
from kdsl.codegen.tvm.signature_layout import CHANNEL_AXIS, block_index, blocked_shape
from kdsl.codegen.tvm.toolchain import default_target, error_reason, load_tvm
from kdsl.lang.errors import LoweringError, ShapeError
from kdsl.lang.operator import Operator

__all__ = ["EPILOGUE_STAGE", "Epilogue", "FusedKernel", "FusedLowered", "build_fused", "fold_epilogue", "lower_fused"]

#: the name of the epilogue's stage (its TIR block and its result buffer)
EPILOGUE_STAGE = "epilogue"
#: the names of the epilogue's inputs, after the operator's weights in the kernel's signature
SCALE, SHIFT, RESIDUAL = "epilogue_scale", "epilogue_shift", "epilogue_residual"


@dataclass(frozen=True)
class Epilogue:
    """What follows the operator in the kernel: always ``out * scale[c] + shift[c]`` (batch norm in eval
    mode, or a bias with ``scale = 1``), then ``+ residual`` if ``residual``, then ``relu`` if ``relu``.

    >>> Epilogue(residual=True).describe()
    'scale, shift, + residual, relu'
    """

    residual: bool = False
    relu: bool = True

    def describe(self) -> str:
        return ", ".join(["scale, shift"] + ["+ residual"] * self.residual + ["relu"] * self.relu)


@dataclass
class FusedLowered(Lowered):
    """A lowered operator with an epilogue: the operator's stages (``stages``, ``out``: what the schedule
    space and a tuned record see) and a TIR function (:meth:`prim_func`) that also has the epilogue's
    inputs and its stage, whose result is the kernel's output."""

    epilogue: Epilogue = Epilogue()
    scale: Any = None
    shift: Any = None
    residual: Any = None
    result: Any = None

    @property
    def epilogue_inputs(self) -> list[Any]:
        """The epilogue's placeholders in the kernel's order: scale, shift, then the residual if any."""
        return [self.scale, self.shift] + ([self.residual] if self.residual is not None else [])

    def prim_func(self) -> Any:
        tvm = load_tvm()
        func = tvm.te.create_prim_func([*self.inputs, *self.weights, *self.epilogue_inputs, self.result])
        return func.with_attr("global_symbol", "main")


def lower_fused(op: Operator, layer: Mapping[str, int], epilogue: Epilogue, dtype: str = "float32") -> FusedLowered:
    """``op`` lowered at ``layer`` (:func:`~kdsl.codegen.tvm.lowering.lower`) with ``epilogue`` after its
    output; a :class:`LoweringError` for an operator it cannot follow (several inputs, no channel dim)."""
    if not isinstance(epilogue, Epilogue):
        raise LoweringError(f"expected an Epilogue, got {type(epilogue).__name__}")
    tvm = load_tvm()
    plain = lower(op, layer, dtype)
    if plain.extra_inputs:
        raise LoweringError(f"an epilogue is for kernels of one data input, not {', '.join(op.input_names)}")
    shape = plain.output_shape
    if len(shape) <= CHANNEL_AXIS:
        raise LoweringError(
            f"the output has shape {shape}: an epilogue's scale and shift are per channel (output dim {CHANNEL_AXIS})"
        )
    taken = {w.name for w in op.weights} & {SCALE, SHIFT, RESIDUAL, EPILOGUE_STAGE}
    taken |= {s.name for s in plain.stages} & {EPILOGUE_STAGE}
    if taken:
        raise LoweringError(f"the operator already names {sorted(taken)}, which the epilogue needs: rename them")
    channels = shape[CHANNEL_AXIS]
    scale = tvm.te.placeholder((channels,), dtype, name=SCALE)
    shift = tvm.te.placeholder((channels,), dtype, name=SHIFT)
    residual = tvm.te.placeholder(shape, dtype, name=RESIDUAL) if epilogue.residual else None

    def element(*index: Any) -> Any:
        c = index[CHANNEL_AXIS]
        value = plain.out(*index) * scale[c] + shift[c]
        if residual is not None:
            value = value + residual(*index)
        return relu(tvm, value, dtype) if epilogue.relu else value

    result = tvm.te.compute(shape, element, name=EPILOGUE_STAGE)
    fields = {name: getattr(plain, name) for name in Lowered.__dataclass_fields__}
    return FusedLowered(**fields, epilogue=epilogue, scale=scale, shift=shift, residual=residual, result=result)


def fold_epilogue(sch: Any, lanes: int = 16) -> tuple[Any, bool]:
    """Fold the epilogue stage of a scheduled :class:`FusedLowered` program into the block that writes the
    operator's output; where TVM refuses (that block is a reduction), schedule it as a parallel,
    vectorized pass of its own instead (``lanes``: the target's vector width in elements). Returns the
    schedule (a new one after a refusal) and whether the epilogue was folded."""
    backup = sch.copy()
    try:
        sch.reverse_compute_inline(sch.get_sblock(EPILOGUE_STAGE))
        return sch, True
    except Exception:  # TVM refuses for a producer it cannot fold into: a pass of its own, only slower
        sch = backup
    loops = sch.get_loops(sch.get_sblock(EPILOGUE_STAGE))
    # the channel and the dims before it parallel; the dims after it (one contiguous run in every
    # buffer but scale and shift, which it does not index) vectorized
    outer = sch.fuse(*loops[: CHANNEL_AXIS + 1])
    sch.parallel(outer)
    inner = loops[CHANNEL_AXIS + 1 :]
    if inner:
        run = sch.fuse(*inner) if len(inner) > 1 else inner[0]
        extent = int(sch.get(run).extent)
        if extent % lanes == 0:
            sch.vectorize(sch.split(run, [None, lanes])[1])
        elif extent <= 4 * lanes:
            sch.vectorize(run)
    return sch, False


def _block_buffers(sch: Any, lowered: FusedLowered, block: int) -> None:
    """Give the kernel's data input, residual and result the channel-blocked layout (``[N, C/b, .., b]``)."""
    blocked_shape(tuple(int(d) for d in lowered.x.shape), block, "the input")
    blocked_shape(lowered.output_shape, block, "the output")
    names = [lowered.x.name, lowered.result.name] + ([lowered.residual.name] if lowered.residual is not None else [])
    found: dict[str, Any] = {}
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        node = sch.get(rv)
        for region in [*node.reads, *node.writes]:
            if region.source.name in names:
                found.setdefault(region.source.name, rv)
    missing = [name for name in names if name not in found]
    if missing:
        raise LoweringError(f"no block of the scheduled kernel accesses {', '.join(missing)}")
    try:
        for name in names:
            sch.transform_layout(found[name], name, block_index(block))
    except Exception as error:  # TVM refused the transform for this schedule
        raise LoweringError(f"cannot block the fused kernel's signature by {block}: {error_reason(error)}") from None


class FusedKernel(Kernel):
    """A compiled operator with its epilogue, forward only:
    ``kernel(x, *weights, scale=, shift=, residual=None) -> result`` on torch tensors; with ``block``,
    ``x``, ``residual`` and the result are channel-blocked (``[N, C/b, .., b]``), ``scale`` and ``shift``
    stay ``[C]``. ``folded``: whether the epilogue runs in the operator's write-back (else its own pass)."""

    def __init__(
        self,
        executable: Any,
        lowered: FusedLowered,
        schedule: Any,
        block: int,
        folded: bool,
        weight_layouts: list[WeightLayout | None] | None = None,
    ) -> None:
        super().__init__(executable, lowered, schedule, weight_layouts)
        self.epilogue, self.block, self.folded = lowered.epilogue, block, folded
        self.channels = lowered.output_shape[CHANNEL_AXIS]
        if block:
            self.input_shape = blocked_shape(self.input_shape, block, "the input")
            self.input_shapes = [self.input_shape]
            self.output_shape = blocked_shape(self.output_shape, block, "the output")

    def __call__(  # type: ignore[override]
        self, x: Any, *weights: Any, scale: Any, shift: Any, residual: Any | None = None, out: Any | None = None
    ) -> Any:
        import torch

        tensors = (x, *weights, scale, shift, residual)
        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
            raise LoweringError(
                "a kernel with an epilogue runs forward only: call it under torch.no_grad() (or detach the inputs)"
            )
        x, weights = self._tensors(x, list(weights))
        extra = [self._operand(scale, "scale", (self.channels,), x.dtype)]
        extra.append(self._operand(shift, "shift", (self.channels,), x.dtype))
        if self.epilogue.residual:
            extra.append(self._operand(residual, "residual", self.output_shape, x.dtype))
        elif residual is not None:
            raise ShapeError("this kernel's epilogue adds no residual (Epilogue(residual=False)): pass none")
        if out is not None and (
            not isinstance(out, torch.Tensor) or tuple(out.shape) != self.output_shape or out.dtype != x.dtype
        ):
            raise ShapeError(f"out must be a {self.dtype} torch tensor of shape {self.output_shape}")
        return self._forward([x], [*weights, *extra], out)

    def time(self, *args: Any, **kwargs: Any) -> list[float]:
        raise LoweringError("a kernel with an epilogue is timed by calling it (its inputs include scale and shift)")

    def export(self, path: Any) -> Any:
        raise LoweringError(
            "a kernel with an epilogue cannot be exported yet (its description would be the plain operator's)"
        )

    def _operand(self, tensor: Any, what: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """An epilogue input checked: a torch tensor of ``shape`` and the input's dtype."""
        import torch

        if not isinstance(tensor, torch.Tensor):
            raise ShapeError(
                f"the epilogue's {what} must be a torch tensor of shape {shape}, got {type(tensor).__name__}"
            )
        if tuple(tensor.shape) != shape:
            raise ShapeError(f"the epilogue's {what} has shape {tuple(tensor.shape)}, expected {shape}")
        if tensor.dtype != dtype:
            raise LoweringError(f"the epilogue's {what} has dtype {tensor.dtype}, the input {dtype}: pass one dtype")
        return tensor


def build_fused(
    op: Operator,
    layer: Mapping[str, int],
    epilogue: Epilogue,
    schedule: Callable[[Lowered], Any] | None = None,
    *,
    block: int = 0,
    dtype: str = "float32",
    prepacked_weights: bool = False,
) -> FusedKernel:
    """Compile ``op`` at ``layer`` followed by ``epilogue``; ``schedule`` schedules the operator's stages
    (a ``Lowered -> s_tir.Schedule`` function as :func:`kdsl.codegen.tvm.build` takes, e.g. a tuned
    record's, :func:`kdsl.tune.tuned.tuned_schedule`; default: the default schedule), then the
    epilogue is folded into the output's write-back (:func:`fold_epilogue`). ``block > 0``: a
    channel-blocked signature. ``prepacked_weights``: the signature takes the weights the schedule packs
    packed (:mod:`.prepack`; call with ``kernel.pack_weights(*weights)``, packed once). See the module
    docstring."""
    tvm = load_tvm()
    lowered = lower_fused(op, layer, epilogue, dtype)
    sch = schedule(lowered) if schedule is not None else default_schedule(lowered)
    sch, folded = fold_epilogue(sch, current_machine().lanes(dtype))
    if block:
        _block_buffers(sch, lowered, block)
    layouts = None
    if prepacked_weights:  # last: the packing copies read only weights, which nothing above transforms
        sch, layouts = prepack_weights(sch, lowered)
    return FusedKernel(tvm.compile(sch.mod, target=default_target()), lowered, sch, block, folded, layouts)
