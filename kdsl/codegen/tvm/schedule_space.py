"""The schedule space of a lowered operator: typed parameters, configurations, and their application.

A *configuration* is a plain JSON-able ``dict`` from parameter names to values. :meth:`Space.apply`
turns one into a ``tvm.s_tir.Schedule`` of the operator's TE program, or raises
:class:`~kdsl.lang.errors.LoweringError` with the reason when it is invalid (never another exception).

Parameters have one of four types, each with a neighbour relation (the topology OpEvo's mutation walks):

* :class:`Factorization` -- a tuple of factors whose product is a loop's extent; neighbours move one
  prime factor from one slot to another.
* :class:`Permutation` -- a loop order; neighbours differ by one swap.
* :class:`Discrete` -- ordered values; neighbours are the adjacent values.
* :class:`Categorical` -- unordered values; every other value is a neighbour.

The space of one operator (per TE stage ``S``, built from the block analysis of
:mod:`kdsl.codegen.tvm.blocks`, never the operator's name):

* reduction stages get a three-level tiling ``S.tile.<axis>`` = (outer, middle, inner) of every spatial
  axis and ``(outer, inner)`` of every reduction axis (a tile of 1 makes no loop); outer spatial tiles are
  fused and parallel, a weight-only vector axis's first; ``S.order`` permutes the middle loops (middle
  spatial tiles and outer reduction tiles); ``S.reductions`` puts the inner reduction tiles below all
  of them (``"split"``) or each right below its outer tile (``"whole"``: the reductions stay in
  ``S.order``'s order, short ones unrolled in place); then come the unit reduction loops and the inner
  spatial tiles, the vector axis ``S.vector`` innermost and vectorized; ``S.unroll`` bounds the product
  of the unrolled inner reduction loops (innermost first), ``S.unroll_tile`` unrolls the register tile;
  ``S.cache`` accumulates in a ``local`` tile (laid out with the tile's axes last, the vector axis
  innermost) written back once, or in place;
  ``S.rfactor`` (stages with little spatial parallelism) splits the outer reduction into a parallel
  partial sum; ``S.attach`` computes a producer stage at its consumer's parallel loop;
* copy stages: ``S.inline`` folds the copy into its producer's write-back, else (like element-wise
  stages) their outer loops are fused and parallel, the innermost vectorized if its reads are contiguous;
* zero-padded copies (``padN``, the lowering's stage for each windowed read): ``S.inline`` puts the bounds
  checks back into the reader, else the copy is a parallel, vectorized pass of its own;
* a branching kernel's element-wise stages (Map, Blend, the softmax's division; ``StageInfo.elementwise``):
  ``S.inline`` is ``"consumers"`` (``compute_inline``: computed where it is read), ``"producer"``
  (``reverse_compute_inline`` into the write-back of the reduction it reads one element per iteration) or
  ``"none"`` (a parallel pass: trailing loops that every access walks contiguously fused into whole
  vectors, else a short row vectorized whole);
* a branching kernel's row reductions (the softmax's max and sum; ``StageInfo.lane_reduce``): ``S.lanes``
  keeps vector lanes of partial results along the contiguous last reduced dim, or the trailing reduced
  dims fused where every read walks them as one run (split + ``rfactor``);
* layouts (ALT): every input, weight and intermediate tensor ``T`` has ``layout.T.perm`` (an order of
  its dims) and ``layout.T.tile`` (``"d:f"``: dim ``d`` tiled by ``f``, the tile moved last, ALT's
  ``tiled channel last``; only factors that divide are offered, and a short dim whole); inputs and weights are packed by
  ``cache_read`` + ``transform_layout`` (the signature stays), intermediates are transformed in place.
  The output's layout is the signature's. In a branching kernel the heuristic lays an intermediate that one
  reduction reads out with that reader's vector dim last (a Product's operand made by an FC).

>>> f = Factorization("t", 12, 3)
>>> sorted(f.neighbours((12, 1, 1)))
[(4, 1, 3), (4, 3, 1), (6, 1, 2), (6, 2, 1)]
>>> Permutation("p", 3).neighbours((0, 1, 2))
[(1, 0, 2), (2, 1, 0), (0, 2, 1)]
>>> Discrete("d", (1, 4, 16)).neighbours(4), Categorical("c", ("a", "b", "c")).neighbours("a")
([1, 16], ['b', 'c'])
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from kdsl.codegen.tvm.blocks import Axis, StageBlock, analyze
from kdsl.codegen.tvm.lowering import error_reason, load_tvm
from kdsl.codegen.tvm.machine import current_machine
from kdsl.lang.errors import LoweringError
from kdsl.lang.graph import Graph
from kdsl.runtime.cpu import Machine

#: The space's version: stored with every tuning record (a new version never reuses old records).
VERSION = "tvm-space-5"  # 5: S.reductions (inner reduction tiles below the middle loops or in place)
# The vector width, the register file and the caches are the target machine's
# (:mod:`kdsl.runtime.cpu`): ``Space.lanes`` and ``Space.accumulators``.
#: Most vectors along the vector axis in one register tile (and in any vectorized loop).
MAX_VECTORS = 2
#: Reduction loops at most this long are unrolled by the heuristic (windows such as kh, kw).
UNROLL_REDUCTION = 4
#: Most elements in a local accumulator tile (larger tiles are rejected: they live in memory anyway).
MAX_LOCAL = 8192
#: Layout tile factors offered (ALT's template: tile one dim, move the tile last).
LAYOUT_FACTORS = (1, 4, 8, 16, 32, 64)
#: Most iterations of an unrolled register tile (outside its vector loop).
MAX_UNROLLED_TILE = 64
#: Largest stride of a strided vector load that a branching kernel's stage prefers to a gather across rows.
MAX_GATHER_STRIDE = 4
#: Bounds on the product of unrolled inner reduction loops.
UNROLL_LIMITS = (1, 4, 16, 64, 256)


def largest_divisor(extent: int, limit: int) -> int:
    """The largest divisor of ``extent`` that is at most ``limit`` (a split by it needs no predicate).

    >>> largest_divisor(56, 16), largest_divisor(7, 4)
    (14, 1)
    """
    return max(d for d in range(1, max(1, min(extent, limit)) + 1) if extent % d == 0)


# ------------------------------------------------------------------------------------------------
# Parameter types
# ------------------------------------------------------------------------------------------------


def primes(n: int) -> list[int]:
    """The prime factors of ``n`` with multiplicity.

    >>> primes(360)
    [2, 2, 2, 3, 3, 5]
    """
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


@dataclass(frozen=True)
class Factorization:
    """A tuple of ``levels`` positive factors whose product is ``extent``."""

    name: str
    extent: int
    levels: int

    def validate(self, value: Any) -> tuple[int, ...]:
        """``value`` as a tuple, or a :class:`LoweringError` saying why it is not one of this parameter's.

        >>> Factorization("t", 8, 2).validate([2, 3])
        Traceback (most recent call last):
        ...
        kdsl.lang.errors.LoweringError: t: factors [2, 3] must be 2 positive ints with product 8
        """
        ok = isinstance(value, (list, tuple)) and len(value) == self.levels
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        if not ok or prod(value) != self.extent:
            raise LoweringError(
                f"{self.name}: factors {value!r} must be {self.levels} positive ints with product {self.extent}"
            )
        return tuple(value)

    def neighbours(self, value: Sequence[int]) -> list[tuple[int, ...]]:
        """Move one prime factor from one slot to another (a symmetric relation)."""
        out = []
        for i, j in itertools.permutations(range(self.levels), 2):
            for p in sorted(set(primes(value[i]))):
                moved = list(value)
                moved[i] //= p
                moved[j] *= p
                out.append(tuple(moved))
        return out

    def random(self, rng: random.Random) -> tuple[int, ...]:
        """Every prime factor in a slot drawn uniformly."""
        value = [1] * self.levels
        for p in primes(self.extent):
            value[rng.randrange(self.levels)] *= p
        return tuple(value)

    def values(self) -> list[tuple[int, ...]]:
        """Every factorization (small extents only).

        >>> len(Factorization("t", 8, 3).values())
        10
        """
        out: list[tuple[int, ...]] = []

        def rec(rest: int, prefix: tuple[int, ...]) -> None:
            if len(prefix) == self.levels - 1:
                out.append((*prefix, rest))
                return
            for d in range(1, rest + 1):
                if rest % d == 0:
                    rec(rest // d, (*prefix, d))

        rec(self.extent, ())
        return out


@dataclass(frozen=True)
class Permutation:
    """An order of ``n`` items, ``value[k]`` the item at position ``k``."""

    name: str
    n: int

    def validate(self, value: Any) -> tuple[int, ...]:
        if not isinstance(value, (list, tuple)) or sorted(value) != list(range(self.n)):
            raise LoweringError(f"{self.name}: {value!r} is not a permutation of 0..{self.n - 1}")
        return tuple(value)

    def neighbours(self, value: Sequence[int]) -> list[tuple[int, ...]]:
        out = []
        for i, j in itertools.combinations(range(self.n), 2):
            swapped = list(value)
            swapped[i], swapped[j] = swapped[j], swapped[i]
            out.append(tuple(swapped))
        return out

    def random(self, rng: random.Random) -> tuple[int, ...]:
        value = list(range(self.n))
        rng.shuffle(value)
        return tuple(value)

    def values(self) -> list[tuple[int, ...]]:
        return list(itertools.permutations(range(self.n)))


@dataclass(frozen=True)
class _Choice:
    """One of ``choices`` (the neighbour relation is the subclass's)."""

    name: str
    choices: tuple[Any, ...]

    def validate(self, value: Any) -> Any:
        if value not in self.choices:
            raise LoweringError(f"{self.name}: {value!r} is not one of {list(self.choices)}")
        return value

    def random(self, rng: random.Random) -> Any:
        return rng.choice(self.choices)

    def values(self) -> list[Any]:
        return list(self.choices)


@dataclass(frozen=True)
class Discrete(_Choice):
    """One of ordered ``choices``; neighbours are the adjacent ones."""

    def neighbours(self, value: Any) -> list[Any]:
        i = self.choices.index(value)
        return [self.choices[j] for j in (i - 1, i + 1) if 0 <= j < len(self.choices)]


@dataclass(frozen=True)
class Categorical(_Choice):
    """One of unordered ``choices``; every other choice is a neighbour."""

    def neighbours(self, value: Any) -> list[Any]:
        return [c for c in self.choices if c != value]


Parameter = Factorization | Permutation | Discrete | Categorical


def q_random_walk(param: Parameter, start: Any, q: float, rng: random.Random) -> Any:
    """OpEvo's mutation of one parameter: from ``start``, stop with probability ``1 - q``, else move to a
    neighbour drawn uniformly (each with probability ``q / |S(u)|``), and repeat.

    >>> q_random_walk(Discrete("d", (1, 2, 3)), 2, 0.0, random.Random(0))
    2
    """
    value = tuple(start) if isinstance(start, list) else start
    while rng.random() < q:
        options = param.neighbours(value)
        if not options:
            break
        value = rng.choice(options)
    return value


def q_walk_distribution(param: Parameter, start: Any, q: float) -> dict[Any, float]:
    """The exact q-random-walk distribution ``(1 - q) (I - Q)^-1 e_start`` over a small parameter's values.

    >>> d = q_walk_distribution(Discrete("d", (1, 2, 3)), 1, 0.5)
    >>> round(sum(d.values()), 9), round(d[1], 4)
    (1.0, 0.5833)
    """
    import numpy as np

    values = [tuple(v) if isinstance(v, list) else v for v in param.values()]
    index = {v: i for i, v in enumerate(values)}
    n = len(values)
    transition = np.zeros((n, n))
    for v in values:
        options = param.neighbours(v)
        for u in options:
            transition[index[u], index[v]] += q / len(options)
        if not options:  # a vertex without neighbours stops the walk
            transition[index[v], index[v]] += 0.0
    start_vec = np.zeros(n)
    start_vec[index[tuple(start) if isinstance(start, list) else start]] = 1.0
    stop = np.array([1.0 - q if param.neighbours(v) else 1.0 for v in values])
    visits = np.linalg.solve(np.eye(n) - transition, start_vec)
    return {v: float(stop[i] * visits[i]) for i, v in enumerate(values)}


def config_key(config: Mapping[str, Any]) -> str:
    """A stable hash of a configuration (tuples and lists hash alike).

    >>> config_key({"a": (1, 2)}) == config_key({"a": [1, 2]})
    True
    """
    text = json.dumps(normalize(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:20]


def normalize(config: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-able copy of ``config`` (tuples become lists).

    >>> normalize({"b": (2, 1), "a": True})
    {'a': True, 'b': [2, 1]}
    """
    return {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(config.items())}


# ------------------------------------------------------------------------------------------------
# The space of a lowered operator
# ------------------------------------------------------------------------------------------------


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    kind: str  # "input", "weight" or "intermediate"
    reader: str  # the first stage that reads it (or the producer's name, for intermediates)


class Space:
    """The schedule space of one lowered operator (:func:`kdsl.codegen.tvm.lowering`)."""

    def __init__(self, lowered: Any, machine: Machine | None = None) -> None:
        tvm = load_tvm()
        self.lowered = lowered
        self.tvm = tvm
        #: the CPU the schedules are for (default: the target's, :func:`~kdsl.codegen.tvm.machine.current_machine`)
        self.machine = machine or current_machine()
        self.lanes = self.machine.lanes(str(lowered.out.dtype))
        #: most vector accumulators one register tile keeps live (the rest of the register file holds
        #: the step's weight vectors and broadcast)
        self.accumulators = self.machine.accumulators()
        self.stages: list[StageBlock] = analyze(lowered)
        self.tensors: list[_Tensor] = []
        params = [w.name for w in lowered.weights]
        read_first: dict[str, str] = {}
        for stage in self.stages:
            for buffer, _ in stage.reads:
                read_first.setdefault(buffer, stage.name)
        self.tensors.append(_Tensor("x", tuple(int(d) for d in lowered.x.shape), "input", read_first.get("x", "")))
        for name, w in zip(params, lowered.weights):
            self.tensors.append(_Tensor(name, tuple(int(d) for d in w.shape), "weight", read_first.get(name, "")))
        out_name = lowered.out.op.name
        for stage in self.stages:
            if stage.name != out_name:
                shape = tuple(e for _, e in stage.spatial)
                self.tensors.append(_Tensor(stage.name, shape, "intermediate", stage.name))
        self.parameters: dict[str, Parameter] = {}
        self._build_parameters()

    # -- parameters ------------------------------------------------------------------------------

    def _add(self, param: Parameter) -> None:
        self.parameters[param.name] = param

    def _build_parameters(self) -> None:
        for stage in self.stages:
            s = stage.name
            if stage.kind == "reduce":
                for axis, extent in stage.spatial:
                    if extent > 1:
                        self._add(Factorization(f"{s}.tile.{axis}", extent, 3))
                for axis, extent in stage.reduced:
                    if extent > 1:
                        self._add(Factorization(f"{s}.tile.{axis}", extent, 2))
                middle = [a for a, e in stage.spatial + stage.reduced if e > 1]
                if len(middle) > 1:
                    self._add(Permutation(f"{s}.order", len(middle)))
                    if any(e > 1 for _, e in stage.reduced):
                        # where the inner reduction tiles go: below every middle loop ("split", the
                        # multi-level tiling) or each right below its outer tile ("whole": the
                        # reductions keep S.order's order, in the identity order the block's)
                        self._add(Categorical(f"{s}.reductions", ("split", "whole")))
                vectors = [a for a, e in stage.spatial if e > 1]
                if vectors:
                    self._add(Categorical(f"{s}.vector", tuple(vectors)))
                self._add(Discrete(f"{s}.unroll", UNROLL_LIMITS))
                self._add(Categorical(f"{s}.unroll_tile", (True, False)))
                self._add(Categorical(f"{s}.cache", ("local", "none")))
                if prod(e for _, e in stage.spatial) < 64 and any(e > 1 for _, e in stage.reduced):
                    self._add(Categorical(f"{s}.rfactor", (False, True)))
                if stage.lane_reduce and self._lane_axis(stage) is not None:
                    # partial results in vector lanes along a contiguous reduced axis (softmax over a row)
                    self._add(Categorical(f"{s}.lanes", (False, True)))
                if len(stage.consumers) == 1 and self._stage(stage.consumers[0]).kind == "reduce":
                    self._add(Categorical(f"{s}.attach", ("root", "outer")))
            elif stage.kind == "copy":
                producers = [b for b, _ in stage.reads if b in {t.name for t in self.stages}]
                # only where the inverse of its read is trusted: else TVM may write the wrong elements
                # and only where the producer has no other reader (a branching kernel's stage may have several:
                # folding one copy into the write-back would leave the others reading an unwritten buffer)
                if (
                    stage.invertible
                    and len(producers) == 1
                    and self._stage(producers[0]).kind == "reduce"
                    and len(self._stage(producers[0]).consumers) == 1
                ):
                    self._add(Categorical(f"{s}.inline", (True, False)))
            elif stage.kind == "pad":
                # materialized (a parallel, vectorized copy) or inlined (bounds checks in the reader)
                self._add(Categorical(f"{s}.inline", (False, True)))
            elif stage.elementwise:
                # a branching kernel's element-wise stage: a pass of its own, computed inside its
                # consumers (compute_inline), or folded into its producer's write-back
                choices = ["none"]
                if stage.consumers and stage.name != self.lowered.out.op.name:
                    choices.append("consumers")
                if self._inline_producer(stage) is not None:
                    choices.append("producer")
                if len(choices) > 1:
                    self._add(Categorical(f"{s}.inline", tuple(choices)))
        for tensor in self.tensors:
            if not tensor.reader or len(tensor.shape) < 1:
                continue
            t = f"layout.{tensor.name}"
            if len(tensor.shape) > 1:
                self._add(Permutation(f"{t}.perm", len(tensor.shape)))
            tiles = [f"{d}:{f}" for d, e in enumerate(tensor.shape) for f in self._layout_factors(e)]
            if tiles:
                self._add(Categorical(f"{t}.tile", ("none", *tiles)))

    def _layout_factors(self, extent: int) -> list[int]:
        """Tile factors offered for a dim: :data:`LAYOUT_FACTORS` that divide it, and the whole dim when it
        is a short vector tile of the heuristic's (28 = 16 + 8 + 4 lanes)."""
        factors = [f for f in LAYOUT_FACTORS if f > 1 and extent % f == 0]
        if extent not in factors and extent == self._vector_factor(extent):
            factors.append(extent)
        return factors

    def _tensor(self, name: str) -> _Tensor:
        return next(t for t in self.tensors if t.name == name)

    def _stage(self, name: str) -> StageBlock:
        return next(s for s in self.stages if s.name == name)

    def _lane_axis(self, stage: StageBlock) -> Axis | None:
        """The last reduced axis when every read along it is contiguous and it divides into vectors of at
        least 4 lanes (:meth:`_lane_factor`)."""
        last = next((a for a in reversed(stage.axes) if a.reduce), None)
        if last is None or last.gathers or stage.reduced[-1][0] != last.label:
            return None
        return None if self._lane_factor(self._lane_extent(stage)) == 1 else last

    def _lane_extent(self, stage: StageBlock) -> int:
        """The length of the contiguous run that lanes split: the last reduced axis, or the trailing reduced
        axes fused where every read walks them as one run (:func:`~kdsl.codegen.tvm.blocks._trailing_run`;
        a mean over H, W of 14: 196 = 49 x 4 lanes, where a row of 14 takes none)."""
        return prod(e for _, e in stage.reduced[-stage.lane_run :])

    def _lane_factor(self, extent: int) -> int:
        return next((f for f in (self.lanes, self.lanes // 2, self.lanes // 4) if f >= 4 and extent % f == 0), 1)

    def _inline_producer(self, stage: StageBlock) -> str | None:
        """The reduction stage whose write-back ``stage`` (element-wise) can be folded into: the one stage
        it reads, read one element per iteration (other buffers it reads are the kernel's inputs)."""
        produced = [b for b, _ in stage.reads if b in {t.name for t in self.stages}]
        if len(produced) != 1 or produced[0] not in stage.identity_reads:
            return None
        producer = self._stage(produced[0])
        return producer.name if producer.kind == "reduce" and len(producer.consumers) == 1 else None

    def layout_parameters(self) -> list[str]:
        """The names of the layout parameters (ALT tunes them apart from the loop parameters)."""
        return [n for n in self.parameters if n.startswith("layout.")]

    def validate(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with tuples, checked: every parameter present with a legal value, no unknown name."""
        if not isinstance(config, Mapping):
            raise LoweringError(f"a configuration is a dict, got {type(config).__name__}")
        unknown = sorted(set(config) - set(self.parameters))
        if unknown:
            raise LoweringError(f"unknown schedule parameters {unknown}")
        missing = sorted(set(self.parameters) - set(config))
        if missing:
            raise LoweringError(f"missing schedule parameters {missing}")
        return {name: param.validate(config[name]) for name, param in self.parameters.items()}

    def random(self, rng: random.Random) -> dict[str, Any]:
        """A configuration with every parameter drawn at random."""
        return {name: param.random(rng) for name, param in self.parameters.items()}

    def family(self, config: Mapping[str, Any]) -> str:
        """The structure of a configuration (its non-factor choices): outputs are checked once per family."""
        return config_key({k: v for k, v in config.items() if ".tile." not in k and not k.endswith(".tile")})

    # -- the heuristic configuration (the default schedule) ------------------------------------------

    def heuristic(self) -> dict[str, Any]:
        """The rule-based configuration that :func:`~kdsl.codegen.tvm.default_schedule.default_schedule`
        applies: a register-tiled micro-kernel per reduction stage, the shape that the hand schedules in
        ``TVM.md`` use to match PyTorch, chosen from the stage's block analysis (never its name).

        * *The vector axis* (:meth:`_vector_axis`): a spatial axis along which every data read is
          contiguous or a broadcast, tiled by one or two whole vectors (a divisor: no predicates).
        * *The register axis* (:meth:`_register_axis`): another spatial axis (a data axis if possible),
          tiled by the largest divisor that keeps at most ``accumulators`` vectors live (the machine's
          register file); in a branching kernel, none where the vector tile is a ragged short axis
          (28 = 16 + 8 + 4 lanes) under a rolled reduction (the tile's rows would start off vector
          boundaries and stay in memory).
        * Reductions stay outside the tile in the block's order (``S.reductions = "whole"``), windows of
          at most :data:`UNROLL_REDUCTION` unrolled into straight-line FMAs where they are (a longer
          reduction after them stays inside them: syno_op1 at conv5_x, whose ``c`` of 8 follows the
          unrolled ``kh, kw``, ran 15-20% slower with ``c`` moved outside them, N=8); the accumulator
          is a ``local`` tile written back once.
        * Weights that the vector axis indexes in another dim than their last are packed once per call
          to ``[v // f, <other dims>, v % f]`` (ALT-style): one tile's weights form one contiguous block.
          So are weights it indexes in their last dim when that dim is longer than the vector tile: a
          tile's slab is then a panel of rows a whole dim apart (matmul 512x1024x1024: 1024 rows 4 KiB
          apart), which the hardware prefetcher and the TLB serve badly (AVX-512, 2 threads: 7.4 ms
          unpacked, 2.9 ms packed into panels of 32, packing included; PyTorch 2.7 ms).
        * A copy of the result is folded into the write-back where its inverse is trusted.
        * A zero-padded copy is materialized only where a reader's vector axis runs along a padded dim:
          bounds checks inside the vector keep LLVM from vectorizing the read (syno_op1's first stage,
          which vectorizes ``W``: 0.35 ms with them, 0.05 ms without); elsewhere a check per broadcast
          scalar is cheaper than a pass over memory (conv2d 3x3, whose vector axis is ``Cout``)."""
        config = {name: self._identity(param) for name, param in self.parameters.items()}
        vectors: dict[str, str] = {}
        for stage in self.stages:
            s = stage.name
            if stage.kind == "copy" and f"{s}.inline" in config:
                config[f"{s}.inline"] = True
            if stage.kind != "reduce" or not stage.spatial:
                continue
            vector, vf = self._vector_axis(stage)
            if f"{s}.lanes" in config and (vector is None or vector.gathers):
                config[f"{s}.lanes"] = True  # a gathered vector (stride of a row) is slower than lanes of partials
                continue
            if vector is not None:
                vectors[s] = vector.label
                config[f"{s}.vector"] = vector.label
                config[f"{s}.tile.{vector.label}"] = (vector.extent // vf, 1, vf)
            budget = self.accumulators // max(1, vf // self.lanes)
            rolled = any(e > UNROLL_REDUCTION for _, e in stage.reduced)
            if isinstance(self.lowered.op, Graph) and vf % self.lanes and self.lanes % vf and rolled:
                # a short axis whole that is no multiple of a vector (28 = 16 + 8 + 4 lanes) under a reduction
                # loop that stays rolled: the rows of a register tile start off vector boundaries in the local
                # accumulator, which then stays in memory and is assembled lane by lane (attention's scores at
                # 8x28x28, Wk of 28 under 14 rows of Hk and a loop over d of 16, 1 thread: 57 -> 21 ms); one
                # row only. Under unrolled windows alone LLVM keeps the rows in registers (a max pool's rows
                # share their window's loads). Plain operators keep their schedules.
                budget = 1
            register, uf = self._register_axis(stage, vector, max(1, budget))
            if register is not None:
                config[f"{s}.tile.{register.label}"] = (register.extent // uf, 1, uf)
                second, sf = self._register_axis(stage, vector, budget // uf, besides=register)
                if second is not None and not isinstance(self.lowered.op, Graph):
                    # the first axis's divisors left accumulators unused (W = 14 for AVX2's budget of 4
                    # rows: a tile of 2): fill them from a second axis (conv2d 3x3 at 8x256x14x14 for
                    # AVX2, 2 threads: 14.7 ms with a 2 x 2-vector tile, 8.9 ms with 2 x 2 x 2 vectors)
                    config[f"{s}.tile.{second.label}"] = (second.extent // sf, 1, sf)
                if vector is None and f"{s}.vector" in config and config[f"{s}.vector"] == register.label:
                    # no axis vectorizes: name one whose inner tile stays 1 (apply then vectorizes nothing)
                    others = [a for a, e in stage.spatial if e > 1 and a != register.label]
                    config[f"{s}.vector"] = others[0] if others else register.label
            windows = [e for _, e in stage.reduced if 1 < e <= UNROLL_REDUCTION]
            for axis, e in stage.reduced:
                if e > 1:
                    config[f"{s}.tile.{axis}"] = (1, e) if e <= UNROLL_REDUCTION else (e, 1)
            if f"{s}.reductions" in config:
                config[f"{s}.reductions"] = "whole"
            config[f"{s}.unroll"] = next((u for u in UNROLL_LIMITS if u >= prod(windows)), UNROLL_LIMITS[-1])
            config[f"{s}.unroll_tile"] = True
            config[f"{s}.cache"] = "local"
            if vector is None:
                continue
            if isinstance(self.lowered.op, Graph):
                self._vector_last(stage, vector, config)
            panels = [(w, d) for w, d in vector.panels if self._tensor(w).shape[d] > vf]
            for weight, dim in dict.fromkeys([*vector.packs, *panels]):
                tensor = self._tensor(weight)
                tile, perm = f"{dim}:{vf}", (dim, *(d for d in range(len(tensor.shape)) if d != dim))
                if tensor.reader == s and tile in self.parameters[f"layout.{weight}.tile"].choices:
                    config[f"layout.{weight}.tile"] = tile
                    config[f"layout.{weight}.perm"] = perm  # v's tile index first: see _pack
        for stage in self.stages:
            if stage.kind == "pad":
                config[f"{stage.name}.inline"] = not any(
                    self._pad_in_vector(stage, self._stage(c), vectors.get(c)) for c in stage.consumers
                )
            if stage.elementwise and f"{stage.name}.inline" in config:
                config[f"{stage.name}.inline"] = self._elementwise_inline(stage)
        return self.validate(config)

    def _elementwise_inline(self, stage: StageBlock) -> str:
        """Where an element-wise stage goes: into its consumers when each of them reads every element
        once (recomputing it per read would multiply its cost: a Map read through a 3x3 window, a gate
        broadcast over H and W), else into its producer's write-back when that is a reduction read one
        element per iteration (a Map or Blend after a convolution costs no pass over memory), else a
        parallel, vectorized pass of its own."""
        choices = self.parameters[f"{stage.name}.inline"].choices
        size = prod(e for _, e in stage.spatial)
        readers = [self._stage(name) for name in stage.consumers]
        if "consumers" in choices and all(prod(e for _, e in c.spatial + c.reduced) <= size for c in readers):
            return "consumers"
        return "producer" if "producer" in choices else "none"

    def _vector_last(self, stage: StageBlock, vector: Axis, config: dict[str, Any]) -> None:
        """Lay out the intermediate results that ``stage`` reads with the vector axis's dim last, where a
        reduction stage made them for this reader alone: a branching kernel's data operand (a Product's
        values, made by an FC with the channel first) is else read with a gather per lane. Plain
        operators keep their layouts (their schedules are unchanged)."""
        out = self.lowered.out.op.name
        for buffer, dims in stage.reads:
            producer = next((p for p in self.stages if p.name == buffer), None)
            if producer is None or buffer == out or producer.kind != "reduce" or producer.consumers != [stage.name]:
                continue
            positions = [d for d, used in enumerate(dims) if vector.index in used]
            if len(positions) != 1 or positions[0] == len(dims) - 1 or len(dims[positions[0]]) != 1:
                continue
            moved = positions[0]
            perm = (*(d for d in range(len(dims)) if d != moved), moved)
            if f"layout.{buffer}.perm" in self.parameters:
                config[f"layout.{buffer}.perm"] = perm

    def _vector_factor(self, extent: int) -> int:
        """The vector tile of an axis: whole vectors (at most :data:`MAX_VECTORS`), else half or quarter
        vectors, else a short axis whole (28 = 16 + 8 + 4 lanes: LLVM splits it); 1 if none fits."""
        lanes = self.lanes
        candidates = (*(m * lanes for m in range(MAX_VECTORS, 0, -1)), lanes // 2, lanes // 4)
        factor = next((f for f in candidates if f >= 4 and extent % f == 0), 1)
        if factor < lanes and extent % 4 == 0 and extent <= MAX_VECTORS * lanes:
            factor = extent
        return factor

    def _vector_axis(self, stage: StageBlock) -> tuple[Axis | None, int]:
        """The axis to vectorize and its tile: contiguous data reads first, then whole vectors, then
        weight-only axes (their data reads are broadcasts that feed a whole vector of FMAs), then the
        innermost."""
        best, best_key, best_factor = None, None, 1
        for axis in stage.axes:
            factor = self._vector_factor(axis.extent) if not axis.reduce and axis.extent > 1 else 1
            if factor == 1:
                continue
            key = (axis.gathers == 0, factor >= self.lanes, axis.weight_only, axis.index)
            if isinstance(self.lowered.op, Graph):
                # a branching kernel's stage (plain operators keep their schedules): a short constant stride
                # along the last dim (a max pool's Stride of 2: 0.87 -> 0.3-0.5 ms at 64x112x112) beats a
                # gather across rows, whatever its vector width
                strided = axis.gather_stride is not None and 0 < axis.gather_stride <= MAX_GATHER_STRIDE
                key = (axis.gathers == 0, strided, *key[1:])
            if best_key is None or key > best_key:
                best, best_key, best_factor = axis, key, factor
        return best, best_factor

    def _register_axis(
        self, stage: StageBlock, vector: Axis | None, budget: int, besides: Axis | None = None
    ) -> tuple[Axis | None, int]:
        """A spatial axis for the register tile besides the vector axis (and ``besides``; a data axis if
        any), tiled to fit ``budget``."""
        candidates = [a for a in stage.axes if not a.reduce and a is not vector and a is not besides and a.extent > 1]
        if not candidates:
            return None, 1
        axis = max(candidates, key=lambda a: (not a.weight_only, largest_divisor(a.extent, budget) > 1, a.index))
        factor = largest_divisor(axis.extent, budget)
        return (axis, factor) if factor > 1 else (None, 1)

    def _pad_in_vector(self, pad: StageBlock, reader: StageBlock, vector: str | None) -> bool:
        """Whether ``reader`` indexes a padded dim of ``pad`` with its vector axis."""
        if vector is None:
            return False
        if isinstance(self.lowered.op, Graph) and reader.axis(vector).gathers:
            # a strided vector (a max pool's Stride of 2) loads element-wise anyway: bounds checks cost less
            # than a pass that pads the input (64x112x112, 1 thread: 0.63 -> 0.49 ms)
            return False
        i = reader.axis(vector).index
        return any(name == pad.name and any(i in dims[d] for d in pad.padded) for name, dims in reader.reads)

    def _identity(self, param: Parameter) -> Any:
        if isinstance(param, Factorization):
            return (param.extent,) + (1,) * (param.levels - 1)
        if isinstance(param, Permutation):
            return tuple(range(param.n))
        if param.name.endswith(".tile"):
            return "none"
        return param.choices[0]

    # -- application --------------------------------------------------------------------------------

    def apply(
        self, config: Mapping[str, Any], *, fallback: bool = False, report: list[tuple[str, str]] | None = None
    ) -> Any:
        """The ``s_tir.Schedule`` of ``config``; :class:`LoweringError` with TVM's reason if it is invalid.

        With ``fallback``, a stage whose part of the configuration fails instead gets the plain parallel
        schedule (or stays as lowered if even that fails): a schedule never changes what a stage computes,
        so a fallback is only slower. ``report``, when given, receives ``(stage, what it got)``."""
        config = self.validate(config)
        applier = _Applier(self, self.tvm.s_tir.Schedule(self.lowered.module()), config, fallback)
        try:
            applier.run()
        except LoweringError:
            raise
        except Exception as error:  # a schedule primitive refused: the configuration is invalid
            raise LoweringError(f"invalid schedule: {error_reason(error)}") from None
        if report is not None:
            report.extend(applier.report)
        return applier.sch


def _vectorize_inner(sch: Any, loop: Any, lanes: int) -> None:
    """Vectorize ``loop``: whole up to :data:`MAX_VECTORS` vectors (a short loop of 28 becomes 16 + 8 + 4
    lanes), else split by at most that (a 1024-lane vector took LLVM minutes to compile)."""
    extent = int(sch.get(loop).extent)
    if extent <= MAX_VECTORS * lanes:
        if extent > 1:
            sch.vectorize(loop)
        return
    factor = next((f for f in (MAX_VECTORS * lanes, lanes, lanes // 2, 4) if extent % f == 0), None)
    if factor is not None:
        sch.vectorize(sch.split(loop, [None, factor])[1])


def _split(sch: Any, loop: Any, factors: Sequence[int], keep_outer: bool = False) -> list[Any | None]:
    """``loop`` split by ``factors``, ``None`` at the levels of factor 1 (no unit loops in the nest) but
    the outermost if ``keep_outer`` (a spatial axis always has a loop in the fused parallel loop)."""
    levels = [i for i, f in enumerate(factors) if f > 1 or (i == 0 and keep_outer)]
    parts: list[Any | None] = [None] * len(factors)
    if len(levels) == 1:
        parts[levels[0]] = loop
    elif levels:
        for i, part in zip(levels, sch.split(loop, [factors[i] for i in levels])):
            parts[i] = part
    return parts


class _Applier:
    """Applies one validated configuration to a schedule, stage by stage."""

    def __init__(self, space: Space, sch: Any, config: dict[str, Any], fallback: bool = False) -> None:
        self.space = space
        self.sch = sch
        self.config = config
        self.fallback = fallback
        self.outer: dict[str, Any] = {}  # stage -> its fused parallel loop
        self.local: dict[str, bool] = {}
        self.report: list[tuple[str, str]] = []

    def run(self) -> None:
        space, config = self.space, self.config
        attached = [s for s in space.stages if config.get(f"{s.name}.attach") == "outer"]
        for stage in space.stages:
            self._stage(stage, attached=stage in attached)
        for stage in attached:  # at their consumer's parallel loop, once it exists
            self._guarded(stage, lambda stage=stage: self._attach(stage))

    def _stage(self, stage: StageBlock, attached: bool) -> None:
        def schedule() -> str:
            # layouts first: packing copies of what this stage reads first, its own result in place
            for tensor in self.space.tensors:
                if (tensor.kind == "intermediate" and tensor.name == stage.name) or (
                    tensor.kind != "intermediate" and tensor.reader == stage.name
                ):
                    self._layout(tensor)
            if attached:
                return "attached to its consumer"
            if stage.kind == "reduce":
                return self._reduce(stage)
            if stage.kind == "copy":
                return self._copy(stage)
            if stage.kind == "pad" and self.config[f"{stage.name}.inline"]:
                self.sch.compute_inline(self.sch.get_sblock(stage.name))
                return "inlined into its reader (bounds checks outside the vector)"
            if stage.elementwise:
                return self._elementwise(stage)
            return self._spatial(stage)

        self._guarded(stage, schedule)

    def _guarded(self, stage: StageBlock, schedule: Any) -> None:
        """Run ``schedule``; with fallbacks, on failure give the stage the plain parallel schedule."""
        if not self.fallback:
            self.report.append((stage.name, schedule()))
            return
        backup = self.sch.copy()
        try:
            self.report.append((stage.name, schedule()))
        except Exception as error:  # any failing primitive: fall back, never crash
            reason = error_reason(error) if str(error).strip() else type(error).__name__
            self.sch, backup = backup, backup.copy()
            try:
                what = self._plain(stage)
            except Exception:  # even the plain schedule failed: leave the stage as lowered
                self.sch = backup
                what = "unscheduled"
            self.report.append((stage.name, f"fallback ({reason}): {what}"))

    def _plain(self, stage: StageBlock) -> str:
        """The fallback: the outermost spatial loop parallel, when the spatial loops are outermost."""
        sch = self.sch
        block = sch.get_sblock(stage.name)
        loops = sch.get_loops(block)
        spatial = [loop for loop, axis in zip(loops, stage.axes) if not axis.reduce]
        if spatial and len(spatial) == len(stage.spatial):
            sch.parallel(spatial[0])
        return "parallel outer loop"

    def _index_map(self, tensor: _Tensor) -> Any | None:
        t = f"layout.{tensor.name}"
        perm = self.config.get(f"{t}.perm", tuple(range(len(tensor.shape))))
        tile = self.config.get(f"{t}.tile", "none")
        tiled, factor = (None, 1) if tile == "none" else (int(tile.split(":")[0]), int(tile.split(":")[1]))
        if tiled is not None and tensor.shape[tiled] == factor and perm[-1] == tiled:
            tiled = None  # the whole dim is already last
        if tiled is None and tuple(perm) == tuple(range(len(tensor.shape))):
            return None
        ndim = len(tensor.shape)

        def index_map(*idx: Any) -> tuple[Any, ...]:
            out = [idx[d] // factor if d == tiled else idx[d] for d in perm]
            if tiled is not None:
                out.append(idx[tiled] % factor)
            return tuple(out)

        return self.space.tvm.tirx.IndexMap.from_func(index_map, ndim=ndim, index_dtype="int32")

    def _layout(self, tensor: _Tensor) -> None:
        if not tensor.reader or self.config.get(f"{tensor.name}.inline") is True:
            return  # an inlined pad has no buffer of its own
        index_map = self._index_map(tensor)
        if index_map is None:
            return
        sch = self.sch
        if tensor.kind == "intermediate":
            sch.transform_layout(sch.get_sblock(tensor.name), ("write", 0), index_map)
            return
        # a packed copy (the heuristic's weights: [v // f, <other dims>, v % f], so that one register
        # tile's weights are one contiguous block; [K, N/f, f] would still stride by N between reduction
        # steps of a matmul)
        block = sch.get_sblock(tensor.reader)
        names = [region.source.name for region in sch.get(block).reads]
        pack = sch.cache_read(block, names.index(tensor.name), "global")
        sch.transform_layout(pack, ("write", 0), index_map)
        # loop over the packed copy in its own order: contiguous vector stores and gathered loads (in the
        # source's order every store lands on another cache line; conv2d conv3_x: 1.17 -> 1.08 ms)
        sch.transform_block_layout(pack, index_map)
        loops = sch.get_loops(pack)
        if len(loops) > 1:
            sch.parallel(sch.fuse(*loops[:-1]))
            _vectorize_inner(sch, loops[-1], self.space.lanes)
        elif loops:
            sch.parallel(loops[0])

    def _reduce(self, stage: StageBlock) -> str:
        """The tiled loop nest: outer spatial tiles fused and parallel (a weight-only vector axis's first,
        so that one weight slab stays in cache while every data tile passes: else a 128x128x3x3 conv
        cycles 590 KB of weights per tile), the middle loops in ``order``, the inner reduction tiles, the
        register tile innermost with the vector axis last; tiles of 1 make no loop."""
        sch, config, s = self.sch, self.config, stage.name
        block = sch.get_sblock(s)
        loops = sch.get_loops(block)
        nspatial = len(stage.spatial)
        if config.get(f"{s}.rfactor"):
            self._rfactor(stage, block, loops)
            return "rfactor: a parallel partial sum"
        if config.get(f"{s}.lanes"):
            return self._lanes(stage, block, loops)
        vector = config.get(f"{s}.vector")
        if vector is not None and config[f"{s}.tile.{vector}"][2] == 1:
            vector = None  # no vector tile: nothing to vectorize or to lay out last
        whole = config.get(f"{s}.reductions") == "whole"
        outer, r_inner, s_inner = [], [], []
        inner_axes: list[int] = []  # block iter indices of the register tile's axes, vector axis last
        vector_inner = vector_outer = None
        middle_labels = [a for a, e in stage.spatial + stage.reduced if e > 1]
        middle_loops: dict[str, list[Any]] = {}  # label -> its loops at the label's place in the order
        r_tiles: dict[int, int] = {}  # id of an inner reduction tile placed with its outer tile -> extent
        for k, (loop, (axis, extent)) in enumerate(zip(loops, stage.spatial + stage.reduced)):
            if extent == 1:  # unit loops: spatial ones fuse into the parallel loop, reductions are inner
                if k < nspatial:
                    outer.append(loop)
                else:
                    r_inner.append((loop, 1))
                continue
            factors = config[f"{s}.tile.{axis}"]
            parts = _split(sch, loop, factors, keep_outer=k < nspatial)
            if k < nspatial:
                if parts[0] is not None:
                    outer.append(parts[0])
                    if axis == vector:
                        vector_outer = parts[0]
                middle_loops[axis] = [lp for lp in parts[1:2] if lp is not None]
                if axis == vector:
                    vector_inner = parts[2]
                elif parts[2] is not None:
                    s_inner.append(parts[2])
                    inner_axes.append(k)
            else:
                middle_loops[axis] = [lp for lp in parts[:1] if lp is not None]
                if parts[1] is not None and whole:
                    middle_loops[axis].append(parts[1])
                    r_tiles[id(parts[1])] = factors[1]
                elif parts[1] is not None:
                    r_inner.append((parts[1], factors[1]))
        if vector_inner is not None:
            inner_axes.append([a for a, _ in stage.spatial].index(vector))
        order = config.get(f"{s}.order", tuple(range(len(middle_labels))))
        if vector_outer is not None and vector in stage.weight_only:
            outer.insert(0, outer.pop(next(i for i, lp in enumerate(outer) if lp.same_as(vector_outer))))
        spatial_labels = {a for a, _ in stage.spatial}
        middle = [(middle_labels[i], middle_loops[middle_labels[i]]) for i in order]
        # the accumulator's place: below the last middle spatial loop before the first reduction loop
        # (none when every spatial extent is 1, a reduction to one value: the write-back stays at the root)
        first_reduce = next((i for i, (a, _) in enumerate(middle) if a not in spatial_labels), len(middle))
        spatial_before = [lp for _, lps in middle[:first_reduce] for lp in lps]
        below = [(a, lp) for a, lps in middle[first_reduce:] for lp in lps]
        middle_nest = [*spatial_before, *(lp for _, lp in below)]
        inner = s_inner + ([vector_inner] if vector_inner is not None else [])
        ordered = [*outer, *middle_nest, *[lp for lp, _ in r_inner], *inner]
        if len(ordered) > 1:
            sch.reorder(*ordered)
        at = spatial_before[-1] if spatial_before else outer[-1] if outer else None
        if config[f"{s}.cache"] == "local":
            tile = prod(int(sch.get(lp).extent) for lp in inner)
            tile *= prod(int(sch.get(lp).extent) for a, lp in below if a in spatial_labels)
            if tile > MAX_LOCAL:
                raise LoweringError(f"{s}: a local accumulator of {tile} elements (more than {MAX_LOCAL})")
            self._check_layout_tile(stage, [a for a, _ in below])
            writeback = sch.cache_write(block, 0, "local")
            if at is not None:
                sch.reverse_compute_at(writeback, at)
            self._tile_last(block, inner_axes)
            if vector_inner is not None and stage.spatial[-1][0] == vector:
                # with a short reduction (a depthwise window) the write-back costs as much as the FMAs
                _vectorize_inner(sch, sch.get_loops(writeback)[-1], self.space.lanes)
            self.local[s] = True
        # vectorize and parallelize before decompose_reduction: afterwards the update block is no longer
        # a complete reduction block under the tile loops and both refuse it
        if vector_inner is not None:
            sch.vectorize(vector_inner)
        unrolled = 1
        if config[f"{s}.unroll_tile"]:
            # fully unrolled register tiles only: a larger unrolled body compiles for minutes
            tile = prod(int(sch.get(lp).extent) for lp in s_inner)
            if tile <= MAX_UNROLLED_TILE:
                unrolled = tile
                for lp in s_inner:
                    sch.unroll(lp)
        budget = min(config[f"{s}.unroll"], max(1, 1024 // unrolled))
        # the inner reduction tiles in nest order, wherever S.reductions put them (a long reduction
        # between two of them is not unrolled: the budget counts only these)
        unrollable = [(lp, r_tiles[id(lp)]) for _, lp in below if id(lp) in r_tiles] + r_inner
        for lp, extent in reversed(unrollable):
            if extent <= budget:
                sch.unroll(lp)
                budget //= extent
            else:
                break
        if outer:  # else a serial reduction to one value (rfactor parallelizes it)
            fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
            sch.parallel(fused)
            self.outer[s] = fused
        reductions = [*(lp for a, lp in below if a not in spatial_labels), *(p for p, _ in r_inner)]
        if reductions:
            init = sch.decompose_reduction(block, reductions[0])
            init_loops = sch.get_loops(init)
            if vector_inner is not None and init_loops:
                sch.vectorize(init_loops[-1])
        tile_shape = "x".join(str(int(sch.get(lp).extent)) for lp in reversed(inner)) or "1"
        packed = sum(
            1 for t in self.space.tensors if t.reader == s and config.get(f"layout.{t.name}.tile", "none") != "none"
        )
        return f"register tile {tile_shape} (vector axis {vector}), packed {packed}"

    def _check_layout_tile(self, stage: StageBlock, below: Sequence[str]) -> None:
        """Refuse a local accumulator whose tile is not a box of the stage's tiled layout.

        The write-back is ``reverse_compute_at`` the tile; TVM relaxes the tile's region in the layout
        ``[.., v // f, .., v % f]`` to a covering box. A tile of ``t`` elements along ``v`` is exactly a
        box when ``f`` divides ``t`` or ``t`` divides ``f``; otherwise the box also holds elements this tile
        has not computed, and the write-back copies them from the uninitialised accumulator, racing with
        the tile that does compute them (``stage0.tile.H = (2, 1, 6)`` with ``layout.stage0.tile = "0:4"``
        gave wrong outputs). ``below`` names the middle loops under the accumulator's place."""
        tile = self.config.get(f"layout.{stage.name}.tile", "none")
        if tile == "none":
            return
        dim, factor = (int(part) for part in tile.split(":"))
        axis, extent = stage.spatial[dim]
        if extent == 1:
            return
        _, middle_factor, inner_factor = self.config[f"{stage.name}.tile.{axis}"]
        t = inner_factor * (middle_factor if axis in below else 1)
        if t % factor and factor % t:
            raise LoweringError(
                f"{stage.name}: its local accumulator holds {t} elements of {axis}, which do not align with the "
                f"layout tile {factor} of {stage.name} (the write-back would copy elements not yet computed)"
            )

    def _tile_last(self, block: Any, indices: Sequence[int]) -> None:
        """Lay the local accumulator out with the buffer dims of the register tile's axes (block iters
        ``indices``, the vector axis last) innermost: a local tile whose vectorized axis is not innermost
        stays in memory and runs ~35x slower (4.6 vs 168 GFLOP/s in ``TVM.md``)."""
        sch, tirx = self.sch, self.space.tvm.tirx
        node = sch.get(block)
        region = node.writes[0].region
        uses: list[int] = []
        for index in indices:
            var = node.iter_vars[index].var
            for d, rng in enumerate(region):
                if d not in uses and any(v.same_as(var) for v in tirx.analysis.undefined_vars(rng.min)):
                    uses.append(d)
        order = [d for d in range(len(region)) if d not in uses] + uses
        if order != list(range(len(region))):
            index_map = tirx.IndexMap.from_func(lambda *idx: tuple(idx[p] for p in order), ndim=len(order))
            sch.transform_layout(block, ("write", 0), index_map)

    def _rfactor(self, stage: StageBlock, block: Any, loops: list[Any]) -> None:
        sch, s = self.sch, stage.name
        nspatial = len(stage.spatial)
        reduce_loops = loops[nspatial:]
        axis = next(a for a, e in stage.reduced if e > 1)
        k = [a for a, _ in stage.reduced].index(axis)
        factors = self.config[f"{s}.tile.{axis}"]
        outer_r, inner_r = sch.split(reduce_loops[k], list(factors))
        rest = [lp for i, lp in enumerate(reduce_loops) if i != k]
        sch.reorder(outer_r, *loops[:nspatial], *rest, inner_r)
        rf = sch.rfactor(outer_r, 0)
        sch.parallel(sch.get_loops(rf)[0])

    def _lanes(self, stage: StageBlock, block: Any, loops: list[Any]) -> str:
        """The last reduced axis split by the vector width and rfactored: a block of partial results, one
        per lane, vectorized along the contiguous axis, then a short reduction of the lanes (a row max or
        sum of a softmax, which a vector across rows would gather with the row's stride)."""
        sch = self.sch
        lanes = self.space._lane_factor(self.space._lane_extent(stage))
        nspatial = len(stage.spatial)
        spatial, reduce = loops[:nspatial], loops[nspatial:]
        run = reduce[-1] if stage.lane_run == 1 else sch.fuse(*reduce[-stage.lane_run :])
        _, inner = sch.split(run, [None, lanes])
        rf = sch.rfactor(inner, nspatial)
        sch.parallel(sch.fuse(*spatial) if len(spatial) > 1 else spatial[0])  # the lanes' reduction
        # the partial results have loops of their own: their spatial loops parallel too (else the whole
        # reduction runs on one thread: a global max pool took as long on 2 threads as on 1)
        rf_loops = sch.get_loops(rf)
        rf_spatial = sch.fuse(*rf_loops[:nspatial]) if nspatial > 1 else rf_loops[0]
        sch.parallel(rf_spatial)
        rf_loops = sch.get_loops(rf)
        sch.vectorize(rf_loops[-1])
        init = sch.decompose_reduction(rf, rf_loops[1])
        sch.vectorize(sch.get_loops(init)[-1])
        along = ", ".join(a for a, _ in stage.reduced[-stage.lane_run :])
        return f"lanes: {lanes} partial results along {along}"

    def _copy(self, stage: StageBlock) -> str:
        """A copy of a tiled stage's result folds into that stage's write-back (saving a pass over
        memory: conv2d's transposition to ``[N, Cout, H, W]`` costs nothing), else it is a pass of its own."""
        sch, s = self.sch, stage.name
        block = sch.get_sblock(s)
        if self.config.get(f"{s}.inline"):
            producer = next(b for b, _ in stage.reads if b in {t.name for t in self.space.stages})
            if not self.local.get(producer):
                raise LoweringError(f"{s}: inlining the copy needs a local accumulator in {producer}")
            sch.reverse_compute_inline(block)
            return f"inlined into {producer}_local"
        return self._spatial(stage)

    def _elementwise(self, stage: StageBlock) -> str:
        """A branching kernel's element-wise stage: inlined as ``S.inline`` says, else a pass of its own."""
        sch, s = self.sch, stage.name
        where = self.config.get(f"{s}.inline", "none")
        if where == "consumers":
            sch.compute_inline(sch.get_sblock(s))
            return f"inlined into {', '.join(stage.consumers)}"
        if where == "producer":
            producer = self.space._inline_producer(stage)
            if producer is None or not self.local.get(producer):
                raise LoweringError(f"{s}: folding into the write-back needs a local accumulator in {producer}")
            sch.reverse_compute_inline(sch.get_sblock(s))
            return f"inlined into {producer}'s write-back"
        loops = sch.get_loops(sch.get_sblock(s))
        last, lanes = int(sch.get(loops[-1]).extent), self.space.lanes
        tail = self._contiguous_tail(stage) if last % lanes else 1
        if len(loops) > tail > 1:
            # trailing loops that every access walks contiguously (or not at all: a gate per channel) fuse
            # into one run of whole vectors (SE's gate at 8x256x14x14, 1 thread: 0.40 -> 0.19 ms, where a
            # row of 14 took no vector); a short run is vectorized whole (49 = 3 x 16 + 1 lanes)
            extent = prod(int(sch.get(lp).extent) for lp in loops[-tail:])
            factor = next((f for f in (2 * lanes, lanes) if extent % f == 0), 0)
            factor = factor or (
                extent if extent <= 4 * lanes else next((f for f in (lanes // 2, 4) if extent % f == 0), 1)
            )
            if factor > 1:
                fused = sch.fuse(*loops[-tail:])
                outer, inner = sch.split(fused, [None, factor])
                sch.parallel(sch.fuse(*loops[:-tail], outer))
                sch.vectorize(inner)
                return f"parallel, vector {factor} over {tail} fused loops"
        if (
            len(loops) > 1
            and not stage.axes[-1].gathers
            and last % 4 == 0
            and self.space.lanes < last <= 4 * self.space.lanes
        ):
            # a short row whole (56 = 3 x 16 + 8 lanes): the polynomial forms of exp, sin, .. are compute-bound, and
            # 16 lanes run them faster than the 8 that divide 56 (Map("exp") at 64x56x56, 1 thread: 60 -> 43 us)
            sch.parallel(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])
            sch.vectorize(loops[-1])
            return f"parallel, vector {last}"
        return self._spatial(stage)

    def _contiguous_tail(self, stage: StageBlock) -> int:
        """The most trailing block axes (at least 1) that every buffer access (the write and each read)
        either indexes as its own trailing dims, in order and whole, or does not index at all (a
        broadcast): fused into one loop, they walk every buffer contiguously."""
        tirx = self.space.tvm.tirx
        node = self.sch.get(self.sch.get_sblock(stage.name))
        ivars = [iv.var for iv in node.iter_vars]
        extents = [int(iv.dom.extent) for iv in node.iter_vars]
        accesses = []
        for region in [*node.reads, *node.writes]:
            mins = [rng.min for rng in region.region]
            uses = [
                {k for k, w in enumerate(ivars) if any(v.same_as(w) for v in tirx.analysis.undefined_vars(m))}
                for m in mins
            ]
            accesses.append((mins, uses, [int(d) for d in region.source.shape]))

        def fits(m: int) -> bool:
            tail = set(range(len(ivars) - m, len(ivars)))
            for mins, uses, shape in accesses:
                if not any(u & tail for u in uses):
                    continue  # a broadcast along the whole tail
                if len(mins) < m or any(u & tail for u in uses[: len(mins) - m]):
                    return False
                for t in range(1, m + 1):
                    k, d = len(ivars) - t, len(mins) - t
                    if not (isinstance(mins[d], tirx.Var) and mins[d].same_as(ivars[k]) and shape[d] == extents[k]):
                        return False
            return True

        return next((m for m in range(len(ivars), 1, -1) if fits(m)), 1)

    def _spatial(self, stage: StageBlock) -> str:
        """Copies, element-wise stages and materialized pads: the outer loops fused and parallel, the
        innermost vectorized when its extent divides into vectors and every read is contiguous along it
        (a gathered vector, as in pixel_shuffle's ``x[.., w // 2]``, is left to LLVM as scalars)."""
        sch, lanes = self.sch, self.space.lanes
        loops = sch.get_loops(sch.get_sblock(stage.name))
        last = int(sch.get(loops[-1]).extent)
        factor = next((f for f in (lanes, lanes // 2, lanes // 4) if f >= 4 and last % f == 0), 1)
        if stage.axes[-1].gathers:
            factor = 1
        outer = list(loops[:-1])
        if factor > 1:
            lo, vi = sch.split(loops[-1], [None, factor])
            outer.append(lo)
            sch.vectorize(vi)
        elif not outer:
            outer = list(loops)
        if outer:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
        return f"parallel, vector {factor}"

    def _attach(self, stage: StageBlock) -> str:
        sch = self.sch
        consumer = stage.consumers[0]
        if consumer not in self.outer:
            raise LoweringError(f"{stage.name}: its consumer {consumer} has no parallel loop to attach to")
        block = sch.get_sblock(stage.name)
        sch.compute_at(block, self.outer[consumer], preserve_unit_loops=True)
        own = sch.get_loops(block)[1:]
        n_spatial = sum(1 for iv in sch.get(block).iter_vars if int(iv.iter_type) == 0)
        spatial, reduce = own[:n_spatial], own[n_spatial:]
        if not reduce and spatial:
            _vectorize_inner(sch, spatial[-1], self.space.lanes)
        return f"computed at {consumer}'s parallel loop"


# ------------------------------------------------------------------------------------------------
# Helpers for the tuners
# ------------------------------------------------------------------------------------------------


def neighbours(space: Space, config: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every configuration one parameter step away from ``config``."""
    for name, param in space.parameters.items():
        for value in param.neighbours(config[name]):
            yield {**config, name: value}
