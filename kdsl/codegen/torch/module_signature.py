"""What the generated module's constructor and forward need to know about an operator: the fan-in
of each weight, the sizes it may read from its input (lazily or as a batch), the
binding a layer gives, the bias dim, the one-line description of its repr."""

from __future__ import annotations

from collections.abc import Mapping
from math import prod

from kdsl import solve
from kdsl.codegen.torch.identifiers import MODULE_NAMES
from kdsl.lang.errors import DivisibilityError, LayerError
from kdsl.lang.nonlinear import ProductJoin
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import Primitive, Reduce, Share, Weight
from kdsl.lang.sizes import Size
from kdsl.solve.constraints import Binding, resolve_binding
from kdsl.solve.layers import Layer, as_layer, layer_label


def free_inputs(graph: Operator) -> set[int]:
    """Positions of the input dims whose size the forward reads from its input (the batch): no node
    reads the dim by name (no step of a linear operator touches it), and its size is one primary
    variable that no step and no other input dim mentions, so any value gives the same operator on
    more (or fewer) rows."""
    if len(graph.input_nodes) > 1:
        return set()  # several inputs: every size is bound when the module is built
    touched: set[str] = set()
    mentioned: list[str] = [v.name for d in graph.inputs for v in d.size.variables]
    for node in graph.nodes:
        steps = node.chain.steps if node.kind == "Chain" else [node.step] if isinstance(node.step, Primitive) else []
        for step in steps:
            touched.update(step.consumes)
            mentioned += [v.name for s in step.sizes() for v in s.variables]
        if isinstance(node.step, ProductJoin):
            touched.update(node.step.reduce)
    free = set()
    for position, dim in enumerate(graph.inputs):
        var = dim.size.variable_name
        if var is not None and dim.name not in touched and mentioned.count(var) == 1 and var in graph.primary_variables:
            free.add(position)
    return free


def forward_arguments(op: Operator, taken: frozenset[str] = frozenset()) -> list[str]:
    """The generated ``forward``'s arguments, one per input in order: ``x`` for one input, else
    the inputs' names (with ``_`` appended while a name is one the module uses itself: ``taken``
    and :data:`~kdsl.codegen.torch.identifiers.MODULE_NAMES`).

    >>> from kdsl.lang import *
    >>> B, M, K, N = primary("B M K N")
    >>> bmm = Product(Input(B, M, K, name="a"), Input(B, K, N, name="torch"), "K") >> Output(B, M, N)
    >>> forward_arguments(bmm)
    ['a', 'torch_']
    """
    if len(op.input_nodes) == 1:
        return ["x"]
    arguments: list[str] = []
    for name in op.input_names:
        argument = name
        while argument in MODULE_NAMES or argument in taken or argument in arguments:
            argument += "_"
        arguments.append(argument)
    return arguments


def _summed_dims(op: Operator) -> list[list[tuple[str, Size]]]:
    """Per weight of ``op``: the dims (name, size) it sums over. A ``Reduce`` (a sum, not a mean)
    of dim ``d`` counts for the weight shared last on ``d`` or on a dim ``d`` was made from
    (through Merge, Split and the other views) before the Reduce. An FC sums its input dims."""
    if not op.is_linear:
        found: list[list[tuple[str, Size]]] = []
        for node in op.nodes:
            if node.kind == "Chain":
                found += _summed_dims(node.chain)
            else:
                found += [[(d.name, d.size) for d, new in zip(w.dims, w.new) if not new] for w in node.weights()]
        return found
    summed: list[list[tuple[str, Size]]] = [[] for _ in op.weights]
    last: dict[str, int] = {}  # live dim -> the weight shared last on it (its position in op.weights)
    count = 0
    for position, step in enumerate(op.steps):
        if isinstance(step, Share):
            if isinstance(step.weight, Weight):
                for dim in step.weight.dims:
                    last[dim.name] = count
                count += 1
            continue
        if isinstance(step, Reduce):
            owner = last.pop(step.dim, None)  # type: ignore[arg-type]
            if owner is not None and not step.mean:
                summed[owner].append((str(step.dim), op.live[position][str(step.dim)]))
            continue
        owners = [last[name] for name in step.consumes if name in last]
        for name in step.consumes:
            last.pop(name, None)
        for name in step.produces:
            if owners:
                last[name] = max(owners)
    return summed


def fan_ins(op: Operator) -> list[Size]:
    """The fan-in of each weight of ``op`` (in ``op.weights`` order) that PyTorch would use for the
    equivalent layer: the product of the sizes of the dims the weight sums over.

    A dim counts for the weight shared last on it before a ``Reduce`` sums it (a mean does not
    count: it already divides by the size). So a conv2d weight ``[Cout, Cin, kh, kw]`` has fan-in
    ``Cin*K^2`` (``nn.Conv2d``); a dim the operator does not sum but keeps in the output, like the
    channel of a depthwise conv or the group of a grouped one, does not count: the depthwise
    weight ``[Cin, kh, kw]`` has fan-in ``K^2`` (``nn.Conv2d(groups=Cin)``), and in a depthwise
    separable conv the later ``Reduce(Cin)`` counts for the pointwise weight ``[Cout, Cin]``, shared
    after it. A weight that sums nothing (a per-element scale) has fan-in 1. An FC weight of a
    branching kernel sums its input dims (``nn.Linear``).

    >>> from kdsl import gallery
    >>> [str(f) for f in fan_ins(gallery.load("depthwise_separable_conv2d"))]
    ['K**2', 'Cin']
    >>> [str(f) for f in fan_ins(gallery.load("grouped_conv2d"))]
    ['Cin*K**2/G']
    """
    return [prod((size for _, size in dims), start=Size.of(1)) for dims in _summed_dims(op)]


