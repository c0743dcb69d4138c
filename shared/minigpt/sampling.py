"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus), all seeded."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k / top_p None means no filtering."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Set to -inf every logit outside the top-k, then outside the smallest set whose probability >= top_p.

    logits (B, V) float -> (B, V). The most likely token always survives.
    """
    logits = logits.clone()
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits[logits < kth] = float("-inf")
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens before it already reach top_p.
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        logits[drop_sorted.scatter(-1, order, drop_sorted)] = float("-inf")
    return logits


def sample_next(logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> Tensor:
    """logits (B, V) -> next token ids (B,). Greedy if params.temperature == 0, else a seeded draw."""
    logits = logits.float()
    if params.greedy:
        return logits.argmax(-1)
    probs = torch.softmax(filter_logits(logits / params.temperature, params.top_k, params.top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch.Generator seeded from params.seed, on the device the logits live on."""
    return torch.Generator(device=device).manual_seed(params.seed)
