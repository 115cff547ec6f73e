"""The proxy task: a small residual CNN on scikit-learn's digits whose convolutions are a candidate.

Search cannot train on ImageNet, so, like Syno and Canvas (which train on CIFAR-100), kdsl trains
a small network briefly on a small real data set that ships inside a package: scikit-learn's
``load_digits`` (1,797 grey 8x8 images of the digits 0-9), upsampled to ``image_size`` pixels.

The network (:func:`proxy_net`): a fixed stem (3x3 conv from 1 channel, BN, ReLU), then one stage
per width in ``widths``, each halving the resolution (from the second on: 2x2 average pooling and
a fixed 1x1 conv to the new width, like ResNet's projection shortcut), each with ``blocks``
residual blocks ``relu(x + bn(op(relu(bn(op(x))))))``, then global average pooling and a linear
classifier. Every ``op`` is the candidate, built with :func:`kdsl.codegen.torch.build` for its
layer's sizes (its own weights): the candidate must map ``[N, Cin, H, W] -> [N, Cout, H, W]`` with
``Cin = Cout``. The stem and the 1x1 transitions stay fixed, since a 1-channel input or a 1x1
projection is no place for a 3x3-like candidate (Syno substitutes the standard convolutions too).
:func:`proxy_layers` is the resulting layer table, one layer per stage.

Training is reproducible: a fixed stratified train/validation split (``split_seed``), weights
drawn after ``torch.manual_seed(seed)``, a data order drawn from a seeded generator, a fixed
number of threads. Canvas's early-stop rule (§7) ends a run whose accuracy at some epoch falls
below ``λ(epoch) · best(epoch)``, see :func:`should_stop`.

>>> [(layer.name, layer["Cin"], layer["H"]) for layer in proxy_layers()]
[('stage1', 32, 16), ('stage2', 64, 8)]
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from kdsl.codegen.torch import build, load_torch
from kdsl.discover.data import load as load_dataset
from kdsl.discover.data import parse_spec
from kdsl.lang.errors import KdslError, SearchError, ShapeError
from kdsl.lang.operator import Operator
from kdsl.solve import shapes, with_widths
from kdsl.solve.layers import Layer

__all__ = [
    "BestCurve",
    "ProxyConfig",
    "data_info",
    "proxy_net",
    "early_stop_threshold",
    "load_data",
    "proxy_layers",
    "should_stop",
    "train",
]

#: digits are 8x8; the network sees them upsampled to 16x16 (two stages need room to halve)
DIGITS_SIZE = 16
#: the validation set grows by the unused training images up to this many (evaluation stays cheap)
MAX_VALIDATION = 5000


#: the proxy networks' backbones (``kdsl discover --net proxy-resnet | proxy-vgg``)
BACKBONES = ("resnet", "vgg")


@dataclass(frozen=True)
class ProxyConfig:
    """Everything that defines a proxy run; equal configs give bit-identical results on one machine.

    >>> ProxyConfig(epochs=2).epochs, ProxyConfig().widths
    (2, (32, 64))
    """

    #: channels per stage. At 16 and 32 channels, splitting channels into groups costs the proxy
    #: far more than it costs ResNet-18 at 64..512 (grouped G=2 scored 1.6 points under conv2d
    #: over 3 seeds); at 32 and 64 it scores with conv2d, as at full scale (see kdsl bench proxy)
    widths: tuple[int, ...] = (32, 64)
    blocks: int = 1
    #: the backbone (:data:`BACKBONES`): ``resnet`` (residual blocks; its 1x1 transitions stay
    #: native) or ``vgg`` (a plain stack in which every convolution, the channel-changing first
    #: one of each stage too, is the candidate)
    backbone: str = "resnet"
    #: the network's input size; None: the data's own (digits: upsampled from 8 to 16)
    image_size: int | None = None
    epochs: int = 12
    batch_size: int = 64
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    seed: int = 0
    split_seed: int = 0
    validation_fraction: float = 0.25
    theta: float = 0.5
    #: the first ``grace`` share of the epochs is never cut short by the early-stop rule. Early
    #: accuracy does not predict the end: in three 30-minute discovers, runs that ended within
    #: 1 point of conv2d stood at 0.40-0.71 after epoch 2 of 12 while conv2d stood at 0.68-0.79,
    #: and Canvas's rule (lambda = 0.58 there) had cut such candidates short at 0.39 in one seed
    #: and let them finish in another; from epoch 4 on every such run cleared it by 0.1 or more.
    grace: float = 0.25
    threads: int = 1
    warmup: float = 0.0
    label_smoothing: float = field(default=0.0)
    #: the data set (:mod:`kdsl.discover.data`): digits, cifar10:DIR, cifar100:DIR, npz:FILE, folder:DIR
    data: str = "digits"
    # The defaults make digits hard enough to discriminate (see ``kdsl bench proxy``): with all
    # 1,347 clean training images conv2d scores 0.976 and a weightless 1-tap shift 0.873; with 600
    # noisy, shifted ones (and twice the epochs, the same number of steps) 0.958 against 0.640.
    #: at most this many training images (a stratified choice); fewer make the task harder
    train_samples: int | None = 600
    #: augmentation: each training image moves by up to ``shift`` pixels in each direction
    shift: int = 2
    #: Gaussian noise (in units of the data's standard deviation) on every image
    noise: float = 0.5
    #: the training images ``train_samples`` leaves out are validated on too (fewer noisy scores)
    validate_on_unused: bool = True

    def __post_init__(self) -> None:
        if not self.widths or any(w < 1 for w in self.widths):
            raise KdslError(f"proxy widths must be positive channel counts, got {self.widths!r}")
        object.__setattr__(self, "widths", tuple(int(w) for w in self.widths))
        if self.image_size is not None and self.image_size % (2 ** (len(self.widths) - 1)):
            raise KdslError(
                f"image_size={self.image_size} must be divisible by 2**{len(self.widths) - 1} "
                f"(each of the {len(self.widths)} stages after the first halves the resolution)"
            )
        for name in ("blocks", "epochs", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise KdslError(f"proxy {name} must be at least 1, got {getattr(self, name)!r}")
        if self.train_samples is not None and self.train_samples < 2:
            raise KdslError(f"proxy train_samples must be at least 2, got {self.train_samples!r}")
        if self.shift < 0 or self.noise < 0:
            raise KdslError(f"proxy shift and noise must not be negative, got {self.shift!r} and {self.noise!r}")
        parse_spec(self.data)
        if self.backbone not in BACKBONES:
            raise KdslError(f"unknown proxy backbone {self.backbone!r}; use one of {', '.join(BACKBONES)}")
        if not 0 <= self.grace < 1:
            raise KdslError(f"proxy grace must lie in [0, 1) (a share of the epochs), got {self.grace!r}")
        if not 0 < self.validation_fraction < 1:
            raise KdslError(f"validation_fraction must lie in (0, 1), got {self.validation_fraction!r}")

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON-ready values (``ProxyConfig(**config.to_dict()) == config``)."""
        values = asdict(self)
        values["widths"] = list(self.widths)
        return values

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> ProxyConfig:
        """A config from an evaluator spec's options (``widths`` may be a JSON list); an unknown
        option is a SearchError that names it.

        >>> ProxyConfig.of({"widths": [8], "epochs": 1}).widths
        (8,)
        """
        values = dict(options)
        if "widths" in values:
            values["widths"] = tuple(values["widths"])
        try:
            return cls(**values)
        except TypeError as error:
            raise SearchError(f"bad proxy-task parameter: {error}") from None


