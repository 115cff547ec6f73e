"""Building operators with ``>>``: pipelines, partial operators and the finished Operator.

``Split(...) >> Merge(...)`` is a :class:`Pipeline`, a reusable fragment (composition is
associative). ``Input(...) >> fragment`` checks each primitive as it is applied and gives a
:class:`Builder` (a partial operator); ``>> Output(...)`` declares the output order and gives an
:class:`~kdsl.lang.operator.Operator`, an immutable, hashable value (a linear one: the input and
one :class:`~kdsl.lang.chain.Chain`).

>>> from kdsl.lang import *
>>> N, Cin, Cout, H, W = primary("N Cin Cout H W"); K = coefficient("K")
>>> window = Unfold(H, K, "kh") >> Unfold(W, K, "kw")
>>> w = Weight(Cout, Cin, "kh", "kw", name="w")
>>> conv = Input(N, Cin, H, W) >> window >> Share(w) >> Reduce(Cin, "kh", "kw") >> Output(N, Cout, H, W)
>>> [str(d.size) for d in conv.outputs]
['N', 'Cout', 'H', 'W']
>>> [str(s) for s in conv.weights[0].shape]
['Cout', 'Cin', 'K', 'K']
"""

from __future__ import annotations

import keyword
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kdsl.lang.chain import Chain, close_chain, partial_text, replay
from kdsl.lang.errors import KdslError, ShapeError
from kdsl.lang.live import Live
from kdsl.lang.operator import Operator
from kdsl.lang.primitive_base import WeightNames
from kdsl.lang.primitives import PRIMITIVES, BuildContext, Dim, Output, Pipeline, Primitive, Weight, dim_of
from kdsl.lang.sizes import Size

#: Set by :mod:`kdsl.lang.branches`: what a linear build does with a Canvas step (``"step"``) or an
#: arithmetic join of two tensors (``"blend"``). This module knows nothing of graphs.
GRAPH_HOOKS: dict[str, Callable[..., Any]] = {}


class _Joinable:
    """``a + b``, ``a - b`` and ``a * b`` of inputs and partial builds: blends (a branching kernel)."""

    __slots__ = ()

    def __add__(self, other: object) -> Any:
        return GRAPH_HOOKS["blend"](self, "add", other)

    def __sub__(self, other: object) -> Any:
        return GRAPH_HOOKS["blend"](self, "sub", other)

    def __mul__(self, other: object) -> Any:
        return GRAPH_HOOKS["blend"](self, "mul", other)


@dataclass(frozen=True, init=False)
class Input(_Joinable):
    """A data input: its dims in order (variables, or ``Dim(name, size)``) and, in a kernel of
    several inputs, its ``name`` (the generated ``forward``'s argument; each input of such a
    kernel is named, each name once). A kernel of one input ignores the name: it is ``x``.

    >>> from kdsl.lang import *
    >>> B, M, N, D = primary("B M N D")
    >>> q, k = Input(B, M, D, name="q"), Input(B, N, D, name="k")
    >>> scores = Product(q, k, "D") >> Output(B, M, N)
    >>> scores.input_names
    ('q', 'k')
    """

    dims: tuple[Dim, ...]
    name: str | None

    def __init__(self, *dims: object, name: str | None = None) -> None:
        if not dims:
            raise ShapeError("Input() needs at least one dim")
        if name is not None:
            check_input_name(name)
        made = tuple(dim_of(d, "Input") for d in dims)
        seen: set[str] = set()
        for dim in made:
            if dim.name in seen:
                raise ShapeError(f"Input: the dim name {dim.name!r} appears twice; name each dim differently")
            seen.add(dim.name)
        object.__setattr__(self, "dims", made)
        object.__setattr__(self, "name", name)

    def __rshift__(self, other: object) -> Any:
        return Builder.start(self.dims, self.name) >> other


def check_input_name(name: object) -> str:
    """``name`` if it can name an input (a Python identifier, not a keyword, not ``self``)."""
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name in ("self", "op"):
        raise ShapeError(
            f"Input(..., name={name!r:.40}): an input's name must be a Python identifier (it names the "
            f"generated forward's argument), like 'q'"
        )
    return name


