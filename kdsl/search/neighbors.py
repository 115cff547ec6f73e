"""Search around known designs: the gallery's operators for the space's spec, then their rewrites.

Bottom-up synthesis starts from nothing, so a short run spends its time on shallow operators and
rarely reaches the designs people use (a grouped conv has 8 steps). This strategy starts where
they are: every gallery operator whose input and output match the spec (``conv2d``,
``grouped_conv2d``, ``depthwise_separable_conv2d``, Syno's operators, ...), with its coefficients
set to each value the space allows, and then walks outwards one rewrite at a time, cheapest path
first (:data:`COST`: the rewrites that keep a design's capacity cost least, so combinations of up to
:data:`MAX_REWRITES` of them come before any design loses a step or gains a shift):

* **coefficient**: one coefficient set to another value the space allows (``G = 4 -> 8``);
* **drop**: one step removed (a shift or a stride of a window, a window that a reduction
  then sums, ...), where the rest still builds and still fits the spec;
* **shift**: a ``Shift`` of a spatial dim inserted before a step (Syno's cheap spatial mixing);
* **swap**: two adjacent steps exchanged (the canonical form dedupes the ones that commute);
* **group**: one weight's contraction over a channel dim split into ``G`` groups, as grouped
  convolution splits conv2d's: ``Split(X, X/G, "g", "X_i")`` before its ``Share``, the weight indexed
  by the group and covering a ``G``-th of its output dim ``O`` (``Dim("O_o", O/G)``), the Reduce of
  ``X`` over ``X_i`` instead, and ``Merge(g, O_o, O)`` after it. It reaches the grouped form of any
  design (conv2d's is ``grouped_conv2d``; a two-stage design grouped twice, with the first stage's
  output channels interleaved by a transpose, mixes its groups between the stages as ShuffleNet does);
* **transpose**: the two halves of a ``Merge`` exchanged (``Merge(g, co)`` -> ``Merge(co, g)``:
  the output channels of the groups interleaved, a channel shuffle), or a ``Split`` of an input
  dim made to interleave instead of taking blocks (``Split(Cin, Cin/G, "g", "ci")`` ->
  ``Split(Cin, G, "ci", "g")``: a group takes every G-th channel).

Each operator's rewrites are tried in a seeded order within each kind, the kinds in the order
transpose, group, coefficient, swap, drop, shift: a drop takes capacity away (a conv without one of its
windows rarely learns as well), and a design with shifts inserted is a *variant* of it
(:mod:`kdsl.search.provenance`), which discover does not train again.

Every operator is kept only if it builds, fits the spec and is new by content key; the driver
evaluates it like every search result (validity on the space's layers, budgets). The walk is
deterministic (the seed only shuffles the order of each operator's rewrites), so a run resumes
from the number of operators it has given. It ignores the space's depth and primitive caps: it
explores near designs that are often deeper than enumeration reaches.

>>> from kdsl.search.space import Space
>>> walk = Neighbors(Space("conv2d", "resnet18", coefficients={"K": [3], "G": [4, 8], "s": [2]}))
>>> found = [step.op for step, _ in zip(walk.states(), range(40))]
>>> from kdsl.lang import library
>>> library.load("grouped_conv2d").key in {op.key for op in found}
True
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from collections.abc import Collection, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kdsl.lang import library, sizes
from kdsl.lang.build import Builder
from kdsl.lang.errors import KdslError
from kdsl.lang.names import unused_name
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import Dim, Merge, Output, Reduce, Share, Shift, Split, Unfold, Weight
from kdsl.search.analytic import evaluate

__all__ = ["Found", "Neighbors", "rebuilt", "seeds", "takes_capacity"]

#: how many rewrites away from a gallery design the walk goes at most
MAX_REWRITES = 3
#: the order in which each operator's rewrites are tried, by kind (see :func:`rewrites`)
ORDER = {"transpose": 0, "group": 1, "coefficient": 2, "swap": 3, "drop": 4, "shift": 5}
#: what each kind of rewrite adds to a neighbour's cost: the walk takes the cheapest first, so the
#: rewrites that keep a design's capacity (transposes, groups, coefficients) are combined up to
#: :data:`MAX_REWRITES` deep before a design loses a step or gains a shift (a BFS would try every
#: drop and shift of every gallery design before the second rewrite of any)
COST = {"transpose": 1, "group": 1, "coefficient": 1, "swap": 2, "drop": 4, "shift": 4}
#: the coefficient that a group rewrite splits channels by
GROUPS = "G"


@dataclass
class Found:
    """One operator the walk gives, evaluated: what the search driver stores."""

    op: Operator
    result: dict[str, Any]
    depth: int
    metrics: dict[str, Any] = field(default_factory=dict)


def _fits(op: Operator, space: Any) -> bool:
    """Whether ``op`` maps the spec's input sizes to its output sizes (dim names may differ)."""
    spec = space.spec
    return [d.size for d in op.inputs] == [d.size for d in spec.inputs] and [d.size for d in op.outputs] == [
        d.size for d in spec.outputs
    ]


