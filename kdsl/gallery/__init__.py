"""The gallery: named operators (:mod:`kdsl.lang.library` reads their files) and their generated pages.

>>> "conv2d" in names()
True
>>> layer_table("conv2d")
'resnet18'
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kdsl import solve
from kdsl.lang.errors import KdslError
from kdsl.lang.library import SUFFIX, describe, directory, load, names, path, source
from kdsl.lang.names import check_identifier
from kdsl.lang.operator import Operator
from kdsl.lang.parser import parse

__all__ = [
    "DISCOVERED",
    "SUFFIX",
    "add",
    "describe",
    "directory",
    "entry_source",
    "layer_table",
    "load",
    "names",
    "path",
    "source",
]


#: The operators that are not layers of a 2-D ResNet: the built-in table of their own shapes (3-D
#: convolutions: a 3-D ResNet-18's; pooling whose output sizes are the layer's: Gensor's poolings).
OWN_TABLES = {
    "bmm": "opevo_bmm",
    "bmm_tn": "opevo_bmm",
    "attention_qk": "bert_attention",
    "conv3d": "r3d18",
    "avg_pool2d_strided": "gensor_pool",
}


def layer_table(name: str) -> str | None:
    """The table of :data:`OWN_TABLES` (OpEvo's batched matmuls, BERT's attention, a 3-D ResNet's
    convolutions, Gensor's poolings), else the first
    built-in layer table on which the operator is valid with its default coefficients: ``resnet18``
    (the stride-1 3x3 layers), else ``resnet18_stride2`` (the stride-2 layers, whose inputs are 56, 28
    and 14 pixels wide, where operators that shrink the image by 2 belong), else the tables of windows
    without padding (``valid3x3``, ``opevo_alexnet``: they bind the output sizes Ho, Wo) and of 3-D
    layers (``transposed3d``); ``None`` if none. Branching kernels are checked the same way.

    >>> layer_table("conv2d"), layer_table("strided_conv2d"), layer_table("max_pool2d_2x2")
    ('resnet18', 'resnet18_stride2', 'resnet18_stride2')
    >>> layer_table("conv2d_valid"), layer_table("alexnet_c1"), layer_table("conv_transpose3d")
    ('valid3x3', 'opevo_alexnet', 'transposed3d')
    >>> layer_table("conv3d"), layer_table("avg_pool2d_strided")
    ('r3d18', 'gensor_pool')
    """
    if name in OWN_TABLES:
        return OWN_TABLES[name]
    op = load(name)
    for table in ("resnet18", "resnet18_stride2", "valid3x3", "opevo_alexnet", "transposed3d"):
        try:
            solve.check(op, table)
        except KdslError:
            continue
        return table
    return None


#: how a gallery file says that search found it (the tests check such entries against the NumPy
#: reference, since no hand-written PyTorch function exists for them)
DISCOVERED = "Found by kdsl discover"


def entry_source(op: Operator, name: str, provenance: Mapping[str, object]) -> str:
    """A gallery file for a discovered operator: a docstring with its provenance (where and how
    it was found, what it measured), then its DSL source bound to ``name``.

    >>> from kdsl.lang import *
    >>> N, C = primary("N C")
    >>> op = Input(N, C) >> Reduce(C) >> Output(N)
    >>> text = entry_source(op, "sum_c", {"key": "abc", "accuracy": 0.5})
    >>> text.splitlines()[0][3:], text.splitlines()[2]
    ('Found by kdsl discover: sum_c (key abc).', 'accuracy: 0.5')
    >>> parse(text) == op
    True
    """
    check_identifier(name, "gallery name")
    if op.dynamic_variables:
        raise KdslError(
            f"{name}: the operator is a template with free widths ({', '.join(op.dynamic_variables)}), whose values "
            f"differ per layer; a gallery entry needs fixed sizes (write the widths in with op.substituted)"
        )
    lines = [f'"""{DISCOVERED}: {name} (key {provenance.get("key", op.key)}).', ""]
    for field, value in provenance.items():
        if field == "key" or value is None:
            continue
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        # the docstring holds plain text: no quote run or backslash can end or escape it
        lines.append(f"{field}: {text}".replace('"', "'").replace("\\", "/"))
    lines.append('"""')
    text = "\n".join(lines) + "\n\n" + op.to_dsl(name)
    if parse(text) != op:  # the docstring must not change what the file means
        raise KdslError(f"{name}: the gallery entry does not read back to the operator")
    return text


def add(op: Operator, name: str, provenance: Mapping[str, object], folder: Path | None = None) -> Path:
    """Write ``op`` as the gallery entry ``name`` (never over an existing one); return its path."""
    target = (folder or directory()) / f"{name}{SUFFIX}"
    if target.exists():
        raise KdslError(f"the gallery already has {target.name}; choose another name")
    target.write_text(entry_source(op, name, provenance))
    return target
