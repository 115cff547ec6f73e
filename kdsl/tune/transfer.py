"""A cost model trained across operators and layers, from the records of every tuning run.

:class:`~kdsl.tune.cost_model.CostModel` learns one task from its own records (ALT's online model); this
one learns from every task in any records database (``kdsl tune``'s, ``kdsl bench``'s) on one target,
over features that mean the same thing on every operator (:mod:`kdsl.tune.features`, each taken against
the task's heuristic configuration), so that a task never measured before is ranked by what other
operators taught.

* :func:`load_tasks` reads the measured configurations of every task of one target (``mcpu``) from
  records databases; records of another target are never read (a schedule's time is the machine's).
* :class:`TransferModel` is boosted shallow regression trees from the features to the *order of a task's
  configurations* (ranking the configurations of one task is what a tuner needs; the absolute time of a
  task is not learnt), each task weighing the same whatever its record count: by default trees boosted on
  the pairwise logistic loss from the analytic estimate (:mod:`kdsl.tune.pair_trees`), or (``learner=
  "ranks"``) trees regressing each configuration's rank within its task.
* :func:`confirm_on` scores records no setting was chosen on: other databases' tasks, each ranked by a
  model of the other operators.
* :func:`leave_one_operator_out` scores it the way a new operator meets it: for each operator, a model
  trained on the other operators' tasks ranks the held-out operator's configurations, task by task
  (Spearman's rank correlation, :func:`rank_correlation`), beside the analytic estimate of
  :func:`kdsl.tune.gensor_model.estimate` on the same configurations.
* :class:`Prefiltered` puts the model in front of a tuner: it asks the tuner for ``factor`` times the
  candidates and passes on the best-predicted ones (the driver does this for opevo, alt and random).

>>> rank_correlation([1, 2, 3, 4], [10, 20, 40, 30])
0.8
>>> rank_correlation([1, 1, 2], [3, 2, 1])
-0.866
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kdsl import solve
from kdsl.codegen.tvm import default_target, lower
from kdsl.codegen.tvm.machine import current_machine
from kdsl.codegen.tvm.schedule_space import VERSION, ScheduleSpace
from kdsl.lang import library
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator
from kdsl.lang.serialize import from_json
from kdsl.tune import gensor_model
from kdsl.tune.cost_model import load_ensemble
from kdsl.tune.features import KINDS, features_matrix
from kdsl.tune.pair_trees import PairTrees
from kdsl.tune.records import Record, RecordStore, TuneError, Tuner

#: Measured configurations a task needs to train or score the model (a rank correlation of 3 is noise).
MIN_CONFIGS = 6
#: Tasks (other than the one tuned) the driver needs before it trusts a model.
MIN_TASKS = 2
#: Boosted trees: how many, their depth and learning rate (ALT's, :mod:`kdsl.tune.cost_model`), the
#: fewest configurations in a leaf, the share of features a split tries and of configurations a tree
#: sees. Hundreds of records of a few operators: large leaves, shallow trees and random subsets keep the
#: trees from learning one operator's quirks. Chosen once (ALT's trees, the earlier forest's leaves and
#: feature share), never tuned on the held-out score. What they score against the analytic estimate
#: changes with every collection of records and every feature set: docs/tune/README.md ("A cost model
#: across operators") has the measured scores and what each was measured on.
TREES, DEPTH, RATE, LEAF, SPLIT_FEATURES, SUBSAMPLE = 200, 3, 0.05, 16, 0.5, 0.7
#: The analytic estimate's weight in the model's score: a configuration scores the trees' predicted rank
#: plus ``PRIOR`` x log2 of its estimate (lower is faster; a task's constant drops out of its order). The
#: trees learn ranks, in [-0.5, 0.5]; at 0.02 a configuration the estimate puts 4x slower scores 0.04
#: higher (4% of a task's rank range), so the estimate orders what the trees see as alike. Each split of
#: the records picked 0.02 of the weights tried, and it tested within +0.01 of the trees alone on the
#: other: a tie-breaker, not a gain (docs/tune/README.md, "A cost model across operators": every weight
#: and every other variant tried, on both splits and two seeds).
PRIOR = 0.02
#: The learners of :class:`TransferModel`: ``"pairs"`` (:class:`~kdsl.tune.pair_trees.PairTrees`, boosted on
#: the pairwise logistic loss within each task, started from ``PAIR_PRIOR`` x log2 of the estimate) and
#: ``"ranks"`` (the trees on each configuration's rank, :func:`rank_target`, the model before session 38).
LEARNERS = ("pairs", "ranks")
#: The estimate's weight in the pairs learner's score: in the loss's units, an estimate 2x slower starts
#: a configuration e times less likely to be the faster of a pair; the trees learn where that is wrong.
#: 1 was written down before any score; 2 and 4, scored after, ranked lower on both splits of
#: ``costmodel8.db`` (docs/tune/README.md, "A cost model across operators").
PAIR_PRIOR = 1.0
#: Each learner's default weight of the estimate.
PRIORS = {"pairs": PAIR_PRIOR, "ranks": PRIOR}


def rank_target(latencies: Sequence[float]) -> np.ndarray:
    """What the model learns of a task's latencies: each one's rank among them, scaled to [-0.5, 0.5]
    (a slowest configuration 100x off weighs no more than one 2x off: ranks are what a tuner uses).

    >>> rank_target([3e-3, 1e-3, 2e-3]).tolist()
    [0.5, -0.5, 0.0]
    """
    ranks = _ranks(latencies)
    return ranks / max(1, len(ranks) - 1) - 0.5


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of two equally long sequences (ties get their mean rank; 0 where
    one side is constant), rounded to 3 places."""
    if len(a) != len(b):
        raise TuneError(f"rank_correlation: {len(a)} values against {len(b)}")
    if len(a) < 2:
        return 0.0
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    scale = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return round(float((ra * rb).sum()) / scale, 3) if scale > 0 else 0.0


