"""Branching kernels: a DAG of linear chains joined by Canvas's non-linear primitives.

A :class:`Graph` has one data input and one output. Its vertices (:class:`Node`) are, in
topological order: the input (node 0); *chains*, each a linear :class:`~kdsl.lang.build.Operator`
applied to one earlier node (everything Syno's half knows: planning, native ops, schedules);
unary Canvas steps (:data:`~kdsl.lang.nonlinear.UNARY`: Map, Fold, Softmax, FC, Rename); and joins
of two branches (Blend, Product). A linear operator is the special case of one chain, and a build
that never branches nor leaves the linear primitives gives a plain ``Operator``, as before.

Tensors are built with the same ``>>``; a tensor may feed several branches, and ``+ - *``,
:func:`Blend` and :func:`Product` join them again:

>>> from kdsl.lang import *
>>> N, C, H, W = primary("N C H W"); R = primary("R")
>>> x = Input(N, C, H, W)
>>> gate = (x >> Reduce(H, W, mean=True) >> FC(C, name="r", size=R, weight="squeeze") >> Map("relu")
...         >> FC("r", name="c", size=C, weight="excite") >> Map("sigmoid") >> Rename("c", "C"))
>>> se = (x * gate) >> Output(N, C, H, W)
>>> [node.kind for node in se.nodes]
['Input', 'Chain', 'FC', 'Map', 'FC', 'Map', 'Rename', 'Blend']
>>> from kdsl import parse
>>> parse(se.to_dsl()) == se
True
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from kdsl.lang import build as _build
from kdsl.lang.build import Builder, Input, Operator, Sized, substitute_operator
from kdsl.lang.canonical import graph_key
from kdsl.lang.errors import KdslError, ShapeError, SizeError
from kdsl.lang.live import Live
from kdsl.lang.nonlinear import JOINS, UNARY, BlendJoin, Fold, Join, Map, ProductJoin
from kdsl.lang.primitives import PRIMITIVES, WINDOWING, BuildContext, Dim, Output, Pipeline, Primitive, Reduce, Weight
from kdsl.lang.printer import graph_to_dsl, graph_to_json
from kdsl.lang.sizes import Size, unify

__all__ = ["Blend", "Graph", "Node", "Product", "Tensor", "chain_step_texts"]

#: the kind of a node that applies a linear chain (an Operator)
CHAIN = "Chain"
INPUT = "Input"


@dataclass(frozen=True)
class Node:
    """One vertex of a graph: ``step`` (``None`` for the input, an :class:`Operator` for a chain, a
    unary step or a join), ``args`` (indices of earlier nodes) and its result's ``dims`` in order."""

    step: Operator | Primitive | Join | None
    args: tuple[int, ...]
    dims: tuple[Dim, ...]

    @property
    def kind(self) -> str:
        """``"Input"``, ``"Chain"``, or the primitive's kind (``"Map"``, ``"Blend"``, ...)."""
        if self.step is None:
            return INPUT
        if isinstance(self.step, Operator):
            return CHAIN
        return self.step.kind

    @property
    def chain(self) -> Operator:
        assert isinstance(self.step, Operator)
        return self.step

    def weights(self) -> tuple[Weight, ...]:
        """The weights the node's step shares (a chain's in its own order, an FC's one)."""
        return _weights_of(self.step)

    def describe(self) -> str:
        """A short text of the node's step, as messages, listings and generated code name it:
        ``Input``, ``chain Unfold(H, K) >> Reduce(C, kh, mean)``, ``Map(relu)``, ``Fold(kh, kw, how=max)``,
        ``FC(C -> r: R)``, ``Rename(c -> C)``, ``Blend(mul)``, ``Product(d)``."""
        step = self.step
        if step is None:
            return INPUT
        if isinstance(step, Operator):
            return "chain " + " >> ".join(chain_step_texts(step)) if step.steps else "chain (no steps)"
        if isinstance(step, Map):
            return f"Map({step.fn}, by={step.by:g})" if step.fn == "scale" else f"Map({step.fn})"
        if isinstance(step, Fold):
            return f"Fold({', '.join(map(str, step.dims))}, how={step.how})"
        return step.describe()


def chain_step_texts(chain: Operator) -> list[str]:
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


