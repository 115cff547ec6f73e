"""Canonicalization rules: a registry of small named rules applied by one driver (:func:`fired`).

Search builds operators bottom-up, one step at a time; before a step is added, every rule that
watches its kind may reject it. A rule looks at the new step and at the frontier dims it consumes
(each dim records which top-down step consumes it: its *role*), so a rule is a pattern over two
adjacent primitives. Exact rules reject a form whose canonical twin (which search also builds)
computes the same function, weights reshaped or permuted offline; ``scale`` rules the same up to
a constant factor; ``approximate`` rules (Syno §6, Fig. 3c) a function that differs only near
boundaries; ``order`` rules pick one of the orders of independent steps (the operator is the
same); ``quality`` rules keep the space to useful operators and are never switched off.

*Weight rules* judge only which dims a contraction shares and which it makes the weight's own:
:func:`weight_rule` over the whole choice, :func:`weight_dim_rule` over one dim alone. The driver
applies them to a step like any rule, and :func:`weight_choices` asks them while synthesis
generates contractions (per dim first), so that the choices they forbid are never built.

Each rule has a one-line identity and, for the exact and scale ones, an example pair that the tests
run through the reference interpreter. The one driver, :func:`fired`, lists the rules that reject
a step; :func:`rejects` (synthesis, the quality check with canonicalization off, and
:func:`kdsl.search.synthesis.canonical_path`) takes the first, :func:`trace` replays a whole
bottom-up path with it.

>>> sorted(RULES)[:4]
['expand_meets_data', 'expand_not_shared', 'goal_dim_not_owned', 'independent_order']
>>> RULES["merge_unfold_approximate"].exactness
'approximate'
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

from kdsl.lang.primitives import PRIMITIVES
from kdsl.lang.sizes import Size
from kdsl.search.kinds import LEAVE, OWN, SHARE, merge_block_ok
from kdsl.search.space import Space
from kdsl.search.state import (
    CONTRACTIONS,
    MERGE_INNER,
    MERGE_OUTER,
    OUT,
    REDUCE,
    REDUCTIONS,
    SHARED,
    SHIFT,
    SPLIT,
    UNFOLD,
    BStep,
    FDim,
    State,
    size_order,
)

__all__ = [
    "EXACTNESS",
    "RULES",
    "Rule",
    "fired",
    "order_key",
    "rejects",
    "rule",
    "trace",
    "weight_choices",
    "weight_dim_rule",
    "weight_rule",
]

Check = Callable[[Space, State, BStep], bool]
#: ``weight_check(space, shared, own)``: True when a weight may not share ``shared`` and own ``own``.
WeightCheck = Callable[[Space, tuple[FDim, ...], tuple[FDim, ...]], bool]
#: ``dim_check(space, d, use)``: True when ``d`` may not be used so (SHARE or OWN) by a weight.
DimCheck = Callable[[Space, FDim, int], bool]

#: The classes of rules, from semantics-preserving to policy; ``quality`` rules are always on.
EXACTNESS = ("exact", "scale", "approximate", "order", "quality")


@dataclass(frozen=True)
class Rule:
    """A named rule: ``check(space, state, step)`` is True when adding ``step`` is uncanonical.
    A weight rule has ``weight_check`` (and a weight-dim rule ``dim_check``), from which ``check``
    is derived."""

    name: str
    kinds: tuple[str, ...]
    exactness: str  # one of EXACTNESS
    identity: str
    check: Check
    weight_check: WeightCheck | None = None
    dim_check: DimCheck | None = None


RULES: dict[str, Rule] = {}
_BY_KIND: dict[str, list[Rule]] = {}
_WEIGHT_RULES: list[Rule] = []


def _register(made: Rule) -> None:
    assert made.exactness in EXACTNESS and made.name not in RULES, made
    RULES[made.name] = made
    for kind in made.kinds:
        _BY_KIND.setdefault(kind, []).append(made)
    if made.weight_check is not None:
        _WEIGHT_RULES.append(made)


def rule(name: str, kinds: str, exactness: str, identity: str) -> Callable[[Check], Check]:
    """Register a rule over the steps of ``kinds`` (space-separated) (decorator)."""

    def register(check: Check) -> Check:
        _register(Rule(name, tuple(kinds.split()), exactness, identity, check))
        return check

    return register


def weight_rule(name: str, exactness: str, identity: str) -> Callable[[WeightCheck], WeightCheck]:
    """Register a weight rule (decorator): it judges a contraction by the dims it shares and the
    dims it makes the weight's own, nothing else."""

    def register(weight_check: WeightCheck) -> WeightCheck:
        _register(_weight_rule(name, exactness, identity, weight_check, None))
        return weight_check

    return register


