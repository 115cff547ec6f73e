"""The text of the generated ``nn.Module``: :func:`source` (the helpers it defines, its constructor
and forward) and :func:`padded_source` (a forward that pads the input and crops the output)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from kdsl import solve
from kdsl.codegen.torch.chain_lowering import _forward_body
from kdsl.codegen.torch.graph_nodes import (
    GRAPH_HELPERS,
    _graph_body,
    _graph_dim_names,
    _node_names,
    masked_folds,
    own_names,
)
from kdsl.codegen.torch.identifiers import _Axes, _class_name, _einops_ok, _identifiers
from kdsl.codegen.torch.layer_facts import NnLayer, class_name, nn_layer, weight_attributes
from kdsl.codegen.torch.module_signature import (
    _bias_dim,
    _fraction_code,
    _known_binding,
    _one_line,
    _summed_dims,
    forward_arguments,
    free_inputs,
    lazy_variables,
)
from kdsl.codegen.torch.writer import _atom, _size_code
from kdsl.lang.errors import LoweringError
from kdsl.lang.operator import Operator
from kdsl.solve.padding import Padding

HELPERS = """
def _conv(x, w, pads, stride, dilation, groups, out):
    \"\"\"F.conv{1,2,3}d with zero padding given as F.pad lists it (last dim first, left then right)
    and ``out`` positions per spatial dim; symmetric padding goes to the convolution itself, which
    avoids copying a padded input.\"\"\"
    conv = (F.conv1d, F.conv2d, F.conv3d)[w.dim() - 3]
    lefts, rights = pads[0::2], pads[1::2]
    if lefts == rights and min(lefts) >= 0:
        return conv(x, w, stride=stride, padding=tuple(reversed(lefts)), dilation=dilation, groups=groups)
    if min(lefts) >= 0 and all(right <= left for left, right in zip(lefts, rights)):
        # padding the right as much as the left only adds outputs past the end (none, for a strided
        # convolution whose last window fits): one convolution and a crop (a view), no padded copy
        y = conv(x, w, stride=stride, padding=tuple(reversed(lefts)), dilation=dilation, groups=groups)
        return y if y.shape[2:] == out else y[(..., *(slice(0, n) for n in out))]
    return conv(F.pad(x, pads), w, stride=stride, dilation=dilation, groups=groups)

def _unfold(x, axes, windows):
    \"\"\"out[..., i, ..., j] = x[..., i + j - window // 2, ...] along each axis, zero outside; the
    windows go last, in order. One F.pad for all the axes (one copy), then views.\"\"\"
    pads = [0] * (2 * (x.dim() - min(axes)))  # F.pad lists the last dim first
    for axis, window in zip(axes, windows):
        at = 2 * (x.dim() - 1 - axis)
        pads[at], pads[at + 1] = window // 2, window - 1 - window // 2
    x = F.pad(x, pads)
    for axis, window in zip(axes, windows):
        x = x.unfold(axis, window, 1)
    return x

