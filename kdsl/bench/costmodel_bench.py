"""``kdsl bench costmodel``: collect tuning records across operators and layers, and score the
cross-operator cost model (:mod:`kdsl.tune.transfer`) on operators it never saw.

``--collect`` measures, for every operator of ``--ops`` at every layer of ``--layers`` (small or medium
sizes of :data:`LAYERS`, each measurement a few milliseconds), ``--configs`` configurations into
``--db``: half drawn at random from the schedule space, half walked by OpEvo from the space's heuristic
configuration (the heuristic itself first), through the same driver and measurer as ``kdsl tune``
(the cost model off, so that the data does not depend on it). A rerun with the same ``--db`` measures
only what is missing.

Then (with or without ``--collect``) it scores leave-one-operator-out on every task of this target in
``--db`` (several databases merge: ``kdsl tune``'s records count as well): for each operator, a model
trained on the other operators ranks each of its tasks' configurations, and Spearman's rank correlation
with the measured latencies is printed beside the analytic estimate's, then one summary line::

    held-out Spearman: model X, analytic Y, gain Z

(means over the held-out tasks). Only this target's records count (``--mcpu`` picks another one).
``--split half`` scores the stricter way (:func:`~kdsl.tune.transfer.train_on_half`): models trained on
half the operators rank the other half's tasks. ``--prior`` is the analytic estimate's weight in the
model's score (:data:`~kdsl.tune.transfer.PRIORS`; 0 scores the trees alone), ``--learner`` the trees'
objective (:data:`~kdsl.tune.transfer.LEARNERS`: ``ranks`` is the model before session 38).
``--confirm DB ...`` scores the tasks of other databases, each with a model trained on ``--db``'s tasks
of the other operators (records no setting was chosen on: collect them with ``--layers confirm`` into a
database of their own), on lines before the summary.

>>> len(DEFAULT_OPS), sorted(set(LAYERS) - set(DEFAULT_OPS))
(10, ['avg_pool2d_strided'])
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Mapping, Sequence

from kdsl.bench import target as bench_target
from kdsl.bench.argument_types import positive_int
from kdsl.codegen.tvm.schedule_space import VERSION
from kdsl.lang import library
from kdsl.lang.errors import KdslError
from kdsl.tune.driver import tune
from kdsl.tune.features import KINDS
from kdsl.tune.records import target_mcpu
from kdsl.tune.transfer import (
    LEARNERS,
    PAIR_PRIOR,
    PRIOR,
    TaskData,
    TaskScore,
    confirm_on,
    leave_one_operator_out,
    load_tasks,
    other_versions,
    train_on_half,
)

_CONV_SMALL = {"N": 1, "Cin": 32, "Cout": 32, "H": 16, "W": 16}
_CONV_MEDIUM = {"N": 1, "Cin": 64, "Cout": 64, "H": 28, "W": 28}
# sizes neither layer above has (Cin != Cout, widths that are no power of two): records nobody chose on
_CONV_CONFIRM = {"N": 1, "Cin": 48, "Cout": 96, "H": 20, "W": 20}

#: operator -> layer name -> sizes: small and medium layers, so that a measurement takes milliseconds;
#: ``confirm`` layers of sizes the other two do not have, collected into a database of their own and
#: scored with ``--confirm`` (a model's settings are chosen on small and medium: the confirm layers are
#: the records nothing was chosen on).
LAYERS: dict[str, dict[str, dict[str, int]]] = {
    "conv2d": {"small": _CONV_SMALL, "medium": _CONV_MEDIUM, "confirm": _CONV_CONFIRM},
    "grouped_conv2d": {"small": _CONV_SMALL, "medium": _CONV_MEDIUM, "confirm": _CONV_CONFIRM},
    "dilated_conv2d": {"small": _CONV_SMALL, "medium": _CONV_MEDIUM, "confirm": _CONV_CONFIRM},
    "depthwise_conv2d": {
        "small": {"N": 1, "Cin": 128, "H": 14, "W": 14},
        "medium": {"N": 1, "Cin": 64, "H": 28, "W": 28},
        "confirm": {"N": 1, "Cin": 96, "H": 20, "W": 20},
    },
    "matmul": {
        "small": {"M": 64, "Cin": 256, "Cout": 256},
        "medium": {"M": 128, "Cin": 512, "Cout": 256},
        "confirm": {"M": 96, "Cin": 384, "Cout": 192},
    },
    "conv1d": {
        "small": {"N": 1, "Cin": 64, "Cout": 64, "L": 256},
        "medium": {"N": 1, "Cin": 128, "Cout": 128, "L": 128},
        "confirm": {"N": 1, "Cin": 96, "Cout": 192, "L": 192},
    },
    # two data inputs, no weight (BERT's batched products at a tenth of their size)
    "bmm": {
        "small": {"B": 8, "M": 64, "K": 64, "N": 64},
        "medium": {"B": 16, "M": 128, "K": 64, "N": 128},
        "confirm": {"B": 12, "M": 96, "K": 48, "N": 96},
    },
    # a GEMV (one row: bound by reading the weight), a thin GEMM, and four rows of another width
    "linear": {
        "small": {"N": 1, "Cin": 1024, "Cout": 1024},
        "medium": {"N": 16, "Cin": 1024, "Cout": 1024},
        "confirm": {"N": 4, "Cin": 768, "Cout": 1536},
    },
    # stride 2 on the output: every read a gather along the strided axis
    "strided_conv2d": {
        "small": {"N": 1, "Cin": 32, "Cout": 32, "H": 32, "W": 32},
        "medium": {"N": 1, "Cin": 64, "Cout": 64, "H": 56, "W": 56},
        "confirm": {"N": 1, "Cin": 48, "Cout": 96, "H": 40, "W": 40},
    },
    "conv_transpose2d": {
        "small": {"N": 1, "Cin": 32, "Cout": 32, "H": 8, "W": 8},
        "medium": {"N": 1, "Cin": 64, "Cout": 64, "H": 14, "W": 14},
        "confirm": {"N": 1, "Cin": 48, "Cout": 32, "H": 12, "W": 12},
    },
    # no weight and few MACs per output: a memory-bound stage pair
    "avg_pool2d_strided": {
        "small": {"N": 1, "Cin": 64, "H": 29, "W": 29, "Ho": 14, "Wo": 14},
        "medium": {"N": 1, "Cin": 128, "H": 57, "W": 57, "Ho": 28, "Wo": 28},
        "confirm": {"N": 1, "Cin": 96, "H": 41, "W": 41, "Ho": 20, "Wo": 20},
    },
}
#: The layer names of :data:`LAYERS` (every operator has each), and those ``--layers`` collects by default.
LAYER_NAMES = ("small", "medium", "confirm")
DEFAULT_LAYERS = ("small", "medium")
#: The operators collected by default: leave-one-operator-out on the first six left each model five
#: operators to learn from; the last four add two-input products, a GEMV, a strided and a transposed
#: window. About 45 s a task on a quiet 2-core machine (the six's collection: 12 tasks in 8 min 54 s), so
#: 20 tasks take about 15 minutes. avg_pool2d_strided is there to ask for (``--ops``), not collected by
#: default: it adds 2 tasks and its default schedule was still changing in session 36.
DEFAULT_OPS = (
    "conv2d",
    "matmul",
    "depthwise_conv2d",
    "grouped_conv2d",
    "conv1d",
    "dilated_conv2d",
    "bmm",
    "linear",
    "strided_conv2d",
    "conv_transpose2d",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``kdsl bench costmodel``."""
    parser.add_argument("--collect", action="store_true", help="measure configurations into --db first")
    parser.add_argument("--ops", nargs="+", choices=sorted(LAYERS), default=list(DEFAULT_OPS), help="operators")
    parser.add_argument(
        "--layers",
        nargs="+",
        type=layer_name,
        default=list(DEFAULT_LAYERS),
        help="the layer sizes of each operator (LAYERS in kdsl/bench/costmodel_bench.py): small, medium, or "
        "confirm (sizes neither of the others has; collect them into a database of their own for --confirm)",
    )
    parser.add_argument("--configs", type=positive_int, default=40, help="configurations measured per task")
    parser.add_argument(
        "--db", nargs="+", default=["costmodel.db"], help="records databases (--collect writes the first)"
    )
    parser.add_argument(
        "--confirm",
        nargs="+",
        default=[],
        metavar="DB",
        help="records databases nothing was chosen on (e.g. --layers confirm's): each of their tasks is ranked "
        "by a model trained on --db's tasks of the other operators, and scored before the summary line",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random and OpEvo draws and the trees")
    parser.add_argument(
        "--split",
        choices=["operator", "half"],
        default="operator",
        help="score leave-one-operator-out, or with models trained on half the operators (stricter)",
    )
    parser.add_argument(
        "--features",
        choices=sorted(KINDS),
        default="relative",
        help="the model's features: each against the task's heuristic configuration (the model kdsl tune "
        "uses), or absolute (the model before session 36, to compare)",
    )
    parser.add_argument(
        "--prior",
        type=estimate_weight,
        default=None,
        help=f"the analytic estimate's weight in the model's score (default: the learner's, {PAIR_PRIOR} for "
        f"pairs, {PRIOR} for ranks; 0: the trees alone)",
    )
    parser.add_argument(
        "--learner",
        choices=LEARNERS,
        default=LEARNERS[0],
        help="pairs: trees boosted on the order of each pair of a task's configurations, started from the "
        "estimate (the model kdsl tune uses); ranks: trees on each configuration's rank (the model before "
        "session 38)",
    )
    bench_target.add_mcpu_argument(parser)


def layer_name(text: str) -> str:
    """argparse type of ``--layers``: a layer name of :data:`LAYERS`.

    >>> layer_name("confirm")
    'confirm'
    >>> layer_name("large")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: --layers: no layer 'large'; choose from small, medium, confirm
    """
    if text not in LAYER_NAMES:
        raise argparse.ArgumentTypeError(f"--layers: no layer {text!r}; choose from {', '.join(LAYER_NAMES)}")
    return text


def estimate_weight(text: str) -> float:
    """argparse type of ``--prior``: a finite number at least 0 (a negative weight would rank by the
    estimate backwards).

    >>> estimate_weight("0.02")
    0.02
    >>> estimate_weight("-1")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: --prior: the analytic estimate's weight must be a finite number >= 0, got '-1'
    """
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"--prior: the analytic estimate's weight must be a finite number >= 0, got {text!r}"
        )
    return value


