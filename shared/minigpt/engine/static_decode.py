"""Lab 01's decode step with the overhead taken out (the reference of its Exercise 5): the model's math on
weights laid out for one-row matmuls, a RoPE table made once, and a preallocated, fixed-shape KV cache.

    w = fuse_weights(model.state_dict(), model.config)             # once
    k_cache, v_cache = empty_cache(model.config)                   # (L, S, Hkv, D) each, preallocated
    for position, token in enumerate(tokens):                      # prompt and decode alike, one token a step
        logits = decode_step(w, model.config, token, position, k_cache, v_cache)     # (V,)

What the step saves against `GPT.forward` (lab 01, section 7), each the way serving engines do it:

* 4 matmuls a layer instead of 7: x @ [W_q; W_k; W_v] and x @ [W_gate; W_up] (vLLM's QKVParallelLinear and
  MergedColumnParallelLinear), so 4 L + 1 matmuls a step;
* every matrix K-major, (in_features, out_features) and contiguous: a one-row x @ W streams W in memory order,
  where nn.Linear's (out, in) weight goes through a transposed matrix-vector product;
* cos and sin of every position computed once (the model recomputes the angles at every call), RMSNorm as
  torch's fused `F.rms_norm`;
* K and V written into a buffer of the model's whole context at `position` (gpt-fast's static cache): no
  allocation, the same shapes at every step, attention over the slots [0, position].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.config import ModelConfig
from minigpt.model import rope_angles

__all__ = ["k_major", "fuse_weights", "empty_cache", "decode_step", "MATRICES"]

MATRICES = ("qkv", "wo", "gate_up", "down")      # per layer, in this order; then "head"


def k_major(*weights: Tensor) -> Tensor:
    """nn.Linear weights (out_i, in) side by side as one (in, sum out_i) contiguous matrix: x @ W = [x @ W_i.T]."""
    return torch.cat([w.detach() for w in weights]).t().contiguous()


def fuse_weights(state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor | list[Tensor]]:
    """The step's weights from a model's state dict, made once:

    embed (V, d); per layer (lists of L) attn_norm (d,), qkv (d, (H + 2 Hkv) D), wo (H D, d), mlp_norm (d,),
    gate_up (d, 2 d_ff), down (d_ff, d); norm (d,), head (d, V); cos and sin (max_seq_len, D / 2)."""
    layer = [f"layers.{i}." for i in range(config.n_layers)]
    positions = torch.arange(config.max_seq_len, device=state["tok_emb.weight"].device)
    angles = rope_angles(positions, config.head_dim, config.rope_theta, config.rope_scaling)
    return {
        "embed": state["tok_emb.weight"].detach().contiguous(),
        "attn_norm": [state[p + "attn_norm.weight"].detach() for p in layer],
        "qkv": [k_major(state[p + "attn.wq.weight"], state[p + "attn.wk.weight"], state[p + "attn.wv.weight"])
                for p in layer],
        "wo": [k_major(state[p + "attn.wo.weight"]) for p in layer],
        "mlp_norm": [state[p + "mlp_norm.weight"].detach() for p in layer],
        "gate_up": [k_major(state[p + "mlp.w_gate.weight"], state[p + "mlp.w_up.weight"]) for p in layer],
        "down": [k_major(state[p + "mlp.w_down.weight"]) for p in layer],
        "norm": state["norm.weight"].detach(),
        "head": k_major(state["lm_head.weight"]),         # tied embeddings: the state dict names the embedding so too
        "cos": angles.cos(),
        "sin": angles.sin(),
    }


def empty_cache(config: ModelConfig, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Zeroed K and V buffers for one sequence of the model's whole context, (L, max_seq_len, Hkv, D) each."""
    shape = (config.n_layers, config.max_seq_len, config.n_kv_heads, config.head_dim)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


@torch.inference_mode()
def decode_step(w: dict, config: ModelConfig, token: int, position: int, k_cache: Tensor, v_cache: Tensor) -> Tensor:
    """Logits (V,) after `token` at `position`, given the keys and values of positions [0, position) in the caches;
    writes this position's K and V at k_cache[:, position] and v_cache[:, position] and nothing else."""
    H, Hkv, D, d, eps = config.n_heads, config.n_kv_heads, config.head_dim, config.d_model, config.norm_eps
    cos, sin = w["cos"][position], w["sin"][position]                                     # (D/2,)
    x = w["embed"][token][None]                                                           # (1, d)
    for i in range(config.n_layers):
        q, k, v = (F.rms_norm(x, (d,), w["attn_norm"][i], eps) @ w["qkv"][i]).split([H * D, Hkv * D, Hkv * D], -1)
        x1, x2 = torch.cat([q, k], -1).view(H + Hkv, D).chunk(2, -1)                      # q and k rotate together
        qk = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)
        k_cache[i, position], v_cache[i, position] = qk[H:], v.view(Hkv, D)
        keys, values = k_cache[i, :position + 1].transpose(0, 1), v_cache[i, :position + 1].transpose(0, 1)
        out = F.scaled_dot_product_attention(qk[:H, None], keys, values, enable_gqa=True)   # (H, 1, D)
        x = x + out.reshape(1, H * D) @ w["wo"][i]
        gate, up = (F.rms_norm(x, (d,), w["mlp_norm"][i], eps) @ w["gate_up"][i]).chunk(2, -1)
        x = x + (F.silu(gate) * up) @ w["down"][i]
    return (F.rms_norm(x, (d,), w["norm"], eps) @ w["head"])[0]
