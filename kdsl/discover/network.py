"""ResNet-18's end-to-end latency with its stage 3x3 convolutions replaced (``kdsl bench network``,
and the end-to-end section of a discovery's report).

:func:`resnet18` is ResNet-18 (He et al. 2016, the ImageNet variant: a 7x7 stride-2 stem and 3x3
max pooling, four stages of two basic blocks at 64, 128, 256 and 512 channels, global average
pooling and a linear classifier) written here, with random weights (nothing is downloaded). Every
3x3 convolution that keeps its shape (stride 1, ``Cin = Cout``: 13 of the 16 block convolutions,
the layers of the ``resnet18`` layer table) is an operator of kdsl; the stem, the three stride-2
3x3 convolutions that open stages 3-5 and their 1x1 projection shortcuts stay PyTorch's
``conv2d``. With no operator the network is the original one, ``conv2d`` everywhere.

:func:`network_latency` times, in one run, each operator's network against the original network:

- backend ``torch`` (eager): the replaced convolutions are kdsl's generated ``nn.Module``\\ s
  (:func:`kdsl.codegen.torch.build`); the original network uses ``torch.nn.Conv2d``;
- backend ``tvm``: the replaced convolutions are kdsl's TVM kernels with the default schedule
  (:func:`kdsl.codegen.tvm.build`, torch tensors in and out), the rest of the network stays
  PyTorch; its original network is the same network with ``conv2d`` lowered through kdsl's TVM,
  and PyTorch's native original network is timed beside it as the reference.

Each backend runs in its own worker process (TVM pins its threads and slows PyTorch down in the
same process, see TVM.md; the TVM worker, which runs both, unpins TVM's threads and keeps them from spinning:
:func:`kdsl.runtime.threads.shared_process_environment`). In a
worker, every network of one batch size is timed in the same rounds, in alternation
(:func:`kdsl.runtime.timing.interleaved_samples`), holding the machine's latency slot; a ratio is
the median over rounds of the ratio within a round (:func:`~kdsl.runtime.timing.ratio_of_pairs`).

>>> [(layer.name, layer["Cin"], layer["H"]) for layer in stage_layers(batch=8, resolution=64)]
[('conv2_x', 64, 16), ('conv3_x', 128, 8), ('conv4_x', 256, 4), ('conv5_x', 512, 2)]
>>> parse_op_spec("grouped_conv2d:G=2")
('grouped_conv2d', {'G': 2})
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from kdsl import gallery
from kdsl.codegen.torch import build, load_torch
from kdsl.discover.proxy import conv_shape_mismatch
from kdsl.lang import library
from kdsl.lang.errors import KdslError, ShapeError, printable
from kdsl.lang.operator import Operator
from kdsl.lang.serialize import from_json, to_json
from kdsl.runtime.threads import shared_process_environment
from kdsl.runtime.timing import interleaved_samples, latency_slot, ratio_of_pairs, ratio_spread
from kdsl.search.store import candidate
from kdsl.solve import bind, shapes
from kdsl.solve.layers import Layer

__all__ = [
    "BACKENDS",
    "NetworkOp",
    "network_latency",
    "parse_op_spec",
    "resnet18",
    "resolve_ops",
    "stage_layers",
    "tvm_network",
]

#: the backends a row is timed on
BACKENDS = ("torch", "tvm")
#: ResNet-18's stages: (layer name, width, stride of the stage's first block)
STAGES = (("conv2_x", 64, 1), ("conv3_x", 128, 2), ("conv4_x", 256, 2), ("conv5_x", 512, 2))
#: the operator of the original network, the one every ratio compares against
BASELINE = "conv2d"

_COEFFICIENTS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[0-9]+(,[A-Za-z_][A-Za-z0-9_]*=[0-9]+)*", re.ASCII)


def stage_layers(batch: int = 1, resolution: int = 224) -> tuple[Layer, ...]:
    """The four layers the replaced convolutions serve (one per stage, ``Cin = Cout``), for an input
    of ``batch`` images of ``resolution`` x ``resolution`` pixels; at 224 and batch 1 it is the
    built-in ``resnet18`` table.

    >>> from kdsl.solve.layers import load_layers
    >>> stage_layers() == load_layers("resnet18")
    True
    >>> stage_layers(resolution=100)
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.KdslError: the resolution must be a positive multiple of 32 (ResNet-18 halves it 5 times), got 100
    """
    if not isinstance(resolution, int) or resolution < 32 or resolution % 32:
        raise KdslError(
            f"the resolution must be a positive multiple of 32 (ResNet-18 halves it 5 times), got {resolution!r}"
        )
    if not isinstance(batch, int) or batch < 1:
        raise KdslError(f"the batch size must be a positive integer, got {batch!r}")
    layers = []
    for index, (name, width, _) in enumerate(STAGES):
        size = resolution // 4 // 2**index
        values = {"N": batch, "Cin": width, "Cout": width, "H": size, "W": size}
        layers.append(Layer(name, {**values, "M": batch * size * size, "L": size * size}))
    return tuple(layers)


def parse_op_spec(spec: str) -> tuple[str, dict[str, int]]:
    """An operator named on the command line, split into its reference (a gallery name, a file, or a
    results database key) and coefficient values given after a colon (``grouped_conv2d:G=2,K=3``).

    >>> parse_op_spec("conv2d"), parse_op_spec("my.dsl:K=5")
    (('conv2d', {}), ('my.dsl', {'K': 5}))
    """
    reference, colon, tail = spec.rpartition(":")
    if not colon or not _COEFFICIENTS.fullmatch(tail):
        return spec, {}
    values: dict[str, int] = {}
    for part in tail.split(","):
        name, value = part.split("=")
        if int(value) < 1:
            raise KdslError(f"{printable(spec)}: the coefficient {name} must be a positive integer, got {value}")
        if name in values:
            raise KdslError(f"{printable(spec)}: the coefficient {name} is given twice")
        values[name] = int(value)
    return reference, values


@dataclass(frozen=True)
class NetworkOp:
    """An operator to put in the network: its label in the table, the operator, and the coefficient
    values that override its defaults (``{}``: the operator's defaults, e.g. ``G=4`` for
    ``grouped_conv2d``)."""

    label: str
    op: Operator
    coefficients: Mapping[str, int] = field(default_factory=dict)

    def binding(self, layer: Layer) -> dict[str, int]:
        """The operator's binding on ``layer``; a :class:`ShapeError` unless it maps
        ``[N, Cin, H, W]`` to ``[N, Cout, H, W]`` there (the shape of the convolution it replaces)."""
        binding = bind(self.op, layer, dict(self.coefficients))
        sizes = shapes(self.op, binding)
        wanted = conv_shape_mismatch(sizes, layer)
        if wanted is not None:
            raise ShapeError(
                f"{self.label} cannot replace ResNet-18's 3x3 convolutions at {layer.name}: they map "
                f"[N, Cin, H, W] = {wanted[0]} -> {wanted[1]}, the operator maps "
                f"{list(sizes['input'])} -> {list(sizes['output'])}"
            )
        return binding

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what a worker process receives)."""
        return {"label": self.label, "op": to_json(self.op), "coefficients": dict(self.coefficients)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NetworkOp:
        """The inverse of :meth:`to_dict`."""
        return cls(data["label"], from_json(data["op"]), dict(data["coefficients"]))


def resolve_ops(specs: Sequence[str | NetworkOp], db: str | None = None, resolution: int = 224) -> list[NetworkOp]:
    """Operators from command-line names (a gallery name, a ``.dsl``/``.json`` file, or with ``db`` a
    candidate key of a results database tried when the name is none of those; each optionally with
    ``:NAME=INT,...`` coefficients), checked on every stage layer at ``resolution``.

    >>> [item.label for item in resolve_ops(["conv2d", "grouped_conv2d:G=2"])]
    ['conv2d', 'grouped_conv2d:G=2']
    >>> resolve_ops(["grouped_conv2d:Q=2"])
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.KdslError: grouped_conv2d:Q=2: grouped_conv2d has no coefficient Q (its coefficients: G, K)
    """
    if not specs:
        raise KdslError("give at least one operator (--ops conv2d grouped_conv2d ...)")
    resolved = []
    for spec in specs:
        if isinstance(spec, NetworkOp):
            item = spec
        else:
            reference, coefficients = parse_op_spec(spec)
            op = _load(reference, db)
            known = op.coefficient_variables
            for name in coefficients:
                if name not in known:
                    listed = ", ".join(known) or "none"
                    raise KdslError(
                        f"{printable(spec)}: {printable(reference)} has no coefficient {name} "
                        f"(its coefficients: {listed})"
                    )
            item = NetworkOp(spec, op, coefficients)
        for layer in stage_layers(1, resolution):
            item.binding(layer)
        resolved.append(item)
    labels = [item.label for item in resolved]
    for label in labels:
        if labels.count(label) > 1:
            raise KdslError(f"the operator {printable(label)} is given twice")
    return resolved


def _load(reference: str, db: str | None) -> Operator:
    named = (
        reference in library.names() or Path(reference).suffix in (".dsl", ".py", ".json") or Path(reference).exists()
    )
    if db is not None and not named:
        return candidate(db, reference)
    return library.load_operator(reference)


# ---------------------------------------------------------------------------------------------
# The network


def _modules() -> Any:
    """The network's module classes, defined on first use (``import kdsl`` does not import torch)."""
    torch = load_torch()
    nn = torch.nn

    class Replaced(nn.Module):
        """One replaced 3x3 convolution: ``inner`` is the operator's module (or a TVM kernel's)."""

        def __init__(self, inner: Any, item: NetworkOp | None, binding: dict[str, int]) -> None:
            super().__init__()
            self.inner, self.item, self.binding = inner, item, binding

        def forward(self, x: Any) -> Any:
            return self.inner(x)

    class TvmConv(nn.Module):
        """A TVM kernel with the weights of the PyTorch module it stands for (shared, not copied)."""

        def __init__(self, kernel: Any, weights: Sequence[Any]) -> None:
            super().__init__()
            self.kernel = kernel
            self.weights = nn.ParameterList(weights)

        def forward(self, x: Any) -> Any:
            return self.kernel(x, *self.weights)

    class BasicBlock(nn.Module):
        def __init__(self, conv1: Any, conv2: Any, width: int, shortcut: Any | None) -> None:
            super().__init__()
            self.conv1, self.bn1 = conv1, nn.BatchNorm2d(width)
            self.conv2, self.bn2 = conv2, nn.BatchNorm2d(width)
            self.shortcut = shortcut

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.shortcut is None else self.shortcut(x)))

    class ResNet18(nn.Module):
        def __init__(self, stem: Any, stages: Any, classes: int) -> None:
            super().__init__()
            self.stem, self.stages = stem, stages
            self.fc = nn.Linear(STAGES[-1][1], classes)

        def forward(self, x: Any) -> Any:
            return self.fc(torch.flatten(self.stages(self.stem(x)).mean(dim=(2, 3)), 1))

    return Replaced, TvmConv, BasicBlock, ResNet18


