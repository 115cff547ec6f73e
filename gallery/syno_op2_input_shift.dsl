"""Found by kdsl discover: syno_op2_input_shift (key be16ae65fba7be67).

Syno's Operator 2 (G=2, s=2) applied to the input rolled one row up, that is to the input
whose row h is the row (h + 1) mod H:

out[n, o, h, w] = sum_{g, ci, kh, kw, c} x[n, g*Cin/G + ci, (h + kh - K//2 + 2) mod H, w + kw - K//2] * W1[g, kh, o, c] * W2[g*Cin/G + ci, kw, c]

(zero where h + kh - K//2 falls outside [0, H) or w + kw - K//2 outside [0, W)). Weights: as in
syno_op2, W2[G, Cin/G, K, Cout/(G*s)] is the formula's W2[Cin, K, Cout/(G*s)] reshaped and
W1[G, K, Cout, Cout/(G*s)] is indexed as in the formula. Search reached it from the gallery's
syno_op2 by inserting a cyclic shift of H at the input. A quarter of conv2d's multiply-accumulates.

command: kdsl discover --time-limit 1800 --workers 2 --seed 0 (default proxy, commit f4abdc8)
search: strategy neighbors (a rewrite of syno_op2: Shift(H) before Unfold(W, K)), depth 12
accuracy: 0.9557
baseline accuracy (conv2d): 0.9624
latency ratio to conv2d: 0.4872
MACs ratio to conv2d: 0.25
params: 783360
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
K, G, s = coefficient("K G s")
W2 = Weight("g", "ci", "kw", Dim("c", Cout/(G*s)), name="W2")
W1 = Weight("g", "kh", Cout, "c", name="W1")
syno_op2_input_shift = (
    Input(N, Cin, H, W)
    >> Shift(H)
    >> Unfold(W, K, "kw")
    >> Shift(H)
    >> Unfold(H, K, "kh")
    >> Split(Cin, Cin/G, "g", "ci")
    >> Share(W2)
    >> Reduce("ci", "kw")
    >> Share(W1)
    >> Reduce("g", "kh", "c")
    >> Output(N, Cout, H, W, defaults={"G": 2, "K": 3, "s": 2})
)
