"""The phase (sub-pixel) form of a window over a zero-inserted dim: transposed convolutions without the zeros.

A chain that reads a dim through ``Dilate(d, s)`` and then a same-padded ``Unfold(d, K, k)`` whose window
``k`` the stage reduces computes ``out[o] = sum_k dilated[o + k - K//2] * w[k]``; of the ``K`` taps only
those with ``s | o + k - K//2`` meet an element, the rest multiply inserted zeros. Split the output
coordinate ``o = s*o1 + p`` (``p`` its phase, ``o1`` its outer index): the taps that meet an element are
``k = s*t + r(p)`` with ``r(p) = (K//2 - p) mod s`` and ``t`` in ``[0, ceil(K/s))``, and they read the input
at ``o1 + t + c(p)``, ``c(p) = -floor((K//2 - p) / s)``. A tap with ``k >= K`` (``s`` does not divide
``K``) is guarded.

The TVM lowering (:func:`kdsl.codegen.tvm.chain_stages.lower_chain`) lowers such a stage as

* a copy of the input with the phase as a new axis, shifted and zero-padded so that the reduction's
  read is affine and needs no bounds check: ``phased[.., p, i, ..] = x[.., i + c(p), ..]`` for
  ``i`` in ``[0, n + ceil(K/s) - 1)`` (zero outside ``[0, n)``); a zero-padded copy (``padN``, marked
  ``StageInfo.phased``) that the default schedule inlines into the reduction and the space may materialize,
* one reduction over ``t`` instead of ``k`` whose result is laid out ``[.., o1, p, ..]``: row-major it
  is the same memory as ``[.., s*o1 + p, ..]``, so the copy to the plan's ``[.., o, ..]`` reads
  ``result[.., o // s, o % s, ..]``, which the schedule folds into the reduction's write-back,

so the inserted zeros cost nothing and the stage does ``s`` times fewer multiply-adds per such dim.
Which stages qualify is decided from the views alone (:func:`find_phases`), never from the operator's name.
This module holds the pattern and its index arithmetic; it builds no stage itself.

>>> from kdsl.lang import *
>>> N, C, H = primary("N C H"); K, s = coefficient("K s")
>>> op = Input(N, C, H) >> Dilate(H, s) >> Unfold("H", K, "k") >> Reduce("k") >> Output(N, C, "H")
>>> steps = [step.at({"N": 1, "C": 2, "H": 5, "K": 3, "s": 2}) for step in op.steps[:2]]
>>> views = [(steps[0], {"N": 1, "C": 2, "H": 5}), (steps[1], {"N": 1, "C": 2, "H": 10})]
>>> [(ph.dim, ph.window, ph.factor, ph.size, ph.extent, ph.taps) for ph in find_phases(views, ["N", "C", "H"], ["k"])]
[('H', 'k', 2, 3, 5, 2)]
>>> phase = find_phases(views, ["N", "C", "H"], ["k"])[0]
>>> [(p, [phase.tap_index(p, t) for t in range(phase.taps)], phase.offset(p)) for p in range(2)]
[(0, [1, 3], 0), (1, [0, 2], 0)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kdsl.lang.primitives import Dilate, Primitive, Unfold


def _select(condition: Any, then: Any, otherwise: Any) -> Any:
    """``then if condition else otherwise`` on ints (TIR expressions use ``tvm.tirx.Select``)."""
    return then if condition else otherwise


@dataclass(frozen=True)
class Phase:
    """One dim read through ``Dilate(dim, factor)`` then ``Unfold(dim, size, window)``: the numbers of
    its phase form (all at one binding), and the names of the stage axes it adds."""

    dim: str  # the unfolded dim (its size after the Dilate is factor * extent)
    window: str  # the Unfold's window dim, which the stage reduces
    factor: int  # s
    size: int  # K
    extent: int  # n, the dim's size before the Dilate
    outer: str = ""  # the stage axis of o1 (extent n)
    phase: str = ""  # the stage axis of p (extent s)
    tap: str = ""  # the reduction axis of t (extent ceil(K / s))

    @property
    def taps(self) -> int:
        """The taps per phase, ``ceil(K / s)``."""
        return -(-self.size // self.factor)

    @property
    def guarded(self) -> bool:
        """Whether some phase's last tap lies past the window (``s`` does not divide ``K``)."""
        return self.size % self.factor != 0

    def tap_index(self, p: Any, t: Any, select: Callable[[Any, Any, Any], Any] = _select) -> Any:
        """The window index ``k = s*t + (K//2 - p) mod s`` of tap ``t`` in phase ``p`` (ints, or TIR
        expressions with ``select=tvm.tirx.Select``)."""
        # no floormod: TVM 0.27 computed W[floormod(4 - p, 3)] as W[floormod(-p, 3)] (p in [0, 3)); the
        # residue of K//2 - p is K//2 mod s - p, plus s once p passes K//2 mod s
        low = (self.size // 2) % self.factor
        return self.factor * t + select(p <= low, low - p, low + self.factor - p)

    def offset(self, p: Any, select: Callable[[Any, Any, Any], Any] = _select) -> Any:
        """``c(p) = -floor((K//2 - p) / s)``: phase ``p``'s tap ``t`` at outer index ``o1`` reads the input
        at ``o1 + t + c(p)`` (one more once ``p`` passes ``K//2 mod s``)."""
        low, high = (self.size // 2) % self.factor, (self.size // 2) // self.factor
        return select(p <= low, 0 - high, 1 - high)


def _fresh(base: str, taken: set[str]) -> str:
    """``base``, primed until no dim of the operator or earlier axis has the name."""
    name = base
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def find_phases(
    views: Sequence[tuple[Primitive, Mapping[str, int]]],
    result: Sequence[str],
    reduced: Sequence[str],
    taken: Iterable[str] = (),
) -> list[Phase]:
    """The dims of a contraction stage that its phase form serves: ``views`` are the steps (each at the
    binding, with the live sizes before it) between the stage's source and the stage, ``result`` and
    ``reduced`` its result and reduced dims, ``taken`` names the new axes must avoid.

    A dim qualifies when it is dilated (factor > 1) and then unfolded, the stage keeps it and reduces the
    window, and no other view touches the dim or the window (the read then reaches the source unchanged:
    anything else keeps the general lowering with its guards)."""
    touches: dict[str, int] = {}
    for step, _ in views:
        for name in {*step.consumes, *step.produces}:
            touches[name] = touches.get(name, 0) + 1
    found = []
    names = {*taken, *result, *reduced}
    for position, (step, _) in enumerate(views):
        if not isinstance(step, Unfold) or step.name not in reduced or step.dim not in result:
            continue
        dim, window = step.dim, str(step.name)
        dilates = [(s, n) for s, n in views[:position] if isinstance(s, Dilate) and s.dim == dim]
        if len(dilates) != 1 or touches.get(dim) != 2 or touches.get(window) != 1:
            continue
        dilate, before = dilates[0]
        if not (dilate.factor.is_constant and step.window.is_constant) or dilate.factor.constant < 2:
            continue  # sizes are constant at a binding; a factor of 1 inserts no zeros
        found.append(Phase(dim, window, int(dilate.factor.constant), int(step.window.constant), int(before[dim])))
    return [
        Phase(
            ph.dim,
            ph.window,
            ph.factor,
            ph.size,
            ph.extent,
            _fresh(f"{ph.dim}_o", names),
            _fresh(f"{ph.dim}_p", names),
            _fresh(f"{ph.window}_t", names),
        )
        for ph in found
    ]


def without_phases(
    views: Sequence[tuple[Primitive, Mapping[str, int]]], phases: Sequence[Phase]
) -> list[tuple[Primitive, Mapping[str, int]]]:
    """``views`` less the Dilate and Unfold of every phase dim (the phase form reads those dims itself)."""
    dims = {ph.dim for ph in phases}
    return [(s, n) for s, n in views if not (isinstance(s, (Dilate, Unfold)) and s.dim in dims)]