def _weights_of(step: object) -> tuple[Weight, ...]:
    if isinstance(step, Operator):
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
class Graph(Sized):
    """A finished branching kernel: the input dims, the nodes (node 0 is the input, the last one
    the result), the output dims (the last node's, in the declared order) and coefficient defaults.
    It has the operator's surface: weights, variables, DSL text, JSON and a content key."""

    inputs: tuple[Dim, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Dim, ...]
    defaults: tuple[tuple[str, int], ...] = ()
    #: the free widths shape matching solved while the kernel was built (for messages only: the
    #: sizes already hold the solutions, and the text and JSON do not keep them)
    matches: tuple[Match, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        self._check_variables()

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.inputs, self.nodes, self.outputs, self.defaults, self.matches))

    @cached_property
    def weights(self) -> tuple[Weight, ...]:
        """Every weight, in node order (a chain's in its own order)."""
        return tuple(w for node in self.nodes for w in node.weights())

    def _all_sizes(self) -> list[Size]:
        sizes = [d.size for d in self.inputs] + [d.size for d in self.outputs]
        for node in self.nodes:
            sizes.extend(d.size for d in node.dims)
            if isinstance(node.step, Operator):
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
        """DSL source that :func:`kdsl.parse` reads back to an equal graph."""
        return graph_to_dsl(self, name)

    def to_json(self) -> str:
        """The versioned JSON form (nodes in order, each naming its arguments); :func:`kdsl.from_json`
        reads it back."""
        return graph_to_json(self)

    @cached_property
    def key(self) -> str:
        """A content hash that ignores dim and weight names and the order of independent branches."""
        return graph_key(self)

    def substituted(self, values: Mapping[str, Size | int]) -> Graph:
        """The same kernel with the variables named in ``values`` replaced by those sizes (a
        dynamic variable by what shape matching or the budget solver found for it)."""
        sizes = {name: Size.of(value) for name, value in values.items()}
        steps: dict[int, Primitive] = {}

        def dims(found: tuple[Dim, ...]) -> tuple[Dim, ...]:
            return tuple(Dim(d.name, d.size.substitute(sizes)) for d in found)

        nodes = []
        for node in self.nodes:
            step = node.step
            if isinstance(step, Operator):
                step = substitute_operator(step, sizes, steps)
            elif isinstance(step, Primitive):
                step = step.substituted(sizes)
            nodes.append(Node(step, node.args, dims(node.dims)))
        defaults = {k: v for k, v in self.defaults if k not in sizes}
        graph = _finish_graph(dims(self.inputs), tuple(nodes), [d.name for d in self.outputs], defaults, Output)
        matches = tuple(m.substituted(sizes) for m in self.matches)
        return Graph(graph.inputs, graph.nodes, graph.outputs, graph.defaults, matches) if matches else graph

    def with_defaults(self, **values: int) -> Graph:
        merged = dict(self.defaults)
        merged.update(values)
        return _finish_graph(self.inputs, self.nodes, [d.name for d in self.outputs], merged, Output)

    def __repr__(self) -> str:
        ins = ", ".join(f"{d.name}: {d.size}" for d in self.inputs)
        outs = ", ".join(f"{d.name}: {d.size}" for d in self.outputs)
        return f"<Graph [{ins}] -> [{outs}], {len(self.nodes)} nodes, key {self.key}>"


# ------------------------------------------------------------------------------------------------
# Building
# ------------------------------------------------------------------------------------------------


_SERIALS = itertools.count()


class _Vertex:
    """A node while building: compared by identity, so a tensor used twice is one vertex.

    Besides its step, arguments and dims it keeps what joins would otherwise find by walking the
    whole graph (which made building quadratic): its input (``root``) and the weights of
    everything it reads (``named``, a :class:`_Weights` view made on first use).
    """

    __slots__ = ("step", "args", "dims", "root", "serial", "named")

    def __init__(self, step: Operator | Primitive | Join | None, args: tuple[_Vertex, ...], dims: tuple[Dim, ...]):
        self.step, self.args, self.dims = step, args, dims
        self.root: _Vertex = args[0].root if args else self
        #: a unique number naming the vertex as a weight's owner (an id() could be reused)
        self.serial = next(_SERIALS)
        self.named: _Weights | None = None


class _Clash(Exception):
    """Two vertices a tensor reads have a weight of one name (or one step names two alike)."""


