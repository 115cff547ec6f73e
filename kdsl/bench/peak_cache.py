"""The measured roofline, kept per machine so that ``kdsl tune`` measures it once a week, not every run.

``kdsl tune`` and ``kdsl bench tune --suite`` need the machine's FMA peak and read bandwidths
(:func:`kdsl.bench.roofline.measure_roofline`: a few seconds of timing, which a busy machine also
makes low). :func:`roofline_for` reads them from a small JSON file, ``peak.json`` in kdsl's cache
folder (:func:`cache_path`: ``$KDSL_CACHE_DIR``, else ``$XDG_CACHE_HOME/kdsl``, else
``~/.cache/kdsl``), where an entry younger than :data:`MAX_AGE_DAYS` days was measured on the same
machine; otherwise it measures, saves and uses the new figures. ``--remeasure-peak`` measures anew
whatever the file holds (after the machine was busy, or changed its clock); ``kdsl bench peak --save``
stores the reads it measured. The machine is its key (:func:`machine_key`): CPU model, the ``mcpu``
kernels are compiled for, the host's cores, the threads kernels run on, and the version of the peak
kernels (:data:`~kdsl.bench.peak.PEAK_KERNELS_VERSION`), so another ``--mcpu`` or ``TVM_NUM_THREADS``
is measured apart and a changed kernel does not reuse old figures. A file that cannot be read, is not
kdsl's, or holds a malformed entry is ignored with a warning (and rewritten on the next save), never
an error.

>>> import tempfile
>>> from kdsl.runtime.cpu import from_features
>>> machine = from_features("haswell", {"avx2", "fma"}, cores=2, ghz=3.0, model="Some CPU")
>>> roofline = Roofline(peak_gflops=150.0, dram_gbs=20.0, cache_gbs=90.0, cache_bytes=32 << 20)
>>> folder = tempfile.mkdtemp()
>>> save_roofline(machine, roofline, folder=folder, now=1000.0).name
'peak.json'
>>> load_roofline(machine, folder=folder, now=1000.0 + 3600) == (roofline, 1000.0)
True
>>> load_roofline(machine, folder=folder, now=1000.0 + 8 * 86400) is None  # older than a week
True
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kdsl.bench.peak import PEAK_KERNELS_VERSION
from kdsl.bench.roofline import Roofline, measure_roofline
from kdsl.codegen.tvm.machine import current_machine
from kdsl.discover.baseline_cache import cache_directory
from kdsl.lang.errors import KdslError
from kdsl.runtime.cpu import Machine

__all__ = [
    "CACHE_FILE",
    "MAX_AGE_DAYS",
    "cache_path",
    "load_roofline",
    "machine_key",
    "roofline_for",
    "save_roofline",
]

#: days a cached roofline is used for before it is measured again
MAX_AGE_DAYS = 7.0
CACHE_FILE = "peak.json"
_FORMAT = "kdsl-peak-cache/1"  # what marks a file as this module's
_FIELDS = ("peak_gflops", "dram_gbs", "cache_gbs", "cache_bytes")


def cache_path(folder: str | os.PathLike[str] | None = None) -> Path:
    """``peak.json`` in ``folder``, else in kdsl's cache folder
    (:func:`~kdsl.discover.baseline_cache.cache_directory`: ``$KDSL_CACHE_DIR``, ``$XDG_CACHE_HOME/kdsl``
    or ``~/.cache/kdsl``, shared with the cached baselines).

    >>> cache_path("/tmp/somewhere").as_posix()
    '/tmp/somewhere/peak.json'
    """
    return cache_directory(folder) / CACHE_FILE


def machine_key(machine: Machine) -> str:
    """The cache's key of ``machine``: CPU model, mcpu, host cores, threads, the peak kernels' version.

    >>> from kdsl.runtime.cpu import from_features
    >>> key = machine_key(from_features("znver4", {"avx512f"}, cores=2, ghz=2.6, model="AMD EPYC 9B14"))
    >>> key.startswith("AMD EPYC 9B14 | mcpu znver4 | ") and "| 2 threads | peak kernels v" in key
    True
    """
    return (
        f"{machine.model or 'unknown CPU'} | mcpu {machine.mcpu} | {os.cpu_count() or 1} host cores | "
        f"{machine.cores} threads | peak kernels v{PEAK_KERNELS_VERSION}"
    )


def _entries(path: Path) -> dict[str, Any]:
    """The file's entries by machine key; empty (with a warning) where it is not a readable cache file."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        warnings.warn(f"kdsl: ignoring the peak cache {path}: it cannot be read ({error})", stacklevel=3)
        return {}
    if not isinstance(data, dict) or data.get("format") != _FORMAT or not isinstance(data.get("entries"), dict):
        warnings.warn(f"kdsl: ignoring the peak cache {path}: it is not a {_FORMAT} file", stacklevel=3)
        return {}
    return data["entries"]


