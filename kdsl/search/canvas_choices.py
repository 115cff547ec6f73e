"""What each of Canvas's primitive kinds offers at a tensor of the micro-DAG being grown: the
instances :class:`kdsl.search.canvas.CanvasSampler` chooses between (its ``_instances``), one
method per kind, and the joins two tensors allow.

:class:`Choices` is a mixin: the sampler sets the attributes it reads (``maps``, ``blends``,
``K``, ``G``, ``windows``, ``spatial``, ``channel``, ``batch``). The rules here are the sampler's
menu; how it draws from the menu, builds the DAG and finishes a kernel stays in ``canvas.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: a tensor of the DAG being grown (``kdsl.search.canvas._Node``: ``dims``, ``made_by``, ``plain``,
#: ``signature``), named loosely here so that this module does not import the sampler's
_Node = Any

__all__ = ["GROUP", "GROUP_WIDTH", "IDENTITY_ON_NONNEGATIVE", "NONNEGATIVE", "Choices"]

#: maps whose result is never negative, and the maps that are the identity on such a tensor
NONNEGATIVE = frozenset({"relu", "abs", "sigmoid"})
IDENTITY_ON_NONNEGATIVE = frozenset({"relu", "abs"})
#: the group dims a Split of the channel makes (one level of groups at a time)
GROUP, GROUP_WIDTH = "g", "cg"


class Choices:
    """The per-kind instances of Canvas's primitives at a node (see the module doc)."""

    maps: Sequence[str]
    blends: Sequence[str]
    K: Any
    G: Any
    windows: dict[str, str]
    spatial: Sequence[str]
    channel: str
    batch: Sequence[str]

    def _map(self, node: _Node) -> list[tuple]:
        made = node.made_by
        nonnegative = (made[0] == "map" and made[1] in NONNEGATIVE) or made[0] == "softmax"
        # relu(relu(x)) = relu(x), abs(relu(x)) = relu(x), relu(sigmoid(x)) = sigmoid(x): no such step
        return [(fn,) for fn in self.maps if not (nonnegative and fn in IDENTITY_ON_NONNEGATIVE)]

    def _unfold(self, node: _Node) -> list[tuple]:
        if self.K is None:
            return []
        return [(window, dim) for window, dim in self.windows.items() if dim in node.dims and window not in node.dims]

    def _windows_of(self, node: _Node) -> list[str]:
        return [w for w in self.windows if w in node.dims]

    def _fold(self, node: _Node) -> list[tuple]:
        windows = self._windows_of(node)
        return [(w,) for w in windows] + ([tuple(windows)] if len(windows) > 1 else [])

    def _reduce(self, node: _Node) -> list[tuple]:
        options = [tuple(d for d in self.spatial if d in node.dims)]
        windows = self._windows_of(node)
        options += [(w,) for w in windows] + ([tuple(windows)] if len(windows) > 1 else [])
        options += [(c,) for c in (self.channel, GROUP_WIDTH) if c in node.dims]
        # a Reduce must leave a dim (a Blend broadcasts the tensor back over the ones it took)
        return [o for o in options if o and len(node.dims) > len(o)]

    def _softmax(self, node: _Node) -> list[tuple]:
        order = list(node.dims)
        groups = [tuple(d for d in self.spatial if d in node.dims), tuple(self._windows_of(node))]
        groups += [(c,) for c in (self.channel, GROUP_WIDTH) if c in node.dims]
        # softmax runs over adjacent dims
        return [g for g in groups if g and _adjacent(order, g)]

    def _fc(self, node: _Node) -> list[tuple]:
        windows = tuple(self._windows_of(node))
        channel = tuple(d for d in (GROUP, GROUP_WIDTH, self.channel) if d in node.dims)
        options = []
        if channel and not node.plain:  # (an FC of plain groups' g and cg is one of the unsplit channel)
            options.append((self.channel, channel))
            if windows:
                options.append((self.channel, channel + windows))  # a convolution
        if GROUP in node.dims and GROUP_WIDTH in node.dims:
            options.append((GROUP_WIDTH, (GROUP_WIDTH,)))  # grouped: one FC per group, weights of its own
            if windows:
                options.append((GROUP_WIDTH, (GROUP_WIDTH,) + windows))
        return options

    def _group(self, node: _Node) -> list[tuple]:
        if self.G is None:
            return []
        if GROUP in node.dims and GROUP_WIDTH in node.dims:
            return [] if node.plain else [("merge",)]  # Merge(f(Split(c))) is f(c) for such f
        if self.channel in node.dims and GROUP not in node.dims and GROUP_WIDTH not in node.dims:
            return [] if node.made_by[0] == "merge" else [("split",)]
        return []

    def _shift(self, node: _Node) -> list[tuple]:
        made = node.made_by
        return [
            (dim, by)
            for dim in self.spatial
            if dim in node.dims
            for by in (1, -1)
            if not (made[0] == "shift" and made[1] == dim and made[2] == -by)  # shifted back: the same tensor
        ]

    def _merged(self, node: _Node) -> set[str]:
        """A tensor's dim names with its groups merged back into the channel (where it has groups
        and no channel): how a join with an ungrouped tensor sees it. A tensor a Split just made
        stays as it is when its groups are plain (merged back they are what the same steps give
        without the Split)."""
        names = set(node.dims)
        if GROUP in names and GROUP_WIDTH in names and self.channel not in names and not node.plain:
            return (names - {GROUP, GROUP_WIDTH}) | {self.channel}
        return names

    def _blends(self, a: _Node, b: _Node) -> list[tuple[bool, tuple]]:
        """``(swap, (how, merge))``: the blends of ``a`` and ``b`` (``b - a`` too); ``merge``: the
        grouped side's groups are merged back first (Canvas broadcasts ``[G, C/G, H, W]`` over
        ``[C, H, W]`` by their sizes; here names must match)."""
        if a.signature == b.signature:
            return []  # a tensor with itself
        left, right = set(a.dims), set(b.dims)
        merge = not (left <= right or right <= left)
        if merge:
            left, right = self._merged(a), self._merged(b)
            if not (left <= right or right <= left):
                return []  # neither broadcasts over the other
        found = [(False, (how, merge)) for how in self.blends]
        if "sub" in self.blends:
            found.append((True, ("sub", merge)))  # a - b and b - a
        return found

    def _products(self, a: _Node, b: _Node) -> list[tuple[bool, tuple]]:
        """``(False, (reduce, merge))``: products reducing the window dims or the channel both
        have (``merge``: with a grouped side's groups merged back first, to meet a channel)."""
        if a.signature == b.signature:
            return []
        found = []
        for merge in (False, True):
            left, right = set(a.dims), set(b.dims)
            if merge:
                left, right = self._merged(a), self._merged(b)
                if left == set(a.dims) and right == set(b.dims):
                    break
            shared = [d for d in left & right if d not in self.batch]
            windows = tuple(sorted(d for d in shared if d in self.windows))
            channels = tuple(sorted(d for d in shared if d in (self.channel, GROUP_WIDTH)))
            union = len(left | right)
            found += [(False, (r, merge)) for r in (windows, channels) if r and union - len(r) >= 1]
        return found


def _adjacent(order: list[str], names: Sequence[str]) -> bool:
    positions = sorted(order.index(n) for n in names)
    return positions[-1] - positions[0] == len(names) - 1
