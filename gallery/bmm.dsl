"""Batched matrix product of two inputs: [B, M, K] @ [B, K, N] -> [B, M, N].

Reproduces ``torch.bmm(a, b)``: both operands are data inputs (no weight), taken in the order
a, b. Its layer table is OpEvo's BatchMatMuls from BERT (``opevo_bmm``: 960 batches of
128x128 · 128x64, and 128x64 on the transposed rows: see ``bmm_tn`` for the transposed layout).

out[b, m, n] = sum_k a[b, m, k] * b[b, k, n]
"""

from kdsl.lang import *

B, M, K, N = primary("B M K N")
a = Input(B, M, K, name="a")
b = Input(B, K, N, name="b")
bmm = (
    Product(a, b, "K")
    >> Output(B, M, N)
)
