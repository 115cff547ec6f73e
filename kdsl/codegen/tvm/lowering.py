"""The TVM backend's lowering: an operator bound to a layer becomes TE placeholders and
``te.compute`` stages, a :class:`Lowered`.

Each node of the operator's graph lowers by its rule in :data:`~kdsl.codegen.tvm.node_rules.GRAPH_RULES`
(:mod:`kdsl.codegen.tvm.node_rules`); a chain node lowers its linear chain to contraction stages
(:func:`~kdsl.codegen.tvm.chain_stages.lower_chain`), and a linear operator is its input and one chain
node. Every stage comes with a :class:`~kdsl.codegen.tvm.chain_stages.StageInfo`, what the scheduler
needs to know of it. The kernel built from these stages is :mod:`kdsl.codegen.tvm.kernel`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kdsl import solve
from kdsl.codegen.tvm.chain_stages import StageInfo
from kdsl.codegen.tvm.node_rules import GRAPH_RULES, GraphContext, read_names
from kdsl.codegen.tvm.toolchain import load_tvm
from kdsl.lang.errors import LoweringError
from kdsl.lang.operator import Operator
from kdsl.solve.constraints import Binding, resolve_binding
from kdsl.solve.layers import as_layer


@dataclass
class Lowered:
    """An operator (or a branching kernel) lowered to TE for one layer."""

    op: Operator
    binding: dict[str, int]
    x: Any
    weights: list[Any]
    out: Any
    stages: list[StageInfo]
    output_shape: tuple[int, ...]
    #: the placeholders of a kernel's other inputs, in its input order (``x`` is the first's)
    extra_inputs: list[Any] = field(default_factory=list)

    @property
    def inputs(self) -> list[Any]:
        """Every input's placeholder, in the kernel's input order."""
        return [self.x, *self.extra_inputs]

    def prim_func(self) -> Any:
        tvm = load_tvm()
        func = tvm.te.create_prim_func([*self.inputs, *self.weights, self.out])
        return func.with_attr("global_symbol", "main")

    def module(self) -> Any:
        tvm = load_tvm()
        return tvm.IRModule({"main": self.prim_func()})


def lower(op: Operator, layer: Mapping[str, int], dtype: str = "float32") -> Lowered:
    """Lower an operator at the sizes of ``layer`` to TE placeholders and stages: one input ``x`` (a
    kernel of several inputs: ``x`` the first, ``x_<name>`` each other one), one placeholder per
    weight (``op.weights`` order), one output (its axes in ``op.outputs`` order). Each node lowers
    by its rule in :data:`GRAPH_RULES`; a linear operator is its input and one chain node.

    >>> from kdsl.lang import *
    >>> N, C, L = primary("N C L")
    >>> x = Input(N, C, L)
    >>> kernel = (x + (x >> Map("relu"))) >> Output(N, C, L)
    >>> [stage.name for stage in lower(kernel, {"N": 1, "C": 2, "L": 8}).stages]
    ['n1_map', 'n2_blend']
    """
    if not isinstance(op, Operator):
        raise LoweringError(f"expected an Operator, got {type(op).__name__}")
    # the one place a linear operator differs: it is bound and checked as a whole (solve.bind), and its
    # chain's stages keep their plain names (_chain)
    if isinstance(layer, Binding) and layer.checked_for(op):
        binding = dict(layer)  # the solver's own binding of op: nothing to solve again
    else:
        binding = solve.bind(op, layer) if op.is_linear else resolve_binding(op, as_layer(layer))
    ctx = GraphContext(op, binding, dtype)
    for index, node in enumerate(op.nodes[1:], 1):
        if node.step is None:  # another input: its placeholder
            ctx.values.append(ctx.input_value(index))
            continue
        rule = GRAPH_RULES.get(node.kind)
        if rule is None:
            raise LoweringError(f"the TVM backend has no rule for the node kind {node.kind}")
        ctx.values.append(rule(ctx, index, node))
    result = ctx.values[-1]
    out_dims = [d.name for d in op.outputs]
    output_shape = tuple(ctx.size(d.size, f"the output dim {d.name}") for d in op.outputs)
    out = result.tensor
    if out is None or any(out is tensor for tensor in ctx.inputs) or result.dims != out_dims:
        # the last node's result in the output's order (or a copy of the input, for a kernel of Renames)
        assert result.tensor is not None
        info = StageInfo("out", out_dims, [], is_copy=True, reads_from=read_names(result))
        out = ctx.stage(info, output_shape, lambda *i: result.at(dict(zip(out_dims, i))))
    return Lowered(op, binding, ctx.x, ctx.weights, out, ctx.stages, output_shape, ctx.inputs[1:])
