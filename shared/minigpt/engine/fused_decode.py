"""A decode step the way serving engines run one: lab 01's model and math, in fewer and larger operations.

    step = FusedDecodeStep(model)                      # once: fused, K-major copies of the weights
    logits = model(prompt, positions=cache.next_positions(P), kv_caches=cache)      # prefill: the model itself
    logits = step(next_tokens, cache)                  # decode: (B,) new tokens -> (B, vocab) logits

What changes against `GPT.forward` for one new token per sequence (measured by `make bench`, data/bench/):

* the three attention projections are one matmul, x @ [W_q; W_k; W_v], and the MLP's gate and up one more (vLLM's
  QKVParallelLinear and MergedColumnParallelLinear): 25 matmuls a step instead of 43;
* each weight is kept K-major, (in_features, out_features), so that a one-row matmul x @ W reads it in the order the
  CPU's BLAS streams fastest (nn.Linear's (out, in) weight goes through a transposed GEMV, much slower at one row);
* RMSNorm is torch's fused `F.rms_norm`; RoPE's cos and sin come from a table made once; q and k rotate together;
* the new K and V go in place into lab 01's `KVCache`, and attention reads the cache through strided views.

The logits equal the model's to float32 rounding (the sums run in another order); greedy tokens are the same.
Plain models only: nn.Linear projections (no quantized or sharded linears), the model's sdpa-style attention.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minigpt.cache.contiguous import KVCache
from minigpt.model import GPT, rope_angles

__all__ = ["FusedDecodeStep", "generate_fused"]


def _k_major(*linears: nn.Module) -> Tensor:
    """The weights of `linears` side by side, (in_features, sum of out_features), contiguous: x @ W = [l(x) for l]."""
    for linear in linears:
        if type(linear) is not nn.Linear:
            raise TypeError(f"FusedDecodeStep needs plain nn.Linear projections, got {type(linear).__name__} "
                            "(quantized or sharded models keep their own step)")
    return torch.cat([linear.weight.detach() for linear in linears]).t().contiguous()


class FusedDecodeStep:
    """One decode step for a batch of B sequences, one new token each, on the model's contiguous `KVCache`."""

    def __init__(self, model: GPT) -> None:
        cfg = model.config
        self.model, self.config = model, cfg
        self.heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.qkv = [_k_major(b.attn.wq, b.attn.wk, b.attn.wv) for b in model.layers]   # (d, (H + 2 Hkv) D)
        self.wo = [_k_major(b.attn.wo) for b in model.layers]                          # (H D, d)
        self.gate_up = [_k_major(b.mlp.w_gate, b.mlp.w_up) for b in model.layers]      # (d, 2 d_ff)
        self.down = [_k_major(b.mlp.w_down) for b in model.layers]                     # (d_ff, d)
        self.head = _k_major(model.lm_head)                                            # (d, vocab)
        self.norms = [(b.attn_norm.weight.detach(), b.mlp_norm.weight.detach()) for b in model.layers]
        self.final_norm = model.norm.weight.detach()
        angles = rope_angles(torch.arange(cfg.max_seq_len, device=model.device), cfg.head_dim, cfg.rope_theta,
                             cfg.rope_scaling)                                          # (S, D/2)
        self.cos, self.sin = angles.cos().to(model.dtype), angles.sin().to(model.dtype)

    def _rope(self, x: Tensor, position: int) -> Tensor:
        """Rotate (B, heads, D) at one position: the pairs (x[i], x[i + D/2]), as `minigpt.model.apply_rope`."""
        cos, sin = self.cos[position], self.sin[position]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, cache: KVCache) -> Tensor:
        """tokens (B,) at position cache.length -> logits (B, vocab); the cache grows by one position."""
        position = cache.length
        if position >= cache.max_seq_len:
            raise ValueError(f"the cache is full ({cache.max_seq_len} positions): no room for another token")
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        eps = self.config.norm_eps
        x = self.model.tok_emb.weight[tokens]                                           # (B, d)
        B, d = x.shape
        for i, layer in enumerate(cache.layers):
            attn_norm, mlp_norm = self.norms[i]
            q, k, v = (F.rms_norm(x, (d,), attn_norm, eps) @ self.qkv[i]).split([H * D, Hkv * D, Hkv * D], dim=-1)
            qk = self._rope(torch.cat([q, k], dim=-1).view(B, H + Hkv, D), position)
            layer.k[:, position] = qk[:, H:]
            layer.v[:, position] = v.view(B, Hkv, D)
            keys = layer.k[:, :position + 1].transpose(1, 2)                            # (B, Hkv, t, D) views
            values = layer.v[:, :position + 1].transpose(1, 2)
            out = F.scaled_dot_product_attention(qk[:, :H, None], keys, values, enable_gqa=H != Hkv)   # (B, H, 1, D)
            x = x + out.reshape(B, H * D) @ self.wo[i]
            gate, up = (F.rms_norm(x, (d,), mlp_norm, eps) @ self.gate_up[i]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ self.down[i]
        for layer in cache.layers:
            layer.length = position + 1
        return F.rms_norm(x, (d,), self.final_norm, eps) @ self.head


@torch.inference_mode()
def generate_fused(model: GPT, prompt: Sequence[int], max_new_tokens: int, *,
                   step: FusedDecodeStep | None = None) -> list[int]:
    """Greedy, exactly `max_new_tokens` tokens (no stop token): the model's prefill, then fused decode steps."""
    step = step or FusedDecodeStep(model)
    cache = KVCache.for_model(model, batch_size=1, max_seq_len=len(prompt) + max_new_tokens)
    ids = torch.tensor([list(prompt)], device=model.device)
    token = model(ids, positions=cache.next_positions(len(prompt)), kv_caches=cache)[:, -1].argmax(-1)
    out = [int(token)]
    while len(out) < max_new_tokens:
        token = step(token, cache).argmax(-1)
        out.append(int(token))
    return out[:max_new_tokens]
