"""``kdsl bench network``: the ResNet-18 written in kdsl/discover/network.py, its replaced convolutions
on both backends, and the command on a tiny setting (no timed assertions)."""

from __future__ import annotations

import json

import pytest
from backends import backend

from kdsl import gallery
from kdsl.cli import main
from kdsl.discover.network import (
    NetworkOp,
    network_latency,
    parse_op_spec,
    resnet18,
    resolve_ops,
    stage_layers,
    tvm_network,
)
from kdsl.lang.errors import KdslError, ShapeError
from kdsl.search.store import Store
from kdsl.solve.layers import load_layers

torch = backend("torch")

#: ResNet-18 with 1000 classes (the published count, e.g. torchvision's model card)
RESNET18_PARAMS = 11_689_512
#: how many stride-1 3x3 convs with Cin = Cout each stage has: 4 in the first, 3 in the others
#: (the first conv of stages 2-4 has stride 2)
REPLACED_PER_STAGE = {64: 4, 128: 3, 256: 3, 512: 3}


def params(net) -> int:
    count = sum(p.numel() for p in net.parameters())
    assert count > 0
    return count


def replaced(net) -> list:
    found = [module for module in net.modules() if type(module).__name__ == "Replaced"]
    assert all(hasattr(module, "binding") for module in found)
    return found


def test_original_resnet18_has_imagenet_shapes_and_the_published_parameter_count():
    net = resnet18()
    with torch.no_grad():
        out = net(torch.randn(1, 3, 224, 224))
    assert tuple(out.shape) == (1, 1000) and params(net) == RESNET18_PARAMS
    assert not replaced(net)


def test_kdsl_conv2d_network_has_the_same_parameters_and_13_replaced_layers():
    net = resnet18(NetworkOp("conv2d", gallery.load("conv2d")))
    layers = replaced(net)
    assert params(net) == RESNET18_PARAMS and len(layers) == sum(REPLACED_PER_STAGE.values())
    widths = [module.binding["Cin"] for module in layers]
    assert {width: widths.count(width) for width in set(widths)} == REPLACED_PER_STAGE


@pytest.mark.parametrize("groups", [None, 2])
def test_grouped_conv2d_divides_the_replaced_layers_parameters_by_g(groups):
    spec = "grouped_conv2d" if groups is None else f"grouped_conv2d:G={groups}"
    (item,) = resolve_ops([spec])
    g = groups or 4  # grouped_conv2d's default
    full = sum(count * width * width * 9 for width, count in REPLACED_PER_STAGE.items())
    assert params(resnet18(item)) == RESNET18_PARAMS - full + full // g


def test_stage_layers_are_the_resnet18_table_at_imagenet_size():
    assert stage_layers(1, 224) == load_layers("resnet18")
    assert [layer["H"] for layer in stage_layers(8, 32)] == [8, 4, 2, 1]


