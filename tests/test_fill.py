"""The solver for free widths (Canvas §6.2-6.3): freedom, per-layer multiples, budget filling.

Canvas's worked example (its Fig. 3) is reproduced exactly; squeeze-excitation and involution are
written with free widths, shown to be the gallery's kernels when the widths are the gallery's, and
filled to a budget, after which PyTorch's hand-written kernels agree with ours on every layer.
"""

from __future__ import annotations

import graph_kernels
import pytest
from backends import backend
from hypothesis import given, settings
from hypothesis import strategies as st

from kdsl import solve
from kdsl.lang import FC, Input, Map, Output, Product, Rename, coefficient, dynamic, library, primary
from kdsl.lang.errors import LayerError
from kdsl.lang.primitives import Dim, Merge, Reduce, Share, Split, Unfold, Weight
from kdsl.solve.dynamic import BudgetError, fill, multiples
from kdsl.solve.widths import freedom

N, Cin, H, W = primary("N Cin H W")
G, K, S, r = coefficient("G K S r")
x1, x2 = dynamic("x1 x2")


def squeeze_excitation(width=x1, defaults=None):
    """The gallery's squeeze-excitation (channels Cin, hidden dim z) with its hidden width free."""
    return graph_kernels.squeeze_excitation(width, defaults, channels="Cin", hidden_name="z")


def involution(hidden=x1, span=x2, defaults=None):
    """The gallery's involution with both FC widths free; span's is matched at the Product."""
    x = Input(N, Cin, H, W)
    window = x >> Split(Cin, S, "g", "ci") >> Unfold(H, K, "kh") >> Unfold(W, K, "kw")
    kernel = (
        x
        >> FC(Cin, name="z", size=hidden, weight="reduce")
        >> Map("relu")
        >> FC("z", name="q", size=span, weight="span")
        >> Split("q", K**2, "g", "kk")
        >> Split("kk", K, "kh", "kw")
    )
    return (
        Product(window, kernel, "kh", "kw")
        >> Merge("g", "ci", "C")
        >> Output(N, "C", H, W, defaults=defaults or {"K": 3, "S": 16})
    )


def fig3_kernel():
    """Canvas Fig. 3: a branch [G*K, H, W] broadcast into one of free width x1: x1 must be a
    multiple of G*K. In named dims: x1 is split into (q, c) with c = G*K, the [c] branch is blended
    over q, and an FC maps the result back to the channels."""
    x = Input(N, Cin, H, W)
    grouped = (
        x >> Unfold(H, K, "kh") >> Split(Cin, Cin / G, "g", "ci") >> Reduce("ci", mean=True) >> Merge("g", "kh", "c")
    )
    wide = x >> FC(Cin, name="z", size=x1, weight="up") >> Split("z", G * K, "q", "c")
    blended = (wide * grouped) >> Merge("q", "c", "z") >> FC("z", name="o", size=Cin, weight="down")
    return blended >> Rename("o", "C") >> Output(N, "C", H, W, defaults={"G": 4})


# Canvas's two targets: K_H = 3 and 5 (a per-layer window), G = 4, and four times the channels
FIG3_LAYERS = [
    {"name": "target1", "N": 1, "Cin": 64, "H": 8, "W": 8, "K": 3},
    {"name": "target_i", "N": 1, "Cin": 256, "H": 8, "W": 8, "K": 5},
]


def test_canvas_fig3_lcm_base_and_doubling_reproduced_exactly():
    op = fig3_kernel()
    assert {k: str(v) for k, v in freedom(op).items()} == {"x1": "G*K"}
    assert multiples(op, FIG3_LAYERS) == [{"x1": 12}, {"x1": 20}]
    free = fill(op, FIG3_LAYERS)
    # k_i = ceil(C_i lcm_1 / (C_1 lcm_i)) = ceil(256 * 12 / (64 * 20)) = 3, so x_i = 60
    assert [v["x1"] for v in free.base] == [12, 60] and free.values == free.base
    # a budget that holds two doublings of both (48 and 240) but not a third of either
    target = sum(solve.cost(op, {**layer, "x1": x})["params"] for layer, x in zip(FIG3_LAYERS, (48, 240)))
    filled = fill(op, FIG3_LAYERS, max_params=target)
    assert [v["x1"] for v in filled.values] == [48, 240]
    assert filled.total["params"] == target


def test_free_width_kernels_are_the_gallerys_when_the_widths_are():
    gallery_se = library.load("squeeze_excitation")
    assert squeeze_excitation().substituted({"x1": Cin / r}).key == gallery_se.key
    gallery_involution = library.load("involution")
    assert involution().substituted({"x1": Cin / r}).key == gallery_involution.key
    assert involution().dynamic_variables == ("x1",)  # span's width was matched: Cin*K**2/S


def test_relative_budget_is_a_multiple_of_conv2d_and_is_used_not_exceeded():
    filled = fill(involution(), "resnet18", max_flops="0.25x")
    conv = library.load("conv2d")
    conv_flops = solve.total_cost(conv, "resnet18")["flops"]
    assert filled.baseline["flops"] == conv_flops
    assert filled.total["flops"] <= conv_flops // 4
    for index, layer in enumerate(filled.layers):
        more = {**filled.values[index], "x1": filled.values[index]["x1"] * 2}
        grown = (
            filled.total["flops"]
            - filled.costs[index]["flops"]
            + solve.cost(filled.op, {**layer.values, **more})["flops"]
        )
        assert grown > conv_flops // 4
    assert "MACs budget" in filled.report()


