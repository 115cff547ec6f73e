"""Pixel unshuffle, the inverse of pixel shuffle: [N, Cin, H, W] -> [N, Cin*r*r, H/r, W/r].

Reproduces ``torch.nn.functional.pixel_unshuffle(x, r)``.

out[n, c*r*r + i*r + j, h, w] = x[n, c, h*r + i, w*r + j]   (r divides H and W)

No weights.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
r = coefficient("r")
pixel_unshuffle = (
    Input(N, Cin, H, W)
    >> Split(H, r, "Ho", "ri")
    >> Split(W, r, "Wo", "rj")
    >> Merge(Cin, "ri", "Cr")
    >> Merge("Cr", "rj", "Crr")
    >> Output(N, "Crr", "Ho", "Wo", defaults={"r": 2})
)