def _im2col(x, kernel):
    \"\"\"F.unfold of [N, C, H, W] with "same" windows (zero padding window // 2 before, the rest
    after): [N, C * kh * kw, H * W]. Odd windows pad alike on both sides: F.unfold itself, one kernel.\"\"\"
    if all(k % 2 for k in kernel):
        return F.unfold(x, kernel, padding=tuple(k // 2 for k in kernel))
    n, c = x.shape[:2]
    x = _unfold(x, (2, 3), kernel)
    return x.permute(0, 1, 4, 5, 2, 3).reshape(n, c * kernel[0] * kernel[1], -1)

def _check_input(x, dims, sizes):
    \"\"\"Raise ShapeError unless x has one axis per dim, of the dim's size (None: any size).\"\"\"
    shape = tuple(getattr(x, "shape", ()))
    if len(shape) == len(dims):  # a plain loop: this runs on every call, a generator costs more than it
        for size, got in zip(sizes, shape):
            if size is not None and size != got:
                break
        else:
            return
    expected = ", ".join(dim if size is None else f"{dim}={size}" for dim, size in zip(dims, sizes))
    raise ShapeError(f"the input must have shape [{expected}] ({len(dims)} dims), got {list(shape)}")
"""

#: The input check of a kernel of several inputs, which names the input (only their modules have it:
#: the text of every one-input module stays as it was).
INPUTS_HELPER = """
def _check_named(x, name, dims, sizes):
    \"\"\"_check_input, its error naming the input.\"\"\"
    try:
        _check_input(x, dims, sizes)
    except ShapeError as error:
        raise ShapeError(f"the input {name}: {error}") from None
"""

#: kdsl's ShapeError where kdsl is installed (callers catch KdslError), else a ValueError of that name.
ERROR_IMPORT = """
try:
    from kdsl.lang.errors import ShapeError
except ImportError:  # running without kdsl

    class ShapeError(ValueError):
        \"\"\"The input's shape does not fit the operator.\"\"\"
"""


def source(op: Operator, layer: Mapping[str, int] | None = None, *, name: str | None = None, pad: bool = False) -> str:
    """Python source of an ``nn.Module`` computing ``op`` (an operator or a branching kernel) that
    runs without kdsl installed.

    With ``pad=True`` (``layer`` required) a size that does not divide the layer is padded
    (:mod:`kdsl.solve.padding`): the module is the operator at the padded sizes, its ``forward``
    zero-pads the input with ``F.pad``, calls ``padded_forward`` (the unpadded forward at those
    sizes) and crops the output (see :func:`padded_source`).

    The module's constructor takes every size variable (as a keyword argument of the variable's
    name, unless the module uses that name itself: then the source says which name it takes
    instead) and ``bias`` (``bias=True`` adds a parameter ``bias`` with one value per output
    channel: the output dim named ``Cout``, else the second one). The sizes of
    :func:`lazy_variables` (N, H, W of a convolution) may be ``None``: the forward then reads them
    from its input at each call (like ``nn.Lazy*`` modules, and any size where no weight depends on
    it) and checks that they divide as the operator needs (``ShapeError``). Each weight is a
    parameter named after the DSL's weight (:func:`weight_attributes`), initialised like PyTorch's
    layers, uniform in ±1/sqrt(fan-in) (``kaiming_uniform_(a=sqrt(5))``) with the fan-in of
    :func:`fan_ins`; ``module.weights`` lists them in ``op.weights`` order.

    The class is ``name`` (default: :func:`~kdsl.codegen.torch.layer_facts.class_name`, the gallery
    name in CamelCase). A convolution-like operator's module has ``nn.Conv2d``'s attributes
    (``in_channels``, ``out_channels``, ``kernel_size``, ``stride``, ``dilation``, ``groups``; a linear
    one ``in_features`` and ``out_features``: :func:`~kdsl.codegen.torch.layer_facts.nn_layer`) and a
    repr like theirs (``GroupedConv2d(64, 64, kernel_size=3, groups=2)``); any other's repr lists its
    sizes (``module.operator`` is the operator in one line).

    The plan (the order of contraction stages) of each linear chain is the one that is cheapest at
    ``layer`` (at a reference size for the variables it does not give). The forward checks its
    input's shape (``ShapeError``). A branching kernel's forward computes one variable per node
    (``x3`` is node 3) with one rule per node kind (:data:`GRAPH_RULES`).

    >>> from kdsl.lang import *
    >>> N, C, L = primary("N C L")
    >>> x = Input(N, C, L)
    >>> kernel = (x + (x >> Map("relu"))) >> Output(N, C, L)
    >>> text = source(kernel)
    >>> print(text[text.index("# node 1") :].strip())
    # node 1: Map(relu) of node 0 -> [N, C, L]
    x1 = torch.relu(x)
    # node 2: Blend(add) of node 0, node 1 -> [N, C, L]
    x2 = x + x1
    if self.bias is not None:
        x2 = x2 + self.bias[:, None]  # one per C
    return x2
    """
    name = class_name(op) if name is None else name
    if pad:
        if layer is None:
            raise LoweringError("source(..., pad=True) pads the sizes of one layer: pass the layer")
        if len(op.input_nodes) > 1:
            raise LoweringError(
                f"padding (pad=True) is not supported for a kernel of several inputs ({', '.join(op.input_names)}) "
                f"yet; pass sizes that divide"
            )
        return padded_source(op, solve.pad_binding(op, layer), name=name)
    return _source_text(op, _known_binding(op, layer) if layer is not None else None, name, nn_layer(op))


def _source_text(op: Operator, binding: Mapping[str, int] | None, name: str, facts: NnLayer | None) -> str:
    """:func:`source`'s text of ``op`` at ``binding``, with ``facts``' torch.nn attributes and repr."""
    ids, axis = module_identifiers(op), _einops_axes(op)
    attributes = weight_attributes(op)
    codes = [f"self.{a}" for a in attributes]
    if not op.is_linear:
        body = _graph_body(op, binding, axis, ids, codes)
    else:
        body = _forward_body(op, solve.plan(op, binding), axis, ids, codes)
    dsl = op.to_dsl().rstrip().replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    text = [
        '"""Generated by kdsl from this operator:',
        "",
        *("    " + line if line else "" for line in dsl.splitlines()),
        '"""',
        "",
        "import math",
        "",
        "import torch",
        "import torch.nn.functional as F",
        "from torch import nn",
        ERROR_IMPORT,
        HELPERS + (GRAPH_HELPERS if not op.is_linear else "") + (INPUTS_HELPER if len(op.input_nodes) > 1 else ""),
        "",
        *_renaming_notes(op, ids, axis, attributes),
        f"class {_class_name(name)}(nn.Module):",
        f"    operator = {_one_line(op)!r}",
        "",
        *_constructor_lines(op, ids, attributes, facts),
        "",
        *_SHARED_METHODS,
        "",
        "    @property",
        "    def weights(self):",
        '        """The weights in the operator\'s order."""',
        f"        return [{', '.join(codes)}]",
        "",
        *(_EXTRA_REPR if facts is None else _LINEAR_REPR if not facts.spatial else _CONV_REPR),
        "",
        *_forward_lines(op, ids, body),
    ]
    return "\n".join(text) + "\n"


