"""Canvas's best kernel for ResNet-34 (Canvas, section 8.4, Figure 6): a shift + add branch that
reads one adjacent pixel, then mixes channels with an FC, plus a light depth-wise branch.

Reproduces ``F.conv2d(x + torch.roll(x, -1, 2), mix[:, :, None, None]) + F.conv2d(x, depthwise[:, None], padding=K // 2, groups=Cin)``.

out[n, o, h, w] = sum_c mix[o, c] * (x[n, c, h, w] + x[n, c, (h + 1) mod H, w])
                + sum_{kh, kw} depthwise[o, kh, kw] * x[n, o, h + kh - K//2, w + kw - K//2]

What the paper says (section 8.4): "Instead of collecting information from all neighbors by
unfolding, this kernel uses a combination of shift and addition to extract features from only one
adjacent pixel in order to significantly reduce FLOPs and parameters. There is also another branch
that uses a lightweight depth-wise convolution (FC within each channel separately, i.e., grouping
and FC) to maintain expressive power and generalization." Figure 6 itself is a drawing our copy of
the paper does not hold, so the wiring here is our reading: the shift is along H and cyclic
(Canvas's Shift), the channel-mixing FC (Cin -> Cin) follows the shift + add, the depth-wise
branch is a K x K window (K = 3; "grouping and FC": each channel its own group, an FC over its
window), and the branches are added. It costs about (Cin + K*K)/(K*K*Cin) of a K x K conv2d's
multiply-accumulates and parameters. The outputs keep Cin channels (ResNet's stride-1 layers).
Weights: mix[c, Cin] is the 1x1 conv's weight [Cin, Cin, 1, 1] without its unit dims;
depthwise[Cin, kh, kw] is the depth-wise conv's weight [Cin, 1, K, K] without its unit dim.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
K = coefficient("K")
depthwise = Weight(Cin, "kh", "kw", name="depthwise")
x = Input(N, Cin, H, W)
t2 = (
    x
    >> Shift(H)
)
t3 = (
    Blend("add", x, t2)
    >> FC(Cin, name="c", size=Cin, weight="mix")
    >> Rename("c", "Cin")
)
t4 = (
    x
    >> Unfold(H, K, "kh")
    >> Unfold(W, K, "kw")
    >> Share(depthwise)
    >> Reduce("kh", "kw")
)
canvas_resnet34 = (
    Blend("add", t3, t4)
    >> Output(N, Cin, H, W, defaults={"K": 3})
)
