"""Time a matmul's heuristic configuration against the same with parameters overridden, side by side in one process.

Each override is a JSON object of space parameters laid over ``ScheduleSpace.heuristic()`` (tiles as lists);
every kernel is checked against ``x @ w``, rounds alternate the order, and each row prints the best median and
its ratio to the heuristic's (below 1: the override is faster)::

    PYTHONPATH=. python scripts/config_ab.py 16384x32x1024 '{"stage0.cache": "local"}' --rounds 9
    PYTHONPATH=. python scripts/config_ab.py 784x128x128 '{"stage0.tile.Cout": [1, 4, 32]}'
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

os.environ.update(TVM_NUM_THREADS=os.environ.get("TVM_NUM_THREADS", "2"), TVM_BIND_THREADS="0")


def main() -> None:
    """Build the heuristic's kernel and one per override, check them, time them in alternation, print ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", help="MxKxN of the gallery's matmul (Cin = K)")
    parser.add_argument("overrides", nargs="*", help="JSON objects of parameters")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    import torch

    from kdsl import gallery
    from kdsl.codegen.tvm import build
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace
    from kdsl.runtime.timing import best_medians

    m, k, n = (int(v) for v in args.case.split("x"))
    layer = {"M": m, "Cin": k, "Cout": n}
    overrides = [{}, *(json.loads(text) for text in args.overrides)]
    x, w = torch.randn(m, k), torch.randn(k, n)
    expected = x @ w
    calls = []
    for override in overrides:

        def schedule(lowered: Any, override: dict[str, Any] = override) -> Any:
            space = ScheduleSpace(lowered)
            config = space.heuristic()
            config.update({name: tuple(v) if isinstance(v, list) else v for name, v in override.items()})
            return space.apply(config)

        kernel = build(gallery.load("matmul"), layer, schedule=schedule)
        out = torch.empty(m, n)
        kernel.executable(x, w, out)
        assert torch.allclose(out, expected, atol=1e-3), override
        calls.append(lambda kernel=kernel, out=out: kernel.executable(x, w, out))
    best = best_medians(calls, rounds=args.rounds, repeats=7, warmup=2)
    for override, seconds in zip(overrides, best):
        label = json.dumps(override) if override else "heuristic"
        print(f"{args.case} {label:60s} {seconds * 1e3:8.3f} ms  /heuristic {seconds / best[0]:.2f}")


if __name__ == "__main__":
    main()