def weight_dim_rule(name: str, exactness: str, identity: str) -> Callable[[DimCheck], DimCheck]:
    """Register a weight-dim rule (decorator): it rejects a contraction that uses one of its dims
    in a way the rule forbids (shares it, or makes it the weight's own)."""

    def register(dim_check: DimCheck) -> DimCheck:
        def weight_check(space: Space, shared: tuple[FDim, ...], own: tuple[FDim, ...]) -> bool:
            return any(dim_check(space, d, SHARE) for d in shared) or any(dim_check(space, d, OWN) for d in own)

        _register(_weight_rule(name, exactness, identity, weight_check, dim_check))
        return dim_check

    return register


def _weight_rule(
    name: str, exactness: str, identity: str, weight_check: WeightCheck, dim_check: DimCheck | None
) -> Rule:
    def check(space: Space, state: State, step: BStep) -> bool:
        return weight_check(space, step.shared, step.weight_only)

    return Rule(name, tuple(sorted(CONTRACTIONS)), exactness, identity, check, weight_check, dim_check)


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
    if state.steps and state.steps[-1].kind in REDUCTIONS:
        return space.reduction_index.get(step.param, 0) < space.reduction_index.get(state.steps[-1].param, 0)
    return False


def order_key(step: BStep) -> tuple:
    """The canonical order of independent adjacent steps: kind rank, then the roots of the dims
    they consume (roots do not depend on the order in which independent steps were applied)."""
    if step.kind in REDUCTIONS:
        return (0, (), step.index)
    return (PRIMITIVES[step.kind].rank, tuple(sorted(d.root for d in step.consumed)), str(step.param))


def _commuting_shares(previous: BStep, step: BStep) -> bool:
    """Two Shares whose only link is that ``step`` shares dims ``previous`` shared: x*w1*w2 = x*w2*w1."""
    if previous.kind not in CONTRACTIONS or step.kind not in CONTRACTIONS:
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
    if previous.kind in REDUCTIONS:
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


@weight_dim_rule("split_before_share", "exact", "Share(w[C]) >> Split(C -> a, b) == Split(C -> a, b) >> Share(w[a, b])")
def _split_before_share(space: Space, d: FDim, use: int) -> bool:
    return use == SHARE and d.role == SPLIT


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
    "expand_meets_data",
    "Expand",
    "exact",
    "Expand(d) >> Split(d -> a, b) >> Share(w[.., a]) >> Reduce(a, b) == Share(sum_a,b w[.., a]): a dim that "
    "only reaches reductions (through Splits and weights) sums weights the weights absorb, or is a constant factor",
)
def _expand_meets_data(space: Space, state: State, step: BStep) -> bool:
    return _only_reduced(state, step.consumed[0])


def _only_reduced(state: State, d: FDim) -> bool:
    """Whether every top-down path from ``d`` ends in a reduction, through Splits and as a dim a
    weight shares (never reaching the output or meeting another dim in a view)."""
    if d.role == REDUCE:
        return True
    below = _producer(state, d)
    if below is None:
        return False
    if d.role == SPLIT:  # top-down, d was split into the two dims this step consumed
        return all(_only_reduced(state, part) for part in below.consumed)
    if d.role == SHARED:  # top-down, d passed through the weight as the matching shared dim
        return _only_reduced(state, below.shared[below.produced.index(d)])
    return False


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


def _absorbed(space: Space, state: State, step: BStep) -> bool:
    """Both dims the view ``step`` makes (bottom-up: consumes) are shared by one weight and summed
    right after it, and the view's input (what the step produces) may be reduced in the space."""
    a, b = step.consumed
    if a.role != SHARED or b.role != SHARED or a.step != b.step:
        return False
    share = state.steps[a.step]
    lower = {id(up): down for up, down in zip(share.produced, share.shared)}
    below = (lower.get(id(a)), lower.get(id(b)))
    if any(d is None or d.role != REDUCE for d in below):
        return False
    return step.produced[0].size in space.reduction_index


# a split or a window whose dims one weight contracts and sums right away: one check serves both
rule(
    "split_absorbed_by_weight",
    "Split",
    "exact",
    "Split(C -> a, b) >> Share(w[a, b, ..]) >> Reduce(a, b) == Share(w[C, ..]) >> Reduce(C): the weight "
    "absorbs the split (reshaped)",
)(_absorbed)
rule(
    "window_absorbed_by_weight",
    "Unfold",
    "exact",
    "Unfold(C, K -> k) >> Share(w[C, k, ..]) >> Reduce(C, k) == Share(w'[C, ..]) >> Reduce(C): a window "
    "whose dims one weight contracts adds up to one weight entry per input position (w' = the sum of "
    "the taps that reach it; any w' is the window's centre tap alone)",
)(_absorbed)


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


