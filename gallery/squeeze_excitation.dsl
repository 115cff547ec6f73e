"""Squeeze-and-excitation (Hu et al. 2018): channels scaled by a gate computed from their means.

Reproduces ``x * sigmoid(F.linear(relu(F.linear(F.adaptive_avg_pool2d(x, 1).flatten(1), squeeze)), excite))[:, :, None, None]``.

out[n, c, h, w] = x[n, c, h, w] * sigmoid(sum_z excite[c, z] * relu(sum_c' squeeze[z, c'] * mean_{h, w} x[n, c', h, w]))

with z < Cin/r (r = 16, the paper's reduction ratio; the layers' biases are left out).
Weights: squeeze[z, Cin] and excite[c, z] are F.linear's weights as they are.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
r = coefficient("r")
x = Input(N, Cin, H, W)
t2 = (
    x
    >> Reduce(H, W, mean=True)
    >> FC(Cin, name="z", size=Cin/r, weight="squeeze")
    >> Map("relu")
    >> FC("z", name="c", size=Cin, weight="excite")
    >> Map("sigmoid")
    >> Rename("c", "Cin")
)
squeeze_excitation = (
    Blend("mul", x, t2)
    >> Output(N, Cin, H, W, defaults={"r": 16})
)
