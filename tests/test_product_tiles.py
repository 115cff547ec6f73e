"""Products of data inputs (batched matmuls): the heuristic takes a short vector axis whole (4 vectors x 4 rows
where it took 2 vectors x 8 rows), the schedule computes what the reference computes, operators with weights
keep their tiles, and the tuners measure the new register tile within 16 trials from a fresh database."""

from __future__ import annotations

import pytest
from backends import backend

backend("tvm")
backend("torch")

from test_space_rules import _FakeMeasurer  # noqa: E402  (a latency from the configuration's key)
from test_tvm_schedule_forms import check_config  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen.tvm import lower  # noqa: E402
from kdsl.codegen.tvm.machine import current_machine  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.runtime.cpu import from_features  # noqa: E402

AVX512 = from_features("skylake-avx512", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=2.6)
AVX2 = from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0)


def _tiles(name: str, layer: dict, machine) -> dict:
    """The heuristic's tiles of the operator's one reduction stage, by axis."""
    space = ScheduleSpace(lower(gallery.load(name), layer), machine)
    config = space.heuristic()
    tiles = {n.rsplit(".", 1)[1]: v for n, v in config.items() if ".tile." in n and not n.startswith("layout.")}
    assert tiles, f"{name}: no tiled reduction"
    return tiles


@pytest.mark.parametrize("name", ["bmm", "bmm_tn"])
@pytest.mark.parametrize(("machine", "n", "rows"), [(AVX512, 64, 4), (AVX2, 32, 2), (AVX512, 48, 5)])
def test_a_short_vector_axis_of_a_product_is_taken_whole(name, machine, n, rows):
    # 16 accumulators (8 for AVX2) over n / lanes vectors leave the rows; M = 20 has a divisor 4 and 5, not 8
    layer = {"B": 3, "M": 40, "K": 24, "N": n}
    tiles = _tiles(name, layer, machine)
    assert tiles["N"] == (1, 1, n)
    assert tiles["M"][2] == max(d for d in range(1, rows + 1) if 40 % d == 0)


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("bmm", {"B": 3, "M": 40, "K": 24, "N": 128}),  # 8 vectors: longer than a short axis, two vectors as before
        ("bmm_tn", {"B": 1, "M": 1, "K": 24, "N": 64}),  # one row: no register tile to share the broadcasts
        ("matmul", {"M": 40, "Cin": 24, "Cout": 64}),  # a weight: packed into panels, two vectors as before
    ],
)
def test_products_with_a_long_axis_one_row_or_a_weight_keep_two_vectors(name, layer):
    tiles = _tiles(name, layer, AVX512)
    vector = "Cout" if name == "matmul" else "N"
    assert tiles[vector] == (layer[vector] // 32, 1, 32)


@pytest.mark.parametrize("name", ["bmm", "bmm_tn"])
def test_the_whole_row_schedule_matches_the_reference(name):
    op, layer = gallery.load(name), {"B": 2, "M": 12, "K": 20, "N": 32}  # 4 vectors of 8 float64 lanes
    space = ScheduleSpace(lower(op, layer, dtype="float64"), AVX512)
    config = space.heuristic()
    assert config["n2_product.tile.N"] == (1, 1, 32)
    check_config(op, layer, space, config)


@pytest.mark.parametrize("tuner", ["opevo", "gensor", "alt"])
def test_the_tuners_measure_the_whole_row_tile_within_16_trials(tmp_path, tuner):
    from kdsl.tune.driver import tune

    lanes = current_machine().lanes("float32")
    # 4 vectors of this machine: whole, with the rows its accumulators leave (AVX-512: 16 / 4 = 4; AVX2: 8 / 4 = 2)
    rows = current_machine().accumulators() // 4
    layer = {"B": 4, "M": 16, "K": 16, "N": 4 * lanes}
    measurer = _FakeMeasurer()
    options = {"steps": 40, "walks": 2} if tuner == "gensor" else {"min_records": 8} if tuner == "alt" else {}
    result = tune(
        gallery.load("bmm_tn"), layer, tuner, 16, tmp_path / "t.db", batch=8, measurer=measurer,
        options=options, confirm=0, cost_model=False,
    )  # fmt: skip
    assert len(measurer.measured) == result.measured == 16
    whole = [c for c in measurer.measured if tuple(c["n2_product.tile.N"]) == (1, 1, 4 * lanes)]
    assert any(c["n2_product.tile.M"][2] == rows for c in whole), f"{tuner} never measured N whole x {rows} rows"
