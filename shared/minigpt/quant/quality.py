"""Perplexity of a (quantized) model on a bounded, seeded subset of validation windows, optionally with a
quantized KV cache in the loop.

Evaluating the whole validation split is slow on a laptop CPU; the same fixed subset for every format keeps
the comparison fair (paired) while the absolute values carry some sampling noise.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from minigpt.model import GPT
from minigpt.quant.kv_cache import QuantizedKVCache
from minigpt.training.data import eval_windows, load_tokens

__all__ = ["validation_subset", "perplexity"]


def validation_subset(n_windows: int = 16, seq_len: int = 256, seed: int = 0) -> tuple[Tensor, Tensor]:
    """n_windows non-overlapping validation windows (inputs, targets), each (n_windows, seq_len), chosen by seed."""
    x, y = eval_windows(load_tokens("val"), seq_len)
    if n_windows > len(x):
        raise ValueError(f"asked for {n_windows} windows but the validation split has {len(x)} of {seq_len} tokens")
    idx = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[:n_windows].sort().values
    return x[idx], y[idx]


@torch.inference_mode()
def perplexity(model: GPT, x: Tensor, y: Tensor, *, kv_format: str | None = None, batch_size: int = 8) -> float:
    """exp(mean next-token cross-entropy) of `model` on windows x -> y (N, T).

    kv_format ("int8", "fp8_e4m3", "fp8_e5m2"): keys and values go through a QuantizedKVCache, so attention
    reads their dequantized values, as it would during cached decoding.
    """
    total, count = 0.0, 0
    for i in range(0, len(x), batch_size):
        xb, yb = x[i:i + batch_size].to(model.device), y[i:i + batch_size].to(model.device)
        if kv_format is None:
            logits = model(xb)
        else:
            cache = QuantizedKVCache.for_model(model, batch_size=len(xb), max_seq_len=xb.shape[1], fmt=kv_format)
            logits = model(xb, positions=cache.next_positions(xb.shape[1]), kv_caches=cache)
        total += F.cross_entropy(logits.float().flatten(0, 1), yb.flatten(), reduction="sum").item()
        count += yb.numel()
    return math.exp(total / count)
