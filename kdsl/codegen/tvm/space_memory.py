"""How the heuristic's reduction stages meet memory: the layouts their vector axis wants, cache blocking
where the data exceed L2, and window sums computed where their reader runs.

:class:`MemoryRules` holds these rules of :meth:`ScheduleSpace.heuristic
<kdsl.codegen.tvm.schedule_space.ScheduleSpace.heuristic>`; the space inherits them (they read its
parameters, tensors, stages and machine), so :mod:`kdsl.codegen.tvm.schedule_space` stays one readable file.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod
from typing import Any

from kdsl.codegen.tvm.blocks import Axis, StageBlock
from kdsl.codegen.tvm.pack_inside import is_packed
from kdsl.codegen.tvm.parameters import order_labels
from kdsl.codegen.tvm.prefetch import prefetch_conflict, slab_reads, slab_rows
from kdsl.runtime.cpu import dtype_bits

#: Outer tiles per cache block offered by ``S.block``.
BLOCK_TILES = (2, 4, 8, 16, 32, 64)
#: Reduction steps per block offered by ``S.rblock`` (Goto's ``Kc``).
RBLOCK_DEPTHS = (64, 128, 256, 512, 1024)
#: Columns each data element must meet before :meth:`MemoryRules._pack_data_rows` packs the data rows.
PACK_ROWS_COLUMNS = 2048
#: Parallel tasks a core that :meth:`MemoryRules._block_reduction` keeps while it moves data tiles into a block.
BLOCK_TASKS = 16
#: Data inputs larger than this many L2 caches get the heuristic's cache blocking (at 2, matmul
#: 512x1024x1024 on a 1 MiB L2 ran 0.92x with it; at 8, 1.06-1.36x; contended).
BLOCK_ABOVE_L2 = 4


class MemoryRules:
    """The heuristic's memory rules, a part of :class:`~kdsl.codegen.tvm.schedule_space.ScheduleSpace`."""

    parameters: dict[str, Any]
    tensors: list[Any]
    stages: list[StageBlock]
    machine: Any
    lowered: Any
    lanes: int
    weight_names: frozenset[str]

    def _memory(self, stage: StageBlock, vector: Axis | None, vf: int, config: dict[str, Any]) -> None:
        """How a reduction stage meets memory: the layouts its vector axis wants (:meth:`_vector_layouts`), cache
        blocking (:meth:`_cache_block`), and a window sum read by another window sum (a separable pooling's rows,
        then its columns) computed at its reader's parallel loop, so that its result is read back from cache,
        not from memory (``S.attach``, the attached sums vectorized: Gensor's P2 1.4x, P3 1.6x, contended); an
        attached stage gets no layouts or blocks of its own."""
        s, reader = stage.name, self.stage_named(stage.consumers[0]) if stage.consumers else None
        # a reader without spatial axes (a sum to one value) has no parallel loop to attach to
        if f"{s}.attach" in config and self._streams(stage) and reader.spatial and self._streams(reader):
            # computed inside its reader's loop, the stage is vectorized along the rows it makes there, not by
            # its own vector axis: layouts for that axis would be passes over the input for nothing (Gensor's
            # P2 packed its 593 MB input channels-last for a channel vector it did not use: 5.8x slower)
            config[f"{s}.attach"] = "outer"
            return
        if vector is not None:
            self._vector_layouts(stage, vector, vf, config)
            if not self._rows_whole(stage, vector, vf, config):
                self._block_reduction(stage, vector, vf, config)
                self._cache_block(stage, vector, config)
        self._prefetch_next(stage, config)

    def _prefetch_next(self, stage: StageBlock, config: dict[str, Any]) -> None:
        """Prefetch the next slab of the data (``S.prefetch = "next"``, :mod:`kdsl.codegen.tvm.prefetch`) where the
        reads it fetches exceed the last-level cache (each slab then comes from memory) and two slabs fit in L2.
        Zen 3 (32 MiB L3, 512 KiB L2), 2 threads, pairs of calls: bmm 960 x 128x128 . 128x64 0.77-0.82 of the time
        without, bmm_tn 0.76-0.93, bmm_tn 960 x 64x128 . 128x64 0.77; at 32 and 8 batches (in L3) 1.02. Matmul
        16384 x 1024 x 4096 and Gensor's M3 (65536 rows), each block of 64 rows of x 256 KiB (half of L2): 0.97,
        0.98 and 0.98."""
        s = stage.name
        if f"{s}.prefetch" not in config or prefetch_conflict(
            stage, {**config, f"{s}.prefetch": "next"}, self.weight_names
        ):
            return
        slabs = self._slab_reads(stage)
        total = self._itemsize * sum(prod(shape) for shape in slabs)
        rows = slab_rows(stage, stage.axes[0].label, config)  # a slab is this many values of the slab axis
        slab = self._itemsize * rows * sum(prod(shape[1:]) for shape in slabs)
        if total > self.machine.l3 and 2 * slab <= self.machine.l2:
            config[f"{s}.prefetch"] = "next"

    def _slab_reads(self, stage: StageBlock) -> list[tuple[int, ...]]:
        """The shapes of the reads ``S.prefetch`` fetches slabs of (:func:`~kdsl.codegen.tvm.prefetch.slab_reads`)."""
        shapes = {t.name: tuple(int(d) for d in t.shape) for t in self.lowered.inputs}
        shapes.update({st.name: tuple(e for _, e in st.spatial) for st in self.stages})
        return [shapes[buffer] for buffer in slab_reads(stage, self.weight_names) if buffer in shapes]

    def _rows_in_output(self, stage: StageBlock, vector: Axis | None) -> bool:
        """Whether ``stage`` writes the kernel's output itself with its vector axis ``vector`` along the output's
        last dim, so that its register tiles are boxes of whole output rows it can write, or accumulate, in
        place. A stage that a copy folded into its write-back transposes (a grouped conv2d's ``[g, H, W, co]``
        into NCHW) does not write the output's rows."""
        writes_output = stage.name == self.lowered.out.op.name
        return writes_output and vector is not None and stage.spatial[-1][0] == vector.label

    @property
    def _itemsize(self) -> int:
        """Bytes of one element of the kernel's output dtype (the sizes the cache rules compare)."""
        return max(1, dtype_bits(self.lowered.out.dtype) // 8)

    @property
    def _input_bytes(self) -> int:
        """Bytes of the kernel's data inputs, at :attr:`_itemsize` an element."""
        return self._itemsize * sum(prod(t.shape) for t in self.tensors if t.kind == "input")

    def _accumulate_in_place(self, stage: StageBlock, config: dict[str, Any]) -> None:
        """``stage`` accumulates in the output it writes (``S.cache = "none"``) where its space offers it: LLVM
        keeps the register tile in registers across the reduction, where a local tile lives in a workspace
        buffer that each tile zeroes and stores to before its write-back."""
        if "none" in self.parameters[f"{stage.name}.cache"].choices:
            config[f"{stage.name}.cache"] = "none"

    def _rows_whole(self, stage: StageBlock, vector: Axis, vf: int, config: dict[str, Any]) -> bool:
        """Take a weight-only vector axis out of the fused parallel loop where its slab order buys nothing: when
        all the stage's weights fit in half of L2 and the data rows of one register tile (its rows times the
        whole reduction) in half of L1, the vector axis's tiles all go to the middle loops
        (``(1, extent // vf, vf)``), so each parallel task keeps its data rows in L1 while the weights pass from
        L2, and writes whole rows of the output (only a stage that writes the kernel's output itself, the vector
        axis its last dim). A thin matmul's result is its traffic: with the weight panels outermost, each task
        wrote its rows a page apart (Gensor's U3, 16384x32x1024, AVX-512, 2 contended threads: 40 -> 18 ms,
        ``scripts/heuristic_compare.py``). Needs 4 data tiles a core, and not a kernel that stays in one
        core's L2 (inputs, weights and output) with weights over half of L1 (ResNet-18's 784x128x128: there
        the panels, each kept in L1, win); returns whether it applied (cache blocking then has no weight
        panels to sweep the data for). A thin product accumulates in place (``S.cache = "none"``) either way."""
        s = stage.name
        if vector.label not in stage.weight_only or not self._rows_in_output(stage, vector):
            return False
        itemsize = self._itemsize
        weights = {w.name for w in self.lowered.weights}
        read = {b for b, _ in stage.reads}
        weight_bytes = itemsize * sum(prod(t.shape) for t in self.tensors if t.name in weights & read)
        others = [(a, e) for a, e in stage.spatial if a != vector.label and e > 1]
        rows = prod(config[f"{s}.tile.{a}"][2] for a, _ in others)
        tasks = prod(e // config[f"{s}.tile.{a}"][2] for a, e in others)
        data_bytes = itemsize * rows * prod(e for _, e in stage.reduced)
        if weight_bytes > self.machine.l2 // 2 or data_bytes > self.machine.l1d // 2 or tasks < 4 * self.machine.cores:
            return False
        # reduced in place: with the whole short reduction inside the tile (and no stage folded into a write-back
        # of the output) LLVM keeps the accumulators in registers, where a local tile lives in a workspace buffer
        # that each tile zeroes and stores to before writing back (time in place / local, Cascade Lake, one
        # process: U3 0.78, M2 0.91, U2 0.88; 784x128x128 with its panels outermost 0.82)
        self._accumulate_in_place(stage, config)
        # whole rows save writes to memory; a kernel whose inputs, weights and output all stay in one core's L2
        # makes none, and there one weight panel kept in L1 across the data tiles beats every task reading all
        # the weights from L2, unless they fit in L1 anyway (rule off / on, Cascade Lake, 11 rounds: 784x128x128
        # 0.98, 512x128x128 0.96, 392x128x128 1.01, 784x96x96 0.99; 784x64x64, weights in L1: 1.08)
        resident = self._input_bytes + weight_bytes + itemsize * prod(e for _, e in stage.spatial) <= self.machine.l2
        if resident and weight_bytes > self.machine.l1d // 2:
            return False
        config[f"{s}.tile.{vector.label}"] = (1, vector.extent // vf, vf)
        return True

    def block_reduction(self, stage: StageBlock, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with the heuristic's K blocking (:meth:`_block_reduction`) applied to ``stage``'s tiles as
        they are: its vector axis and register tile are ``config``'s, not the heuristic's. For a tuner that
        builds its own tiles (Gensor's constructions), whose start's blocks were chosen for other tiles.

        >>> from kdsl.lang import library
        >>> from kdsl.codegen.tvm import lower
        >>> from kdsl.codegen.tvm.schedule_space import ScheduleSpace
        >>> from kdsl.runtime.cpu import from_features
        >>> machine = from_features("x", {"avx2", "avx512f", "fma"}, cores=2, ghz=2.5)  # L1d 32 KiB, L2 1 MiB
        >>> space = ScheduleSpace(lower(library.load("matmul"), {"M": 512, "Cin": 4096, "Cout": 1024}), machine=machine)
        >>> config = {**space.heuristic(), "stage0.rblock": "none"}
        >>> space.block_reduction(space.stages[0], config)["stage0.rblock"]
        'Cin:256'
        """
        out = dict(config)
        vector = out.get(f"{stage.name}.vector")
        if vector is None or f"{stage.name}.tile.{vector}" not in out:
            return out
        self._block_reduction(stage, stage.axis(vector), out[f"{stage.name}.tile.{vector}"][2], out)
        return out

    def _block_reduction(self, stage: StageBlock, vector: Axis, vf: int, config: dict[str, Any]) -> None:
        """K blocking (``S.rblock``, Goto's ``Kc``) of a stage's one long reduction where it accumulates in place,
        its vector axis runs along weight panels, and one register tile's operands over the whole reduction (its
        data rows and its weight panel) exceed half of L2: the reduction in blocks as deep as one register tile's
        weight panel fits L1 (``depth * vf`` elements), the blocks outermost in the middle loops, and below them
        the middle tiles of the register tile's data axis, so each panel is read from L1 by that many data tiles
        (whose rows of one block stay in half of L2) before the next block. The data axis keeps
        :data:`BLOCK_TASKS` tasks a core. Matmul 512x4096x1024 (Cascade Lake, 1 MiB L2, 2 threads; median over
        5 fresh processes of 4 rounds each, ``scripts/heuristic_compare.py --processes 5``): 41.7 -> 36.7 ms. Where the
        operands fit (512x1024x1024: 160 KiB) blocking measured 1.07x slower (7.7 -> 8.2 ms, 6 processes): left."""
        s = stage.name
        name = f"{s}.rblock"
        long = [(a, e) for a, e in stage.reduced if e > 1]
        if name not in self.parameters or config.get(f"{s}.cache") != "none" or len(long) != 1:
            return
        if vector.label not in stage.weight_only or vf < self.machine.lanes(self.lowered.out.dtype):
            return  # no weight panel as wide as a vector (a tuner's tile may have none)
        axis, extent = long[0]
        itemsize, inner = self._itemsize, config[f"{s}.tile.{axis}"][1]
        depths = [
            n
            for n in RBLOCK_DEPTHS
            if n * vf * itemsize <= self.machine.l1d
            and n % inner == 0
            and f"{axis}:{n}" in self.parameters[name].choices
        ]
        rows = [(a, e) for a, e in stage.spatial if a != vector.label and e > 1 and config[f"{s}.tile.{a}"][2] > 1]
        if not depths or not rows:
            return
        tile_rows = prod(config[f"{s}.tile.{a}"][2] for a, _ in rows)
        if extent * (tile_rows + vf) * itemsize <= self.machine.l2 // 2:
            return
        if self._panels_stream_from_l3(vector, vf, extent, tile_rows):
            return
        row_axis = rows[0][0]
        outer, middle, tile = config[f"{s}.tile.{row_axis}"]
        tasks = prod(e // prod(config[f"{s}.tile.{a}"][1:]) for a, e in stage.spatial if e > 1)
        m = 1
        while (
            outer % (2 * m) == 0
            and tasks // (2 * m) >= BLOCK_TASKS * self.machine.cores
            and 2 * m * middle * tile * depths[-1] * itemsize <= self.machine.l2 // 2
        ):
            m *= 2
        if middle * m == 1:  # no data tile to read a block's weight panels from L1 again
            return
        config[f"{s}.tile.{row_axis}"] = (outer // m, middle * m, tile)
        config[name] = f"{axis}:{depths[-1]}"
        labels = order_labels(stage)
        first = labels.index(axis)
        config[f"{s}.order"] = (first, *(i for i in range(len(labels)) if i != first))
        self._pack_blocks(stage, vector, depths[-1] * itemsize, config)
        self._pack_data_rows(stage, vector, row_axis, tile, config)

    def _panels_stream_from_l3(self, vector: Axis, vf: int, extent: int, tile_rows: int) -> bool:
        """Whether the weight panels of a long reduction (``extent`` steps) can stream from L3 instead of being
        K-blocked: the whole weight (every vector tile's panel over the reduction) fits in half of L3, and a
        core's L3 serves at least twice what the register tile reads from it each cycle at peak (``vf`` weight
        elements a reduction step, over the step's ``tile_rows x vf / lanes`` FMAs). Then the unblocked nest (each
        task's data rows in L2, the panels streamed) does without the blocks' per-task packing and L2 sizing.
        Matmul 512x4096x1024 on a Zen 3 (L3 32 bytes a cycle, 512 KiB L2; a 4 x 16 tile reads 16 bytes a
        cycle), pairs of back-to-back calls: 0.85x the K-blocked time, 1.01x PyTorch's. On Cascade Lake (16
        bytes a cycle) K blocking measured 1.14x faster (:meth:`_block_reduction`), and the rule keeps it there;
        where the weight exceeds half of L3 (2048x4096x2048 on the Zen 3: 32 MiB) streaming ran 1.36x slower."""
        itemsize, lanes = self._itemsize, self.machine.lanes(self.lowered.out.dtype)
        if extent * vector.extent * itemsize > self.machine.l3 // 2:
            return False
        steps_per_cycle = self.machine.fma_units * lanes / (tile_rows * vf)  # reduction steps of the tile a cycle
        return 2 * vf * itemsize * steps_per_cycle <= self.machine.l3_bytes_per_cycle

    def _pack_data_rows(
        self, stage: StageBlock, vector: Axis, row_axis: str, tile: int, config: dict[str, Any]
    ) -> None:
        """With K blocks: pack a data input's rows in panels of one register tile (``layout.x.tile = "0:8"``:
        ``[M, K] -> [M/8, K, 8]``, Goto's packed A), where each of its elements meets at least
        :data:`PACK_ROWS_COLUMNS` columns, so that the one copy costs little beside the multiply-adds. A data
        tile's rows of one block, kept in L1 while the block's weight panels pass, are then one contiguous run;
        unpacked they are whole rows apart, in M1 32 KiB, and share L1's sets with each other and with the
        panels. Gensor's M1 (8192^3, Cascade Lake, 2 threads): 1.09x faster (``scripts/heuristic_compare.py``, 2
        processes: 1.14 and 1.03), and 0.85 and 0.89 of the unpacked time in two runs of back-to-back pairs. At
        1024 columns (OpEvo's MM3, 512x4096x1024) it was level (0.99): there the copy, a gather of 8 rows, is
        about 5% of the call."""
        if vector.extent < PACK_ROWS_COLUMNS or tile <= 1:
            return
        nspatial, row = len(stage.spatial), stage.axis(row_axis).index
        for buffer, dims in stage.reads:
            last = dims[-1]
            if len(last) != 1 or min(last) < nspatial or {row} not in dims[:-1]:
                continue  # not rows of the reduction: a window's or the vector's read
            d = dims.index({row})
            if self._input_along(stage, buffer, dims, d) != buffer:
                continue  # a weight, or an input read through a copy
            choice = f"{d}:{tile}"
            param = self.parameters.get(f"layout.{buffer}.tile")
            if param is not None and choice in param.choices and config.get(f"layout.{buffer}.tile", "none") == "none":
                config[f"layout.{buffer}.tile"] = choice

    def _pack_blocks(self, stage: StageBlock, vector: Axis, depth_bytes: int, config: dict[str, Any]) -> None:
        """With K blocks: each task packs one block of its weight panels (``layout.T.pack = "block"``, Goto's
        packed B; :mod:`~kdsl.codegen.tvm.pack_inside`) instead of a pass over the whole weight, and takes
        several panels (the vector axis's middle tiles, below the data tiles), so that each data tile's rows
        are read from L1 by every panel of the block, while the block stays in half of L2 and two tasks a core
        remain. Matmul 512x4096x1024 (Cascade Lake, 2 threads; medians of fresh processes): 21.8 ms against 26.5
        with the same tiles packed in a pass (3 processes), 22.3 against the old default's 29.9 (5 processes)."""
        s = stage.name
        packed = [
            t.name
            for t in self.tensors
            if t.reader == s and f"layout.{t.name}.pack" in self.parameters and is_packed(config, t.name, t.shape)
        ]
        if not packed:
            return
        for name in packed:
            config[f"layout.{name}.pack"] = "block"
        outer, middle, vf = config[f"{s}.tile.{vector.label}"]
        tasks = prod(e // prod(config[f"{s}.tile.{a}"][1:]) for a, e in stage.spatial if e > 1)
        m = 1
        while (
            outer % (2 * m) == 0
            and tasks // (2 * m) >= 2 * self.machine.cores
            and depth_bytes * vf * middle * 2 * m <= self.machine.l2 // 2
        ):
            m *= 2
        config[f"{s}.tile.{vector.label}"] = (outer // m, middle * m, vf)

    def _cache_block(self, stage: StageBlock, vector: Axis, config: dict[str, Any]) -> None:
        """Cache blocking where the data inputs exceed L2: with a weight-only vector axis first in the fused
        parallel loop, consecutive tasks sweep all the data once per weight panel, from memory; blocks of the
        first data axis's outer tiles (``S.block``), each block's data at most half of L2, keep it in L2
        while the weight panels pass (matmul 4096x512x2048, 1 MiB L2, AVX-512, 2 contended threads: 1.36x
        faster; where the data is only a few L2s, :data:`BLOCK_ABOVE_L2`, it does not pay). Nor does it where
        one weight panel (a vector tile's, over the whole reduction) fills more than a quarter of L2, too
        little room beside it: matmul 512x4096x1024 on a Zen 3 (512 KiB L2, 256 KiB panels) ran 1.49x and 1.80x
        slower with blocks of 4 and 2 tiles of rows than with none (pairs of calls). Gensor's M3, 64 KiB panels
        there, runs 1.12x faster with its blocks of 16 than of 8."""
        name = f"{stage.name}.block"
        if name not in self.parameters or vector.label not in stage.weight_only:
            return
        data = self._input_bytes
        if data <= BLOCK_ABOVE_L2 * self.machine.l2:
            return
        vf = config[f"{stage.name}.tile.{vector.label}"][2]
        if prod(e for _, e in stage.reduced) * vf * self._itemsize > self.machine.l2 // 4:
            return
        for axis, extent in stage.spatial:
            if extent == 1 or axis in stage.weight_only:
                continue
            _, middle, inner = config[f"{stage.name}.tile.{axis}"]
            count = extent // (middle * inner)
            fits = [n for n in BLOCK_TILES if count % n == 0 and n < count and data * n <= count * self.machine.l2 // 2]
            if fits and f"{axis}:{fits[-1]}" in self.parameters[name].choices:
                config[name] = f"{axis}:{fits[-1]}"
            return  # the first data axis only: the fused loop's outermost

    def _vector_layouts(self, stage: StageBlock, vector: Axis, vf: int, config: dict[str, Any]) -> None:
        """The heuristic's layouts for a reduction stage's vector axis: intermediates with its dim last
        (branching kernels), a data input it gathers from with its dim last (plain operators), and packed
        weights (``packs`` and long ``panels``)."""
        if not self.lowered.op.is_linear:
            self._vector_last(stage, vector, config)
        elif vector.gathers:
            self._input_vector_last(stage, vector, config)
        else:
            self._input_reduced_tiles(stage, vector, config)
        panels = [(w, d) for w, d in vector.panels if self.tensor_named(w).shape[d] > vf]
        for weight, dim in dict.fromkeys([*vector.packs, *panels]):
            tensor = self.tensor_named(weight)
            tile, perm = f"{dim}:{vf}", (dim, *(d for d in range(len(tensor.shape)) if d != dim))
            param = self.parameters.get(f"layout.{weight}.tile")  # none where no factor divides the dim
            if tensor.reader == stage.name and param is not None and tile in param.choices:
                config[f"layout.{weight}.tile"] = tile
                config[f"layout.{weight}.perm"] = perm  # v's tile index first: see _pack

    def _vector_last(self, stage: StageBlock, vector: Axis, config: dict[str, Any]) -> None:
        """Lay out the intermediate results that ``stage`` reads with the vector axis's dim last, where a
        reduction stage made them for this reader alone: a branching kernel's data operand (a Product's
        values, made by an FC with the channel first) is else read with a gather per lane. Plain
        operators keep their layouts (their schedules are unchanged)."""
        out = self.lowered.out.op.name
        for buffer, dims in stage.reads:
            producer = next((p for p in self.stages if p.name == buffer), None)
            if producer is None or buffer == out or producer.kind != "reduce" or producer.consumers != [stage.name]:
                continue
            positions = [d for d, used in enumerate(dims) if vector.index in used]
            if len(positions) != 1 or positions[0] == len(dims) - 1 or len(dims[positions[0]]) != 1:
                continue
            moved = positions[0]
            perm = (*(d for d in range(len(dims)) if d != moved), moved)
            if f"layout.{buffer}.perm" in self.parameters:
                config[f"layout.{buffer}.perm"] = perm

    def _input_vector_last(self, stage: StageBlock, vector: Axis, config: dict[str, Any]) -> None:
        """Pack a data input that the vector axis gathers from with that axis's dim last, where the stage
        reads it directly or through a zero-padded copy that is inlined (one along an unpadded dim: the
        pad's bounds checks stay outside the vector). A depthwise convolution at 14x14, whose rows take no
        vector, vectorizes its channels; in ``[N, C, H, W]`` each lane is a row apart, packed ``[N, H, W, C]``
        the lanes are one load (256x14x14, AVX-512, 2 contended threads: 0.30 -> 0.16 ms, the packing
        included). Only plain (linear) operators: a branching kernel's stages have rules of their own."""
        for buffer, dims in stage.reads:
            positions = [d for d, used in enumerate(dims) if vector.index in used]
            if len(positions) != 1 or dims[positions[0]] != {vector.index} or positions[0] == len(dims) - 1:
                continue
            dim = positions[0]
            tensor = self._input_along(stage, buffer, dims, dim)
            if tensor is None or f"layout.{tensor}.perm" not in self.parameters:
                continue
            rest = (d for d in range(len(self.tensor_named(tensor).shape)) if d != dim)
            config[f"layout.{tensor}.perm"] = (*rest, dim)

    def _input_reduced_tiles(self, stage: StageBlock, vector: Axis, config: dict[str, Any]) -> None:
        """Tile a data input larger than L2 along a dim that one reduction axis alone walks, a vector of it
        last (``layout.x.tile = "1:16"``: ``[N, C, H, W] -> [N, C/16, H, W, 16]``, oneDNN's blocked layout).
        The reduction's steps over channels then read neighbouring elements where they read a plane apart,
        a new cache line a step, from memory (Gensor's C2, conv2d at N=32, 128x28x28, Cascade Lake: 50 ->
        32 ms; the strided C3 71 -> 44; conv3_x at N=1, within L2: 1.13 -> 1.10, so left as it is). Only
        where the stage reads the input itself or through a zero-padded copy of the same rank; through a copy,
        the copy is tiled instead, and the heuristic materializes it."""
        itemsize, nspatial = self._itemsize, len(stage.spatial)
        for buffer, dims in stage.reads:
            for d, used in enumerate(dims[:-1]):
                # one reduction axis alone, not the vector's, and no pad along it (its checks would split vectors)
                alone = len(used) == 1 and min(used) >= nspatial and vector.index not in used
                tensor = self._input_along(stage, buffer, dims, d) if alone else None
                # read through a zero-padded copy: tile that copy, made in a pass of its own, so that the reader
                # has no bounds checks left (OpEvo's C2, conv2d 5x5 at N=512, 64x27x27, Cascade Lake: the input
                # tiled and its pad inlined 1720 ms, the pad tiled 1038 ms)
                padded = tensor not in (None, buffer) and f"layout.{buffer}.tile" in self.parameters
                target = buffer if padded else tensor
                param = self.parameters.get(f"layout.{target}.tile") if target is not None else None
                if param is None or f"{d}:{self.lanes}" not in param.choices:
                    continue
                if prod(self.tensor_named(tensor).shape) * itemsize > self.machine.l2:
                    config[f"layout.{target}.tile"] = f"{d}:{self.lanes}"
                break

    def _input_along(self, stage: StageBlock, buffer: str, dims: list[set[int]], dim: int) -> str | None:
        """The data input that ``stage``'s read of ``buffer`` (``dims``: the iter indices per buffer dim) reaches
        along its dim ``dim``: ``buffer`` itself, or the input of a zero-padded copy of the same rank that this
        stage alone reads, that does not pad ``dim`` and reads it along the same dim; ``None`` for anything
        else (a copy of another rank, such as the phase form's ``[.., p, i, ..]`` copy, is no plain pad)."""
        producer = next((p for p in self.stages if p.name == buffer), None)
        tensor = buffer
        if producer is not None:
            if producer.kind != "pad" or dim in producer.padded or producer.consumers != [stage.name]:
                return None
            tensor, pad_dims = producer.reads[0]
            if len(pad_dims) != len(dims) or pad_dims[dim] != {dim}:
                return None
        return tensor if self.tensor_named(tensor).kind == "input" else None
