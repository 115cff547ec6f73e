"""Partial operators built bottom-up, from the output towards the input (Syno Algorithm 1).

A :class:`State` is a partial graph: the *frontier* (the dims at its top, which must finally be
the input's dims) and the bottom-up steps applied so far. Each bottom-up step is the mirror of a
top-down primitive; what each kind does bottom-up, and how synthesis generates it, is one row of
the search table (:data:`kdsl.search.kinds.SEARCH_RULES`).

:func:`children` lists the canonical children of a state (deterministic order), pruned by the
depth, the per-kind caps, the coefficient allowances, the validity masks, the canonicalization
rules (:mod:`kdsl.search.rules`), the shape distance (:mod:`kdsl.search.distance`) and the
budgets. :func:`to_operators` turns a finished state into kdsl operators, and
:func:`canonical_path` a finished operator into the bottom-up path search takes to build it.

>>> from kdsl.search.space import Space
>>> space = Space("conv2d", "resnet18", coefficients={"K": [3]}, max_depth=6)
>>> [str(step) for step, child in children(space, root(space))][:3]
['Reduce(K)', 'Reduce(Cin)', 'Reduce(Cout)']
"""

from __future__ import annotations

import copy
import itertools
import weakref
from collections.abc import Collection, Iterable, Iterator

from kdsl.lang.build import Input, Output, Pipeline
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import Dim, Primitive
from kdsl.lang.sizes import Size
from kdsl.search.distance import state_distance
from kdsl.search.kinds import KIND_INDEX, KINDS, SEARCH_RULES, Candidate
from kdsl.search.rules import RULES, order_key_with_reduce, rejects, weight_choices
from kdsl.search.space import Space
from kdsl.search.state import CONTRACTIONS, OUT, BStep, FDim, State, mul

__all__ = [
    "BStep",
    "FDim",
    "State",
    "canonical_path",
    "children",
    "is_complete",
    "root",
    "spec_twin",
    "to_operators",
]


# ------------------------------------------------------------------------------------------------
# The empty and the finished partial graph
# ------------------------------------------------------------------------------------------------


def root(space: Space, goal: int = 0) -> State:
    """The empty partial graph: the frontier is the output, the ``goal``-th of the space's
    :attr:`~kdsl.search.space.Space.output_goals` (0: the spec's own)."""
    sizes = space.output_goals[goal]
    frontier = tuple(FDim(i, size, OUT, -1, i, False, False) for i, size in enumerate(sizes))
    zeros = tuple(0.0 for _ in space.assignments)
    mask = space.mask_all(sizes + space.input_sizes)
    return State(frontier, (), len(frontier), mask, (0,) * len(KINDS), (0,) * len(space.coefficients), zeros, zeros)


def is_complete(space: Space, state: State) -> bool:
    """Whether the frontier is exactly the input (as a multiset of sizes) with nothing pending."""
    if len(state.frontier) != len(space.input_sizes) or any(d.pending for d in state.frontier):
        return False
    return sorted(id(d.size) for d in state.frontier) == sorted(id(s) for s in space.input_sizes)


# ------------------------------------------------------------------------------------------------
# Applying bottom-up steps
# ------------------------------------------------------------------------------------------------


def _apply(
    space: Space, state: State, step: BStep, created: tuple[Size, ...], window: int | None = None
) -> State | None:
    """The child state after ``step`` (whose produced dims are already made), or None when a cap,
    an allowance, the validity mask or a budget rules it out."""
    kind_index = KIND_INDEX[step.kind]
    if state.counts[kind_index] >= space.cap_tuple[kind_index]:
        return None
    if any(size == 1 for size in created):
        # a dim of size 1 (Split(G/s, s/G) joins G/s and s/G into one): the language refuses it,
        # and converting such a state to an operator raised in the middle of a discover run
        return None
    mask = state.mask
    for size in created:
        mask &= space.mask(size)
    if window is not None:
        mask &= window
    if not mask:
        return None
    uses = state.uses
    if step.param is not None:  # reduced sizes, blocks and stride factors spend the allowances
        added = space.coefficient_uses(step.param)
        uses = tuple(u + a for u, a in zip(uses, added))
        if any(u > a for u, a in zip(uses, space.allowances)):
            return None
    params, flops_lb = state.params, state.flops_lb
    if step.kind in CONTRACTIONS:  # a new weight: its parameters, and FLOPs at least as many
        weight = _product(d.size for d in step.consumed)
        totals = space_totals(space, weight)
        params = tuple(p + t for p, t in zip(params, totals))
        flops_lb = tuple(max(f, t) for f, t in zip(flops_lb, totals))
        if space.max_params is not None and _cheapest(params, mask) > space.max_params:
            return None
        if space.max_flops is not None and _cheapest(flops_lb, mask) > space.max_flops:
            return None
    gone = {id(d) for d in step.consumed}
    frontier = tuple(d for d in state.frontier if id(d) not in gone) + step.produced
    counts = state.counts[:kind_index] + (state.counts[kind_index] + 1,) + state.counts[kind_index + 1 :]
    next_id = state.next_id + len(step.produced)
    return State(frontier, (*state.steps, step), next_id, mask, counts, uses, params, flops_lb)


