"""Found by kdsl discover: grouped_conv2d_shifted_window (key 447c0c9549de36ce).

A grouped 3x3 convolution (G=2) whose output is read two columns to the right, cyclically.
Reproduces ``torch.roll(F.conv2d(x, w.reshape(Cout, Cin // G, K, K), padding=K // 2, groups=G), -2, dims=3)``:

out[n, g*(Cout/G) + o, h, w] = sum_{c, kh, kw} x[n, g*(Cin/G) + c, h + kh - K//2, ((w + 2) mod W) + kw - K//2] * w[g, o, c, kh, kw]

(zero where a read falls outside the image). Weights: w[G, Cout/G, Cin/G, kh, kw] is F.conv2d's
weight [Cout, Cin/G, kh, kw] with its first dim split into (group, channel in group), as in
grouped_conv2d. Search reached it from the gallery's grouped_conv2d by inserting two cyclic shifts
of W (around the window over W); the planner applies both to the output. In a network the roll
moves features across the residual sum, so it is not the grouped conv itself; it trained as well
(0.960 vs conv2d's 0.962).

command: kdsl discover --time-limit 1800 --workers 2 --seed 0 (default proxy, commit f4abdc8)
search: strategy neighbors (a rewrite of grouped_conv2d: Shift(W) before Share(w), Shift(W) before Reduce(kw)), depth 10
accuracy: 0.9599
baseline accuracy (conv2d): 0.9624
latency ratio to conv2d: 0.465
MACs ratio to conv2d: 0.5
params: 1566720
"""

from kdsl.lang import *

N, Cin, H, W, Cout = primary("N Cin H W Cout")
G, K = coefficient("G K")
w = Weight("g", Dim("co", Cout/G), "ci", "kh", "kw", name="w")
grouped_conv2d_shifted_window = (
    Input(N, Cin, H, W)
    >> Split(Cin, Cin/G, "g", "ci")
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Shift(W)
    >> Share(w)
    >> Reduce("ci", "kh")
    >> Shift(W)
    >> Reduce("kw")
    >> Merge("g", "co", "Cout")
    >> Output(N, Cout, H, W, defaults={"G": 2, "K": 3})
)
