"""``python -m kdsl.bench.schedule``: its flags are parsed, not guessed from ``sys.argv``."""

import subprocess
import sys

import pytest

from kdsl.bench import schedule


def test_help_prints_the_usage_and_measures_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        schedule.main(["--help"])
    assert exited.value.code == 0
    assert "--quick" in capsys.readouterr().out


def test_an_unknown_flag_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        schedule.main(["--quik"])
    assert exited.value.code == 2
    assert "--quik" in capsys.readouterr().err


def test_the_module_answers_help_without_measuring() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kdsl.bench.schedule", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "usage: python -m kdsl.bench.schedule" in done.stdout
