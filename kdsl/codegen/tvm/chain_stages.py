"""A linear chain lowered to ``te.compute`` stages: bottom-up coordinate expressions over a stage plan.

The chain's stage plan (:func:`kdsl.solve.plan`, the same plan the PyTorch backend lowers) gives a
sequence of views and contraction stages. Each contraction stage becomes one ``te.compute``: its
spatial axes are the stage's result dims, its reduction axes the dims it reduces, and its body reads
the previous stage's tensor at the coordinate obtained by walking the views in between *bottom-up*
with the primitives' own coordinate rules (:mod:`kdsl.lang.index`, turned into TIR here; a window's
read is guarded by ``0 <= . < N``, N the dim's size, never the window's), times every weight it
shares. Views after the last stage become a final copy stage.

A stage that reduces a window over a Dilate's inserted zeros is lowered in its phase form instead
(:mod:`kdsl.codegen.tvm.phases`, :func:`_phase_stages`): a phased, zero-padded copy of its source, a
reduction over only the taps that meet an element with its result laid out ``[.., o1, p, ..]``, and the
copy back to ``[.., s*o1 + p, ..]`` (in the output's order when it is the last stage), which the default
schedule folds into the reduction's write-back.

:func:`lower_chain` lowers a chain onto any TE tensor: :func:`kdsl.codegen.tvm.lowering.lower` lowers
every chain node of an operator with it (a linear operator's one chain with plain stage names, a
branching operator's with stage names prefixed). :class:`StageInfo` is what the scheduler reads of
every stage, these and the node rules' (:mod:`kdsl.codegen.tvm.node_rules`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any

from kdsl import solve
from kdsl.codegen.tvm.phases import Phase, find_phases, without_phases
from kdsl.lang.errors import LoweringError
from kdsl.lang.index import Add, Const, Cyclic, FloorDiv, Half, Index, Mod, Scale, SizeOf, Var, walk_up
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import CONTRACTION, REDUCTION, Primitive, Weight
from kdsl.lang.sizes import Size


@dataclass
class StageInfo:
    """What the scheduler needs to know about one compute stage."""

    name: str
    spatial: list[str]  # dim names of the output axes, in order
    reduced: list[str]  # dim names of the reduction axes, in order
    weight_only: set[str] = field(default_factory=set)  # spatial dims that only weights index
    is_copy: bool = False  # a pure view (no contraction)
    is_pad: bool = False  # a zero-padded copy of a tensor that a window (Unfold) reads past the edges
    padded: tuple[int, ...] = ()  # for a pad stage: the positions of the padded dims
    reads_from: tuple[str, ...] = ()  # the stages (pads included) whose results this stage reads
    elementwise: bool = False  # a branching kernel's element-wise stage (Map, Blend, ...): it may be inlined
    lane_reduce: bool = False  # a branching kernel's reduction that may keep vector lanes of partial results
    phased: bool = False  # a pad stage that is the phase form's copy (kdsl.codegen.tvm.phases)


def _sizes_along(plan: Any, binding: Mapping[str, int]) -> list[dict[str, int]]:
    """The concrete live sizes before every step of the plan, and after the last one."""
    return [{name: int(size.evaluate(binding)) for name, size in live} for live in plan.live]


@dataclass
class _Guard:
    """The validity condition of a windowed read: ``0 <= coordinate < size`` of dim ``dim``.

    ``pad`` is the (low, high) zero padding of ``dim`` that makes the condition always true, when the
    coordinate reaches the source tensor unchanged (no view above the Unfold touches ``dim``)."""

    condition: Any
    dim: str
    pad: tuple[int, int] | None


def _tir(tvm: Any, expr: Index, leaves: Mapping[str, Any]) -> Any:
    """An index expression over constant sizes as a TIR expression (``leaves``: the loop variables)."""
    if isinstance(expr, Var):
        return leaves[expr.name]
    if isinstance(expr, Const):
        return tvm.tirx.const(expr.value, "int32")  # the dtype of TE's axes
    if isinstance(expr, SizeOf):
        return _int(expr.size)
    if isinstance(expr, Half):
        return _int(expr.size) // 2
    if isinstance(expr, Add):
        left, right = _tir(tvm, expr.left, leaves), _tir(tvm, expr.right, leaves)
        return left + right if expr.sign > 0 else left - right
    if isinstance(expr, Scale):
        return _tir(tvm, expr.expr, leaves) * _int(expr.size)
    if isinstance(expr, FloorDiv):
        return tvm.tirx.floordiv(_tir(tvm, expr.expr, leaves), _int(expr.size))
    if isinstance(expr, Mod):
        return tvm.tirx.floormod(_tir(tvm, expr.expr, leaves), _int(expr.size))
    if isinstance(expr, Cyclic):
        return _cyclic(tvm, _tir(tvm, expr.expr, leaves), expr.offset, _int(expr.extent))
    raise LoweringError(f"no TIR form for the index expression {expr!r}")


def _int(size: Size) -> int:
    return int(size.constant)


def walk_views(
    tvm: Any, views: list[tuple[Primitive, dict[str, int]]], coords: dict[str, Any], binding: Mapping[str, int]
) -> tuple[dict[str, Any], list[_Guard]]:
    """Walk ``views`` (each with the live sizes before it) bottom-up from ``coords``: return the
    coordinates in the tensor before the first view, and the guards that make a read valid.

    The walk is the primitives' own coordinate rules (:func:`kdsl.lang.index.walk_up`) over the steps
    evaluated at the binding, so the identities of size-1 dims apply; the result becomes TIR."""
    bound = [(step.at(binding), {name: Size.of(n) for name, n in sizes.items()}) for step, sizes in views]
    up, guards = walk_up(bound, {name: Var(name) for name in coords})
    result = {name: _tir(tvm, expr, coords) for name, expr in up.items()}
    checks = []
    for guard in guards:
        source, window = _tir(tvm, guard.expr, coords), _int(guard.window)
        # bounded by the size of the dim being unfolded, not by the window
        condition = tvm.tirx.all(source >= 0, source < _int(guard.extent))
        if guard.divisor is not None:  # a Dilate's inserted zeros lie between multiples of its factor
            condition = tvm.tirx.all(condition, tvm.tirx.floormod(source, _int(guard.divisor)) == 0)
        checks.append(_Guard(condition, guard.dim, (window // 2, window - 1 - window // 2) if guard.paddable else None))
    return result, checks


def window_paddings(
    tvm: Any, views: list[tuple[Primitive, dict[str, int]]], names: Sequence[str], binding: Mapping[str, int]
) -> dict[str, tuple[int, int]]:
    """The zero padding of the source's dims that removes the guards of reads through ``views``
    (found by walking symbolic coordinates of the dims ``names``)."""
    probe = {name: tvm.tirx.Var(f"probe_{name}", "int32") for name in names}
    _, guards = walk_views(tvm, views, probe, binding)
    pads: dict[str, tuple[int, int]] = {}
    for guard in guards:
        if guard.pad is not None and guard.pad != (0, 0):
            low, high = pads.get(guard.dim, (0, 0))
            pads[guard.dim] = (max(low, guard.pad[0]), max(high, guard.pad[1]))
    return pads


def padded_copy(
    tvm: Any,
    tensor: Any,
    dims: list[str],
    pads: Mapping[str, tuple[int, int]],
    name: str,
    dtype: str,
    fill: float = 0.0,
) -> Any:
    """``tensor`` with ``fill`` (zeros) around the dims of ``pads``: ``padded[i + low] = tensor[i]``."""
    shape = [int(n) + sum(pads.get(d, (0, 0))) for n, d in zip(tensor.shape, dims)]

    def compute(*indices: Any) -> Any:
        inside, source = [], []
        for index, d, n in zip(indices, dims, tensor.shape):
            low = pads.get(d, (0, 0))[0]
            if d in pads:
                inside.extend([index >= low, index < low + int(n)])
            source.append(index - low if low else index)
        value = tensor[tuple(source)]
        if not inside:
            return value
        return tvm.tirx.if_then_else(tvm.tirx.all(*inside), value, tvm.tirx.const(fill, dtype))

    return tvm.te.compute(tuple(shape), compute, name=name)


def _cyclic(tvm: Any, coordinate: Any, offset: int, extent: int) -> Any:
    """``(coordinate + offset) mod extent`` for a coordinate in ``[0, extent)``, without floormod."""
    offset %= extent
    if offset == 0:
        return coordinate
    moved = coordinate + offset
    return tvm.tirx.Select(moved >= extent, moved - extent, moved)


def read_guarded(
    tvm: Any,
    tensor: Any,
    dims: list[str],
    coords: dict[str, Any],
    guards: list[_Guard],
    dtype: str,
    padded: tuple[Any, Mapping[str, tuple[int, int]]] | None = None,
    fill: float = 0.0,
) -> Any:
    """``tensor[coords]``, ``fill`` (zero) where a guard fails; with ``padded = (tensor, pads)`` the padded
    copy is read instead and the guards it covers are dropped."""
    if padded is not None:
        tensor, pads = padded
        coords = {d: c + pads[d][0] if d in pads else c for d, c in coords.items()}
        guards = [g for g in guards if g.pad is None or g.dim not in pads]
    value = tensor[tuple(coords[d] for d in dims)]
    if guards:
        conditions = [g.condition for g in guards]
        condition = conditions[0] if len(conditions) == 1 else tvm.tirx.all(*conditions)
        value = tvm.tirx.if_then_else(condition, value, tvm.tirx.const(fill, dtype))
    return value


def _stage_body(
    tvm: Any,
    dtype: str,
    binding: Mapping[str, int],
    weight_tensors: dict[str, Any],
    result: list[str],
    axes: dict[str, Any],
    shares: list[Weight],
    pending: list[tuple[Primitive, dict[str, int]]],
    source: Any,
    source_dims: list[str],
    mean_sizes: list[int],
    new_dims: set[str],
    padded: tuple[Any, Mapping[str, tuple[int, int]]] | None,
) -> Callable[..., Any]:
    """The ``fcompute`` of one contraction stage."""

    def compute(*indices: Any) -> Any:
        coords = dict(zip(result, indices))
        coords.update(axes)
        data_coords = {k: v for k, v in coords.items() if k not in new_dims}
        up, guards = walk_views(tvm, pending, data_coords, binding)
        value = read_guarded(tvm, source, source_dims, up, guards, dtype, padded)
        for weight in shares:
            value = value * weight_tensors[weight.name][tuple(coords[d.name] for d in weight.dims)]
        if mean_sizes:
            value = value * tvm.tirx.const(1.0 / prod(mean_sizes), dtype)
        if axes:
            return tvm.te.sum(value, axis=list(axes.values()))
        return value

    return compute


def _phased_copy(
    tvm: Any,
    tensor: Any,
    dims: list[str],
    phases: Mapping[str, Phase],
    pads: Mapping[str, tuple[int, int]],
    name: str,
    dtype: str,
) -> tuple[Any, list[str], tuple[int, ...]]:
    """The phase form's copy of ``tensor``: each phase dim ``d`` becomes two axes ``(p, i)`` holding
    ``tensor[.., i + c(p), ..]`` (:mod:`kdsl.codegen.tvm.phases`), the dims of ``pads`` are zero-padded as
    :func:`padded_copy` pads them, zero outside the tensor. Returns the copy, its axes' names and the
    positions of the padded axes (every ``i``)."""
    axes: list[str] = []
    shape: list[int] = []
    padded: list[int] = []
    for d, n in zip(dims, (int(n) for n in tensor.shape)):
        if d in phases:
            ph = phases[d]
            axes.append(ph.phase)
            shape.append(ph.factor)
            extent = n + ph.taps - 1  # o1 + t for o1 < n, t < taps
        else:
            extent = n + sum(pads.get(d, (0, 0)))
        if d in phases or d in pads:
            padded.append(len(axes))
        axes.append(d)
        shape.append(extent)

    def compute(*indices: Any) -> Any:
        at = dict(zip(axes, indices))
        inside, source = [], []
        for d, n in zip(dims, tensor.shape):
            if d in phases:
                index = at[d] + phases[d].offset(at[phases[d].phase], tvm.tirx.Select)
            else:
                index = at[d] - pads[d][0] if d in pads else at[d]
            if d in phases or d in pads:
                inside.extend([index >= 0, index < int(n)])
            source.append(index)
        value = tensor[tuple(source)]
        if not inside:
            return value
        return tvm.tirx.if_then_else(tvm.tirx.all(*inside), value, tvm.tirx.const(0.0, dtype))

    return tvm.te.compute(tuple(shape), compute, name=name), axes, tuple(padded)


@dataclass
class _Contraction:
    """One contraction stage of the plan, as :func:`lower_chain` found it (names and sizes at the binding)."""

    name: str
    result: list[str]
    result_sizes: dict[str, int]
    reduce_sizes: dict[str, int]  # reduced dim -> size, in the block's order
    means: list[str]
    shares: list[Weight]
    new_dims: set[str]


def _phase_stages(
    tvm: Any,
    dtype: str,
    binding: Mapping[str, int],
    weight_tensors: Mapping[str, Any],
    stage: _Contraction,
    phases: list[Phase],
    pending: list[tuple[Primitive, dict[str, int]]],
    source: Any,
    source_dims: list[str],
    names: tuple[str, str],
    stages: list[StageInfo],
    merged_dims: list[str],
) -> Any:
    """Lower ``stage`` in its phase form (:mod:`kdsl.codegen.tvm.phases`): the phased copy of ``source``
    (a pad stage named ``names[0]``), the reduction over the taps that meet an element, laid out
    ``[.., o1, p, ..]``, and its copy to the plan's ``[.., s*o1 + p, ..]`` (named ``names[1]``, its dims in the
    order ``merged_dims``, a permutation of the stage's result). Appends the three stages to ``stages`` and
    returns the copy."""
    te = tvm.te
    by_dim = {ph.dim: ph for ph in phases}
    by_window = {ph.window: ph for ph in phases}
    phase_axes = {ph.phase for ph in phases}
    rest = without_phases(pending, phases)
    data_names = [d for d in [*stage.result, *stage.reduce_sizes] if d not in stage.new_dims]
    plain = [d for d in data_names if d not in by_dim and d not in by_window]
    pads = window_paddings(tvm, rest, plain, binding)
    phased, phased_dims, padded = _phased_copy(tvm, source, source_dims, by_dim, pads, names[0], dtype)
    info = StageInfo(names[0], phased_dims, [], is_pad=True, padded=padded, reads_from=(source.op.name,))
    info.phased = True
    stages.append(info)

    spatial = [a for d in stage.result for a in ((by_dim[d].outer, by_dim[d].phase) if d in by_dim else (d,))]
    extents = {ph.outer: ph.extent for ph in phases} | {ph.phase: ph.factor for ph in phases} | stage.result_sizes
    axes = {
        (by_window[r].tap if r in by_window else r): te.reduce_axis(
            (0, by_window[r].taps if r in by_window else n), name=f"r_{by_window[r].tap if r in by_window else r}"
        )
        for r, n in stage.reduce_sizes.items()
    }

    def compute(*indices: Any) -> Any:
        at = dict(zip(spatial, indices)) | axes
        coords = {d: at[d] for d in [*stage.result, *stage.reduce_sizes] if d in at}  # the plan's coordinates
        checks = []
        for ph in phases:
            p = at[ph.phase]
            coords[ph.dim] = ph.factor * at[ph.outer] + p
            tap = ph.tap_index(p, at[ph.tap], tvm.tirx.Select)
            coords[ph.window] = tvm.tirx.min(tap, ph.size - 1) if ph.guarded else tap  # an index inside w
            if ph.guarded:
                checks.append(tap < ph.size)
        up, guards = walk_views(tvm, rest, {d: coords[d] for d in plain}, binding)
        read = []
        for d in phased_dims:
            if d in by_dim:  # o1 + t: affine, inside the copy
                read.append(at[by_dim[d].outer] + at[by_dim[d].tap])
            elif d in phase_axes:
                read.append(at[d])
            else:
                read.append(up[d] + pads[d][0] if d in pads else up[d])
        value = phased[tuple(read)]
        checks += [g.condition for g in guards if g.pad is None or g.dim not in pads]
        if checks:
            # the data read alone: under the condition TVM would simplify a weight's min(k, K - 1) to k, and
            # a weight's read region past its window breaks packing it (cache_read)
            value = tvm.tirx.if_then_else(tvm.tirx.all(*checks), value, tvm.tirx.const(0.0, dtype))
        for weight in stage.shares:
            value = value * weight_tensors[weight.name][tuple(coords[d.name] for d in weight.dims)]
        if stage.means:
            value = value * tvm.tirx.const(1.0 / prod(stage.reduce_sizes[m] for m in stage.means), dtype)
        return te.sum(value, axis=list(axes.values()))

    result = te.compute(tuple(extents[a] for a in spatial), compute, name=stage.name)
    reduced = [by_window[r].tap if r in by_window else r for r in stage.reduce_sizes]
    weight_only = stage.new_dims & set(stage.result)
    stages.append(StageInfo(stage.name, spatial, reduced, weight_only=weight_only, reads_from=(names[0],)))

    def merge(*indices: Any) -> Any:
        at = dict(zip(merged_dims, indices))
        return result[
            tuple(
                index
                for d in stage.result
                for index in ((at[d] // by_dim[d].factor, at[d] % by_dim[d].factor) if d in by_dim else (at[d],))
            )
        ]

    merged = te.compute(tuple(stage.result_sizes[d] for d in merged_dims), merge, name=names[1])
    stages.append(StageInfo(names[1], list(merged_dims), [], is_copy=True, reads_from=(stage.name,)))
    return merged


@dataclass
class ChainLowered:
    """A linear chain lowered onto a given tensor: its stages, and its result.

    ``tensor`` holds the result with axes ``dims`` (the chain's output dims, in order), or is ``None``
    when the chain was lowered with ``materialize=False`` and ends in views: then ``source`` (axes
    ``source_dims``) is the last tensor computed and ``views`` (each step with the live sizes before
    it) the views a reader walks bottom-up from the output coordinates (:meth:`read`)."""

    tensor: Any
    dims: list[str]
    stages: list[StageInfo]
    source: Any
    source_dims: list[str]
    views: list[tuple[Primitive, dict[str, int]]]
    binding: dict[str, int]

    def read(self, tvm: Any, coords: Mapping[str, Any], dtype: str, fill: float = 0.0) -> tuple[Any, list[Any]]:
        """The value at output ``coords`` read through the views from ``source`` (``fill`` where a window
        reads past its dim), and the guards' conditions (empty when every read is valid)."""
        up, guards = walk_views(tvm, self.views, dict(coords), self.binding)
        return read_guarded(tvm, self.source, self.source_dims, up, guards, dtype, None, fill), [
            g.condition for g in guards
        ]


def _contraction(block: Sequence[Primitive], stage: Any, sizes: list[dict[str, int]], name: str) -> _Contraction:
    """The contraction stage ``stage`` of a plan (its steps ``block``; ``sizes`` along the plan)."""
    reduce_sizes = {
        step.dim: sizes[i][step.dim] for i, step in enumerate(block, stage.start) if REDUCTION in step.facts
    }
    means = [step.dim for step in block if REDUCTION in step.facts and step.mean]
    shares = [step.weight for step in block if CONTRACTION in step.facts]
    new_dims = {d.name for w in shares for d, new in zip(w.dims, w.new) if new}
    result = [name for name, _ in stage.result]
    return _Contraction(name, result, sizes[stage.stop], reduce_sizes, means, shares, new_dims)


def lower_chain(
    tvm: Any,
    op: Operator,
    binding: Mapping[str, int],
    source: Any,
    source_dims: Sequence[str],
    weight_tensors: Mapping[str, Any],
    dtype: str,
    prefix: str = "",
    materialize: bool = True,
) -> ChainLowered:
    """Lower the linear chain ``op`` onto the TE tensor ``source`` (axes named ``source_dims``, the dims
    of ``op.inputs`` in any order) with the weights ``weight_tensors`` (by weight name). Stage names
    start with ``prefix`` (unique names across a branching kernel; ``""`` for a plain operator). With
    ``materialize=False`` trailing views are left to the reader (:class:`ChainLowered`)."""
    te = tvm.te
    plan = solve.plan(op, binding)
    steps = list(plan.steps)
    sizes = _sizes_along(plan, binding)
    chain_input = source
    source_dims = list(source_dims)
    pending: list[tuple[Primitive, dict[str, int]]] = []
    stages: list[StageInfo] = []

    def padder(
        tensor: Any, dims: list[str], views: list[tuple[Primitive, dict[str, int]]], names: Sequence[str]
    ) -> tuple[Any, dict[str, tuple[int, int]]] | None:
        """A zero-padded copy of ``tensor`` (a stage of its own) for reads through windows, so that the
        reading stage has no bounds checks; the scheduler may inline it back."""
        pads = window_paddings(tvm, views, names, binding)
        if not pads:
            return None
        name = f"{prefix}pad{sum(1 for s in stages if s.is_pad)}"
        padded_dims = tuple(i for i, d in enumerate(dims) if d in pads)
        stages.append(StageInfo(name, list(dims), [], is_pad=True, padded=padded_dims, reads_from=(tensor.op.name,)))
        return padded_copy(tvm, tensor, dims, pads, name, dtype), pads

    stage_starts = {stage.start: stage for stage in plan.stages}
    output_names = [d.name for d in plan.outputs]
    taken = {name for live in plan.live for name, _ in live}  # the phase form's new axes avoid these
    index = 0
    while index < len(steps):
        stage = stage_starts.get(index)
        if stage is None:
            pending.append((steps[index], sizes[index]))
            index += 1
            continue
        found = _contraction(
            steps[stage.start : stage.stop], stage, sizes, f"{prefix}stage{sum(not s.is_pad for s in stages)}"
        )
        bound = [(step.at(binding), n) for step, n in pending]
        phases = find_phases(bound, found.result, list(found.reduce_sizes), taken) if pending else []
        if phases:  # a window over inserted zeros: only the taps that meet an element (module phases)
            # the last stage's copy back from [.., o1, p, ..] also puts the dims in the output's order
            last = stage.stop == len(steps) and sorted(found.result) == sorted(output_names)
            pad = f"{prefix}pad{sum(s.is_pad for s in stages)}"
            names = (pad, f"{prefix}out" if last else f"{prefix}merge{len(stages)}")
            args = (found, phases, pending, source, source_dims, names, stages)
            source = _phase_stages(tvm, dtype, binding, weight_tensors, *args, output_names if last else found.result)
            source_dims = output_names if last else found.result
        else:
            axes = {r: te.reduce_axis((0, n), name=f"r_{r}") for r, n in found.reduce_sizes.items()}
            data_names = [d for d in [*found.result, *axes] if d not in found.new_dims]
            padded = padder(source, source_dims, pending, data_names)
            means = [found.reduce_sizes[m] for m in found.means]
            compute = _stage_body(
                tvm, dtype, binding, weight_tensors, found.result, axes, found.shares, list(pending), source,
                list(source_dims), means, found.new_dims, padded,
            )  # fmt: skip
            read = (padded[0] if padded else source).op.name
            source = te.compute(tuple(found.result_sizes[r] for r in found.result), compute, name=found.name)
            weight_only = found.new_dims & set(found.result)
            stages.append(StageInfo(found.name, found.result, list(axes), weight_only=weight_only, reads_from=(read,)))
            source_dims = found.result
        pending = []
        index = stage.stop

    if pending or source is chain_input or source_dims != output_names:
        if not materialize:
            return ChainLowered(None, output_names, stages, source, list(source_dims), list(pending), dict(binding))
        pending_views, copied, copied_dims = list(pending), source, list(source_dims)
        copy_padded = padder(copied, copied_dims, pending_views, output_names)

        def copy(*indices: Any) -> Any:
            up, guards = walk_views(tvm, pending_views, dict(zip(output_names, indices)), binding)
            return read_guarded(tvm, copied, copied_dims, up, guards, dtype, copy_padded)

        output_shape = tuple(sizes[-1][n] for n in output_names)
        source = te.compute(output_shape, copy, name=f"{prefix}out")
        read = (copy_padded[0] if copy_padded else copied).op.name
        stages.append(StageInfo(f"{prefix}out", output_names, [], is_copy=True, reads_from=(read,)))
    return ChainLowered(source, output_names, stages, source, output_names, [], dict(binding))
