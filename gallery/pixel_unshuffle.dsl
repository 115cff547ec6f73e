"""Pixel unshuffle, the inverse of pixel shuffle: [N, C, H*r, W*r] -> [N, C*r*r, H, W].

Reproduces ``torch.nn.functional.pixel_unshuffle(x, r)``.

out[n, c*r*r + i*r + j, h, w] = x[n, c, h*r + i, w*r + j]

No weights.
"""

from kdsl.lang import *

N, C, H, W = primary("N C H W")
r = coefficient("r")
pixel_unshuffle = (
    Input(N, C, Dim("Hr", H*r), Dim("Wr", W*r))
    >> Split("Hr", r, "H", "ri")
    >> Split("Wr", r, "W", "rj")
    >> Merge(C, "ri", "Cr")
    >> Merge("Cr", "rj", "Crr")
    >> Output(N, "Crr", H, W, defaults={"r": 2})
)