def test_base_widths_over_budget_is_a_budget_error_that_names_the_widths():
    with pytest.raises(BudgetError, match="x1=1.*more than the budget"):
        fill(squeeze_excitation(), "resnet18", max_params=10)


def test_fill_needs_a_free_width_and_a_readable_budget():
    with pytest.raises(LayerError, match="no free width"):
        fill(library.load("conv2d"), "resnet18", max_flops="0.5x")
    with pytest.raises(BudgetError, match="bad budget"):
        fill(squeeze_excitation(), "resnet18", max_flops="lots")


@pytest.mark.parametrize("name", ["squeeze_excitation", "involution"])
def test_filled_kernels_match_their_hand_written_pytorch(name):
    torch = backend("torch")
    from kdsl.codegen import reference
    from kdsl.codegen import torch as kdsl_torch
    from kdsl.codegen.native import BRANCHING

    template = squeeze_excitation() if name == "squeeze_excitation" else involution()
    layers = [{**layer.values, "N": 2} for layer in solve.load_layers("resnet18")[::3]]
    filled = fill(template, layers, max_params="0.05x")
    prepare, native = BRANCHING[name]
    for item, widths in zip(filled.layers, filled.values):
        layer = item.values
        assert widths["x1"] >= 1
        x, weights = reference.random_inputs(template, layer, seed=3, dtype="float64")
        module = kdsl_torch.build(template, layer).double()
        with torch.no_grad():
            for parameter, value in zip(module.weights, weights, strict=True):
                parameter.copy_(torch.from_numpy(value))
            got = module(torch.from_numpy(x))
        values = solve.bind(template, layer)
        tensors = [torch.from_numpy(w) for w in weights]
        with torch.no_grad():
            want = native(torch.from_numpy(x), prepare(tensors, values), values)
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-9), (item.name, widths)


# -- properties ------------------------------------------------------------------------------------


def _mlp():
    x = Input(N, Cin, H, W)
    return (
        (x >> FC(Cin, name="z", size=x1, weight="up") >> Map("relu") >> FC("z", name="c", size=Cin, weight="down"))
        >> Rename("c", "Cin")
        >> Output(N, Cin, H, W)
    )


def _grouped_width():
    """x1 split into G groups, each a conv over its share of channels: x1 must be a multiple of G."""
    x = Input(N, Cin, H, W)
    w = Weight("g", Dim("co", x1 / G), "ci", "kh", name="w")
    body = (
        x
        >> Split(Cin, Cin / G, "g", "ci")
        >> Unfold(H, K, "kh")
        >> Share(w)
        >> Reduce("ci", "kh")
        >> Merge("g", "co", "z")
    )
    return (
        body
        >> FC("z", name="c", size=Cin, weight="back")
        >> Rename("c", "Cin")
        >> Output(N, Cin, H, W, defaults={"G": 2, "K": 3})
    )


TEMPLATES = {"se": squeeze_excitation, "mlp": _mlp, "grouped": _grouped_width, "fig3": fig3_kernel}


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(sorted(TEMPLATES)),
    channels=st.lists(st.sampled_from([8, 16, 24, 32, 48]), min_size=1, max_size=3),
    metric=st.sampled_from(["flops", "params"]),
    scale=st.floats(min_value=1.0, max_value=40.0),
)
def test_a_filled_template_is_valid_within_budget_and_full(name, channels, metric, scale):
    op = TEMPLATES[name]()
    layers = [{"name": f"l{i}", "N": 1, "Cin": c, "H": 4, "W": 4, "K": 3} for i, c in enumerate(channels)]
    base = fill(op, layers)
    limit = int(base.total[metric] * scale)
    filled = fill(op, layers, **{f"max_{metric}": limit})
    solve.check(op, filled.layers)  # valid on every layer
    assert filled.total[metric] <= limit
    for index, (layer, widths) in enumerate(zip(filled.layers, filled.values)):
        for width in widths:
            assert widths[width] % filled.multiples[index][width] == 0
            assert widths[width] >= base.values[index][width]
            doubled = solve.cost(op, {**layer.values, width: widths[width] * 2})[metric]
            grown = filled.total[metric] - filled.costs[index][metric] + doubled
            assert grown > limit, (layer.name, width, widths[width])


# -- the command line ------------------------------------------------------------------------------


def test_kdsl_check_fills_a_template_to_a_relative_budget(capsys, tmp_path):
    from kdsl.cli import main

    source = tmp_path / "involution_free.dsl"
    source.write_text(involution().to_dsl())
    assert main(["check", str(source), "--layers", "resnet18", "--max-flops", "0.25x"]) == 0
    out = capsys.readouterr().out
    assert "a template with the free widths x1" in out and "x1 may be any width" in out
    filled = fill(involution(), "resnet18", max_flops="0.25x")
    for layer, widths in zip(filled.layers, filled.values):
        row = next(line for line in out.splitlines() if line.strip().startswith(layer.name))
        assert row.split()[2] == str(widths["x1"])
    assert "MACs budget" in out and "% used" in out
    # a budget the least widths cannot meet is a clear error, not a traceback
    assert main(["check", str(source), "--max-flops", "1"]) != 0
    assert "more than the budget" in capsys.readouterr().err
