"""The cached roofline (:mod:`kdsl.bench.peak_cache`): one entry per machine key, an age limit, a forced
re-measurement, and a corrupt or foreign file ignored with a warning. Every test uses a tmp folder (the
``folder`` parameter or ``KDSL_CACHE_DIR``), never the user's cache; nothing is timed (a fake measure)."""

from __future__ import annotations

import json
import warnings

import pytest

from kdsl.bench import peak_cache
from kdsl.bench.peak_cache import cache_path, load_roofline, machine_key, roofline_for, save_roofline
from kdsl.bench.roofline import Roofline
from kdsl.runtime.cpu import from_features

ZEN4 = from_features("znver4", {"avx512f", "fma"}, cores=2, ghz=2.6, model="AMD EPYC 9B14")
ONE_THREAD = from_features("znver4", {"avx512f", "fma"}, cores=1, ghz=2.6, model="AMD EPYC 9B14")
AVX2 = from_features("haswell", {"avx2", "fma"}, cores=2, ghz=2.6, model="AMD EPYC 9B14")
QUIET = Roofline(peak_gflops=229.9, dram_gbs=25.4, cache_gbs=206.9, cache_bytes=32 << 20)
OTHER = Roofline(peak_gflops=100.0, dram_gbs=10.0, cache_gbs=50.0, cache_bytes=32 << 20)


class FakeMeasure:
    """A measure that returns ``roofline`` and counts its calls (nothing is timed)."""

    def __init__(self, roofline: Roofline) -> None:
        self.roofline, self.calls = roofline, 0

    def __call__(self, machine) -> Roofline:
        self.calls += 1
        assert machine.mcpu  # a machine, as roofline_for passes it
        return self.roofline


def test_a_measured_roofline_is_cached_and_reused_until_remeasured(tmp_path):
    measure = FakeMeasure(QUIET)
    first, note = roofline_for(ZEN4, folder=tmp_path, measure=measure)
    assert first == QUIET and note.startswith("measured now, cached in") and measure.calls == 1
    again, note = roofline_for(ZEN4, folder=tmp_path, measure=FakeMeasure(OTHER))
    assert again == QUIET and note.startswith("cached, measured ") and "--remeasure-peak" in note
    measure = FakeMeasure(OTHER)
    forced, note = roofline_for(ZEN4, folder=tmp_path, remeasure=True, measure=measure)
    assert forced == OTHER and measure.calls == 1 and note.startswith("measured now")
    assert roofline_for(ZEN4, folder=tmp_path, measure=FakeMeasure(QUIET))[0] == OTHER  # the new one is kept


def test_each_machine_key_has_its_own_entry(tmp_path):
    keys = {machine_key(m) for m in (ZEN4, ONE_THREAD, AVX2)}
    assert len(keys) == 3  # threads and mcpu each make another key
    save_roofline(ZEN4, QUIET, folder=tmp_path, now=1000.0)
    save_roofline(AVX2, OTHER, folder=tmp_path, now=1000.0)
    assert load_roofline(ZEN4, folder=tmp_path, now=1001.0) == (QUIET, 1000.0)
    assert load_roofline(AVX2, folder=tmp_path, now=1001.0) == (OTHER, 1000.0)
    assert load_roofline(ONE_THREAD, folder=tmp_path, now=1001.0) is None
    entries = json.loads(cache_path(tmp_path).read_text())["entries"]
    assert set(entries) == {machine_key(ZEN4), machine_key(AVX2)}


def test_an_entry_older_than_the_age_limit_or_from_the_future_is_not_used(tmp_path):
    save_roofline(ZEN4, QUIET, folder=tmp_path, now=1000.0)
    limit = peak_cache.MAX_AGE_DAYS * 86400
    assert load_roofline(ZEN4, folder=tmp_path, now=1000.0 + limit - 1) == (QUIET, 1000.0)
    assert load_roofline(ZEN4, folder=tmp_path, now=1000.0 + limit + 1) is None
    assert load_roofline(ZEN4, folder=tmp_path, now=999.0) is None  # a clock set back: measure again


def test_another_peak_kernel_version_is_another_key(monkeypatch, tmp_path):
    save_roofline(ZEN4, QUIET, folder=tmp_path)
    monkeypatch.setattr(peak_cache, "PEAK_KERNELS_VERSION", peak_cache.PEAK_KERNELS_VERSION + 1)
    assert load_roofline(ZEN4, folder=tmp_path) is None