def _cheapest(values: tuple[float, ...], mask: int) -> float:
    return min((v for i, v in enumerate(values) if mask >> i & 1), default=float("inf"))


def _product(sizes: Iterable[Size]) -> Size:
    result = _ONE
    for size in sizes:
        result = mul(result, size)
    return result


_ONE = Size.of(1)


def space_totals(space: Space, size: Size) -> tuple[float, ...]:
    """``size`` summed over the layers, for each coefficient assignment (cached on the space)."""
    cache = space.__dict__.setdefault("_totals_cache", {})
    found = cache.get(size)
    if found is None:
        found = tuple(
            float(sum(_value(size, values, assignment) for values in space.layer_values))
            for assignment in space.assignments
        )
        cache[size] = found
    return found


def _value(size: Size, layer: dict, assignment: dict) -> float:
    value = float(size.constant)
    for var, e in size.exponents:
        x = assignment.get(var.name, layer.get(var.name, 1))
        value *= float(x) ** e
    return value


# ------------------------------------------------------------------------------------------------
# Children
# ------------------------------------------------------------------------------------------------


def _candidates(space: Space, state: State, kinds: Collection[str] | None = None) -> Iterator[Candidate]:
    """Every bottom-up step applicable to ``state`` before pruning, in a fixed order (kind by
    kind, in the table's order), with the sizes it creates and, for a window, its mask; only
    steps of ``kinds`` when given."""
    for kind, rule in SEARCH_RULES.items():
        if kinds is None or kind in kinds:
            yield from rule.generate(space, state, weight_choices)


def children(
    space: Space,
    state: State,
    stats: dict | None = None,
    limit: int | None = None,
    kinds: Collection[str] | None = None,
) -> Iterator[tuple[BStep, State]]:
    """The canonical children of ``state`` in a fixed order, pruned by depth, caps, allowances,
    validity masks, canonicalization rules, shape distance and budgets. ``limit`` (at most the
    space's depth): the depth the operator must be finished by (iterative deepening walks the
    space with growing limits; the shape distance prunes against it). ``kinds``: only steps of
    these kinds."""

    limit = space.max_depth if limit is None else min(limit, space.max_depth)
    if state.depth >= limit:
        return
    remaining = limit - state.depth - 1
    for step, created, window in _candidates(space, state, kinds):
        # only the quality rules when canonicalization is off; a weight's dims were chosen by
        # weight_choices, which applied the weight rules already
        rule = rejects(space, state, step, chosen=step.kind in CONTRACTIONS)
        if rule is not None:
            if stats is not None:
                stats[rule] = stats.get(rule, 0) + 1
            continue
        child = _apply(space, state, step, created, window)
        if child is None:
            continue
        if space.use_distance:
            if state_distance(space, child) > remaining:
                if stats is not None:
                    stats["distance"] = stats.get("distance", 0) + 1
                continue
        elif len(child.frontier) - len(space.input_sizes) > remaining * 4 + 4:
            continue  # without shape distance, still refuse frontiers that can never shrink in time
        yield step, child


# ------------------------------------------------------------------------------------------------
# Operators of an extra output goal that the spec's own goal holds already
# ------------------------------------------------------------------------------------------------

