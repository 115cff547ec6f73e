"""Semantic fingerprints: one hash per *function family*, so that search stores an operator once
however its weights are parametrized.

A linear operator with weights ``w`` computes ``y = M(w) x`` for a matrix ``M(w)`` (outputs by
inputs, the batch dim aside) whose entries are polynomials in the weights: sums of products of
weight entries, one factor per weight, each term also a constant from zero padding and repeated
dims. Learning trains ``w``, so what an operator *is* to a user is its family ``{M(w) : w}``. A
re-parametrization (``w = P(w')`` onto the same family) changes the DSL text and the canonical hash
but not the family: a Split the weight absorbs (``Split(Cin, G)`` vs ``Split(Cin, Cin/G)`` with one
weight over both parts), a window over a weight-only dim that is then reduced (its weight entries
add up to one free entry per offset), a Shift on a dim a weight contracts (a permuted weight), an
Expand then reduced (a constant factor).

The fingerprint records two properties of the family itself, found from the reference interpreter
(:mod:`kdsl.codegen.reference`) on one small layer:

1. **The equality pattern** of ``M``: which entries are identically zero on the family, and which
   pairs of entries are identically equal (the same polynomial in the weights). Both are statements
   about the set ``{M(w)}``, so a surjective re-parametrization keeps them. For random weights two
   different polynomials take different values (with probability one), so one evaluation decides:
   we call two entries equal when they agree to 1e-11 of the largest entry (equal entries are
   computed alike, so they agree to the last bits or nearly; two different entries of one draw land
   within 1e-11 of each other with a probability near 1e-11 per pair). ``M`` comes from one run
   whose batch dim holds every unit input (the identity), so the pattern covers every (output,
   input) pair. Entries are labelled in the spec's dim order (which every operator of a space
   shares) by their class's first occurrence.
2. **The family's dimension** (the rank of the weight
   Jacobian at a random point, from random directional derivatives, which the multilinear structure
   gives exactly: the derivative along ``v`` is the sum over weights of ``M`` with that weight
   replaced by ``v``). It is what the pattern cannot see: a rank-one product ``w2[o] * w1[i]`` has
   all entries distinct, like a full ``w[o, i]``, but its family has dimension ``|o| + |i| - 1``,
   not ``|o| * |i|``. To save runs, an operator with one weight takes the number of nonzero classes
   as its dimension (exact when each entry is one weight entry, or a sum over weight entries no
   other entry uses, which is what its views make); only operators with two or more weights are
   probed, on a tinier layer (:data:`RANK_LAYERS`), and search probes one only when another family
   has its pattern (:class:`Families`).

What it can confuse (false duplicates): families that differ only where the pattern and the
dimension agree (entries related by linear relations beyond equality, e.g. ``a, b, a + b`` vs ``a,
b, c``, which a single weight's windows can make), and operators that coincide on the small layer
but not on real ones (sizes chosen small: :data:`SMALL_LAYERS`, the first that binds; coefficients
``K=3, G=2, s=2, others 2``; ``G = s`` there, so operators that differ only by exchanging G and s
collide, and so may ones whose extents coincide at these sizes). Scale is ignored (entries ``C *
w`` and ``w`` share a pattern), on purpose: a learned weight absorbs a constant. It does not
confuse re-parametrizations for different families, except through rounding (two entries within
1e-11 relative of a rounding boundary: negligible) and through a twin bound on another rank layer
(a false distinct, never a false duplicate). Branching kernels
(:class:`kdsl.lang.operator.Operator`) are not linear: they get no fingerprint (None), nor do operators
no small layer binds.

**Spatial rolls and flips.** A convolutional network is translation-equivariant: rolling an
operator's output cyclically along H or W (or flipping it) only moves the seam, so such an
operator is the same design (the gallery's ``grouped_conv2d_shifted_window`` is ``grouped_conv2d``
with its output rolled by 2 along W). The pattern is therefore taken *modulo* the rolls and flips
of the output's spatial dims (:data:`SPATIAL`): of the patterns of every rolled and flipped output,
relabelled by first occurrence, the least one is hashed (:func:`canonical_pattern`). The family's
dimension does not change under a permutation of outputs. A Shift inside the operator (of the
input, or of a window) is *not* folded: it changes what is computed near the image's border.

>>> from kdsl.lang import library
>>> fingerprint(library.load("conv2d")) == fingerprint(library.load("conv2d"))
True
>>> fingerprint(library.load("conv2d")) == fingerprint(library.load("pointwise_conv2d"))
False
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from kdsl.codegen import reference
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator
from kdsl.lang.parser import parse

__all__ = [
    "EQUAL_CHANNEL_LAYERS",
    "SPATIAL",
    "canonical_pattern",
    "output_transforms",
    "EQUAL_CHANNEL_RANK_LAYERS",
    "Families",
    "PAIR_LAYERS",
    "RANK_LAYERS",
    "duplicates",
    "SMALL_LAYERS",
    "family_rank",
    "fingerprint",
    "pattern",
    "pair_rank",
    "pattern_key",
    "rank_of",
]

#: Small layers to evaluate on, tried in order until one binds. Primaries not named take 4,
#: coefficients not named 2; the batch dim is set to the input's size (the identity batch).
SMALL_LAYERS: tuple[dict[str, int], ...] = (
    {"Cin": 4, "Cout": 8, "H": 4, "W": 4, "M": 4, "K": 3, "G": 2, "s": 2},
    {"Cin": 8, "Cout": 12, "H": 4, "W": 4, "M": 4, "K": 3, "G": 2, "s": 2},
    {"Cin": 12, "Cout": 8, "H": 6, "W": 6, "M": 6, "K": 3, "G": 2, "s": 2},
)
#: Tinier layers for the rank probe of operators with several weights (one probe is one run per
#: weight, and a family needs about as many probes as its dimension).
RANK_LAYERS: tuple[dict[str, int], ...] = (
    {"Cin": 2, "Cout": 3, "H": 4, "W": 4, "M": 4, "K": 3, "G": 2, "s": 2},
    {"Cin": 4, "Cout": 4, "H": 4, "W": 4, "M": 4, "K": 3, "G": 2, "s": 2},
    {"Cin": 8, "Cout": 8, "H": 4, "W": 4, "M": 4, "K": 3, "G": 2, "s": 2},
)
#: Layers for :func:`pair_rank`: at least 4 input channels, so that with G = 2 the first two
#: channels are one group when groups take blocks and two when they take every G-th channel.
PAIR_LAYERS: tuple[dict[str, int], ...] = (
    {"Cin": 4, "Cout": 4, "H": 4, "W": 4, "M": 4, "K": 3, "G": 2, "s": 2},
    {"Cin": 8, "Cout": 8, "H": 4, "W": 4, "M": 4, "K": 3, "G": 2, "s": 2},
)
#: Layers with ``Cout = Cin`` (and their rank layers), for the families of a space whose every
#: layer has it: there a Cin -> Cin operator can re-parametrize a Cin -> Cout one, and two Cin -> Cout
#: operators that differ by exchanging Cin and Cout compute the same maps. Larger than
#: :data:`SMALL_LAYERS` and with ``G != s``, so that fewer extents coincide (at Cin = Cout = 4, G =
#: s = 2 many do, and operators that differ on every real layer collide).
EQUAL_CHANNEL_LAYERS: tuple[dict[str, int], ...] = (
    {"Cin": 16, "Cout": 16, "H": 4, "W": 4, "M": 4, "K": 3, "G": 4, "s": 2},
    {"Cin": 24, "Cout": 24, "H": 6, "W": 6, "M": 6, "K": 3, "G": 4, "s": 2},
)
EQUAL_CHANNEL_RANK_LAYERS: tuple[dict[str, int], ...] = (
    {"Cin": 8, "Cout": 8, "H": 4, "W": 4, "M": 4, "K": 3, "G": 4, "s": 2},
    {"Cin": 16, "Cout": 16, "H": 4, "W": 4, "M": 4, "K": 3, "G": 4, "s": 2},
)
#: The names a batch dim may have (the specs' ``batch``).
BATCH = ("N", "M")
#: The output dims along which a roll or flip is the same design (see the module docstring).
SPATIAL = ("H", "W")
#: Relative rounding before comparing entries.
TOLERANCE = 1e-11
#: The most directional derivatives a rank probe takes (bigger families are reported as this).
MAX_RANK = 192


def fingerprint(
    op: object,
    batch: Collection[str] = BATCH,
    layers: Sequence[Mapping[str, int]] = SMALL_LAYERS,
    rank_layers: Sequence[Mapping[str, int]] = RANK_LAYERS,
) -> str | None:
    """A hash of ``op``'s function family: its pattern key and its dimension, ``"<16 hex>:<rank>"``;
    equal for re-parametrizations of one family (see the module docstring); None for a branching
    kernel, an operator without a batch dim among ``batch``, or one no small layer binds."""
    key = pattern_key(op, batch, layers)
    if key is None:
        return None
    rank = key[1] if key[1] is not None else rank_of(op, batch, rank_layers)  # type: ignore[arg-type]
    return None if rank is None else f"{key[0]}:{rank}"


def pattern_key(
    op: object, batch: Collection[str] = BATCH, layers: Sequence[Mapping[str, int]] = SMALL_LAYERS
) -> tuple[str, int | None] | None:
    """The cheap half of the fingerprint (one reference run): the equality pattern's hash, and
    the family's dimension when it comes free (one weight or none), else None (then
    :func:`rank_of` probes it: search asks only when another family has the same pattern)."""
    if not isinstance(op, Operator) or not op.is_linear:
        return None
    name = _batch(op, batch)
    if name is None:
        return None
    for base in layers:
        try:
            layer = _layer(op, base, name)
            labels = pattern(op, layer, name)
            canonical = canonical_pattern(labels, output_axes(op, layer, name))
        except KdslError:
            continue
        return _digest(canonical), (family_rank(op, layer, name, labels) if len(op.weights) <= 1 else None)
    return None


def _digest(labels: np.ndarray) -> str:
    return hashlib.sha256(labels.tobytes() + f"|{labels.shape}".encode()).hexdigest()[:16]


def output_axes(op: Operator, layer: Mapping[str, int], batch: str) -> list[tuple[str, int]]:
    """The ``(name, size)`` of each output dim but the batch, in the order of the rows of the
    pattern (:func:`pattern`)."""
    sizes = reference.shapes(op, layer).output
    return [(d.name, n) for d, n in zip(op.outputs, sizes) if d.name != batch]


def _relabel(labels: np.ndarray) -> np.ndarray:
    """``labels`` with its nonzero classes renumbered 1, 2, ... in order of first occurrence."""
    flat = labels.ravel()
    values, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(np.where(values == 0, -1, first)))  # 0 keeps rank 0 when present
    if values[0] != 0:
        rank = rank + 1
    return rank[inverse.ravel()].reshape(labels.shape).astype(np.int64)


def output_transforms(axes: Sequence[tuple[str, int]]) -> list[tuple[tuple[int, ...], tuple[bool, ...]]]:
    """Every roll and flip of the spatial axes among ``axes`` (see :data:`SPATIAL`): pairs of the
    roll of each spatial axis and whether it is flipped, the identity first.

    >>> output_transforms([("Cout", 8), ("W", 2)])
    [((0,), (False,)), ((0,), (True,)), ((1,), (False,)), ((1,), (True,))]
    """
    spatial = [n for name, n in axes if name in SPATIAL]
    rolls: list[tuple[int, ...]] = [()]
    flips: list[tuple[bool, ...]] = [()]
    for n in spatial:
        rolls = [(*r, k) for r in rolls for k in range(n)]
        flips = [(*f, b) for f in flips for b in (False, True)]
    return [(r, f) for r in rolls for f in flips]


def transformed(
    labels: np.ndarray, axes: Sequence[tuple[str, int]], roll: Sequence[int], flip: Sequence[bool]
) -> np.ndarray:
    """The pattern of the operator whose output is this one's flipped (where ``flip``) and then
    rolled by ``roll`` (``out'[i] = out[(i - r) mod n]``) along each spatial axis, relabelled."""
    grid = labels.reshape(*(n for _, n in axes), labels.shape[-1])
    spatial = [i for i, (name, _) in enumerate(axes) if name in SPATIAL]
    for axis, r, f in zip(spatial, roll, flip):
        if f:
            grid = np.flip(grid, axis=axis)
        if r:
            grid = np.roll(grid, r, axis=axis)
    return _relabel(np.ascontiguousarray(grid).reshape(labels.shape))


def canonical_pattern(labels: np.ndarray, axes: Sequence[tuple[str, int]]) -> np.ndarray:
    """The least (by bytes) of the patterns of every roll and flip of the output (see the module
    docstring): equal for two operators whose outputs differ by a roll or flip along H or W.

    >>> labels = np.array([[1], [2], [3], [0]])  # one input, outputs W = 0..3
    >>> rolled = np.array([[3], [0], [1], [2]])  # the same output rolled by 2
    >>> bool((canonical_pattern(labels, [("W", 4)]) == canonical_pattern(rolled, [("W", 4)])).all())
    True
    """
    best = _relabel(labels)
    best_bytes = best.tobytes()
    for roll, flip in output_transforms(axes)[1:]:  # the first is the identity
        candidate = transformed(labels, axes, roll, flip)
        data = candidate.tobytes()
        if data < best_bytes:
            best, best_bytes = candidate, data
    return best


def rank_of(
    op: Operator, batch: Collection[str] = BATCH, layers: Sequence[Mapping[str, int]] = RANK_LAYERS
) -> int | None:
    """The family's dimension (see :func:`family_rank`) on the first of :data:`RANK_LAYERS` that
    binds; None if none does."""
    name = _batch(op, batch)
    if name is None:
        return None
    for tiny in layers:
        try:
            return family_rank(op, _layer(op, tiny, name), name)
        except KdslError:
            continue
    return None


def pair_rank(
    op: Operator, batch: Collection[str] = BATCH, layers: Sequence[Mapping[str, int]] = PAIR_LAYERS
) -> int | None:
    """The dimension of the family's columns of the first two input channels, on the first of
    :data:`PAIR_LAYERS` that binds (None where none does, or the input has no channel dim).

    The pattern and the family's dimension cannot tell apart two operators that differ by a
    permutation of their input channels when every output reads every input (Syno's operator 2
    with its channel groups taking blocks or every G-th channel: dense ``M`` either way, families of
    one dimension), yet the families differ on real layers: which channels share a group's weights
    is what the design is. Two channels of one group span fewer directions than two of different
    groups, so the dimension of the family restricted to those two input channels tells them apart;
    a re-parametrization keeps the family, hence every such dimension, so it never splits one.

    >>> from kdsl.lang import library
    >>> grouped = library.load("grouped_conv2d").with_defaults(G=2)
    >>> pair_rank(grouped) < pair_rank(library.load("conv2d"))
    True
    """
    name = _batch(op, batch)
    if name is None:
        return None
    channel = next((d.name for d in op.inputs if d.name != name and d.name not in SPATIAL), None)
    if channel is None:
        return None
    for tiny in layers:
        try:
            return family_rank(op, _layer(op, tiny, name), name, channels=(channel, 2))
        except KdslError:
            continue
    return None


def _batch(op: Operator, batch: Collection[str]) -> str | None:
    outputs = {d.name for d in op.outputs}
    return next((d.name for d in op.inputs if d.name in batch and d.name in outputs), None)


def _layer(op: Operator, base: Mapping[str, int], batch: str) -> dict[str, int]:
    layer: dict[str, int] = {}
    for var in op.variables:
        layer[var.name] = base.get(var.name, 4 if var.kind != "coefficient" else 2)
    layer[batch] = 1
    shape = reference.shapes(op, layer).input
    layer[batch] = int(np.prod(shape))
    return layer


def _identity(op: Operator, layer: Mapping[str, int], batch: str) -> tuple[np.ndarray, int]:
    shape = reference.shapes(op, layer).input
    axis = [d.name for d in op.inputs].index(batch)
    n = layer[batch]
    rest = shape[:axis] + shape[axis + 1 :]
    x = np.moveaxis(np.eye(n).reshape((n, *rest)), 0, axis)
    return np.ascontiguousarray(x), axis


def _matrix(op: Operator, layer: Mapping[str, int], batch: str, x: np.ndarray, weights: Sequence) -> np.ndarray:
    """``M(w)``: outputs (spec order, batch aside) by inputs."""
    y = reference.run(op, layer, x, list(weights))
    axis = [d.name for d in op.outputs].index(batch)
    y = np.moveaxis(y, axis, -1)
    return y.reshape(-1, layer[batch])


def pattern(op: Operator, layer: Mapping[str, int], batch: str) -> np.ndarray:
    """The equality pattern of ``M(w)`` at ``layer``: an int label per entry, 0 for entries zero
    on the family, else 1 + the index of its class in order of first occurrence."""
    x, _ = _identity(op, layer, batch)
    shapes = reference.shapes(op, layer).weights
    rng = np.random.default_rng(1)
    m = _matrix(op, layer, batch, x, [rng.standard_normal(shape) for shape in shapes])
    scale = float(np.max(np.abs(m))) or 1.0
    values = np.round(m.ravel() / scale / TOLERANCE)
    _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))  # classes relabelled by first occurrence
    labels = order[inverse.ravel()] + 1
    labels[values == 0] = 0
    return labels.reshape(m.shape).astype(np.int64)


