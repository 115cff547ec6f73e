"""Fully connected layer without bias: [N, Cin] -> [N, Cout].

Reproduces ``torch.nn.functional.linear(x, w)``.

out[n, o] = sum_c x[n, c] * w[o, c]

Weights: w[Cout, Cin] is F.linear's weight as is.
"""

from kdsl.lang import *

N, Cin, Cout = primary("N Cin Cout")
w = Weight(Cout, Cin, name="w")
linear = (
    Input(N, Cin)
    >> Share(w)
    >> Reduce(Cin)
    >> Output(N, Cout)
)
