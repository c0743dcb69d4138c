"""What every serving engine shares (lab 08): request validation, per-request output bookkeeping and the
offline `generate`. `LLMEngine` (continuous batching) and `NaiveEngine` (one request at a time) subclass it,
so the server, the async wrapper and the benchmarks drive either through the same interface:

    engine.add_request(request_id, prompt_ids, max_tokens, sampling, stop=(), adapter=-1)
    engine.step() -> list[RequestOutput]      engine.abort(request_id) -> RequestOutput | None
    engine.has_unfinished()                   engine.stats() -> EngineStats
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.serving.detokenizer import IncrementalDetokenizer
from minigpt.serving.outputs import Completion, EngineStats, RequestOutput, TokenLogprob

__all__ = ["EngineBase", "Prompt"]

Prompt = str | Sequence[int]


@dataclass
class _Tracked:
    """The engine's per-request view for outputs: what was already emitted, and when."""

    detok: IncrementalDetokenizer | None
    num_prompt_tokens: int
    arrival_time: float
    num_emitted: int = 0
    admitted: bool = False
    num_cached_tokens: int = 0
    first_token_time: float | None = None
    last_token_time: float | None = None
    token_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None      # one per sampled token, when the request asked for them


class EngineBase(ABC):
    """Validation and output bookkeeping; subclasses schedule and run the model."""

    def __init__(self, model: GPT, *, tokenizer: object | None = None, model_name: str = "minigpt",
                 adapter_names: Sequence[str] = (), clock: Callable[[], float] = time.perf_counter) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.adapter_names = tuple(adapter_names)
        self.max_model_len = model.config.max_seq_len
        self._clock = clock
        self._t0 = clock()
        self._tracked: dict[Hashable, _Tracked] = {}
        self.num_finished = 0
        self.num_generated_tokens = 0
        self.num_steps = 0

    # --- subclass interface ------------------------------------------------------------------------

    @abstractmethod
    def _enqueue(self, request_id: Hashable, prompt: list[int], max_tokens: int, sampling: SamplingParams,
                 stop: tuple[str, ...], adapter: int, arrival_time: float) -> None: ...

    @abstractmethod
    def _abort(self, request_id: Hashable) -> None: ...

    @abstractmethod
    def step(self) -> list[RequestOutput]: ...

    @abstractmethod
    def has_unfinished(self) -> bool: ...

    @abstractmethod
    def stats(self) -> EngineStats: ...

    # --- requests ----------------------------------------------------------------------------------

    def now(self) -> float:
        """Seconds since the engine was built (the clock of every timestamp it reports)."""
        return self._clock() - self._t0

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; build the engine with tokenizer=load_tokenizer() "
                                 "or pass token ids")
            return list(self.tokenizer.encode(prompt, disallowed_special=()))      # "<|endoftext|>" in text is text
        return [int(t) for t in prompt]

    def validate(self, request_id: Hashable, prompt: Prompt, max_tokens: int, sampling: SamplingParams = SamplingParams(),
                 *, stop: Sequence[str] = (), adapter: int = -1) -> list[int]:
        """The prompt's token ids, or ValueError naming what is wrong with the request (nothing is changed)."""
        if request_id in self._tracked:
            raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")
        ids = self.encode(prompt)
        vocab = self.model.config.vocab_size
        if not ids:
            raise ValueError("the prompt is empty; pass at least one token")
        if bad := [t for t in ids if not 0 <= t < vocab]:
            raise ValueError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab})")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if len(ids) + max_tokens > self.max_model_len:
            raise ValueError(f"the prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) = {len(ids) + max_tokens} "
                             f"exceeds the model's context of {self.max_model_len} tokens")
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        if bad := [t for t, _ in sampling.logit_bias if t >= vocab]:
            raise ValueError(f"logit_bias token id {bad[0]} is outside the vocabulary [0, {vocab})")
        if stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode the output")
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stop)!r}")
        if isinstance(adapter, bool) or not isinstance(adapter, int) or not -1 <= adapter < len(self.adapter_names):
            raise ValueError(f"adapter index must be -1 (base model) or in [0, {len(self.adapter_names)}), got {adapter!r}")
        return ids

    def add_request(self, request_id: Hashable, prompt_ids: Prompt, max_tokens: int,
                    sampling: SamplingParams = SamplingParams(), *, stop: Sequence[str] = (), adapter: int = -1) -> None:
        """Queue a request (first come, first served). ValueError naming the problem, nothing changed, if it is
        invalid: empty prompt, token outside the vocabulary, prompt + max_tokens over the context, id in use..."""
        stop = tuple(stop)
        ids = self.validate(request_id, prompt_ids, max_tokens, sampling, stop=stop, adapter=adapter)
        arrival = self.now()
        self._enqueue(request_id, ids, max_tokens, sampling, stop, adapter, arrival)
        detok = IncrementalDetokenizer(self.tokenizer, stop) if self.tokenizer is not None else None
        self._tracked[request_id] = _Tracked(detok, len(ids), arrival,
                                             logprobs=[] if sampling.logprobs is not None else None)

    def abort(self, request_id: Hashable, error: str | None = None) -> RequestOutput | None:
        """Stop a request now and free its KV blocks; its final output (finish_reason "abort", with `error` when
        the engine stops it because its own step failed), or None if the id is unknown or already finished
        (aborting twice is harmless)."""
        if request_id not in self._tracked:
            return None
        self._abort(request_id)
        return self._output(request_id, [], "abort", self.now(), error)

    def is_tracked(self, request_id: Hashable) -> bool:
        return request_id in self._tracked

    # --- outputs -----------------------------------------------------------------------------------

    def _record_logprob(self, request_id: Hashable, logprob: TokenLogprob) -> None:
        """Keep a sampled token's logprobs until the token is emitted (in sampling order)."""
        t = self._tracked.get(request_id)
        if t is not None and t.logprobs is not None:
            t.logprobs.append(logprob)

    def _output(self, request_id: Hashable, new_tokens: list[int], finish_reason: str | None,
                now: float, error: str | None = None) -> RequestOutput:
        """Build this step's output for a request; forget the request once it is finished."""
        t = self._tracked[request_id]
        itl = None
        logprobs = None
        if t.logprobs is not None:
            first = len(t.token_ids)
            logprobs = t.logprobs[first:first + len(new_tokens)]
        if new_tokens:
            if t.first_token_time is None:
                t.first_token_time = now
            elif t.last_token_time is not None:
                itl = now - t.last_token_time
            t.last_token_time = now
            t.token_ids.extend(new_tokens)
            t.token_times.extend([now] * len(new_tokens))
            self.num_generated_tokens += len(new_tokens)
        finished = finish_reason is not None
        text = t.detok.step(new_tokens, finished) if t.detok is not None else ""
        if finished:
            del self._tracked[request_id]
            self.num_finished += 1
        return RequestOutput(request_id, list(new_tokens), text, finished, finish_reason, t.num_prompt_tokens,
                             len(t.token_ids), t.num_cached_tokens, t.arrival_time, t.first_token_time, now, itl,
                             error, logprobs)

    # --- offline -----------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[Prompt], sampling_params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
                 max_tokens: int | Sequence[int] = 16, *, stop: Sequence[str] = ()) -> list[Completion]:
        """Run every prompt to completion (offline, like vLLM's LLM.generate); completions in prompt order."""
        if self.has_unfinished():
            raise RuntimeError("generate() needs an idle engine; finish or abort the running requests first")
        n = len(prompts)
        params = [sampling_params] * n if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        budgets = [max_tokens] * n if isinstance(max_tokens, int) else list(max_tokens)
        if len(params) != n or len(budgets) != n:
            raise ValueError(f"{n} prompts but {len(params)} sampling params and {len(budgets)} max_tokens")
        ids = [("generate", i) for i in range(n)]
        for i, p in enumerate(prompts):                 # validate all before queueing any
            self.validate(ids[i], p, budgets[i], params[i], stop=stop)
        for i, p in enumerate(prompts):
            self.add_request(ids[i], p, budgets[i], params[i], stop=stop)
        arrival = {rid: self._tracked[rid].arrival_time for rid in ids}
        texts = {rid: [] for rid in ids}
        tokens: dict[Hashable, list[int]] = {rid: [] for rid in ids}
        times: dict[Hashable, list[float]] = {rid: [] for rid in ids}
        done: dict[Hashable, Completion] = {}
        while self.has_unfinished():
            for out in self.step():
                rid = out.request_id
                texts[rid].append(out.text)
                tokens[rid].extend(out.new_token_ids)
                times[rid].extend([out.token_time] * len(out.new_token_ids))
                if out.finished:
                    first = out.first_token_time if out.first_token_time is not None else out.token_time
                    done[rid] = Completion(rid[1], "".join(texts[rid]), tokens[rid], out.num_prompt_tokens,
                                           len(tokens[rid]), out.finish_reason, first - arrival[rid],
                                           out.token_time - arrival[rid], times[rid])
        return [done[rid] for rid in ids]