def module_identifiers(op: Operator) -> dict[str, str]:
    """Size variable -> its Python identifier in the generated methods (:func:`_identifiers`); in a
    branching kernel's module the forward's node variables (:func:`own_names`) are taken too."""
    variables = [v.name for v in op.variables]
    return _identifiers(variables, own_names(op)) if not op.is_linear else _identifiers(variables)


def _einops_axes(op: Operator) -> _Axes:
    """The einops axis of every dim of ``op``."""
    dims = _graph_dim_names(op)
    axis = _Axes(set(dims))
    for dim in sorted(dims, key=lambda d: not _einops_ok(d)):  # names einops takes keep themselves
        axis(dim)
    return axis


def _renaming_notes(op: Operator, ids: dict[str, str], axis: _Axes, attributes: list[str]) -> list[str]:
    """Comments listing the dims, size variables and weights whose names the module could not use."""
    notes = []
    renamed_axes = axis.renamed()
    if renamed_axes:
        pairs = ", ".join(f"{dim} -> {new}" for dim, new in renamed_axes.items())
        notes.append(f"# einops axes of the dims whose names einops does not take: {pairs}")
    renamed_ids = {v: i for v, i in ids.items() if v != i}
    if renamed_ids:
        pairs = ", ".join(f"{v} -> {i}" for v, i in renamed_ids.items())
        notes.append(f"# constructor arguments of the size variables whose names this module uses itself: {pairs}")
    renamed_weights = {w.name: a for w, a in zip(op.weights, attributes) if w.name != a}
    if renamed_weights and len(op.weights) == 1:
        notes.append(f"# the one weight {op.weights[0].name} is the attribute weight, as torch.nn names a layer's")
    elif renamed_weights:
        pairs = ", ".join(f"{w} -> {a}" for w, a in renamed_weights.items())
        notes.append(f"# attributes of the weights whose names nn.Module or this module uses itself: {pairs}")
    return notes


