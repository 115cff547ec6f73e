"""Kernels whose data input and output are channel-blocked tensors (``NCHW[b]c``): what lets consecutive
kernels of a network pass activations in the layout they compute in, with no transform between them
(ALT's layout propagation, §4.2).

The schedule space packs tensors *inside* a kernel (``cache_read`` + ``transform_layout``: the signature
stays, every call pays the packing). :func:`block_signature` instead transforms the function's own
input and output buffers, after the schedule is applied: the kernel then reads a tensor of shape
``[N, C/b, H, W, b]`` (channel ``c`` of the plain tensor at ``[c // b, ..., c % b]``) and writes its
output the same way. Only buffer indices change, never the loops, so the schedule's tiling stays as
tuned and the kernel computes exactly what the plain one does. Weights keep their layout (the schedule
packs them in the kernel, or with ``prepacked_weights=True`` the caller, once: :mod:`.prepack`).

>>> import torch
>>> x = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
>>> blocked = to_blocked(x, 2)
>>> tuple(blocked.shape), bool((from_blocked(blocked) == x).all())
((2, 2, 3, 2), True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kdsl.codegen.tvm.default_schedule import default_schedule
from kdsl.codegen.tvm.kernel import Kernel
from kdsl.codegen.tvm.lowering import Lowered, lower
from kdsl.codegen.tvm.prepack import WeightLayout, prepack_weights
from kdsl.codegen.tvm.toolchain import default_target, error_reason, load_tvm
from kdsl.lang.errors import LoweringError
from kdsl.lang.operator import Operator

__all__ = [
    "BlockedKernel",
    "block_array",
    "block_signature",
    "blocked_shape",
    "build_blocked",
    "from_blocked",
    "signature_name",
    "to_blocked",
]

#: the dim of a data tensor that is blocked: the channels of ``[N, C, H, W]`` (and of ``[N, C, L]``)
CHANNEL_AXIS = 1


def blocked_shape(shape: tuple[int, ...], block: int, what: str = "the tensor") -> tuple[int, ...]:
    """``shape`` with its channel dim split into ``C / block`` blocks, the block moved last; a
    :class:`LoweringError` naming the dim when ``block`` does not divide it.

    >>> blocked_shape((8, 64, 7, 7), 16)
    (8, 4, 7, 7, 16)
    >>> blocked_shape((1, 24, 7, 7), 16, "the input")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.LoweringError: the input's channels (dim 1, size 24) cannot be blocked by 16: pick a block ...
    """
    if len(shape) < 2:
        raise LoweringError(f"{what} has shape {shape}: a channel-blocked layout needs a channel dim (dim 1)")
    if not isinstance(block, int) or block < 1:
        raise LoweringError(f"the channel block must be a positive integer, got {block!r}")
    channels = shape[CHANNEL_AXIS]
    if channels % block:
        raise LoweringError(
            f"{what}'s channels (dim {CHANNEL_AXIS}, size {channels}) cannot be blocked by {block}: "
            f"pick a block that divides {channels}"
        )
    return (shape[0], channels // block, *shape[2:], block)


def to_blocked(tensor: Any, block: int) -> Any:
    """A torch tensor ``[N, C, ...]`` as ``[N, C/block, ..., block]`` (a contiguous copy)."""
    shape = blocked_shape(tuple(tensor.shape), block)
    split = tensor.reshape(shape[0], shape[1], block, *shape[2:-1])
    return split.movedim(2, -1).contiguous()


def block_array(array: Any, block: int) -> Any:
    """A NumPy array ``[N, C, ...]`` as ``[N, C/block, ..., block]`` (a contiguous copy, dtype kept): what
    :func:`to_blocked` does to a torch tensor, for the tuner's measuring worker, which has no torch.

    >>> import numpy as np
    >>> block_array(np.arange(8).reshape(1, 4, 2), 2)[0, 1].tolist()  # per column (2 of them), channels 2 and 3
    [[4, 6], [5, 7]]
    """
    import numpy as np

    shape = blocked_shape(tuple(array.shape), block)
    split = array.reshape(shape[0], shape[1], block, *shape[2:-1])
    return np.ascontiguousarray(np.moveaxis(split, 2, -1))


def signature_name(block: int, rank: int = 4) -> str:
    """The name of a kernel signature's layout: ``NCHW`` for ``block == 0`` (the plain one), else the
    channel-blocked one (``NCHW16c``); ``rank`` is the data tensor's number of dims.

    >>> signature_name(0), signature_name(16), signature_name(8, rank=3)
    ('NCHW', 'NCHW16c', 'NCL8c')
    """
    names = {3: "NCL", 4: "NCHW", 5: "NCDHW"}.get(rank, "NC" + "".join(f"D{i}" for i in range(rank - 2)))
    return names if block == 0 else f"{names}{block}c"


def from_blocked(tensor: Any) -> Any:
    """The inverse of :func:`to_blocked`: ``[N, C/b, ..., b]`` back to ``[N, C, ...]``."""
    block = tensor.shape[-1]
    plain = tensor.movedim(-1, 2)
    return plain.reshape(tensor.shape[0], tensor.shape[1] * block, *tensor.shape[2:-1]).contiguous()


def block_index(block: int) -> Callable[..., list[Any]]:
    """The index map of the channel-blocked layout (``transform_layout``'s): ``[n, c, ..]`` to
    ``[n, c // block, .., c % block]``."""

    def index(*i: Any) -> list[Any]:
        return [i[0], i[CHANNEL_AXIS] // block, *i[2:], i[CHANNEL_AXIS] % block]

    return index


def block_signature(sch: Any, lowered: Lowered, block: int) -> Any:
    """Transform the data input and the output buffers of a scheduled kernel (an ``s_tir.Schedule`` of
    ``lowered``) to the channel-blocked layout, in place; returns ``sch``."""
    blocked_shape(tuple(int(d) for d in lowered.x.shape), block, "the input")
    blocked_shape(lowered.output_shape, block, "the output")
    if lowered.extra_inputs:
        raise LoweringError("a channel-blocked signature is for kernels of one data input")
    x_name, out_name = lowered.x.name, lowered.out.name
    reader = writer = None
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        node = sch.get(rv)
        if reader is None and any(region.source.name == x_name for region in node.reads):
            reader = rv
        if any(region.source.name == out_name for region in node.writes):
            writer = rv
    if reader is None or writer is None:
        raise LoweringError(f"no block of the scheduled kernel reads {x_name} or writes {out_name}")
    try:
        sch.transform_layout(reader, x_name, block_index(block))
        sch.transform_layout(writer, out_name, block_index(block))
    except Exception as error:  # TVM refused the transform for this schedule
        raise LoweringError(f"cannot block the kernel's signature by {block}: {error_reason(error)}") from None
    return sch


class BlockedKernel(Kernel):
    """A compiled kernel called as ``kernel(x_blocked, *weights) -> out_blocked`` (forward only: the
    PyTorch lowering that gives kernels their backward pass computes in the plain layout)."""

    def __init__(
        self,
        executable: Any,
        lowered: Lowered,
        schedule: Any,
        block: int,
        weight_layouts: list[WeightLayout | None] | None = None,
    ) -> None:
        super().__init__(executable, lowered, schedule, weight_layouts)
        self.block = block
        self.input_shape = blocked_shape(self.input_shape, block, "the input")
        self.input_shapes = [self.input_shape]
        self.output_shape = blocked_shape(self.output_shape, block, "the output")

    def __call__(self, x: Any, *weights: Any, out: Any | None = None) -> Any:
        import torch

        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (x, *weights)):
            raise LoweringError(
                "a channel-blocked kernel runs forward only: call it under torch.no_grad() (or detach the inputs)"
            )
        return super().__call__(x, *weights, out=out)


def build_blocked(
    op: Operator,
    layer: Mapping[str, int],
    block: int,
    schedule: Callable[[Lowered], Any] | None = None,
    *,
    dtype: str = "float32",
    prepacked_weights: bool = False,
) -> BlockedKernel:
    """Compile ``op`` at ``layer`` with ``schedule`` (a ``Lowered -> s_tir.Schedule`` function, as
    :func:`kdsl.codegen.tvm.build` takes; default: the default schedule) and a channel-blocked
    signature (:func:`block_signature`); ``prepacked_weights``: the weights the schedule packs taken
    packed too (:mod:`.prepack`; call with ``kernel.pack_weights(*weights)``).

    >>> import torch
    >>> from kdsl import gallery
    >>> from kdsl.codegen.tvm import build
    >>> op, layer = gallery.load("conv2d"), {"N": 1, "Cin": 8, "Cout": 8, "H": 4, "W": 4}
    >>> x, w = torch.randn(1, 8, 4, 4), torch.randn(8, 8, 3, 3)
    >>> blocked = build_blocked(op, layer, 4)
    >>> blocked.input_shape, blocked.output_shape
    ((1, 2, 4, 4, 4), (1, 2, 4, 4, 4))
    >>> torch.allclose(from_blocked(blocked(to_blocked(x, 4), w)), build(op, layer)(x, w), atol=1e-5)
    True
    """
    tvm = load_tvm()
    lowered = lower(op, layer, dtype)
    sch = schedule(lowered) if schedule is not None else default_schedule(lowered)
    block_signature(sch, lowered, block)
    layouts = None
    if prepacked_weights:
        sch, layouts = prepack_weights(sch, lowered)
    return BlockedKernel(tvm.compile(sch.mod, target=default_target()), lowered, sch, block, layouts)
