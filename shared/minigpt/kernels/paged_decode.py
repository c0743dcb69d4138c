"""Split-KV decode attention over the paged KV cache (flash-decoding) as a Triton kernel (lab 04).

Paged layout (lab 02), one layer:
    k_pool, v_pool   (num_blocks, block_size, n_kv_heads, head_dim)   the physical blocks
    block_tables     (B, max_blocks) int32   logical block i of sequence b lives in physical block [b, i]
    seq_lens         (B,) int32              tokens cached per sequence (>= 1)
    q                (B, Hq, D)              one new query per sequence; query head h reads KV head h // group

A decode step has one query per sequence, so "one program per query tile" would leave most of the GPU idle
at small batch and long context. Flash-decoding splits each context into chunks of PAGES_PER_SPLIT blocks:

    stage 1 (Triton): program (b, kv_head, split) attends its group of query heads to the keys of its
            chunk, following the block table, with the online softmax; writes a partial output o_s
            (normalised within the chunk) and its log-sum-exp lse_s.
    stage 2 (merge_partials): out = sum_s exp(lse_s - lse) o_s with lse = logsumexp_s(lse_s). Weighting
            by exp(lse_s - lse) is exactly the online-softmax rescaling, done once at the end; a plain mean
            of the o_s would be wrong whenever the chunks hold different amounts of softmax mass.

The reference it must equal is lab 02's minigpt.cache.paged_attention.paged_decode_attention (gather each
sequence's blocks, then attend). gather_then_sdpa is the batched gather + SDPA baseline used for GPU timings.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from minigpt.kernels.flash_attention import LOG2E
from minigpt.kernels.triton_support import check_triton_device, dot_options

__all__ = ["paged_decode", "paged_decode_partials", "merge_partials",
           "gather_then_sdpa", "check_paged_inputs", "random_paged_inputs"]


def check_paged_inputs(q: Tensor, k_pool: Tensor, v_pool: Tensor, block_tables: Tensor, seq_lens: Tensor) -> int:
    """Validate the paged-decode inputs; return the GQA group size Hq // Hkv."""
    if q.ndim != 3 or k_pool.ndim != 4 or k_pool.shape != v_pool.shape:
        raise ValueError(f"expected q (B, Hq, D) and k_pool, v_pool (num_blocks, block_size, Hkv, D); got "
                         f"{tuple(q.shape)}, {tuple(k_pool.shape)}, {tuple(v_pool.shape)}")
    B, Hq, D = q.shape
    if k_pool.shape[3] != D or Hq % k_pool.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} does not fit pools {tuple(k_pool.shape)} (head_dim, or Hq not a "
                         "multiple of Hkv)")
    if block_tables.ndim != 2 or block_tables.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError(f"expected block_tables (B={B}, max_blocks) and seq_lens (B,); got "
                         f"{tuple(block_tables.shape)}, {tuple(seq_lens.shape)}")
    if block_tables.dtype not in (torch.int32, torch.int64) or seq_lens.dtype not in (torch.int32, torch.int64):
        raise TypeError("block_tables and seq_lens must be integer tensors (int32)")
    return Hq // k_pool.shape[2]


@triton.jit
def _paged_decode_split_kernel(Q, K_POOL, V_POOL, BLOCK_TABLES, SEQ_LENS, O_PART, LSE_PART,
                               stride_qb, stride_qh, stride_qd,
                               stride_kn, stride_kt, stride_kh, stride_kd,
                               stride_vn, stride_vt, stride_vh, stride_vd,
                               stride_tb, stride_tp,
                               stride_ob, stride_oh, stride_os, stride_od,
                               stride_lb, stride_lh, stride_ls,
                               qk_scale,
                               GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                               BLOCK_D: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_T: tl.constexpr,
                               PAGES_PER_SPLIT: tl.constexpr, PRECISION: tl.constexpr,
                               UPCAST: tl.constexpr):
    b = tl.program_id(0)
    kv_h = tl.program_id(1)
    split = tl.program_id(2)

    offs_h = tl.arange(0, BLOCK_H)                      # the GROUP query heads of this KV head (padded)
    h_ok = offs_h < GROUP
    heads = kv_h * GROUP + offs_h
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    offs_t = tl.arange(0, BLOCK_T)                      # token slots within one page (padded)

    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=h_ok[:, None] & d_ok[None, :], other=0.0)                 # (BLOCK_H, BLOCK_D)
    if UPCAST:                                          # interpreter only (see flash_attention.dot_options)
        q = q.to(tl.float32)
    seq_len = tl.load(SEQ_LENS + b)
    n_pages = tl.cdiv(seq_len, PAGE_SIZE)
    first = split * PAGES_PER_SPLIT
    last = tl.minimum(first + PAGES_PER_SPLIT, n_pages)

    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_D), dtype=tl.float32)
    for page in range(first, last):
        block = tl.load(BLOCK_TABLES + b * stride_tb + page * stride_tp).to(tl.int64)   # physical block
        pos = page * PAGE_SIZE + offs_t
        t_ok = (offs_t < PAGE_SIZE) & (pos < seq_len)
        kT = tl.load(K_POOL + block * stride_kn + offs_t[None, :] * stride_kt + kv_h * stride_kh
                     + offs_d[:, None] * stride_kd, mask=t_ok[None, :] & d_ok[:, None], other=0.0)
        if UPCAST:
            kT = kT.to(tl.float32)
        s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale                     # (BLOCK_H, BLOCK_T)
        s = tl.where(t_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V_POOL + block * stride_vn + offs_t[:, None] * stride_vt + kv_h * stride_vh
                    + offs_d[None, :] * stride_vd, mask=t_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    empty = l_i == 0.0                                  # a split past the end of this sequence
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i * 0.6931471805599453 + tl.log(tl.where(empty, 1.0, l_i)))
    tl.store(O_PART + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :] * stride_od,
             out, mask=h_ok[:, None] & d_ok[None, :])
    tl.store(LSE_PART + b * stride_lb + heads * stride_lh + split * stride_ls, lse, mask=h_ok)


