"""Syno's Operator 1 (Syno, Figure 7): two weights joined by a shared W-window and a channel dim.

out[n, o, h, w] = sum_{g < G, ci < Cin/G, kh < K, kw < K, c < Cout/(G*s)}
    x[n, g*Cin/G + ci, h + kh - K//2, w + kw - K//2] * W1[g, kh, kw, o, c] * W2[g*Cin/G + ci, kw, c]

(zero where h + kh - K//2 or w + kw - K//2 falls outside the image). W2 shares Cin (as g, ci) and the
W-window kw with the data, and brings its own dim c of size Cout/(G*s); W1 shares the group g,
both windows and c, and brings the output channel o. Defaults are the ResNet-18 setting K=3,
G=32, s=2.

No single PyTorch function. It computes in two stages: first
T[n, g, kw, c, h, w] = sum_ci x[n, g*Cin/G + ci, h, w + kw - K//2] * W2[g*Cin/G + ci, kw, c]
(a grouped 1-D conv along W that keeps its window kw instead of reducing it), then
out[n, o, h, w] = sum_{g, kh, kw, c} T[n, g, kw, c, h + kh - K//2, w] * W1[g, kh, kw, o, c].
Weights: W2[G, Cin/G, K, Cout/(G*s)] is the formula's W2[Cin, K, Cout/(G*s)] reshaped
(W2[g, ci, kw, c] = W2_formula[g*Cin/G + ci, kw, c]; it is shared after Cin is split, so the
reduction over ci fuses with the product), and W1[G, K, K, Cout, Cout/(G*s)] is indexed as in the formula.
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
K, G, s = coefficient("K G s")
W2 = Weight("g", "ci", "kw", Dim("c", Cout/(G*s)), name="W2")
W1 = Weight("g", "kh", "kw", Cout, "c", name="W1")
syno_op1 = (
    Input(N, Cin, H, W)
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Split(Cin, Cin/G, "g", "ci")
    >> Share(W2)
    >> Reduce("ci")
    >> Share(W1)
    >> Reduce("g", "kh", "kw", "c")
    >> Output(N, Cout, H, W, defaults={"G": 32, "K": 3, "s": 2})
)
