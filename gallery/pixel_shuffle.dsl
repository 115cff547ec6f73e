"""Pixel shuffle (sub-pixel convolution's rearrangement): [N, C*r*r, H, W] -> [N, C, H*r, W*r].

Reproduces ``torch.nn.functional.pixel_shuffle(x, r)``.

out[n, c, h*r + i, w*r + j] = x[n, c*r*r + i*r + j, h, w]

No weights.
"""

from kdsl.lang import *

N, C, H, W = primary("N C H W")
r = coefficient("r")
pixel_shuffle = (
    Input(N, Dim("Crr", C*r**2), H, W)
    >> Split("Crr", r**2, "C", "rr")
    >> Split("rr", r, "ri", "rj")
    >> Merge(H, "ri", "Hr")
    >> Merge(W, "rj", "Wr")
    >> Output(N, C, "Hr", "Wr", defaults={"r": 2})
)
