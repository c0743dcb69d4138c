"""A bounded KV cache: sliding window over a ring buffer, with attention sinks (StreamingLLM).

    cache = [RingKVCache(batch=1, n_kv_heads=2, head_dim=64, window=256, n_sinks=4, inv_freq=f) for _ in layers]
    logits = cached_logits(model, tokens, cache, inv_freq, prefill=16)       # then one token at a time

The cache holds the first `n_sinks` tokens for ever and the last `window` tokens in a ring: token p goes to
slot p (p < n_sinks) or n_sinks + (p - n_sinks) % window, so memory is fixed at n_sinks + window slots.

Positions. Keys are stored already rotated at their absolute position p, and the next tokens get positions
length, length+1, ... however many times the ring has wrapped: RoPE scores depend only on q-k distances,
which in the window stay below `window`. Reusing slot numbers as positions after a wrap breaks those
distances. The sinks, once tokens between them and the window have been evicted, are shown to the query as
if they sat just before the window (StreamingLLM numbers positions inside the cache): with n tokens seen,
sink i is rotated on by shift = n - window - n_sinks, to position i + shift, so its distance to the newest
token is at most window + n_sinks - 1, inside the trained range.

`streaming_attention` is the same attention as a mask over a whole sequence (one forward pass, any length):
the two agree wherever both apply, and the mask is what measures perplexity over long streams cheaply.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from minigpt.attention import AttentionFn
from minigpt.longctx.long_forward import angles_for
from minigpt.model import GPT, apply_rope

__all__ = ["RingKVCache", "rotate_keys", "cached_logits", "streaming_attention", "kept_positions", "cache_nbytes"]


def rotate_keys(k: Tensor, shift: int | Tensor, inv_freq: Tensor) -> Tensor:
    """Rotate keys k (B, T, H, D), already at some positions, on by `shift` positions (a scalar or (T,))."""
    shift = torch.as_tensor(shift, device=k.device).expand(k.shape[1])
    return apply_rope(k, angles_for(shift, inv_freq))


def kept_positions(length: int, window: int, n_sinks: int = 0) -> list[int]:
    """The absolute positions a sink + window cache holds after `length` tokens, oldest first."""
    if length <= n_sinks + window:
        return list(range(length))
    return list(range(n_sinks)) + list(range(length - window, length))


class RingKVCache:
    """One layer's bounded cache: `n_sinks` first tokens kept, then a ring of the last `window` tokens.

    `update(k, v)` takes keys/values (B, T, Hkv, D) rotated at positions `next_positions(T)` and returns the
    cached ones (B, kept, Hkv, D), oldest first, sinks rotated next to the window. Several tokens at once are
    accepted while nothing is evicted (a prefill); after that one at a time (each new token evicts a different
    one). Bad input raises ValueError with the cache unchanged.
    """

    def __init__(self, batch: int, n_kv_heads: int, head_dim: int, window: int, n_sinks: int = 0,
                 inv_freq: Tensor | None = None, dtype: torch.dtype = torch.float32) -> None:
        if window < 1 or n_sinks < 0:
            raise ValueError(f"need window >= 1 and n_sinks >= 0, got window={window}, n_sinks={n_sinks}")
        if n_sinks and inv_freq is None:
            raise ValueError("a cache with sinks needs the RoPE frequencies (inv_freq) to re-rotate them")
        self.window, self.n_sinks, self.inv_freq = window, n_sinks, inv_freq
        self.k = torch.zeros(batch, n_sinks + window, n_kv_heads, head_dim, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.length = 0                                   # tokens seen so far

    # -- queries
    @property
    def capacity(self) -> int:
        return self.n_sinks + self.window

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors actually allocated (fixed, whatever the stream length)."""
        return cache_nbytes([self.k, self.v])

    def next_positions(self, n: int) -> Tensor:
        """Absolute positions of the next n tokens: length .. length + n - 1 (never reset by the ring)."""
        return torch.arange(self.length, self.length + n)

    def slot(self, position: int) -> int:
        """Ring slot of absolute `position`: sinks at 0..n_sinks-1, then n_sinks + (p - n_sinks) % window."""
        if position < self.n_sinks:
            return position
        return self.n_sinks + (position - self.n_sinks) % self.window

    # -- changes
    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if k.shape != v.shape or k.ndim != 4 or k.shape[0] != self.k.shape[0] or k.shape[2:] != self.k.shape[2:]:
            raise ValueError(f"expected k, v of shape (B={self.k.shape[0]}, T, {self.k.shape[2]}, {self.k.shape[3]}), "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        T = k.shape[1]
        if T > 1 and self.length + T > self.capacity:
            raise ValueError(f"{T} tokens at once would evict cached ones ({self.length} + {T} > capacity "
                             f"{self.capacity}); feed them one at a time once the window is full")
        for t in range(T):
            s = self.slot(self.length + t)
            self.k[:, s] = k[:, t]
            self.v[:, s] = v[:, t]
        self.length += T
        return self.read()

    def read(self) -> tuple[Tensor, Tensor]:
        """The cached keys and values, oldest first, sinks rotated to sit just before the window."""
        slots = [self.slot(p) for p in kept_positions(self.length, self.window, self.n_sinks)]
        k, v = self.k[:, slots], self.v[:, slots]
        shift = self.length - self.window - self.n_sinks
        if self.n_sinks and shift > 0:
            k = torch.cat([rotate_keys(k[:, :self.n_sinks], shift, self.inv_freq), k[:, self.n_sinks:]], dim=1)
        return k, v


def cache_nbytes(tensors: Sequence[Tensor]) -> int:
    """Bytes of the storages behind `tensors` (measured from the allocations, each storage counted once)."""
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


@torch.no_grad()
def cached_logits(model: GPT, tokens: Tensor, caches: Sequence, inv_freq: Tensor, *, prefill: int = 1) -> Tensor:
    """Run tokens (B, T) through the model with one cache per layer: `prefill` tokens first, then one at a time.

    Positions come from caches[0].next_positions(n); attention is the model's own (causal for a prefill,
    unmasked for one query). Returns the logits (B, T, V) of every step, concatenated.
    """
    if len(caches) != len(model.layers):
        raise ValueError(f"got {len(caches)} layer caches for a model with {len(model.layers)} layers")
    out, start, T = [], 0, tokens.shape[1]
    while start < T:
        n = min(prefill, T) if start == 0 else 1
        angles = angles_for(caches[0].next_positions(n), inv_freq)
        x = model.tok_emb(tokens[:, start:start + n])
        for block, cache in zip(model.layers, caches):
            x = block(x, angles, cache)
        out.append(model.lm_head(model.norm(x)))
        start += n
    return torch.cat(out, dim=1)


def streaming_attention(window: int, n_sinks: int = 0, inv_freq: Tensor | None = None,
                        block: int = 256) -> AttentionFn:
    """What a RingKVCache(window, n_sinks) computes, as attention over a whole sequence (Tq == Tk).

    Query p sees keys (p - window, p] and, when it is not among them, sink j < n_sinks rotated on by
    max(p + 1 - window - n_sinks, 0). Computed one block of queries at a time, so cost and memory grow with
    T * (block + window), not T^2. Pass window >= T (and n_sinks=0) for plain causal attention.
    """
    if n_sinks and inv_freq is None:
        raise ValueError("attention sinks need the RoPE frequencies (inv_freq) to re-rotate them")

    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        B, Hq, T, D = q.shape
        if k.shape[2] != T:
            raise ValueError("streaming_attention runs on a whole sequence (as many queries as keys)")
        group = Hq // k.shape[1]
        k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
        qf, scale = q.float(), 1.0 / math.sqrt(D)
        out = torch.empty_like(qf)
        for a in range(0, T, block):
            b = min(a + block, T)
            p = torch.arange(a, b)[:, None]
            lo = max(0, a - window + 1)
            j = torch.arange(lo, b)[None, :]
            scores = qf[:, :, a:b] @ k[:, :, lo:b].transpose(-1, -2) * scale
            scores = scores.masked_fill(~((j <= p) & (j > p - window)), float("-inf"))
            parts_s, parts_v = [scores], [v[:, :, lo:b]]
            if n_sinks:
                shift = (p[:, 0] + 1 - window - n_sinks).clamp(min=0)
                q_back = apply_rope(qf[:, :, a:b].transpose(1, 2), angles_for(-shift, inv_freq)).transpose(1, 2)
                s_sink = q_back @ k[:, :, :n_sinks].transpose(-1, -2) * scale
                js = torch.arange(n_sinks)[None, :]
                s_sink = s_sink.masked_fill(~(js <= p - window), float("-inf"))
                parts_s.insert(0, s_sink)
                parts_v.insert(0, v[:, :, :n_sinks])
            probs = torch.softmax(torch.cat(parts_s, -1), -1)
            out[:, :, a:b] = probs @ torch.cat(parts_v, 2)
        return out.to(q.dtype)

    return attention
