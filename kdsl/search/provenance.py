"""What a candidate *is*: its function family, and one line that says so, computed, not guessed.

Search and discover name candidates by content hash; a hash does not tell a user that a candidate
is the gallery's grouped convolution with its output rolled along W. :func:`describe` does, from two
comparisons with every gallery operator (:mod:`kdsl.lang.library`):

1. **Semantics.** The candidate's function family (:func:`kdsl.search.semantic.pattern_key`: the
   equality pattern of its matrix, taken modulo rolls and flips of the spatial output, and the
   family's dimension) against each gallery operator's. Equal families are one design up to a
   re-parametrization of the weights; then the exact (unrolled) patterns say whether the
   candidate *is* that operator or that operator with its output rolled or flipped (by how much
   in ``torch.roll``'s sense, found at the fingerprint's small layer, where W = 4: a roll by 2 and
   by -2 are one there). Failing that, the candidate with its channels relabelled the same way on
   input and output (interleaved by a group count, or the inverse) is compared: a network whose
   every convolution is such an operator is the design's network with its channels renamed (batch
   norm, activations and residual sums act per channel), so it is the design (a grouped conv that
   reads and writes its groups interleaved). Only interleavings are tried, not every permutation.
2. **Steps.** Failing that, the candidate and every gallery operator are compared the same way
   with their ``Shift`` steps removed: a gallery operator with shifts inserted, moved or removed
   is a known design, cheaply varied (a variant). Failing that too, the candidate is **new**; its
   line says what it is made of (weights, windows, groups, shifts), the rewrites that led to it
   when search recorded them (gallery neighbours), and the gallery operator nearest by steps.

Kinds: :data:`KNOWN` (a gallery operator up to re-parametrization and spatial roll or flip),
:data:`VARIANT` (a gallery operator with only its ``Shift`` steps changed), :data:`NEW`, and
:data:`UNCOMPARED` (no fingerprint: a branching kernel, or one no small layer binds; compared by
content key only). A family is the fingerprint ``pattern:rank``; coefficient values (``G = 2`` or
``4``) are not part of it (the fingerprint's layers fix them), so one design at two group counts is
one family, and the line says which values the candidate uses.

>>> from kdsl.lang import library
>>> describe(library.load("grouped_conv2d").with_defaults(G=2)).line
'is `grouped_conv2d` (G=2, K=3)'
>>> found = describe(library.load("grouped_conv2d_shifted_window"), names=["grouped_conv2d"])
>>> found.kind, found.line
('known', '`grouped_conv2d` (G=2, K=3) with its output rolled by 2 along W')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from kdsl.codegen import reference
from kdsl.lang import library
from kdsl.lang.errors import KdslError
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import Shift
from kdsl.search import semantic
from kdsl.search.neighbors import rebuilt

__all__ = ["KNOWN", "NEW", "UNCOMPARED", "VARIANT", "Provenance", "References", "describe", "without_shifts"]

KNOWN = "known"
VARIANT = "variant"
NEW = "new"
UNCOMPARED = "uncompared"


@dataclass(frozen=True)
class Provenance:
    """One candidate's provenance: ``kind`` (see the module doc), the one-line ``line``, its
    ``family`` (``pattern:rank``, or ``key:<content key>`` without a fingerprint), ``base``
    (the family of the candidate with its Shift steps removed: what discover trains once),
    ``design`` (the gallery operator it is or varies) and the ``coefficients`` it uses."""

    kind: str
    line: str
    family: str
    base: str
    design: str | None = None
    coefficients: tuple[tuple[str, int], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        fields = asdict(self)
        fields["coefficients"] = dict(self.coefficients)
        return fields


@dataclass
class _Semantics:
    """What the comparison needs of one operator: its roll-invariant pattern digest and rank (None
    until asked, for several weights), and its unrolled pattern at the layer it was taken on."""

    op: Operator
    digest: str
    rank: int | None
    layer: int
    labels: np.ndarray
    axes: list[tuple[str, int]]
    inputs: list[tuple[str, int]] = dataclasses.field(default_factory=list)

    pair: int | None = None
    pair_probed: bool = False
    #: the semantics of ``op`` with its channels relabelled (:func:`_relabelled`): its labels are
    #: the relabelled operator's, but ``op`` is not, so no probe of ``op`` speaks for it
    relabelled: bool = False

    def family_rank(self) -> int | None:
        if self.rank is None:
            self.rank = semantic.rank_of(self.op)
        return self.rank

    def pair_rank(self) -> int | None:
        """:func:`kdsl.search.semantic.pair_rank` of the operator (probed once, when asked)."""
        if not self.pair_probed:
            self.pair, self.pair_probed = semantic.pair_rank(self.op), True
        return self.pair

    @property
    def family(self) -> str:
        return f"{self.digest}:{self.family_rank()}"


def _semantics(op: object) -> _Semantics | None:
    if not isinstance(op, Operator) or not op.is_linear:
        return None
    batch = semantic._batch(op, semantic.BATCH)
    if batch is None:
        return None
    for index, base in enumerate(semantic.SMALL_LAYERS):
        try:
            layer = semantic._layer(op, base, batch)
            labels = semantic.pattern(op, layer, batch)
            axes = semantic.output_axes(op, layer, batch)
            sizes = reference.shapes(op, layer).input
        except KdslError:
            continue
        inputs = [(d.name, n) for d, n in zip(op.inputs, sizes) if d.name != batch]
        digest = semantic._digest(semantic.canonical_pattern(labels, axes))
        rank = semantic.family_rank(op, layer, batch, labels) if len(op.weights) <= 1 else None
        return _Semantics(op, f"{index}:{digest}", rank, index, labels, axes, inputs)
    return None


def _interleave(n: int, groups: int, inverse: bool) -> np.ndarray:
    """The permutation of ``n`` channels that reads them ``groups`` at a time interleaved: index
    ``i`` of the result is channel ``(i % (n/groups)) * groups + i // (n/groups)`` (or the inverse)."""
    block = n // groups
    order = np.array([(i % block) * groups + i // block for i in range(n)])
    return np.argsort(order) if inverse else order


def _relabelled(mine: _Semantics) -> list[tuple[str, _Semantics]]:
    """``mine`` with its channels relabelled by every interleaving of ``g`` groups (``g`` dividing
    both channel counts), the same on the input and the output (and its inverse): words, and the
    semantics of the relabelled operator. A network whose every convolution is the operator is,
    under one global relabelling of its channels, the network of the relabelled one (batch norm,
    activations and residual sums act per channel): the same design."""
    channels_out = [i for i, (name, _) in enumerate(mine.axes) if name not in semantic.SPATIAL]
    channels_in = [i for i, (name, _) in enumerate(mine.inputs) if name not in semantic.SPATIAL]
    if len(channels_out) != 1 or len(channels_in) != 1:
        return []
    rows = mine.labels.reshape(*(n for _, n in mine.axes), *(n for _, n in mine.inputs))
    n_out, n_in = mine.axes[channels_out[0]][1], mine.inputs[channels_in[0]][1]
    found = []
    # groups < both counts: interleaving all channels at once is no relabelling (the identity), and
    # on one side only it would compare a real permutation with none
    for groups in range(2, min(n_out, n_in)):
        if n_out % groups or n_in % groups:
            continue
        for inverse in (False, True):
            moved = np.take(rows, _interleave(n_out, groups, inverse), axis=channels_out[0])
            moved = np.take(moved, _interleave(n_in, groups, inverse), axis=len(mine.axes) + channels_in[0])
            labels = semantic._relabel(np.ascontiguousarray(moved).reshape(mine.labels.shape))
            digest = semantic._digest(semantic.canonical_pattern(labels, mine.axes))
            other = _Semantics(
                mine.op,
                f"{mine.layer}:{digest}",
                mine.rank,
                mine.layer,
                labels,
                mine.axes,
                mine.inputs,
                relabelled=True,
            )
            words = (
                f"with its channels relabelled ({'de-' if inverse else ''}interleaved by {groups} on input and output)"
            )
            found.append((words, other))
    return found


class References:
    """The gallery's operators, fingerprinted once (ranks of several-weight ones on demand).

    ``names``: the gallery operators to compare with (default: all of them); branching kernels
    and operators without a fingerprint are kept for the comparison by content key only.
    """

    def __init__(self, names: Iterable[str] | None = None) -> None:
        self.names = sorted(library.names() if names is None else names)
        self.keys: dict[str, str] = {}
        self.semantics: list[tuple[str, _Semantics]] = []
        self.bases: list[tuple[str, _Semantics]] = []  # without their Shift steps
        self.shifted: set[str] = set()  # the names of those that have Shift steps
        self.steps: dict[str, list[str]] = {}
        for name in self.names:
            op = library.load(name)
            self.keys[getattr(op, "design_key", op.key)] = name  # a design, at any coefficients
            found = _semantics(op)
            if found is None:
                continue
            self.semantics.append((name, found))
            self.steps[name] = _step_words(found.op)
            stripped = without_shifts(found.op)
            base = _semantics(stripped) if stripped is not None else found
            if base is not None:
                self.bases.append((name, base))
            if stripped is not None:
                self.shifted.add(name)

    def matches(self, mine: _Semantics, bases: bool = False) -> list[tuple[str, _Semantics]]:
        """The gallery operators of ``mine``'s family (pattern and rank); with ``bases``, those
        whose family once their Shift steps are removed is ``mine``'s."""
        pool = self.bases if bases else self.semantics
        same = [(name, other) for name, other in pool if other.digest == mine.digest]
        same = [(name, other) for name, other in same if other.family_rank() == mine.family_rank()]
        # the channel-pair probe (semantic.pair_rank) where pattern and rank cannot see a permutation
        # of the input channels; a relabelled operator has no probe of its own (its op is not it)
        return [(name, other) for name, other in same if mine.relabelled or other.pair_rank() == mine.pair_rank()]


@lru_cache(maxsize=4)
def _references(names: tuple[str, ...] | None) -> References:
    return References(names)


def without_shifts(op: Operator) -> Operator | None:
    """``op`` with every ``Shift`` step removed, or None when it has none or no longer builds.

    >>> from kdsl.lang import library
    >>> shifted = library.load("grouped_conv2d_shifted_window")
    >>> without_shifts(shifted) == library.load("grouped_conv2d").with_defaults(G=2)
    True
    """
    steps = tuple(step for step in op.steps if not isinstance(step, Shift))
    return rebuilt(op, steps) if len(steps) < len(op.steps) else None


def _named(name: str, coefficients: Sequence[tuple[str, int]]) -> str:
    values = ", ".join(f"{k}={v}" for k, v in coefficients)
    return f"`{name}`" + (f" ({values})" if values else "")


def _transform_words(mine: _Semantics, theirs: _Semantics) -> str | None:
    """How ``mine``'s output differs from ``theirs``: ``""`` when it does not, ``"with its output
    rolled by 2 along W"`` and the like, or None when no roll or flip maps one onto the other."""
    if mine.layer != theirs.layer or mine.labels.shape != theirs.labels.shape:
        return None
    target = semantic._relabel(theirs.labels)
    spatial = [(name, n) for name, n in mine.axes if name in semantic.SPATIAL]
    for roll, flip in semantic.output_transforms(mine.axes):
        if not np.array_equal(semantic.transformed(mine.labels, mine.axes, roll, flip), target):
            continue
        words = []
        for (name, n), r, f in zip(spatial, roll, flip):
            if f:
                words.append(f"flipped along {name}")
            # transformed rolled mine by r onto theirs: mine[i] = theirs[i + r], torch.roll(theirs, -r)
            shift = (-r) % n
            shift = shift - n if shift > n // 2 else shift
            if shift:
                words.append(f"rolled by {shift} along {name}")
        return "with its output " + " and ".join(words) if words else ""
    return None


def _known_relabelled(mine: _Semantics, references: References, bases: bool = False) -> tuple[str, str, str] | None:
    """``(gallery name, words, family)`` when ``mine`` with its channels relabelled alike on input and
    output is a gallery design's family (:func:`_known`; ``bases`` as there): the words say the
    relabelling (and any roll), the family is the relabelled one's."""
    for relabelling, other in _relabelled(mine):
        known = _known(other, references, bases)
        if known is not None:
            name, words = known
            return name, relabelling + (f", {words}" if words else ""), other.family
    return None


def _known(mine: _Semantics, references: References, bases: bool = False) -> tuple[str, str] | None:
    """``(gallery name, transform words)`` of the best gallery match of ``mine``'s family: an
    exact one first (same unrolled pattern), else one that a roll or flip maps onto it. With
    ``bases``: matches of the gallery operators without their Shift steps."""
    matches = references.matches(mine, bases)
    described = [(name, _transform_words(mine, other)) for name, other in matches]
    exact = [(name, words) for name, words in described if words == ""]
    rolled = [(name, words) for name, words in described if words]
    for name, words in exact + rolled:
        return name, words or ""
    return (matches[0][0], "up to a roll or flip of its output") if matches else None


def _step_words(op: Operator) -> list[str]:
    return [type(step).__name__ + "(" + ", ".join(map(str, _refs(step))) + ")" for step in op.steps]


def _refs(step: Any) -> list[str]:
    words = step.describe()
    inside = words[words.index("(") + 1 : words.rindex(")")] if "(" in words else ""
    # dims only: sizes and names of fresh dims vary between spellings of one step
    return [part.strip() for part in inside.split(",")][:1]


def _edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


#: How :func:`structure` words the views of an operator, by primitive (lower-case class name).
_VIEW_WORDS = {
    "unfold": "windows over",
    "split": "split",
    "stride": "strided",
    "shift": "shifted along",
    "expand": "expanded",
}


def structure(op: Any) -> str:
    """A short description of what ``op`` is made of: its weights, windows, groups and views.

    >>> from kdsl.lang import library
    >>> structure(library.load("grouped_conv2d"))
    '1 weight w[g, co, ci, kh, kw]; windows over H, W; Cin split; channels merged'
    """
    steps = list(op.steps) if getattr(op, "is_linear", False) else []  # a branching one has nodes
    weights = list(getattr(op, "weights", ()))
    parts = [
        f"{len(weights)} weight{'s' if len(weights) != 1 else ''} "
        + ", ".join(f"{w.name}[{', '.join(d.name for d in w.dims)}]" for w in weights)
    ]

    def dims_of(kind: str) -> list[str]:
        found: list[str] = []
        for step in steps:
            if type(step).__name__.lower() == kind:
                dim = _refs(step)[0]
                if dim and dim not in found:
                    found.append(dim)
        return found

    for kind, words in _VIEW_WORDS.items():
        dims = dims_of(kind)
        if dims and kind == "split":
            parts.append(f"{', '.join(dims)} split")
        elif dims:
            parts.append(f"{words} {', '.join(dims)}")
    if any(type(step).__name__.lower() == "merge" for step in steps):
        parts.append("channels merged")
    if not steps:  # a branching kernel: its nodes
        parts = [f"branching kernel of {len(getattr(op, 'nodes', ()))} nodes"]
    return "; ".join(parts)


def describe(
    op: Any,
    *,
    origin: Mapping[str, Any] | None = None,
    names: Iterable[str] | None = None,
    references: References | None = None,
) -> Provenance:
    """The provenance of ``op`` (see the module doc). ``origin``: what search recorded of where
    it came from (a gallery neighbour's ``{"origin": name, "rewrites": [...]}``); ``names``: the
    gallery operators to compare with (default all); ``references``: a prepared comparison."""
    refs = references or _references(tuple(sorted(names)) if names is not None else None)
    coefficients = tuple(getattr(op, "coefficient_values", ()))
    mine = _semantics(op)
    if mine is None:
        key = getattr(op, "design_key", None) or getattr(op, "key", "")  # coefficients are apart
        family = f"key:{key}"
        if key in refs.keys:
            return Provenance(KNOWN, f"is {_named(refs.keys[key], coefficients)}", family, family, refs.keys[key])
        line = f"new (not compared semantically: no fingerprint): {structure(op)}"
        return Provenance(UNCOMPARED, line, family, family, None, coefficients)
    family = mine.family
    known = _known(mine, refs)
    if known is not None:
        name, words = known
        line = ("is " if not words else "") + _named(name, coefficients) + (f" {words}" if words else "")
        return Provenance(KNOWN, line, family, family, name, coefficients)
    relabelled = _known_relabelled(mine, refs)
    if relabelled is not None:  # one design: its family is the design's (discover trains it once)
        name, words, design_family = relabelled
        return Provenance(
            KNOWN, _named(name, coefficients) + " " + words, design_family, design_family, name, coefficients
        )
    stripped = without_shifts(op)
    base_semantics = _semantics(stripped) if stripped is not None else mine
    base = base_semantics.family if base_semantics is not None else family
    known = _known(base_semantics, refs, bases=True) if base_semantics is not None else None
    if known is None and base_semantics is not None and stripped is not None:
        # shifts inserted into a gallery design whose channels are relabelled alike on input and output
        relabelled = _known_relabelled(base_semantics, refs, bases=True)
        if relabelled is not None:
            name, words, base = relabelled
            known = name, words
    if known is not None:
        name, words = known
        shifts = [f"{step.describe()} at step {i + 1}" for i, step in enumerate(op.steps) if isinstance(step, Shift)]
        if name not in refs.shifted:
            change = "with " + ", ".join(shifts)
        else:
            change = "with its Shift steps " + ("changed: " + ", ".join(shifts) if shifts else "removed")
        line = _named(name, coefficients) + (f" {words}" if words else "") + " " + change
        return Provenance(VARIANT, line, family, base, name, coefficients)
    # the coefficient values too: the same new design at G = 2 and G = 4 are two candidates
    values = ", ".join(f"{k}={v}" for k, v in coefficients)
    line = "new" + (f" ({values})" if values else "") + f": {structure(op)}"
    rewrites = list((origin or {}).get("rewrites") or [])
    if (origin or {}).get("origin") and rewrites:
        line += f"; from `{origin['origin']}` by {'; '.join(map(str, rewrites))}"  # type: ignore[index]
    else:
        words = _step_words(op)
        nearest = min(refs.steps, key=lambda name: (_edit_distance(words, refs.steps[name]), name), default=None)
        if nearest is not None:
            line += (
                f"; nearest gallery design by steps: `{nearest}` ({_edit_distance(words, refs.steps[nearest])} edits)"
            )
    return Provenance(NEW, line, family, base, None, coefficients)