@rule("split_undoes_merge", "Split", "exact", "Split(x -> a, b) >> Merge(a, b -> x) == x: the identity")
def _split_undoes_merge(space: Space, state: State, step: BStep) -> bool:
    outer, inner = step.consumed
    return outer.role == MERGE_OUTER and inner.role == MERGE_INNER and outer.step == inner.step


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
    return (size_order(window.size), window.root) > (size_order(other.size), other.root)


@rule(
    "merge_unfold_approximate",
    "Merge",
    "approximate",
    "Merge(A, B) >> Unfold(AB, K) ~= Unfold(B, K) >> Merge(A, B) for K << B [Fig. 3c]",
)
def _merge_unfold_approximate(space: Space, state: State, step: BStep) -> bool:
    return step.consumed[0].role == UNFOLD


# -- weights ---------------------------------------------------------------------------------------


@weight_dim_rule(
    "weight_dims_direct", "exact", "Share(w[.., d]) >> Split(d -> a, b) == Share(w'[.., a, b]); likewise Shift"
)
def _weight_dims_direct(space: Space, d: FDim, use: int) -> bool:
    return use == OWN and d.role in (SPLIT, SHIFT)


@weight_dim_rule("weight_dim_not_summed", "exact", "Share(w[.., c]) >> Reduce(c) == Share(sum_c w[.., c])")
def _weight_dim_not_summed(space: Space, d: FDim, use: int) -> bool:
    return use == OWN and d.role == REDUCE


@weight_dim_rule(
    "goal_dim_not_owned",
    "exact",
    "Share(w[.., Cin]) >> Output(.., Cin) == Share(w[.., Cout]) >> Output(.., Cout) where Cout = Cin on every layer: "
    "the spec's own output goal holds it (see Space.output_goals)",
)
def _goal_dim_not_owned(space: Space, d: FDim, use: int) -> bool:
    return use == OWN and d.role == OUT and d.size != space.output_sizes[d.id]


@rule(
    "weights_not_redundant", "Share", "exact", "x * w1[S] * w2[T] with S a subset of T == x * w[T]: one weight suffices"
)
def _weights_not_redundant(space: Space, state: State, step: BStep) -> bool:
    below = {d.step for d in step.consumed}
    if len(below) == 1:
        index = next(iter(below))
        if index >= 0 and state.steps[index].kind in CONTRACTIONS and all(d.role == SHARED for d in step.consumed):
            return True  # every dim of this weight is a dim the weight below shares
    for d in step.shared:
        if d.role == SHARED:
            other = state.steps[d.step]
            if not other.weight_only and all(any(p is c for c in step.consumed) for p in other.produced):
                return True  # the weight below has no dims of its own and all its dims are here
    return False


# -- quality (always on) ---------------------------------------------------------------------------


@weight_rule("share_contracts", "quality", "a Share shares at least one dim that is reduced below it (a contraction)")
def _share_contracts(space: Space, shared: tuple[FDim, ...], own: tuple[FDim, ...]) -> bool:
    return not any(d.reduces for d in shared)


@weight_dim_rule(
    "weights_not_spatial",
    "quality",
    "no weight depends on a spatial size (H, W): weights are shared across positions",
)
def _weights_not_spatial(space: Space, d: FDim, use: int) -> bool:
    return bool(space.spatial) and any(v.name in space.spatial for v in d.size.variables)


@weight_dim_rule(
    "weight_only_channels",
    "quality",
    "a weight's own dims are channels: they carry a primary variable (unless the space allows otherwise)",
)
def _weight_only_channels(space: Space, d: FDim, use: int) -> bool:
    return use == OWN and space.weight_only_primary and d.coef_only


@rule(
    "stride_feeds_unfold",
    "Merge Split Share Stride Expand",
    "quality",
    "a strided dim is consumed by an Unfold (or a Shift on the way)",
)
def _stride_feeds_unfold(space: Space, state: State, step: BStep) -> bool:
    return any(d.pending for d in step.consumed)


# ------------------------------------------------------------------------------------------------
# The driver
# ------------------------------------------------------------------------------------------------


