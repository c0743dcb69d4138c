"""The model's forward pass at any length, with any RoPE frequencies and any attention function.

    nll = position_nll(model, tokens, inv_freq=scaled_inv_freq(...), logit_scale=yarn_logit_scale(8))
    logits = long_logits(model, tokens, inv_freq, attention=windowed)

`GPT.forward` refuses sequences longer than `max_seq_len` and builds its own angles from `rope_theta`; here the
same blocks run on angles p * inv_freq for p = 0..T-1 and on `attention(q, k, v)` (any `minigpt.attention`
function), multiplying q.k by `logit_scale` (YaRN's temperature). The model is left as it was.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.attention import AttentionFn, resolve_attention
from minigpt.model import GPT

__all__ = ["angles_for", "swapped_attention", "long_logits", "position_nll", "bucket_perplexity"]


def angles_for(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Rotation angles (..., T, D/2) = positions * inv_freq, float32 (computed in float64, then rounded)."""
    return (positions.double()[..., None] * inv_freq.double().to(positions.device)).float()


@contextlib.contextmanager
def swapped_attention(model: GPT, attention: AttentionFn) -> Iterator[None]:
    """Use `attention` in every layer inside the block; put the previous functions back afterwards."""
    saved = [block.attn.attention for block in model.layers]
    try:
        for block in model.layers:
            block.attn.attention = attention
        yield
    finally:
        for block, fn in zip(model.layers, saved):
            block.attn.attention = fn


def _scaled(attention: AttentionFn, logit_scale: float) -> AttentionFn:
    if logit_scale == 1.0:
        return attention
    return lambda q, k, v: attention(q * logit_scale, k, v)


@torch.no_grad()
def long_logits(model: GPT, tokens: Tensor, inv_freq: Tensor, *, attention: str | AttentionFn = "sdpa",
                logit_scale: float = 1.0) -> Tensor:
    """tokens (B, T) -> logits (B, T, V), T unbounded; RoPE angles p * inv_freq for p = 0..T-1."""
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have shape (batch, seq), got {tuple(tokens.shape)}")
    if inv_freq.shape != (model.config.head_dim // 2,):
        raise ValueError(f"inv_freq must have shape ({model.config.head_dim // 2},), got {tuple(inv_freq.shape)}")
    angles = angles_for(torch.arange(tokens.shape[1], device=tokens.device), inv_freq)
    with swapped_attention(model, _scaled(resolve_attention(attention), logit_scale)):
        x = model.tok_emb(tokens)
        for block in model.layers:
            x = block(x, angles)
        return model.lm_head(model.norm(x))


def position_nll(model: GPT, tokens: Tensor, inv_freq: Tensor, **kwargs) -> Tensor:
    """Negative log-likelihood (B, T-1) of token t+1 given tokens 0..t, in nats, at every position t."""
    logits = long_logits(model, tokens, inv_freq, **kwargs).float()
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none")


def bucket_perplexity(nll: Tensor, edges: list[int]) -> list[float]:
    """exp(mean NLL) over the predicted positions in [edges[j], edges[j+1]), pooled over the batch (B, T-1)."""
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        part = nll[..., lo:hi]
        if part.numel() == 0:
            raise ValueError(f"no positions in [{lo}, {hi}); the sequences have {nll.shape[-1]} predictions")
        out.append(float(part.mean().exp()))
    return out
