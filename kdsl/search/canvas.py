"""Canvas's micro-DAG sampler (Canvas §6.1) as a search strategy: random branching kernels, filled
to the space's budget.

One *attempt* grows a kernel top-down from the spec's input tensor, one node per step, to a target
of ``n`` nodes (the input counts; ``n`` is drawn per attempt from ``nodes``, by default 4 to
``space.max_depth + 1``). At each step the sampler lists, for every node, the single-input
primitives that apply to it, and for every pair of nodes the joins; it picks a primitive *kind*
first (weighted, uniform by default) and then one instance of that kind uniformly. Without that
rescaling the O(n^2) pairs of joins would crowd out the unary steps (Canvas's "sampling probability
adjustment"). The kinds (:data:`KINDS`):

==========  =================================================================================
map         ``Map(f)``, f in ``maps`` (relu, sigmoid, gelu, tanh, abs by default)
unfold      ``Unfold(D, K, "kD")`` of a spatial dim (one window per dim at a time)
fold        ``Fold(kH[, kW], how="max")`` over window dims: max pooling
reduce      ``Reduce(..., mean=True)`` over the spatial dims (Canvas's global pooling, broadcast
            back later by a blend), over window dims (average pooling) or over the channel
softmax     ``Softmax`` over the spatial dims, the window dims or the channel
fc          ``FC`` of the channel dims (with or without the windows: a convolution) to a new
            channel of a fresh dynamic width ``x<i>``; grouped (per ``g``) when grouped
group       ``Split(channel, channel/G, "g", "cg")`` (G groups), and ``Merge`` back
shift       ``Shift(D, +-1)`` of a spatial dim
blend       ``Blend(how, a, b)``, how in ``blends`` (add, sub, mul, max, min by default)
product     ``Product(a, b, ...)`` reducing the window dims or the channel both have
==========  =================================================================================

Dims keep fixed names by role, so that branches meet by name as Canvas's positional shapes do: the
batch and spatial dims keep the spec's names, every channel is called like the input's channel
(an FC's new dim is renamed to it), groups are ``g`` and ``cg``, windows ``kH``, ``kW``. A blend of
a channel of width ``x3`` with one of ``Cin`` is where shape matching (:func:`kdsl.lang.unify`)
solves ``x3 = Cin``.

**Topology** (Canvas's heuristic): the sampler counts the leaves (nodes no step reads yet) and only
offers steps after which the remaining steps can still join every leaf into one: when they are
just enough, only joins of two leaves are left. **Pruning**: a Map that is the identity on its
argument (relu or abs of a relu, abs, sigmoid or softmax: no two ReLUs in a row), a Merge that
undoes a Split, a Shift that undoes a Shift, a join of a tensor with itself, and a step that
remakes a tensor the kernel already has (same step on the same tensor; a weighted step never
equals another) are never offered; a kernel whose content key (``op.key``, the approximate
isomorphism hash) was already produced is dropped. A step the language refuses (a
:class:`~kdsl.lang.errors.KdslError`: sizes that no width can match) is dropped and another drawn.

**Finishing**: the last node must become the spec's output. Its channel is renamed to the
output's when the sizes agree or a free width can make them agree (``x3 = Cout``), else one FC of
all its channel, group and window dims maps it to the output channels (this finishing step is not
counted in ``n``). Where matching a free width to the output would leave the kernel no free
width at all (``keep_width``, the default), the finishing FC is used instead, so that the budget
solver has a width to fill. Then the free widths are filled to the space's budgets by
:func:`kdsl.solve.fill` (Canvas §6.3) on every layer of the space, which also checks the filled
kernel on every layer; a kernel that cannot be made valid or whose least widths exceed a budget is
rejected (counted). **Budget floor**: a kernel whose FLOPs stay under ``min_fill`` (default 0.4) of
the space's FLOPs budget is dropped (counted as ``underfilled``): the doubling solver leaves a
filled template within a factor 2 of the budget, so what falls below is a kernel whose structure
cannot use it (no free width: a 1x1 FC after shifts and maps, ~0.1x conv2d's MACs), which rarely
learns what the convolution it replaces learns; below the space's ``min_flops``, if set, is
dropped too.

**In the results store** (strategy ``canvas`` of :func:`kdsl.search.run.search`) a kernel is its
template's DSL text, free widths left as ``dynamic("x1")``, keyed by its content key, with the
filled widths per layer in the row's metrics (``metrics["widths"][layer]``): the budget solver
gives each layer its own widths, which in general no single size formula (like ``Cin/4``) writes.
A kernel without free widths is evaluated as every search result is
(:func:`kdsl.search.analytic.evaluate`, with padding where ``space.pad``); :func:`kdsl.solve.fill`
is given ``pad`` once it takes it.

Where this differs from Canvas: dims are matched by name, not position; Canvas's Fold includes
mean folds, here an average fold is a ``Reduce(mean=True)``; the finishing FC or Rename is a fixed
step rather than a sampled one; the kernel count ``n`` varies per attempt; groups are one level
deep; ``n`` counts kdsl's nodes as the sampler made them (an FC and the Rename of its new dim are
one step).

Each attempt ``i`` of seed ``s`` draws from its own generator seeded with ``"canvas:s:i"``, so a
run is reproducible and resumes from its attempt counter alone.

>>> from kdsl.search.space import Space
>>> space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [4]}, max_flops="0.5x")
>>> sampler = CanvasSampler(space, seed=1)
>>> found = [sampler.draw(i) for i in range(30)]
>>> legal = [s for s in found if s is not None]
>>> len(legal) > 0, all(s.result["status"] == "valid" for s in legal)
(True, True)
>>> legal[0].key == CanvasSampler(space, seed=1).draw(found.index(legal[0])).key  # reproducible
True
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kdsl.lang.branches import Blend, Product, Tensor
from kdsl.lang.build import Input, Output
from kdsl.lang.errors import KdslError, SearchError
from kdsl.lang.nonlinear import BLEND_KINDS, FC, MAP_FUNCTIONS, Fold, Map, Rename, Softmax
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import Merge, Reduce, Shift, Split, Unfold
from kdsl.lang.sizes import Size, dynamic, unify
from kdsl.search.analytic import evaluate
from kdsl.search.canvas_choices import GROUP, GROUP_WIDTH, Choices
from kdsl.search.space import Space
from kdsl.solve import BudgetError, fill

__all__ = ["DEFAULT_BLENDS", "DEFAULT_MAPS", "KINDS", "CanvasSampler", "Sample", "sample"]

#: the primitive kinds the sampler chooses between (uniformly by default, then an instance)
KINDS = ("map", "unfold", "fold", "reduce", "softmax", "fc", "group", "shift", "blend", "product")
#: Map functions offered by default (exp is left out: it overflows in deep networks)
DEFAULT_MAPS = ("relu", "sigmoid", "gelu", "tanh", "abs")
DEFAULT_BLENDS = ("add", "sub", "mul", "max", "min")
#: the weight of the finishing FC
OUTPUT_WEIGHT = "w_out"


def _accepts(function: Any, name: str) -> bool:
    return name in inspect.signature(function).parameters


# padding (Syno's rounding up of sizes, ``space.pad``) is passed on to fill once it takes it
_FILL_PADS = _accepts(fill, "pad")


@dataclass(frozen=True)
class Sample:
    """A legal kernel the sampler produced: the template ``op`` (free widths still symbolic, the
    coefficients as defaults), its content ``key``, the widths the budget solver chose per layer
    (``widths``, by layer name), ``result`` (the fields of :func:`kdsl.search.analytic.evaluate`:
    status, FLOPs and params in total and per layer, coefficients), the ``steps`` sampled and the
    kinds they had."""

    op: Operator
    key: str
    widths: dict[str, dict[str, int]]
    result: dict[str, Any]
    steps: int
    kinds: tuple[str, ...]

    @property
    def depth(self) -> int:
        """The number of sampled steps (what the results store calls depth)."""
        return self.steps

    @property
    def metrics(self) -> dict[str, Any]:
        """What the results store keeps beside the DSL text: the widths per layer and the kinds."""
        return {"widths": self.widths, "kinds": list(self.kinds), "coefficients": self.result["coefficients"]}


@dataclass
class _Node:
    """A tensor of the micro-DAG being grown."""

    tensor: Tensor
    dims: dict[str, Size]
    made_by: tuple[object, ...]  # the step: ("map", fn), ("split",), ("shift", dim, by), ...
    signature: object  # equal for two nodes that are the same step on the same tensor
    recipe: tuple[str, tuple[tuple[int, ...], tuple], int] | None = None  # (kind, choice, FC index)
    #: its groups (g, cg) are a Split's, and every step since treated them as one channel: merging
    #: them back gives what the same steps give without the Split (a Split commutes with those)
    plain: bool = False


@dataclass
class _Attempt:
    rng: random.Random
    nodes: list[_Node]
    readers: list[int]
    assignment: dict[str, int]
    widths: int = 0
    kinds: list[str] = field(default_factory=list)
    #: the free widths shape matching solved at joins so far (every node is built with them)
    solved: dict[str, Size] = field(default_factory=dict)


class CanvasSampler(Choices):
    """The strategy ``canvas`` of :func:`kdsl.search.run.search`: endless attempts, each a
    :class:`Sample` or None (see the module's docstring).

    ``nodes``: the node count of an attempt (an int, or an inclusive range drawn per attempt;
    default 4 to ``space.max_depth + 1``). ``weights``: a weight per kind (a kind left out or at
    0 is never drawn). ``maps``/``blends``: the Map functions and Blend kinds offered.
    ``progress`` holds the attempt counter (for resuming). ``stats`` counts attempts, legal
    kernels and every reason an attempt failed; ``offered``/``chosen`` sum, per kind, the
    probability it had and how often it was drawn (the rescaling's record).
    """

    name = "canvas"

    def __init__(
        self,
        space: Space,
        seed: int = 0,
        progress: Mapping[str, Any] | None = None,
        *,
        nodes: int | tuple[int, int] | None = None,
        weights: Mapping[str, float] | None = None,
        maps: Sequence[str] = DEFAULT_MAPS,
        blends: Sequence[str] = DEFAULT_BLENDS,
        keep_width: bool = True,
        min_fill: float = 0.4,
    ) -> None:
        progress = dict(progress or {})
        self.keep_width = bool(keep_width)
        if isinstance(min_fill, bool) or not isinstance(min_fill, (int, float)) or not 0 <= min_fill <= 1:
            raise SearchError(
                f"canvas: min_fill is the least fraction of the FLOPs budget, from 0 to 1; got {min_fill!r}"
            )
        self.min_fill = float(min_fill)
        self.space = space
        self.seed = seed
        self.iteration = int(progress.get("iteration", 0))
        self.failures = int(progress.get("failures", 0))
        self.finished = False
        top = space.max_depth + 1
        low, high = (nodes, nodes) if isinstance(nodes, int) else (nodes or (min(4, top), top))
        if not 2 <= low <= high:
            raise SearchError(f"canvas: the node count must be a range of at least 2 nodes, got {nodes!r}")
        self.node_range = (low, high)
        unknown = set(weights or {}) - set(KINDS)
        if unknown:
            raise SearchError(f"canvas: unknown kinds {sorted(unknown)} in weights; the kinds are {', '.join(KINDS)}")
        self.weights = {kind: float((weights or {}).get(kind, 1.0)) for kind in KINDS}
        if any(w < 0 for w in self.weights.values()) or not any(self.weights.values()):
            raise SearchError(f"canvas: weights must be non-negative and not all 0, got {dict(weights or {})}")
        for name, given, known in (("maps", maps, MAP_FUNCTIONS), ("blends", blends, BLEND_KINDS)):
            bad = [item for item in given if item not in known or item == "scale"]
            if bad:
                raise SearchError(f"canvas: unknown {name} {bad}; choose from {', '.join(known)}")
        self.maps, self.blends = tuple(maps), tuple(blends)
        self._setup_roles()
        self.seen: set[str] = set()
        self._kinds: list[str] = []  # the last attempt's kinds and step count
        self._steps = 0
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "attempts",
                "legal",
                "steps",
                "errors",
                "dead_ends",
                "unfinished",
                "duplicates",
                "over_budget",
                "underfilled",
                "invalid",
            ),
            0,
        )
        #: seconds spent growing and finishing kernels, and filling and checking them
        self.seconds: dict[str, float] = {"sample": 0.0, "solve": 0.0}
        self.offered: dict[str, float] = dict.fromkeys(KINDS, 0.0)
        self.chosen: dict[str, int] = dict.fromkeys(KINDS, 0)

    # -- the spec's roles ---------------------------------------------------------------------------
    def _setup_roles(self) -> None:
        spec = self.space.spec
        self.batch = tuple(spec.batch)
        self.spatial = tuple(d.name for d in spec.inputs if d.name in spec.spatial)
        self.channels = tuple(d.name for d in spec.inputs if d.name not in spec.batch and d.name not in spec.spatial)
        kept = {d.name: d.size for d in spec.inputs if d.name in self.batch + self.spatial}
        out_kept = {d.name: d.size for d in spec.outputs if d.name in self.batch + self.spatial}
        out_channels = [d for d in spec.outputs if d.name not in kept]
        if kept != out_kept or len(self.channels) != 1 or len(out_channels) != 1:
            raise SearchError(
                f"canvas: the spec {spec.name} must keep its batch and spatial dims ({', '.join(kept) or 'none'}) "
                f"and map one channel dim to one channel dim; it maps {_text(spec.inputs)} -> {_text(spec.outputs)}"
            )
        self.channel = self.channels[0]
        self.output = out_channels[0]
        self.windows = {f"k{name}": name for name in self.spatial}
        coefficients = set(self.space.coefficient_names)
        self.K = Size.variable("K", "coefficient") if "K" in coefficients else None
        self.G = Size.variable("G", "coefficient") if "G" in coefficients else None

    # -- the strategy's interface ---------------------------------------------------------------------
    @property
    def nodes(self) -> int:
        """Steps sampled so far (the search driver's node count)."""
        return self.stats["steps"]

    def progress(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "failures": self.failures}

    def states(self) -> Generator[Sample | None, object, None]:
        """Endless attempts: a :class:`Sample`, or None for an attempt that gave no new legal kernel."""
        while True:
            found = self.draw(self.iteration)
            self.iteration += 1
            if found is None:
                self.failures += 1
            yield found

    # -- one attempt ----------------------------------------------------------------------------------
    def draw(self, iteration: int) -> Sample | None:
        """Attempt ``iteration`` of this seed: a legal kernel not produced before, or None."""
        self.stats["attempts"] += 1
        start = time.perf_counter()
        try:
            op = self._sample(iteration)
        finally:
            self.seconds["sample"] += time.perf_counter() - start
        if op is None:
            return None
        key = op.key
        if key in self.seen:
            self.stats["duplicates"] += 1
            return None
        self.seen.add(key)
        start = time.perf_counter()
        try:
            found = self._solve(op)
        finally:
            self.seconds["solve"] += time.perf_counter() - start
        if found is None:
            return None
        widths, result = found
        ceiling = self.space.max_flops
        if ceiling is not None and result["flops"] < self.min_fill * ceiling:
            self.stats["underfilled"] += 1  # its structure cannot use the budget (no free width to fill)
            return None
        self.stats["legal"] += 1
        return Sample(op, key, widths, result, self._steps, tuple(self._kinds))

    def _start(self, rng: random.Random) -> _Attempt:
        """An attempt with the input alone, and coefficient values drawn from the space's."""
        source = Tensor.of(Input(*self.space.spec.inputs), "canvas")
        node = _Node(source, dict(source.shape), ("input",), ("input",))
        return _Attempt(rng, [node], [0], dict(rng.choice(self.space.assignments)))

    def _sample(self, iteration: int) -> Operator | None:
        """Grow and finish the kernel of attempt ``iteration`` (None: a dead end, counted)."""
        attempt = self._start(random.Random(f"canvas:{self.seed}:{iteration}"))
        steps = attempt.rng.randint(*self.node_range) - 1
        for step in range(steps):
            if not self._grow(attempt, steps - step - 1):
                self.stats["dead_ends"] += 1
                return None
        op = self._finish(attempt)
        if op is None:
            self.stats["unfinished"] += 1
        self._kinds, self._steps = attempt.kinds, steps
        return op

    def _grow(self, attempt: _Attempt, remaining: int) -> bool:
        """Add one node; False when no step is left that keeps the kernel finishable."""
        options = {kind: self._instances(kind, attempt, remaining) for kind in KINDS if self.weights[kind] > 0}
        first = True
        while True:
            kinds = [kind for kind, found in options.items() if found]
            if not kinds:
                return False
            weights = [self.weights[kind] for kind in kinds]
            kind = attempt.rng.choices(kinds, weights)[0]
            if first:  # the record of the rescaling: each kind's chance at the step's first draw
                total = sum(weights)
                for k, w in zip(kinds, weights):
                    self.offered[k] += w / total
                self.chosen[kind] += 1
                first = False
            instances = options[kind]
            choice = instances.pop(attempt.rng.randrange(len(instances)))
            if self._add(attempt, kind, choice, remaining == 0):
                return True

    def _add(self, attempt: _Attempt, kind: str, choice: tuple[tuple[int, ...], tuple], last: bool = False) -> bool:
        """Take the step ``choice`` of ``kind``; False (nothing changed) when the language refuses
        it, when it remakes a tensor the kernel has, or when ``last`` and its result cannot be
        made the output."""
        index = attempt.widths + 1 if kind == "fc" else 0
        solved = attempt.solved
        try:
            node = self._apply(attempt.nodes, kind, choice, index, solved)
            nodes = attempt.nodes
            found = {m.variable: m.size for m in node.tensor.matches if m.variable not in solved}
            if found:
                # a join solved a free width: every tensor of the kernel is rebuilt with it, or a
                # later join would meet one FC's weight with two sizes
                solved = {k: v.substitute(found) for k, v in solved.items()} | found
                nodes = self._rebuilt(attempt.nodes, solved)
                node = self._apply(nodes, kind, choice, index, solved)
        except KdslError:
            self.stats["errors"] += 1  # sizes no width can match, say: another choice
            return False
        if last and not self._finishable(node):
            return False
        if any(node.signature == other.signature for other in nodes):
            return False  # (an FC's weights are its own: only weightless steps can remake a tensor)
        for arg in choice[0]:
            attempt.readers[arg] += 1
        attempt.nodes = nodes + [node]
        attempt.solved = solved
        attempt.widths = max(attempt.widths, index)
        attempt.readers.append(0)
        attempt.kinds.append(kind)
        self.stats["steps"] += 1
        return True

    def _rebuilt(self, nodes: list[_Node], solved: Mapping[str, Size]) -> list[_Node]:
        """The nodes built again, in order, from their recipes with the widths ``solved``."""
        made = nodes[:1]
        for node in nodes[1:]:
            assert node.recipe is not None
            kind, choice, index = node.recipe
            made.append(self._apply(made, kind, choice, index, solved))
        return made

    def _leaves_after(self, attempt: _Attempt, args: tuple[int, ...]) -> int:
        leaves = sum(1 for count in attempt.readers if count == 0)
        return leaves + 1 - sum(1 for a in set(args) if attempt.readers[a] == 0)

    # -- what may come next ---------------------------------------------------------------------------
    def _instances(self, kind: str, attempt: _Attempt, remaining: int) -> list[tuple[tuple[int, ...], tuple]]:
        """Every instance ``(args, detail)`` of ``kind`` after which the remaining steps can still
        join every leaf into one (each join of two leaves removes one)."""
        found: list[tuple[tuple[int, ...], tuple]] = []
        nodes = attempt.nodes
        if kind in ("blend", "product"):
            for i in range(len(nodes)):
                for j in range(i + 1, len(nodes)):
                    if self._leaves_after(attempt, (i, j)) - 1 > remaining:
                        continue
                    details = (
                        self._blends(nodes[i], nodes[j]) if kind == "blend" else self._products(nodes[i], nodes[j])
                    )
                    found.extend(((j, i) if swap else (i, j), d) for swap, d in details)
            return found
        for i, node in enumerate(nodes):
            if self._leaves_after(attempt, (i,)) - 1 > remaining:
                continue
            found.extend(((i,), d) for d in getattr(self, f"_{kind}")(node))
        return found

    # -- taking a step --------------------------------------------------------------------------------
    def _apply(
        self,
        nodes: Sequence[_Node],
        kind: str,
        choice: tuple[tuple[int, ...], tuple],
        index: int,
        solved: Mapping[str, Size],
    ) -> _Node:
        """The node the step makes from ``nodes``; an FC makes the width ``x<index>`` (or what
        shape matching ``solved`` for it)."""
        args, detail = choice
        node = nodes[args[0]]
        t = node.tensor
        signature: object = (kind, detail, tuple(nodes[a].signature for a in args))
        if kind == "map":
            made: tuple = ("map", detail[0])
            result = t >> Map(detail[0])
        elif kind == "unfold":
            made = ("unfold",)
            result = t >> Unfold(detail[1], self.K, detail[0])
        elif kind == "fold":
            made = ("fold",)
            result = t >> Fold(*detail, how="max")
        elif kind == "reduce":
            made = ("reduce",)
            result = t >> Reduce(*detail, mean=True)
        elif kind == "softmax":
            made = ("softmax",)
            result = t >> Softmax(*detail)
        elif kind == "fc":
            name, dims = detail
            width = Size.of(dynamic(f"x{index}")).substitute(solved)
            made = ("fc",)
            signature = ("fc", index)  # its weight is its own: never equal to another tensor
            result = t >> FC(*dims, name=f"f{index}", size=width, weight=f"w{index}") >> Rename(f"f{index}", name)
        elif kind == "group":
            made = detail
            if detail[0] == "split":
                # G groups of channel/G: Split's block is the inner size
                result = t >> Split(self.channel, node.dims[self.channel] / self.G, GROUP, GROUP_WIDTH)
            else:
                result = t >> Merge(GROUP, GROUP_WIDTH, self.channel)
        elif kind == "shift":
            made = ("shift", *detail)
            result = t >> Shift(detail[0], detail[1])
        elif kind == "blend":
            made = ("blend",)
            how, merge = detail
            sides = tuple(nodes[a].signature for a in args)
            signature = ("blend", detail, sides if how == "sub" else tuple(sorted(sides, key=repr)))
            lhs, rhs = self._join_sides(nodes[args[0]], nodes[args[1]], merge)
            result = Blend(how, lhs, rhs)
        else:
            made = ("product",)
            sides = tuple(sorted((nodes[a].signature for a in args), key=repr))
            signature = ("product", detail, sides)
            lhs, rhs = self._join_sides(nodes[args[0]], nodes[args[1]], detail[1])
            result = Product(lhs, rhs, *detail[0])
        assert isinstance(result, Tensor)
        return _Node(
            result, dict(result.shape), made, signature, (kind, choice, index), self._plain(nodes, kind, choice)
        )

    def _plain(self, nodes: Sequence[_Node], kind: str, choice: tuple[tuple[int, ...], tuple]) -> bool:
        """Whether the step's result has plain groups (see :class:`_Node`)."""
        args, detail = choice
        if kind == "group":
            return detail[0] == "split"
        if kind == "fc" or (kind in ("reduce", "softmax") and GROUP_WIDTH in detail):
            return False  # the groups now differ from one another
        if kind in ("blend", "product"):
            merged = detail[-1]
            reduced = detail[0] if kind == "product" else ()
            grouped = [nodes[a] for a in args if GROUP in nodes[a].dims]
            return bool(grouped) and not merged and GROUP_WIDTH not in reduced and all(n.plain for n in grouped)
        return nodes[args[0]].plain

    def _join_sides(self, a: _Node, b: _Node, merge: bool) -> tuple[Tensor, Tensor]:
        """The two tensors a join reads: as they are, or with a grouped one's groups merged back."""
        if not merge:
            return a.tensor, b.tensor
        sides = []
        for node in (a, b):
            grouped = self._merged(node) != set(node.dims)
            tensor = node.tensor >> Merge(GROUP, GROUP_WIDTH, self.channel) if grouped else node.tensor
            sides.append(tensor)
        return sides[0], sides[1]  # type: ignore[return-value]

    # -- the end ---------------------------------------------------------------------------------------
    def _finishable(self, node: _Node) -> bool:
        """The tensor has the output's batch and spatial dims, and channel dims an FC can map, and
        no plain groups (the finishing FC of their g and cg would make their Split pointless)."""
        dims = node.dims
        rest = [d for d in dims if d not in self.batch and d not in self.spatial]
        allowed = {self.channel, GROUP, GROUP_WIDTH, *self.windows}
        return (
            all(d in dims for d in self.batch + self.spatial) and bool(rest) and set(rest) <= allowed and not node.plain
        )

    def _finish(self, attempt: _Attempt) -> Operator | None:
        """The last node made into the spec's output (a Rename, a width matched, or an FC)."""
        last = attempt.nodes[-1]
        if not self._finishable(last) or sum(1 for count in attempt.readers if count == 0) != 1:
            return None
        target = self.output.size
        channels = [d for d in last.dims if d not in self.batch and d not in self.spatial]
        solved: tuple[str, Size] | None = None
        tensor = last.tensor
        if channels == [self.channel]:
            size = last.dims[self.channel]
            solved = None if size is target else unify(size, target)
            if size is target or solved is not None:  # else sizes that cannot match: an FC below
                if self.channel != self.output.name:
                    tensor = tensor >> Rename(self.channel, self.output.name)  # type: ignore[assignment]
                channels = []
        try:
            op = self._output(tensor, channels, target)
            if solved is not None:
                free = op.dynamic_variables
                if self.keep_width and set(free) == {solved[0]}:
                    # matching the last free width to the output would leave the budget solver
                    # nothing to fill (a kernel at its least width, ~0.1x conv2d's MACs): the
                    # finishing FC keeps it free instead (Canvas §6.3 fills what FCs leave)
                    op = self._output(last.tensor, [self.channel], target)
                else:
                    op = op.substituted({solved[0]: solved[1]})
            used = set(op.coefficient_variables)
            op = op.with_defaults(**{k: v for k, v in attempt.assignment.items() if k in used})
        except KdslError:
            self.stats["errors"] += 1
            return None
        if [(d.name, d.size) for d in op.outputs] != [(d.name, d.size) for d in self.space.spec.outputs]:
            return None
        return op

    def _output(self, tensor: Any, channels: Sequence[str], target: Size) -> Operator:
        """``tensor`` (after its Rename, if any) made the output: an FC of ``channels`` to the
        output's channel when there are any."""
        if channels:
            tensor = tensor >> FC(*channels, name=self.output.name, size=target, weight=OUTPUT_WEIGHT)
        return tensor >> Output(*(d.name for d in self.space.spec.outputs))

    def _solve(self, op: Operator) -> tuple[dict[str, dict[str, int]], dict] | None:
        """Fill the free widths to the budgets on every layer and check the result there: the
        widths per layer and the evaluation, or None (counted) for a kernel that cannot be made
        valid or does not fit the budgets. A kernel without free widths is evaluated as every
        search result is (:func:`kdsl.search.analytic.evaluate`: padded where ``space.pad``)."""
        space = self.space
        if not op.dynamic_variables:
            result = evaluate(space, op)
            if result["status"] != "valid":
                self.stats["over_budget" if result["status"] == "over_budget" else "invalid"] += 1
                return None
            return {}, result
        coefficients = op.default_coefficients
        pad = {"pad": True} if _FILL_PADS and getattr(space, "pad", False) else {}
        try:
            filled = fill(
                op,
                space.layers,
                max_flops=space.max_flops,
                max_params=space.max_params,
                coefficients=coefficients,
                **pad,
            )
        except KdslError as error:
            self.stats["over_budget" if isinstance(error, BudgetError) else "invalid"] += 1
            return None
        flops = [int(c["flops"]) for c in filled.costs]
        params = [int(c["params"]) for c in filled.costs]
        if space.min_params is not None and sum(params) < space.min_params:
            self.stats["over_budget"] += 1  # (fill fills up to the budgets; a floor it does not know)
            return None
        if space.min_flops is not None and sum(flops) < space.min_flops:
            self.stats["over_budget"] += 1  # filled as far as the ceilings allow and still below the floor
            return None
        result = {
            "status": "valid",
            "error": None,
            "coefficients": coefficients,
            "flops": sum(flops),
            "params": sum(params),
            "flops_per_layer": flops,
            "params_per_layer": params,
        }
        return {layer.name: dict(values) for layer, values in zip(filled.layers, filled.values)}, result


def sample(space: Space, count: int, seed: int = 0, **options: Any) -> list[Sample]:
    """The first ``count`` legal kernels of seed ``seed`` (at most ``200 * count`` attempts).

    >>> from kdsl.search.space import Space
    >>> space = Space("conv2d", "resnet18", coefficients={"K": [3], "G": [4]}, max_flops="0.5x")
    >>> kernels = sample(space, 2, seed=3)
    >>> len(kernels), len({k.key for k in kernels})
    (2, 2)
    """
    sampler = CanvasSampler(space, seed=seed, **options)
    found: list[Sample] = []
    for iteration in range(200 * count):
        drawn = sampler.draw(iteration)
        if drawn is not None:
            found.append(drawn)
            if len(found) == count:
                break
    return found


def _text(dims: Sequence[Any]) -> str:
    return "[" + ", ".join(d.name for d in dims) + "]"