def paged_decode_partials(q: Tensor, k_pool: Tensor, v_pool: Tensor, block_tables: Tensor, seq_lens: Tensor, *,
                          pages_per_split: int | None = None) -> tuple[Tensor, Tensor]:
    """Stage 1: (o_part (B, Hq, S, D) float32, lse_part (B, Hq, S) float32) for S = ceil(max_blocks / pages_per_split).

    pages_per_split None: enough splits to give the GPU a few programs per SM (about 256 tokens per split),
    one page per split in the interpreter's tiny shapes is also fine but slower, so there it is 4.
    """
    group = check_paged_inputs(q, k_pool, v_pool, block_tables, seq_lens)
    check_triton_device(q, k_pool, v_pool, block_tables, seq_lens)
    B, Hq, D = q.shape
    _, page_size, Hkv, _ = k_pool.shape
    max_blocks = block_tables.shape[1]
    if pages_per_split is None:
        pages_per_split = max(1, 256 // page_size) if q.is_cuda else 4
    n_splits = max(1, triton.cdiv(max_blocks, pages_per_split))
    o_part = torch.empty((B, Hq, n_splits, D), device=q.device, dtype=torch.float32)
    lse_part = torch.empty((B, Hq, n_splits), device=q.device, dtype=torch.float32)
    _paged_decode_split_kernel[(B, Hkv, n_splits)](
        q, k_pool, v_pool, block_tables, seq_lens, o_part, lse_part,
        *q.stride(), *k_pool.stride(), *v_pool.stride(), *block_tables.stride(), *o_part.stride(), *lse_part.stride(),
        LOG2E / math.sqrt(D),
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), HEAD_DIM=D,
        BLOCK_D=max(16, triton.next_power_of_2(D)), PAGE_SIZE=page_size,
        BLOCK_T=max(16, triton.next_power_of_2(page_size)), PAGES_PER_SPLIT=pages_per_split,
        **dot_options(q.dtype))
    return o_part, lse_part


def merge_partials(o_part: Tensor, lse_part: Tensor) -> Tensor:
    """Stage 2: combine per-split results. o_part (..., S, D), lse_part (..., S) -> (..., D) float32.

    out = sum_s w_s o_s with w_s = exp(lse_s - logsumexp(lse)); empty splits carry lse = -inf, weight 0.
    """
    lse = torch.logsumexp(lse_part, dim=-1, keepdim=True)
    weights = torch.exp(lse_part - lse)
    return (weights.unsqueeze(-1) * o_part).sum(-2)


def paged_decode(q: Tensor, k_pool: Tensor, v_pool: Tensor, block_tables: Tensor, seq_lens: Tensor, *,
                 pages_per_split: int | None = None) -> Tensor:
    """Split-KV decode attention over the paged cache: (B, Hq, D) in q's dtype. Same contract as lab 02's
    minigpt.cache.paged_attention.paged_decode_attention (every seq_len must be >= 1 and covered by its block
    table)."""
    o_part, lse_part = paged_decode_partials(q, k_pool, v_pool, block_tables, seq_lens,
                                             pages_per_split=pages_per_split)
    return merge_partials(o_part, lse_part).to(q.dtype)


def gather_then_sdpa(q: Tensor, k_pool: Tensor, v_pool: Tensor, block_tables: Tensor, seq_lens: Tensor) -> Tensor:
    """Batched baseline: copy every table's blocks into padded contiguous K, V (B, Hkv, max_blocks*bs, D),
    then scaled_dot_product_attention with a length mask. Costs an extra write + read of the whole cache."""
    B, Hq, D = q.shape
    k = k_pool[block_tables.long()].flatten(1, 2).transpose(1, 2)    # (B, Hkv, L, D)
    v = v_pool[block_tables.long()].flatten(1, 2).transpose(1, 2)
    mask = torch.arange(k.shape[2], device=q.device)[None, :] < seq_lens[:, None]   # (B, L)
    out = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask[:, None, None, :],
                                                           enable_gqa=Hq != k.shape[1])
    return out[:, :, 0]


def random_paged_inputs(seq_lens: list[int], *, n_heads: int, n_kv_heads: int, head_dim: int, block_size: int,
                        dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", seed: int = 0,
                        extra_blocks: int = 0,
                        num_blocks: int | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Seeded (q, k_pool, v_pool, block_tables, seq_lens) in the paged layout, for tests and benchmarks.

    Each sequence gets ceil(len / block_size) + extra_blocks table entries, all distinct physical blocks drawn
    in shuffled order from a pool of num_blocks (default: exactly enough).
    """
    g = torch.Generator(device=device).manual_seed(seed)
    max_blocks = max(math.ceil(n / block_size) for n in seq_lens) + extra_blocks
    num_blocks = num_blocks or len(seq_lens) * max_blocks
    shape = (num_blocks, block_size, n_kv_heads, head_dim)
    k_pool = torch.randn(shape, generator=g, device=device).to(dtype)
    v_pool = torch.randn(shape, generator=g, device=device).to(dtype)
    tables = torch.randperm(num_blocks, generator=g, device=device)[:len(seq_lens) * max_blocks]
    q = torch.randn(len(seq_lens), n_heads, head_dim, generator=g, device=device).to(dtype)
    return (q, k_pool, v_pool, tables.view(len(seq_lens), max_blocks).to(torch.int32),
            torch.tensor(seq_lens, dtype=torch.int32, device=device))
