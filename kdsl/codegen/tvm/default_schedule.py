"""Default CPU schedules for lowered kdsl operators, derived from each stage's structure.

A lowered operator is a list of ``te.compute`` stages (:class:`kdsl.codegen.tvm.StageInfo`): contractions
(data times 0-3 weights, summed over reduced dims), reduce-only stages (pooling), element-wise products
(Shares without a Reduce) and pure copies (the views after the last stage). Unscheduled, TVM runs them as
naive scalar loop nests, ~100x slower than PyTorch. The schedule here is built per stage from what the
stage's TIR block reads (which block axes index which buffer dim, with which stride), never from the
operator's name, so it applies to operators that search invents.

**Reduction stages** get a register-tiled micro-kernel, the shape that the hand schedules in
``TVM.md`` use to match PyTorch:

* *The vector axis* ``v``: a spatial axis along which every data read is contiguous (the last buffer
  dim with stride 1) or constant (a broadcast: the axis indexes only weights, like ``Cout`` in conv2d).
  Weight-only axes win ties: their data reads are broadcasts that feed a whole vector of FMAs. Its tile
  is one or two vectors (16 or 32 fp32 lanes on AVX-512); factors always divide the extent, so no
  predicates appear and ``vectorize`` never meets a partial vector.
* *The register axis* ``u``: another spatial axis (a data axis if possible, e.g. ``W``), tiled by the
  largest divisor that keeps at most :data:`MAX_ACCUMULATORS` vector accumulators live.
* Loop order: the remaining spatial loops outside, then *all reduction loops*, then the ``u x v`` tile
  innermost: each output tile is finished while it sits in registers, and every reduction step loads
  ``u`` broadcast scalars and ``v/lanes`` weight vectors for ``u*v/lanes`` FMAs.
* The accumulator is ``cache_write(..., "local")``, ``reverse_compute_at`` the tile, with its layout
  transformed so that ``u, v`` are its last two dims: a local tile whose vectorized axis is not
  innermost stays in memory and runs ~35x slower (4.6 vs 168 GFLOP/s in ``TVM.md``).
  ``decompose_reduction`` splits off the zero-init, whose inner loop is vectorized too.
* Weights whose vector axis is not their innermost stride-1 dim are packed once per call
  (``cache_read`` + ``transform_layout`` to ``[v // V, <other dims>, v % V]``, ALT-style), so the inner loop
  reads contiguous vectors instead of gathering with a large stride. Data inputs are never copied.
* A copy stage that only permutes the last contraction's result (conv2d computes ``[N, H, W, Cout]``
  with ``Cout`` innermost, then transposes to ``[N, Cout, H, W]``) is ``reverse_compute_inline``d into
  the accumulator's write-back, so the transposition costs no extra pass over memory.
* The spatial loops outside the tile are fused and parallelized (one fused loop balances any shape).

**Other stages**: copies and element-wise stages get their outer loops fused and parallelized and
their innermost loop vectorized when its extent divides into whole vectors.

**Falling back.** Every stage is scheduled on a copy of the schedule; if any primitive raises
(``ScheduleError``/``TVMError``: an unusual index expression, a block that cannot be inlined), that stage
gets the plain parallel schedule instead, and if even that fails it is left as it was. A schedule
never changes what a stage computes, so the fallback is only slower. :func:`default_schedule` can
``report`` what each stage got.

**Zero padding.** The lowering reads every window (``Unfold``) through a zero-padded copy of the tensor,
a stage of its own (:attr:`~kdsl.codegen.tvm.StageInfo.is_pad`). The copy is materialized (a parallel,
vectorized pass) only when the reader's vector axis runs along a padded dim: bounds checks inside the
vector would keep LLVM from vectorizing the read (syno_op1's first stage at conv3_x, which vectorizes
``W``: the whole operator went from 1.5 ms to 0.77 ms). Elsewhere the copy is inlined back and its checks
cost one compare per broadcast scalar, cheaper than a pass over memory (conv2d 3x3 64->64 56x56, whose
vector axis is ``Cout``, runs at ~200 GFLOP/s on an idle 2-core AVX-512 machine with them in place).

Not done (yet): cache blocking of long reductions (a 1024-deep matmul streams its data rows once per
weight slab), rfactor for stages that reduce everything to one value (they stay serial), packing of
data inputs (a stage whose only contiguous axis is short vectorizes with 8 or 4 lanes or not at all).

:mod:`kdsl.bench.schedule` times the default schedule against PyTorch (``python -m kdsl.bench.schedule``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kdsl.codegen.tvm.lowering import Lowered, StageInfo, error_reason, invertible_copy, load_tvm

#: Vector register width in bits (AVX-512). On narrower machines LLVM splits the vectors: still correct.
VECTOR_BITS = 512
#: Most vector accumulators the register tile may hold (of 32 zmm registers; the rest hold weights).
MAX_ACCUMULATORS = 16
#: Most vectors along the vector axis in one register tile.
MAX_VECTORS = 2
#: Reduction loops at most this long are unrolled (windows such as kh, kw).
UNROLL_REDUCTION = 4
#: Put the vector axis's outer loop outermost when it indexes only weights: one weight slab stays in
#: cache while every data tile passes (else a 128x128x3x3 conv cycles 590 KB of weights per tile).
VECTOR_OUTSIDE = True
#: Pack weights that are already contiguous along the vector axis too (see _schedule_reduction): off, as
#: it measured no faster for matmul 1024^3 or 3136x64x64 and costs a copy of the weight per call.
PACK_CONTIGUOUS = False
#: Vectorize the accumulator's write-back when the vector axis is the result's last dim.
VECTORIZE_WRITEBACK = True


@dataclass
class _Axis:
    index: int  # position among the block's iter vars
    extent: int
    reduce: bool
    weight_only: bool
    gathers: int = 0  # data reads for which this axis is not the stride-1 last dim (a gather)
    packs: list[int] = field(default_factory=list)  # weight reads that need packing for this axis


@dataclass
class _Read:
    index: int  # position in the block's reads
    buffer: Any
    is_weight: bool
    dims: list[list[Any]]  # per buffer dim: the block vars it uses
    strides: list[dict[Any, int] | None]  # per buffer dim: var -> coefficient, None if not affine


def _lanes(dtype: str) -> int:
    bits = int("".join(c for c in dtype if c.isdigit()) or 32)
    return max(1, VECTOR_BITS // bits)


def _divisor(extent: int, limit: int) -> int:
    """The largest divisor of ``extent`` that is at most ``limit`` (so that a split needs no predicate)."""
    return max(d for d in range(1, max(1, min(extent, limit)) + 1) if extent % d == 0)


def _analyze(sch: Any, block: Any, stage: StageInfo, weight_names: set[str]) -> tuple[list[_Axis], list[_Read]]:
    from tvm.sym.pattern import detect_linear_equation
    from tvm.tirx.analysis import undefined_vars

    node = sch.get(block)
    ivars = [iv.var for iv in node.iter_vars]
    axes = [
        _Axis(
            i,
            int(iv.dom.extent),
            int(iv.iter_type) != 0,
            i < len(stage.spatial) and stage.spatial[i] in stage.weight_only,
        )
        for i, iv in enumerate(node.iter_vars)
    ]
    reads = []
    for k, region in enumerate(node.reads):
        dims, strides = [], []
        for rng in region.region:
            used = [v for v in undefined_vars(rng.min) if any(v.same_as(w) for w in ivars)]
            dims.append(used)
            coeffs = detect_linear_equation(rng.min, used) if used else ()
            if used and len(coeffs) == len(used) + 1:
                # a coefficient that is not a constant (a product of two axes) leaves the axis out: a gather
                strides.append({v: int(c.value) for v, c in zip(used, coeffs[:-1]) if hasattr(c, "value")})
            else:
                strides.append(None if used else {})
        reads.append(_Read(k, region.source, region.source.name in weight_names, dims, strides))
    for axis in axes:
        var = ivars[axis.index]
        for read in reads:
            for d, used in enumerate(read.dims):
                if not any(var.same_as(u) for u in used):
                    continue
                stride = read.strides[d]
                coeff = None if stride is None else next((c for v, c in stride.items() if v.same_as(var)), None)
                contiguous = d == len(read.dims) - 1 and coeff == 1
                if contiguous:
                    continue
                if read.is_weight and len(used) == 1 and coeff == 1:
                    axis.packs.append(read.index)
                else:
                    axis.gathers += 1
    return axes, reads


def _pick_vector(axes: list[_Axis], lanes: int) -> tuple[_Axis | None, int]:
    """The axis to vectorize and its tile (a divisor of its extent, whole vectors when possible)."""
    best, best_key, best_factor = None, None, 1
    for axis in axes:
        if axis.reduce or axis.extent < 2:
            continue
        factor = 1
        for candidate in (*(m * lanes for m in range(MAX_VECTORS, 0, -1)), lanes // 2, lanes // 4):
            if candidate >= 4 and axis.extent % candidate == 0:
                factor = candidate
                break
        if factor < lanes and axis.extent % 4 == 0 and axis.extent <= MAX_VECTORS * lanes:
            factor = axis.extent  # a short axis whole (28 = 16 + 8 + 4 lanes): LLVM splits it into vectors
        if factor == 1:
            continue
        # contiguous data reads first, then whole vectors, then weight-only axes (broadcast data), then innermost
        key = (axis.gathers == 0, factor >= lanes, axis.weight_only, axis.index)
        if best_key is None or key > best_key:
            best, best_key, best_factor = axis, key, factor
    return best, best_factor


def _pick_register(axes: list[_Axis], vector: _Axis | None, budget: int) -> tuple[_Axis | None, int]:
    """A second spatial axis for the register tile (a data axis if any), tiled to fit ``budget``."""
    candidates = [a for a in axes if not a.reduce and a is not vector and a.extent > 1]
    if not candidates:
        return None, 1
    axis = max(candidates, key=lambda a: (not a.weight_only, _divisor(a.extent, budget) > 1, a.index))
    factor = _divisor(axis.extent, budget)
    return (axis, factor) if factor > 1 else (None, 1)


def _pack_weight(sch: Any, block: Any, read: _Read, axis: _Axis, factor: int, ivar: Any) -> None:
    """Copy a weight into ``[v // factor, <its other dims>, v % factor]`` so the vector loads are contiguous."""
    tvm = load_tvm()
    position = next(d for d, used in enumerate(read.dims) if any(ivar.same_as(u) for u in used))
    ndim = len(read.dims)
    pack = sch.cache_read(block, read.index, "global")

    def index_map(*idx: Any) -> tuple[Any, ...]:
        # v's tile index first: one tile's weights are then a single contiguous block (for a matmul
        # weight [K, N], [K, N/vf, vf] would still stride by N between reduction steps)
        rest = [idx[d] for d in range(ndim) if d != position]
        return (idx[position] // factor, *rest, idx[position] % factor)

    layout = tvm.tirx.IndexMap.from_func(index_map, ndim=ndim, index_dtype="int32")
    sch.transform_layout(pack, ("write", 0), layout)
    # iterate in the packed order: contiguous vector stores, gathered loads (conv2d conv3_x 1.17 -> 1.08 ms)
    sch.transform_block_layout(pack, layout)
    loops = sch.get_loops(pack)
    if len(loops) > 1:
        sch.parallel(sch.fuse(*loops[:-1]))
        sch.vectorize(loops[-1])  # the vector tile: at most MAX_VECTORS vectors
    elif loops:
        sch.parallel(loops[0])


def _schedule_reduction(sch: Any, block: Any, axes: list[_Axis], reads: list[_Read], lanes: int) -> str:
    if all(a.reduce for a in axes):
        return "serial: a reduction to one value (nothing to tile or parallelize without rfactor)"
    vector, vf = _pick_vector(axes, lanes)
    vectors = max(1, vf // lanes) if vector is not None else 1
    register, uf = _pick_register(axes, vector, max(1, MAX_ACCUMULATORS // vectors))
    ivars = [iv.var for iv in sch.get(block).iter_vars]
    if vector is not None and PACK_CONTIGUOUS:
        # a weight that is already contiguous along v is still read as short runs of vf values, one per
        # reduction step, a whole weight row apart (4 KiB for a 1024-wide matmul: a new page per step);
        # packed, a tile's weights are one contiguous stream
        var = ivars[vector.index]
        for read in reads:
            last = read.dims[-1] if read.dims else []
            along_v = read.is_weight and len(last) == 1 and last[0].same_as(var) and read.strides[-1] == {last[0]: 1}
            if along_v and int(read.buffer.shape[-1]) > vf:
                vector.packs.append(read.index)
    if vector is not None:
        for index in dict.fromkeys(vector.packs):
            _pack_weight(sch, block, reads[index], vector, vf, ivars[vector.index])
    loops = sch.get_loops(block)
    outer, reduction, inner = [], [], []
    v_inner = u_inner = None
    for axis, loop in zip(axes, loops):
        if axis.reduce:
            reduction.append(loop)
        elif axis is vector:
            lo, v_inner = sch.split(loop, [None, vf])
            outer.append(lo)
        elif axis is register:
            lo, u_inner = sch.split(loop, [None, uf])
            outer.append(lo)
        else:
            outer.append(loop)
    inner = [loop for loop in (u_inner, v_inner) if loop is not None]
    if VECTOR_OUTSIDE and vector is not None and vector.weight_only:
        # the weight slab of one vector tile stays in cache while all data tiles sweep past it
        outer.insert(0, outer.pop([a for a in axes if not a.reduce].index(vector)))
    sch.reorder(*outer, *reduction, *inner)

    # the accumulator: a local tile with [u, v] as its last dims, written back once per tile
    writeback = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(writeback, outer[-1])
    spatial = [a.index for a in axes if not a.reduce]
    last = [a.index for a in (register, vector) if a is not None]
    order = [i for i in spatial if i not in last] + last
    if order != spatial:
        positions = [spatial.index(i) for i in order]
        sch.transform_layout(
            block,
            ("write", 0),
            load_tvm().tirx.IndexMap.from_func(lambda *idx: tuple(idx[p] for p in positions), ndim=len(spatial)),
        )
    if VECTORIZE_WRITEBACK and vector is not None and spatial[-1] == vector.index:
        # with a short reduction (a depthwise window) the write-back costs as much as the FMAs
        sch.vectorize(sch.get_loops(writeback)[-1])
    # vectorize before decompose_reduction: afterwards the update block is no longer a complete
    # reduction block under the tile loops and vectorize refuses it
    if v_inner is not None:
        sch.vectorize(v_inner)
    if u_inner is not None:
        sch.unroll(u_inner)
    # small windows (kh, kw) unroll into straight-line FMAs
    for axis, loop in zip([a for a in axes if a.reduce], reduction):
        if axis.extent <= UNROLL_REDUCTION:
            sch.unroll(loop)
    # parallel before decompose_reduction too: it needs complete or reduction blocks below the loop
    sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    init = sch.decompose_reduction(block, reduction[0])
    if v_inner is not None:
        sch.vectorize(sch.get_loops(init)[-1])
    shape = f"{vf if vector else 1}x{uf if register else 1}"
    packed = len(set(vector.packs)) if vector else 0
    return f"register tile {shape} (vector axis {vector.index if vector else None}), packed {packed}"


def _schedule_spatial(sch: Any, block: Any, axes: list[_Axis], lanes: int) -> str:
    """Copies and element-wise stages: fused parallel outer loops, a vectorized innermost loop."""
    loops = sch.get_loops(block)
    inner = None
    last = axes[-1]
    factor = next((f for f in (lanes, lanes // 2, lanes // 4) if f >= 4 and last.extent % f == 0), 1)
    if factor > 1 and last.gathers == 0:
        outer_last, inner = sch.split(loops[-1], [None, factor])
        outer = [*loops[:-1], outer_last]
    else:
        outer = list(loops[:-1]) or list(loops)
    if inner is not None:
        sch.vectorize(inner)
    if outer:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    return f"parallel, vector {factor if inner is not None else 1}"


def _simple(sch: Any, name: str) -> str:
    block = sch.get_sblock(name)
    loops = sch.get_loops(block)
    node = sch.get(block)
    spatial = [loop for loop, iv in zip(loops, node.iter_vars) if int(iv.iter_type) == 0]
    if spatial and len(spatial) == len([iv for iv in node.iter_vars if int(iv.iter_type) == 0]):
        sch.parallel(spatial[0])
    return "parallel outer loop"


def default_schedule(lowered: Lowered, report: list[tuple[str, str]] | None = None) -> Any:
    """A CPU schedule for every stage of ``lowered`` (see the module docstring); ``report``, when given,
    receives ``(stage, what it got)`` for every stage, fallbacks included with their reason."""
    tvm = load_tvm()
    sch = tvm.s_tir.Schedule(lowered.module())
    weight_names = {w.name for w in lowered.weights}
    lanes = _lanes(str(lowered.out.dtype))
    produced_by_tile: set[str] = set()
    for stage in lowered.stages:
        try:
            sch.get_sblock(stage.name)
        except Exception:  # a copy already inlined into its producer's write-back
            _note(report, stage.name, "inlined into the previous stage's write-back")
            continue
        backup = sch.copy()
        try:
            readers = [r for r in lowered.stages if stage.name in r.reads_from] if stage.is_pad else []
            what = _schedule_stage(sch, stage, weight_names, lanes, produced_by_tile, readers)
            _note(report, stage.name, what)
        except Exception as error:  # any failing primitive: fall back, never crash
            sch = backup
            backup = sch.copy()
            reason = error_reason(error) if str(error).strip() else type(error).__name__
            try:
                _note(report, stage.name, f"fallback ({reason}): {_simple(sch, stage.name)}")
            except Exception:  # even the plain schedule failed: leave the stage as lowered
                sch = backup
                _note(report, stage.name, f"fallback ({reason}): unscheduled")
    return sch


def _note(report: list[tuple[str, str]] | None, name: str, what: str) -> None:
    if report is not None:
        report.append((name, what))


def _pad_in_vector(sch: Any, pad: StageInfo, readers: Sequence[StageInfo], weight_names: set[str], lanes: int) -> bool:
    """Whether a reader of the zero-padded copy ``pad`` would vectorize along a padded dim: then the copy
    is materialized, since bounds checks inside the vector keep LLVM from vectorizing the read (syno_op1's
    first stage: 0.35 ms with them, 0.05 ms without); elsewhere a check per broadcast scalar is cheaper
    than a pass over memory (conv2d 3x3, whose vector axis is ``Cout``)."""
    for reader in readers:
        if not reader.reduced:
            continue  # a copy or element-wise reader is one pass already: the checks go into it
        block = sch.get_sblock(reader.name)
        axes, reads = _analyze(sch, block, reader, weight_names)
        vector, _ = _pick_vector(axes, lanes)
        if vector is None:
            continue
        var = sch.get(block).iter_vars[vector.index].var
        for read in reads:
            if read.buffer.name == pad.name and any(
                any(var.same_as(u) for u in read.dims[d]) for d in pad.padded if d < len(read.dims)
            ):
                return True
    return False


def _schedule_stage(
    sch: Any,
    stage: StageInfo,
    weight_names: set[str],
    lanes: int,
    tiled: set[str],
    readers: Sequence[StageInfo] = (),
) -> str:
    block = sch.get_sblock(stage.name)
    if stage.is_pad and not _pad_in_vector(sch, stage, readers, weight_names, lanes):
        sch.compute_inline(block)
        return "inlined into its reader (bounds checks outside the vector)"
    axes, reads = _analyze(sch, block, stage, weight_names)
    if stage.is_copy:
        inlined = _inline_copy(sch, block, tiled)
        if inlined:
            return inlined
    if any(a.reduce for a in axes):
        what = _schedule_reduction(sch, block, axes, reads, lanes)
        tiled.add(stage.name)
        return what
    return _schedule_spatial(sch, block, axes, lanes)


def _inline_copy(sch: Any, block: Any, tiled: set[str]) -> str | None:
    """Fold a copy of a tiled stage's result into that stage's write-back (saves a pass over memory)."""
    producers = sch.get_producers(block)
    if len(producers) != 1:
        return None
    producer = sch.get(producers[0])
    if not producer.name_hint.endswith("_local") and producer.name_hint not in tiled:
        return None
    if not invertible_copy(sch.get(block)):
        return None  # TVM might accept it and invert the read wrongly (see invertible_copy)
    try:
        # a ScheduleError is raised before anything changes: on failure the copy is scheduled alone
        sch.reverse_compute_inline(block)
    except Exception:  # not a bijective copy of the producer's buffer
        return None
    return f"inlined into {producer.name_hint}"
