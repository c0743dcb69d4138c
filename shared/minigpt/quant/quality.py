"""Perplexity of a (quantized) model on a bounded, seeded subset of validation windows, optionally with a
quantized KV cache in the loop.

Perplexity alone hides small changes (a quantized model can gain on some tokens and lose on others), so
`fidelity` also compares the quantized model's next-token distribution with the full-precision model's on the
same tokens: the mean KL divergence KL(p_fp32 || p_quant) in nats per token and the top-1 agreement (the share of
positions where both pick the same most likely token).

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

__all__ = ["validation_subset", "perplexity", "fidelity"]


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


@torch.inference_mode()
def fidelity(model: GPT, reference: GPT, x: Tensor, y: Tensor, *, batch_size: int = 8) -> dict[str, float]:
    """{"perplexity", "kl", "top1"} of `model` on windows x -> y (N, T), against `reference` (the fp32 model):

    kl   = mean over positions of sum_v p_ref(v) (log p_ref(v) - log p(v))   (nats per token; 0 when identical)
    top1 = mean over positions of [argmax p == argmax p_ref]                 (1 when identical)
    """
    nll, kl, agree, count = 0.0, 0.0, 0, 0
    for i in range(0, len(x), batch_size):
        xb, yb = x[i:i + batch_size].to(model.device), y[i:i + batch_size].to(model.device)
        logp = F.log_softmax(model(xb).float(), -1).flatten(0, 1)
        logp_ref = F.log_softmax(reference(xb.to(reference.device)).float(), -1).flatten(0, 1).to(logp.device)
        nll += F.nll_loss(logp, yb.flatten(), reduction="sum").item()
        kl += F.kl_div(logp, logp_ref, log_target=True, reduction="sum").item()
        agree += int((logp.argmax(-1) == logp_ref.argmax(-1)).sum())
        count += yb.numel()
    return {"perplexity": math.exp(nll / count), "kl": kl / count, "top1": agree / count}