class _Weights:
    """The weights a vertex reads (its own and its ancestors'), by name, with the vertex that owns
    each: a prefix (``length`` entries) of an insertion-ordered table that vertices extend in place.

    A vertex that adds a weight appends to its argument's table when nothing was appended past its
    argument's view, and a join appends the smaller side's weights to the larger one's: so a chain
    of residual blocks costs O(1) per join, where building every join's set afresh cost O(size of
    the graph). A table is copied only when a second branch adds weights to a view that another
    branch already extended.
    """

    __slots__ = ("table", "length")

    def __init__(self, table: dict[str, tuple[int, int, Weight]], length: int) -> None:
        #: name -> (position in the table, the owner vertex's serial, the weight)
        self.table = table
        self.length = length

    def owner(self, name: str) -> int | None:
        """The serial of the vertex in this view that owns a weight named ``name``, if any."""
        entry = self.table.get(name)
        return entry[1] if entry is not None and entry[0] < self.length else None

    def entries(self) -> Iterator[tuple[str, tuple[int, int, Weight]]]:
        return itertools.islice(self.table.items(), self.length)

    def __len__(self) -> int:
        return self.length

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.owner(name) is not None

    def extended(self, added: Sequence[tuple[str, int, Weight]]) -> _Weights:
        """This view plus weights whose names it does not hold (the caller checked)."""
        if not added:
            return self
        table = self.table
        # an empty view starts a table of its own: the interned input vertex must not keep the
        # weights of every kernel built on it alive
        if self.length == 0 or len(table) != self.length:
            table = dict(self.entries())
        for name, owner, weight in added:
            table[name] = (len(table), owner, weight)
        return _Weights(table, len(table))


def _merged(first: _Weights, second: _Weights) -> _Weights:
    """The union of two views (a join's branches), in O(the smaller one); raises :class:`_Clash`
    where both hold a weight of one name from two different vertices."""
    if first.table is second.table:  # prefixes of one table: the longer holds the shorter
        return first if first.length >= second.length else second
    small, large = (first, second) if first.length <= second.length else (second, first)
    added: list[tuple[str, int, Weight]] = []
    for name, (_, owner, weight) in small.entries():
        found = large.owner(name)
        if found is None:
            added.append((name, owner, weight))
        elif found != owner:
            raise _Clash(name)
    return large.extended(added)


def _own_weights(vertex: _Vertex, before: _Weights) -> _Weights:
    added: list[tuple[str, int, Weight]] = []
    names: set[str] = set()
    for weight in _weights_of(vertex.step):
        assert weight.name is not None
        if weight.name in names or before.owner(weight.name) is not None:
            raise _Clash(weight.name)
        names.add(weight.name)
        added.append((weight.name, vertex.serial, weight))
    return before.extended(added)


def _weights_view(root: _Vertex) -> _Weights:
    """``root``'s weights view, made for it and for any vertex it reads that has none yet (only
    vertices a rewrite just made: building makes each vertex's view as it makes the vertex)."""
    if root.named is not None:
        return root.named
    for vertex in _topological(root, made_only=True):
        if not vertex.args:
            before = _Weights({}, 0)
        elif len(vertex.args) == 1:
            before = vertex.args[0].named  # type: ignore[assignment]
        else:
            before = _merged(*(arg.named for arg in vertex.args))  # type: ignore[arg-type]
        vertex.named = _own_weights(vertex, before)
    assert root.named is not None
    return root.named


def _checked_weights(vertex: _Vertex, full_check: Callable[[], object]) -> _Weights:
    """``vertex``'s weights view; where two weights share a name, ``full_check`` (the check over
    the whole graph) raises the error that names both."""
    try:
        return _weights_view(vertex)
    except _Clash as clash:
        full_check()
        raise ShapeError(f"two weights are named {clash}; give each weight its own name") from None


def _topological(root: _Vertex, made_only: bool = False) -> list[_Vertex]:
    """The vertices root depends on, in post-order (arguments left to right), without recursion;
    with ``made_only``, only those without a weights view yet (a vertex with one is not entered)."""
    order: list[_Vertex] = []
    done: set[int] = set()
    stack: list[tuple[_Vertex, int]] = [(root, 0)]
    while stack:
        vertex, next_arg = stack.pop()
        if id(vertex) in done or (made_only and vertex.named is not None):
            continue
        if next_arg < len(vertex.args):
            stack.append((vertex, next_arg + 1))
            arg = vertex.args[next_arg]
            if id(arg) not in done:
                stack.append((arg, 0))
            continue
        done.add(id(vertex))
        order.append(vertex)
    return order


