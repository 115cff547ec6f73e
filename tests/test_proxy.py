"""The proxy task: its network follows the data (channels, classes, size), its harder default
(fewer samples, shifts, noise), and `kdsl bench proxy` (spread over seeds, gallery vs weak)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from backends import backend

from kdsl import gallery, solve
from kdsl.bench.proxy_bench import GALLERY, WEAK, operators, proxy_spread
from kdsl.cli import main
from kdsl.discover import proxy
from kdsl.discover.proxy import ProxyConfig, data_info, load_data, proxy_layers, proxy_net, train
from kdsl.lang.errors import KdslError


@pytest.fixture
def rgb_npz(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "rgb.npz"
    np.savez(path, x=rng.integers(0, 256, (60, 3, 8, 8), dtype=np.uint8), y=np.arange(60) % 5)
    return f"npz:{path}"


def test_the_network_follows_the_data(rgb_npz):
    config = ProxyConfig(data=rgb_npz, widths=(8, 16), epochs=1, train_samples=None)
    assert data_info(config) == (3, 8, 5)
    assert [(layer["Cin"], layer["H"]) for layer in proxy_layers(config)] == [(8, 8), (16, 4)]
    torch = backend("torch")
    net = proxy_net(gallery.load("conv2d"), config)
    assert tuple(net(torch.zeros(2, 3, 8, 8)).shape) == (2, 5)
    result = train(gallery.load("conv2d"), config)
    assert result["epochs_run"] == 1 and 0.0 <= result["accuracy"] <= 1.0
    resized = ProxyConfig(data=rgb_npz, widths=(8,), image_size=4)
    assert tuple(load_data(resized)[0].shape[1:]) == (3, 4, 4)
    with pytest.raises(KdslError, match=r"image_size=8 must be divisible by 2\*\*4"):
        data_info(ProxyConfig(data=rgb_npz, widths=(8, 8, 8, 8, 8)))


def test_train_samples_are_a_stratified_subset():
    full = load_data(ProxyConfig(train_samples=None, noise=0.0))
    few = load_data(ProxyConfig(train_samples=200, noise=0.0))
    assert len(few[1]) == 200 and few[1].bincount().min() >= 19
    # the same images (a subset); the validation set keeps its images and gains the unused ones
    rows = {tuple(x.flatten().tolist()) for x in full[0]}
    assert all(tuple(x.flatten().tolist()) in rows for x in few[0][:20])
    assert few[2][: len(full[2])].equal(full[2]) and few[3][: len(full[3])].equal(full[3])
    assert len(few[3]) == len(full[3]) + len(full[1]) - 200
    kept = {tuple(x.flatten().tolist()) for x in few[0]}
    assert not any(tuple(x.flatten().tolist()) in kept for x in few[2][len(full[2]) :])
    alone = load_data(ProxyConfig(train_samples=200, noise=0.0, validate_on_unused=False))
    assert alone[2].equal(full[2])
    noisy = load_data(ProxyConfig(noise=0.5, validate_on_unused=False))[2]
    assert not noisy.equal(full[2]) and float((noisy - full[2]).std()) == pytest.approx(0.5, rel=0.05)


def test_augmentation_shifts_each_image_within_the_bound():
    torch = backend("torch")
    x = torch.randn(16, 2, 6, 6)
    config = ProxyConfig(shift=1, noise=0.0)
    moved = proxy._augment(x, config, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    offsets = []
    for image, original in zip(moved, padded, strict=True):
        found = [(a, b) for a in range(3) for b in range(3) if original[:, a : a + 6, b : b + 6].equal(image)]
        assert found, "an augmented image is no shift of its original"
        offsets.append(found[0])
    assert len(set(offsets)) > 1
    assert proxy._augment(x, ProxyConfig(shift=0, noise=0.0), torch.Generator()).equal(x)


def test_bad_proxy_configs():
    with pytest.raises(KdslError, match="unknown data 'imagenet'"):
        ProxyConfig(data="imagenet")
    with pytest.raises(KdslError, match="shift and noise must not be negative"):
        ProxyConfig(noise=-1.0)
    with pytest.raises(KdslError, match="train_samples must be at least 2"):
        ProxyConfig(train_samples=1)


def test_the_weak_operators_fit_the_proxy():
    ops = operators()
    assert list(ops) == [*GALLERY, *WEAK]
    for name, op in ops.items():
        assert len(solve.check(op, proxy_layers())) == 2, name


def test_proxy_spread_statistics():
    config = ProxyConfig(widths=(8,), image_size=8, epochs=1, train_samples=200)
    result = proxy_spread(config, seeds=(0, 1), names=["conv2d", "channel_sum"])
    for row in result["operators"].values():
        a, b = row["accuracy"]
        assert row["mean"] == pytest.approx((a + b) / 2) and row["std"] == pytest.approx(abs(a - b) / 2**0.5)
    rankings = result["rankings"]
    assert result["ranking_stable"] == (rankings[0] == rankings[1])
    by_seed = [{n: row["accuracy"][i] for n, row in result["operators"].items()} for i in range(2)]
    assert result["separated"] == all(s["conv2d"] > s["channel_sum"] for s in by_seed)


def test_bench_proxy_on_the_command_line(capsys):
    code = main(
        [
            "bench",
            "proxy",
            "--runs",
            "1",
            "--epochs",
            "1",
            "--train-samples",
            "100",
            "--ops",
            "pointwise",
            "shift_1tap",
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["operators"]) == {"pointwise", "shift_1tap"} and result["config"]["train_samples"] == 100


def test_discover_refuses_bad_data_before_any_work(tmp_path, capsys):
    db = tmp_path / "runs.sqlite"
    assert main(["discover", "--data", "mnist", "--time-limit", "1", "--db", str(db)]) == 2
    assert "unknown data 'mnist'" in capsys.readouterr().err
    assert main(["discover", "--data", f"npz:{tmp_path / 'none.npz'}", "--time-limit", "1", "--db", str(db)]) == 2
    assert "none.npz" in capsys.readouterr().err and not db.exists()


def test_the_vgg_proxy_puts_the_candidate_in_every_convolution_the_widening_ones_too():
    torch = backend("torch")
    from kdsl.discover.loop import DiscoverConfig, _space
    from kdsl.lang.errors import SearchError

    config = ProxyConfig(backbone="vgg", widths=(8, 16), epochs=1)
    layers = proxy_layers(config)
    assert [layer.name for layer in layers] == ["stage1", "stage2_in", "stage2"]
    assert (layers[1]["Cin"], layers[1]["Cout"]) == (8, 16)
    net = proxy_net(gallery.load("conv2d"), config)
    candidates = [m for m in net.modules() if type(m).__name__.startswith("Stage")]
    assert len(candidates) == 3  # one per layer: stage1, the widening stage2_in, stage2
    assert tuple(net(torch.randn(2, 1, 16, 16)).shape) == (2, 10)
    # an operator that keeps the channels cannot widen a stage: refused before any work
    with pytest.raises(SearchError, match="Cin != Cout"):
        _space(DiscoverConfig(net="proxy-vgg", spec="conv2d_same_channels"))
    assert DiscoverConfig(net="proxy-vgg").proxy_config().backbone == "vgg"
