"""Canonicalization rules: a table of small named rules applied by one driver (:func:`rejects`).

Search builds operators bottom-up, one step at a time; before a step is added, every rule that
watches its kind may reject it. A rule looks at the new step and at the frontier dims it consumes
(each dim records which top-down step consumes it: its *role*), so a rule is a pattern over two
adjacent primitives. Exact rules reject a form whose canonical twin (which search also builds)
computes the same function, weights reshaped or permuted offline; ``scale`` rules the same up to
a constant factor; ``approximate`` rules (Syno §6, Fig. 3c) a function that differs only near
boundaries; ``order`` rules pick one of the orders of independent steps (the operator is the
same); ``quality`` rules keep the space to useful operators and are never switched off.

Each rule has a one-line identity and, for the exact and scale ones, an example pair (built by
:func:`example`) that the tests run through the reference interpreter. :func:`trace` replays a
bottom-up path and says which rule rejects which step; :func:`canonical_path` turns a finished
operator into its canonical bottom-up path (or says which rule it breaks).

>>> sorted(RULES)[:4]
['expand_not_shared', 'independent_order', 'merge_above_split', 'merge_after_share']
>>> RULES["merge_unfold_approximate"].exactness
'approximate'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kdsl.lang.build import Operator
from kdsl.lang.errors import KdslError
from kdsl.lang.primitives import Expand, Merge, Reduce, Share, Shift, Split, Stride, Unfold, Weight
from kdsl.lang.sizes import Size
from kdsl.search.space import Space, _order
from kdsl.search.state import (
    MERGE_INNER,
    MERGE_OUTER,
    RANK,
    REDUCE,
    SHARED,
    SHIFT,
    SPLIT,
    STRIDE,
    UNFOLD,
    BStep,
    FDim,
    State,
    merge_block_ok,
    root,
)

__all__ = ["RULES", "Rule", "canonical_path", "rejects", "share_choices", "trace", "violates_quality"]

Check = Callable[[Space, State, BStep], bool]


@dataclass(frozen=True)
class Rule:
    """A named rule: ``check(space, state, step)`` is True when adding ``step`` is uncanonical."""

    name: str
    kinds: tuple[str, ...]
    exactness: str  # exact | scale | approximate | order | quality
    identity: str
    check: Check


RULES: dict[str, Rule] = {}
_BY_KIND: dict[str, list[Rule]] = {}


def rule(name: str, kinds: str, exactness: str, identity: str) -> Callable[[Check], Check]:
    """Register a rule (decorator)."""

    def register(check: Check) -> Check:
        made = Rule(name, tuple(kinds.split()), exactness, identity, check)
        RULES[name] = made
        for kind in made.kinds:
            _BY_KIND.setdefault(kind, []).append(made)
        return check

    return register


def _whole(size: Size) -> bool:
    """A size that is a product of variables (no denominator): ``b`` divides ``a`` when a/b is."""
    return size.constant.denominator == 1 and all(e > 0 for _, e in size.exponents)


def _producer(state: State, d: FDim) -> BStep | None:
    return state.steps[d.step] if d.step >= 0 else None


# -- order ---------------------------------------------------------------------------------------


@rule(
    "reductions_first",
    "Reduce",
    "order",
    "reductions commute with every other step: generate them first, in vocabulary order",
)
def _reductions_first(space: Space, state: State, step: BStep) -> bool:
    if not state.reducing:
        return True
    if state.steps and state.steps[-1].kind == "Reduce":
        return space.reduction_index.get(step.param, 0) < space.reduction_index.get(state.steps[-1].param, 0)
    return False


def order_key(step: BStep) -> tuple:
    """The canonical order of independent adjacent steps: kind rank, then the roots of the dims
    they consume (roots do not depend on the order in which independent steps were applied)."""
    if step.kind == "Reduce":
        return (0, (), step.index)
    return (RANK[step.kind], tuple(sorted(d.root for d in step.consumed)), str(step.param))


def _commuting_shares(previous: BStep, step: BStep) -> bool:
    """Two Shares whose only link is that ``step`` shares dims ``previous`` shared: x*w1*w2 = x*w2*w1."""
    if previous.kind != "Share" or step.kind != "Share":
        return False
    mine = {id(d) for d in previous.produced}
    return not any(id(d) in mine for d in step.weight_only)


@rule(
    "independent_order",
    "Merge Split Shift Share Unfold Stride Expand",
    "order",
    "steps on disjoint dims commute: keep one order (views below contractions, then by the dims' roots)",
)
def _independent_order(space: Space, state: State, step: BStep) -> bool:
    if not state.steps:
        return False
    previous = state.steps[-1]
    if previous.kind == "Reduce":
        return False
    last = len(state.steps) - 1
    if any(d.step == last for d in step.consumed):
        return False  # dependent
    return order_key(step) < order_key(previous)


@rule("weight_order", "Share", "order", "x*w1*w2 = x*w2*w1: adjacent Shares linked only by shared dims keep one order")
def _weight_order(space: Space, state: State, step: BStep) -> bool:
    if not state.steps:
        return False
    previous = state.steps[-1]
    if not _commuting_shares(previous, step) or not any(d.step == len(state.steps) - 1 for d in step.consumed):
        return False
    return order_key(step) < order_key(previous)


# -- views against contractions (Fig. 3b) ----------------------------------------------------------


@rule("split_before_share", "Share", "exact", "Share(w[C]) >> Split(C -> a, b) == Split(C -> a, b) >> Share(w[a, b])")
def _split_before_share(space: Space, state: State, step: BStep) -> bool:
    return any(d.role == SPLIT for d in step.shared)


@rule("merge_after_share", "Merge", "exact", "Merge(a, b -> m) >> Share(w[m]) == Share(w[a, b]) >> Merge(a, b -> m)")
def _merge_after_share(space: Space, state: State, step: BStep) -> bool:
    return step.consumed[0].role == SHARED


@rule("shift_after_share", "Shift", "exact", "Shift(d) >> Share(w[d]) == Share(roll(w, 1)[d]) >> Shift(d)")
def _shift_after_share(space: Space, state: State, step: BStep) -> bool:
    return step.consumed[0].role == SHARED


@rule("split_not_above_reduces", "Split", "exact", "Split(C -> a, b) >> Reduce(a, b) == Reduce(C)")
def _split_not_above_reduces(space: Space, state: State, step: BStep) -> bool:
    a, b = step.consumed
    return a.role == REDUCE and b.role == REDUCE and (a.size * b.size) in space.reduction_index


@rule("merge_not_above_reduce", "Merge", "exact", "Merge(a, b -> m) >> Reduce(m) == Reduce(a, b)")
def _merge_not_above_reduce(space: Space, state: State, step: BStep) -> bool:
    if step.consumed[0].role != REDUCE:
        return False
    return all(d.size in space.reduction_index for d in step.produced)


@rule(
    "no_shift_before_reduce",
    "Shift",
    "exact",
    "Shift(d) >> Reduce(d) == Reduce(d): a cyclic shift does not change a sum",
)
def _no_shift_before_reduce(space: Space, state: State, step: BStep) -> bool:
    return step.consumed[0].role == REDUCE


@rule("no_expand_before_reduce", "Expand", "scale", "Expand(d: C) >> Reduce(d) == C * identity: only a multiplier")
def _no_expand_before_reduce(space: Space, state: State, step: BStep) -> bool:
    return step.consumed[0].role == REDUCE


@rule(
    "expand_not_shared", "Expand", "exact", "Expand(d: C) >> Share(w[d]) == Share(w[C] weight-only): a weight's own dim"
)
def _expand_not_shared(space: Space, state: State, step: BStep) -> bool:
    return step.consumed[0].role == SHARED


@rule(
    "window_reduced_once",
    "Unfold",
    "approximate",
    "Unfold(N, K) >> Reduce(N, k) ~= K * Reduce(N): an Unfold's dims are reduced at most once "
    "(equal but near the borders)",
)
def _window_reduced_once(space: Space, state: State, step: BStep) -> bool:
    main, window = step.consumed
    return main.role == REDUCE and window.role == REDUCE


# -- views against views ---------------------------------------------------------------------------


@rule(
    "merge_above_split",
    "Merge",
    "exact",
    "Merge(o, i) >> Split(block b) == Split(i, b) >> Merge(o, i/b) when b | i (and the mirror when i | b) [Fig. 3a]",
)
def _merge_above_split(space: Space, state: State, step: BStep) -> bool:
    d = step.consumed[0]
    if d.role != SPLIT:
        return False
    below = _producer(state, d)
    assert below is not None
    outer, inner = step.produced
    block = below.consumed[1].size
    ratio = inner.size / block
    if ratio == 1:
        return True  # Merge then Split by the same block is the identity
    if _whole(ratio):  # b | i: Split(i -> i/b, b) then Merge(o, i/b)
        return merge_block_ok(space, outer.size * ratio, ratio)
    if _whole(1 / ratio):  # i | b: Split(o -> o/m, m) then Merge(m, i), m = b/i
        return merge_block_ok(space, block, inner.size)
    return False


@rule(
    "right_leaning_splits",
    "Split",
    "exact",
    "Split(X -> ab, c) >> Split(ab -> a, b) == Split(X -> a, bc) >> Split(bc -> b, c)",
)
def _right_leaning_splits(space: Space, state: State, step: BStep) -> bool:
    return step.consumed[0].role == SPLIT


@rule(
    "right_leaning_merges", "Merge", "exact", "Merge(a, b -> ab) >> Merge(ab, c) == Merge(b, c -> bc) >> Merge(a, bc)"
)
def _right_leaning_merges(space: Space, state: State, step: BStep) -> bool:
    d = step.consumed[0]
    if d.role != MERGE_OUTER:
        return False
    below = _producer(state, d)
    assert below is not None
    whole = below.consumed[0].size
    _, inner2 = step.produced
    inner1 = below.produced[1].size
    fused = inner2.size * inner1
    return merge_block_ok(space, whole, fused) and merge_block_ok(space, fused, inner1)


@rule(
    "unfold_chain_order",
    "Unfold",
    "approximate",
    "Unfold(N, K1) >> Unfold(N, K2) ~= Unfold(N, K2) >> Unfold(N, K1): both read x[i + j1 + j2 - ...]; "
    "only the zero padding of the intermediate row differs, at the borders",
)
def _unfold_chain_order(space: Space, state: State, step: BStep) -> bool:
    main, window = step.consumed
    if main.role != UNFOLD:
        return False
    below = _producer(state, main)
    assert below is not None
    other = below.consumed[1]
    return (_order(window.size), window.root) > (_order(other.size), other.root)


@rule(
    "merge_unfold_approximate",
    "Merge",
    "approximate",
    "Merge(A, B) >> Unfold(AB, K) ~= Unfold(B, K) >> Merge(A, B) for K << B [Fig. 3c]",
)
def _merge_unfold_approximate(space: Space, state: State, step: BStep) -> bool:
    return step.consumed[0].role == UNFOLD


# -- weights ---------------------------------------------------------------------------------------


@rule(
    "weight_dims_direct", "Share", "exact", "Share(w[.., d]) >> Split(d -> a, b) == Share(w'[.., a, b]); likewise Shift"
)
def _weight_dims_direct(space: Space, state: State, step: BStep) -> bool:
    return any(d.role in (SPLIT, SHIFT) for d in step.weight_only)


@rule("weight_dim_not_summed", "Share", "exact", "Share(w[.., c]) >> Reduce(c) == Share(sum_c w[.., c])")
def _weight_dim_not_summed(space: Space, state: State, step: BStep) -> bool:
    return any(d.role == REDUCE for d in step.weight_only)


@rule(
    "weights_not_redundant", "Share", "exact", "x * w1[S] * w2[T] with S a subset of T == x * w[T]: one weight suffices"
)
def _weights_not_redundant(space: Space, state: State, step: BStep) -> bool:
    below = {d.step for d in step.consumed}
    if len(below) == 1:
        index = next(iter(below))
        if index >= 0 and state.steps[index].kind == "Share" and all(d.role == SHARED for d in step.consumed):
            return True  # every dim of this weight is a dim the weight below shares
    for d in step.shared:
        if d.role == SHARED:
            other = state.steps[d.step]
            if not other.weight_only and all(any(p is c for c in step.consumed) for p in other.produced):
                return True  # the weight below has no dims of its own and all its dims are here
    return False


# -- quality (always on) ---------------------------------------------------------------------------


@rule("share_contracts", "Share", "quality", "a Share shares at least one dim that is reduced below it (a contraction)")
def _share_contracts(space: Space, state: State, step: BStep) -> bool:
    return not any(d.reduces for d in step.shared)


@rule(
    "weights_not_spatial",
    "Share",
    "quality",
    "no weight depends on a spatial size (H, W): weights are shared across positions",
)
def _weights_not_spatial(space: Space, state: State, step: BStep) -> bool:
    return bool(space.spatial) and any(v.name in space.spatial for d in step.consumed for v in d.size.variables)


@rule(
    "weight_only_channels",
    "Share",
    "quality",
    "a weight's own dims are channels: they carry a primary variable (unless the space allows otherwise)",
)
def _weight_only_channels(space: Space, state: State, step: BStep) -> bool:
    return space.weight_only_primary and any(d.coef_only for d in step.weight_only)


@rule(
    "stride_feeds_unfold",
    "Merge Split Share Stride Expand",
    "quality",
    "a strided dim is consumed by an Unfold (or a Shift on the way)",
)
def _stride_feeds_unfold(space: Space, state: State, step: BStep) -> bool:
    return any(d.pending for d in step.consumed)


# ------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------


def rejects(space: Space, state: State, step: BStep, *, exactness: tuple[str, ...] | None = None) -> str | None:
    """The name of the first rule that rejects adding ``step`` to ``state``, or None.

    With ``space.canonicalize`` off only quality rules apply; ``exactness`` restricts the rules
    to those kinds."""
    for item in _BY_KIND.get(step.kind, ()):
        if not space.canonicalize and item.exactness != "quality":
            continue
        if exactness is not None and item.exactness not in exactness:
            continue
        if item.check(space, state, step):
            return item.name
    return None


def violates_quality(space: Space, state: State, step: BStep) -> bool:
    return any(item.exactness == "quality" and item.check(space, state, step) for item in _BY_KIND.get(step.kind, ()))


def share_choices(space: Space, d: FDim) -> tuple[int, ...]:
    """What a Share may do with the frontier dim ``d``: 0 leave it, 1 share it, 2 make it
    weight-only (the per-dim part of the Share rules, applied while generating Shares)."""
    if space.spatial and any(v.name in space.spatial for v in d.size.variables):
        return (0,)  # weights_not_spatial
    new_dim = not (space.weight_only_primary and d.coef_only)  # weight_only_channels
    if not space.canonicalize:
        return (0, 1, 2) if new_dim else (0, 1)
    share = d.role != SPLIT  # split_before_share
    only = new_dim and d.role not in (REDUCE, SPLIT, SHIFT)  # weight_dim_not_summed, weight_dims_direct
    return (0,) + ((1,) if share else ()) + ((2,) if only else ())


def trace(
    space: Space, steps: list[BStep] | tuple[BStep, ...], exactness: tuple[str, ...] | None = None
) -> list[tuple[str, str]]:
    """Replay a bottom-up path (steps of a state) and list ``(step, rule)`` for each rejection."""
    _State = State

    found = []
    for i, step in enumerate(steps):
        prefix = _State((), tuple(steps[:i]), 0, 0, (), (), (), ())
        for item in _BY_KIND.get(step.kind, ()):
            if exactness is not None and item.exactness not in exactness:
                continue
            if item.check(space, prefix, step):
                found.append((str(step), item.name))
    return found


# ------------------------------------------------------------------------------------------------
# From a finished operator to its canonical bottom-up path
# ------------------------------------------------------------------------------------------------


def canonical_path(space: Space, op: Operator, *, check: bool = True) -> State:
    """The bottom-up path search would take to build ``op`` (its steps linearized in the canonical
    order). With ``check``, raises :class:`KdslError` naming the first rule the path breaks.

    >>> from kdsl import gallery
    >>> space = Space("conv2d", "resnet18", coefficients={"K": [3]}, max_depth=6)
    >>> state = canonical_path(space, gallery.load("conv2d"))
    >>> [step.kind for step in state.steps]
    ['Reduce', 'Reduce', 'Reduce', 'Share', 'Unfold', 'Unfold']
    """
    sizes, nodes, consumers = _top_down(op)
    state = root(space)
    batch = set(space.spec.batch)
    outputs = [d for d in op.outputs if d.name not in batch]
    if [d.size for d in state.frontier] != [d.size for d in outputs] or len(outputs) + len(batch) != len(op.outputs):
        raise KdslError("the operator's output does not match the space's spec")
    by_name = {d.name: f for d, f in zip(outputs, state.frontier)}
    done: set[int] = set()
    remaining = list(range(len(op.steps)))
    while remaining:
        options = []
        for i in remaining:
            if consumers[i] <= done:
                bstep, names = _bottom_up(state, op.steps[i], i, sizes, by_name)
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
        for name in nodes[i][1]:
            by_name.pop(name, None)
        for name, d in zip(names, bstep.produced):
            by_name[name] = d
        done.add(i)
        remaining.remove(i)
    return state


def order_key_with_reduce(space: Space, step: BStep) -> tuple:
    if step.kind == "Reduce":
        return (0, (), space.reduction_index.get(step.param, -1), str(step.param))
    return order_key(step)


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


def _top_down(op: Operator) -> tuple[dict, list, list[set[int]]]:
    """Replay ``op`` top-down: the size each step sees on a consumed name (``(step, name)``), each
    step's (consumed, produced) names, and which later steps consume each step's outputs."""
    live = {d.name: d.size for d in op.inputs}
    producer: dict[str, int] = {}
    sizes: dict = {}
    nodes = []
    consumers: list[set[int]] = [set() for _ in op.steps]
    for i, step in enumerate(op.steps):
        consumed = tuple(step.consumes)
        for name in consumed:
            sizes[(i, name)] = live[name]
            if name in producer:
                consumers[producer[name]].add(i)
        if isinstance(step, Split):
            live.pop(step.dim)
            live[step.outer] = sizes[(i, step.dim)] / step.block
            live[step.inner] = step.block
        elif isinstance(step, Merge):
            a, b = live.pop(step.outer), live.pop(step.inner)
            live[step.name] = a * b
        elif isinstance(step, Unfold):
            live[step.name] = step.window
        elif isinstance(step, Stride):
            live[step.dim] = live[step.dim] / step.stride
        elif isinstance(step, Expand):
            live[step.name] = step.size
        elif isinstance(step, Reduce):
            live.pop(step.dim)
        elif isinstance(step, Share):
            weight = step.weight
            assert isinstance(weight, Weight)
            for dim, new in zip(weight.dims, weight.new):
                if new:
                    live[dim.name] = dim.size
        produced = tuple(step.produces)
        for name in produced:
            producer[name] = i
        nodes.append((consumed, produced))
    return sizes, nodes, consumers


def _bottom_up(state: State, step, i: int, sizes: dict, by_name: dict) -> tuple[BStep, tuple[str, ...]]:
    """The bottom-up step mirroring top-down ``step``; returns it and the names its produced
    (bottom-up) dims carry top-down."""
    n = len(state.steps)
    nid = state.next_id
    if isinstance(step, Reduce):
        size = sizes[(i, step.dim)]
        made = FDim(nid, size, REDUCE, n, nid, True, False)
        return BStep("Reduce", (), (made,), size, index=n), (step.dim,)
    if isinstance(step, Split):
        a, b = by_name[step.outer], by_name[step.inner]
        size = sizes[(i, step.dim)]
        made = FDim(nid, size, SPLIT, n, nid, a.reduces or b.reduces, False)
        return BStep("Split", (a, b), (made,), index=n), (step.dim,)
    if isinstance(step, Merge):
        d = by_name[step.name]
        o = FDim(nid, sizes[(i, step.outer)], MERGE_OUTER, n, nid, d.reduces, False)
        inner = FDim(nid + 1, sizes[(i, step.inner)], MERGE_INNER, n, nid + 1, d.reduces, False)
        return BStep("Merge", (d,), (o, inner), inner.size, index=n), (step.outer, step.inner)
    if isinstance(step, Shift):
        d = by_name[step.dim]
        made = FDim(nid, d.size, SHIFT, n, nid, d.reduces, d.pending)
        return BStep("Shift", (d,), (made,), index=n), (step.dim,)
    if isinstance(step, Unfold):
        m, k = by_name[step.dim], by_name[step.name]
        made = FDim(nid, m.size, UNFOLD, n, nid, m.reduces or k.reduces, False)
        return BStep("Unfold", (m, k), (made,), index=n), (step.dim,)
    if isinstance(step, Stride):
        d = by_name[step.dim]
        made = FDim(nid, sizes[(i, step.dim)], STRIDE, n, nid, d.reduces, True)
        return BStep("Stride", (d,), (made,), step.stride, index=n), (step.dim,)
    if isinstance(step, Expand):
        return BStep("Expand", (by_name[step.name],), (), index=n), ()
    if isinstance(step, Share):
        weight = step.weight
        assert isinstance(weight, Weight)
        only = tuple(by_name[d.name] for d, new in zip(weight.dims, weight.new) if new)
        shared_names = tuple(d.name for d, new in zip(weight.dims, weight.new) if not new)
        shared = tuple(by_name[name] for name in shared_names)
        produced = tuple(FDim(nid + j, d.size, SHARED, n, d.root, d.reduces, False) for j, d in enumerate(shared))
        return BStep("Share", only + shared, produced, weight_only=only, index=n), shared_names
    raise KdslError(f"no bottom-up form for {step!r}")  # pragma: no cover
