"""OpEvo (Gao et al., AAAI 2021): evolutionary schedule search with q-random-walk mutation.

The top ``λ`` configurations found so far are the parents. A child takes each parameter from a parent
drawn with probability proportional to the parents' fitness (1 / latency; invalid configurations have
fitness 0, so their choices are not inherited), then every parameter mutates by a q-random walk over
that parameter's topology (:func:`kdsl.codegen.tvm.parameters.q_random_walk`: a prime factor moves between
slots, two loops swap, a discrete value steps to a neighbour, a categorical one jumps to any other).
No configuration is proposed twice: a child already seen mutates again.

Two departures from the paper, for spaces of 30-50 parameters and budgets of tens of trials: a mutation
walks each parameter with probability ``walks / #parameters`` (about two per child; the paper walks all
of them, which here changes ~15 parameters at once: a random restart), and the first population is the
space's heuristic configuration, its mutations and a share (``explore``) of random configurations that the
space accepts (a cheap check that the schedule applies), so that no trial is spent on a configuration the
space rejects outright. Every child is repaired where its parameters rule each other out (an ``S.block``
that its mutated tiles no longer divide) and checked to apply before it is proposed: no trial is spent on a
configuration that fails to apply.

The paper's parameters are constructor options (and ``kdsl tune --tuner opevo --tuner-option KEY=VALUE``):
``q`` (the mutation rate of §4.3, in [0, 1): 0 never mutates, near 1 walks far), ``parents`` (λ, the
parent size of §4.2: the top λ configurations are the parents), ``offspring`` (rho, the children bred from
one selection of parents, Algorithm 1 of §4.4: at most rho proposed per round; default the driver's batch),
``walks`` (parameters walked per child; ``None``: every parameter, as in §4.3) and ``init``
(``"heuristic"``: the first population described above; ``"random"``: λ random accepted configurations,
Algorithm 1's first step). :data:`PAPER` is the paper's setting (Appendix B: λ = rho = 8, q = 0.5), reached
with ``setting="paper"`` (``--tuner-option setting=paper``):

>>> sorted(PAPER.items())
[('init', 'random'), ('offspring', 8), ('parents', 8), ('q', 0.5), ('walks', None)]

>>> import random
>>> from kdsl.codegen.tvm.parameters import Factorization
>>> params = {"t": Factorization("t", 8, 2)}
>>> child = recombine(params, [({"t": (8, 1)}, 1.0), ({"t": (2, 4)}, 3.0)], random.Random(0))
>>> child["t"] in [(8, 1), (2, 4)]
True
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from kdsl.codegen.tvm.parameters import Parameter, config_key, q_random_walk
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.tune.records import Record, TuneError, is_integer, is_number

#: OpEvo's setting in its paper's experiments (Appendix B): λ = rho = 8 parents and offspring, mutation
#: rate q = 0.5, every parameter walked (§4.3), a first population of λ random configurations (§4.4).
PAPER: dict[str, Any] = {"parents": 8, "offspring": 8, "q": 0.5, "walks": None, "init": "random"}


def recombine(
    params: Mapping[str, Parameter], parents: Sequence[tuple[Mapping[str, Any], float]], rng: random.Random
) -> dict[str, Any]:
    """A child whose every parameter comes from a parent drawn with probability ∝ its fitness."""
    weights = [max(f, 0.0) for _, f in parents]
    if sum(weights) <= 0:
        weights = [1.0] * len(parents)
    child = {}
    for name in params:
        parent = rng.choices(parents, weights=weights)[0][0]
        child[name] = parent[name]
    return child


def mutate(
    params: Mapping[str, Parameter], config: Mapping[str, Any], q: float, rng: random.Random, rate: float = 1.0
) -> dict[str, Any]:
    """Parameters moved by independent q-random walks; each one walks with probability ``rate``.

    ``rate=1`` is OpEvo's mutation (every parameter walks). A schedule space of 30-50 parameters then
    changes ~15 of them per child with ``q=0.5``, which is a random restart rather than a local step, so
    :class:`OpEvo` walks about two parameters per child (``rate = 2 / #parameters``)."""
    return {
        name: q_random_walk(param, config[name], q, rng) if rate >= 1 or rng.random() < rate else config[name]
        for name, param in params.items()
    }


def random_valid(space: ScheduleSpace, rng: random.Random, seen: set[str], tries: int = 200) -> dict[str, Any] | None:
    """A random configuration that the space accepts and that is not in ``seen`` (None after ``tries``)."""
    for _ in range(tries):
        config = space.random(rng)
        key = config_key(config)
        if key in seen:
            continue
        if space.rejection(config) is None:
            return config
    return None


class OpEvo:
    """OpEvo over ``space``; ``fixed`` pins some parameters (ALT tunes loops under a fixed layout).

    ``parents`` is the paper's λ, ``offspring`` its rho, ``q`` its mutation rate (see the module's text;
    ``setting="paper"`` in :func:`kdsl.tune.driver.make_tuner` gives :data:`PAPER`)."""

    name = "opevo"

    def __init__(
        self,
        space: ScheduleSpace,
        history: Sequence[Record] = (),
        *,
        seed: int = 0,
        parents: int = 8,
        q: float = 0.5,
        walks: float | None = 2.0,
        explore: float = 0.25,
        offspring: int | None = None,
        init: str = "heuristic",
        fixed: Mapping[str, Any] | None = None,
        start: Mapping[str, Any] | None = None,
        seen: set[str] | None = None,
    ) -> None:
        check_opevo_options(parents, q, walks, explore, offspring, init)
        self.space = space
        self.rng = random.Random(seed)
        self.parents = parents
        self.q = q
        self.offspring = offspring
        self.init = init
        self.fixed = dict(fixed or {})
        self.free = {n: p for n, p in space.parameters.items() if n not in self.fixed}
        # expected parameters walked per mutation (walks=None: all of them, the paper's mutation)
        self.rate = 1.0 if walks is None else min(1.0, walks / max(1, len(self.free)))
        self.explore = explore  # share of random configurations in the first population
        self.seen: set[str] = seen if seen is not None else set()
        self.population: list[tuple[dict[str, Any], float]] = []
        for record in history:
            self.seen.add(record.key)
            if all(record.config.get(n) == _plain(v) for n, v in self.fixed.items()):
                self.population.append((self._tuple(record.config), record.fitness))
        self.start = dict(start) if start is not None else space.heuristic()
        self.start.update(self.fixed)

    def _tuple(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}

    def _new(self, config: dict[str, Any], batch: set[str]) -> bool:
        """Whether ``config`` is new and applies (its key joins ``batch`` either way: never tried twice)."""
        key = config_key(config)
        if key in self.seen or key in batch:
            return False
        batch.add(key)
        return self.space.rejection(config) is None

    def _child(self, config: dict[str, Any]) -> dict[str, Any]:
        """A mutated configuration with the fixed parameters set, and what the others rule out repaired
        (:meth:`~kdsl.codegen.tvm.schedule_space.ScheduleSpace.repair`: an ``S.block`` whose tiles moved)."""
        return self.space.repair({**config, **self.fixed}, keep=self.fixed)

    def propose(self, n: int) -> list[dict[str, Any]]:
        if self.offspring is not None:
            n = min(n, self.offspring)  # rho children per selection of parents (the next round selects again)
        out: list[dict[str, Any]] = []
        keys: set[str] = set()
        valid = [(c, f) for c, f in self.population if f > 0]
        if len(valid) < self.parents:
            out = self._first(n, keys)
            self.seen |= keys
            return out
        parents = sorted(valid, key=lambda cf: -cf[1])[: self.parents]
        attempts = 0
        while len(out) < n and attempts < 50 * n:
            child = recombine(self.free, parents, self.rng)
            for _ in range(20):
                child = mutate(self.free, child, self.q, self.rng, self.rate)
                config = self._child(child)
                attempts += 1
                if self._new(config, keys):
                    out.append(config)
                    break
        self.seen |= keys
        return out

    def _first(self, n: int, keys: set[str]) -> list[dict[str, Any]]:
        """The first population: random accepted configurations (``init="random"``), or the heuristic
        start, its mutations and a share ``explore`` of random accepted configurations."""
        out: list[dict[str, Any]] = []
        start = self._child(self.start)  # ALT's fixed layout may rule out a choice of the heuristic's
        if self.init == "heuristic" and self._new(dict(start), keys):
            out.append(dict(start))
        for _ in range(50 * n):  # bounded: in a small space every mutation may be seen or rejected
            if len(out) >= n:
                break
            if self.init == "heuristic" and self.rng.random() >= self.explore:
                config = self._child(mutate(self.free, start, self.q, self.rng, self.rate))
            else:
                config = random_valid(self.space, self.rng, self.seen | keys) or {}
                config = self._child(config) if config else {}
            if config and self._new(config, keys):
                out.append(config)
            elif not config:
                break
        return out

    def update(self, records: Sequence[Record]) -> None:
        for record in records:
            self.seen.add(record.key)
            self.population.append((self._tuple(record.config), record.fitness))


def check_opevo_options(
    parents: int, q: float, walks: float | None, explore: float, offspring: int | None, init: str
) -> None:
    """Refuse OpEvo options out of range (a :class:`TuneError` naming the option); the constructor and
    :func:`kdsl.tune.driver.check_options` (before anything is compiled or measured) both call it.

    >>> check_opevo_options(8, 0.5, 2.0, 0.25, None, "heuristic")
    >>> check_opevo_options(8, 1.0, 2.0, 0.25, None, "heuristic")
    Traceback (most recent call last):
    ...
    kdsl.tune.records.TuneError: opevo: q must be in [0, 1) (q = 1 walks forever), got 1.0
    """
    if not is_integer(parents) or parents < 1:
        raise TuneError(f"opevo: lambda (parents) must be a positive integer, got {parents!r}")
    if not is_number(q) or not 0 <= q < 1:
        raise TuneError(f"opevo: q must be in [0, 1) (q = 1 walks forever), got {q!r}")
    if walks is not None and (not is_number(walks) or walks <= 0):
        raise TuneError(f"opevo: walks must be a positive number or None (every parameter), got {walks!r}")
    if not is_number(explore) or not 0 <= explore <= 1:
        raise TuneError(f"opevo: explore must be in [0, 1], got {explore!r}")
    if offspring is not None and (not is_integer(offspring) or offspring < 1):
        raise TuneError(f"opevo: rho (offspring) must be a positive integer or none (the batch), got {offspring!r}")
    if init not in ("heuristic", "random"):
        raise TuneError(f"opevo: init must be 'heuristic' or 'random', got {init!r}")


class RandomTuner:
    """Random configurations that the space accepts (a baseline)."""

    name = "random"

    def __init__(self, space: ScheduleSpace, history: Sequence[Record] = (), *, seed: int = 0) -> None:
        self.space = space
        self.rng = random.Random(seed)
        self.seen = {r.key for r in history}

    def propose(self, n: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(n):
            config = random_valid(self.space, self.rng, self.seen)
            if config is None:
                break
            self.seen.add(config_key(config))
            out.append(config)
        return out

    def update(self, records: Sequence[Record]) -> None:
        self.seen |= {r.key for r in records}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def opevo_options(given: Mapping[str, Any]) -> dict[str, Any]:
    """OpEvo's constructor options from the names a user types (``--tuner-option KEY=VALUE``):
    ``setting="paper"`` is :data:`PAPER` (options given beside it win), ``lambda`` is ``parents`` (λ),
    ``rho`` is ``offspring``, ``walks="all"`` is ``None`` (every parameter walks).

    >>> opevo_options({"setting": "paper", "q": 0.3, "lambda": 4}) == {**PAPER, "q": 0.3, "parents": 4}
    True
    """
    options = dict(given)
    setting = options.pop("setting", None)
    if setting not in (None, "paper"):
        raise TuneError(f"opevo: unknown setting {setting!r}; the one setting is 'paper' (λ = rho = 8, q = 0.5)")
    for alias, name in (("lambda", "parents"), ("rho", "offspring")):
        if alias in options:
            if name in options:
                raise TuneError(f"opevo: {alias} and {name} are the same option; give one")
            options[name] = options.pop(alias)
    if options.get("walks") == "all":
        options["walks"] = None
    return {**(PAPER if setting == "paper" else {}), **options}
