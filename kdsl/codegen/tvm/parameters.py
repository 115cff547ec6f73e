"""Typed schedule parameters, OpEvo's q-random walk over them, and configuration keys.

A schedule space (:class:`kdsl.codegen.tvm.schedule_space.ScheduleSpace`) is a ``dict`` of named parameters.
Parameters have one of four types, each with a neighbour relation (the topology OpEvo's mutation walks):

* :class:`Factorization` -- a tuple of factors whose product is a loop's extent; neighbours move one
  prime factor from one slot to another.
* :class:`Permutation` -- a loop order; neighbours differ by one swap.
* :class:`Discrete` -- ordered values; neighbours are the adjacent values.
* :class:`Categorical` -- unordered values; every other value is a neighbour.

:func:`q_random_walk` is OpEvo's mutation of one parameter, :func:`q_walk_distribution` its exact
distribution; :func:`config_key` and :func:`normalize` make a configuration hashable and JSON-able.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from kdsl.lang.errors import LoweringError


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


def order_labels(stage: Any) -> list[str]:
    """The labels of the middle loops that ``S.order`` permutes, in its identity order: every axis of the
    stage longer than 1, the spatial ones first.

    >>> from types import SimpleNamespace
    >>> order_labels(SimpleNamespace(spatial=[("N", 1), ("M", 64)], reduced=[("K", 32), ("kh", 1)]))
    ['M', 'K']
    """
    return [a for a, e in stage.spatial + stage.reduced if e > 1]


def reduction_block_depth(config: Mapping[str, Any], stage: str, axis: str) -> int:
    """The depth of ``S.rblock``'s blocks of reduction ``axis`` (0: the axis is not blocked).

    >>> reduction_block_depth({"stage0.rblock": "Cin:256"}, "stage0", "Cin"), reduction_block_depth({}, "stage0", "Cin")
    (256, 0)
    """
    value = config.get(f"{stage}.rblock", "none")
    if value == "none" or value.split(":")[0] != axis:
        return 0
    return int(value.split(":")[1])


def stored_last(config: Mapping[str, Any], tensor: str, ndims: int) -> int:
    """The dim of ``tensor`` (of ``ndims`` dims) whose elements its layout in ``config`` stores contiguously:
    a tiled dim (``layout.T.tile = "d:f"`` moves ``d``'s tile of ``f`` last; a tile of 1 moves nothing),
    else the last of ``layout.T.perm``, else the last dim. A vector read along any other dim gathers: with
    the channels tiled last (``1:8``), a depthwise convolution's rows along ``W`` are 8 elements apart
    (measured 65-89 us against 17 us with rows contiguous, 64x28x28 on AVX-512, where the model had
    counted them contiguous and estimated both alike).

    >>> stored_last({}, "x", 4), stored_last({"layout.x.perm": (0, 2, 3, 1)}, "x", 4)
    (3, 1)
    >>> stored_last({"layout.x.perm": (0, 1, 2, 3), "layout.x.tile": "1:8"}, "x", 4)
    1
    >>> stored_last({"layout.x.tile": "1:1"}, "x", 4)
    3
    """
    tile = config.get(f"layout.{tensor}.tile", "none")
    if tile != "none" and int(tile.split(":")[1]) > 1:
        return int(tile.split(":")[0])
    perm = config.get(f"layout.{tensor}.perm")
    return list(perm)[-1] if perm is not None else ndims - 1
