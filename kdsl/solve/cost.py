"""Analytic cost: FLOPs, parameters and memory, as SymPy formulas or as ints on a layer.

* ``flops``: the FLOPs of the operator's :func:`~kdsl.solve.plan.plan` (the sum of its stage
  costs, multiply-accumulate convention: conv2d is ``N*Cout*H*W*Cin*K**2``); ``macs`` is the same
  number under the command line's name for it (every count kdsl prints is in MACs);
* ``params``: the number of weight elements (sum over weights of the product of their dims);
* ``input`` / ``output``: the number of elements of the data input and of the output;
* ``intermediate``: the largest tensor along the plan (every stage's iteration space is one of
  the points considered), a proxy for peak memory.

Symbolic formulas use the plan chosen at the reference point; numbers on a layer use the plan
chosen at that layer's binding, so the two can differ where the best order depends on the sizes.

**Branching kernels** (:class:`~kdsl.lang.operator.Operator`) cost the sum of their nodes' costs, one
rule per node kind (:data:`GRAPH_FLOPS`); every count is in FLOPs where a multiply-accumulate
counts 1, as for chains:

* ``Chain``: its plan's FLOPs (the MACs and additions of its contraction stages);
* ``Map``: 1 per output element; ``Blend``: 1 per result element (the larger branch's);
* ``Fold`` (max/min): 1 per *input* element (one comparison each);
* ``Softmax``: 3 per element (exp, sum, divide; the max subtracted for stability is not counted);
* ``FC``: output elements times the product of the folded dims' sizes (its MACs);
* ``Product``: output elements times the product of the reduced dims' sizes (its MACs);
* ``Rename`` and the input: 0.

``params`` is the sum of the weights' sizes. Memory is counted in *elements* (not bytes), like
``input``/``output``: ``memory`` is the sum of every node's result (the input, each intermediate
and the output, which is the last node's; a Rename moves no data and counts 0; a chain's inner
stages are not counted), ``peak`` the most elements alive at once when the nodes run in order and
each result is freed after its last reader (the input until its last reader, the output to the
end), and ``intermediate`` the largest single tensor (node results and the tensors along each
chain's plan). Symbolic ``peak`` and ``intermediate`` are the candidates that are largest at the
reference point.

>>> from kdsl.lang import *
>>> N, C, H, W, R = primary("N C H W R")
>>> x = Input(N, C, H, W)
>>> gate = (x >> Reduce(H, W, mean=True) >> FC(C, name="r", size=R, weight="squeeze") >> Map("relu")
...         >> FC("r", name="c", size=C, weight="excite") >> Map("sigmoid") >> Rename("c", "C"))
>>> se = (x * gate) >> Output(N, C, H, W)
>>> se_cost = cost(se)
>>> se_cost["flops"], se_cost["params"]
(2*C*H*N*W + 2*C*N*R + C*N + N*R, 2*C*R)
>>> cost(se, {"N": 1, "C": 64, "H": 8, "W": 8, "R": 4})["flops"]
8772

>>> from kdsl.lang import *
>>> N, Cin, Cout, H, W = primary("N Cin Cout H W"); K = coefficient("K")
>>> conv = (Input(N, Cin, H, W) >> Unfold(H, K, "kh") >> Unfold(W, K, "kw")
...     >> Share(Weight(Cout, Cin, "kh", "kw", name="w")) >> Reduce(Cin, "kh", "kw")
...     >> Output(N, Cout, H, W, defaults={"K": 3}))
>>> formulas = cost(conv)
>>> formulas["flops"], formulas["params"]
(Cin*Cout*H*K**2*N*W, Cin*Cout*K**2)
>>> from kdsl.solve import load_layers
>>> numbers = cost(conv, load_layers("resnet18")[0])
>>> numbers["flops"], numbers["params"]
(115605504, 36864)
>>> shapes(conv, {"N": 1, "Cin": 3, "Cout": 8, "H": 5, "W": 5})
{'input': (1, 3, 5, 5), 'output': (1, 8, 5, 5), 'weights': {'w': (8, 3, 3, 3)}}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from kdsl.lang.chain import Chain
from kdsl.lang.errors import DivisibilityError, LayerError
from kdsl.lang.nonlinear import FC, JOINS, UNARY, ProductJoin
from kdsl.lang.operator import Operator
from kdsl.lang.sizes import Size
from kdsl.solve.constraints import bind
from kdsl.solve.layers import Layer, as_layer, as_layers, layer_label
from kdsl.solve.node_facts import dim_elements, elements, node_label, storage
from kdsl.solve.plan import Plan, plan, reference_binding

METRICS = ("flops", "params", "input", "output", "intermediate")
#: the extra metrics of a branching kernel (elements): every node's result, and the most alive at once
GRAPH_METRICS = (*METRICS, "memory", "peak")
#: metrics that :func:`total_cost` takes the maximum of over layers (the others add up)
LARGEST = frozenset({"intermediate", "peak"})


def _product(sizes: list[Size]) -> Size:
    total = Size.of(1)
    for size in sizes:
        total = total * size
    return total


def _largest(p: Plan) -> Size:
    """The largest live tensor along the plan, compared at the plan's own binding."""
    binding = dict(p.binding)
    candidates = [_product([size for _, size in dims]) for dims in p.live]
    return max(candidates, key=lambda size: size.evaluate(binding))