def _constructor_lines(
    op: Operator, ids: dict[str, str], attributes: list[str], facts: NnLayer | None = None
) -> list[str]:
    """``__init__``: the sizes, ``facts``' torch.nn attributes, one parameter per weight and the bias,
    their fan-ins."""
    variables = [v.name for v in op.variables]
    defaults = op.default_coefficients
    lazy = lazy_variables(op)
    required = [v for v in variables if v not in defaults and v not in lazy]
    signature = ", ".join(
        [f"{ids[v]}: int" for v in required]
        + [f"{ids[v]}: int | None = None" for v in variables if v in lazy]
        + [f"{ids[v]}: int = {defaults[v]}" for v in variables if v in defaults]
        + ["bias: bool = False"]
    )
    weight_lines = []
    fan_codes = {}
    for weight, attribute, sums in zip(op.weights, attributes, _summed_dims(op)):
        shape = ", ".join(_size_code(d.size, ids) for d in weight.dims)
        fan_code = " * ".join(_atom(_size_code(size, ids)) for _, size in sums) or "1"
        what = f"sums {', '.join(d for d, _ in sums)}" if sums else "sums nothing"
        dims_text = ", ".join(d.name for d in weight.dims)
        weight_lines.append(f"        # {weight.name}[{dims_text}]: {what}, fan-in {fan_code}")
        weight_lines.append(f"        self.{attribute} = nn.Parameter(torch.empty({shape}))")
        fan_codes[attribute] = fan_code
    position = _bias_dim(op)
    channel = op.outputs[position]
    owners = [a for w, a in zip(op.weights, attributes) if channel.name in {d.name for d in w.dims}]
    bias_fan_in = fan_codes[owners[-1]] if owners else fan_codes[attributes[-1]] if attributes else "1"
    fan_codes["bias"] = bias_fan_in
    return [
        f"    def __init__(self, {signature}):",
        "        super().__init__()",
        "        self.sizes = {" + ", ".join(f'"{v}": {ids[v]}' for v in variables) + "}",
        *_layer_lines(facts, ids),
        *weight_lines,
        f"        # bias: one per {channel.name} (output dim {position}), fan-in {bias_fan_in} like its weight's",
        "        if bias:",
        f"            self.bias = nn.Parameter(torch.empty({_size_code(channel.size, ids)}))",
        "        else:",
        '            self.register_parameter("bias", None)',
        "        self.fan_ins = {" + ", ".join(f'"{a}": {code}' for a, code in fan_codes.items()) + "}",
        *(
            ["        self.masks = {}  # node -> the padding mask of its max/min fold (they depend on shapes only)"]
            if not op.is_linear and masked_folds(op)
            else []
        ),
        "        self.reset_parameters()",
    ]


def _layer_lines(facts: NnLayer | None, ids: dict[str, str]) -> list[str]:
    """The constructor's lines setting the torch.nn attributes of a convolution-like operator."""
    if facts is None:
        return []
    lines = ["        # what torch.nn's layer of the same weight layout calls these (kdsl.codegen.torch.layer_facts)"]
    for attribute, size in facts.attributes:
        if isinstance(size, tuple):
            items = [_size_code(s, ids) for s in size]
            code = f"({', '.join(items)},)" if len(items) == 1 else f"({', '.join(items)})"
        else:
            code = _size_code(size, ids)
        lines.append(f"        self.{attribute} = {code}")
    return lines


