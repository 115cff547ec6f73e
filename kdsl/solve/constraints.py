"""Constraints on an operator's variables, checked against layer tables.

:func:`constraints` collects, symbolically, what must hold for any concrete sizes: every
coefficient is at least 1 (kind ``"positive"``); every size a step creates is a positive integer
(kind ``"integral"``) and every window is smaller than the dim it slides over (kind ``"window"``),
as each primitive declares in :meth:`~kdsl.lang.primitives.Primitive.requirements`; every input
and output size is a positive integer. Sizes that are integers for any positive integer variables
(``Cin``, ``K**2``, ``2*H``) give no constraint.

A *binding* maps every variable of the operator to an int. For a layer it is the layer's values
for the primary variables; a coefficient takes, in this order, the value in ``coefficients``, the
layer's value, or the operator's default (``Output(..., defaults={"K": 3})``). Variables the
operator does not use are ignored.

>>> from kdsl.lang import library
>>> grouped = library.load("grouped_conv2d")
>>> for c in constraints(grouped):
...     print(c.kind, "|", c.description)
positive | the coefficient G must be a positive integer
positive | the coefficient K must be a positive integer
integral | Split(Cin, Cin/G): Cin/G must be a positive integer
window | Unfold(H, K): the window K must be smaller than the dim H (H)
window | Unfold(W, K): the window K must be smaller than the dim W (W)
integral | Share(w): the weight dim co: Cout/G must be a positive integer
>>> assignments(grouped, "resnet18", {"G": range(1, 9)})
[{'G': 1, 'K': 3}, {'G': 2, 'K': 3}, {'G': 4, 'K': 3}, {'G': 8, 'K': 3}]
>>> check(grouped, "resnet18", {"G": 3})
Traceback (most recent call last):
...
kdsl.lang.errors.DivisibilityError: layer conv2_x (Cin=64, G=3): Split(Cin, Cin/G): Cin/G = 64/3 is not an integer; ...
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from kdsl.lang.chain import Chain
from kdsl.lang.errors import DivisibilityError, LayerError
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import Primitive
from kdsl.lang.sizes import Size, Var
from kdsl.solve.layers import Layer, as_layer, as_layers, layer_label
from kdsl.solve.node_facts import node_label
from kdsl.solve.padding import Padding, pad_sizes

KINDS = ("positive", "integral", "window", "slide")


def _ratio(size: Size, binding: Mapping[str, int]) -> tuple[int, int]:
    """``size`` under ``binding`` as (numerator, denominator) ints, without Fractions."""
    num, den = size.constant.numerator, size.constant.denominator
    for var, exp in size.exponents:
        try:
            value = binding[var.name]
        except KeyError:
            raise LayerError(f"variable {var.name} has no value (needed by the size {size})") from None
        if exp > 0:
            num *= value**exp
        else:
            den *= value**-exp
    return num, den


def _value_text(size: Size, binding: Mapping[str, int]) -> str:
    num, den = _ratio(size, binding)
    return str(Fraction(num, den)) if den else "undefined"


def _size_value(size: Size, binding: Mapping[str, int]) -> str:
    """``K=9`` for a variable, ``H/s = 28`` for an expression, ``3`` for a constant."""
    value = _value_text(size, binding)
    if size.is_constant:
        return value
    if size.variable_name is not None:
        return f"{size.variable_name}={value}"
    return f"{size} = {value}"


@dataclass(frozen=True)
class Constraint:
    """One condition on the variables, with the step and dim it comes from.

    ``kind`` is ``"positive"`` (a coefficient is at least 1; ``sizes`` is the variable),
    ``"integral"`` (``sizes[0]`` is a positive integer), ``"window"`` (the window ``sizes[0]``
    is smaller than the dim's size ``sizes[1]``) or ``"slide"`` (a Slide's ``(N, K, P, s)``: P is
    ``(N - K) // s + 1``, PyTorch's number of windows without padding). ``step`` is the step as text
    (``"Stride(H, s)"``), ``dim`` the dim involved.
    """

    kind: str
    sizes: tuple[Size, ...]
    step: str
    dim: str | None
    description: str
    what: str = ""

    @property
    def variables(self) -> tuple[str, ...]:
        """The variables the constraint depends on, primaries first, then by name."""
        found = {var for size in self.sizes for var in size.variables}
        return tuple(v.name for v in sorted(found, key=Var.sort_key))

    def holds(self, binding: Mapping[str, int]) -> bool:
        """Whether the constraint holds under ``binding`` (which binds all its variables)."""
        if self.kind == "positive":
            num, den = _ratio(self.sizes[0], binding)
            return den > 0 and num >= den
        if self.kind == "integral":
            num, den = _ratio(self.sizes[0], binding)
            return den > 0 and num > 0 and num % den == 0
        if self.kind == "slide":
            return _slide_count(self.sizes, binding) is not None
        window_num, window_den = _ratio(self.sizes[0], binding)
        dim_num, dim_den = _ratio(self.sizes[1], binding)
        if window_den <= 0 or dim_den <= 0:
            return False
        return window_num * dim_den < dim_num * window_den

    def explain(self, binding: Mapping[str, int]) -> str:
        """Why the constraint fails under ``binding`` (one clause, no layer name)."""
        if self.kind == "positive":
            name = self.sizes[0].variable_name
            return f"the coefficient {name} = {_value_text(self.sizes[0], binding)} is not a positive integer"
        if self.kind == "integral":
            size = self.sizes[0]
            return f"{self.step}: {self.what}{size} = {_value_text(size, binding)} is not an integer"
        if self.kind == "slide":
            _, window, count, _ = self.sizes
            values = [_value_text(size, binding) for size in self.sizes]
            expected = _slide_expected(self.sizes, binding)
            if expected is None:
                return (
                    f"{self.step}: the window {_size_value(window, binding)} does not fit in the dim {self.dim} "
                    f"of size {values[0]}"
                )
            return (
                f"{self.step}: the dim {self.dim} of size {values[0]} has (N - K) // s + 1 = ({values[0]} - "
                f"{values[1]}) // {values[3]} + 1 = {expected} windows, not {_size_value(count, binding)}"
            )
        window, dim_size = self.sizes
        dim_text = _size_value(dim_size, binding)
        if dim_size.variable_name != self.dim:
            dim_text = f"the dim {self.dim} ({dim_text})"
        return f"{self.step}: the window {_size_value(window, binding)} is not smaller than {dim_text}"

    def failure(self, layer: str, binding: Mapping[str, int], hint: str | None = None) -> str:
        """The full message for a violation on ``layer``: names the layer, values and step, and
        says what to do (``hint``, else the usual advice for the constraint's kind)."""
        values = ", ".join(f"{name}={binding[name]}" for name in self.variables if name in binding)
        where = f"{layer_label(layer)} ({values})" if values else layer_label(layer)
        if hint is not None:
            pass
        elif self.kind == "window":
            hint = (
                "choose a smaller window or layers where the dim is larger; pass allow_large_windows=True "
                "to accept it (backends that zero-pad, like PyTorch, handle it)"
            )
        elif self.kind == "slide" and _slide_expected(self.sizes, binding) is None:
            # no count of windows can fix a window larger than its dim (PyTorch refuses it too)
            hint = f"choose a window no larger than the dim {self.dim}, or layers where {self.dim} is larger"
        elif self.kind == "slide":
            hint = "bind the number of windows to (N - K) // s + 1 in the layer table, or choose another window"
        elif self.kind == "positive":
            hint = "coefficients must be integers of at least 1"
        else:
            hint = "choose coefficients that divide the layer's sizes (kdsl.solve.assignments lists the valid ones)"
            if any(v.kind == "primary" and e > 0 for v, e in self.sizes[0].exponents):
                # padding can round the primaries up (kdsl.solve.padding)
                hint += ", or pad the layer's sizes up with pad=True (kdsl check --pad)"
        return f"{where}: {self.explain(binding)}; {hint}"

    def __str__(self) -> str:
        return self.description


def _slide_expected(sizes: tuple[Size, ...], binding: Mapping[str, int]) -> int | None:
    """PyTorch's number of windows without padding, ``(N - K) // s + 1``, or None where N, K and s
    are not positive integers or the window is larger than the dim."""
    dim_size, window, _, stride = (_ratio(size, binding) for size in sizes)
    values = []
    for num, den in (dim_size, window, stride):
        if den <= 0 or num <= 0 or num % den:
            return None
        values.append(num // den)
    n, k, s = values
    return (n - k) // s + 1 if k <= n else None


def _slide_count(sizes: tuple[Size, ...], binding: Mapping[str, int]) -> int | None:
    """The number of windows of a Slide where it is PyTorch's (:func:`_slide_expected`), else None."""
    expected = _slide_expected(sizes, binding)
    num, den = _ratio(sizes[2], binding)
    return expected if expected is not None and den > 0 and num == expected * den else None


def _trivially_integral(size: Size) -> bool:
    return size.constant.denominator == 1 and all(exp > 0 for _, exp in size.exponents)


class _Collector:
    """Constraints in the order found, each (kind, sizes) once: the first step that needs a size
    is the one messages name."""

    def __init__(self) -> None:
        self.found: list[Constraint] = []
        self.seen: set[tuple[str, tuple[Size, ...]]] = set()

    def add(
        self, kind: str, sizes: tuple[Size, ...], step: str, dim: str | None, description: str, what: str = ""
    ) -> None:
        if (kind, sizes) in self.seen:
            return
        self.seen.add((kind, sizes))
        self.found.append(Constraint(kind, sizes, step, dim, description, what))

    def integral(self, size: Size, step: str, dim: str | None, what: str = "") -> None:
        if not _trivially_integral(size):
            self.add("integral", (size,), step, dim, f"{step}: {what}{size} must be a positive integer", what)

    def coefficients(self, names: Iterable[str]) -> None:
        for name in names:
            var = Size.variable(name, "coefficient")
            self.add(
                "positive", (var,), f"coefficient {name}", None, f"the coefficient {name} must be a positive integer"
            )

    def step(self, step: Primitive, text: str, before: Mapping[str, Size], after: Mapping[str, Size]) -> None:
        for need in step.requirements(before, after):
            if need.kind == "integral":
                self.integral(need.sizes[0], text, need.dim, need.what)
            elif need.kind == "slide":  # a window without padding: (N - K) // s + 1 windows
                dim_size, window, count, stride = need.sizes
                by = "" if stride == 1 else f" with stride {stride}"
                self.add(
                    "slide",
                    need.sizes,
                    text,
                    need.dim,
                    f"{text}: {count} must be the number of windows {window}{by} in the dim {need.dim} "
                    f"({dim_size}): ({dim_size} - {window}) // {stride} + 1",
                )
            else:  # a window must be smaller than the dim it slides over
                window, dim_size = need.sizes
                self.add(
                    "window",
                    need.sizes,
                    text,
                    need.dim,
                    f"{text}: the window {window} must be smaller than the dim {need.dim} ({dim_size})",
                )


@lru_cache(maxsize=512)
def constraints(op: Operator | Chain) -> tuple[Constraint, ...]:
    """The constraints of ``op``, without duplicates: coefficient positivity, the input's dims, then,
    node by node, the requirements of every step of a chain, of every unary step (an FC's output
    size) and the integrality of every dim of a node's result; the output's dims last. In a
    branching operator the step text names the node (``node 1 chain: Split(C, C/G)``, ``node 2
    FC(C -> r: C/G)``); a linear operator's one chain node is named by its steps alone.

    >>> from kdsl.lang import *
    >>> H = primary("H"); s, K = coefficient("s K")
    >>> op = Input(H) >> Unfold(H, K, "k") >> Stride(H, s) >> Reduce("k") >> Output("H")
    >>> [c.description for c in constraints(op) if c.kind != "positive"]
    ['Unfold(H, K): the window K must be smaller than the dim H (H)', 'Stride(H, s): H/s must be a positive integer']
    >>> N, C = primary("N C"); G = coefficient("G")
    >>> x = Input(N, C)
    >>> gate = x >> FC(C, name="r", size=C / G, weight="down") >> Map("relu") >> FC("r", name="C", size=C, weight="up")
    >>> kernel = (x * gate) >> Output(N, C, defaults={"G": 4})
    >>> for c in constraints(kernel):
    ...     print(c.description)
    the coefficient G must be a positive integer
    node 1 FC(C -> r: C/G): the FC output dim r: C/G must be a positive integer
    """
    if isinstance(op, Chain):  # a chain node's own constraints: those of its linear operator
        op = Operator.linear(op)
    # the one place a linear operator differs: its steps name themselves, and its dims are its
    # steps' and its output's (no node dims to list)
    linear = op.is_linear
    collect = _Collector()
    collect.coefficients(op.coefficient_variables)
    for dim in op.inputs:
        collect.integral(dim.size, f"Input({dim.name})", dim.name)
    for match in op.matches:
        # first, so that a width shape matching fixed is reported with both dims that fixed it
        collect.integral(match.size, f"shape matching at {match.describe()}", match.dim, f"so {match.variable} = ")
    for index, node in enumerate(op.nodes):
        step = node.step
        if isinstance(step, Chain):
            prefix = "" if linear else f"node {index} chain: "
            for position, chain_step in enumerate(step.steps):
                text = prefix + chain_step.describe()
                collect.step(chain_step, text, step.live[position], step.live[position + 1])
        elif isinstance(step, Primitive):
            before = {d.name: d.size for d in op.nodes[node.args[0]].dims}
            collect.step(step, node_label(op, index), before, {d.name: d.size for d in node.dims})
        if not linear:
            for dim in node.dims:
                collect.integral(dim.size, node_label(op, index), dim.name, f"the dim {dim.name}: ")
    for dim in op.outputs:
        collect.integral(dim.size, f"Output({dim.name})", dim.name)
    return tuple(collect.found)


# ------------------------------------------------------------------------------------------------
# Bindings
# ------------------------------------------------------------------------------------------------


def _coefficient_values(coefficients: Mapping[str, int] | None) -> dict[str, int]:
    if coefficients is None:
        return {}
    if not isinstance(coefficients, Mapping):
        raise LayerError(f"coefficients must be a dict like {{'K': 3}}, got {coefficients!r}")
    values: dict[str, int] = {}
    for name, value in coefficients.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise LayerError(f"coefficients: {name}={value!r} must be an integer")
        values[str(name)] = value
    return values


def resolve_binding(op: Operator, layer: Layer, coefficients: Mapping[str, int] | None = None) -> dict[str, int]:
    """Every variable of ``op`` bound for ``layer`` (no constraint is checked).

    Primaries come from the layer; a coefficient from ``coefficients``, else the layer, else
    ``op``'s defaults. Raises :class:`LayerError` naming the variable and layer when one is unbound.
    """
    given = _coefficient_values(coefficients)
    defaults = dict(op.defaults)
    binding: dict[str, int] = {}
    for var in op.variables:
        name = var.name
        if var.kind == "primary":
            value = layer.get(name)
            if value is None:
                bound = ", ".join(layer) or "nothing"
                raise LayerError(
                    f"{layer_label(layer.name)} does not bind the variable {name} that the operator needs "
                    f"(it binds {bound}); add {name} to the layer table"
                )
        elif name in given:
            value = given[name]
        elif name in layer:
            value = layer[name]
        elif name in defaults:
            value = defaults[name]
        elif var.kind == "dynamic":
            raise LayerError(
                f"the dynamic variable {name} (a free width) has no value on {layer_label(layer.name)}: the "
                f"operator is a template; fill it with kdsl.solve.fill(op, layers, max_flops=...) (or "
                f"`kdsl check --max-macs`), or pass {{'{name}': 16}} with the coefficients"
            )
        else:
            raise LayerError(
                f"the coefficient {name} has no value on {layer_label(layer.name)}: pass coefficients={{'{name}': 3}} "
                f"or give the operator defaults (Output(..., defaults={{'{name}': 3}}))"
            )
        binding[name] = value
    return binding


class Binding(dict):
    """A binding the solver checked for one operator (what :func:`bind` and :func:`check` return): a
    backend given it builds from it instead of solving the sizes again. It reads and changes like the
    dict it is; once changed it is no longer taken as checked (:meth:`checked_for`).

    >>> from kdsl.lang import library
    >>> conv = library.load("conv2d")
    >>> binding = bind(conv, {"N": 1, "Cin": 8, "Cout": 8, "H": 5, "W": 5})
    >>> binding.checked_for(conv), binding.checked_for(library.load("matmul"))
    (True, False)
    >>> binding["K"] = 5
    >>> binding.checked_for(conv)
    False
    """

    def __init__(self, values: Mapping[str, int], operator_key: str) -> None:
        super().__init__(values)
        self._checked = (operator_key, tuple(sorted(self.items())))

    def checked_for(self, op: Operator) -> bool:
        """Whether the solver checked these exact values for ``op``."""
        key, items = self._checked
        return key == op.key and tuple(sorted(self.items())) == items


@dataclass(frozen=True)
class CheckReport:
    """The result of a successful :func:`check`: the concrete binding of each layer.

    ``large_windows`` lists the window violations accepted under ``allow_large_windows=True``.
    Under ``pad=True``, ``paddings`` holds per layer its :class:`~kdsl.solve.padding.Padding`, or
    ``None`` where nothing is padded; :meth:`binding` stays the original binding.
    """

    layers: tuple[Layer, ...]
    bindings: tuple[tuple[tuple[str, int], ...], ...]
    large_windows: tuple[str, ...] = ()
    paddings: tuple[Padding | None, ...] = ()
    operator_key: str = ""  # the key of the operator checked: its bindings are Bindings of it

    def binding(self, layer: str) -> dict[str, int]:
        """The binding of the layer named ``layer`` (a :class:`Binding`: backends build from it as is)."""
        for item, binding in zip(self.layers, self.bindings):
            if item.name == layer:
                return Binding(binding, self.operator_key)
        raise LayerError(f"no layer named {layer!r}; the layers are {', '.join(x.name for x in self.layers)}")

    def padded_binding(self, layer: str) -> dict[str, int]:
        """The binding the padded operator runs at on the layer named ``layer`` (the original one
        where nothing is padded, or without ``pad=True``)."""
        for item, padding in zip(self.layers, self.paddings):
            if item.name == layer and padding is not None:
                return padding.padded_binding
        return self.binding(layer)

    def __iter__(self) -> Iterator[tuple[Layer, dict[str, int]]]:
        return ((layer, Binding(binding, self.operator_key)) for layer, binding in zip(self.layers, self.bindings))

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def ok(self) -> bool:
        """Always true: a failed check raises instead of returning a report."""
        return True


def _violated(
    op: Operator, layer: Layer, binding: Mapping[str, int], *, windows: bool, large: list[str] | None = None
) -> None:
    for constraint in constraints(op):
        if constraint.holds(binding):
            continue
        message = constraint.failure(layer.name, binding)
        if constraint.kind == "window" and not windows:
            if large is not None:
                large.append(message)
            continue
        raise DivisibilityError(message)


def check(
    op: Operator,
    layers: object,
    coefficients: Mapping[str, int] | None = None,
    *,
    allow_large_windows: bool = False,
    pad: bool = False,
) -> CheckReport:
    """Check ``op`` on every layer of ``layers`` (anything :func:`load_layers` takes, or one layer).

    Raises :class:`LayerError` for an unbound variable and :class:`DivisibilityError` for the
    first violated constraint (a size that is not a positive integer, or a window that is not
    smaller than its dim unless ``allow_large_windows``), naming the layer, values and step.
    With ``pad=True`` a size that padding fixes does not raise: each layer's primaries are
    rounded up (:func:`pad_binding`), the other constraints are checked at the padded binding,
    and the report's ``paddings`` say what was padded.

    >>> from kdsl.lang import *
    >>> H = primary("H"); s, K = coefficient("s K")
    >>> op = (Input(H) >> Unfold(H, K, "k") >> Stride(H, s) >> Reduce("k")
    ...       >> Output("H", defaults={"K": 3, "s": 2}))
    >>> check(op, "resnet18_stride2").binding("conv5_1")
    {'H': 14, 'K': 3, 's': 2}
    >>> check(op, "resnet18")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.DivisibilityError: layer conv5_x (H=7, s=2): Stride(H, s): H/s = 7/2 is not an integer; ...
    >>> print(check(op, "resnet18", pad=True).paddings[3].describe())
    H 7 -> 8 (Stride(H, s): H/s)
    """
    table = as_layers(layers)
    large: list[str] = []
    bindings = []
    paddings: list[Padding | None] = []
    for layer in table:
        binding = resolve_binding(op, layer, coefficients)
        if pad:
            padding = pad_sizes(op, layer, binding, constraints(op))
            _violated(op, layer, padding.padded_binding, windows=not allow_large_windows, large=large)
            paddings.append(padding if padding.needed else None)
        else:
            _violated(op, layer, binding, windows=not allow_large_windows, large=large)
        bindings.append(tuple(binding.items()))
    return CheckReport(table, tuple(bindings), tuple(large), tuple(paddings), op.key)


def bind(op: Operator, layer: object, coefficients: Mapping[str, int] | None = None) -> Binding:
    """The concrete binding of every variable of ``op`` on one layer (a Layer or a dict).

    Integrality and positivity are checked (:class:`DivisibilityError`); window sizes are not,
    since backends that zero-pad accept any window.

    >>> from kdsl.lang import *
    >>> M, Cin, Cout = primary("M Cin Cout")
    >>> matmul = Input(M, Cin) >> Share(Weight(Cin, Cout, name="w")) >> Reduce(Cin) >> Output(M, Cout)
    >>> bind(matmul, {"name": "fc", "M": 3136, "Cin": 64, "Cout": 10, "H": 56})
    {'Cin': 64, 'Cout': 10, 'M': 3136}
    """
    item = as_layer(layer)
    binding = resolve_binding(op, item, coefficients)
    _violated(op, item, binding, windows=False)
    return Binding(binding, op.key)


def pad_binding(op: Operator, layer: object, coefficients: Mapping[str, int] | None = None) -> Padding:
    """The least padding of ``op`` on one layer (a Layer or a dict): primaries rounded up until
    every size is an integer, coefficients fixed; window constraints are not checked (as in
    :func:`bind`). See :mod:`kdsl.solve.padding` for the semantics. Raises
    :class:`DivisibilityError` when padding cannot fix a size.

    >>> from kdsl.lang import library
    >>> padding = pad_binding(library.load("strided_conv2d"), {"N": 1, "Cin": 8, "Cout": 8, "H": 7, "W": 5})
    >>> print(padding.describe())
    H 7 -> 8 (Stride(H, s): H/s)
    W 5 -> 6 (Stride(W, s): W/s)
    >>> padding.input_shape, padding.output_shape
    ((1, 8, 7, 5), (1, 8, 4, 3))
    """
    item = as_layer(layer)
    binding = resolve_binding(op, item, coefficients)
    padding = pad_sizes(op, item, binding, constraints(op))
    _violated(op, item, padding.padded_binding, windows=False)
    return padding


def assignments(
    op: Operator,
    layers: object,
    choices: Mapping[str, Iterable[int]],
    *,
    allow_large_windows: bool = False,
) -> list[dict[str, int]]:
    """Every assignment of coefficient values under which ``op`` checks on all ``layers``.

    ``choices`` maps a coefficient to its candidate values. A coefficient without choices takes
    its default (``op.defaults``) and appears in each assignment; one that every layer binds is
    taken from the layers and does not appear; otherwise :class:`LayerError`. Names in
    ``choices`` that are not coefficients of ``op`` are ignored, and so are values below 1.
    Assignments come in product order: coefficients by name, values ascending. Each constraint is
    checked as soon as its variables are assigned, so invalid prefixes are pruned early.

    >>> from kdsl.lang import *
    >>> H = primary("H"); s, K = coefficient("s K")
    >>> op = Input(H) >> Unfold(H, K, "k") >> Stride(H, s) >> Reduce("k") >> Output("H")
    >>> assignments(op, "resnet18", {"K": [3, 7, 9], "s": [1, 2, 7]})
    [{'K': 3, 's': 1}, {'K': 3, 's': 7}]
    """
    if not isinstance(choices, Mapping):
        raise LayerError(f"choices must be a dict like {{'K': [1, 3, 5]}}, got {choices!r}")
    table = as_layers(layers)
    defaults = dict(op.defaults)
    names: list[str] = []
    candidates: list[list[int]] = []
    per_layer: set[str] = set()
    for name in op.coefficient_variables:
        if name in choices:
            values = choices[name]
            if isinstance(values, (int, str, bytes)) or not isinstance(values, Iterable):
                raise LayerError(f"choices[{name!r}] must be a list of ints, got {values!r}")
            found: set[int] = set()
            for value in values:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise LayerError(f"choices[{name!r}] holds {value!r}, which is not an integer")
                if value >= 1:
                    found.add(value)
            names.append(name)
            candidates.append(sorted(found))
        elif name in defaults:
            names.append(name)
            candidates.append([defaults[name]])
        elif all(name in layer for layer in table):
            per_layer.add(name)
        else:
            raise LayerError(
                f"the coefficient {name} has no choices, no default and is not bound by every layer: "
                f"pass choices={{'{name}': [1, 2, 3]}} or give the operator defaults"
            )
    # per-layer base bindings (primaries and coefficients the layers bind)
    bases: list[dict[str, int]] = []
    for layer in table:
        base: dict[str, int] = {}
        for var in op.variables:
            if var.kind != "coefficient" or var.name in per_layer:
                value = layer.get(var.name)
                if value is None:
                    raise LayerError(
                        f"{layer_label(layer.name)} does not bind the variable {var.name} that the operator needs "
                        f"(it binds {', '.join(layer) or 'nothing'}); add {var.name} to the layer table"
                    )
                base[var.name] = value
        bases.append(base)
    # each constraint is checked at the depth where its last enumerated variable is assigned
    position = {name: i for i, name in enumerate(names)}
    levels: list[list[Constraint]] = [[] for _ in range(len(names) + 1)]
    for constraint in constraints(op):
        if constraint.kind == "window" and allow_large_windows:
            continue
        depth = max((position[v] + 1 for v in constraint.variables if v in position), default=0)
        levels[depth].append(constraint)
    if not all(c.holds(base) for c in levels[0] for base in bases):
        return []
    results: list[dict[str, int]] = []

    def extend(depth: int) -> None:
        if depth == len(names):
            first = bases[0] if bases else {}
            results.append({name: first[name] for name in names})
            return
        name = names[depth]
        for value in candidates[depth]:
            for base in bases:
                base[name] = value
            if all(c.holds(base) for c in levels[depth + 1] for base in bases):
                extend(depth + 1)

    extend(0)
    return results


__all__ = [
    "Binding",
    "CheckReport",
    "Constraint",
    "KINDS",
    "assignments",
    "bind",
    "check",
    "constraints",
    "pad_binding",
    "resolve_binding",
]
