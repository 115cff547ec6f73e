"""The operator: one type for linear operators and branching kernels.

An :class:`Operator` is a DAG with one data input and one output. Its vertices (:class:`Node`) are,
in topological order: the input (node 0); *chains*, each a linear :class:`~kdsl.lang.chain.Chain`
applied to one earlier node (everything Syno's half knows: planning, native ops, schedules); unary
Canvas steps (:data:`~kdsl.lang.nonlinear.UNARY`: Map, Fold, Softmax, FC, Rename); and joins of two
branches (Blend, Product). A linear operator is the special case of the input and one chain node:
``op.is_linear``, ``op.chain`` (that chain) and ``op.steps`` (its steps) read it directly.

>>> from kdsl.lang import *
>>> N, C, L = primary("N C L")
>>> pool = Input(N, C, L) >> Unfold(L, 3, "k") >> Reduce("k") >> Output(N, C, L)
>>> [node.kind for node in pool.nodes], pool.is_linear, len(pool.steps)
(['Input', 'Chain'], True, 2)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from kdsl.lang.canonical import graph_key
from kdsl.lang.chain import Chain, Sized, check_defaults, close_chain, output_names, substitute_chain
from kdsl.lang.errors import ShapeError
from kdsl.lang.live import Live
from kdsl.lang.nonlinear import Fold, Join, Map
from kdsl.lang.primitives import WINDOWING, Dim, Output, Primitive, Reduce, Weight
from kdsl.lang.printer import graph_to_dsl, graph_to_json, to_dsl, to_json
from kdsl.lang.sizes import Size

__all__ = ["CHAIN", "INPUT", "Match", "Node", "Operator", "chain_step_texts"]

#: the kind of a node that applies a linear chain
CHAIN = "Chain"
INPUT = "Input"


@dataclass(frozen=True)
class Node:
    """One vertex of an operator: ``step`` (``None`` for an input, a :class:`Chain` for a chain, a
    unary step or a join), ``args`` (indices of earlier nodes), its result's ``dims`` in order and,
    for an input of a kernel of several inputs, the input's ``name`` (``None`` otherwise)."""

    step: Chain | Primitive | Join | None
    args: tuple[int, ...]
    dims: tuple[Dim, ...]
    name: str | None = None

    @property
    def kind(self) -> str:
        """``"Input"``, ``"Chain"``, or the primitive's kind (``"Map"``, ``"Blend"``, ...)."""
        if self.step is None:
            return INPUT
        if isinstance(self.step, Chain):
            return CHAIN
        return self.step.kind

    @property
    def chain(self) -> Chain:
        assert isinstance(self.step, Chain)
        return self.step

    def weights(self) -> tuple[Weight, ...]:
        """The weights the node's step shares (a chain's in its own order, an FC's one)."""
        return weights_of(self.step)

    def describe(self) -> str:
        """A short text of the node's step, as messages, listings and generated code name it:
        ``Input``, ``chain Unfold(H, K) >> Reduce(C, kh, mean)``, ``Map(relu)``, ``Fold(kh, kw, how=max)``,
        ``FC(C -> r: R)``, ``Rename(c -> C)``, ``Blend(mul)``, ``Product(d)``."""
        step = self.step
        if step is None:
            return INPUT if self.name is None else f"Input {self.name}{_dims_text(self.dims)}"
        if isinstance(step, Chain):
            return "chain " + " >> ".join(chain_step_texts(step)) if step.steps else "chain (no steps)"
        if isinstance(step, Map):
            return f"Map({step.fn}, by={step.by:g})" if step.fn == "scale" else f"Map({step.fn})"
        if isinstance(step, Fold):
            return f"Fold({', '.join(map(str, step.dims))}, how={step.how})"
        return step.describe()


def chain_step_texts(chain: Chain) -> list[str]:
    """The chain's steps as short texts, consecutive Reduces of one kind written as one."""
    texts: list[str] = []
    previous: Reduce | None = None
    for step in chain.steps:
        if isinstance(step, Reduce) and isinstance(previous, Reduce) and previous.mean == step.mean:
            dims = texts[-1][len("Reduce(") : -1].removesuffix(", mean")
            texts[-1] = f"Reduce({dims}, {step.dim}{', mean' if step.mean else ''})"
        elif isinstance(step, Reduce) and step.mean:
            texts.append(step.describe()[:-1] + ", mean)")
        else:
            texts.append(step.describe())
        previous = step if isinstance(step, Reduce) else None
    return texts


def weights_of(step: object) -> tuple[Weight, ...]:
    if isinstance(step, Chain):
        return step.weights
    if isinstance(step, Primitive):
        return step.weights()
    return ()


