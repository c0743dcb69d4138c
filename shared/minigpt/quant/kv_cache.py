"""A quantized KV cache: keys and values stored as INT8 or FP8 codes with one scale per token and KV head.

    cache = QuantizedKVCache.for_model(model, fmt="int8")          # or "fp8_e4m3", "fp8_e5m2"
    logits = model(tokens, positions=cache.next_positions(T), kv_caches=cache)

Same protocol as lab 01's `minigpt.cache.contiguous.KVCache`: `update(k, v)` writes (B, T, Hkv, D) at
[length, length + T) and returns everything so far, dequantized to the model's dtype for attention.

Scales: for every written position and KV head, s = max over head_dim |k| / grid_max (INT8: 127, FP8: the
format's max). Heads differ in range by orders of magnitude (and RoPE makes keys' ranges differ by head),
so a scale shared across heads rounds the small heads to a handful of levels; per-head costs
Hkv float32 scales per token per tensor, i.e. 4 / head_dim extra bytes per element.

Memory per token and layer: 2 * Hkv * (head_dim * 1 byte + 4 bytes of scale) instead of 2 * Hkv * head_dim * 4
(fp32) or * 2 (bf16).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from minigpt.cache.contiguous import KVCache, LayerKVCache
from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.quant.formats import FP8_DTYPES, fp8_format

__all__ = ["KV_FORMATS", "quantize_kv", "dequantize_kv", "QuantizedLayerKVCache", "QuantizedKVCache"]

KV_FORMATS = {"int8": torch.int8, "fp8_e4m3": FP8_DTYPES["e4m3"], "fp8_e5m2": FP8_DTYPES["e5m2"]}


def _grid_max(code_dtype: torch.dtype) -> float:
    return 127.0 if code_dtype == torch.int8 else fp8_format(code_dtype)["max"]


def quantize_kv(x: Tensor, code_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """x (B, T, H, D) -> (codes (B, T, H, D) in code_dtype, float32 scales (B, T, H)): one scale per token and head."""
    gmax = _grid_max(code_dtype)
    x32 = x.float()
    scale = (x32.abs().amax(-1) / gmax).clamp(min=1e-12)
    y = (x32 / scale[..., None]).clamp(-gmax, gmax)
    codes = torch.round(y).to(torch.int8) if code_dtype == torch.int8 else y.to(code_dtype)
    return codes, scale


def dequantize_kv(codes: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    return (codes.float() * scale[..., None]).to(dtype)


class QuantizedLayerKVCache(LayerKVCache):
    """One layer's K and V as codes (B, max_seq_len, Hkv, D) plus scales (B, max_seq_len, Hkv); lab 01's
    `LayerKVCache` with code tensors, so shapes, length and overflow behave the same."""

    def __init__(self, batch_size: int, max_seq_len: int, n_kv_heads: int, head_dim: int, *, fmt: str = "int8",
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        if fmt not in KV_FORMATS:
            raise ValueError(f"unknown KV-cache format {fmt!r}; choose one of {list(KV_FORMATS)}")
        super().__init__(batch_size, max_seq_len, n_kv_heads, head_dim, dtype=KV_FORMATS[fmt], device=device)
        self.fmt, self.dtype = fmt, dtype          # dtype: what update() returns (dequantized)
        self.k_scale = torch.zeros(self.k.shape[:3], dtype=torch.float32, device=device)
        self.v_scale = torch.zeros(self.v.shape[:3], dtype=torch.float32, device=device)

    @property
    def nbytes(self) -> int:
        """Bytes allocated: codes and scales of K and V for the whole capacity."""
        return self.k.nbytes + self.v.nbytes + self.k_scale.nbytes + self.v_scale.nbytes

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Quantize and store k, v (B, T, Hkv, D) at [length, length + T); return all positions so far,
        dequantized to `dtype`. Bad shapes or an overflow raise ValueError and leave the cache untouched."""
        expected = (self.batch_size, k.shape[1] if k.ndim == 4 else -1, self.n_kv_heads, self.head_dim)
        if k.shape != v.shape or tuple(k.shape) != expected:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be (batch={self.batch_size}, T, "
                             f"n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim})")
        start, end = self.length, self.length + k.shape[1]
        if end > self.max_seq_len:
            raise ValueError(f"KV cache overflow: writing {k.shape[1]} positions at position {start} needs {end} "
                             f"positions but the cache holds max_seq_len={self.max_seq_len}")
        if not (torch.isfinite(k).all() and torch.isfinite(v).all()):
            raise ValueError("keys or values hold NaN or infinite entries; refusing to quantize them into the cache")
        self.k[:, start:end], self.k_scale[:, start:end] = quantize_kv(k, self.k.dtype)
        self.v[:, start:end], self.v_scale[:, start:end] = quantize_kv(v, self.v.dtype)
        self.length = end
        return (dequantize_kv(self.k[:, :end], self.k_scale[:, :end], self.dtype),
                dequantize_kv(self.v[:, :end], self.v_scale[:, :end], self.dtype))

    def __repr__(self) -> str:
        return (f"QuantizedLayerKVCache({self.fmt}, length={self.length}/{self.max_seq_len}, "
                f"kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, {self.nbytes} bytes)")


class QuantizedKVCache(KVCache):
    """All layers' quantized caches; `length`, `next_positions`, `reset` and `nbytes` as in KVCache."""

    def __init__(self, layers: Sequence[QuantizedLayerKVCache]) -> None:
        super().__init__(layers)  # type: ignore[arg-type]

    @classmethod
    def for_model(cls, model: GPT | ModelConfig, batch_size: int = 1, max_seq_len: int | None = None, *,
                  fmt: str = "int8", dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> "QuantizedKVCache":
        is_config = isinstance(model, ModelConfig)     # a model: anything with .config, .dtype, .device (a handle too)
        cfg = model if is_config else model.config
        dtype = dtype or (torch.float32 if is_config else model.dtype)
        device = device or ("cpu" if is_config else model.device)
        max_seq_len = cfg.max_seq_len if max_seq_len is None else max_seq_len
        return cls([QuantizedLayerKVCache(batch_size, max_seq_len, cfg.n_kv_heads, cfg.head_dim, fmt=fmt,
                                          dtype=dtype, device=device) for _ in range(cfg.n_layers)])
