"""Depthwise 2-D convolution: one K x K filter per channel.

Reproduces ``torch.nn.functional.conv2d(x, w[:, None], padding=K // 2, groups=Cin)`` for odd K.

out[n, c, h, w] = sum_{kh, kw} x[n, c, h + kh - K//2, w + kw - K//2] * w[c, kh, kw]

Weights: w[Cin, kh, kw] is F.conv2d's weight [Cin, 1, kh, kw] without its unit dim
(torch_weight = w[:, None]).
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
K = coefficient("K")
w = Weight(Cin, "kh", "kw", name="w")
depthwise_conv2d = (
    Input(N, Cin, H, W)
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Share(w)
    >> Reduce("kh", "kw")
    >> Output(N, Cin, H, W, defaults={"K": 3})
)
