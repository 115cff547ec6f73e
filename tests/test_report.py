"""The discovery report a user acts on: a plain verdict, rows that say what each candidate is good
for, a Pareto plot on a log latency axis, and ``kdsl results`` ranking as ``results.md`` does."""

from __future__ import annotations

import re

import pytest

from kdsl.cli import main
from kdsl.discover.loop import Evaluations
from kdsl.discover.ranking import load_records, rank, verdict
from kdsl.discover.report import summary, write_report
from kdsl.search.run import search
from kdsl.search.space import Space

pytest.importorskip("matplotlib")


def _discovery_db(tmp_path, metrics):
    """A search database with a few stored operators, evaluated with the given metrics."""
    db = str(tmp_path / "runs.sqlite")
    space = Space("conv2d", "resnet18", max_depth=3, coefficients={"K": [3], "G": [32], "s": [2]})
    search(space, "enumerate", db=db, max_results=len(metrics))
    evaluations = Evaluations(db)
    try:
        evaluations.add({"key": "conv2d-baseline", "status": "ok", "metrics": {"accuracy": 0.976}}, role="baseline")
        keys = [row[0] for row in evaluations.database.rows("SELECT key FROM candidates ORDER BY key")]
        assert len(keys) >= len(metrics)
        for key, values in zip(keys, metrics):
            evaluations.add({"key": key, "status": "ok", "metrics": values})
    finally:
        evaluations.close()
    return db, keys[: len(metrics)]


METRICS = [
    {"accuracy": 0.970, "latency_ratio": 0.5, "flops_ratio": 0.25, "params": 100},  # usable, 2x faster
    {"accuracy": 0.900, "latency_ratio": 0.2, "flops_ratio": 0.1, "params": 10},  # too inaccurate
    {"accuracy": 0.980, "latency_ratio": 1.5, "flops_ratio": 1.0, "params": 400},  # accurate, slower
]


def test_results_md_says_what_met_the_margin_and_kdsl_results_ranks_the_same(tmp_path, capsys):
    db, keys = _discovery_db(tmp_path, METRICS)
    records, baseline = load_records(db)
    assert baseline["accuracy"] == 0.976 and len(records) == 3
    paths = write_report(records, baseline, tmp_path / "out", baseline_accuracy=0.976, margin=0.01)
    text = paths["table"].read_text()
    assert "2 of 3 candidates came within 1.0 points" in text
    assert f"fastest {keys[0]} (2.00x faster" in text
    assert "usable: within 0.6 points, 2.00x faster" in text and "too inaccurate: 7.6 points below" in text
    assert "Latency ratio / MACs ratio over 3 candidates: median 2.00, max 2.00" in text
    assert "| MACs ratio | latency / MACs |" in text and "FLOP" not in text
    assert "| latency ratio (eager PyTorch / PyTorch conv2d) |" in text  # records without a backend: torch
    table_order = re.findall(r"^\| \d+ \| \[?`?([0-9a-f]+)", text, flags=re.MULTILINE)
    assert main(["results", "--db", db, "--margin", "0.01"]) == 0
    out = capsys.readouterr().out
    cli_order = re.findall(r"^\s+\d+\s+([0-9a-f]+)", out, flags=re.MULTILINE)
    assert table_order == cli_order == [keys[0], keys[2], keys[1]]
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_where_nothing_met_the_margin_says_so_plainly():
    rows = [{"key": "a", "accuracy": 0.5, "latency_ratio": 0.1}, {"key": "b", "accuracy": 0.8, "latency_ratio": 3.0}]
    text = summary(rows, baseline_accuracy=0.976, margin=0.01)
    assert text.startswith("No candidate came within 1.0 points") and "the closest is b at 0.800" in text
    assert [r["key"] for r in rank(rows, baseline_accuracy=0.976, margin=0.01)] == ["b", "a"]
    assert verdict({"status": "error", "error": "LoweringError: boom"}, baseline_accuracy=0.9).startswith("failed")


def test_a_verdict_says_as_accurate_when_the_gap_rounds_to_zero():
    def says(accuracy: float) -> str:
        return verdict({"accuracy": accuracy, "latency_ratio": 0.5}, baseline_accuracy=0.962)

    assert says(0.962) == says(0.9619) == "usable: as accurate, 2.00x faster"
    assert says(0.963).startswith("usable: 0.1 points above") and says(0.961).startswith("usable: within 0.1 points")


def test_a_plain_search_database_is_listed_by_reward(tmp_path, capsys):
    db = str(tmp_path / "plain.sqlite")
    search(Space("matmul", "resnet18", max_depth=2), "enumerate", db=db)
    assert load_records(db) is None
    assert main(["results", "--db", db]) == 0
    assert "reward" in capsys.readouterr().out


def test_kdsl_gallery_add_writes_an_entry_with_its_provenance(tmp_path, capsys):
    from kdsl import gallery
    from kdsl.lang.parser import parse
    from kdsl.search.store import Store

    db, keys = _discovery_db(tmp_path, METRICS)
    folder = tmp_path / "gallery"
    folder.mkdir()
    assert main(["gallery", "add", "found_op", "--db", db, "--key", keys[0][:10], "--out", str(folder)]) == 0
    text = (folder / "found_op.dsl").read_text()
    assert text.startswith('"""' + gallery.DISCOVERED)
    assert "accuracy: 0.97" in text and "latency ratio to conv2d: 0.5" in text and "strategy enumerate" in text
    store = Store(db, readonly=True)
    try:
        stored = parse(store.get(keys[0])["dsl"])
    finally:
        store.close()
    assert parse(text) == stored
    # never over an existing entry; a bad name is refused
    assert main(["gallery", "add", "found_op", "--db", db, "--key", keys[0], "--out", str(folder)]) != 0
    assert main(["gallery", "add", "not a name", "--db", db, "--key", keys[0], "--out", str(folder)]) != 0
    assert "already has found_op.dsl" in capsys.readouterr().err


