"""Read-only facts about branching kernels (:class:`~kdsl.lang.graph.Graph`) that the solver, the
cost model and the renderers share: how a node is named in messages, which node's storage a
result lives in (a Rename moves no data), and element counts.

>>> from kdsl.lang import *
>>> N, C, H, W, R = primary("N C H W R")
>>> x = Input(N, C, H, W)
>>> gate = (x >> Reduce(H, W, mean=True) >> FC(C, name="r", size=R, weight="squeeze") >> Map("relu")
...         >> FC("r", name="c", size=C, weight="excite") >> Map("sigmoid") >> Rename("c", "C"))
>>> se = (x * gate) >> Output(N, C, H, W)
>>> [node_text(node) for node in se.nodes]  # doctest: +NORMALIZE_WHITESPACE
['Input', 'chain Reduce(H, W, mean)', 'FC(C -> r: R)', 'Map(relu)', 'FC(r -> c: C)', 'Map(sigmoid)',
 'Rename(c -> C)', 'Blend(mul)']
>>> node_label(se, 2)
'node 2 FC(C -> r: R)'
>>> storage(se)
(0, 1, 2, 3, 4, 5, 5, 7)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kdsl.lang.build import Operator
from kdsl.lang.graph import Graph, Node
from kdsl.lang.nonlinear import FC, BlendJoin, Fold, Map, ProductJoin, Rename, Softmax
from kdsl.lang.primitives import WINDOWING, Dim, Primitive, Reduce
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


def _chain_step_text(step: Primitive) -> str:
    if isinstance(step, Reduce) and step.mean:
        return step.describe()[:-1] + ", mean)"
    return step.describe()


def _merged_reduces(chain: Operator) -> list[str]:
    """The chain's steps as short texts, consecutive Reduces of one kind written as one."""
    texts: list[str] = []
    previous: Reduce | None = None
    for step in chain.steps:
        if isinstance(step, Reduce) and isinstance(previous, Reduce) and previous.mean == step.mean:
            dims = texts[-1][len("Reduce(") : -1].removesuffix(", mean")
            texts[-1] = f"Reduce({dims}, {step.dim}{', mean' if step.mean else ''})"
        else:
            texts.append(_chain_step_text(step))
        previous = step if isinstance(step, Reduce) else None
    return texts


def node_text(node: Node) -> str:
    """A short text of a node's step: ``Map(relu)``, ``Fold(kh, kw, how=max)``, ``FC(C -> r: R)``,
    ``Blend(mul)``, ``Product(d)``, ``chain Unfold(H, K, kh) >> Share(w)``."""
    step = node.step
    if step is None:
        return "Input"
    if isinstance(step, Operator):
        return "chain " + " >> ".join(_merged_reduces(step)) if step.steps else "chain (no steps)"
    if isinstance(step, Map):
        return f"Map({step.fn}, by={step.by:g})" if step.fn == "scale" else f"Map({step.fn})"
    if isinstance(step, Fold):
        return f"Fold({', '.join(map(str, step.dims))}, how={step.how})"
    if isinstance(step, Softmax):
        return f"Softmax({', '.join(map(str, step.dims))})"
    if isinstance(step, FC):
        return step.describe()
    if isinstance(step, Rename):
        return f"Rename({step.dim} -> {step.name})"
    if isinstance(step, BlendJoin):
        return f"Blend({step.how})"
    if isinstance(step, ProductJoin):
        return f"Product({', '.join(step.reduce)})"
    return node.kind


def node_label(graph: Graph, index: int) -> str:
    """How messages name a node: ``node 2 FC(C -> r: R)``."""
    return f"node {index} {node_text(graph.nodes[index])}"


def storage(graph: Graph) -> tuple[int, ...]:
    """For each node, the node whose result holds its data: itself, or for a Rename (which moves no
    data) the storage of its argument."""
    owners: list[int] = []
    for index, node in enumerate(graph.nodes):
        owners.append(owners[node.args[0]] if node.kind == "Rename" else index)
    return tuple(owners)


def windowed_source(graph: Graph, index: int) -> bool:
    """Whether the node ``index`` is (through Renames) a chain with a window (Unfold): the values a
    Fold over it reads include a window's zero padding, which takes no part (see the reference)."""
    node = graph.nodes[index]
    while node.kind == "Rename":
        node = graph.nodes[node.args[0]]
    return isinstance(node.step, Operator) and any(WINDOWING in step.facts for step in node.step.steps)


__all__ = ["dim_elements", "elements", "node_label", "node_text", "storage", "windowed_source"]
