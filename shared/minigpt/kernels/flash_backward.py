"""FlashAttention-2 backward pass as Triton kernels (lab 04, part two).

Layout and mask as in flash_attention.py: q (B,Hq,Tq,D), k and v (B,Hkv,Tk,D), Tk >= Tq when causal, query head h
reads KV head h // group, causal mask bottom-right (query i sees keys j <= i + Tk - Tq). From the forward's
out and LSE (B,Hq,Tq), with P = exp(s - lse) recomputed tile by tile and s = q k^T / sqrt(D):

    delta = rowsum(dO * O)                                   _bwd_preprocess_kernel, one program per query tile
    dV = P^T dO     dS = P * (dO V^T - delta)     dK = dS^T Q / sqrt(D)
                                                             _bwd_dkdv_kernel, one program per key tile and KV head
    dQ = dS K / sqrt(D)                                      _bwd_dq_kernel, one program per query tile and head

Why three kernels:
* delta is a sum over the head dimension of the whole row; a key-tile program sees every query row, so computing it
  there would redo the same (Tq x D) reduction once per key tile (and a version summed over the tile's keys is wrong).
* dK and dV of a key tile are sums over all queries (and, under GQA, over the group's query heads): one program per
  (key tile, KV head) loops over them and writes its tile once, with no atomics.
* dQ of a query tile is a sum over all keys. The same loop could add its share into a float32 dQ with
  tl.atomic_add (FlashAttention-2's CUDA code does): fewer matmuls (5 instead of 7 per tile pair) but every key
  tile's program contends for the same dQ rows, the float32 sum's order changes from run to run (not bitwise
  reproducible), and it needs a (B,Hq,Tq,D) float32 buffer and a conversion pass. Here dQ gets its own kernel
  that recomputes s and dP (two extra matmuls per tile pair), deterministic, writing each tile once in q's dtype.

Entry point: flash_attention_backward(q, k, v, out, lse, d_out, causal=...) -> (dq, dk, dv) in the dtypes of q, k, v.
Under the interpreter (TRITON_INTERPRET=1 at import) the kernels run on CPU tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from minigpt.kernels.triton_support import check_triton_device, dot_options, interpreting
from minigpt.kernels.tiled_attention import check_attention_shapes

__all__ = ["flash_attention_backward", "attention_delta", "BackwardTiles", "backward_tiles"]

LOG2E = 1.4426950408889634


@triton.jit
def _bwd_preprocess_kernel(O, DO, DELTA,
                           stride_ob, stride_oh, stride_ot, stride_od,
                           stride_db, stride_dh, stride_dt, stride_dd,
                           stride_lb, stride_lh, stride_lt,
                           n_q_heads, q_len,
                           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta[b, h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d], in float32."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    bh = tl.program_id(1)
    b = bh // n_q_heads
    h = bh % n_q_heads
    offs_d = tl.arange(0, BLOCK_D)
    ok = (offs_m[:, None] < q_len) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od,
                mask=ok, other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_db + h * stride_dh + offs_m[:, None] * stride_dt + offs_d[None, :] * stride_dd,
                 mask=ok, other=0.0).to(tl.float32)
    tl.store(DELTA + b * stride_lb + h * stride_lh + offs_m * stride_lt, tl.sum(o * do, 1), mask=offs_m < q_len)


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,
                     stride_qb, stride_qh, stride_qt, stride_qd,
                     stride_kb, stride_kh, stride_kt, stride_kd,
                     stride_vb, stride_vh, stride_vt, stride_vd,
                     stride_db, stride_dh, stride_dt, stride_dd,
                     stride_lb, stride_lh, stride_lt,
                     stride_dkb, stride_dkh, stride_dkt, stride_dkd,
                     stride_dvb, stride_dvh, stride_dvt, stride_dvd,
                     n_kv_heads, q_len, k_len, sm_scale,
                     GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr,
                     PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK, dV of BLOCK_N keys of one KV head: sums over every query row of the GROUP query heads reading it."""
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b = bh // n_kv_heads
    kv_h = bh % n_kv_heads
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    n_ok = offs_n < k_len
    kv_ok = n_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b * stride_kb + kv_h * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd,
                mask=kv_ok, other=0.0)                                    # (BLOCK_N, BLOCK_D)
    v = tl.load(V + b * stride_vb + kv_h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                mask=kv_ok, other=0.0)
    if UPCAST:                                          # interpreter only: its bf16 arithmetic is unreliable
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)

    offset = k_len - q_len                              # bottom-right: query i sees keys j <= i + offset
    lo = 0
    if IS_CAUSAL:                                       # query rows before start_n - offset see none of these keys
        lo = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
    for g in range(GROUP):                              # GQA: every query head of this KV head's group
        h = kv_h * GROUP + g
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_db + h * stride_dh
        l_base = LSE + b * stride_lb + h * stride_lh
        dl_base = DELTA + b * stride_lb + h * stride_lh
        for start_m in range(lo, q_len, BLOCK_M):
            rows = start_m + offs_m
            m_ok = rows < q_len
            q = tl.load(q_base + rows[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                        mask=m_ok[:, None] & d_ok[None, :], other=0.0)     # (BLOCK_M, BLOCK_D)
            do = tl.load(do_base + rows[:, None] * stride_dt + offs_d[None, :] * stride_dd,
                         mask=m_ok[:, None] & d_ok[None, :], other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
                do = do.to(tl.float32)
            lse = tl.load(l_base + rows * stride_lt, mask=m_ok, other=0.0)
            delta = tl.load(dl_base + rows * stride_lt, mask=m_ok, other=0.0)
            # P^T for this (key tile, query tile): (BLOCK_N, BLOCK_M), in log2 units for exp2
            sT = tl.dot(k, tl.trans(q), input_precision=PRECISION) * (sm_scale * 1.4426950408889634)
            pT = tl.exp2(sT - lse[None, :] * 1.4426950408889634)
            visible = m_ok[None, :] & n_ok[:, None]
            if IS_CAUSAL:
                visible = visible & (offs_n[:, None] <= rows[None, :] + offset)
            pT = tl.where(visible, pT, 0.0)
            dv += tl.dot(pT.to(do.dtype), do, input_precision=PRECISION)
            dpT = tl.dot(v, tl.trans(do), input_precision=PRECISION)      # (dO V^T)^T
            dsT = pT * (dpT - delta[None, :])
            dk += tl.dot(dsT.to(q.dtype), q, input_precision=PRECISION)
    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + kv_h * stride_dkh + offs_n[:, None] * stride_dkt + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(DV + b * stride_dvb + kv_h * stride_dvh + offs_n[:, None] * stride_dvt + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=kv_ok)


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
                   stride_qb, stride_qh, stride_qt, stride_qd,
                   stride_kb, stride_kh, stride_kt, stride_kd,
                   stride_vb, stride_vh, stride_vt, stride_vd,
                   stride_db, stride_dh, stride_dt, stride_dd,
                   stride_lb, stride_lh, stride_lt,
                   stride_dqb, stride_dqh, stride_dqt, stride_dqd,
                   n_q_heads, q_len, k_len, sm_scale,
                   GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr,
                   PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ of BLOCK_M query rows of one head: a sum over the key tiles they see (s and dP recomputed)."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // n_q_heads
    h = bh % n_q_heads
    kv_h = h // GROUP
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    m_ok = rows < q_len
    q_ok = m_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                mask=q_ok, other=0.0)
    do = tl.load(DO + b * stride_db + h * stride_dh + rows[:, None] * stride_dt + offs_d[None, :] * stride_dd,
                 mask=q_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    lse = tl.load(LSE + b * stride_lb + h * stride_lh + rows * stride_lt, mask=m_ok, other=0.0)
    delta = tl.load(DELTA + b * stride_lb + h * stride_lh + rows * stride_lt, mask=m_ok, other=0.0)
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)

    offset = k_len - q_len
    hi = k_len
    if IS_CAUSAL:                                       # the tile's last visible key, as in the forward
        hi = tl.minimum(k_len, start_m + BLOCK_M + offset)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        n_ok = cols < k_len
        kT = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None] * stride_kd,
                     mask=n_ok[None, :] & d_ok[:, None], other=0.0)      # (BLOCK_D, BLOCK_N)
        vT = tl.load(v_base + cols[None, :] * stride_vt + offs_d[:, None] * stride_vd,
                     mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        if UPCAST:
            kT = kT.to(tl.float32)
            vT = vT.to(tl.float32)
        s = tl.dot(q, kT, input_precision=PRECISION) * (sm_scale * 1.4426950408889634)
        p = tl.exp2(s - lse[:, None] * 1.4426950408889634)
        visible = m_ok[:, None] & n_ok[None, :]
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
        p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, vT, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kT.dtype), tl.trans(kT), input_precision=PRECISION)
    dq = dq * sm_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + rows[:, None] * stride_dqt + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=q_ok)