# the deployable kernel's ratio (TVM / TVM conv2d) is what ranks; eager PyTorch's is shown beside it
DEPLOYED = [
    {  # slow in eager PyTorch, fast as a TVM kernel
        "accuracy": 0.970,
        "latency_backend": "tvm",
        "latency_ratio": 0.4,
        "tvm_latency_ratio": 0.4,
        "torch_ratio": 1.6,
        "tvm_vs_torch_conv2d": 0.5,
        "tvm_latency_ms": 4.0,
        "baseline_tvm_latency_ms": 10.0,
        "latency_baseline_ms": 10.0,
        "latency_ms": 12.8,
        "baseline_latency_ms": 8.0,
        "flops_ratio": 0.25,
        "params": 100,
    },
    {  # fast in eager PyTorch, slow as a TVM kernel
        "accuracy": 0.971,
        "latency_backend": "tvm",
        "latency_ratio": 0.9,
        "tvm_latency_ratio": 0.9,
        "torch_ratio": 0.3,
        "tvm_vs_torch_conv2d": 1.1,
        "tvm_latency_ms": 9.0,
        "latency_baseline_ms": 10.0,
        "latency_ms": 2.4,
        "flops_ratio": 0.25,
        "params": 100,
    },
    {  # its TVM kernel did not build: no deployable ratio, ranked after the measured ones
        "accuracy": 0.972,
        "latency_backend": "tvm",
        "latency_ratio": None,
        "torch_ratio": 0.2,
        "tvm_error": "the TVM kernel failed to build: LoweringError: no rule",
        "flops_ratio": 0.25,
        "params": 100,
    },
]


def test_the_report_ranks_by_the_deployable_kernel_and_shows_eager_pytorch_beside_it(tmp_path, capsys):
    import json

    db, keys = _discovery_db(tmp_path, DEPLOYED)
    records, baseline = load_records(db)
    ranked = rank(records, baseline_accuracy=0.976, margin=0.01)
    assert [r["key"] for r in ranked] == keys  # by latency_ratio (TVM), not by torch_ratio
    paths = write_report(records, baseline, tmp_path / "out", baseline_accuracy=0.976, margin=0.01)
    text = paths["table"].read_text()
    assert "| latency ratio (TVM kernel / TVM conv2d) | ms: candidate / paired conv2d |" in text
    first = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    # the ratio, the times it divides, TVM against PyTorch's conv2d, eager PyTorch's ratio and time
    assert "| 0.400 | 4.00 / 10.00 | 0.500 | 1.600 | 12.80 |" in first
    assert "each ratio is relative to the conv2d time on its own row" in text
    assert "no TVM kernel: the TVM kernel failed to build: LoweringError" in text
    stored = json.loads(paths["json"].read_text())["candidates"]
    assert [row["tvm_vs_torch_conv2d"] for row in stored[:2]] == [0.5, 1.1]
    assert stored[0]["torch_ratio"] == 1.6 and stored[0]["latency_backend"] == "tvm"
    assert main(["results", "--db", db, "--margin", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "latency = TVM kernel / TVM conv2d" in out and "vs torch" in out
    row = next(line for line in out.splitlines() if re.match(r"\s+1\s+" + keys[0][:16], line))
    assert re.search(r"0\.400\s+0\.500\s+1\.600", row), row


def test_the_report_says_when_the_baseline_came_from_the_cache(tmp_path):
    baseline = {"name": "conv2d", "accuracy": 0.9, "baseline_cache": {"file": "/c/baseline-x.json", "measured": "T"}}
    paths = write_report([], baseline, tmp_path / "out", baseline_accuracy=0.9, margin=0.01)
    text = paths["table"].read_text()
    assert "read from this machine's cache (/c/baseline-x.json, measured T)" in text and "--no-baseline-cache" in text
    plain = write_report([], {"accuracy": 0.9}, tmp_path / "plain", baseline_accuracy=0.9, margin=0.01)
    assert "read from this machine's cache" not in plain["table"].read_text()


def test_the_terminal_summary_prints_its_sentences_on_lines_of_their_own(tmp_path, capsys):
    from kdsl.cli.discover_commands import _print_summary
    from kdsl.discover.loop import DiscoverConfig

    db, _ = _discovery_db(tmp_path, METRICS)
    paths = {"table": "out/results.md", "pages": "out/pages", "plot": "out/pareto.png"}
    _print_summary({"evaluated": 3, "screened": 3, **paths}, DiscoverConfig(db=db, margin=0.01))
    out = capsys.readouterr().out
    assert "\\n" not in out  # the summary's line break was once printed as a literal backslash-n
    lines = out.splitlines()
    assert any(line.startswith("2 of 3 candidates came within") for line in lines)
    assert any(line.startswith("Latency ratio / MACs ratio over 3 candidates") for line in lines)
