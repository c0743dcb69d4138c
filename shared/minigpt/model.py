"""The mini-GPT: a small Llama-style decoder-only transformer.

    x = embed(tokens)
    for each layer:  x = x + Attention(RMSNorm(x), positions)      (RoPE on q and k, GQA)
                     x = x + SwiGLU(RMSNorm(x))
    logits = RMSNorm(x) @ W_embed^T                                (tied embeddings)

Three extension points let later labs plug in without forking this file:

* `kv_caches`: one object per layer with `update(k, v) -> (k_all, v_all)` (see `LayerCache`);
  positions must then be passed explicitly, since only the caller knows where the new tokens start.
* `attention`: a name from `minigpt.attention` ("naive", "sdpa") or any function (q, k, v) -> out;
  change it later with `model.set_attention(...)`.
* `make_linear(in_features, out_features, name) -> nn.Module`: builds every projection inside the
  layers (quantized or tensor-parallel linears), `name` being e.g. "layers.3.attn.wq".
"""

from __future__ import annotations

import math
from typing import Callable, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minigpt.attention import AttentionFn, resolve_attention
from minigpt.config import Llama3RopeScaling, ModelConfig

LinearFactory = Callable[[int, int, str], nn.Module]


def default_linear(in_features: int, out_features: int, name: str) -> nn.Module:
    """A bias-free nn.Linear (the default `make_linear`)."""
    return nn.Linear(in_features, out_features, bias=False)


class LayerCache(Protocol):
    """What the model needs from a per-layer KV cache."""

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new keys/values (B, T, Hkv, D); return all of them so far, (B, length + T, Hkv, D)."""
        ...


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: Llama3RopeScaling | None = None,
                  device: torch.device | str | None = None) -> Tensor:
    """Rotation frequencies (head_dim/2,) in float32: theta^(-2i/head_dim), rescaled by Llama 3.1's rule if given."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    if scaling is None:
        return inv_freq
    wavelength = 2 * math.pi / inv_freq
    context = scaling.original_max_position_embeddings
    s = ((context / wavelength - scaling.low_freq_factor)
         / (scaling.high_freq_factor - scaling.low_freq_factor)).clamp(0.0, 1.0)   # 0: long waves, 1: short
    return (1 - s) * inv_freq / scaling.factor + s * inv_freq


def rope_angles(positions: Tensor, head_dim: int, theta: float, scaling: Llama3RopeScaling | None = None) -> Tensor:
    """Rotation angles (..., T, head_dim/2): angle[p, i] = p * inv_freq[i] (see `rope_inv_freq`), in float32."""
    return positions.float()[..., None] * rope_inv_freq(head_dim, theta, scaling, positions.device)


