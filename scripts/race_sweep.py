"""Race and coverage check of many kernels' lowered TIR (:mod:`kdsl.codegen.tvm.race_check`), no compile.

    PYTHONPATH=. python scripts/race_sweep.py --draws 8            # the sweep in docs/network.md
    PYTHONPATH=. python scripts/race_sweep.py --draws 2 --only conv2d

For each operator and small layer below, the default schedule and ``--draws`` random valid configurations
of its schedule space (``ScheduleSpace.random``, what the tuners start from; a draw the space rejects is
drawn again) are applied in three forms: the plain kernel, the channel-blocked signature (``block=16``,
:func:`~kdsl.codegen.tvm.signature_layout.block_signature`) and the kernel with a fused epilogue (batch norm,
residual, ReLU: :mod:`kdsl.codegen.tvm.epilogue`), and then every ResNet-18 stage layer's default, in
the three forms. Each is lowered by TVM's own pipeline and checked: stores of two parallel iterations at
one index (:func:`~kdsl.codegen.tvm.race_check.find_races`) and output elements no store writes
(:func:`~kdsl.codegen.tvm.race_check.unwritten`). It prints one line per kernel with a finding, then totals.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from typing import Any

from kdsl import gallery
from kdsl.codegen.tvm import lower
from kdsl.codegen.tvm.epilogue import Epilogue, _block_buffers, fold_epilogue, lower_fused
from kdsl.codegen.tvm.machine import current_machine
from kdsl.codegen.tvm.race_check import find_races, lowered_function, unwritten
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.codegen.tvm.signature_layout import block_signature
from kdsl.discover.network import stage_layers
from kdsl.lang.errors import LoweringError

CASES = [
    ("conv2d", {"N": 1, "Cin": 32, "Cout": 32, "H": 14, "W": 14, "K": 3}),
    ("grouped_conv2d", {"N": 1, "Cin": 32, "Cout": 32, "H": 14, "W": 14, "G": 4, "K": 3}),
    ("depthwise_conv2d", {"N": 1, "Cin": 32, "H": 14, "W": 14, "K": 3}),
    ("matmul", {"M": 64, "Cin": 64, "Cout": 64}),
]
FORMS = ("plain", "blocked", "fused")
BLOCK = 16


def schedule_of(op: Any, layer: dict[str, int], config: dict[str, Any] | None, form: str) -> tuple[Any, str]:
    """The scheduled kernel (``config``: None for the default) in ``form`` and the name of its output buffer."""
    lowered = lower_fused(op, layer, Epilogue(residual=True, relu=True)) if form == "fused" else lower(op, layer)
    space = ScheduleSpace(lowered)
    sch = space.apply(space.heuristic(), fallback=True) if config is None else space.apply(config)
    if form == "blocked":
        block_signature(sch, lowered, BLOCK)
        return sch, lowered.out.name
    if form == "fused":
        sch, _ = fold_epilogue(sch, current_machine().lanes("float32"))
        if layer.get("Cout", layer.get("Cin", 0)) % BLOCK == 0 and len(lowered.output_shape) == 4:
            _block_buffers(sch, lowered, BLOCK)  # the blocked, propagated network's kernel
        return sch, lowered.result.name
    return sch, lowered.out.name


def check(label: str, sch: Any, output: str, totals: Counter) -> None:
    func = lowered_function(sch)
    races = find_races(func)
    missing = unwritten(func, output)
    totals["kernels"] += 1
    totals["races"] += len([r for r in races if r.kind != "unchecked"])
    totals["unchecked"] += len([r for r in races if r.kind == "unchecked"])
    totals["unwritten"] += missing > 0
    if races or missing:
        print(f"{label}: {'; '.join(map(str, races)) or 'no race'}; {missing} output element(s) unwritten")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=8, help="random configurations per operator and form")
    parser.add_argument("--only", help="one operator of the list")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    totals: Counter = Counter()
    for name, layer in CASES:
        if args.only and name != args.only:
            continue
        op = gallery.load(name)
        for form in FORMS:
            if form != "plain" and name == "matmul":
                continue  # no channel dim to block, no batch norm after it
            configs: list[dict[str, Any] | None] = [None]
            space = ScheduleSpace(lower(op, layer))
            while len(configs) < args.draws + 1:
                config = space.random(rng)
                try:
                    sch, output = schedule_of(op, layer, config, form)
                except LoweringError:
                    totals["rejected draws"] += 1
                    continue
                configs.append(config)
                check(f"{name} {form} draw {len(configs) - 1}", sch, output, totals)
            sch, output = schedule_of(op, layer, None, form)
            check(f"{name} {form} default", sch, output, totals)
    if not args.only:
        conv = gallery.load("conv2d")
        for stage in stage_layers(1):
            layer = {**stage.values, "K": 3}
            for form in FORMS:
                sch, output = schedule_of(conv, layer, None, form)
                check(f"resnet18 {stage.name} {form} default", sch, output, totals)
    print(", ".join(f"{key}: {value}" for key, value in sorted(totals.items())))


if __name__ == "__main__":
    main()
