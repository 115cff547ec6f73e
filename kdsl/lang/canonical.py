"""Structural content hashes of operators.

Each dim gets a hash from how it was made: an input dim from its position and size, any other dim
from the step that produced it (kind, parameters, port) and the hashes of the dims it consumed.
The operator's key hashes its output dims in order and the multiset of its reductions. So the key
does not depend on dim names, on the order of independent steps, nor on the order of a weight's
dims (weights can be reshaped offline), while any change of semantics changes it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kdsl.lang.primitives import CONTRACTION, REDUCTION, OperatorParts, Primitive

KEY_VERSION = "kdsl-key-1"
#: blends whose two branches may be swapped (kdsl.lang.nonlinear.COMMUTATIVE_BLENDS, restated here
#: because the key must not change if that module's set ever grows by mistake)
COMMUTATIVE = frozenset({"add", "mul", "min", "max"})


def _h(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _params(step: Primitive) -> list[object]:
    """The step's parameters as the key sees them: every field that is not a dim (sizes as text)."""
    params: list[object] = []
    for f in step.fields:
        if f.kind not in ("ref", "refs", "name", "weight"):
            value = getattr(step, f.name)
            params.append(str(value) if f.kind == "size" else value)
    return params


def structural_key(op: OperatorParts) -> str:
    """A 16-hex-digit hash, equal for operators equal up to renaming and reordering.

    A view's produced dim hashes its kind (and port, when it produces several), its parameters and
    the hashes of the dims it consumed; a reduction is a sink; a contraction makes a weight tensor
    whose shared dims are a multiset (weights can be reshaped offline).
    """
    dims, sinks = _dim_hashes(op, {d.name: _h("input", i, str(d.size)) for i, d in enumerate(op.inputs)})
    outputs = [dims[d.name] for d in op.outputs]
    return _h(KEY_VERSION, outputs, sorted(sinks))[:16]


def _dim_hashes(op: OperatorParts, inputs: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The hash of every dim live after ``op``'s steps, starting from the input dims' hashes
    ``inputs`` (by name), and the hashes of its reductions."""
    dims = dict(inputs)
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
    return dims, sinks


def instance_key(design: str, coefficients: dict[str, int]) -> str:
    """The key of a design (:func:`structural_key`) at chosen coefficient values: the design's own key
    when it has none, else a hash of both, so that ``grouped_conv2d`` at G = 2 and at G = 4 (two
    functions on a concrete layer) are two candidates in a results store."""
    if not coefficients:
        return design
    return _h(KEY_VERSION, "coefficients", design, sorted(coefficients.items()))[:16]


def graph_key(graph: Any) -> str:
    """The content hash of a branching kernel (:class:`kdsl.lang.operator.Operator`).

    As for a chain, every dim gets a hash from how it was made, and every node (a tensor) one from
    its kind, parameters and the hashes of what it read: a chain by the hashes its steps give its
    output dims and reductions, starting from its argument's dims (by name, not position); a
    commutative join with its branches sorted; a Rename changes
    nothing. Dims of a join are matched by hash, never by name or position, so the key ignores
    names and the order of independent branches. Two distinct nodes that hash alike (equal chains
    with weights of their own) differ from one node read twice: the key also hashes the multiset
    of every node's hash, and, where two nodes hash alike, of their hashes refined by where they
    are read (:func:`_refined`).
    """
    tensors: list[str] = []
    dims: list[dict[str, str]] = []
    several = len(graph.input_nodes) > 1
    for node in graph.nodes:
        if node.kind == "Input" and several:
            # the input's position in the kernel's signature is part of its identity: (q, k) -> q·kᵀ
            # is not (k, q) -> q·kᵀ; its name is not (names never are)
            position = graph.input_nodes.index(len(tensors))
            tensor = _h("input", position, [str(d.size) for d in node.dims])
            made = {d.name: _h("input", position, i, str(d.size)) for i, d in enumerate(node.dims)}
        elif node.kind == "Input":
            tensor = _h("input", [str(d.size) for d in node.dims])
            made = {d.name: _h("input", i, str(d.size)) for i, d in enumerate(node.dims)}
        elif len(node.args) == 2:
            sides = (
                sorted((tensors[a], sorted(dims[a].values())) for a in node.args)
                if node.kind == "Product" or node.step.how in COMMUTATIVE
                else [(tensors[a], sorted(dims[a].values())) for a in node.args]
            )
            reduced = (
                sorted(dims[a][n] for a in node.args for n in node.step.reduce if n in dims[a])
                if node.kind == "Product"
                else []
            )
            tensor = _h(node.kind.lower(), *_params(node.step), sides, reduced)
            made = {}
            for d in node.dims:
                found = sorted({dims[a][d.name] for a in node.args if d.name in dims[a]})
                made[d.name] = _h("joined", tensor, found)
        else:
            (arg,) = node.args
            before = dims[arg]
            if node.kind == "Chain":
                # hashed from the argument's dim hashes, by name: not by position, which a
                # commutative join's swapped branches (or a Rename) change without changing the data
                out, sinks = _dim_hashes(node.step, {d.name: before[d.name] for d in node.step.inputs})
                tensor = _h("chain", tensors[arg], sorted(out[d.name] for d in node.step.outputs), sorted(sinks))
                made = {d.name: _h("chain-out", tensor, out[d.name]) for d in node.dims}
            elif node.kind == "Rename":
                tensor = tensors[arg]
                made = {d.name: before[node.step.dim if d.name == node.step.name else d.name] for d in node.dims}
            else:
                consumed = sorted(before[n] for n in node.step.consumes)
                tensor = _h(node.kind.lower(), *_params(node.step), tensors[arg], consumed)
                made = {
                    d.name: _h("kept", tensor, before[d.name]) if d.name in before else _h("new", tensor)
                    for d in node.dims
                }
        tensors.append(tensor)
        dims.append(made)
    outputs = [dims[-1][d.name] for d in graph.outputs]
    twins = [t for i, t in enumerate(tensors) if graph.nodes[i].kind != "Rename"]
    if len(set(twins)) == len(twins):
        return _h(KEY_VERSION, "graph", tensors[-1], outputs, sorted(tensors))[:16]
    # Nodes that hash alike (two chains with weights of their own) are told apart by where they
    # are used: (a - b) * a is not (a - b) * b, not even with the weights swapped.
    return _h(KEY_VERSION, "graph", tensors[-1], outputs, sorted(tensors), sorted(_refined(graph, tensors)))[:16]


def _refined(graph: Any, tensors: list[str]) -> list[str]:
    """Each node's hash refined by the hashes of the nodes it reads and of the nodes that read it
    (and in which role: a non-commutative join's lhs or rhs), until no class of equal hashes
    splits any more (colour refinement). The roles and hashes ignore names and the order of
    commutative branches, as the key does."""
    edges: list[list[tuple[int, str, str]]] = [[] for _ in graph.nodes]
    for index, node in enumerate(graph.nodes):
        ordered = len(node.args) == 2 and node.kind == "Blend" and node.step.how not in COMMUTATIVE
        for position, arg in enumerate(node.args):
            role = ("lhs", "rhs")[position] if ordered else "arg"
            edges[index].append((arg, "reads", role))
            edges[arg].append((index, "read-by", role))
    colors = list(tensors)
    for _ in range(len(colors)):
        refined = [
            _h("refined", colors[i], sorted((colors[j], way, role) for j, way, role in edges[i]))
            for i in range(len(colors))
        ]
        if len(set(refined)) == len(set(colors)):
            break
        colors = refined
    return colors