def resnet18(
    item: NetworkOp | None = None, *, batch: int = 1, resolution: int = 224, classes: int = 1000, seed: int = 0
) -> Any:
    """ResNet-18 (an ``nn.Module`` in eval mode, random weights drawn after ``torch.manual_seed(seed)``)
    with its stage 3x3 convolutions replaced by ``item``'s operator built for ``batch`` images of
    ``resolution`` pixels; ``item=None``: the original network (``nn.Conv2d`` everywhere).

    >>> import torch
    >>> net = resnet18(classes=10, resolution=32)
    >>> tuple(net(torch.zeros(2, 3, 32, 32)).shape), sum(p.numel() for p in net.parameters())
    ((2, 10), 11181642)
    """
    torch = load_torch()
    nn = torch.nn
    Replaced, _, BasicBlock, ResNet18 = _modules()
    if not isinstance(classes, int) or classes < 1:
        raise KdslError(f"the number of classes must be a positive integer, got {classes!r}")
    layers = stage_layers(batch, resolution)
    torch.manual_seed(seed)

    def replaced(layer: Layer, name: str) -> Any:
        width = layer["Cout"]
        if item is None:
            return nn.Conv2d(width, width, 3, padding=1, bias=False)
        binding = item.binding(layer)
        return Replaced(build(item.op, binding, name=name), item, binding)

    stem = nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1),
    )
    stages = []
    previous = 64
    for layer, (name, width, stride) in zip(layers, STAGES):
        blocks = []
        for index in range(2):
            if index == 0 and stride != 1:
                # the stage's first conv halves the resolution and widens: PyTorch's conv2d, with a
                # 1x1 stride-2 projection on the shortcut
                conv1 = nn.Conv2d(previous, width, 3, stride=stride, padding=1, bias=False)
                shortcut = nn.Sequential(
                    nn.Conv2d(previous, width, 1, stride=stride, bias=False), nn.BatchNorm2d(width)
                )
            else:
                conv1, shortcut = replaced(layer, f"{name}_block{index}_conv1"), None
            conv2 = replaced(layer, f"{name}_block{index}_conv2")
            blocks.append(BasicBlock(conv1, conv2, width, shortcut))
        stages.append(nn.Sequential(*blocks))
        previous = width
    net = ResNet18(stem, nn.Sequential(*stages), classes).eval()
    # what its layers were bound for: kdsl kernels compiled for the network later need the same sizes
    net.batch, net.resolution = batch, resolution
    return net


