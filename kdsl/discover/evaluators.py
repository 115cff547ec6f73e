"""Evaluators: what search measures about a candidate, and the MCTS reward made from it.

An :class:`Evaluator` has a ``name`` and ``evaluate(op, context) -> metrics``, a flat dict of
JSON values (numbers, strings, booleans, and lists or dicts of them for per-layer or per-epoch
detail) that the results store keeps as JSON. Metric names are unique across evaluators, so the
metrics of several evaluators merge into one dict. Three are built in:

- :class:`AnalyticEvaluator` (``"analytic"``): FLOPs (multiply-accumulates) and parameters per
  layer and in total, and their ratios to the baseline operator (the gallery's ``conv2d``).
- :class:`LatencyEvaluator` (``"latency"``): median time per layer of the candidate's eager
  PyTorch module and (optionally) its TVM kernel, and their ratios to conv2d compiled the same way
  and to PyTorch's own ``F.conv2d``, all measured in the same process, interleaved, holding the
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
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import median
from typing import Any, ClassVar

from kdsl import gallery
from kdsl.codegen.native import native_function
from kdsl.codegen.torch import build
from kdsl.codegen.tvm import build as tvm_build
from kdsl.discover.proxy import ProxyConfig, train
from kdsl.lang.errors import SearchError
from kdsl.lang.operator import Operator
from kdsl.runtime.timing import interleaved_samples, latency_slot, ratio_of_pairs, ratio_spread
from kdsl.solve import bind, shapes, with_widths
from kdsl.solve.cost import cost
from kdsl.solve.layers import load_layers, with_batch

__all__ = [
    "AccuracyEvaluator",
    "AnalyticEvaluator",
    "Context",
    "check_device",
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


#: What each latency ratio divides: (the candidate's lane, the baseline's lane). Lanes: ``torch`` is
#: kdsl's eager PyTorch module, ``native`` PyTorch's own ``F.conv2d`` (:data:`kdsl.codegen.native.NATIVE`),
#: ``tvm`` the candidate's TVM kernel and ``tvm_base`` conv2d's, compiled the same way.
RATIOS = {
    "torch_ratio": ("torch", "native"),
    "tvm_latency_ratio": ("tvm", "tvm_base"),
    "tvm_vs_torch_conv2d": ("tvm", "native"),
}
#: The metric of a lane's summed median time, as the report shows it.
LANE_MS = {
    "torch": "latency_ms",
    "native": "baseline_latency_ms",
    "tvm": "tvm_latency_ms",
    "tvm_base": "baseline_tvm_latency_ms",
}


def check_device(device: str) -> None:
    """Refuse, before any work, a latency device that is not there: ``"cpu"`` always is; ``"cuda"``
    needs a CUDA device that PyTorch sees.

    >>> check_device("cpu")
    >>> check_device("tpu")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.SearchError: unknown latency device 'tpu': use cpu or cuda
    """
    if device == "cpu":
        return
    if device != "cuda":
        raise SearchError(f"unknown latency device {device!r}: use cpu or cuda")
    import torch

    if not torch.cuda.is_available():
        raise SearchError(
            "--device cuda: no CUDA device is visible to PyTorch (torch.cuda.is_available() is False; "
            f"torch {torch.__version__}, built for CUDA {torch.version.cuda or 'none'}); time on the CPU "
            "with --device cpu, or run where a GPU and a CUDA build of torch are present"
        )


@lru_cache(maxsize=8)
def _schedule_lookup(path: str) -> Callable[..., Any]:
    module_name, _, attribute = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise SearchError(f"cannot load the tuned-schedule lookup {path!r}: {error}") from None


@register
class LatencyEvaluator(Evaluator):
    """Median forward time on every layer of a table, and the ratios to the baseline operator.

    For each layer the candidate and the baseline are built side by side and timed in alternation
    (:func:`~kdsl.runtime.timing.interleaved_samples`), in the same process, while holding the
    machine's latency slot; so noise affects both and only one measurement runs per machine.

    **What is timed** (*lanes*, all timed in the same interleaved rounds): with ``"torch"`` in
    ``backends``, kdsl's eager PyTorch module of the candidate; with ``"tvm"``, the candidate's TVM
    kernel, the kernel kdsl would deploy on a CPU (default schedule, or the best tuned record of
    that operator at that layer when ``tuned`` finds one), and conv2d's TVM kernel compiled the same
    way; always PyTorch's own ``F.conv2d`` at the layer. ``rank`` says which ratio becomes
    ``latency_ratio``, the one search ranks by: ``"tvm"`` (the default when TVM is timed: the TVM
    kernel over TVM conv2d) or ``"torch"`` (eager PyTorch over ``F.conv2d``). ``device="cuda"``
    times the PyTorch lanes on a GPU (TVM's CUDA kernels are not measured yet). A candidate whose TVM
    kernel fails to build gets ``tvm_error`` and no TVM ratios (its ``latency_ratio`` is None when
    ranked by TVM) instead of failing the whole evaluation.

    **Repeatable ratios.** The ratio is what search ranks by, so it must come out the same when a
    candidate is measured again, in another run, beside other work. It is ensured by:

    * *one thread* (``threads=1``, the default; ``None`` keeps the process's setting): the latency
      slot keeps other *measurements* off the machine, not the accuracy workers that train beside
      it, and an intra-op thread pool that competes with them for cores waits on its slowest
      thread, so a 2-thread time swings with their load while a 1-thread time does not;
    * *warm-up* (``warmup`` untimed calls per function first: the first calls allocate buffers and
      pick kernels);
    * *the median of interleaved pairs* (:func:`~kdsl.runtime.timing.ratio_of_pairs`): each round
      times every lane back to back, and a layer's ratio is the median of the rounds' ratios, which
      a slow spell scales away (the ratio of the two medians moves with it);
    * *enough rounds*: at least ``repeats``, and more (up to ``max_repeats``) while some ratio's
      rounds scatter by more than ``spread`` (their interquartile range over their median,
      :func:`~kdsl.runtime.timing.ratio_spread`).

    Metrics: per lane its summed medians (:data:`LANE_MS`: ``latency_ms`` eager PyTorch,
    ``baseline_latency_ms`` ``F.conv2d``, ``tvm_latency_ms``, ``baseline_tvm_latency_ms``; the
    baselines' are the *paired* times, measured in the same rounds as this candidate) and
    ``{lane}_ms_by_layer`` forms of them (``latency_ms_by_layer``, ...); per ratio of
    :data:`RATIOS` the layers' ratios weighted by the baseline lane's time (the candidate's total
    time over the baseline's when each layer's ratio holds; < 1 is faster) and ``{ratio}_by_layer``;
    ``latency_ratio``, ``latency_ratio_by_layer`` (the ranked one), ``latency_backend``,
    ``latency_baseline_ms`` (the paired baseline time ``latency_ratio`` is relative to),
    ``latency_spread`` (the largest spread), ``latency_rounds`` (summed over layers),
    ``latency_threads``, ``latency_device``, and with TVM ``tvm_schedule`` and ``tvm_threads``.
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
        rank: str | None = None,
        device: str = "cpu",
        tuned: Mapping[str, str] | None = None,
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
        rank = rank or ("tvm" if "tvm" in backends else "torch")
        if rank not in backends:
            raise SearchError(f"latency: ranking by {rank!r} needs it among the backends {list(backends)!r}")
        if device not in ("cpu", "cuda"):
            raise SearchError(f"unknown latency device {device!r}: use cpu or cuda")
        if device == "cuda" and "tvm" in backends:
            raise SearchError(
                "latency on cuda times PyTorch only (kdsl's TVM kernels run on the CPU): use the torch backend"
            )
        if tuned is not None and not {"db", "lookup"} <= set(tuned):
            raise SearchError(f"latency: tuned must be {{'db': PATH, 'lookup': 'module:function'}}, got {tuned!r}")
        self.backends, self.rank, self.device = tuple(backends), rank, device
        self.tuned = dict(tuned) if tuned is not None else None
        self.repeats, self.target = repeats, target
        self.baseline, self.threads, self.seed = baseline, threads, seed
        self.warmup, self.max_repeats, self.spread = warmup, max_repeats, spread
        self._baselines: dict[tuple[str, Any], tuple[Callable[[], Any], bool]] = {}

    def _schedule(self, op: Operator, binding: Mapping[str, int]) -> Any:
        """The tuned schedule of ``op`` at ``layer`` (a ``Lowered -> Schedule`` function), or
        ``"default"`` when there is no usable record."""
        if self.tuned is None:
            return "default"
        found = _schedule_lookup(self.tuned["lookup"])(self.tuned["db"], op, dict(binding))
        return "default" if found is None else found

    def _lane(self, lane: str, op: Operator, layer: Any) -> tuple[Callable[[], Any], bool]:
        """A call without arguments that runs ``lane`` of ``op`` at ``layer`` once (on the device,
        synchronized there), and whether it runs a tuned schedule."""
        import torch

        binding = bind(op, layer)
        generator = torch.Generator().manual_seed(self.seed)
        x = torch.randn(shapes(op, binding)["input"], generator=generator)
        if lane in ("tvm", "tvm_base"):
            schedule = self._schedule(op, binding)
            kernel = tvm_build(op, binding, schedule=schedule)
            weights = [torch.randn(shape, generator=generator) for shape in kernel.weight_shapes]
            out = torch.empty(kernel.output_shape)
            return (lambda: kernel(x, *weights, out=out)), schedule != "default"
        device = torch.device(self.device)
        x = x.to(device)
        if lane == "native":
            module = build(op, binding)
            weights = [weight.detach().to(device) for weight in module.weights]
            function = native_function(self.baseline, x, weights, dict(binding))
        else:
            module = build(op, binding).eval().to(device)

            def function() -> Any:
                with torch.no_grad():
                    return module(x)

        if device.type != "cuda":
            return function, False

        def synchronized() -> Any:  # a CUDA call returns before the kernel ends: wait for it
            result = function()
            torch.cuda.synchronize(device)
            return result

        return synchronized, False

    def _base_lane(self, lane: str, layer: Any) -> tuple[Callable[[], Any], bool]:
        """:meth:`_lane` of the baseline, built once per layer in a process (a worker evaluates
        many candidates on the same layers: conv2d's kernels need not be compiled for each)."""
        key = (lane, layer)
        if key not in self._baselines:
            self._baselines[key] = self._lane(lane, _baseline(self.baseline), layer)
        return self._baselines[key]

    def pairs(self, candidate: Callable[[], Any], baseline: Callable[[], Any]) -> tuple[list[float], list[float]]:
        """Seconds per call of the candidate and the baseline in each interleaved round (see
        :meth:`rounds`). The caller holds the latency slot."""
        mine, theirs = self.rounds([candidate, baseline], [(0, 1)])
        return mine, theirs

    def rounds(self, functions: Sequence[Callable[[], Any]], ratios: Sequence[tuple[int, int]]) -> list[list[float]]:
        """Seconds per call of each function in each interleaved round: at least ``repeats`` rounds,
        more (``repeats`` at a time, up to ``max_repeats``) while the rounds' ratios of some pair of
        ``ratios`` (indexes into ``functions``) scatter by more than ``spread``. The caller holds the
        latency slot."""
        samples = interleaved_samples(functions, repeats=self.repeats, target=self.target, warmup=self.warmup)

        def scatter() -> float:
            return max(ratio_spread(samples[a], samples[b]) for a, b in ratios)

        while len(samples[0]) < self.max_repeats and scatter() > self.spread:
            more = min(self.repeats, self.max_repeats - len(samples[0]))
            extra = interleaved_samples(functions, repeats=more, target=self.target, warmup=0)
            samples = [have + new for have, new in zip(samples, extra)]
        return samples

    def _prepare(self, op: Operator, layers: Sequence[Any]) -> tuple[dict[str, list[Callable[[], Any]]], Metrics]:
        """Every lane's call per layer (compiling everything before any timing), and what went
        wrong or was tuned, as metrics."""
        lanes: dict[str, list[Callable[[], Any]]] = {}
        if "torch" in self.backends:
            lanes["torch"] = [self._lane("torch", op, layer)[0] for layer in layers]
        lanes["native"] = [self._base_lane("native", layer)[0] for layer in layers]
        notes: Metrics = {}
        if "tvm" in self.backends:
            notes["tvm_threads"] = int(os.environ.get("TVM_NUM_THREADS", "0") or 0) or None
            try:
                built = [self._lane("tvm", op, layer) for layer in layers]
            except Exception as error:  # any failure to lower or compile: recorded, the rest still measured
                first = (str(error).strip().splitlines() or [""])[0]
                notes["tvm_error"] = f"the TVM kernel failed to build: {type(error).__name__}: {first[:300]}"
                return lanes, notes
            base_built = [self._base_lane("tvm_base", layer) for layer in layers]
            lanes["tvm"], lanes["tvm_base"] = [f for f, _ in built], [f for f, _ in base_built]
            tuned = sum(t for _, t in built)
            notes["tvm_schedule"] = (
                "default" if not tuned else f"tuned on {tuned} of {len(layers)} layers, default elsewhere"
            )
            if any(t for _, t in base_built):
                notes["tvm_schedule"] += "; conv2d tuned where it has records"
        return lanes, notes

    def evaluate(self, op: Operator, context: Context | Mapping[str, Any] | None = None) -> Metrics:
        import torch

        context = Context.of(context)
        threads = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            # compile everything first (may run in parallel with other workers), then time
            layers = with_widths(op, self.layers, context.widths)
            lanes, notes = self._prepare(op, layers)
            names = list(lanes)
            ratios = {name: pair for name, pair in RATIOS.items() if pair[0] in lanes and pair[1] in lanes}
            indexes = [(names.index(a), names.index(b)) for a, b in ratios.values()]
            metrics: Metrics = {"latency_threads": torch.get_num_threads(), "latency_device": self.device, **notes}
            times: dict[str, dict[str, float]] = {lane: {} for lane in names}
            by_layer: dict[str, dict[str, float]] = {name: {} for name in ratios}
            spreads, rounds = [], 0
            with context.latency_slot():
                for number, layer in enumerate(layers):
                    samples = self.rounds([lanes[lane][number] for lane in names], indexes)
                    for lane, each in zip(names, samples):
                        times[lane][layer.name] = median(each) * 1e3
                    for name, (i, j) in zip(ratios, indexes):
                        by_layer[name][layer.name] = ratio_of_pairs(samples[i], samples[j])
                        spreads.append(ratio_spread(samples[i], samples[j]))
                    rounds += len(samples[0])
        finally:
            torch.set_num_threads(threads)
        for lane in names:
            metrics[LANE_MS[lane]] = sum(times[lane].values())
            metrics[f"{LANE_MS[lane]}_by_layer"] = times[lane]
        for name, (_, denominator) in ratios.items():
            weighted = sum(times[denominator][k] * r for k, r in by_layer[name].items())
            metrics[name] = _ratio(weighted, sum(times[denominator].values()))
            metrics[f"{name}_by_layer"] = by_layer[name]
        ranked = "tvm_latency_ratio" if self.rank == "tvm" else "torch_ratio"
        metrics["latency_backend"] = self.rank
        metrics["latency_ratio"] = metrics.get(ranked)
        metrics["latency_ratio_by_layer"] = metrics.get(f"{ranked}_by_layer")
        metrics["latency_baseline_ms"] = metrics.get(LANE_MS[RATIOS[ranked][1]]) if ranked in metrics else None
        metrics["latency_spread"] = max(spreads)
        metrics["latency_rounds"] = rounds
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
