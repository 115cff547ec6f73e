"""Attention scores from given queries and keys: Q · Kᵀ, [B, M, D] x [B, N, D] -> [B, M, N].

Reproduces ``torch.matmul(q, k.transpose(-2, -1))``, the scores of
``F.scaled_dot_product_attention(q, k, v, scale=1.0)`` before the softmax: unscaled, since a
Map's ``scale`` takes a number, not a size, so 1/sqrt(D) cannot be written for every D (multiply
by 1/sqrt(D) after, or write ``Map("scale", by=0.125)`` for D = 64). Inputs in the order q, k;
layer table ``bert_attention`` (BERT-base: 960 = 80 x 12 heads, 128 tokens, head width 64).

out[b, m, n] = sum_d q[b, m, d] * k[b, n, d]
"""

from kdsl.lang import *

B, M, D, N = primary("B M D N")
q = Input(B, M, D, name="q")
k = Input(B, N, D, name="k")
attention_qk = (
    Product(q, k, "D")
    >> Output(B, M, N)
)
