"""The proxy task's data: scikit-learn's digits by default, or a user's local images, without code.

A data set is named by a short spec (``kdsl discover --data SPEC``):

- ``digits`` (the default): scikit-learn's bundled 1,797 grey 8x8 digits; nothing to download.
- ``cifar10:DIR`` / ``cifar100:DIR``: a local copy in torchvision's on-disk format, the folder
  ``cifar-10-batches-py`` (``data_batch_1`` .. ``data_batch_5`` and ``test_batch``) or
  ``cifar-100-python`` (``train`` and ``test``, fine labels), or the folder that holds it.
- ``npz:FILE``: a NumPy ``.npz`` with arrays ``x`` (``[n, c, h, w]`` or ``[n, h, w]``; ``uint8``
  read as 0..255, otherwise as is) and ``y`` (``n`` integer labels ``0 .. classes-1``); optional
  ``x_val`` and ``y_val`` are the validation set (else a stratified split of ``x``).
- ``folder:DIR``: one sub-folder per class (sorted names are the classes) of image files (PNG,
  JPEG, ... read with Pillow), converted to grey when every image is grey, else RGB, and resized
  to the first image's size.

Parsing never runs code: CIFAR's pickles are read by an unpickler that accepts only the few
NumPy reconstructors an array needs (anything else is refused with a :class:`DataError`) and an
``.npz`` is read with ``allow_pickle=False``.

Every loader returns a :class:`Data`: float32 images ``[n, c, h, w]`` standardized per channel
with the training set's mean and standard deviation, int64 labels, and the number of classes.

>>> data = load("digits")
>>> data.train_x.shape, data.val_x.shape, data.classes, data.channels, data.image_size
((1347, 1, 8, 8), (450, 1, 8, 8), 10, 1, 8)
>>> parse_spec("cifar10:/data/cifar")
('cifar10', '/data/cifar')
"""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from kdsl.lang.errors import KdslError, printable

__all__ = ["KINDS", "Data", "DataError", "load", "parse_spec", "safe_unpickle"]

#: The kinds of data spec, with what follows the colon.
KINDS = {
    "digits": "",
    "cifar10": "DIR",
    "cifar100": "DIR",
    "npz": "FILE",
    "folder": "DIR",
}


class DataError(KdslError):
    """A data spec or a data file that cannot be read; the message names the file and the problem."""


@dataclass(frozen=True)
class Data:
    """A proxy data set: standardized float32 images ``[n, c, h, w]`` and int64 labels."""

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    classes: int

    @property
    def channels(self) -> int:
        return int(self.train_x.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.train_x.shape[2])


def parse_spec(spec: str) -> tuple[str, str]:
    """``(kind, path)`` of a data spec; an unknown kind or a missing path is a :class:`DataError`.

    >>> parse_spec("digits"), parse_spec("npz:my.npz")
    (('digits', ''), ('npz', 'my.npz'))
    >>> parse_spec("mnist")
    Traceback (most recent call last):
    ...
    kdsl.discover.data.DataError: unknown data 'mnist'; use digits, cifar10:DIR, cifar100:DIR, npz:FILE or folder:DIR
    """
    kind, _, path = str(spec).partition(":")
    usage = ", ".join(k + (f":{v}" if v else "") for k, v in KINDS.items())
    usage = usage.rsplit(", ", 1)[0] + " or " + usage.rsplit(", ", 1)[1]
    if kind not in KINDS:
        raise DataError(f"unknown data {printable(str(spec))!r}; use {usage}")
    if KINDS[kind] and not path:
        raise DataError(f"--data {kind} needs a path: {kind}:{KINDS[kind]}")
    if not KINDS[kind] and path:
        raise DataError(f"--data {kind} takes no path (got {printable(path)!r})")
    return kind, path


# ---------------------------------------------------------------------------------------------
# Safe pickles (CIFAR)

#: The only globals a CIFAR pickle may name: NumPy's array reconstructors (numpy 1 and 2 spell
#: the module differently) and the codec Python 3 uses for bytes in protocol-2 pickles.
_SAFE_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _SAFE_GLOBALS:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a data file has no business calling")
        return super().find_class(module, name)


