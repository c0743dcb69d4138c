"""Model quality on the validation split: loss, perplexity, and draft/target greedy agreement."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from minigpt.training.data import eval_windows, load_tokens
from minigpt.model import GPT


@torch.inference_mode()
def validation_loss(model: GPT, seq_len: int | None = None, max_windows: int | None = None, batch_size: int = 8) -> dict[str, float]:
    """Mean next-token cross-entropy (nats) over non-overlapping validation windows; perplexity = exp(loss)."""
    seq_len = seq_len or model.config.max_seq_len
    x, y = eval_windows(load_tokens("val"), seq_len, max_windows)
    total = 0.0
    for i in range(0, len(x), batch_size):
        logits = model(x[i:i + batch_size].to(model.device)).float()
        total += F.cross_entropy(logits.flatten(0, 1), y[i:i + batch_size].flatten().to(model.device), reduction="sum").item()
    loss = total / y.numel()
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": y.numel()}


@torch.inference_mode()
def greedy_agreement(draft: GPT, target: GPT, seq_len: int | None = None, max_windows: int | None = None, batch_size: int = 8) -> float:
    """Fraction of validation positions where argmax(draft logits) == argmax(target logits), teacher-forced.

    Under greedy speculative decoding this is the chance that one drafted token is accepted.
    """
    seq_len = seq_len or min(draft.config.max_seq_len, target.config.max_seq_len)
    x, _ = eval_windows(load_tokens("val"), seq_len, max_windows)
    same = 0
    for i in range(0, len(x), batch_size):
        xb = x[i:i + batch_size].to(target.device)
        same += (draft(xb).argmax(-1) == target(xb).argmax(-1)).sum().item()
    return same / x.numel()
