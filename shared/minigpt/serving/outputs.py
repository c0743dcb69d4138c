"""What the engines return (lab 08): per-step outputs, offline completions and engine statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Literal

__all__ = ["FinishReason", "RequestOutput", "TokenLogprob", "Completion", "EngineStats", "openai_finish_reason"]

FinishReason = Literal["stop", "length", "abort"]


def openai_finish_reason(reason: str) -> FinishReason:
    """The engine's stop rules ("stop_token", "stop_string", "length", "abort") in OpenAI's words."""
    if reason in ("stop_token", "stop_string", "stop"):
        return "stop"
    if reason in ("length", "abort"):
        return reason
    raise ValueError(f"unknown finish reason {reason!r}")


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability under the model (raw logits, before temperature and filtering) and the
    `k` most likely tokens with theirs (k = SamplingParams.logprobs)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class RequestOutput:
    """One request's progress in one engine step.

    new_token_ids: tokens sampled in this step (usually one; none for an abort or a held-back stop token).
    text: the text delta; concatenating every delta of a request gives exactly its completion text
    (a trailing partial UTF-8 character is held back until it is complete).
    Times are seconds on the engine's clock: arrival, first token, and this step's token time.
    finish_reason "abort": stopped before its end, by a client (abort) or because this request's own step failed;
    then `error` says what failed (None for a client's abort). `logprobs`: one TokenLogprob per new token, when the
    request asked for them (SamplingParams.logprobs), else None.
    """

    request_id: Hashable
    new_token_ids: list[int]
    text: str
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    token_time: float | None = None
    itl: float | None = None            # time since this request's previous token (None for the first)
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time


@dataclass
class Completion:
    """An offline completion (like vLLM's RequestOutput from LLM.generate)."""

    request_id: Hashable
    text: str
    token_ids: list[int]
    num_prompt_tokens: int
    num_completion_tokens: int
    finish_reason: FinishReason
    ttft: float
    e2e: float
    token_times: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine: batch, queue, KV pool, prefix cache and counters since start."""

    num_running: int
    num_waiting: int
    num_blocks: int
    num_blocks_used: int
    prefix_cache_hit_rate: float
    num_preemptions: int
    num_steps: int = 0
    num_finished: int = 0
    num_generated_tokens: int = 0
    last_batch_size: int = 0
    last_batched_tokens: int = 0
    prefix_cache_queried_tokens: int = 0      # tokens looked up in the prefix cache on admission
    prefix_cache_hit_tokens: int = 0          # of which found (hit rate = hit / queried)

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use (cached-but-free prefix blocks count as free)."""
        return self.num_blocks_used / self.num_blocks if self.num_blocks else 0.0