def safe_unpickle(path: Path) -> Any:
    """The object in the pickle ``path``, if it holds only plain values and NumPy arrays.

    Any other global (a function, a class) is refused before it is called: a :class:`DataError`.
    """
    try:
        with open(path, "rb") as handle:
            return _SafeUnpickler(handle, encoding="bytes").load()
    except OSError as error:
        raise DataError(f"cannot read {printable(str(path))}: {error.strerror or error}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as error:
        raise DataError(f"{printable(str(path))} is not a CIFAR batch file in torchvision's format: {error}") from None


def _field(batch: Any, path: Path, *names: str) -> Any:
    if not isinstance(batch, dict):
        raise DataError(f"{printable(str(path))} holds a {type(batch).__name__}, not the dict of a CIFAR batch")
    for name in names:
        for key in (name.encode(), name):
            if key in batch:
                return batch[key]
    raise DataError(f"{printable(str(path))} has no {' or '.join(repr(n) for n in names)} entry")


def _cifar_batch(path: Path, label_names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    batch = safe_unpickle(path)
    data = _field(batch, path, "data")
    labels = _field(batch, path, *label_names)
    if not isinstance(data, np.ndarray) or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        shape = getattr(data, "shape", type(data).__name__)
        raise DataError(f"{printable(str(path))}: 'data' must be an array [n, 3072] (3x32x32 images), got {shape}")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError):
        raise DataError(f"{printable(str(path))}: the labels are not integers") from None
    if y.shape != (data.shape[0],):
        raise DataError(f"{printable(str(path))}: {data.shape[0]} images but {y.size} labels")
    return data.reshape(-1, 3, 32, 32).astype(np.float32) / 255.0, y


def _cifar(kind: str, root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    folder_name = "cifar-10-batches-py" if kind == "cifar10" else "cifar-100-python"
    if (root / folder_name).is_dir():
        root = root / folder_name
    if kind == "cifar10":
        train_files, test_files, labels, classes = (
            [f"data_batch_{i}" for i in range(1, 6)],
            ["test_batch"],
            ("labels",),
            10,
        )
    else:
        train_files, test_files, labels, classes = ["train"], ["test"], ("fine_labels",), 100
    if not root.is_dir():
        raise DataError(f"{kind}: {printable(str(root))} is not a folder (give the folder {folder_name} or its parent)")
    missing = [name for name in train_files + test_files if not (root / name).is_file()]
    if missing:
        raise DataError(
            f"{kind}: {printable(str(root))} lacks {', '.join(missing)}; expected torchvision's {folder_name} "
            f"folder ({', '.join(train_files + test_files)})"
        )
    parts = [_cifar_batch(root / name, labels) for name in train_files]
    tests = [_cifar_batch(root / name, labels) for name in test_files]
    train_x, train_y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    val_x, val_y = np.concatenate([p[0] for p in tests]), np.concatenate([p[1] for p in tests])
    for y, name in ((train_y, train_files[0]), (val_y, test_files[0])):
        if y.size and (y.min() < 0 or y.max() >= classes):
            raise DataError(f"{kind}: {printable(str(root / name))} has labels outside 0..{classes - 1}")
    return train_x, train_y, val_x, val_y, classes


# ---------------------------------------------------------------------------------------------
# NPZ and image folders


def _images(x: Any, where: str) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.ndim not in (3, 4) or x.dtype.kind not in "uif":
        shape = getattr(x, "shape", None)
        raise DataError(f"{where} must be a numeric array [n, c, h, w] or [n, h, w], got shape {shape}")
    if x.ndim == 3:
        x = x[:, None]
    if x.shape[2] != x.shape[3]:
        raise DataError(f"{where}: images must be square, got {x.shape[2]}x{x.shape[3]}")
    if x.shape[0] == 0 or x.shape[2] == 0:
        raise DataError(f"{where} holds no images")
    x = x.astype(np.float32) / (255.0 if x.dtype == np.uint8 else 1.0)
    if not np.isfinite(x).all():
        raise DataError(f"{where} holds NaN or infinite values")
    return x


def _labels(y: Any, n: int, where: str) -> np.ndarray:
    if not isinstance(y, np.ndarray) or y.dtype.kind not in "iu" or y.shape != (n,):
        raise DataError(
            f"{where} must be {n} integer labels (one per image), got {getattr(y, 'dtype', '?')} "
            f"{getattr(y, 'shape', '?')}"
        )
    if y.min() < 0:
        raise DataError(f"{where} has negative labels; use 0 .. classes-1")
    return y.astype(np.int64)


def _npz(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, int]:
    name = printable(str(path))
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except OSError as error:
        raise DataError(f"cannot read {name}: {error}") from None
    except (ValueError, zipfile.BadZipFile, EOFError) as error:
        raise DataError(f"{name} is not a NumPy .npz file of plain arrays: {error}") from None
    for key in ("x", "y"):
        if key not in arrays:
            raise DataError(f"{name} has no array {key!r} (it has {', '.join(sorted(arrays)) or 'none'})")
    x = _images(arrays["x"], f"{name}: x")
    y = _labels(arrays["y"], len(x), f"{name}: y")
    val_x = val_y = None
    if ("x_val" in arrays) != ("y_val" in arrays):
        raise DataError(f"{name}: give both x_val and y_val, or neither")
    if "x_val" in arrays:
        val_x = _images(arrays["x_val"], f"{name}: x_val")
        val_y = _labels(arrays["y_val"], len(val_x), f"{name}: y_val")
        if val_x.shape[1:] != x.shape[1:]:
            raise DataError(f"{name}: x_val's images are {list(val_x.shape[1:])}, x's are {list(x.shape[1:])}")
    classes = int(max(y.max(), val_y.max() if val_y is not None else 0)) + 1
    return x, y, val_x, val_y, classes


_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".pgm", ".pbm", ".tif", ".tiff", ".webp"}


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise DataError("--data folder:DIR reads images with Pillow; install it with: pip install pillow") from None
    return Image


def _folder(root: Path) -> tuple[np.ndarray, np.ndarray, None, None, int]:
    name = printable(str(root))
    if not root.is_dir():
        raise DataError(f"folder: {name} is not a folder")
    classes = sorted(p for p in root.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise DataError(f"folder: {name} needs one sub-folder per class (at least 2), found {len(classes)}")
    image_module = _pillow()
    files = [
        (index, f)
        for index, folder in enumerate(classes)
        for f in sorted(folder.iterdir())
        if f.suffix.lower() in _IMAGE_SUFFIXES
    ]
    empty = [c.name for i, c in enumerate(classes) if not any(index == i for index, _ in files)]
    if empty:
        raise DataError(f"folder: {name}: the class folders {', '.join(map(printable, empty))} hold no images")
    pictures = []
    for _, path in files:
        try:
            with image_module.open(path) as picture:
                picture.load()
                pictures.append(picture.copy())
        except (OSError, ValueError, SyntaxError) as error:  # Pillow's errors for broken files
            raise DataError(f"folder: cannot read the image {printable(str(path))}: {error}") from None
    grey = all(p.mode in ("1", "L", "I", "I;16", "F") for p in pictures)
    width, height = pictures[0].size
    size = min(width, height)
    arrays = []
    for picture in pictures:
        picture = picture.convert("L" if grey else "RGB")
        if picture.size != (size, size):
            picture = picture.resize((size, size), image_module.Resampling.BILINEAR)
        array = np.asarray(picture, dtype=np.float32) / 255.0
        arrays.append(array[None] if grey else array.transpose(2, 0, 1))
    x = np.stack(arrays)
    y = np.array([index for index, _ in files], dtype=np.int64)
    return x, y, None, None, len(classes)


def _digits() -> tuple[np.ndarray, np.ndarray, None, None, int]:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError(
            "the default proxy data (digits) comes with scikit-learn; install it with: "
            "pip install 'kdsl[search]' (or pip install scikit-learn)"
        ) from None
    digits = load_digits()
    return (digits.images[:, None] / 16.0).astype(np.float32), digits.target.astype(np.int64), None, None, 10


# ---------------------------------------------------------------------------------------------
# Splitting, standardizing


def _split(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A stratified split of the indices of ``y``: ``round(fraction * count)`` of each class to
    validation (at least one where a class has two or more images), the rest to training."""
    rng = np.random.default_rng(seed)
    train, val = [], []
    for label in np.unique(y):
        members = np.flatnonzero(y == label)
        rng.shuffle(members)
        cut = min(len(members) - 1, max(1, round(fraction * len(members)))) if len(members) > 1 else 0
        val.extend(members[:cut])
        train.extend(members[cut:])
    return np.sort(np.array(train, dtype=np.int64)), np.sort(np.array(val, dtype=np.int64))


def _stamp(path: str) -> tuple[int, ...]:
    """Modification times of a data path and of the folders and files right under it, so a
    changed file is read again rather than taken from the cache."""
    if not path:
        return ()
    root = Path(path).expanduser()
    try:
        entries = [root, *root.iterdir()] if root.is_dir() else [root]
        return tuple(entry.stat().st_mtime_ns for entry in entries)
    except OSError:
        return ()


def load(spec: str = "digits", split_seed: int = 0, validation_fraction: float = 0.25) -> Data:
    """The data set of ``spec`` (see the module's docstring), split and standardized.

    A validation set comes from the data where it has one (CIFAR's test batch, an npz's
    ``x_val``), else from a stratified split of ``validation_fraction`` (seeded by ``split_seed``).
    Loaded data stays cached in the process until its files change.
    """
    _, path = parse_spec(spec)
    return _load(str(spec), _stamp(path), split_seed, validation_fraction)


@lru_cache(maxsize=4)
def _load(spec: str, stamp: tuple[int, ...], split_seed: int, validation_fraction: float) -> Data:
    kind, path = parse_spec(spec)
    if kind == "digits":
        x, y, val_x, val_y, classes = _digits()
    elif kind in ("cifar10", "cifar100"):
        x, y, val_x, val_y, classes = _cifar(kind, Path(path).expanduser())
    elif kind == "npz":
        x, y, val_x, val_y, classes = _npz(Path(path).expanduser())
    else:
        x, y, val_x, val_y, classes = _folder(Path(path).expanduser())
    if classes < 2:
        raise DataError(f"{printable(str(spec))}: the labels name only one class; a classifier needs two or more")
    if val_x is None or val_y is None:
        train_idx, val_idx = _split(y, validation_fraction, split_seed)
        if not len(val_idx) or not len(train_idx):
            raise DataError(
                f"{printable(str(spec))}: {len(y)} images are too few to split into training and validation"
            )
        x, y, val_x, val_y = x[train_idx], y[train_idx], x[val_idx], y[val_idx]
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    std = x.std(axis=(0, 2, 3), keepdims=True)
    std = np.where(std > 0, std, 1.0)
    return Data(
        name=str(spec),
        train_x=((x - mean) / std).astype(np.float32),
        train_y=y,
        val_x=((val_x - mean) / std).astype(np.float32),
        val_y=val_y,
        classes=classes,
    )
