"""The command line at its edges, run through the real entry point (``python -m kdsl.cli``): bad
input is one line on stderr and exit code 2, Ctrl-C is one line and 130, nothing from a database
or a layer file reaches the terminal unescaped, ``kdsl results`` never writes, and two searches of
one run never both work on it."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kdsl.lang.errors import SearchError
from kdsl.search.store import Store

ESCAPES = "\x1b[31mred\x1b]0;pwned\x07"
#: a search that runs for about ten seconds (long enough to be caught running)
LONG = ["search", "conv2d", "--coefficient", "K=3", "--reduction", "Cin", "--reduction", "K", "--cap", "Expand=0"]


def kdsl(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KDSL_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "kdsl.cli", *argv], capture_output=True, text=True, timeout=timeout, env=env
    )


def _default_sigint() -> None:
    # an ignored SIGINT is inherited across exec, and Python then keeps ignoring it: a process
    # started while the test process ignores SIGINT (as it does after some earlier tests in a full
    # run) would never see the Ctrl-C these tests send
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*argv: str, own_group: bool = False) -> subprocess.Popen:
    """``kdsl argv`` running (without KDSL_DEBUG), its output on pipes; ``own_group``: in a new
    session, so that a signal to its process group reaches every process it starts."""
    env = {k: v for k, v in os.environ.items() if k != "KDSL_DEBUG"}
    return subprocess.Popen(
        [sys.executable, "-m", "kdsl.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=own_group,
        preexec_fn=_default_sigint,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    """The result is exit code 2 and exactly one line on stderr, ``error: ...``, naming ``needles``."""
    lines = result.stderr.splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "\x1b" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def wait_for_holder(db: Path, process: subprocess.Popen, *, candidates: int = 0) -> None:
    """Wait until ``process`` holds its run in ``db`` (and has committed ``candidates`` rows)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            with sqlite3.connect(db) as connection:
                held = connection.execute("SELECT COUNT(*) FROM runs WHERE holder IS NOT NULL").fetchone()[0]
                stored = connection.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
        except sqlite3.Error:
            held = stored = 0
        if held and stored >= candidates:
            return
        time.sleep(0.05)
    raise AssertionError("the search never took its run")


def make_db(path: Path, **row: object) -> Path:
    """A results database with one valid candidate (``row`` overrides its fields)."""
    store = Store(path)
    lease = store.claim("fingerprint", "enumerate", 0, "test")
    fields = {"key": "k1", "dsl": "op = Input(M) >> Output(M)\n", "depth": 1, "status": "valid", "flops": 10}
    store.commit(lease, [{**fields, "params": 3, "reward": 0.5, **row}], {"cursor": [1]}, release=True)
    store.close()
    assert path.is_file()
    return path


# -- --set, budgets, specs ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["K=²", "K=--3", "K=-3", "K=0", "K=3.5", "K"])
def test_set_with_a_bad_value_is_one_line(value):
    assert_one_line_error(kdsl("check", "conv2d", "--set", value), "--set")


@pytest.mark.parametrize(("value", "needles"), [("Q=3", ["Q", "K"]), ("k=5", ["k", "did you mean K"])])
def test_set_with_an_unknown_name_says_which_names_exist(value, needles):
    assert_one_line_error(kdsl("check", "conv2d", "--set", value), *needles)


def test_set_of_a_primary_variable_points_to_the_layer_table():
    assert_one_line_error(kdsl("check", "conv2d", "--set", "H=5"), "primary", "--layers")


