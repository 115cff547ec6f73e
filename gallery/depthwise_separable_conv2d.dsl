"""Depthwise separable convolution (MobileNet): a depthwise K x K conv, then a 1x1 conv.

Reproduces, for odd K,
``F.conv2d(F.conv2d(x, depthwise[:, None], padding=K // 2, groups=Cin), pointwise[:, :, None, None])``.

out[n, o, h, w] = sum_c pointwise[o, c] * sum_{kh, kw} x[n, c, h + kh - K//2, w + kw - K//2] * depthwise[c, kh, kw]

Weights: depthwise[Cin, kh, kw] is the first conv's weight [Cin, 1, K, K] without its unit dim;
pointwise[Cout, Cin] is the second conv's weight [Cout, Cin, 1, 1] without its unit dims.
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
K = coefficient("K")
depthwise = Weight(Cin, "kh", "kw", name="depthwise")
pointwise = Weight(Cout, Cin, name="pointwise")
depthwise_separable_conv2d = (
    Input(N, Cin, H, W)
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Share(depthwise)
    >> Reduce("kh", "kw")
    >> Share(pointwise)
    >> Reduce(Cin)
    >> Output(N, Cout, H, W, defaults={"K": 3})
)