@pytest.mark.parametrize(
    ("text", "warned"),
    [
        (b"{not json", "cannot be read"),
        (b"\xff\xfe not UTF-8", "cannot be read"),
        (json.dumps({"entries": {}}).encode(), "not a kdsl-peak-cache/1 file"),
        (json.dumps([1, 2, 3]).encode(), "not a kdsl-peak-cache/1 file"),
        (json.dumps({"format": "kdsl-peak-cache/1", "entries": []}).encode(), "not a kdsl-peak-cache/1 file"),
    ],
)
def test_a_corrupt_or_foreign_file_is_ignored_with_a_warning_and_replaced(tmp_path, text, warned):
    cache_path(tmp_path).write_bytes(text)
    with pytest.warns(UserWarning, match=warned):
        assert load_roofline(ZEN4, folder=tmp_path) is None
    with pytest.warns(UserWarning, match=warned):
        roofline, note = roofline_for(ZEN4, folder=tmp_path, measure=FakeMeasure(QUIET))
    assert roofline == QUIET and note.startswith("measured now, cached")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file was rewritten: no warning any more
        assert load_roofline(ZEN4, folder=tmp_path)[0] == QUIET


@pytest.mark.parametrize(
    "entry",
    [
        {"measured_at": 1000.0},  # fields missing
        {"measured_at": "yesterday", "peak_gflops": 1.0, "dram_gbs": 1.0, "cache_gbs": 1.0, "cache_bytes": 1},
        {"measured_at": 1000.0, "peak_gflops": -5.0, "dram_gbs": 1.0, "cache_gbs": 1.0, "cache_bytes": 1},
        {"measured_at": 1000.0, "peak_gflops": [1], "dram_gbs": 1.0, "cache_gbs": 1.0, "cache_bytes": 1},
        "a string",
    ],
)
def test_a_malformed_entry_is_ignored_with_a_warning(tmp_path, entry):
    data = {"format": "kdsl-peak-cache/1", "entries": {machine_key(ZEN4): entry}}
    cache_path(tmp_path).write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="malformed entry"):
        assert load_roofline(ZEN4, folder=tmp_path, now=1001.0) is None


def test_the_folder_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KDSL_CACHE_DIR", str(tmp_path / "kdsl-cache"))
    assert cache_path() == tmp_path / "kdsl-cache" / "peak.json"
    monkeypatch.delenv("KDSL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_path() == tmp_path / "xdg" / "kdsl" / "peak.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_path() == tmp_path / "home" / ".cache" / "kdsl" / "peak.json"


def test_a_cache_folder_that_cannot_be_written_is_warned_of_and_the_measurement_still_used(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.warns(UserWarning, match="could not be cached"):
        roofline, note = roofline_for(ZEN4, folder=blocker / "kdsl", measure=FakeMeasure(QUIET))
    assert roofline == QUIET and note == "measured now (not cached)"


def test_bench_peak_save_stores_what_it_measured_as_this_machines_roofline(capsys, monkeypatch):
    from backends import backend

    backend("tvm")
    from kdsl.bench import peak, peak_bench
    from kdsl.cli import main
    from kdsl.codegen.tvm.machine import current_machine

    machine = current_machine()

    def fake_peak(measured, **options):
        assert options["copy"] is True  # the flags reach the measurement
        reads = (peak.Rate(25.0, 24.0), peak.Rate(200.0, 190.0))
        return peak.MachinePeak(measured, peak.Rate(230.0, 229.0), *reads, 1 << 28, 1 << 20)

    monkeypatch.setattr(peak_bench, "measure_peak", fake_peak)
    assert main(["bench", "peak", "--save"]) == 0
    out = capsys.readouterr().out
    assert f"saved as this machine's roofline for kdsl tune and kdsl bench tune --suite: {cache_path()}" in out
    saved = load_roofline(machine)
    assert saved is not None and saved[0] == Roofline(230.0, 25.0, 200.0, machine.l3)
    assert roofline_for(machine, measure=FakeMeasure(OTHER))[0] == saved[0]  # what kdsl tune now uses
    assert main(["bench", "peak"]) == 0 and "saved as" not in capsys.readouterr().out  # only when asked
