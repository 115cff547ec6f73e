"""Batched matrix product with the left operand transposed: [B, K, M]ᵀ @ [B, K, N] -> [B, M, N].

Reproduces ``torch.bmm(a.transpose(1, 2), b)`` (OpEvo's BMM2 and BMM3: the left matrix is
transposed first, then multiplied): the transpose costs nothing here, the Product pairs a's and
b's K by name. Inputs in the order a, b; layer table ``opevo_bmm``.

out[b, m, n] = sum_k a[b, k, m] * b[b, k, n]
"""

from kdsl.lang import *

B, K, M, N = primary("B K M N")
a = Input(B, K, M, name="a")
b = Input(B, K, N, name="b")
bmm_tn = (
    Product(a, b, "K")
    >> Output(B, M, N)
)
