"""Free widths: what shape matching leaves of them, and the budget solver that fills them.

A template (an operator with dynamic variables, ``x1 = dynamic("x1")``) is completed per layer in
two steps, as Canvas does (§6.2-6.3):

1. *Shape matching* already happened while the kernel was built: where two branches join, a width
   that can make their sizes equal was solved and substituted (:func:`kdsl.lang.unify`). What is
   left is *freedom*: each remaining width must make every size it appears in an integer, so it
   must be a multiple of the denominators around it — :func:`freedom` says which, symbolically
   (``x1 must be a multiple of G*K``), and :func:`multiples` gives the least such value per layer
   (Canvas's ``lcm_{i,j}``).
2. *Budget filling* (:func:`fill`): the base value of each width on layer ``i`` is its multiple
   scaled by the layer's channels relative to the layer with the fewest (``k_i = ceil(C_i lcm_1 /
   (C_1 lcm_i))``, ``x_i = k_i lcm_i``), so widths keep the network's channel proportions; then, in
   rounds, each width is doubled — least cost per added unit first — while the FLOPs and parameter budgets
   (summed over the layers) still hold, until a round doubles nothing.

Widths are per layer (a width that suits 64 channels does not suit 512); coefficients (``G``,
``K``) stay what the layers, ``coefficients`` or the defaults say.

>>> from kdsl.lang import *
>>> N, Cin, H, W = primary("N Cin H W"); x1 = dynamic("x1")
>>> x = Input(N, Cin, H, W)
>>> gate = (x >> Reduce(H, W, mean=True) >> FC(Cin, name="z", size=x1, weight="squeeze") >> Map("relu")
...         >> FC("z", name="c", size=Cin, weight="excite") >> Map("sigmoid") >> Rename("c", "Cin"))
>>> se = (x * gate) >> Output(N, Cin, H, W)
>>> filled = fill(se, "resnet18", max_params=180_000)
>>> [b["x1"] for b in filled.base], [values["x1"] for values in filled.values], filled.total["params"]
([1, 2, 4, 8], [32, 32, 64, 128], 176128)

The base widths keep the channels' proportions (64, 128, 256, 512 channels); four full rounds
double every width, and the fifth doubles only the first layer's, the one that costs least per
added channel (the next, 2*128*32 more parameters on conv3_x, would exceed the budget).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

from kdsl.lang import library
from kdsl.lang.errors import BudgetError, DivisibilityError, KdslError, LayerError
from kdsl.lang.operator import Operator
from kdsl.solve.constraints import check, resolve_binding
from kdsl.solve.cost import cost
from kdsl.solve.layers import Layer, as_layers, layer_label
from kdsl.solve.widths import WidthRule, freedom, layer_rules, width_terms

__all__ = ["BudgetError", "Filled", "fill", "freedom", "is_relative", "multiples", "parse_budget", "with_widths"]

#: budgets fill can aim at, each the name of a cost metric
BUDGETS = ("flops", "params")
#: how many rounds of doubling fill tries at most (2**40 times a base width is far past any budget)
MAX_ROUNDS = 40


_BUDGET = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kKmMgGtT]?)\s*(x?)\s*$")


def read_budget(text: str | int | float) -> tuple[float, bool]:
    """The number a budget's text says and whether it is relative (``0.5x``), before any baseline:
    a :class:`BudgetError` unless it is a positive, finite number.

    >>> read_budget("0.5x"), read_budget("150M")
    ((0.5, True), (150000000.0, False))
    >>> read_budget("1e400")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.BudgetError: bad budget '1e400': it is too large to be a number (at most about 1e308)
    """
    if isinstance(text, bool):
        raise BudgetError(f"bad budget {text!r}: expected a number or a string like 0.5x")
    if isinstance(text, (int, float)):
        if text <= 0 or not math.isfinite(text):
            raise BudgetError(f"bad budget {text!r}: it must be positive")
        return float(text), False
    match = _BUDGET.match(str(text))
    if not match:
        raise BudgetError(f"bad budget {text!r}: write a number (1e9, 150M, 2G) or a multiple of the baseline (0.5x)")
    number = float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[match.group(2).lower()]
    if not math.isfinite(number):
        raise BudgetError(f"bad budget {text!r}: it is too large to be a number (at most about 1e308)")
    if number <= 0:
        raise BudgetError(f"bad budget {text!r}: it must be positive")
    return number, bool(match.group(3))


def parse_budget(text: str | int | float | None, baseline: int | None = None) -> int | None:
    """A budget: an absolute number (``1e9``, ``150M``, ``2G``) or a multiple of ``baseline``
    (``0.5x``). ``None`` means no limit. A budget that comes to less than one, or overflows, is a
    :class:`BudgetError` naming it.

    >>> parse_budget("0.5x", baseline=1000), parse_budget("150M"), parse_budget(None)
    (500, 150000000, None)
    >>> parse_budget("half")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.BudgetError: bad budget 'half': write a number (1e9, 150M, 2G) or a multiple ...
    >>> parse_budget("1e-9x", baseline=1000)
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.BudgetError: bad budget '1e-9x': it comes to 1e-06, less than one (MAC or parameter)
    """
    if text is None:
        return None
    number, relative = read_budget(text)
    if relative:
        if baseline is None:
            raise BudgetError(f"budget {text!r} is relative, but there is no baseline operator to compare with")
        number *= baseline
    return _whole_budget(number, text)


def _whole_budget(number: float, text: object) -> int:
    """``number`` as a whole budget: a count of at least one, and finite (``1e400`` overflows a float)."""
    if not math.isfinite(number):
        raise BudgetError(f"bad budget {text!r}: it is too large to be a number (at most about 1e308)")
    if number < 1:
        raise BudgetError(f"bad budget {text!r}: it comes to {number:.3g}, less than one (MAC or parameter)")
    return int(number)


def _bindings(op: Operator, layers: tuple[Layer, ...], coefficients: Mapping[str, int] | None) -> list[dict[str, int]]:
    """Each layer's binding of everything but the free widths (which are set to 1 meanwhile)."""
    given = dict(coefficients or {})
    widths = {name: 1 for name in op.dynamic_variables}
    found = []
    for layer in layers:
        fixed = {name: value for name, value in widths.items() if name not in layer and name not in given}
        binding = resolve_binding(op, layer, {**fixed, **given})
        for name in fixed:
            binding[name] = 1
        found.append(binding)
    return found


