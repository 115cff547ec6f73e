"""Max pooling over K x K windows, stride 1, "same" padding.

Reproduces ``torch.nn.functional.max_pool2d(x, K, 1, K // 2)`` for odd K (K=3: ``F.max_pool2d(x, 3, 1, 1)``).

out[n, c, h, w] = max_{kh, kw} x[n, c, h + kh - K//2, w + kw - K//2]

over the window positions inside the image: a Fold ignores the zeros a window reads outside
its dim, as max_pool2d's padding does (a negative input near the border stays negative).
No weights.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
K = coefficient("K")
x = Input(N, Cin, H, W)
max_pool2d = (
    x
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Fold("kh", "kw")
    >> Output(N, Cin, H, W, defaults={"K": 3})
)
