"""A rule-based CUDA schedule for every stage of a lowered operator, and the GPU schedule space.

A kernel runs on a GPU only when every loop nest is bound to ``blockIdx``/``threadIdx``; the rules
below bind every stage, sized from the GPU's description (:mod:`kdsl.runtime.gpu`):

* **reduction stages** (contractions, pooling, folds, FCs, products, the softmax's max and sum): the
  GEMM-style *tiled* form. The stage's spatial axes are split into the data axes (M: a conv's output
  positions) and the weight-only axes (N: ``Cout``), each fused into one loop; the reduction (K:
  ``Cin*kh*kw``) is the third. A block computes a tile of ``threads x register tile`` outputs (64 x 64 by
  default: 256 threads, each a 4x4 tile of ``local`` accumulators written back once); the sizes come from
  :func:`contraction_tiles`, which is pure and tested without TVM. For an image (data axes ``..., H, W``)
  a block's data tile is whole rows, so that the region of the input it reads has the same shape for every
  block (TVM widens a region that varies to the whole image). The reduction's outer axis is split in chunks
  of about ``k_chunk`` elements with the window; for a contraction (two or more reads), each chunk's slice
  of every input is first copied into shared memory by all threads of the block (``cache_read`` at the
  chunk loop; a zero-padded input is inlined into that copy), weight tiles padded so that threads along
  ``Cout`` do not hit the same banks; the chunk and the window are unrolled. When the grid would not fill
  the GPU's SMs, the reduction is split (**split-K**, ``rfactor``): each slice's blocks write partial sums
  to an intermediate and a second, plain kernel adds them (no atomics, deterministic). The write-back of
  a slice's register tile is guarded where the tiles run past the output's end (the cache of partial sums
  is made before the loops are tiled, so that TVM bounds it by the output, not by the tiles), and
  :func:`kdsl.codegen.tvm.cuda.schedule_verified` refuses a split kernel unless its stores, evaluated for
  every block and thread (:mod:`kdsl.codegen.tvm.store_check`), write each partial sum exactly once. A layout copy after
  the stage (conv2d's NHWC accumulator to NCHW) is folded into the register write-back.
* **other stages** (element-wise maps, blends, copies, zero-padded copies): all loops fused, split by
  the threads per block, bound. Zero-padded copies and element-wise stages are first inlined into
  their readers where TVM allows it (``inline``), so they cost no pass of their own.

Each level is a fallback for the one above: a stage whose tiled rule raises gets the tiled rule
without shared memory, then the plain fused+bound rule (a correct, slow schedule, but never an unbound
one). :func:`kdsl.codegen.tvm.cuda.schedule_verified` also steps a whole kernel down a level when TVM's GPU
verification refuses it (a shared tile over 48 KiB, too many threads).

The knobs form a :class:`GpuConfig`; :class:`GpuSpace` gives the heuristic configuration and random
points (for measuring variants on a GPU and keeping the best). The CPU schedule space
(:mod:`kdsl.codegen.tvm.schedule_space`) is separate and untouched.

>>> GpuConfig().threads, GpuConfig().level
(256, 'shared')
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from math import prod
from typing import Any

from kdsl.codegen.tvm.blocks import analyze
from kdsl.codegen.tvm.lowering import Lowered
from kdsl.codegen.tvm.toolchain import error_reason, load_tvm
from kdsl.lang.errors import LoweringError
from kdsl.runtime.gpu import Gpu, from_arch

__all__ = ["LEVELS", "MIN_SLICE", "GpuConfig", "GpuSpace", "Tiles", "contraction_tiles"]

#: The rule levels, most elaborate first: tiled with shared-memory loads, tiled, plain fused+bound.
LEVELS = ("shared", "tiled", "plain")


@dataclass(frozen=True)
class GpuConfig:
    """The knobs of the GPU schedule (one set for every stage of a kernel).

    ``threads``: threads per block of a reduction stage; ``thread_split``: how many of them run along
    the weight-only axes (the rest along the data axes); ``reg_d``/``reg_o``: the register tile per
    thread along the data and weight-only axes; ``k_chunk``: the reduction chunk copied to shared memory
    at a time; ``level``: the most elaborate rule to try (:data:`LEVELS`); ``inline``: fold zero-padded
    copies and element-wise stages into their readers; ``plain_threads``: threads per block of the
    other stages; ``fill``: shrink the tiles until the grid has two blocks per SM."""

    threads: int = 256
    thread_split: int = 16
    reg_d: int = 4
    reg_o: int = 4
    k_chunk: int = 32
    level: str = "shared"
    inline: bool = True
    plain_threads: int = 256
    fill: bool = True
    split_k: int = 0
    unroll: bool = True

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise LoweringError(f"unknown GPU schedule level {self.level!r}; use one of {', '.join(LEVELS)}")
        if not isinstance(self.split_k, int) or self.split_k < 0:
            raise LoweringError(
                f"GPU schedule knob split_k must be 0 (automatic) or a positive integer, got {self.split_k!r}"
            )
        for name in ("threads", "thread_split", "reg_d", "reg_o", "k_chunk", "plain_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise LoweringError(f"GPU schedule knob {name} must be a positive integer, got {value!r}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lower_level(self) -> GpuConfig | None:
        """The same knobs one rule level down, or ``None`` below ``plain``."""
        index = LEVELS.index(self.level)
        return replace(self, level=LEVELS[index + 1]) if index + 1 < len(LEVELS) else None


def _pow2_at_most(value: int) -> int:
    out = 1
    while out * 2 <= value:
        out *= 2
    return out


class GpuSpace:
    """The GPU schedules of one lowered kernel: :meth:`heuristic`, :meth:`random` points, :meth:`apply`."""

    THREADS = (64, 128, 256, 512)
    SPLITS = (1, 2, 4, 8, 16, 32)
    REGS = (1, 2, 4, 8)
    CHUNKS = (4, 8, 16, 32, 64)
    SPLIT_K = (0, 0, 0, 1, 2, 4, 8, 16, 32)  # 0: automatic (fill the SMs), weighted as the default

    def __init__(self, lowered: Lowered, gpu: Gpu | None = None, *, bound: bool = True) -> None:
        self.lowered = lowered
        self.gpu = gpu or from_arch()
        self.blocks = {b.name: b for b in analyze(lowered)}
        #: ``False``: every loop that the schedule would bind to a block or thread index stays a serial loop,
        #: all else (splits, rfactor, caches, guards) the same, so that the schedule compiles for a CPU: the
        #: GPU kernels' arithmetic emulated there (:mod:`kdsl.codegen.tvm.cuda_emulate`)
        self.bound = bound

    def _bind(self, sch: Any, loop: Any, tag: str) -> None:
        if self.bound:
            sch.bind(loop, tag)

    def heuristic(self) -> GpuConfig:
        """The default: 256 threads (8 warps: enough to hide latency, few enough that a thread may keep a
        4x4 tile of accumulators in its registers), 16 of them along the output channels, a 4x4 register
        tile (a 64x64 output tile a block), reduction chunks of ~32 elements staged in shared memory, split-K
        chosen to fill the SMs (:func:`contraction_tiles`)."""
        return GpuConfig(threads=min(256, self.gpu.max_threads_per_block))

    def random(self, rng: random.Random) -> GpuConfig:
        """A random point of the whole space (it may fail verification; the caller steps it down)."""
        return GpuConfig(
            threads=rng.choice([t for t in self.THREADS if t <= self.gpu.max_threads_per_block]),
            thread_split=rng.choice(self.SPLITS),
            reg_d=rng.choice(self.REGS),
            reg_o=rng.choice(self.REGS),
            k_chunk=rng.choice(self.CHUNKS),
            level=rng.choice(("shared", "shared", "tiled")),
            inline=rng.random() < 0.8,
            plain_threads=rng.choice((128, 256, 512)),
            fill=rng.random() < 0.5,
            split_k=rng.choice(self.SPLIT_K),
            unroll=rng.random() < 0.8,
        )

    def around(self, rng: random.Random) -> GpuConfig:
        """A random point near the heuristic: the GEMM-style shared-memory schedule with other block and
        register tiles (up to 8x8 accumulators, 128 x 128 outputs a block), reduction chunks, split-K factors
        and unrolling; the kind of point that a tuner keeps, not the whole space's corners."""
        base = self.heuristic()
        return replace(
            base,
            threads=rng.choice([t for t in (128, 256, 256, 512) if t <= self.gpu.max_threads_per_block]),
            thread_split=rng.choice((8, 16, 16, 32)),
            reg_d=rng.choice((2, 4, 4, 8)),
            reg_o=rng.choice((2, 4, 4, 8)),
            k_chunk=rng.choice((8, 16, 32, 32, 64)),
            split_k=rng.choice(self.SPLIT_K),
            fill=rng.random() < 0.8,
            unroll=rng.random() < 0.8,
        )

    # -- applying a configuration ------------------------------------------------------------------------

    def apply(self, config: GpuConfig, report: list[tuple[str, str]] | None = None) -> Any:
        """An ``s_tir.Schedule`` with every stage bound; ``report`` receives ``(stage, rule)`` per stage."""
        tvm = load_tvm()
        sch = tvm.s_tir.Schedule(self.lowered.module())
        output = self.lowered.out.op.name
        inlined: set[str] = set()
        if config.inline:
            for info in self.lowered.stages:
                block = self.blocks[info.name]
                if info.name == output or not (block.kind == "pad" or (block.elementwise and not block.reduced)):
                    continue
                trial = sch.copy()
                try:
                    trial.compute_inline(trial.get_sblock(info.name))
                except Exception:  # TVM raises ScheduleError/TVMError; the stage stays a pass
                    continue
                sch = trial
                inlined.add(info.name)
                if report is not None:
                    report.append((info.name, "inlined"))
        for info in self.lowered.stages:
            if info.name in inlined:
                continue
            block = self.blocks[info.name]
            if config.inline and block.kind == "copy" and block.invertible and not block.reduced:
                # a layout copy after a tiled stage (conv2d's NHWC accumulator to the NCHW output) folded into
                # that stage's register write-back: one kernel and one pass over the output fewer
                trial = sch.copy()
                try:
                    trial.reverse_compute_inline(trial.get_sblock(info.name))
                except Exception:  # TVM refuses (the producer is not a complete block): the copy stays a pass
                    pass
                else:
                    sch = trial
                    if report is not None:
                        report.append((info.name, "inlined"))
                    continue
            levels = LEVELS[LEVELS.index(config.level) :] if block.reduced else ("plain",)
            for level in levels:
                trial = sch.copy()
                try:
                    if level == "plain":
                        self._plain(trial, info.name, config)
                    else:
                        self._tiled(trial, info.name, config, shared=level == "shared")
                except Exception as error:  # any schedule error: the next level down
                    if level == "plain":
                        raise LoweringError(
                            f"stage {info.name}: even the plain GPU schedule failed: {error_reason(error)}"
                        ) from None
                    continue
                sch = trial
                if report is not None:
                    report.append((info.name, level))
                break
        return sch

    def _spatial_count(self, name: str) -> int:
        return len(self.blocks[name].spatial)

    def _plain(self, sch: Any, name: str, config: GpuConfig) -> None:
        """All spatial loops fused, split by the threads per block, bound; reductions stay serial per thread."""
        block = sch.get_sblock(name)
        loops = sch.get_loops(block)
        count = self._spatial_count(name)
        if count == 0:
            loops = [sch.add_unit_loop(block)]
            count = 1
        fused = sch.fuse(*loops[:count]) if count > 1 else loops[0]
        extent = prod(e for _, e in self.blocks[name].spatial) or 1
        threads = min(config.plain_threads, self.gpu.max_threads_per_block, max(32, -(-extent // 32) * 32))
        outer, inner = sch.split(fused, [None, threads])
        self._bind(sch, outer, "blockIdx.x")
        self._bind(sch, inner, "threadIdx.x")

    def tiles(self, name: str, config: GpuConfig) -> Tiles:
        """The tile sizes of reduction stage ``name`` at ``config`` (:func:`contraction_tiles`)."""
        info = self.blocks[name]
        data, weight, _ = _axes_split(info)
        extents = [extent for _, extent in info.spatial]
        return contraction_tiles(
            data_extent=prod(extents[i] for i in data),
            weight_extent=prod(extents[i] for i in weight) if weight else 1,
            last_data=extents[data[-1]],
            last_weight=extents[weight[-1]] if weight else 1,
            reduce_extents=[extent for _, extent in info.reduced],
            config=config,
            gpu=self.gpu,
            rows=len(data) > 1 and prod(extents[i] for i in data[:-1]) > 1,
            height=extents[data[-2]] if len(data) > 1 else 1,
        )

    def _tiled(self, sch: Any, name: str, config: GpuConfig, *, shared: bool) -> None:
        """The GEMM-style tiled form of a reduction stage (see the module docstring)."""
        info = self.blocks[name]
        block = sch.get_sblock(name)
        count = len(info.spatial)
        if count == 0:
            raise LoweringError("no spatial axis to tile")
        tiles = self.tiles(name, config)
        if tiles.threads < 32 and tiles.outputs >= 32:
            raise LoweringError("fewer than a warp of threads per block")
        data_axes, weight_axes, _ = _axes_split(info)
        has_weight = bool(weight_axes)
        reduce_extents = [extent for _, extent in info.reduced]

        split_loop = rf_write = None
        if tiles.split > 1:
            # split-K: the reduction's outermost axis cut in `split` slices, each summed by its own blocks into a
            # slice of an intermediate (rfactor); a second, plain kernel adds the slices (no atomics, deterministic)
            loops = sch.get_loops(block)
            k_split, _ = sch.split(loops[count], [tiles.split, None])
            final = block
            block = sch.rfactor(k_split, 0)
            reduce_extents[0] //= tiles.split
            # the partial sums' register tile and its write-back made now, while the rfactor block's loops are still
            # its whole domain: the write-back block then spans the intermediate's shape, and reverse_compute_at
            # below guards a tile's positions past the output's end. Made after the tiling (as before), TVM sized
            # it by the tiles where its analyzer could not bound them (conv1d at conv5_x: 64 positions for 49),
            # unguarded, and the overflow overwrote the next slice's sums (wrong once on an H200)
            rf_write = sch.cache_write(block, 0, "local")
            thread = self._plain_block(sch, final, count, config)
            # its sum in a register, written once: a complete write-back block that a following copy (conv2d's
            # NHWC -> NCHW output) can be folded into
            sch.reverse_compute_at(sch.cache_write(final, 0, "local"), thread)
        loops = sch.get_loops(block)
        if tiles.split > 1:
            split_loop, loops = loops[count], [*loops[:count], *loops[count + 1 :]]
        sch.reorder(*[loops[i] for i in data_axes + weight_axes])
        data_loops = [loops[i] for i in data_axes]
        weight_loops = [loops[i] for i in weight_axes]
        reduce_loops = loops[count:]

        # the reduction: its outermost loop split in chunks (each chunk's inputs staged in shared memory),
        # the other reduction loops (a conv's window) whole inside a chunk
        r_outer, r_inner = sch.split(reduce_loops[0], [None, tiles.chunk])

        # the register tile runs along the last data (weight) axis only, so that a thread's local tile is a box
        # that TVM compacts to reg_d x reg_o registers (a tile of the fused axes may span rows: a box of thousands)
        d_outer, d_reg = sch.split(data_loops[-1], [None, tiles.reg_d])
        outer_d = [*data_loops[:-1], d_outer]
        regs = [d_reg]
        outer_o = []
        if has_weight:
            o_outer, o_reg = sch.split(weight_loops[-1], [None, tiles.reg_o])
            outer_o = [*weight_loops[:-1], o_outer]
            regs.append(o_reg)
        sch.reorder(*outer_d, *outer_o, *regs)
        d_fused = sch.fuse(*outer_d) if len(outer_d) > 1 else outer_d[0]
        d_block, d_thread = sch.split(d_fused, [None, tiles.t_d])
        order, threads_loops = [d_block], [d_thread]
        if has_weight:
            o_fused = sch.fuse(*outer_o) if len(outer_o) > 1 else outer_o[0]
            o_block, o_thread = sch.split(o_fused, [None, tiles.t_o])
            order.append(o_block)
            threads_loops.append(o_thread)
        if split_loop is not None:
            order.insert(0, split_loop)  # a block works in one slice of the reduction: its shared tiles stay small
        sch.reorder(*order, *threads_loops, r_outer, r_inner, *reduce_loops[1:], *regs)
        bx = sch.fuse(*order) if len(order) > 1 else order[0]
        tx = sch.fuse(*threads_loops) if len(threads_loops) > 1 else threads_loops[0]
        self._bind(sch, bx, "blockIdx.x")
        self._bind(sch, tx, "threadIdx.x")
        write = rf_write if split_loop is not None else sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(write, tx)
        if shared and len(sch.get(block).reads) >= 2:
            names = [region.source.name for region in sch.get(block).reads]
            for buffer in names:
                index = next(i for i, r in enumerate(sch.get(block).reads) if r.source.name == buffer)
                # only this stage reads the copy: another reader of the buffer (a residual add) keeps the original
                copy = sch.cache_read(block, index, "shared", consumer_blocks=[block])
                sch.compute_at(copy, r_outer)
                # under the block, thread and chunk loops: the copy's own loops, shared by the block's threads
                copy_loops = sch.get_loops(copy)[3:]
                fused = sch.fuse(*copy_loops) if len(copy_loops) > 1 else copy_loops[0]
                _, inner = sch.split(fused, [None, tiles.threads])
                self._bind(sch, inner, "threadIdx.x")
                pad = self._bank_padding(name, buffer)
                if pad is not None:
                    sch.storage_align(copy, 0, pad, 8, 1)
        sch.decompose_reduction(block, r_outer)
        # the chunk and the window unrolled: the inner loop is a straight run of FMAs on registers
        if config.unroll:
            for loop in (r_inner, *reduce_loops[1:]):
                sch.unroll(loop)

    def _bank_padding(self, name: str, buffer: str) -> int | None:
        """The dim of ``buffer``'s shared tile whose stride to pad, or None: the last dim that stage ``name``
        indexes by a weight-only axis (Cout of conv2d's w[Cout, Cin, kh, kw]) when it is not the buffer's
        last dim. Threads next to each other along Cout then read elements a whole row (Cin*kh*kw of the
        chunk, e.g. 36 floats) apart, times the register tile: 144 floats, the same 2 of the 32 banks for 16
        threads, an 8-way conflict. A row stride of 1 mod 8 (storage_align) makes it 2-way."""
        info = self.blocks[name]
        weight_only = {a.index for a in info.axes if a.weight_only}
        for read_name, dims in info.reads:
            if read_name != buffer:
                continue
            along = [d for d, used in enumerate(dims) if used and used <= weight_only]
            if along and along[-1] != len(dims) - 1:
                return along[-1]
        return None

    def _plain_block(self, sch: Any, block: Any, count: int, config: GpuConfig) -> Any:
        """The plain rule on a block given by reference (the second kernel of a split-K reduction); returns
        the loop bound to the threads."""
        loops = sch.get_loops(block)
        fused = sch.fuse(*loops[:count]) if count > 1 else loops[0]
        extent = int(sch.get(fused).extent)
        threads = min(config.plain_threads, self.gpu.max_threads_per_block, max(32, -(-extent // 32) * 32))
        outer, inner = sch.split(fused, [None, threads])
        self._bind(sch, outer, "blockIdx.x")
        self._bind(sch, inner, "threadIdx.x")
        return inner


@dataclass(frozen=True)
class Tiles:
    """The tile sizes of one reduction stage: a block of ``t_d x t_o`` threads computes ``t_d*reg_d`` data
    outputs by ``t_o*reg_o`` weight-only outputs (a thread a ``reg_d x reg_o`` register tile); ``chunk``
    elements of the reduction's outer axis are staged per step; ``split`` slices of it run in separate
    blocks (split-K); ``blocks`` is the grid of the tiled kernel."""

    t_d: int
    t_o: int
    reg_d: int
    reg_o: int
    chunk: int
    split: int
    blocks: int

    @property
    def threads(self) -> int:
        return self.t_d * self.t_o

    @property
    def outputs(self) -> int:
        """Outputs per block."""
        return self.t_d * self.reg_d * self.t_o * self.reg_o


def _axes_split(info: Any) -> tuple[list[int], list[int], list[str]]:
    """A stage's spatial axes as (data axes, weight-only axes, labels); all data when none is weight-only."""
    labels = [label for label, _ in info.spatial]
    weight = [i for i, label in enumerate(labels) if label in info.weight_only]
    data = [i for i in range(len(labels)) if i not in weight]
    if not data:
        data, weight = weight, []
    return data, weight, labels


def _divisors(value: int) -> list[int]:
    return [d for d in range(1, value + 1) if value % d == 0]


def contraction_tiles(
    *,
    data_extent: int,
    weight_extent: int,
    last_data: int,
    last_weight: int,
    reduce_extents: list[int],
    config: GpuConfig,
    gpu: Gpu,
    rows: bool = False,
    height: int = 1,
) -> Tiles:
    """The GEMM view of a reduction stage (M = data outputs, N = weight-only outputs, K = the reduction)
    tiled for ``gpu``: pure, so that tests check the launch plan without TVM.

    A block is ``threads`` threads, ``thread_split`` of them along N; each thread holds ``reg_d x reg_o``
    accumulators (4x4 by default: 16 registers of accumulators plus 8 of operands, well under the 255 a
    thread may hold), so a 256-thread block computes a 64x64 output tile and reads each staged operand
    element 64 times. When the grid has fewer blocks than the GPU has SMs, the reduction is split (split-K)
    while each slice keeps at least ``MIN_SLICE`` elements, then the register tiles and the threads shrink.

    >>> gpu = from_arch("sm_90")
    >>> t = contraction_tiles(data_extent=49, weight_extent=512, last_data=7, last_weight=512,
    ...                       reduce_extents=[512, 3, 3], config=GpuConfig(), gpu=gpu, rows=True, height=7)
    >>> (t.t_d * t.reg_d, t.t_o * t.reg_o, t.split, t.blocks, t.chunk)  # conv2d at conv5_x: the whole 7x7 image
    (49, 64, 32, 256, 4)
    >>> t = contraction_tiles(data_extent=49, weight_extent=512, last_data=49, last_weight=512,
    ...                       reduce_extents=[512, 3], config=GpuConfig(), gpu=gpu)  # conv1d: 49 in tiles of 32
    >>> (t.t_d * t.reg_d, t.split, t.blocks)  # tiles past the output's end split too: the write-back is guarded
    (32, 8, 256)
    """
    t_d, t_o, reg_d, reg_o = _block_tile(data_extent, weight_extent, last_data, last_weight, config, gpu)
    k_outer = reduce_extents[0] if reduce_extents else 1
    rest = prod(reduce_extents[1:]) if reduce_extents else 1
    if rows and data_extent > last_data:
        t_d, reg_d = _row_aligned(t_d, data_extent, last_data, height, config)

    def grid() -> int:
        return -(-data_extent // (t_d * reg_d)) * -(-weight_extent // (t_o * reg_o))

    split = _split_k(grid(), k_outer, rest, config, gpu)
    # then smaller tiles: registers first (the block keeps its warps to hide latency), then threads; a
    # row-aligned data tile keeps its shape, the weight side shrinks
    while config.fill and grid() * split < gpu.sms:
        if not rows and reg_d > 1 and reg_d >= reg_o:
            reg_d //= 2
        elif reg_o > 1:
            reg_o //= 2
        elif not rows and t_d * t_o > 64 and t_d > 1:
            t_d //= 2
        elif t_o > 1 and t_d * t_o > 64:
            t_o //= 2
        else:
            break
    # the chunk of the outer reduction axis staged per step: about k_chunk elements with the window, a
    # divisor of the slice so that no step is partial
    slice_extent = k_outer // split
    want = max(1, round(config.k_chunk / rest))
    chunk = max(d for d in _divisors(slice_extent) if d <= max(1, want))
    return Tiles(t_d, t_o, reg_d, reg_o, chunk, split, grid() * split)


def _block_tile(
    data_extent: int, weight_extent: int, last_data: int, last_weight: int, config: GpuConfig, gpu: Gpu
) -> tuple[int, int, int, int]:
    """The block's threads along the data and weight-only outputs and each thread's register tile,
    ``(t_d, t_o, reg_d, reg_o)``, from ``config`` within the outputs' extents."""
    threads = _pow2_at_most(min(config.threads, gpu.max_threads_per_block))
    has_weight = weight_extent > 1 or last_weight > 1
    reg_o = max(1, min(config.reg_o, _pow2_at_most(last_weight))) if has_weight else 1
    t_o = min(_pow2_at_most(config.thread_split), _pow2_at_most(max(1, weight_extent // reg_o)), threads)
    t_o = t_o if has_weight else 1
    t_d = threads // t_o
    while t_d > 32 and t_d > data_extent:
        t_d //= 2
    reg_d = max(1, min(config.reg_d, _pow2_at_most(last_data), _pow2_at_most(max(1, data_extent // t_d))))
    return t_d, t_o, reg_d, reg_o


def _row_aligned(t_d: int, data_extent: int, last_data: int, height: int, config: GpuConfig) -> tuple[int, int]:
    """``(t_d, reg_d)`` for a data tile of whole rows of the image (or a divisor of one row).

    The region of the input a block reads is then the same size for every block, rows x (row + window
    halo), which TVM can allocate in shared memory; a tile that straddles rows at varying offsets has a
    symbolic region, which TVM widens to the whole image."""
    reg_d = min(_divisors(last_data), key=lambda d: (abs(d - config.reg_d), -d))
    per_row = last_data // reg_d
    if per_row > t_d:
        return max(d for d in _divisors(per_row) if d <= t_d), reg_d
    # rows a block: a divisor of the image's height, or whole images (a tile that wraps from one image into
    # the next at varying rows has a varying region again)
    want = max(1, min(t_d // per_row, data_extent // last_data))
    height = max(1, height)
    rows_per_block = height * (want // height) if want >= height else max(d for d in _divisors(height) if d <= want)
    return per_row * rows_per_block, reg_d


def _split_k(grid: int, k_outer: int, rest: int, config: GpuConfig, gpu: Gpu) -> int:
    """How many slices of the outer reduction axis run in separate blocks (``grid``: blocks without split-K).

    The automatic factor is the smallest power of two that fills the SMs, a slice keeping at least
    :data:`MIN_SLICE` reduction elements (``rest``: the elements of the other reduction axes); a fixed one
    is the largest divisor of the outer axis up to it."""
    if config.split_k != 0:
        return max(d for d in _divisors(k_outer) if d <= config.split_k)
    split = 1
    while (
        config.fill
        and grid * split < gpu.sms
        and k_outer % (split * 2) == 0
        and k_outer // (split * 2) * rest >= MIN_SLICE
    ):
        split *= 2
    return split


#: the fewest reduction elements a split-K slice keeps: below this, a block's loads and its share of the
#: second kernel's work outweigh the FMAs it adds
MIN_SLICE = 128