def proxy_layers(config: ProxyConfig | None = None) -> tuple[Layer, ...]:
    """The proxy network's layer table: one layer per stage, the sizes the candidate must fit.

    Each layer binds ``N`` (the training batch), ``Cin = Cout`` (the stage width), ``H = W`` and,
    like the built-in tables, ``M = N*H*W`` and ``L = H*W``; the ``vgg`` backbone adds, before each
    stage that widens, a layer ``stageK_in`` with the previous width as ``Cin``. Check a candidate with
    ``kdsl.solve.check(op, proxy_layers())`` before training it.

    >>> proxy_layers(ProxyConfig(widths=(8, 16, 32), image_size=16))[2]
    Layer('stage3', {'Cin': 32, 'Cout': 32, 'H': 4, 'L': 16, 'M': 1024, 'N': 64, 'W': 4})
    """
    config = config or ProxyConfig()
    _, image_size, _ = data_info(config)
    layers = []
    previous = config.widths[0]
    for index, width in enumerate(config.widths):
        size = image_size // 2**index
        base = {"N": config.batch_size, "H": size, "W": size, "M": config.batch_size * size * size, "L": size * size}
        if config.backbone == "vgg" and width != previous:
            # the stage's first convolution changes the channels: the candidate serves it too
            layers.append(Layer(f"stage{index + 1}_in", {**base, "Cin": previous, "Cout": width}))
        layers.append(Layer(f"stage{index + 1}", {**base, "Cin": width, "Cout": width}))
        previous = width
    return tuple(layers)


