"""1-D convolution, "same" padding.

Reproduces ``torch.nn.functional.conv1d(x, w, padding=K // 2)`` for odd K (x: [N, Cin, L]).

out[n, o, l] = sum_{c, k} x[n, c, l + k - K//2] * w[o, c, k]

Weights: w[Cout, Cin, k] is F.conv1d's weight as is.
"""

from kdsl.lang import *

N, Cin, L, Cout = primary("N Cin L Cout")
K = coefficient("K")
w = Weight(Cout, Cin, "k", name="w")
conv1d = (
    Input(N, Cin, L)
    >> Unfold(L, K, "k")
    >> Share(w)
    >> Reduce(Cin, "k")
    >> Output(N, Cout, L, defaults={"K": 3})
)
