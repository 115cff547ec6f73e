"""The proxy's data loaders on tiny generated files of every format, and their errors."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from kdsl.discover import data
from kdsl.discover.data import DataError, load, parse_spec
from kdsl.lang.errors import KdslError


def _cifar_batch(path, n, labels_key, classes, seed):
    rng = np.random.default_rng(seed)
    batch = {
        b"batch_label": b"generated",
        labels_key: [int(v) for v in rng.integers(0, classes, n)],
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"filenames": [b"x.png"] * n,
    }
    with open(path, "wb") as handle:
        pickle.dump(batch, handle, protocol=2)
    return batch


def test_cifar10_in_torchvision_format(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    batches = [_cifar_batch(folder / f"data_batch_{i}", 4, b"labels", 10, i) for i in range(1, 6)]
    test = _cifar_batch(folder / "test_batch", 6, b"labels", 10, 9)
    loaded = load(f"cifar10:{tmp_path}")  # the parent folder works too
    assert loaded.train_x.shape == (20, 3, 32, 32) and loaded.val_x.shape == (6, 3, 32, 32)
    assert loaded.classes == 10 and loaded.channels == 3 and loaded.image_size == 32
    assert loaded.train_y.tolist() == [v for b in batches for v in b[b"labels"]]
    assert loaded.val_y.tolist() == test[b"labels"]
    # standardized per channel with the training set's statistics; pixel layout kept (CHW rows)
    first = batches[0][b"data"][0].reshape(3, 32, 32).astype(np.float32) / 255
    raw = np.concatenate([b[b"data"] for b in batches]).reshape(-1, 3, 32, 32).astype(np.float32) / 255
    expected = (first - raw.mean(axis=(0, 2, 3))[:, None, None]) / raw.std(axis=(0, 2, 3))[:, None, None]
    np.testing.assert_allclose(loaded.train_x[0], expected, rtol=1e-4, atol=1e-4)


def test_cifar100_reads_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train = _cifar_batch(folder / "train", 8, b"fine_labels", 100, 1)
    _cifar_batch(folder / "test", 3, b"fine_labels", 100, 2)
    loaded = load(f"cifar100:{folder}")
    assert loaded.classes == 100 and loaded.train_y.tolist() == train[b"fine_labels"]


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    _cifar_batch(folder / "test", 3, b"fine_labels", 100, 2)
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with open(folder / "train", "wb") as handle:
        pickle.dump({b"data": Evil(), b"fine_labels": [0]}, handle, protocol=2)
    with pytest.raises(DataError, match="train.*posix.system|train.*os.system") as caught:
        load(f"cifar100:{folder}")
    assert "no business" in str(caught.value)
    assert not marker.exists()


def test_cifar_errors_name_the_file_and_the_problem(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    with pytest.raises(DataError, match="lacks data_batch_1"):
        load(f"cifar10:{folder}")
    for i in range(1, 6):
        _cifar_batch(folder / f"data_batch_{i}", 2, b"labels", 10, i)
    (folder / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="test_batch is not a CIFAR batch"):
        load(f"cifar10:{folder}")
    with open(folder / "test_batch", "wb") as handle:
        pickle.dump({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}, handle, protocol=2)
    with pytest.raises(DataError, match=r"test_batch: 'data' must be an array \[n, 3072\]"):
        load(f"cifar10:{folder}")


def test_npz_with_and_without_a_validation_set(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (40, 12, 12), dtype=np.uint8)  # [n, h, w]: one channel
    y = np.arange(40) % 4
    np.savez(tmp_path / "plain.npz", x=x, y=y)
    loaded = load(f"npz:{tmp_path / 'plain.npz'}", 0, 0.3)
    assert loaded.channels == 1 and loaded.image_size == 12 and loaded.classes == 4
    assert len(loaded.train_y) == 28 and len(loaded.val_y) == 12
    assert np.bincount(loaded.val_y).tolist() == [3, 3, 3, 3]  # stratified
    np.savez(
        tmp_path / "val.npz",
        x=rng.random((10, 2, 8, 8)),
        y=np.arange(10) % 2,
        x_val=rng.random((4, 2, 8, 8)),
        y_val=np.array([0, 1, 1, 0]),
    )
    loaded = load(f"npz:{tmp_path / 'val.npz'}")
    assert loaded.train_x.shape == (10, 2, 8, 8) and loaded.val_y.tolist() == [0, 1, 1, 0]


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((4, 8, 8))}, "has no array 'y'"),
        ({"x": np.zeros((4, 8)), "y": np.zeros(4, int)}, r"x must be a numeric array \[n, c, h, w\]"),
        ({"x": np.zeros((4, 8, 6)), "y": np.zeros(4, int)}, "must be square"),
        ({"x": np.zeros((4, 8, 8)), "y": np.zeros(3, int)}, "must be 4 integer labels"),
        ({"x": np.zeros((4, 8, 8)), "y": np.zeros(4)}, "must be 4 integer labels"),
        ({"x": np.zeros((4, 8, 8)), "y": np.zeros(4, int)}, "only one class"),
        ({"x": np.zeros((4, 8, 8)), "y": np.arange(4), "x_val": np.zeros((1, 8, 8))}, "both x_val and y_val"),
    ],
)
def test_npz_errors(tmp_path, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError, match=message) as caught:
        load(f"npz:{tmp_path / 'bad.npz'}")
    assert "bad.npz" in str(caught.value)


def test_npz_that_holds_pickled_objects_or_is_not_an_npz(tmp_path):
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object), y=np.zeros(1, int))
    with pytest.raises(DataError, match="objects.npz is not a NumPy .npz file of plain arrays"):
        load(f"npz:{tmp_path / 'objects.npz'}")
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(DataError, match="text.npz"):
        load(f"npz:{tmp_path / 'text.npz'}")
    with pytest.raises(DataError, match="cannot read .*missing.npz"):
        load(f"npz:{tmp_path / 'missing.npz'}")


def test_image_folder(tmp_path):
    image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    for name in ("cat", "dog", "fox"):
        (tmp_path / name).mkdir()
        for i in range(4):
            pixels = rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)
            image.fromarray(pixels).save(tmp_path / name / f"{i}.png")
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    loaded = load(f"folder:{tmp_path}", 0, 0.25)
    assert loaded.classes == 3 and loaded.channels == 3 and loaded.image_size == 10
    assert len(loaded.train_y) + len(loaded.val_y) == 12 and sorted(set(loaded.val_y.tolist())) == [0, 1, 2]
    (tmp_path / "fox" / "broken.png").write_bytes(b"\x89PNG broken")
    with pytest.raises(DataError, match="cannot read the image .*broken.png"):
        load(f"folder:{tmp_path}", 1, 0.25)


def test_grey_image_folder_gives_one_channel(tmp_path):
    image = pytest.importorskip("PIL.Image")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(3):
            image.fromarray(np.full((6, 6), 40 * i, np.uint8), mode="L").save(tmp_path / name / f"{i}.png")
    assert load(f"folder:{tmp_path}").channels == 1
    (tmp_path / "c").mkdir()
    with pytest.raises(DataError, match="class folders c hold no images"):
        load(f"folder:{tmp_path}")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mnist", "unknown data 'mnist'"),
        ("cifar10", "needs a path"),
        ("digits:x", "takes no path"),
        ("folder:", "needs a path"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(DataError, match=message):
        parse_spec(spec)
    assert issubclass(DataError, KdslError)


def test_safe_unpickle_reads_arrays_and_plain_values(tmp_path):
    value = {"a": [1, 2.5, "x", b"y", None, (True,)], "b": np.arange(6, dtype=np.int16).reshape(2, 3)}
    (tmp_path / "ok.pickle").write_bytes(pickle.dumps(value, protocol=4))
    back = data.safe_unpickle(tmp_path / "ok.pickle")
    assert back["a"] == value["a"] and back["b"].tolist() == value["b"].tolist()
