"""Involution (Li et al. 2021), as Canvas (section 5) decomposes it: a K x K kernel generated from
each pixel by two FCs, one per group of S channels, multiplied with the unfolded input and summed
over the window.

Reproduces, with ``G = Cin // S``:
``kernel = F.conv2d(relu(F.conv2d(x, reduce[:, :, None, None])), span[:, :, None, None]).view(N, G, 1, K*K, H, W)``,
``(kernel * F.unfold(x, K, padding=K // 2).view(N, G, S, K*K, H, W)).sum(3).view(N, Cin, H, W)``.

out[n, g*S + ci, h, w] = sum_{kh, kw} k[n, g, kh, kw, h, w] * x[n, g*S + ci, h + kh - K//2, w + kw - K//2]
k[n, g, kh, kw, h, w] = sum_z span[g*K*K + kh*K + kw, z] * relu(sum_c reduce[z, c] * x[n, c, h, w])

Canvas's broadcast multiply of [G, K, K, H, W] with [G, C/G, K, K, H, W] is the Product over kh,
kw; its free variable x1 is the hidden width Cin/r and x2 = G*K*K is span's output. Defaults follow
the involution paper: 16 channels per group (S), reduction r = 4, K = 3 (its batch norm in the
kernel generator is left out, as are biases).
Weights: reduce[z, Cin] and span[G*K*K, z] are the two 1x1 convs' weights without their unit dims.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
S, K, r = coefficient("S K r")
x = Input(N, Cin, H, W)
t2 = (
    x
    >> Split(Cin, S, "g", "ci")
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
)
t3 = (
    x
    >> FC(Cin, name="z", size=Cin/r, weight="reduce")
    >> Map("relu")
    >> FC("z", name="q", size=Cin*K**2/S, weight="span")
    >> Split("q", K**2, "g", "kk")
    >> Split("kk", K, "kh", "kw")
)
involution = (
    Product(t2, t3, "kh", "kw")
    >> Merge("g", "ci", "C")
    >> Output(N, "C", H, W, defaults={"K": 3, "S": 16, "r": 4})
)