def family_rank(
    op: Operator,
    layer: Mapping[str, int],
    batch: str,
    labels: np.ndarray | None = None,
    channels: tuple[str, int] | None = None,
) -> int:
    """The family's dimension: with one weight (or none) the number of nonzero classes of
    ``labels``; with more, the rank of the weight Jacobian at a random point, probed along random
    directions until the rank stops growing (at most :data:`MAX_RANK`). With ``channels = (dim,
    n)``: the dimension of the family's columns of the first ``n`` entries of the input dim ``dim``
    (every other input entry held at zero), see :func:`pair_rank`."""
    if len(op.weights) <= 1 and labels is not None and channels is None:
        return len(np.unique(labels[labels > 0]))
    one = dict(layer) | {batch: 1}
    params = sum(int(np.prod(shape)) for shape in reference.shapes(op, one).weights)
    per_sample = int(np.prod(reference.shapes(op, one).output))
    # enough samples that the outputs can hold every direction the weights have (twice over)
    layer = dict(layer) | {batch: max(1, min(layer[batch], -(-2 * params // per_sample)))}
    shapes = reference.shapes(op, layer)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shapes.input)
    if channels is not None:
        dim, count = channels
        axis = [d.name for d in op.inputs].index(dim)
        kept = np.zeros(x.shape[axis])
        kept[:count] = 1.0
        x = x * kept.reshape([-1 if i == axis else 1 for i in range(x.ndim)])
    point = [rng.standard_normal(shape) for shape in shapes.weights]
    columns: list[np.ndarray] = []
    rank = 0
    while len(columns) < min(params, MAX_RANK):
        for _ in range(8):
            derivative = 0.0
            for k, shape in enumerate(shapes.weights):
                weights = list(point)
                weights[k] = rng.standard_normal(shape)
                derivative = derivative + reference.run(op, layer, x, weights).ravel()
            columns.append(np.asarray(derivative))
        rank = int(np.linalg.matrix_rank(np.stack(columns, axis=1)))
        if rank < len(columns):
            break
    return min(rank, MAX_RANK)


def coefficient_tag(op: object) -> str:
    """The coefficient values an operator is a candidate at, as a suffix of its family's name
    (``""`` when it has none).

    >>> from kdsl.lang import library
    >>> coefficient_tag(library.load("grouped_conv2d").with_defaults(G=2)), coefficient_tag(library.load("matmul"))
    ('|G=2,K=3', '')
    """
    values = getattr(op, "coefficient_values", ())
    return "|" + ",".join(f"{k}={v}" for k, v in values) if values else ""


class Families:
    """The function families a search has stored, for dedupe at insertion: ``store`` (a
    :class:`kdsl.search.store.Store` or None) holds those of earlier calls, this object those of
    this call. The rank of an operator with several weights is probed only when another family
    has its pattern (the expensive half, paid on a pattern collision only); a stored operator
    whose rank was not needed then is read back from its DSL text when it is.

    >>> from kdsl.lang import library
    >>> families = Families(None)
    >>> families.classify("a", library.load("conv2d"))[2], families.classify("b", library.load("conv2d"))[2]
    (None, 'a')
    """

    def __init__(self, store: Any, batch: Collection[str] = BATCH) -> None:
        self.store = store
        self.batch = tuple(batch)
        self.known: dict[str, list[list[Any]]] = {}  # pattern -> [key, rank or None, op or DSL text]

    def lookup(self, op: object) -> tuple[str | None, int | None, str | None]:
        """``(pattern, rank, duplicate_of)``: ``duplicate_of`` is the key of a known operator of
        ``op``'s family, else None; ``pattern`` is None when ``op`` has no fingerprint, ``rank``
        None when it was not needed."""
        found = pattern_key(op, self.batch)
        if found is None:
            return None, None, None
        pattern, rank = found
        # the pattern is taken at the small layers' coefficient values; a candidate is a design at
        # its own values (grouped conv at G = 2 and at G = 4 are two), so those join the family's name
        pattern += coefficient_tag(op)
        members = self.known.get(pattern)
        if members is None:
            stored = self.store.families(pattern) if self.store is not None else []
            members = self.known[pattern] = [[k, r, dsl] for k, r, dsl in stored]
        if members and rank is None:
            rank = rank_of(op, self.batch)  # type: ignore[arg-type]
        mine: list[int | None] = []  # op's pair rank, probed on the first equal-rank member
        for member in members:
            if member[1] is None:
                member[1] = self._rank(member[2])
            if member[1] != rank:
                continue
            # pattern and rank agree: a permutation of input channels can still tell them apart
            if not mine:
                mine.append(pair_rank(op, self.batch))  # type: ignore[arg-type]
            if len(member) < 4:
                member.append(self._pair_rank(member[2]))
            if member[3] == mine[0]:
                return pattern, rank, member[0]
        return pattern, rank, None

    def add(self, key: str, pattern: str, rank: int | None, op: object) -> None:
        """Make ``op`` (found by :meth:`lookup` to have no known family) a known family."""
        self.known.setdefault(pattern, []).append([key, rank, op])

    def _pair_rank(self, op_or_text: Any) -> int | None:
        try:
            op = parse(op_or_text) if isinstance(op_or_text, str) else op_or_text
        except KdslError:
            return None
        return pair_rank(op, self.batch) if isinstance(op, Operator) and op.is_linear else None

    def classify(self, key: str, op: object) -> tuple[str | None, int | None, str | None]:
        """:meth:`lookup`, and :meth:`add` when the family is new."""
        pattern, rank, duplicate_of = self.lookup(op)
        if pattern is not None and duplicate_of is None:
            self.add(key, pattern, rank, op)
        return pattern, rank, duplicate_of

    def _rank(self, op_or_text: Any) -> int | None:
        try:
            op = parse(op_or_text) if isinstance(op_or_text, str) else op_or_text
        except KdslError:
            return None
        if not isinstance(op, Operator) or not op.is_linear:
            return None
        found = pattern_key(op, self.batch)
        if found is not None and found[1] is not None:
            return found[1]
        return rank_of(op, self.batch)


def duplicates(
    texts: Sequence[str],
    batch: Collection[str] = BATCH,
    layers: Sequence[Mapping[str, int]] = SMALL_LAYERS,
    rank_layers: Sequence[Mapping[str, int]] = RANK_LAYERS,
) -> tuple[int, int]:
    """``(operators, families)`` among DSL ``texts`` by the full :func:`fingerprint` (pattern and
    rank for every operator, whatever search skipped); an operator without a fingerprint counts
    as its own family. ``operators - families`` are re-parametrizations of another. ``layers`` and
    ``rank_layers``: where the fingerprints are taken (:data:`EQUAL_CHANNEL_LAYERS` for families
    equal where ``Cout = Cin``, as on ResNet's stage convolutions).

    >>> from kdsl.lang import library
    >>> duplicates([library.load("conv2d").to_dsl()] * 2 + [library.load("pointwise_conv2d").to_dsl()])
    (3, 2)
    """
    by_fingerprint: dict[str, list[Any]] = {}
    for i, text in enumerate(texts):
        try:
            op = parse(text)
            found = fingerprint(op, batch, layers, rank_layers)
        except KdslError:
            op, found = None, None
        by_fingerprint.setdefault(found if found is not None else f"unknown {i}", []).append(op)
    # operators that share a fingerprint are told apart by the channel-pair probe, as search's
    # dedupe does (Families): probed only where a fingerprint is shared
    families = 0
    for members in by_fingerprint.values():
        families += len({pair_rank(op, batch) for op in members}) if len(members) > 1 else 1
    return len(texts), families
