"""The machine description (:mod:`kdsl.runtime.cpu`; LLVM's features read by
:mod:`kdsl.codegen.tvm.machine`) and the target option (``--mcpu``): LLVM's features of an AVX2 and
an AVX-512 mcpu, the host's caches, model and clock from given sysfs and cpuinfo text, and an unknown
mcpu refused before anything compiles. No timing."""

from __future__ import annotations

import math
import os

import pytest
from backends import backend

from kdsl.bench.target import percent_of_peak, select_mcpu
from kdsl.cli import main
from kdsl.codegen.tvm import default_target
from kdsl.codegen.tvm.machine import current_machine
from kdsl.lang.errors import LoweringError
from kdsl.runtime import cpu as cpu_module
from kdsl.runtime.cpu import FMA_UNITS, fma_units_of, from_features, host_caches, host_ghz, host_model
from kdsl.runtime.workers import WorkerPool

tvm = backend("tvm")

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13  64-Core Processor
cpu MHz\t\t: 2450.000

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13  64-Core Processor
cpu MHz\t\t: 3049.500
"""


@pytest.mark.parametrize(
    ("mcpu", "isa", "lanes", "registers"),
    [("haswell", "avx2", 8, 16), ("znver3", "avx2", 8, 16), ("skylake-avx512", "avx512", 16, 32)],
)
def test_the_machine_of_an_mcpu_comes_from_llvm_features(mcpu, isa, lanes, registers):
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    machine = current_machine(target)
    assert (machine.mcpu, machine.isa, machine.lanes("float32"), machine.vector_registers) == (
        mcpu,
        isa,
        lanes,
        registers,
    )
    assert machine.lanes("float64") == lanes // 2 and machine.cores == 2
    assert machine.accumulators() < registers  # a register tile leaves room for weights and a broadcast
    assert f"mcpu {mcpu}" in machine.describe() and isa.upper() in machine.describe()
    # peak: cores x FMA units x lanes x 2 flops x GHz (both are FMA machines)
    assert machine.peak_gflops() == pytest.approx(2 * machine.fma_units * lanes * 2 * machine.ghz)


def test_an_unknown_mcpu_is_refused_by_name():
    with pytest.raises(LoweringError, match="nonsense"):
        default_target("nonsense")


def test_kdsl_mcpu_retargets_default_target_and_the_machine(monkeypatch):
    monkeypatch.setenv("KDSL_MCPU", "haswell")
    assert str(default_target().attrs["mcpu"]) == "haswell"
    assert current_machine().isa == "avx2" and current_machine().mcpu == "haswell"
    monkeypatch.setenv("KDSL_MCPU", "skylake-avx512")
    assert current_machine().isa == "avx512"


def test_select_mcpu_checks_before_it_sets(monkeypatch):
    # set, then removed: monkeypatch records the variable either way and restores it (unset) after the
    # test; a bare delenv of an unset variable records nothing, and select_mcpu's znver3 below then
    # leaked into every later test (their schedules were AVX2's)
    monkeypatch.setenv("KDSL_MCPU", "haswell")
    monkeypatch.delenv("KDSL_MCPU")
    with pytest.raises(LoweringError, match="not-a-cpu"):
        select_mcpu("not-a-cpu")
    assert "KDSL_MCPU" not in os.environ
    select_mcpu(None)
    assert "KDSL_MCPU" not in os.environ
    select_mcpu("znver3")
    assert os.environ["KDSL_MCPU"] == "znver3" and current_machine().mcpu == "znver3"


def _environment_job(state: None, name: str, slot: object) -> str | None:
    return os.environ.get(name)


def test_spawned_workers_inherit_the_mcpu_next_to_their_own_environment(monkeypatch):
    # the measurer's pool sets TVM_NUM_THREADS in its workers: KDSL_MCPU must survive beside it
    monkeypatch.setenv("KDSL_MCPU", "haswell")
    with WorkerPool(_environment_job, environment={"TVM_NUM_THREADS": "1"}, name="kdsl-test-env") as pool:
        outcomes = pool.run(["KDSL_MCPU", "TVM_NUM_THREADS"])
    assert [outcome.value for outcome in outcomes] == ["haswell", "1"]


def _write_cache(root, index: str, level: str, kind: str, size: str) -> None:
    folder = root / index
    folder.mkdir()
    (folder / "level").write_text(level + "\n")
    (folder / "type").write_text(kind + "\n")
    (folder / "size").write_text(size + "\n")
    assert (folder / "size").read_text().strip() == size


def test_host_caches_reads_a_sysfs_tree(tmp_path):
    _write_cache(tmp_path, "index0", "1", "Data", "48K")
    _write_cache(tmp_path, "index1", "1", "Instruction", "32K")
    _write_cache(tmp_path, "index2", "2", "Unified", "2048K")
    _write_cache(tmp_path, "index3", "3", "Unified", "480M")
    assert host_caches(str(tmp_path)) == {"l1d": 48 * 1024, "l2": 2048 * 1024, "l3": 480 * 1024 * 1024}
    assert host_caches(str(tmp_path / "missing")) == {}


def test_host_model_and_clock_from_cpuinfo_text(monkeypatch):
    assert host_model(CPUINFO) == "AMD EPYC 7B13 64-Core Processor"
    assert host_model("processor : 0\n") == ""
    # hide any cpufreq in sysfs (which host_ghz prefers) so that the given text is what is read
    real_read = cpu_module._read
    monkeypatch.setattr(cpu_module, "_read", lambda path: "" if "cpufreq" in path else real_read(path))
    assert host_ghz(CPUINFO) == pytest.approx(3.0495)
    assert host_ghz("processor : 0\n") == 2.0  # nothing to read: the stated default


def test_fma_units_of_a_server_part_named_like_a_client_core():
    features = {"avx2", "fma", "avx512f"}
    # a cloud VM reports a Sapphire Rapids Xeon as rocketlake (a client core with one 512-bit FMA unit)
    server = from_features("rocketlake", features, cores=2, ghz=2.6, model="Intel(R) Xeon(R) Platinum 8481C")
    client = from_features("rocketlake", features, cores=2, ghz=2.6, model="11th Gen Intel(R) Core(TM) i7-11700")
    unnamed = from_features("rocketlake", features, cores=2, ghz=2.6)
    assert (server.fma_units, client.fma_units, unnamed.fma_units) == (2, 1, 1)
    assert server.peak_gflops() == pytest.approx(2 * client.peak_gflops())


# every row of FMA_UNITS, written out here so that a changed row fails: (mcpu, its features, FMA units)
_AVX512 = {"avx2", "fma", "avx512f"}
_AVX2 = {"avx2", "fma"}
FMA_ROWS = [
    *[(name, {"avx", "fma"}, 1) for name in ("bdver2", "bdver3")],
    ("bdver1", {"avx"}, 1),  # FMA4 only: LLVM's "fma" feature is FMA3
    ("bdver4", _AVX2, 1),
    ("btver2", {"avx"}, 1),
    ("znver1", _AVX2, 1),
    ("znver2", _AVX2, 2),
    ("znver3", _AVX2, 2),
    ("znver4", _AVX512, 1),
    ("znver5", _AVX512, 2),
    *[(name, _AVX512, 1) for name in ("cannonlake", "icelake-client", "tigerlake", "rocketlake")],
    *[
        (name, _AVX512, 2)
        for name in (
            "skylake-avx512",
            "cascadelake",
            "cooperlake",
            "icelake-server",
            "sapphirerapids",
            "emeraldrapids",
            "graniterapids",
        )
    ],
    *[(name, _AVX2, 2) for name in ("haswell", "broadwell", "skylake", "alderlake")],
]


@pytest.mark.parametrize(("mcpu", "features", "units"), FMA_ROWS, ids=[row[0] for row in FMA_ROWS])
def test_fma_units_follow_the_llvm_cpu_name(mcpu, features, units):
    machine = from_features(mcpu, features, cores=2, ghz=2.0)
    assert machine.fma_units == units
    assert machine.peak_gflops() == pytest.approx(2 * units * machine.lanes() * 2 * 2.0)
    assert FMA_UNITS[mcpu] == units
    # an AMD server's model name changes nothing: LLVM's znver names come from the CPUID family itself
    epyc = from_features(mcpu, features, cores=2, ghz=2.0, model="AMD EPYC 9B14")
    assert epyc.fma_units == (units if "fma" in features or "avx512f" in features else 1)


def test_every_row_of_the_fma_table_is_tested_and_known_to_llvm():
    assert {row[0] for row in FMA_ROWS} == set(FMA_UNITS)
    for mcpu in FMA_UNITS:
        assert current_machine(default_target(mcpu)).mcpu == mcpu  # an unknown name raises


def test_zen4_assumes_one_512_bit_fma_per_cycle_where_zen5_assumes_two():
    zen4 = from_features("znver4", _AVX512, cores=2, ghz=2.6, model="AMD EPYC 9B14 96-Core Processor")
    zen5 = from_features("znver5", _AVX512, cores=2, ghz=2.6, model="AMD EPYC 9B45 128-Core Processor")
    assert (zen4.fma_units, zen5.fma_units) == (1, 2)
    assert zen4.peak_gflops() == pytest.approx(166.4)  # 2 cores x 1 x 16 lanes x 2 x 2.6 GHz
    assert "1 FMA unit," in zen4.describe() and "2 FMA units," in zen5.describe()
    assert fma_units_of("znver3", {"sse2"}) == 1  # no FMA: a multiply and an add, one unit of two flops


def test_percent_of_peak_counts_two_flops_per_mac():
    machine = from_features("haswell", {"avx2", "fma"}, cores=2, ghz=3.0)  # 2 x 2 x 8 x 2 x 3 = 192 GFLOP/s
    assert percent_of_peak(macs=96e9, seconds=1.0, peak_gflops=machine.peak_gflops()) == pytest.approx(100.0)
    assert percent_of_peak(macs=1e9, seconds=0.1, peak_gflops=machine.peak_gflops()) == pytest.approx(100 * 20 / 192)


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "tune", "--mcpu", "nonsense"],
        ["bench", "codegen", "--ops", "conv2d", "--mcpu", "nonsense"],
        ["tune", "matmul", "--layers", '{"M": 4, "Cin": 8, "Cout": 8}', "--trials", "1", "--mcpu", "nonsense"],
    ],
)
def test_the_cli_refuses_an_unknown_mcpu_before_it_measures(capsys, monkeypatch, tmp_path, argv):
    monkeypatch.setenv("KDSL_MCPU", "haswell")
    monkeypatch.delenv("KDSL_MCPU")  # restored (unset) after the test, whatever the command sets
    monkeypatch.chdir(tmp_path)  # kdsl tune would write tune.db here
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "nonsense" in captured.err and "Traceback" not in captured.err
    assert len(captured.err.strip().splitlines()) == 1 and captured.out == ""
    assert "KDSL_MCPU" not in os.environ and list(tmp_path.iterdir()) == []  # nothing set, nothing tuned


AVX2 = from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0)
AVX512 = from_features("skylake-avx512", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=3.0)


def _register_tile(name, layer, machine):
    """The default schedule's register tile of ``name``'s contraction stage on ``machine``: its inner
    spatial tiles, the vector axis and the layout choices."""
    from kdsl import gallery
    from kdsl.codegen.tvm import lower
    from kdsl.codegen.tvm.schedule_space import ScheduleSpace

    space = ScheduleSpace(lower(gallery.load(name), layer), machine=machine)
    config = space.heuristic()
    stage = next(s for s in space.stages if s.kind == "reduce")
    inner = {axis: config[f"{stage.name}.tile.{axis}"][2] for axis, e in stage.spatial if e > 1}
    vector = config[f"{stage.name}.vector"]
    assert space.lanes == machine.lanes() and inner[vector] > 1
    return inner, vector, config


@pytest.mark.parametrize("machine", [AVX2, AVX512], ids=["avx2", "avx512"])
@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("matmul", {"M": 512, "Cin": 1024, "Cout": 1024}),
        ("conv2d", {"N": 1, "Cin": 128, "Cout": 128, "H": 28, "W": 28}),
        ("conv2d", {"N": 8, "Cin": 64, "Cout": 64, "H": 56, "W": 56}),
    ],
)
def test_the_register_tile_fits_the_vector_width_and_the_register_file(name, layer, machine):
    inner, vector, _ = _register_tile(name, layer, machine)
    lanes = machine.lanes()
    assert inner[vector] % lanes == 0, (inner, lanes)  # whole vectors along the vector axis
    accumulators = (inner[vector] // lanes) * math.prod(f for axis, f in inner.items() if axis != vector)
    assert accumulators <= machine.accumulators(), (inner, accumulators)
    # and it uses the register file: at least half the accumulators a tile may hold
    assert 2 * accumulators >= machine.accumulators(), (inner, accumulators)


def test_the_register_tile_differs_between_avx2_and_avx512():
    layer = {"M": 512, "Cin": 1024, "Cout": 1024}
    narrow, vector, _ = _register_tile("matmul", layer, AVX2)
    wide, _, _ = _register_tile("matmul", layer, AVX512)
    assert narrow[vector] == 2 * AVX2.lanes() and wide[vector] == 2 * AVX512.lanes()
    assert math.prod(narrow.values()) < math.prod(wide.values())


@pytest.mark.parametrize("machine", [AVX2, AVX512], ids=["avx2", "avx512"])
def test_a_matmul_weight_is_packed_into_panels_of_the_vector_tile(machine):
    inner, vector, config = _register_tile("matmul", {"M": 64, "Cin": 256, "Cout": 128}, machine)
    assert vector == "Cout"
    assert config["layout.w.tile"] == f"1:{inner['Cout']}" and tuple(config["layout.w.perm"]) == (1, 0)


def test_a_second_axis_fills_the_accumulators_the_first_leaves():
    # W = 14 takes 2 rows of AVX2's budget of 4 (2 vectors each): H fills the rest (2 x 2 x 2 vectors)
    inner, vector, _ = _register_tile("conv2d", {"N": 8, "Cin": 256, "Cout": 256, "H": 14, "W": 14}, AVX2)
    accumulators = (inner[vector] // AVX2.lanes()) * math.prod(f for axis, f in inner.items() if axis != vector)
    assert accumulators == AVX2.accumulators(), inner
    assert sum(1 for axis, f in inner.items() if axis != vector and f > 1) == 2, inner
