"""Spatially separable convolution: a K x 1 conv from Cin to Cout channels, then a 1 x K conv
from Cout to Cout channels.

Reproduces, for odd K,
``F.conv2d(F.conv2d(x, w_kx1[..., None], padding=(K // 2, 0)), w_1xk[:, :, None, :], padding=(0, K // 2))``.

mid[n, m, h, w] = sum_{c, kh} x[n, c, h + kh - K//2, w] * w_kx1[m, c, kh]
out[n, o, h, w] = sum_{m, kw} mid[n, m, h, w + kw - K//2] * w_1xk[o, m, kw]

Weights: w_kx1[Cout, Cin, kh] is the first conv's weight [Cout, Cin, K, 1] without its unit dim;
w_1xk[Cout, Cout, kw] is the second conv's weight [Cout, Cout, 1, K] without its unit dim.
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
K = coefficient("K")
w_kx1 = Weight(Dim("mid", Cout), Cin, "kh", name="w_kx1")
w_1xk = Weight(Dim("Cout", Cout), "mid", "kw", name="w_1xk")
conv2d_kx1_1xk = (
    Input(N, Cin, H, W)
    >> Unfold(H, K, "kh")
    >> Share(w_kx1)
    >> Reduce(Cin, "kh")
    >> Unfold(W, K, "kw")
    >> Share(w_1xk)
    >> Reduce("mid", "kw")
    >> Output(N, Cout, H, W, defaults={"K": 3})
)
