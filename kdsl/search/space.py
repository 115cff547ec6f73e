"""Search spaces: what to synthesize (input and output shapes), from what (size vocabulary, caps),
for which layers, and within which budgets.

A :class:`Space` is immutable in spirit and precomputes what the hot loop needs: the candidate
sizes of reductions, Merge blocks and Stride factors (monomials over the spec's variables), and a
*validity mask* for any size: bit ``a`` is set when the size is a positive integer on every layer
under the ``a``-th assignment of coefficient values (the product of the candidate values). A
partial operator keeps the AND of the masks of the sizes it created; when it drops to 0 no
assignment can make the operator valid and the branch is pruned. No SymPy in any of it.

>>> space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [2, 32]}, max_depth=6)
>>> [str(d.size) for d in space.spec.inputs], [str(d.size) for d in space.spec.outputs]
(['N', 'Cin', 'H', 'W'], ['N', 'Cout', 'H', 'W'])
>>> space.assignments
({'G': 2, 'K': 3}, {'G': 32, 'K': 3})
>>> solved = Space("conv2d_stride2", "resnet18_stride2", coefficients={"K": [3], "G": None})
>>> {c.name: c.values for c in solved.coefficients}  # s from H/s, G from the gcds of Cin, Cout, H
{'G': (2, 4, 7, 8, 14, 16, 32, 64, 128), 'K': (3,), 's': (2, 7, 14)}
>>> from kdsl.lang.sizes import primary, coefficient
>>> Cin = primary("Cin"); G, K = coefficient("G K")
>>> bin(space.mask(Cin / G)), bin(space.mask(Cin / K))
('0b11', '0b0')
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from kdsl.lang import library
from kdsl.lang.errors import KdslError, SearchError
from kdsl.lang.parser import parse_size
from kdsl.lang.primitives import REDUCTION, Dim
from kdsl.lang.sizes import Size, Var
from kdsl.search.kinds import DEFAULT_CAPS, KINDS
from kdsl.search.state import div, mul, size_order
from kdsl.solve import total_cost
from kdsl.solve.coefficients import divides, divisors
from kdsl.solve.dynamic import is_relative, parse_budget
from kdsl.solve.layers import Layer, load_layers

__all__ = ["DEFAULT_CAPS", "KINDS", "SPECS", "Coefficient", "Space", "Spec", "div", "load_spec", "mul", "parse_budget"]


@dataclass(frozen=True)
class Spec:
    """The boundary of a search: named input and output dims, and which layer variable binds each
    spec variable that a layer table does not bind itself (``aliases``, e.g. ``C`` <- ``Cin``)."""

    name: str
    inputs: tuple[Dim, ...]
    outputs: tuple[Dim, ...]
    aliases: tuple[tuple[str, str], ...] = ()
    baseline: str | None = None
    #: dims that pass through unchanged (same name and size in input and output), left out of search
    batch: tuple[str, ...] = ()
    #: primary variables that no weight may depend on (a weight's size must not grow with the image)
    spatial: tuple[str, ...] = ()

    @property
    def variables(self) -> tuple[Var, ...]:
        found: set[Var] = set()
        for dim in self.inputs + self.outputs:
            found.update(dim.size.variables)
        return tuple(sorted(found, key=Var.sort_key))


def _p(name: str) -> Size:
    return Size.variable(name, "primary")


def _c(name: str) -> Size:
    return Size.variable(name, "coefficient")


def _dims(*items: tuple[str, Size]) -> tuple[Dim, ...]:
    return tuple(Dim(n, s) for n, s in items)


N, Cin, Cout, H, W, M = (_p(n) for n in ("N", "Cin", "Cout", "H", "W", "M"))
_s = _c("s")

#: Built-in specs. ``conv2d``: [N, Cin, H, W] -> [N, Cout, H, W]. ``conv2d_stride2``: the output
#: is [N, Cout, H/s, W/s]. ``conv2d_same_channels``: [N, Cin, H, W] -> [N, Cin, H, W], for
#: depthwise operators and pooling. ``matmul``:
#: [M, Cin] -> [M, Cout] (the row count ``M`` is what ResNet layer tables call ``M = N*H*W``).
SPECS: dict[str, Spec] = {
    "conv2d": Spec(
        "conv2d",
        _dims(("N", N), ("Cin", Cin), ("H", H), ("W", W)),
        _dims(("N", N), ("Cout", Cout), ("H", H), ("W", W)),
        baseline="conv2d",
        batch=("N",),
        spatial=("H", "W"),
    ),
    "conv2d_stride2": Spec(
        "conv2d_stride2",
        _dims(("N", N), ("Cin", Cin), ("H", H), ("W", W)),
        _dims(("N", N), ("Cout", Cout), ("H", H / _s), ("W", W / _s)),
        baseline="strided_conv2d",
        batch=("N",),
        spatial=("H", "W"),
    ),
    "conv2d_same_channels": Spec(
        "conv2d_same_channels",
        _dims(("N", N), ("Cin", Cin), ("H", H), ("W", W)),
        _dims(("N", N), ("Cin", Cin), ("H", H), ("W", W)),
        baseline="depthwise_conv2d",
        batch=("N",),
        spatial=("H", "W"),
    ),
    "matmul": Spec(
        "matmul", _dims(("M", M), ("Cin", Cin)), _dims(("M", M), ("Cout", Cout)), baseline="matmul", batch=("M",)
    ),
}


def load_spec(spec: str | Spec | Mapping) -> Spec:
    """A spec from a built-in name, a JSON file, a mapping, or a Spec.

    The JSON form: ``{"name": "x", "primary": ["N", "C"], "coefficients": ["s"], "input":
    [["N", "N"], ["C", "C"]], "output": [["N", "N"], ["Cs", "C/s"]], "aliases": {}}`` (each dim
    is ``[name, size]``; sizes are read by the safe size parser).

    >>> load_spec("matmul").inputs
    (Dim(name='M', size=Size(M)), Dim(name='Cin', size=Size(Cin)))
    >>> load_spec("conv3d")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.SearchError: unknown spec 'conv3d': give a built-in spec (conv2d, ...) or a JSON file
    """
    if isinstance(spec, Spec):
        return spec
    if isinstance(spec, str) and spec in SPECS:
        return SPECS[spec]
    if isinstance(spec, str):
        path = Path(spec)
        if not path.is_file():
            names = ", ".join(SPECS)
            raise SearchError(f"unknown spec {spec!r}: give a built-in spec ({names}) or a JSON file")
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise SearchError(f"cannot read the spec file {str(path)!r}: {error}") from None
    if not isinstance(spec, Mapping):
        raise SearchError(f"a spec must be a name, a JSON file or a mapping, got {spec!r}")
    return _spec_from_mapping(spec)


def _spec_from_mapping(data: Mapping) -> Spec:
    if "inputs" in data:
        raise SearchError(
            "spec: search synthesizes operators of one data input ('input'); a kernel of several inputs "
            "(Input(..., name='q')) is written by hand"
        )
    kinds: dict[str, str] = {}
    for key, kind in (("primary", "primary"), ("coefficients", "coefficient")):
        names = data.get(key, [])
        if isinstance(names, Mapping):
            names = list(names)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise SearchError(f"spec: {key!r} must be a list of variable names, got {names!r}")
        for name in names:
            kinds[name] = kind

    def dims(key: str) -> tuple[Dim, ...]:
        items = data.get(key)
        if not isinstance(items, list) or not items:
            raise SearchError(f"spec: {key!r} must be a non-empty list of [name, size] pairs")
        made = []
        for item in items:
            if isinstance(item, str):
                item = [item, item]
            if not isinstance(item, list) or len(item) != 2 or not all(isinstance(x, str) for x in item):
                raise SearchError(f"spec: each {key} dim must be [name, size], got {item!r}")
            try:
                made.append(Dim(item[0], parse_size(item[1], kinds)))
            except KdslError as error:
                raise SearchError(f"spec: the {key} dim {item!r}: {error.message}") from None
        return tuple(made)

    aliases = data.get("aliases", {})
    if not isinstance(aliases, Mapping):
        raise SearchError(f"spec: 'aliases' must map spec variables to layer variables, got {aliases!r}")
    name = data.get("name", "custom")
    names = {}
    for key in ("batch", "spatial"):
        names[key] = data.get(key, [])
        if not isinstance(names[key], list) or not all(isinstance(n, str) for n in names[key]):
            raise SearchError(f"spec: {key!r} must be a list of names, got {names[key]!r}")
    made = Spec(
        str(name),
        dims("input"),
        dims("output"),
        tuple(sorted(aliases.items())),
        data.get("baseline"),
        tuple(names["batch"]),
        tuple(names["spatial"]),
    )
    _check_batch(made)
    return made


def _check_batch(spec: Spec) -> None:
    for name in spec.batch:
        ins = [d for d in spec.inputs if d.name == name]
        outs = [d for d in spec.outputs if d.name == name]
        if len(ins) != 1 or len(outs) != 1 or ins[0].size is not outs[0].size:
            raise SearchError(
                f"spec {spec.name}: the batch dim {name} must appear once, with one size, in input and output"
            )


@dataclass(frozen=True)
class Coefficient:
    """A coefficient variable's candidate values and its allowance: how many times (counting
    powers) it may appear in the parameters (reduced sizes, Merge blocks, Stride factors) of one
    operator."""

    name: str
    values: tuple[int, ...]
    allowance: int = 2


def _layers_for(spec: Spec, layers: object) -> tuple:
    table = load_layers(layers)
    if not spec.aliases:
        return table
    made = []
    for layer in table:
        values = layer.values
        for name, source in spec.aliases:
            if name in values:
                continue
            if source not in values:
                raise SearchError(f"spec {spec.name}: layer {layer.name} binds no {source} to give {name}")
            values[name] = values[source]
        made.append(Layer(layer.name, values))
    return tuple(made)


class Space:
    """Everything a search needs to know about what it may build.

    ``spec``: a built-in name (see :data:`SPECS`), a JSON file or a :class:`Spec`. ``layers``: a
    layer table (``"resnet18"``, a JSON file, ...): every result is valid on all of them.
    ``coefficients``: name -> candidate values (or ``(values, allowance)``), default
    ``{"K": [3], "G": [32], "s": [2]}``. Values ``None`` (or ``(None, allowance)``) ask the
    solver: the coefficient takes every value above 1 that can divide a layer size on all layers
    (:meth:`_solved_values`; ``s`` in ``conv2d_stride2`` on ``resnet18_stride2``: 2, 7, 14, the
    divisors of the gcd of H); a coefficient the spec's sizes use gets them without being named.
    Each solved value multiplies the assignments the validity masks track (G and s solved on
    ``resnet18`` give 7 x 7; a depth-4 enumeration of conv2d that ends in 25 s with G=32, s=2
    has not ended after 60 s with them solved), so keep windows like
    ``K``, which divide nothing, to a list. ``max_depth``: the most primitives per operator.
    ``caps``: per-kind caps (see :data:`DEFAULT_CAPS`). ``max_flops``/``max_params``: budgets,
    absolute or relative to the spec's baseline gallery operator (``"0.5x"``); FLOPs and params
    are summed over the layers. ``min_params``/``min_flops``: floors, written the same way; an
    operator below one is recorded as ``over_budget`` (out of the budget's range) and not a
    result: one with almost no weights or work cannot learn what the baseline learns. A floor
    above its ceiling is refused. ``reductions``: the sizes a Reduce may have (default: each
    coefficient alone, and each non-spatial primary divided by coefficient monomials within
    their allowances and ``max_coefficient_degree``, e.g. ``K``, ``Cin``, ``Cin/G``, ``Cout/(G*s)``).
    ``canonicalize``/``use_distance`` switch the canonicalization rules and shape-distance pruning
    (for benchmarks). ``weight_only_primary``: a weight's own dims
    (like ``Cout``) must carry a primary variable, i.e. be channels rather than windows.
    ``pad``: a candidate whose sizes do not divide a layer is padded there instead of rejected
    (:mod:`kdsl.solve.padding`; costs at the padded sizes) where candidates are checked on the
    layers (:func:`kdsl.search.analytic.evaluate`, and samplers that read ``space.pad``).
    Synthesis still builds only sizes that divide every layer.
    ``equal_variables``: where every layer binds a variable of the output alone to the value of a
    variable of the input (ResNet's stage convolutions have ``Cout = Cin``), an operator may end
    at the output with the first replaced by the second (``[N, Cin, H, W]``, the shape of
    ``[N, Cout, H, W]`` on every layer): so depthwise operators serve the conv2d spec. These are
    the extra :attr:`output_goals`, which enumeration walks alongside the spec's own (sampling,
    MCTS and the gallery's neighbors keep to the spec's); off, only the spec's.

    >>> space = Space("conv2d", "resnet18")
    >>> [[str(s) for s in goal] for goal in space.output_goals], space.equalities
    ([['Cout', 'H', 'W'], ['Cin', 'H', 'W']], (('Cout', 'Cin'),))
    >>> len(Space("conv2d", "resnet18", equal_variables=False).output_goals)
    1
    """

    def __init__(
        self,
        spec: str | Spec | Mapping = "conv2d",
        layers: object = "resnet18",
        *,
        coefficients: Mapping[str, object] | None = None,
        max_depth: int = 6,
        caps: Mapping[str, int | None] | None = None,
        max_flops: str | int | float | None = None,
        max_params: str | int | float | None = None,
        min_params: str | int | float | None = None,
        min_flops: str | int | float | None = None,
        reductions: Iterable[Size | str] | None = None,
        max_coefficient_degree: int = 2,
        canonicalize: bool = True,
        use_distance: bool = True,
        weight_only_primary: bool = True,
        baseline: str | None = None,
        pad: bool = False,
        equal_variables: bool = True,
    ) -> None:
        self.spec = load_spec(spec)
        self.pad = bool(pad)
        self.layers = _layers_for(self.spec, layers)
        self.layer_values = tuple(layer.values for layer in self.layers)
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or not 1 <= max_depth <= 30:
            raise SearchError(f"max_depth must be an integer from 1 to 30, got {max_depth!r}")
        self.max_depth = max_depth
        self.coefficients = self._coefficients(coefficients)
        self.coefficient_names = tuple(c.name for c in self.coefficients)
        self._coefficient_index = {name: i for i, name in enumerate(self.coefficient_names)}
        self.allowances = tuple(c.allowance for c in self.coefficients)
        self.assignments = tuple(
            dict(zip(self.coefficient_names, values))
            for values in itertools.product(*(c.values for c in self.coefficients))
        )
        self.full_mask = (1 << len(self.assignments)) - 1
        self._kinds: dict[str, str] = {v.name: v.kind for v in self.spec.variables}
        for name in self.coefficient_names:
            if self._kinds.get(name, "coefficient") != "coefficient":
                raise SearchError(f"{name} is a primary variable of the spec; it cannot be a coefficient")
            self._kinds[name] = "coefficient"
        for var in self.spec.variables:
            if var.kind == "coefficient" and var.name not in self._kinds:
                raise SearchError(f"the spec uses the coefficient {var.name}; give it candidate values")
        unknown_caps = set(caps or {}) - set(KINDS)
        if unknown_caps:
            raise SearchError(f"unknown primitive kinds in caps: {sorted(unknown_caps)}; the kinds are {KINDS}")
        self.caps = {**DEFAULT_CAPS, **(caps or {})}
        self.cap_tuple = tuple(self.caps[k] if self.caps[k] is not None else max_depth for k in KINDS)
        self.canonicalize = canonicalize
        self.use_distance = use_distance
        self.weight_only_primary = weight_only_primary
        self.max_coefficient_degree = max_coefficient_degree
        self._mask_cache: dict[Size, int] = {}
        self._window_cache: dict[tuple[Size, Size], int] = {}
        batch_vars = {v.name for d in self.spec.inputs if d.name in self.spec.batch for v in d.size.variables}
        self.primaries = tuple(v for v in self.spec.variables if v.kind == "primary" and v.name not in batch_vars)
        batch = set(self.spec.batch)
        #: the input and output dims that search works on (batch dims pass through untouched)
        self.inputs = tuple(d for d in self.spec.inputs if d.name not in batch)
        self.outputs = tuple(d for d in self.spec.outputs if d.name not in batch)
        self.input_sizes = tuple(d.size for d in self.inputs)
        self.output_sizes = tuple(d.size for d in self.outputs)
        self.spatial = frozenset(self.spec.spatial)
        every = tuple(d.size for d in self.spec.inputs + self.spec.outputs)
        if self.mask_all(every) == 0:
            raise SearchError(
                f"the spec's input/output sizes are not integers on the layers for any coefficient values "
                f"({', '.join(str(s) for s in every)})"
            )
        #: output variable -> the input variable every layer binds to the same value (when allowed)
        self.equalities = self._equalities() if equal_variables else ()
        #: the output sizes search may end at: the spec's first, then with ``equalities`` applied
        self.output_goals = (self.output_sizes,)
        if self.equalities:
            replaced = {name: Size.variable(source, "primary") for name, source in self.equalities}
            self.output_goals += (tuple(size.substitute(replaced) for size in self.output_sizes),)
        self.coefficient_monomials = self._monomials()
        self.baseline_name = baseline or self.spec.baseline
        self.reductions = self._reductions(reductions)
        self.reduction_index = {size: i for i, size in enumerate(self.reductions)}
        self.positive_monomials = tuple(m for m in self.coefficient_monomials if all(e > 0 for _, e in m.exponents))
        self._baseline_cost: dict[str, int] | None = None
        self.max_flops = parse_budget(max_flops, self.baseline_cost("flops") if is_relative(max_flops) else None)
        self.max_params = parse_budget(max_params, self.baseline_cost("params") if is_relative(max_params) else None)
        self.min_params = parse_budget(min_params, self.baseline_cost("params") if is_relative(min_params) else None)
        self.min_flops = parse_budget(min_flops, self.baseline_cost("flops") if is_relative(min_flops) else None)
        for metric, floor, ceiling in (
            ("FLOPs", self.min_flops, self.max_flops),
            ("params", self.min_params, self.max_params),
        ):
            if floor is not None and ceiling is not None and floor > ceiling:
                raise SearchError(
                    f"the least {metric} ({floor}) exceed the most {metric} ({ceiling}): no operator can be in "
                    f"between; lower min_{metric.lower()} or raise max_{metric.lower()}"
                )

    # -- construction helpers ------------------------------------------------------------------
    def _coefficients(self, given: Mapping[str, object] | None) -> tuple[Coefficient, ...]:
        used = {v.name for v in self.spec.variables if v.kind == "coefficient"}
        if given is None:
            given = {"K": [3], "G": [32], "s": [2]}
            if "s" not in used:
                given = {"K": [3], "G": [32]}
        if not isinstance(given, Mapping):
            raise SearchError(f"coefficients must map names to candidate values, got {given!r}")
        # a coefficient of the spec's own sizes without a list is solved, like one given as None
        given = {**dict.fromkeys(used), **given}
        made = []
        for name, item in sorted(given.items()):
            allowance = 2
            values = item
            if isinstance(item, Coefficient):
                made.append(item)
                continue
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], int):
                values, allowance = item
            if values is None:
                values = self._solved_values(str(name))
            if isinstance(values, int) and not isinstance(values, bool):
                values = [values]
            if not isinstance(values, Iterable) or isinstance(values, (str, bytes)):
                raise SearchError(f"coefficient {name}: candidate values must be a list of ints, got {item!r}")
            values = tuple(values)
            if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
                raise SearchError(f"coefficient {name}: candidate values must be positive ints, got {values!r}")
            if not isinstance(allowance, int) or allowance < 0:
                raise SearchError(f"coefficient {name}: the allowance must be a non-negative int, got {allowance!r}")
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(name)):
                raise SearchError(f"coefficient name {name!r} is not an identifier")
            made.append(Coefficient(str(name), values, allowance))
        return tuple(made)

    def _solved_values(self, name: str) -> tuple[int, ...]:
        """The values of a coefficient given without a list, derived from the layers
        (:mod:`kdsl.solve.coefficients`): where the spec's sizes divide by it (``H/s``), the divisors
        of the gcd over the layers that those sizes allow; otherwise any divisor of the gcd over the
        layers of one of the spec's non-batch primaries (``Cin``, ``Cout``, ``H``, ``W``), since a
        size with the coefficient in its denominator is only valid where such a gcd is a multiple of
        it. 1 is left out: it makes the coefficient vanish (``Cin/G = Cin``), so it adds no operator
        and would make every ``P/G`` size pass the validity mask, disabling the pruning."""
        spec_sizes = [d.size for d in self.spec.inputs + self.spec.outputs if d.size.exponent(name) < 0]
        if spec_sizes:
            found: set[int] | None = None
            for size in spec_sizes:
                condition = divides(size, self.layer_values, f"the spec's size {size}")
                allowed = set(condition.values(name)) if condition is not None else set()
                found = allowed if found is None else found & allowed
            where = f"the spec's sizes {', '.join(map(str, spec_sizes))}"
        else:
            batch = {v.name for d in self.spec.inputs if d.name in self.spec.batch for v in d.size.variables}
            found = set()
            for var in self.spec.variables:
                if var.kind == "primary" and var.name not in batch and all(var.name in v for v in self.layer_values):
                    found |= set(divisors(math.gcd(*(values[var.name] for values in self.layer_values))))
            where = "a gcd over the layers of the spec's primaries"
        values = tuple(sorted((found or set()) - {1}))
        if not values:
            raise SearchError(
                f"coefficient {name}: no value above 1 divides {where} on every layer, so it has no useful "
                f"value; give it a list (--set {name}=2) or leave it out"
            )
        return values

    def _equalities(self) -> tuple[tuple[str, str], ...]:
        """Each primary of the output alone paired with the first primary of the input (by name)
        that every layer binds to the same value."""
        inputs = {v.name for size in self.input_sizes for v in size.variables if v.kind == "primary"}
        outputs = {v.name for size in self.output_sizes for v in size.variables if v.kind == "primary"}
        found = []
        for name in sorted(outputs - inputs):
            for source in sorted(inputs):
                if all(name in values and values.get(source) == values[name] for values in self.layer_values):
                    found.append((name, source))
                    break
        return tuple(found)

    def _monomials(self) -> tuple[Size, ...]:
        """Coefficient monomials (constant 1) within each allowance and the total degree."""
        ranges = [range(-c.allowance, c.allowance + 1) for c in self.coefficients]
        found = []
        for exps in itertools.product(*ranges):
            if sum(abs(e) for e in exps) > self.max_coefficient_degree or not any(exps):
                continue
            found.append(Size.make(1, {Var(n, "coefficient"): e for n, e in zip(self.coefficient_names, exps)}))
        return tuple(sorted(found, key=size_order))

    def _reductions(self, given: Iterable[Size | str] | None) -> tuple[Size, ...]:
        if given is not None:
            sizes = []
            for item in given:
                try:
                    size = parse_size(item, self._kinds) if isinstance(item, str) else Size.of(item)
                except KdslError as error:
                    raise SearchError(f"reductions: {error.message}") from None
                if self.mask(size) == 0:
                    raise SearchError(f"reductions: the size {size} is not a positive integer on these layers")
                sizes.append(size)
            return tuple(dict.fromkeys(sorted(sizes, key=size_order)))
        # default: a single coefficient (a window K, a group count G), or a non-spatial primary
        # divided by coefficients (Cin, Cin/G, Cout/(G*s)): the sizes reductions have in practice
        sizes = []
        for primary in (None, *self.primaries):
            if primary is not None and primary.name in self.spatial:
                continue
            base = Size.of(1) if primary is None else Size.make(1, {primary: 1})
            for monomial in (Size.of(1), *self.coefficient_monomials):
                exponents = [e for _, e in monomial.exponents]
                if primary is None and (len(exponents) != 1 or exponents[0] != 1):
                    continue
                if primary is not None and any(e > 0 for e in exponents):
                    continue
                size = base * monomial
                if size != 1 and self.mask(size):
                    sizes.append(size)
        # The sizes the spec's baseline reduces come first (conv2d: K, Cin; then G, Cin/G, ...).
        # Reduces are generated, and made canonical, in this order, so it decides which subtree
        # enumeration walks first: with the alphabetical order G came before K, and a 20-second
        # enumeration reached conv2d after 17,933 nodes instead of 7,252.
        first = self._baseline_reductions()
        return tuple(dict.fromkeys(sorted(sizes, key=lambda size: (size not in first, size_order(size)))))

    def _baseline_reductions(self) -> frozenset[Size]:
        """The sizes of the dims the spec's baseline operator reduces (none without a baseline)."""
        if not self.baseline_name:
            return frozenset()
        try:
            op = library.load(self.baseline_name)
        except KdslError:
            return frozenset()
        steps = op.steps if op.is_linear else ()  # a branching baseline has no linear steps to read
        return frozenset(
            op.live[index][name]
            for index, step in enumerate(steps)
            if REDUCTION in step.facts
            for name in step.consumes
        )

    def baseline_cost(self, metric: str) -> int:
        """The spec baseline operator's total ``metric`` (``flops``, ``params``) over the layers; a SearchError
        where the spec names no baseline."""
        if self._baseline_cost is None:
            if not self.baseline_name:
                raise SearchError(f"spec {self.spec.name} has no baseline operator for relative budgets")
            op = library.load(self.baseline_name)
            self._baseline_cost = total_cost(op, self.layers, op.default_coefficients)
        return self._baseline_cost[metric]

    # -- size validity -------------------------------------------------------------------------
    def mask(self, size: Size) -> int:
        """Bit ``a`` set: ``size`` is a positive integer on every layer under assignment ``a``."""
        found = self._mask_cache.get(size)
        if found is not None:
            return found
        bits = 0
        for index, assignment in enumerate(self.assignments):
            if all(_integral(size, values, assignment) for values in self.layer_values):
                bits |= 1 << index
        self._mask_cache[size] = bits
        return bits

    def mask_all(self, sizes: Iterable[Size]) -> int:
        bits = self.full_mask
        for size in sizes:
            bits &= self.mask(size)
        return bits

    def window_mask(self, window: Size, main: Size) -> int:
        """Bit ``a`` set: the window is smaller than the main dim on every layer (and integral)."""
        key = (window, main)
        found = self._window_cache.get(key)
        if found is not None:
            return found
        bits = 0
        for index, assignment in enumerate(self.assignments):
            ok = True
            for values in self.layer_values:
                w = _value(window, values, assignment)
                m = _value(main, values, assignment)
                if w is None or m is None or w >= m:
                    ok = False
                    break
            if ok:
                bits |= 1 << index
        self._window_cache[key] = bits
        return bits

    def coefficient_uses(self, size: Size) -> tuple[int, ...]:
        """How many times (counting powers) each coefficient appears in ``size``."""
        uses = [0] * len(self.coefficients)
        for var, e in size.exponents:
            index = self._coefficient_index.get(var.name)
            if index is not None:
                uses[index] += abs(e)
        return tuple(uses)

    def assignment_for(self, mask: int, used: Iterable[str]) -> dict[str, int]:
        """The first assignment allowed by ``mask``, restricted to the coefficients ``used``."""
        names = set(used)
        for index, assignment in enumerate(self.assignments):
            if mask >> index & 1:
                return {k: v for k, v in assignment.items() if k in names}
        raise SearchError("no coefficient assignment is valid for this operator")

    def describe(self) -> str:
        """A one-line summary of the space, for logs and the results store.

        >>> Space("matmul", "resnet18", max_depth=3).describe()
        'matmul [M, Cin] -> [M, Cout] on 4 layers, depth <= 3, G in (32,), K in (3,), Cout = Cin on every layer'
        """
        ins = ", ".join(d.name if str(d.size) == d.name else f"{d.name}: {d.size}" for d in self.spec.inputs)
        outs = ", ".join(d.name if str(d.size) == d.name else f"{d.name}: {d.size}" for d in self.spec.outputs)
        coefficients = ", ".join(f"{c.name} in {c.values}" for c in self.coefficients)
        text = f"{self.spec.name} [{ins}] -> [{outs}] on {len(self.layers)} layers, depth <= {self.max_depth}"
        if coefficients:
            text += f", {coefficients}"
        if self.max_flops is not None:
            text += f", FLOPs <= {self.max_flops}"
        if self.min_flops is not None:
            text += f", FLOPs >= {self.min_flops}"
        if self.max_params is not None:
            text += f", params <= {self.max_params}"
        for name, source in self.equalities:
            text += f", {name} = {source} on every layer"
        if self.pad:
            text += ", padded"
        return text

    def fingerprint(self) -> str:
        """A stable description of everything that decides the enumeration order (for resuming)."""
        # "pad" appears only when on, so that the fingerprints of existing stores stay as they were
        return json.dumps(
            ({"pad": True} if self.pad else {})
            | {
                "spec": [
                    self.spec.name,
                    [str(d.size) for d in self.spec.inputs],
                    [str(d.size) for d in self.spec.outputs],
                ],
                "layers": [list(layer.items) for layer in self.layers],
                "coefficients": [[c.name, list(c.values), c.allowance] for c in self.coefficients],
                "depth": self.max_depth,
                # only where a goal was added, so that the fingerprints of other stores stay
                **({"goals": [[str(s) for s in goal] for goal in self.output_goals]} if self.equalities else {}),
                # a kind kept out of search by default appears only when enabled, so that the
                # fingerprints of existing stores stay
                "caps": [self.caps[k] for k in KINDS if DEFAULT_CAPS[k] != 0 or self.caps[k] != 0],
                "reductions": [str(s) for s in self.reductions],
                # the FLOPs floor only where set, so that the fingerprints of existing stores stay
                "budgets": [self.max_flops, self.max_params, self.min_params]
                + ([self.min_flops] if self.min_flops is not None else []),
                "switches": [
                    self.canonicalize,
                    self.use_distance,
                    self.max_coefficient_degree,
                    self.weight_only_primary,
                ],
            },
            sort_keys=True,
        )


def _value(size: Size, layer: Mapping[str, int], assignment: Mapping[str, int]) -> Fraction | None:
    value = size.constant
    for var, e in size.exponents:
        x = assignment.get(var.name)
        if x is None:
            x = layer.get(var.name)
        if x is None:
            return None
        value *= Fraction(x) ** e
    return value


def _integral(size: Size, layer: Mapping[str, int], assignment: Mapping[str, int]) -> bool:
    value = _value(size, layer, assignment)
    return value is not None and value.denominator == 1 and value >= 1
