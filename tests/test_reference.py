"""The NumPy reference interpreter, one primitive at a time, on tiny arrays checked by hand."""

import numpy as np
import pytest

from kdsl.codegen import reference
from kdsl.lang import Input, Output, coefficient, library, primary
from kdsl.lang.errors import DivisibilityError, LayerError, LoweringError, ShapeError
from kdsl.lang.primitives import Expand, Merge, Reduce, Share, Shift, Split, Stride, Unfold, Weight

N, C, L, H, W, Cin, Cout = primary("N C L H W Cin Cout")
K, s, G = coefficient("K s G")


def assert_runs_to(op, layer, x, weights, expected):
    got = reference.run(op, layer, np.asarray(x, dtype=np.float64), [np.asarray(w, dtype=np.float64) for w in weights])
    assert got.shape == np.asarray(expected).shape, (got.shape, np.asarray(expected).shape)
    np.testing.assert_array_equal(got, np.asarray(expected, dtype=np.float64))
    assert got.dtype == np.float64


# -- view primitives ---------------------------------------------------------------------------


def test_unfold_windows_with_zero_padding():
    op = Input(L) >> Unfold(L, K, "k") >> Output(L, "k")
    expected = [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0]]
    assert_runs_to(op, {"L": 4, "K": 3}, [1, 2, 3, 4], [], expected)


def test_unfold_even_window_starts_k_over_2_before():
    # out[i, j] = in[i + j - K//2] with K//2 = 1 for K = 2
    op = Input(L) >> Unfold(L, K, "k") >> Output(L, "k")
    assert_runs_to(op, {"L": 3, "K": 2}, [1, 2, 3], [], [[0, 1], [1, 2], [2, 3]])


def test_unfold_window_larger_than_the_dim_is_bounded_by_the_dim():
    op = Input(L) >> Unfold(L, K, "k") >> Output(L, "k")
    # K = 5 > L = 2: offsets -2..2; only 0 <= i + j - 2 < 2 read data
    expected = [[0, 0, 1, 2, 0], [0, 1, 2, 0, 0]]
    assert_runs_to(op, {"L": 2, "K": 5}, [1, 2], [], expected)


def test_shift_wraps_around():
    op = Input(L) >> Shift(L) >> Output(L)
    assert_runs_to(op, {"L": 4}, [1, 2, 3, 4], [], [2, 3, 4, 1])
    back = Input(L) >> Shift(L, -2) >> Output(L)
    assert_runs_to(back, {"L": 4}, [1, 2, 3, 4], [], [3, 4, 1, 2])
    far = Input(L) >> Shift(L, 5) >> Output(L)  # offsets larger than the dim wrap too
    assert_runs_to(far, {"L": 4}, [1, 2, 3, 4], [], [2, 3, 4, 1])


def test_stride_keeps_every_s_th_element():
    op = Input(L) >> Unfold(L, 3, "k") >> Stride(L, s) >> Reduce("k") >> Output("L")
    # window sums [3, 6, 9, 12, 15, 11] at positions 0..5; stride 2 keeps positions 0, 2, 4
    assert_runs_to(op, {"L": 6, "s": 2}, [1, 2, 3, 4, 5, 6], [], [3, 9, 15])


def test_stride_on_a_window_keeps_every_s_th_tap():
    op = Input(L) >> Unfold(L, 4, "k") >> Stride("k", 2) >> Output(L, "k")
    # taps j = 0, 2 of a 4-window at offset -2: in[i - 2], in[i]
    assert_runs_to(op, {"L": 3}, [1, 2, 3], [], [[0, 1], [0, 2], [1, 3]])


def test_split_index_order_is_outer_times_block_plus_inner():
    op = Input(L) >> Split(L, 3, "g", "j") >> Output("g", "j")
    assert_runs_to(op, {"L": 6}, [0, 1, 2, 3, 4, 5], [], [[0, 1, 2], [3, 4, 5]])


def test_merge_index_order_and_it_undoes_split():
    op = Input(H, W) >> Merge(W, H, "WH") >> Output("WH")
    # out[i] = in[h = i % H, w = i // H]: W is the outer (slow) index
    assert_runs_to(op, {"H": 2, "W": 3}, [[0, 1, 2], [3, 4, 5]], [], [0, 3, 1, 4, 2, 5])
    round_trip = Input(L) >> Split(L, 2, "a", "b") >> Merge("a", "b", "L2") >> Output("L2")
    assert_runs_to(round_trip, {"L": 6}, np.arange(6), [], np.arange(6))


