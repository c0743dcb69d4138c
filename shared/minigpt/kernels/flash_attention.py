"""FlashAttention forward as a Triton kernel, and the autograd Function with the Triton backward (lab 04).

One program per (query tile, batch * query head). It loads its BLOCK_M queries once, loops over the key /
value tiles of BLOCK_N keys with the online softmax held in registers (running max m, denominator l,
accumulator acc), and writes the output tile and the log-sum-exp per query. Nothing of size (Tq, Tk) ever
reaches memory: HBM traffic is O(T * D) per head instead of O(T^2).

* Causal masking is bottom-right (query i sees keys j <= i + Tk - Tq, as in minigpt.attention); key tiles
  entirely above the diagonal are never visited (the loop stops at the tile's last visible key). The causal fast
  path runs the tiles entirely below the diagonal without a mask and masks only the diagonal tiles;
  causal_split=False keeps the single masked loop for comparison.
* GQA: query head h reads KV head h // (Hq // Hkv); a KV head serves its whole group.
* Tails: loads beyond Tq, Tk or head_dim are masked (other=0) and masked scores set to -inf.
* fp32 / fp16 / bf16 inputs; the dots accumulate in fp32 and the output is written in the input dtype.
* Exponentials are exp2 on scores pre-multiplied by log2(e) (one multiply folded into the scale); the LSE
  is converted back to natural log.

On a machine without a GPU, set TRITON_INTERPRET=1 *before* this module is imported (the @triton.jit
decorator reads it) and pass CPU tensors: Triton's interpreter runs the same kernel with numpy.

Entry points:
    flash_attention_forward(q, k, v, causal=...) -> (out, lse)     q (B,Hq,Tq,D), k/v (B,Hkv,Tk,D)
    flash_attention(q, k, v) -> out                                the model's attention signature;
        importing this module also registers it as minigpt.attention's "triton" implementation, so
        GPT(cfg, attention="triton") and model.set_attention("triton") work afterwards.
    FlashAttentionFunction.apply(q, k, v, is_causal=False) -> out  autograd on (B, T, D) or (B, H, T, D);
        saves one LSE tensor ((B, T) for 3-D inputs, plus q, k, v, out); its backward is the Triton
        FlashAttention-2 backward of flash_backward.py. is_causal=True needs Tq = Tk: the course's mask is
        bottom-right, torch SDPA's is top-left (tiled_attention.MASK_CONVENTION).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from minigpt.attention import ATTENTION_IMPLEMENTATIONS
from minigpt.kernels.flash_backward import flash_attention_backward
from minigpt.kernels.tiled_attention import check_attention_shapes, function_backward, function_forward
from minigpt.kernels.triton_support import check_triton_device, dot_options, interpreting

__all__ = ["flash_attention_forward", "flash_attention", "FlashAttentionFunction", "interpreting",
           "AUTOTUNE_CONFIGS", "check_triton_device", "dot_options"]

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, lo, hi, offs_m, offs_n, offs_d, d_ok, k_len, offset,
               stride_kt, stride_kd, stride_vt, stride_vd, qk_scale,
               MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """The online-softmax update over the key tiles [lo, hi). MASKED=False: the caller guarantees every key of
    these tiles is visible to every query row (below the causal diagonal, before Tk), so no mask is built."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < k_len
        if MASKED:
            kT = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None] * stride_kd,
                         mask=col_ok[None, :] & d_ok[:, None], other=0.0)      # (BLOCK_D, BLOCK_N)
        else:
            kT = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None] * stride_kd,
                         mask=d_ok[:, None], other=0.0)
        if UPCAST:
            kT = kT.to(tl.float32)
        s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale              # scores * log2(e) / sqrt(D)
        if MASKED:
            visible = col_ok[None, :]
            if IS_CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + offset)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)                    # rescales what was accumulated under the old max
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)       # (BLOCK_N, BLOCK_D)
        else:
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :] * stride_vd,
                        mask=d_ok[None, :], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_fwd_kernel(Q, K, V, O, LSE,
                      stride_qb, stride_qh, stride_qt, stride_qd,
                      stride_kb, stride_kh, stride_kt, stride_kd,
                      stride_vb, stride_vh, stride_vt, stride_vd,
                      stride_ob, stride_oh, stride_ot, stride_od,
                      stride_lb, stride_lh, stride_lt,
                      n_q_heads, q_len, k_len, qk_scale,
                      GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                      IS_CAUSAL: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL_SPLIT: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // n_q_heads
    h = bh % n_q_heads
    kv_h = h // GROUP                                   # GQA: a KV head serves GROUP consecutive query heads

    offs_m = start_m + tl.arange(0, BLOCK_M)            # query rows of this tile
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < q_len) & d_ok[None, :], other=0.0)
    if UPCAST:                                          # interpreter only: its bf16 arithmetic is unreliable
        q = q.to(tl.float32)
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)   # running max (log2 units)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)                 # running denominator
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)         # running numerator sum p v

    offset = k_len - q_len                              # bottom-right alignment of the causal mask
    hi = k_len
    if IS_CAUSAL:
        hi = tl.minimum(k_len, start_m + BLOCK_M + offset)      # skip tiles fully above the diagonal
    if IS_CAUSAL and CAUSAL_SPLIT:
        # fast path, two stages: the tiles whose every key is visible to the tile's first query row
        # (start_n + BLOCK_N - 1 <= start_m + offset, hence also < Tk) run without building a mask; only the
        # tiles crossing the diagonal (at most cdiv(BLOCK_M, BLOCK_N) + 1 of them) pay for it
        full = (start_m + offset + 1) // BLOCK_N * BLOCK_N
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, 0, full, offs_m, offs_n, offs_d, d_ok, k_len,
                                   offset, stride_kt, stride_kd, stride_vt, stride_vd, qk_scale,
                                   False, IS_CAUSAL, PRECISION, UPCAST, BLOCK_N)
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, full, hi, offs_m, offs_n, offs_d, d_ok, k_len,
                                   offset, stride_kt, stride_kd, stride_vt, stride_vd, qk_scale,
                                   True, IS_CAUSAL, PRECISION, UPCAST, BLOCK_N)
    else:
        # one loop, every tile masked (the tail, and the diagonal when causal): the lab's exercise 4 kernel
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, k_base, v_base, 0, hi, offs_m, offs_n, offs_d, d_ok, k_len,
                                   offset, stride_kt, stride_kd, stride_vt, stride_vd, qk_scale,
                                   True, IS_CAUSAL, PRECISION, UPCAST, BLOCK_N)

    out = acc / l_i[:, None]                            # divide once, after the last tile
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(offs_m[:, None] < q_len) & d_ok[None, :])
    lse = m_i * 0.6931471805599453 + tl.log(l_i)        # natural-log LSE: ln2 * m (log2 units) + ln(l)
    tl.store(LSE + b * stride_lb + h * stride_lh + offs_m * stride_lt, lse, mask=offs_m < q_len)


