"""Depthwise 2-D convolution: one K x K filter per channel.

Reproduces ``torch.nn.functional.conv2d(x, w[:, None], padding=K // 2, groups=C)`` for odd K.

out[n, c, h, w] = sum_{kh, kw} x[n, c, h + kh - K//2, w + kw - K//2] * w[c, kh, kw]

Weights: w[C, kh, kw] is F.conv2d's weight [C, 1, kh, kw] without its unit dim
(torch_weight = w[:, None]).
"""

from kdsl.lang import *

N, C, H, W = primary("N C H W")
K = coefficient("K")
w = Weight(C, "kh", "kw", name="w")
depthwise_conv2d = (
    Input(N, C, H, W)
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Share(w)
    >> Reduce("kh", "kw")
    >> Output(N, C, H, W, defaults={"K": 3})
)
