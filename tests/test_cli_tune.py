"""``kdsl tune`` end to end on a tiny matmul: tune, read the schedule, build it with ``--apply`` (a
shared library) and with ``kdsl.tune.apply`` (a kernel that computes the matmul)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from backends import backend

import kdsl
from kdsl import gallery
from kdsl.cli import main

backend("tvm")

from kdsl.codegen import tvm as kdsl_tvm  # noqa: E402
from kdsl.tune.records import target_mcpu  # noqa: E402  (after the skip: it reads TVM's target)

TINY = '{"M": 4, "Cin": 8, "Cout": 8}'


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> str:
    """A records database holding two measured schedules of the tiny matmul."""
    db = tmp_path_factory.mktemp("tune") / "t.db"
    assert (
        main(["tune", "matmul", "--layers", TINY, "--trials", "2", "--compile-batch", "2", "--db", str(db), "--json"])
        == 0
    )
    assert db.is_file()
    return str(db)


def test_tune_prints_the_schedule_as_lines_and_json_only_when_asked(capsys, tuned):
    code, out, _ = run(capsys, "tune", "matmul", "--layers", TINY, "--db", tuned, "--apply")
    assert code == 0 and "GMAC/s" in out and "schedule (one parameter a line" in out
    assert "stage0.tile.M" in out and '"config"' not in out and '"stage0' not in out  # lines, not JSON
    code, out, _ = run(capsys, "tune", "matmul", "--layers", TINY, "--db", tuned, "--apply", "--json")
    record = json.loads(out)
    assert code == 0 and record["latency_ms"] > 0 and "stage0.tile.M" in record["config"]


def test_tune_apply_writes_a_library_and_the_old_layer_spelling_still_works(capsys, tuned, tmp_path):
    library = tmp_path / "kernel.so"
    code, out, _ = run(capsys, "tune", "matmul", "--layer", TINY, "--db", tuned, "--apply", "--out", str(library))
    assert code == 0 and library.stat().st_size > 0 and f"wrote {library}" in out
    torch = backend("torch")
    kernel = kdsl_tvm.load(library)  # what --apply wrote, called like kdsl.tune.apply's kernel
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    np.testing.assert_allclose(kernel(x, w).numpy(), (x @ w).numpy(), rtol=1e-5, atol=1e-5)


def test_the_python_api_builds_a_kernel_that_computes_the_operator(tuned):
    torch = backend("torch")
    op = gallery.load("matmul")
    layer = json.loads(TINY)
    kernel = kdsl.tune.apply(tuned, op, layer)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    np.testing.assert_allclose(kernel(x, w).numpy(), (x @ w).numpy(), rtol=1e-5, atol=1e-5)
    record = kdsl.tune.best_record(tuned, op, layer)
    assert record.latency is not None and record.latency > 0


def test_apply_without_a_record_says_what_to_run(capsys, tuned, tmp_path):
    code, _, err = run(capsys, "tune", "matmul", "--layers", '{"M": 4, "Cin": 8, "Cout": 16}', "--db", tuned, "--apply")
    assert code == 2 and "no measured schedule" in err and "kdsl tune" in err
    code, _, err = run(capsys, "tune", "matmul", "--layers", TINY, "--db", str(tmp_path / "none.db"), "--apply")
    assert code == 2 and "no tuning records database" in err
    code, _, err = run(capsys, "tune", "matmul", "--db", tuned)
    assert code == 2 and "--layers" in err


def test_apply_for_another_target_names_the_mcpu_the_records_were_tuned_for(capsys, tuned, monkeypatch):
    host = target_mcpu()  # the records of the fixture were tuned for it
    other = "haswell" if host != "haswell" else "skylake"
    monkeypatch.setenv("KDSL_MCPU", other)
    code, _, err = run(capsys, "tune", "matmul", "--layers", TINY, "--db", tuned, "--apply")
    assert code == 2 and f"only for mcpu {host}" in err and f"add --mcpu {host}" in err


def test_looking_records_up_describes_no_task(capsys, tuned, monkeypatch, tmp_path):
    """Reading a database (``--apply``, a network's fallback to the other packing, another target) adds no
    task to it: only tuning describes a task."""
    import sqlite3

    from kdsl.tune.records import RecordStore
    from kdsl.tune.tuned import tuned_schedule

    db = tmp_path / "copy.db"
    source, copy = sqlite3.connect(tuned), sqlite3.connect(db)
    source.backup(copy)  # its records may still be in the write-ahead log, which a file copy leaves behind
    source.close()
    copy.close()

    def tasks() -> set[str]:
        store = RecordStore(db)
        try:
            return set(store.descriptions())
        finally:
            store.database.close()

    before = tasks()
    layer = json.loads(TINY)
    assert tuned_schedule(db, gallery.load("matmul"), layer, prepacked=True, fallback=True) is not None
    assert tuned_schedule(db, gallery.load("matmul"), layer, block=16) is None
    monkeypatch.setenv("KDSL_MCPU", "haswell" if target_mcpu() != "haswell" else "skylake")
    code, _, err = run(capsys, "tune", "matmul", "--layers", TINY, "--db", str(db), "--apply")
    assert code == 2 and "only for mcpu" in err  # found from the task's description, not the database's
    assert tasks() == before and len(before) == 1


def test_tune_takes_several_layers_and_ends_with_one_table(capsys, tmp_path):
    other = '{"M": 8, "Cin": 8, "Cout": 8}'
    db = str(tmp_path / "two.db")
    argv = ["tune", "matmul", "--layers", TINY, other, "--trials", "1", "--compile-batch", "1", "--db", db]
    code, out, err = run(capsys, *argv)
    lines = out.splitlines()
    assert code == 0, err
    assert lines[0].split()[:2] == ["layer", "best"] and lines[0].split()[2] in ("s", "ms", "us", "ns")
    assert lines[1].startswith("layer1") or lines[1].startswith(TINY[:12])
    assert len([line for line in lines if "opevo" in line]) == 2 and f"tune (opevo, {other})" in err
    library = tmp_path / "k.so"
    code, out, _ = run(capsys, "tune", "matmul", "--layers", TINY, other, "--db", db, "--apply", "--out", str(library))
    assert code == 0 and (tmp_path / "k_layer1.so").stat().st_size > 0 and (tmp_path / "k_layer2.so").is_file()
    code, out, _ = run(capsys, "tune", "matmul", "--layers", TINY, other, "--db", db, "--apply", "--json")
    summaries = json.loads(out)["layers"]
    assert (
        code == 0 and [s["layer"] for s in summaries] == [TINY, other] and all(s["latency_ms"] > 0 for s in summaries)
    )
