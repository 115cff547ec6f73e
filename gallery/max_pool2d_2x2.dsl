"""Max pooling over K x K tiles with stride K: output [N, Cin, H/K, W/K].

Reproduces ``torch.nn.functional.max_pool2d(x, K, K)`` (K divides H and W; K=2: ``F.max_pool2d(x, 2, 2)``).

out[n, c, i, j] = max_{kh, kw} x[n, c, K*i + kh, K*j + kw]

Split, not Unfold + Stride: Unfold's window is centred (out[i, j] = in[i + j - K//2]), so
Unfold(H, 2) >> Stride(H, 2) reads rows 2i-1 and 2i, not 2i and 2i+1. (Unfold(H, 2) >> Shift(H) >>
Stride(H, 2) reads 2i and 2i+1, the same pool in three steps; Split says it in one.) No weights.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
K = coefficient("K")
x = Input(N, Cin, H, W)
max_pool2d_2x2 = (
    x
    >> Split(H, K, "Ho", "kh")
    >> Split(W, K, "Wo", "kw")
    >> Fold("kh", "kw")
    >> Output(N, Cin, "Ho", "Wo", defaults={"K": 2})
)
