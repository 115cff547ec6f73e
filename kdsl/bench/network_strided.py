"""ResNet-18's strided convolutions as kdsl kernels: the 7x7 stride-2 stem, the three stride-2 3x3
convolutions that open stages 3-5, and their 1x1 stride-2 projection shortcuts.

Whatever operator replaces the 13 stride-1 3x3 convolutions, these seven stay what they are in
ResNet-18: convolutions with stride 2 and padding ``K // 2``, the gallery's ``strided_conv2d``
(``Unfold`` then ``Stride`` on H and W), which equals ``F.conv2d(x, w, stride=2, padding=K // 2)``
for even H and W (the output is ``H / 2``; the weight is PyTorch's ``[Cout, Cin, K, K]`` as is). Each
runs once a forward pass; ``kdsl tune --network resnet18 --replace all`` (the default) tunes them
with the stage convolutions and compiles them with their glue fused (:mod:`kdsl.codegen.tvm.epilogue`):
the stem's and a block's first convolution's batch norm and ReLU, the shortcut's batch norm alone.
The stem's 3x3 stride-2 max pooling is a kdsl kernel too (:func:`max_pool_op`: Canvas's max ``Fold``
over strided windows), tuned as a task of its own (:mod:`kdsl.bench.network_head`, with the head).

>>> [(layer.name, layer["Cin"], layer["Cout"], layer["H"], k) for layer, k in strided_layers(1, 224)][:3]
[('stem 7x7/2', 3, 64, 224, 7), ('conv3_x 3x3/2', 64, 128, 56, 3), ('conv3_x 1x1/2', 64, 128, 56, 1)]
"""

from __future__ import annotations

from functools import cache
from typing import Any

from kdsl import gallery
from kdsl.codegen.tvm.epilogue import Epilogue
from kdsl.discover.network import STAGES, stage_layers
from kdsl.lang import Fold, Input, Output, Stride, Unfold, coefficient, primary
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator
from kdsl.solve import bind
from kdsl.solve.layers import Layer
from kdsl.tune.network import NetworkTask

__all__ = [
    "REPLACE",
    "STRIDED_OP",
    "max_pool_binding",
    "max_pool_op",
    "strided_layers",
    "strided_modules",
    "strided_op",
    "strided_tasks",
]

#: what ``--replace`` may put kdsl kernels in: the 13 stride-1 3x3 convolutions, or every convolution
REPLACE = ("all", "3x3")
#: the gallery operator of the strided convolutions
STRIDED_OP = "strided_conv2d"
#: every strided convolution has stride 2
_STRIDE = 2


@cache
def strided_op() -> Operator:
    """The gallery's ``strided_conv2d`` (loaded once)."""
    return gallery.load(STRIDED_OP)


@cache
def max_pool_op() -> Operator:
    """Max pooling over K x K windows with stride s and padding ``K // 2``: ``F.max_pool2d(x, K, s, K // 2)``
    for odd K and s dividing H and W (ResNet-18's stem: K=3, s=2). A max ``Fold`` ignores the zeros a
    window reads outside the image, as PyTorch's padding does.

    >>> import torch
    >>> from kdsl.codegen import reference
    >>> x = torch.randn(1, 2, 6, 4, dtype=torch.float64)
    >>> got = reference.run(max_pool_op(), {"N": 1, "Cin": 2, "H": 6, "W": 4}, x.numpy(), [])
    >>> bool((torch.from_numpy(got) == torch.nn.functional.max_pool2d(x, 3, 2, 1)).all())
    True
    """
    n, cin, h, w = primary("N Cin H W")
    window, stride = coefficient("K s")
    return (
        Input(n, cin, h, w)
        >> Unfold(h, window, "kh")
        >> Unfold(w, window, "kw")
        >> Stride(h, stride)
        >> Stride(w, stride)
        >> Fold("kh", "kw", how="max")
        >> Output(n, cin, "H", "W", defaults={"K": 3, "s": _STRIDE})
    )


def max_pool_binding(batch: int, resolution: int) -> dict[str, int]:
    """The binding of :func:`max_pool_op` at ResNet-18's stem output (64 channels, half the resolution)."""
    size = resolution // 2
    return bind(max_pool_op(), Layer("stem pool", {"N": batch, "Cin": 64, "H": size, "W": size}), {})


def strided_layers(batch: int, resolution: int) -> list[tuple[Layer, int]]:
    """The seven strided convolutions as (layer, window K), in the order a forward pass runs them: the
    stem, then per stage 3-5 its first 3x3 convolution and its 1x1 shortcut. ``H`` and ``W`` are the
    *input* sizes (the output is half of them), as in the ``resnet18_stride2`` layer table."""
    stages = stage_layers(batch, resolution)  # checks the batch and the resolution
    rows = [("stem 7x7/2", 3, 64, resolution, 7)]
    for index in range(1, len(STAGES)):
        name, width, _ = STAGES[index]
        previous, size = STAGES[index - 1][1], stages[index - 1]["H"]
        rows += [(f"{name} 3x3/2", previous, width, size, 3), (f"{name} 1x1/2", previous, width, size, 1)]
    return [
        (Layer(label, {"N": batch, "Cin": cin, "Cout": cout, "H": size, "W": size}), k)
        for label, cin, cout, size, k in rows
    ]


def _binding(layer: Layer, window: int) -> dict[str, int]:
    return bind(strided_op(), layer, {"K": window, "s": _STRIDE})


def strided_tasks(batches: list[int] | tuple[int, ...], resolution: int = 224) -> list[NetworkTask]:
    """The tuning tasks of the seven strided convolutions at each batch size (plain signature only: the
    stem's 3 input channels cannot be channel-blocked, and the blocked networks keep PyTorch's
    convolutions there); each runs once a pass, scaled by ``1 / batch`` like the stage tasks.

    >>> [(t.label, t.weight, t.layer["K"]) for t in strided_tasks([8], 32)][-1]
    ('conv5_x 1x1/2 N=8', 1, 1)
    """
    return [
        NetworkTask(f"{layer.name} N={batch}", strided_op(), _binding(layer, k), 1, 1 / batch)
        for batch in batches
        for layer, k in strided_layers(batch, resolution)
    ]


def strided_modules(net: Any) -> list[tuple[Any, dict[str, int], Epilogue]]:
    """The ``nn.Conv2d`` modules of ``net`` (a :func:`~kdsl.discover.network.resnet18`) that the strided
    kernels replace, each with its binding of ``strided_conv2d`` and the epilogue that folds the glue
    after it (ReLU after the stem and a block's first convolution, none after a shortcut's batch norm)."""
    batch, resolution = getattr(net, "batch", None), getattr(net, "resolution", None)
    if batch is None or resolution is None:
        raise KdslError("the strided kernels need a network built by resnet18(), which records its batch and size")
    modules = [(net.stem[0], Epilogue())]
    for stage in list(net.stages)[1:]:
        first = stage[0]
        modules += [(first.conv1, Epilogue()), (first.shortcut[0], Epilogue(relu=False))]
    result = []
    for (module, epilogue), (layer, k) in zip(modules, strided_layers(batch, resolution)):
        expected = (layer["Cout"], layer["Cin"], k, k)
        if tuple(module.weight.shape) != expected or module.stride != (_STRIDE, _STRIDE):
            raise KdslError(
                f"{layer.name}: expected a stride-2 convolution of weight {list(expected)}, found "
                f"{list(module.weight.shape)} with stride {module.stride}"
            )
        result.append((module, _binding(layer, k), epilogue))
    return result
