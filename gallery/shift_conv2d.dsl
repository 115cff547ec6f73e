"""Shift convolution: a cyclic spatial shift of every channel by one pixel down and right
(each output pixel reads its lower-right neighbour), then a pointwise (1x1) convolution.

Reproduces ``F.conv2d(torch.roll(x, shifts=(-1, -1), dims=(2, 3)), w[:, :, None, None])``.

out[n, o, h, w] = sum_c x[n, c, (h + 1) mod H, (w + 1) mod W] * w[o, c]

Weights: w[Cout, Cin] is F.conv2d's weight [Cout, Cin, 1, 1] without its unit dims.
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
w = Weight(Cout, Cin, name="w")
shift_conv2d = (
    Input(N, Cin, H, W)
    >> Shift(H)
    >> Shift(W)
    >> Share(w)
    >> Reduce(Cin)
    >> Output(N, Cout, H, W)
)
