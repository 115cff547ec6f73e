"""Matrix product: [M, Cin] @ [Cin, Cout] -> [M, Cout].

Reproduces ``torch.matmul(x, w)``.

out[m, o] = sum_c x[m, c] * w[c, o]

Weights: w[Cin, Cout] is torch.matmul's right operand as is.
"""

from kdsl.lang import *

M, Cin, Cout = primary("M Cin Cout")
w = Weight(Cin, Cout, name="w")
matmul = (
    Input(M, Cin)
    >> Share(w)
    >> Reduce(Cin)
    >> Output(M, Cout)
)
