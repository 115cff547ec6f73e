"""Strided 2-D convolution: output [N, Cout, H/s, W/s].

Reproduces ``torch.nn.functional.conv2d(x, w, stride=s, padding=K // 2)`` for odd K and s dividing
H and W.

out[n, o, i, j] = sum_{c, kh, kw} x[n, c, s*i + kh - K//2, s*j + kw - K//2] * w[o, c, kh, kw]

Weights: w[Cout, Cin, kh, kw] is F.conv2d's weight as is.
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
K, s = coefficient("K s")
w = Weight(Cout, Cin, "kh", "kw", name="w")
strided_conv2d = (
    Input(N, Cin, H, W)
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Stride(H, s)
    >> Stride(W, s)
    >> Share(w)
    >> Reduce(Cin, "kh", "kw")
    >> Output(N, Cout, "H", "W", defaults={"K": 3, "s": 2})
)