def multiples(op: Operator, layers: object, coefficients: Mapping[str, int] | None = None) -> list[dict[str, int]]:
    """Per layer, the least value of each free width that makes its sizes integers (``lcm_{i,j}``).

    >>> from kdsl.lang import *
    >>> N, Cin = primary("N Cin"); G, K = coefficient("G K"); x1 = dynamic("x1")
    >>> op = (Input(N, Cin) >> Share(Weight(Cin, Dim("z", x1), name="w")) >> Reduce(Cin)
    ...       >> Split("z", G * K, "q", "c") >> Output(N, "q", "c", defaults={"G": 4}))
    >>> multiples(op, [{"name": "a", "N": 1, "Cin": 64, "K": 3}, {"name": "b", "N": 1, "Cin": 256, "K": 5}])
    [{'x1': 12}, {'x1': 20}]
    """
    table = as_layers(layers)
    terms = width_terms(op)
    rules = [layer_rules(op, binding, terms) for binding in _bindings(op, table, coefficients)]
    return [{name: rule.least() for name, rule in each.items()} for each in rules]  # type: ignore[misc]


def _channels(op: Operator, binding: Mapping[str, int]) -> Fraction:
    """What base widths scale with: the input's channel dim (its second dim, NCHW-style; its only
    dim for a one-dim input)."""
    dim = op.inputs[1] if len(op.inputs) > 1 else op.inputs[0]
    return dim.size.evaluate(binding)