# ---------------------------------------------------------------------------------------------
# Canvas's early-stop rule


def early_stop_threshold(epoch: int, epochs: int, best: float, theta: float = 0.5) -> float:
    """The least accuracy a run may have after ``epoch`` (1-based) of ``epochs``: ``λ · best``.

    Canvas §7: ``accuracy(epoch) >= λ · accuracy_max(epoch)`` with ``λ = f(epoch / epochs)``,
    ``f(x) = θ + (1 - θ) x``; ``accuracy_max(epoch)`` is the accuracy at that same epoch of the best
    run so far (see :class:`BestCurve`). Early epochs may lag behind; the last must match.

    >>> early_stop_threshold(1, 4, 0.8), early_stop_threshold(4, 4, 0.8)
    (0.5, 0.8)
    """
    if not 1 <= epoch <= epochs:
        raise KdslError(f"epoch must lie in 1..{epochs}, got {epoch}")
    factor = theta + (1.0 - theta) * epoch / epochs
    return factor * best


def should_stop(
    history: Sequence[float],
    best_history: Sequence[float] | None,
    epochs: int,
    theta: float = 0.5,
    grace: float = 0.0,
) -> bool:
    """Whether a run with the per-epoch accuracies ``history`` so far stops now (Canvas §7).

    It stops when its latest accuracy is below :func:`early_stop_threshold` of the best run's
    accuracy at the same epoch. Without a best curve (or past its end) it never stops, nor within
    the first ``grace`` share of the epochs (``grace=0.25`` of 12 epochs: not before epoch 4).

    >>> best = [0.5, 0.7, 0.8, 0.9]
    >>> should_stop([0.35], best, 4), should_stop([0.35, 0.4], best, 4), should_stop([0.5, 0.8], best, 4)
    (False, True, False)
    >>> should_stop([0.35, 0.4], best, 4, grace=0.5)
    False
    """
    if not history or not best_history or len(history) > len(best_history):
        return False
    epoch = len(history)
    if epoch <= int(grace * epochs):
        return False
    return history[-1] < early_stop_threshold(epoch, epochs, best_history[epoch - 1], theta)


class BestCurve:
    """The accuracy curve of the best completed run so far (Canvas's ``accuracy_max(epoch)``).

    A run replaces the curve when it completed all epochs (was not early-stopped) and its final
    accuracy beats the current best's final accuracy. Start it with the baseline's curve.

    >>> curve = BestCurve([0.4, 0.6, 0.7])
    >>> curve.update([0.5, 0.7, 0.75]), curve.update([0.9], early_stopped=True), curve.history
    (True, False, [0.5, 0.7, 0.75])
    """

    def __init__(self, history: Sequence[float] | None = None) -> None:
        self.history: list[float] | None = list(history) if history else None

    def update(self, history: Sequence[float], *, early_stopped: bool = False) -> bool:
        """Record a finished run; return whether it became the best."""
        if early_stopped or not history:
            return False
        if self.history is None or history[-1] > self.history[-1]:
            self.history = list(history)
            return True
        return False


# ---------------------------------------------------------------------------------------------
# Data and network


