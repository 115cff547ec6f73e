"""Evaluators: what search measures about a candidate, and the MCTS reward made from it.

An :class:`Evaluator` has a ``name`` and ``evaluate(op, context) -> metrics``, a flat dict of
JSON values (numbers, strings, booleans, and lists or dicts of them for per-layer or per-epoch
detail) that the results store keeps as JSON. Metric names are unique across evaluators, so the
metrics of several evaluators merge into one dict. Three are built in:

- :class:`AnalyticEvaluator` (``"analytic"``): FLOPs (multiply-accumulates) and parameters per
  layer and in total, and their ratios to the baseline operator (the gallery's ``conv2d``).
- :class:`LatencyEvaluator` (``"latency"``): median PyTorch (optionally TVM) time per layer and
  the ratio to the baseline, both measured in the same process, interleaved, holding the
  machine's latency slot.
- :class:`AccuracyEvaluator` (``"accuracy"``): the proxy task of :mod:`kdsl.discover.proxy` with
  Canvas's early-stop rule, and the baseline's accuracy from the same code.

Evaluators are made from plain, picklable specs by :func:`make_evaluator` (``{"name":
"latency", "batch": 1}``, or ``{"class": "package.module:Class", ...}`` for your own), so
executors can ship them to worker processes.

>>> from kdsl import gallery
>>> metrics = make_evaluator({"name": "analytic", "layers": "resnet18"}).evaluate(gallery.load("depthwise_conv2d"))
>>> metrics["params"], metrics["baseline_params"], round(metrics["params_ratio"], 5)
(8640, 3133440, 0.00276)
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import median
from typing import Any, ClassVar

from kdsl import gallery
from kdsl.codegen.measure import interleaved_samples, latency_slot, ratio_of_pairs, ratio_spread
from kdsl.codegen.torch import build
from kdsl.codegen.tvm import build as tvm_build
from kdsl.discover.proxy import ProxyConfig, train
from kdsl.lang.build import Operator
from kdsl.lang.errors import SearchError
from kdsl.solve import bind, shapes, with_widths
from kdsl.solve.cost import cost
from kdsl.solve.layers import load_layers, with_batch

__all__ = [
    "AccuracyEvaluator",
    "AnalyticEvaluator",
    "Context",
    "Evaluator",
    "LatencyEvaluator",
    "Metrics",
    "evaluate_all",
    "make_evaluator",
    "register",
]

#: A flat dict of JSON values.
Metrics = dict[str, Any]

#: The operator every ratio compares against.
BASELINE = "conv2d"


@dataclass
class Context:
    """What an evaluation may use besides the operator.

    ``best_history``: the accuracy curve of the best run so far (Canvas's early-stop rule);
    ``latency_slot``: a context-manager factory that holds the machine's one measurement slot
    (executors pass one that also pauses the task's timeout while waiting); ``extra``: anything
    else a custom evaluator wants.
    """

    best_history: Sequence[float] | None = None
    latency_slot: Callable[[], contextlib.AbstractContextManager[Any]] = latency_slot
    extra: dict[str, Any] = field(default_factory=dict)
    #: a template's free widths per layer (layer name -> width -> value), as Canvas's sampler
    #: stores them (``metrics["widths"]`` of its results)
    widths: dict[str, dict[str, int]] | None = None

    @classmethod
    def of(cls, value: Context | Mapping[str, Any] | None) -> Context:
        """A Context from a Context, a plain dict (as tasks carry it) or None."""
        if isinstance(value, Context):
            return value
        values = dict(value or {})
        best = values.pop("best_history", None)
        widths = values.pop("widths", None)
        return cls(best_history=list(best) if best else None, extra=values, widths=widths)


class Evaluator(ABC):
    """Measures one aspect of a candidate operator. Subclasses set ``name`` and implement
    :meth:`evaluate`; constructor keyword arguments are the spec's parameters."""

    name: ClassVar[str] = "evaluator"

    @abstractmethod
    def evaluate(self, op: Operator, context: Context | Mapping[str, Any] | None = None) -> Metrics:
        """Metrics of ``op``; raise :class:`KdslError` when it cannot be evaluated (e.g. it does
        not fit a layer), which executors record as status ``error``."""


_REGISTRY: dict[str, type[Evaluator]] = {}


def register(cls: type[Evaluator]) -> type[Evaluator]:
    """Class decorator: make ``cls`` available to :func:`make_evaluator` under ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


def _spec_key(spec: Mapping[str, Any]) -> str:
    return json.dumps(dict(spec), sort_keys=True, default=str)


@lru_cache(maxsize=32)
def _cached_evaluator(key: str) -> Evaluator:
    spec = json.loads(key)
    name, path = spec.pop("name", None), spec.pop("class", None)
    if path is not None:
        module_name, _, attribute = str(path).partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise SearchError(f"cannot load the evaluator class {path!r}: {error}") from None
    elif name in _REGISTRY:
        cls = _REGISTRY[name]
    else:
        known = ", ".join(sorted(_REGISTRY))
        raise SearchError(f"unknown evaluator {name!r}; use one of {known}, or {{'class': 'module:Class'}}")
    try:
        return cls(**spec)
    except TypeError as error:
        raise SearchError(f"bad parameters for the evaluator {name or path!r}: {error}") from None


def make_evaluator(spec: str | Mapping[str, Any] | Evaluator) -> Evaluator:
    """An evaluator from a spec: a name, ``{"name": ..., **params}``, ``{"class": "mod:Cls",
    **params}``, or an Evaluator (returned as is). Equal specs give the same (cached) instance
    in a process, so baseline measurements are made once per worker.

    >>> make_evaluator("analytic") is make_evaluator({"name": "analytic"})
    True
    >>> make_evaluator("speed")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.SearchError: unknown evaluator 'speed'; use one of accuracy, analytic, latency, ...
    """
    if isinstance(spec, Evaluator):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    return _cached_evaluator(_spec_key(spec))


def evaluate_all(
    op: Operator, specs: Sequence[str | Mapping[str, Any] | Evaluator], context: Context | Mapping | None = None
) -> Metrics:
    """The merged metrics of several evaluators (a metric name given twice is an error).

    >>> from kdsl import gallery
    >>> sorted(evaluate_all(gallery.load("conv2d"), ["analytic"], {}))[:3]
    ['baseline_flops', 'baseline_params', 'flops']
    """
    merged: Metrics = {}
    context = Context.of(context)
    for spec in specs:
        evaluator = make_evaluator(spec)
        for key, value in evaluator.evaluate(op, context).items():
            if key in merged:
                raise SearchError(f"two evaluators both report the metric {key!r}; give them distinct names")
            merged[key] = value
    return merged


@lru_cache(maxsize=8)
def _baseline(name: str) -> Operator:
    return gallery.load(name)


def _table(layers: object, batch: int | None = None) -> tuple[Any, ...]:
    table = load_layers(layers)
    if batch is None:
        return table
    return tuple(with_batch(layer, batch) for layer in table)


def _ratio(value: float, base: float) -> float:
    return value / base if base else math.inf


# ---------------------------------------------------------------------------------------------
# Analytic


@register
class AnalyticEvaluator(Evaluator):
    """FLOPs (multiply-accumulates) and parameters per layer and summed, against the baseline.

    Metrics: ``flops``, ``params`` (totals over the table), ``flops_by_layer``,
    ``params_by_layer`` (dicts), ``baseline_flops``, ``baseline_params``, ``flops_ratio``,
    ``params_ratio`` (candidate / baseline; lower is cheaper).

    >>> from kdsl import gallery
    >>> AnalyticEvaluator(layers="resnet18").evaluate(gallery.load("conv2d"))["flops_ratio"]
    1.0
    """

    name = "analytic"

    def __init__(self, layers: object = "resnet18", baseline: str = BASELINE, batch: int | None = None) -> None:
        self.layers = _table(layers, batch)
        self.baseline = baseline

    def _costs(self, op: Operator, widths: Mapping[str, Any] | None = None) -> tuple[dict[str, int], dict[str, int]]:
        flops, params = {}, {}
        for layer in with_widths(op, self.layers, widths):
            each = cost(op, layer, metrics=("flops", "params"))
            flops[layer.name], params[layer.name] = int(each["flops"]), int(each["params"])
        return flops, params

    def evaluate(self, op: Operator, context: Context | Mapping[str, Any] | None = None) -> Metrics:
        flops, params = self._costs(op, Context.of(context).widths)
        base_flops, base_params = _baseline_costs(self.baseline, self.layers)
        total_flops, total_params = sum(flops.values()), sum(params.values())
        return {
            "flops": total_flops,
            "params": total_params,
            "flops_by_layer": flops,
            "params_by_layer": params,
            "baseline_flops": base_flops,
            "baseline_params": base_params,
            "flops_ratio": _ratio(total_flops, base_flops),
            "params_ratio": _ratio(total_params, base_params),
        }


@lru_cache(maxsize=16)
def _baseline_costs(baseline: str, layers: tuple[Any, ...]) -> tuple[int, int]:
    flops, params = AnalyticEvaluator(layers, baseline)._costs(_baseline(baseline))
    return sum(flops.values()), sum(params.values())


# ---------------------------------------------------------------------------------------------
# Latency


@register
class LatencyEvaluator(Evaluator):
    """Median forward time on every layer of a table, and the ratio to the baseline operator.

    For each layer the candidate and the baseline are built side by side and timed in alternation
    (:func:`~kdsl.codegen.measure.interleaved_samples`), in the same process, while holding the
    machine's latency slot; so noise affects both and only one measurement runs per machine.
    ``backends`` is ``("torch",)`` or also ``"tvm"`` (default TVM schedule; set
    ``TVM_BIND_THREADS=0`` in a process that times both, see TVM.md).

    **Repeatable ratios.** The ratio is what search ranks by, so it must come out the same when a
    candidate is measured again, in another run, beside other work. It is ensured by:

    * *one thread* (``threads=1``, the default; ``None`` keeps the process's setting): the latency
      slot keeps other *measurements* off the machine, not the accuracy workers that train beside
      it, and an intra-op thread pool that competes with them for cores waits on its slowest
      thread, so a 2-thread time swings with their load while a 1-thread time does not;
    * *warm-up* (``warmup`` untimed calls per function first: the first calls allocate buffers and
      pick kernels);
    * *the median of interleaved pairs* (:func:`~kdsl.codegen.measure.ratio_of_pairs`): each round
      times the candidate and then the baseline back to back, and the layer's ratio is the median
      of the rounds' ratios, which a slow spell scales away (the ratio of the two medians moves
      with it);
    * *enough rounds*: at least ``repeats``, and more (up to ``max_repeats``) while the rounds'
      ratios scatter by more than ``spread`` (their interquartile range over their median,
      :func:`~kdsl.codegen.measure.ratio_spread`).

    Metrics per backend ``b`` (``latency`` for torch, ``tvm_latency`` for TVM): ``{b}_ms`` (sum
    over layers of the candidate's median), ``baseline_{b}_ms``, ``{b}_ms_by_layer``,
    ``{b}_ratio_by_layer`` (median of the pairs' ratios per layer), ``{b}_ratio`` (the layers'
    ratios weighted by the baseline's time: the candidate's total time over the baseline's when
    each layer's ratio holds; < 1 is faster), ``{b}_spread`` (the largest layer's spread) and
    ``{b}_rounds`` (rounds timed, summed over layers); ``latency_threads``.
    """

    name = "latency"

    def __init__(
        self,
        layers: object = "resnet18",
        batch: int = 1,
        backends: Sequence[str] = ("torch",),
        repeats: int = 9,
        target: float = 0.02,
        baseline: str = BASELINE,
        threads: int | None = 1,
        seed: int = 0,
        warmup: int = 3,
        max_repeats: int = 27,
        spread: float = 0.1,
    ) -> None:
        self.layers = _table(layers, batch)
        unknown = set(backends) - {"torch", "tvm"}
        if unknown or not backends:
            raise SearchError(f"latency backends must be 'torch' and/or 'tvm', got {list(backends)!r}")
        if repeats < 1 or max_repeats < repeats or warmup < 0 or spread < 0:
            raise SearchError(
                f"latency: need 1 <= repeats <= max_repeats, warmup >= 0 and spread >= 0; got repeats={repeats}, "
                f"max_repeats={max_repeats}, warmup={warmup}, spread={spread}"
            )
        self.backends = tuple(backends)
        self.repeats, self.target = repeats, target
        self.baseline, self.threads, self.seed = baseline, threads, seed
        self.warmup, self.max_repeats, self.spread = warmup, max_repeats, spread

    def _callables(self, backend: str, op: Operator, layer: Any) -> Callable[[], Any]:
        import torch

        binding = bind(op, layer)
        generator = torch.Generator().manual_seed(self.seed)
        x = torch.randn(shapes(op, binding)["input"], generator=generator)
        if backend == "torch":
            module = build(op, binding).eval()

            def run() -> Any:
                with torch.no_grad():
                    return module(x)

            return run

        kernel = tvm_build(op, binding)
        weights = [torch.randn(shape, generator=generator) for shape in kernel.weight_shapes]
        out = torch.empty(kernel.output_shape)
        return lambda: kernel(x, *weights, out=out)

    def pairs(self, candidate: Callable[[], Any], baseline: Callable[[], Any]) -> tuple[list[float], list[float]]:
        """Seconds per call of the candidate and the baseline in each interleaved round: at least
        ``repeats`` rounds, more (``repeats`` at a time, up to ``max_repeats``) while their ratios
        scatter by more than ``spread``. The caller holds the latency slot."""
        mine, theirs = interleaved_samples(
            [candidate, baseline], repeats=self.repeats, target=self.target, warmup=self.warmup
        )
        while len(mine) < self.max_repeats and ratio_spread(mine, theirs) > self.spread:
            more = min(self.repeats, self.max_repeats - len(mine))
            extra = interleaved_samples([candidate, baseline], repeats=more, target=self.target, warmup=0)
            mine, theirs = mine + extra[0], theirs + extra[1]
        return mine, theirs

    def evaluate(self, op: Operator, context: Context | Mapping[str, Any] | None = None) -> Metrics:
        import torch

        context = Context.of(context)
        base = _baseline(self.baseline)
        threads = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            # compile everything first (may run in parallel with other workers), then time
            layers = with_widths(op, self.layers, context.widths)
            prepared = {
                backend: [
                    (layer.name, self._callables(backend, op, layer), self._callables(backend, base, layer))
                    for layer in layers
                ]
                for backend in self.backends
            }
            metrics: Metrics = {"latency_threads": torch.get_num_threads()}
            with context.latency_slot():
                for backend, rows in prepared.items():
                    prefix = "latency" if backend == "torch" else "tvm_latency"
                    mine, theirs, ratios, spreads, rounds = {}, {}, {}, [], 0
                    for layer_name, candidate, baseline in rows:
                        a, b = self.pairs(candidate, baseline)
                        mine[layer_name], theirs[layer_name] = median(a) * 1e3, median(b) * 1e3
                        ratios[layer_name] = ratio_of_pairs(a, b)
                        spreads.append(ratio_spread(a, b))
                        rounds += len(a)
                    metrics[f"{prefix}_ms"] = sum(mine.values())
                    metrics[f"baseline_{prefix}_ms"] = sum(theirs.values())
                    weighted = sum(theirs[k] * ratios[k] for k in ratios)
                    metrics[f"{prefix}_ratio"] = _ratio(weighted, sum(theirs.values()))
                    metrics[f"{prefix}_ms_by_layer"] = mine
                    metrics[f"{prefix}_ratio_by_layer"] = ratios
                    metrics[f"{prefix}_spread"] = max(spreads)
                    metrics[f"{prefix}_rounds"] = rounds
        finally:
            torch.set_num_threads(threads)
        return metrics


# ---------------------------------------------------------------------------------------------
# Accuracy


@lru_cache(maxsize=4)
def _baseline_training(baseline: str, config: Any) -> dict[str, Any]:
    return train(_baseline(baseline), config)


@register
class AccuracyEvaluator(Evaluator):
    """Validation accuracy of the proxy network (:mod:`kdsl.discover.proxy`) built from the candidate.

    Keyword arguments are :class:`~kdsl.discover.proxy.ProxyConfig` fields (``epochs``,
    ``widths``, ``seed``, ...). The early-stop rule compares against ``context.best_history``, or,
    with ``compare_baseline`` and no history given, the baseline's own curve. With
    ``compare_baseline`` the baseline is trained once per process by the same code and config.

    Metrics: ``accuracy``, ``accuracy_history``, ``early_stopped``, ``epochs_run``,
    ``train_seconds``, ``candidate_params``, and with the baseline ``baseline_accuracy``,
    ``baseline_accuracy_history``, ``accuracy_delta`` (candidate - baseline).
    """

    name = "accuracy"

    def __init__(self, baseline: str = BASELINE, compare_baseline: bool = True, **config: Any) -> None:
        self.config = ProxyConfig.of(config)
        self.baseline = baseline
        self.compare_baseline = compare_baseline

    def baseline_metrics(self) -> dict[str, Any]:
        """The baseline operator's proxy metrics (trained once per process)."""
        return _baseline_training(self.baseline, self.config)

    def evaluate(self, op: Operator, context: Context | Mapping[str, Any] | None = None) -> Metrics:
        context = Context.of(context)
        base = self.baseline_metrics() if self.compare_baseline else None
        best = context.best_history or (base["accuracy_history"] if base else None)
        metrics: Metrics = dict(train(op, self.config, best, widths=context.widths))
        if base is not None:
            metrics["baseline_accuracy"] = base["accuracy"]
            metrics["baseline_accuracy_history"] = base["accuracy_history"]
            metrics["accuracy_delta"] = metrics["accuracy"] - base["accuracy"]
        return metrics