def _weight_names(vertices: Sequence[_Vertex]) -> list[Weight]:
    found: list[Weight] = []
    seen: dict[str, Weight] = {}
    for vertex in vertices:
        for weight in _weights_of(vertex.step):
            assert weight.name is not None
            if weight.name in seen:
                # name both weights' dims: the two may be equal (one Share written in two
                # branches) or not (two FCs named alike)
                raise ShapeError(
                    f"two branches share weights named {weight.name!r}: {_describe(seen[weight.name].dims)} and "
                    f"{_describe(weight.dims)}; give each weight its own name (Weight(..., name=...), "
                    f"FC(..., weight=...)), or apply the weight once and branch from its result"
                )
            seen[weight.name] = weight
            found.append(weight)
    return found


def _describe(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join(f"{d.name}: {d.size}" for d in dims) + "]"


class Tensor:
    """A value in a branching build: a vertex, plus linear steps applied to it and not yet closed
    into a chain. ``t >> step`` extends it; ``a + b``, ``a - b``, ``a * b``, :func:`Blend` and
    :func:`Product` join two tensors of the same input; ``>> Output(...)`` finishes the kernel."""

    __slots__ = ("vertex", "pending", "matches")

    def __init__(self, vertex: _Vertex, pending: Builder | None = None, matches: tuple[Match, ...] = ()) -> None:
        self.vertex = vertex
        self.pending = pending if pending is not None and pending.steps else None
        #: the free widths shape matching solved on the way here (for messages)
        self.matches = matches

    @staticmethod
    def of(value: object, role: str) -> Tensor:
        """A tensor from an Input, a linear Builder or a Tensor."""
        if isinstance(value, Tensor):
            return value
        if isinstance(value, Input):
            return Tensor(_input_vertex(value.dims))
        if isinstance(value, Builder):
            return Tensor(_input_vertex(value.inputs), value)
        raise ShapeError(f"{role}: expected a tensor (Input(...) >> ...), got {type(value).__name__}")

    @property
    def shape(self) -> dict[str, Size]:
        """The live dims, name -> size."""
        if self.pending is not None:
            return self.pending.shape
        return {d.name: d.size for d in self.vertex.dims}

    def _weights(self) -> _Weights:
        vertex = self.vertex
        return _checked_weights(vertex, lambda: _weight_names(_topological(vertex)))

    def closed(self) -> _Vertex:
        """The vertex with the pending linear steps closed into a chain node."""
        pending = self.pending
        if pending is None:
            return self.vertex
        if pending.closed_vertex is None:  # one vertex per build, however many branches read it
            if not pending.live.sizes:  # (Output() would only say that it needs dims)
                raise ShapeError(
                    "a branch of a kernel reduces every dim away, which leaves a scalar; reduce fewer dims"
                ).with_context(pending._text_so_far())
            chain = pending.finish(Output(*pending.live.sizes))
            pending.closed_vertex = _Vertex(chain, (self.vertex,), chain.outputs)
        return pending.closed_vertex

    def __rshift__(self, other: object) -> Tensor | Graph | Operator:
        if isinstance(other, Pipeline):
            result: object = self
            for primitive in other.primitives:
                result = result >> primitive  # type: ignore[operator]
            return result >> other.output if other.output is not None else result  # type: ignore[operator,return-value]
        if isinstance(other, Primitive) and other.kind in PRIMITIVES:
            pending = self.pending
            if pending is None:
                # weight names continue w1, w2, ... after the weights the tensor already has
                dims = self.vertex.dims
                pending = Builder(dims, (), Live({d.name: d.size for d in dims}, ()), [], self._weights())
            return Tensor(self.vertex, pending >> other, self.matches)  # type: ignore[arg-type]
        if isinstance(other, Primitive) and other.kind in UNARY:
            vertex = self.closed()
            live = Live({d.name: d.size for d in vertex.dims}, ())
            context = BuildContext([], _checked_weights(vertex, lambda: _weight_names(_topological(vertex))))
            try:
                step = other.apply(live, context)
            except KdslError as error:
                raise error.with_context(f"a {other.kind} step on the tensor {_describe(vertex.dims)}") from None
            made = _Vertex(step, (vertex,), tuple(Dim(n, s) for n, s in live.sizes.items()))
            # the full check (over the graph and the new step) runs only to word an error
            _checked_weights(made, lambda: _weight_names(_topological(vertex) + [_Vertex(step, (), ())]))
            return Tensor(made, None, self.matches)
        if isinstance(other, Output):
            return self.finish(other)
        raise ShapeError(f"cannot apply {other!r:.120} to a tensor; expected a primitive, a pipeline or Output(...)")

    def join(self, step: Join, other: object) -> Tensor:
        right = Tensor.of(other, step.kind)
        lhs, rhs = self.closed(), right.closed()
        if lhs.root.dims != rhs.root.dims:
            raise ShapeError(
                f"{step.kind}: the branches start from different inputs {_describe(lhs.root.dims)} and "
                f"{_describe(rhs.root.dims)}; a kernel has one data input"
            )
        rhs = _rebase(rhs, lhs.root)
        lhs, rhs, found = _match(step, lhs, rhs)
        solved = {m.variable: m.size for m in found}
        earlier = tuple(m.substituted(solved) for m in dict.fromkeys(self.matches + right.matches))
        matches = earlier + found
        dims = step.combine(lhs.dims, rhs.dims)
        vertex = _Vertex(step, (lhs, rhs), dims)
        try:
            _weights_view(vertex)
        except _Clash:
            # Both branches read a weight of one name through different vertices: either one
            # build's weighted steps copied into two chains (made one shared chain here), or an
            # error. Only then is the whole graph walked, so a join costs O(the branches' new
            # weights), not O(the graph).
            vertex = _share_prefixes(vertex)
            try:
                _weight_names(_topological(vertex))
            except KdslError as error:
                raise error.with_context(
                    f"{step.kind} of the branches {_describe(lhs.dims)} and {_describe(rhs.dims)}"
                ) from None
            _weights_view(vertex)
        return Tensor(vertex, None, matches)

    def __add__(self, other: object) -> Tensor:
        return self.join(BlendJoin("add"), other)

    def __sub__(self, other: object) -> Tensor:
        return self.join(BlendJoin("sub"), other)

    def __mul__(self, other: object) -> Tensor:
        return self.join(BlendJoin("mul"), other)

    def __radd__(self, other: object) -> Tensor:
        return Tensor.of(other, "+").join(BlendJoin("add"), self)

    def __rsub__(self, other: object) -> Tensor:
        return Tensor.of(other, "-").join(BlendJoin("sub"), self)

    def __rmul__(self, other: object) -> Tensor:
        return Tensor.of(other, "*").join(BlendJoin("mul"), self)

    def finish(self, output: Output) -> Graph | Operator:
        vertex = self.closed()
        order = _topological(vertex)
        if len(order) == 2 and isinstance(vertex.step, Operator):
            # one linear chain on the input: a plain operator, the special case
            chain = vertex.step
            return Builder(chain.inputs, chain.steps, None, []).finish(output)
        if len(order) == 1:
            return Builder(vertex.dims, (), Live({d.name: d.size for d in vertex.dims}, ()), []).finish(output)
        index = {id(v): i for i, v in enumerate(order)}
        nodes = tuple(Node(v.step, tuple(index[id(a)] for a in v.args), v.dims) for v in order)
        graph = _finish_graph(order[0].dims, nodes, list(output.refs), dict(output.defaults), Output)
        if self.matches:
            graph = Graph(graph.inputs, graph.nodes, graph.outputs, graph.defaults, self.matches)
        return graph

    def __repr__(self) -> str:
        return f"Tensor({_describe([Dim(n, s) for n, s in self.shape.items()])})"


def _match(step: Join, lhs: _Vertex, rhs: _Vertex) -> tuple[_Vertex, _Vertex, tuple[Match, ...]]:
    """Shape matching (Canvas §6.2): where a dim both branches name has two sizes and a dynamic
    variable can make them equal, solve for it (:func:`~kdsl.lang.sizes.unify`) and substitute it
    in both branches; sizes that cannot match are left for the join to report."""
    matches: list[Match] = []
    for _ in range(len(lhs.dims) + len(rhs.dims)):  # each round solves one variable
        left = {d.name: d.size for d in lhs.dims}
        found = None
        for dim in rhs.dims:
            if dim.name in left and left[dim.name] is not dim.size:
                found = unify(left[dim.name], dim.size)
                if found is not None:
                    break
        if found is None:
            break
        name, size = found
        matches = [m.substituted({name: size}) for m in matches]
        matches.append(Match(name, size, step.describe(), dim.name, left[dim.name], dim.size))
        memo: dict[int, _Vertex] = {}
        steps: dict[int, Primitive] = {}
        lhs = _substitute_vertex(lhs, {name: size}, memo, steps)
        rhs = _substitute_vertex(rhs, {name: size}, memo, steps)
    return lhs, rhs, tuple(matches)


def _substitute_vertex(
    root: _Vertex, sizes: Mapping[str, Size], memo: dict[int, _Vertex], steps: dict[int, Primitive]
) -> _Vertex:
    """``root``'s tree with ``sizes`` substituted; vertices (and steps) that do not change stay the
    same objects, and ``memo`` keeps vertices both branches share shared."""
    for vertex in _topological(root):
        if id(vertex) in memo:
            continue
        dims = tuple(Dim(d.name, d.size.substitute(sizes)) for d in vertex.dims)
        args = tuple(memo[id(a)] for a in vertex.args)
        step = vertex.step
        if isinstance(step, Operator):
            step = substitute_operator(step, sizes, steps)
        elif isinstance(step, Primitive):
            step = steps.setdefault(id(step), step.substituted(sizes))
        if step is vertex.step and args == vertex.args and dims == vertex.dims:
            memo[id(vertex)] = vertex
        elif not vertex.args:
            memo[id(vertex)] = _input_vertex(dims)
        else:
            memo[id(vertex)] = _Vertex(step, args, dims)
    return memo[id(root)]


def _rebase(vertex: _Vertex, root: _Vertex) -> _Vertex:
    """``vertex`` with its input replaced by ``root`` (two Input(...) values with equal dims are the
    same input), sharing every vertex it can."""
    if vertex.root is root:
        return vertex
    memo: dict[int, _Vertex] = {}
    for v in _topological(vertex):
        if not v.args:
            memo[id(v)] = root
        else:
            memo[id(v)] = _Vertex(v.step, tuple(memo[id(a)] for a in v.args), v.dims)
    return memo[id(vertex)]


def _common_prefix(first: Operator, second: Operator) -> int:
    length = 0
    for a, b in zip(first.steps, second.steps):
        # the same step objects: copied from one build by >>, never two equal steps written twice
        # (two Weight(...)s of one shape and name in two branches stay two, and an error)
        if a is not b:
            break
        length += 1
    return length


def _chain_vertex(source: _Vertex, steps: tuple[Primitive, ...], outputs: Sequence[str] | None) -> _Vertex:
    if not steps:
        return source
    builder = Builder(source.dims, steps, None, [])
    chain = builder.finish(Output(*(outputs if outputs is not None else builder.live.sizes)))
    return _Vertex(chain, (source,), chain.outputs)


def _share_prefixes(root: _Vertex) -> _Vertex:
    """Two chains on one tensor that begin with the same weighted steps are one chain, then two.

    ``h = x >> conv`` extended by ``>>`` in one branch and closed in another (``h + (h >> Unfold(...)
    >> ...)``) copies h's steps, its weights too, into both chains; the common prefix becomes one
    node that both read, so the weight is one parameter, as the user wrote it.
    """
    for _ in range(64):  # each pass removes one shared prefix; kernels are far smaller than this
        chains: dict[int, list[_Vertex]] = {}
        for vertex in _topological(root):
            if isinstance(vertex.step, Operator):
                chains.setdefault(id(vertex.args[0]), []).append(vertex)
        found = None
        for group in chains.values():
            for i, first in enumerate(group):
                for second in group[i + 1 :]:
                    length = _common_prefix(first.step, second.step)  # type: ignore[arg-type]
                    prefix = first.step.steps[:length]  # type: ignore[union-attr]
                    if any(step.weights() for step in prefix):
                        found = (first, second, length)
                        break
                if found:
                    break
            if found:
                break
        if found is None:
            return root
        first, second, length = found
        shared = _chain_vertex(first.args[0], first.step.steps[:length], None)  # type: ignore[union-attr]
        replaced = {
            id(v): _chain_vertex(shared, v.step.steps[length:], [d.name for d in v.dims])  # type: ignore[union-attr]
            for v in (first, second)
        }
        memo: dict[int, _Vertex] = {}
        for v in _topological(root):
            if id(v) in replaced:
                memo[id(v)] = replaced[id(v)]
            elif v.args:
                memo[id(v)] = _Vertex(v.step, tuple(memo[id(a)] for a in v.args), v.dims)
            else:
                memo[id(v)] = v
        root = memo[id(root)]
    return root


_INPUTS: dict[tuple[Dim, ...], _Vertex] = {}


def _input_vertex(dims: tuple[Dim, ...]) -> _Vertex:
    # one vertex per distinct input: branches of x = Input(...) built separately meet at one node
    vertex = _INPUTS.get(dims)
    if vertex is None:
        if len(_INPUTS) > 4096:
            _INPUTS.clear()
        vertex = _INPUTS[dims] = _Vertex(None, (), dims)
    return vertex


def _finish_graph(
    inputs: tuple[Dim, ...], nodes: tuple[Node, ...], refs: list[object], defaults: Mapping[str, int], output: type
) -> Graph:
    last = nodes[-1]
    live = Live({d.name: d.size for d in last.dims}, ())
    names: dict[str, None] = {}
    for ref in refs:
        name = live.resolve(ref, "Output")
        if name in names:
            raise ShapeError(f"Output: the dim {name} is listed twice")
        names[name] = None
    if len(names) != len(live):
        missing = [n for n in live.sizes if n not in names]
        raise ShapeError(
            f"Output: the dims {', '.join(missing)} are still live but not in the output; "
            f"Reduce, Fold or list them (the live dims are {live.describe()})"
        )
    checked = output(*names, defaults=dict(defaults) or None)
    graph = Graph(inputs, nodes, tuple(Dim(n, live.size(n)) for n in names), checked.defaults)
    coefficients = set(graph.coefficient_variables)
    for key, _ in graph.defaults:
        if key not in coefficients:
            raise SizeError(
                f"Output(defaults=...): {key} is not a coefficient variable of this kernel "
                f"(its coefficients are {sorted(coefficients) or 'none'})"
            )
    return graph


def Blend(how: str, lhs: object, rhs: object) -> Tensor:
    """Join two branches element-wise: ``how`` is ``add``, ``sub``, ``mul``, ``min`` or ``max``.

    >>> from kdsl.lang import *
    >>> N, C, L = primary("N C L")
    >>> x = Input(N, C, L)
    >>> y = Blend("max", x, x >> Shift(L)) >> Output(N, C, L)
    >>> [node.kind for node in y.nodes]
    ['Input', 'Chain', 'Blend']
    """
    return Tensor.of(lhs, "Blend").join(BlendJoin(how), rhs)


def Product(lhs: object, rhs: object, *reduce: str) -> Tensor:
    """Multiply two branches and sum over ``reduce``: dims with one name index both branches.

    >>> from kdsl.lang import *
    >>> N, P, D = primary("N P D")
    >>> x = Input(N, P, D)
    >>> scores = Product(x, x >> Rename(P, "Q"), "D")
    >>> list(scores.shape)
    ['N', 'P', 'Q']
    """
    return Tensor.of(lhs, "Product").join(ProductJoin(*reduce), rhs)


def _chain_to_tensor(builder: Builder, other: object) -> Tensor | Graph | Operator:
    return Tensor.of(builder, "a chain") >> other


def _blend_hook(left: object, how: str, right: object) -> Tensor:
    return Tensor.of(left, how).join(BlendJoin(how), right)


# The linear builder (kdsl.lang.build) knows nothing of graphs: it hands a Canvas step or an
# arithmetic join to these hooks.
_build.GRAPH_HOOKS["step"] = _chain_to_tensor
_build.GRAPH_HOOKS["blend"] = _blend_hook

JOIN_FUNCTIONS = {"Blend": Blend, "Product": Product}
assert set(JOIN_FUNCTIONS) == set(JOINS)
