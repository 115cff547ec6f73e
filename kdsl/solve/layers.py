"""Layer tables: the concrete sizes one operator must serve.

One operator stands for many layers of a network (Syno's placeholders, Canvas's templates). A
:class:`Layer` binds variables to positive integers; usually the primary variables (``N``,
``Cin``, ``Cout``, ``H``, ``W``, ...), sometimes a coefficient too. An operator ignores the
variables it does not use, so one table serves a conv2d, a matmul and a linear layer alike.

Tables come from :func:`load_layers`: a built-in name, a JSON file, or a list of dicts.

>>> table = load_layers("resnet18")
>>> [layer.name for layer in table]
['conv2_x', 'conv3_x', 'conv4_x', 'conv5_x']
>>> table[3]["Cin"], table[3]["H"], table[3]["M"]
(512, 7, 49)
>>> load_layers([{"name": "tiny", "Cin": 8, "H": 4}])[0]
Layer('tiny', {'Cin': 8, 'H': 4})
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from kdsl.lang.errors import LayerError

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def layer_label(name: str) -> str:
    """How messages name a layer: ``layer conv2_x``, or ``the layer`` for the one layer given as a
    plain mapping (its default name is "layer", and "layer layer" reads like a typo).

    >>> layer_label("conv2_x"), layer_label("layer")
    ('layer conv2_x', 'the layer')
    """
    return "the layer" if name == "layer" else f"layer {name}"


@dataclass(frozen=True, init=False)
class Layer:
    """A named binding of variables to positive integers (hashable; variables kept sorted).

    >>> layer = Layer("conv2_x", {"H": 56, "Cin": 64})
    >>> layer["Cin"], "H" in layer, layer.get("K")
    (64, True, None)
    >>> layer.values
    {'Cin': 64, 'H': 56}
    """

    name: str
    items: tuple[tuple[str, int], ...]

    def __init__(self, name: str, values: Mapping[str, int] | Iterable[tuple[str, int]]) -> None:
        if not isinstance(name, str) or not name.strip():
            raise LayerError(f"a layer name must be a non-empty string, got {name!r}")
        if not name.isprintable():
            # a name is printed in tables and error messages: escape sequences in it (ANSI colours,
            # OSC titles, bidi overrides) would act on the user's terminal. repr() shows them inert.
            raise LayerError(f"the layer name {name!r} has control characters; give a plain name")
        if isinstance(values, Mapping):
            pairs = list(values.items())
        else:
            try:
                pairs = [tuple(pair) for pair in values]  # type: ignore[union-attr]
            except TypeError:
                raise LayerError(f"layer {name}: expected a mapping of variable -> int, got {values!r}") from None
            if any(len(pair) != 2 for pair in pairs):
                raise LayerError(f"layer {name}: expected (variable, value) pairs, got {values!r}")
        checked: dict[str, int] = {}
        for key, value in pairs:
            if not isinstance(key, str) or not _IDENTIFIER.match(key):
                raise LayerError(f"layer {name}: the variable name {key!r} is not an identifier")
            if not _positive_int(value):
                raise LayerError(f"layer {name}: {key}={value!r} must be a positive integer")
            if key in checked:
                raise LayerError(f"layer {name}: the variable {key} is bound twice")
            checked[key] = value  # type: ignore[assignment]
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "items", tuple(sorted(checked.items())))

    @property
    def values(self) -> dict[str, int]:
        """The binding as a fresh dict (variable name -> value)."""
        return dict(self.items)

    def __getitem__(self, variable: str) -> int:
        for key, value in self.items:
            if key == variable:
                return value
        bound = ", ".join(k for k, _ in self.items) or "nothing"
        raise LayerError(f"layer {self.name} does not bind the variable {variable!r} (it binds {bound})")

    def get(self, variable: str, default: int | None = None) -> int | None:
        """The value of ``variable``, or ``default`` when the layer does not bind it."""
        for key, value in self.items:
            if key == variable:
                return value
        return default

    def __contains__(self, variable: object) -> bool:
        return any(key == variable for key, _ in self.items)

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"Layer({self.name!r}, {self.values!r})"


def _views(values: dict[str, int]) -> dict[str, int]:
    """Add the sizes of two other views of the same activations: ``M = N*H*W`` rows of the
    pixel-wise matmul, and ``L = H*W`` positions of the image read as a 1-D sequence."""
    return {**values, "M": values["N"] * values["H"] * values["W"], "L": values["H"] * values["W"]}


def with_batch(layer: Layer, batch: int) -> Layer:
    """The same layer with batch size ``batch`` (and ``M``, ``L`` recomputed when it has H and W).

    >>> with_batch(load_layers("resnet18")[0], 8)["M"]
    25088
    """
    values = layer.values
    values["N"] = batch
    if "H" in values and "W" in values:
        values = _views(values)
    return Layer(layer.name, values)


def _resnet18() -> tuple[Layer, ...]:
    rows = (("conv2_x", 64, 56), ("conv3_x", 128, 28), ("conv4_x", 256, 14), ("conv5_x", 512, 7))
    return tuple(Layer(name, _views({"N": 1, "Cin": c, "Cout": c, "H": h, "W": h})) for name, c, h in rows)


def _resnet18_stride2() -> tuple[Layer, ...]:
    # the first (strided) 3x3 conv of stages 3-5; H and W are the *input* sizes
    rows = (("conv3_1", 64, 128, 56), ("conv4_1", 128, 256, 28), ("conv5_1", 256, 512, 14))
    return tuple(Layer(name, _views({"N": 1, "Cin": cin, "Cout": cout, "H": h, "W": h})) for name, cin, cout, h in rows)


def _opevo_bmm() -> tuple[Layer, ...]:
    # OpEvo's BatchMatMuls (appendix B.2, from BERT): 960 batches of [M, K] x [K, N]; BMM1 is
    # 128x128 · 128x64, BMM2 the same with the left matrix transposed first, BMM3 128x64 transposed · 128x64
    rows = (("bmm1", 128, 128, 64), ("bmm2", 128, 128, 64), ("bmm3", 64, 128, 64))
    return tuple(Layer(name, {"B": 960, "M": m, "K": k, "N": n}) for name, m, k, n in rows)


def _bert_attention() -> tuple[Layer, ...]:
    # BERT-base's attention scores as OpEvo's BMMs see them: 80 sequences x 12 heads = 960 batches,
    # 128 queries and keys of head width 64
    return (Layer("bert_base", {"B": 960, "M": 128, "N": 128, "D": 64}),)


def _valid3x3() -> tuple[Layer, ...]:
    # ResNet-18's stride-1 3x3 convs with their input padded beforehand: a window without padding
    # (Slide) gives Ho = H - 2 windows, the layer's own output size
    rows = (("conv2_x", 64, 56), ("conv3_x", 128, 28), ("conv4_x", 256, 14), ("conv5_x", 512, 7))
    return tuple(
        Layer(name, _views({"N": 1, "Cin": c, "Cout": c, "H": h + 2, "W": h + 2, "Ho": h, "Wo": h}))
        for name, c, h in rows
    )


def _opevo_alexnet() -> tuple[Layer, ...]:
    # OpEvo's C1 (appendix B.3): (512, 3, 227, 227) convolved with (64, 3, 11, 11), stride 4, padding 0
    return (Layer("C1", _views({"N": 512, "Cin": 3, "Cout": 64, "H": 227, "W": 227, "Ho": 55, "Wo": 55})),)


def _transposed3d() -> tuple[Layer, ...]:
    # upsampling stages of a 3-D generator (a transposed convolution doubles D, H and W); ALT evaluates
    # T2D/T3D on random configurations it does not list, so these are representative sizes, not ALT's
    rows = (("up1", 256, 128, 4, 8), ("up2", 128, 64, 8, 16), ("up3", 64, 32, 16, 32))
    return tuple(
        Layer(name, _views({"N": 1, "Cin": cin, "Cout": cout, "D": d, "H": h, "W": h}))
        for name, cin, cout, d, h in rows
    )


def _r3d18() -> tuple[Layer, ...]:
    # the stride-1 3x3x3 convs of a 3-D ResNet-18 (torchvision's r3d_18) on a 16-frame 112x112 clip: its
    # stem keeps the 16 frames and halves the image; each later stage halves all three (D, H, W). conv5_x
    # (2 frames) is left out: its 3-frame window is larger than its depth, which the solver refuses by default
    rows = (("conv2_x", 64, 16, 56), ("conv3_x", 128, 8, 28), ("conv4_x", 256, 4, 14))
    return tuple(Layer(name, {"N": 1, "Cin": c, "Cout": c, "D": d, "H": h, "W": h}) for name, c, d, h in rows)


def _gensor_pool() -> tuple[Layer, ...]:
    # Gensor's average poolings (Table IV: P1-P3, window F = K, stride S = s, no padding); each layer binds
    # its window and stride, and the output sizes PyTorch's floor gives: Ho = (H - K) // s + 1
    rows = (("P1", 16, 48, 48, 2), ("P2", 128, 168, 83, 2), ("P3", 128, 617, 21, 3))
    return tuple(
        Layer(name, {"N": n, "Cin": c, "H": h, "W": h, "Ho": (h - k) // 2 + 1, "Wo": (h - k) // 2 + 1, "K": k, "s": 2})
        for name, n, c, h, k in rows
    )


#: Built-in tables. ``resnet18``: the distinct stride-1 3x3 convs of ResNet-18 on ImageNet (N=1).
#: ``resnet18_stride2``: the first conv of stages 3-5 (stride 2; H, W are input sizes).
#: ``valid3x3``: the ``resnet18`` layers on inputs padded beforehand, with the output sizes Ho, Wo a
#: window without padding needs. ``opevo_alexnet``: OpEvo's AlexNet C1 (Ho, Wo = 55).
#: ``transposed3d``: 3-D upsampling layers (D, H, W input sizes). Each of these layers also binds
#: ``M = N*H*W`` (the rows of the pixel-wise matmul view) and ``L = H*W`` (a 1-D view).
#: ``r3d18``: the stride-1 3x3x3 convs of a 3-D ResNet-18's stages 2-4 (D, H, W; no ``M``, ``L``). ``gensor_pool``:
#: Gensor's average poolings P1-P3 (each binds its window K, stride s and output sizes Ho, Wo).
#: ``opevo_bmm``: OpEvo's three BatchMatMuls (B, M, K, N); ``bert_attention``: BERT-base's Q·Kᵀ (B, M, N, D).
BUILTIN_TABLES = {
    "resnet18": _resnet18,
    "resnet18_stride2": _resnet18_stride2,
    "valid3x3": _valid3x3,
    "opevo_alexnet": _opevo_alexnet,
    "transposed3d": _transposed3d,
    "r3d18": _r3d18,
    "gensor_pool": _gensor_pool,
    "opevo_bmm": _opevo_bmm,
    "bert_attention": _bert_attention,
}


def _from_json(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise LayerError(f"cannot read the layer table {str(path)!r}: {error}") from None
    try:
        return json.loads(text)
    except ValueError as error:
        raise LayerError(f"the layer table {str(path)!r} is not valid JSON: {error}") from None


def _layer_from(item: object, index: int, default_name: str | None = None) -> Layer:
    if isinstance(item, Layer):
        return item
    if not isinstance(item, Mapping):
        raise LayerError(f"layer #{index}: expected an object like {{'name': ..., 'Cin': 64}}, got {item!r}")
    values = dict(item)
    name = values.pop("name", default_name or f"layer{index}")
    if not isinstance(name, str) or not name.strip():
        raise LayerError(f"layer #{index}: the name must be a non-empty string, got {name!r}")
    return Layer(name, values)


def load_layers(spec: object) -> tuple[Layer, ...]:
    """A layer table from a built-in name, a JSON file, a list of dicts or Layers, or one Layer.

    A JSON file holds a list of objects (``[{"name": "l1", "Cin": 64, "H": 56}]``) or an object
    ``{"layers": [...]}``. A layer without a name is called ``layer0``, ``layer1``, ...

    >>> [layer.name for layer in load_layers("resnet18_stride2")]
    ['conv3_1', 'conv4_1', 'conv5_1']
    >>> load_layers({"layers": [{"Cin": 3}]})
    (Layer('layer0', {'Cin': 3}),)
    >>> load_layers("vgg")
    Traceback (most recent call last):
    ...
    kdsl.lang.errors.LayerError: unknown layer table 'vgg': ...
    """
    if isinstance(spec, Layer):
        return (spec,)
    if isinstance(spec, str) and spec in BUILTIN_TABLES:
        return BUILTIN_TABLES[spec]()
    if isinstance(spec, (str, os.PathLike)):
        path = Path(spec)
        if not path.is_file():
            raise LayerError(
                f"unknown layer table {str(spec)!r}: give a built-in table ({', '.join(sorted(BUILTIN_TABLES))}) "
                f"or the path of a JSON file"
            )
        spec = _from_json(path)
    if isinstance(spec, Mapping):
        spec = spec.get("layers", [spec])
    if isinstance(spec, (str, bytes)) or not isinstance(spec, Iterable):
        raise LayerError(f"a layer table must be a list of layers, got {spec!r}")
    layers = tuple(_layer_from(item, index) for index, item in enumerate(spec))
    if not layers:
        raise LayerError("the layer table is empty; give at least one layer")
    names = [layer.name for layer in layers]
    for name in names:
        if names.count(name) > 1:
            raise LayerError(f"the layer table has two layers named {name!r}; name each layer differently")
    return layers


def as_layers(spec: object) -> tuple[Layer, ...]:
    """Like :func:`load_layers`, also accepting one layer as a plain mapping of variables."""
    if isinstance(spec, Mapping) and "layers" not in spec:
        return (_layer_from(spec, 0, "layer"),)
    return load_layers(spec)


def as_layer(spec: object) -> Layer:
    """One layer from a Layer or a mapping (``{"Cin": 64, ...}``, optionally with a ``name``)."""
    if isinstance(spec, Layer):
        return spec
    if isinstance(spec, Mapping):
        return _layer_from(spec, 0, "layer")
    raise LayerError(f"expected a Layer or a mapping of variable -> int, got {spec!r}")


__all__ = ["BUILTIN_TABLES", "Layer", "as_layer", "as_layers", "layer_label", "load_layers"]
