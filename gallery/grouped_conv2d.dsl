"""Grouped 2-D convolution with G groups.

Reproduces ``torch.nn.functional.conv2d(x, w.reshape(Cout, Cin // G, K, K), padding=K // 2, groups=G)``
for odd K (G divides Cin and Cout; the default G=4 divides every ResNet-18 width).

out[n, g*(Cout/G) + o, h, w] = sum_{c, kh, kw} x[n, g*(Cin/G) + c, h + kh - K//2, w + kw - K//2] * w[g, o, c, kh, kw]

Weights: w[G, Cout/G, Cin/G, kh, kw] is F.conv2d's weight [Cout, Cin/G, kh, kw] with its first dim
split into (group, channel in group): torch_weight = w.reshape(Cout, Cin // G, K, K).
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
G, K = coefficient("G K")
w = Weight("g", Dim("co", Cout/G), "ci", "kh", "kw", name="w")
grouped_conv2d = (
    Input(N, Cin, H, W)
    >> Split(Cin, Cin/G, "g", "ci")
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Share(w)
    >> Reduce("ci", "kh", "kw")
    >> Merge("g", "co", "Cout")
    >> Output(N, Cout, H, W, defaults={"G": 4, "K": 3})
)
