"""The states of bottom-up synthesis: frontier dims, bottom-up steps and partial graphs.

A :class:`State` is a partial graph: the *frontier* (the dims at its top, which must finally be the
input's dims) and the bottom-up steps (:class:`BStep`) applied so far; each frontier dim
(:class:`FDim`) records its *role*, i.e. which top-down step will consume it. The synthesis
(:mod:`kdsl.search.synthesis`) and the canonicalization rules (:mod:`kdsl.search.rules`) both read
these values; neither is imported here.
"""

from __future__ import annotations

from kdsl.lang.sizes import Size
from kdsl.search.space import KINDS, Space, div

__all__ = ["BStep", "FDim", "State", "is_complete", "merge_block_ok", "root"]

# How a frontier dim was made, i.e. which top-down step consumes it (its "role").
OUT, REDUCE, SHARED, MERGE_OUTER, MERGE_INNER, SPLIT, UNFOLD, STRIDE, SHIFT = range(9)
ROLE_NAMES = ("out", "reduce", "shared", "merge-outer", "merge-inner", "split", "unfold", "stride", "shift")

KIND_INDEX = {kind: i for i, kind in enumerate(KINDS)}
#: Rank of each kind in the canonical order of independent adjacent steps (bottom-up): reductions
#: first, then 1-to-1 views, then contractions, then 1-to-many views and strides.
RANK = {"Reduce": 0, "Merge": 1, "Split": 1, "Shift": 1, "Share": 2, "Unfold": 3, "Stride": 3, "Expand": 3}


class FDim:
    """A frontier dim: an edge of the partial graph whose top end is still open.

    ``role``/``step``: how and by which bottom-up step it was made (``OUT`` and -1 for output
    dims). ``root``: the id of the dim before any Share versions (Shares keep the root).
    ``reduces``: some path below it (top-down) reaches a Reduce. ``pending``: it was strided and
    must be consumed by an Unfold.
    """

    __slots__ = ("id", "size", "role", "step", "root", "reduces", "pending", "coef_only")

    def __init__(self, id: int, size: Size, role: int, step: int, root: int, reduces: bool, pending: bool) -> None:
        self.id = id
        self.size = size
        self.role = role
        self.step = step
        self.root = root
        self.reduces = reduces
        self.pending = pending
        self.coef_only = all(v.kind == "coefficient" for v, _ in size.exponents)

    def __repr__(self) -> str:
        flags = "*" if self.pending else ""
        return f"d{self.id}:{self.size}{flags}"


class BStep:
    """One bottom-up step: its kind, the frontier dims it consumes and produces, a size parameter
    (Reduce size, Merge block, Stride factor), and for Share which consumed dims are weight-only."""

    __slots__ = ("kind", "consumed", "produced", "param", "weight_only", "index")

    def __init__(
        self,
        kind: str,
        consumed: tuple[FDim, ...],
        produced: tuple[FDim, ...],
        param: Size | None = None,
        weight_only: tuple[FDim, ...] = (),
        index: int = 0,
    ) -> None:
        self.kind = kind
        self.consumed = consumed
        self.produced = produced
        self.param = param
        self.weight_only = weight_only
        self.index = index

    @property
    def shared(self) -> tuple[FDim, ...]:
        """For a Share: the consumed dims that stay on the frontier (in order of ``produced``)."""
        return tuple(d for d in self.consumed if d not in self.weight_only)

    def __str__(self) -> str:
        if self.kind == "Reduce":
            return f"Reduce({self.param})"
        if self.kind == "Share":
            only = ", ".join(str(d.size) for d in self.weight_only)
            shared = ", ".join(str(d.size) for d in self.shared)
            return f"Share(weight-only [{only}], shared [{shared}])"
        args = ", ".join(str(d.size) for d in self.consumed)
        if self.param is not None:
            args += f"; {self.param}"
        return f"{self.kind}({args})"

    __repr__ = __str__


class State:
    """A partial graph: frontier, bottom-up steps, validity mask, primitive counts, coefficient
    uses, and per-assignment parameter totals (``params``) and FLOPs lower bounds (``flops_lb``)."""

    __slots__ = ("frontier", "steps", "next_id", "mask", "counts", "uses", "params", "flops_lb")

    def __init__(
        self,
        frontier: tuple[FDim, ...],
        steps: tuple[BStep, ...],
        next_id: int,
        mask: int,
        counts: tuple[int, ...],
        uses: tuple[int, ...],
        params: tuple[float, ...],
        flops_lb: tuple[float, ...],
    ) -> None:
        self.frontier = frontier
        self.steps = steps
        self.next_id = next_id
        self.mask = mask
        self.counts = counts
        self.uses = uses
        self.params = params
        self.flops_lb = flops_lb

    @property
    def depth(self) -> int:
        return len(self.steps)

    @property
    def reducing(self) -> bool:
        """Still in the reduction stage (only Reduces so far)."""
        return all(step.kind == "Reduce" for step in self.steps)

    def __repr__(self) -> str:
        return f"State([{', '.join(map(repr, self.frontier))}], {list(self.steps)})"


def root(space: Space) -> State:
    """The empty partial graph: the frontier is the output."""
    frontier = tuple(FDim(i, size, OUT, -1, i, False, False) for i, size in enumerate(space.output_sizes))
    zeros = tuple(0.0 for _ in space.assignments)
    mask = space.mask_all(space.output_sizes + space.input_sizes)
    return State(frontier, (), len(frontier), mask, (0,) * len(KINDS), (0,) * len(space.coefficients), zeros, zeros)


def is_complete(space: Space, state: State) -> bool:
    """Whether the frontier is exactly the input (as a multiset of sizes) with nothing pending."""
    if len(state.frontier) != len(space.input_sizes) or any(d.pending for d in state.frontier):
        return False
    return sorted(id(d.size) for d in state.frontier) == sorted(id(s) for s in space.input_sizes)


def merge_blocks(space: Space, size: Size) -> tuple[tuple[Size, Size], ...]:
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


def merge_block_ok(space: Space, size: Size, inner: Size) -> bool:
    """Whether the bottom-up Merge of a dim of ``size`` into ``(size/inner, inner)`` is generated."""
    return (div(size, inner), inner) in merge_blocks(space, size)
