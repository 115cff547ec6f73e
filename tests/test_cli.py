"""The command line, called in-process, and the README's example."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kdsl import gallery
from kdsl.cli import main
from kdsl.search.store import Store

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_show_prints_dsl_shapes_constraints_cost_and_loop_nest(capsys, tmp_path):
    svg = tmp_path / "op1.svg"
    code, out, _ = run(capsys, "show", "syno_op1", "--svg", str(svg))
    assert code == 0
    for expected in ["Share(W2)", "weight W1", "Split(Cin, Cin/G): Cin/G must be a positive integer", "MACs", "for "]:
        assert expected in out
    assert svg.read_text().startswith("<svg") and "Share W2" in svg.read_text()


def test_show_reads_dsl_and_json_files(capsys, tmp_path):
    op = gallery.load("conv2d")
    (tmp_path / "mine.dsl").write_text(op.to_dsl())
    (tmp_path / "mine.json").write_text(op.to_json())
    for file in ("mine.dsl", "mine.json"):
        code, out, _ = run(capsys, "show", str(tmp_path / file))
        assert code == 0 and f"key: {op.key}" in out


def test_check_prints_a_table_per_layer(capsys):
    code, out, _ = run(capsys, "check", "conv2d", "--layers", "resnet18")
    assert code == 0
    assert "valid on all 4 layers of resnet18 with K=3" in out
    assert re.search(r"conv5_x\s+\[1, 512, 7, 7\]", out)


def test_check_failure_names_layer_and_constraint(capsys):
    code, _, err = run(capsys, "check", "grouped_conv2d", "--set", "G=3")
    assert code == 2
    assert "conv2_x" in err and "Cin/G" in err and "64/3" in err


def test_check_solve_lists_the_valid_coefficients(capsys):
    code, out, _ = run(capsys, "check", "grouped_conv2d", "--layers", "resnet18", "--solve")
    assert code == 0
    # 64 is the gcd of ResNet-18's channels; K < 7, the last stage's H
    assert "G in {1, 2, 4, 8, 16, 32, 64}: G divides 64" in out
    assert "K in {1, 2, 3, 4, 5, 6}" in out and "(42 assignments)" in out
    assert "valid on all 4 layers of resnet18 with G=4, K=3" in out  # the usual check follows
    code, out, _ = run(capsys, "check", "syno_op1", "--layers", "resnet18", "--solve", "--set", "K=3")
    assert code == 0 and "jointly: G*s divides 64" in out and "K in {3}" in out
    code, out, _ = run(capsys, "check", "strided_conv2d", "--layers", "resnet18_stride2", "--solve", "--json")
    assert code == 0
    solved = json.loads(out)["solved"]
    assert solved["values"]["s"] == [1, 2, 7, 14] and {"K": 3, "s": 2} in solved["assignments"]


def test_check_solve_without_valid_values_fails_cleanly(capsys):
    code, _, err = run(capsys, "check", "grouped_conv2d", "--solve", "--set", "G=3")
    assert code == 2 and "no value of the coefficient G" in err and "within the bound {3}" in err


def test_check_accepts_a_json_layer_table(capsys, tmp_path):
    table = tmp_path / "layers.json"
    table.write_text(json.dumps([{"name": "tiny", "N": 2, "Cin": 8, "Cout": 4, "H": 6, "W": 6}]))
    code, out, _ = run(capsys, "check", "grouped_conv2d", "--layers", str(table))
    assert code == 0 and "tiny" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "no_such_operator"],
        ["show", "missing.dsl"],
        ["check", "conv2d", "--set", "K"],
        ["check", "conv2d", "--layers", "nope"],
    ],
)
def test_bad_input_exits_2_with_a_message(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.startswith("error:")


def test_gallery_list_and_demo(capsys):
    code, out, _ = run(capsys, "gallery", "list")
    assert code == 0 and all(name in out for name in gallery.names())
    code, out, _ = run(capsys, "demo")
    assert code == 0 and out.count("valid on the") == len(gallery.names())


def test_readme_example_runs():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README has no python example"
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # our own README
    assert tuple(namespace["y"].shape) == (8, 64, 56, 56)


def test_gallery_build_writes_an_index_and_a_page_per_operator(capsys, tmp_path):
    (tmp_path / "rediscovery.json").write_text(
        json.dumps(
            {
                "conv2d": {"found": True, "strategy": "enumerate", "depth": 5, "seconds": 1.5, "key": "k"},
                "grouped_conv2d": {
                    "found": True,
                    "strategy": "enumerate",
                    "space": "default",
                    "depth": 8,
                    "nodes": 9,
                    "seconds": 2.0,
                    "key": "g",
                },
            }
        )
    )
    code, _, _ = run(capsys, "gallery", "build", "--out", str(tmp_path), "--no-measure")
    assert code == 0
    index = (tmp_path / "README.md").read_text()
    for name in gallery.names():
        assert f"(pages/{name}.md)" in index
        page = (tmp_path / "pages" / f"{name}.md").read_text()
        assert gallery.load(name).key in page and (tmp_path / "pages" / f"{name}.svg").exists()
    assert "found by search at depth 5" in index and "found by search at depth 8" in index
    page = (tmp_path / "pages" / "grouped_conv2d.md").read_text()  # the page has the whole record
    for row in [
        "| strategy | enumerate |",
        "| search space | default |",
        "| nodes visited | 9 |",
        "| CPU seconds | 2.0 |",
    ]:
        assert row in page, row
    assert (tmp_path / "site" / "index.html").exists() and (tmp_path / "site" / "grouped_conv2d.html").exists()


def test_gallery_build_out_reads_the_gallerys_records_and_writes_them_to_out(capsys, tmp_path):
    recorded = json.loads((gallery.directory() / "latencies.json").read_text())
    found = json.loads((gallery.directory() / "rediscovery.json").read_text())
    code, _, _ = run(capsys, "gallery", "build", "--out", str(tmp_path), "--no-measure")
    assert code == 0
    # the measured and rediscovery sections come from the gallery, and the measurements go to --out
    assert json.loads((tmp_path / "latencies.json").read_text()) == recorded
    conv2d = recorded["operators"]["conv2d"]
    row = next(line for line in (tmp_path / "README.md").read_text().splitlines() if "[conv2d](pages/" in line)
    assert f"{conv2d['tvm_fwd_ms']:.3f}" in row and f"found by search at depth {found['conv2d']['depth']}" in row
    assert json.loads((gallery.directory() / "latencies.json").read_text()) == recorded  # the gallery's unchanged


def test_search_results_and_show_from_the_database(capsys, tmp_path):
    db = str(tmp_path / "r.db")
    code, _, _ = run(
        capsys,
        "search",
        "conv2d",
        "--layers",
        "resnet18",
        "--max-depth",
        "3",
        "--coefficient",
        "K=3",
        "--db",
        db,
        "--quiet",
    )
    assert code == 0
    code, out, _ = run(capsys, "results", "--db", db, "--top", "1", "--json")
    assert code == 0
    best = json.loads(out)["top"][0]
    code, out, _ = run(capsys, "show", "--db", db, best["key"][:10])
    assert code == 0 and f"key: {best['key']}" in out


def test_search_walks_cin_to_cin_operators_unless_told_the_spec_outputs_only(capsys, tmp_path):
    depthwise = gallery.load("depthwise_conv2d").key
    found = {}
    for flag in ([], ["--spec-outputs-only"]):
        db = str(tmp_path / f"r{len(flag)}.db")
        argv = ["search", "conv2d", "--max-depth", "5", "--set", "K=3", "--reduction", "K", "--cap", "Share=1"]
        code, out, _ = run(capsys, *argv, *flag, "--db", db, "--json")
        assert code == 0
        found[bool(flag)] = (json.loads(out)["space"], {row["key"] for row in Store(db).top(10**6, status=None)})
    assert "Cout = Cin on every layer" in found[False][0] and depthwise in found[False][1]
    assert "Cout = Cin" not in found[True][0] and depthwise not in found[True][1]


def test_gallery_rediscover_writes_records_that_build_reads(capsys, tmp_path):
    code, out, _ = run(capsys, "gallery", "rediscover", "--skip-slow", "--out", str(tmp_path))
    assert code == 0 and "conv2d" in out
    records = json.loads((tmp_path / "rediscovery.json").read_text())
    assert records["conv2d"]["found"] and records["conv2d"]["depth"] == 6
    assert records["conv2d"]["key"] == gallery.load("conv2d").design_key
    # the classics are looked for in their spec's default space, and each record says so
    assert records["conv2d"]["space"] == "default" and records["conv2d"]["nodes"] > 0
    assert "syno_op1" not in records


def test_gallery_rediscover_says_why_when_the_time_runs_out(capsys, tmp_path):
    code, out, _ = run(capsys, "gallery", "rediscover", "--skip-slow", "--time-limit", "0.001", "--out", str(tmp_path))
    records = json.loads((tmp_path / "rediscovery.json").read_text())
    missed = [r for r in records.values() if not r["found"]]
    assert code == 0 and missed and all("not reached within" in r["why"] for r in missed)
    assert "not found: not reached within" in out


def test_gallery_rediscover_one_operator_keeps_the_other_records(capsys, tmp_path):
    (tmp_path / "rediscovery.json").write_text(json.dumps({"conv2d": {"found": True, "kept": 1}}))
    code, out, _ = run(capsys, "gallery", "rediscover", "pointwise_conv2d", "--out", str(tmp_path))
    records = json.loads((tmp_path / "rediscovery.json").read_text())
    assert code == 0 and records["conv2d"] == {"found": True, "kept": 1} and "pointwise_conv2d" in out
    found = records["pointwise_conv2d"]
    assert found["found"] and found["depth"] == 2 and found["seconds"] >= 0 and found["wall_seconds"] >= 0
    code, _, err = run(capsys, "gallery", "rediscover", "no_such_op", "--out", str(tmp_path))
    assert code != 0 and "no_such_op" in err and "pointwise_conv2d" in err
