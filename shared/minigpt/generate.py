"""The naive generation loop: every step re-runs the whole sequence (the baseline later labs beat).

Shared pieces that every generator in the course reuses, so they all stop and sample alike:
`check_request` (prompt must fit), `StopRule` (end-of-text, stop strings, budget) and
`minigpt.sampling.sample_next`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

import torch

from minigpt.model import GPT
from minigpt.sampling import SamplingParams, make_generator, sample_next
from minigpt.tokenizer import EOT_ID

FinishReason = Literal["stop_token", "stop_string", "length"]


@dataclass
class Generation:
    """New tokens (the stop token excluded, a stop string's tokens included) and why generation ended."""

    tokens: list[int]
    finish_reason: FinishReason
    prompt_tokens: int = 0


def check_request(model: GPT, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """Validate a generation request; returns the prompt as a list of ints.

    The whole sequence, prompt plus new tokens, must fit in the context (max_seq_len).
    """
    prompt = [int(t) for t in (prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt)]
    cfg = model.config
    if not prompt:
        raise ValueError("the prompt is empty; pass at least one token (e.g. [tokenizer.eot_token])")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if bad := [t for t in prompt if not 0 <= t < cfg.vocab_size]:
        raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {cfg.vocab_size})")
    if len(prompt) + max_new_tokens > cfg.max_seq_len:
        raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) = {len(prompt) + max_new_tokens} "
                         f"exceeds the context of {cfg.max_seq_len} tokens; shorten the prompt or ask for fewer tokens")
    return prompt


@dataclass
class StopRule:
    """Decides after each new token whether generation is over.

    stop_token_ids: tokens that end generation and are not returned (default: end-of-text).
    stop_strings: text that ends generation once it appears in the decoded output (needs a tokenizer).
    """

    max_new_tokens: int
    stop_token_ids: Sequence[int] = (EOT_ID,)
    stop_strings: Sequence[str] = ()
    tokenizer: object | None = None
    tokens: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.stop_strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer to decode the output; pass tokenizer=load_tokenizer()")

    def add(self, token: int) -> FinishReason | None:
        """Record one sampled token; return why generation stops, or None to go on."""
        if token in self.stop_token_ids:
            return "stop_token"
        self.tokens.append(token)
        if self.stop_strings:
            tail = self.tokenizer.decode(self.tokens[-64:])
            if any(s in tail for s in self.stop_strings):
                return "stop_string"
        if len(self.tokens) >= self.max_new_tokens:
            return "length"
        return None


@torch.inference_mode()
def generate_naive(model: GPT, prompt: Sequence[int], max_new_tokens: int, sampling: SamplingParams = SamplingParams(), *,
                   stop_token_ids: Sequence[int] = (EOT_ID,), stop_strings: Sequence[str] = (),
                   tokenizer: object | None = None) -> Generation:
    """Generate by re-running the model on the whole sequence for every new token: O(T) work per step."""
    ids = check_request(model, prompt, max_new_tokens)
    n_prompt = len(ids)
    stop = StopRule(max_new_tokens, stop_token_ids, stop_strings, tokenizer)
    generator = make_generator(sampling, model.device)
    reason: FinishReason | None = "length" if max_new_tokens == 0 else None
    while reason is None:
        logits = model(torch.tensor([ids], device=model.device))[:, -1]        # (1, V)
        token = int(sample_next(logits, sampling, generator))
        ids.append(token)
        reason = stop.add(token)
    return Generation(stop.tokens, reason, prompt_tokens=n_prompt)