#: per space: the same space without canonicalization and shape distance (for :func:`spec_twin`)
_UNRULED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def spec_twin(space: Space, state: State) -> State | None:
    """For a complete state that starts from an extra output goal (``[N, Cin, H, W]`` where the
    spec says ``[N, Cout, H, W]`` and every layer has ``Cout = Cin``): the state of the spec's own
    goal with the same steps, each with a size of the equal variable (``Cout``) where this one has
    the input's (``Cin``) as far as the steps allow, or None when there is none. A twin computes the
    same function on every layer of the space, so the state is a re-parametrization of an operator
    the spec's goal holds (a matmul whose weight is ``[Cin, Cin]`` instead of ``[Cout, Cin]``);
    without one, the operator needs the equality (a depthwise conv: its output channel *is* its
    input channel). None too for a state of the spec's own goal.

    The twin is looked for among every valid child (canonicalization and shape distance off, so
    that a twin that is not canonical still counts: its canonical form is in the spec's goal).

    >>> from kdsl.search.space import Space
    >>> from kdsl.lang import library
    >>> space = Space("conv2d", "resnet18", coefficients={"K": [3]}, max_depth=6)
    >>> depthwise = canonical_path(space, library.load("depthwise_conv2d"))
    >>> spec_twin(space, depthwise) is None
    True
    >>> square = Space("matmul", "resnet18", max_depth=2, canonicalize=False)
    >>> reduced = next(child for step, child in children(square, root(square, goal=1)) if str(step) == "Reduce(Cin)")
    >>> matmul = next(child for step, child in children(square, reduced) if step.kind == "Share")
    >>> matmul.steps[-1], spec_twin(square, matmul).steps[-1]  # (the rule goal_dim_not_owned prunes it early)
    (Share(weight-only [Cin], shared [Cin]), Share(weight-only [Cout], shared [Cin]))
    """
    sizes = [d.size for d in _root_dims(space, state)]
    if sizes == list(space.output_goals[0]):
        return None
    unruled = _UNRULED.get(space)
    if unruled is None:
        unruled = copy.copy(space)
        unruled.canonicalize = False
        unruled.use_distance = False
        _UNRULED[space] = unruled
    renamed = {name: Size.variable(source, "primary") for name, source in space.equalities}
    return _replay(unruled, state.steps, 0, root(unruled), renamed)


def _root_dims(space: Space, state: State) -> list[FDim]:
    """The root's dims (ids 0..n-1) of a state: each is consumed by a step or still on the frontier."""
    n = len(space.output_sizes)
    found: dict[int, FDim] = {d.id: d for d in state.frontier if d.id < n}
    for step in state.steps:
        for d in step.consumed:
            if d.id < n:
                found[d.id] = d
    return [found[i] for i in range(n)]


def _replay(space: Space, steps: tuple[BStep, ...], index: int, state: State, renamed: dict) -> State | None:
    if index == len(steps):
        return state if is_complete(space, state) else None
    want = steps[index]
    for step, child in children(space, state, kinds=(want.kind,)):
        if _matches(step, want, renamed):
            found = _replay(space, steps, index + 1, child, renamed)
            if found is not None:
                return found
    return None


def _matches(step: BStep, want: BStep, renamed: dict) -> bool:
    """``step`` is ``want`` with the equal variables renamed back (same kind, same dims)."""
    if step.kind != want.kind or len(step.produced) != len(want.produced):
        return False
    if [d.id for d in step.consumed] != [d.id for d in want.consumed]:
        return False
    if [d.id for d in step.weight_only] != [d.id for d in want.weight_only]:
        return False
    if (step.param is None) != (want.param is None):
        return False
    if step.param is not None and step.param.substitute(renamed) != want.param:
        return False
    return all(a.size.substitute(renamed) == b.size for a, b in zip(step.produced, want.produced))


# ------------------------------------------------------------------------------------------------
# Conversion to an Operator
# ------------------------------------------------------------------------------------------------


