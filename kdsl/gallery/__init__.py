"""The gallery: named operators (:mod:`kdsl.lang.library` reads their files) and their generated pages.

>>> "conv2d" in names()
True
>>> layer_table("conv2d")
'resnet18'
"""

from __future__ import annotations

from kdsl import solve
from kdsl.lang.errors import KdslError
from kdsl.lang.library import SUFFIX, describe, directory, load, names, path, source

__all__ = ["SUFFIX", "describe", "directory", "layer_table", "load", "names", "path", "source"]


def layer_table(name: str) -> str | None:
    """The first built-in ResNet-18 layer table on which the operator is valid with its default
    coefficients: ``resnet18`` (the stride-1 3x3 layers), else ``resnet18_stride2`` (the stride-2
    layers, whose inputs are 56, 28 and 14 pixels wide, where operators that shrink the image by 2
    belong); ``None`` if neither. Branching kernels are checked the same way.

    >>> layer_table("conv2d"), layer_table("strided_conv2d"), layer_table("max_pool2d_2x2")
    ('resnet18', 'resnet18_stride2', 'resnet18_stride2')
    """
    op = load(name)
    for table in ("resnet18", "resnet18_stride2"):
        try:
            solve.check(op, table)
        except KdslError:
            continue
        return table
    return None