def attention_delta(out: Tensor, d_out: Tensor, *, block_m: int = 32) -> Tensor:
    """delta = rowsum(dO * O) (B,Hq,Tq) float32, by _bwd_preprocess_kernel (32 rows per program: no register
    spills up to head_dim 128 on sm_80 / sm_90)."""
    B, Hq, Tq, D = out.shape
    delta = torch.empty((B, Hq, Tq), device=out.device, dtype=torch.float32)
    if Tq:
        _bwd_preprocess_kernel[(triton.cdiv(Tq, block_m), B * Hq)](
            out, d_out, delta, *out.stride(), *d_out.stride(), *delta.stride(), Hq, Tq,
            HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_M=block_m)
    return delta


@dataclass(frozen=True)
class BackwardTiles:
    """Tile sizes and warps of the two gradient kernels (dkdv_m: query rows per step of the dK/dV kernel's loop,
    dkdv_n: keys per program; dq_m: query rows per program, dq_n: keys per step)."""

    dkdv_m: int
    dkdv_n: int
    dq_m: int
    dq_n: int
    dkdv_warps: int = 4
    dq_warps: int = 4


def backward_tiles(dtype: torch.dtype, head_dim: int) -> BackwardTiles:
    """GPU tiles chosen so that neither kernel spills registers on sm_80 / sm_90 (tests/minigpt/compile_kernels.py
    reports registers and spills per variant): each program holds two (tile x head_dim) inputs of its own plus two
    fp32 accumulators (dK, dV) or one (dQ) across its loop, so larger head dims take smaller tiles or more warps."""
    if dtype == torch.float32:
        return BackwardTiles(16 if head_dim > 64 else 32, 32, 32, 32, 8, 8)
    if head_dim > 64:
        return BackwardTiles(32, 32, 32, 32, 4, 8)
    return BackwardTiles(32, 64, 64, 32, 4, 4)


