"""Naive serving (lab 08's baseline): ONE request at a time, first come first served, through lab 01's
contiguous KV cache: a prefill over the prompt, then one-token decode steps, exactly `generate_kv_cache`.

Same interface as `LLMEngine` (add_request / step / abort / stats / generate), so the same server runs
either (`python -m minigpt.serving --engine naive`). Each step pushes ONE token of ONE request through
the model: every other request waits in the queue, which is what continuous batching removes.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import torch

from minigpt.cache.contiguous import KVCache
from minigpt.engine.logits_processing import LogitsProcessor
from minigpt.generate import StopRule
from minigpt.model import GPT
from minigpt.sampling import SamplingParams, make_generator, sample_next, token_logprobs
from minigpt.serving.base import EngineBase
from minigpt.serving.outputs import EngineStats, RequestOutput, TokenLogprob, openai_finish_reason
from minigpt.tokenizer import stop_token_ids

__all__ = ["NaiveEngine"]

log = logging.getLogger(__name__)


@dataclass
class _Job:
    request_id: Hashable
    prompt: list[int]
    sampling: SamplingParams
    stop: StopRule
    generator: torch.Generator
    adapter: int = -1
    processor: LogitsProcessor | None = None      # penalties, logit_bias, grammar (None: the raw logits)


class NaiveEngine(EngineBase):
    """One request at a time on a contiguous KV cache of the model's whole context (batch 1)."""

    def __init__(self, model: GPT, *, tokenizer: object | None = None, model_name: str = "minigpt",
                 adapter_names: Sequence[str] = (), clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(model.eval(), tokenizer=tokenizer, model_name=model_name, adapter_names=adapter_names,
                         clock=clock)
        self.cache = KVCache.for_model(self.model, batch_size=1, max_seq_len=self.max_model_len)
        self.queue: deque[_Job] = deque()
        self.current: _Job | None = None

    @classmethod
    def from_checkpoint(cls, name: str = "target", *, max_model_len: int | None = None, **kwargs: object) -> "NaiveEngine":
        """A course checkpoint or a Hugging Face folder, as `LLMEngine.from_checkpoint`."""
        from minigpt.checkpoint import load_model
        from minigpt.tokenizer import tokenizer_for
        kwargs.setdefault("tokenizer", tokenizer_for(name))
        kwargs.setdefault("model_name", str(name))
        return cls(load_model(name, max_seq_len=max_model_len), **kwargs)

    def _enqueue(self, request_id: Hashable, prompt: list[int], max_tokens: int, sampling: SamplingParams,
                 stop: tuple[str, ...], adapter: int, arrival_time: float) -> None:
        rule = StopRule(max_tokens, stop_token_ids(self.tokenizer), stop, self.tokenizer if stop else None)
        self.queue.append(_Job(request_id, prompt, sampling, rule, make_generator(sampling, self.model.device), adapter,
                               LogitsProcessor.for_params(sampling)))

    def _abort(self, request_id: Hashable) -> None:
        if self.current is not None and self.current.request_id == request_id:
            self.current = None
            return
        self.queue = deque(j for j in self.queue if j.request_id != request_id)

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Prefill the next queued request (and sample its first token), or decode one token of the current one.
        If the step fails (the request's sampling raises, say), that request alone ends: "abort" with `error`."""
        if self.current is None:
            if not self.queue:
                return []
            self.current = self.queue.popleft()
            self.cache.reset()
            tokens = self.current.prompt
        else:
            tokens = self.current.stop.tokens[-1:]
        job = self.current
        try:
            x = torch.tensor([tokens], device=self.model.device)
            logits = self.model(x, positions=self.cache.next_positions(x.shape[1]), kv_caches=self.cache)[:, -1]
            adjusted = logits if job.processor is None else job.processor(logits[0], job.stop.tokens)[None]
            token = int(sample_next(adjusted, job.sampling, job.generator))
        except Exception as err:                          # noqa: BLE001  (this request's failure, nobody else's)
            log.warning("request %r failed in an engine step: %s", job.request_id, err)
            return [self.abort(job.request_id, f"{type(err).__name__}: {err}")]
        self.num_steps += 1
        if job.sampling.logprobs is not None:
            self._record_logprob(job.request_id, TokenLogprob(token, *token_logprobs(logits[0], token,
                                                                                      job.sampling.logprobs)))
        before = len(job.stop.tokens)
        reason = job.stop.add(token)
        new = job.stop.tokens[before:]
        if reason is not None:
            self.current = None
        return [self._output(job.request_id, new, None if reason is None else openai_finish_reason(reason), self.now())]

    def has_unfinished(self) -> bool:
        return self.current is not None or bool(self.queue)

    def stats(self) -> EngineStats:
        running = int(self.current is not None)
        return EngineStats(running, len(self.queue), 0, 0, 0.0, 0, self.num_steps, self.num_finished,
                           self.num_generated_tokens, running, running)
