"""Average pooling over K x K windows with stride s, no padding: output [N, Cin, Ho, Wo].

Reproduces ``torch.nn.functional.avg_pool2d(x, K, stride=s)`` (padding 0): the windows may overlap
(s < K) or leave gaps (s > K), and where s does not fit H - K whole times, the rows and columns left
over are dropped, as PyTorch's floor does. The output sizes Ho and Wo are the layer's: the solver
checks Ho = (H - K) // s + 1 and Wo = (W - K) // s + 1 on every layer (Gensor's P3: 21 -> 10 at K=3,
s=2; P2: 83 -> 41 at K=2, s=2).

out[n, c, i, j] = mean_{kh, kw} x[n, c, s*i + kh, s*j + kw]

No weights.
"""

from kdsl.lang import *

N, Cin, H, W, Ho, Wo = primary("N Cin H W Ho Wo")
K, s = coefficient("K s")
avg_pool2d_strided = (
    Input(N, Cin, H, W)
    >> Slide(H, K, Ho, "kh", stride=s)
    >> Slide(W, K, Wo, "kw", stride=s)
    >> Reduce("kh", "kw", mean=True)
    >> Output(N, Cin, "H", "W", defaults={"K": 3, "s": 2})
)
