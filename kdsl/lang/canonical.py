"""Structural content hashes of operators.

Each dim gets a hash from how it was made: an input dim from its position and size, any other dim
from the step that produced it (kind, parameters, port) and the hashes of the dims it consumed.
The operator's key hashes its output dims in order and the multiset of its reductions. So the key
does not depend on dim names, on the order of independent steps, nor on the order of a weight's
dims (weights can be reshaped offline), while any change of semantics changes it.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from kdsl.lang.primitives import Expand, Merge, Reduce, Share, Shift, Split, Stride, Unfold, Weight

if TYPE_CHECKING:
    from kdsl.lang.build import Operator

KEY_VERSION = "kdsl-key-1"


def _h(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def structural_key(op: Operator) -> str:
    """A 16-hex-digit hash, equal for operators equal up to renaming and reordering."""
    dims: dict[str, str] = {d.name: _h("input", i, str(d.size)) for i, d in enumerate(op.inputs)}
    sinks: list[str] = []
    for step in op.steps:
        if isinstance(step, Split):
            source = dims.pop(step.dim)
            dims[step.outer] = _h("split-outer", str(step.block), source)
            dims[step.inner] = _h("split-inner", str(step.block), source)
        elif isinstance(step, Merge):
            outer, inner = dims.pop(step.outer), dims.pop(step.inner)
            dims[step.name] = _h("merge", outer, inner)
        elif isinstance(step, Shift):
            dims[step.dim] = _h("shift", step.offset, dims[step.dim])
        elif isinstance(step, Expand):
            dims[step.name] = _h("expand", str(step.size))
        elif isinstance(step, Unfold):
            source = dims[step.dim]
            dims[step.dim] = _h("unfold-main", str(step.window), source)
            dims[step.name] = _h("unfold-window", str(step.window), source)
        elif isinstance(step, Stride):
            dims[step.dim] = _h("stride", str(step.stride), dims[step.dim])
        elif isinstance(step, Reduce):
            sinks.append(_h("reduce", step.mean, dims.pop(step.dim)))
        elif isinstance(step, Share):
            weight = step.weight
            assert isinstance(weight, Weight)
            shared = sorted(dims[d.name] for d, new in zip(weight.dims, weight.new) if not new)
            fresh = sorted(str(d.size) for d, new in zip(weight.dims, weight.new) if new)
            tensor = _h("weight", shared, fresh)
            for dim, new in zip(weight.dims, weight.new):
                if new:
                    dims[dim.name] = _h("weight-dim", tensor, str(dim.size))
                else:
                    dims[dim.name] = _h("shared", tensor, dims[dim.name])
        else:  # pragma: no cover - every primitive is handled above
            raise TypeError(f"no structural hash rule for {step!r}")
    outputs = [dims[d.name] for d in op.outputs]
    return _h(KEY_VERSION, outputs, sorted(sinks))[:16]
