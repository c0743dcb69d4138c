"""Attention implementations, interchangeable through the model's `attention` extension point.

Every implementation has the signature

    attn(q: (B, Hq, Tq, D), k: (B, Hkv, Tk, D), v: (B, Hkv, Tk, D)) -> (B, Hq, Tq, D)

with Tk >= Tq. The queries are the *last* Tq of the Tk positions (a KV cache holds the earlier ones),
so query i sits at absolute position Tk - Tq + i and may attend to keys j <= Tk - Tq + i: the causal
mask is aligned to the bottom-right corner. Prefill with an empty cache (Tq == Tk) is the usual lower
triangle; a decode step (Tq == 1) needs no mask at all. Under GQA query head h reads KV head
h // (Hq // Hkv).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

AttentionFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def causal_mask(q_len: int, k_len: int, device: torch.device | None = None) -> Tensor:
    """(Tq, Tk) boolean mask, True where query i may see key j, i.e. j <= i + (Tk - Tq)."""
    if k_len < q_len:
        raise ValueError(f"attention got {q_len} queries but only {k_len} keys; keys must include the queries' own positions")
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(k_len, device=device)[None, :]
    return j <= i + (k_len - q_len)


def _check_shapes(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.ndim != 4 or k.shape != v.shape or k.ndim != 4:
        raise ValueError(f"attention expects q (B,Hq,Tq,D) and k, v (B,Hkv,Tk,D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads cannot be grouped over {k.shape[1]} KV heads")


def naive_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(D) + mask) v, written out: the reference every other implementation matches."""
    _check_shapes(q, k, v)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """PyTorch's fused scaled_dot_product_attention (flash / memory-efficient kernels where available).

    Careful: SDPA's `is_causal=True` aligns the mask to the *top-left* corner, which is only right when
    Tq == Tk. With a cache (Tq < Tk) we pass no mask for one query and an explicit mask otherwise.
    """
    _check_shapes(q, k, v)
    q_len, k_len = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if q_len == k_len:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    mask = None if q_len == 1 else causal_mask(q_len, k_len, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


ATTENTION_IMPLEMENTATIONS: dict[str, AttentionFn] = {"naive": naive_attention, "sdpa": sdpa_attention}


def resolve_attention(attention: str | AttentionFn) -> AttentionFn:
    """Look up an implementation by name, or pass a callable through."""
    if callable(attention):
        return attention
    try:
        return ATTENTION_IMPLEMENTATIONS[attention]
    except KeyError:
        raise ValueError(f"unknown attention implementation {attention!r}; choose one of "
                         f"{sorted(ATTENTION_IMPLEMENTATIONS)} or pass a function (q, k, v) -> out") from None
