"""``kdsl tune --network resnet18``: tune every kdsl layer of ResNet-18 with one shared trial budget,
compile the network with the tuned kernels, and time it end to end against PyTorch's ResNet-18.

The network is :func:`kdsl.discover.network.resnet18` with an operator in its 13 stride-1 3x3
convolutions: 4 distinct layers (``conv2_x`` runs 4 times a pass, ``conv3_x``..``conv5_x`` 3 times)
at each batch size, the tasks :func:`kdsl.tune.network.tune_network` shares the budget among.

:func:`compile_network` puts the tuned kernels (the best record in the database, else the default
schedule) into the network, in one of three layouts (:data:`LAYOUTS`):

- ``plain``: kernels read and write ``NCHW``, as :func:`~kdsl.discover.network.tvm_network`'s do;
- ``blocked``: kernels read and write channel-blocked ``NCHW[b]c`` tensors
  (:mod:`kdsl.codegen.tvm.signature_layout`), but every activation between layers stays ``NCHW``:
  each kernel call pays a transform in and a transform out (layouts chosen per layer, none propagated);
- ``propagated``: the same kernels, and the activations stay blocked between consecutive kdsl layers
  (ALT's layout propagation): batch norm (folded into a per-channel scale and shift), ReLU and the
  residual add run on blocked tensors, and a transform is paid only where a PyTorch convolution
  (the stride-2 convolutions and their 1x1 shortcuts) needs ``NCHW``. The classifier's average
  pooling reads a blocked tensor directly (the mean over ``H, W`` of ``[N, C/b, H, W, b]`` is the
  channels in order).

All three fold batch norm the same way, so they differ only in layouts and transforms. By default
(``fuse=True``) each kdsl kernel also computes the glue after it (:mod:`kdsl.codegen.tvm.epilogue`): the
folded batch norm and the ReLU after a block's first convolution, and the batch norm, the residual add
and the ReLU after its second, so no PyTorch operator runs between a kdsl kernel and the next one's
input; ``fuse=False`` runs that glue as PyTorch operators (the comparison row of :func:`time_compiled`).
By default (``prepack=True``) each kernel takes the weights its schedule packs already packed
(:mod:`kdsl.codegen.tvm.prepack`), packed once when the network is compiled instead of on every call;
``prepack=False`` packs them in the kernel per call (the row :data:`PER_CALL`). ``kdsl tune --network``
tunes each layer in the signature its kernel runs: weights packed once, outside the measured time
(``NetworkTask.prepacked``, records under a task of their own), and a prepacked kernel takes its schedule
from those records; the per-call row from the per-call ones (either falls back to the other's records,
then to the default schedule: :func:`compile_network`).

>>> item = resolve_ops(["conv2d"], resolution=32)[0]
>>> [(task.label, task.weight) for task in network_tasks(item, [1], 32, replace="3x3")]
[('conv2_x N=1', 4), ('conv3_x N=1', 3), ('conv4_x N=1', 3), ('conv5_x N=1', 3)]
>>> len(network_tasks(item, [1], 32))  # replace="all", the default: the 7 strided convs, max pool and head too
13
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from statistics import median
from typing import Any

from kdsl.bench.argument_types import positive_int
from kdsl.bench.network_head import head_module, head_op, head_tasks, network_kernel
from kdsl.bench.network_strided import (
    REPLACE,
    max_pool_binding,
    max_pool_op,
    strided_modules,
    strided_op,
    strided_tasks,
)
from kdsl.codegen.torch import load_torch
from kdsl.codegen.tvm.epilogue import Epilogue, FusedKernel
from kdsl.codegen.tvm.kernel import outputs_filled_with_nan
from kdsl.codegen.tvm.signature_layout import blocked_shape, from_blocked, signature_name, to_blocked
from kdsl.discover.network import STAGES, NetworkOp, resnet18, resolve_ops, run_worker, stage_layers
from kdsl.lang.errors import KdslError, printable
from kdsl.runtime.threads import shared_process_environment
from kdsl.runtime.timing import interleaved_samples, latency_slot, ratio_of_pairs
from kdsl.runtime.units import faster_or_slower
from kdsl.tune.driver import check_options
from kdsl.tune.network import NetworkTask, TaskSummary, tune_network

__all__ = [
    "LAYOUTS",
    "NETWORKS",
    "ONLY_3X3",
    "PER_CALL",
    "REPLACE",
    "UNFUSED",
    "add_network_arguments",
    "command_tune_network",
    "compile_network",
    "network_tasks",
    "time_compiled",
    "time_networks",
]

#: the networks ``kdsl tune --network`` knows
NETWORKS = ("resnet18",)
#: how the compiled network passes activations between its kdsl layers (see the module docstring)
LAYOUTS = ("plain", "blocked", "propagated")
#: the row of the propagated network whose blocked kernels run the plain signature's records (as before
#: kernels were tuned blocked), timed beside the one that runs the records tuned blocked
PLAIN_RECORDS = "kdsl tuned NCHW, run blocked, propagated"
#: the row of the network whose glue (batch norm, ReLU, residual add) runs as PyTorch operators
UNFUSED = "kdsl tuned, plain, glue in PyTorch"
#: the row of the network whose kernels pack their weights on every call (not once, when compiled)
PER_CALL = "kdsl tuned, plain, weights packed per call"
#: the row of the tuned plain network with kdsl kernels in its 13 stride-1 3x3 convolutions only (the
#: stem, the stride-2 convolutions and their shortcuts PyTorch's), timed beside the all-kdsl one
ONLY_3X3 = "kdsl tuned, plain, 3x3 convs only"


def network_tasks(
    item: NetworkOp,
    batches: Sequence[int],
    resolution: int = 224,
    block: int = 0,
    replace: str = "all",
    classes: int = 1000,
    prepacked: bool = False,
) -> list[NetworkTask]:
    """The tuning tasks of ResNet-18 with ``item`` in its stage convolutions: one per stage layer and
    batch size, weighted by how many times a forward pass runs it (the stage's first block has a
    stride-2 convolution in stages 3-5, so they run the layer 3 times, ``conv2_x`` 4 times),
    scaled by ``1 / batch``: the budget is shared by time saved per image. ``block > 0``: the kernels
    with the channel-blocked signature the blocked networks run (labelled with it, ``NCHW16c``).
    ``replace="all"``: with the plain signature, also the seven strided convolutions
    (:func:`kdsl.bench.network_strided.strided_tasks`), the max pooling and the head (the average pooling
    and the classifier of ``classes`` classes: :func:`kdsl.bench.network_head.head_tasks`). ``prepacked``:
    every task tuned with its packed weights taken packed (:attr:`~kdsl.tune.network.NetworkTask.prepacked`),
    as :func:`compile_network` runs the kernels by default."""
    if replace not in REPLACE:
        raise KdslError(f"unknown --replace {replace!r}: use one of {', '.join(REPLACE)}")
    tasks = []
    suffix = f" {signature_name(block)}" if block else ""
    for batch in batches:
        for layer, (_, _, stride) in zip(stage_layers(batch, resolution), STAGES):
            weight = 4 if stride == 1 else 3
            label = f"{layer.name} N={batch}{suffix}"
            tasks.append(NetworkTask(label, item.op, item.binding(layer), weight, 1 / batch, block, prepacked))
    if replace == "all" and not block:
        others = strided_tasks(list(batches), resolution) + head_tasks(batches, resolution, classes)
        tasks += [dataclasses.replace(task, prepacked=prepacked) for task in others]
    return tasks


def _fold(bn: Any) -> tuple[Any, Any]:
    """An eval-mode ``BatchNorm2d`` as a per-channel (scale, shift): ``bn(x) = x * scale + shift``."""
    scale = bn.weight.detach() / (bn.running_var + bn.eps).sqrt()
    return scale, bn.bias.detach() - bn.running_mean * scale


def _compiled_module() -> Any:
    """The compiled network's module class, defined on first use (``import kdsl`` imports no torch)."""
    torch = load_torch()

    class CompiledResNet(torch.nn.Module):
        """ResNet-18 with kdsl kernels in its convolutions; a tensor of 5 dims is blocked. A convolution
        is a PyTorch module or a (kernel, weights) pair; the strided ones' kernels are always plain
        (``NCHW``): only the plain layout gets them, and kernels for the max pooling and the head."""

        def __init__(self, net: Any, kernels: dict[int, tuple[Any, list[Any]]], layout: str, block: int) -> None:
            super().__init__()
            self.layout, self.block = layout, block
            self.stem, self.fc = net.stem, net.fc
            # the stem's convolution, its batch norm folded, and its max pooling, run apart when a
            # kernel computes the convolution, batch norm and ReLU in one
            self.stem_conv = kernels.get(id(net.stem[0]), net.stem[0])
            self.stem_bn, self.pool = _fold(net.stem[1]), kernels.get(id(net.stem[3]), net.stem[3])
            # the average pooling and the classifier: one kernel (its bias added by its epilogue, or by
            # PyTorch when it has none), else PyTorch's mean and nn.Linear
            self.head, bias = kernels.get(id(net.fc)), net.fc.bias
            self.fc_bias = torch.zeros(net.fc.out_features) if bias is None else bias.detach()
            self.fc_scale = torch.ones(net.fc.out_features)
            self.blocks = []  # (conv1, bn1, conv2, bn2, shortcut) per basic block
            for stage in net.stages:
                for basic in stage:
                    shortcut = None
                    if basic.shortcut is not None:
                        projection = basic.shortcut[0]
                        shortcut = (kernels.get(id(projection), projection), _fold(basic.shortcut[1]))
                    conv1 = kernels.get(id(basic.conv1), basic.conv1)
                    conv2 = kernels[id(basic.conv2)]
                    self.blocks.append((conv1, _fold(basic.bn1), conv2, _fold(basic.bn2), shortcut))
            #: the shapes of the tensors transformed in the last forward pass, when a list
            self.trace: list[tuple[str, tuple[int, ...]]] | None = None

        def convert(self, x: Any, blocked: bool) -> Any:
            if (x.dim() == 5) == blocked:
                return x
            if self.trace is not None:
                self.trace.append(("to" if blocked else "from", tuple(x.shape)))
            return to_blocked(x, self.block) if blocked else from_blocked(x)

        def conv(self, conv: Any, x: Any) -> Any:
            if not isinstance(conv, tuple):  # a PyTorch convolution: NCHW
                return conv(self.convert(x, False))
            kernel, weights = conv
            y = kernel(self.convert(x, self.layout != "plain"), *weights)
            return self.convert(y, False) if self.layout == "blocked" else y

        def affine(self, x: Any, scale_shift: tuple[Any, Any]) -> Any:
            scale, shift = scale_shift
            shape = (1, -1, 1, 1) if x.dim() == 4 else (1, x.shape[1], 1, 1, x.shape[-1])
            return x * scale.reshape(shape) + shift.reshape(shape)

        def layer(
            self, conv: Any, x: Any, scale_shift: tuple[Any, Any], rest: Any | None = None, relu: bool = True
        ) -> Any:
            """``relu(bn(conv(x)) [+ rest])`` (no ReLU if not ``relu``): in the kernel's epilogue when it
            has one, else in PyTorch."""
            if not (isinstance(conv, tuple) and isinstance(conv[0], FusedKernel)):
                y = self.affine(self.conv(conv, x), scale_shift)
                y = y if rest is None else y + self.convert(rest, y.dim() == 5)
                return torch.relu(y) if relu else y
            kernel, weights = conv
            blocked = self.layout != "plain"
            residual = None if rest is None else self.convert(rest, blocked)
            scale, shift = scale_shift
            y = kernel(self.convert(x, blocked), *weights, scale=scale, shift=shift, residual=residual)
            return self.convert(y, False) if self.layout == "blocked" else y

        def forward(self, x: Any) -> Any:
            if self.stem_conv is self.stem[0]:
                x = self.stem(x)
            else:
                x = self.layer(self.stem_conv, x, self.stem_bn)
                x = self.pool[0](x) if isinstance(self.pool, tuple) else self.pool(x)
            for conv1, bn1, conv2, bn2, shortcut in self.blocks:
                # one transform of the block's input serves both its first convolution and its shortcut
                first_blocked = isinstance(conv1, tuple) and self.layout == "propagated"
                x = self.convert(x, first_blocked)
                y = self.layer(conv1, x, bn1)
                rest = x if shortcut is None else self.layer(shortcut[0], x, shortcut[1], relu=False)
                x = self.layer(conv2, y, bn2, rest)
            if self.head is not None:
                kernel, weights = self.head
                if isinstance(kernel, FusedKernel):
                    return kernel(x, *weights, scale=self.fc_scale, shift=self.fc_bias)
                return kernel(x, *weights) + self.fc_bias
            pooled = x.mean(dim=(2, 3)).reshape(x.shape[0], -1)  # blocked or not: channels in order
            return self.fc(pooled)

    return CompiledResNet


