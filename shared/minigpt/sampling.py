"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus), all seeded."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


# A temperature below float32's smallest normal number is treated as its limit, 0 (greedy): dividing float32 logits
# by it would divide by 0 (1e-300 rounds to 0.0 in float32) and sample from NaN.
GREEDY_BELOW = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k / top_p None means no filtering. `logprobs` (serving): None for
    none, k >= 0 for the sampled token's log-probability plus the k most likely tokens' (`token_logprobs`).

    Applied to a sequence's logits before all of that (serving; `minigpt.engine.logits_processing`): OpenAI's
    `presence_penalty` and `frequency_penalty` in [-2, 2], `logit_bias` ((token id, bias in [-100, 100]) pairs), and
    `constraint`, a `logits_processing.GrammarConstraint` the output must follow (None: free text)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    constraint: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0 or None, got {self.logprobs}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (math.isfinite(v) and -2 <= v <= 2):
                raise ValueError(f"{name} must be a finite number in [-2, 2], got {v}")
        for token, bias in self.logit_bias:
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids >= 0, got {token!r}")
            if not (math.isfinite(bias) and -100 <= bias <= 100):
                raise ValueError(f"logit_bias values must be finite numbers in [-100, 100], got {bias} for {token}")

    @property
    def processes_logits(self) -> bool:
        """Whether a sequence's logits change before sampling (penalties, bias or a grammar)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias or self.constraint is not None)

    @property
    def greedy(self) -> bool:
        """temperature 0, or so small that it is 0 in the limit (below GREEDY_BELOW, about 1.2e-38)."""
        return self.temperature < GREEDY_BELOW


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
        # Drop a token when the tokens before it already reach top_p; never the most likely one (a top_p so small
        # that it rounds to 0 in float32, e.g. 5e-324, would otherwise drop every token and leave NaN).
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop_sorted[..., 0] = False
        logits[drop_sorted.scatter(-1, order, drop_sorted)] = float("-inf")
    return logits


def sample_next(logits: Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> Tensor:
    """logits (B, V) -> next token ids (B,). Greedy if params.temperature == 0, else a seeded draw.

    The logits are shifted so that the largest is 0 before dividing by the temperature: softmax is unchanged, and a
    tiny temperature (1e-300) sends the others to -inf instead of overflowing to inf - inf = NaN, which is its limit,
    greedy. Non-finite logits (a broken model) raise ValueError rather than sampling from NaN."""
    logits = logits.float()
    if params.greedy:
        return logits.argmax(-1)
    top = logits.max(-1, keepdim=True).values
    if not torch.isfinite(top).all():
        raise ValueError("the logits are not finite (NaN or inf); cannot sample")
    scaled = (logits - top) / params.temperature
    probs = torch.softmax(filter_logits(scaled, params.top_k, params.top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def token_logprobs(logits: Tensor, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The model's log-probability of `token` and its `k` most likely tokens with theirs, from one row of raw
    logits (V,), before temperature and filtering (what vLLM returns by default as raw logprobs)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = torch.topk(logp, k) if k > 0 else None
    alts = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
    return float(logp[token]), alts


def make_generator(params: SamplingParams, device: torch.device | str | None = None) -> torch.Generator:
    """A torch.Generator seeded from params.seed, on the device the logits live on (None: torch's default device,
    as torch's factories do; pass the model's device)."""
    return torch.Generator(device=torch.get_default_device() if device is None else device).manual_seed(params.seed)
