"""Syno's Operator 2: a variant of Operator 1 that resembles two 1-D convolutions whose
weights are connected by a shared channel dim, with a cyclic shift along H.

out[n, o, h, w] = sum_{g < G, ci < Cin/G, kh < K, kw < K, c < Cout/(G*s)}
    x[n, g*Cin/G + ci, ((h + kh - K//2) + 1) mod H, w + kw - K//2] * W1[g, kh, o, c] * W2[g*Cin/G + ci, kw, c]

(zero where h + kh - K//2 or w + kw - K//2 falls outside [0, H) or [0, W)). The Shift of H comes
before H is unfolded, so the wrap-around applies to the window's source row and the zero padding
to the unshifted row. W2 contracts ci and the W-window kw, W1 contracts g, the H-window kh and c.
Defaults are the ResNet-18 setting K=3, G=32, s=2.

No single PyTorch function. Weights: W2[G, Cin/G, K, Cout/(G*s)] is the formula's
W2[Cin, K, Cout/(G*s)] reshaped (W2[g, ci, kw, c] = W2_formula[g*Cin/G + ci, kw, c]; shared after
Cin is split, so the reduction over ci and kw fuses with the product), and W1[G, K, Cout,
Cout/(G*s)] is indexed as in the formula.
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
K, G, s = coefficient("K G s")
W2 = Weight("g", "ci", "kw", Dim("c", Cout/(G*s)), name="W2")
W1 = Weight("g", "kh", Cout, "c", name="W1")
syno_op2 = (
    Input(N, Cin, H, W)
    >> Unfold(W, K, "kw")
    >> Shift(H)
    >> Unfold(H, K, "kh")
    >> Split(Cin, Cin/G, "g", "ci")
    >> Share(W2)
    >> Reduce("ci", "kw")
    >> Share(W1)
    >> Reduce("g", "kh", "c")
    >> Output(N, Cout, H, W, defaults={"G": 32, "K": 3, "s": 2})
)
