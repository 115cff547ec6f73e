"""2-D convolution, "same" padding.

Reproduces ``torch.nn.functional.conv2d(x, w, padding=K // 2)`` for odd K.

out[n, o, h, w] = sum_{c, kh, kw} x[n, c, h + kh - K//2, w + kw - K//2] * w[o, c, kh, kw]

Weights: w[Cout, Cin, kh, kw] is F.conv2d's weight as is.
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
K = coefficient("K")
w = Weight(Cout, Cin, "kh", "kw", name="w")
conv2d = (
    Input(N, Cin, H, W)
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Share(w)
    >> Reduce(Cin, "kh", "kw")
    >> Output(N, Cout, H, W, defaults={"K": 3})
)
