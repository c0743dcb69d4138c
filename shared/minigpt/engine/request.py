"""Requests and sequences (lab 03): what a client asks for, and the engine's running state for it.

    req = Request("r1", prompt=[...], max_new_tokens=64, arrival_time=0.25)
    seq = Sequence(req)                  # status "waiting"; seq.tokens == prompt
    seq.num_computed                     # tokens whose K/V are in the paged cache
    seq.append_token(tok, now=1.0)       # a sampled token: output grows, StopRule decides the end

A sequence's tokens are prompt + output. `num_computed` trails `num_tokens` by the prompt while it is
prefilled (possibly in chunks), then by exactly one token (the last sampled one) while it decodes.
Preemption by recomputation frees the cache and sets `num_computed` back to 0: the output tokens stay,
and the next prefill recomputes prompt + output, so generation continues where it stopped.

Overlap scheduling (lab 12, `engine.overlap`) schedules the next step before this step's token is known: the
sequence then holds a PLACEHOLDER as its last token (`append_placeholder`), counted in `num_tokens` and read by
`token_slice`, never in `output_tokens`, until `resolve_placeholder` puts the sampled token in its place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Hashable

import torch

from minigpt.engine.logits_processing import LogitsProcessor
from minigpt.generate import StopRule
from minigpt.sampling import SamplingParams, make_generator
from minigpt.tokenizer import EOT_ID

__all__ = ["Request", "Sequence", "SequenceStatus", "PLACEHOLDER"]

PLACEHOLDER = -1          # the token of a step still running (overlap scheduling); no real token id is negative


class SequenceStatus(str, Enum):
    WAITING = "waiting"        # arrived, never scheduled
    RUNNING = "running"        # holds blocks, scheduled every step
    PREEMPTED = "preempted"    # evicted (blocks freed), back at the front of the queue with its output
    FINISHED = "finished"      # stopped (stop token, stop string, length) or aborted


@dataclass(frozen=True)
class Request:
    """One generation request. `max_new_tokens` is the token budget (>= 1); stop rules as `generate_naive`."""

    request_id: Hashable
    prompt: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    arrival_time: float = 0.0
    stop_token_ids: tuple[int, ...] = (EOT_ID,)
    stop_strings: tuple[str, ...] = ()
    tokenizer: object | None = None

    def __post_init__(self) -> None:
        prompt = self.prompt.tolist() if isinstance(self.prompt, torch.Tensor) else self.prompt
        object.__setattr__(self, "prompt", tuple(int(t) for t in prompt))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        if not self.prompt:
            raise ValueError(f"request {self.request_id!r}: the prompt is empty; pass at least one token")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not (isinstance(self.arrival_time, (int, float)) and math.isfinite(self.arrival_time) and self.arrival_time >= 0):
            raise ValueError(f"request {self.request_id!r}: arrival_time must be a finite number >= 0 seconds, "
                             f"got {self.arrival_time!r}")


class Sequence:
    """The engine's state for one request: tokens, cache progress, status and timestamps (for metrics)."""

    def __init__(self, request: Request, device: torch.device | str = "cpu") -> None:
        self.request = request
        self.status = SequenceStatus.WAITING
        self.stop = StopRule(request.max_new_tokens, request.stop_token_ids, request.stop_strings, request.tokenizer)
        self.generator = make_generator(request.sampling, device)
        self.logits_processor = LogitsProcessor.for_params(request.sampling)   # None: samples from the raw logits
        self.num_computed = 0
        self.finish_reason: str | None = None
        self.first_token_time: float | None = None
        self.token_times: list[float] = []        # time each output token was produced
        self.finish_time: float | None = None
        self.num_preemptions = 0
        self.pending = False                      # the last token is a PLACEHOLDER (overlap scheduling)

    @property
    def seq_id(self) -> Hashable:
        return self.request.request_id

    @property
    def arrival_time(self) -> float:
        return self.request.arrival_time

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt

    @property
    def output_tokens(self) -> list[int]:
        return self.stop.tokens

    @property
    def tokens(self) -> list[int]:
        return list(self.request.prompt) + self.stop.tokens + [PLACEHOLDER] * self.pending

    def token_slice(self, start: int, end: int) -> list[int]:
        """tokens[start:end] without building the whole list (a decode step reads one token)."""
        p = len(self.request.prompt)
        out = self.stop.tokens + [PLACEHOLDER] if self.pending else self.stop.tokens
        return list(self.request.prompt[start:end]) + out[max(start - p, 0):max(end - p, 0)]

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt) + len(self.stop.tokens) + self.pending

    @property
    def num_remaining(self) -> int:
        """Tokens still to push through the model before the next token can be sampled."""
        return self.num_tokens - self.num_computed

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token: int, now: float) -> str | None:
        """Record a sampled token at time `now`; returns why the sequence stops, or None."""
        reason = self.stop.add(int(token))
        if self.first_token_time is None:
            self.first_token_time = now
        if reason != "stop_token":          # the stop token itself is not part of the output
            self.token_times.append(now)
        return reason

    def append_placeholder(self) -> str | None:
        """The token of a step still running, value unknown (overlap scheduling): "length" if it will be the last
        one the request may have, else None (a stop token or string is known only once it is resolved)."""
        if self.pending:
            raise ValueError(f"sequence {self.seq_id!r} already waits for a token: resolve it first")
        self.pending = True
        return "length" if len(self.stop.tokens) + 1 >= self.request.max_new_tokens else None

    def resolve_placeholder(self, token: int, now: float) -> str | None:
        """Put the sampled token in the placeholder's place; returns why the sequence stops, or None
        (`append_token`'s rules)."""
        if not self.pending:
            raise ValueError(f"sequence {self.seq_id!r} has no placeholder to resolve")
        self.pending = False
        return self.append_token(token, now)

    def __repr__(self) -> str:
        return (f"Sequence({self.seq_id!r}, {self.status.value}, prompt={len(self.prompt)}, "
                f"output={len(self.output_tokens)}, computed={self.num_computed})")
