"""Hypothesis profiles: `ci` is deterministic and small, `dev` (default locally) explores more."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(autouse=True)
def _private_kdsl_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own kdsl cache folder (cached baselines), never the user's ~/.cache/kdsl."""
    monkeypatch.setenv("KDSL_CACHE_DIR", str(tmp_path_factory.mktemp("kdsl-cache")))