def test_expand_repeats_the_data():
    op = Input(L) >> Expand("e", C) >> Output("e", L)
    assert_runs_to(op, {"L": 2, "C": 3}, [1, 2], [], [[1, 2], [1, 2], [1, 2]])


def test_reduce_sum_and_mean():
    total = Input(H, W) >> Reduce(W) >> Output(H)
    assert_runs_to(total, {"H": 2, "W": 3}, [[1, 2, 3], [4, 5, 6]], [], [6, 15])
    mean = Input(H, W) >> Reduce(H, mean=True) >> Output(W)
    assert_runs_to(mean, {"H": 2, "W": 3}, [[1, 2, 3], [4, 5, 6]], [], [2.5, 3.5, 4.5])


def test_reduce_mean_right_after_share():
    op = Input(C, H) >> Share(Weight(H, name="w")) >> Reduce(H, mean=True) >> Output(C)
    assert_runs_to(op, {"C": 2, "H": 2}, [[1, 3], [2, 4]], [[10, 100]], [155, 210])


# -- Share ---------------------------------------------------------------------------------------


def test_share_aligns_shared_dims_by_name_and_adds_weight_only_dims():
    op = Input(H, W) >> Share(Weight(W, Cout, name="w")) >> Output(Cout, H, W)
    x = np.array([[1.0, 2.0], [3.0, 4.0]])  # [H, W]
    w = np.array([[1.0, 10.0, 100.0], [2.0, 20.0, 200.0]])  # [W, Cout]
    expected = np.einsum("hw,wo->ohw", x, w)
    assert_runs_to(op, {"H": 2, "W": 2, "Cout": 3}, x, [w], expected)
    assert reference.run(op, {"H": 2, "W": 2, "Cout": 3}, x, [w])[2, 1, 0] == 3.0 * 100.0


def test_share_then_reduce_is_a_matrix_product():
    op = Input(N, Cin) >> Share(Weight(Cout, Cin, name="w")) >> Reduce(Cin) >> Output(Cout, N)
    x = np.arange(6.0).reshape(2, 3)
    w = np.arange(12.0).reshape(4, 3)
    assert_runs_to(op, {"N": 2, "Cin": 3, "Cout": 4}, x, [w], (x @ w.T).T)


def test_two_weights_in_order():
    op = (
        Input(N, Cin)
        >> Share(Weight(Cin, name="scale"))
        >> Share(Weight(Cout, Cin, name="w"))
        >> Reduce(Cin)
        >> Output(N, Cout)
    )
    x = np.array([[1.0, 2.0]])
    scale = np.array([3.0, 5.0])
    w = np.array([[1.0, 1.0], [1.0, -1.0]])
    assert_runs_to(op, {"N": 1, "Cin": 2, "Cout": 2}, x, [scale, w], [[13.0, -7.0]])


def test_computes_in_the_dtype_of_x():
    op = Input(N, Cin) >> Share(Weight(Cout, Cin, name="w")) >> Reduce(Cin) >> Output(N, Cout)
    x, (w,) = reference.random_inputs(op, {"N": 2, "Cin": 3, "Cout": 4}, dtype=np.float32)
    out = reference.run(op, {"N": 2, "Cin": 3, "Cout": 4}, x, [w.astype(np.float64)])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-5)


def test_random_inputs_are_seeded():
    op = Input(N, Cin) >> Share(Weight(Cout, Cin, name="w")) >> Reduce(Cin) >> Output(N, Cout)
    layer = {"N": 2, "Cin": 3, "Cout": 4}
    first, second, other = (reference.random_inputs(op, layer, seed=k) for k in (1, 1, 2))
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1][0], second[1][0])
    assert not np.array_equal(first[0], other[0])


def test_shapes_and_defaults():
    op = Input(N, Cin, H) >> Unfold(H, K, "k") >> Stride(H, s) >> Share(Weight(Cout, Cin, "k", name="w"))
    op = op >> Reduce(Cin, "k") >> Output(N, Cout, "H", defaults={"K": 3, "s": 2})
    got = reference.shapes(op, {"N": 1, "Cin": 2, "Cout": 5, "H": 8})
    assert got == reference.Shapes(input=(1, 2, 8), weights=((5, 2, 3),), output=(1, 5, 4))
    assert reference.shapes(op, {"N": 1, "Cin": 2, "Cout": 5, "H": 9, "s": 3}).output == (1, 5, 3)


