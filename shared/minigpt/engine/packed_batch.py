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

from dataclasses import dataclass
from typing import Hashable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.attention import AttentionFn
from minigpt.cache.block_manager import BlockManager
from minigpt.cache.block_table import block_tables_tensor
from minigpt.cache.paged import PagedKVCache
from minigpt.cache.paged_attention import paged_attention, write_kv

__all__ = ["PackedBatch", "pack_chunks", "varlen_paged_attention", "PackedLayerView", "packed_layers",
           "packed_attention", "decode_rows", "decode_attention"]


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
    (L_b = seq_lens[b]); its keys are its first L_b cached tokens, read through its block table from
    the pools (num_blocks, block_size, Hkv, D); the query at position p sees keys j <= p.

    Lab 02's `paged_attention` already does exactly this for a padded (B, Hq, Tq, D) query, so the
    packed queries are scattered into that shape for the attention alone and gathered back: every
    weight matmul (most of the FLOPs) stays packed, only the small attention product sees padding.
    A FlashAttention varlen kernel skips even that (lab 04).
    """
    _, Hq, N, D = q.shape
    cu = cu_seqlens_q.to(q.device).long()
    q_lens = cu[1:] - cu[:-1]
    B, Tq = len(q_lens), int(q_lens.max())
    seq_of = torch.repeat_interleave(torch.arange(B, device=q.device), q_lens)        # (N,) sequence of each row
    row_of = torch.arange(N, device=q.device) - cu[seq_of]                           # (N,) its index in the chunk
    padded = q.new_zeros(B, Tq, Hq, D)
    padded[seq_of, row_of] = q[0].transpose(0, 1)
    out = paged_attention(padded.transpose(1, 2), k_pool, v_pool, block_tables, seq_lens, q_lens)   # (B, Hq, Tq, D)
    return out.transpose(1, 2)[seq_of, row_of].transpose(0, 1)[None]


class PackedLayerView:
    """One layer's cache for a packed step: `update` writes the N new K/V rows to their slots, returns the pools."""

    def __init__(self, k_pool: Tensor, v_pool: Tensor, slots: Tensor) -> None:
        self.k_pool, self.v_pool, self.slots = k_pool, v_pool, slots

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        write_kv(self.k_pool, self.v_pool, self.slots, k[0], v[0])
        return self.k_pool, self.v_pool


def packed_layers(cache: PagedKVCache, batch: PackedBatch) -> list[PackedLayerView]:
    return [PackedLayerView(k, v, batch.slots) for k, v in zip(cache.k_pools, cache.v_pools)]


def decode_rows(block_tables: Tensor, seq_lens: Tensor, block_size: int) -> tuple[Tensor, Tensor | None]:
    """For a step of decodes: the pool row (block * block_size + offset) of each sequence's cached tokens, (B, L)
    with L the longest sequence, and the (B, 1, 1, L) mask of real keys (None when all have length L).
    Computed once per step; every layer then gathers its K/V with one index_select."""
    lens = seq_lens.long()
    L = int(lens.max())
    j = torch.arange(L, device=block_tables.device)
    rows = block_tables.long()[:, j // block_size] * block_size + j % block_size          # (B, L)
    if bool((lens == L).all()):
        return rows, None
    visible = j[None, :] < lens[:, None]
    return rows.masked_fill(~visible, 0), visible[:, None, None, :]


def decode_attention(q: Tensor, k_pool: Tensor, v_pool: Tensor, rows: Tensor, mask: Tensor | None) -> Tensor:
    """q (B, Hq, 1, D), one new query per sequence, over the keys at pool `rows` (B, L) -> (B, Hq, 1, D), with
    PyTorch's fused SDPA (grouped-query heads as they are). Equals lab 02's `paged_decode_attention`."""
    B, L = rows.shape
    Hkv, D = k_pool.shape[2], k_pool.shape[3]
    k = k_pool.reshape(-1, Hkv, D).index_select(0, rows.reshape(-1)).view(B, L, Hkv, D).transpose(1, 2)
    v = v_pool.reshape(-1, Hkv, D).index_select(0, rows.reshape(-1)).view(B, L, Hkv, D).transpose(1, 2)
    return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask,
                                          enable_gqa=q.shape[1] != Hkv)


def packed_attention(batch: PackedBatch) -> AttentionFn:
    """The model's attention function for this step (the model hands us the pools transposed on dims 1, 2).

    A step of decodes only (one query row per sequence, N = B: the common step, and every step at batch 1) takes a
    shorter path: the packed queries (1, Hq, B, D) are already one query per sequence, the rows to read are found
    once for the step (`decode_rows`), and each layer runs fused SDPA on its gathered K/V (`decode_attention`),
    instead of scattering into a padded layout and building a (B, Tq, L) causal mask in every layer."""
    plan: list = []
    decode_only = batch.tokens.shape[1] == len(batch.seq_ids)

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        k_pool, v_pool = k.transpose(1, 2), v.transpose(1, 2)
        if decode_only:
            if not plan:
                plan.extend(decode_rows(batch.block_tables, batch.seq_lens, k_pool.shape[1]))
            return decode_attention(q[0].transpose(0, 1)[:, :, None], k_pool, v_pool, *plan)[:, :, 0] \
                .transpose(0, 1)[None]
        return varlen_paged_attention(q, k_pool, v_pool, batch.cu_seqlens_q, batch.seq_lens, batch.block_tables)
    return attend
