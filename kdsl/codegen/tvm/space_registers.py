"""The heuristic's register tile: which spatial axes share the accumulators beside the vector axis, and how wide
the vector tile is where its rows would cost more than its lanes.

:class:`RegisterRules` holds these rules of :meth:`ScheduleSpace.heuristic
<kdsl.codegen.tvm.schedule_space.ScheduleSpace.heuristic>`; the space inherits them (they read its lanes,
accumulator budget, lowered operator and tensors), as it inherits :class:`~kdsl.codegen.tvm.space_memory.MemoryRules`.
"""

from __future__ import annotations

from typing import Any

from kdsl.codegen.tvm.blocks import Axis, StageBlock
from kdsl.codegen.tvm.parameters import largest_divisor
from kdsl.codegen.tvm.pass_stages import MAX_VECTORS
from kdsl.codegen.tvm.space_memory import BLOCK_ABOVE_L2

#: cycles from one FMA to the next that reads its result (Skylake to Sapphire Rapids, Zen 3 and 4): a register tile
#: needs ``FMA_LATENCY x fma_units`` independent accumulators to keep every FMA unit busy
FMA_LATENCY = 4


class RegisterRules:
    """The heuristic's register-tile rules, a part of :class:`~kdsl.codegen.tvm.schedule_space.ScheduleSpace`."""

    lowered: Any
    machine: Any
    lanes: int
    accumulators: int
    _input_bytes: int  # MemoryRules'

    def _reuse_weights(self, stage: StageBlock, vector: Axis | None, vf: int) -> int:
        """The vector tile ``vf`` cut to one vector where its several vectors leave the register tile only an
        axis that the weights index (each row of the tile then loads weights of its own), or no row at all, and
        one vector frees room for an axis they do not index (its rows share each weight vector). A grouped
        conv2d at conv5_x (G = 32, 16 channels a group) for AVX2: groups 4 x 2 vectors -> W 7 x 1 vector, 1.9x
        faster (2 contended threads). With no row (AVX2's budget of 4 rows of 2 vectors, which no divisor of 7
        fits: a tile of 2 accumulators, each weight vector used once), ResNet-18's conv5_x layers at batch 1 (Zen
        3, 2 threads, pairs): conv2d 2.52x faster with W 7 x 1 vector, 13 other 7x7 layers 1.38-2.50x. Branching
        kernels only where there is no row (their 7 layers at conv5_x 1.40-2.42x: residual_conv2d's convolution
        2.42x, a max pool's folds 1.60x, with no weights at all); the weight-indexed rows are a plain operators'
        rule."""
        lanes, accumulators = self.lanes, self.accumulators
        if vector is None or vf <= lanes or vf % lanes:
            return vf
        budget = accumulators // (vf // lanes)
        register, _ = self._register_axis(stage, vector, budget)
        weights = {w.name for w in self.lowered.weights}
        indexed = {i for buffer, dims in stage.reads if buffer in weights for used in dims for i in used}
        if register is not None and (register.index not in indexed or not self.lowered.op.is_linear):
            return vf
        free = [a for a in stage.axes if not a.reduce and a is not vector and a.extent > 1 and a.index not in indexed]
        if any(largest_divisor(a.extent, budget) < largest_divisor(a.extent, accumulators) for a in free):
            return lanes
        return vf

    def _register_axis(
        self, stage: StageBlock, vector: Axis | None, budget: int, besides: Axis | None = None
    ) -> tuple[Axis | None, int]:
        """A spatial axis for the register tile besides the vector axis (and ``besides``; a data axis if
        any), tiled to fit ``budget``."""
        candidates = [a for a in stage.axes if not a.reduce and a is not vector and a is not besides and a.extent > 1]
        if not candidates:
            return None, 1
        axis = max(candidates, key=lambda a: (not a.weight_only, largest_divisor(a.extent, budget) > 1, a.index))
        factor = largest_divisor(axis.extent, budget)
        return (axis, factor) if factor > 1 else (None, 1)

    def _strided_rows_to_lanes(self, stage: StageBlock, vector: Axis | None, vf: int) -> tuple[int, Axis | None]:
        """A plain convolution whose innermost data axis reads its input at a stride above 1 (``x[.., 2*w + kw]``)
        and whose vector axis only the weights index: on a machine of fewer than 16 lanes, 32 lanes of the
        vector axis (AVX2: 4 vectors, AVX-512's 2) over rows of the next data axis out (``H``), not of the
        strided one. Strided rows of the register tile broadcast from a new cache line each, and 2 x 2 rows of
        a 3 x 3 window at stride 2 leave LLVM 25 broadcasts live beside the accumulators (AVX2's 16 registers
        spilled). Gensor's C1 and C3 (stride 2, AVX2, Zen 3, 2 threads, pairs against the default's 2 vectors
        over W x H, or W): 0.74 and 0.69 of the time; stride-1 convolutions keep their tiles (ALT's C2D with 4
        vectors over H: 1.37x slower), nor do strided ones whose inputs fit in :data:`BLOCK_ABOVE_L2` L2 caches.
        Returns the vector tile and the rows' axis (``None``: the rule does not apply)."""
        wide = 32
        if not self.lowered.op.is_linear or vector is None or not vector.weight_only or vf != MAX_VECTORS * self.lanes:
            return vf, None
        if self.lanes >= 16 or wide % self.lanes or vector.extent % wide:
            return vf, None
        data = [a for a in stage.axes if not a.reduce and not a.weight_only and a.extent > 1]
        if not data or (data[-1].gather_stride or 0) <= 1:
            return vf, None
        if len(data) < 2 or largest_divisor(data[-2].extent, self.accumulators // (wide // self.lanes)) == 1:
            return vf, None  # no rows of H to take (OpEvo's C1, H = 55: rows of N instead were 0.98x as fast)
        if self._input_bytes <= BLOCK_ABOVE_L2 * self.machine.l2:
            # data that stays in L2 costs no line per broadcast (ResNet-18's stride-2 layers at batch 1, 400 KiB:
            # the rule's tiles took 1.08 and 1.24x the time of the default's)
            return vf, None
        return wide, data[-2]

    def _fullest_register_tile(
        self, stage: StageBlock, vector: Axis | None, budget: int, register: Axis, uf: int
    ) -> tuple[Axis, int, Axis | None, int]:
        """The register tile's first and second axes (each with its tile): ``register`` (:meth:`_register_axis`'s
        pick) first, unless it and its second axis fill at most half of ``budget`` accumulators and another first
        axis fills more.
        The preferred first axis may be so short that its tile and the second's leave half the budget unused:
        ALT's T2D (a transposed conv2d as phases, ``W_p`` = 2 innermost, ``W_o`` = 14) got ``W_p`` 2 x ``W_o`` 2
        of AVX2's 8 rows, where ``W_o`` 7 alone fills 7 (0.74x the time, Zen 3, 2 threads, in pairs)."""

        def with_second(first: Axis, f: int) -> tuple[Axis, int, Axis | None, int]:
            second, sf = self._register_axis(stage, vector, budget // f, besides=first)
            return first, f, second, sf

        best = with_second(register, uf)
        if 2 * best[1] * best[3] > budget:
            return best  # within a factor of 2 of the budget: the preferred axes keep it (7 of 8 is no reason)
        candidates = [a for a in stage.axes if not a.reduce and a is not vector and a.extent > 1]
        for axis in sorted(candidates, key=lambda a: -a.index):  # on a tie the innermost, as _register_axis
            if axis.weight_only != register.weight_only or axis is register:
                continue  # a data axis stays first where there is one (_register_axis)
            option = with_second(axis, largest_divisor(axis.extent, budget))
            if option[1] * option[3] > best[1] * best[3]:
                best = option
        return best

    def _cover_fma_latency(
        self, vectors: int, register: Axis, uf: int, second: Axis | None, sf: int
    ) -> tuple[Axis, int, Axis | None, int]:
        """The first axis's tile widened past the half-file budget where the budget's divisors leave fewer
        accumulators than the FMA units' latency needs (:data:`FMA_LATENCY`), and a larger divisor reaches it
        within three quarters of the register file (the rest holds the step's ``vectors`` weight vectors and
        its broadcasts). A budget is the largest divisor at most :meth:`accumulators
        <kdsl.runtime.cpu.Machine.accumulators>`; an extent of 15 under AVX2's budget of 4 rows of 2 vectors
        got 3 rows, 6 accumulators for the 8 that 2 FMA units of latency 4 keep in flight. With 5 rows (10
        accumulators) a strided 3x3 convolution at 64x256x32x32 ran 0.69x the time (Zen 3, 2 threads, pairs)."""
        live = FMA_LATENCY * self.machine.fma_units
        if vectors * uf * sf >= live:
            return register, uf, second, sf
        rows = (3 * self.machine.vector_registers // 4) // (vectors * sf)
        wider = largest_divisor(register.extent, rows)
        if wider > uf and vectors * wider * sf >= live:
            return register, wider, second, sf
        return register, uf, second, sf
