"""Dilated (atrous) 2-D convolution with dilation d, "same" padding.

Reproduces ``torch.nn.functional.conv2d(x, w, padding=d * (K - 1) // 2, dilation=d)`` for odd K and
d in {2, 3}.

out[n, o, h, w] = sum_{c, kh, kw} x[n, c, h + d*kh - d*(K-1)/2, w + d*kw - d*(K-1)/2] * w[o, c, kh, kw]

How: Unfold(H, d*K) reads tap j at h + j - (d*K)//2; Shift by 1 then Stride d keep the taps
j = d*kh + 1, i.e. offsets d*kh + 1 - (d*K)//2, which equal d*kh - d*(K-1)/2 exactly when
(d*K)//2 - d*(K-1)/2 = d//2 = 1, that is d = 2 or 3 with K odd. (Other dilations need the Shift
offset d//2.)

Weights: w[Cout, Cin, kh, kw] is F.conv2d's weight as is.
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
K, d = coefficient("K d")
w = Weight(Cout, Cin, "kh", "kw", name="w")
dilated_conv2d = (
    Input(N, Cin, H, W)
    >> Unfold(H, K*d, "kh")
    >> Shift("kh")
    >> Stride("kh", d)
    >> Unfold(W, K*d, "kw")
    >> Shift("kw")
    >> Stride("kw", d)
    >> Share(w)
    >> Reduce(Cin, "kh", "kw")
    >> Output(N, Cout, H, W, defaults={"K": 3, "d": 2})
)
