"""HBM traffic and FLOPs of attention, naive versus FlashAttention (lab 04).

Per (batch, head), with T queries and keys, head_dim D and e bytes per element:

* naive, three kernels (S = Q K^T; P = softmax(S); O = P V): read Q, K, V and write O (4 T D elements),
  write S, read S, write P, read P (4 T^2 elements):                       e * (4 T D + 4 T^2)
* flash, one kernel, K and V tiles reused from on-chip memory: read Q, K, V once, write O once
  (plus 4 bytes of LSE per query):                                          e * 4 T D + 4 T
  A real kernel re-reads K and V once per query tile (T / BLOCK_M passes); L2 absorbs much of that, and
  `flash_kv_passes` below adds it explicitly.

FLOPs: 2 matmuls of 2 T T D each = 4 T^2 D per head; a causal mask halves the useful work.
"""

from __future__ import annotations

import math

__all__ = ["naive_attention_bytes", "flash_attention_bytes", "attention_flops", "kv_passes"]


def naive_attention_bytes(batch: int, heads: int, seq_len: int, head_dim: int, bytes_per_element: int) -> int:
    """HBM bytes moved by unfused attention that materialises S and P (see module docstring)."""
    return batch * heads * bytes_per_element * (4 * seq_len * head_dim + 4 * seq_len * seq_len)


def flash_attention_bytes(batch: int, heads: int, seq_len: int, head_dim: int, bytes_per_element: int, *,
                          flash_kv_passes: int = 1, with_lse: bool = True) -> int:
    """HBM bytes of fused attention: Q read and O written once, K and V read `flash_kv_passes` times
    (1 = ideal reuse; ceil(T / BLOCK_M) = no reuse across query tiles), LSE float32 if `with_lse`."""
    qkvo = bytes_per_element * seq_len * head_dim * (2 + 2 * flash_kv_passes)
    return batch * heads * (qkvo + (4 * seq_len if with_lse else 0))


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, *, causal: bool) -> float:
    """Matmul FLOPs of the forward pass (4 T^2 D per head; half of it when causal)."""
    flops = 4.0 * batch * heads * seq_len * seq_len * head_dim
    return flops / 2 if causal else flops


def kv_passes(seq_len: int, block_m: int) -> int:
    """How many times a kernel without cross-tile reuse reads K and V: one per query tile."""
    return math.ceil(seq_len / block_m)
