"""Structural content hashes of operators.

Each dim gets a hash from how it was made: an input dim from its position and size, any other dim
from the step that produced it (kind, parameters, port) and the hashes of the dims it consumed.
The operator's key hashes its output dims in order and the multiset of its reductions. So the key
does not depend on dim names, on the order of independent steps, nor on the order of a weight's
dims (weights can be reshaped offline), while any change of semantics changes it.
"""

from __future__ import annotations

import hashlib

from kdsl.lang.primitives import CONTRACTION, REDUCTION, OperatorParts, Primitive

KEY_VERSION = "kdsl-key-1"


def _h(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _params(step: Primitive) -> list[object]:
    """The step's parameters as the key sees them: every field that is not a dim (sizes as text)."""
    params: list[object] = []
    for f in step.fields:
        if f.kind not in ("ref", "name"):
            value = getattr(step, f.name)
            params.append(str(value) if f.kind == "size" else value)
    return params


def structural_key(op: OperatorParts) -> str:
    """A 16-hex-digit hash, equal for operators equal up to renaming and reordering.

    A view's produced dim hashes its kind (and port, when it produces several), its parameters and
    the hashes of the dims it consumed; a reduction is a sink; a contraction makes a weight tensor
    whose shared dims are a multiset (weights can be reshaped offline).
    """
    dims: dict[str, str] = {d.name: _h("input", i, str(d.size)) for i, d in enumerate(op.inputs)}
    sinks: list[str] = []
    for step in op.steps:
        if REDUCTION in step.facts:
            sinks.append(_h(step.kind.lower(), *_params(step), dims.pop(step.consumes[0])))
        elif CONTRACTION in step.facts:
            weight = step.weight  # type: ignore[attr-defined]
            shared = sorted(dims[d.name] for d, new in zip(weight.dims, weight.new) if not new)
            fresh = sorted(str(d.size) for d, new in zip(weight.dims, weight.new) if new)
            tensor = _h("weight", shared, fresh)
            for dim, new in zip(weight.dims, weight.new):
                dims[dim.name] = (
                    _h("weight-dim", tensor, str(dim.size)) if new else _h("shared", tensor, dims[dim.name])
                )
        else:
            consumed = [dims.pop(name) for name in step.consumes]
            tags = [f"{step.kind.lower()}-{port}" for port in step.ports] or [step.kind.lower()] * len(step.produces)
            for name, tag in zip(step.produces, tags):
                dims[name] = _h(tag, *_params(step), *consumed)
    outputs = [dims[d.name] for d in op.outputs]
    return _h(KEY_VERSION, outputs, sorted(sinks))[:16]
