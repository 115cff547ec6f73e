"""Weights packed once, outside the kernel: a signature that takes each weight in its packed layout.

A schedule of the space packs a weight that its vector axis indexes in another dim than the last
(``layout.<weight>.tile``/``perm``: ``cache_read`` + ``transform_layout``): a stage copies the weight
into ``[v // f, <other dims>, v % f]`` on every call. In a network the weights are constants, so an
inference compiler packs them once, ahead of time. :func:`prepack_weights` does that to a scheduled
kernel: for every weight whose only reader is such a packing copy, it transforms the function's own
weight parameter with the copy's index map (``transform_layout`` on the parameter buffer: the
signature changes) and inlines the copy, which has become an identity; the kernel then reads the
packed weight the caller passes where it read the packed copy. The loops are untouched, so a tuned
record's schedule applies unchanged (whether it was tuned packing per call or prepacked: ``kdsl.tune``'s
``prepacked`` tasks, measured with this signature, are keyed apart) and the kernel computes
exactly what the per-call packing one does. A weight the schedule does not pack keeps its layout.

:class:`WeightLayout` says what the signature takes and packs a weight into it once (NumPy index
arithmetic and one scatter, no TVM call: TVM's own ``IndexMap.map_tensor`` took 15 s for a
512x512x3x3 weight); :meth:`WeightLayout.to_json` carries it to another process, and
:meth:`WeightLayout.pack_array` packs there without torch (a tuning run's measuring worker).

>>> import torch
>>> from kdsl import gallery
>>> from kdsl.codegen.tvm import build
>>> op, layer = gallery.load("conv2d"), {"N": 1, "Cin": 8, "Cout": 32, "H": 4, "W": 4}
>>> kernel = build(op, layer, prepacked_weights=True)
>>> kernel.prepacked, kernel.weight_layouts[0].shape  # the packed shape follows the machine's vector width
(True, (32, 8, 3, 3))
>>> x, w = torch.randn(1, 8, 4, 4), torch.randn(32, 8, 3, 3)
>>> packed = kernel.pack_weights(w)  # once, e.g. when a network is compiled
>>> torch.allclose(kernel(x, *packed), build(op, layer)(x, w), atol=1e-5)
True
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

from kdsl.codegen.tvm.lowering import Lowered
from kdsl.codegen.tvm.toolchain import load_tvm
from kdsl.lang.errors import LoweringError, ShapeError

__all__ = ["WeightLayout", "pack_weights", "prepack_weights"]


@dataclass(frozen=True)
class WeightLayout:
    """The packed layout a kernel's signature takes for one weight: ``packed[index_map(i)] = weight[i]``
    (``index_map``: a ``tvm.tirx.IndexMap`` from the operator's weight coordinates to the packed ones)."""

    name: str
    shape: tuple[int, ...]
    packed_shape: tuple[int, ...]
    index_map: Any = field(compare=False, repr=False)

    def describe(self) -> str:
        """The layout in one line: the weight, its shape, the packed shape and the map.

        >>> tvm = load_tvm()
        >>> index_map = tvm.tirx.IndexMap.from_func(lambda a, b: (a // 4, b, a % 4), ndim=2, index_dtype="int32")
        >>> WeightLayout("w", (8, 3), (2, 3, 4), index_map).describe()
        'w (8, 3) -> (2, 3, 4): (i0 // 4, i1, i0 % 4)'
        """
        names = {var.name: f"i{d}" for d, var in enumerate(self.index_map.initial_indices)}
        parts = [_text(expr, names) for expr in self.index_map.final_indices]
        return f"{self.name} {self.shape} -> {self.packed_shape}: ({', '.join(parts)})"

    def pack(self, weight: Any) -> Any:
        """``weight`` (a torch tensor or NumPy array of :attr:`shape`) in the packed layout: a new
        contiguous torch tensor of :attr:`packed_shape`, same dtype (a :class:`ShapeError` naming the
        weight for another shape).

        >>> import torch
        >>> tvm = load_tvm()
        >>> index_map = tvm.tirx.IndexMap.from_func(lambda a, b: (a // 2, b, a % 2), ndim=2, index_dtype="int32")
        >>> WeightLayout("w", (4, 1), (2, 1, 2), index_map).pack(torch.tensor([[0.0], [1.0], [2.0], [3.0]])).tolist()
        [[[0.0, 1.0]], [[2.0, 3.0]]]
        """
        import torch

        if isinstance(weight, np.ndarray):
            weight = torch.from_numpy(weight)
        if not isinstance(weight, torch.Tensor):
            raise ShapeError(
                f"the weight {self.name} must be a torch tensor or a NumPy array, got {type(weight).__name__}"
            )
        coordinates = self._coordinates(tuple(weight.shape))
        packed = weight.new_empty(self.packed_shape)
        packed[tuple(torch.from_numpy(c) for c in coordinates)] = weight.detach()
        return packed

    def pack_array(self, weight: np.ndarray) -> np.ndarray:
        """``weight`` (a NumPy array of :attr:`shape`) in the packed layout as a new NumPy array, same
        dtype, packed as :meth:`pack` packs it but without torch (a tuning run's measuring process).

        >>> tvm = load_tvm()
        >>> index_map = tvm.tirx.IndexMap.from_func(lambda a, b: (a // 2, b, a % 2), ndim=2, index_dtype="int32")
        >>> WeightLayout("w", (4, 1), (2, 1, 2), index_map).pack_array(np.arange(4.0).reshape(4, 1)).tolist()
        [[[0.0, 1.0]], [[2.0, 3.0]]]
        """
        if not isinstance(weight, np.ndarray):
            raise ShapeError(f"the weight {self.name} must be a NumPy array, got {type(weight).__name__}")
        coordinates = self._coordinates(tuple(weight.shape))
        packed = np.empty(self.packed_shape, dtype=weight.dtype)
        packed[tuple(coordinates)] = weight
        return packed

    def _coordinates(self, shape: tuple[int, ...]) -> list[np.ndarray]:
        """The packed coordinates of every element of a weight of ``shape`` (which must be :attr:`shape`),
        one open-grid array per packed dim, broadcasting to ``shape``."""
        if shape != self.shape:
            raise ShapeError(
                f"the weight {self.name} has shape {shape}, expected {self.shape} (its layout in the "
                f"operator) to pack it to {self.packed_shape}"
            )
        # open grids: each packed coordinate is computed over only the dims it depends on, and the
        # scatter broadcasts them (no full-size index array per dim for a 9 MB weight)
        grid = np.ogrid[tuple(slice(0, n) for n in self.shape)]
        variables = list(self.index_map.initial_indices)
        coordinates = [
            np.asarray(_evaluate(expr, variables, grid), dtype=np.int64) for expr in self.index_map.final_indices
        ]
        if np.broadcast_shapes(*(c.shape for c in coordinates), (1,) * len(self.shape)) != self.shape:
            raise LoweringError(
                f"the packed layout of {self.name} does not use every dim of {self.shape}: {self.describe()}"
            )
        return coordinates

    def to_json(self) -> dict[str, Any]:
        """The layout as JSON-able values (its index map as TVM's JSON), for another process to rebuild
        with :meth:`from_json`: a tuning run compiles in one process and times in another.

        >>> tvm = load_tvm()
        >>> index_map = tvm.tirx.IndexMap.from_func(lambda a, b: (a // 4, b, a % 4), ndim=2, index_dtype="int32")
        >>> WeightLayout.from_json(WeightLayout("w", (8, 3), (2, 3, 4), index_map).to_json()).describe()
        'w (8, 3) -> (2, 3, 4): (i0 // 4, i1, i0 % 4)'
        """
        index_map = load_tvm().ir.save_json(self.index_map)
        return {"name": self.name, "shape": list(self.shape), "packed_shape": list(self.packed_shape), "map": index_map}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WeightLayout:
        """The layout :meth:`to_json` gave (a :class:`LoweringError` for anything else)."""
        try:
            index_map = load_tvm().ir.load_json(data["map"])
            layout = cls(str(data["name"]), tuple(data["shape"]), tuple(data["packed_shape"]), index_map)
        except Exception as error:  # a missing field, or TVM's own error for text that is no IndexMap
            raise LoweringError(f"not a packed weight layout: {str(error).strip()[-200:]}") from None
        if not isinstance(index_map, load_tvm().tirx.IndexMap) or len(index_map.initial_indices) != len(layout.shape):
            raise LoweringError(f"the packed layout of {layout.name} maps another number of dims than {layout.shape}")
        return layout


def pack_weights(layouts: Sequence[WeightLayout | None], weights: Sequence[Any]) -> list[Any]:
    """Each of ``weights`` packed by its layout (:meth:`WeightLayout.pack`); one whose layout is ``None``
    (not packed by the kernel's schedule) is passed on as it is."""
    if len(weights) != len(layouts):
        raise ShapeError(f"expected {len(layouts)} weights to pack, got {len(weights)}")
    return [weight if layout is None else layout.pack(weight) for layout, weight in zip(layouts, weights)]


def prepack_weights(sch: Any, lowered: Lowered) -> tuple[Any, list[WeightLayout | None]]:
    """Give the scheduled kernel ``sch`` (an ``s_tir.Schedule`` of ``lowered``, after its schedule) the
    packed layout of every weight its schedule packs in a copy of its own, and remove those copies (see
    the module docstring). Returns the schedule (a copy of it before a weight that could not be
    prepacked, which keeps its per-call packing) and the layout of each weight (``None``: the
    signature's weight is the operator's)."""
    layouts: list[WeightLayout | None] = []
    for weight in lowered.weights:
        backup = sch.copy()
        try:
            layout = _prepack_one(sch, weight.name, tuple(int(d) for d in weight.shape))
        except Exception:  # a TVM primitive refused this schedule's copy: keep packing it per call
            sch, layout = backup, None
        layouts.append(layout)
    return sch, layouts


def _prepack_one(sch: Any, name: str, shape: tuple[int, ...]) -> WeightLayout | None:
    """Prepack the weight parameter ``name`` of ``sch`` in place if its only reader is a packing copy;
    ``None`` (nothing changed) otherwise."""
    tvm = load_tvm()
    readers = []
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        node = sch.get(rv)
        if any(region.source.name == name for region in node.reads):
            readers.append((rv, node))
    if len(readers) != 1:
        return None  # unread, or also read elsewhere than by one packing copy: the signature stays
    rv, node = readers[0]
    store = node.body
    if not isinstance(store, tvm.tirx.BufferStore) or type(store.value).__name__ not in ("TensorLoad", "BufferLoad"):
        return None  # TVM 0.27 names a buffer load TensorLoad (tvm.tirx.BufferLoad is its constructor)
    if store.value.source.name != name or len(node.reads) != 1 or len(node.writes) != 1:
        return None
    packed_shape = tuple(int(d) for d in store.buffer.shape)
    if prod(packed_shape) != prod(shape) or str(store.buffer.scope()) != "global":
        return None  # a padded or partial copy, or one into a cache of another scope: not a pure repacking
    iters = [iv.var for iv in node.iter_vars]
    extents = [int(iv.dom.extent) for iv in node.iter_vars]
    # the copy is packed[S(v)] = weight[R(v)] over its iterations v: the layout is S after R's inverse
    # (R is the identity where the copy loops over the weight, S where it loops over the packed copy)
    read_inverse = tvm.tirx.IndexMap(iters, list(store.value.indices), None).inverse(extents)
    written = tvm.tirx.IndexMap(iters, list(store.indices), None).map_indices(list(read_inverse.final_indices))
    index_map = tvm.tirx.IndexMap(list(read_inverse.initial_indices), list(written), None)
    if tuple(int(d) for d in index_map.map_shape(list(shape))) != packed_shape:
        return None
    if not _one_to_one(index_map, shape, packed_shape):
        return None  # a packing that drops or repeats elements is no layout a caller could pack into
    sch.transform_layout(rv, ("read", 0), index_map)
    # checked by evaluation, not by the printed form: TVM may leave ((v0 * 4 + v4) // 4) as it is
    copied = sch.get(rv)
    grid = np.ogrid[tuple(slice(0, n) for n in extents)]
    iters = [iv.var for iv in copied.iter_vars]
    for read, write in zip(copied.body.value.indices, copied.body.indices, strict=True):
        if not np.array_equal(*np.broadcast_arrays(_evaluate(read, iters, grid), _evaluate(write, iters, grid))):
            raise LoweringError(f"the packing copy of {name} is no identity after its transform")
    sch.compute_inline(rv)  # the kernel now reads the packed parameter where it read the copy
    return WeightLayout(name, shape, packed_shape, index_map)


def _one_to_one(index_map: Any, shape: tuple[int, ...], packed_shape: tuple[int, ...]) -> bool:
    """Whether ``index_map`` sends the elements of ``shape`` to every element of ``packed_shape`` once
    (evaluated element by element with NumPy: a scatter by a map that is not would leave elements unset)."""
    grid = np.ogrid[tuple(slice(0, n) for n in shape)]
    variables = list(index_map.initial_indices)
    flat = np.zeros(shape, dtype=np.int64)
    for coordinate, extent in zip(index_map.final_indices, packed_shape):
        position = np.asarray(_evaluate(coordinate, variables, grid), dtype=np.int64)
        if position.min() < 0 or position.max() >= extent:
            return False
        flat = flat * extent + position
    return bool((np.bincount(flat.ravel(), minlength=prod(packed_shape)) == 1).all())


def _evaluate(expr: Any, variables: Sequence[Any], values: Sequence[Any]) -> Any:
    """The integer index expression ``expr`` over NumPy arrays (``values[d]`` for ``variables[d]``): the
    affine arithmetic with floor division and modulo that layout maps are made of."""
    tirx = load_tvm().tirx
    for variable, value in zip(variables, values):
        if expr.same_as(variable):
            return value
    if isinstance(expr, tirx.IntImm):
        return expr.value
    operations = {
        tirx.Add: lambda a, b: a + b,
        tirx.Sub: lambda a, b: a - b,
        tirx.Mul: lambda a, b: a * b,
        tirx.FloorDiv: lambda a, b: a // b,  # NumPy's // and % on integers are floor division and modulo
        tirx.FloorMod: lambda a, b: a % b,
    }
    for kind, operation in operations.items():
        if isinstance(expr, kind):
            return operation(_evaluate(expr.a, variables, values), _evaluate(expr.b, variables, values))
    raise LoweringError(f"cannot pack a weight by the index expression {expr} ({type(expr).__name__})")


def _text(expr: Any, names: dict[str, str]) -> str:
    """``expr`` printed with the layout's variables renamed ``i0, i1, ..`` (by dim), in one pass (no
    renamed variable is renamed again)."""
    return re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda word: names.get(word.group(0), word.group(0)), str(expr))