def _formulas(op: Operator, p: Plan) -> dict[str, Size | list[Size]]:
    return {
        "params": [_product(list(w.shape)) for w in op.weights],
        "input": _product([d.size for d in op.inputs]),
        "output": _product([d.size for d in op.outputs]),
        "intermediate": _largest(p),
    }


def _int(value: Fraction, what: str, where: str) -> int:
    if value.denominator != 1:
        raise DivisibilityError(f"{where}: the {what} come to {value}, not an integer; check the constraints")
    return int(value)


def cost(
    op: Operator,
    layer: Layer | Mapping[str, int] | None = None,
    coefficients: Mapping[str, int] | None = None,
    *,
    metrics: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Cost formulas of ``op`` (SymPy expressions), or its costs on ``layer`` (ints).

    With a layer, coefficients come from ``coefficients``, else the layer, else ``op.defaults``;
    the binding is checked as by :func:`~kdsl.solve.constraints.bind`. Keys: ``flops``,
    ``params``, ``input``, ``output``, ``intermediate``; a branching kernel also has ``memory``
    and ``peak`` (:data:`GRAPH_METRICS`, see the module doc for the counting rules). ``metrics``
    asks for some keys only (a budget solver pricing many widths needs ``("flops", "params")``,
    and the peak of a kernel costs more to find than its FLOPs).

    ``macs`` is the same number as ``flops`` under the name kdsl's command line and README use (a
    multiply-accumulate counts one): every key-set that has one has both, and ``metrics`` takes
    either name. ``flops`` is kept for the code that reads it.

    >>> from kdsl.lang import library
    >>> cost(library.load("squeeze_excitation"), {"N": 1, "Cin": 64, "H": 8, "W": 8}, metrics=("params",))
    {'params': 512}
    >>> found = cost(library.load("conv2d"), {"N": 1, "Cin": 8, "Cout": 8, "H": 4, "W": 4}, metrics=("macs",))
    >>> found["macs"] == found["flops"] == 8 * 8 * 9 * 4 * 4
    True
    """
    asked = None if metrics is None or isinstance(metrics, str) else ["flops" if m == "macs" else m for m in metrics]
    result = _cost(op, layer, coefficients, metrics if asked is None else asked)
    if "flops" in result:
        result["macs"] = result["flops"]  # the same count under the CLI's name
    return result


def _cost(
    op: Operator,
    layer: Layer | Mapping[str, int] | None,
    coefficients: Mapping[str, int] | None,
    metrics: Sequence[str] | None,
) -> dict[str, Any]:
    import sympy

    wanted = _wanted(op, metrics)
    if not op.is_linear:
        return _graph_cost(op, layer, coefficients, wanted)
    if layer is None:
        p = plan(op)
        formulas = _formulas(op, p)
        params = formulas["params"]
        assert isinstance(params, list)
        found = {
            "flops": p.flops_formula(),
            "params": sympy.Add(*(size.to_sympy() for size in params)),
            "input": formulas["input"].to_sympy(),  # type: ignore[union-attr]
            "output": formulas["output"].to_sympy(),  # type: ignore[union-attr]
            "intermediate": formulas["intermediate"].to_sympy(),  # type: ignore[union-attr]
        }
        return {key: value for key, value in found.items() if key in wanted}
    item = as_layer(layer)
    binding = bind(op, item, coefficients)
    p = plan(op, binding)
    where = layer_label(item.name)
    result: dict[str, Any] = {}
    if "flops" in wanted:
        result["flops"] = p.flops(binding)
    if "params" in wanted:
        result["params"] = sum(_int(_product(list(w.shape)).evaluate(binding), "params", where) for w in op.weights)
    if wanted & {"input", "output", "intermediate"}:
        formulas = _formulas(op, p)
        for key in ("input", "output", "intermediate"):
            if key in wanted:
                size = formulas[key]
                assert isinstance(size, Size)
                result[key] = _int(size.evaluate(binding), key, where)
    return result


def _wanted(op: Operator, metrics: Sequence[str] | None) -> frozenset[str]:
    known = GRAPH_METRICS if not op.is_linear else METRICS
    if metrics is None:
        return frozenset(known)
    if isinstance(metrics, str) or not all(m in known for m in metrics):
        raise LayerError(f"metrics must be a list of {', '.join(known)}; got {metrics!r:.80}")
    return frozenset(metrics)


def total_cost(op: Operator, layers: object, coefficients: Mapping[str, int] | None = None) -> dict[str, int]:
    """:func:`cost` summed over the layers of a table (``intermediate`` and ``peak`` are the maximum).

    >>> from kdsl.lang import *
    >>> M, Cin, Cout = primary("M Cin Cout")
    >>> matmul = Input(M, Cin) >> Share(Weight(Cin, Cout, name="w")) >> Reduce(Cin) >> Output(M, Cout)
    >>> total_cost(matmul, "resnet18")["params"] == 64**2 + 128**2 + 256**2 + 512**2
    True
    """
    keys = GRAPH_METRICS if not op.is_linear else METRICS
    totals = dict.fromkeys(keys, 0)
    for layer in as_layers(layers):
        each = cost(op, layer, coefficients)
        for key in keys:
            totals[key] = max(totals[key], each[key]) if key in LARGEST else totals[key] + each[key]
    totals["macs"] = totals["flops"]  # the same count under the CLI's name (see cost)
    return totals


def within_budget(
    op: Operator,
    layers: object,
    max_flops: int | None = None,
    max_params: int | None = None,
    coefficients: Mapping[str, int] | None = None,
) -> bool:
    """Whether ``op``'s FLOPs and parameters, summed over ``layers``, are within the budgets
    (``None``: no limit).

    >>> from kdsl.lang import *
    >>> M, Cin, Cout = primary("M Cin Cout")
    >>> matmul = Input(M, Cin) >> Share(Weight(Cin, Cout, name="w")) >> Reduce(Cin) >> Output(M, Cout)
    >>> within_budget(matmul, "resnet18", max_params=350_000), within_budget(matmul, "resnet18", max_params=300_000)
    (True, False)
    """
    for name, limit in (("max_flops", max_flops), ("max_params", max_params)):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))):
            raise LayerError(f"{name} must be a number, got {limit!r}")
    totals = total_cost(op, layers, coefficients)
    if max_flops is not None and totals["flops"] > max_flops:
        return False
    return not (max_params is not None and totals["params"] > max_params)


def shapes(
    op: Operator, layer: Layer | Mapping[str, int], coefficients: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Concrete shapes on one layer: ``input``, ``output`` (tuples of ints) and ``weights``
    (weight name -> tuple, in the weight's declared dim order); a kernel of several inputs adds
    ``inputs`` (input name -> tuple, in the order it takes them; ``input`` is the first's).

    >>> from kdsl.lang import *
    >>> B, M, K, N = primary("B M K N")
    >>> bmm = Product(Input(B, M, K, name="a"), Input(B, K, N, name="b"), "K") >> Output(B, M, N)
    >>> shapes(bmm, {"B": 2, "M": 3, "K": 4, "N": 5})["inputs"]
    {'a': (2, 3, 4), 'b': (2, 4, 5)}
    """
    binding = bind(op, as_layer(layer), coefficients)

    def ints(sizes: list[Size]) -> tuple[int, ...]:
        return tuple(int(size.evaluate(binding)) for size in sizes)

    found: dict[str, Any] = {
        "input": ints([d.size for d in op.inputs]),
        "output": ints([d.size for d in op.outputs]),
        "weights": {w.name: ints(list(w.shape)) for w in op.weights},
    }
    if len(op.input_nodes) > 1:  # several inputs: each by name, in order ("input" is the first's)
        found["inputs"] = {name: ints([d.size for d in dims]) for name, dims in zip(op.input_names, op.input_dims)}
    return found


