"""Per-call overhead of kdsl's PyTorch modules against PyTorch's own function, measured on the CPU.

On a GPU at small sizes (batch 1, ResNet layers) a kernel takes 10-60 us, so what decides how a
generated module compares with PyTorch's own function is what a forward costs besides the
arithmetic: the aten operators it dispatches (each one a kernel launch on a GPU, each copy a
kernel too) and the Python it runs per call (einops parsing, shape checks, helper calls). Both
show on the CPU at a tiny binding (batch 1, 16 channels, 8x8 pixels), where the arithmetic is
negligible: :func:`overhead_rows` times the forward of every gallery operator that has an entry
in :data:`kdsl.codegen.native.NATIVE` against that entry (interleaved, no autograd) and counts
the aten operators each dispatches (:func:`count_aten_ops`, a ``TorchDispatchMode``: it sees
every operator below autograd, views included, as a GPU would run them).

Run it as ``python -m kdsl.bench.overhead [names...]``; it prints one row per operator.

>>> ops = count_aten_ops(lambda: __import__("torch").ones(2, 3).t().sum())
>>> sorted(ops)
['aten.ones.default', 'aten.sum.default', 'aten.t.default']
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from statistics import median
from typing import Any

from kdsl import gallery, solve
from kdsl.codegen import torch as kdsl_torch
from kdsl.codegen.native import NATIVE
from kdsl.lang.errors import KdslError
from kdsl.runtime.timing import interleaved_samples, ratio_of_pairs

__all__ = ["TINY", "VIEW_OPS", "count_aten_ops", "main", "overhead_rows", "tiny_binding"]

#: The tiny binding: every size a gallery operator may need, small enough that the arithmetic is
#: negligible next to the per-call cost (K falls back to 2 where 3 does not divide, as for pooling).
TINY: dict[str, int] = {"N": 1, "M": 8, "Cin": 16, "Cout": 16, "H": 8, "W": 8, "L": 8, "G": 2, "K": 3, "s": 2, "d": 2}

#: aten operators that only make a view (no kernel runs on a GPU for them).
VIEW_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "permute",
        "expand",
        "unsqueeze",
        "squeeze",
        "t",
        "transpose",
        "slice",
        "select",
        "as_strided",
        "alias",
        "detach",
        "unfold",
        "flatten",
        "movedim",
        "split",
        "narrow",
        "diagonal",
        "unbind",
    }
)


def tiny_binding(op: Any) -> dict[str, int]:
    """The :data:`TINY` sizes that ``op`` uses, bound (K = 2 where K = 3 does not divide)."""
    names = {v.name for v in op.variables}
    layer = {k: v for k, v in TINY.items() if k in names}
    try:
        return solve.bind(op, layer)
    except KdslError:
        return solve.bind(op, {**layer, "K": 2})


def count_aten_ops(function: Callable[[], Any]) -> Counter[str]:
    """How many times ``function`` dispatches each aten operator (below autograd: views included)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Counter[str] = Counter()

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            counts[str(func)] += 1
            return func(*args, **(kwargs or {}))

    with _Count():
        function()
    return counts


def _split_counts(counts: Mapping[str, int]) -> tuple[int, int]:
    """(operators that run a kernel, operators that only make a view)."""
    views = sum(n for op, n in counts.items() if op.split(".")[1] in VIEW_OPS)
    return sum(counts.values()) - views, views


def _case(name: str) -> dict[str, Any]:
    import torch

    op = gallery.load(name)
    binding = tiny_binding(op)
    module = kdsl_torch.build(op, binding)
    x = torch.randn(tuple(int(d.size.evaluate(binding)) for d in op.inputs))
    prepare, call = NATIVE[name]
    prepared = prepare([w.detach() for w in module.weights], binding)

    def ours() -> Any:
        return module(x)

    def native() -> Any:
        return call(x, prepared, binding)

    with torch.no_grad():
        ours_ops, native_ops = count_aten_ops(ours), count_aten_ops(native)
        # rounds in alternation; the ratio is the median of each round's own ratio, which a slow
        # spell of a shared machine scales on both sides alike
        kdsl_rounds, native_rounds = interleaved_samples([ours, native], repeats=15, target=0.03)
    kdsl_s, native_s = median(kdsl_rounds), median(native_rounds)
    kernels, views = _split_counts(ours_ops)
    native_kernels, native_views = _split_counts(native_ops)
    return {
        "op": name,
        "binding": binding,
        "kdsl_us": kdsl_s * 1e6,
        "native_us": native_s * 1e6,
        "ratio": ratio_of_pairs(kdsl_rounds, native_rounds),
        "kdsl_kernels": kernels,
        "kdsl_views": views,
        "native_kernels": native_kernels,
        "native_views": native_views,
        "kdsl_ops": dict(ours_ops),
    }


def overhead_rows(names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per operator (default: every gallery operator in :data:`NATIVE`): microseconds per
    forward of the kdsl module and of the native function, their ratio, and the aten operators
    each dispatches (kernels, views) at :func:`tiny_binding`."""
    return [_case(name) for name in (names or [n for n in sorted(NATIVE) if n in gallery.names()])]


def main(argv: Sequence[str] | None = None) -> int:
    """Print :func:`overhead_rows` as a table (``-v``: each kdsl module's aten operators too)."""
    import torch

    # one thread: the tiny arithmetic gains nothing from more, and a shared machine's other
    # threads would otherwise add their noise to every call
    torch.set_num_threads(1)
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = "-v" in args
    names = [a for a in args if a != "-v"]
    print(
        f"{'operator':28} {'kdsl us':>8} {'native us':>9} {'extra us':>8} {'ratio':>6}  "
        "kdsl kernels+views  native kernels+views"
    )
    for row in overhead_rows(names):
        extra = row["kdsl_us"] - row["native_us"]  # the Python and launches a forward adds per call
        print(
            f"{row['op']:28} {row['kdsl_us']:8.1f} {row['native_us']:9.1f} {extra:8.1f} {row['ratio']:6.2f}  "
            f"{row['kdsl_kernels']:>12}+{row['kdsl_views']:<5}  {row['native_kernels']:>14}+{row['native_views']}"
        )
        if verbose:
            print("    " + ", ".join(f"{op.removeprefix('aten.')} x{n}" for op, n in sorted(row["kdsl_ops"].items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
