"""Average pooling over K x K tiles with stride K: output [N, Cin, H/K, W/K].

Reproduces ``torch.nn.functional.avg_pool2d(x, K)`` (K divides H and W).

out[n, c, i, j] = mean_{kh, kw} x[n, c, K*i + kh, K*j + kw]

No weights.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
K = coefficient("K")
avg_pool2d = (
    Input(N, Cin, H, W)
    >> Split(H, K, "Ho", "kh")
    >> Split(W, K, "Wo", "kw")
    >> Reduce("kh", "kw", mean=True)
    >> Output(N, Cin, "Ho", "Wo", defaults={"K": 2})
)
