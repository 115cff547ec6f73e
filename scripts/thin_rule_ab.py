"""Time matmuls with the thin-product rule (``MemoryRules._rows_whole``) on and off, side by side in one process.

Each case is built twice from this tree's heuristic: as it is, and with the rule declined (the weight-only vector
axis's tiles then stay outermost in the fused parallel loop: one weight panel per run of tasks). Rounds alternate
the order; each row prints both register tiles of ``Cout``, the best median of each side and ``off/on`` (above 1:
whole rows pay)::

    PYTHONPATH=. python scripts/thin_rule_ab.py 784x128x128 512x128x128 784x64x64 3136x128x128 --rounds 11
"""

from __future__ import annotations

import argparse
import os
from typing import Any

os.environ.update(TVM_NUM_THREADS=os.environ.get("TVM_NUM_THREADS", "2"), TVM_BIND_THREADS="0")


def build_pair(layer: dict[str, int]) -> list[tuple[Any, Any]]:
    """``[(kernel, tile of Cout)]`` with the rule as it is, then declined."""
    from kdsl import gallery
    from kdsl.codegen.tvm import build, space_memory
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    rule = space_memory.MemoryRules._rows_whole
    out = []
    for declined in (False, True):
        tiles = []

        def schedule(lowered: Any, tiles: list[Any] = tiles) -> Any:
            space = ScheduleSpace(lowered)
            config = space.heuristic()
            tiles.append(config["stage0.tile.Cout"])
            return space.apply(config)

        if declined:
            space_memory.MemoryRules._rows_whole = lambda *args, **kwargs: False
        try:
            out.append((build(gallery.load("matmul"), layer, schedule=schedule), tiles[-1] if tiles else None))
        finally:
            space_memory.MemoryRules._rows_whole = rule
    return out


def main() -> None:
    """Build each case's pair, check both against ``x @ w``, time them in alternation and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="+", help="MxKxN")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import torch

    from kdsl.codegen.tvm.machine import current_machine
    from kdsl.runtime.timing import median_seconds, round_order

    machine = current_machine()
    print(f"{machine.mcpu}: L1d {machine.l1d // 1024} KiB, L2 {machine.l2 // 1024} KiB, {machine.cores} cores")
    rows = []
    for case in args.cases:
        m, k, n = (int(v) for v in case.split("x"))
        pair = build_pair({"M": m, "Cin": k, "Cout": n})
        x, w = torch.randn(m, k), torch.randn(*pair[0][0].weight_shapes[0])
        expected = x @ w
        calls = []
        for kernel, _ in pair:
            out = torch.empty(m, n)
            kernel.executable(x, w, out)
            assert torch.allclose(out, expected, atol=1e-3), case
            calls.append(lambda kernel=kernel, out=out, x=x, w=w: kernel.executable(x, w, out))
        rows.append((case, [tile for _, tile in pair], calls))
    best = {case: [float("inf")] * 2 for case, _, _ in rows}
    for r in range(args.rounds):
        for case, _, calls in rows:
            for i in round_order(2, r):
                best[case][i] = min(best[case][i], median_seconds(calls[i], repeats=7, warmup=2))
    for case, (on_tile, off_tile), _ in rows:
        on, off = best[case]
        print(f"{case:14s} on {on_tile} {on * 1e3:8.3f} ms  off {off_tile} {off * 1e3:8.3f} ms  off/on {off / on:.2f}")


if __name__ == "__main__":
    main()
