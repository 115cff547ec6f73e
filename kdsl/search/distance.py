"""Shape distance (Syno §7.1 and Appendix A): a lower bound on the number of primitives a partial
operator still needs before its frontier is exactly the input.

Only *helpful* steps can bring the frontier closer: reshapes (bottom-up, joining two dims or
splitting one) and eliminations (a window joins its main dim, a repeated dim is dropped, a
contraction drops its weight-only dims, several at once). Group the frontier dims ``O`` and input
dims ``I`` into *reshape groups* (the connected components of the future reshapes). In a group,
joining ``|O|`` pieces into one takes at least ``|O| - 1`` joins and, seen from the top, at least
``|I| + |E| - 1`` splits, where ``E`` are the dims eliminated inside the group; so a group costs at
least ``|O| + |I| - 2``, one more when its sizes differ (``prod O != prod I``: something must be
eliminated or strided), and eliminations cost at least one more step overall (one contraction can
drop many dims; without contractions left, one step per dropped dim). Frontier dims dropped on
their own cost nothing but that step.
The distance is the minimum over the ways to group, found by branch and bound:

* a dim with a primary variable only joins a group whose input shares one of its primaries (or
  is dropped): anything else is dominated by dropping it;
* a coefficient-only dim only joins a group whose size ratio lacks one of its variables;
* while reductions may still be added (the reduction stage), a group that is short of elements
  (or empty) can take a new reduced dim, at the cost of that reduction and one more dim;
* with strides left, a group short of coefficient factors can be fixed by a stride (one step).

Which kinds keep which of these allowances open (``reducing``, ``strides``, ``shares``) while
under their caps is read from the search table (``KindRule.distance``).

>>> from kdsl.lang.sizes import primary, coefficient
>>> Cin, H, W, N = primary("Cin H W N"); s, k = coefficient("s k")
>>> shape_distance([Cin, H / s, s * W, k, N], [N, Cin, H, W])  # a split, a join, a window (paper's example)
3
>>> shape_distance([N, Cin, H, W], [N, Cin, H, W])
0
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kdsl.lang.sizes import Size
from kdsl.search.kinds import SEARCH_RULES
from kdsl.search.state import mul

__all__ = ["shape_distance", "state_distance"]

INFINITY = math.inf
_ONE = Size.of(1)


def _partitions(items: list[int]) -> list[list[list[int]]]:
    if not items:
        return [[]]
    first, rest = items[0], items[1:]
    found = []
    for partition in _partitions(rest):
        found.append([[first], *partition])
        for i in range(len(partition)):
            found.append(partition[:i] + [[first, *partition[i]]] + partition[i + 1 :])
    return found


_PARTITIONS: dict[tuple[Size, ...], list] = {}


def _blocks(inputs: tuple[Size, ...]) -> list:
    found = _PARTITIONS.get(inputs)
    if found is None:
        found = []
        for partition in _partitions(list(range(len(inputs)))):
            blocks = []
            for block in partition:
                numel = _ONE
                primaries: set[str] = set()
                for i in block:
                    numel = mul(numel, inputs[i])
                    primaries.update(v.name for v, e in inputs[i].exponents if v.kind == "primary")
                blocks.append((_ONE / numel, len(block), frozenset(primaries)))
            found.append(blocks)
        _PARTITIONS[inputs] = found
    return found


def _group_cost(ratio: Size, n_out: int, n_in: int, reducing: bool, strides: bool) -> tuple[float, bool]:
    """(lower bound on the group's reshapes, whether it needs an elimination)."""
    if n_out == 0:
        return (n_in, False) if reducing else (INFINITY, False)
    if ratio is _ONE:
        return n_out + n_in - 2, False
    positive = ratio.constant > 1
    negative = ratio.constant < 1
    for var, e in ratio.exponents:
        if e > 0:
            positive = True
        elif var.kind == "primary":
            return (n_out + n_in, False) if reducing else (INFINITY, False)
        else:
            negative = True
    if negative and not strides:
        return (n_out + n_in, False) if reducing else (INFINITY, False)
    return n_out + n_in - 1, positive


def shape_distance(
    sizes: Sequence[Size],
    inputs: Sequence[Size],
    *,
    pending: int = 0,
    reducing: bool = False,
    strides: bool = False,
    shares: bool = True,
) -> float:
    """A lower bound on the steps from a frontier of ``sizes`` to the ``inputs`` (``inf`` when
    unreachable). ``pending``: strided dims that each still need an Unfold. ``reducing``: more
    reductions may come. ``strides``/``shares``: whether strides/contractions are still available."""
    inputs = tuple(inputs)
    if not pending and sorted(map(id, sizes)) == sorted(map(id, inputs)):
        return 0
    info = []
    for size in sizes:
        primaries = frozenset(v.name for v, e in size.exponents if v.kind == "primary")
        info.append((size, primaries))
    info.sort(key=lambda item: not item[1])  # dims with primaries first
    best = INFINITY
    for blocks in _blocks(inputs):
        best = min(best, _search(info, blocks, pending, reducing, strides, shares, best))
        if best == 0:
            break
    return best if best == INFINITY else int(best)


def _search(info, blocks, pending: int, reducing: bool, strides: bool, shares: bool, bound: float) -> float:
    m = len(blocks)
    ratios = [b[0] for b in blocks]
    counts = [0] * m
    base = sum(b[1] - 2 for b in blocks)
    best = bound
    n = len(info)

    def leaf(dropped: int) -> float:
        total = 0.0
        needs = dropped > 0
        excess_groups = 0
        for b in range(m):
            cost, elim = _group_cost(ratios[b], counts[b], blocks[b][1], reducing, strides)
            if cost == INFINITY:
                return INFINITY
            total += cost
            if elim:
                needs = True
                excess_groups += 1
        eliminations = (1 if needs else 0) if shares else dropped + excess_groups
        return total + max(eliminations, pending)

    def visit(i: int, assigned: int, dropped: int) -> None:
        nonlocal best
        if base + assigned + (1 if dropped and shares else 0) >= best:
            return
        if i == n:
            cost = leaf(dropped)
            if cost < best:
                best = cost
            return
        size, primaries = info[i]
        for b in range(m):
            if primaries:
                if not primaries & blocks[b][2]:
                    continue
            else:
                ratio = ratios[b]
                helps = any(ratio.exponent(v.name) < 0 for v, _ in size.exponents)
                if counts[b] and not helps and not (size.constant > 1 and ratio.constant < 1):
                    continue
            old = ratios[b]
            ratios[b] = mul(old, size)
            counts[b] += 1
            visit(i + 1, assigned + 1, dropped)
            counts[b] -= 1
            ratios[b] = old
        visit(i + 1, assigned, dropped + 1)

    visit(0, 0, 0)
    return best


#: (allowance, position in ``State.counts``) for each kind that keeps an allowance open
_ALLOWANCES = tuple((rule.distance, i) for i, rule in enumerate(SEARCH_RULES.values()) if rule.distance is not None)


def state_distance(space, state) -> float:
    """The shape distance of a search state (memoized on the space)."""

    cache = space.__dict__.setdefault("_distance_cache", {})
    frontier = state.frontier
    pending = sum(1 for d in frontier if d.pending)
    counts = state.counts
    caps = space.cap_tuple
    open_ = {allowance: counts[i] < caps[i] for allowance, i in _ALLOWANCES}
    reducing = state.reducing and open_["reducing"]
    strides = open_["strides"]
    shares = open_["shares"]
    key = (tuple(sorted(id(d.size) for d in frontier)), pending, reducing, strides, shares)
    found = cache.get(key)
    if found is None:
        found = shape_distance(
            [d.size for d in frontier],
            space.input_sizes,
            pending=pending,
            reducing=reducing,
            strides=strides,
            shares=shares,
        )
        cache[key] = found
    return found
