"""Self-attention over the pixels of an image (a non-local block, Wang et al. 2018): softmax over
all positions of query . key, times the values; queries, keys and values are FCs of x.

Reproduces, with ``q, k = F.conv2d(x, query[:, :, None, None]), F.conv2d(x, key[:, :, None, None])`` flattened to [N, d, H*W]:
``torch.bmm(v, torch.softmax(torch.bmm(q.transpose(1, 2), k), -1).transpose(1, 2))``, v = the values' conv [N, Cin, H*W].

out[n, c, h, w] = sum_{hk, wk} softmax_{hk, wk}(sum_d q[n, d, h, w] * k[n, d, hk, wk]) * v[n, c, hk, wk]
q[n, d, h, w] = sum_c' query[d, c'] x[n, c', h, w] (k, v alike with key[d, Cin], value[c, Cin])

d < Cin/r with r = 8 (the non-local paper halves the width; 8 keeps the scores' cost down); no
1/sqrt(d) scaling (the non-local block's embedded Gaussian has none), no output projection and no
residual. The keys' and values' positions are renamed Hk, Wk so the Product pairs each query
pixel with every key pixel. Weights: query[d, Cin], key[d, Cin], value[c, Cin] are the 1x1 convs'
weights without their unit dims.
"""

from kdsl.lang import *

N, Cin, H, W = primary("N Cin H W")
r = coefficient("r")
x = Input(N, Cin, H, W)
t2 = (
    x
    >> FC(Cin, name="d", size=Cin/r, weight="query")
)
t3 = (
    x
    >> FC(Cin, name="d", size=Cin/r, weight="key")
    >> Rename(H, "Hk")
    >> Rename(W, "Wk")
)
t4 = (
    Product(t2, t3, "d")
    >> Softmax("Hk", "Wk")
)
t5 = (
    x
    >> FC(Cin, name="c", size=Cin, weight="value")
    >> Rename(H, "Hk")
    >> Rename(W, "Wk")
)
spatial_attention = (
    Product(t4, t5, "Hk", "Wk")
    >> Output(N, "c", H, W, defaults={"r": 8})
)
