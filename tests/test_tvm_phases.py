"""The phase (sub-pixel) form of a window over a Dilate's inserted zeros (kdsl.codegen.tvm.phases): the TVM
lowering computes only the taps that meet an input element, and still computes exactly what the NumPy
reference computes, under the default schedule and at random points of the schedule space; chains
where the pattern does not apply keep the general lowering."""

import os
import random
from math import ceil, prod

import numpy as np
import pytest
from backends import backend, data_inputs

backend("tvm")
torch = backend("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_tvm_schedule import check_scheduled, input_arrays  # noqa: E402

from kdsl import gallery  # noqa: E402
from kdsl.codegen import reference  # noqa: E402
from kdsl.codegen.tvm import build, lower  # noqa: E402
from kdsl.codegen.tvm.schedule_space import ScheduleSpace  # noqa: E402
from kdsl.lang import Dilate, Input, Output, Reduce, Share, Shift, Unfold, Weight, coefficient, primary  # noqa: E402
from kdsl.lang.errors import LoweringError  # noqa: E402

os.environ.setdefault("TVM_NUM_THREADS", "2")

T2 = {"N": 2, "Cin": 3, "Cout": 5, "H": 5, "W": 4}
T3 = {"N": 1, "Cin": 3, "Cout": 4, "D": 3, "H": 4, "W": 2}
CASES = [
    ("conv_transpose2d", T2 | {"K": 4, "s": 2}),
    ("conv_transpose2d", T2 | {"K": 3, "s": 2}),  # K not divisible by s: a guarded last tap
    ("conv_transpose2d", T2 | {"K": 3, "s": 1}),  # no zeros inserted: the general lowering
    ("conv_transpose2d", T2 | {"K": 5, "s": 3}),
    ("conv_transpose2d", T2 | {"K": 1, "s": 2}),
    ("conv_transpose2d", {"N": 1, "Cin": 16, "Cout": 32, "H": 7, "W": 8, "K": 4, "s": 2}),
    ("conv_transpose3d", T3 | {"K": 4, "s": 2}),
    ("conv_transpose3d", T3 | {"K": 3, "s": 2}),
]


def macs(lowered, name="stage0"):
    """The multiply-adds of the lowered stage ``name``: the product of its spatial and reduced extents."""
    seen, stack, tensor = set(), [lowered.out], None
    while stack and tensor is None:  # the stage's tensor among those the output depends on
        t = stack.pop()
        if t.op.name not in seen:
            seen.add(t.op.name)
            tensor = t if t.op.name == name else None
            stack.extend(getattr(t.op, "input_tensors", []))
    assert tensor is not None, name
    count = prod(int(ax.dom.extent) for ax in (*tensor.op.axis, *tensor.op.reduce_axis))
    assert count > 0
    return count


@pytest.mark.parametrize(("name", "layer"), CASES)
def test_transposed_convolutions_scheduled_equal_reference(name, layer):
    report = dict(check_scheduled(gallery.load(name), layer))
    assert not any("fallback" in what for what in report.values()), report


@pytest.mark.parametrize(("name", "layer"), CASES)
def test_only_the_taps_that_meet_an_element_are_computed(name, layer):
    lowered = lower(gallery.load(name), layer)
    dims = len(lowered.output_shape) - 2
    s, k = layer["s"], layer["K"]
    outputs = prod(lowered.output_shape)
    taps = ceil(k / s) ** dims if s > 1 else k**dims  # per output element and input channel
    assert macs(lowered) == outputs * layer["Cin"] * taps
    names = [st.name for st in lowered.stages]
    if s > 1:  # the phased copy, the reduction laid out [.., o1, p, ..], its copy back in the output's order
        assert names == ["pad0", "stage0", "out"], names
        spatial = lowered.stages[1].spatial
        assert spatial.index("H_p") == spatial.index("H_o") + 1, spatial
    else:
        assert not any(r.endswith("_t") for st in lowered.stages for r in st.reduced)


@pytest.mark.parametrize(("name", "layer"), [CASES[5], CASES[6]])
def test_the_heuristic_inlines_the_phased_copy(name, layer):
    # materialized, the copy is s**dims shifted copies of the input written by a scalar pass: ALT's T3D ran
    # 38 ms that way and 22 inlined (docs/tune/README.md)
    lowered = lower(gallery.load(name), layer)
    assert [info.phased for info in lowered.stages] == [True, False, False]
    config = ScheduleSpace(lowered).heuristic()
    assert config["pad0.inline"] is True
    script = ScheduleSpace(lowered).apply(config).mod.script()  # raises if the inlining is refused
    assert 'sblock("stage0_update")' in script and 'sblock("pad0")' not in script


@pytest.mark.parametrize(("name", "layer"), [CASES[1], CASES[3], CASES[7]])
def test_random_points_of_the_schedule_space_equal_reference(name, layer):
    op = gallery.load(name)
    x, weights = input_arrays(op, layer)
    expected = reference.run(op, layer, x, weights)
    space = ScheduleSpace(lower(op, layer, dtype="float64"))
    rng, checked, tried = random.Random(1), 0, 0
    while checked < 4 and tried < 40:
        tried += 1
        config = space.random(rng)
        try:
            space.apply(config)
        except LoweringError:
            continue
        kernel = build(op, layer, dtype="float64", schedule=lambda lowered, config=config: space.apply(config))
        got = kernel(*(torch.from_numpy(a) for a in data_inputs(x)), *(torch.from_numpy(w) for w in weights))
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-9, atol=1e-9, err_msg=str(config))
        checked += 1
    assert checked == 4, f"only {checked} of {tried} random configurations applied"