def data_info(config: ProxyConfig | None = None) -> tuple[int, int, int]:
    """``(channels, image_size, classes)`` of the proxy's data as the network sees it.

    >>> data_info(), data_info(ProxyConfig(image_size=8))
    ((1, 16, 10), (1, 8, 10))
    """
    config = config or ProxyConfig()
    data = load_dataset(config.data, config.split_seed, config.validation_fraction)
    size = config.image_size or (DIGITS_SIZE if config.data == "digits" else data.image_size)
    if size % (2 ** (len(config.widths) - 1)):
        raise KdslError(
            f"image_size={size} must be divisible by 2**{len(config.widths) - 1} "
            f"(each of the {len(config.widths)} stages after the first halves the resolution)"
        )
    return data.channels, size, data.classes


@lru_cache(maxsize=4)
def _tensors(config: ProxyConfig) -> tuple[Any, Any, Any, Any]:
    torch = _torch()
    data = load_dataset(config.data, config.split_seed, config.validation_fraction)
    _, size, _ = data_info(config)
    train_x, train_y = data.train_x, data.train_y
    val_x, val_y = data.val_x, data.val_y
    if config.train_samples is not None and config.train_samples < len(train_y):
        keep, unused = _subsample(train_y, config.train_samples, config.split_seed)
        # The training images left out join the validation set (up to MAX_VALIDATION images in
        # all): on digits 1,197 instead of 450, so one point of accuracy is 12 images, not 4.5,
        # and the binomial noise of a score falls from 1.0 to 0.6 points.
        room = max(0, MAX_VALIDATION - len(val_y))
        if config.validate_on_unused and room:
            unused = unused[:room]
            val_x = np.concatenate([val_x, train_x[unused]])
            val_y = np.concatenate([val_y, train_y[unused]])
        train_x, train_y = train_x[keep], train_y[keep]
    tensors = []
    for x in (train_x, val_x):
        x = torch.from_numpy(x)
        if x.shape[-1] != size:
            x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear")
        tensors.append(x)
    val_x = tensors[1]
    if config.noise:
        # the validation images get one fixed draw of the noise the training images get fresh
        generator = torch.Generator().manual_seed(config.split_seed)
        val_x = val_x + config.noise * torch.randn(val_x.shape, generator=generator)
    return tensors[0], torch.from_numpy(train_y), val_x, torch.from_numpy(val_y)


def _subsample(y: Any, count: int, seed: int) -> tuple[Any, Any]:
    """A stratified choice of ``count`` of the indices of ``y`` (and the rest)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    # round-robin over classes in a seeded order, so every class keeps its share
    by_class = {int(label): [i for i in order if y[i] == label] for label in np.unique(y)}
    keep: list[int] = []
    while len(keep) < count:
        for members in by_class.values():
            if members and len(keep) < count:
                keep.append(members.pop())
    kept = set(keep)
    return np.array(sorted(keep)), np.array([i for i in range(len(y)) if i not in kept])


def load_data(config: ProxyConfig | None = None) -> tuple[Any, Any, Any, Any]:
    """``(train_x, train_y, val_x, val_y)`` as torch tensors: the data of ``config.data``
    (:mod:`kdsl.discover.data`), resized to the image size, standardized, split (stratified),
    at most ``train_samples`` training images, ``noise`` added to the validation images.

    >>> train_x, train_y, val_x, val_y = load_data(ProxyConfig(train_samples=None, noise=0.0))
    >>> tuple(train_x.shape), tuple(val_x.shape), int(val_y.bincount().min())
    ((1347, 1, 16, 16), (450, 1, 16, 16), 44)
    """
    return _tensors(config or ProxyConfig())


def _torch() -> Any:
    return load_torch()


def conv_shape_mismatch(sizes: Mapping[str, Sequence[int]], layer: Layer) -> tuple[list[int], list[int]] | None:
    """None when ``sizes`` (:func:`kdsl.solve.shapes` of an operator) map ``[N, Cin, H, W]`` to
    ``[N, Cout, H, W]`` on ``layer``, as the convolution an operator replaces does; else those two
    shapes, for the caller's message."""
    wanted_in = [layer[v] for v in ("N", "Cin", "H", "W")]
    wanted_out = [layer[v] for v in ("N", "Cout", "H", "W")]
    if list(sizes["input"]) == wanted_in and list(sizes["output"]) == wanted_out:
        return None
    return wanted_in, wanted_out


