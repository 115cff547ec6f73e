"""Window reductions (pooling): the heuristic before and after its strided-rows rule, beside PyTorch, in one process.

    PYTHONPATH=. TVM_BIND_THREADS=0 python scripts/window_schedules.py             # every case, 5 rounds
    PYTHONPATH=. TVM_BIND_THREADS=0 python scripts/window_schedules.py --only P1 --rounds 9

For each case it compiles the heuristic configuration twice: as the space makes it now, and as space
version 8 made it (:func:`old_heuristic`: :meth:`~kdsl.codegen.tvm.schedule_space.ScheduleSpace.strided_rows`
declining, a strided TVM vector ramp; a max pool's padding inlined as bounds checks).
Both kernels and PyTorch's own function run in alternating rounds, each round
its median of a few repeats (:func:`kdsl.runtime.timing.median_seconds`); the best per side is printed with
the ratios old / new and PyTorch / new (above 1: the new schedule is faster). Both kernels are checked
against each other and against PyTorch first. On a shared machine compare the ratios, not the times.
``TVM_BIND_THREADS=0`` keeps TVM's pinned threads from slowing PyTorch (``TVM.md``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from kdsl import gallery
from kdsl.bench.network_strided import max_pool_binding, max_pool_op
from kdsl.bench.tune_suites import suite_cases
from kdsl.codegen.tvm import default_target, load_tvm, lower
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.runtime.timing import median_seconds, round_order


def cases() -> list[tuple[str, Any, dict[str, int], Callable[[Any, dict[str, int]], Any]]]:
    """(label, operator, binding, PyTorch's function of the input and binding) for every case compared."""
    import torch.nn.functional as F

    rows = []
    for case in suite_cases("gensor"):
        if case.label in ("P1", "P2", "P3"):
            op = gallery.load(case.operator)
            if case.operator == "avg_pool2d":
                rows.append((case.label, op, dict(case.layer), lambda x, b: F.avg_pool2d(x, b["K"])))
            else:
                rows.append((case.label, op, dict(case.layer), lambda x, b: F.avg_pool2d(x, b["K"], stride=b["s"])))
    rows.append(
        ("resnet18 stem max pool N=1", max_pool_op(), max_pool_binding(1, 224), lambda x, b: F.max_pool2d(x, 3, 2, 1))
    )
    conv2 = {"N": 1, "Cin": 64, "H": 56, "W": 56, "K": 2}  # kdsl.bench.schedule's avg_pool2d conv2_x
    rows.append(("avg_pool2d conv2_x", gallery.load("avg_pool2d"), conv2, lambda x, b: F.avg_pool2d(x, b["K"])))
    return rows


def old_heuristic(space: ScheduleSpace) -> dict[str, Any]:
    """The heuristic configuration of space version 8: no strided rows, and in a branching kernel a zero-padded
    copy inlined wherever its readers' vectors gather (their bounds checks inside a strided vector)."""
    space.strided_rows = lambda stage, vector: False
    config = space.heuristic()
    if not space.lowered.op.is_linear:
        for pad in space.stages:
            if pad.kind != "pad" or f"{pad.name}.inline" not in config:
                continue
            readers = [space.stage_named(c) for c in pad.consumers]
            vectors = [config.get(f"{r.name}.vector") for r in readers]
            checked = [
                space.padding_in_vector(pad, r, v) and not r.axis(v).gathers for r, v in zip(readers, vectors) if v
            ]
            config[f"{pad.name}.inline"] = not pad.phased and not any(checked)
    return config


def kernels(op: Any, binding: dict[str, int]) -> dict[str, Any]:
    """The compiled heuristic schedule of ``op`` at ``binding``: ``old`` (space version 8's rules) and ``new``."""
    tvm = load_tvm()
    lowered = lower(op, binding)
    built = {}
    for side in ("old", "new"):
        space = ScheduleSpace(lowered)
        config = old_heuristic(space) if side == "old" else space.heuristic()
        built[side] = tvm.compile(space.apply(config).mod, target=default_target())
    return built


def compare(rounds: int, only: str | None) -> None:
    """Time every case (or the one labelled ``only``) and print one line of ratios per case."""
    import torch

    tvm = load_tvm()
    dev = tvm.cpu()
    rng = np.random.default_rng(0)
    for label, op, binding, torch_function in cases():
        if only and only != label.split()[0]:
            continue
        lowered = lower(op, binding)
        x = rng.standard_normal([int(d) for d in lowered.x.shape]).astype("float32")
        out_shape = [int(d) for d in lowered.out.shape]
        built = kernels(op, binding)
        xt = torch.from_numpy(x)
        expected = torch_function(xt, binding).numpy()
        args = {
            side: (tvm.runtime.tensor(x, dev), tvm.runtime.tensor(np.zeros(out_shape, "float32"), dev))
            for side in built
        }
        for side, f in built.items():
            f(*args[side])
            np.testing.assert_allclose(args[side][1].numpy(), expected, rtol=1e-4, atol=1e-5)
        calls = {side: (lambda f=f, a=args[side]: f(*a)) for side, f in built.items()}
        calls["torch"] = lambda fn=torch_function, x=xt, b=binding: fn(x, b)
        names = list(calls)
        best = dict.fromkeys(names, float("inf"))
        with torch.no_grad():
            for round_index in range(rounds):
                for index in round_order(len(names), round_index):
                    best[names[index]] = min(best[names[index]], median_seconds(calls[names[index]], repeats=5))
        ms = {k: v * 1e3 for k, v in best.items()}
        print(
            f"{label:28s} old {ms['old']:.4f} ms  new {ms['new']:.4f} ms  torch {ms['torch']:.4f} ms  "
            f"old/new {best['old'] / best['new']:.2f}  torch/new {best['torch'] / best['new']:.2f}",
            flush=True,
        )


def main() -> None:
    """Parse the command line and compare."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", help="one case's first word: P1, P2, P3, resnet18, avg_pool2d")
    args = parser.parse_args()
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    import torch

    torch.set_num_threads(int(os.environ.get("TVM_NUM_THREADS", "2")))
    compare(args.rounds, args.only)


if __name__ == "__main__":
    main()