@dataclass(frozen=True)
class Filled:
    """What :func:`fill` found: per layer, the widths and the costs they give.

    ``layers`` are the input layers with the widths (and the coefficients used) bound: pass them
    to the solver, or their ``.values`` to any backend (``kdsl.codegen.torch.build(op,
    filled.layers[0].values)``). ``multiples`` are the
    least valid widths (``lcm``), ``base`` the channel-scaled start, ``values`` the result.
    """

    op: Operator
    layers: tuple[Layer, ...]
    multiples: tuple[dict[str, int], ...]
    base: tuple[dict[str, int], ...]
    values: tuple[dict[str, int], ...]
    costs: tuple[dict[str, int], ...]
    budgets: dict[str, int | None]
    baseline: dict[str, int] | None = None

    @property
    def total(self) -> dict[str, int]:
        """FLOPs and parameters summed over the layers."""
        return {metric: sum(c[metric] for c in self.costs) for metric in BUDGETS}

    def binding(self, layer: str) -> dict[str, int]:
        """The widths of the layer named ``layer``."""
        for item, values in zip(self.layers, self.values):
            if item.name == layer:
                return dict(values)
        raise LayerError(f"no layer named {layer!r}; the layers are {', '.join(x.name for x in self.layers)}")

    def operator(self, layer: str) -> Operator:
        """The template with the layer's widths written in as constants (no free width left)."""
        return self.op.substituted(self.binding(layer))

    def used(self) -> dict[str, float]:
        """The share of each budget used (only the budgets given)."""
        return {m: self.total[m] / limit for m, limit in self.budgets.items() if limit}

    def report(self) -> str:
        """A table for people: per layer the multiples, base and filled widths, and costs."""
        names = self.op.dynamic_variables
        lines = []
        for name in names:
            lines.append(f"  {name}: {' '.join(str(m[name]) for m in self.multiples)} (multiples per layer)")
        header = f"  {'layer':<12}" + "".join(f"{name + ' base':>12}{name:>8}" for name in names)
        lines.append(header + f"{'M MACs':>12}{'params':>12}")
        for layer, base, values, each in zip(self.layers, self.base, self.values, self.costs):
            row = f"  {layer.name:<12}" + "".join(f"{base[n]:>12}{values[n]:>8}" for n in names)
            lines.append(row + f"{each['flops'] / 1e6:>12.2f}{each['params']:>12}")
        total = self.total
        lines.append(f"  {'total':<12}" + " " * 20 * len(names) + f"{total['flops'] / 1e6:>12.2f}{total['params']:>12}")
        for metric, limit in self.budgets.items():
            if limit:
                word = "MACs" if metric == "flops" else metric  # the CLI's word for solve.cost's flops
                lines.append(f"  {word} budget {limit}: {total[metric] / limit:.1%} used")
        return "\n".join(lines)


@lru_cache(maxsize=64)
def _baseline_cost(op: Operator, layers: tuple[Layer, ...]) -> tuple[tuple[str, int], ...]:
    """The baseline's FLOPs and parameters over the layers (a search fills many kernels against one)."""
    totals = dict.fromkeys(BUDGETS, 0)
    for layer in layers:
        each = cost(op, layer, metrics=BUDGETS)
        for metric in BUDGETS:
            totals[metric] += int(each[metric])
    return tuple(totals.items())


def is_relative(text: object) -> bool:
    """Whether a budget is a multiple of a baseline (``"0.5x"``) rather than a count."""
    return isinstance(text, str) and text.strip().lower().endswith("x")


