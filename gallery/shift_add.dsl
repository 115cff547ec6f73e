"""Canvas's unfold + shifted residual (Canvas, section 8.5, Figure 8): a K-tap window along H and a
residual connection shifted by one pixel along W, so every output reads 2*K pixels (6 at K=3) for
K weights per channel and K + 1 operations per output (3 and 4 at K=3), where a K x K window
would take K*K of each.

Reproduces ``F.conv2d(x + torch.roll(x, -1, 3), w[:, None, :, None], padding=(K // 2, 0), groups=Cin)``.

out[n, c, h, w] = sum_kh w[c, kh] * (x[n, c, h + kh - K//2, w] + x[n, c, h + kh - K//2, (w + 1) mod W])

Canvas applies the shifted residual after the unfold (y + shift_W(y), y the window's sum); the
file adds it before, which is the same function (the window along H and the shift along W
commute) and reads better. The figure draws one channel with 3 weights; here every channel has its
own K (a depth-wise window, Canvas's FC within each channel). Shift is cyclic, like torch.roll.
Weights: w[Cin, kh] is the depth-wise F.conv2d weight [Cin, 1, K, 1] without its unit dims.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
K = coefficient("K")
w = Weight(Cin, "kh", name="w")
x = Input(N, Cin, H, W)
t2 = (
    x
    >> Shift(W)
)
shift_add = (
    Blend("add", x, t2)
    >> Unfold(H, K, "kh")
    >> Share(w)
    >> Reduce("kh")
    >> Output(N, Cin, H, W, defaults={"K": 3})
)
