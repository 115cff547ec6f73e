"""The dependency graph of a chain's steps over dim versions, and folding the views whose outputs
are only summed into the sums (:func:`folded`): what :mod:`kdsl.solve.plan` orders into stages.

>>> from kdsl.lang import library
>>> graph = dependency_graph(library.load("conv2d").chain)
>>> len(graph.steps) == len(library.load("conv2d").steps)
True
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from kdsl.lang.chain import Chain
from kdsl.lang.live import Live
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import (
    DROPS,
    HEAVY,
    ONE_TO_MANY,
    REDUCTION,
    VIEW,
    WINDOWING,
    BuildContext,
    Primitive,
    Reduce,
)
from kdsl.lang.sizes import Size

__all__ = ["DependencyGraph", "dependency_graph", "folded"]

#: Facts of a view that is not a permutation of its elements (it replicates, pads or drops some).
NOT_PERMUTATIONS = frozenset({HEAVY, ONE_TO_MANY, WINDOWING, DROPS})

# ------------------------------------------------------------------------------------------------
# The dependency graph over dim versions
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DependencyGraph:
    steps: tuple[Primitive, ...]
    consumed: tuple[tuple[int, ...], ...]  # per step: versions, in the order of step.consumes
    produced: tuple[tuple[int, ...], ...]  # per step: versions, in the order of step.produces
    inherit: tuple[tuple[int, ...], ...]  # per produced version: the consumed version whose name it keeps, or -1
    successors: tuple[tuple[int, ...], ...]
    predecessors: tuple[int, ...]  # how many steps each step depends on
    names: tuple[str, ...]  # per version
    sizes: tuple[Size, ...]  # per version
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@lru_cache(maxsize=512)
def dependency_graph(op: Operator) -> DependencyGraph:
    names: list[str] = []
    sizes: list[Size] = []
    producer: list[int] = []
    current: dict[str, int] = {}

    def new(name: str, size: Size, step: int) -> int:
        names.append(name)
        sizes.append(size)
        producer.append(step)
        return len(names) - 1

    for dim in op.inputs:
        current[dim.name] = new(dim.name, dim.size, -1)
    inputs = tuple(current.values())
    consumed: list[tuple[int, ...]] = []
    produced: list[tuple[int, ...]] = []
    inherit: list[tuple[int, ...]] = []
    successors: list[set[int]] = [set() for _ in op.steps]
    predecessors: list[int] = []
    for index, step in enumerate(op.steps):
        taken = tuple(current.pop(name) for name in step.consumes)
        made = tuple(new(name, op.live[index + 1][name], index) for name in step.produces)
        current.update(zip(step.produces, made))
        sources = dict(zip(step.consumes, taken))
        inherit.append(tuple(sources.get(name, -1) for name in step.produces))
        before = {producer[v] for v in taken if producer[v] >= 0}
        for earlier in before:
            successors[earlier].add(index)
        predecessors.append(len(before))
        consumed.append(taken)
        produced.append(made)
    return DependencyGraph(
        steps=op.steps,
        consumed=tuple(consumed),
        produced=tuple(produced),
        inherit=tuple(inherit),
        successors=tuple(tuple(sorted(s)) for s in successors),
        predecessors=tuple(predecessors),
        names=tuple(names),
        sizes=tuple(sizes),
        inputs=inputs,
        outputs=tuple(current[d.name] for d in op.outputs),
    )


# ------------------------------------------------------------------------------------------------
# Folding views into the reductions that consume them
# ------------------------------------------------------------------------------------------------


def _foldable(graph: DependencyGraph, index: int, reducer: dict[int, int]) -> list[int] | None:
    """The Reduces that consume every dim step ``index`` makes, if it is a permutation of the data
    (a view that neither replicates, drops nor pads: a reshape or a cyclic shift) whose outputs
    are only ever summed (all with one ``mean`` flag), else None."""
    step = graph.steps[index]
    if VIEW not in step.facts or step.facts & NOT_PERMUTATIONS:
        return None
    readers = [reducer.get(version) for version in graph.produced[index]]
    if any(reader is None for reader in readers):
        return None
    means = {graph.steps[reader].mean for reader in readers}  # type: ignore[index,attr-defined]
    return readers if len(means) == 1 else None  # type: ignore[return-value]


@lru_cache(maxsize=512)
def folded(op: Operator) -> Operator:
    """``op`` with every reshape or cyclic shift whose outputs are only summed folded into the sum.

    Such a view permutes the elements of its dims, and a sum over all of a permutation's outputs
    is the sum over all of its inputs (a mean likewise, the sizes being equal): summing a merged
    dim is summing both of its parts, summing the two parts of a split dim is summing the dim,
    and summing a shifted dim is summing the dim. So ``Merge(a, b, "c") ... Reduce("c")`` becomes
    ``Reduce(a, b)``; the Reduces take the view's place (nothing between them touches its
    outputs, and the planner moves them again). This is what keeps a plan from ending a
    contraction stage at the view: a Merge between a Share and the Reduce of the merged dim would
    make the Share's whole product (every dim of the weight times every dim of the data) one
    materialised tensor, summed only afterwards.

    >>> from kdsl.lang import *
    >>> N, C, D = primary("N C D"); G = coefficient("G")
    >>> op = (Input(N, C) >> Split(C, G, "c", "g") >> Share(Weight("c", "g", D, name="w"))
    ...       >> Merge("c", "g", "C2") >> Reduce("C2") >> Output(N, D))
    >>> [step.describe() for step in folded(op).steps]
    ['Split(C, G)', 'Share(w)', 'Reduce(c)', 'Reduce(g)']
    """
    current = op
    while True:
        graph = dependency_graph(current)
        reducer = {graph.consumed[index][0]: index for index, step in enumerate(graph.steps) if REDUCTION in step.facts}
        for index in range(len(graph.steps)):
            readers = _foldable(graph, index, reducer)
            if readers is not None:
                break
        else:
            return current
        step = graph.steps[index]
        mean = graph.steps[readers[0]].mean  # type: ignore[attr-defined]
        sums = [Reduce(name, mean=mean) for name in step.consumes]  # every dim the view permutes
        steps: list[Primitive] = []
        for position, other in enumerate(current.steps):
            if position == index:
                steps.extend(sums)
            elif position not in readers:
                steps.append(other)
        live = Live({d.name: d.size for d in current.inputs}, frozenset())
        context = BuildContext()
        resolved = tuple(other.apply(live, context) for other in steps)
        # built directly, not with Output(...): a folded split's block may have been the only use of
        # a coefficient that the defaults still name
        chain = Chain(current.inputs, resolved, current.outputs, current.defaults)
        current = Operator.linear(chain) if isinstance(current, Operator) else chain