def collect(
    ops: Sequence[str], layers: Sequence[str], configs: int, db: str, seed: int = 0, *, log: bool = True
) -> int:
    """Measure up to ``configs`` configurations of each operator at each layer into ``db`` (random, then
    OpEvo-walked from the heuristic); how many were measured in this call."""
    total = 0
    for name in ops:
        if name not in LAYERS:
            raise KdslError(f"kdsl bench costmodel: no layers for operator {name!r}; choose from {', '.join(LAYERS)}")
        unknown = [layer for layer in layers if layer not in LAYERS[name]]
        if unknown:
            raise KdslError(
                f"kdsl bench costmodel: operator {name!r} has no layer {unknown[0]!r}; "
                f"choose from {', '.join(LAYERS[name])}"
            )
    for name in ops:
        op = library.load(name)
        for layer in layers:
            for tuner, share in (("random", configs // 2), ("opevo", configs - configs // 2)):
                result = tune(op, LAYERS[name][layer], tuner, share, db, seed=seed, confirm=0, cost_model=False)
                total += result.measured
                if log:
                    print(f"collected {name} {layer} {tuner}: {result.measured} measured", file=sys.stderr)
    return total


def summary(scores: Sequence[TaskScore]) -> tuple[float, float, float]:
    """Mean held-out Spearman of the model and of the analytic estimate over tasks, and their difference.

    >>> summary([TaskScore("t", "a", {}, 9, 0.8, 0.5), TaskScore("u", "b", {}, 9, 0.6, 0.5)])
    (0.7, 0.5, 0.2)
    """
    if not scores:
        raise KdslError("no held-out task to score: the records need tasks of at least two operators")
    model = round(statistics.mean(s.model for s in scores), 3)
    analytic = round(statistics.mean(s.analytic for s in scores), 3)
    return model, analytic, round(model - analytic, 3)


def _layer_text(binding: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(binding.items()))


def _print_rows(scores: Sequence[TaskScore], heading: str = "held-out operator") -> None:
    print(f"{heading:20} {'layer':44} {'configs':>7} {'model':>6} {'analytic':>8}")
    for score in sorted(scores, key=lambda s: (s.label, _layer_text(s.binding))):
        print(
            f"{score.label:20} {_layer_text(score.binding):44} {score.configs:7d} "
            f"{score.model:6.2f} {score.analytic:8.2f}"
        )


def _confirm(args: argparse.Namespace, tasks: Sequence[TaskData], target: str) -> None:
    """``--confirm``: score the confirm databases' tasks (those not in ``--db``) with models of ``tasks``."""
    known = {t.task for t in tasks}
    held_out = load_tasks(args.confirm, target, exclude=known, kind=args.features)
    scores = confirm_on(tasks, held_out, seed=args.seed, prior=args.prior, learner=args.learner)
    if not scores:
        print(f"confirm: no task in {', '.join(args.confirm)} of an operator --db's model can be trained without")
        return
    _print_rows(scores, "confirm operator")
    model, analytic, gain = summary(scores)
    operators = len({s.label for s in scores})
    print(
        f"confirmed on {len(scores)} tasks of {operators} operators nothing was chosen on: "
        f"model {model:.2f}, analytic {analytic:.2f}, gain {gain:+.2f}"
    )


def bench_costmodel(args: argparse.Namespace) -> int:
    """``kdsl bench costmodel``: collect (``--collect``), then score leave-one-operator-out (and on the
    ``--confirm`` databases; the summary of ``--db`` stays the last line)."""
    bench_target.select_mcpu(args.mcpu)
    if args.collect:
        collect(args.ops, args.layers, args.configs, args.db[0], args.seed)
    target = target_mcpu()
    tasks = load_tasks(args.db, target, kind=args.features)
    operators = sorted({t.label for t in tasks})
    print(f"target {target}: {len(tasks)} tasks of {len(operators)} operators ({', '.join(operators)})")
    for version, count in sorted(other_versions(args.db, target).items()):
        print(f"skipped {count} tasks of schedule space {version} (this kdsl's is {VERSION}: other kernels)")
    scores = (train_on_half if args.split == "half" else leave_one_operator_out)(
        tasks, seed=args.seed, prior=args.prior, learner=args.learner
    )
    _print_rows(scores)
    if args.confirm:
        _confirm(args, tasks, target)
    model, analytic, gain = summary(scores)
    print(f"held-out Spearman: model {model:.2f}, analytic {analytic:.2f}, gain {gain:+.2f}")
    return 0