def load_roofline(
    machine: Machine, *, folder: str | os.PathLike[str] | None = None, now: float | None = None
) -> tuple[Roofline, float] | None:
    """``machine``'s cached roofline and when it was measured (seconds since the epoch), or ``None``
    where the cache has none younger than :data:`MAX_AGE_DAYS` days (a malformed entry: a warning)."""
    path = cache_path(folder)
    entry = _entries(path).get(machine_key(machine))
    if entry is None:
        return None
    try:
        measured_at = float(entry["measured_at"])
        roofline = Roofline(*(type(default)(entry[name]) for name, default in zip(_FIELDS, (0.0, 0.0, 0.0, 0))))
    except (KeyError, TypeError, ValueError, KdslError) as error:
        warnings.warn(f"kdsl: ignoring a malformed entry of the peak cache {path} ({error})", stacklevel=2)
        return None
    age = (time.time() if now is None else now) - measured_at
    return (roofline, measured_at) if 0 <= age <= MAX_AGE_DAYS * 86400 else None


def save_roofline(
    machine: Machine, roofline: Roofline, *, folder: str | os.PathLike[str] | None = None, now: float | None = None
) -> Path:
    """Store ``roofline`` as ``machine``'s, measured ``now`` (default: this moment), beside the other
    machines' entries; written to a temporary file first and moved into place, so that a reader never
    sees half a file. Returns the file's path."""
    path = cache_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a bad file is replaced: its warning was for the readers
        entries = _entries(path)
    entry: dict[str, Any] = {name: getattr(roofline, name) for name in _FIELDS}
    entry.update(measured_at=time.time() if now is None else now, machine=machine.describe())
    entries[machine_key(machine)] = entry
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"format": _FORMAT, "entries": entries}, indent=1, sort_keys=True) + "\n")
    os.replace(temporary, path)
    return path


def roofline_for(
    machine: Machine | None = None,
    *,
    remeasure: bool = False,
    folder: str | os.PathLike[str] | None = None,
    measure: Callable[[Machine], Roofline] = measure_roofline,
) -> tuple[Roofline, str]:
    """``machine``'s roofline (default: the one kernels are compiled for) and a note that says where it
    came from: the cache's entry where one is young enough and ``remeasure`` is false, else ``measure``'s
    (a few seconds of timing), which is then saved. A cache folder that cannot be written is warned of."""
    machine = machine or current_machine()
    cached = None if remeasure else load_roofline(machine, folder=folder)
    if cached is not None:
        roofline, measured_at = cached
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(measured_at))
        return roofline, f"cached, measured {when} ({cache_path(folder)}; --remeasure-peak to measure again)"
    roofline = measure(machine)
    try:
        path = save_roofline(machine, roofline, folder=folder)
    except OSError as error:
        warnings.warn(f"kdsl: the measured peak could not be cached ({error})", stacklevel=2)
        return roofline, "measured now (not cached)"
    return roofline, f"measured now, cached in {path}"