def fill(
    op: Operator,
    layers: object,
    *,
    max_flops: str | int | float | None = None,
    max_params: str | int | float | None = None,
    baseline: Operator | str | None = None,
    coefficients: Mapping[str, int] | None = None,
) -> Filled:
    """Fill the free widths of ``op`` on every layer (Canvas §6.3) and return the result.

    Base widths: each width's least valid value per layer (:func:`multiples`) scaled with the
    layer's input channels. Then, in rounds, each width is doubled, least cost per unit first, while
    the total FLOPs and parameters over ``layers`` stay within ``max_flops``/``max_params``
    (numbers, ``"150M"``, or ``"0.5x"`` of ``baseline``: an operator or a gallery name, default
    the gallery's ``conv2d`` with its defaults). A width that costs nothing stays at its base.
    Without a budget the base widths are the answer. Raises :class:`BudgetError` when even the
    base widths exceed a budget, and the solver's usual errors when the filled kernel is not
    valid on a layer.

    >>> from kdsl.lang import *
    >>> N, Cin = primary("N Cin"); x1 = dynamic("x1")
    >>> mlp = (Input(N, Cin) >> FC(Cin, name="z", size=x1, weight="up") >> Map("relu")
    ...        >> FC("z", name="o", size=Cin, weight="down") >> Output(N, "o"))
    >>> filled = fill(mlp, [{"name": "a", "N": 1, "Cin": 8}], max_params=300)
    >>> filled.values, filled.total["params"]
    (({'x1': 16},), 256)
    """
    table = as_layers(layers)
    names = op.dynamic_variables
    if not names:
        raise LayerError("the operator has no free width (dynamic variable) to fill; check it with kdsl.solve.check")
    limits, reference = _limits(table, baseline, {"flops": max_flops, "params": max_params})
    bindings = _bindings(op, table, coefficients)
    rules = [layer_rules(op, binding) for binding in bindings]
    least, base = _base_widths(op, bindings, rules)
    # a width the layer (or ``coefficients``) gives is that layer's, not filled: kept as given
    pinned = [{name for name in names if name in layer or name in (coefficients or {})} for layer in table]
    prices = _Prices(op, bindings, names, limits, pinned, rules)
    values = [
        {name: bindings[i][name] if name in pinned[i] else value for name, value in b.items()}
        for i, b in enumerate(base)
    ]
    try:
        costs = [prices.layer_cost(i, values[i]) for i in range(len(table))]
    except KdslError as error:
        raise type(error)(f"{error} (with the base widths {_widths_text(table, values)})") from None
    totals = {m: sum(c[m] for c in costs) for m in BUDGETS}
    exceeded = prices.over(totals)
    if exceeded:
        metric = exceeded[0]
        raise BudgetError(
            f"even the least widths ({_widths_text(table, values)}) need {totals[metric]} {metric} over the layers, "
            f"more than the budget of {limits[metric]}; raise the budget or shrink the kernel"
        )
    if any(limit is not None for limit in limits.values()):
        _double_widths(prices, values, costs, totals)
    filled_layers = tuple(
        Layer(layer.name, {**layer.values, **{k: v for k, v in binding.items() if k not in names}, **widths})
        for layer, binding, widths in zip(table, bindings, values)
    )
    # the widths came from the constraints with one width each; the full check judges the rest
    try:
        check(op, filled_layers)
    except DivisibilityError as error:
        raise DivisibilityError(
            f"the filled widths do not make the kernel valid: {error}; the constraints that join several "
            f"widths in one size are not solved by fill"
        ) from None
    return Filled(op, filled_layers, tuple(least), tuple(base), tuple(values), tuple(costs), limits, reference)


def budget_limits(
    layers: object,
    *,
    max_flops: str | int | float | None = None,
    max_params: str | int | float | None = None,
    baseline: Operator | str | None = None,
) -> dict[str, int | None]:
    """The budgets over ``layers`` as counts (``flops`` and ``params``; None where not given): a
    relative one (``0.5x``) is that multiple of ``baseline``'s total cost (default ``conv2d``).

    >>> budget_limits("resnet18", max_flops="0.5x", max_params="1M")
    {'flops': 231211008, 'params': 1000000}
    """
    return _limits(as_layers(layers), baseline, {"flops": max_flops, "params": max_params})[0]


def _limits(
    table: tuple[Layer, ...], baseline: Operator | str | None, budgets: Mapping[str, str | int | float | None]
) -> tuple[dict[str, int | None], dict[str, int] | None]:
    """Each budget as a number (a relative one, ``0.5x``, of ``baseline``'s cost over ``table``), and
    that reference cost when some budget is relative."""
    reference: dict[str, int] | None = None
    if any(is_relative(value) for value in budgets.values()):
        base_op = library.load(baseline or "conv2d") if baseline is None or isinstance(baseline, str) else baseline
        reference = dict(_baseline_cost(base_op, table))
    limits = {
        metric: parse_budget(value, reference[metric] if reference and is_relative(value) else None)  # type: ignore[arg-type]
        for metric, value in budgets.items()
    }
    return limits, reference


def _base_widths(
    op: Operator, bindings: list[dict[str, int]], rules: list[dict[str, WidthRule]]
) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """Per layer, each width's least valid value, and the base widths: the least values of the layer
    with the fewest input channels, scaled with each layer's channels (rounded up to a valid value;
    a width that must divide a size takes its largest valid value where the scaled one passes it)."""
    names = op.dynamic_variables
    least = [{name: rule.least() or 1 for name, rule in each.items()} for each in rules]
    channels = [_channels(op, binding) for binding in bindings]
    smallest = min(range(len(bindings)), key=lambda i: channels[i])
    base = []
    for i in range(len(bindings)):
        values = {}
        for name in names:
            target = Fraction(channels[i] * least[smallest][name], channels[smallest])
            rule = rules[i][name]
            values[name] = rule.at_least(target) or rule.largest() or least[i][name]
        base.append(values)
    return least, base