def _ranks(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    order = np.argsort(array, kind="stable")
    ranks = np.empty(len(array))
    ranks[order] = np.arange(len(array), dtype=float)
    for value in np.unique(array):  # ties: their mean rank
        tied = array == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


# ------------------------------------------------------------------------------------------------
# The training data: measured configurations of every task of one target
# ------------------------------------------------------------------------------------------------


@dataclass
class TaskData:
    """One task's measured configurations (each once, its fastest latency), with their features and the
    analytic estimate of each."""

    task: str
    operator: str  # the operator's content key: the unit held out together
    label: str  # a gallery name where the operator is one, else the key's start
    target: str
    binding: dict[str, int]
    configs: list[dict[str, Any]]
    latencies: list[float]
    features: np.ndarray = field(repr=False)
    estimates: list[float] = field(repr=False)
    kind: str = "relative"  # of the features (:data:`kdsl.tune.features.KINDS`)


@functools.lru_cache(maxsize=1)
def _gallery_keys() -> dict[str, str]:
    """Content key -> name of every gallery operator: the label of a gallery operator's task, and the
    operator of records whose run stored no operator JSON (loaded once per process)."""
    out = {}
    for name in library.names():
        try:
            out.setdefault(library.load(name).key, name)
        except KdslError:  # an entry that does not load is not one a record can name
            continue
    return out


def _operator(description: Mapping[str, Any]) -> tuple[Operator, str] | None:
    """The described operator and its label (None: the description names no operator kdsl can rebuild)."""
    key = str(description.get("op", ""))
    name = _gallery_keys().get(key)
    text = description.get("json")
    if isinstance(text, str):
        try:
            return from_json(text), name or key[:8]
        except KdslError:
            return None
    return (library.load(name), name) if name is not None else None


def space_for(op: Operator, binding: Mapping[str, int], target: str) -> ScheduleSpace:
    """The schedule space of ``op`` at ``binding`` on the machine of ``target`` (an mcpu name)."""
    machine = current_machine(default_target(target or None))
    return ScheduleSpace(lower(op, solve.bind(op, dict(binding))), machine=machine)


def measured(records: Iterable[Record]) -> dict[str, Record]:
    """The fastest record of each measured configuration (a configuration two tuners measured counts once)."""
    best: dict[str, Record] = {}
    for record in records:
        if record.latency is None or record.latency <= 0:
            continue
        known = best.get(record.key)
        if known is None or record.latency < (known.latency or 0.0):
            best[record.key] = record
    return best


def other_versions(paths: Sequence[str | os.PathLike[str]], target: str) -> dict[str, int]:
    """How many tasks of ``target`` in the records databases ``paths`` were tuned in another version of
    the schedule space than this kdsl's (:data:`~kdsl.codegen.tvm.schedule_space.VERSION`), by version:
    :func:`load_tasks` skips them (their configurations timed other kernels), and a caller that finds no
    task says why. A database that does not exist counts nothing."""
    counts: dict[str, int] = {}
    for path in paths:
        if not os.path.exists(path):
            continue
        for description in RecordStore(path).descriptions().values():
            version = str(description.get("space", VERSION))
            if str(description.get("target", "")) == target and version != VERSION:
                counts[version] = counts.get(version, 0) + 1
    return counts


def load_tasks(
    paths: Sequence[str | os.PathLike[str]],
    target: str,
    *,
    exclude: Iterable[str] = (),
    min_configs: int = MIN_CONFIGS,
    kind: str = "relative",
) -> list[TaskData]:
    """Every task of ``target`` (an mcpu name) in the records databases ``paths`` with at least
    ``min_configs`` measured configurations, except the tasks in ``exclude``; tasks of the same
    operator, layer and target in several databases merge. Tasks of another target, of another version
    of the schedule space, of a channel-blocked or prepacked signature, or of an operator that cannot be
    rebuilt or lowered are skipped, and so are MetaSchedule's records (a trace, not a configuration).
    ``kind`` is the features' (:func:`~kdsl.tune.features.features_matrix`)."""
    if kind not in KINDS:
        raise TuneError(f"cost model: no features of kind {kind!r}; choose from {', '.join(KINDS)}")
    skip = set(exclude)
    merged: dict[str, tuple[dict[str, Any], dict[str, Record]]] = {}
    for path in paths:
        if not os.path.exists(path):
            raise TuneError(f"cost model: no records database at {path!r}")
        store = RecordStore(path)
        for task, description in store.descriptions().items():
            if task in skip or str(description.get("target", "")) != target:
                continue
            if description.get("space", VERSION) != VERSION:
                continue
            if description.get("channel_block") or description.get("prepacked_weights"):
                continue  # timed in a blocked or prepacked signature: not the kernel the features describe
            _, known = merged.setdefault(task, (description, {}))
            # MetaSchedule's records hold a trace of its own schedule, not a configuration of kdsl's space:
            # their features would be the heuristic's defaults, so they teach and score nothing
            ours = [r for r in store.records(task) if "trace" not in r.config]
            for key, record in measured(ours).items():
                if key not in known or (record.latency or 0.0) < (known[key].latency or 0.0):
                    known[key] = record
    out = []
    for task, (description, records) in merged.items():
        if len(records) < min_configs:
            continue
        found = _operator(description)
        if found is None:
            continue
        op, label = found
        binding = {str(k): int(v) for k, v in dict(description.get("binding", {})).items()}
        try:
            space = space_for(op, binding, target)
        except KdslError:  # an operator this kdsl no longer lowers at that binding teaches nothing
            continue
        configs = [r.config for r in records.values()]
        features = np.array(features_matrix(space, configs, kind), dtype=float).reshape(-1, len(KINDS[kind]))
        estimates = [gensor_model.estimate(space, c) for c in configs]
        latencies = [float(r.latency or 0.0) for r in records.values()]
        out.append(TaskData(task, op.key, label, target, binding, configs, latencies, features, estimates, kind))
    return out


# ------------------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------------------


class TransferModel:
    """Boosted trees from :mod:`kdsl.tune.features` to the order of a task's configurations, trained on
    the tasks of one ``target`` whose features are of ``kind`` (relative to the task's heuristic
    configuration by default). A configuration's score is the trees' prediction plus ``prior`` x log2 of
    its analytic estimate (None: the learner's default, :data:`PRIORS`; 0: the trees alone). The
    ``learner`` (:data:`LEARNERS`) is ``"pairs"``, trees boosted on the order of every pair of a task's
    configurations starting from that score, or ``"ranks"``, trees regressing each configuration's rank
    within its task (:func:`rank_target`) with the estimate added after. Deterministic given ``seed``.

    >>> TransferModel("znver4", kind="logs")
    Traceback (most recent call last):
    kdsl.tune.records.TuneError: cost model: no features of kind 'logs'; choose from relative, absolute
    >>> TransferModel("znver4", prior=-1.0)
    Traceback (most recent call last):
    kdsl.tune.records.TuneError: cost model: the analytic estimate's weight (prior) must be finite and >= 0, got -1.0
    >>> TransferModel("znver4", learner="forest")
    Traceback (most recent call last):
    kdsl.tune.records.TuneError: cost model: no learner 'forest'; choose from pairs, ranks
    """

    def __init__(
        self,
        target: str,
        seed: int = 0,
        kind: str = "relative",
        prior: float | None = None,
        learner: str = LEARNERS[0],
    ) -> None:
        if kind not in KINDS:
            raise TuneError(f"cost model: no features of kind {kind!r}; choose from {', '.join(KINDS)}")
        if learner not in LEARNERS:
            raise TuneError(f"cost model: no learner {learner!r}; choose from {', '.join(LEARNERS)}")
        prior = PRIORS[learner] if prior is None else prior
        if not (math.isfinite(prior) and prior >= 0):
            raise TuneError(
                f"cost model: the analytic estimate's weight (prior) must be finite and >= 0, got {prior!r}"
            )
        self.target = target
        self.seed = seed
        self.kind = kind
        self.prior = prior
        self.learner = learner
        self.model: Any = None
        self.tasks: list[str] = []
        self.operators: list[str] = []

    def fit(self, tasks: Sequence[TaskData]) -> int:
        """Train on ``tasks`` (all of this model's target: another target's records are a
        :class:`TuneError`); how many configurations it learned from."""
        for data in tasks:
            if data.target != self.target:
                raise TuneError(
                    f"cost model for target {self.target!r} given task {data.task} of target {data.target!r}: "
                    "records of one machine never train another's model"
                )
            if data.kind != self.kind:
                raise TuneError(f"cost model of {self.kind} features given task {data.task} with {data.kind} features")
        usable = [t for t in tasks if len(t.latencies) >= 2]
        if not usable:
            self.model = None
            return 0
        features = np.vstack([t.features for t in usable])
        self.tasks = [t.task for t in usable]
        self.operators = sorted({t.label for t in usable})
        if self.learner == "pairs":
            self.model = self._fit_pairs(usable, features)
            return len(features)
        targets = np.concatenate([rank_target(t.latencies) for t in usable])
        weights = np.concatenate([np.full(len(t.latencies), 1.0 / len(t.latencies)) for t in usable])
        model = load_ensemble().GradientBoostingRegressor(
            n_estimators=TREES,
            max_depth=DEPTH,
            learning_rate=RATE,
            min_samples_leaf=LEAF,
            max_features=SPLIT_FEATURES,
            subsample=SUBSAMPLE,
            random_state=self.seed,
        )
        model.fit(features, targets, sample_weight=weights)
        self.model = model
        return len(features)

    def _fit_pairs(self, tasks: Sequence[TaskData], features: np.ndarray) -> PairTrees:
        """The pairs learner on ``tasks`` (their rows stacked in ``features``), started from the estimate's
        term of the score; the same trees' settings as the ranks learner's."""
        groups, start = [], 0
        for data in tasks:
            groups.append(range(start, start + len(data.latencies)))
            start += len(data.latencies)
        init = self.prior * _log2_estimates([e for t in tasks for e in t.estimates]) if self.prior else None
        trees = PairTrees(TREES, DEPTH, RATE, LEAF, SPLIT_FEATURES, SUBSAMPLE, seed=self.seed)
        return trees.fit(features, groups, [t.latencies for t in tasks], init)

    @property
    def trained(self) -> bool:
        return self.model is not None

    def predict_features(self, features: np.ndarray, estimates: Sequence[float] | None = None) -> list[float]:
        """The score of each row of features (lower is faster): the trees' predicted rank among its task
        (in [-0.5, 0.5]) plus :attr:`prior` x log2 of the row's analytic estimate in ``estimates`` (seconds,
        one per row; needed unless the prior is 0)."""
        if self.model is None:
            raise TuneError("the cross-operator cost model is not trained (no tasks with measured records)")
        if len(features) == 0:
            return []
        ranks = self.model.predict(np.asarray(features, dtype=float))
        if self.prior == 0:
            return [float(v) for v in ranks]
        if estimates is None or len(estimates) != len(ranks):
            given = "none" if estimates is None else len(estimates)
            raise TuneError(f"cost model: {len(ranks)} rows of features need as many analytic estimates, got {given}")
        return [float(v) for v in ranks + self.prior * _log2_estimates(estimates)]

    def predict(self, space: ScheduleSpace, configs: Sequence[Mapping[str, Any]]) -> list[float]:
        """The score of each configuration of ``space`` (lower is faster; :meth:`predict_features`)."""
        rows = features_matrix(space, configs, self.kind)
        estimates = [gensor_model.estimate(space, c) for c in configs] if self.prior else None
        return self.predict_features(np.array(rows, dtype=float).reshape(-1, len(KINDS[self.kind])), estimates)


def _log2_estimates(estimates: Sequence[float]) -> np.ndarray:
    """log2 of analytic estimates (seconds), an estimate of 0 kept finite."""
    return np.log2(np.maximum(np.asarray(estimates, dtype=float), 1e-30))


# ------------------------------------------------------------------------------------------------
# Scoring: leave one operator out
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskScore:
    """How well the model (trained without this task's operator) and the analytic estimate rank one
    task's measured configurations."""

    task: str
    label: str
    binding: dict[str, int]
    configs: int
    model: float
    analytic: float


def leave_one_operator_out(
    tasks: Sequence[TaskData], seed: int = 0, prior: float | None = None, learner: str = LEARNERS[0]
) -> list[TaskScore]:
    """For each operator, a model (of ``learner``, the estimate's weight ``prior``) trained on the other
    operators' tasks scores each of its tasks (operators with no other operator to learn from are not scored):
    :func:`confirm_on` with the same tasks on both sides."""
    return confirm_on(tasks, tasks, seed, prior, learner)


#: At most this many choices of half the operators train :func:`train_on_half`'s models (drawn at random
#: where there are more: 20 of 6 operators is every one, 184756 of 20 is not affordable).
HALF_SPLITS = 20


def train_on_half(
    tasks: Sequence[TaskData], seed: int = 0, prior: float | None = None, learner: str = LEARNERS[0]
) -> list[TaskScore]:
    """The stricter split: models trained on half the operators (rounded down) each score every task of
    the other half, for every such choice (at most :data:`HALF_SPLITS`, drawn with ``seed``; the estimate's
    weight ``prior``); a task's model score is its mean over the models that never saw its operator.
    Fewer than two operators: no score.

    >>> train_on_half([])
    []
    """
    operators = sorted({t.operator for t in tasks})
    if len(operators) < 2:
        return []
    choices = list(itertools.combinations(operators, len(operators) // 2))
    if len(choices) > HALF_SPLITS:
        choices = random.Random(seed).sample(choices, HALF_SPLITS)
    scores: dict[str, list[float]] = {}
    for trained_on in choices:
        model = TransferModel(tasks[0].target, seed, tasks[0].kind, prior, learner)
        model.fit([t for t in tasks if t.operator in trained_on])
        for data in (t for t in tasks if t.operator not in trained_on):
            scores.setdefault(data.task, []).append(
                rank_correlation(model.predict_features(data.features, data.estimates), data.latencies)
            )
    return [
        TaskScore(
            t.task,
            t.label,
            t.binding,
            len(t.latencies),
            round(sum(scores[t.task]) / len(scores[t.task]), 3),
            rank_correlation(t.estimates, t.latencies),
        )
        for t in tasks
        if t.task in scores
    ]


def confirm_on(
    train: Sequence[TaskData],
    held_out: Sequence[TaskData],
    seed: int = 0,
    prior: float | None = None,
    learner: str = LEARNERS[0],
) -> list[TaskScore]:
    """Score records no variant was chosen on: each task of ``held_out`` is ranked by a model trained on
    the tasks of ``train`` of every *other* operator (and never on the task itself), so a held-out task is
    a new layer of an operator the model never saw. Where :func:`leave_one_operator_out` on ``train``
    picked the features and settings, this is the number that was not picked on.

    >>> confirm_on([], [])
    []
    """
    out = []
    for operator in sorted({t.operator for t in held_out}):
        seen = [t for t in train if t.operator != operator]
        if not seen:
            continue
        model = TransferModel(seen[0].target, seed, seen[0].kind, prior, learner)
        model.fit(seen)
        for data in (t for t in held_out if t.operator == operator):
            predicted = model.predict_features(data.features, data.estimates)
            out.append(
                TaskScore(
                    data.task,
                    data.label,
                    data.binding,
                    len(data.latencies),
                    rank_correlation(predicted, data.latencies),
                    rank_correlation(data.estimates, data.latencies),
                )
            )
    return out


# ------------------------------------------------------------------------------------------------
# In front of a tuner, and the driver's per-run report
# ------------------------------------------------------------------------------------------------


class Prefiltered:
    """A tuner whose proposals pass through the model: ``factor`` times the asked-for candidates are
    drawn from ``inner`` and the best-predicted ones proposed (the rest stay seen by ``inner`` and are
    never measured)."""

    def __init__(self, inner: Tuner, space: ScheduleSpace, model: TransferModel, factor: int = 4) -> None:
        if factor < 1:
            raise TuneError(f"cost model: the prefilter's factor must be at least 1, got {factor!r}")
        self.inner = inner
        self.space = space
        self.model = model
        self.factor = factor
        self.name = inner.name
        self.ranked = 0  # candidates the model has scored

    def propose(self, n: int) -> list[dict[str, Any]]:
        pool = self.inner.propose(n * self.factor)
        if len(pool) <= n:
            return pool
        scores = self.model.predict(self.space, pool)
        self.ranked += len(pool)
        order = sorted(range(len(pool)), key=lambda i: (scores[i], i))
        return [pool[i] for i in order[:n]]

    def update(self, records: Sequence[Record]) -> None:
        self.inner.update(records)


@dataclass(frozen=True)
class Ranking:
    """The held-out rank correlation of a run: the model (trained without this task) and the analytic
    estimate, each against this run's measured latencies."""

    model: float
    analytic: float
    configs: int
    tasks: int
    operators: tuple[str, ...]

    def line(self) -> str:
        """The report line of a run.

        >>> Ranking(0.7, 0.5, 24, 6, ("conv2d", "matmul")).line()  # doctest: +NORMALIZE_WHITESPACE
        'cost model: held-out Spearman 0.70 (analytic 0.50, gain +0.20) on 24 configurations;
         trained on 6 tasks of conv2d, matmul'
        """
        return (
            f"cost model: held-out Spearman {self.model:.2f} (analytic {self.analytic:.2f}, gain "
            f"{self.model - self.analytic:+.2f}) on {self.configs} configurations; trained on {self.tasks} tasks "
            f"of {', '.join(self.operators)}"
        )


def run_ranking(model: TransferModel, space: ScheduleSpace, records: Sequence[Record]) -> Ranking | None:
    """The :class:`Ranking` of ``model`` on the measured ``records`` of a run (None under 3 of them)."""
    best = list(measured(records).values())
    if len(best) < 3 or not model.trained:
        return None
    configs = [r.config for r in best]
    latencies = [r.latency or 0.0 for r in best]
    predicted = model.predict(space, configs)
    estimates = [gensor_model.estimate(space, c) for c in configs]
    return Ranking(
        rank_correlation(predicted, latencies),
        rank_correlation(estimates, latencies),
        len(best),
        len(model.tasks),
        tuple(model.operators),
    )


def pretrained(
    paths: Sequence[str | os.PathLike[str]], target: str, exclude: str, seed: int = 0
) -> TransferModel | None:
    """A model of ``target`` trained on the tasks of ``paths`` other than ``exclude``, or None with
    fewer than :data:`MIN_TASKS` such tasks."""
    tasks = load_tasks([p for p in paths if os.path.exists(p)], target, exclude=[exclude])
    if len(tasks) < MIN_TASKS:
        return None
    model = TransferModel(target, seed)
    model.fit(tasks)
    return model if model.trained else None