def _needed_variables(op: Operator) -> dict[str, str]:
    """Variable -> the first weight whose shape or fan-in needs it (so it must be known when the
    module is built), as text for messages."""
    needed: dict[str, str] = {}
    for weight, fan_in in zip(op.weights, fan_ins(op)):
        text = f"the weight {weight.name}[{', '.join(d.name for d in weight.dims)}]"
        for size in [d.size for d in weight.dims] + [fan_in]:
            for var in size.variables:
                needed.setdefault(var.name, text)
    return needed


def lazy_variables(op: Operator) -> dict[str, int]:
    """The size variables a module of ``op`` can leave unbound until it is called, like the
    ``nn.Lazy*`` modules (variable -> the position of the input dim it is read from): primaries
    that no weight's shape or fan-in mentions and that are exactly the size of an input dim (N, H,
    W of a convolution; the first such dim).

    >>> from kdsl import gallery
    >>> lazy_variables(gallery.load("conv2d"))
    {'H': 2, 'N': 0, 'W': 3}
    """
    if len(op.input_nodes) > 1:
        return {}  # several inputs: the module is built with every size (which input would it read?)
    needed = _needed_variables(op)
    positions = {}
    for position, dim in enumerate(op.inputs):
        var = dim.size.variable_name
        if var is not None and var not in needed and var not in positions and var in op.primary_variables:
            positions[var] = position
    return dict(sorted(positions.items(), key=lambda item: [v.name for v in op.variables].index(item[0])))


def _known_binding(op: Operator, layer: object) -> dict[str, int]:
    """The binding of ``op``'s variables that ``layer`` gives (with the coefficients' defaults),
    checked like :func:`kdsl.solve.bind` where it binds everything. A primary the layer omits is
    left out when :func:`lazy_variables` allows it (the module reads it from its input); else
    :class:`LayerError` names it and what needs it. The constraints whose variables are all bound
    are checked (:class:`DivisibilityError`); the forward checks the others on its input."""
    if isinstance(layer, Binding) and layer.checked_for(op):
        return layer  # the solver's own binding of op (solve.bind, solve.check): nothing to solve again
    item = as_layer(layer)
    missing = [v.name for v in op.variables if v.kind == "primary" and item.get(v.name) is None]
    if not missing:
        return solve.bind(op, item)
    lazy, needed = lazy_variables(op), _needed_variables(op)
    for name in missing:
        if name not in lazy:
            why = (
                f"{needed[name]} needs it (weights have their shapes when the module is built)"
                if name in needed
                else "the forward needs it and no input dim has exactly that size to read it from"
            )
            raise LayerError(f"{layer_label(item.name)} does not give the size {name}: {why}; add {name} to the layer")
    filled = Layer(item.name, {**item.values, **{name: 1 for name in missing}})
    binding = {k: v for k, v in resolve_binding(op, filled).items() if k not in missing}
    for constraint in solve.constraints(op):
        known = constraint.kind != "window" and set(constraint.variables) <= set(binding)
        if known and not constraint.holds(binding):
            raise DivisibilityError(constraint.failure(item.name, binding))
    return Binding(binding, op.key)  # checked as far as the layer goes; the forward reads the rest


def _fraction_code(size: Size, identifiers: Mapping[str, str]) -> tuple[str, str]:
    """Python code of a size's numerator and denominator (``"1"`` when it has none)."""
    numerator = [str(size.constant.numerator)] if size.constant.numerator != 1 else []
    denominator = [str(size.constant.denominator)] if size.constant.denominator != 1 else []
    for var, exponent in size.exponents:
        (numerator if exponent > 0 else denominator).extend([identifiers[var.name]] * abs(exponent))
    return " * ".join(numerator) or "1", " * ".join(denominator) or "1"


def _one_line(op: Operator) -> str:
    """The operator in one line, for the module's repr."""
    inputs = ", ".join(d.name for d in op.inputs)
    outputs = ", ".join(d.name for d in op.outputs)
    if not op.is_linear:
        nodes = "; ".join(f"node {i}: {node.describe()}" for i, node in enumerate(op.nodes) if i)
        return f"Input({inputs}) -> {nodes} -> Output({outputs})"
    return " >> ".join([f"Input({inputs})", *(step.describe() for step in op.steps), f"Output({outputs})"])


def _bias_dim(op: Operator) -> int:
    """The output dim a bias runs along: the one named ``Cout``, else the second (the channels of
    ``[N, C, ...]``), else the only one."""
    names = [d.name for d in op.outputs]
    return names.index("Cout") if "Cout" in names else min(1, len(names) - 1)
