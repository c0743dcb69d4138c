"""FlashAttention's algorithm in plain PyTorch: tiled forward with the online softmax, and the backward
pass that recomputes the probabilities from the saved log-sum-exp (FlashAttention-2) (lab 04).

Layout as everywhere in minigpt: q (B, Hq, Tq, D), k and v (B, Hkv, Tk, D), Tk >= Tq, query head h reads
KV head h // (Hq // Hkv), and the causal mask is aligned bottom-right (query i sits at position Tk - Tq + i
and sees keys j <= Tk - Tq + i). Scores are s = q k^T / sqrt(D).

Forward, per query row, over key tiles j (the online softmax of online_softmax.py, carried to the output):

    m_new = max(m, rowmax(s_j))          alpha = exp(m - m_new)
    l     = alpha * l + rowsum(exp(s_j - m_new))
    acc   = alpha * acc + exp(s_j - m_new) v_j
    out   = acc / l  (once, after the last tile)        lse = m + log(l)

Backward, with P = exp(s - lse) recomputed tile by tile (no (Tq, Tk) matrix kept from the forward):

    delta = rowsum(dO * O)               dV = P^T dO          dP = dO V^T
    dS    = P * (dP - delta)             dQ = dS K / sqrt(D)  dK = dS^T Q / sqrt(D)

Under GQA the dK, dV of a KV head are the sums over its group of query heads.

TiledAttentionFunction.apply(q, k, v, is_causal=False) ties the two into autograd in the interface of
course suites such as Stanford CS336's (see MASK_CONVENTION for what is_causal means when Tq != Tk).
"""

from __future__ import annotations

import math

from typing import Callable

import torch
from torch import Tensor

__all__ = ["tiled_attention_forward", "tiled_attention_backward", "tiled_attention", "attention_lse",
           "check_attention_shapes", "TiledAttentionFunction", "as_heads", "MASK_CONVENTION"]