def compile_network(
    net: Any,
    layout: str = "propagated",
    *,
    db: str | os.PathLike[str] | None = None,
    block: int = 16,
    kernels: dict[tuple[Any, ...], Any] | None = None,
    plain_records: bool = False,
    fuse: bool = True,
    prepack: bool = True,
    replace: str = "all",
) -> Any:
    """``net`` (a :func:`~kdsl.discover.network.resnet18` with an operator, in eval mode) with its kdsl
    layers compiled by TVM: each with the best schedule of ``db`` for its (operator, binding) in the
    signature it runs in (a blocked layout's kernels: the records tuned with that channel-blocked
    signature, never the plain ones), else the default schedule, in ``layout`` (:data:`LAYOUTS`;
    ``block``: the channel block of the blocked ones). ``plain_records``: the blocked kernels take the
    plain signature's records instead, as they did before kernels were tuned blocked (a comparison).
    It shares ``net``'s weights and runs forward only (under ``torch.no_grad()``). ``kernels`` caches
    compiled kernels across calls. ``fuse``: each kernel computes the batch norm, ReLU and residual add
    after it (:mod:`kdsl.codegen.tvm.epilogue`; the schedule is still the plain kernel's record), else
    those run as PyTorch operators. ``prepack``: each kernel's signature takes the weights its schedule
    packs in that packed layout (:mod:`kdsl.codegen.tvm.prepack`), packed here, once (so the compiled
    network holds packed copies of those weights: a later change to ``net``'s weights needs a new
    compile); else every kernel call packs them. The records follow: a prepacked kernel takes the best
    record of its task tuned prepacked (``NetworkTask.prepacked``), falling back to the best of the task
    tuned with its weights packed per call, then to the default schedule; a per-call kernel (``prepack=False``)
    takes the per-call task's best, falling back to the prepacked one's, then the default (the fallbacks
    keep a database tuned one way usable the other).
    ``replace="all"``: in the plain layout the stem, its max pooling, the
    stride-2 convolutions and their shortcuts are kdsl kernels too (:mod:`kdsl.bench.network_strided`),
    and so are the global average pooling and the classifier, one kernel whose epilogue adds the bias
    (:mod:`kdsl.bench.network_head`; unfused, PyTorch adds it), each from its tuned record if any;
    the blocked layouts, and ``replace="3x3"``, keep PyTorch's operators there."""
    if layout not in LAYOUTS:
        raise KdslError(f"unknown layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    if replace not in REPLACE:
        raise KdslError(f"unknown replace {replace!r}: use one of {', '.join(REPLACE)}")
    kernels = {} if kernels is None else kernels
    blocked = 0 if layout == "plain" else block
    by_module: dict[int, tuple[Any, list[Any]]] = {}
    # what follows each kdsl convolution: a block's first is followed by bn + relu, its second by bn,
    # the shortcut's add and relu
    epilogues: dict[int, Epilogue] = {}
    for basic in (basic for stage in net.stages for basic in stage) if fuse else ():
        epilogues[id(basic.conv1)] = Epilogue()  # a PyTorch (stride-2) conv1 is not a kdsl module: unused
        epilogues[id(basic.conv2)] = Epilogue(residual=True)
    for module in net.modules():
        item, binding = getattr(module, "item", None), getattr(module, "binding", None)
        if item is None or binding is None:
            continue
        borrowed = plain_records and blocked > 0
        kernel = network_kernel(item.op, binding, epilogues.get(id(module)), db, kernels, prepack, blocked, borrowed)
        # packed here, once (a weight its kernel does not pack is passed on as it is)
        by_module[id(module)] = (kernel, kernel.pack_weights([w.detach() for w in module.inner.weights]))
    if not by_module:
        raise KdslError("compile_network needs a network built with an operator (resnet18(item)), got the original one")
    for module, binding, epilogue in strided_modules(net) if replace == "all" and layout == "plain" else ():
        kernel = network_kernel(strided_op(), binding, epilogue if fuse else None, db, kernels, prepack)
        by_module[id(module)] = (kernel, kernel.pack_weights([module.weight.detach()]))
    if replace == "all" and layout == "plain":  # the stem's max pooling and the head (pooling + classifier)
        pool = network_kernel(max_pool_op(), max_pool_binding(net.batch, net.resolution), None, db, kernels, prepack)
        by_module[id(net.stem[3])] = (pool, [])
        fc, binding = head_module(net)  # its bias: the epilogue's shift (fused), else a PyTorch add
        head = network_kernel(head_op(), binding, Epilogue(relu=False) if fuse else None, db, kernels, prepack)
        by_module[id(fc)] = (head, head.pack_weights([fc.weight.detach()]))
    compiled = _compiled_module()(net, by_module, layout, block).eval()
    #: bytes of weights packed once here that the kernels would otherwise pack on every forward pass
    compiled.prepacked_bytes = sum(
        w.numel() * w.element_size()
        for kernel, weights in by_module.values()
        for w, layout in zip(weights, getattr(kernel, "weight_layouts", ()))
        if layout is not None
    )
    return compiled


def _transforms(trace: Sequence[tuple[str, tuple[int, ...]]], block: int) -> Callable[[], None]:
    """A function that runs the layout transforms of ``trace`` on tensors of their shapes."""
    torch = load_torch()
    tensors = [(direction, torch.randn(shape)) for direction, shape in trace]

    def run() -> None:
        for direction, tensor in tensors:
            to_blocked(tensor, block) if direction == "to" else from_blocked(tensor)

    return run


def time_compiled(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One batch size's rows: PyTorch's ResNet-18 and the compiled networks (default schedule, and the
    tuned one in every layout; all with the glue in the kernels' epilogues and the weights packed once, and
    the tuned plain one again with its glue in PyTorch, :data:`UNFUSED`, and with its weights packed on
    every call, :data:`PER_CALL`; with ``replace="all"`` also the tuned plain one with kdsl kernels in the
    3x3 stage convolutions only, :data:`ONLY_3X3`), plus the layout transforms alone, timed in the same
    interleaved rounds; each network's output is checked against the PyTorch network of the same weights."""
    torch = load_torch()
    item = NetworkOp.from_dict(payload["op"])
    batch, resolution, block = payload["batch"], payload["resolution"], payload["block"]
    classes, seed, db = payload["classes"], payload["seed"], payload["db"]
    replace = payload.get("replace", "all")
    native = resnet18(batch=batch, resolution=resolution, classes=classes, seed=seed)
    net = resnet18(item, batch=batch, resolution=resolution, classes=classes, seed=seed)
    kernels: dict[tuple[Any, ...], Any] = {}
    networks = {
        "PyTorch ResNet-18 (native)": native,
        "kdsl default schedules, plain": compile_network(net, "plain", kernels=kernels, replace=replace),
        "kdsl tuned, plain": compile_network(net, "plain", db=db, kernels=kernels, replace=replace),
    }
    if replace == "all":
        networks[ONLY_3X3] = compile_network(net, "plain", db=db, kernels=kernels, replace="3x3")
    networks |= {
        UNFUSED: compile_network(net, "plain", db=db, kernels=kernels, fuse=False, replace=replace),
        PER_CALL: compile_network(net, "plain", db=db, kernels=kernels, prepack=False, replace=replace),
        "kdsl tuned, blocked, no propagation": compile_network(net, "blocked", db=db, block=block, kernels=kernels),
        "kdsl tuned, blocked, propagated": compile_network(net, "propagated", db=db, block=block, kernels=kernels),
        PLAIN_RECORDS: compile_network(net, "propagated", db=db, block=block, kernels=kernels, plain_records=True),
    }
    x = torch.randn(batch, 3, resolution, resolution, generator=torch.Generator().manual_seed(seed))
    rows, functions = [], []
    with torch.no_grad():
        expected = net(x)
        for name, network in networks.items():
            with outputs_filled_with_nan():  # an output element a kernel never writes is NaN, never luck
                error = None if network is native else float((network(x) - expected).abs().max())
            rows.append({"network": name, "batch": batch, "max_abs_error": error, "transforms": 0})
            rows[-1]["prepacked_mb"] = getattr(network, "prepacked_bytes", 0) / 1e6
            functions.append(lambda network=network: network(x))
        for name in ("kdsl tuned, blocked, no propagation", "kdsl tuned, blocked, propagated"):
            networks[name].trace = []
            networks[name](x)
            trace, networks[name].trace = networks[name].trace, None
            rows.append({"network": f"its transforms alone ({name.split(', ')[-1]})", "batch": batch})
            rows[-1].update(max_abs_error=None, transforms=len(trace))
            functions.append(_transforms(trace, block))
        with latency_slot():
            rounds = interleaved_samples(functions, repeats=payload["repeats"], target=payload["target"], warmup=2)
    for row, samples in zip(rows, rounds):
        row["ms"] = median(samples) * 1e3
        row["vs_native"] = ratio_of_pairs(samples, rounds[0])
        row["rounds"] = len(samples)
    return rows


def time_networks(
    item: NetworkOp,
    db: str,
    batches: Sequence[int],
    *,
    resolution: int = 224,
    classes: int = 1000,
    block: int = 16,
    threads: int = 2,
    repeats: int = 7,
    target: float = 0.3,
    seed: int = 0,
    replace: str = "all",
) -> list[dict[str, Any]]:
    """:func:`time_compiled` at every batch size, each in its own worker process (PyTorch and TVM in
    one process: :func:`kdsl.runtime.threads.shared_process_environment` keeps TVM's threads unpinned and
    sleeping between kernels, so they leave PyTorch's operators the cores). ``replace``: which
    convolutions the plain networks run as kdsl kernels (:data:`REPLACE`)."""
    if replace not in REPLACE:
        raise KdslError(f"unknown --replace {replace!r}: use one of {', '.join(REPLACE)}")
    rows = []
    environment = shared_process_environment(threads)
    for batch in batches:
        payload = {
            "op": item.to_dict(),
            "db": str(db),
            "batch": batch,
            "resolution": resolution,
            "classes": classes,
            "block": block,
            "threads": threads,
            "repeats": repeats,
            "target": target,
            "seed": seed,
            "replace": replace,
        }
        rows += run_worker("kdsl.bench.network_tune", payload, environment, f"the batch-{batch} timing")
    return rows


# ---------------------------------------------------------------------------------------------
# The command


def add_network_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``kdsl tune --network`` adds to ``kdsl tune`` (whose ``--trials`` is then the budget
    all layers share, and whose OPERATOR, ``conv2d`` if none, goes into the network's convolutions)."""
    parser.add_argument(
        "--network",
        choices=NETWORKS,
        help="tune every kdsl layer of this network with one shared --trials budget and time it against PyTorch's",
    )
    parser.add_argument(
        "--batch",
        dest="batch_sizes",
        type=positive_int,
        nargs="+",
        help="with --network: the batch sizes (default: 1 8)",
    )
    parser.add_argument("--resolution", type=positive_int, default=224, help="with --network: the input size")
    parser.add_argument(
        "--block", type=positive_int, default=16, help="with --network: the channel block of the blocked layouts"
    )
    parser.add_argument("--threads", type=positive_int, default=2, help="with --network: threads when timing")
    parser.add_argument(
        "--replace",
        choices=REPLACE,
        default="all",
        help="with --network: the convolutions the plain network runs as kdsl kernels: all (the stem, the stride-2 "
        "convolutions and their shortcuts too, as strided_conv2d) or 3x3 (the 13 stride-1 3x3 ones only)",
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=7, help="with --network: interleaved rounds of the end-to-end timing"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def task_table(summaries: Sequence[TaskSummary]) -> str:
    """The per-task table of a network's tuning run.

    >>> print(task_table([TaskSummary("conv2_x N=1 NCHW16c", 4, 16, 2.0, 1.5)]))
    task                  runs/pass  trials  default ms   best ms  saved ms/pass
    conv2_x N=1 NCHW16c           4      16       2.000     1.500          2.000
    """
    lines = [f"{'task':<20} {'runs/pass':>10} {'trials':>7} {'default ms':>11} {'best ms':>9} {'saved ms/pass':>14}"]
    for row in summaries:
        saved = None if row.default_ms is None or row.best_ms is None else row.weight * (row.default_ms - row.best_ms)
        lines.append(
            f"{printable(row.label):<20} {row.weight:>10} {row.trials:>7} {_ms(row.default_ms):>11} "
            f"{_ms(row.best_ms):>9} {_ms(saved):>14}"
        )
    return "\n".join(lines)


def network_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The end-to-end rows of :func:`time_compiled` as a table."""
    lines = [f"{'network':<42} {'batch':>5} {'ms':>10} {'vs PyTorch':>10} {'max |error|':>12} {'transforms':>10}"]
    for row in rows:
        error = "-" if row["max_abs_error"] is None else f"{row['max_abs_error']:.1e}"
        transforms = row["transforms"] or "-"
        lines.append(
            f"{row['network']:<42} {row['batch']:>5} {row['ms']:10.3f} {row['vs_native']:10.2f} {error:>12} "
            f"{transforms:>10}"
        )
    return "\n".join(lines)


def propagation_summary(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per batch size: how much of the unpropagated network's transform time propagation removed,
    and how much faster (or slower) the propagated network ran end to end.

    >>> names = ("its transforms alone (no propagation)", "its transforms alone (propagated)",
    ...          "kdsl tuned, blocked, no propagation", "kdsl tuned, blocked, propagated")
    >>> rows = [{"batch": 1, "network": n, "ms": ms} for n, ms in zip(names, (2.0, 0.5, 10.0, 10.4))]
    >>> print(propagation_summary(rows)[0])
    batch 1: without propagation the transforms take 2.000 ms a pass, with it 0.500 ms (75% of the transform
    time removed); end to end the propagated network is 0.400 ms slower (20% of that transform time)
    """
    lines = []
    for batch in sorted({row["batch"] for row in rows}):
        ms = {row["network"]: row["ms"] for row in rows if row["batch"] == batch}
        transforms = ms["its transforms alone (no propagation)"]
        left = ms["its transforms alone (propagated)"]
        saved = ms["kdsl tuned, blocked, no propagation"] - ms["kdsl tuned, blocked, propagated"]
        lines.append(
            f"batch {batch}: without propagation the transforms take {transforms:.3f} ms a pass, with it "
            f"{left:.3f} ms ({_share_removed(transforms - left, transforms)}); end to end the propagated "
            f"network is {faster_or_slower(saved)}"
            + (f" ({abs(saved) / transforms:.0%} of that transform time)" if transforms > 0 else "")
        )
    return lines


def _share_removed(removed: float, whole: float) -> str:
    """``removed`` ms of ``whole`` ms of transforms, as a share in words (a negative one was added).

    >>> _share_removed(1.5, 2.0), _share_removed(-0.5, 2.0), _share_removed(0.1, 0.0)
    ('75% of the transform time removed', '25% more transform time', 'no transform time to remove')
    """
    if not whole > 0:
        return "no transform time to remove"
    if removed < 0:
        return f"{-removed / whole:.0%} more transform time"
    return f"{removed / whole:.0%} of the transform time removed"


def command_tune_network(args: argparse.Namespace) -> int:
    """``kdsl tune --network resnet18``: tune the network's tasks, then time the compiled network."""
    if args.layers or args.apply or args.out:
        raise KdslError("kdsl tune --network tunes every layer of the network: give no --layers, --apply or --out")
    tuner = args.tuner or "opevo"
    # a bad --tuner-option before the default schedules of every task are measured (minutes), not after
    check_options(tuner, dict(args.tuner_option))
    args.batch_sizes = args.batch_sizes or [1, 8]
    item = resolve_ops([args.operator or "conv2d"], resolution=args.resolution)[0]
    for name, width, _ in STAGES:  # refuse a --block that does not divide a stage's channels before tuning
        blocked_shape((1, width, 1, 1), args.block, f"--block: {name}")
    # each layer in both signatures the networks are timed in: the plain one, and the blocked one, each
    # with the weights the schedule packs taken packed (what compile_network runs, prepack=True)
    tasks = network_tasks(item, args.batch_sizes, args.resolution, replace=args.replace, prepacked=True)
    tasks += network_tasks(item, args.batch_sizes, args.resolution, args.block, prepacked=True)
    log = None if args.json else (lambda line: print(f"tune --network: {line}", file=sys.stderr, flush=True))
    summaries = tune_network(
        tasks,
        args.trials,
        args.db,
        tuner=tuner,
        batch=args.compile_batch,
        seed=args.seed,
        options=dict(args.tuner_option),
        log=log,
    )
    if log is not None:
        log("timing the compiled networks against PyTorch's")
    rows = time_networks(
        item,
        args.db,
        args.batch_sizes,
        resolution=args.resolution,
        block=args.block,
        threads=args.threads,
        repeats=args.repeats,
        seed=args.seed,
        replace=args.replace,
    )
    if args.json:
        tasks_json = [vars(summary) for summary in summaries]
        print(json.dumps({"tasks": tasks_json, "networks": rows, "db": args.db}, indent=1))
        return 0
    where = "the 13 stride-1 3x3 convolutions"
    if args.replace == "all":
        where += (
            "; strided_conv2d in the 7x7 stem, the three stride-2 3x3 convolutions and their 1x1 shortcuts, "
            "a max Fold in the max pooling, and one kernel for the average pooling and the classifier "
            f"(the plain networks but the row '{ONLY_3X3}'; the blocked ones keep PyTorch's operators there)"
        )
    print(
        f"kdsl tune --network {args.network}: {printable(item.label)} in {where}, "
        f"{args.resolution}x{args.resolution} input, {tuner}, {args.trials} trials split evenly between the kernels' "
        f"NCHW and {signature_name(args.block)} signatures (weights packed once, outside the measured time), "
        f"each share given to its layers by expected saving (records in {printable(args.db)})"
    )
    print(task_table(summaries))
    print(
        f"\nEnd to end, forward, {args.threads} threads, one process per batch size, every network of a batch "
        f"timed in the same {args.repeats}+ interleaved rounds (median ms; vs PyTorch: its time over PyTorch's, "
        f"below 1 faster, the median of the rounds' ratios); max |error|: against the PyTorch network of the same "
        f"weights; blocked: {signature_name(args.block)}, kernels tuned in that signature (the row "
        f"'{PLAIN_RECORDS}': the same network with the NCHW records, as before kernels were tuned blocked)."
    )
    print(
        "kdsl's kernels compute the batch norm, ReLU and residual add after them in their epilogues "
        f"(fused), but in the row '{UNFUSED}', where PyTorch's operators do; and take the weights their "
        f"schedules pack packed once, when the network is compiled, but in the row '{PER_CALL}' (which runs the "
        "records tuned packing per call where the database has them, else the prepacked ones)."
    )
    print(network_table(rows))
    print()
    for row in rows:
        if row["network"] == "kdsl tuned, plain":
            print(
                f"batch {row['batch']}: weights packed once when compiled, not per call: {row['prepacked_mb']:.1f} MB "
                f"a forward pass (the tuned plain network's kernels; '{PER_CALL}' packs them in every call)"
            )
    for line in propagation_summary(rows):
        print(line)
    return 0


def _worker_main() -> int:
    torch = load_torch()
    payload = json.loads(sys.stdin.read())
    torch.set_num_threads(payload["threads"])
    print(json.dumps(time_compiled(payload)))
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--worker"]:
        sys.exit("usage: python -m kdsl.bench.network_tune --worker (a payload on stdin)")
    sys.exit(_worker_main())
