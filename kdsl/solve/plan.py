"""Stage plans: the order in which backends lower an operator, and its FLOPs (Syno's rfactor, §8).

**Semantics.** An operator is linear in its data input: ``out = sum over reduced dims of
view(x) * prod(weights)``. Steps that touch different dims commute, so the written order of the
steps is one of many valid orders, and the order decides the cost: reducing a channel against
the first weight *before* unfolding for the second weight sums ``K`` times fewer products.

**Dependencies.** Each step consumes dim *versions* and produces new ones; a step depends on the
steps that produced the versions it consumes. A step that keeps a dim's name (a window's sliding
dim, a cyclic shift, a stride, a shared dim) still makes a new version of it (so two Shares of
one dim stay in their written order), and a name may be reused once its dim is consumed
(``Reduce("kh")`` then a new ``"kh"`` window).

**Plan.** A :class:`Plan` is a dependency-respecting order of the operator's steps
(:attr:`Plan.steps`, resolved, with dim names unique among the live dims at every point: if a
reorder would make two live dims share a name, the later one is renamed ``kh`` -> ``kh_2``).
The steps fall into two groups:

* *views* (the primitives with the ``VIEW`` fact) rearrange or replicate the data and cost
  no FLOPs;
* *contraction stages* (:class:`Stage`): a run of consecutive steps of the form ``Share* Reduce*``
  (one or more Shares then zero or more Reduces, or only Reduces). A Share after a Reduce starts a
  new stage. A stage is one einsum: the data (``Stage.operand``) times the stage's weights, summed
  over ``Stage.reduced``, gives ``Stage.result``. Its cost is the size of its iteration space
  ``Stage.iteration`` (the dims after its last Share, before its Reduces: result dims and reduced
  dims); a Reduce-only stage costs the size of the data it sums (additions). So conv2d costs
  ``N*Cout*H*W*Cin*K**2`` (the multiply-accumulate convention). A view that must sit between a
  Share and a Reduce (``Share(w[Cin]) >> Split(Cin) >> Reduce("ci")``) ends the stage: the
  Reduce becomes a Reduce-only stage of its own.

FLOPs of a plan = the sum of its stage costs (:meth:`Plan.flops_formula`, :meth:`Plan.flops`).

**No blow-ups.** A plan must not materialise what a fused order avoids. Two rules see to it:
a reshape or cyclic shift whose outputs are only summed is folded into the sum first
(:func:`folded`: ``Merge(a, b, "c") ... Reduce("c")`` is ``Reduce(a, b)``), and while a
contraction stage is open its ready Reduces run before any view (a view there would end the
stage, and the einsum would write the Share's whole product before a second pass sums it).
:meth:`Plan.tensors` lists what a lowering writes.

**Planner.** Steps without the ``HEAVY`` fact never grow the data, so they are scheduled as soon as
they are ready (in written order among themselves, Reduces first inside a stage); Reduces thus run
as early as possible. A permutation view whose dims only the output reads (a cyclic shift of an
output dim, say) runs last, on the output, instead of on the larger data where it was written. The
order of the *heavy* steps (contractions, one-to-many views) is chosen to minimize FLOPs at a
binding: every dependency-respecting order is tried (branch and bound) when there are at most
:data:`MAX_ENUMERATED` heavy steps, else a greedy order picks, at each point, the ready heavy step
after which (with the light steps it enables) the data is smallest. Ties go to the order closest to
the written one (lexicographically smallest in the written indices of the heavy steps). With no
binding the plan is chosen at a reference point: every primary variable 256, every coefficient its
default or 3. Both the operator and its :func:`folded` form are planned so, and the plan with fewer
FLOPs (then the smaller largest tensor; then the folded one) is kept.

**Lowering.** A backend walks :meth:`Plan.segments` in order: a :class:`View` applies one view
step to the data (``View.before`` -> ``View.after`` live dims), a :class:`Stage` is one einsum.

>>> from kdsl.lang import *
>>> N, C, D, E = primary("N C D E")
>>> op = (Input(N, C) >> Share(Weight(C, D, name="w1")) >> Share(Weight(D, E, name="w2"))
...       >> Reduce(C, D) >> Output(N, E))
>>> p = plan(op)
>>> print(p.describe())
stage 1: [N, C] * w1[C, D] -> sum over C -> [N, D]  (cost C*D*N)
stage 2: [N, D] * w2[D, E] -> sum over D -> [N, E]  (cost D*E*N)
>>> p.flops_formula()
C*D*N + D*E*N
>>> p.flops({"N": 1, "C": 2, "D": 3, "E": 4})
18
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from math import prod
from typing import TYPE_CHECKING

from kdsl.lang.chain import Chain
from kdsl.lang.errors import DivisibilityError, LayerError, LoweringError
from kdsl.lang.live import Live
from kdsl.lang.names import unused_name
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import (
    CONTRACTION,
    HEAVY,
    REDUCTION,
    VIEW,
    BuildContext,
    Dim,
    Primitive,
    Weight,
)
from kdsl.lang.sizes import Size
from kdsl.solve.dependencies import NOT_PERMUTATIONS, DependencyGraph, dependency_graph, folded
from kdsl.solve.layers import Layer

if TYPE_CHECKING:
    import sympy

#: Above this many heavy steps (contractions and one-to-many views) the planner orders them greedily.
MAX_ENUMERATED = 7
#: The reference point at which a plan is chosen when no binding is given.
REFERENCE_PRIMARY = 256
REFERENCE_COEFFICIENT = 3

_VIEW, _SHARE, _REDUCE = 0, 1, 2
_NONE, _SHARING, _REDUCING = 0, 1, 2

Dims = tuple[tuple[str, Size], ...]
#: The ready light steps of a scheduler: (Reduces, other steps), each a heap of written indices.
_Lights = tuple[list[int], list[int]]


def _kind(step: Primitive) -> int:
    if CONTRACTION in step.facts:
        return _SHARE
    if REDUCTION in step.facts:
        return _REDUCE
    return _VIEW


def _heavy(step: Primitive) -> bool:
    return HEAVY in step.facts


def reference_binding(op: Operator) -> dict[str, int]:
    """The reference point: every primary variable 256, every coefficient its default or 3.

    >>> from kdsl.lang import *
    >>> H = primary("H"); K = coefficient("K")
    >>> reference_binding(Input(H) >> Unfold(H, K, "k") >> Reduce("k") >> Output(H, defaults={"K": 5}))
    {'H': 256, 'K': 5}
    """
    defaults = dict(op.defaults)
    return {
        v.name: REFERENCE_PRIMARY if v.kind != "coefficient" else defaults.get(v.name, REFERENCE_COEFFICIENT)
        for v in op.variables
    }


# ------------------------------------------------------------------------------------------------
# Scheduling
# ------------------------------------------------------------------------------------------------


class _State:
    """A partial schedule with its running cost (numeric, at one binding)."""

    __slots__ = ("pending", "ready_heavy", "order", "size", "closed", "phase", "open_cost")

    pending: list[int]
    ready_heavy: list[int]
    order: list[int]
    size: Fraction
    closed: Fraction
    phase: int
    open_cost: Fraction

    def copy(self) -> _State:
        other = _State.__new__(_State)
        other.pending = list(self.pending)
        other.ready_heavy = list(self.ready_heavy)
        other.order = list(self.order)
        other.size = self.size
        other.closed = self.closed
        other.phase = self.phase
        other.open_cost = self.open_cost
        return other

    def total(self) -> Fraction:
        """FLOPs so far (a lower bound of any completion: costs only grow)."""
        return self.closed + (self.open_cost if self.phase != _NONE else 0)


class _Scheduler:
    def __init__(self, graph: DependencyGraph, binding: Mapping[str, int | Fraction]) -> None:
        self.graph = graph
        values = [size.evaluate(binding) for size in graph.sizes]
        self.factor = [
            Fraction(prod(values[v] for v in made)) / Fraction(prod(values[v] for v in taken))
            for taken, made in zip(graph.consumed, graph.produced)
        ]
        self.kind = [_kind(step) for step in graph.steps]
        self.heavy = [_heavy(step) for step in graph.steps]
        # A permutation (a reshape or cyclic shift) whose dims only the output (or another such
        # permutation) reads runs last, on the output: run when ready it would permute the largest
        # tensor instead (a cyclic shift of W right after a window over W rolls the K**2-times
        # unfolded data) and end a contraction stage.
        deferred: set[int] = set()
        for index in reversed(range(len(graph.steps))):  # a step's successors come after it
            step = graph.steps[index]
            if (
                VIEW in step.facts
                and not step.facts & NOT_PERMUTATIONS
                and deferred.issuperset(graph.successors[index])
            ):
                deferred.add(index)
        self.deferred = sorted(deferred)
        self.input_size = Fraction(prod(values[v] for v in graph.inputs))

    def start(self) -> _State:
        state = _State()
        state.pending = list(self.graph.predecessors)
        state.ready_heavy = []
        state.order = []
        state.size = self.input_size
        state.closed = Fraction(0)
        state.phase = _NONE
        state.open_cost = Fraction(0)
        lights: _Lights = ([], [])
        for index, count in enumerate(state.pending):
            if count == 0:
                if self.heavy[index]:
                    state.ready_heavy.append(index)
                else:
                    self._ready(lights, index)
        self._drain(state, lights)
        return state

    def _ready(self, lights: _Lights, index: int) -> None:
        if index in self.deferred:
            return  # appended by best_order
        heapq.heappush(lights[0] if self.kind[index] == _REDUCE else lights[1], index)

    def _do(self, state: _State, index: int, lights: _Lights) -> None:
        kind = self.kind[index]
        if kind == _SHARE:
            if state.phase == _REDUCING:
                state.closed += state.open_cost
            state.size *= self.factor[index]
            state.phase = _SHARING
            state.open_cost = state.size
        elif kind == _REDUCE:
            if state.phase == _NONE:
                state.open_cost = state.size
            state.phase = _REDUCING
            state.size *= self.factor[index]
        else:
            if state.phase != _NONE:
                state.closed += state.open_cost
                state.phase = _NONE
            state.size *= self.factor[index]
        state.order.append(index)
        for after in self.graph.successors[index]:
            state.pending[after] -= 1
            if state.pending[after] == 0:
                if self.heavy[after]:
                    insort(state.ready_heavy, after)
                else:
                    self._ready(lights, after)

    def _drain(self, state: _State, lights: _Lights) -> None:
        """Schedule the ready light steps, in written order, except that while a contraction stage
        is open its ready Reduces go first: a view there would end the stage and materialise its
        whole product (the Share's iteration space) before the sum instead of after it."""
        reduces, views = lights
        while reduces or views:
            if reduces and (not views or state.phase != _NONE or reduces[0] < views[0]):
                self._do(state, heapq.heappop(reduces), lights)
            else:
                self._do(state, heapq.heappop(views), lights)

    def advance(self, state: _State, heavy: int) -> None:
        """Schedule the ready heavy step ``heavy``, then every light step that becomes ready."""
        state.ready_heavy.remove(heavy)
        lights: _Lights = ([], [])
        self._do(state, heavy, lights)
        self._drain(state, lights)

    def best_order(self) -> list[int]:
        return self._best_order() + self.deferred

    def _best_order(self) -> list[int]:
        root = self.start()
        count = sum(self.heavy)
        if count > MAX_ENUMERATED:
            return self._greedy(root)
        best: list[object] = [None, None]

        def visit(state: _State) -> None:
            if not state.ready_heavy:
                total = state.total()
                if best[0] is None or total < best[0]:  # type: ignore[operator]
                    best[0], best[1] = total, state.order
                return
            if best[0] is not None and state.total() >= best[0]:  # type: ignore[operator]
                return
            for heavy in list(state.ready_heavy):
                child = state.copy()
                self.advance(child, heavy)
                visit(child)

        visit(root)
        return best[1]  # type: ignore[return-value]

    def _greedy(self, state: _State) -> list[int]:
        while state.ready_heavy:
            chosen: _State | None = None
            for heavy in state.ready_heavy:
                child = state.copy()
                self.advance(child, heavy)
                if chosen is None or child.size < chosen.size:
                    chosen = child
            assert chosen is not None
            state = chosen
        return state.order


# ------------------------------------------------------------------------------------------------
# The plan
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One contraction stage: ``steps[start:stop]`` of the plan, a run ``Share* Reduce*``.

    ``operand`` are the data dims entering the stage, ``weights`` the weights it multiplies (each
    indexed by its ``dims``, in declared order, with the plan's dim names), ``reduced`` the dims it
    sums over (``mean[i]`` says whether ``reduced[i]`` is averaged), ``iteration`` its iteration
    space (result dims and reduced dims), ``result`` the data dims after it, and ``cost`` the
    product of the iteration sizes (a monomial).
    """

    start: int
    stop: int
    steps: tuple[Primitive, ...]
    operand: Dims
    weights: tuple[Weight, ...]
    reduced: tuple[str, ...]
    mean: tuple[bool, ...]
    iteration: Dims
    result: Dims
    cost: Size

    def __str__(self) -> str:
        names = lambda dims: "[" + ", ".join(n for n, _ in dims) + "]"
        text = names(self.operand)
        for weight in self.weights:
            text += f" * {weight.name}[{', '.join(d.name for d in weight.dims)}]"
        if self.reduced:
            text += " -> sum over " + ", ".join(f"{n} (mean)" if m else n for n, m in zip(self.reduced, self.mean))
        return f"{text} -> {names(self.result)}  (cost {self.cost})"


@dataclass(frozen=True)
class View:
    """One view step of a plan: ``step`` turns the live dims ``before`` into ``after``."""

    index: int
    step: Primitive
    before: Dims
    after: Dims


@dataclass(frozen=True)
class Plan:
    """A lowering order of an operator: steps, contraction stages, FLOPs. See the module doc.

    ``steps`` are resolved steps (``order[i]`` is the index in ``source.steps`` of ``steps[i]``;
    ``source`` is ``op`` with the views that only feed sums folded into them, see :func:`folded`);
    ``live[i]`` are the live dims before ``steps[i]`` (``live[-1]``: after the last step);
    ``outputs`` are the output dims in the operator's output order, with the plan's names;
    ``binding`` is the point at which the plan was chosen.
    """

    op: Operator = field(repr=False)
    steps: tuple[Primitive, ...]
    order: tuple[int, ...]
    stages: tuple[Stage, ...]
    live: tuple[Dims, ...]
    inputs: tuple[Dim, ...]
    outputs: tuple[Dim, ...]
    binding: tuple[tuple[str, int | Fraction], ...]
    source: Operator = field(repr=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.source is None:
            object.__setattr__(self, "source", self.op)

    def stage_at(self, index: int) -> Stage | None:
        """The stage that ``steps[index]`` belongs to, or ``None`` for a view step."""
        for stage in self.stages:
            if stage.start <= index < stage.stop:
                return stage
        return None

    def segments(self) -> tuple[View | Stage, ...]:
        """The plan as a backend lowers it: views and stages, in order."""
        items: list[View | Stage] = []
        index = 0
        stages = {stage.start: stage for stage in self.stages}
        while index < len(self.steps):
            stage = stages.get(index)
            if stage is not None:
                items.append(stage)
                index = stage.stop
            else:
                items.append(View(index, self.steps[index], self.live[index], self.live[index + 1]))
                index += 1
        return tuple(items)

    def tensors(self) -> tuple[Dims, ...]:
        """The dims of every tensor a backend materialises along the plan: the input, each view's
        result and each stage's result. A stage's iteration space is not one of them (its einsum
        multiplies and sums without storing the products), which is why a plan that ends a stage
        before its sum (a Share-only stage) shows here and a fused one does not."""
        found = [self.live[0]]
        for item in self.segments():
            found.append(item.result if isinstance(item, Stage) else item.after)
        return tuple(found)

    def largest_tensor(self, binding: Mapping[str, int] | None = None) -> int:
        """The number of elements of the largest of :meth:`tensors` at ``binding`` (default: the
        binding the plan was chosen at), a proxy for the memory the lowering writes.

        >>> from kdsl.lang import *
        >>> N, C, D, E = primary("N C D E")
        >>> op = (Input(N, C) >> Share(Weight(C, D, E, name="w")) >> Merge(D, E, "DE") >> Reduce(C)
        ...       >> Output(N, "DE"))
        >>> plan(op).largest_tensor({"N": 2, "C": 3, "D": 4, "E": 5})  # [N, D, E], not [N, C, D, E]
        40
        >>> plan(op, reorder=False).largest_tensor({"N": 2, "C": 3, "D": 4, "E": 5})
        120
        """
        values = {**dict(self.binding), **(dict(_as_mapping(binding)) if binding is not None else {})}
        sizes = [prod((size.evaluate(values) for _, size in dims), start=Fraction(1)) for dims in self.tensors()]
        return int(max(sizes))

    def flops_formula(self) -> sympy.Expr:
        """The FLOPs as a SymPy expression: the sum of the stage costs."""
        import sympy

        return sympy.Add(*(stage.cost.to_sympy() for stage in self.stages))

    def flops(self, binding: Mapping[str, int]) -> int:
        """The FLOPs under a concrete binding (a dict or Layer; coefficients it lacks take the
        operator's defaults)."""
        values = {**dict(self.op.defaults), **_as_mapping(binding)}
        total = sum((stage.cost.evaluate(values) for stage in self.stages), Fraction(0))
        if total.denominator != 1:
            raise DivisibilityError(
                f"the FLOPs {self.flops_formula()} are {total} under {values}, not an integer: the binding "
                f"does not satisfy the operator's constraints (see kdsl.solve.check)"
            )
        return int(total)

    def describe(self) -> str:
        """One line per view step and per stage."""
        lines = []
        number = 0
        for item in self.segments():
            if isinstance(item, Stage):
                number += 1
                lines.append(f"stage {number}: {item}")
            else:
                lines.append(f"view: {item.step!r}")
        return "\n".join(lines)


def _as_mapping(binding: object) -> Mapping[str, int]:
    if isinstance(binding, Layer):
        return binding.values
    if not isinstance(binding, Mapping):
        raise LayerError(f"a binding must be a dict of variable -> value, got {binding!r}")
    return binding


def _stages(steps: tuple[Primitive, ...], live: tuple[Dims, ...]) -> tuple[Stage, ...]:
    stages: list[Stage] = []
    start = -1
    first_reduce = -1

    def close(stop: int) -> None:
        iteration = live[first_reduce] if first_reduce >= 0 else live[stop]
        part = steps[start:stop]
        reduces = [s for s in part if REDUCTION in s.facts]
        cost = Size.of(1)
        for _, size in iteration:
            cost = cost * size
        stages.append(
            Stage(
                start=start,
                stop=stop,
                steps=part,
                operand=live[start],
                weights=tuple(s.weight for s in part if CONTRACTION in s.facts),  # type: ignore[attr-defined]
                reduced=tuple(s.dim for s in reduces),  # type: ignore[misc]
                mean=tuple(s.mean for s in reduces),
                iteration=iteration,
                result=live[stop],
                cost=cost,
            )
        )

    for index, step in enumerate(steps):
        kind = _kind(step)
        if kind == _SHARE:
            if start >= 0 and first_reduce >= 0:
                close(index)
                start = -1
            if start < 0:
                start, first_reduce = index, -1
        elif kind == _REDUCE:
            if start < 0:
                start, first_reduce = index, -1
            if first_reduce < 0:
                first_reduce = index
        elif start >= 0:
            close(index)
            start = -1
    if start >= 0:
        close(len(steps))
    return tuple(stages)


def _build(
    op: Operator, ordered: Operator, graph: DependencyGraph, order: list[int], binding: tuple[tuple[str, object], ...]
) -> Plan:
    names: dict[int, str] = {v: graph.names[v] for v in graph.inputs}
    taken = set(names.values())
    renamed: list[Primitive] = []
    for index in order:
        step = graph.steps[index]
        for version in graph.consumed[index]:
            taken.discard(names[version])
        made = graph.produced[index]
        for version, source in zip(made, graph.inherit[index]):
            if source >= 0:  # keeps the name of the dim it replaces (first, so a fresh name cannot take it)
                names[version] = names[source]
                taken.add(names[version])
        for version, source in zip(made, graph.inherit[index]):
            if source < 0:
                names[version] = unused_name(graph.names[version], taken)
                taken.add(names[version])
        consumed = {name: names[v] for name, v in zip(step.consumes, graph.consumed[index])}
        produced = {name: names[v] for name, v in zip(step.produces, made)}
        renamed.append(step.renamed(consumed, produced))
    # replay: validates the order and records the live dims before each step
    live = Live({d.name: d.size for d in op.inputs}, frozenset())
    context = BuildContext()
    snapshots: list[Dims] = [tuple(live.sizes.items())]
    steps: list[Primitive] = []
    for step in renamed:
        steps.append(step.apply(live, context))
        snapshots.append(tuple(live.sizes.items()))
    outputs = tuple(Dim(names[v], graph.sizes[v]) for v in graph.outputs)
    return Plan(
        op=op,
        steps=tuple(steps),
        order=tuple(order),
        stages=_stages(tuple(steps), tuple(snapshots)),
        live=tuple(snapshots),
        inputs=op.inputs,
        outputs=outputs,
        binding=binding,  # type: ignore[arg-type]
        source=ordered,
    )


def _cost(p: Plan) -> tuple[Fraction, int]:
    values = dict(p.binding)
    return sum((stage.cost.evaluate(values) for stage in p.stages), Fraction(0)), p.largest_tensor()


@lru_cache(maxsize=1024)
def _plan(op: Operator, binding: tuple[tuple[str, int | Fraction], ...], reorder: bool) -> Plan:
    if not reorder:
        graph = dependency_graph(op)
        return _build(op, op, graph, list(range(len(graph.steps))), binding)
    plans = []
    # the folded operator first: on a tie it wins (it writes no larger tensor); the operator as
    # written stays a candidate because summing a folded view's parts early can cost a pass more
    # (a part of size 1 at this binding is summed in a pass of its own)
    for source in dict.fromkeys((folded(op), op)):
        graph = dependency_graph(source)
        order = _Scheduler(graph, dict(binding)).best_order()
        if len(order) != len(graph.steps):  # pragma: no cover - the dependency graph is acyclic
            raise AssertionError("the planner lost steps")
        plans.append(_build(op, source, graph, order, binding))
    return min(plans, key=_cost)


def plan(op: Operator, binding: Mapping[str, int] | None = None, *, reorder: bool = True) -> Plan:
    """The cheapest plan of ``op`` at ``binding`` (a dict or Layer; variables it lacks, or all of
    them when it is ``None``, take the reference values: primaries 256, coefficients their
    default or 3). Plans are cached per operator and binding.

    ``reorder=False`` keeps the written order of the steps (the plan without rfactor), for
    comparison.

    >>> from kdsl.lang import *
    >>> N, C, L = primary("N C L"); K = coefficient("K")
    >>> op = Input(N, C, L) >> Unfold(L, K, "k") >> Reduce(C, "k") >> Output(N, L)
    >>> print(plan(op).describe())
    stage 1: [N, C, L] -> sum over C -> [N, L]  (cost C*L*N)
    view: Unfold(dim='L', window=Size(K), name='k')
    stage 2: [N, L, k] -> sum over k -> [N, L]  (cost L*N*K)
    >>> print(plan(op, reorder=False).describe())
    view: Unfold(dim='L', window=Size(K), name='k')
    stage 1: [N, C, L, k] -> sum over C, k -> [N, L]  (cost C*L*N*K)

    A branching kernel has one plan per chain: :func:`chain_plans`.
    """
    if not op.is_linear:
        raise LoweringError(
            "plan() orders the steps of one linear operator; a branching kernel has one plan per chain: "
            "use kdsl.solve.plan.chain_plans(kernel)"
        )
    point: dict[str, int | Fraction] = dict(reference_binding(op))
    if binding is not None:
        for name, value in _as_mapping(binding).items():
            if name in point:
                if isinstance(value, bool) or not isinstance(value, (int, Fraction)) or value <= 0:
                    raise LayerError(f"the binding {name}={value!r} must be a positive integer")
                point[name] = value
    return _plan(op, tuple(point.items()), bool(reorder))


def chain_plans(graph: Operator, binding: Mapping[str, int] | None = None, *, reorder: bool = True) -> dict[int, Plan]:
    """The plan of every chain of a branching kernel, by node index, at ``binding`` (variables it
    lacks take the kernel's reference values: primaries 256, coefficients its default or 3).

    >>> from kdsl.lang import *
    >>> N, C, H, W = primary("N C H W")
    >>> x = Input(N, C, H, W)
    >>> kernel = (x * (x >> Reduce(H, W, mean=True) >> Map("sigmoid"))) >> Output(N, C, H, W)
    >>> print(chain_plans(kernel)[1].describe())
    stage 1: [N, C, H, W] -> sum over H (mean), W (mean) -> [N, C]  (cost C*H*N*W)
    """
    point: dict[str, int] = reference_binding(graph)
    if binding is not None:
        point.update((name, value) for name, value in _as_mapping(binding).items() if name in point)
    return {
        index: plan(node.step, point, reorder=reorder)
        for index, node in enumerate(graph.nodes)
        if isinstance(node.step, Chain)
    }


__all__ = ["MAX_ENUMERATED", "Plan", "Stage", "View", "chain_plans", "plan", "reference_binding"]