#: The generated module's methods that are the same for every operator.
_SHARED_METHODS = [
    "    def reset_parameters(self):",
    "        # PyTorch's default for its layers, kaiming_uniform_(a=sqrt(5)): uniform in +-1/sqrt(fan-in)",
    "        for name, fan_in in self.fan_ins.items():",
    "            if getattr(self, name) is not None:",
    "                bound = 1.0 / math.sqrt(fan_in)",
    "                nn.init.uniform_(getattr(self, name), -bound, bound)",
]
_EXTRA_REPR = [
    "    def extra_repr(self):",
    "        # one short line: the sizes the module was built with (self.operator is the operator)",
    "        given = [f'{name}={size}' for name, size in self.sizes.items() if size is not None]",
    "        return ', '.join([*given, *(['bias=True'] if self.bias is not None else [])])",
]
_CONV_REPR = [
    "    def extra_repr(self):",
    "        # nn.Conv2d's, with a tuple of equal sizes as one number and the defaults left out",
    "        def short(sizes):",
    "            return sizes[0] if len(set(sizes)) == 1 else sizes",
    "",
    "        fields = [str(self.in_channels), str(self.out_channels), f'kernel_size={short(self.kernel_size)}']",
    "        fields += [f'stride={short(self.stride)}'] if set(self.stride) != {1} else []",
    "        fields += [f'dilation={short(self.dilation)}'] if set(self.dilation) != {1} else []",
    "        fields += [f'groups={self.groups}'] if self.groups != 1 else []",
    "        return ', '.join([*fields, *(['bias=True'] if self.bias is not None else [])])",
]
_LINEAR_REPR = [
    "    def extra_repr(self):",
    "        fields = [f'in_features={self.in_features}', f'out_features={self.out_features}']",
    "        return ', '.join([*fields, *(['bias=True'] if self.bias is not None else [])])",
]


def _forward_lines(op: Operator, ids: dict[str, str], body: list[str]) -> list[str]:
    """``forward``: the sizes, the input's check, the sizes read from the input, ``body`` (ending in
    ``return``) with the bias added before it returns."""
    variables = [v.name for v in op.variables]
    free, lazy = free_inputs(op), lazy_variables(op)
    expected = []
    late = False  # an input dim whose size mentions a lazy variable without being it
    for i, d in enumerate(op.inputs):
        mentions = {v.name for v in d.size.variables} & set(lazy)
        if i in free:
            expected.append("None")
        elif mentions and d.size.variable_name not in lazy:
            expected.append("None")
            late = True
        else:
            expected.append(_size_code(d.size, ids))
    dim_list = "[" + ", ".join(f'"{d.name}"' for d in op.inputs) + "]"
    if len(op.input_nodes) > 1:
        return _several_inputs_forward(op, ids, body)
    return [
        "    def forward(self, x):",
        f"        {', '.join(ids[v] for v in variables)}{',' if len(variables) == 1 else ''} = self.sizes.values()"
        if variables
        else "",
        f"        _check_input(x, {dim_list}, [{', '.join(expected)}])",
        *(
            f"        {ids[d.size.variable_name]} = x.shape[{i}]  # any size (like a batch)"
            for i, d in enumerate(op.inputs)
            if i in free and d.size.variable_name is not None
        ),
        *_lazy_size_lines(op, ids, dim_list if late else None),
        *("        " + line for line in _with_bias(op, body)),
    ]


