"""Read-only facts about branching kernels (:class:`~kdsl.lang.operator.Operator`) that the solver, the
cost model and the renderers share: how a node is named in messages, which node's storage a
result lives in (a Rename moves no data), and element counts.

>>> from kdsl.lang import library
>>> se = library.load("squeeze_excitation")
>>> [node.describe() for node in se.nodes]  # doctest: +NORMALIZE_WHITESPACE
['Input', 'chain Reduce(H, W, mean)', 'FC(Cin -> z: Cin/r)', 'Map(relu)', 'FC(z -> c: Cin)', 'Map(sigmoid)',
 'Rename(c -> Cin)', 'Blend(mul)']
>>> node_label(se, 2)
'node 2 FC(Cin -> z: Cin/r)'
>>> storage(se)
(0, 1, 2, 3, 4, 5, 5, 7)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kdsl.lang.operator import Operator
from kdsl.lang.primitives import Dim
from kdsl.lang.sizes import Size


def elements(sizes: Iterable[Size]) -> Size:
    """The product of ``sizes`` (the number of elements of a tensor of these dims)."""
    total = Size.of(1)
    for size in sizes:
        total = total * size
    return total


def dim_elements(dims: Sequence[Dim]) -> Size:
    """The number of elements of a tensor with the dims ``dims``."""
    return elements(d.size for d in dims)


def node_label(graph: Operator, index: int) -> str:
    """How messages name a node: ``node 2 FC(C -> r: R)``."""
    return f"node {index} {graph.nodes[index].describe()}"


def storage(graph: Operator) -> tuple[int, ...]:
    """For each node, the node whose result holds its data: itself, or for a Rename (which moves no
    data) the storage of its argument."""
    owners: list[int] = []
    for index, node in enumerate(graph.nodes):
        owners.append(owners[node.args[0]] if node.kind == "Rename" else index)
    return tuple(owners)


__all__ = ["dim_elements", "elements", "node_label", "storage"]