def check_attention_shapes(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> int:
    """Validate (B,Hq,Tq,D) / (B,Hkv,Tk,D) shapes; return the GQA group size Hq // Hkv."""
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape:
        raise ValueError(f"attention expects q (B,Hq,Tq,D) and k, v (B,Hkv,Tk,D); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head_dim")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads cannot be grouped over {k.shape[1]} KV heads")
    if causal and k.shape[2] < q.shape[2]:
        raise ValueError(f"causal attention got {q.shape[2]} queries but only {k.shape[2]} keys; the keys must "
                         "include the queries' own positions")
    return q.shape[1] // k.shape[1]


def _up(t: Tensor) -> Tensor:
    """float32 for half / bfloat16 / float32 tensors, float64 kept (for gradient checks in double)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _mask(q_idx: Tensor, k_idx: Tensor, offset: int) -> Tensor:
    """(len(q_idx), len(k_idx)) True where query i may see key j: j <= i + offset (bottom-right)."""
    return k_idx[None, :] <= q_idx[:, None] + offset


def tiled_attention_forward(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True,
                            block_k: int = 16) -> tuple[Tensor, Tensor]:
    """(out (B,Hq,Tq,D) in q's dtype, lse (B,Hq,Tq) float32, float64 for float64 q), reading K and V `block_k` keys at a time.

    All arithmetic in float32 (float64 for float64 inputs). Key tiles entirely above the causal diagonal are skipped.
    """
    group = check_attention_shapes(q, k, v, causal)
    B, Hq, Tq, D = q.shape
    Tk = k.shape[2]
    scale = 1.0 / math.sqrt(D)
    qf = _up(q)
    kf = _up(k).repeat_interleave(group, dim=1)           # head h reads KV head h // group
    vf = _up(v).repeat_interleave(group, dim=1)
    m = torch.full((B, Hq, Tq, 1), -math.inf, device=q.device, dtype=qf.dtype)
    l = torch.zeros((B, Hq, Tq, 1), device=q.device, dtype=qf.dtype)
    acc = torch.zeros((B, Hq, Tq, D), device=q.device, dtype=qf.dtype)
    q_idx = torch.arange(Tq, device=q.device)
    offset = Tk - Tq
    for start in range(0, Tk, block_k):
        if causal and start > Tq - 1 + offset:            # the whole tile lies above the diagonal
            break
        k_idx = torch.arange(start, min(start + block_k, Tk), device=q.device)
        s = (qf @ kf[:, :, start:start + block_k].transpose(-2, -1)) * scale
        if causal:
            s = s.masked_fill(~_mask(q_idx, k_idx, offset), -math.inf)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        # rows with every key so far masked keep m = -inf; use 0 there so exp() sees no (-inf) - (-inf)
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - m_safe)
        p = torch.exp(s - m_safe)
        l = alpha * l + p.sum(-1, keepdim=True)
        acc = alpha * acc + p @ vf[:, :, start:start + block_k]
        m = m_new
    out = acc / l
    lse = (m + torch.log(l)).squeeze(-1)
    return out.to(q.dtype), lse


def tiled_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The model's attention signature (causal, bottom-right): usable as GPT(attention=tiled_attention)."""
    return tiled_attention_forward(q, k, v, causal=True)[0]


def attention_lse(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = True) -> Tensor:
    """The reference log-sum-exp per query (B, Hq, Tq), from the full score matrix (for tests and checks)."""
    group = check_attention_shapes(q, k, v, causal)
    kf = _up(k).repeat_interleave(group, dim=1)
    s = (_up(q) @ kf.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        Tq, Tk = q.shape[2], k.shape[2]
        s = s.masked_fill(~_mask(torch.arange(Tq, device=q.device), torch.arange(Tk, device=q.device), Tk - Tq),
                          -math.inf)
    return torch.logsumexp(s, dim=-1)


def tiled_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, d_out: Tensor, *,
                             causal: bool = True, block_q: int = 16,
                             block_k: int = 16) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of attention, recomputing P = exp(s - lse) tile by tile from the saved lse (B,Hq,Tq).

    Outer loop over key tiles (dK, dV of a tile finish there), inner loop over query tiles (dQ accumulates).
    Gradients are returned in the dtypes of q, k, v.
    """
    group = check_attention_shapes(q, k, v, causal)
    B, Hq, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D)
    qf, dof = _up(q), _up(d_out)
    kf = _up(k).repeat_interleave(group, dim=1)
    vf = _up(v).repeat_interleave(group, dim=1)
    lse = lse.to(qf.dtype).unsqueeze(-1)                              # (B, Hq, Tq, 1)
    delta = (dof * out.to(qf.dtype)).sum(-1, keepdim=True)                # rowsum(dO * O), (B, Hq, Tq, 1)
    dq = torch.zeros_like(qf)
    dk = torch.zeros_like(kf)
    dv = torch.zeros_like(vf)
    offset = Tk - Tq
    for ks in range(0, Tk, block_k):
        k_idx = torch.arange(ks, min(ks + block_k, Tk), device=q.device)
        k_j, v_j = kf[:, :, ks:ks + block_k], vf[:, :, ks:ks + block_k]
        # with the causal mask, query rows before ks - offset see none of this tile
        q_first = max(0, ks - offset) if causal else 0
        for qs in range(q_first - q_first % block_q, Tq, block_q):
            q_idx = torch.arange(qs, min(qs + block_q, Tq), device=q.device)
            q_i, do_i = qf[:, :, qs:qs + block_q], dof[:, :, qs:qs + block_q]
            s = (q_i @ k_j.transpose(-2, -1)) * scale
            p = torch.exp(s - lse[:, :, qs:qs + block_q])
            if causal:
                p = p.masked_fill(~_mask(q_idx, k_idx, offset), 0.0)
            dv[:, :, ks:ks + block_k] += p.transpose(-2, -1) @ do_i
            dp = do_i @ v_j.transpose(-2, -1)
            ds = p * (dp - delta[:, :, qs:qs + block_q])
            dq[:, :, qs:qs + block_q] += (ds @ k_j) * scale
            dk[:, :, ks:ks + block_k] += (ds.transpose(-2, -1) @ q_i) * scale
    dk = dk.view(B, Hkv, group, Tk, D).sum(2)                         # sum over each KV head's group
    dv = dv.view(B, Hkv, group, Tk, D).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# ---------------------------------------------------------------------------------------------------------------
# Autograd, in the interface course suites use: apply(q, k, v, is_causal=False) on (B, T, D) or (B, H, T, D)
# ---------------------------------------------------------------------------------------------------------------

MASK_CONVENTION = """\
Causal mask conventions. minigpt aligns the causal mask bottom-right: with Tq queries and Tk >= Tq keys, query i
sits at position Tk - Tq + i and sees keys j <= i + Tk - Tq. That is right for a KV cache, where the new queries
are the last Tq positions of the sequence. torch's scaled_dot_product_attention(is_causal=True) and a mask built
as torch.ones(Tq, Tk).tril() (as course suites such as CS336's do) align it top-left: query i sees keys j <= i.
The two agree exactly when Tq = Tk. The autograd Functions (TiledAttentionFunction, FlashAttentionFunction) take
is_causal=True only with Tq = Tk and raise ValueError otherwise, since a caller of that interface could mean either;
for a KV-cache step (bottom-right by definition) call tiled_attention_forward / flash_attention_forward."""


def as_heads(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> tuple[Tensor, Tensor, Tensor, bool]:
    """(q, k, v as (B, H, T, D), whether the inputs were (B, T, D)) for the autograd Functions' interface.

    Raises ValueError for is_causal=True with Tq != Tk (the conventions differ there: MASK_CONVENTION)."""
    if q.ndim not in (3, 4) or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"q, k, v must all be (batch, seq, head_dim) or all (batch, heads, seq, head_dim); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    Tq, Tk = q.shape[-2], k.shape[-2]
    if is_causal and Tq != Tk:
        raise ValueError(f"is_causal=True with {Tq} queries and {Tk} keys is ambiguous: the course's mask is "
                         "bottom-right (query i sees keys j <= i + Tk - Tq, right for a KV cache), torch's SDPA and "
                         "tril() masks are top-left (keys j <= i); they agree only when Tq = Tk. For a KV-cache step "
                         "call flash_attention_forward / tiled_attention_forward(causal=True) (bottom-right), or "
                         "build the top-left mask yourself.")
    if q.ndim == 3:
        return q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), True
    return q, k, v, False


class TiledAttentionFunction(torch.autograd.Function):
    """Attention with the PyTorch tiled forward and the LSE-recomputing backward of this module.

    apply(q, k, v, is_causal=False) (is_causal also positional): q (B, Tq, D), k and v (B, Tk, D), or
    q (B, Hq, Tq, D) and k, v (B, Hkv, Tk, D) with GQA. Returns out shaped like q. Saves for backward exactly
    one log-sum-exp tensor, (B, Tq) float32 for 3-D inputs ((B, Hq, Tq) for 4-D), besides q, k, v and out.
    is_causal=True needs Tq = Tk (MASK_CONVENTION).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        return function_forward(ctx, tiled_attention_forward, q, k, v, is_causal)

    @staticmethod
    def backward(ctx, d_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        return function_backward(ctx, tiled_attention_backward, d_out)


def function_forward(ctx, forward: Callable, q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
    """The forward both attention Functions share: (B, T, D) or (B, H, T, D) in, `forward(q4, k4, v4, causal)` ->
    (out, lse) on heads, out shaped like q; saves exactly one LSE ((B, Tq) for 3-D inputs) with q, k, v, out."""
    q4, k4, v4, three_d = as_heads(q, k, v, bool(is_causal))
    out, lse = forward(q4, k4, v4, causal=bool(is_causal))
    if three_d:
        out, lse = out.squeeze(1), lse.squeeze(1)
    ctx.save_for_backward(lse, q, k, v, out)
    ctx.is_causal = bool(is_causal)
    return out


def function_backward(ctx, backward: Callable, d_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
    """The backward both attention Functions share: `backward(q, k, v, out, lse, d_out, causal)` on heads (3-D
    inputs get a head axis of 1 and lose it again), no gradient for is_causal."""
    lse, q, k, v, out = ctx.saved_tensors
    if q.ndim == 3:
        dq, dk, dv = backward(q[:, None], k[:, None], v[:, None], out[:, None], lse[:, None], d_out[:, None],
                              causal=ctx.is_causal)
        return dq[:, 0], dk[:, 0], dv[:, 0], None
    dq, dk, dv = backward(q, k, v, out, lse, d_out, causal=ctx.is_causal)
    return dq, dk, dv, None