def rewrite_kind(text: str) -> str:
    """The kind (a key of :data:`COST`) of a rewrite as :func:`rewrites` words it.

    >>> [rewrite_kind(t) for t in ("transpose Merge(g, co)", "G=4", "Shift(H) before Share(w)", "drop Shift(H, 1)")]
    ['transpose', 'coefficient', 'shift', 'drop']
    """
    first = text.split(" ", 1)[0]
    if first in ("transpose", "group", "swap", "drop"):
        return first
    return "shift" if first.startswith("Shift(") else "coefficient"


def takes_capacity(rewrites: Any) -> bool:
    """Whether the rewrites that made a neighbour (its search metrics' ``rewrites``) drop one of its
    design's windows or weights: such a design computes less from the same input and learns less
    (in the three 30-minute discoveries of docs/discover, none of the 65 trained came within
    2 points of conv2d; the best was 3.3 points below), so discover trains them last.

    >>> takes_capacity(["transpose Merge(g, co)", "drop Unfold(W, K)"]), takes_capacity(["drop Shift(H, 1)"])
    (True, False)
    """
    return any(str(text).startswith(("drop Unfold", "drop Share")) for text in rewrites or ())


def _coefficient_values(space: Any) -> dict[str, tuple[int, ...]]:
    return {c.name: tuple(c.values) for c in space.coefficients}


def seeds(space: Any) -> list[tuple[str, Operator]]:
    """The gallery's linear operators that fit the space's spec, each with every assignment of its
    coefficients to values the space allows (its own defaults where the space says nothing).

    >>> from kdsl.search.space import Space
    >>> names = [name for name, _ in seeds(Space("conv2d", "resnet18", coefficients={"K": [3], "G": [4]}))]
    >>> "conv2d" in names and "grouped_conv2d" in names and "depthwise_separable_conv2d" in names
    True
    """
    allowed = _coefficient_values(space)
    found: list[tuple[str, Operator]] = []
    for name in library.names():  # the gallery's files, read by lang (search sits below kdsl.gallery)
        op = library.load(name)
        if not op.is_linear or not _fits(op, space):
            continue
        variants = [op]
        for coefficient in op.coefficient_variables:
            values = allowed.get(coefficient)
            if values:
                variants = [v.with_defaults(**{coefficient: value}) for v in variants for value in values]
        found.extend((name, variant) for variant in variants)
    return found


def _transposed(op: Operator, step: Any) -> Any | None:
    """``step`` with its two halves exchanged (see the module doc), or None where it has none: a
    ``Merge``, or a ``Split`` of one of ``op``'s input dims (whose size is known without a build)."""
    if isinstance(step, Merge):
        return dataclasses.replace(step, outer=step.inner, inner=step.outer)
    if isinstance(step, Split) and step.outer and step.inner:
        size = next((d.size for d in op.inputs if d.name == step.dim), None)
        if size is not None:
            return Split(step.dim, size / step.block, step.inner, step.outer)
    return None


