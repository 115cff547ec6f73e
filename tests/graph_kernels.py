"""Branching kernels several test files build alike (one copy here): squeeze-excitation and attention."""

from __future__ import annotations

from kdsl.lang import FC, Input, Map, Output, Product, Reduce, Rename, Softmax, primary
from kdsl.lang.graph import Graph
from kdsl.lang.sizes import Size

N, C, H, W, R, P, D = primary("N C H W R P D")


def squeeze_excitation(hidden: Size = R, defaults: dict[str, int] | None = None) -> Graph:
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
    assert isinstance(kernel, Graph)
    return kernel


def attention() -> Graph:
    """softmax over the positions Q of the scores Q·K over d, times V: out[N, c, P]."""
    x = Input(N, C, P)
    q = x >> FC(C, name="d", size=D, weight="wq")
    keys = x >> FC(C, name="d", size=D, weight="wk") >> Rename(P, "Q")
    v = x >> FC(C, name="c", size=C, weight="wv") >> Rename(P, "Q")
    kernel = Product(Product(q, keys, "d") >> Softmax("Q"), v, "Q") >> Output(N, "c", P)
    assert isinstance(kernel, Graph)
    return kernel
