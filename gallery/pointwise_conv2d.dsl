"""Pointwise (1x1) convolution: a channel mix at every pixel.

Reproduces ``torch.nn.functional.conv2d(x, w[:, :, None, None])``.

out[n, o, h, w] = sum_c x[n, c, h, w] * w[o, c]

Weights: w[Cout, Cin] is F.conv2d's weight [Cout, Cin, 1, 1] without its two unit dims
(torch_weight = w[:, :, None, None]).
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
w = Weight(Cout, Cin, name="w")
pointwise_conv2d = (
    Input(N, Cin, H, W)
    >> Share(w)
    >> Reduce(Cin)
    >> Output(N, Cout, H, W)
)