# ------------------------------------------------------------------------------------------------
# Branching kernels: one FLOPs rule per node kind
# ------------------------------------------------------------------------------------------------

#: a node's FLOPs as monomials to add: (graph, node index, the binding its chains are planned at)
NodeFlops = Callable[[Operator, int, Mapping[str, int]], list[Size]]


def _arg_sizes(graph: Operator, index: int) -> dict[str, Size]:
    """The sizes of the dims of every argument of a node, by name (a join's branches agree)."""
    sizes: dict[str, Size] = {}
    for arg in graph.nodes[index].args:
        sizes.update((d.name, d.size) for d in graph.nodes[arg].dims)
    return sizes


def _no_flops(graph: Operator, index: int, point: Mapping[str, int]) -> list[Size]:
    return []


def _chain_flops(graph: Operator, index: int, point: Mapping[str, int]) -> list[Size]:
    return [stage.cost for stage in plan(graph.nodes[index].chain, point).stages]


def _per_result(graph: Operator, index: int, point: Mapping[str, int]) -> list[Size]:
    return [dim_elements(graph.nodes[index].dims)]


def _per_input(graph: Operator, index: int, point: Mapping[str, int]) -> list[Size]:
    return [dim_elements(graph.nodes[graph.nodes[index].args[0]].dims)]


