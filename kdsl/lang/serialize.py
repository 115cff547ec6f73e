"""Reading the versioned JSON form of operators (:mod:`kdsl.lang.printer` writes it).

>>> from kdsl.lang import *
>>> N, C = primary("N C")
>>> op = Input(N, C) >> Reduce(C) >> Output(N)
>>> from_json(op.to_json()) == op
True
"""

from __future__ import annotations

import json
from typing import Any

from kdsl.lang.branches import JOIN_FUNCTIONS, Tensor
from kdsl.lang.build import Input
from kdsl.lang.errors import KdslError, ParseError
from kdsl.lang.nonlinear import JOINS, UNARY
from kdsl.lang.operator import Operator
from kdsl.lang.parser import parse_size
from kdsl.lang.primitives import PRIMITIVES, Dim, Output, Pipeline, Primitive, Weight
from kdsl.lang.printer import FORMAT, GRAPH_FORMAT, GRAPH_VERSION, VERSION, to_dict, to_json
from kdsl.lang.sizes import KINDS

__all__ = ["FORMAT", "MAX_JSON_CHARS", "VERSION", "from_dict", "from_json", "to_dict", "to_json"]
MAX_JSON_CHARS = 1_000_000


def _field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        raise ParseError(f"{where}: expected an object, got {type(obj).__name__}")
    if key not in obj:
        raise ParseError(f"{where}: the field {key!r} is missing")
    value = obj[key]
    # a JSON true/false is a Python bool, which is an int too: a number field takes no bool
    if not isinstance(value, kind) or (
        isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
    ):
        raise ParseError(f"{where}: the field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _step(data: Any, variables: dict[str, str], where: str) -> Primitive:
    kind = _field(data, "op", str, where)
    cls = PRIMITIVES.get(kind) or UNARY.get(kind)
    if cls is None:
        raise ParseError(f"{where}: unknown primitive {kind!r}")
    values = _values(cls.fields, data, variables, where)
    return cls.from_values(values)


def _values(fields: Any, data: Any, variables: dict[str, str], where: str) -> dict[str, object]:
    values: dict[str, object] = {}
    for f in fields:
        if f.kind == "size":
            values[f.name] = parse_size(_field(data, f.name, str, where), variables)
        elif f.kind in ("ref", "name", "choice"):
            values[f.name] = _field(data, f.name, str, where)
        elif f.kind == "refs":
            refs = _field(data, f.name, list, where)
            if not all(isinstance(r, str) for r in refs):
                raise ParseError(f"{where}: the field {f.name!r} must be a list of dim names")
            values[f.name] = tuple(refs)
        elif f.kind == "number":
            number = _field(data, f.name, (int, float), where)
            try:
                values[f.name] = float(number)
            except OverflowError:  # an integer past float's range (JSON integers have no bound)
                raise ParseError(
                    f"{where}: the field {f.name!r} is too large for a number ({str(number)[:20]}...)"
                ) from None
        elif f.kind == "weight" and f.keyword:
            values[f.name] = _field(data, f.name, str, where)
        elif f.kind == "int":
            values[f.name] = _field(data, f.name, int, where)
        elif f.kind == "bool":
            values[f.name] = _field(data, f.name, bool, where)
        else:  # a weight: its name and dims
            entries: list[object] = []
            for index, dim in enumerate(_field(data, "dims", list, where)):
                at = f"{where}.dims[{index}]"
                dim_name = _field(dim, "name", str, at)
                if _field(dim, "new", bool, at):
                    entries.append(Dim(dim_name, parse_size(_field(dim, "size", str, at), variables)))
                else:
                    entries.append(dim_name)
            values[f.name] = Weight(*entries, name=_field(data, "weight", str, where))
    return values


def _variables_and_inputs(data: dict[str, Any], what: str) -> tuple[dict[str, str], list[Dim]]:
    """The variables (name -> kind) and the input dims of an operator's or a kernel's JSON."""
    variables = _field(data, "variables", dict, what)
    for var_name, kind in variables.items():
        if kind not in KINDS:
            raise ParseError(f"variable {var_name!r} has the unknown kind {kind!r}")
    inputs = [
        Dim(_field(d, "name", str, "inputs"), parse_size(_field(d, "size", str, "inputs"), variables))
        for d in _field(data, "inputs", list, what)
    ]
    return variables, inputs


def from_dict(data: Any) -> Operator:
    """Rebuild an operator from :func:`to_dict`'s output, checking every step again."""
    if not isinstance(data, dict):
        raise ParseError(f"an operator's JSON must be an object, got {type(data).__name__}")
    if data.get("format") == GRAPH_FORMAT:
        return _graph_from_dict(data)
    if data.get("format") != FORMAT:
        raise ParseError(f"not a kdsl operator (format is {data.get('format')!r}, expected {FORMAT!r})")
    version = data.get("version")
    if version != VERSION:
        raise ParseError(f"unsupported operator JSON version {version!r} (this kdsl reads version {VERSION})")
    variables, inputs = _variables_and_inputs(data, "operator")
    steps = tuple(
        _step(step, variables, f"steps[{index}]") for index, step in enumerate(_field(data, "steps", list, "operator"))
    )
    outputs = _field(data, "outputs", list, "operator")
    if not all(isinstance(o, str) for o in outputs):
        raise ParseError("outputs must be a list of dim names")
    defaults = _field(data, "defaults", dict, "operator")
    # one pipeline applied once: the build hands its live dims from step to step without copies
    return Input(*inputs) >> Pipeline(steps, Output(*outputs, defaults=defaults))  # type: ignore[return-value]


def _graph_from_dict(data: dict[str, Any]) -> Operator:
    """Rebuild a branching kernel node by node. Arguments must name earlier nodes (so the JSON
    cannot hold a cycle), and every node must reach the output (no branch left unjoined)."""
    version = data.get("version")
    if version != GRAPH_VERSION:
        raise ParseError(f"unsupported kernel JSON version {version!r} (this kdsl reads version {GRAPH_VERSION})")
    variables, inputs = _variables_and_inputs(data, "kernel")
    nodes = _field(data, "nodes", list, "kernel")
    if not nodes:
        raise ParseError("a kernel's JSON needs at least one node")
    first_name = data.get("input_name")
    if first_name is not None and not isinstance(first_name, str):
        raise ParseError("input_name must be a string")
    tensors: list[Any] = [Input(*inputs, name=first_name)]
    readers = [0] * (len(nodes) + 1)
    for index, node in enumerate(nodes, 1):
        where = f"nodes[{index - 1}]"
        if isinstance(node, dict) and node.get("op") == "Input":  # a second input: no arguments
            _, dims = _variables_and_inputs({"variables": data.get("variables"), **node}, where)
            tensors.append(Input(*dims, name=_field(node, "name", str, where)))
            continue
        args = _field(node, "args", list, where)
        for arg in args:
            if isinstance(arg, bool) or not isinstance(arg, int) or not 0 <= arg < len(tensors):
                raise ParseError(
                    f"{where}: the argument {arg!r:.40} is not an earlier node (0..{len(tensors) - 1}); a kernel's "
                    f"nodes come in order and cannot form a cycle"
                )
            readers[arg] += 1
        kind = _field(node, "op", str, where)
        expected = 2 if kind in JOIN_FUNCTIONS else 1
        if len(args) != expected:
            raise ParseError(f"{where}: a {kind} node takes {expected} argument(s), got {len(args)}")
        if kind == "Chain":
            steps = tuple(
                _step(step, variables, f"{where}.steps[{i}]")
                for i, step in enumerate(_field(node, "steps", list, where))
            )
            tensors.append(Tensor.of(tensors[args[0]], where) >> Pipeline(steps))
        elif kind == "Blend":
            how = _field(node, "how", str, where)
            tensors.append(JOIN_FUNCTIONS["Blend"](how, tensors[args[0]], tensors[args[1]]))
        elif kind == "Product":
            reduce = _values(JOINS["Product"].fields, node, variables, where)["reduce"]
            tensors.append(JOIN_FUNCTIONS["Product"](tensors[args[0]], tensors[args[1]], *reduce))  # type: ignore[misc]
        else:
            tensors.append(Tensor.of(tensors[args[0]], where) >> _step(node, variables, where))
    unused = [i - 1 for i in range(1, len(tensors) - 1) if readers[i] == 0]
    if unused:
        raise ParseError(f"nodes[{unused[0]}] is never used: every branch must be joined into the output")
    outputs = _field(data, "outputs", list, "kernel")
    if not all(isinstance(o, str) for o in outputs):
        raise ParseError("outputs must be a list of dim names")
    defaults = _field(data, "defaults", dict, "kernel")
    return Tensor.of(tensors[-1], "kernel") >> Output(*outputs, defaults=defaults)  # type: ignore[return-value]


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
