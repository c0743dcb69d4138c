"""Batch-invariant inference (lab 12): a request's logits, bit for bit, whoever it is batched with.

    model = InvariantModel(gpt)                                    # FusedModel with invariant matmuls
    with using_attention(gpt, invariant_packed_attention(batch)):  # attention over fixed KV blocks
        logits = model(batch.tokens, positions=batch.positions, kv_caches=packed_layers(cache, batch))

Why a row's result depends on its batch: a floating-point sum depends on the order of its terms, and a
library picks its reduction strategy by shape. On the course's CPU (torch 2.13), `x @ W` for one row goes
through a matrix-vector kernel and for 2 or more rows through a blocked matrix-matrix kernel whose blocking
changes with the row count; attention over a batch pads every sequence's keys to the longest. Each choice is
exact arithmetic's same answer with other roundings, so a request's greedy tokens can change with the load.

The fix fixes every reduction's order independently of the batch:

* `invariant_matmul(x, w, tile)`: rows in groups of `tile` (the last padded with zeros), every group one
  (tile, K) @ (K, N) product of the same shape (one `bmm`), so every row meets the same kernel and blocking.
* `invariant_attention`: each query reduces over its own keys in blocks of the cache's block size at fixed
  positions (0..bs-1, bs..2bs-1, ...), merged in order with the online softmax
      m' = max(m, max_j s_j),  l' = l e^(m - m') + sum_j e^(s_j - m'),  o' = o e^(m - m') + sum_j e^(s_j - m') v_j
  A block past the query's position is masked whole: e^(m - m') = 1 and its terms are 0, so o' = o bit for bit:
  the same query gives the same bits in a decode step, a prefill, or any chunk of one.
* RMSNorm, RoPE, SiLU and the embedding are per row already (measured by `variance_by_op`).

Cost: the padding and fixed shapes (measured in lab 12 and `make bench`).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from minigpt.attention import AttentionFn
from minigpt.engine.fused_decode import FusedModel
from minigpt.engine.packed_batch import PackedBatch

__all__ = ["DEFAULT_TILE", "invariant_matmul", "invariant_attention", "invariant_attention_dense",
           "invariant_packed_attention", "InvariantModel", "rows_changed"]

DEFAULT_TILE = 8


def invariant_matmul(x: Tensor, w: Tensor, tile: int = DEFAULT_TILE) -> Tensor:
    """x (..., K) @ w (K, N) -> (..., N), each row computed by a (tile, K) @ (K, N) product whatever the number
    of rows: the rows are padded with zeros to a multiple of `tile` and multiplied as (M / tile) equal blocks."""
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:
        raise ValueError(f"tile must be a positive int (rows per product), got {tile!r}")
    lead, K = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, K)
    M = rows.shape[0]
    pad = -M % tile
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, K)])
    groups = rows.shape[0] // tile
    out = torch.bmm(rows.view(groups, tile, K), w.expand(groups, *w.shape))
    return out.reshape(-1, w.shape[-1])[:M].reshape(*lead, w.shape[-1])


def invariant_attention(q: Tensor, positions: Tensor, k_blocks: Callable[[int], tuple[Tensor, Tensor]],
                        num_blocks: int, block_size: int) -> Tensor:
    """Causal attention of N query rows, each over its own sequence's keys, in fixed key blocks.

    q (N, Hq, D); positions (N,) each query's position (it sees keys 0..p); k_blocks(b) -> (k, v), each
    (N, block_size, Hkv, D): the keys and values of positions b * block_size .. (b + 1) * block_size - 1 of each
    row's sequence (any finite values where a sequence has none: they are masked). Returns (N, Hq, D) float32."""
    N, Hq, D = q.shape
    qs = q.float() * (1.0 / math.sqrt(D))
    m = q.new_full((N, Hq), float("-inf"), dtype=torch.float32)
    l = q.new_zeros((N, Hq), dtype=torch.float32)
    o = q.new_zeros((N, Hq, D), dtype=torch.float32)
    offsets = torch.arange(block_size, device=q.device)
    for b in range(num_blocks):
        k, v = k_blocks(b)
        group = Hq // k.shape[2]
        k = k.float().repeat_interleave(group, dim=2).transpose(1, 2)           # (N, Hq, bs, D)
        v = v.float().repeat_interleave(group, dim=2).transpose(1, 2)
        scores = (qs[:, :, None, :] * k).sum(-1)                                # (N, Hq, bs): a dot per key
        hidden = (b * block_size + offsets)[None, :] > positions[:, None]       # (N, bs): keys after the query
        scores = scores.masked_fill(hidden[:, None, :], float("-inf"))
        m_new = torch.maximum(m, scores.amax(-1))                               # finite: key 0 is in block 0
        scale = torch.exp(m - m_new)
        p = torch.exp(scores - m_new[..., None])
        l = l * scale + p.sum(-1)
        o = o * scale[..., None] + (p[..., None] * v).sum(-2)
        m = m_new
    return o / l[..., None]


def invariant_attention_dense(q: Tensor, positions: Tensor, keys: Tensor, values: Tensor, block_size: int) -> Tensor:
    """`invariant_attention` over keys held per row: keys, values (N, L, Hkv, D), row n's sequence's keys at
    positions 0..L-1 (those past `positions[n]` are masked, whatever they hold). Returns (N, Hq, D) float32."""
    N, L = keys.shape[:2]
    pad = -L % block_size
    if pad:
        keys = torch.cat([keys, keys.new_zeros(N, pad, *keys.shape[2:])], dim=1)
        values = torch.cat([values, values.new_zeros(N, pad, *values.shape[2:])], dim=1)
    blocks = keys.shape[1] // block_size

    def block(b: int) -> tuple[Tensor, Tensor]:
        return keys[:, b * block_size:(b + 1) * block_size], values[:, b * block_size:(b + 1) * block_size]
    return invariant_attention(q, positions, block, blocks, block_size)


def invariant_packed_attention(batch: PackedBatch) -> AttentionFn:
    """The model's attention for one packed step (`packed_batch.packed_attention`'s contract) with
    `invariant_attention`: every row's keys read block by block through its sequence's block table."""
    cu = batch.cu_seqlens_q.long()
    q_lens = cu[1:] - cu[:-1]
    seq_of = torch.repeat_interleave(torch.arange(len(q_lens), device=cu.device), q_lens)       # (N,)
    positions = batch.positions[0]
    tables = batch.block_tables.long()[seq_of]                                                  # (N, max_blocks)

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k_pool, v_pool = k.transpose(1, 2), v.transpose(1, 2)        # (num_blocks, bs, Hkv, D)
        bs = k_pool.shape[1]
        needed = int(positions.max()) // bs + 1
        out = invariant_attention(q[0].transpose(0, 1), positions, lambda b: (k_pool[tables[:, b]], v_pool[tables[:, b]]),
                                  needed, bs)
        return out.to(q.dtype).transpose(0, 1)[None]                 # (1, Hq, N, D)
    return attend


class InvariantModel(FusedModel):
    """`FusedModel` whose every projection is `invariant_matmul` (attention comes from the model's layers, as
    there: the engine sets `invariant_packed_attention` for each step)."""

    def __init__(self, model, tile: int = DEFAULT_TILE) -> None:
        super().__init__(model)
        self.tile = tile

    def _linear(self, x: Tensor, w: Tensor) -> Tensor:
        return invariant_matmul(x, w, self.tile)


def rows_changed(alone: Tensor, batched: Tensor) -> float:
    """Fraction of the elements of a row computed alone that differ bit-wise from the same row in a batch."""
    return (alone != batched).float().mean().item()