def _softmax_flops(graph: Operator, index: int, point: Mapping[str, int]) -> list[Size]:
    # exp, the sum, the divide: 3 per element (the max subtracted for stability is not counted)
    return [3 * dim_elements(graph.nodes[index].dims)]


def _fc_flops(graph: Operator, index: int, point: Mapping[str, int]) -> list[Size]:
    step = graph.nodes[index].step
    assert isinstance(step, FC)
    sizes = _arg_sizes(graph, index)
    return [dim_elements(graph.nodes[index].dims) * elements(sizes[str(name)] for name in step.dims)]


def _product_flops(graph: Operator, index: int, point: Mapping[str, int]) -> list[Size]:
    step = graph.nodes[index].step
    assert isinstance(step, ProductJoin)
    sizes = _arg_sizes(graph, index)
    return [dim_elements(graph.nodes[index].dims) * elements(sizes[name] for name in step.reduce)]


#: one FLOPs rule per node kind (the counting convention is in the module doc)
GRAPH_FLOPS: dict[str, NodeFlops] = {
    "Input": _no_flops,
    "Chain": _chain_flops,
    "Map": _per_result,
    "Fold": _per_input,
    "Softmax": _softmax_flops,
    "FC": _fc_flops,
    "Rename": _no_flops,
    "Blend": _per_result,
    "Product": _product_flops,
}
assert set(GRAPH_FLOPS) == {"Input", "Chain", *UNARY, *JOINS}


def _peak_candidates(graph: Operator) -> list[list[Size]]:
    """For each node that makes data, the results alive while it runs (its own included): every
    result lives from its node to its last reader (a Rename's readers read its storage), the
    output to the end."""
    owners = storage(graph)
    last = list(range(len(graph.nodes)))
    for index, node in enumerate(graph.nodes):
        for arg in node.args:
            last[owners[arg]] = max(last[owners[arg]], index)
    last[owners[-1]] = len(graph.nodes)
    candidates = []
    for index in range(len(graph.nodes)):
        if owners[index] != index:
            continue
        alive = [o for o in range(index + 1) if owners[o] == o and last[o] >= index]
        candidates.append([dim_elements(graph.nodes[o].dims) for o in alive])
    return candidates


