"""Pixel shuffle (sub-pixel convolution's rearrangement): [N, Cin, H, W] -> [N, Cin/r**2, H*r, W*r]
(the input channels Cin = C*r*r split into C = Cin/r**2 channels and an r x r block).

Reproduces ``torch.nn.functional.pixel_shuffle(x, r)``.

out[n, c, h*r + i, w*r + j] = x[n, c*r*r + i*r + j, h, w]   (r divides Cin twice)

No weights.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
r = coefficient("r")
pixel_shuffle = (
    Input(N, Cin, H, W)
    >> Split(Cin, r**2, "C", "rr")
    >> Split("rr", r, "ri", "rj")
    >> Merge(H, "ri", "Hr")
    >> Merge(W, "rj", "Wr")
    >> Output(N, "C", "Hr", "Wr", defaults={"r": 2})
)