def _several_inputs_forward(op: Operator, ids: dict[str, str], body: list[str]) -> list[str]:
    """``forward(self, q, k)`` of a kernel of several inputs: every size bound when the module was
    built (none read from an input), each input's shape checked under its name."""
    variables = [v.name for v in op.variables]
    arguments = forward_arguments(op, _node_names(op))  # as the body (graph_nodes) names them
    lines = [f"    def forward(self, {', '.join(arguments)}):"]
    if variables:
        lines.append(
            f"        {', '.join(ids[v] for v in variables)}{',' if len(variables) == 1 else ''} = self.sizes.values()"
        )
    for argument, name, dims in zip(arguments, op.input_names, op.input_dims):
        names = "[" + ", ".join(f'"{d.name}"' for d in dims) + "]"
        sizes = ", ".join(_size_code(d.size, ids) for d in dims)
        lines.append(f"        _check_named({argument}, {name!r}, {names}, [{sizes}])")
    return lines + ["        " + line for line in _with_bias(op, body)]


def _lazy_size_lines(op: Operator, ids: dict[str, str], late_check: str | None) -> list[str]:
    """The forward's lines reading the lazy sizes the module was not given from its input, and
    checking that they divide as the operator needs; ``late_check``: the dims' list where an input
    dim's size can be checked only then (it mentions a lazy variable without being it)."""
    free, lazy = free_inputs(op), lazy_variables(op)
    read = [v for v in lazy if lazy[v] not in free]
    if not read:
        return []
    lines = [
        f"        if {' or '.join(f'{ids[v]} is None' for v in read)}:  "
        "# not given when built: the input's sizes (no weight depends on them)",
        f"            {', '.join(ids[v] for v in read)} = {', '.join(f'x.shape[{lazy[v]}]' for v in read)}",
    ]
    if late_check is not None:
        full = ["None" if i in free else _size_code(d.size, ids) for i, d in enumerate(op.inputs)]
        lines.append(f"            _check_input(x, {late_check}, [{', '.join(full)}])")
    for constraint in solve.constraints(op):
        if constraint.kind == "slide" and set(constraint.variables) & set(read):
            lines += _slide_check_lines(constraint, ids)
        if constraint.kind != "integral" or not set(constraint.variables) & set(read):
            continue
        numerator, denominator = _fraction_code(constraint.sizes[0], ids)
        if denominator == "1":
            continue
        values = ", ".join(f"{v}={{{ids[v]}}}" for v in constraint.variables)
        text = constraint.description.replace("{", "{{").replace("}", "}}")
        message = f"{text} ({values}), for the input of shape {{list(x.shape)}}"
        lines.append(f"            if ({numerator}) % ({denominator}):")
        lines.append(f"                raise ShapeError(f{message!r})")  # one f-string: torch.compile traces it
    return lines


def _slide_check_lines(constraint: solve.Constraint, ids: dict[str, str]) -> list[str]:
    """The forward's check of a window without padding whose dim's size it read from its input: the
    window fits in the dim, and PyTorch's count of windows ``(N - K) // s + 1`` is the one the module
    was built with (else ``Tensor.unfold`` would fail, or make another count, silently)."""
    dim, window, count, stride = (_atom(_size_code(size, ids)) for size in constraint.sizes)
    window_text, count_text = str(constraint.sizes[1]), str(constraint.sizes[2])
    step, name, shape = constraint.step, constraint.dim, "{list(x.shape)}"
    too_large = f"{step}: the window {window_text}={{{window}}} does not fit in the dim {name} of size {{{dim}}}"
    wrong = (
        f"{step}: the dim {name} of size {{{dim}}} has (N - K) // s + 1 = {{({dim} - {window}) // {stride} + 1}} "
        f"windows, not {count_text}={{{count}}}"
    )
    return [
        f"            if {window} > {dim}:",
        f"                raise ShapeError(f{too_large + ', for the input of shape ' + shape!r})",
        f"            if ({dim} - {window}) // {stride} + 1 != {count}:",
        f"                raise ShapeError(f{wrong + ', for the input of shape ' + shape!r})",
    ]


