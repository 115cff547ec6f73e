"""The values of bottom-up synthesis: frontier dims, bottom-up steps, partial graphs, and the
memoized size arithmetic the hot loop uses.

A :class:`State` is a partial graph: the *frontier* (the dims at its top, which must finally be the
input's dims) and the bottom-up steps (:class:`BStep`) applied so far; each frontier dim
(:class:`FDim`) records its *role*, i.e. which top-down step will consume it. The per-kind table
(:mod:`kdsl.search.kinds`), the synthesis (:mod:`kdsl.search.synthesis`) and the canonicalization
rules (:mod:`kdsl.search.rules`) all read these values; none of them is imported here.
"""

from __future__ import annotations

from kdsl.lang.primitives import CONTRACTION, PRIMITIVES, REDUCTION
from kdsl.lang.sizes import Size

__all__ = ["BStep", "FDim", "State", "div", "mul", "size_order"]

# How a frontier dim was made, i.e. which top-down step consumes it (its "role").
OUT, REDUCE, SHARED, MERGE_OUTER, MERGE_INNER, SPLIT, UNFOLD, STRIDE, SHIFT = range(9)
ROLE_NAMES = ("out", "reduce", "shared", "merge-outer", "merge-inner", "split", "unfold", "stride", "shift")

#: the kinds that sum a dim away (read from the declarations; the hot loop tests membership)
REDUCTIONS = frozenset(kind for kind, cls in PRIMITIVES.items() if REDUCTION in cls.facts)
#: the kinds that multiply by a weight
CONTRACTIONS = frozenset(kind for kind, cls in PRIMITIVES.items() if CONTRACTION in cls.facts)


class FDim:
    """A frontier dim: an edge of the partial graph whose top end is still open.

    ``role``/``step``: how and by which bottom-up step it was made (``OUT`` and -1 for output
    dims). ``root``: the id of the dim before any weight versions (a contraction keeps the root).
    ``reduces``: some path below it (top-down) reaches a reduction. ``pending``: it was strided
    and must be consumed by a window.
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
    (a reduced size, a block, a stride factor), and for a contraction which consumed dims are the
    weight's own (weight-only)."""

    __slots__ = ("kind", "consumed", "produced", "param", "weight_only", "index", "shared")

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
        #: for a contraction: the consumed dims that stay on the frontier (in order of ``produced``);
        #: kept, since every weight rule reads it
        self.shared = tuple(d for d in consumed if d not in weight_only) if weight_only else consumed

    def __str__(self) -> str:
        if self.kind in REDUCTIONS:
            return f"{self.kind}({self.param})"
        if self.kind in CONTRACTIONS:
            only = ", ".join(str(d.size) for d in self.weight_only)
            shared = ", ".join(str(d.size) for d in self.shared)
            return f"{self.kind}(weight-only [{only}], shared [{shared}])"
        args = ", ".join(str(d.size) for d in self.consumed)
        if self.param is not None:
            args += f"; {self.param}"
        return f"{self.kind}({args})"

    __repr__ = __str__


class State:
    """A partial graph: frontier, bottom-up steps, validity mask, per-kind step counts (in the
    order of :data:`kdsl.search.kinds.KINDS`), coefficient uses, and per-assignment parameter
    totals (``params``) and FLOPs lower bounds (``flops_lb``)."""

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
        """Still in the reduction stage (only reductions so far)."""
        return all(step.kind in REDUCTIONS for step in self.steps)

    def __repr__(self) -> str:
        return f"State([{', '.join(map(repr, self.frontier))}], {list(self.steps)})"


_PRODUCTS: dict[tuple[Size, Size], Size] = {}


def mul(a: Size, b: Size) -> Size:
    """``a * b``, memoized (search multiplies the same few sizes over and over)."""
    key = (a, b)
    found = _PRODUCTS.get(key)
    if found is None:
        found = _PRODUCTS[key] = a * b
    return found


_QUOTIENTS: dict[tuple[Size, Size], Size] = {}


def div(a: Size, b: Size) -> Size:
    """``a / b``, memoized."""
    key = (a, b)
    found = _QUOTIENTS.get(key)
    if found is None:
        found = _QUOTIENTS[key] = a / b
    return found


def size_order(size: Size) -> tuple:
    """A deterministic order of sizes: primaries first by name, then coefficient powers."""
    return (
        tuple((v.sort_key(), e) for v, e in size.exponents if v.kind == "primary"),
        sum(abs(e) for _, e in size.exponents),
        tuple((v.sort_key(), -e) for v, e in size.exponents),
        size.constant,
    )
