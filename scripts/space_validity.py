"""How many of the tuners' proposals fail to apply: random draws and OpEvo mutations, before and after repair.

    PYTHONPATH=. python scripts/space_validity.py --draws 200            # the table in docs/tune/README.md
    PYTHONPATH=. python scripts/space_validity.py --draws 50 --only matmul

For each operator and layer (the ALT suite's shapes, Gensor's P3 and OpEvo's BMM1), ``--draws``
configurations of four kinds are applied (no compile): *random, raw* draws every parameter on its own
(``ScheduleSpace.random`` before :mod:`kdsl.codegen.tvm.space_rules`), *random* is ``ScheduleSpace.random``,
*mutation, raw* is OpEvo's mutation of the heuristic configuration (about two parameters walked, q = 0.5)
and *mutation* the same repaired (``ScheduleSpace.repair``, what OpEvo now proposes). It prints one
markdown row per operator: the invalid share of each kind and the most common reason of the raw ones.
"""

from __future__ import annotations

import argparse
import random
import re
from collections import Counter

from kdsl import gallery
from kdsl.codegen.tvm import lower
from kdsl.codegen.tvm.schedule_space import ScheduleSpace
from kdsl.tune.opevo import mutate

CASES = [
    ("conv2d", {"N": 1, "Cin": 128, "Cout": 128, "H": 28, "W": 28, "K": 3}),
    ("matmul", {"M": 512, "Cin": 1024, "Cout": 1024}),
    ("depthwise_conv2d", {"N": 1, "Cin": 128, "H": 28, "W": 28, "K": 3}),
    ("grouped_conv2d", {"N": 1, "Cin": 128, "Cout": 128, "H": 28, "W": 28, "G": 4, "K": 3}),
    ("conv1d", {"N": 1, "Cin": 256, "Cout": 256, "L": 512, "K": 3}),
    ("conv3d", {"N": 1, "Cin": 64, "Cout": 64, "D": 8, "H": 28, "W": 28, "K": 3}),
    ("conv_transpose2d", {"N": 1, "Cin": 256, "Cout": 128, "H": 14, "W": 14}),
    ("avg_pool2d_strided", {"N": 128, "Cin": 617, "H": 21, "W": 21, "Ho": 10, "Wo": 10, "K": 3, "s": 2}),
    ("bmm", {"B": 960, "M": 128, "K": 128, "N": 64}),
]
KINDS = ("random, raw", "random", "mutation, raw", "mutation")


def draw(space: ScheduleSpace, kind: str, rng: random.Random, start: dict) -> dict:
    """One configuration of ``kind`` (see the module's text)."""
    rate = min(1.0, 2.0 / len(space.parameters))
    if kind == "random, raw":
        return {name: param.random(rng) for name, param in space.parameters.items()}
    if kind == "random":
        return space.random(rng)
    mutated = mutate(space.parameters, start, 0.5, rng, rate)
    return mutated if kind == "mutation, raw" else space.repair(mutated)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated operator names")
    args = parser.parse_args()
    only = [n for n in args.only.split(",") if n]
    print("| operator | layer | " + " | ".join(f"{k} invalid" for k in KINDS) + " | most common reason (raw) |")
    print("|---" * (len(KINDS) + 3) + "|")
    for name, layer in CASES:
        if only and name not in only:
            continue
        space = ScheduleSpace(lower(gallery.load(name), layer))
        start, shares, reasons = space.heuristic(), [], Counter()
        for kind in KINDS:
            rng, invalid = random.Random(args.seed), 0
            for _ in range(args.draws):
                reason = space.rejection(draw(space, kind, rng, start))
                if reason is not None:
                    invalid += 1
                    reasons[re.sub(r"\d+", "#", reason.split(": ", 1)[-1])[:60]] += kind.endswith("raw")
            shares.append(f"{invalid}/{args.draws}")
        top = reasons.most_common(1)[0][0] if reasons else "-"
        shape = ",".join(f"{k}={v}" for k, v in layer.items())
        print(f"| {name} | {shape} | " + " | ".join(shares) + f" | {top} |", flush=True)


if __name__ == "__main__":
    main()