@functools.cache
def _asked(kind: str | None, canonicalize: bool, exactness: frozenset[str] | None, switched: bool) -> tuple[Rule, ...]:
    """The rules to ask about a step of ``kind`` (None: the weight rules), in registry order:
    with ``switched``, a space with canonicalization off asks only quality rules; ``exactness``
    restricts the classes. Cached: the hot loop asks this for every candidate step."""
    candidates = _WEIGHT_RULES if kind is None else _BY_KIND.get(kind, ())
    return tuple(
        item
        for item in candidates
        if (canonicalize or not switched or item.exactness == "quality")
        and (exactness is None or item.exactness in exactness)
    )


@functools.cache
def _step_rules(kind: str, canonicalize: bool) -> tuple[Rule, ...]:
    """:func:`_asked` for ``kind`` without the weight rules (see :func:`fired`'s ``chosen``)."""
    return tuple(item for item in _asked(kind, canonicalize, None, True) if item.weight_check is None)


def fired(
    space: Space,
    state: State,
    step: BStep,
    exactness: Collection[str] | None = None,
    *,
    switched: bool = True,
    first: bool = False,
    chosen: bool = False,
) -> tuple[Rule, ...]:
    """The driver: the rules that reject adding ``step`` to ``state``, in registry order; with
    ``first``, only the first (the checks after it are not run). ``exactness`` restricts the
    classes of rules; with ``switched`` (the default) ``space.canonicalize`` off leaves only the
    quality rules. ``chosen``: the step's weight came from :func:`weight_choices`, which already
    applied every weight rule, so they are not asked again (a fifth of enumeration's time went to
    asking them twice)."""
    classes = None if exactness is None else frozenset(exactness)
    found: tuple[Rule, ...] = ()
    if chosen and classes is None and switched:
        rules = _step_rules(step.kind, space.canonicalize)
    else:
        rules = _asked(step.kind, space.canonicalize, classes, switched)
    for item in rules:
        if item.check(space, state, step):
            if first:
                return (item,)
            found += (item,)
    return found


def rejects(
    space: Space, state: State, step: BStep, *, exactness: Collection[str] | None = None, chosen: bool = False
) -> str | None:
    """The name of the first rule that rejects adding ``step`` to ``state``, or None (synthesis
    asks this of every candidate step; ``chosen``: see :func:`fired`)."""
    found = fired(space, state, step, exactness, first=True, chosen=chosen)
    return found[0].name if found else None


def weight_choices(space: Space, dims: Sequence[FDim]) -> Iterator[tuple[tuple[FDim, ...], ...]]:
    """The ways a contraction may use the frontier ``dims`` that the weight rules allow, in a fixed
    order, each as (consumed, shared, own) dims in the order of ``dims``: each dim is left, shared
    or made the weight's own. The weight-dim rules prune each dim's uses before the uses are
    combined, the other weight rules judge each combination, so synthesis never builds a
    contraction that a weight rule would reject."""
    asked = _asked(None, space.canonicalize, None, True)
    per_dim = [item.dim_check for item in asked if item.dim_check is not None]
    whole = [item.weight_check for item in asked if item.dim_check is None]
    options = [
        (LEAVE, *(use for use in (SHARE, OWN) if not any(check(space, d, use) for check in per_dim))) for d in dims
    ]
    for choice in itertools.product(*options):
        shared = tuple(d for d, use in zip(dims, choice) if use == SHARE)
        own = tuple(d for d, use in zip(dims, choice) if use == OWN)
        for check in whole:
            if check(space, shared, own):  # type: ignore[misc]
                break
        else:
            yield tuple(d for d, use in zip(dims, choice) if use != LEAVE), shared, own


def trace(
    space: Space, steps: list[BStep] | tuple[BStep, ...], exactness: Collection[str] | None = None
) -> list[tuple[str, str]]:
    """Replay a bottom-up path (steps of a state) and list ``(step, rule)`` for every rule that
    rejects a step (every class, whatever ``space.canonicalize`` says, unless ``exactness``)."""
    found = []
    for i, step in enumerate(steps):
        prefix = State((), tuple(steps[:i]), 0, 0, (), (), (), ())
        found.extend((str(step), item.name) for item in fired(space, prefix, step, exactness, switched=False))
    return found


def order_key_with_reduce(space: Space, step: BStep) -> tuple:
    """:func:`order_key`, with reductions in the order of the space's reduction vocabulary (the
    order :func:`kdsl.search.synthesis.canonical_path` linearizes a finished operator in)."""
    if step.kind in REDUCTIONS:
        return (0, (), space.reduction_index.get(step.param, -1), str(step.param))  # type: ignore[arg-type]
    return order_key(step)
