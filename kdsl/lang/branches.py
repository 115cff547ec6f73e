"""Building branching operators: tensors, branches and their joins.

An :class:`~kdsl.lang.operator.Operator` is a DAG of nodes (the input, linear chains, Canvas's
unary steps, joins). A build that never branches nor leaves the linear primitives gives the
linear operator (the input and one chain); one that does is built here, a tensor at a time.

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

from kdsl.lang import build as _build
from kdsl.lang.build import Builder, Input
from kdsl.lang.chain import Chain, substitute_chain
from kdsl.lang.errors import KdslError, ShapeError
from kdsl.lang.live import Live
from kdsl.lang.nonlinear import JOINS, UNARY, BlendJoin, Join, ProductJoin
from kdsl.lang.operator import Match, Node, Operator, finish_nodes, weights_of
from kdsl.lang.primitives import PRIMITIVES, BuildContext, Dim, Output, Pipeline, Primitive, Weight
from kdsl.lang.sizes import Size, unify

__all__ = ["Blend", "Product", "Tensor"]

# ------------------------------------------------------------------------------------------------


_SERIALS = itertools.count()


class _Vertex:
    """A node while building: compared by identity, so a tensor used twice is one vertex.

    Besides its step, arguments and dims it keeps what joins would otherwise find by walking the
    whole graph (which made building quadratic): its inputs (``roots``) and the weights of
    everything it reads (``named``, a :class:`_Weights` view made on first use).
    """

    __slots__ = ("step", "args", "dims", "roots", "serial", "named", "name")

    def __init__(
        self,
        step: Chain | Primitive | Join | None,
        args: tuple[_Vertex, ...],
        dims: tuple[Dim, ...],
        name: str | None = None,
    ):
        self.step, self.args, self.dims = step, args, dims
        #: an input vertex's name (None for an unnamed input and for every other vertex)
        self.name = name
        #: every input the vertex reads, in the order a kernel takes them (left branch first)
        self.roots: tuple[_Vertex, ...] = (
            (self,) if not args else args[0].roots if len(args) == 1 else _union(args[0].roots, args[1].roots)
        )
        #: a unique number naming the vertex as a weight's owner (an id() could be reused)
        self.serial = next(_SERIALS)
        self.named: _Weights | None = None


def _union(first: tuple[_Vertex, ...], second: tuple[_Vertex, ...]) -> tuple[_Vertex, ...]:
    if first == second:
        return first
    return first + tuple(v for v in second if all(v is not u for u in first))


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
    for weight in weights_of(vertex.step):
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
        for weight in weights_of(vertex.step):
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
            return Tensor(_input_vertex(value.dims, value.name))
        if isinstance(value, Builder):
            return Tensor(_input_vertex(value.inputs, value.input_name), value)
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
            chain = pending.finish_chain(Output(*pending.live.sizes))
            pending.closed_vertex = _Vertex(chain, (self.vertex,), chain.outputs)
        return pending.closed_vertex

    def __rshift__(self, other: object) -> Tensor | Operator:
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
        rhs = _rebase(rhs, _same_inputs(step.kind, lhs.roots, rhs.roots))
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

    def finish(self, output: Output) -> Operator:
        vertex = self.closed()
        order = _topological(vertex)
        if len(order) == 2 and isinstance(vertex.step, Chain):
            # one linear chain on the input: the linear operator, the special case
            chain = vertex.step
            return Builder(chain.inputs, chain.steps, None, []).finish(output)
        if len(order) == 1:
            return Builder(vertex.dims, (), Live({d.name: d.size for d in vertex.dims}, ()), []).finish(output)
        index = {id(v): i for i, v in enumerate(order)}
        # a kernel of one input keeps no name (it is x): its text, JSON and key stay as they were
        named = len(vertex.roots) > 1
        nodes = tuple(
            Node(v.step, tuple(index[id(a)] for a in v.args), v.dims, v.name if named else None) for v in order
        )
        graph = finish_nodes(order[0].dims, nodes, list(output.refs), dict(output.defaults))
        if self.matches:
            graph = Operator(graph.inputs, graph.nodes, graph.outputs, graph.defaults, self.matches)
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
        if isinstance(step, Chain):
            step = substitute_chain(step, sizes, steps)
        elif isinstance(step, Primitive):
            step = steps.setdefault(id(step), step.substituted(sizes))
        if step is vertex.step and args == vertex.args and dims == vertex.dims:
            memo[id(vertex)] = vertex
        elif not vertex.args:
            memo[id(vertex)] = _input_vertex(dims, vertex.name)
        else:
            memo[id(vertex)] = _Vertex(step, args, dims)
    return memo[id(root)]


def _same_inputs(kind: str, left: tuple[_Vertex, ...], right: tuple[_Vertex, ...]) -> dict[int, _Vertex]:
    """Which of the right branch's inputs are the left one's (by id): two Input(...) values of one
    name (or both unnamed) and equal dims are one input. Inputs of one name and other dims, or a
    second input where one is unnamed, are errors that name them."""
    same: dict[int, _Vertex] = {}
    for vertex in right:
        found = next((v for v in left if v.name == vertex.name), None)
        if found is not None and found.dims == vertex.dims:
            if found is not vertex:
                same[id(vertex)] = found
            continue
        if found is not None and vertex.name is not None:
            raise ShapeError(
                f"{kind}: two inputs are named {vertex.name!r}, {_describe(found.dims)} and {_describe(vertex.dims)}; "
                f"give each input its own name"
            )
        if found is not None or vertex.name is None or any(v.name is None for v in left):
            raise ShapeError(
                f"{kind}: the branches start from different inputs {_describe(left[0].dims)} and "
                f"{_describe(vertex.dims)}; a kernel of several inputs names each one (Input(..., name='q'))"
            )
    return same


def _rebase(vertex: _Vertex, same: Mapping[int, _Vertex]) -> _Vertex:
    """``vertex`` with the inputs in ``same`` (by id) replaced by theirs (two Input(...) values
    with equal dims and names are the same input), sharing every vertex it can."""
    if not same or all(id(r) not in same for r in vertex.roots):
        return vertex
    memo: dict[int, _Vertex] = {}
    for v in _topological(vertex):
        if not v.args:
            memo[id(v)] = same.get(id(v), v)
        else:
            memo[id(v)] = _Vertex(v.step, tuple(memo[id(a)] for a in v.args), v.dims)
    return memo[id(vertex)]


def _common_prefix(first: Chain, second: Chain) -> int:
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
    chain = builder.finish_chain(Output(*(outputs if outputs is not None else builder.live.sizes)))
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
            if isinstance(vertex.step, Chain):
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


_INPUTS: dict[tuple[str | None, tuple[Dim, ...]], _Vertex] = {}


def _input_vertex(dims: tuple[Dim, ...], name: str | None = None) -> _Vertex:
    # one vertex per distinct input: branches of x = Input(...) built separately meet at one node
    vertex = _INPUTS.get((name, dims))
    if vertex is None:
        if len(_INPUTS) > 4096:
            _INPUTS.clear()
        vertex = _INPUTS[name, dims] = _Vertex(None, (), dims, name)
    return vertex


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


def _chain_to_tensor(builder: Builder, other: object) -> Tensor | Operator:
    return Tensor.of(builder, "a chain") >> other


def _blend_hook(left: object, how: str, right: object) -> Tensor:
    return Tensor.of(left, how).join(BlendJoin(how), right)


# The linear builder (kdsl.lang.build) knows nothing of graphs: it hands a Canvas step or an
# arithmetic join to these hooks.
_build.GRAPH_HOOKS["step"] = _chain_to_tensor
_build.GRAPH_HOOKS["blend"] = _blend_hook

JOIN_FUNCTIONS = {"Blend": Blend, "Product": Product}
assert set(JOIN_FUNCTIONS) == set(JOINS)
