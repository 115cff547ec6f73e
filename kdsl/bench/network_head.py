"""The layers of ResNet-18 that are no convolution, as kdsl kernels and tuning tasks: the stem's 3x3
stride-2 max pooling (:func:`~kdsl.bench.network_strided.max_pool_op`) and the head, the global average
pooling and the classifier in one kernel (:func:`head_op`).

The head is one operator: ``Reduce(H, W, mean=True)`` then the classifier's ``Share`` and
``Reduce(Cin)``, the gallery's ``linear`` after a mean over the final feature map. The solver plans it
as two stages in one kernel (the mean over ``H, W`` first, then the ``[N, 512] x [512, classes]``
product), so it costs the mean and the product, never ``H * W`` times the product. The classifier's
bias is the epilogue's per-output shift (:class:`~kdsl.codegen.tvm.epilogue.Epilogue` with
``relu=False`` and a scale of ones): output dim 1 of ``[N, classes]`` is the class, as a convolution's
dim 1 is its channel. ``nn.Linear``'s weight ``[classes, 512]`` is the operator's weight as is.

Both run once a forward pass: one task each per batch size, weighted ``1 / batch`` like the others.
:func:`network_kernel` compiles them, and the strided convolutions, for
:func:`~kdsl.bench.network_tune.compile_network` from their tuned records (the default schedule when
there are none), cached under :func:`kernel_key`, the one key every kernel of that cache has.

>>> [(task.label, task.weight, task.layer["Cin"], task.layer["H"]) for task in head_tasks([1], 64, classes=10)]
[('maxpool 3x3/2 N=1', 1, 64, 32), ('avgpool+fc N=1', 1, 512, 2)]
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from kdsl.bench.network_strided import max_pool_binding, max_pool_op
from kdsl.codegen.tvm import build as tvm_build
from kdsl.codegen.tvm.epilogue import Epilogue, build_fused
from kdsl.codegen.tvm.signature_layout import build_blocked
from kdsl.discover.network import STAGES, stage_layers
from kdsl.lang import Input, Output, Reduce, Share, Weight, primary
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator
from kdsl.solve import bind
from kdsl.solve.layers import Layer
from kdsl.tune.network import NetworkTask
from kdsl.tune.tuned import tuned_schedule

__all__ = [
    "HEAD_LABEL",
    "POOL_LABEL",
    "head_binding",
    "head_module",
    "head_op",
    "head_tasks",
    "kernel_key",
    "network_kernel",
]

#: the label of the max pooling's task (before `` N=batch``)
POOL_LABEL = "maxpool 3x3/2"
#: the label of the head's task: the global average pooling and the classifier
HEAD_LABEL = "avgpool+fc"


@cache
def head_op() -> Operator:
    """ResNet-18's head without its bias: ``F.linear(x.mean(dim=(2, 3)), w)`` for ``x`` of ``[N, Cin,
    H, W]`` and ``w`` of ``[Cout, Cin]`` (``nn.Linear``'s weight as is).

    >>> import torch
    >>> from kdsl.codegen import reference
    >>> x, w = torch.randn(2, 4, 3, 3, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    >>> got = reference.run(head_op(), {"N": 2, "Cin": 4, "Cout": 5, "H": 3, "W": 3}, x.numpy(), [w.numpy()])
    >>> bool(torch.allclose(torch.from_numpy(got), torch.nn.functional.linear(x.mean(dim=(2, 3)), w)))
    True
    """
    n, cin, cout, h, w = primary("N Cin Cout H W")
    classifier = Weight(cout, cin, name="w")
    return Input(n, cin, h, w) >> Reduce(h, w, mean=True) >> Share(classifier) >> Reduce(cin) >> Output(n, cout)


def head_binding(batch: int, resolution: int, classes: int) -> dict[str, int]:
    """The binding of :func:`head_op` after ResNet-18's last stage (512 channels, ``resolution / 32``
    pixels a side) for ``classes`` classes."""
    if not isinstance(classes, int) or classes < 1:
        raise KdslError(f"the number of classes must be a positive integer, got {classes!r}")
    last = stage_layers(batch, resolution)[-1]  # checks the batch and the resolution
    values = {"N": batch, "Cin": STAGES[-1][1], "Cout": classes, "H": last["H"], "W": last["W"]}
    return bind(head_op(), Layer("head", values), {})


def head_tasks(batches: Sequence[int], resolution: int = 224, classes: int = 1000) -> list[NetworkTask]:
    """The max pooling's and the head's tuning tasks at each batch size (plain signature: the blocked
    networks keep PyTorch's there), each run once a pass and scaled by ``1 / batch``."""
    tasks = []
    for batch in batches:
        tasks.append(
            NetworkTask(f"{POOL_LABEL} N={batch}", max_pool_op(), max_pool_binding(batch, resolution), 1, 1 / batch)
        )
        tasks.append(
            NetworkTask(f"{HEAD_LABEL} N={batch}", head_op(), head_binding(batch, resolution, classes), 1, 1 / batch)
        )
    return tasks


def head_module(net: Any) -> tuple[Any, dict[str, int]]:
    """The classifier (``nn.Linear``) of ``net`` (a :func:`~kdsl.discover.network.resnet18`) and the
    binding of :func:`head_op` that replaces it with the global average pooling before it."""
    batch, resolution = getattr(net, "batch", None), getattr(net, "resolution", None)
    fc = getattr(net, "fc", None)
    if batch is None or resolution is None or fc is None:
        raise KdslError("the head's kernel needs a network built by resnet18(), which records its batch and size")
    width = STAGES[-1][1]
    if tuple(fc.weight.shape) != (fc.out_features, width):
        raise KdslError(f"the classifier: expected a weight of [classes, {width}], found {list(fc.weight.shape)}")
    return fc, head_binding(batch, resolution, fc.out_features)


def kernel_key(
    op: Any,
    binding: Mapping[str, int],
    db: str | os.PathLike[str] | None,
    epilogue: Epilogue | None,
    prepack: bool,
    block: int = 0,
    borrowed: bool = False,
) -> tuple[Any, ...]:
    """The key of a compiled kernel in :func:`~kdsl.bench.network_tune.compile_network`'s cache: the
    operator, its binding, the signature (``block``), whose records (``borrowed``: the plain ones run
    blocked), the epilogue, whether the weights come packed, and the records database, which must be in
    it: a cache shared with a network of default schedules (``db=None``) would otherwise hand its kernels
    to the tuned one.

    >>> keys = [kernel_key(max_pool_op(), {"H": 8}, db, None, True) for db in ("a.db", "b.db", None)]
    >>> len(set(keys))
    3
    """
    records = None if db is None else os.fspath(db)
    return (op.key, json.dumps(dict(binding), sort_keys=True), block, borrowed, epilogue, prepack, records)


def network_kernel(
    op: Any,
    binding: dict[str, int],
    epilogue: Epilogue | None,
    db: Any,
    kernels: dict[tuple[Any, ...], Any],
    prepack: bool,
    block: int = 0,
    borrowed: bool = False,
) -> Any:
    """The kernel of ``op`` at ``binding`` for :func:`~kdsl.bench.network_tune.compile_network`, cached in
    ``kernels`` under :func:`kernel_key`: ``NCHW`` (``block=0``: the strided convolutions, the max pooling,
    the head) or channel-blocked by ``block``, with ``epilogue`` after it when one is given. Its schedule is
    the tuned record of the signature ``prepack`` says, else of the other packing, else the default; the
    records of the plain signature when ``borrowed`` (a blocked network run with plain records), else of
    its own."""
    key = kernel_key(op, binding, db, epilogue, prepack, block, borrowed)
    if key not in kernels:
        records_of = 0 if borrowed else block  # the signature whose records give the schedule
        schedule = None if db is None else tuned_schedule(db, op, binding, records_of, prepack, fallback=True)
        if epilogue is not None:
            kernels[key] = build_fused(op, binding, epilogue, schedule, block=block, prepacked_weights=prepack)
        elif block:
            kernels[key] = build_blocked(op, binding, block, schedule, prepacked_weights=prepack)
        else:
            kernels[key] = tvm_build(op, binding, schedule=schedule or "default", prepacked_weights=prepack)
    return kernels[key]