# -- errors ----------------------------------------------------------------------------------------

CONV1D = (
    Input(N, Cin, L)
    >> Unfold(L, K, "k")
    >> Share(Weight(Cout, Cin, "k", name="w"))
    >> Reduce(Cin, "k")
    >> Output(N, Cout, L, defaults={"K": 3})
)
LAYER = {"N": 1, "Cin": 2, "Cout": 3, "L": 5}


def test_wrong_input_shape_names_the_dim():
    x, weights = reference.random_inputs(CONV1D, LAYER)
    with pytest.raises(ShapeError, match=r"dim L has size 4 but this layer needs 5"):
        reference.run(CONV1D, LAYER, x[..., :4], weights)
    with pytest.raises(ShapeError, match=r"has 2 axes"):
        reference.run(CONV1D, LAYER, x[0], weights)


def test_wrong_weights_raise_shape_errors():
    x, (w,) = reference.random_inputs(CONV1D, LAYER)
    with pytest.raises(ShapeError, match=r"1 weights \(w\) but 0 were given"):
        reference.run(CONV1D, LAYER, x, [])
    with pytest.raises(ShapeError, match=r"weight w: the dim k has size 2 but this layer needs 3"):
        reference.run(CONV1D, LAYER, x, [w[..., :2]])
    with pytest.raises(ShapeError, match=r"the weight w must be a NumPy array, got str"):
        reference.run(CONV1D, LAYER, x, "w")
    with pytest.raises(ShapeError, match=r"1 weights \(w\) but 2 were given"):
        reference.run(CONV1D, LAYER, x, w, w)


def test_the_weights_one_by_one_as_a_kernel_takes_them_give_the_same_result():
    x, (w,) = reference.random_inputs(CONV1D, LAYER)
    np.testing.assert_array_equal(reference.run(CONV1D, LAYER, x, w), reference.run(CONV1D, LAYER, x, [w]))


def test_unbound_variable_is_a_layer_error():
    x, weights = reference.random_inputs(CONV1D, LAYER)
    with pytest.raises(LayerError, match=r"no value for Cout"):
        reference.run(CONV1D, {"N": 1, "Cin": 2, "L": 5}, x, weights)
    with pytest.raises(LayerError, match=r"positive integers"):
        reference.run(CONV1D, {**LAYER, "L": 0}, x, weights)


def test_a_size_that_does_not_divide_is_a_divisibility_error():
    op = Input(N, Cin) >> Split(Cin, Cin / G, "g", "ci") >> Reduce("ci") >> Output(N, "g")
    x = np.zeros((1, 6))
    with pytest.raises(DivisibilityError, match=r"Split\(Cin, Cin/G\).*Cin/G is 3/2 .*Cin=6, G=4"):
        reference.run(op, {"N": 1, "Cin": 6, "G": 4}, x, [])
    strided = Input(H) >> Unfold(H, 3, "k") >> Stride(H, s) >> Reduce("k") >> Output("H")
    with pytest.raises(DivisibilityError, match=r"Stride\(H, s\)"):
        reference.run(strided, {"H": 7, "s": 2}, np.zeros(7), [])


def test_integer_input_is_refused():
    x, weights = reference.random_inputs(CONV1D, LAYER)
    with pytest.raises(LoweringError, match=r"floating"):
        reference.run(CONV1D, LAYER, x.astype(np.int64), weights)


def test_an_image_of_64x64_runs_quickly():
    conv = library.load("conv2d")  # 3x3, "same" padding
    layer = {"N": 2, "Cin": 16, "Cout": 16, "H": 64, "W": 64}
    x, weights = reference.random_inputs(conv, layer)
    out = reference.run(conv, layer, x, weights)
    assert out.shape == (2, 16, 64, 64)
    # the centre pixel is an ordinary dot product of the 3x3 patch with the filter
    patch = x[:, :, 9:12, 19:22]
    np.testing.assert_allclose(out[:, :, 10, 20], np.einsum("nchw,ochw->no", patch, weights[0]))