@dataclass
class _Prices:
    """The cost of widths on one layer of the table, priced once each, and which budgets totals break."""

    op: Operator
    bindings: list[dict[str, int]]
    names: tuple[str, ...]
    limits: Mapping[str, int | None]
    pinned: list[set[str]]
    rules: list[dict[str, WidthRule]]
    seen: dict[tuple[int, tuple[int, ...]], dict[str, int]] = field(default_factory=dict)

    def layer_cost(self, i: int, values: Mapping[str, int]) -> dict[str, int]:
        key = (i, tuple(values[name] for name in self.names))
        if key not in self.seen:  # a round prices each doubling, then takes some of them: price once
            each = cost(self.op, {**self.bindings[i], **values}, metrics=BUDGETS)
            self.seen[key] = {metric: int(each[metric]) for metric in BUDGETS}
        return self.seen[key]

    def over(self, totals: Mapping[str, int]) -> list[str]:
        return [m for m in BUDGETS if self.limits[m] is not None and totals[m] > self.limits[m]]  # type: ignore[operator]


def _double_widths(
    prices: _Prices, values: list[dict[str, int]], costs: list[dict[str, int]], totals: dict[str, int]
) -> None:
    """Double widths in rounds, least budget share per unit of width first, while the totals stay
    within the budgets (``values``, ``costs`` and ``totals`` are updated in place)."""
    limits = prices.limits
    for _ in range(MAX_ROUNDS):
        order = []
        for i in range(len(values)):
            for name in prices.names:
                grown = prices.rules[i][name].grown(values[i][name])
                if name in prices.pinned[i] or grown is None:
                    continue
                trial = prices.layer_cost(i, {**values[i], name: grown})
                # the share of the budget each added unit of width costs (the tightest budget)
                delta = max(
                    (trial[m] - costs[i][m]) / limits[m] / (grown - values[i][name])  # type: ignore[operator]
                    for m in BUDGETS
                    if limits[m] is not None
                )
                if delta > 0:  # a width that costs nothing has no budget to fill
                    order.append((delta, i, name))
        doubled = False
        for _, i, name in sorted(order):
            candidate = {**values[i], name: prices.rules[i][name].grown(values[i][name])}
            trial = prices.layer_cost(i, candidate)
            new_totals = {m: totals[m] - costs[i][m] + trial[m] for m in BUDGETS}
            if not prices.over(new_totals):
                values[i], costs[i], doubled = candidate, trial, True
                totals.update(new_totals)
        if not doubled:
            break


def _widths_text(layers: tuple[Layer, ...], values: list[dict[str, int]]) -> str:
    return "; ".join(
        f"{layer_label(layer.name)}: " + ", ".join(f"{k}={v}" for k, v in widths.items())
        for layer, widths in zip(layers, values)
    )


def with_widths(op: Operator, layers: object, widths: Mapping[str, Mapping[str, int]] | None) -> tuple[Layer, ...]:
    """The layers with a template's free widths bound (``widths``: layer name -> width -> value, as
    :class:`Filled` finds them and the results store keeps them); an operator without free widths
    gets the layers as they are.

    >>> from kdsl.lang import *
    >>> N, C = primary("N C"); x1 = dynamic("x1")
    >>> op = Input(N, C) >> FC(C, name="z", size=x1, weight="w") >> Output(N, "z")
    >>> with_widths(op, [{"name": "a", "N": 1, "C": 8}], {"a": {"x1": 4}})[0]
    Layer('a', {'C': 8, 'N': 1, 'x1': 4})
    """
    table = as_layers(layers)
    names = op.dynamic_variables
    if not names:
        return table
    found = []
    for layer in table:
        given = dict((widths or {}).get(layer.name) or {})
        missing = [name for name in names if name not in given and name not in layer]
        if missing:
            raise LayerError(
                f"the template's free widths {', '.join(missing)} have no value on {layer_label(layer.name)}; "
                f"fill them with kdsl.solve.fill on these layers (the widths given cover "
                f"{', '.join(sorted(widths or {})) or 'no layer'})"
            )
        found.append(Layer(layer.name, {**layer.values, **{k: int(v) for k, v in given.items() if k in names}}))
    return tuple(found)