def test_the_kdsl_conv2d_network_computes_the_native_network_with_the_same_weights():
    native = resnet18(resolution=32, classes=10)
    mine = resnet18(NetworkOp("conv2d", gallery.load("conv2d")), resolution=32, classes=10)
    layers = (torch.nn.Conv2d, torch.nn.Linear, torch.nn.BatchNorm2d)
    theirs_in_order = [m for m in native.modules() if isinstance(m, layers)]
    ours_in_order = [m for m in mine.modules() if isinstance(m, layers) or type(m).__name__ == "Replaced"]
    assert len(ours_in_order) == len(theirs_in_order)
    with torch.no_grad():
        for ours, theirs in zip(ours_in_order, theirs_in_order):
            if type(ours).__name__ == "Replaced":
                ours.inner.weight.copy_(theirs.weight)
            elif isinstance(ours, (torch.nn.Conv2d, torch.nn.Linear, torch.nn.BatchNorm2d)):
                ours.load_state_dict(theirs.state_dict())
        x = torch.randn(2, 3, 32, 32)
        expected, actual = native(x), mine(x)
    assert torch.allclose(actual, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


@pytest.mark.parametrize("spec", ["conv2d", "grouped_conv2d:G=2", "depthwise_separable_conv2d"])
def test_the_tvm_kernel_network_computes_the_pytorch_module_network(spec):
    (item,) = resolve_ops([spec], resolution=32)
    net = resnet18(item, batch=2, resolution=32, classes=10)
    compiled = tvm_network(net)
    assert len(replaced(compiled)) == 13
    assert all(type(module.inner).__name__ == "TvmConv" for module in replaced(compiled))

    # the TVM network is a copy with the same weights
    def checksums(module):
        found = sorted((tuple(p.shape), round(p.double().sum().item(), 6)) for p in module.parameters())
        assert found
        return found

    assert checksums(net) == checksums(compiled)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected, actual = net(x), compiled(x)
    assert torch.allclose(actual, expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())


def test_tvm_network_refuses_the_original_network():
    with pytest.raises(KdslError, match="built with an operator"):
        tvm_network(resnet18(resolution=32, classes=10))


def test_operator_names_take_coefficients_after_a_colon():
    assert parse_op_spec("grouped_conv2d:G=2,K=3") == ("grouped_conv2d", {"G": 2, "K": 3})
    assert parse_op_spec("dir:name/op.dsl") == ("dir:name/op.dsl", {})  # a colon that is no coefficient
    with pytest.raises(KdslError, match="given twice"):
        parse_op_spec("grouped_conv2d:G=2,G=4")


@pytest.mark.parametrize(
    ("specs", "error", "match"),
    [
        (["no_such_operator"], KdslError, "no_such_operator"),
        (["grouped_conv2d:Q=2"], KdslError, "no coefficient Q"),
        (["strided_conv2d"], ShapeError, "cannot replace ResNet-18's 3x3 convolutions at conv2_x"),
        (["grouped_conv2d:G=3"], KdslError, "G"),  # 3 divides no width
        (["conv2d", "conv2d"], KdslError, "given twice"),
        ([], KdslError, "at least one operator"),
    ],
)
def test_bad_operators_are_named(specs, error, match):
    with pytest.raises(error, match=match):
        resolve_ops(specs)


def test_a_candidate_key_is_read_from_a_results_database(tmp_path):
    op = gallery.load("grouped_conv2d")
    db = tmp_path / "runs.db"
    store = Store(db)
    lease = store.claim("fingerprint", "enumerate", 0, "test")
    row = {"key": op.key, "dsl": op.to_dsl(), "depth": 6, "status": "valid", "flops": 1, "params": 1}
    store.commit(lease, [row], {"cursor": [1]}, release=True)
    store.close()
    (item,) = resolve_ops([f"{op.key[:10]}:G=2"], db=str(db))
    assert item.op.key == op.key and item.coefficients == {"G": 2} and item.label == f"{op.key[:10]}:G=2"
    with pytest.raises(KdslError, match="no candidate"):
        resolve_ops(["ffffffff"], db=str(db))


def test_the_command_prints_a_row_per_operator_backend_and_batch(capsys):
    argv = ["bench", "network", "--ops", "conv2d", "grouped_conv2d:G=2", "--resolution", "32", "--classes", "10"]
    code = main([*argv, "--batch", "1", "2", "--repeats", "1", "--target", "0.001", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["resolution"] == 32
    rows = {(row["op"], row["backend"], row["batch"]): row for row in report["rows"]}
    expected = set()
    for batch in (1, 2):
        expected |= {(op, "torch", batch) for op in ("original (native conv2d)", "conv2d", "grouped_conv2d:G=2")}
        expected |= {
            (op, "tvm", batch)
            for op in (
                "original (native conv2d, reference)",
                "original (kdsl TVM conv2d)",
                "conv2d",
                "grouped_conv2d:G=2",
            )
        }
    assert set(rows) == expected
    assert all(row["ms"] > 0 and row["ratio"] > 0 and row["threads"] == 2 for row in rows.values())
    # ratios are to each backend's own original network; kdsl's TVM conv2d network *is* the TVM one
    assert rows[("original (native conv2d)", "torch", 1)]["ratio"] == 1.0
    assert rows[("conv2d", "tvm", 2)]["ratio"] == 1.0 == rows[("original (kdsl TVM conv2d)", "tvm", 2)]["ratio"]
    assert rows[("original (native conv2d, reference)", "tvm", 1)]["vs_native"] == 1.0


def test_the_command_table_names_what_is_replaced_and_what_stays(capsys):
    argv = ["bench", "network", "--ops", "conv2d", "--resolution", "32", "--classes", "10", "--backends", "torch"]
    code = main([*argv, "--batch", "1", "--repeats", "1", "--target", "0.001"])
    out = capsys.readouterr().out
    assert code == 0 and "the 13 stride-1 3x3 convolutions" in out and "2 threads" in out
    assert "stride-2 3x3 convolutions and their 1x1 projection shortcuts" in out
    rows = [line.split() for line in out.splitlines() if line.split()[-6:-5] == ["1"]]
    assert [row[-7] for row in rows] == ["torch", "torch"] and "tvm " not in out


def test_the_command_rejects_a_resolution_resnet_cannot_halve(capsys):
    code = main(["bench", "network", "--ops", "conv2d", "--resolution", "48"])
    assert code == 2 and "multiple of 32" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_the_command_refuses_cuda_in_one_line_without_a_gpu(capsys):
    code = main(["bench", "network", "--ops", "conv2d", "--device", "cuda", "--resolution", "32"])
    err = capsys.readouterr().err
    assert code == 2 and "no CUDA device" in err and len(err.strip().splitlines()) == 1


def test_tvm_networks_on_cuda_are_refused_with_what_to_do():
    with pytest.raises(KdslError, match="--backends torch"):
        network_latency(["conv2d"], backends=("tvm",), device="cuda")
    with pytest.raises(KdslError, match="unknown device 'tpu'"):
        network_latency(["conv2d"], device="tpu")
