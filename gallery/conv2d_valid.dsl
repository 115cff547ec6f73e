"""2-D convolution without padding ("valid"): output [N, Cout, H - K + 1, W - K + 1].

Reproduces ``torch.nn.functional.conv2d(x, w, padding=0)``. The output sizes Ho and Wo are the
layer's (a size N - K + 1 is no monomial): the solver checks Ho = H - K + 1 and Wo = W - K + 1 on
every layer.

out[n, o, i, j] = sum_{c, kh, kw} x[n, c, i + kh, j + kw] * w[o, c, kh, kw]

Weights: w[Cout, Cin, kh, kw] is F.conv2d's weight as is.
"""

from kdsl.lang import *

N, Cin, H, W, Ho, Wo, Cout = primary("N Cin H W Ho Wo Cout")
K = coefficient("K")
w = Weight(Cout, Cin, "kh", "kw", name="w")
conv2d_valid = (
    Input(N, Cin, H, W)
    >> Slide(H, K, Ho, "kh")
    >> Slide(W, K, Wo, "kw")
    >> Share(w)
    >> Reduce(Cin, "kh", "kw")
    >> Output(N, Cout, "H", "W", defaults={"K": 3})
)