def apply_rope(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate each (x[i], x[i + D/2]) pair of x (B, T, H, D) by angles (T, D/2) or (B, T, D/2).

    The dot product of two rotated vectors depends only on the difference of their positions.
    """
    if angles.ndim == 2:
        angles = angles[None]
    cos, sin = angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]   # (B|1, T, 1, D/2)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, make_linear: LinearFactory, attention: AttentionFn) -> None:
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.head_dim = hd
        self.wq = make_linear(d, cfg.n_heads * hd, f"layers.{layer}.attn.wq")
        self.wk = make_linear(d, cfg.n_kv_heads * hd, f"layers.{layer}.attn.wk")
        self.wv = make_linear(d, cfg.n_kv_heads * hd, f"layers.{layer}.attn.wv")
        self.wo = make_linear(cfg.n_heads * hd, d, f"layers.{layer}.attn.wo")
        self.attention = attention

    def forward(self, x: Tensor, angles: Tensor, kv_cache: LayerCache | None = None) -> Tensor:
        B, T, _ = x.shape
        # -1 heads: a tensor-parallel shard holds only some of them.
        q = apply_rope(self.wq(x).view(B, T, -1, self.head_dim), angles)
        k = apply_rope(self.wk(x).view(B, T, -1, self.head_dim), angles)
        v = self.wv(x).view(B, T, -1, self.head_dim)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        out = self.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))   # (B, Hq, T, D)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    """w_down(silu(w_gate x) * w_up x)."""

    def __init__(self, cfg: ModelConfig, layer: int, make_linear: LinearFactory) -> None:
        super().__init__()
        self.w_gate = make_linear(cfg.d_model, cfg.d_ff, f"layers.{layer}.mlp.w_gate")
        self.w_up = make_linear(cfg.d_model, cfg.d_ff, f"layers.{layer}.mlp.w_up")
        self.w_down = make_linear(cfg.d_ff, cfg.d_model, f"layers.{layer}.mlp.w_down")

    def forward(self, x: Tensor) -> Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, make_linear: LinearFactory, attention: AttentionFn) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer, make_linear, attention)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg, layer, make_linear)

    def forward(self, x: Tensor, angles: Tensor, kv_cache: LayerCache | None = None) -> Tensor:
        x = x + self.attn(self.attn_norm(x), angles, kv_cache)
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, config: ModelConfig, *, make_linear: LinearFactory = default_linear,
                 attention: str | AttentionFn = "sdpa") -> None:
        super().__init__()
        self.config = config
        attn_fn = resolve_attention(attention)
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config, i, make_linear, attn_fn) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False) if config.tie_embeddings \
            else make_linear(config.d_model, config.vocab_size, "lm_head")
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():      # scale residual-branch outputs (GPT-2 style)
            if name.endswith(("attn.wo.weight", "mlp.w_down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / (2 * config.n_layers) ** 0.5)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def device(self) -> torch.device:
        return self.tok_emb.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_emb.weight.dtype

    def num_parameters(self) -> int:
        """Distinct parameters (a tied embedding counts once)."""
        return sum(p.numel() for p in self.parameters())

    def set_attention(self, attention: str | AttentionFn) -> None:
        """Swap the attention implementation in every layer."""
        fn = resolve_attention(attention)
        for block in self.layers:
            block.attn.attention = fn

    def forward(self, tokens: Tensor, positions: Tensor | None = None,
                kv_caches: Sequence[LayerCache] | None = None) -> Tensor:
        """tokens (B, T) int64 -> logits (B, T, vocab_size) in the model's dtype.

        positions: (T,) or (B, T) absolute positions of the tokens; default 0..T-1, which is only
        right without a cache, so it is required when `kv_caches` is given.
        """
        if not isinstance(tokens, Tensor):
            raise TypeError(f"tokens must be a torch.Tensor of shape (batch, seq), got {type(tokens).__name__}; "
                            "wrap a list with torch.tensor([ids])")
        if positions is None:
            if kv_caches is not None:
                raise ValueError("pass `positions` with `kv_caches`: the new tokens start at the cache's length, not at 0")
            positions = torch.arange(tokens.shape[-1], device=tokens.device)
        if kv_caches is not None and len(kv_caches) != len(self.layers):
            raise ValueError(f"got {len(kv_caches)} layer caches for a model with {len(self.layers)} layers")
        if not (torch.compiler.is_compiling() or _is_capturing(tokens)):
            self._check_inputs(tokens, positions)
        angles = rope_angles(positions, self.config.head_dim, self.config.rope_theta, self.config.rope_scaling)
        x = self.tok_emb(tokens)
        for i, block in enumerate(self.layers):
            x = block(x, angles, None if kv_caches is None else kv_caches[i])
        return self.lm_head(self.norm(x))

    def _check_inputs(self, tokens: Tensor, positions: Tensor) -> None:
        """Clear errors for the usual mistakes (skipped while compiling or capturing a CUDA graph)."""
        cfg = self.config
        if tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"tokens must be an integer tensor (torch.long), got dtype {tokens.dtype}")
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (batch, seq), got {tuple(tokens.shape)}; add a batch dimension with tokens[None]")
        if tokens.device != self.device:
            raise ValueError(f"tokens are on {tokens.device} but the model is on {self.device}; move them with tokens.to(model.device)")
        if positions.shape[-1] != tokens.shape[1] or positions.ndim not in (1, 2):
            raise ValueError(f"positions {tuple(positions.shape)} do not match tokens {tuple(tokens.shape)}; expected (T,) or (B, T)")
        if tokens.shape[1] > cfg.max_seq_len:
            raise ValueError(f"sequence of {tokens.shape[1]} tokens is longer than the context (max_seq_len={cfg.max_seq_len}); "
                             "truncate the prompt or generate fewer tokens")
        # Value checks read tensors back to the host: a sync per step on a GPU, so they run on CPU only
        # (generators validate prompt ids on the host before any GPU work, see minigpt.generate.check_request).
        if tokens.numel() and tokens.device.type == "cpu":
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < 0 or hi >= cfg.vocab_size:
                raise ValueError(f"token id {lo if lo < 0 else hi} is outside the vocabulary [0, {cfg.vocab_size}); "
                                 "was the text encoded with the course tokenizer (minigpt.load_tokenizer)?")
            p_lo, p_hi = int(positions.min()), int(positions.max())
            if p_lo < 0 or p_hi >= cfg.max_seq_len:
                raise ValueError(f"position {p_lo if p_lo < 0 else p_hi} is outside the context [0, {cfg.max_seq_len}); "
                                 "the sequence, prompt plus generated tokens, must fit in max_seq_len")


def _is_capturing(t: Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()
