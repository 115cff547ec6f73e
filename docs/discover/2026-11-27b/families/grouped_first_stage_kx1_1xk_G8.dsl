# seed 3 candidate 30abd2c681315be9
from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
K, G = coefficient("K G")
w_kx1 = Weight("g", Dim("mid_o", Cout/G), "Cin_i", "kh", name="w_kx1")
w_1xk = Weight(Dim("Cout", Cout), "mid", "kw", name="w_1xk")
op = (
    Input(N, Cin, H, W)
    >> Unfold(H, K, "kh")
    >> Split(Cin, Cin/G, "g", "Cin_i")
    >> Share(w_kx1)
    >> Reduce("Cin_i")
    >> Merge("g", "mid_o", "mid")
    >> Reduce("kh")
    >> Unfold(W, K, "kw")
    >> Share(w_1xk)
    >> Reduce("mid", "kw")
    >> Output(N, Cout, H, W, defaults={"G": 8, "K": 3})
)