def _check_fits(op: Operator, layer: Layer) -> None:
    """Raise a ShapeError unless ``op`` maps ``[N, Cin, H, W]`` to ``[N, Cout, H, W]`` on ``layer``."""
    sizes = shapes(op, layer)
    wanted = conv_shape_mismatch(sizes, layer)
    if wanted is not None:
        raise ShapeError(
            f"layer {layer.name} of the proxy network needs [N, Cin, H, W] = {wanted[0]} -> "
            f"[N, Cout, H, W] = {wanted[1]}, but the operator maps {list(sizes['input'])} -> "
            f"{list(sizes['output'])}; search it with the conv2d spec"
        )


def proxy_net(
    op: Operator, config: ProxyConfig | None = None, widths: Mapping[str, Mapping[str, int]] | None = None
) -> Any:
    """The proxy network (an ``nn.Module``) with every block convolution replaced by ``op``.

    Raises the :class:`KdslError` of :func:`kdsl.codegen.torch.build` when ``op`` does not fit a
    layer of :func:`proxy_layers`. Weights are drawn from torch's global generator: seed it first.
    """
    torch = _torch()
    nn = torch.nn

    config = config or ProxyConfig()
    channels, _, classes = data_info(config)
    # a template (free widths) gets each stage's widths: the sampler filled them on these layers
    layers = with_widths(op, proxy_layers(config), widths)
    for layer in layers:
        _check_fits(op, layer)

    class Block(nn.Module):
        def __init__(self, layer: Layer, index: int) -> None:
            super().__init__()
            width = layer["Cout"]
            self.conv1 = build(op, layer.values, name=f"{layer.name}_block{index}_conv1")
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = build(op, layer.values, name=f"{layer.name}_block{index}_conv2")
            self.bn2 = nn.BatchNorm2d(width)

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(x + self.bn2(self.conv2(y)))

    if config.backbone == "vgg":
        return _vgg(op, config, layers, channels, classes)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            first = config.widths[0]
            self.stem = nn.Sequential(
                nn.Conv2d(channels, first, 3, padding=1, bias=False), nn.BatchNorm2d(first), nn.ReLU()
            )
            stages = []
            previous = first
            for index, layer in enumerate(layers):
                width = layer["Cout"]
                parts: list[Any] = []
                if index > 0:
                    parts += [nn.AvgPool2d(2), nn.Conv2d(previous, width, 1, bias=False), nn.BatchNorm2d(width)]
                parts += [Block(layer, b) for b in range(config.blocks)]
                stages.append(nn.Sequential(*parts))
                previous = width
            self.stages = nn.Sequential(*stages)
            self.head = nn.Linear(previous, classes)

        def forward(self, x: Any) -> Any:
            x = self.stages(self.stem(x))
            return self.head(x.mean(dim=(2, 3)))

    return Net()


def _vgg(op: Operator, config: ProxyConfig, layers: Sequence[Layer], channels: int, classes: int) -> Any:
    """The VGG-like proxy: a native stem, then per stage (max-pooled after the first) the candidate
    in every convolution, each followed by batch norm and ReLU; global pooling and a linear head."""
    torch = _torch()
    nn = torch.nn
    first = config.widths[0]
    parts: list[Any] = [nn.Conv2d(channels, first, 3, padding=1, bias=False), nn.BatchNorm2d(first), nn.ReLU()]
    stage = None
    for layer in layers:
        name = layer.name.removesuffix("_in")
        if stage is not None and name != stage:
            parts.append(nn.MaxPool2d(2))
        stage = name
        repeats = 1 if layer.name.endswith("_in") else config.blocks
        for index in range(repeats):
            parts += [
                build(op, layer.values, name=f"{layer.name}_conv{index}"),
                nn.BatchNorm2d(layer["Cout"]),
                nn.ReLU(),
            ]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(*parts)
            self.head = nn.Linear(layers[-1]["Cout"], classes)

        def forward(self, x: Any) -> Any:
            return self.head(self.features(x).mean(dim=(2, 3)))

    return Net()