def rebuilt(op: Operator, steps: tuple[Any, ...], defaults: Mapping[str, int] | None = None) -> Operator | None:
    """``op``'s input, output and coefficients (and ``defaults``) with other steps, or ``None``
    where they do not build or no longer map the input's sizes to the output's."""
    try:
        built = Builder(op.inputs, steps, None, []).finish(
            Output(*(d.name for d in op.outputs), defaults={**dict(op.defaults), **(defaults or {})} or None)
        )
    except KdslError:
        return None
    return built if [d.size for d in built.outputs] == [d.size for d in op.outputs] else None


def grouped(op: Operator, index: int, groups: int, fixed: Collection[str]) -> tuple[str, Operator] | None:
    """``op`` with the weight that step ``index`` shares grouped (the module doc's **group**) by the
    coefficient ``G`` (``groups``: its value where ``op`` has no ``G`` yet), and the words that say
    so; None where that step is no ``Share`` of a weight contracting one whole channel dim (not a
    window, not a part of a split, not one of the ``fixed`` dims such as the batch and spatial
    ones, reduced later) into one output dim of its own, or the result does not build.

    >>> from kdsl.lang import library
    >>> words, op = grouped(library.load("conv2d"), 2, 2, fixed={"N", "H", "W"})
    >>> words, op.design_key == library.load("grouped_conv2d").design_key
    ('group Share(w) by G', True)
    """
    steps = list(op.steps)
    share = steps[index]
    if not isinstance(share, Share) or not isinstance(share.weight, Weight):
        return None
    weight, live = share.weight, op.live[index]
    windows = {step.name or "" for step in steps[:index] if isinstance(step, Unfold)}
    # a part of a split channel is grouped already: grouping it again makes G*G groups, the same
    # design at another G (the coefficient rewrite's job), so only whole channels are grouped
    windows |= {step.inner or "" for step in steps[:index] if isinstance(step, Split)}
    windows |= {step.outer or "" for step in steps[:index] if isinstance(step, Split)}
    outs = [d for d, new in zip(weight.dims, weight.new) if new]
    contracted = [
        d.name
        for d, new in zip(weight.dims, weight.new)
        if not new and d.name in live and d.name not in windows and d.name not in fixed
    ]
    reduces = {
        name: i
        for i in range(index + 1, len(steps))
        if isinstance(steps[i], Reduce)
        for name in steps[i].dims
        if isinstance(name, str)
    }
    contracted = [name for name in contracted if name in reduces]
    if len(outs) != 1 or len(contracted) != 1:
        return None
    out, channel = outs[0], contracted[0]
    G = sizes.coefficient(GROUPS)
    names = {name for sizes in op.live for name in sizes} | {d.name for w in op.weights for d in w.dims}
    group, inner, part = (unused_name(name, names, separator="") for name in ("g", f"{channel}_i", f"{out.name}_o"))
    entries: list[object] = [group]
    for d, new in zip(weight.dims, weight.new):
        if d.name == out.name:
            entries.append(Dim(part, out.size / G))
        elif d.name == channel:
            entries.append(inner)
        else:
            entries.append(Dim(d.name, d.size) if new else d.name)
    where = reduces[channel]
    reduce = steps[where]
    steps[where] = Reduce(*(inner if name == channel else name for name in reduce.dims), mean=reduce.mean)
    steps.insert(where + 1, Merge(group, part, out.name))
    steps[index] = Share(Weight(*entries, name=weight.name))
    steps.insert(index, Split(channel, live[channel] / G, group, inner))
    defaults = {} if GROUPS in op.coefficient_variables else {GROUPS: groups}
    built = rebuilt(op, tuple(steps), defaults)
    return (f"group {share.describe()} by {GROUPS}", built) if built is not None else None