def test_check_prints_the_coefficient_that_the_layer_binds(tmp_path):
    table = tmp_path / "l.json"
    table.write_text(json.dumps([{"name": "l1", "N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8, "K": 5}]))
    result = kdsl("check", "conv2d", "--layers", str(table))
    assert result.returncode == 0, result.stderr
    assert "with K=5" in result.stdout
    assert result.stdout.split()[-1] == str(8 * 8 * 5 * 5)  # conv2d's params with K=5, not K=3
    result = kdsl("check", "conv2d", "--layers", str(table), "--set", "K=3")  # --set still wins
    assert result.returncode == 0 and "with K=3" in result.stdout and result.stdout.split()[-1] == str(8 * 8 * 9)


@pytest.mark.parametrize("command", [["search", "conv2d", "--db", "x.db"], ["discover", "--db", "x.db"]])
def test_a_fractional_absolute_budget_is_refused(command, tmp_path):
    line = assert_one_line_error(kdsl(*command, "--max-flops", "0.5"), "0.5x")
    assert "--max-flops" in line
    assert not (tmp_path / "x.db").exists()


def test_discover_refuses_a_spec_the_proxy_network_cannot_use(tmp_path):
    db = tmp_path / "d" / "runs.sqlite"
    assert_one_line_error(kdsl("discover", "--spec", "matmul", "--db", str(db)), "matmul", "conv2d")
    assert not db.parent.exists()  # refused before any work


def test_kdsl_debug_shows_the_traceback():
    env = {**os.environ, "KDSL_DEBUG": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "kdsl.cli", "check", "conv2d", "--set", "Q=3"], capture_output=True, text=True, env=env
    )
    assert result.returncode != 0 and "Traceback" in result.stderr and "KdslError" in result.stderr


def test_usage_errors_are_one_line():
    assert_one_line_error(kdsl("search", "conv2d", "--max-depth", "0"), "--max-depth")
    assert_one_line_error(kdsl("results", "--db", "r.db", "--top", "-1"), "--top")


# -- the results database ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("update", "needles"),
    [
        ("UPDATE candidates SET flops = 'lots'", ["'k1'", "flops", "'lots'"]),
        ("UPDATE candidates SET metrics = '{bad'", ["'k1'", "metrics"]),
        ("UPDATE candidates SET reward = 'high'", ["'k1'", "reward"]),
    ],
)
def test_results_names_the_bad_row_and_column(tmp_path, update, needles):
    db = make_db(tmp_path / "r.db")
    with sqlite3.connect(db) as connection:
        connection.execute(update)
    assert_one_line_error(kdsl("results", "--db", str(db)), *needles)
    assert_one_line_error(kdsl("results", "--db", str(db), "--json"), *needles)


def test_results_names_a_missing_column(tmp_path):
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE candidates (key TEXT, dsl TEXT, depth INTEGER, status TEXT)")
    assert_one_line_error(kdsl("results", "--db", str(db)), "no column", "flops")
    assert_one_line_error(kdsl("results", "--db", str(tmp_path / "missing.db")), "no results database")


def test_results_never_writes_to_the_database(tmp_path):
    db = make_db(tmp_path / "r.db")
    with sqlite3.connect(db) as connection:
        connection.execute("PRAGMA journal_mode=DELETE")  # results used to switch it back to WAL
    before = hashlib.sha256(db.read_bytes()).hexdigest(), sorted(os.listdir(tmp_path))
    result = kdsl("results", "--db", str(db))
    assert result.returncode == 0 and "key k1" in result.stdout, result.stderr
    assert (hashlib.sha256(db.read_bytes()).hexdigest(), sorted(os.listdir(tmp_path))) == before
    os.chmod(db, 0o444)  # and a database the user may only read is enough
    try:
        assert kdsl("results", "--db", str(db)).returncode == 0
    finally:
        os.chmod(db, 0o644)


def test_names_from_a_database_are_printed_escaped(tmp_path):
    db = make_db(tmp_path / "r.db", key="k" + ESCAPES, dsl=f"# {ESCAPES}\nop = Input(M) >> Output(M)\n")
    result = kdsl("results", "--db", str(db))
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "k\\x1b[31mred\\x1b]0;pwned\\x07" in result.stdout
    assert "\x1b" not in kdsl("results", "--db", str(db), "--json").stdout


def test_names_from_a_layer_file_are_never_printed_raw(tmp_path):
    table = tmp_path / "l.json"
    table.write_text(json.dumps([{"name": "l" + ESCAPES, "N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8}]))
    assert_one_line_error(kdsl("check", "conv2d", "--layers", str(table)), "\\x1b[31m", "control characters")


# -- Ctrl-C ---------------------------------------------------------------------------------------------


def test_ctrl_c_in_search_is_one_line_130_and_keeps_the_data(tmp_path):
    db = tmp_path / "r.db"
    process = start(*LONG, "--max-depth", "6", "--db", str(db), "--quiet")
    wait_for_holder(db, process, candidates=1)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert err.splitlines() == [f"interrupted; what was committed to {db} is kept and the same command resumes"]
    with sqlite3.connect(db) as connection:
        holder, progress, finished = connection.execute("SELECT holder, progress, finished FROM runs").fetchone()
        stored = connection.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
    assert holder is None and json.loads(progress) and not finished and stored >= 1


@pytest.mark.skipif(sys.platform != "linux", reason="signals a process group")
def test_ctrl_c_in_discover_is_one_line_130(tmp_path):
    db = tmp_path / "runs.sqlite"
    argv = ["discover", "--db", str(db), "--out", str(tmp_path / "out"), "--epochs", "1", "--time-limit", "60"]
    process = start(*argv, own_group=True)
    # progress on a pipe is whole lines: "discover: started", then the run says it is measuring the
    # baseline (its worker is up)
    lines = [process.stderr.readline(), process.stderr.readline()]
    assert lines[0] == "discover: started\n" and "measuring the baseline" in lines[1], lines
    # Ctrl-C in the run's loop: once the baseline is measured and search has run (a SIGINT while
    # the baseline's worker starts was once lost in CI; see the issue 14/15 closing note)
    while not lines[-1].startswith("search ("):
        lines.append(process.stderr.readline())
        assert lines[-1], lines
    time.sleep(0.5)
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "\r" not in err
    # the progress says where it stopped, then the one line of the interruption
    assert err.splitlines()[-2].startswith("discover: ") and "stopped after" in err.splitlines()[-2]
    assert err.splitlines()[-1] == f"interrupted; what was committed to {db} is kept and the same command resumes"


# -- one writer per run -----------------------------------------------------------------------------


def test_a_second_search_of_a_running_run_is_refused_and_nothing_is_repeated_or_lost(tmp_path):
    db = tmp_path / "r.db"
    argv = [*LONG, "--max-depth", "5", "--db", str(db), "--quiet", "--json"]
    first = start(*argv)
    wait_for_holder(db, first)
    first.send_signal(signal.SIGSTOP)  # hold the first one mid-run, whatever the machine's speed
    try:
        assert_one_line_error(kdsl(*argv), "in use by process", str(first.pid))
    finally:
        first.send_signal(signal.SIGCONT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert json.loads(out)["finished"]
    again = kdsl(*argv)
    assert again.returncode == 0 and json.loads(again.stdout)["new"] == 0, again.stderr
    fresh = kdsl(*[*LONG, "--max-depth", "5", "--db", str(tmp_path / "fresh.db"), "--quiet", "--json"])
    assert fresh.returncode == 0, fresh.stderr

    def keys(path: Path, where: str = "") -> list[str]:
        with sqlite3.connect(path) as connection:
            return sorted(row[0] for row in connection.execute(f"SELECT key FROM candidates {where}"))

    # re-parametrizations of a stored operator are kept as status 'duplicate' and not counted as new
    distinct = keys(db, "WHERE status != 'duplicate'")
    assert keys(db) == keys(tmp_path / "fresh.db") and len(distinct) == json.loads(fresh.stdout)["new"]


def test_a_killed_holder_does_not_block_the_run(tmp_path):
    db = tmp_path / "r.db"
    first = start(*LONG, "--max-depth", "6", "--db", str(db), "--quiet")
    wait_for_holder(db, first)
    first.kill()  # kill -9: the lease is never given back
    first.communicate()
    result = kdsl(*LONG, "--max-depth", "6", "--db", str(db), "--quiet", "--time-limit", "0.5")
    assert result.returncode == 0, result.stderr


def test_a_writer_that_lost_its_lease_cannot_overwrite_progress(tmp_path):
    db = tmp_path / "r.db"
    store = Store(db)
    lease = store.claim("fingerprint", "enumerate", 0, "test")
    with pytest.raises(SearchError, match="in use by process"):  # the same process asking twice
        Store(db).claim("fingerprint", "enumerate", 0, "test")
    with sqlite3.connect(db) as connection:  # another host took the run over (our heartbeat looked stale)
        connection.execute("UPDATE runs SET holder = '1@elsewhere@', lease = lease + 1, progress = '{\"n\": 7}'")
    row = {"key": "late", "dsl": "...", "depth": 1, "status": "valid"}
    with pytest.raises(SearchError, match="lost its run"):
        store.commit(lease, [row], {"n": 3})
    store.close()
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT progress FROM runs").fetchone()[0] == '{"n": 7}'
        assert connection.execute("SELECT COUNT(*) FROM candidates").fetchone()[0] == 0