class _Names:
    """Dim names for a finished graph: dims joined by name-keeping steps (a window's main dim, a
    shifted or strided dim, a weight's shared dims: ``KindRule.same_name``) form one chain with
    one name."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        while self.parent.get(x, x) != x:
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def to_operators(space: Space, state: State) -> list[Operator]:
    """The operators a complete state stands for: one per way of matching its frontier to the
    input (several only when the input has equal sizes). Coefficient defaults are the first valid
    assignment of the space."""
    if not is_complete(space, state):
        raise KdslError("the partial operator does not reach the input yet")
    by_size: dict[int, list[FDim]] = {}
    for d in state.frontier:
        by_size.setdefault(id(d.size), []).append(d)
    slots: dict[int, list[int]] = {}
    for position, size in enumerate(space.input_sizes):
        slots.setdefault(id(size), []).append(position)
    groups = [(by_size[key], positions) for key, positions in slots.items()]
    operators = []
    for perms in itertools.product(*(itertools.permutations(dims) for dims, _ in groups)):
        matching = {}
        for (_, positions), dims in zip(groups, perms):
            for position, d in zip(positions, dims):
                matching[d.id] = position
        operators.append(_build(space, state, matching))
    return operators


def _build(space: Space, state: State, matching: dict[int, int]) -> Operator:
    chains = _Names()
    dims: dict[int, FDim] = {}
    # the root's dims: their sizes say which of the space's output goals the state started from
    outputs = _root_dims(space, state)
    for d in outputs:
        dims[d.id] = d
    for step in state.steps:
        for d in step.produced:
            dims[d.id] = d
        for old, new in SEARCH_RULES[step.kind].same_name(step):
            chains.union(old.id, new.id)
    for d in state.frontier:
        dims[d.id] = d
    # name each chain: input name, else output name, else from its size
    names: dict[int, str] = {}
    taken: set[str] = set(space.spec.batch)

    def claim(chain: int, wanted: str) -> None:
        if chain in names:
            return
        name, i = wanted, 2
        while name in taken:
            name, i = f"{wanted}_{i}", i + 1
        names[chain] = name
        taken.add(name)

    for d in state.frontier:
        claim(chains.find(d.id), space.inputs[matching[d.id]].name)
    for i, d in enumerate(outputs):
        claim(chains.find(d.id), space.outputs[i].name)
    for step in state.steps:
        for d in (*step.produced, *step.consumed):
            chain = chains.find(d.id)
            if chain not in names:
                var = d.size.variable_name
                if d.coef_only:
                    claim(chain, (var or "k").lower())
                else:
                    claim(chain, f"{var}_r" if var else "d")
    name = {d: names[chains.find(d)] for d in dims}
    top_down: list[Primitive] = []
    weights = 0
    for step in reversed(state.steps):
        if step.kind in CONTRACTIONS:
            weights += 1
        top_down.append(SEARCH_RULES[step.kind].build(step, name, f"w{weights}"))
    used = {v.name for d in dims.values() for v in d.size.variables if v.kind == "coefficient"}
    for step in state.steps:
        if step.param is not None:
            used.update(v.name for v in step.param.variables if v.kind == "coefficient")
    defaults = space.assignment_for(state.mask, used)
    inputs: list[Dim | None] = [None] * len(space.input_sizes)
    for d in state.frontier:
        inputs[matching[d.id]] = Dim(name[d.id], d.size)
    searched_in = iter(inputs)
    searched_out = iter(name[d.id] for d in outputs)
    batch = set(space.spec.batch)
    inputs = [d if d.name in batch else next(searched_in) for d in space.spec.inputs]
    output = Output(
        *(d.name if d.name in batch else next(searched_out) for d in space.spec.outputs), defaults=defaults or None
    )
    return Input(*inputs) >> Pipeline(tuple(top_down), output)  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------
# From a finished operator to its canonical bottom-up path
# ------------------------------------------------------------------------------------------------


def canonical_path(space: Space, op: Operator, *, check: bool = True) -> State:
    """The bottom-up path search would take to build ``op`` (its steps linearized in the canonical
    order). With ``check``, raises :class:`KdslError` naming the first rule the path breaks.

    >>> from kdsl.lang import library
    >>> space = Space("conv2d", "resnet18", coefficients={"K": [3]}, max_depth=6)
    >>> state = canonical_path(space, library.load("conv2d"))
    >>> [step.kind for step in state.steps]
    ['Reduce', 'Reduce', 'Reduce', 'Share', 'Unfold', 'Unfold']
    """
    consumers = _consumers(op)
    batch = set(space.spec.batch)
    outputs = [d for d in op.outputs if d.name not in batch]
    goals = [i for i, goal in enumerate(space.output_goals) if list(goal) == [d.size for d in outputs]]
    if not goals or len(outputs) + len(batch) != len(op.outputs):
        raise KdslError("the operator's output does not match the space's spec")
    state = root(space, goals[0])
    by_name = {d.name: f for d, f in zip(outputs, state.frontier)}
    done: set[int] = set()
    remaining = list(range(len(op.steps)))
    while remaining:
        options = []
        for i in remaining:
            if consumers[i] <= done:
                step = op.steps[i]
                bstep, names = SEARCH_RULES[step.kind].mirror(state, step, op.live[i], by_name)
                options.append((order_key_with_reduce(space, bstep), i, bstep, names))
        options.sort(key=lambda item: item[:2])
        _, i, bstep, names = options[0]
        if check:
            broken = rejects(space, state, bstep)
            if broken is not None:
                raise KdslError(
                    f"the operator is not canonical: rule {broken} rejects {bstep} ({RULES[broken].identity})"
                )
        state = _apply_unchecked(state, bstep)
        for name in op.steps[i].produces:  # top-down made, so this bottom-up step consumed them
            by_name.pop(name, None)
        for name, d in zip(names, bstep.produced):
            by_name[name] = d
        done.add(i)
        remaining.remove(i)
    return state


def _apply_unchecked(state: State, step: BStep) -> State:
    gone = {id(d) for d in step.consumed}
    frontier = tuple(d for d in state.frontier if id(d) not in gone) + step.produced
    return State(
        frontier,
        (*state.steps, step),
        state.next_id + len(step.produced),
        state.mask,
        state.counts,
        state.uses,
        state.params,
        state.flops_lb,
    )


def _consumers(op: Operator) -> list[set[int]]:
    """For each top-down step, the later steps that consume what it produces."""
    producer: dict[str, int] = {}
    consumers: list[set[int]] = [set() for _ in op.steps]
    for i, step in enumerate(op.steps):
        for name in step.consumes:
            if name in producer:
                consumers[producer[name]].add(i)
        for name in step.produces:
            producer[name] = i
    return consumers
