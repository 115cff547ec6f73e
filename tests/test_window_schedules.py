"""Window reductions whose vector axis reads its input with a stride (pooling windows at stride 2 or 3):
a window sum or mean leaves that axis to LLVM's loop vectorizer (``ScheduleSpace.strided_rows``: a serial
row, the window unrolled inside it, the sum in place), a max pool (a branching kernel) keeps its strided
vector but reads a materialized pad. Checked against the NumPy reference for strided, overlapping and
ragged windows, mean and max, for AVX-512 and AVX2 machine descriptions; the rule is the block analysis's
(an unnamed operator with the same reads gets it, one that reads its rows contiguously does not), and the
configuration it picks is a point of the space that the tuners' neighbours move from and back to."""

import os

import pytest
from backends import backend

backend("tvm")
torch = backend("torch")

from test_tvm_schedule_forms import check_config  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.bench.network_strided import max_pool_op  # noqa: E402
from kdsl.codegen.tvm import lower  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace, neighbours  # noqa: E402
from kdsl.lang import Input, Output, Reduce, Split, coefficient, primary  # noqa: E402
from kdsl.runtime.cpu import from_features  # noqa: E402

os.environ.setdefault("TVM_NUM_THREADS", "2")

AVX512 = from_features("skylake-avx512", {"avx", "avx2", "fma", "avx512f"}, cores=2, ghz=3.0)
AVX2 = from_features("haswell", {"avx", "avx2", "fma"}, cores=2, ghz=3.0)
MACHINES = pytest.mark.parametrize("machine", [AVX512, AVX2], ids=["avx512", "avx2"])


def _strided(n, c, size, window, stride):
    """A layer of ``avg_pool2d_strided`` (PyTorch's floor for the output size)."""
    out = (size - window) // stride + 1
    return {"N": n, "Cin": c, "H": size, "W": size, "Ho": out, "Wo": out, "K": window, "s": stride}


#: (operator, layer): tile means at stride 2 (Wo = 6; Wo = 19, no multiple of any vector), overlapping means
#: (K=3, s=2: Wo = 10; 41 with a dropped last column; K=5), the separable form's columns at stride 2
MEANS = [
    ("avg_pool2d", {"N": 2, "Cin": 3, "H": 12, "W": 12, "K": 2}),
    ("avg_pool2d", {"N": 1, "Cin": 2, "H": 38, "W": 38, "K": 2}),
    ("avg_pool2d_strided", _strided(2, 3, 21, 3, 2)),
    ("avg_pool2d_strided", _strided(1, 2, 83, 3, 2)),
    ("avg_pool2d_strided", _strided(2, 2, 23, 5, 2)),  # a window of 5, longer than the usual unroll bound
]


def _strided_stages(space, config):
    """The reduction stages whose heuristic configuration is the strided-rows schedule, checked to be it."""
    found = []
    for stage in space.stages:
        if stage.kind != "reduce" or not space.strided_rows(stage, stage.axis(config[f"{stage.name}.vector"])):
            continue
        vector = stage.axis(config[f"{stage.name}.vector"])
        assert config[f"{stage.name}.tile.{vector.label}"] == (1, vector.extent, 1), config
        assert config[f"{stage.name}.cache"] == "none", config
        # the whole window unrolled inside the row (a rolled window loop would be LLVM's innermost loop)
        assert all(config[f"{stage.name}.tile.{a}"] == (1, e) for a, e in stage.reduced if e > 1), config
        found.append(stage.name)
    # every stage it names reads along its row with a constant stride above 1 (the analysis's verdict)
    assert all(space.stage_named(n).axis(config[f"{n}.vector"]).gather_stride > 1 for n in found), found
    return found


@MACHINES
@pytest.mark.parametrize("name, layer", MEANS, ids=[f"{n}-{lay['W']}-K{lay['K']}" for n, lay in MEANS])
def test_a_strided_window_mean_runs_serial_rows_and_equals_the_reference(machine, name, layer):
    op = gallery.load(name)
    space = ScheduleSpace(lower(op, layer, dtype="float64"), machine=machine)
    config = space.heuristic()
    # the stage that reads with a stride of 2 (the tile mean's only stage, the separable form's columns)
    assert _strided_stages(space, config) == [space.stages[-1].name], config
    report = []
    space.apply(config, report=report)
    assert not any("fallback" in what for _, what in report), report
    check_config(op, layer, space, config)


