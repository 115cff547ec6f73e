"""Search's table of primitive kinds: what search may place, and how, one row per kind.

Each row (:class:`KindRule`) is the bottom-up mirror of one top-down primitive declared in
:mod:`kdsl.lang.primitives`: how synthesis generates candidate steps of that kind from a partial
graph, its default cap per operator, which shape-distance allowance it keeps open while under its
cap, which dims keep their name through it, how a top-down step of that kind becomes a bottom-up
step (for :func:`kdsl.search.synthesis.canonical_path`) and how a bottom-up step becomes the
top-down primitive again (for :func:`kdsl.search.synthesis.to_operators`). The other search
modules read this table (and the declared ``facts``/``rank``) instead of naming kinds.

=========  ==================================================================================
Reduce     adds a reduced dim to the frontier (only in the reduction stage)
Merge      splits one frontier dim of size N into (N/B, B)
Split      joins two frontier dims (outer G, inner B) into one of size G*B
Shift      keeps the dim (a new version)
Share      takes frontier dims into a new weight: weight-only dims (like Cout) leave the
           frontier, shared dims stay (as new versions)
Unfold     joins a main dim N and a window K into N
Stride     turns K into S*K; the result must then be consumed by an Unfold (or a Shift first)
Expand     drops a frontier dim
Slide      not placed (cap 0): its input dim's size N is no monomial of its windows P and K
Dilate     not placed (cap 0): a transposed convolution is written by hand, not searched for
=========  ==================================================================================

The order of the rows is the order in which synthesis tries the kinds (and the order of
``State.counts``).

>>> KINDS
('Reduce', 'Merge', 'Split', 'Shift', 'Share', 'Unfold', 'Stride', 'Expand', 'Slide', 'Dilate')
>>> DEFAULT_CAPS["Stride"], SEARCH_RULES["Share"].distance
(1, 'shares')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kdsl.lang.errors import SearchError
from kdsl.lang.primitives import Dim, Expand, Merge, Primitive, Reduce, Share, Shift, Split, Stride, Unfold, Weight
from kdsl.lang.sizes import Size
from kdsl.search.state import (
    MERGE_INNER,
    MERGE_OUTER,
    REDUCE,
    SHARED,
    SHIFT,
    SPLIT,
    STRIDE,
    UNFOLD,
    BStep,
    FDim,
    State,
    div,
    mul,
)

__all__ = [
    "DEFAULT_CAPS",
    "KINDS",
    "KIND_INDEX",
    "LEAVE",
    "OWN",
    "SEARCH_RULES",
    "SHARE",
    "Candidate",
    "KindRule",
    "SpaceParts",
    "merge_block_ok",
    "merge_blocks",
]


class SpaceParts(Protocol):
    """What the rows read of a search space (:class:`kdsl.search.space.Space` has it; the space
    module reads this table, so it cannot be imported here)."""

    reductions: tuple[Size, ...]
    reduction_index: Mapping[Size, int]
    coefficient_monomials: tuple[Size, ...]
    positive_monomials: tuple[Size, ...]

    def mask(self, size: Size) -> int: ...

    def window_mask(self, window: Size, main: Size) -> int: ...


#: A candidate step, the sizes it creates (for the validity mask) and, for a window, the mask of
#: assignments under which the window is smaller than its main dim (None: no window).
Candidate = tuple[BStep, tuple[Size, ...], "int | None"]

#: What a contraction may do with one frontier dim: leave it, share it, or make it the weight's own.
LEAVE, SHARE, OWN = 0, 1, 2
#: The (consumed, shared, own) dims a new weight may take from the given dims by the
#: canonicalization rules (:func:`kdsl.search.rules.weight_choices`; the rules module reads this
#: table, so it is passed in).
WeightChoices = Callable[[SpaceParts, Sequence[FDim]], Iterator[tuple[tuple[FDim, ...], ...]]]
#: The names the finished graph gives its dims, by dim id.
Names = Mapping[int, str]


@dataclass(frozen=True)
class KindRule:
    """Search's rule for one primitive kind.

    ``generate(space, state, weight_choices)``: every candidate step of this kind, before pruning, in
    a fixed order. ``cap``: the default per-operator cap (None: limited by the depth only).
    ``distance``: the shape-distance allowance (an argument of
    :func:`kdsl.search.distance.shape_distance`) that stays open while the count is under the cap.
    ``same_name(step)``: pairs (consumed, produced) that are one dim top-down, so one name.
    ``mirror(state, step, sizes, by_name)``: the bottom-up step for the resolved top-down ``step``
    (``sizes``: live sizes before it; ``by_name``: the frontier dims by top-down name), and the
    top-down names of the dims it produces. ``build(step, names, weight)``: the top-down primitive
    (``weight``: the name for a new weight).
    """

    kind: str
    generate: Callable[[SpaceParts, State, WeightChoices], Iterator[Candidate]]
    cap: int | None
    distance: str | None
    same_name: Callable[[BStep], Iterable[tuple[FDim, FDim]]]
    mirror: Callable[[State, Primitive, Mapping[str, Size], Mapping[str, FDim]], tuple[BStep, tuple[str, ...]]]
    build: Callable[[BStep, Names, str], Primitive]


def _free(state: State) -> list[FDim]:
    """The frontier dims that may take any step (a strided dim waits for its window)."""
    return [d for d in state.frontier if not d.pending]


def _no_names(step: BStep) -> tuple[tuple[FDim, FDim], ...]:
    return ()


def _first_keeps_name(step: BStep) -> tuple[tuple[FDim, FDim], ...]:
    return ((step.consumed[0], step.produced[0]),)


# -- Reduce: adds a reduced dim ------------------------------------------------------------------


def _reduce_generate(space: SpaceParts, state: State, weight_choices: WeightChoices) -> Iterator[Candidate]:
    # only in the reduction stage, in the fixed order of the reduction vocabulary
    if not state.reducing:
        return
    n, nid = len(state.steps), state.next_id
    last = space.reduction_index[state.steps[-1].param] if state.steps else -1  # type: ignore[index]
    for index in range(last if last >= 0 else 0, len(space.reductions)):
        size = space.reductions[index]
        made = FDim(nid, size, REDUCE, n, nid, True, False)
        yield BStep("Reduce", (), (made,), size, index=n), (size,), None


def _reduce_mirror(state: State, step: Primitive, sizes: Mapping[str, Size], by_name: Mapping[str, FDim]):
    assert isinstance(step, Reduce)
    n, nid = len(state.steps), state.next_id
    size = sizes[step.dim]
    made = FDim(nid, size, REDUCE, n, nid, True, False)
    return BStep("Reduce", (), (made,), size, index=n), (step.dim,)


def _reduce_build(step: BStep, names: Names, weight: str) -> Primitive:
    return Reduce(names[step.produced[0].id])


# -- Merge: splits one dim of size N into (N/B, B) -----------------------------------------------


def merge_blocks(space: SpaceParts, size: Size) -> tuple[tuple[Size, Size], ...]:
    """The (outer, inner) pairs a dim of ``size`` may be split into bottom-up: one of the two
    parts is a coefficient monomial, neither is 1, and both are valid sizes."""
    cache = space.__dict__.setdefault("_merge_cache", {})
    found = cache.get(size)
    if found is not None:
        return found
    pairs = []
    for monomial in space.coefficient_monomials:
        rest = div(size, monomial)
        if rest == 1 or monomial == 1 or rest.primaries_in_denominator():
            continue
        if not (space.mask(rest) and space.mask(monomial)):
            continue
        for pair in ((rest, monomial), (monomial, rest)):
            if pair not in pairs:
                pairs.append(pair)
    found = tuple(pairs)
    cache[size] = found
    return found


def merge_block_ok(space: SpaceParts, size: Size, inner: Size) -> bool:
    """Whether the bottom-up Merge of a dim of ``size`` into ``(size/inner, inner)`` is generated."""
    return (div(size, inner), inner) in merge_blocks(space, size)


def _merge_generate(space: SpaceParts, state: State, weight_choices: WeightChoices) -> Iterator[Candidate]:
    n, nid = len(state.steps), state.next_id
    for d in _free(state):
        for outer, inner in merge_blocks(space, d.size):
            o = FDim(nid, outer, MERGE_OUTER, n, nid, d.reduces, False)
            i = FDim(nid + 1, inner, MERGE_INNER, n, nid + 1, d.reduces, False)
            yield BStep("Merge", (d,), (o, i), inner, index=n), (outer, inner), None


def _merge_mirror(state: State, step: Primitive, sizes: Mapping[str, Size], by_name: Mapping[str, FDim]):
    assert isinstance(step, Merge)
    n, nid = len(state.steps), state.next_id
    d = by_name[step.name]
    o = FDim(nid, sizes[step.outer], MERGE_OUTER, n, nid, d.reduces, False)
    inner = FDim(nid + 1, sizes[step.inner], MERGE_INNER, n, nid + 1, d.reduces, False)
    return BStep("Merge", (d,), (o, inner), inner.size, index=n), (step.outer, step.inner)


def _merge_build(step: BStep, names: Names, weight: str) -> Primitive:
    outer, inner = step.produced
    return Merge(names[outer.id], names[inner.id], names[step.consumed[0].id])


# -- Split: joins (outer, inner) into one dim ----------------------------------------------------


def _split_generate(space: SpaceParts, state: State, weight_choices: WeightChoices) -> Iterator[Candidate]:
    n, nid = len(state.steps), state.next_id
    free = _free(state)
    for a in free:
        for b in free:
            if a is b:
                continue
            size = mul(a.size, b.size)
            made = FDim(nid, size, SPLIT, n, nid, a.reduces or b.reduces, False)
            yield BStep("Split", (a, b), (made,), index=n), (size,), None


def _split_mirror(state: State, step: Primitive, sizes: Mapping[str, Size], by_name: Mapping[str, FDim]):
    assert isinstance(step, Split)
    n, nid = len(state.steps), state.next_id
    a, b = by_name[step.outer], by_name[step.inner]
    made = FDim(nid, sizes[step.dim], SPLIT, n, nid, a.reduces or b.reduces, False)
    return BStep("Split", (a, b), (made,), index=n), (step.dim,)


def _split_build(step: BStep, names: Names, weight: str) -> Primitive:
    outer, inner = step.consumed
    return Split(names[step.produced[0].id], inner.size, names[outer.id], names[inner.id])


# -- Shift: keeps the dim (a new version) --------------------------------------------------------


def _shift_generate(space: SpaceParts, state: State, weight_choices: WeightChoices) -> Iterator[Candidate]:
    n, nid = len(state.steps), state.next_id
    for d in state.frontier:  # a strided dim may pass through a Shift on its way to its window
        made = FDim(nid, d.size, SHIFT, n, nid, d.reduces, d.pending)
        yield BStep("Shift", (d,), (made,), index=n), (), None


def _shift_mirror(state: State, step: Primitive, sizes: Mapping[str, Size], by_name: Mapping[str, FDim]):
    assert isinstance(step, Shift)
    n, nid = len(state.steps), state.next_id
    d = by_name[step.dim]
    made = FDim(nid, d.size, SHIFT, n, nid, d.reduces, d.pending)
    return BStep("Shift", (d,), (made,), index=n), (step.dim,)


def _shift_build(step: BStep, names: Names, weight: str) -> Primitive:
    return Shift(names[step.produced[0].id])


# -- Share: frontier dims into a new weight -------------------------------------------------------


def _share_generate(space: SpaceParts, state: State, weight_choices: WeightChoices) -> Iterator[Candidate]:
    n, nid = len(state.steps), state.next_id
    # each free dim is left, shared or the weight's own, as the canonicalization rules allow
    for consumed, shared, weight_only in weight_choices(space, _free(state)):
        produced = tuple(FDim(nid + i, d.size, SHARED, n, d.root, d.reduces, False) for i, d in enumerate(shared))
        step = BStep("Share", consumed, produced, weight_only=weight_only, index=n)
        yield step, tuple(d.size for d in weight_only), None


def _share_same_name(step: BStep) -> Iterable[tuple[FDim, FDim]]:
    return zip(step.shared, step.produced)


def _share_mirror(state: State, step: Primitive, sizes: Mapping[str, Size], by_name: Mapping[str, FDim]):
    assert isinstance(step, Share) and isinstance(step.weight, Weight)
    n, nid = len(state.steps), state.next_id
    weight = step.weight
    only = tuple(by_name[d.name] for d, new in zip(weight.dims, weight.new) if new)
    shared_names = tuple(d.name for d, new in zip(weight.dims, weight.new) if not new)
    shared = tuple(by_name[name] for name in shared_names)
    produced = tuple(FDim(nid + j, d.size, SHARED, n, d.root, d.reduces, False) for j, d in enumerate(shared))
    return BStep("Share", only + shared, produced, weight_only=only, index=n), shared_names


def _share_build(step: BStep, names: Names, weight: str) -> Primitive:
    entries: list[object] = [Dim(names[d.id], d.size) for d in step.weight_only]
    entries += [names[d.id] for d in step.produced]
    return Share(Weight(*entries, name=weight))


# -- Unfold: joins a main dim and a window into the main dim -------------------------------------


def _unfold_generate(space: SpaceParts, state: State, weight_choices: WeightChoices) -> Iterator[Candidate]:
    # the main dim carries a primary variable, the window is coefficient-only
    n, nid = len(state.steps), state.next_id
    frontier = state.frontier
    for m in frontier:
        if m.coef_only:
            continue
        for k in frontier:
            if k is m or not k.coef_only:
                continue
            made = FDim(nid, m.size, UNFOLD, n, nid, m.reduces or k.reduces, False)
            yield BStep("Unfold", (m, k), (made,), index=n), (), space.window_mask(k.size, m.size)


def _unfold_mirror(state: State, step: Primitive, sizes: Mapping[str, Size], by_name: Mapping[str, FDim]):
    assert isinstance(step, Unfold)
    n, nid = len(state.steps), state.next_id
    m, k = by_name[step.dim], by_name[step.name]
    made = FDim(nid, m.size, UNFOLD, n, nid, m.reduces or k.reduces, False)
    return BStep("Unfold", (m, k), (made,), index=n), (step.dim,)


def _unfold_build(step: BStep, names: Names, weight: str) -> Primitive:
    window = step.consumed[1]
    return Unfold(names[step.produced[0].id], window.size, names[window.id])


# -- Stride: K -> S*K, to be consumed by a window ------------------------------------------------


def _stride_generate(space: SpaceParts, state: State, weight_choices: WeightChoices) -> Iterator[Candidate]:
    n, nid = len(state.steps), state.next_id
    for d in _free(state):
        for factor in space.positive_monomials:
            size = mul(d.size, factor)
            made = FDim(nid, size, STRIDE, n, nid, d.reduces, True)
            yield BStep("Stride", (d,), (made,), factor, index=n), (size, factor), None


def _stride_mirror(state: State, step: Primitive, sizes: Mapping[str, Size], by_name: Mapping[str, FDim]):
    assert isinstance(step, Stride)
    n, nid = len(state.steps), state.next_id
    d = by_name[step.dim]
    made = FDim(nid, sizes[step.dim], STRIDE, n, nid, d.reduces, True)
    return BStep("Stride", (d,), (made,), step.stride, index=n), (step.dim,)


def _stride_build(step: BStep, names: Names, weight: str) -> Primitive:
    assert step.param is not None
    return Stride(names[step.produced[0].id], step.param)


# -- Expand: drops a dim -------------------------------------------------------------------------


def _expand_generate(space: SpaceParts, state: State, weight_choices: WeightChoices) -> Iterator[Candidate]:
    n = len(state.steps)
    for d in _free(state):
        yield BStep("Expand", (d,), (), index=n), (), None


def _expand_mirror(state: State, step: Primitive, sizes: Mapping[str, Size], by_name: Mapping[str, FDim]):
    assert isinstance(step, Expand)
    return BStep("Expand", (by_name[step.name],), (), index=len(state.steps)), ()


def _expand_build(step: BStep, names: Names, weight: str) -> Primitive:
    d = step.consumed[0]
    return Expand(names[d.id], d.size)


# -- Slide and Dilate: written by hand, never placed by search ----------------------------------
# A Slide's input dim has N = s*(P-1) + K + (a remainder below s) elements, no monomial of the sizes
# search works with, and a Dilate only serves a transposed convolution; both stay out of synthesis
# (cap 0), so bottom-up synthesis neither proposes nor mirrors them.


def _not_generated(space: SpaceParts, state: State, weight_choices: WeightChoices) -> Iterator[Candidate]:
    return iter(())


def _not_mirrored(state: State, step: Primitive, sizes: Mapping[str, Size], by_name: Mapping[str, FDim]):
    raise SearchError(
        f"{step.describe()}: search does not place {step.kind} steps (a window without padding or a "
        f"transposed convolution's zero insertion), so it has no bottom-up path to this operator"
    )


def _not_built(step: BStep, names: Names, weight: str) -> Primitive:
    raise SearchError(f"search does not place {step.kind} steps")


#: The table, in the order synthesis tries the kinds.
SEARCH_RULES: dict[str, KindRule] = {
    rule.kind: rule
    for rule in (
        KindRule("Reduce", _reduce_generate, None, "reducing", _no_names, _reduce_mirror, _reduce_build),
        KindRule("Merge", _merge_generate, 2, None, _no_names, _merge_mirror, _merge_build),
        KindRule("Split", _split_generate, 2, None, _no_names, _split_mirror, _split_build),
        KindRule("Shift", _shift_generate, 2, None, _first_keeps_name, _shift_mirror, _shift_build),
        KindRule("Share", _share_generate, 2, "shares", _share_same_name, _share_mirror, _share_build),
        KindRule("Unfold", _unfold_generate, 2, None, _first_keeps_name, _unfold_mirror, _unfold_build),
        KindRule("Stride", _stride_generate, 1, "strides", _first_keeps_name, _stride_mirror, _stride_build),
        KindRule("Expand", _expand_generate, 1, None, _no_names, _expand_mirror, _expand_build),
        KindRule("Slide", _not_generated, 0, None, _no_names, _not_mirrored, _not_built),
        KindRule("Dilate", _not_generated, 0, None, _no_names, _not_mirrored, _not_built),
    )
}

#: The kinds search may place, in the order it tries them.
KINDS: tuple[str, ...] = tuple(SEARCH_RULES)
#: Each kind's position in ``State.counts``.
KIND_INDEX: dict[str, int] = {kind: i for i, kind in enumerate(KINDS)}
#: Default per-operator caps on primitive counts (None: limited only by the depth).
DEFAULT_CAPS: dict[str, int | None] = {kind: rule.cap for kind, rule in SEARCH_RULES.items()}
