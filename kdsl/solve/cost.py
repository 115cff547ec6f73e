"""Analytic cost: FLOPs, parameters and memory, as SymPy formulas or as ints on a layer.

* ``flops``: the FLOPs of the operator's :func:`~kdsl.solve.plan.plan` (the sum of its stage
  costs, multiply-accumulate convention: conv2d is ``N*Cout*H*W*Cin*K**2``);
* ``params``: the number of weight elements (sum over weights of the product of their dims);
* ``input`` / ``output``: the number of elements of the data input and of the output;
* ``intermediate``: the largest tensor along the plan (every stage's iteration space is one of
  the points considered), a proxy for peak memory.

Symbolic formulas use the plan chosen at the reference point; numbers on a layer use the plan
chosen at that layer's binding, so the two can differ where the best order depends on the sizes.

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

from collections.abc import Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from kdsl.lang.errors import DivisibilityError, LayerError
from kdsl.lang.sizes import Size
from kdsl.solve.constraints import bind
from kdsl.solve.layers import Layer, as_layer, as_layers, layer_label
from kdsl.solve.plan import Plan, plan

if TYPE_CHECKING:
    from kdsl.lang.build import Operator

METRICS = ("flops", "params", "input", "output", "intermediate")


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
    op: Operator, layer: Layer | Mapping[str, int] | None = None, coefficients: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Cost formulas of ``op`` (SymPy expressions), or its costs on ``layer`` (ints).

    With a layer, coefficients come from ``coefficients``, else the layer, else ``op.defaults``;
    the binding is checked as by :func:`~kdsl.solve.constraints.bind`. Keys: ``flops``,
    ``params``, ``input``, ``output``, ``intermediate``.
    """
    import sympy

    if layer is None:
        p = plan(op)
        formulas = _formulas(op, p)
        params = formulas["params"]
        assert isinstance(params, list)
        return {
            "flops": p.flops_formula(),
            "params": sympy.Add(*(size.to_sympy() for size in params)),
            "input": formulas["input"].to_sympy(),  # type: ignore[union-attr]
            "output": formulas["output"].to_sympy(),  # type: ignore[union-attr]
            "intermediate": formulas["intermediate"].to_sympy(),  # type: ignore[union-attr]
        }
    item = as_layer(layer)
    binding = bind(op, item, coefficients)
    p = plan(op, binding)
    formulas = _formulas(op, p)
    where = layer_label(item.name)
    params = formulas["params"]
    assert isinstance(params, list)
    result = {"flops": p.flops(binding)}
    result["params"] = sum(_int(size.evaluate(binding), "params", where) for size in params)
    for key in ("input", "output", "intermediate"):
        size = formulas[key]
        assert isinstance(size, Size)
        result[key] = _int(size.evaluate(binding), key, where)
    return result


def total_cost(op: Operator, layers: object, coefficients: Mapping[str, int] | None = None) -> dict[str, int]:
    """:func:`cost` summed over the layers of a table (``intermediate`` is the maximum).

    >>> from kdsl.lang import *
    >>> M, Cin, Cout = primary("M Cin Cout")
    >>> matmul = Input(M, Cin) >> Share(Weight(Cin, Cout, name="w")) >> Reduce(Cin) >> Output(M, Cout)
    >>> total_cost(matmul, "resnet18")["params"] == 64**2 + 128**2 + 256**2 + 512**2
    True
    """
    totals = dict.fromkeys(METRICS, 0)
    for layer in as_layers(layers):
        each = cost(op, layer, coefficients)
        for key in METRICS:
            totals[key] = max(totals[key], each[key]) if key == "intermediate" else totals[key] + each[key]
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
    (weight name -> tuple, in the weight's declared dim order)."""
    binding = bind(op, as_layer(layer), coefficients)

    def ints(sizes: list[Size]) -> tuple[int, ...]:
        return tuple(int(size.evaluate(binding)) for size in sizes)

    return {
        "input": ints([d.size for d in op.inputs]),
        "output": ints([d.size for d in op.outputs]),
        "weights": {w.name: ints(list(w.shape)) for w in op.weights},
    }


__all__ = ["METRICS", "cost", "shapes", "total_cost", "within_budget"]
