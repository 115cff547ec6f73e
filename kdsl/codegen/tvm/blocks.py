"""The one analysis of a lowered operator's TIR blocks that every schedule rule reads.

For every TE stage (:class:`~kdsl.codegen.tvm.chain_stages.StageInfo`) it records the block's axes (label,
extent, spatial or reduction, weight-only) and what each read does along each axis: which buffer dims
an axis indexes, with which stride, and so whether a vector along the axis would load contiguous
elements, a broadcast, a gather, or a weight that a packing copy can make contiguous. The schedule
space's parameters, its heuristic configuration (and through it the default schedule) and the tuners'
cost model all read this one record; none of them inspects a block again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any, Protocol, TypeVar

from kdsl.codegen.tvm.lowering import Lowered
from kdsl.codegen.tvm.toolchain import load_tvm
from kdsl.lang.errors import LoweringError


def invertible_copy(block: Any) -> bool:
    """Whether ``reverse_compute_inline`` may fold the copy ``block`` (a TIR ``SBlock``) into its producer.

    The copy must read one buffer, as many elements as it writes, at indices built only from sums of
    its iter vars times constants, ``// c`` and ``% c`` (the fused splits that Split and Merge produce),
    with every iter var of extent > 1 used (a broadcast is not a bijection). A constant term is refused:
    TVM 0.27 accepted the read ``stage0[(v + 1) // 2]`` (``v`` in [0, 2), a bijection) as affine and
    inverted it to ``out[2*v - 1]`` under ``T.where(v == 1)``, so ``out[0]`` was never written. Anything
    else stays a separate pass, which is only slower."""
    tvm = load_tvm()
    tirx = tvm.tirx
    if len(block.reads) != 1 or len(block.writes) != 1:
        return False
    used: list[Any] = []

    def plain(expr: Any) -> bool:
        if isinstance(expr, tirx.Var):
            used.append(expr)
            return True
        if isinstance(expr, tirx.Add):
            return plain(expr.a) and plain(expr.b)
        if isinstance(expr, tirx.Mul):
            if isinstance(expr.b, tirx.IntImm):
                return int(expr.b.value) > 0 and plain(expr.a)
            if isinstance(expr.a, tirx.IntImm):
                return int(expr.a.value) > 0 and plain(expr.b)
            return False
        if isinstance(expr, (tirx.FloorDiv, tirx.FloorMod)):
            return isinstance(expr.b, tirx.IntImm) and int(expr.b.value) > 0 and plain(expr.a)
        return False

    for rng in block.reads[0].region:
        if isinstance(rng.min, tirx.IntImm) and int(rng.min.value) == 0:
            continue  # a size-1 dim of the producer
        if not plain(rng.min):
            return False
    every_var = all(any(iv.var.same_as(u) for u in used) for iv in block.iter_vars if int(iv.dom.extent) > 1)
    # as many elements read as written: a strided read (out[i] = y[2*i]) covers only part of its producer
    same_count = prod(int(iv.dom.extent) for iv in block.iter_vars) == prod(int(n) for n in block.reads[0].source.shape)
    return every_var and same_count


@dataclass
class Axis:
    """One block axis and how the stage's reads run along it."""

    label: str  # the dim's name, made unique within the stage (dims may repeat)
    index: int  # position among the block's iter vars (spatial first, then reductions, as TE orders them)
    extent: int
    reduce: bool
    weight_only: bool  # a spatial axis that only weights index (Cout in conv2d): data reads broadcast
    gathers: int = 0  # reads along which a vector on this axis would gather (not the stride-1 last dim)
    gather_stride: int | None = 0  # the largest element stride of those gathers (None: not affine, or not the last dim)
    packs: list[tuple[str, int]] = field(default_factory=list)  # (weight, dim) a packing copy makes contiguous
    # (weight, dim) read contiguously along this axis in its last dim, with other dims in front: a tile's
    # slab of it is a strided panel (rows a whole last dim apart) that a packing copy makes one block
    panels: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class StageBlock:
    """One stage's block: its kind, axes and reads (``reads``' dims hold block iter indices)."""

    name: str
    kind: str  # "reduce", "spatial" (element-wise), "copy" or "pad" (a zero-padded copy for windows)
    spatial: list[tuple[str, int]]  # (axis label, extent), block iter order
    reduced: list[tuple[str, int]]
    weight_only: set[str]
    reads: list[tuple[str, list[set[int]]]]  # (buffer name, per buffer dim: the block iter indices used)
    axes: list[Axis] = field(default_factory=list)
    consumers: list[str] = field(default_factory=list)
    padded: tuple[int, ...] = ()  # a pad stage's padded dims
    invertible: bool = False  # a copy that reverse_compute_inline folds correctly (invertible_copy)
    elementwise: bool = False  # a branching kernel's element-wise stage (StageInfo.elementwise)
    lane_reduce: bool = False  # StageInfo.lane_reduce
    lane_run: int = 1  # trailing reduced axes that every read walks as one contiguous run (_trailing_run)
    identity_reads: set[str] = field(default_factory=set)  # buffers it reads one element per iteration, bijectively

    def axis(self, label: str) -> Axis:
        return next(a for a in self.axes if a.label == label)


class _Named(Protocol):
    @property
    def name(self) -> str: ...


NamedT = TypeVar("NamedT", bound=_Named)


def named(items: Sequence[NamedT], name: str, what: str) -> NamedT:
    """The one of ``items`` called ``name`` (a stage, a tensor); a :class:`LoweringError` naming it and
    the names there are where none is, never a bare ``StopIteration``.

    >>> from types import SimpleNamespace as Item
    >>> named([Item(name="x"), Item(name="stage0")], "stage0", "stage").name
    'stage0'
    >>> named([Item(name="x")], "y", "tensor")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.LoweringError: the kernel has no tensor 'y' (its tensors: x)
    """
    found = next((item for item in items if item.name == name), None)
    if found is None:
        raise LoweringError(f"the kernel has no {what} {name!r} (its {what}s: {', '.join(i.name for i in items)})")
    return found


def unique_labels(names: Sequence[str]) -> list[str]:
    """Unique labels for axes (dim names may repeat): the second ``k`` is ``k2``."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}{seen[name]}")
    return out


def analyze(lowered: Lowered) -> list[StageBlock]:
    """The blocks of ``lowered``'s unscheduled module, one per stage, consumers linked."""
    tvm = load_tvm()
    sch = tvm.s_tir.Schedule(lowered.module())
    weight_names = {w.name for w in lowered.weights}
    stages = [_analyze_block(sch.get(sch.get_sblock(info.name)), info, weight_names) for info in lowered.stages]
    by_name = {s.name: s for s in stages}
    for stage in stages:
        for buffer, _ in stage.reads:
            if buffer in by_name:
                by_name[buffer].consumers.append(stage.name)
    return stages


def _analyze_block(node: Any, info: Any, weight_names: set[str]) -> StageBlock:
    tvm = load_tvm()
    from tvm.sym.pattern import detect_linear_equation

    ivars = [iv.var for iv in node.iter_vars]
    spatial_ix = [i for i, iv in enumerate(node.iter_vars) if int(iv.iter_type) == 0]
    reduce_ix = [i for i, iv in enumerate(node.iter_vars) if int(iv.iter_type) != 0]
    labels = unique_labels([*info.spatial, *info.reduced])
    extents = [int(iv.dom.extent) for iv in node.iter_vars]
    spatial = [(labels[k], extents[i]) for k, i in enumerate(spatial_ix)]
    reduced = [(labels[len(spatial_ix) + k], extents[i]) for k, i in enumerate(reduce_ix)]
    weight_only = {labels[k] for k, d in enumerate(info.spatial) if d in info.weight_only}
    axes = [
        Axis(labels[i], i, extents[i], i in reduce_ix, i < len(info.spatial) and labels[i] in weight_only)
        for i in range(len(ivars))
    ]
    reads = []
    for region in node.reads:
        name = region.source.name
        dims: list[set[int]] = []
        strides: list[dict[int, int] | None] = []  # per buffer dim: iter index -> coefficient, None if not affine
        for rng in region.region:
            used_vars = [v for v in tvm.tirx.analysis.undefined_vars(rng.min) if any(v.same_as(w) for w in ivars)]
            used = [next(i for i, w in enumerate(ivars) if w.same_as(v)) for v in used_vars]
            dims.append(set(used))
            coeffs = detect_linear_equation(rng.min, used_vars) if used_vars else ()
            if used_vars and len(coeffs) == len(used_vars) + 1:
                # a coefficient that is not a constant (a product of two axes) leaves the axis out: a gather
                strides.append({i: int(c.value) for i, c in zip(used, coeffs[:-1]) if hasattr(c, "value")})
            else:
                strides.append(None if used_vars else {})
        reads.append((name, dims))
        for axis in axes:
            for d, used in enumerate(dims):
                if axis.index not in used:
                    continue
                coeff = None if strides[d] is None else strides[d].get(axis.index)
                if d == len(dims) - 1 and coeff == 1:
                    if name in weight_names and len(used) == 1 and len(dims) > 1:
                        axis.panels.append((name, d))
                    continue  # contiguous
                if name in weight_names and len(used) == 1 and coeff == 1:
                    axis.packs.append((name, d))
                else:
                    axis.gathers += 1
                    # a strided read of the last dim (a Stride of 2) loads two vectors and shuffles them
                    small = d == len(dims) - 1 and coeff is not None and axis.gather_stride is not None
                    axis.gather_stride = max(axis.gather_stride, abs(coeff)) if small else None
    kind = "pad" if info.is_pad else "copy" if info.is_copy else ("reduce" if reduce_ix else "spatial")
    return StageBlock(
        info.name,
        kind,
        spatial,
        reduced,
        weight_only,
        reads,
        axes,
        padded=info.padded,
        invertible=kind == "copy" and invertible_copy(node),
        elementwise=info.elementwise,
        lane_reduce=info.lane_reduce,
        lane_run=_trailing_run(node, reduce_ix) if info.lane_reduce and reduce_ix else 1,
        identity_reads=_identity_reads(node) if info.elementwise else set(),
    )


def _trailing_run(node: Any, indices: Sequence[int]) -> int:
    """The most trailing axes of ``indices`` (block iter indices, at least 1) that every read either
    indexes as its own trailing dims, in order, whole and with stride 1, or does not index at all (a
    broadcast): fused into one loop, they walk every buffer contiguously (a mean over H, W of 14 is
    one run of 196)."""
    tvm = load_tvm()
    tirx = tvm.tirx
    ivars = [iv.var for iv in node.iter_vars]
    extents = [int(iv.dom.extent) for iv in node.iter_vars]
    reads = []
    for region in node.reads:
        mins = [rng.min for rng in region.region]
        uses = [
            {k for k, w in enumerate(ivars) if any(v.same_as(w) for v in tirx.analysis.undefined_vars(m))} for m in mins
        ]
        reads.append((mins, uses, [int(d) for d in region.source.shape]))

    def fits(m: int) -> bool:
        tail = list(indices[-m:])
        for mins, uses, shape in reads:
            if not any(u & set(tail) for u in uses):
                continue
            if len(mins) < m or any(u & set(tail) for u in uses[: len(mins) - m]):
                return False
            for k, d in zip(tail, range(len(mins) - m, len(mins))):
                if not (isinstance(mins[d], tirx.Var) and mins[d].same_as(ivars[k]) and shape[d] == extents[k]):
                    return False
        return True

    return next((m for m in range(len(indices), 1, -1) if fits(m)), 1)


def _identity_reads(node: Any) -> set[str]:
    """The buffers that ``node`` reads at a permutation of its iter vars, as many elements as it has
    iterations: the reads that ``reverse_compute_inline`` can fold into their producer's write-back
    (a broadcast read, one element for many iterations, is not a bijection)."""
    tvm = load_tvm()
    tirx = tvm.tirx
    found = set()
    extents = [int(iv.dom.extent) for iv in node.iter_vars]
    for region in node.reads:
        used: list[int] = []
        for rng in region.region:
            if isinstance(rng.min, tirx.Var):
                used.extend(i for i, iv in enumerate(node.iter_vars) if iv.var.same_as(rng.min))
            elif not (isinstance(rng.min, tirx.IntImm) and int(rng.min.value) == 0):
                used = []
                break
        every = len(used) == len(set(used)) and {i for i, e in enumerate(extents) if e > 1} <= set(used)
        if used and every and prod(extents) == prod(int(n) for n in region.source.shape):
            found.add(region.source.name)
    return found
