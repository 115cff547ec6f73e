"""The baseline's evaluation, cached per user, machine and settings.

Every ``kdsl discover`` run measures the baseline (conv2d's proxy accuracy and latency) before it
trains a candidate: about 52 of a 60-second run's seconds. The measurement depends only on what
:func:`baseline_key_parts` lists (this machine's CPU and core count, the Python, torch, TVM and
kdsl versions, the evaluators' specs with their layer tables resolved to sizes, the proxy's
config, the seed, the workers sharing the cores), so a run whose parts all match reuses it from a
JSON file in :func:`cache_directory`; a changed part (another layer table, another epoch count)
is another key and is measured again.

>>> parts = {"evaluators": [{"name": "analytic", "layers": "resnet18"}]}
>>> key = baseline_key(parts)
>>> len(key), key == baseline_key(dict(parts)), key == baseline_key({"evaluators": []})
(64, True, False)
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from kdsl.runtime.cpu import host_model
from kdsl.solve.layers import load_layers

__all__ = ["baseline_key", "baseline_key_parts", "cache_directory", "load_baseline", "store_baseline"]

#: bump when what a cached baseline holds or means changes
VERSION = 1


def cache_directory(given: str | os.PathLike[str] | None = None) -> Path:
    """Where kdsl's per-user caches live (cached baselines, the measured peak): ``given``, else
    ``$KDSL_CACHE_DIR``, else ``$XDG_CACHE_HOME/kdsl``, else ``~/.cache/kdsl``.

    >>> str(cache_directory("/tmp/somewhere"))
    '/tmp/somewhere'
    """
    if given is not None:
        return Path(given)
    if os.environ.get("KDSL_CACHE_DIR"):
        return Path(os.environ["KDSL_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kdsl"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _resolved(spec: Any) -> Any:
    """An evaluator spec with its ``layers`` as the sizes they name (a table edited under the same
    name is a different baseline)."""
    if not isinstance(spec, Mapping):
        return spec
    resolved = dict(spec)
    if "layers" in resolved:
        resolved["layers"] = [[layer.name, sorted(layer.values.items())] for layer in load_layers(resolved["layers"])]
    return resolved


def baseline_key_parts(
    evaluators: Sequence[Any], *, proxy: Any, seed: int, workers: int, baseline: str = "conv2d"
) -> dict[str, Any]:
    """Everything a baseline's evaluation depends on, as JSON values."""
    from kdsl import __version__

    return {
        "version": VERSION,
        "baseline": baseline,
        "machine": {
            "cpu": host_model(),
            "cores": os.cpu_count(),
            "arch": platform.machine(),
            "system": platform.system(),
            "mcpu": os.environ.get("KDSL_MCPU"),
        },
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "tvm": _version("apache-tvm"),
        "kdsl": __version__,
        "evaluators": [_resolved(spec) for spec in evaluators],
        "proxy": repr(proxy),
        "seed": seed,
        # the workers share the cores: each one's TVM and OpenMP threads are cores / workers
        "workers": workers,
    }


def baseline_key(parts: Mapping[str, Any]) -> str:
    """The SHA-256 of ``parts`` as canonical JSON."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _path(directory: Path, key: str) -> Path:
    return directory / f"baseline-{key[:24]}.json"


def load_baseline(directory: Path, parts: Mapping[str, Any]) -> dict[str, Any] | None:
    """The cached evaluation result for ``parts`` (with ``metrics["baseline_cache"]`` saying where
    and when it was measured), or ``None`` when there is none, or the file is unreadable or was
    written for other parts."""
    key = baseline_key(parts)
    path = _path(directory, key)
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or stored.get("key") != key or not isinstance(stored.get("result"), dict):
        return None
    result = dict(stored["result"])
    if result.get("status") != "ok" or not isinstance(result.get("metrics"), dict):
        return None
    measured = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(stored.get("created") or 0)))
    result["metrics"] = {**result["metrics"], "baseline_cache": {"file": str(path), "measured": measured}}
    return result


def store_baseline(directory: Path, parts: Mapping[str, Any], result: Mapping[str, Any]) -> Path:
    """Write ``result`` (an ok evaluation) as the cached baseline of ``parts``, atomically."""
    key = baseline_key(parts)
    directory.mkdir(parents=True, exist_ok=True)
    path = _path(directory, key)
    record = {"key": key, "parts": parts, "created": time.time(), "result": dict(result)}
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".baseline-", suffix=".json")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(record, stream, default=str)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
