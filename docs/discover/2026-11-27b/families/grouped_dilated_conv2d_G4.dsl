# seed 3 candidate 4242541f7f56ef33
from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
K, d, G = coefficient("K d G")
w = Weight("g", Dim("Cout_o", Cout/G), "Cin_i", "kh", "kw", name="w")
op = (
    Input(N, Cin, H, W)
    >> Unfold(H, K*d, "kh")
    >> Shift("kh")
    >> Stride("kh", d)
    >> Unfold(W, K*d, "kw")
    >> Shift("kw")
    >> Stride("kw", d)
    >> Split(Cin, Cin/G, "g", "Cin_i")
    >> Share(w)
    >> Reduce("Cin_i")
    >> Merge("g", "Cout_o", "Cout")
    >> Reduce("kh", "kw")
    >> Output(N, Cout, H, W, defaults={"G": 4, "K": 3, "d": 2})
)
