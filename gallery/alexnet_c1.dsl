"""AlexNet's first convolution (OpEvo's C1): 11x11 windows, stride 4, no padding.

Reproduces ``torch.nn.functional.conv2d(x, w, stride=s, padding=0)``: OpEvo's C1 convolves an image
of shape (512, 3, 227, 227) with a kernel of shape (64, 3, 11, 11), giving (512, 64, 55, 55). The
output sizes Ho and Wo are the layer's: the solver checks PyTorch's floor rule
Ho = (H - K) // s + 1 on every layer ((227 - 11) // 4 + 1 = 55).

out[n, o, i, j] = sum_{c, kh, kw} x[n, c, s*i + kh, s*j + kw] * w[o, c, kh, kw]

Weights: w[Cout, Cin, kh, kw] is F.conv2d's weight as is.
"""

from kdsl.lang import *

N, Cin, H, W, Ho, Wo, Cout = primary("N Cin H W Ho Wo Cout")
K, s = coefficient("K s")
w = Weight(Cout, Cin, "kh", "kw", name="w")
alexnet_c1 = (
    Input(N, Cin, H, W)
    >> Slide(H, K, Ho, "kh", stride=s)
    >> Slide(W, K, Wo, "kw", stride=s)
    >> Share(w)
    >> Reduce(Cin, "kh", "kw")
    >> Output(N, Cout, "H", "W", defaults={"K": 11, "s": 4})
)
