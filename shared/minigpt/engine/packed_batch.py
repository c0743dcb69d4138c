"""A packed (flattened, variable-length) batch on the paged cache (lab 03), and its attention.

Every token scheduled in a step goes into ONE row: tokens (1, N), N = sum of the chunk lengths, each
with its own absolute position. Sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1 (the
layout of FlashAttention's varlen kernels and vLLM). No padding: a step with one 64-token prefill
chunk and 7 decodes runs 71 rows, where lab 02's padded layout (B, Tq) runs 8 * 64 = 512.

    batch = pack_chunks(chunks, manager)                           # chunks: (seq_id, tokens, start, slots)
    with using_attention(model, packed_attention(batch)):
        logits = model(batch.tokens, positions=batch.positions, kv_caches=packed_layers(cache, batch))
    last = logits[0, batch.last_index]                             # (B, V)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.attention import AttentionFn
from minigpt.cache.block_manager import BlockManager
from minigpt.cache.block_table import block_tables_tensor
from minigpt.cache.paged import PagedKVCache
from minigpt.cache.paged_attention import write_kv

__all__ = ["PackedBatch", "pack_chunks", "varlen_paged_attention", "PackedLayerView", "packed_layers",
           "packed_attention"]


@dataclass
class PackedBatch:
    seq_ids: list[Hashable]
    tokens: Tensor          # (1, N) int64
    positions: Tensor       # (1, N) int64: chunk b covers start_b .. start_b + n_b - 1
    slots: Tensor           # (N,) int64 slot of each token
    cu_seqlens_q: Tensor    # (B + 1,) int64: sequence b's tokens are rows cu[b] .. cu[b+1] - 1
    seq_lens: Tensor        # (B,) int64: tokens of each sequence in the cache after this step
    block_tables: Tensor    # (B, max_blocks) int32

    @property
    def last_index(self) -> Tensor:
        """(B,) row of each sequence's last token in this step."""
        return self.cu_seqlens_q[1:] - 1


def pack_chunks(chunks: Sequence[tuple[Hashable, Sequence[int], int, Sequence[int]]], manager: BlockManager,
                device: torch.device | str = "cpu") -> PackedBatch:
    """chunks: (seq_id, tokens, start, slots) with slots already reserved in `manager`.

    Positions continue across chunks: a chunk that starts at `start` has positions start .. start + n - 1.
    """
    if not chunks:
        raise ValueError("pack_chunks needs at least one chunk")
    ids, tokens, positions, slots, lens = [], [], [], [], [0]
    for seq_id, toks, start, sl in chunks:
        toks = [int(t) for t in toks]
        if not toks or len(sl) != len(toks):
            raise ValueError(f"chunk of {seq_id!r}: needs >= 1 token and one slot per token")
        ids.append(seq_id)
        tokens += toks
        positions += range(start, start + len(toks))
        slots += sl
        lens.append(lens[-1] + len(toks))
    tables = [manager.table(s).blocks for s in ids]
    return PackedBatch(ids, torch.tensor([tokens], device=device), torch.tensor([positions], device=device),
                       torch.tensor(slots, device=device), torch.tensor(lens, device=device),
                       torch.tensor([start + len(toks) for _, toks, start, _ in chunks], device=device),
                       block_tables_tensor(tables, device))


def varlen_paged_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, cu_seqlens_q: Tensor, seq_lens: Tensor,
                           block_tables: Tensor) -> Tensor:
    """q (1, Hq, N, D) packed queries -> (1, Hq, N, D).

    Sequence b: queries q[:, :, cu[b]:cu[b+1]] are its last n_b positions L_b - n_b .. L_b - 1
    (L_b = seq_lens[b]); its keys are its first L_b cached tokens, read through its block table
    from the pools (num_blocks, block_size, Hkv, D). Query at position p sees keys j <= p (bottom-right
    causal mask). One small attention per sequence: exact, no padding, no cross-sequence mask.
    """
    _, Hq, N, D = q.shape
    Hkv, bs = k_pool.shape[2], k_pool.shape[1]
    out = torch.empty_like(q)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for b in range(len(lens)):
        s, e, L = cu[b], cu[b + 1], lens[b]
        blocks = block_tables[b, :math.ceil(L / bs)].long()
        k = k_pool[blocks].reshape(-1, Hkv, D)[:L].transpose(0, 1)            # (Hkv, L, D)
        v = v_pool[blocks].reshape(-1, Hkv, D)[:L].transpose(0, 1)
        n, group = e - s, Hq // Hkv
        qb = q[0, :, s:e].reshape(Hkv, group * n, D)                           # rows ordered (g, t)
        visible = torch.arange(L, device=q.device)[None, :] <= torch.arange(L - n, L, device=q.device)[:, None]
        o = F.scaled_dot_product_attention(qb, k.to(q.dtype), v.to(q.dtype), attn_mask=visible.repeat(group, 1))
        out[0, :, s:e] = o.reshape(Hq, n, D)
    return out


class PackedLayerView:
    """One layer's cache for a packed step: `update` writes the N new K/V rows to their slots, returns the pools."""

    def __init__(self, k_pool: Tensor, v_pool: Tensor, slots: Tensor) -> None:
        self.k_pool, self.v_pool, self.slots = k_pool, v_pool, slots

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        write_kv(self.k_pool, self.v_pool, self.slots, k[0], v[0])
        return self.k_pool, self.v_pool


def packed_layers(cache: PagedKVCache, batch: PackedBatch) -> list[PackedLayerView]:
    return [PackedLayerView(k, v, batch.slots) for k, v in zip(cache.k_pools, cache.v_pools)]


def packed_attention(batch: PackedBatch) -> AttentionFn:
    """The model's attention function for this step (the model hands us the pools transposed on dims 1, 2)."""
    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return varlen_paged_attention(q, k.transpose(1, 2), v.transpose(1, 2), batch.cu_seqlens_q, batch.seq_lens,
                                      batch.block_tables)
    return attend
