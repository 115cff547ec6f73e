"""im2col: every K x K patch as a column, output [N, Cin*K*K, H*W].

Reproduces ``torch.nn.functional.unfold(x, K, padding=K // 2)`` (nn.Unfold) for odd K.

out[n, c*K*K + kh*K + kw, h*W + w] = x[n, c, h + kh - K//2, w + kw - K//2]

No weights.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
K = coefficient("K")
unfold2d = (
    Input(N, Cin, H, W)
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Merge(Cin, "kh", "Ckh")
    >> Merge("Ckh", "kw", "CKK")
    >> Merge(H, W, "L")
    >> Output(N, "CKK", "L", defaults={"K": 3})
)
