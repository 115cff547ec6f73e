"""The schedule space of a lowered operator: its parameters, the heuristic configuration, neighbours.

A *configuration* is a plain JSON-able ``dict`` from parameter names to values. :meth:`ScheduleSpace.apply`
turns one into a ``tvm.s_tir.Schedule`` of the operator's TE program, or raises
:class:`~kdsl.lang.errors.LoweringError` with the reason when it is invalid (never another exception).

The parameter types and OpEvo's q-random walk are :mod:`kdsl.codegen.tvm.parameters`'s; applying a
configuration as schedule primitives is :mod:`kdsl.codegen.tvm.schedule_apply`'s.

The space of one operator (per TE stage ``S``, built from the block analysis of
:mod:`kdsl.codegen.tvm.blocks`, never the operator's name):

* reduction stages get a three-level tiling ``S.tile.<axis>`` = (outer, middle, inner) of every spatial
  axis and ``(outer, inner)`` of every reduction axis (a tile of 1 makes no loop); outer spatial tiles are
  fused and parallel, a weight-only vector axis's first; ``S.order`` permutes the middle loops (middle
  spatial tiles and outer reduction tiles); ``S.reductions`` puts the inner reduction tiles below all
  of them (``"split"``) or each right below its outer tile (``"whole"``: the reductions stay in
  ``S.order``'s order, short ones unrolled in place); then come the unit reduction loops,
  ``S.spatial_below``'s level and the inner spatial tiles, the vector axis ``S.vector`` innermost and
  vectorized; ``S.spatial_below`` (``"none"`` or a spatial axis) moves that axis's middle tile out of
  ``S.order``'s loops to right below the inner reductions, a fourth spatial level above the register tile
  (``S0 R0 S1 R1 Sm S2``, as MetaSchedule's ``SSRSRS``; its tile joins the local accumulator, which then
  stays in memory); ``S.unroll`` bounds the product of the unrolled inner reduction loops (innermost
  first; up to 1024, where MetaSchedule's pragma goes to 512 and the heuristic to 256),
  ``S.unroll_tile`` unrolls the register tile;
  ``S.block`` (``"none"`` or ``"a:n"``: cache blocking) splits axis ``a``'s outer tiles into blocks of ``n``,
  the blocks outermost in the fused parallel loop and the ``n`` tiles innermost (``n`` must divide the
  outer tiles' count: else the configuration is invalid; :meth:`ScheduleSpace.random` and
  :meth:`ScheduleSpace.repair` keep to the blocks the tiles allow, :mod:`kdsl.codegen.tvm.space_rules`);
  ``S.rblock`` (``"none"`` or ``"a:n"``: K blocking) splits reduction ``a``'s outer tiles into blocks of ``n``
  steps, the blocks at ``a``'s place in ``S.order`` and the steps within a block below every middle loop;
  ``S.cache`` accumulates in a ``local`` tile (laid out with the tile's axes last, the vector axis innermost)
  written back once, or in place;
  ``S.prefetch`` (``"none"`` or ``"next"``) has each task of the fused parallel loop prefetch its share of the
  next slab of the data its outermost axis slices (a batch's operands; :mod:`kdsl.codegen.tvm.prefetch`);
  ``S.rfactor`` (stages with little spatial parallelism) splits the outer reduction into a parallel
  partial sum; ``S.lanes`` (below) also serves a plain operator's reduction that every read walks
  contiguously (a GEMV's dot products), ``S.lane_rows`` of its rows at once; ``S.attach`` computes a
  producer stage at its consumer's parallel loop (an attached reduction with its reductions above its
  innermost loop, which is vectorized);
* copy stages: ``S.inline`` folds the copy into its producer's write-back, else (like element-wise
  stages) their outer loops are fused and parallel, the innermost vectorized if its reads are contiguous;
* zero-padded copies (``padN``, the lowering's stage for each windowed read): ``S.inline`` puts the bounds
  checks back into the reader, else the copy is a parallel, vectorized pass of its own;
* a branching kernel's element-wise stages (Map, Blend, the softmax's division; ``StageInfo.elementwise``):
  ``S.inline`` is ``"consumers"`` (``compute_inline``: computed where it is read), ``"producer"``
  (``reverse_compute_inline`` into the write-back of the reduction it reads one element per iteration) or
  ``"none"`` (a parallel pass: trailing loops that every access walks contiguously fused into whole
  vectors, else a short row vectorized whole);
* a branching kernel's row reductions (the softmax's max and sum; ``StageInfo.lane_reduce``): ``S.lanes``
  keeps vector lanes of partial results along the contiguous last reduced dim, or the trailing reduced
  dims fused where every read walks them as one run (split + ``rfactor``);
* layouts (ALT): every input, weight and intermediate tensor ``T`` has ``layout.T.perm`` (an order of
  its dims) and ``layout.T.tile`` (``"d:f"``: dim ``d`` tiled by ``f``, the tile moved last, ALT's
  ``tiled channel last``; only factors that divide are offered, and a short dim whole); inputs and weights are packed by
  ``cache_read`` + ``transform_layout``, in a pass or per task or K block of a reduction reader (``layout.T.pack``,
  :mod:`kdsl.codegen.tvm.pack_inside`; the signature stays; with ``prepacked_weights=True`` the kernel's
  signature takes a packed weight instead and the copy is removed, :mod:`kdsl.codegen.tvm.prepack`),
  intermediates are transformed in place.
  The output's layout is the signature's. In a branching kernel the heuristic lays an intermediate that one
  reduction reads out with that reader's vector dim last (a Product's operand made by an FC).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterator, Mapping
from math import prod
from typing import Any

from kdsl.codegen.tvm.blocks import Axis, StageBlock, analyze, named
from kdsl.codegen.tvm.machine import current_machine
from kdsl.codegen.tvm.pack_inside import PACK_PLACES
from kdsl.codegen.tvm.parameters import (
    Categorical,
    Discrete,
    Factorization,
    Parameter,
    Permutation,
    config_key,
    largest_divisor,
    order_labels,
)
from kdsl.codegen.tvm.pass_stages import MAX_VECTORS, RAGGED_VECTORS
from kdsl.codegen.tvm.prefetch import PREFETCH_CHOICES, insert_prefetches, slab_axis
from kdsl.codegen.tvm.product_tiles import whole_product_rows
from kdsl.codegen.tvm.schedule_apply import _Applier, _Tensor
from kdsl.codegen.tvm.space_memory import BLOCK_TILES, RBLOCK_DEPTHS, MemoryRules
from kdsl.codegen.tvm.space_registers import RegisterRules
from kdsl.codegen.tvm.space_rules import conflicts, repair
from kdsl.codegen.tvm.toolchain import error_reason, load_tvm
from kdsl.lang.errors import LoweringError
from kdsl.runtime.cpu import Machine

# what each version changed: docs/tune/space_versions.md
#: The space's version: stored with every tuning record (a new version never reuses old records).
VERSION = "tvm-space-16"
# The vector width, the register file and the caches are the target machine's
# (:mod:`kdsl.runtime.cpu`): ``ScheduleSpace.lanes`` and ``ScheduleSpace.accumulators``.
#: Reduction loops at most this long are unrolled by the heuristic (windows such as kh, kw).
UNROLL_REDUCTION = 4
#: Layout tile factors offered (ALT's template: tile one dim, move the tile last).
LAYOUT_FACTORS = (1, 4, 8, 16, 32, 64)
#: Largest stride of a strided vector load that a branching kernel's stage prefers to a gather across rows.
MAX_GATHER_STRIDE = 4
#: Longest short axis (in vectors) that a plain operator's heuristic vectorizes whole instead of by half vectors.
SHORT_VECTORS = 4
#: Bounds on the product of unrolled inner reduction loops (MetaSchedule's unroll pragma goes to 512).
UNROLL_LIMITS = (1, 4, 16, 64, 256, 512, 1024)
#: Rows that ``S.lanes`` may sum at once (``S.lane_rows``), each a stream of its own.
LANE_ROWS = (1, 2, 4, 8)
#: The largest bound the heuristic picks (its schedules stay those of the space before 512 and 1024).
HEURISTIC_UNROLL = 256


# ------------------------------------------------------------------------------------------------
# The space of a lowered operator
# ------------------------------------------------------------------------------------------------


class ScheduleSpace(RegisterRules, MemoryRules):
    """The schedule space of one lowered operator (:func:`kdsl.codegen.tvm.lowering.lower`)."""

    def __init__(self, lowered: Any, machine: Machine | None = None) -> None:
        tvm = load_tvm()
        self.lowered = lowered
        self.tvm = tvm
        #: the CPU the schedules are for (default: the target's, :func:`~kdsl.codegen.tvm.machine.current_machine`)
        self.machine = machine or current_machine()
        self.lanes = self.machine.lanes(str(lowered.out.dtype))
        #: most vector accumulators one register tile keeps live (the rest of the register file holds
        #: the step's weight vectors and broadcast)
        self.accumulators = self.machine.accumulators()
        self.stages: list[StageBlock] = analyze(lowered)
        self.tensors: list[_Tensor] = []
        params = [w.name for w in lowered.weights]
        read_first: dict[str, str] = {}
        for stage in self.stages:
            for buffer, _ in stage.reads:
                read_first.setdefault(buffer, stage.name)
        self.tensors.append(_Tensor("x", tuple(int(d) for d in lowered.x.shape), "input", read_first.get("x", "")))
        for name, w in zip(params, lowered.weights):
            self.tensors.append(_Tensor(name, tuple(int(d) for d in w.shape), "weight", read_first.get(name, "")))
        out_name = lowered.out.op.name
        for stage in self.stages:
            if stage.name != out_name:
                shape = tuple(e for _, e in stage.spatial)
                self.tensors.append(_Tensor(stage.name, shape, "intermediate", stage.name))
        #: the names of the kernel's weights (what S.prefetch never fetches)
        self.weight_names = frozenset(params)
        self.parameters: dict[str, Parameter] = {}
        self._build_parameters()
        #: :meth:`rejection`'s verdicts by :func:`~kdsl.codegen.tvm.parameters.config_key` (``None``: it applies)
        self.verdicts: dict[str, str | None] = {}

    # -- parameters ------------------------------------------------------------------------------

    def _add(self, param: Parameter) -> None:
        self.parameters[param.name] = param

    def _build_parameters(self) -> None:
        for stage in self.stages:
            s = stage.name
            if stage.kind == "reduce":
                for axis, extent in stage.spatial:
                    if extent > 1:
                        self._add(Factorization(f"{s}.tile.{axis}", extent, 3))
                for axis, extent in stage.reduced:
                    if extent > 1:
                        self._add(Factorization(f"{s}.tile.{axis}", extent, 2))
                middle = order_labels(stage)
                if len(middle) > 1:
                    self._add(Permutation(f"{s}.order", len(middle)))
                    if any(e > 1 for _, e in stage.reduced):
                        # where the inner reduction tiles go: below every middle loop ("split", the
                        # multi-level tiling) or each right below its outer tile ("whole": the
                        # reductions keep S.order's order, in the identity order the block's)
                        self._add(Categorical(f"{s}.reductions", ("split", "whole")))
                vectors = [a for a, e in stage.spatial if e > 1]
                if vectors:
                    self._add(Categorical(f"{s}.vector", tuple(vectors)))
                if any(e > 1 for _, e in stage.reduced) and vectors:
                    # a fourth spatial level: one axis's middle tile below the inner reductions, above the
                    # register tile (S0 R0 S1 R1 Sm S2, MetaSchedule's SSRSRS): one step's loads serve Sm tiles
                    self._add(Categorical(f"{s}.spatial_below", ("none", *vectors)))
                blocks = [f"{a}:{n}" for a, e in stage.spatial for n in BLOCK_TILES if e > 1 and e % n == 0 and n < e]
                if blocks and any(e > 1 for _, e in stage.reduced):
                    # cache blocking: one axis's outer tiles in blocks of n, the blocks outermost
                    self._add(Categorical(f"{s}.block", ("none", *blocks)))
                depths = [f"{a}:{n}" for a, e in stage.reduced for n in RBLOCK_DEPTHS if e % n == 0 and n < e]
                if depths and vectors:  # K blocking: blocks of a long reduction's steps, the outer loop in S.order
                    self._add(Categorical(f"{s}.rblock", ("none", *depths)))
                self._add(Discrete(f"{s}.unroll", UNROLL_LIMITS))
                self._add(Categorical(f"{s}.unroll_tile", (True, False)))
                self._add(Categorical(f"{s}.cache", ("local", "none")))
                if slab_axis(stage, self.weight_names) is not None:  # software prefetch of the next slab of data
                    self._add(Categorical(f"{s}.prefetch", PREFETCH_CHOICES))
                if prod(e for _, e in stage.spatial) < 64 and any(e > 1 for _, e in stage.reduced):
                    self._add(Categorical(f"{s}.rfactor", (False, True)))
                if (stage.lane_reduce or self.lowered.op.is_linear) and self.lane_axis(stage) is not None:
                    # partial results in vector lanes along a contiguous reduced axis (softmax over a row; in a
                    # plain operator a dot product whose every read runs along the reduction, as in a GEMV)
                    self._add(Categorical(f"{s}.lanes", (False, True)))
                    rows = tuple(r for r in LANE_ROWS if prod(e for _, e in stage.spatial) % r == 0)
                    if len(rows) > 1:  # rows of S.lanes interleaved: one stream each
                        self._add(Discrete(f"{s}.lane_rows", rows))
                if len(stage.consumers) == 1 and self.stage_named(stage.consumers[0]).kind == "reduce":
                    self._add(Categorical(f"{s}.attach", ("root", "outer")))
            elif stage.kind == "copy":
                producers = [b for b, _ in stage.reads if b in {t.name for t in self.stages}]
                # only where the inverse of its read is trusted: else TVM may write the wrong elements
                # and only where the producer has no other reader (a branching kernel's stage may have several:
                # folding one copy into the write-back would leave the others reading an unwritten buffer)
                if (
                    stage.invertible
                    and len(producers) == 1
                    and self.stage_named(producers[0]).kind == "reduce"
                    and len(self.stage_named(producers[0]).consumers) == 1
                ):
                    self._add(Categorical(f"{s}.inline", (True, False)))
            elif stage.kind == "pad":
                # materialized (a parallel, vectorized copy) or inlined (bounds checks in the reader)
                self._add(Categorical(f"{s}.inline", (False, True)))
            elif stage.elementwise:
                # a branching kernel's element-wise stage: a pass of its own, computed inside its
                # consumers (compute_inline), or folded into its producer's write-back
                choices = ["none"]
                if stage.consumers and stage.name != self.lowered.out.op.name:
                    choices.append("consumers")
                if self.inline_producer(stage) is not None:
                    choices.append("producer")
                if len(choices) > 1:
                    self._add(Categorical(f"{s}.inline", tuple(choices)))
        for tensor in self.tensors:
            if not tensor.reader or len(tensor.shape) < 1:
                continue
            t = f"layout.{tensor.name}"
            if len(tensor.shape) > 1:
                self._add(Permutation(f"{t}.perm", len(tensor.shape)))
            tiles = [f"{d}:{f}" for d, e in enumerate(tensor.shape) for f in self._layout_factors(e)]
            if tiles:
                self._add(Categorical(f"{t}.tile", ("none", *tiles)))
            reader = self.stage_named(tensor.reader) if tensor.kind != "intermediate" else None
            if reader is not None and reader.kind == "reduce" and f"{reader.name}.vector" in self.parameters:
                blocks = PACK_PLACES[2:] if f"{reader.name}.rblock" in self.parameters else ()
                self._add(Categorical(f"{t}.pack", (*PACK_PLACES[:2], *blocks)))  # where its copy runs

    def _layout_factors(self, extent: int) -> list[int]:
        """Tile factors offered for a dim: :data:`LAYOUT_FACTORS` that divide it, and the whole dim when it
        is a short vector tile of the heuristic's (28 = 16 + 8 + 4 lanes)."""
        factors = [f for f in LAYOUT_FACTORS if f > 1 and extent % f == 0]
        if extent not in factors and extent == self._vector_factor(extent):
            factors.append(extent)
        return factors

    def tensor_named(self, name: str) -> _Tensor:
        """The kernel's tensor ``name`` (an input, a weight, a stage's buffer); a LoweringError if none."""
        return named(self.tensors, name, "tensor")

    def stage_named(self, name: str) -> StageBlock:
        """The kernel's stage ``name`` (:attr:`stages`); a LoweringError if none."""
        return named(self.stages, name, "stage")

    # -- what tuners and cost models read of the space's rules (public: modules outside the class use them) --

    def lane_axis(self, stage: StageBlock) -> Axis | None:
        """The axis ``S.lanes`` keeps partial results along: ``stage``'s last reduced axis when every read
        along it is contiguous and :meth:`lane_partials` is more than 1, else ``None`` (no ``S.lanes``)."""
        last = next((a for a in reversed(stage.axes) if a.reduce), None)
        if last is None or last.gathers or stage.reduced[-1][0] != last.label:
            return None
        return None if self.lane_partials(stage) == 1 else last

    def lane_partials(self, stage: StageBlock) -> int:
        """The partial results ``S.lanes`` keeps for ``stage``: its contiguous run (:meth:`_lane_extent`) in
        vectors of the machine's width, or of half or a quarter of it (4 lanes or more); 1 if none divides."""
        return self._lane_factor(self._lane_extent(stage))

    def identity_value(self, name: str) -> Any:
        """Parameter ``name``'s value that changes nothing where one can (a factorization whole, the identity
        order, no layout tile), else its first choice: where :meth:`heuristic` starts every parameter."""
        param = self.parameters[name]
        if isinstance(param, Factorization):
            return (param.extent,) + (1,) * (param.levels - 1)
        if isinstance(param, Permutation):
            return tuple(range(param.n))
        if param.name.endswith(".tile"):
            return "none"
        return param.choices[0]

    def vector_tile(self, axis: Axis) -> int:
        """The vector tile :meth:`heuristic` gives ``axis`` as a stage's vector axis (a plain operator's short
        axis whole up to :data:`SHORT_VECTORS` vectors: :meth:`_vector_factor`); 1 where none fits."""
        return self._vector_factor(axis.extent, SHORT_VECTORS if self.lowered.op.is_linear else MAX_VECTORS)

    def vector_layouts(self, stage: StageBlock, vector: Axis, vf: int) -> dict[str, Any]:
        """The layout parameters :meth:`heuristic` sets for reduction ``stage`` vectorized along ``vector`` by
        tiles of ``vf`` (:meth:`_vector_layouts`), as entries to update a configuration with."""
        layouts: dict[str, Any] = {}
        self._vector_layouts(stage, vector, vf, layouts)
        return layouts

    def _lane_extent(self, stage: StageBlock) -> int:
        """The length of the contiguous run that lanes split: the last reduced axis, or the trailing reduced
        axes fused where every read walks them as one run (:func:`~kdsl.codegen.tvm.blocks._trailing_run`;
        a mean over H, W of 14: 196 = 49 x 4 lanes, where a row of 14 takes none)."""
        return prod(e for _, e in stage.reduced[-stage.lane_run :])

    def _lane_factor(self, extent: int) -> int:
        return next((f for f in (self.lanes, self.lanes // 2, self.lanes // 4) if f >= 4 and extent % f == 0), 1)

    def inline_producer(self, stage: StageBlock) -> str | None:
        """The reduction stage whose write-back ``stage`` (element-wise) can be folded into: the one stage
        it reads, read one element per iteration (other buffers it reads are the kernel's inputs)."""
        produced = [b for b, _ in stage.reads if b in {t.name for t in self.stages}]
        if len(produced) != 1 or produced[0] not in stage.identity_reads:
            return None
        producer = self.stage_named(produced[0])
        return producer.name if producer.kind == "reduce" and len(producer.consumers) == 1 else None

    def layout_parameters(self) -> list[str]:
        """The names of the layout parameters (ALT tunes them apart from the loop parameters)."""
        return [n for n in self.parameters if n.startswith("layout.")]

    def validate(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with tuples, checked: every parameter present with a legal value, no unknown name."""
        if not isinstance(config, Mapping):
            raise LoweringError(f"a configuration is a dict, got {type(config).__name__}")
        unknown = sorted(set(config) - set(self.parameters))
        if unknown:
            raise LoweringError(f"unknown schedule parameters {unknown}")
        missing = sorted(set(self.parameters) - set(config))
        if missing:
            raise LoweringError(f"missing schedule parameters {missing}")
        return {name: param.validate(config[name]) for name, param in self.parameters.items()}

    def random(self, rng: random.Random) -> dict[str, Any]:
        """A configuration with every parameter drawn at random, then the parameters that the others rule
        out drawn again from what they allow (:func:`~kdsl.codegen.tvm.space_rules.repair`: an ``S.block``
        that its tiles do not divide was 30-90% of random draws)."""
        return repair(self, {name: param.random(rng) for name, param in self.parameters.items()}, rng)

    def repair(self, config: Mapping[str, Any], keep: Collection[str] = ()) -> dict[str, Any]:
        """``config`` with the parameters that the others rule out moved to the nearest allowed value,
        ``keep`` untouched (:func:`~kdsl.codegen.tvm.space_rules.repair`; what tuners do to a mutation)."""
        return repair(self, config, keep=keep)

    def rejection(self, config: Mapping[str, Any]) -> str | None:
        """Why :meth:`apply` refuses ``config`` (the cheap rules first, then TVM's primitives), or ``None``
        when it applies: the check a tuner runs before it proposes a configuration for measuring. Verdicts are
        kept (:attr:`verdicts`): the driver's check of a proposal the tuner checked applies nothing again."""
        try:
            config = self.validate(config)
        except LoweringError as error:
            return str(error)
        key = config_key(config)
        if key not in self.verdicts:
            try:
                broken = conflicts(self, config)
                if not broken:
                    self.apply(config)
                self.verdicts[key] = broken[0] if broken else None
            except LoweringError as error:
                self.verdicts[key] = str(error)
        return self.verdicts[key]

    def family(self, config: Mapping[str, Any]) -> str:
        """The structure of a configuration (its non-factor choices): outputs are checked once per family."""
        return config_key({k: v for k, v in config.items() if ".tile." not in k and not k.endswith(".tile")})

    # -- the heuristic configuration (the default schedule) ------------------------------------------

    def heuristic(self) -> dict[str, Any]:
        """The rule-based configuration that :func:`~kdsl.codegen.tvm.default_schedule.default_schedule`
        applies: a register-tiled micro-kernel per reduction stage, the shape that the hand schedules in
        ``TVM.md`` use to match PyTorch, chosen from the stage's block analysis (never its name).

        * *The vector axis* (:meth:`_vector_axis`): a spatial axis along which every data read is
          contiguous or a broadcast, tiled by one or two whole vectors (a divisor: no predicates).
        * *The register axis* (:meth:`_register_axis`): another spatial axis (a data axis if possible),
          tiled by the largest divisor that keeps at most ``accumulators`` vectors live (the machine's
          register file); in a branching kernel, none where the vector tile is a ragged short axis
          (28 = 16 + 8 + 4 lanes) under a rolled reduction (the tile's rows would start off vector
          boundaries and stay in memory).
        * Reductions stay outside the tile in the block's order (``S.reductions = "whole"``), windows of
          at most :data:`UNROLL_REDUCTION` unrolled into straight-line FMAs where they are (a longer
          reduction after them stays inside them: syno_op1 at conv5_x, whose ``c`` of 8 follows the
          unrolled ``kh, kw``, ran 15-20% slower with ``c`` moved outside them, N=8); a stage's one long
          reduction with no window (a matmul's ``K``) gets :data:`UNROLL_REDUCTION` steps unrolled inside its
          rolled loop, spreading the loop's own instructions over four register tiles of FMAs (matmul
          512x1024x1024, AVX-512, 2 threads beside other work: 1.09x) and, where the stage writes the
          output's rows itself, accumulates in place (a ``local`` tile lives in a workspace each tile zeroes
          and copies; in place LLVM keeps it in registers); else the accumulator is a ``local`` tile written
          back once.
        * Weights that the vector axis indexes in another dim than their last are packed once per call
          to ``[v // f, <other dims>, v % f]`` (ALT-style): one tile's weights form one contiguous block.
          So are weights it indexes in their last dim when that dim is longer than the vector tile: a
          tile's slab is then a panel of rows a whole dim apart (matmul 512x1024x1024: 1024 rows 4 KiB
          apart), which the hardware prefetcher and the TLB serve badly (AVX-512, 2 threads: 7.4 ms
          unpacked, 2.9 ms packed into panels of 32, packing included; PyTorch 2.7 ms). A compiled
          network packs them once (:mod:`kdsl.codegen.tvm.prepack`).
        * Plain operators only: a short vector axis is taken whole up to :data:`SHORT_VECTORS` vectors rather than by
          half vectors; a register tile whose preferred axes fill at most half the accumulators takes a first axis that
          fills more (:meth:`_fullest_register_tile`), and one that keeps fewer accumulators than the FMA units'
          latency needs widens past the budget within three quarters of the register file (:meth:`_cover_fma_latency`:
          250 rows are 5 x 2 vectors on AVX2, not 2 x 2); a strided convolution over data beyond L2 takes 32 lanes over
          rows of ``H`` where vectors are shorter (:meth:`_strided_rows_to_lanes`); several vectors are cut to one where
          they leave the register tile only an axis the weights index, or no row at all (:meth:`_reuse_weights`;
          the no-row case in branching kernels too: AVX2's 7x7 layers); a data input that the
          vector axis gathers from is packed with that axis's dim last (:meth:`_input_vector_last`: a depthwise
          convolution's channels on the lanes); a GEMV sums in vector lanes (:meth:`_weights_read_once`); data inputs
          larger than :data:`BLOCK_ABOVE_L2` L2 caches are cache-blocked (:meth:`_cache_block`), except in a thin
          product: where the weights fit in half of L2 and a register tile's data rows (the whole reduction) in half of
          L1, the weight-only vector axis's tiles all go to the middle loops, so each parallel task writes whole output
          rows (:meth:`_rows_whole`: Gensor's U3 2.3x faster), but not in a kernel whose inputs, weights and output all
          fit in one core's L2 while its weights exceed half of L1 (no writes to memory to save; the weight panels, each
          kept in L1, stay outermost); a thin product accumulates in place either way (``S.cache = "none"``: LLVM keeps
          the tile in registers, where a local tile lives in a workspace buffer).
        * Products of data inputs (a batched matmul): a vector axis of at most :data:`SHORT_VECTORS` whole vectors
          taken whole (:func:`~kdsl.codegen.tvm.product_tiles.whole_product_rows`).
        * Where the data that the parallel loop's outermost axis slices (a batch's operands, a cache block's rows)
          exceed the last-level cache, each task prefetches its share of the next slab (:meth:`_prefetch_next`:
          bmm 960 x 128x128 . 128x64 1.31x faster on a Zen 3, matmul 65536 x 1024 x 4096 1.02x).
        * Plain operators' window sums and means (:meth:`_streams`): the vector along their rows, ragged or not, the
          input unpacked; one read by another is computed at its reader's parallel loop (:meth:`_memory`). Where
          that row reads its input with a stride above 1 (:meth:`strided_rows`: ``x[.., 2*wo + kw]``), it is no
          TVM vector but a serial loop of any length with the window unrolled inside it and the sum in place
          (:meth:`_serial_rows`), which LLVM's loop vectorizer turns into whole loads and shuffles.
        * A copy of the result is folded into the write-back where its inverse is trusted.
        * A zero-padded copy is materialized only where a reader's vector axis runs along a padded dim (a strided
          vector's too, :meth:`padding_in_vector`):
          bounds checks inside the vector keep LLVM from vectorizing the read (syno_op1's first stage,
          which vectorizes ``W``: 0.35 ms with them, 0.05 ms without); elsewhere a check per broadcast
          scalar is cheaper than a pass over memory (conv2d 3x3, whose vector axis is ``Cout``). The phase
          form's copy (:mod:`kdsl.codegen.tvm.phases`) too: it holds ``s**dims`` shifted copies of the input,
          and its scalar pass cost more than the phase offsets it saves (ALT's T3D 38 -> 22 ms inlined)."""
        config = {name: self.identity_value(name) for name in self.parameters}
        vectors: dict[str, str] = {}
        for stage in self.stages:
            if stage.kind == "copy" and f"{stage.name}.inline" in config:
                config[f"{stage.name}.inline"] = True
            if stage.kind == "reduce" and stage.spatial:
                self._tile_reduction(stage, config, vectors)
        for stage in self.stages:
            if stage.kind == "pad":  # a pad laid out in tiles is a copy of its own (_input_reduced_tiles)
                config[f"{stage.name}.inline"] = config.get(f"layout.{stage.name}.tile", "none") == "none" and not any(
                    self.padding_in_vector(stage, self.stage_named(c), vectors.get(c)) for c in stage.consumers
                )
            if stage.elementwise and f"{stage.name}.inline" in config:
                config[f"{stage.name}.inline"] = self._elementwise_inline(stage)
        return self.validate(self.repair(config))  # a GEMV in lanes keeps no accumulator to fold a copy into

    def _tile_reduction(self, stage: StageBlock, config: dict[str, Any], vectors: dict[str, str]) -> None:
        """:meth:`heuristic`'s register-tiled micro-kernel for one reduction stage, written into ``config``
        (``vectors`` gets the stage's vector axis, which the rule for padded copies reads)."""
        s = stage.name
        vector, vf = self._vector_axis(stage)
        if f"{s}.lanes" in config and not stage.lane_reduce and self._weights_read_once(stage):
            config[f"{s}.lanes"] = True  # a GEMV: packing the weight would be a second pass for no reuse
            # 4 rows at once: 4 streams from memory and 4 sums in flight (GEMV 16384 x 8192: 30.2 -> 26.2 ms)
            if f"{s}.lane_rows" in config:
                config[f"{s}.lane_rows"] = max(r for r in self.parameters[f"{s}.lane_rows"].choices if r <= 4)
            return
        if f"{s}.lanes" in config and stage.lane_reduce and (vector is None or vector.gathers):
            config[f"{s}.lanes"] = True  # a gathered vector (stride of a row) is slower than lanes of partials
            return
        if self.strided_rows(stage, vector):
            self._serial_rows(stage, vector, config)
            return
        vf = self._reuse_weights(stage, vector, vf)
        vf = whole_product_rows(self, stage, vector, vf, SHORT_VECTORS)
        vf, rows = self._strided_rows_to_lanes(stage, vector, vf)
        if vector is not None:
            vectors[s] = vector.label
            config[f"{s}.vector"] = vector.label
            config[f"{s}.tile.{vector.label}"] = (vector.extent // vf, 1, vf)
        budget = self.accumulators // max(1, vf // self.lanes)
        rolled = any(e > UNROLL_REDUCTION for _, e in stage.reduced)
        if not self.lowered.op.is_linear and vf % self.lanes and self.lanes % vf and rolled:
            # a short axis whole that is no multiple of a vector (28 = 16 + 8 + 4 lanes) under a reduction
            # loop that stays rolled: the rows of a register tile start off vector boundaries in the local
            # accumulator, which then stays in memory and is assembled lane by lane (attention's scores at
            # 8x28x28, Wk of 28 under 14 rows of Hk and a loop over d of 16, 1 thread: 57 -> 21 ms); one
            # row only. Under unrolled windows alone LLVM keeps the rows in registers (a max pool's rows
            # share their window's loads). Plain operators keep their schedules.
            budget = 1
        if rows is not None:  # _strided_rows_to_lanes' rows, alone
            register, uf = rows, largest_divisor(rows.extent, max(1, budget))
        else:
            register, uf = self._register_axis(stage, vector, max(1, budget))
        if register is not None:
            if rows is not None:
                second, sf = None, 1
            elif self.lowered.op.is_linear:
                register, uf, second, sf = self._fullest_register_tile(stage, vector, budget, register, uf)
                register, uf, second, sf = self._cover_fma_latency(-(-vf // self.lanes), register, uf, second, sf)
            else:
                second, sf = self._register_axis(stage, vector, budget // uf, besides=register)
            config[f"{s}.tile.{register.label}"] = (register.extent // uf, 1, uf)
            if second is not None:
                # the first axis's divisors left accumulators unused (W = 14 for AVX2's budget of 4
                # rows: a tile of 2): fill them from a second axis (conv2d 3x3 at 8x256x14x14 for
                # AVX2, 2 threads: 14.7 ms with a 2 x 2-vector tile, 8.9 ms with 2 x 2 x 2 vectors); in
                # branching kernels too (their 7 changed layers at conv4_x, AVX2, Zen 3, pairs: 1.01-1.31x)
                config[f"{s}.tile.{second.label}"] = (second.extent // sf, 1, sf)
            if vector is None and f"{s}.vector" in config and config[f"{s}.vector"] == register.label:
                # no axis vectorizes: name one whose inner tile stays 1 (apply then vectorizes nothing)
                others = [a for a, e in stage.spatial if e > 1 and a != register.label]
                config[f"{s}.vector"] = others[0] if others else register.label
        windows = [e for _, e in stage.reduced if 1 < e <= UNROLL_REDUCTION]
        for axis, e in stage.reduced:
            if e > 1:
                config[f"{s}.tile.{axis}"] = (1, e) if e <= UNROLL_REDUCTION else (e, 1)
        rolled_axes = [(axis, e) for axis, e in stage.reduced if e > UNROLL_REDUCTION]
        one_long = not windows and len(rolled_axes) == 1 and rolled_axes[0][1] % UNROLL_REDUCTION == 0
        if one_long:
            # one long reduction and no window (a matmul, a 1x1 convolution): its loop body is one register
            # tile's FMAs, and the loop's own increment, compare and per-row address arithmetic take issue
            # slots beside them; UNROLL_REDUCTION steps of it unrolled inside the rolled loop amortize them
            axis, e = rolled_axes[0]
            config[f"{s}.tile.{axis}"] = (e // UNROLL_REDUCTION, UNROLL_REDUCTION)
            windows = [UNROLL_REDUCTION]
        if f"{s}.reductions" in config:
            config[f"{s}.reductions"] = "whole"
        config[f"{s}.unroll"] = next((u for u in UNROLL_LIMITS if u >= prod(windows)), UNROLL_LIMITS[-1])
        config[f"{s}.unroll"] = min(config[f"{s}.unroll"], HEURISTIC_UNROLL)
        config.update({f"{s}.unroll_tile": True, f"{s}.cache": "local"})
        if self._rows_in_output(stage, vector) and (one_long or (windows and not rolled_axes)):
            # in place where the register tile is rows of the output and the reduction is one long loop or
            # windows alone (time in place / local, Cascade Lake, one process beside other work: bmm
            # 960x128x128x64 0.83, bmm_tn 0.88, matmul 784x128x128 0.93, 512x1024x1024 0.97; Zen 3, pairs of
            # calls: depthwise 3x3 with rows of W on the lanes, 64x56x56 0.49 and ALT's DEP 128x28x28 0.51); a
            # convolution whose vector is its channels keeps its local tile (conv2d 3x3 at conv3_x: 1.07 in place)
            self._accumulate_in_place(stage, config)
        self._memory(stage, vector, vf, config)

    def _elementwise_inline(self, stage: StageBlock) -> str:
        """Where an element-wise stage goes: into its consumers when each of them reads every element
        once (recomputing it per read would multiply its cost: a Map read through a 3x3 window, a gate
        broadcast over H and W), else into its producer's write-back when that is a reduction read one
        element per iteration (a Map or Blend after a convolution costs no pass over memory), else a
        parallel, vectorized pass of its own."""
        choices = self.parameters[f"{stage.name}.inline"].choices
        size = prod(e for _, e in stage.spatial)
        readers = [self.stage_named(name) for name in stage.consumers]
        if "consumers" in choices and all(prod(e for _, e in c.spatial + c.reduced) <= size for c in readers):
            return "consumers"
        return "producer" if "producer" in choices else "none"

    def _vector_factor(self, extent: int, short: int = MAX_VECTORS) -> int:
        """The vector tile of an axis: whole vectors (at most :data:`MAX_VECTORS`), else half or quarter
        vectors, else a short axis whole (28 = 16 + 8 + 4 lanes: LLVM splits it) if it is at most ``short``
        vectors long; 1 if none fits."""
        lanes = self.lanes
        candidates = (*(m * lanes for m in range(MAX_VECTORS, 0, -1)), lanes // 2, lanes // 4)
        factor = next((f for f in candidates if f >= 4 and extent % f == 0), 1)
        if factor < lanes and extent % 4 == 0 and extent <= short * lanes:
            factor = extent
        return factor

    def _vector_axis(self, stage: StageBlock) -> tuple[Axis | None, int]:
        """The axis to vectorize and its tile: contiguous data reads first, then whole vectors, then
        weight-only axes (their data reads are broadcasts that feed a whole vector of FMAs), then the
        innermost."""
        best, best_key, best_factor = None, None, 1
        # plain operators take a short axis whole up to SHORT_VECTORS vectors rather than half vectors (a
        # depthwise row of 56 for AVX-512 or of 28 for AVX2: 3.5 vectors; 1.2x and 1.5x faster, contended)
        short = SHORT_VECTORS if self.lowered.op.is_linear else MAX_VECTORS
        streams = self._streams(stage)
        for axis in stage.axes:
            factor = self._vector_factor(axis.extent, short) if not axis.reduce and axis.extent > 1 else 1
            along_rows = axis.gathers == 0 or (
                axis.gather_stride is not None and 0 < axis.gather_stride <= MAX_GATHER_STRIDE
            )
            if streams and not axis.reduce and along_rows and factor < self.lanes:
                # a window sum's row whole, ragged or not (Gensor's P2: W = 83, prime): each element is read
                # once or twice, so a vector across rows, with the pass that packs the input for it, costs more
                # than the ragged tail of a vector along them (P2: 0.8x -> 2.1x PyTorch, P3: 0.6x -> 3.9x, contended)
                # a strided row of any length: it runs as a serial loop for LLVM (strided_rows), no TVM vector
                serial = axis.gathers > 0 and (axis.gather_stride or 0) > 1
                factor = (
                    axis.extent
                    if axis.extent > 1 and (serial or axis.extent <= RAGGED_VECTORS * self.lanes)
                    else factor
                )
            if factor == 1:
                continue
            key = (axis.gathers == 0, factor >= self.lanes, axis.weight_only, axis.index)
            if not self.lowered.op.is_linear or streams:
                # a branching kernel's stage (plain operators keep their schedules): a short constant stride
                # along the last dim (a max pool's Stride of 2: 0.87 -> 0.3-0.5 ms at 64x112x112) beats a
                # gather across rows, whatever its vector width
                strided = axis.gather_stride is not None and 0 < axis.gather_stride <= MAX_GATHER_STRIDE
                key = (axis.gathers == 0, strided, *key[1:])
            if best_key is None or key > best_key:
                best, best_key, best_factor = axis, key, factor
        return best, best_factor

    def _streams(self, stage: StageBlock) -> bool:
        """Whether ``stage`` is a plain operator's reduction that reads no weight: a window sum or mean (average
        pooling), which adds each input element into a few outputs at most and shares no operand between
        them. Its time is its passes over memory, not its arithmetic: its vector runs along the rows it reads
        (contiguous, or a short constant stride), so its input is read as it lies, without a packing pass."""
        weights = {w.name for w in self.lowered.weights}
        return self.lowered.op.is_linear and stage.kind == "reduce" and not any(b in weights for b, _ in stage.reads)

    def strided_rows(self, stage: StageBlock, vector: Axis | None) -> bool:
        """Whether the heuristic leaves ``stage``'s vector axis ``vector`` to LLVM's loop vectorizer
        (:meth:`_serial_rows`): a window sum or mean (:meth:`_streams`) whose vector axis reads its input with
        a constant stride above 1 (a pooling window's stride: ``x[.., 2*wo + kw]``). TVM emits such a vector as a
        strided ramp that LLVM's code generator loads lane by lane (a scalar load and an insert per lane); a
        serial loop over the axis with the window unrolled inside it is vectorized by LLVM's loop vectorizer,
        which loads the interleaved elements as whole vectors and shuffles them apart."""
        if vector is None or not self._streams(stage) or not vector.gathers:
            return False
        return vector.gather_stride is not None and vector.gather_stride > 1

    def _serial_rows(self, stage: StageBlock, vector: Axis, config: dict[str, Any]) -> None:
        """:meth:`heuristic`'s schedule for a stage with strided rows (:meth:`strided_rows`): the other
        spatial axes fused and parallel, the vector axis one serial middle loop (its tile ``(1, extent, 1)``:
        no TVM vector), the window loops inside it unrolled (all of them up to :data:`HEURISTIC_UNROLL`
        iterations), the sum kept in place (a local accumulator of one element per output ran 1.2x slower).
        MetaSchedule's best schedule for Gensor's P1 is this nest; the heuristic's strided 16-lane ramp was
        3.9x slower than it (16x48x48x48, K=2, AVX-512, 2 contended threads)."""
        s = stage.name
        config[f"{s}.vector"] = vector.label
        config[f"{s}.tile.{vector.label}"] = (1, vector.extent, 1)
        # the whole window unrolled where it fits the heuristic's bound (5x5 too: LLVM vectorizes innermost loops
        # only, and a rolled window loop inside the row would be the innermost one), else the short loops only
        whole = prod(e for _, e in stage.reduced) <= HEURISTIC_UNROLL
        windows = {axis: e for axis, e in stage.reduced if e > 1 and (whole or e <= UNROLL_REDUCTION)}
        for axis, e in stage.reduced:
            if e > 1:
                config[f"{s}.tile.{axis}"] = (1, e) if axis in windows else (e, 1)
        if f"{s}.reductions" in config:
            config[f"{s}.reductions"] = "whole"  # in the block's order: after the spatial axes, inside the row
        config[f"{s}.unroll"] = min(
            next((u for u in UNROLL_LIMITS if u >= prod(windows.values())), UNROLL_LIMITS[-1]), HEURISTIC_UNROLL
        )
        config[f"{s}.cache"] = "none"
        self._memory(stage, None, 1, config)

    def _weights_read_once(self, stage: StageBlock) -> bool:
        """Whether every weight element is read once per call: no spatial axis longer than 1 leaves the
        weights unindexed (a GEMV, ``linear`` with one row). Its register tile would reuse nothing and a
        packed weight costs a pass over it; partial sums in vector lanes along the contiguous reduction
        read each weight row once (``linear`` 1x4096x4096, AVX-512, 2 contended threads: 119 -> 32 ms)."""
        weights = {w.name for w in self.lowered.weights}
        indexed = {i for buffer, dims in stage.reads if buffer in weights for used in dims for i in used}
        return bool(indexed) and all(a.extent == 1 or a.index in indexed for a in stage.axes if not a.reduce)

    def padding_in_vector(self, pad: StageBlock, reader: StageBlock, vector: str | None) -> bool:
        """Whether ``reader``'s vector axis ``vector`` (a label, or ``None``) indexes a padded dim of ``pad``:
        inlined, the zero-padded copy's bounds checks would sit inside the vector."""
        if vector is None:
            return False
        # a strided vector (a max pool's Stride of 2) too: its bounds checks select lane by lane, which cost more
        # than a pass that pads the input (ResNet-18's stem pool, 64x112x112, Cascade Lake, contended: 1 thread
        # 1.7x, 2 threads 2.0x faster padded; an earlier measurement, 1 thread, had the checks 1.3x faster)
        i = reader.axis(vector).index
        return any(name == pad.name and any(i in dims[d] for d in pad.padded) for name, dims in reader.reads)

    # -- application --------------------------------------------------------------------------------

    def apply(
        self, config: Mapping[str, Any], *, fallback: bool = False, report: list[tuple[str, str]] | None = None
    ) -> Any:
        """The ``s_tir.Schedule`` of ``config``; :class:`LoweringError` with TVM's reason if it is invalid.

        With ``fallback``, a stage whose part of the configuration fails instead gets the plain parallel
        schedule (or stays as lowered if even that fails): a schedule never changes what a stage computes,
        so a fallback is only slower. ``report``, when given, receives ``(stage, what it got)``."""
        config = self.validate(config)
        applier = _Applier(self, self.tvm.s_tir.Schedule(self.lowered.module()), config, fallback)
        try:
            applier.run()
            sch = applier.sch
            if applier.prefetches:  # statements no schedule primitive places: inserted into the module
                sch, notes = insert_prefetches(sch, applier.prefetches)
                applier.report += [(plan.stage, note) for plan, note in zip(applier.prefetches, notes)]
        except LoweringError:
            raise
        except Exception as error:  # a schedule primitive refused: the configuration is invalid
            raise LoweringError(f"invalid schedule: {error_reason(error)}") from None
        if report is not None:
            report.extend(applier.report)
        return sch


# ------------------------------------------------------------------------------------------------
# Helpers for the tuners
# ------------------------------------------------------------------------------------------------


def neighbours(space: ScheduleSpace, config: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every configuration one parameter step away from ``config``."""
    for name, param in space.parameters.items():
        for value in param.neighbours(config[name]):
            yield {**config, name: value}