def tvm_network(net: Any, kernels: dict[tuple[str, str], Any] | None = None) -> Any:
    """A copy of ``net`` (a :func:`resnet18` with an operator) whose replaced convolutions run as
    kdsl's TVM kernels (default schedule), with the same weights; ``kernels`` caches compiled
    kernels by (operator text, binding) across calls."""
    _, TvmConv, _, _ = _modules()
    from kdsl.codegen.tvm import build as tvm_build

    kernels = {} if kernels is None else kernels
    result = copy.deepcopy(net)
    swapped = 0
    for module in result.modules():
        item, binding = getattr(module, "item", None), getattr(module, "binding", None)
        if item is None or binding is None:
            continue
        key = (to_json(item.op), json.dumps(binding, sort_keys=True))
        if key not in kernels:
            kernels[key] = tvm_build(item.op, binding)
        module.inner = TvmConv(kernels[key], list(module.inner.weights))
        swapped += 1
    if not swapped:
        raise KdslError("tvm_network needs a network built with an operator (resnet18(item)), got the original one")
    return result.eval()


# ---------------------------------------------------------------------------------------------
# Timing


def _same_as_baseline(item: NetworkOp) -> bool:
    return item.op.key == gallery.load(BASELINE).key and not item.coefficients


def _time_batch(
    backend: str, items: Sequence[NetworkOp], batch: int, config: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Rows of one backend at one batch size: every network timed in the same rounds."""
    torch = load_torch()
    resolution, classes, seed = config["resolution"], config["classes"], config["seed"]
    start = time.perf_counter()
    networks: dict[str, Any] = {"native": resnet18(batch=batch, resolution=resolution, classes=classes, seed=seed)}
    kernels: dict[tuple[str, str], Any] = {}
    if backend == "tvm":
        base = NetworkOp(BASELINE, gallery.load(BASELINE))
        networks["baseline"] = tvm_network(resnet18(base, batch=batch, resolution=resolution, classes=classes), kernels)
    for item in items:
        if backend == "tvm" and _same_as_baseline(item):
            continue  # its network is the baseline's
        net = resnet18(item, batch=batch, resolution=resolution, classes=classes, seed=seed)
        networks[item.label] = tvm_network(net, kernels) if backend == "tvm" else net
    device = config.get("device", "cpu")
    x = torch.randn(batch, 3, resolution, resolution, generator=torch.Generator().manual_seed(seed))
    if device != "cpu":
        networks = {name: net.to(device) for name, net in networks.items()}
        x = x.to(device)
    build_seconds = time.perf_counter() - start
    names = list(networks)
    if device == "cuda":  # a GPU runs asynchronously: a call is over when the device is done
        functions = [lambda net=networks[name]: (net(x), torch.cuda.synchronize()) for name in names]
    else:
        functions = [lambda net=networks[name]: net(x) for name in names]
    base_name = "baseline" if backend == "tvm" else "native"
    base_index = names.index(base_name)

    def widest(rounds: list[list[float]]) -> float:
        others = [index for index in range(len(names)) if index != base_index]
        return max((ratio_spread(rounds[i], rounds[base_index]) for i in others), default=0.0)

    repeats, most = config["repeats"], max(config["repeats"], config["max_repeats"])
    with torch.no_grad(), latency_slot():
        rounds = interleaved_samples(functions, repeats=repeats, target=config["target"], warmup=2)
        # more rounds while a ratio's rounds scatter (a shared machine's load comes and goes)
        while len(rounds[0]) < most and widest(rounds) > config["spread"]:
            more = min(repeats, most - len(rounds[0]))
            extra = interleaved_samples(functions, repeats=more, target=config["target"], warmup=0)
            rounds = [mine + theirs for mine, theirs in zip(rounds, extra)]
    samples = dict(zip(names, rounds))
    rows = []

    def row(label: str, name: str) -> dict[str, Any]:
        return {
            "op": label,
            "backend": backend,
            "batch": batch,
            "ms": median(samples[name]) * 1e3,
            "ratio": ratio_of_pairs(samples[name], samples[base_name]),
            "spread": ratio_spread(samples[name], samples[base_name]),
            "vs_native": ratio_of_pairs(samples[name], samples["native"]),
            "rounds": len(samples[name]),
            "threads": torch.get_num_threads(),
            "device": device,
            "build_s": build_seconds,
        }

    rows.append(
        row("original (native conv2d)" if backend == "torch" else "original (native conv2d, reference)", "native")
    )
    if backend == "tvm":
        rows.append(row("original (kdsl TVM conv2d)", "baseline"))
    for item in items:
        rows.append(row(item.label, "baseline" if backend == "tvm" and _same_as_baseline(item) else item.label))
    return rows


def _worker(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    torch = load_torch()
    torch.set_num_threads(payload["threads"])
    items = [NetworkOp.from_dict(each) for each in payload["ops"]]
    rows = []
    for batch in payload["batches"]:
        rows += _time_batch(payload["backend"], items, batch, payload)
    return rows


def network_latency(
    ops: Sequence[str | NetworkOp],
    batches: Sequence[int] = (1, 8),
    backends: Sequence[str] = BACKENDS,
    *,
    db: str | None = None,
    resolution: int = 224,
    classes: int = 1000,
    threads: int = 2,
    repeats: int = 5,
    max_repeats: int = 15,
    spread: float = 0.15,
    target: float = 0.3,
    seed: int = 0,
    device: str = "cpu",
    progress: Any | None = None,
) -> list[dict[str, Any]]:
    """ResNet-18's end-to-end forward latency with each operator in its stage 3x3 convolutions,
    against the original network, per backend and batch size: one row per (operator, backend,
    batch) plus the original networks' rows (``op`` starts with ``original``), each with ``ms``
    (median over rounds), ``ratio`` (to the backend's original network: native ``conv2d`` for
    ``torch``, kdsl's TVM ``conv2d`` for ``tvm``), ``vs_native`` (to PyTorch's native original
    network), ``spread`` (:func:`~kdsl.runtime.timing.ratio_spread` of ``ratio``), ``rounds``,
    ``threads`` and ``build_s``. Each backend is timed in its own worker process with ``threads``
    threads; ``target`` is about how many seconds each network runs per round; after ``repeats``
    rounds, ``repeats`` more are timed (up to ``max_repeats``) while a ratio's spread exceeds
    ``spread``. ``device``: ``"cpu"``, or ``"cuda"`` to run the PyTorch networks on the GPU (each
    call synchronized; kdsl's TVM kernels are not wired into a network on CUDA yet, so ``"tvm"`` is
    refused there). ``progress`` is called with a line before each backend's worker starts.
    """
    if device not in ("cpu", "cuda"):
        raise KdslError(f"unknown device {device!r} for the network latency: use cpu or cuda")
    if device == "cuda" and "tvm" in backends:
        raise KdslError(
            "--device cuda times the PyTorch networks only (--backends torch): kdsl's TVM CUDA kernels "
            "are not wired into a network yet"
        )
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        raise KdslError(f"backends must be some of {', '.join(BACKENDS)}, got {list(backends)!r}")
    if not batches or any(not isinstance(b, int) or b < 1 for b in batches):
        raise KdslError(f"batch sizes must be positive integers, got {list(batches)!r}")
    for name, value, least in (("threads", threads, 1), ("repeats", repeats, 1), ("max_repeats", max_repeats, 1)):
        if not isinstance(value, int) or value < least:
            raise KdslError(f"{name} must be a positive integer, got {value!r}")
    if not target > 0 or not spread >= 0:
        raise KdslError(f"target must be a positive number of seconds and spread >= 0, got {target!r} and {spread!r}")
    items = resolve_ops(ops, db, resolution)
    payload = {
        "ops": [item.to_dict() for item in items],
        "batches": list(batches),
        "resolution": resolution,
        "classes": classes,
        "threads": threads,
        "repeats": repeats,
        "max_repeats": max_repeats,
        "spread": spread,
        "target": target,
        "seed": seed,
        "device": device,
    }
    rows = []
    for backend in backends:
        if progress is not None:
            progress(f"timing the {backend} networks (batch {', '.join(map(str, batches))})")
        environment = dict(os.environ, TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        if backend == "tvm":
            # PyTorch runs the rest of the network in the same process: TVM's threads unpinned and not spinning
            environment = shared_process_environment(threads)
        rows += run_worker("kdsl.discover.network", {**payload, "backend": backend}, environment, f"the {backend}")
    return rows


def run_worker(module: str, payload: Mapping[str, Any], environment: Mapping[str, str], what: str) -> list[Any]:
    """Run ``python -m MODULE --worker`` with ``payload`` as JSON on stdin and ``environment``; the rows
    it prints as its last line of JSON (a failure is a :class:`KdslError` that names ``what`` and
    ends with the worker's stderr)."""
    result = subprocess.run(
        [sys.executable, "-m", module, "--worker"],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=dict(environment),
    )
    if result.returncode != 0:
        raise KdslError(f"{what} network worker failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    """Worker entry point: read the payload on stdin, print the rows as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m kdsl.discover.network")
    parser.add_argument("--worker", action="store_true", required=True)
    parser.parse_args(argv)
    print(json.dumps(_worker(json.loads(sys.stdin.read()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
