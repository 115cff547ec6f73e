"""Transposed 3-D convolution: output [N, Cout, s*D, s*H, s*W].

Reproduces ``torch.nn.functional.conv_transpose3d(x, v, stride=s, padding=p, output_padding=q)`` with
p = K - 1 - K//2 and q = s*H - ((H - 1)*s - 2*p + K) (K=4, s=2: padding 1, output 2D x 2H x 2W):
the input with s - 1 zeros inserted after every element (Dilate), then a same-padded window.

out[n, o, z, y, x] = sum_{c, kd, kh, kw} d[n, c, z + kd - K//2, y + kh - K//2, x + kw - K//2] * w[o, c, kd, kh, kw],
d[n, c, z, y, x] = x[n, c, z/s, y/s, x/s] where s divides z, y and x, else 0

Weights: w[Cout, Cin, kd, kh, kw] is F.conv_transpose3d's weight v[Cin, Cout, kd, kh, kw] flipped in
the three windows: w[o, c, kd, kh, kw] = v[c, o, K-1-kd, K-1-kh, K-1-kw].
"""

from kdsl.lang import *

N, Cin, D, H, W, Cout = primary("N Cin D H W Cout")
s, K = coefficient("s K")
w = Weight(Cout, Cin, "kd", "kh", "kw", name="w")
conv_transpose3d = (
    Input(N, Cin, D, H, W)
    >> Dilate(D, s)
    >> Dilate(H, s)
    >> Dilate(W, s)
    >> Unfold("D", K, "kd")
    >> Unfold("H", K, "kh")
    >> Unfold("W", K, "kw")
    >> Share(w)
    >> Reduce(Cin, "kd", "kh", "kw")
    >> Output(N, Cout, "D", "H", "W", defaults={"K": 4, "s": 2})
)
