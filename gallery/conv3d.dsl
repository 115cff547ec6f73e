"""3-D convolution, "same" padding.

Reproduces ``torch.nn.functional.conv3d(x, w, padding=K // 2)`` for odd K (stride 1): output [N, Cout, D, H, W].

out[n, o, z, y, x] = sum_{c, kd, kh, kw} x[n, c, z + kd - K//2, y + kh - K//2, x + kw - K//2] * w[o, c, kd, kh, kw]

Weights: w[Cout, Cin, kd, kh, kw] is F.conv3d's weight as is.
"""

from kdsl.lang import *

N, Cin, D, H, W, Cout = primary("N Cin D H W Cout")
K = coefficient("K")
w = Weight(Cout, Cin, "kd", "kh", "kw", name="w")
conv3d = (
    Input(N, Cin, D, H, W)
    >> Unfold(D, K, "kd")
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Share(w)
    >> Reduce(Cin, "kd", "kh", "kw")
    >> Output(N, Cout, D, H, W, defaults={"K": 3})
)
