"""The model's forward the way serving engines run it: lab 00's model and math, in fewer and larger operations.

    fused = FusedModel(model)                              # fused, K-major copies of the weights
    logits = fused(tokens, positions=..., kv_caches=...)   # what model(...) returns, to float32 rounding

What changes against `GPT.forward`, and why (measured by `make bench`, data/bench/):

* the three attention projections are one matmul, x @ [W_q; W_k; W_v], and the MLP's gate and up one more (vLLM's
  QKVParallelLinear and MergedColumnParallelLinear): 25 matmuls a pass instead of 43;
* each weight is kept K-major, (in_features, out_features), so that a one-row matmul x @ W reads it in the order the
  CPU's BLAS streams fastest (nn.Linear's (out, in) weight goes through a transposed GEMV, much slower at one row);
* RMSNorm is torch's fused `F.rms_norm`; RoPE's cos and sin come from a table made once; q and k rotate together.

Everything else is the model's own: its per-layer KV caches (`kv_caches`), its attention function (read from the
model's layers at every call, so `set_attention` applies, unless the call passes its own `attention`, as the
engine's runner does each step). Plain models only (nn.Linear projections); the copies are remade when the model's
weights, projections or blocks change.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minigpt.attention import AttentionFn
from minigpt.cache.contiguous import KVCache
from minigpt.engine.static_decode import MATRICES, fuse_weights
from minigpt.model import GPT, LayerCache

__all__ = ["FusedModel", "fusable", "generate_fused"]


PROJECTIONS = (("attn", "wq"), ("attn", "wk"), ("attn", "wv"), ("attn", "wo"), ("mlp", "w_gate"), ("mlp", "w_up"),
               ("mlp", "w_down"))                                  # each block's, in `fuse_weights`' order


def _projections(model: GPT) -> list[nn.Module]:
    return [getattr(getattr(b, part), name) for b in model.layers for part, name in PROJECTIONS] + [model.lm_head]


def _edges(model: GPT) -> list[tuple[nn.Module, str, nn.Module]]:
    """Every (parent, name, child) link on the paths from the model to its projections: the projections are the same
    modules as long as each parent's `_modules[name]` is still the same child."""
    edges = {}
    for path in ["layers"] + [f"layers.{i}.{part}.{name}" for i in range(len(model.layers))
                              for part, name in PROJECTIONS] + ["lm_head"]:
        parent = model
        for name in path.split("."):
            child = parent._modules[name]
            edges[id(parent), name] = (parent, name, child)
            parent = child
    return list(edges.values())


def fusable(model: GPT) -> bool:
    """Whether every projection is a plain nn.Linear (not quantized, sharded or wrapped by an adapter)."""
    return all(type(m) is nn.Linear for m in _projections(model))


def _version(t: Tensor) -> int | None:
    return None if t.is_inference() else t._version


class FusedModel:
    """Callable like the GPT it was made from: tokens (B, T), positions, kv_caches -> logits (B, T, vocab)."""

    def __init__(self, model: GPT) -> None:
        if not fusable(model):
            kinds = sorted({type(m).__name__ for m in _projections(model)} - {"Linear"})
            raise TypeError(f"FusedModel needs plain nn.Linear projections, got {', '.join(kinds)} "
                            "(quantized, sharded or adapted models run the model itself)")
        cfg = model.config
        self.model, self.config = model, cfg
        self.heads, self.kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self._fuse()

    def _fuse(self) -> None:
        """The K-major matrices and the RoPE table, as lab 01's `static_decode.fuse_weights` makes them."""
        w = fuse_weights(self.model.state_dict(), self.config)
        self.qkv, self.wo, self.gate_up, self.down = (w[key] for key in MATRICES)     # lists of one a layer
        self.head, self.cos, self.sin = w["head"], w["cos"], w["sin"]                  # (d, vocab), (S, D/2) x 2
        self._made_from = [(m._parameters, m.weight, _version(m.weight)) for m in _projections(self.model)]
        self._edges = _edges(self.model)

    def _stale(self) -> bool:
        """A block or projection replaced, or a weight replaced or changed in place, since the copies were made
        (weights made in inference mode keep no version counter: their in-place changes go unseen). Dictionary reads
        only: it runs before every step (nn.Module attribute reads cost several times more)."""
        return any(parent._modules.get(name) is not child for parent, name, child in self._edges) or \
            any(params.get("weight") is not w or _version(w) != version for params, w, version in self._made_from)

    def _rope(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate x (B, T, heads, D) at positions (T,) or (B, T), as `minigpt.model.apply_rope` does."""
        cos, sin = self.cos[positions][..., None, :], self.sin[positions][..., None, :]   # (B|., T, 1, D/2)
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)

    def _linear(self, x: Tensor, w: Tensor) -> Tensor:
        """x (..., K) @ w (K, N), w K-major (lab 12's `InvariantModel` fixes its reduction order)."""
        return x @ w

    @torch.inference_mode()
    def __call__(self, tokens: Tensor, positions: Tensor, kv_caches: Sequence[LayerCache] | None = None, *,
                 attention: AttentionFn | None = None) -> Tensor:
        """Logits (B, T, vocab); `attention`, if given, replaces every layer's attention function for this call (what
        `using_attention` does to the model, without touching it)."""
        if self._stale():
            self._fuse()
        H, Hkv, D = self.heads, self.kv_heads, self.head_dim
        eps = self.config.norm_eps
        x = self.model.tok_emb(tokens)                                                 # (B, T, d)
        B, T, d = x.shape
        for i, block in enumerate(self.model.layers):
            q, k, v = self._linear(F.rms_norm(x, (d,), block.attn_norm.weight, eps), self.qkv[i]).split(
                [H * D, Hkv * D, Hkv * D], dim=-1)
            qk = self._rope(torch.cat([q, k], dim=-1).view(B, T, H + Hkv, D), positions)
            q, k, v = qk[:, :, :H], qk[:, :, H:], v.view(B, T, Hkv, D)
            if kv_caches is not None:
                k, v = kv_caches[i].update(k, v)
            out = (attention or block.attn.attention)(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            x = x + self._linear(out.transpose(1, 2).reshape(B, T, H * D), self.wo[i])
            gate, up = self._linear(F.rms_norm(x, (d,), block.mlp_norm.weight, eps), self.gate_up[i]).chunk(2, dim=-1)
            x = x + self._linear(F.silu(gate) * up, self.down[i])
        return self._linear(F.rms_norm(x, (d,), self.model.norm.weight, eps), self.head)


@torch.inference_mode()
def generate_fused(model: GPT, prompt: Sequence[int], max_new_tokens: int, *,
                   fused: FusedModel | None = None) -> list[int]:
    """Greedy, exactly `max_new_tokens` tokens (no stop token), lab 01's loop on the fused model."""
    fused = fused or FusedModel(model)
    cache = KVCache.for_model(model, batch_size=1, max_seq_len=len(prompt) + max_new_tokens)
    tokens = torch.tensor([list(prompt)], device=model.device)
    out: list[int] = []
    while len(out) < max_new_tokens:
        token = fused(tokens, positions=cache.next_positions(tokens.shape[1]), kv_caches=cache)[:, -1].argmax(-1)
        out.append(int(token))
        tokens = token[:, None]
    return out
