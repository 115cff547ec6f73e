"""Kernels several test files build alike (one copy here): squeeze-excitation, attention, and the
grouped convolution with interleaved channels that search finds."""

from __future__ import annotations

from kdsl.lang import (
    FC,
    Dim,
    Input,
    Map,
    Merge,
    Output,
    Product,
    Reduce,
    Rename,
    Share,
    Softmax,
    Split,
    Unfold,
    Weight,
    coefficient,
    primary,
)
from kdsl.lang.operator import Operator
from kdsl.lang.sizes import Size

N, C, H, W, R, P, D = primary("N C H W R P D")


def squeeze_excitation(hidden: Size = R, defaults: dict[str, int] | None = None) -> Operator:
    """x * sigmoid(FC(relu(FC(mean over H, W of x)))), the hidden width ``hidden``."""
    x = Input(N, C, H, W)
    gate = (
        x
        >> Reduce(H, W, mean=True)
        >> FC(C, name="r", size=hidden, weight="squeeze")
        >> Map("relu")
        >> FC("r", name="c", size=C, weight="excite")
        >> Map("sigmoid")
        >> Rename("c", "C")
    )
    kernel = (x * gate) >> Output(N, C, H, W, defaults=defaults)
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
