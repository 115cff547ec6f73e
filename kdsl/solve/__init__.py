"""The solver: layer tables, constraints and assignments, stage plans (rfactor), cost formulas.

>>> from kdsl.lang import *
>>> from kdsl import solve
>>> N, Cin, Cout, H, W = primary("N Cin Cout H W"); K = coefficient("K")
>>> conv = (Input(N, Cin, H, W) >> Unfold(H, K, "kh") >> Unfold(W, K, "kw")
...     >> Share(Weight(Cout, Cin, "kh", "kw", name="w")) >> Reduce(Cin, "kh", "kw")
...     >> Output(N, Cout, H, W))
>>> len(solve.check(conv, "resnet18", {"K": 3}))
4
>>> solve.assignments(conv, "resnet18", {"K": [3, 5, 7, 9]})
[{'K': 3}, {'K': 5}]
>>> solve.solve_coefficients(conv, "resnet18").values
{'K': (1, 2, 3, 4, 5, 6)}
>>> solve.cost(conv)["flops"]
Cin*Cout*H*K**2*N*W

Every function here takes a branching kernel (a :class:`~kdsl.lang.operator.Operator`) as well, except
:func:`plan`, which orders one linear chain (:func:`chain_plans` gives a kernel's plans).

Note: the functions ``constraints``, ``plan`` and ``cost`` shadow the submodules of the same
name as attributes of this package; import from the submodules with ``from kdsl.solve.plan
import ...``.
"""

from kdsl.solve.coefficients import CoefficientSolution, Divides, solve_coefficients
from kdsl.solve.constraints import (
    Binding,
    CheckReport,
    Constraint,
    assignments,
    bind,
    constraints,
    pad_binding,
)
from kdsl.solve.cost import cost, node_flops, shapes, total_cost, within_budget
from kdsl.solve.dynamic import BudgetError, Filled, budget_limits, fill, multiples, with_widths
from kdsl.solve.layers import Layer, load_layers
from kdsl.solve.padding import DimPad, PaddedVariable, Padding
from kdsl.solve.plan import Plan, Stage, View, chain_plans, plan, reference_binding
from kdsl.solve.summary import CheckSummary, check
from kdsl.solve.widths import divisor_bounds, freedom

__all__ = [
    "Binding",
    "BudgetError",
    "CheckReport",
    "CheckSummary",
    "CoefficientSolution",
    "Constraint",
    "DimPad",
    "Divides",
    "Filled",
    "Layer",
    "PaddedVariable",
    "Padding",
    "Plan",
    "Stage",
    "View",
    "assignments",
    "bind",
    "chain_plans",
    "check",
    "constraints",
    "cost",
    "budget_limits",
    "fill",
    "divisor_bounds",
    "freedom",
    "load_layers",
    "multiples",
    "node_flops",
    "pad_binding",
    "plan",
    "reference_binding",
    "shapes",
    "solve_coefficients",
    "total_cost",
    "with_widths",
    "within_budget",
]
