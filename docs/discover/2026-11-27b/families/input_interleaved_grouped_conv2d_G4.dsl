# seed 3 candidate 26f2e5650cfacfc6
from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
G, K = coefficient("G K")
w = Weight("g", Dim("co", Cout/G), "ci", "kh", "kw", name="w")
op = (
    Input(N, Cin, H, W)
    >> Split(Cin, G, "ci", "g")
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Share(w)
    >> Reduce("ci", "kh", "kw")
    >> Merge("g", "co", "Cout")
    >> Output(N, Cout, H, W, defaults={"G": 4, "K": 3})
)
