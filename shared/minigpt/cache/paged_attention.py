"""Paged attention in plain PyTorch (lab 02): read each sequence's keys and values through its block table.

Layout, per layer: k_pool, v_pool of shape (num_blocks, block_size, n_kv_heads, head_dim). Row
`slot = block * block_size + offset` of the flat view (num_blocks * block_size, Hkv, D) holds one token.

* `write_kv` stores new tokens at their slots (the slot mapping of `minigpt.cache.block_table`).
* `paged_decode_attention` is the decode step: ONE query per sequence, batch of different lengths.
  This signature and layout are the reference the Triton split-KV decode kernel of lab 04 must match.
* `paged_attention` is the general case (prefill, chunks after a cached prefix, mixed batches): a batch
  padded to Tq queries, sequence b having q_lens[b] real ones, which are its LAST q_lens[b] positions,
  with lab 01's bottom-right causal mask.

Both gather the blocks into a dense (B, Hkv, max_blocks * block_size, D) tensor and mask the slots past
each sequence's length: simple and exact, but it copies the K/V it reads; a real kernel (lab 04) reads
the blocks in place. Under GQA query head h reads KV head h // (Hq // Hkv).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["write_kv", "gather_kv", "paged_decode_attention", "paged_attention"]


def write_kv(k_pool: Tensor, v_pool: Tensor, slots: Tensor, k: Tensor, v: Tensor) -> None:
    """k, v (N, Hkv, D) go to rows `slots` (N,) int64 of the pools viewed as (num_blocks * block_size, Hkv, D)."""
    Hkv, D = k_pool.shape[2], k_pool.shape[3]
    k_pool.view(-1, Hkv, D).index_copy_(0, slots, k.to(k_pool.dtype))
    v_pool.view(-1, Hkv, D).index_copy_(0, slots, v.to(v_pool.dtype))


def gather_kv(pool: Tensor, block_tables: Tensor) -> Tensor:
    """pool (N, bs, Hkv, D), block_tables (B, M) -> (B, Hkv, M * bs, D): each sequence's blocks in logical order."""
    B, M = block_tables.shape
    _, bs, Hkv, D = pool.shape
    return pool[block_tables.long()].reshape(B, M * bs, Hkv, D).transpose(1, 2)


def _check(q: Tensor, k_pool: Tensor, v_pool: Tensor, block_tables: Tensor, seq_lens: Tensor) -> None:
    if k_pool.ndim != 4 or k_pool.shape != v_pool.shape:
        raise ValueError(f"k_pool and v_pool must both be (num_blocks, block_size, n_kv_heads, head_dim), got "
                         f"{tuple(k_pool.shape)} and {tuple(v_pool.shape)}")
    if q.shape[1] % k_pool.shape[2] or q.shape[-1] != k_pool.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} does not fit the pools' {k_pool.shape[2]} KV heads of dim {k_pool.shape[3]}")
    if block_tables.ndim != 2 or seq_lens.shape != (q.shape[0],) or block_tables.shape[0] != q.shape[0]:
        raise ValueError(f"block_tables must be (B, max_blocks) and seq_lens (B,) with B = {q.shape[0]}, got "
                         f"{tuple(block_tables.shape)} and {tuple(seq_lens.shape)}")


def paged_decode_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, block_tables: Tensor, seq_lens: Tensor) -> Tensor:
    """One new query per sequence: q (B, Hq, D) -> (B, Hq, D).

    block_tables (B, max_blocks) int32, seq_lens (B,) int32: sequence b attends to its positions
    [0, seq_lens[b]) (its new token's K/V already written). out = softmax(q k^T / sqrt(D)) v, in float32.
    """
    _check(q, k_pool, v_pool, block_tables, seq_lens)
    B, Hq, D = q.shape
    Hkv = k_pool.shape[2]
    k = gather_kv(k_pool, block_tables).float()                               # (B, Hkv, L, D)
    v = gather_kv(v_pool, block_tables).float()
    qg = q.float().view(B, Hkv, Hq // Hkv, D)                                  # query heads grouped by KV head
    scores = qg @ k.transpose(-2, -1) / math.sqrt(D)                           # (B, Hkv, group, L)
    visible = torch.arange(k.shape[2], device=q.device)[None, :] < seq_lens.to(q.device).long()[:, None]   # (B, L)
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).reshape(B, Hq, D).to(q.dtype)


def paged_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, block_tables: Tensor, seq_lens: Tensor,
                    q_lens: Tensor | None = None) -> Tensor:
    """q (B, Hq, Tq, D) -> (B, Hq, Tq, D): prefill, decode or a mix, sequences of different lengths.

    Sequence b has q_lens[b] <= Tq real queries (default Tq), its positions
    [seq_lens[b] - q_lens[b], seq_lens[b]); query i sits at position p = seq_lens[b] - q_lens[b] + i and
    sees keys j <= p (bottom-right causal mask), j < seq_lens[b]. Rows i >= q_lens[b] are padding: their
    output is unspecified (finite) and must be ignored.
    """
    _check(q, k_pool, v_pool, block_tables, seq_lens)
    B, Hq, Tq, D = q.shape
    Hkv = k_pool.shape[2]
    seq_lens = seq_lens.to(q.device).long()
    q_lens = torch.full_like(seq_lens, Tq) if q_lens is None else q_lens.to(q.device).long()
    k = gather_kv(k_pool, block_tables).float()                               # (B, Hkv, L, D)
    v = gather_kv(v_pool, block_tables).float()
    L = k.shape[2]
    qg = q.float().reshape(B, Hkv, (Hq // Hkv) * Tq, D)                        # rows ordered (group, t)
    scores = qg @ k.transpose(-2, -1) / math.sqrt(D)                           # (B, Hkv, group*Tq, L)
    pos = (seq_lens - q_lens)[:, None] + torch.arange(Tq, device=q.device)[None, :]          # (B, Tq)
    pos = torch.minimum(pos, seq_lens[:, None] - 1)                            # padding rows: see the whole sequence
    j = torch.arange(L, device=q.device)
    visible = j[None, None, :] <= pos[:, :, None]                              # (B, Tq, L)
    visible = visible.repeat(1, Hq // Hkv, 1)                                  # (B, group*Tq, L)
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).reshape(B, Hq, Tq, D).to(q.dtype)
