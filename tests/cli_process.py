"""The ``kdsl`` command run as a user runs it: a fresh Python process on this checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_kdsl(*argv: str, timeout: float = 180) -> str:
    """``python -m kdsl.cli ARGV`` in the repository root; its stdout, after asserting it exited 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "kdsl.cli", *argv], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    return result.stdout