@dataclass(frozen=True)
class Match:
    """A free width that shape matching solved at a join: ``variable = size``, because the dim
    ``dim`` had the size ``left`` in the left branch and ``right`` in the right one."""

    variable: str
    size: Size
    join: str
    dim: str
    left: Size
    right: Size

    def substituted(self, values: Mapping[str, Size]) -> Match:
        return Match(
            self.variable,
            self.size.substitute(values),
            self.join,
            self.dim,
            self.left.substitute(values),
            self.right.substitute(values),
        )

    def describe(self) -> str:
        """``Product(kh, kw): the dim g is Cin/S in the left branch and x2/K**2 in the right``."""
        return f"{self.join}: the dim {self.dim} is {self.left} in the left branch and {self.right} in the right"


@dataclass(frozen=True, eq=True)
class Operator(Sized):
    """A finished operator: the input dims, the nodes (node 0 is the input, the last one the
    result), the output dims (the last node's, in the declared order) and coefficient defaults.

    A kernel may read several inputs (:attr:`input_nodes`, in the order the kernel takes them:
    the order in which its nodes first reach them, left branch first; node 0 is the first and
    :attr:`inputs` its dims). Each is then named (:attr:`input_names`), each name once, and a dim
    name two inputs share has one size in both.

    A linear operator's nodes are the input and one chain (:attr:`is_linear`); its chain carries
    the same outputs and defaults. Equal operators have equal fields; :attr:`key` is a content hash
    that is also the same for operators that differ only in dim names, weight-dim order or the order
    of independent steps and branches.
    """

    inputs: tuple[Dim, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Dim, ...]
    defaults: tuple[tuple[str, int], ...] = ()
    #: the free widths shape matching solved while the kernel was built (for messages only: the
    #: sizes already hold the solutions, and the text and JSON do not keep them)
    matches: tuple[Match, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        chain = self.chain
        if chain is not None and (
            chain.inputs != self.inputs or chain.outputs != self.outputs or chain.defaults != self.defaults
        ):
            raise ShapeError(
                "a linear operator's one chain carries its inputs, outputs and defaults; build it with "
                "Operator.linear(chain) or Operator.from_steps(...)"
            )
        if len(self.input_nodes) > 1:
            self._check_inputs()
        self._check_variables()

    def _check_inputs(self) -> None:
        """Several inputs: each named, each name once, each read, and one size per dim name."""
        seen: dict[str, int] = {}
        sizes: dict[str, tuple[Size, str]] = {}
        for index in self.input_nodes:
            node = self.nodes[index]
            if node.name is None:
                raise ShapeError(
                    f"a kernel of {len(self.input_nodes)} inputs names each one; the input "
                    f"{_dims_text(node.dims)} has no name: Input(..., name='q')"
                )
            if node.name in seen:
                raise ShapeError(f"two inputs are named {node.name!r}; give each input its own name")
            seen[node.name] = index
            if not self.consumers[index]:
                raise ShapeError(f"the input {node.name!r} is never used; join it into the result or leave it out")
            for dim in node.dims:
                earlier = sizes.setdefault(dim.name, (dim.size, node.name))
                if earlier[0] != dim.size:
                    raise ShapeError(
                        f"the dim {dim.name} is {earlier[0]} in the input {earlier[1]!r} but {dim.size} in the input "
                        f"{node.name!r}; a dim name two inputs share has one size (rename one: Input(Dim('N2', ...)))"
                    )

    @cached_property
    def input_nodes(self) -> tuple[int, ...]:
        """The indices of the input nodes, in the order the kernel takes its inputs (node 0 first).

        >>> from kdsl.lang import *
        >>> M, K, N = primary("M K N")
        >>> mm = Product(Input(M, K, name="a"), Input(K, N, name="b"), "K") >> Output(M, N)
        >>> mm.input_nodes, mm.input_names
        ((0, 1), ('a', 'b'))
        """
        return tuple(i for i, node in enumerate(self.nodes) if node.step is None)

    @property
    def input_names(self) -> tuple[str, ...]:
        """The inputs' names in order: ``("x",)`` for an operator of one input."""
        if len(self.input_nodes) == 1:
            return ("x",)
        return tuple(str(self.nodes[i].name) for i in self.input_nodes)

    @property
    def input_dims(self) -> tuple[tuple[Dim, ...], ...]:
        """Each input's dims, in the order of :attr:`input_nodes` (the first is :attr:`inputs`)."""
        return tuple(self.nodes[i].dims for i in self.input_nodes)

    @staticmethod
    def linear(chain: Chain) -> Operator:
        """The linear operator of one chain: the input, then the chain (its outputs and defaults)."""
        nodes = (Node(None, (), chain.inputs), Node(chain, (0,), chain.outputs))
        return Operator(chain.inputs, nodes, chain.outputs, chain.defaults)

    @staticmethod
    def from_steps(
        inputs: tuple[Dim, ...],
        steps: tuple[Primitive, ...],
        outputs: tuple[Dim, ...],
        defaults: tuple[tuple[str, int], ...] = (),
    ) -> Operator:
        """The linear operator of resolved ``steps`` (as another operator's, or a plan's, hold them)."""
        return Operator.linear(Chain(inputs, steps, outputs, defaults))

    def __reduce__(self) -> tuple[object, ...]:
        # pickled (to worker processes) as its fields only: the derived values cached on it (live
        # dims, the key, the plan) are recomputed on the other side
        return (type(self), (self.inputs, self.nodes, self.outputs, self.defaults, self.matches))

    # -- the linear case --------------------------------------------------------------------------

    @property
    def is_linear(self) -> bool:
        """Whether the operator is one linear chain on its input (no branch, no non-linear step)."""
        return len(self.nodes) == 2 and isinstance(self.nodes[1].step, Chain)

    @property
    def chain(self) -> Chain | None:
        """The chain of a linear operator; ``None`` for a branching one."""
        return self.nodes[1].step if self.is_linear else None  # type: ignore[return-value]

    def _linear(self, what: str) -> Chain:
        chain = self.chain
        if chain is None:
            kinds = ", ".join(node.kind for node in self.nodes[1:])
            raise ShapeError(
                f"{what} is defined for a linear operator (one chain of linear primitives); this one branches "
                f"or has non-linear steps (its nodes are {kinds}): read its nodes instead"
            )
        return chain

    @property
    def steps(self) -> tuple[Primitive, ...]:
        """A linear operator's steps (top-down); a ``ShapeError`` on a branching one."""
        return self._linear("steps").steps

    @property
    def live(self) -> tuple[Mapping[str, Size], ...]:
        """A linear operator's live dims (name -> size, in order) before each step, then after the
        last one (:attr:`kdsl.lang.chain.Chain.live`)."""
        return self._linear("live").live

    def views(self, start: int = 0, stop: int | None = None) -> list[tuple[Primitive, Mapping[str, Size]]]:
        """A linear operator's steps ``start:stop`` paired with the live dims before each."""
        return self._linear("views").views(start, stop)

    # -- every operator ---------------------------------------------------------------------------

    @cached_property
    def weights(self) -> tuple[Weight, ...]:
        """Every weight, in node order (a chain's in the order it shares them)."""
        return tuple(w for node in self.nodes for w in node.weights())

    def _all_sizes(self) -> list[Size]:  # every input's dims are some node's dims
        sizes = [d.size for d in self.inputs] + [d.size for d in self.outputs]
        for node in self.nodes:
            sizes.extend(d.size for d in node.dims)
            if isinstance(node.step, Chain):
                sizes.extend(node.step._all_sizes())
            elif isinstance(node.step, Primitive):
                sizes.extend(node.step.sizes())
        return sizes

    def padding_region(self, fold: int) -> tuple[int, ...]:
        """The chain nodes whose windows' zero padding the Fold node ``fold`` leaves out, in the
        order they run: the linear region it reads, followed back through chains and Renames (which
        move no data) to the last non-linear node or the input; empty when no chain there has a
        window. The Fold's mask is that region run on ones, weights ones too: positive exactly where
        an element reads data (:class:`~kdsl.lang.nonlinear.Fold`).

        >>> from kdsl.lang import *
        >>> N, L = primary("N L")
        >>> pool = Input(N, L) >> Unfold(L, 3, "k") >> Rename(L, "M") >> Shift("M") >> Fold("k") >> Output(N, "M")
        >>> [pool.nodes[i].kind for i in pool.padding_region(4)]
        ['Chain', 'Chain']
        """
        chains: list[int] = []
        index = self.nodes[fold].args[0]
        while self.nodes[index].kind in (CHAIN, "Rename"):
            if self.nodes[index].kind == CHAIN:
                chains.append(index)
            index = self.nodes[index].args[0]
        if not any(WINDOWING in step.facts for i in chains for step in self.nodes[i].chain.steps):
            return ()
        return tuple(reversed(chains))

    @cached_property
    def consumers(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the nodes that read it."""
        readers: list[list[int]] = [[] for _ in self.nodes]
        for index, node in enumerate(self.nodes):
            for arg in node.args:
                readers[arg].append(index)
        return tuple(tuple(r) for r in readers)

    def to_dsl(self, name: str = "op") -> str:
        """DSL source that :func:`kdsl.parse` reads back to an equal operator (a linear one as one
        pipeline, a branching one with a statement per shared tensor or branch)."""
        chain = self.chain
        return to_dsl(chain, name) if chain is not None else graph_to_dsl(self, name)

    def to_json(self) -> str:
        """The versioned JSON form (a linear operator's steps; a branching one's nodes in order, each
        naming its arguments); :func:`kdsl.from_json` reads it back."""
        chain = self.chain
        return to_json(chain) if chain is not None else graph_to_json(self)

    @cached_property
    def design_key(self) -> str:
        """A stable content hash of the operator's structure, its coefficients left symbolic (names
        and step order do not matter): equal for ``grouped_conv2d`` at every G. A branching
        operator's key already leaves coefficients symbolic: there it is :attr:`key`."""
        chain = self.chain
        return chain.design_key if chain is not None else graph_key(self)

    @cached_property
    def key(self) -> str:
        """The content hash: ignores dim and weight names, weight-dim order and the order of
        independent steps and branches. A linear operator's is :attr:`design_key` and its default
        coefficient values (the identity of a search candidate).

        >>> from kdsl import gallery
        >>> grouped = gallery.load("grouped_conv2d")
        >>> grouped.with_defaults(G=2).key == grouped.with_defaults(G=4).key
        False
        >>> grouped.with_defaults(G=2).design_key == grouped.with_defaults(G=4).design_key
        True
        """
        chain = self.chain
        return chain.key if chain is not None else graph_key(self)

    def substituted(self, values: Mapping[str, Size | int]) -> Operator:
        """The same operator with the variables named in ``values`` replaced by those sizes (a
        dynamic variable by what shape matching or the budget solver found for it).

        >>> from kdsl.lang import *
        >>> N, C = primary("N C"); x1 = dynamic("x1")
        >>> op = Input(N, C) >> Share(Weight(C, Dim("z", x1), name="w")) >> Reduce(C) >> Output(N, "z")
        >>> op.dynamic_variables, str(op.substituted({"x1": 2 * C}).outputs[1].size)
        (('x1',), '2*C')
        """
        sizes = {name: Size.of(value) for name, value in values.items()}
        steps: dict[int, Primitive] = {}
        chain = self.chain
        if chain is not None:
            return Operator.linear(substitute_chain(chain, sizes, steps))

        def dims(found: tuple[Dim, ...]) -> tuple[Dim, ...]:
            return tuple(Dim(d.name, d.size.substitute(sizes)) for d in found)

        nodes = []
        for node in self.nodes:
            step = node.step
            if isinstance(step, Chain):
                step = substitute_chain(step, sizes, steps)
            elif isinstance(step, Primitive):
                step = step.substituted(sizes)
            nodes.append(Node(step, node.args, dims(node.dims), node.name))
        defaults = {k: v for k, v in self.defaults if k not in sizes}
        graph = finish_nodes(dims(self.inputs), tuple(nodes), [d.name for d in self.outputs], defaults)
        matches = tuple(m.substituted(sizes) for m in self.matches)
        return Operator(graph.inputs, graph.nodes, graph.outputs, graph.defaults, matches) if matches else graph

    def with_defaults(self, **values: int) -> Operator:
        """The same operator with other preferred coefficient values."""
        chain = self.chain
        if chain is not None:
            return Operator.linear(chain.with_defaults(**values))
        merged = dict(self.defaults)
        merged.update(values)
        return finish_nodes(self.inputs, self.nodes, [d.name for d in self.outputs], merged)

    def __repr__(self) -> str:
        ins = ", ".join(f"{d.name}: {d.size}" for d in self.inputs)
        outs = ", ".join(f"{d.name}: {d.size}" for d in self.outputs)
        chain = self.chain
        if chain is not None:
            return f"<Operator [{ins}] -> [{outs}], {len(chain.steps)} steps, key {self.key}>"
        return f"<Operator [{ins}] -> [{outs}], {len(self.nodes)} nodes, key {self.key}>"


def _dims_text(dims: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(f"{d.name}: {d.size}" for d in dims) + "]"


def finish_nodes(
    inputs: tuple[Dim, ...], nodes: tuple[Node, ...], refs: list[object], defaults: Mapping[str, int]
) -> Operator:
    """The operator of ``nodes`` with the output order ``refs`` and ``defaults``, checked: every
    live dim of the last node listed once, every default a coefficient. Nodes that are the input
    and one chain give the linear operator of that chain (outputs in the declared order)."""
    if len(nodes) == 2 and isinstance(nodes[1].step, Chain):
        chain = nodes[1].step
        live = Live({d.name: d.size for d in chain.outputs}, ())
        return Operator.linear(
            close_chain(chain.inputs, chain.steps, live, Output(*refs, defaults=dict(defaults) or None))
        )
    last = nodes[-1]
    live = Live({d.name: d.size for d in last.dims}, ())
    names = output_names(live, refs, "Reduce, Fold")
    checked = Output(*names, defaults=dict(defaults) or None)
    graph = Operator(inputs, nodes, tuple(Dim(n, live.size(n)) for n in names), checked.defaults)
    check_defaults(graph.defaults, set(graph.coefficient_variables), "kernel")
    return graph