@MACHINES
@pytest.mark.parametrize("size", [32, 24], ids=["whole-vectors", "ragged-rows"])
def test_a_strided_max_pool_keeps_its_vector_and_pads_its_input(machine, size):
    # a branching kernel: no serial rows (a max Fold's keys measured faster as a strided vector), and the
    # windows read a materialized pad instead of bounds checks lane by lane (Wo = 12: no whole vector)
    op = max_pool_op()
    layer = {"N": 1, "Cin": 3, "H": size, "W": size, "K": 3, "s": 2}
    space = ScheduleSpace(lower(op, layer, dtype="float64"), machine=machine)
    config = space.heuristic()
    assert _strided_stages(space, config) == [], config
    pads = [s.name for s in space.stages if s.kind == "pad"]
    assert pads and all(config[f"{p}.inline"] is False for p in pads), config
    check_config(op, layer, space, config)


def test_the_rule_follows_the_reads_not_the_operator():
    # two unnamed poolings along one dim: along W the outputs read x with a stride of 2 (serial rows); along
    # H each output row reads a contiguous row of x (a TVM vector along W, as before)
    n, c, h, w = primary("N C H W")
    k = coefficient("K")
    along_w = Input(n, c, h, w) >> Split(w, k, "Wo", "kw") >> Reduce("kw", mean=True) >> Output(n, c, h, "Wo")
    along_h = Input(n, c, h, w) >> Split(h, k, "Ho", "kh") >> Reduce("kh", mean=True) >> Output(n, c, "Ho", w)
    layer = {"N": 2, "C": 4, "H": 16, "W": 32, "K": 2}
    verdicts = {}
    for label, op in (("W", along_w), ("H", along_h)):
        space = ScheduleSpace(lower(op, layer, dtype="float64"), machine=AVX512)
        config = space.heuristic()
        verdicts[label] = _strided_stages(space, config)
        check_config(op, layer, space, config)
    assert verdicts == {"W": ["stage0"], "H": []}, verdicts
    # a convolution reads a weight: its strided vector keeps the register-tiled micro-kernel
    conv = ScheduleSpace(lower(gallery.load("conv2d"), {"N": 1, "Cin": 8, "Cout": 8, "H": 8, "W": 8}))
    assert _strided_stages(conv, conv.heuristic()) == []


def test_tuners_reach_the_serial_rows_and_the_strided_vector_from_each_other():
    space = ScheduleSpace(lower(gallery.load("avg_pool2d"), {"N": 2, "Cin": 3, "H": 12, "W": 32, "K": 2}))
    config = space.heuristic()
    assert config["stage0.tile.Wo"] == (1, 16, 1) and space.rejection(config) is None, config
    # one step of the q-random walk moves the row's factor into the vector tile (TVM's strided vector) ...
    vectorized = [c for c in neighbours(space, config) if c["stage0.tile.Wo"][2] > 1]
    assert vectorized, "no neighbour vectorizes the row"
    assert any(space.rejection(c) is None for c in vectorized)
    # ... and one step back returns to the serial row
    assert any(config == back for back in neighbours(space, vectorized[0])), vectorized[0]["stage0.tile.Wo"]


@MACHINES
def test_a_window_sum_computed_in_its_reader_keeps_the_input_layout(machine):
    # P2's row sums (stage0) run inside their reader's loop, vectorized along the rows they make there: a
    # channels-last pack of the input for stage0's own channel vector was a transposing pass for nothing
    op, layer = gallery.load("avg_pool2d_strided"), _strided(2, 168, 83, 2, 2)
    space = ScheduleSpace(lower(op, layer, dtype="float32"), machine=machine)
    config = space.heuristic()
    assert config["stage0.attach"] == "outer", config
    assert config["layout.x.perm"] == (0, 1, 2, 3), config
    check_config(op, layer, space, config, dtype="float32")