def flash_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, d_out: Tensor, *,
                             causal: bool = True, block_m: int | None = None, block_n: int | None = None,
                             num_stages: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of attention from the forward's out and lse (B,Hq,Tq), in the dtypes of q, k, v.

    block_m / block_n: query / key tiles of both kernels (powers of two, at least 16). None: 32 x 32 in the
    interpreter, backward_tiles(dtype, head_dim) on a GPU.
    """
    group = check_attention_shapes(q, k, v, causal)
    check_triton_device(q, k, v, out, lse, d_out)
    if d_out.shape != q.shape or out.shape != q.shape or lse.shape != q.shape[:3]:
        raise ValueError(f"out and d_out must have q's shape {tuple(q.shape)} and lse {tuple(q.shape[:3])}; got "
                         f"{tuple(out.shape)}, {tuple(d_out.shape)}, {tuple(lse.shape)}")
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if d_out.dtype != q.dtype:
        d_out = d_out.to(q.dtype)
    lse = lse.float().contiguous()                       # delta is written with the same strides
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if Tq == 0 or Tk == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    t = BackwardTiles(32, 32, 32, 32) if interpreting() else backward_tiles(q.dtype, D)
    if block_m or block_n:
        bm, bn = block_m or t.dq_m, block_n or t.dkdv_n
        t = BackwardTiles(bm, bn, bm, bn, t.dkdv_warps, t.dq_warps)
    delta = attention_delta(out, d_out)
    common = (*q.stride(), *k.stride(), *v.stride(), *d_out.stride(), *lse.stride())
    meta = dict(GROUP=group, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)), IS_CAUSAL=bool(causal),
                **dot_options(q.dtype), num_stages=num_stages)
    scale = 1.0 / math.sqrt(D)
    _bwd_dkdv_kernel[(triton.cdiv(Tk, t.dkdv_n), B * Hkv)](
        q, k, v, d_out, lse, delta, dk, dv, *common, *dk.stride(), *dv.stride(), Hkv, Tq, Tk, scale, **meta,
        BLOCK_M=t.dkdv_m, BLOCK_N=t.dkdv_n, num_warps=t.dkdv_warps)
    _bwd_dq_kernel[(triton.cdiv(Tq, t.dq_m), B * Hq)](
        q, k, v, d_out, lse, delta, dq, *common, *dq.stride(), Hq, Tq, Tk, scale, **meta,
        BLOCK_M=t.dq_m, BLOCK_N=t.dq_n, num_warps=t.dq_warps)
    return dq, dk, dv
