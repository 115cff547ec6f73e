"""Canvas's unfold + shifted residual (Canvas, section 8.5, Figure 8): a K-tap window along H, then a
residual connection shifted by one pixel along W, so every output reads 2*K pixels (6 at K=3) for
K weights per channel and K + 1 operations per output (3 and 4 at K=3), where a K x K window
would take K*K of each.

Reproduces ``y + torch.roll(y, -1, 3)`` with ``y = F.conv2d(x, w[:, None, :, None], padding=(K // 2, 0), groups=Cin)``.

out[n, c, h, w] = y[n, c, h, w] + y[n, c, h, (w + 1) mod W],  y[n, c, h, w] = sum_kh w[c, kh] * x[n, c, h + kh - K//2, w]

The figure draws one channel with 3 weights; here every channel has its own K (a depth-wise
window, Canvas's FC within each channel). Shift is cyclic, like torch.roll.
Weights: w[Cin, kh] is the depth-wise F.conv2d weight [Cin, 1, K, 1] without its unit dims.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
K = coefficient("K")
w = Weight(Cin, "kh", name="w")
x = Input(N, Cin, H, W)
t2 = (
    x
    >> Unfold(H, K, "kh")
    >> Share(w)
    >> Reduce("kh")
)
t3 = (
    t2
    >> Shift(W)
)
shift_add = (
    Blend("add", t2, t3)
    >> Output(N, Cin, H, W, defaults={"K": 3})
)
