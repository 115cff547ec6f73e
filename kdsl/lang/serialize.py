"""The versioned JSON form of operators.

>>> from kdsl.lang import *
>>> N, C = primary("N C")
>>> op = Input(N, C) >> Reduce(C) >> Output(N)
>>> from_json(op.to_json()) == op
True
"""

from __future__ import annotations

import json
from typing import Any

from kdsl.lang.build import Input, Operator, Output, Pipeline
from kdsl.lang.errors import KdslError, ParseError
from kdsl.lang.parser import parse_size
from kdsl.lang.primitives import Dim, Expand, Merge, Primitive, Reduce, Share, Shift, Split, Stride, Unfold, Weight

FORMAT = "kdsl-operator"
VERSION = 1
MAX_JSON_CHARS = 1_000_000


def to_dict(op: Operator) -> dict[str, Any]:
    """The JSON-ready dict of ``op`` (sizes as strings, every dim by name)."""
    steps: list[dict[str, Any]] = []
    for step in op.steps:
        if isinstance(step, Split):
            steps.append(
                {"op": "Split", "dim": step.dim, "block": str(step.block), "outer": step.outer, "inner": step.inner}
            )
        elif isinstance(step, Merge):
            steps.append({"op": "Merge", "outer": step.outer, "inner": step.inner, "name": step.name})
        elif isinstance(step, Shift):
            steps.append({"op": "Shift", "dim": step.dim, "offset": step.offset})
        elif isinstance(step, Expand):
            steps.append({"op": "Expand", "name": step.name, "size": str(step.size)})
        elif isinstance(step, Unfold):
            steps.append({"op": "Unfold", "dim": step.dim, "window": str(step.window), "name": step.name})
        elif isinstance(step, Stride):
            steps.append({"op": "Stride", "dim": step.dim, "stride": str(step.stride)})
        elif isinstance(step, Reduce):
            steps.append({"op": "Reduce", "dim": step.dim, "mean": step.mean})
        elif isinstance(step, Share):
            weight = step.weight
            assert isinstance(weight, Weight)
            dims = [{"name": d.name, "size": str(d.size), "new": n} for d, n in zip(weight.dims, weight.new)]
            steps.append({"op": "Share", "weight": weight.name, "dims": dims})
        else:  # pragma: no cover - every primitive is handled above
            raise TypeError(f"no JSON form for {step!r}")
    return {
        "format": FORMAT,
        "version": VERSION,
        "variables": {v.name: v.kind for v in op.variables},
        "inputs": [{"name": d.name, "size": str(d.size)} for d in op.inputs],
        "steps": steps,
        "outputs": [d.name for d in op.outputs],
        "defaults": dict(op.defaults),
    }


def to_json(op: Operator) -> str:
    """``op`` as a JSON string (sorted keys, so equal operators give equal text)."""
    return json.dumps(to_dict(op), sort_keys=True)


def _field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        raise ParseError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise ParseError(f"{where}: the field {key!r} is missing")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ParseError(f"{where}: the field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _step(data: Any, variables: dict[str, str], where: str) -> Primitive:
    kind = _field(data, "op", str, where)

    def size(key: str):
        return parse_size(_field(data, key, str, where), variables)

    def name(key: str) -> str:
        return _field(data, key, str, where)

    if kind == "Split":
        return Split(name("dim"), size("block"), name("outer"), name("inner"))
    if kind == "Merge":
        return Merge(name("outer"), name("inner"), name("name"))
    if kind == "Shift":
        return Shift(name("dim"), _field(data, "offset", int, where))
    if kind == "Expand":
        return Expand(name("name"), size("size"))
    if kind == "Unfold":
        return Unfold(name("dim"), size("window"), name("name"))
    if kind == "Stride":
        return Stride(name("dim"), size("stride"))
    if kind == "Reduce":
        return Reduce(name("dim"), mean=_field(data, "mean", bool, where))
    if kind == "Share":
        entries: list[object] = []
        for index, dim in enumerate(_field(data, "dims", list, where)):
            at = f"{where}.dims[{index}]"
            dim_name = _field(dim, "name", str, at)
            if _field(dim, "new", bool, at):
                entries.append(Dim(dim_name, parse_size(_field(dim, "size", str, at), variables)))
            else:
                entries.append(dim_name)
        return Share(Weight(*entries, name=name("weight")))
    raise ParseError(f"{where}: unknown primitive {kind!r}")


def from_dict(data: Any) -> Operator:
    """Rebuild an operator from :func:`to_dict`'s output, checking every step again."""
    if not isinstance(data, dict):
        raise ParseError(f"an operator's JSON must be an object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise ParseError(f"not a kdsl operator (format is {data.get('format')!r}, expected {FORMAT!r})")
    version = data.get("version")
    if version != VERSION:
        raise ParseError(f"unsupported operator JSON version {version!r} (this kdsl reads version {VERSION})")
    variables = _field(data, "variables", dict, "operator")
    for var_name, kind in variables.items():
        if kind not in ("primary", "coefficient"):
            raise ParseError(f"variable {var_name!r} has the unknown kind {kind!r}")
    inputs = [
        Dim(_field(d, "name", str, "inputs"), parse_size(_field(d, "size", str, "inputs"), variables))
        for d in _field(data, "inputs", list, "operator")
    ]
    steps = tuple(
        _step(step, variables, f"steps[{index}]") for index, step in enumerate(_field(data, "steps", list, "operator"))
    )
    outputs = _field(data, "outputs", list, "operator")
    if not all(isinstance(o, str) for o in outputs):
        raise ParseError("outputs must be a list of dim names")
    defaults = _field(data, "defaults", dict, "operator")
    # one pipeline applied once: the build hands its live dims from step to step without copies
    return Input(*inputs) >> Pipeline(steps, Output(*outputs, defaults=defaults))  # type: ignore[return-value]


def from_json(text: str) -> Operator:
    """Read an operator from :func:`to_json` text; malformed input raises ``ParseError``."""
    if not isinstance(text, (str, bytes)):
        raise ParseError(f"operator JSON must be text, got {type(text).__name__}")
    if len(text) > MAX_JSON_CHARS:
        raise ParseError("operator JSON is too long")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise ParseError(f"invalid JSON: {error}") from None
    try:
        return from_dict(data)
    except KdslError:
        raise
    except (TypeError, ValueError, RecursionError) as error:
        raise ParseError(f"malformed operator JSON: {error}") from None
