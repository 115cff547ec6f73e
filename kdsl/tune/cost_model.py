"""A learned cost model of schedule configurations: boosted regression trees from features to log latency.

ALT (Xu et al., EuroSys 2023, §5.2.3) ranks the points its exploration visits with a tree ensemble from
XGBoost trained online on the measured points, and measures only the top-k of each batch. This is that
model over kdsl's schedule space (:mod:`kdsl.codegen.tvm.schedule_space`), with scikit-learn's gradient
boosted trees. ALT's features come from the generated program (loop structures, access expressions);
these come from the configuration and the space, which is cheaper and needs no TVM lowering per candidate:

* every parameter encoded as numbers (:func:`parameter_features`): log2 of each level of a tile
  factorization, each item's position in a permutation, log2 of an ordered numeric value, a one-hot of
  an unordered choice (layout tiles included);
* per reduction stage, what the space's machine makes of the register tile (:func:`stage_features`):
  its size in vectors and against the register file, the innermost vector's length and whether it is a
  whole number of vectors, the cache tile, the inner reduction tile and the parallel extent;
* the analytic estimate of Gensor's model (:func:`kdsl.tune.gensor_model.estimate`), in log.

The target is the log of the latency in seconds: a ratio model, so that the trees split alike on a
kernel at 1 ms and at 10 ms. The trees learn the correction to a line fitted through the log of Gensor's
estimate (slope at least 0): where the records say nothing (a candidate far from every measured one, in a
leaf fitted to other configurations) the ranking falls back on the analytic model instead of a constant.
Cross-validated on the records of four ``kdsl bench tune`` runs (matmul and conv2d, ~60 records each,
on a loaded 2-core VM; trained on half, Spearman's rank correlation on the other half, 10 splits), the
trees alone ranked 0.53 on average, the estimate alone 0.50, the corrected line 0.56 (0.32-0.78 per
run): tens of records teach little beyond the prior yet. Records without a latency (rejected or failed)
are left out: ALT checks that a schedule applies before it proposes one, so the model never needs to
learn the space's rejections.

>>> from kdsl.codegen.tvm.schedule_space import Categorical, Factorization, Permutation
>>> params = {"t": Factorization("t", 8, 2), "p": Permutation("p", 3), "c": Categorical("c", ("a", "b"))}
>>> parameter_features(params, {"t": (2, 4), "p": (2, 0, 1), "c": "b"})
[1.0, 2.0, 1.0, 2.0, 0.0, 0.0, 1.0]
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

import numpy as np

from kdsl.codegen.tvm.parameters import Categorical, Discrete, Factorization, Parameter, Permutation, config_key
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.lang.errors import import_or_explain
from kdsl.tune import gensor_model
from kdsl.tune.records import Record, TuneError, is_number

#: Boosting rounds, tree depth and learning rate of the model: with tens of records, shallow trees and a
#: small rate generalize; more rounds than records would only memorize them.
TREES, DEPTH, RATE = 200, 3, 0.05


def load_ensemble() -> Any:
    """scikit-learn's ``sklearn.ensemble``, imported on first use (or a :class:`TuneError` saying how to
    install it). Lazy like the torch and TVM loads: importing it takes ~1.5 s and pulls scipy, which
    ``import kdsl`` and every tuner without a model should not pay for."""
    return import_or_explain(
        "sklearn.ensemble",
        TuneError,
        "ALT's cost model needs scikit-learn",
        "pip install 'kdsl[search]', or run ALT without it (--tuner-option model=false)",
    )


def have_sklearn() -> bool:
    """Whether scikit-learn is installed (checked without importing it)."""
    return importlib.util.find_spec("sklearn") is not None


def parameter_features(params: Mapping[str, Parameter], config: Mapping[str, Any]) -> list[float]:
    """Every parameter of ``config`` as numbers, in the order of ``params`` (see the module's text)."""
    out: list[float] = []
    for name, param in params.items():
        value = config[name]
        if isinstance(param, Factorization):
            out.extend(math.log2(v) for v in value)
        elif isinstance(param, Permutation):
            order = list(value)
            out.extend(float(order.index(item)) for item in range(param.n))
        elif isinstance(param, Discrete):
            numeric = all(is_number(c) and c > 0 for c in param.choices)
            out.append(math.log2(value) if numeric else float(param.choices.index(value)))
        elif isinstance(param, Categorical):
            out.extend(1.0 if value == choice else 0.0 for choice in param.choices)
    return out


def stage_features(space: ScheduleSpace, config: Mapping[str, Any]) -> list[float]:
    """What the register tile of each reduction stage means on the space's machine (see the module)."""
    out: list[float] = []
    lanes, registers = space.lanes, space.accumulators
    for stage in space.stages:
        s = stage.name
        if stage.kind != "reduce":
            continue
        levels = {a: tuple(config.get(f"{s}.tile.{a}", (e, 1, 1))) for a, e in stage.spatial}
        inner = prod(t[2] for t in levels.values())
        middle = prod(t[1] * t[2] for t in levels.values())
        outer = prod(t[0] for t in levels.values())
        vector = config.get(f"{s}.vector")
        length = levels[vector][2] if vector in levels else 1
        reduce_inner = prod(tuple(config.get(f"{s}.tile.{a}", (e, 1)))[1] for a, e in stage.reduced)
        vectors = inner / lanes
        out += [
            math.log2(max(vectors, 1 / lanes)),  # register tile in vectors
            vectors / max(1, registers),  # against the accumulators the register file holds (> 1: spills)
            math.log2(length),  # innermost (vectorized) length
            1.0 if length % lanes == 0 else 0.0,  # whole vectors only
            math.log2(middle),  # cache tile
            math.log2(reduce_inner),
            math.log2(outer),  # parallel extent
        ]
    return out


class CostModel:
    """Boosted trees from a configuration's features to its log latency, refitted on every call to
    :meth:`fit` (ALT trains its model online on the measured points). Deterministic given ``seed``."""

    def __init__(self, space: ScheduleSpace, seed: int = 0) -> None:
        self.space = space
        self.seed = seed
        self.model: Any = None
        self.line = (0.0, 0.0)  # log seconds against log estimate: the prior the trees correct
        self._cache: dict[str, list[float]] = {}

    def features(self, config: Mapping[str, Any]) -> list[float]:
        """The feature vector of ``config`` (cached by its key)."""
        key = config_key(config)
        cached = self._cache.get(key)
        if cached is None:
            estimate = gensor_model.estimate(self.space, config)
            cached = [
                *parameter_features(self.space.parameters, config),
                *stage_features(self.space, config),
                math.log(max(estimate, 1e-12)),
            ]
            self._cache[key] = cached
        return cached

    def fit(self, records: Sequence[Record]) -> int:
        """Refit on the records with a latency; how many it learned from (fewer than 2: no model)."""
        valid = [r for r in records if r.latency is not None and r.latency > 0]
        if len(valid) < 2:
            self.model = None
            return len(valid)
        ensemble = load_ensemble()
        features = np.array([self.features(r.config) for r in valid])
        target = np.array([math.log(r.latency or 1.0) for r in valid])
        prior = features[:, -1]  # log of Gensor's estimate
        slope, intercept = np.polyfit(prior, target, 1) if np.ptp(prior) > 0 else (0.0, float(target.mean()))
        if slope < 0:  # an estimate that ranks backwards here is no prior: the trees alone
            slope, intercept = 0.0, float(target.mean())
        self.line = (float(slope), float(intercept))
        model = ensemble.GradientBoostingRegressor(
            n_estimators=TREES, max_depth=DEPTH, learning_rate=RATE, min_samples_leaf=1, random_state=self.seed
        )
        model.fit(features, target - (slope * prior + intercept))
        self.model = model
        return len(valid)

    @property
    def trained(self) -> bool:
        return self.model is not None

    def predict(self, configs: Sequence[Mapping[str, Any]]) -> list[float]:
        """Predicted log seconds of each configuration (lower is faster)."""
        if self.model is None:
            raise TuneError("the cost model is not trained yet (fit it on at least 2 measured records)")
        if not configs:
            return []
        features = np.array([self.features(c) for c in configs])
        slope, intercept = self.line
        return [float(v) for v in self.model.predict(features) + slope * features[:, -1] + intercept]
