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

The space of one operator (per TE stage ``S``, built from the stage's loops, never its name):

* reduction stages get a three-level tiling ``S.tile.<axis>`` = (outer, middle, inner) of every spatial
  axis and ``(outer, inner)`` of every reduction axis; outer spatial tiles are fused and parallel;
  ``S.order`` permutes the middle loops (middle spatial tiles and outer reduction tiles); then come the
  inner reduction tiles and the inner spatial tiles, the vector axis ``S.vector`` innermost and vectorized;
  ``S.unroll`` bounds the unrolled inner reduction loops, ``S.unroll_tile`` unrolls the register tile;
  ``S.cache`` accumulates in a ``local`` tile (laid out vector axis last) written back once, or in place;
  ``S.rfactor`` (stages with little spatial parallelism) splits the outer reduction into a parallel
  partial sum; ``S.attach`` computes a producer stage at its consumer's parallel loop;
* copy stages: ``S.inline`` folds the copy into its producer's write-back;
* zero-padded copies (``padN``, the lowering's stage for each windowed read): ``S.inline`` puts the bounds
  checks back into the reader, else the copy is a parallel, vectorized pass of its own;
* layouts (ALT): every input, weight and intermediate tensor ``T`` has ``layout.T.perm`` (an order of
  its dims) and ``layout.T.tile`` (``"d:f"``: dim ``d`` tiled by ``f``, the tile moved last, ALT's
  ``tiled channel last``; only factors that divide are offered); inputs and weights are packed by
  ``cache_read`` + ``transform_layout`` (the signature stays), intermediates are transformed in place.
  The output's layout is the signature's.

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
from dataclasses import dataclass, field
from math import prod
from typing import Any

from kdsl.codegen.tvm.lowering import error_reason, invertible_copy, load_tvm
from kdsl.lang.errors import LoweringError

#: The space's version: stored with every tuning record (a new version never reuses old records).
VERSION = "tvm-space-3"  # 3: copies folded only where the inverse is trusted, size-1 fixes
#: Vector lanes of fp32 on AVX-512.
LANES = 16
#: Most elements in a local accumulator tile (larger tiles are rejected: they live in memory anyway).
MAX_LOCAL = 8192
#: Layout tile factors offered (ALT's template: tile one dim, move the tile last).
LAYOUT_FACTORS = (1, 4, 8, 16, 32, 64)
#: Most iterations of an unrolled register tile (outside its vector loop).
MAX_UNROLLED_TILE = 64
#: Bounds on the product of unrolled inner reduction loops.
UNROLL_LIMITS = (1, 4, 16, 64, 256)


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
class _Stage:
    name: str
    kind: str  # "reduce", "spatial" (element-wise), "copy" or "pad" (a zero-padded copy for windows)
    spatial: list[tuple[str, int]]  # (axis label, extent), block iter order
    reduced: list[tuple[str, int]]
    weight_only: set[str]
    reads: list[tuple[str, list[set[int]]]]  # (buffer name, per buffer dim: the block iter indices used)
    consumers: list[str] = field(default_factory=list)
    padded: tuple[int, ...] = ()  # a pad stage's padded dims
    invertible: bool = False  # a copy that reverse_compute_inline folds correctly (tvm.invertible_copy)


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    kind: str  # "input", "weight" or "intermediate"
    reader: str  # the first stage that reads it (or the producer's name, for intermediates)


def _label(names: Sequence[str]) -> list[str]:
    """Unique labels for axes (dim names may repeat)."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}{seen[name]}")
    return out


class Space:
    """The schedule space of one lowered operator (:func:`kdsl.codegen.tvm.lowering`)."""

    def __init__(self, lowered: Any) -> None:
        tvm = load_tvm()
        self.lowered = lowered
        self.tvm = tvm
        module = lowered.module()
        sch = tvm.s_tir.Schedule(module)
        self.stages: list[_Stage] = []
        self.tensors: list[_Tensor] = []
        params = [w.name for w in lowered.weights]
        read_first: dict[str, str] = {}
        for info in lowered.stages:
            block = sch.get_sblock(info.name)
            node = sch.get(block)
            ivars = [iv.var for iv in node.iter_vars]
            spatial_ix = [i for i, iv in enumerate(node.iter_vars) if int(iv.iter_type) == 0]
            reduce_ix = [i for i, iv in enumerate(node.iter_vars) if int(iv.iter_type) != 0]
            labels = _label([*info.spatial, *info.reduced])
            extents = [int(iv.dom.extent) for iv in node.iter_vars]
            spatial = [(labels[k], extents[i]) for k, i in enumerate(spatial_ix)]
            reduced = [(labels[len(spatial_ix) + k], extents[i]) for k, i in enumerate(reduce_ix)]
            reads = []
            for region in node.reads:
                dims = []
                for rng in region.region:
                    used = tvm.tirx.analysis.undefined_vars(rng.min)
                    dims.append({i for i, v in enumerate(ivars) if any(v.same_as(u) for u in used)})
                reads.append((region.source.name, dims))
                read_first.setdefault(region.source.name, info.name)
            kind = "pad" if info.is_pad else "copy" if info.is_copy else ("reduce" if reduce_ix else "spatial")
            weight_only = {labels[k] for k, d in enumerate(info.spatial) if d in info.weight_only}
            invertible = kind == "copy" and invertible_copy(node)
            self.stages.append(
                _Stage(info.name, kind, spatial, reduced, weight_only, reads, padded=info.padded, invertible=invertible)
            )
        names = {s.name for s in self.stages}
        for stage in self.stages:
            for buffer, _ in stage.reads:
                if buffer in names:
                    producer = next(s for s in self.stages if s.name == buffer)
                    producer.consumers.append(stage.name)
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
                vectors = [a for a, e in stage.spatial if e > 1]
                if vectors:
                    self._add(Categorical(f"{s}.vector", tuple(vectors)))
                self._add(Discrete(f"{s}.unroll", UNROLL_LIMITS))
                self._add(Categorical(f"{s}.unroll_tile", (True, False)))
                self._add(Categorical(f"{s}.cache", ("local", "none")))
                if prod(e for _, e in stage.spatial) < 64 and any(e > 1 for _, e in stage.reduced):
                    self._add(Categorical(f"{s}.rfactor", (False, True)))
                if len(stage.consumers) == 1 and self._stage(stage.consumers[0]).kind == "reduce":
                    self._add(Categorical(f"{s}.attach", ("root", "outer")))
            elif stage.kind == "copy":
                producers = [b for b, _ in stage.reads if b in {t.name for t in self.stages}]
                # only where the inverse of its read is trusted: else TVM may write the wrong elements
                if stage.invertible and len(producers) == 1 and self._stage(producers[0]).kind == "reduce":
                    self._add(Categorical(f"{s}.inline", (True, False)))
            elif stage.kind == "pad":
                # materialized (a parallel, vectorized copy) or inlined (bounds checks in the reader)
                self._add(Categorical(f"{s}.inline", (False, True)))
        for tensor in self.tensors:
            if not tensor.reader or len(tensor.shape) < 1:
                continue
            t = f"layout.{tensor.name}"
            if len(tensor.shape) > 1:
                self._add(Permutation(f"{t}.perm", len(tensor.shape)))
            tiles = [f"{d}:{f}" for d, e in enumerate(tensor.shape) for f in LAYOUT_FACTORS if f > 1 and e % f == 0]
            if tiles:
                self._add(Categorical(f"{t}.tile", ("none", *tiles)))

    def _stage(self, name: str) -> _Stage:
        return next(s for s in self.stages if s.name == name)

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

    # -- a heuristic starting point ------------------------------------------------------------------

    def heuristic(self) -> dict[str, Any]:
        """A register-tiled configuration in the spirit of the default schedule: an axis along which the
        data reads are contiguous or broadcast vectorized by up to 32 lanes, other axes in registers,
        reductions outside the tile, local accumulator, weights packed along the vector axis, copies
        folded into the write-back, and a zero-padded copy materialized only where its bounds checks
        would fall inside the vector (a check per lane keeps LLVM from vectorizing the read)."""
        config = {name: self._identity(param) for name, param in self.parameters.items()}
        vectors: dict[str, str] = {}
        for stage in self.stages:
            s = stage.name
            if stage.kind == "copy" and f"{s}.inline" in config:
                config[f"{s}.inline"] = True
            if stage.kind != "reduce":
                continue
            spatial = [(a, e) for a, e in stage.spatial if e > 1]
            if not spatial:
                continue
            vector = self._preferred_vector(stage)
            vectors[s] = vector
            config[f"{s}.vector"] = vector
            extent = dict(spatial)[vector]
            vf = next((f for f in (2 * LANES, LANES, LANES // 2) if extent % f == 0), None)
            if vf is None:  # a short axis: all of it (LLVM splits an odd width into whole vectors)
                vf = extent if extent <= 2 * LANES and extent % 4 == 0 else 4 if extent % 4 == 0 else 1
            config[f"{s}.tile.{vector}"] = (extent // vf, 1, vf)
            budget = max(1, 16 // max(1, -(-vf // LANES)))
            others = [(a, e) for a, e in spatial if a != vector]
            data = [(a, e) for a, e in others if a not in stage.weight_only]
            weight = [(a, e) for a, e in others if a in stage.weight_only]
            for axis, e in [*reversed(weight), *reversed(data)]:
                uf = max(d for d in range(1, min(e, budget) + 1) if e % d == 0)
                if uf > 1:
                    config[f"{s}.tile.{axis}"] = (e // uf, 1, uf)
                    budget //= uf
            for axis, e in stage.reduced:
                if e > 1:
                    config[f"{s}.tile.{axis}"] = (1, e) if e <= 4 else (e, 1)
            config[f"{s}.unroll"] = 16
            config[f"{s}.cache"] = "local"
            for tensor in self.tensors:
                if tensor.kind == "weight" and tensor.reader == s:
                    dim = self._dim_of(stage, tensor.name, vector)
                    choice = f"{dim}:{vf}"
                    param = self.parameters.get(f"layout.{tensor.name}.tile")
                    if dim is not None and dim != len(tensor.shape) - 1 and param and choice in param.choices:
                        config[f"layout.{tensor.name}.tile"] = choice
        for stage in self.stages:
            if stage.kind == "pad":
                config[f"{stage.name}.inline"] = not any(
                    self._pad_in_vector(stage, self._stage(c), vectors.get(c)) for c in stage.consumers
                )
        return self.validate(config)

    def _pad_in_vector(self, pad: _Stage, reader: _Stage, vector: str | None) -> bool:
        """Whether ``reader`` indexes a padded dim of ``pad`` with its vector axis."""
        if vector is None:
            return False
        i = [a for a, _ in reader.spatial].index(vector)
        return any(name == pad.name and any(i in dims[d] for d in pad.padded) for name, dims in reader.reads)

    def _identity(self, param: Parameter) -> Any:
        if isinstance(param, Factorization):
            return (param.extent,) + (1,) * (param.levels - 1)
        if isinstance(param, Permutation):
            return tuple(range(param.n))
        if param.name.endswith(".tile"):
            return "none"
        return param.choices[0]

    def _preferred_vector(self, stage: _Stage) -> str:
        """A weight-only axis (data reads are broadcasts), else one that is the last dim of every read."""
        spatial = [(a, e) for a, e in stage.spatial if e > 1]
        labels = [a for a, _ in stage.spatial]

        weights = {t.name for t in self.tensors if t.kind == "weight"}

        def score(item: tuple[str, int]) -> tuple[bool, bool, int, bool, int]:
            axis, extent = item
            i = labels.index(axis)
            # data reads must be contiguous (or broadcast) along it: weights get packed, data does not
            contiguous = all(not any(i in d for d in dims[:-1]) for name, dims in stage.reads if name not in weights)
            return (contiguous, extent % LANES == 0, min(extent, LANES), axis in stage.weight_only, i)

        return max(spatial, key=score)[0]

    def _dim_of(self, stage: _Stage, buffer: str, axis: str) -> int | None:
        labels = [a for a, _ in stage.spatial]
        i = labels.index(axis)
        for name, dims in stage.reads:
            if name == buffer:
                hits = [d for d, used in enumerate(dims) if used == {i}]
                return hits[0] if hits else None
        return None

    # -- application --------------------------------------------------------------------------------

    def apply(self, config: Mapping[str, Any]) -> Any:
        """The ``s_tir.Schedule`` of ``config``; :class:`LoweringError` with TVM's reason if it is invalid."""
        config = self.validate(config)
        tvm = self.tvm
        sch = tvm.s_tir.Schedule(self.lowered.module())
        try:
            _Applier(self, sch, config).run()
        except LoweringError:
            raise
        except Exception as error:  # a schedule primitive refused: the configuration is invalid
            raise LoweringError(f"invalid schedule: {error_reason(error)}") from None
        return sch


def _vectorize_inner(sch: Any, loop: Any) -> None:
    """Vectorize ``loop`` by at most two vectors (a 1024-lane vector took LLVM minutes to compile)."""
    extent = int(sch.get(loop).extent)
    factor = next((f for f in (2 * LANES, LANES, LANES // 2, 4) if extent % f == 0), None)
    if factor is None:
        return
    if factor < extent:
        loop = sch.split(loop, [None, factor])[1]
    sch.vectorize(loop)


class _Applier:
    """Applies one validated configuration to a schedule, stage by stage."""

    def __init__(self, space: Space, sch: Any, config: dict[str, Any]) -> None:
        self.space = space
        self.sch = sch
        self.config = config
        self.outer: dict[str, Any] = {}  # stage -> its fused parallel loop
        self.local: dict[str, bool] = {}

    def run(self) -> None:
        space, sch, config = self.space, self.sch, self.config
        # layouts first: packing copies of inputs and weights, in-place maps of intermediates
        for tensor in space.tensors:
            self._layout(tensor)
        for stage in space.stages:
            if config.get(f"{stage.name}.attach") == "outer":
                continue  # scheduled where it is attached, below
            if stage.kind == "reduce":
                self._reduce(stage)
            elif stage.kind == "copy":
                self._copy(stage)
            elif stage.kind == "pad" and config[f"{stage.name}.inline"]:
                sch.compute_inline(sch.get_sblock(stage.name))
            else:
                self._spatial(sch.get_sblock(stage.name))
        for stage in space.stages:
            if config.get(f"{stage.name}.attach") == "outer":
                self._attach(stage)

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
            _vectorize_inner(sch, loops[-1])
        elif loops:
            sch.parallel(loops[0])

    def _reduce(self, stage: _Stage) -> None:
        sch, config, s = self.sch, self.config, stage.name
        block = sch.get_sblock(s)
        loops = sch.get_loops(block)
        nspatial = len(stage.spatial)
        if config.get(f"{s}.rfactor"):
            self._rfactor(stage, block, loops)
            return
        vector = config.get(f"{s}.vector")
        outer, middle, r_inner, s_inner = [], [], [], []
        vector_inner = None
        middle_labels = [a for a, e in stage.spatial + stage.reduced if e > 1]
        middle_loops: dict[str, Any] = {}
        for k, (loop, (axis, extent)) in enumerate(zip(loops, stage.spatial + stage.reduced)):
            if extent == 1:
                continue
            factors = config[f"{s}.tile.{axis}"]
            parts = sch.split(loop, list(factors))
            if k < nspatial:
                outer.append(parts[0])
                middle_loops[axis] = parts[1]
                if axis == vector:
                    vector_inner = parts[2]
                else:
                    s_inner.append(parts[2])
            else:
                middle_loops[axis] = parts[0]
                r_inner.append((parts[1], factors[1]))
        order = config.get(f"{s}.order", tuple(range(len(middle_labels))))
        middle = [middle_loops[middle_labels[i]] for i in order]
        # weight-only axes outermost: one weight slab stays in cache while data tiles pass
        weight_first = [
            lp for lp, (a, e) in zip(outer, [x for x in stage.spatial if x[1] > 1]) if a in stage.weight_only
        ]
        outer = weight_first + [lp for lp in outer if lp not in weight_first]
        inner = s_inner + ([vector_inner] if vector_inner is not None else [])
        ordered = [*outer, *middle, *[lp for lp, _ in r_inner], *inner]
        if len(ordered) > 1:
            sch.reorder(*ordered)
        # the accumulator's place: below the last middle spatial loop before the first reduction loop
        # (none when every spatial extent is 1, a reduction to one value: the write-back stays at the root)
        first_reduce = next((i for i, k in enumerate(order) if k >= sum(1 for _, e in stage.spatial if e > 1)), None)
        spatial_before = middle[:first_reduce] if first_reduce is not None else middle
        at = spatial_before[-1] if spatial_before else outer[-1] if outer else None
        if config[f"{s}.cache"] == "local":
            below = middle[len(spatial_before) :]
            spatial_labels = {a for a, _ in stage.spatial}
            tile = prod(int(sch.get(lp).extent) for lp in inner)
            for lp, idx in zip(below, order[len(spatial_before) :]):
                if middle_labels[idx] in spatial_labels:
                    tile *= int(sch.get(lp).extent)
            if tile > MAX_LOCAL:
                raise LoweringError(f"{s}: a local accumulator of {tile} elements (more than {MAX_LOCAL})")
            self._check_layout_tile(stage, [middle_labels[i] for i in order[len(spatial_before) :]])
            writeback = sch.cache_write(block, 0, "local")
            if at is not None:
                sch.reverse_compute_at(writeback, at)
            if vector is not None:
                self._vector_last(block, [a for a, _ in stage.spatial].index(vector))
            self.local[s] = True
        if vector_inner is not None and int(sch.get(vector_inner).extent) > 1:
            sch.vectorize(vector_inner)
        unrolled = 1
        if config[f"{s}.unroll_tile"]:
            # fully unrolled register tiles only: a larger unrolled body compiles for minutes
            tile = prod(int(sch.get(lp).extent) for lp in s_inner)
            if tile <= MAX_UNROLLED_TILE:
                unrolled = tile
                for lp in s_inner:
                    if int(sch.get(lp).extent) > 1:
                        sch.unroll(lp)
        budget = min(config[f"{s}.unroll"], max(1, 1024 // unrolled))
        for lp, extent in reversed(r_inner):
            if extent > 1 and extent <= budget:
                sch.unroll(lp)
                budget //= extent
            elif extent > 1:
                break
        if outer:  # else a serial reduction to one value, as in the default schedule (rfactor parallelizes it)
            fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
            sch.parallel(fused)
            self.outer[s] = fused
        reduce_loops = [middle_loops[a] for a, e in stage.reduced if e > 1]
        if reduce_loops:
            first = next(lp for lp in [*middle, *[p for p, _ in r_inner]] if any(lp.same_as(r) for r in reduce_loops))
            init = sch.decompose_reduction(block, first)
            init_loops = sch.get_loops(init)
            if vector_inner is not None and init_loops and int(sch.get(init_loops[-1]).extent) > 1:
                sch.vectorize(init_loops[-1])

    def _check_layout_tile(self, stage: _Stage, below: Sequence[str]) -> None:
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

    def _vector_last(self, block: Any, index: int) -> None:
        """Lay the local accumulator out with the buffer dims that block iter ``index`` (the vector axis)
        indexes last: a local tile whose vectorized axis is not innermost stays in memory (``TVM.md``)."""
        sch, tirx = self.sch, self.space.tvm.tirx
        node = sch.get(block)
        var = node.iter_vars[index].var
        region = node.writes[0].region
        uses = [d for d, rng in enumerate(region) if any(v.same_as(var) for v in tirx.analysis.undefined_vars(rng.min))]
        order = [d for d in range(len(region)) if d not in uses] + uses
        if order != list(range(len(region))):
            index_map = tirx.IndexMap.from_func(lambda *idx: tuple(idx[p] for p in order), ndim=len(order))
            sch.transform_layout(block, ("write", 0), index_map)

    def _rfactor(self, stage: _Stage, block: Any, loops: list[Any]) -> None:
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

    def _copy(self, stage: _Stage) -> None:
        sch, s = self.sch, stage.name
        block = sch.get_sblock(s)
        if self.config.get(f"{s}.inline"):
            producer = next(b for b, _ in stage.reads if b in {t.name for t in self.space.stages})
            if not self.local.get(producer):
                raise LoweringError(f"{s}: inlining the copy needs a local accumulator in {producer}")
            sch.reverse_compute_inline(block)
            return
        self._spatial(block)

    def _spatial(self, block: Any) -> None:
        sch = self.sch
        loops = sch.get_loops(block)
        last = int(sch.get(loops[-1]).extent)
        factor = next((f for f in (LANES, LANES // 2, 4) if last % f == 0), 1)
        outer = list(loops[:-1])
        if factor > 1:
            lo, vi = sch.split(loops[-1], [None, factor])
            outer.append(lo)
            sch.vectorize(vi)
        elif not outer:
            outer = list(loops)
        if outer:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])

    def _attach(self, stage: _Stage) -> None:
        sch = self.sch
        consumer = stage.consumers[0]
        if consumer not in self.outer:
            raise LoweringError(f"{stage.name}: its consumer {consumer} has no parallel loop to attach to")
        block = sch.get_sblock(stage.name)
        sch.compute_at(block, self.outer[consumer], preserve_unit_loops=True)
        own = sch.get_loops(block)[1:]
        n_spatial = sum(1 for iv in sch.get(block).iter_vars if int(iv.iter_type) == 0)
        spatial, reduce = own[:n_spatial], own[n_spatial:]
        if reduce or not spatial:
            return
        _vectorize_inner(sch, spatial[-1])


# ------------------------------------------------------------------------------------------------
# Helpers for the tuners
# ------------------------------------------------------------------------------------------------


def neighbours(space: Space, config: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every configuration one parameter step away from ``config``."""
    for name, param in space.parameters.items():
        for value in param.neighbours(config[name]):
            yield {**config, name: value}