def rewrites(op: Operator, space: Any, rng: random.Random) -> Iterator[tuple[str, Operator]]:
    """The operators one rewrite away from ``op`` (see the module doc), in a seeded order."""
    moves: list[tuple[str, Any]] = []
    for coefficient, values in _coefficient_values(space).items():
        if coefficient in op.coefficient_variables:
            moves.extend(
                ("coefficient", (coefficient, v)) for v in values if v != op.default_coefficients.get(coefficient)
            )
    moves.extend(("drop", i) for i in range(len(op.steps)))
    moves.extend(("swap", i) for i in range(len(op.steps) - 1))
    moves.extend(("transpose", i) for i, step in enumerate(op.steps) if _transposed(op, step) is not None)
    groups = _coefficient_values(space).get(GROUPS)
    fixed = set(space.spatial) | set(space.spec.batch) | {d.name for d in op.inputs if d.name in space.spatial}
    if groups:
        moves.extend(("group", i) for i, step in enumerate(op.steps) if isinstance(step, Share))
    spatial = [d.name for d in op.inputs if d.name in space.spatial or d.size.variable_name in space.spatial]
    moves.extend(("shift", (i, dim)) for i in range(len(op.steps)) for dim in spatial)
    rng.shuffle(moves)
    # stable, so each kind keeps the seeded order: the rewrites that change the design without
    # taking capacity away first, then drops (a dropped window or weight rarely learns as well),
    # shifts last (a design with shifts inserted is a variant of it)
    moves.sort(key=lambda move: ORDER[move[0]])
    for kind, move in moves:
        if kind == "coefficient":
            coefficient, value = move
            yield f"{coefficient}={value}", op.with_defaults(**{coefficient: value})
            continue
        if kind == "group":
            found = grouped(op, move, groups[0], fixed)
            if found is not None:
                yield found
            continue
        steps = list(op.steps)
        if kind == "drop":
            text = f"drop {steps[move].describe()}"
            del steps[move]
        elif kind == "swap":
            text = f"swap {steps[move].describe()} and {steps[move + 1].describe()}"
            steps[move], steps[move + 1] = steps[move + 1], steps[move]
        elif kind == "transpose":
            text = f"transpose {steps[move].describe()}"
            steps[move] = _transposed(op, steps[move])
        else:
            position, dim = move
            around = steps[max(0, position - 1) : position + 1]
            if any(isinstance(step, Shift) and step.dim == dim for step in around):
                continue  # a shift next to a shift of the same dim only moves it further
            text = f"Shift({dim}) before {steps[position].describe()}"
            steps.insert(position, Shift(dim))
        built = rebuilt(op, tuple(steps))
        if built is not None:
            yield text, built


class Neighbors:
    """The strategy ``neighbors`` of :func:`kdsl.search.run.search` (see the module doc)."""

    def __init__(self, space: Any, seed: int = 0, progress: Mapping[str, Any] | None = None) -> None:
        self.space = space
        self.seed = seed
        self.emitted = int((progress or {}).get("emitted", 0))
        self.nodes = 0

    def progress(self) -> dict[str, Any]:
        return {"emitted": self.emitted}

    def states(self) -> Generator[Found | None, object, None]:
        seen: set[str] = set()
        # cheapest first (COST: rewrites that keep the design's capacity cost least), ties in the
        # order found; an insertion counter keeps the order total, so the walk stays deterministic
        queue: list[tuple[int, int, Operator, int, str, tuple[str, ...]]] = []
        counter = itertools.count()
        for name, op in seeds(self.space):
            if op.key not in seen:
                seen.add(op.key)
                heapq.heappush(queue, (0, next(counter), op, 0, name, ()))
        given = 0
        while queue:
            cost, _, op, distance, origin, path = heapq.heappop(queue)
            self.nodes += 1
            if given >= self.emitted:  # operators given before a resume are not given again
                self.emitted += 1
                result = evaluate(self.space, op)
                metrics = {"origin": origin, "rewrites": list(path)}
                yield Found(op, result, len(op.steps), metrics)
            given += 1
            if distance >= MAX_REWRITES:
                continue
            rng = random.Random(f"neighbors:{self.seed}:{op.key}")
            for text, other in rewrites(op, self.space, rng):
                if other.key in seen or not _fits(other, self.space):
                    continue
                seen.add(other.key)
                step = cost + COST[rewrite_kind(text)]
                heapq.heappush(queue, (step, next(counter), other, distance + 1, origin, (*path, text)))
