"""Partial operators built bottom-up, from the output towards the input (Syno Algorithm 1).

A :class:`State` is a partial graph: the *frontier* (the dims at its top, which must finally be
the input's dims) and the bottom-up steps applied so far. Each bottom-up step is the mirror of a
top-down primitive:

=========  ==================================================================================
Reduce     adds a reduced dim to the frontier
Share      takes frontier dims into a new weight: weight-only dims (like Cout) leave the
           frontier, shared dims stay (as new versions)
Split      joins two frontier dims (outer G, inner B) into one of size G*B
Merge      splits one frontier dim of size N into (N/B, B)
Unfold     joins a main dim N and a window K into N
Stride     turns K into S*K; the result must then be consumed by an Unfold (or a Shift first)
Shift      keeps the dim (a new version)
Expand     drops a frontier dim
=========  ==================================================================================

:func:`children` lists the canonical children of a state (deterministic order), pruned by the
depth, the per-kind caps, the coefficient allowances, the validity masks, the canonicalization
rules (:mod:`kdsl.search.rules`), the shape distance (:mod:`kdsl.search.distance`) and the
budgets. :func:`to_operators` turns a finished state into kdsl operators.

>>> from kdsl.search.space import Space
>>> space = Space("conv2d", "resnet18", coefficients={"K": [3]}, max_depth=6)
>>> [str(step) for step, child in children(space, root(space))][:3]
['Reduce(K)', 'Reduce(Cin)', 'Reduce(Cout)']
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from kdsl.lang.build import Input, Operator, Output, Pipeline
from kdsl.lang.errors import KdslError
from kdsl.lang.primitives import Dim, Expand, Merge, Primitive, Reduce, Share, Shift, Split, Stride, Unfold, Weight
from kdsl.lang.sizes import Size
from kdsl.search.distance import state_distance
from kdsl.search.rules import rejects, share_choices, violates_quality
from kdsl.search.space import Space, mul
from kdsl.search.state import (
    KIND_INDEX,
    MERGE_INNER,
    MERGE_OUTER,
    OUT,
    REDUCE,
    SHARED,
    SHIFT,
    SPLIT,
    STRIDE,
    UNFOLD,
    BStep,
    FDim,
    State,
    is_complete,
    merge_blocks,
    root,
)

__all__ = ["BStep", "FDim", "State", "children", "is_complete", "root", "to_operators"]

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
    mask = state.mask
    for size in created:
        mask &= space.mask(size)
    if window is not None:
        mask &= window
    if not mask:
        return None
    uses = state.uses
    if step.param is not None and step.kind != "Share":
        added = space.coefficient_uses(step.param)
        uses = tuple(u + a for u, a in zip(uses, added))
        if any(u > a for u, a in zip(uses, space.allowances)):
            return None
    params, flops_lb = state.params, state.flops_lb
    if step.kind == "Share":
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


def _product(sizes) -> Size:
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


def _candidates(space: Space, state: State) -> Iterator[tuple[BStep, tuple[Size, ...], int | None]]:
    """Every bottom-up step applicable to ``state`` before pruning, in a fixed order, with the
    sizes it creates (for the validity mask) and, for Unfold, the window mask."""
    n = len(state.steps)
    nid = state.next_id
    frontier = state.frontier
    free = [d for d in frontier if not d.pending]
    # Reduce: only in the reduction stage, in the fixed order of the reduction vocabulary
    if state.reducing:
        last = -1
        if state.steps:
            last = space.reduction_index[state.steps[-1].param]
        for index in range(last if last >= 0 else 0, len(space.reductions)):
            size = space.reductions[index]
            made = FDim(nid, size, REDUCE, n, nid, True, False)
            yield BStep("Reduce", (), (made,), size, index=n), (size,), None
    # Merge: split a frontier dim of size D into (D/B, B)
    for d in free:
        for outer, inner in merge_blocks(space, d.size):
            o = FDim(nid, outer, MERGE_OUTER, n, nid, d.reduces, False)
            i = FDim(nid + 1, inner, MERGE_INNER, n, nid + 1, d.reduces, False)
            yield BStep("Merge", (d,), (o, i), inner, index=n), (outer, inner), None
    # Split: join (outer, inner) into one dim
    for a in free:
        for b in free:
            if a is b:
                continue
            size = mul(a.size, b.size)
            made = FDim(nid, size, SPLIT, n, nid, a.reduces or b.reduces, False)
            yield BStep("Split", (a, b), (made,), index=n), (size,), None
    # Shift: keeps the dim
    for d in frontier:
        made = FDim(nid, d.size, SHIFT, n, nid, d.reduces, d.pending)
        yield BStep("Shift", (d,), (made,), index=n), (), None
    # Share: each free dim is left out, shared, or weight-only
    yield from _shares(space, state, free, n, nid)
    # Unfold: join a main dim (with a primary variable) and a coefficient-only window
    for m in frontier:
        if m.coef_only:
            continue
        for k in frontier:
            if k is m or not k.coef_only:
                continue
            made = FDim(nid, m.size, UNFOLD, n, nid, m.reduces or k.reduces, False)
            yield BStep("Unfold", (m, k), (made,), index=n), (), space.window_mask(k.size, m.size)
    # Stride: K -> S*K, to be consumed by an Unfold
    for d in free:
        for factor in space.positive_monomials:
            size = mul(d.size, factor)
            made = FDim(nid, size, STRIDE, n, nid, d.reduces, True)
            yield BStep("Stride", (d,), (made,), factor, index=n), (size, factor), None
    # Expand: drop a dim
    for d in free:
        yield BStep("Expand", (d,), (), index=n), (), None


def _shares(space: Space, state: State, free: list[FDim], n: int, nid: int) -> Iterator:

    options = [share_choices(space, d) for d in free]
    for choice in itertools.product(*options):
        shared = [d for d, c in zip(free, choice) if c == 1]
        if not any(d.reduces for d in shared):
            continue  # quality: a Share must contract (some shared dim is reduced below it)
        weight_only = tuple(d for d, c in zip(free, choice) if c == 2)
        produced = tuple(FDim(nid + i, d.size, SHARED, n, d.root, d.reduces, False) for i, d in enumerate(shared))
        step = BStep("Share", tuple(d for d, c in zip(free, choice) if c), produced, weight_only=weight_only, index=n)
        yield step, tuple(d.size for d in weight_only), None


def children(space: Space, state: State, stats: dict | None = None) -> Iterator[tuple[BStep, State]]:
    """The canonical children of ``state`` in a fixed order, pruned by depth, caps, allowances,
    validity masks, canonicalization rules, shape distance and budgets."""

    if state.depth >= space.max_depth:
        return
    remaining = space.max_depth - state.depth - 1
    for step, created, window in _candidates(space, state):
        if space.canonicalize:
            rule = rejects(space, state, step)
            if rule is not None:
                if stats is not None:
                    stats[rule] = stats.get(rule, 0) + 1
                continue
        else:
            if violates_quality(space, state, step):
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
# Conversion to an Operator
# ------------------------------------------------------------------------------------------------


class _Names:
    """Dim names for a finished graph: dims joined by name-keeping steps (Unfold's main dim,
    Shift, Stride, Share's shared dims) form one chain with one name."""

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
    outputs = [FDim(i, size, OUT, -1, i, False, False) for i, size in enumerate(space.output_sizes)]
    for d in outputs:
        dims[d.id] = d
    for step in state.steps:
        for d in step.produced:
            dims[d.id] = d
        if step.kind in ("Shift", "Stride") or step.kind == "Unfold":
            chains.union(step.consumed[0].id, step.produced[0].id)
        elif step.kind == "Share":
            for old, new in zip(step.shared, step.produced):
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
        c, p = step.consumed, step.produced
        if step.kind == "Reduce":
            top_down.append(Reduce(name[p[0].id]))
        elif step.kind == "Merge":
            top_down.append(Merge(name[p[0].id], name[p[1].id], name[c[0].id]))
        elif step.kind == "Split":
            top_down.append(Split(name[p[0].id], c[1].size, name[c[0].id], name[c[1].id]))
        elif step.kind == "Shift":
            top_down.append(Shift(name[p[0].id]))
        elif step.kind == "Unfold":
            top_down.append(Unfold(name[p[0].id], c[1].size, name[c[1].id]))
        elif step.kind == "Stride":
            top_down.append(Stride(name[p[0].id], step.param))
        elif step.kind == "Expand":
            top_down.append(Expand(name[c[0].id], c[0].size))
        elif step.kind == "Share":
            weights += 1
            entries: list[object] = [Dim(name[d.id], d.size) for d in step.weight_only]
            entries += [name[d.id] for d in p]
            top_down.append(Share(Weight(*entries, name=f"w{weights}")))
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