def _accuracy(model: Any, x: Any, y: Any, batch: int = 512) -> float:
    """Validation accuracy with batch-norm statistics of the validation batch itself.

    After a few hundred steps the running averages lag far behind the weights and make early
    epochs read as chance; the early-stop rule needs early epochs to mean something.
    """
    torch = _torch()
    saved = {name: b.clone() for name, b in model.named_buffers()}
    correct = 0
    with torch.no_grad():
        for start in range(0, len(y), batch):
            logits = model(x[start : start + batch])
            correct += int((logits.argmax(dim=1) == y[start : start + batch]).sum())
        for name, b in model.named_buffers():
            b.copy_(saved[name])
    return correct / len(y)


def _augment(x: Any, config: ProxyConfig, generator: Any) -> Any:
    """A training batch moved by up to ``shift`` pixels per image (zeros enter at the border:
    the data's mean after standardizing) and with fresh Gaussian ``noise``."""
    torch = _torch()
    if config.shift:
        s = config.shift
        padded = torch.nn.functional.pad(x, (s, s, s, s))
        offsets = torch.randint(0, 2 * s + 1, (len(x), 2), generator=generator)
        size = x.shape[-1]
        x = torch.stack([padded[i, :, a : a + size, b : b + size] for i, (a, b) in enumerate(offsets.tolist())])
    if config.noise:
        x = x + config.noise * torch.randn(x.shape, generator=generator)
    return x


def _learning_rate(config: ProxyConfig, step: int, steps_per_epoch: int, total_steps: int) -> float:
    """Linear warm-up over ``warmup`` epochs (none by default), then cosine decay to 0."""
    warmup = min(total_steps - 1, round(config.warmup * steps_per_epoch))
    if step < warmup:
        return config.lr * (step + 1) / (warmup + 1)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (total_steps - warmup)))


def train(
    op: Operator,
    config: ProxyConfig | None = None,
    best_history: Sequence[float] | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
    widths: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """Train the proxy network with ``op`` and return its metrics.

    Keys: ``accuracy`` (validation accuracy after the last epoch run), ``accuracy_history`` (one
    per epoch run), ``early_stopped`` (Canvas's rule against ``best_history``), ``epochs_run``,
    ``train_seconds``, ``candidate_params`` (the weights of all candidate layers).
    SGD with Nesterov momentum, cosine learning-rate decay per step, cross-entropy.
    """
    torch = _torch()
    config = config or ProxyConfig()
    train_x, train_y, val_x, val_y = load_data(config)
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        start = time.perf_counter()
        torch.manual_seed(config.seed)
        model = proxy_net(op, config, widths)
        candidate_params = sum(
            p.numel() for name, p in model.named_parameters() if ".conv1." in name or ".conv2." in name
        )
        optimizer = torch.optim.SGD(
            model.parameters(),
            lr=config.lr,
            momentum=config.momentum,
            nesterov=True,
            weight_decay=config.weight_decay,
        )
        steps_per_epoch = math.ceil(len(train_y) / config.batch_size)
        total_steps = steps_per_epoch * config.epochs
        order = torch.Generator().manual_seed(config.seed)
        augment = torch.Generator().manual_seed(config.seed + 1)
        history: list[float] = []
        early_stopped = False
        step = 0
        model.train()
        for epoch in range(1, config.epochs + 1):
            permutation = torch.randperm(len(train_y), generator=order)
            for first in range(0, len(train_y), config.batch_size):
                batch = permutation[first : first + config.batch_size]
                for group in optimizer.param_groups:
                    group["lr"] = _learning_rate(config, step, steps_per_epoch, total_steps)
                images = _augment(train_x[batch], config, augment)
                loss = torch.nn.functional.cross_entropy(
                    model(images), train_y[batch], label_smoothing=config.label_smoothing
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step += 1
            history.append(_accuracy(model, val_x, val_y))
            if on_epoch is not None:
                on_epoch(epoch, history[-1])
            if epoch < config.epochs and should_stop(history, best_history, config.epochs, config.theta, config.grace):
                early_stopped = True
                break
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    return {
        "accuracy": history[-1],
        "accuracy_history": history,
        "early_stopped": early_stopped,
        "epochs_run": len(history),
        "train_seconds": round(seconds, 3),
        "candidate_params": int(candidate_params),
    }
