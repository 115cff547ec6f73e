"""Renderers and the operator commands on branching kernels: the loop-nest listing and the SVG
show every node, branch and join; ``kdsl show`` and ``kdsl check`` read a DSL file of a branching
kernel (run as ``python -m kdsl.cli``, in a subprocess, like a user)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from graph_kernels import attention
from graph_kernels import squeeze_excitation as _squeeze_excitation
from hypothesis import given, settings

from kdsl import gallery
from kdsl.codegen.render import LOOP_NEST_RULES, graph_loop_nest, loop_nest, svg
from kdsl.lang import Blend, Input, Map, Output, Rename, Softmax, Unfold, coefficient, primary
from kdsl.lang.nonlinear import JOINS, UNARY
from kdsl.lang.operator import Operator
from kdsl.testing.strategies import graphs

ROOT = Path(__file__).resolve().parent.parent
N, C, H, W, R, P, D = primary("N C H W R P D")
G = coefficient("G")


def squeeze_excitation() -> Operator:
    return _squeeze_excitation(C / G, {"G": 4})


def test_every_node_kind_has_a_loop_nest_rule() -> None:
    assert set(LOOP_NEST_RULES) == {"Chain", *UNARY, *JOINS}


def test_loop_nest_has_a_block_per_node_and_the_join_reads_both_branches() -> None:
    text = loop_nest(squeeze_excitation())
    headers = re.findall(r"^# node (\d+)  (.*?)  (\S+(?:, \S+)?) -> (\S+)\[", text, flags=re.MULTILINE)
    assert [int(h[0]) for h in headers] == list(range(1, 8))
    assert headers[0][1:] == ("chain Reduce(H, W, mean)", "x", "t1")
    assert headers[-1][1:] == ("Blend(mul)", "x, t6", "out")
    # the branch's chain, its FCs (weights by name), the join broadcasting the gate over H, W
    for line in [
        "  t1[n, c] /= H * W",
        "    t2[n, r] += t1[n, c] * squeeze[r, c]",
        "  t3[n, r] = relu(t2[n, r])",
        "t6 = t5    # the same data; the dim c is called C from here on",
        "  out[n, c, h, w] = x[n, c, h, w] * t6[n, c]",
    ]:
        assert line in text.splitlines(), line


def test_attention_loop_nest_shows_products_softmax_and_the_output_order() -> None:
    lines = graph_loop_nest(attention()).splitlines()
    assert "# node 4  Product(d)  t1, t3 -> t4[N, P, Q]" in lines
    assert "    t4[n, p, Q] += t1[n, d, p] * t3[n, d, Q]" in lines
    assert "  s5 = sum(exp(t4[n, p, Q]) for Q < P)" in lines
    # the FC over C into a new dim c: the two loop variables stay distinct
    assert "    t6[n, c, p] += x[n, c_, p] * wv[c, c_]" in lines
    assert lines[-3:] == ["# the output [N, c, P]", "for n < N, c < C, p < P:", "  out[n, c, p] = t8[n, p, c]"]


def test_fold_after_a_window_says_padding_takes_no_part() -> None:
    K = coefficient("K")
    pool = Input(N, C, H) >> Unfold(H, K, "k") >> Map("abs") >> Output(N, C, H, "k", defaults={"K": 3})
    assert "padding" not in loop_nest(pool)
    text = loop_nest(gallery.load("max_pool2d"))
    assert "max(t1[" in text and "a window's zero padding takes no part" in text


def test_svg_draws_every_node_its_dims_and_the_joins() -> None:
    picture = svg(attention())
    assert picture.startswith("<svg") and picture.rstrip().endswith("</svg>")
    # one box per node and one for the output
    assert picture.count("<rect") == 1 + len(attention().nodes) + 1
    for text in [
        "input x",
        "1: FC(C -&gt; d: D)",
        "4: Product(d) (join)",
        "5: Softmax(Q)",
        "output [N: N, c: C, P: P]",
    ]:
        assert text in picture, text
    assert "[N: N, P: P, Q: P]" in picture  # a node's result dims
    # one arrow per argument: 8 nodes read 10 results, plus the output's
    assert picture.count('marker-end="url(#arrow)"') == 10 + 1
    assert picture.count(">lhs<") == picture.count(">rhs<") == 2


def test_svg_lists_a_chains_steps() -> None:
    picture = svg(gallery.load("involution"))
    for step in ["1: chain", "  Split(Cin, S)", "  Unfold(H, K)", "6: Product(kh, kw) (join)", "  Merge(g, ci)"]:
        assert f">{step}<" in picture, step


def test_linear_operators_render_as_in_the_gallery_pages() -> None:
    compared = 0
    for name in gallery.names():
        op = gallery.load(name)
        page = ROOT / "gallery" / "pages" / f"{name}.svg"
        if not op.is_linear or not page.exists():
            continue
        assert svg(op) == page.read_text(), name
        compared += 1
    assert compared >= 10


# ------------------------------------------------------------------------------------------------
# kdsl show / kdsl check on a DSL file of a branching kernel
# ------------------------------------------------------------------------------------------------


def kdsl(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "kdsl.cli", *argv], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )
    assert result.returncode in (0, 2), result.stderr
    return result


@pytest.fixture
def kernel_file(tmp_path: Path) -> Path:
    path = tmp_path / "se.dsl"
    path.write_text(squeeze_excitation().to_dsl())
    return path


def test_show_prints_nodes_constraints_formulas_loop_nest_and_svg(kernel_file: Path, tmp_path: Path) -> None:
    picture = tmp_path / "se.svg"
    result = kdsl("show", str(kernel_file), "--svg", str(picture))
    out = result.stdout
    assert result.returncode == 0, result.stderr
    for expected in [
        'Blend("mul", x, t2)',
        "weight squeeze[r: C/G, C: C]",
        "  2  FC(C -> r: C/G) of 1 -> [N: N, r: C/G]    MACs C**2*N/G",
        "  7  Blend(mul) of 0, 6 -> [N: N, C: C, H: H, W: W]    MACs C*H*N*W",
        "node 2 FC(C -> r: C/G): the FC output dim r: C/G must be a positive integer",
        "  MACs         2*C**2*N/G + 2*C*H*N*W + C*N + C*N/G",
        "  peak         2*C*H*N*W + C*N",
        "  # node 7  Blend(mul)  x, t6 -> out[N, C, H, W]",
        f"key: {squeeze_excitation().key}",
    ]:
        assert expected in out, expected
    assert picture.read_text().count("<rect") == 10


def test_check_prints_a_row_per_layer(kernel_file: Path, tmp_path: Path) -> None:
    table = tmp_path / "layers.json"
    table.write_text('[{"name": "a", "N": 1, "C": 64, "H": 8, "W": 8}, {"name": "b", "N": 2, "C": 32, "H": 4, "W": 4}]')
    result = kdsl("check", str(kernel_file), "--layers", str(table))
    assert result.returncode == 0, result.stderr
    assert f"{kernel_file}: valid on all 2 layers of {table} with G=4" in result.stdout
    assert "M MACs" in result.stdout and "peak elems" in result.stdout
    # layer a by hand (N=1): the mean and the product, 2*C*H*W; two FCs, 2*C*C/G; sigmoid C; relu C/G
    flops_a = 2 * 64 * 8 * 8 + 2 * 64 * 64 // 4 + 64 + 64 // 4
    assert re.search(rf"^  a\s+\[1, 64, 8, 8\]\s+\[1, 64, 8, 8\]\s+{flops_a / 1e6:.2f}\s+2048\s+", result.stdout, re.M)


def test_check_failure_is_one_line_naming_the_node_and_the_layer(kernel_file: Path, tmp_path: Path) -> None:
    table = tmp_path / "layers.json"
    table.write_text(
        '[{"name": "a", "N": 1, "C": 64, "H": 8, "W": 8}, {"name": "odd", "N": 1, "C": 6, "H": 4, "W": 4}]'
    )
    result = kdsl("check", str(kernel_file), "--layers", str(table))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        "error: layer odd (C=6, G=4): node 2 FC(C -> r: C/G): the FC output dim r: C/G = 3/2"
    )
    typo = kdsl("check", str(kernel_file), "--layers", str(table), "--set", "g=2")
    assert typo.returncode == 2 and "did you mean G?" in typo.stderr and typo.stderr.count("\n") == 1


@given(graphs())
@settings(max_examples=60)
def test_drawn_kernels_render_every_node(kernel: Operator) -> None:
    text = loop_nest(kernel)
    headers = re.findall(r"^# node (\d+)  ", text, flags=re.MULTILINE)
    assert [int(h) for h in headers] == list(range(1, len(kernel.nodes)))
    assert re.search(r"^\s*out(\[| = )", text, flags=re.MULTILINE), text
    picture = svg(kernel)
    assert picture.count("<rect") == len(kernel.nodes) + 2  # the background, the nodes, the output
    arguments = sum(len(node.args) for node in kernel.nodes)
    assert picture.count('marker-end="url(#arrow)"') == arguments + 1


def test_maps_blends_softmax_and_a_final_rename_read_as_code() -> None:
    L = primary("L")
    x = Input(N, C, L)
    kernel = (Blend("max", x >> Map("scale", by=0.5), x >> Map("neg")) >> Softmax(N, C)) >> Rename("L", "M")
    lines = loop_nest(kernel >> Output(N, C, "M")).splitlines()
    for line in [
        "  t1[n, c, l] = 0.5 * x[n, c, l]",
        "  t2[n, c, l] = -x[n, c, l]",
        "  t3[n, c, l] = max(t1[n, c, l], t2[n, c, l])",
        "for l < L:",
        "  s4 = sum(exp(t3[n, c, l]) for n < N, c < C)",
        "    t4[n, c, l] = exp(t3[n, c, l]) / s4",
    ]:
        assert line in lines, line
    assert lines[-1] == "out = t5"
    reordered = loop_nest(kernel >> Output("M", N, C)).splitlines()
    assert reordered[-2:] == ["for M < L, n < N, c < C:", "  out[M, n, c] = t5[n, c, M]"]