def _with_bias(op: Operator, body: list[str]) -> list[str]:
    """``body`` (ending in ``return <result>``) adding the bias, one per channel, to the result."""
    position = _bias_dim(op)
    *lines, last = body
    result = last.removeprefix("return ")
    if not re.fullmatch(r"\w+", result):
        lines.append(f"x = {result}")
        result = "x"
    trailing = len(op.outputs) - 1 - position
    index = "[:, " + ", ".join(["None"] * trailing) + "]" if trailing else ""
    return [
        *lines,
        "if self.bias is not None:",
        f"    {result} = {result} + self.bias{index}  # one per {op.outputs[position].name}",
        f"return {result}",
    ]


def padded_source(op: Operator, padding: Padding, *, name: str | None = None) -> str:
    """The source of ``op`` at ``padding``'s padded binding (as :func:`source` writes it, its
    ``forward`` renamed ``padded_forward``) and a ``forward`` that zero-pads the input at the end
    of each padded dim (``F.pad``), calls ``padded_forward`` and crops each output dim to the
    elements it keeps. With nothing padded it is :func:`source` at the layer.

    >>> from kdsl.lang import library
    >>> from kdsl import solve
    >>> op = library.load("grouped_conv2d")
    >>> layer = {"N": 1, "Cin": 64, "Cout": 64, "H": 7, "W": 7, "G": 3}
    >>> text = padded_source(op, solve.pad_binding(op, layer))
    >>> print(text[text.index("    def forward"):text.index("    def padded_forward")].strip())
    def forward(self, x):
            # kdsl pad=True: Cin 64 -> 66 (Split(Cin, Cin/G)); Cout 64 -> 66 (Share(w): the weight dim co: Cout/G)
            # zero-pad the input at the end of each padded dim, run at the padded sizes, crop the output
            _check_input(x, ["N", "Cin", "H", "W"], [None, 64, 7, 7])
            x = F.pad(x, (0, 0, 0, 0, 0, 2))  # Cin 64 -> 66
            y = self.padded_forward(x)
            return y[:, :64]  # Cout 66 -> 64
    """
    if not padding.needed:
        return source(op, padding.padded_binding, name=name)
    # no torch.nn attributes: the padded sizes are not the layer's (nn.Conv2d(64, 64, groups=3) does not exist)
    name = class_name(op) if name is None else name
    code = _source_text(op, _known_binding(op, padding.padded_binding), name, None)
    free = free_inputs(op)
    dims = ", ".join(f'"{d.name}"' for d in padding.inputs)
    sizes = ", ".join("None" if i in free else str(d.original) for i, d in enumerate(padding.inputs))
    lines = [
        "    def forward(self, x):",
        "        # kdsl pad=True: " + "; ".join(str(v) for v in padding.variables),
        "        # zero-pad the input at the end of each padded dim, run at the padded sizes, crop the output",
        f"        _check_input(x, [{dims}], [{sizes}])",
    ]
    padded_inputs = [d for d in padding.inputs if d.amount]
    if padded_inputs:
        # F.pad lists (left, right) pairs from the last dim backwards, up to the first padded dim
        first = min(i for i, d in enumerate(padding.inputs) if d.amount)
        pairs = ", ".join(f"0, {d.amount}" for d in reversed(padding.inputs[first:]))
        notes = ", ".join(f"{d.name} {d.original} -> {d.padded}" for d in padded_inputs)
        lines.append(f"        x = F.pad(x, ({pairs}))  # {notes}")
    lines.append("        y = self.padded_forward(x)")
    cropped = [d for d in padding.outputs if d.amount]
    if cropped:
        last = max(i for i, d in enumerate(padding.outputs) if d.amount)
        index = ", ".join(f":{d.original}" if d.amount else ":" for d in padding.outputs[: last + 1])
        notes = ", ".join(f"{d.name} {d.padded} -> {d.original}" for d in cropped)
        lines.append(f"        return y[{index}]  # {notes}")
    else:
        lines.append("        return y")
    marker = "\n    def forward(self, x):\n"
    head, tail = code.split(marker)
    return head + "\n" + "\n".join(lines) + "\n\n    def padded_forward(self, x):\n" + tail