class Builder(_Joinable):
    """A partial operator: the input, the resolved steps so far and the live dims.

    A Builder is a value: ``b >> x`` and ``b >> y`` both extend the same ``b``. The live dims are
    handed on to the first extension instead of copied (a chain of n steps over d dims costs
    O(n + d), not O(n * d)); a builder extended a second time replays its steps to get them back.
    """

    __slots__ = ("inputs", "steps", "_live", "_context", "closed_vertex", "input_name")

    def __init__(
        self,
        inputs: tuple[Dim, ...],
        steps: tuple[Primitive, ...],
        live: Live | None,
        weights: list[Weight],
        earlier: WeightNames | None = None,
        input_name: str | None = None,
    ) -> None:
        self.inputs = inputs
        #: the name of the Input this build starts from (kept for a kernel of several inputs)
        self.input_name = input_name
        self.steps = steps
        self._live = live
        self._context: BuildContext | None = BuildContext(list(weights), earlier) if live is not None else None
        #: the graph vertex this build closes into when it branches (kdsl.lang.branches), made once
        self.closed_vertex: Any = None

    @staticmethod
    def start(inputs: tuple[Dim, ...], input_name: str | None = None) -> Builder:
        return Builder(inputs, (), Live({d.name: d.size for d in inputs}, ()), [], input_name=input_name)

    def _state(self) -> tuple[Live, BuildContext]:
        """The live dims and weights after the steps, replayed if they were handed on."""
        if self._live is None or self._context is None:
            self.steps, self._live, self._context = replay(self.inputs, self.steps)
        return self._live, self._context

    @property
    def live(self) -> Live:
        """The live dims after the steps (do not change them)."""
        return self._state()[0]

    @property
    def weights(self) -> list[Weight]:
        """The weights shared so far, in order."""
        return list(self._state()[1].weights)

    @property
    def shape(self) -> dict[str, Size]:
        """The live dims, name -> size."""
        return dict(self.live.sizes)

    def _apply(self, primitive: Primitive) -> Builder:
        return self._apply_all((primitive,))

    def _apply_all(self, primitives: tuple[Primitive, ...]) -> Builder:
        live, context = self._state()
        # hand the state on: this builder replays its steps if it is ever extended again
        self._live = self._context = None
        steps = list(self.steps)
        try:
            for primitive in primitives:
                for single in primitive.expand():
                    steps.append(single.apply(live, context))
        except KdslError as error:
            raise error.with_context(partial_text(self.inputs, tuple(steps))) from None
        built = Builder(self.inputs, tuple(steps), None, [], input_name=self.input_name)
        built._live, built._context = live, context
        return built

    def _text_so_far(self) -> str:
        return partial_text(self.inputs, self.steps)

    def finish_chain(self, output: Output) -> Chain:
        """The chain of the steps so far, its outputs in ``output``'s order."""
        try:
            live = self.live
        except KdslError as error:
            raise error.with_context(self._text_so_far()) from None
        return close_chain(self.inputs, self.steps, live, output, self._text_so_far())

    def finish(self, output: Output) -> Operator:
        """The linear operator of the steps so far (the input and one chain)."""
        return Operator.linear(self.finish_chain(output))

    def __rshift__(self, other: object) -> Any:
        if isinstance(other, Primitive) and other.kind not in PRIMITIVES:
            return GRAPH_HOOKS["step"](self, other)  # a Canvas step: the build branches off into a graph
        if isinstance(other, Pipeline) and any(p.kind not in PRIMITIVES for p in other.primitives):
            return GRAPH_HOOKS["step"](self, other)
        if isinstance(other, Primitive):
            return self._apply(other)
        if isinstance(other, Pipeline):
            built = self._apply_all(other.primitives)
            return built.finish(other.output) if other.output is not None else built
        if isinstance(other, Output):
            return self.finish(other)
        raise ShapeError(f"cannot apply {other!r}; expected a primitive, a pipeline or Output(...)")

    def __repr__(self) -> str:
        return f"Builder({self.live.describe()})"