# Autotuning (GPU only; the interpreter uses the fixed tiles passed in). What each knob trades:
#   BLOCK_M  queries per program: larger re-reads K/V fewer times (HBM traffic ~ Tq/BLOCK_M passes) but
#            needs more registers for q and acc, and gives fewer programs to fill the SMs at short T.
#   BLOCK_N  keys per inner step: larger means fewer loop iterations and bigger tensor-core dots, but
#            more registers / shared memory for the K, V and score tiles.
#   num_warps   threads per program (4 warps = 128 threads): more hide latency, fewer leave registers
#            per thread for the accumulator (spills above ~255 registers/thread are fatal for speed).
#   num_stages  software-pipelining depth: how many K/V tiles are in flight in shared memory while the
#            current one is computed; more hides HBM latency, costs shared memory (can fail to launch).
AUTOTUNE_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [(128, 64, 8, 3), (128, 64, 4, 3), (128, 32, 4, 4), (64, 64, 4, 3),
                         (64, 32, 4, 4), (128, 128, 8, 2), (64, 128, 4, 2), (128, 64, 8, 4)]
]
_flash_fwd_autotuned = triton.autotune(configs=AUTOTUNE_CONFIGS,
                                       key=["q_len", "k_len", "HEAD_DIM", "IS_CAUSAL", "GROUP", "CAUSAL_SPLIT"])(_flash_fwd_kernel)


