"""Boosted trees that learn an order: pairwise logistic loss within groups (RankNet's loss, boosted).

The cross-operator cost model (:mod:`kdsl.tune.transfer`) needs the order of one task's configurations,
never a time that can be compared across tasks. Regressing each configuration's rank within its task (the
``"ranks"`` learner) learns the order only through a proxy; these trees fit the order itself: for every
pair of configurations of one task where ``a`` ran faster than ``b``, the loss is
``log(1 + exp(score(a) - score(b)))`` (lower scores are faster), every group weighing the same whatever
its number of pairs. Each tree is a Newton step on that loss (fitted to the gradient over the Hessian,
weighted by the Hessian), as gradient boosting does for a classifier.

The score starts from ``init`` (the cross-operator model passes ``PAIR_PRIOR`` x log2 of the analytic
estimate): the trees learn where the estimate's order is wrong, in the loss's units (a score 1 lower is
e times the odds of being the faster one), rather than rebuilding its order in steps.

>>> trees = PairTrees(trees=20, leaf=1, seed=0)
>>> x = np.arange(12, dtype=float).reshape(-1, 1)
>>> trees.fit(x, [list(range(6)), list(range(6, 12))], [[6, 5, 4, 3, 2, 1], [1, 2, 3, 4, 5, 6]])  # doctest: +ELLIPSIS
<kdsl.tune.pair_trees.PairTrees object at ...>
>>> scores = trees.predict(x)
>>> bool(scores[0] > scores[5]) and bool(scores[6] < scores[11])  # each group's order, learnt
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kdsl.lang.errors import import_or_explain
from kdsl.tune.records import TuneError

#: The largest step of one row in one tree, in the loss's units before the learning rate: 200 trees at
#: rate 0.05 can then move a score by 40 at most, several times the span of log2 of an estimate over a task.
MAX_STEP = 4.0


def _tree_class() -> Any:
    """scikit-learn's regression tree, imported on first use (``import kdsl`` does not load scikit-learn)."""
    return import_or_explain(
        "sklearn.tree",
        TuneError,
        "the cross-operator cost model needs scikit-learn",
        "pip install 'kdsl[search]', or tune without it (--no-cost-model)",
    ).DecisionTreeRegressor


class PairTrees:
    """``trees`` regression trees of depth ``depth`` (leaves of at least ``leaf`` rows, ``features`` the
    share of columns a split tries, ``subsample`` the share of rows a tree sees) boosted at ``rate`` on
    the pairwise logistic loss of :func:`fit`'s groups. Deterministic given ``seed``."""

    def __init__(
        self,
        trees: int = 200,
        depth: int = 3,
        rate: float = 0.05,
        leaf: int = 16,
        features: float = 0.5,
        subsample: float = 0.7,
        seed: int = 0,
    ) -> None:
        if trees < 1 or depth < 1 or leaf < 1 or not (rate > 0) or not (0 < features <= 1 and 0 < subsample <= 1):
            raise TuneError(
                f"pair trees: need trees, depth, leaf >= 1, rate > 0 and shares in (0, 1]; got trees={trees}, "
                f"depth={depth}, leaf={leaf}, rate={rate}, features={features}, subsample={subsample}"
            )
        self.trees, self.depth, self.rate, self.leaf = trees, depth, rate, leaf
        self.features, self.subsample, self.seed = features, subsample, seed
        self.fitted: list[Any] = []

    def fit(
        self,
        x: np.ndarray,
        groups: Sequence[Sequence[int]],
        latencies: Sequence[Sequence[float]],
        init: np.ndarray | None = None,
    ) -> PairTrees:
        """Learn from the rows ``x``: ``groups[g]`` are the row indices of one task, ``latencies[g]`` their
        measured times (the order to learn); ``init`` the starting score of every row (default 0)."""
        x = np.asarray(x, dtype=float)
        rows = len(x)
        score = np.zeros(rows) if init is None else np.asarray(init, dtype=float).copy()
        if len(score) != rows or len(groups) != len(latencies):
            raise TuneError(f"pair trees: {rows} rows, {len(score)} initial scores, {len(groups)} groups of rows")
        faster, slower, weight = self._pairs(groups, latencies)
        rng = np.random.default_rng(self.seed)
        tree_class = _tree_class()
        self.fitted = []
        if len(faster) == 0:  # no pair with an order (every group one row or all times equal): nothing to learn
            return self
        for _ in range(self.trees):
            # d(loss)/d(score): a pair whose faster row scores above the slower one pushes both apart
            # the chance the order is wrong, sigmoid(score[faster] - score[slower]), in a form that cannot overflow
            p = 0.5 * (1.0 + np.tanh(0.5 * (score[faster] - score[slower])))
            gradient = np.zeros(rows)
            np.add.at(gradient, faster, weight * p)
            np.add.at(gradient, slower, -weight * p)
            hessian = np.zeros(rows)
            np.add.at(hessian, faster, weight * p * (1 - p))
            np.add.at(hessian, slower, weight * p * (1 - p))
            hessian = np.maximum(hessian, 1e-12)  # a row in no pair: weight ~0, target finite
            # a pair the start orders wrong by a wide margin has p ~ 1 and a Hessian ~ 0: its Newton step
            # would be unbounded, so each row's step is capped (XGBoost's max_delta_step does the same)
            step = np.clip(-gradient / hessian, -MAX_STEP, MAX_STEP)
            sample = rng.random(rows) < self.subsample
            tree = tree_class(
                max_depth=self.depth,
                min_samples_leaf=self.leaf,
                max_features=self.features,
                random_state=int(rng.integers(1 << 30)),
            )
            tree.fit(x[sample], step[sample], sample_weight=hessian[sample])
            score += self.rate * tree.predict(x)
            self.fitted.append(tree)
        return self

    @staticmethod
    def _pairs(
        groups: Sequence[Sequence[int]], latencies: Sequence[Sequence[float]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every ordered pair within a group (the faster row, the slower row) and its weight: 1 over the
        group's number of pairs, so that each group weighs the same."""
        faster, slower, weight = [], [], []
        for rows, times in zip(groups, latencies):
            index = np.asarray(rows, dtype=int)
            lat = np.asarray(times, dtype=float)
            if len(index) != len(lat):
                raise TuneError(f"pair trees: a group of {len(index)} rows has {len(lat)} latencies")
            a, b = np.nonzero(lat[:, None] < lat[None, :])
            if len(a):
                faster.append(index[a])
                slower.append(index[b])
                weight.append(np.full(len(a), 1.0 / len(a)))
        if not faster:
            return np.zeros(0, dtype=int), np.zeros(0, dtype=int), np.zeros(0)
        return np.concatenate(faster), np.concatenate(slower), np.concatenate(weight)

    def predict(self, x: np.ndarray, init: np.ndarray | None = None) -> np.ndarray:
        """The score of each row (lower is faster): ``init`` plus the trees' sum."""
        x = np.asarray(x, dtype=float)
        score = np.zeros(len(x)) if init is None else np.asarray(init, dtype=float).copy()
        for tree in self.fitted:
            score += self.rate * tree.predict(x)
        return score
