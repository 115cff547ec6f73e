"""KDSL_TEST_BACKENDS: a requested backend that cannot load fails the run; one left out skips."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import backends
import pytest

TESTS = Path(__file__).resolve().parent


def test_every_backend_is_requested_by_default_and_a_list_narrows_it(monkeypatch):
    monkeypatch.delenv("KDSL_TEST_BACKENDS", raising=False)
    assert backends.requested() == {"reference", "torch", "tvm"}
    monkeypatch.setenv("KDSL_TEST_BACKENDS", "reference, torch")
    assert backends.requested() == {"reference", "torch"}
    monkeypatch.setenv("KDSL_TEST_BACKENDS", "torch,cuda")
    with pytest.raises(pytest.UsageError, match="cuda"):
        backends.requested()


def _run(body: str, environment: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a one-test file under pytest in a subprocess, with ``environment`` added."""
    import os
    import tempfile

    folder = Path(tempfile.mkdtemp())
    (folder / "test_one.py").write_text(f"from backends import backend\n\n\ndef test_one():\n    {body}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), **environment)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder / "test_one.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
    )


def test_a_backend_left_out_skips_and_a_requested_one_that_cannot_load_fails(monkeypatch):
    skipped = _run('backend("tvm")', {"KDSL_TEST_BACKENDS": "reference"})
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout
    # a requested backend whose module is missing: the test fails, naming it (the module made unimportable)
    failed = _run('import sys; sys.modules["tvm"] = None; backend("tvm")', {"KDSL_TEST_BACKENDS": "tvm"})
    assert failed.returncode == 1 and "backend tvm is requested" in failed.stdout, failed.stdout
