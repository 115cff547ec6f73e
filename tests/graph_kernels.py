"""Kernels several test files build alike (one copy here): squeeze-excitation, attention, a residual
convolution, a strided max pool, and the grouped convolution with interleaved channels that search
finds."""

from __future__ import annotations

from kdsl.lang import FC, Fold, Input, Map, Output, Product, Rename, Softmax, coefficient, primary
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import Dim, Merge, Reduce, Share, Split, Stride, Unfold, Weight
from kdsl.lang.sizes import Size

N, C, H, W, R, P, D = primary("N C H W R P D")
K = coefficient("K")


def squeeze_excitation(
    hidden: Size = R, defaults: dict[str, int] | None = None, channels: str = "C", hidden_name: str = "r"
) -> Operator:
    """x * sigmoid(FC(relu(FC(mean over H, W of x)))), the hidden width ``hidden`` (its dim
    ``hidden_name``), over the channels ``channels`` (the gallery's kernel: ``Cin`` and ``z``)."""
    c = primary(channels)
    x = Input(N, c, H, W)
    gate = (
        x
        >> Reduce(H, W, mean=True)
        >> FC(c, name=hidden_name, size=hidden, weight="squeeze")
        >> Map("relu")
        >> FC(hidden_name, name="c", size=c, weight="excite")
        >> Map("sigmoid")
        >> Rename("c", channels)
    )
    kernel = (x * gate) >> Output(N, c, H, W, defaults=defaults)
    assert not kernel.is_linear
    return kernel


def residual_conv() -> Operator:
    """x + a "same"-padded K x K convolution of x (K = 3 by default), channels C in and out."""
    x = Input(N, C, H, W)
    conv = (
        x
        >> Unfold(H, K, "kh")
        >> Unfold(W, K, "kw")
        >> Share(Weight(Dim("o", C), C, "kh", "kw", name="w"))
        >> Reduce(C, "kh", "kw")
    )
    kernel = (x + (conv >> Rename("o", "C"))) >> Output(N, C, H, W, defaults={"K": 3})
    assert not kernel.is_linear
    return kernel


def max_pool_3x3_stride_2() -> Operator:
    """A 3x3 max pool at stride 2 (a Fold: the windows' zero padding takes part)."""
    kernel = (
        Input(N, C, H, W)
        >> Unfold(H, 3, "kh")
        >> Stride(H, 2)
        >> Unfold(W, 3, "kw")
        >> Stride(W, 2)
        >> Fold("kh", "kw")
        >> Output(N, C, H / 2, W / 2)
    )
    assert not kernel.is_linear
    return kernel


def attention() -> Operator:
    """softmax over the positions Q of the scores Q·K over d, times V: out[N, c, P]."""
    x = Input(N, C, P)
    q = x >> FC(C, name="d", size=D, weight="wq")
    keys = x >> FC(C, name="d", size=D, weight="wk") >> Rename(P, "Q")
    v = x >> FC(C, name="c", size=C, weight="wv") >> Rename(P, "Q")
    kernel = Product(Product(q, keys, "d") >> Softmax("Q"), v, "Q") >> Output(N, "c", P)
    assert not kernel.is_linear
    return kernel


def interleaved_grouped(split_interleaved: bool, merge_interleaved: bool) -> Operator:
    """Grouped 3x3 conv (G = 2) whose groups read interleaved input channels (``Split(Cin, G, "ci",
    "g")``) and/or write interleaved output channels (``Merge("co", "g", "Cout")``) when asked."""
    n, cin, h, w, cout = primary("N Cin H W Cout")
    g, k = coefficient("G K")
    weight = Weight("g", Dim("co", cout / g), "ci", "kh", "kw", name="w")
    split = Split(cin, g, "ci", "g") if split_interleaved else Split(cin, cin / g, "g", "ci")
    merge = Merge("co", "g", "Cout") if merge_interleaved else Merge("g", "co", "Cout")
    return (
        Input(n, cin, h, w)
        >> split
        >> Unfold(h, k, "kh")
        >> Unfold(w, k, "kw")
        >> Share(weight)
        >> Reduce("ci", "kh", "kw")
        >> merge
        >> Output(n, cout, h, w, defaults={"G": 2, "K": 3})
    )
