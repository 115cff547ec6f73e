"""Transposed 2-D convolution: output [N, Cout, s*H, s*W].

Reproduces ``torch.nn.functional.conv_transpose2d(x, v, stride=s, padding=p, output_padding=q)`` with
p = K - 1 - K//2 and q = s*H - ((H - 1)*s - 2*p + K) (K=4, s=2: padding 1, output 2H; K=3, s=2:
padding 1, output_padding 1; K=3, s=1: padding 1): the input with s - 1 zeros inserted after every
element (Dilate), then a same-padded window.

out[n, o, y, x] = sum_{c, kh, kw} d[n, c, y + kh - K//2, x + kw - K//2] * w[o, c, kh, kw],
d[n, c, y, x] = x[n, c, y/s, x/s] where s divides y and x, else 0

Weights: w[Cout, Cin, kh, kw] is F.conv_transpose2d's weight v[Cin, Cout, kh, kw] flipped in both
windows: w[o, c, kh, kw] = v[c, o, K-1-kh, K-1-kw].
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
s, K = coefficient("s K")
w = Weight(Cout, Cin, "kh", "kw", name="w")
conv_transpose2d = (
    Input(N, Cin, H, W)
    >> Dilate(H, s)
    >> Dilate(W, s)
    >> Unfold("H", K, "kh")
    >> Unfold("W", K, "kw")
    >> Share(w)
    >> Reduce(Cin, "kh", "kw")
    >> Output(N, Cout, "H", "W", defaults={"K": 4, "s": 2})
)
