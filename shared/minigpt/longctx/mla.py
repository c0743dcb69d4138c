"""Multi-head latent attention (DeepSeek-V2/V3), small: the latent cache, the materialised path, the absorbed decode.

    shape = MLAShape(d_model=64, n_heads=4, kv_lora_rank=16, rope_dim=8, nope_dim=16, v_dim=16)
    w = MLAWeights.draw(shape, torch.Generator().manual_seed(0))
    q_nope, q_rope, c_kv, k_rope = project(w, x, torch.arange(T))      # x (B, T, d_model); RoPE applied
    y = materialised_attention(w, q_nope, q_rope, c_kv, k_rope)         # prefill: K and V per head, causal
    step = absorbed_decode(q_nope[:, -1], q_rope[:, -1], c_kv, k_rope, w.w_uk, w.w_uv, w.w_o)   # == y[:, -1]

Per token a layer caches the latent c_KV = x W_DKV (kv_lora_rank wide) and one RoPE key k_R = RoPE(x W_KR) (rope_dim
wide) shared by the heads. Head h's key is [c_KV W_UK[h], k_R] and its value c_KV W_UV[h]; its query is
[q_nope, q_rope] (nope_dim + rope_dim), the scores scaled by 1/sqrt(nope_dim + rope_dim).

* `materialised_attention` projects K and V up for every cached token, then attends: what prefill does (vLLM's
  "compute friendly" path, MHA with head dimensions 192/128 on DeepSeek-V3).
* `absorbed_decode` folds W_UK into the query (q_nope W_UK[h]^T, kv_lora_rank wide) and W_UV into the output
  (attend over c_KV, then W_UV[h], then W_O): a decode step reads only the latent cache (vLLM's "data-movement
  friendly" path; FlashMLA's kernel computes the attention over the latents).

Simplified against DeepSeek: no query LoRA (q = x W_Q directly), no norm on the latent, no YaRN on the RoPE part.
`decode_step_cost` prices one decode step of a layer both ways, for the roofline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from minigpt.longctx.rope_scaling import base_inv_freq
from minigpt.model import apply_rope

__all__ = ["MLAShape", "MLAWeights", "DEEPSEEK_V3", "project", "materialised_attention", "naive_decode",
           "absorbed_decode", "StepCost", "decode_step_cost"]


@dataclass(frozen=True)
class MLAShape:
    """One MLA layer's widths (DeepSeek's config names in the comments)."""

    d_model: int          # hidden_size
    n_heads: int          # num_attention_heads
    kv_lora_rank: int     # kv_lora_rank: the latent c_KV
    rope_dim: int         # qk_rope_head_dim: the decoupled RoPE key, shared by the heads
    nope_dim: int         # qk_nope_head_dim
    v_dim: int            # v_head_dim
    n_layers: int = 1     # num_hidden_layers
    rope_theta: float = 10_000.0

    @property
    def scale(self) -> float:
        """The softmax scale: 1/sqrt of the whole query-key width, nope and rope parts together."""
        return 1.0 / math.sqrt(self.nope_dim + self.rope_dim)


# DeepSeek-V3's config.json (huggingface.co/deepseek-ai/DeepSeek-V3): hidden_size 7168, num_attention_heads 128,
# kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128, num_hidden_layers 61.
DEEPSEEK_V3 = MLAShape(d_model=7168, n_heads=128, kv_lora_rank=512, rope_dim=64, nope_dim=128, v_dim=128,
                       n_layers=61)


@dataclass(frozen=True)
class MLAWeights:
    """w_q (d_model, H (nope + rope)), w_dkv (d_model, r), w_kr (d_model, rope), w_uk (H, r, nope),
    w_uv (H, r, v), w_o (H v, d_model)."""

    shape: MLAShape
    w_q: Tensor
    w_dkv: Tensor
    w_kr: Tensor
    w_uk: Tensor
    w_uv: Tensor
    w_o: Tensor

    @classmethod
    def draw(cls, shape: MLAShape, generator: torch.Generator, dtype: torch.dtype = torch.float32) -> "MLAWeights":
        """Random weights, each scaled by 1/sqrt(its input width) so activations stay near unit size."""
        s, H = shape, shape.n_heads

        def w(*dims: int, fan_in: int) -> Tensor:
            return (torch.randn(*dims, generator=generator, dtype=torch.float64) / math.sqrt(fan_in)).to(dtype)
        return cls(s, w(s.d_model, H * (s.nope_dim + s.rope_dim), fan_in=s.d_model),
                   w(s.d_model, s.kv_lora_rank, fan_in=s.d_model), w(s.d_model, s.rope_dim, fan_in=s.d_model),
                   w(H, s.kv_lora_rank, s.nope_dim, fan_in=s.kv_lora_rank),
                   w(H, s.kv_lora_rank, s.v_dim, fan_in=s.kv_lora_rank), w(H * s.v_dim, s.d_model, fan_in=H * s.v_dim))


def project(w: MLAWeights, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """x (B, T, d_model) at `positions` (T,) -> q_nope (B, T, H, nope), q_rope (B, T, H, rope), c_kv (B, T, r),
    k_rope (B, T, rope): the queries and what the cache keeps, RoPE applied to the rope parts."""
    s, (B, T, _) = w.shape, x.shape
    angles = positions.to(torch.float64)[:, None] * base_inv_freq(s.rope_dim, s.rope_theta)
    q = (x @ w.w_q).view(B, T, s.n_heads, s.nope_dim + s.rope_dim)
    q_nope, q_rope = q.split([s.nope_dim, s.rope_dim], dim=-1)
    q_rope = apply_rope(q_rope, angles.to(x.dtype))
    k_rope = apply_rope((x @ w.w_kr)[:, :, None, :], angles.to(x.dtype))[:, :, 0]
    return q_nope, q_rope, x @ w.w_dkv, k_rope


def materialised_attention(w: MLAWeights, q_nope: Tensor, q_rope: Tensor, c_kv: Tensor, k_rope: Tensor,
                           causal: bool = True) -> Tensor:
    """The compute-friendly path: every cached token's K (B, T, H, nope + rope) and V (B, T, H, v) projected up, then
    attention of the Tq queries (the last Tq of the T positions when causal) -> (B, Tq, d_model)."""
    s = w.shape
    B, Tq, H, _ = q_nope.shape
    T = c_kv.shape[1]
    k = torch.cat([torch.einsum("btr,hrd->bthd", c_kv, w.w_uk), k_rope[:, :, None, :].expand(B, T, H, s.rope_dim)], -1)
    v = torch.einsum("btr,hrd->bthd", c_kv, w.w_uv)
    q = torch.cat([q_nope, q_rope], -1)
    scores = torch.einsum("bqhd,bthd->bhqt", q, k) * s.scale
    if causal:
        mask = torch.arange(T, device=q.device)[None, :] > torch.arange(T - Tq, T, device=q.device)[:, None]
        scores = scores.masked_fill(mask, -math.inf)
    out = torch.einsum("bhqt,bthd->bqhd", scores.softmax(-1), v)
    return out.reshape(B, Tq, H * s.v_dim) @ w.w_o


def naive_decode(q_nope: Tensor, q_rope: Tensor, c_kv: Tensor, k_rope: Tensor, w_uk: Tensor, w_uv: Tensor,
                 w_o: Tensor) -> Tensor:
    """One decode step the materialised way (the signature of `absorbed_decode`): K and V of every cached token
    projected up, then attention. The reference the absorbed path must equal."""
    H, r, nope = w_uk.shape
    shape = MLAShape(w_o.shape[1], H, r, q_rope.shape[-1], nope, w_uv.shape[-1])
    w = MLAWeights(shape, torch.empty(0), torch.empty(0), torch.empty(0), w_uk, w_uv, w_o)
    return materialised_attention(w, q_nope[:, None], q_rope[:, None], c_kv, k_rope, causal=False)[:, 0]


def absorbed_decode(q_nope: Tensor, q_rope: Tensor, c_kv: Tensor, k_rope: Tensor, w_uk: Tensor, w_uv: Tensor,
                    w_o: Tensor) -> Tensor:
    """One decode step over the latent cache, W_UK folded into the query and W_UV into the output.

    q_nope (B, H, nope), q_rope (B, H, rope): the new token's query, RoPE applied; c_kv (B, T, r), k_rope (B, T, rope):
    the cache; w_uk (H, r, nope), w_uv (H, r, v), w_o (H v, d_model) -> (B, d_model). Nothing of size T x H x nope
    or T x H x v is ever formed."""
    H, r, nope = w_uk.shape
    scale = 1.0 / math.sqrt(nope + q_rope.shape[-1])
    q_latent = torch.einsum("bhd,hrd->bhr", q_nope, w_uk)                       # q_nope W_UK[h]^T
    scores = (torch.einsum("bhr,btr->bht", q_latent, c_kv) + torch.einsum("bhe,bte->bht", q_rope, k_rope)) * scale
    o_latent = torch.einsum("bht,btr->bhr", scores.softmax(-1), c_kv)            # attention over the latents
    o = torch.einsum("bhr,hrv->bhv", o_latent, w_uv)                             # then W_UV[h]
    return o.reshape(o.shape[0], -1) @ w_o


@dataclass(frozen=True)
class StepCost:
    """FLOPs and bytes of one layer's attention in one decode step (W_O and the query projection left out: the same
    both ways)."""

    flops: float
    bytes: float


def decode_step_cost(shape: MLAShape, context_len: int, batch: int = 1, bytes_per_element: int = 2,
                     ) -> dict[str, StepCost]:
    """One layer, one decode step over `context_len` cached tokens, `batch` sequences:

    materialised  up-project K and V from the latents for every cached token (2 T r H (nope + v) FLOPs a sequence),
                  write them and read them back (unfused), attend: reads the latents, W_UK and W_UV, and the K/V.
    absorbed      fold W_UK into the query (2 H nope r), scores over the latents and rope keys (2 H T (r + rope)),
                  weighted sum of the latents (2 H T r), W_UV (2 H r v): reads the latents, W_UK and W_UV once."""
    s, T, b = shape, context_len, bytes_per_element
    H, r, e, n, v = s.n_heads, s.kv_lora_rank, s.rope_dim, s.nope_dim, s.v_dim
    latents = batch * T * (r + e) * b
    up_weights = H * r * (n + v) * b
    materialised_kv = batch * T * H * (n + v) * b
    return {
        "materialised": StepCost(batch * (2 * T * r * H * (n + v) + 2 * H * T * (n + e) + 2 * H * T * v),
                                 latents + up_weights + 2 * materialised_kv),
        "absorbed": StepCost(batch * (2 * H * n * r + 2 * H * T * (r + e) + 2 * H * T * r + 2 * H * r * v),
                             latents + up_weights),
    }