def flash_attention_forward(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True, block_m: int | None = None,
                            block_n: int | None = None, num_warps: int = 4,
                            num_stages: int = 2, causal_split: bool = True) -> tuple[Tensor, Tensor]:
    """Run the Triton forward kernel: (out (B,Hq,Tq,D) in q's dtype, lse (B,Hq,Tq) float32).

    causal_split: the causal fast path (unmasked tiles, then the diagonal tiles with the mask); False runs the
    single loop that masks every tile (the lab's exercise 4 kernel), kept for comparison.

    block_m / block_n: fixed tile sizes (powers of two). None: autotune on a GPU (AUTOTUNE_CONFIGS),
    32 x 32 in the interpreter (fewer, larger tiles run faster there). Any strides are accepted (no .contiguous() copies).
    """
    group = check_attention_shapes(q, k, v, causal)
    check_triton_device(q, k, v)
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype out of float32/float16/bfloat16; got {q.dtype}, {k.dtype}, {v.dtype}")
    B, Hq, Tq, D = q.shape
    Tk = k.shape[2]
    out = torch.empty_like(q)
    lse = torch.empty((B, Hq, Tq), device=q.device, dtype=torch.float32)
    if Tq == 0:
        return out, lse
    if Tk == 0:
        raise ValueError("attention over zero keys is undefined")
    args = (q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
            Hq, Tq, Tk, LOG2E / math.sqrt(D))
    meta = dict(GROUP=group, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)), IS_CAUSAL=causal,
                CAUSAL_SPLIT=causal_split, **dot_options(q.dtype))
    tune = block_m is None and block_n is None and not interpreting()
    if tune:
        grid = lambda META: (triton.cdiv(Tq, META["BLOCK_M"]), B * Hq)   # noqa: E731
        _flash_fwd_autotuned[grid](*args, **meta)
    else:
        bm, bn = block_m or 32, block_n or 32
        _flash_fwd_kernel[(triton.cdiv(Tq, bm), B * Hq)](*args, **meta, BLOCK_M=bm, BLOCK_N=bn,
                                                         num_warps=num_warps, num_stages=num_stages)
    return out, lse


def flash_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal (bottom-right) FlashAttention with the model's signature (B,Hq,Tq,D), (B,Hkv,Tk,D) -> (B,Hq,Tq,D)."""
    return flash_attention_forward(q, k, v, causal=True)[0]


class FlashAttentionFunction(torch.autograd.Function):
    """Attention with the Triton forward kernel and the Triton FlashAttention-2 backward (flash_backward.py).

    apply(q, k, v, is_causal=False) (is_causal also positional): q (B, Tq, D), k and v (B, Tk, D), or
    q (B, Hq, Tq, D) and k, v (B, Hkv, Tk, D) with GQA. Returns out shaped like q. Saves for backward exactly
    one log-sum-exp tensor, (B, Tq) float32 for 3-D inputs ((B, Hq, Tq) for 4-D), besides q, k, v and out.
    is_causal=True needs Tq = Tk: the course's mask is bottom-right, torch's SDPA is top-left, and they agree only
    there (minigpt.kernels.tiled_attention.MASK_CONVENTION); other shapes raise ValueError.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        return function_forward(ctx, flash_attention_forward, q, k, v, is_causal)

    @staticmethod
    def backward(ctx, d_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        return function_backward(ctx, flash_attention_backward, d_out)


# attention="triton" in minigpt: the core keeps no import of this folder, the kernel registers itself.
ATTENTION_IMPLEMENTATIONS.setdefault("triton", flash_attention)
