"""A residual block's core: the input plus a "same"-padded K x K convolution of it (Cout = Cin).

Reproduces ``x + F.conv2d(x, w, padding=K // 2)``.

out[n, o, h, w] = x[n, o, h, w] + sum_{c, kh, kw} x[n, c, h + kh - K//2, w + kw - K//2] * w[o, c, kh, kw]

The conv's output channel o is renamed to Cin, so the two branches match by name (a Blend adds
dims of one name). Weights: w[o, Cin, kh, kw] is F.conv2d's weight [Cout, Cin, K, K] as is.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
K = coefficient("K")
w = Weight(Dim("o", Cin), Cin, "kh", "kw", name="w")
x = Input(N, Cin, H, W)
t2 = (
    x
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Share(w)
    >> Reduce(Cin, "kh", "kw")
    >> Rename("o", "Cin")
)
residual_conv2d = (
    Blend("add", x, t2)
    >> Output(N, Cin, H, W, defaults={"K": 3})
)