def _largest_at(candidates: list[list[Size]], point: Mapping[str, int]) -> list[Size]:
    return max(candidates, key=lambda terms: sum((t.evaluate(point) for t in terms), Fraction(0)))


def _graph_terms(
    graph: Operator, point: Mapping[str, int], wanted: frozenset[str] = frozenset(GRAPH_METRICS)
) -> dict[str, list[list[Size]]]:
    """Each metric in ``wanted`` as a list of nodes' terms (sums of monomials) at the plan point
    ``point``."""

    def tensors() -> list[list[Size]]:
        found = [[dim_elements(node.dims)] for node in graph.nodes]
        for node in graph.nodes:
            if isinstance(node.step, Chain):
                found.extend([elements(size for _, size in dims)] for dims in plan(node.step, point).live)
        return found

    def memory() -> list[list[Size]]:
        owners = storage(graph)
        return [[dim_elements(node.dims)] for index, node in enumerate(graph.nodes) if owners[index] == index]

    rules: dict[str, Callable[[], list[list[Size]]]] = {
        "flops": lambda: [GRAPH_FLOPS[node.kind](graph, index, point) for index, node in enumerate(graph.nodes)],
        "params": lambda: [[elements(w.shape)] for w in graph.weights],
        "input": lambda: [[dim_elements(dims)] for dims in graph.input_dims],  # every input's elements
        "output": lambda: [[dim_elements(graph.outputs)]],
        "intermediate": lambda: [_largest_at(tensors(), point)],
        "memory": memory,
        "peak": lambda: [_largest_at(_peak_candidates(graph), point)],
    }
    return {key: rule() for key, rule in rules.items() if key in wanted}


def _graph_cost(
    graph: Operator,
    layer: Layer | Mapping[str, int] | None,
    coefficients: Mapping[str, int] | None,
    wanted: frozenset[str] = frozenset(GRAPH_METRICS),
) -> dict[str, Any]:
    import sympy

    if layer is None:
        terms = _graph_terms(graph, reference_binding(graph), wanted)
        return {key: sympy.Add(*(t.to_sympy() for node in nodes for t in node)) for key, nodes in terms.items()}
    item = as_layer(layer)
    binding = bind(graph, item, coefficients)
    terms = _graph_terms(graph, binding, wanted)
    where = layer_label(item.name)
    result: dict[str, Any] = {}
    for key, nodes in terms.items():
        total = sum((t.evaluate(binding) for node in nodes for t in node), Fraction(0))
        result[key] = _int(total, key, where)
    return result


def node_flops(
    graph: Operator, layer: Layer | Mapping[str, int] | None = None, coefficients: Mapping[str, int] | None = None
) -> list[Any]:
    """The FLOPs of each node of a branching kernel, in node order: SymPy formulas, or ints on
    ``layer`` (the rules of :data:`GRAPH_FLOPS`; their sum is ``cost(graph)["flops"]``).

    >>> from kdsl.lang import *
    >>> N, P, D = primary("N P D")
    >>> x = Input(N, P, D)
    >>> scores = Product(x, x >> Rename(P, "Q"), "D") >> Softmax("Q") >> Output(N, P, "Q")
    >>> node_flops(scores)
    [0, 0, D*N*P**2, 3*N*P**2]
    >>> node_flops(scores, {"N": 2, "P": 4, "D": 8})
    [0, 0, 256, 96]
    """
    import sympy

    if graph.is_linear:
        raise LayerError("node_flops takes a branching operator; a linear one is one chain: use cost()")
    if layer is None:
        point = reference_binding(graph)
        return [
            sympy.Add(*(t.to_sympy() for t in GRAPH_FLOPS[node.kind](graph, index, point)))
            for index, node in enumerate(graph.nodes)
        ]
    item = as_layer(layer)
    binding = bind(graph, item, coefficients)
    where = layer_label(item.name)
    return [
        _int(
            sum((t.evaluate(binding) for t in GRAPH_FLOPS[node.kind](graph, index, binding)), Fraction(0)),
            "FLOPs",
            f"{where}: {node_label(graph, index)}",
        )
        for index, node in enumerate(graph.nodes)
    ]


__all__ = ["GRAPH_FLOPS", "GRAPH_METRICS", "METRICS", "cost", "node_flops", "shapes", "total_cost", "within_budget"]
