# seed 3 candidate f87b3a9cfa4a985a
from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
K, G = coefficient("K G")
w_kx1 = Weight("g", Dim("mid_o", Cout/G), "Cin_i", "kh", name="w_kx1")
w_1xk = Weight("g2", Dim("Cout_o", Cout/G), "mid_i", "kw", name="w_1xk")
op = (
    Input(N, Cin, H, W)
    >> Unfold(H, K, "kh")
    >> Split(Cin, Cin/G, "g", "Cin_i")
    >> Share(w_kx1)
    >> Reduce("Cin_i")
    >> Merge("g", "mid_o", "mid")
    >> Reduce("kh")
    >> Unfold(W, K, "kw")
    >> Split("mid", Cout/G, "g2", "mid_i")
    >> Share(w_1xk)
    >> Reduce("mid_i")
    >> Merge("Cout_o", "g2", "Cout")
    >> Reduce("kw")
    >> Output(N, Cout, H, W, defaults={"G": 2, "K": 3})
)