def test_a_view_of_the_dilated_dim_keeps_the_general_lowering():
    # a Shift between the Dilate and the window remaps the dim: the phase form does not apply
    N, Cin, L, Cout = primary("N Cin L Cout")
    op = (
        Input(N, Cin, L)
        >> Dilate(L, 2)
        >> Shift("L")
        >> Unfold("L", 3, "k")
        >> Share(Weight(Cout, Cin, "k", name="w"))
        >> Reduce(Cin, "k")
        >> Output(N, Cout, "L")
    )
    layer = {"N": 1, "Cin": 3, "Cout": 4, "L": 5}
    lowered = lower(op, layer)
    assert not any(r.endswith("_t") for st in lowered.stages for r in st.reduced)
    check_scheduled(op, layer)


@st.composite
def phase_chains(draw):
    """A chain with a window over inserted zeros on L, a plain window or none on M, a weight or a
    mean, and a second contraction after it or none, with small drawn sizes."""
    N, C, L, M, D, E = primary("N C L M D E")
    S, K = coefficient("s K")
    s, k = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    mean, second, window_m = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    chain = Input(N, C, L, M) >> Dilate(L, S)
    if window_m:
        chain = chain >> Unfold(M, 3, "km")
    chain = chain >> Unfold("L", K, "kl")
    reduced = ["kl", *(["km"] if window_m else [])]
    if mean:
        chain = chain >> Reduce(*reduced, mean=True)
        out = [N, C, "L", M]
    else:
        chain = chain >> Share(Weight(D, C, *reduced, name="w")) >> Reduce(C, *reduced)
        out = [N, "D", "L", M]
        if second:
            chain = chain >> Share(Weight(E, "D", name="v")) >> Reduce("D")
            out = [N, "E", "L", M]
    order = draw(st.permutations(out))
    op = chain >> Output(*order)
    layer = {"s": s, "K": k, "N": draw(st.integers(1, 2)), "C": draw(st.integers(1, 4)), "M": draw(st.integers(4, 5))}
    layer["L"] = draw(st.integers(k // s + 1, k // s + 3))  # the dilated dim longer than the window
    if not mean:
        layer["D"] = draw(st.integers(1, 5))
        if second:
            layer["E"] = draw(st.integers(1, 3))
    return op, layer


@settings(max_examples=20, deadline=None)
@given(phase_chains())
def test_drawn_chains_with_a_window_over_inserted_zeros_equal_reference(case):
    op, layer = case
    report = check_scheduled(op, layer)
    assert report
