"""Cheap pre-screening: scores that predict a candidate's proxy accuracy before it is trained.

Training a candidate costs seconds; these cost a fraction of that, so ``kdsl discover`` scores
many candidates and trains only the best-scored (see :mod:`kdsl.discover.loop`). Each score
builds the proxy network (:func:`kdsl.discover.proxy.proxy_net`) with the candidate, seeded
like the training run, on one batch of the proxy's training data:

- ``naswot`` (Mellor et al., "Neural Architecture Search without Training", 2021): the log
  determinant of the kernel of binary ReLU activation codes of the batch's images at
  initialization; a network whose units tell the images apart scores higher. Zero-cost: one
  forward pass.
- ``grad_norm``: the norm of the loss's gradient with respect to the candidate's weights at
  initialization. Zero-cost: one forward and backward pass.
- ``synflow`` (Tanaka et al., 2020): the sum of ``|θ · ∂R/∂θ|`` over the candidate's weights,
  where ``R`` is the output summed for an all-ones input through the network with every weight
  made positive (batch norm in evaluation mode); data-free.
- ``short``: validation accuracy after a short training run (``short_epochs``, default 1, on
  the same learning-rate schedule squeezed into it).

:func:`correlation` measures how well each ranks candidates against the full proxy accuracy
(Spearman's rank correlation), as ``kdsl bench prescreen`` does on a search store. Measured on
the default proxy (noisy, 2 shared cores): over the 15 gallery operators that fit the proxy and
3 weak ones (accuracies 0.31 to 0.96), ``short`` 0.79 (1 epoch, 1.3 s a candidate; 2 epochs:
0.88), ``grad_norm`` 0.66,
``naswot`` 0.47, ``synflow`` 0.22 (0.2 s for all three), full training 11.8 s (``kdsl bench
prescreen --gallery``); over 16 random candidates of a search store (``kdsl bench prescreen``;
accuracies mostly 0.49 to 0.54) none predicts (-0.27 to -0.10). ``kdsl discover`` screens with
``grad_norm`` by default.

>>> from kdsl import gallery
>>> config = ProxyConfig(widths=(8,), image_size=8)
>>> scores = zero_cost(gallery.load("conv2d"), config)
>>> sorted(scores), all(isinstance(v, float) for v in scores.values())
(['grad_norm', 'naswot', 'synflow'], True)
>>> spearman([1, 2, 3, 4], [10, 20, 40, 30])
0.8
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kdsl.codegen.torch import load_torch
from kdsl.discover.evaluators import Context, Evaluator, Metrics
from kdsl.discover.proxy import ProxyConfig, load_data, proxy_net, train
from kdsl.lang.errors import SearchError
from kdsl.lang.operator import Operator

__all__ = ["METHODS", "PrescreenEvaluator", "correlation", "score", "spearman", "zero_cost"]

#: Every pre-screening score; the zero-cost ones come from one call of :func:`zero_cost`.
METHODS = ("naswot", "grad_norm", "synflow", "short")
ZERO_COST = ("naswot", "grad_norm", "synflow")


def _candidate_parameters(model: Any) -> list[Any]:
    return [p for name, p in model.named_parameters() if ".conv1." in name or ".conv2." in name]


def zero_cost(
    op: Operator, config: ProxyConfig | None = None, widths: Mapping[str, Mapping[str, int]] | None = None
) -> dict[str, float]:
    """The zero-cost scores ``naswot``, ``grad_norm`` and ``synflow`` of ``op`` (higher is better).

    A score that cannot be computed (e.g. no candidate weights for ``grad_norm``) is 0; a NaN or
    infinite one is -inf for ``naswot`` (a collapsed kernel) and 0 otherwise.
    """
    torch = load_torch()
    config = config or ProxyConfig()
    train_x, train_y, _, _ = load_data(config)
    generator = torch.Generator().manual_seed(config.seed)
    batch = torch.randperm(len(train_y), generator=generator)[: config.batch_size]
    x, y = train_x[batch], train_y[batch]
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        torch.manual_seed(config.seed)
        model = proxy_net(op, config, widths)
        scores = {"naswot": _naswot(torch, model, x), "grad_norm": _grad_norm(torch, model, x, y)}
        scores["synflow"] = _synflow(torch, model, x.shape)
    finally:
        torch.set_num_threads(threads)
    return {k: (v if math.isfinite(v) else (-math.inf if k == "naswot" else 0.0)) for k, v in scores.items()}


def _naswot(torch: Any, model: Any, x: Any) -> float:
    codes: list[Any] = []

    def hook(module: Any, inputs: Any, output: Any) -> None:
        codes.append((output.detach().flatten(1) > 0).double())

    # the sign pattern of every ReLU's input: the stem's ReLU modules, and in each residual block
    # the first batch norm (relu(bn1(...)) follows it) and the block's output (a ReLU's)
    watched = [m for m in model.modules() if isinstance(m, torch.nn.ReLU)]
    for module in model.modules():
        if hasattr(module, "conv1") and hasattr(module, "bn1"):
            watched += [module.bn1, module]
    handles = [m.register_forward_hook(hook) for m in watched]
    model.train()
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    c = torch.cat(codes, dim=1)
    kernel = c @ c.T + (1 - c) @ (1 - c).T
    sign, logdet = torch.linalg.slogdet(kernel)
    return float(logdet) if float(sign) > 0 else -math.inf


def _grad_norm(torch: Any, model: Any, x: Any, y: Any) -> float:
    params = _candidate_parameters(model)
    if not params:
        return 0.0
    model.train()
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    total = sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None)
    model.zero_grad(set_to_none=True)
    return math.sqrt(total)


def _synflow(torch: Any, model: Any, shape: Sequence[int]) -> float:
    params = _candidate_parameters(model)
    if not params:
        return 0.0
    model = model.double().eval()
    signs = {}
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if p.is_floating_point():
                signs[name] = torch.sign(p)
                p.abs_()
    model.zero_grad(set_to_none=True)
    ones = torch.ones((1, *shape[1:]), dtype=torch.float64)
    model(ones).sum().backward()
    total = sum(float((p.detach() * p.grad).abs().sum()) for p in _candidate_parameters(model) if p.grad is not None)
    # a log keeps scores of deep and shallow candidates comparable in size (the ranking is the same)
    return math.log(total) if total > 0 else 0.0


def score(
    op: Operator,
    method: str,
    config: ProxyConfig | None = None,
    widths: Mapping[str, Mapping[str, int]] | None = None,
    short_epochs: int = 1,
) -> float:
    """One pre-screening score of ``op`` (see :data:`METHODS`); higher predicts more accurate."""
    config = config or ProxyConfig()
    if method in ZERO_COST:
        return zero_cost(op, config, widths)[method]
    if method == "short":
        return float(train(op, replace(config, epochs=short_epochs), widths=widths)["accuracy"])
    raise SearchError(f"unknown pre-screening method {method!r}; use one of {', '.join(METHODS)}")


class PrescreenEvaluator(Evaluator):
    """An evaluator (``{"class": "kdsl.discover.prescreen:PrescreenEvaluator", "method": ...}``)
    that reports ``prescreen`` (the score of ``method``) and ``prescreen_seconds``, so the main
    job screens candidates in its worker processes, under their timeout. Other keyword arguments
    are :class:`ProxyConfig` fields."""

    name = "prescreen"

    def __init__(self, method: str = "grad_norm", short_epochs: int = 1, **config: Any) -> None:
        if method not in METHODS:
            raise SearchError(f"unknown pre-screening method {method!r}; use one of {', '.join(METHODS)}")
        self.config = ProxyConfig.of(config)
        self.method, self.short_epochs = method, short_epochs

    def evaluate(self, op: Operator, context: Context | Mapping[str, Any] | None = None) -> Metrics:
        start = time.perf_counter()
        value = score(op, self.method, self.config, Context.of(context).widths, self.short_epochs)
        return {"prescreen": value, "prescreen_method": self.method, "prescreen_seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------------------------------
# How well a score predicts


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of two equally long sequences (ties get their mean rank)."""
    if len(a) != len(b) or len(a) < 2:
        raise SearchError(f"rank correlation needs two sequences of one length >= 2, got {len(a)} and {len(b)}")
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    return round(cov / math.sqrt(va * vb), 6) if va and vb else 0.0


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def correlation(
    candidates: Sequence[tuple[str, Operator, Mapping[str, Any] | None]],
    config: ProxyConfig | None = None,
    methods: Sequence[str] = METHODS,
    short_epochs: int = 1,
    stream: Any = None,
) -> dict[str, Any]:
    """Score each ``(name, op, widths)`` with every method and train it fully; return per method
    the Spearman correlation with the full accuracy and its seconds per candidate, and the rows.
    A candidate that fails to build or train is left out (and listed under ``failed``)."""
    config = config or ProxyConfig()
    rows, failed = [], []
    seconds = dict.fromkeys([*methods, "full"], 0.0)
    for name, op, widths in candidates:
        row: dict[str, Any] = {"name": name}
        try:
            if any(m in ZERO_COST for m in methods):
                start = time.perf_counter()
                row.update({k: v for k, v in zero_cost(op, config, widths).items() if k in methods})
                spent = (time.perf_counter() - start) / max(1, sum(m in ZERO_COST for m in methods))
                for m in methods:
                    if m in ZERO_COST:
                        seconds[m] += spent
            if "short" in methods:
                start = time.perf_counter()
                row["short"] = score(op, "short", config, widths, short_epochs)
                seconds["short"] += time.perf_counter() - start
            start = time.perf_counter()
            row["accuracy"] = float(train(op, config, widths=widths)["accuracy"])
            seconds["full"] += time.perf_counter() - start
        except Exception as error:  # a candidate that does not build is no measurement
            failed.append(f"{name}: {type(error).__name__}: {str(error)[:200]}")
            continue
        rows.append(row)
        if stream is not None:
            stream.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
            stream.write("\n")
            stream.flush()
    accuracy = [row["accuracy"] for row in rows]
    result: dict[str, Any] = {"candidates": len(rows), "failed": failed, "rows": rows, "methods": {}}
    for m in methods:
        values = [row[m] if math.isfinite(row[m]) else -1e300 for row in rows]
        result["methods"][m] = {
            "spearman": spearman(values, accuracy) if len(rows) >= 2 else None,
            "seconds_per_candidate": seconds[m] / max(1, len(rows)),
        }
    result["full_seconds_per_candidate"] = seconds["full"] / max(1, len(rows))
    return result
