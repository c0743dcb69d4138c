"""The serving engine (lab 08): one object composing the course's reference parts, a small vLLM.

    engine = LLMEngine.from_checkpoint("target", EngineConfig(num_blocks=256, enable_prefix_caching=True))
    engine.add_request("r1", prompt_ids, max_tokens=32, sampling=SamplingParams(temperature=0.8, seed=1))
    while engine.has_unfinished():
        for out in engine.step():          # RequestOutput: new tokens, text delta, finished, finish_reason
            ...
    engine.generate(["Once upon", "def f("], SamplingParams(), max_tokens=16)   # offline, like LLM.generate

Every step: the scheduler (lab 03: token budget, chunked prefill, preemption by recomputation; admission
from the prefix cache, `engine.prefix_scheduler`: lab 02's hashed blocks, or lab 13's radix tree with
`EngineConfig(prefix_cache="radix")`, `cache.radix_manager`) picks the chunks, the runner (lab 03's packed varlen
layout over lab 02's paged KV cache) runs them in ONE model call and samples the next token of every
sequence whose chunk reached its end, and the scheduler applies the tokens and frees finished sequences.
Weights may be INT8/INT4 weight-only (lab 05). Speculative decoding is not part of this engine: a config
asking for it raises ValueError.

The runner is built by `runner_factory(model, cache)` so a subclass can read per-request state: each
sequence's request is an `EngineRequest` carrying `adapter` (-1 = base model; multi-LoRA runners use it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Literal, Sequence

import torch

from minigpt.cache.block_table import blocks_needed
from minigpt.cache.paged import PagedKVCache
from minigpt.engine.overlap import InFlight, ModelThread, apply_ahead, launch, launch_ready, resolve
from minigpt.engine.prefix_scheduler import PrefixCachingScheduler
from minigpt.engine.request import Request
from minigpt.engine.runner import ModelRunner
from minigpt.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from minigpt.engine.static_step import DEFAULT_BUCKETS, StaticDecodeStep
from minigpt.model import GPT
from minigpt.sampling import SamplingParams, make_generator
from minigpt.serving.base import EngineBase, Prompt
from minigpt.serving.outputs import EngineStats, RequestOutput, TokenLogprob, openai_finish_reason
from minigpt.tokenizer import stop_token_ids

__all__ = ["EngineConfig", "EngineRequest", "LLMEngine", "RunnerFactory", "quantized"]

Weights = Literal["fp32", "int8", "int4"]
PrefixCacheKind = Literal["hash", "radix"]
StaticDecode = Literal["off", "eager", "compiled"]
RunnerFactory = Callable[[GPT, PagedKVCache], ModelRunner]
log = logging.getLogger(__name__)
INT4_GROUP_SIZE = 32          # divides every course model's widths (64 .. 1024)


@dataclass(frozen=True)
class EngineConfig:
    """KV pool (num_blocks x block_size tokens), batch limits (sequences, tokens per step), prefix caching (hashed
    blocks or a radix tree), weight precision, fused weights. `speculative_k` > 0 (speculative decoding) is not
    implemented and is refused."""

    num_blocks: int = 256
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    enable_prefix_caching: bool = True
    prefix_cache: PrefixCacheKind = "hash"  # with prefix caching: lab 02's chained block hashes, or "radix": lab
                                         # 13's tree (it holds its blocks; LRU leaves evicted when the pool runs dry)
    host_tier_blocks: int = 0            # radix only: blocks the tree evicts kept in host memory (an LRU of this
                                         # many) and loaded back for a later prompt instead of recomputed (lab 13)
    enable_chunked_prefill: bool = True
    weights: Weights = "fp32"
    fused_weights: bool = True           # on a CPU, steps on fused K-major weight copies (engine.fused_decode);
                                         # a GPU runs the model as written until the GPU tier has measured both
    speculative_k: int = 0
    async_scheduling: bool = False       # schedule step N+1 while step N runs (lab 12, engine.overlap)
    batch_invariant: bool = False        # each request's logits independent of its batch (lab 12; fp32 weights)
    static_decode: StaticDecode = "off"  # decode-only steps with shapes fixed per batch-size bucket, "eager" or
                                         # "compiled" (torch.compile, one graph a bucket, replayed from a CUDA graph
                                         # on a GPU: mode="reduce-overhead"; lab 12, engine.static_step)
    compile_backend: str = "inductor"    # torch.compile's backend for "compiled" ("eager" compiles in seconds: tests)

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"EngineConfig.{name} must be a positive int, got {v!r}")
        if self.prefix_cache not in ("hash", "radix"):
            raise ValueError(f"EngineConfig.prefix_cache must be 'hash' (lab 02) or 'radix' (lab 13), "
                             f"got {self.prefix_cache!r}")
        if self.prefix_cache == "radix" and not self.enable_prefix_caching:
            raise ValueError("EngineConfig.prefix_cache='radix' needs enable_prefix_caching=True (without prefix "
                             "caching there is no cache to keep in a tree)")
        if isinstance(self.host_tier_blocks, bool) or not isinstance(self.host_tier_blocks, int) \
                or self.host_tier_blocks < 0:
            raise ValueError(f"EngineConfig.host_tier_blocks must be an int >= 0, got {self.host_tier_blocks!r}")
        if self.host_tier_blocks and self.prefix_cache != "radix":
            raise ValueError("EngineConfig.host_tier_blocks keeps the blocks lab 13's radix tree evicts: it needs "
                             "prefix_cache='radix'")
        if self.weights not in ("fp32", "int8", "int4"):
            raise ValueError(f"EngineConfig.weights must be 'fp32', 'int8' or 'int4', got {self.weights!r}")
        if self.speculative_k:
            raise ValueError("speculative decoding is not implemented in this engine (speculative_k must be 0); "
                             "see minigpt.engine.speculative for lab 06's standalone version")
        if self.static_decode not in ("off", "eager", "compiled"):
            raise ValueError(f"EngineConfig.static_decode must be 'off', 'eager' or 'compiled', got {self.static_decode!r}")
        if self.static_decode != "off" and (self.weights != "fp32" or self.batch_invariant):
            raise ValueError("EngineConfig.static_decode needs fp32 weights and is not batch-invariant")
        if self.batch_invariant and self.weights != "fp32":
            raise ValueError("EngineConfig.batch_invariant needs fp32 weights (the invariant step runs plain matmuls)")
        self.scheduler_config()                      # validates max_num_seqs and max_num_batched_tokens

    def decode_buckets(self) -> tuple[int, ...]:
        """Batch-size buckets of the static decode step: powers of two below max_num_seqs, and max_num_seqs."""
        return tuple(b for b in DEFAULT_BUCKETS if b < self.max_num_seqs) + (self.max_num_seqs,)

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(self.max_num_seqs, self.max_num_batched_tokens, self.enable_chunked_prefill)


@dataclass(frozen=True)
class EngineRequest(Request):
    """A lab 03 Request plus the LoRA adapter it asks for (-1 = the base model)."""

    adapter: int = -1


def quantized(model: GPT, weights: Weights) -> GPT:
    """The model with weight-only INT8 / INT4 projections (lab 05), or itself for fp32."""
    if weights == "fp32":
        return model
    from minigpt.quant.linear import quantize_weight_only
    return quantize_weight_only(model, 8) if weights == "int8" else quantize_weight_only(model, 4, INT4_GROUP_SIZE)


class LLMEngine(EngineBase):
    """Continuous batching on a paged KV cache with prefix caching (see the module docstring)."""

    def __init__(self, model: GPT, config: EngineConfig = EngineConfig(), *, tokenizer: object | None = None,
                 model_name: str = "minigpt", adapter_names: Sequence[str] = (),
                 runner_factory: RunnerFactory = ModelRunner, clock: Callable[[], float] = time.perf_counter) -> None:
        model = quantized(model.eval(), config.weights)
        super().__init__(model, tokenizer=tokenizer, model_name=model_name, adapter_names=adapter_names, clock=clock)
        self.config = config
        self.cache = PagedKVCache.for_model(model, config.num_blocks, config.block_size,
                                            enable_prefix_caching=config.enable_prefix_caching,
                                            prefix_cache=config.prefix_cache,
                                            host_tier_blocks=config.host_tier_blocks)
        scheduler_cls = PrefixCachingScheduler if config.enable_prefix_caching else Scheduler
        self.scheduler: Scheduler = scheduler_cls(self.cache.manager, config.scheduler_config(),
                                                  max_model_len=model.config.max_seq_len)
        fused = config.fused_weights and model.device.type == "cpu"
        if (config.batch_invariant or config.static_decode != "off") and runner_factory is not ModelRunner:
            raise ValueError("EngineConfig.batch_invariant and static_decode run the engine's own ModelRunner; this "
                             "engine was given another runner (multi-LoRA runners have neither)")
        compiled = config.static_decode == "compiled"
        static = None if config.static_decode == "off" else StaticDecodeStep(
            model, self.cache, config.decode_buckets(), compile=compiled, backend=config.compile_backend,
            mode="reduce-overhead" if compiled and model.device.type == "cuda" else None)     # CUDA graphs on a GPU
        self.runner = (ModelRunner(model, self.cache, fused=fused, invariant=config.batch_invariant, static=static)
                       if runner_factory is ModelRunner
                       else runner_factory(model, self.cache))
        self.num_preemptions = 0
        self._last_batch = (0, 0)
        self._in_flight: InFlight | None = None            # async scheduling: the step running on the model's thread
        self._model_thread = ModelThread() if config.async_scheduling else None

    @classmethod
    def from_checkpoint(cls, name: str = "target", config: EngineConfig = EngineConfig(), *,
                        max_model_len: int | None = None, **kwargs: object) -> "LLMEngine":
        """A course checkpoint ("target", "draft", a .safetensors path) with the course tokenizer, or a Hugging Face
        folder with its own tokenizer.json; `max_model_len` caps the context (kwargs go to the constructor)."""
        from minigpt.checkpoint import load_model
        from minigpt.tokenizer import tokenizer_for
        kwargs.setdefault("tokenizer", tokenizer_for(name))
        kwargs.setdefault("model_name", str(name))
        return cls(load_model(name, max_seq_len=max_model_len), config, **kwargs)

    # --- EngineBase ---------------------------------------------------------------------------------

    def validate(self, request_id: Hashable, prompt: Prompt, max_tokens: int, sampling: SamplingParams = SamplingParams(),
                 *, stop: Sequence[str] = (), adapter: int = -1) -> list[int]:
        """EngineBase.validate, plus: the request's K/V (prompt + max_tokens - 1 tokens) must fit the whole pool."""
        ids = super().validate(request_id, prompt, max_tokens, sampling, stop=stop, adapter=adapter)
        need = blocks_needed(len(ids) + max_tokens - 1, self.config.block_size)
        usable = self.config.num_blocks - (self.config.static_decode != "off")     # the static step's null block
        if need > usable:
            raise ValueError(f"the request needs up to {need} KV blocks but the pool has only {usable}; "
                             "ask for fewer tokens")
        return ids

    def _enqueue(self, request_id: Hashable, prompt: list[int], max_tokens: int, sampling: SamplingParams,
                 stop: tuple[str, ...], adapter: int, arrival_time: float) -> None:
        request = EngineRequest(request_id, tuple(prompt), max_tokens, sampling, arrival_time,
                                stop_token_ids(self.tokenizer), stop, self.tokenizer if stop else None, adapter=adapter)
        seq = self.scheduler.add_request(request)    # ValueError (nothing changed) if it could never fit the pool
        if self.model.device.type != "cpu":          # sample with a generator on the logits' device
            seq.generator = make_generator(sampling, self.model.device)

    def _abort(self, request_id: Hashable) -> None:
        seq = self.scheduler.sequences.get(request_id)
        if seq is not None and not seq.is_finished:
            self.scheduler.abort(request_id)
        self.scheduler.sequences.pop(request_id, None)

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """One scheduler step and one model call; an output for every request that got a token or finished.

        A request whose part of the step fails (its sampling raises, say) fails ALONE: the step is re-run one chunk
        at a time to find it, it ends with finish_reason "abort" and `error`, and every other request goes on.
        With `async_scheduling`, the step handed out is the one that landed, the next one already running
        (`_step_overlapped`)."""
        if self.config.async_scheduling:
            return self._step_overlapped()
        out = self.scheduler.schedule()
        failed: dict[Hashable, str] = {}
        sampled, logprobs = self._execute(out, failed)
        if failed:
            out = SchedulerOutput([c for c in out.chunks if c.seq_id not in failed], out.preempted)
        now = self.now()
        self.scheduler.update(out, sampled, now)
        self.num_preemptions += len(out.preempted)
        return self._emit(out, sampled, logprobs, failed, now)

    def _step_overlapped(self) -> list[RequestOutput]:
        """Overlap scheduling (`engine.overlap`): while step N runs on the model's thread, move the scheduler past
        it with placeholders and schedule step N+1; when N lands, sample, resolve, launch N+1, and hand out N's
        outputs while N+1 runs. A sampling that raises fails its request alone; a model call that raises fails
        every request of its step."""
        if self._in_flight is None:
            out = self.scheduler.schedule()
            self.num_preemptions += len(out.preempted)
            if not out.chunks:
                return self._emit(out, {}, {}, {}, self.now())
            self._in_flight = launch(self.runner, self._model_thread, out)
        step, self._in_flight = self._in_flight, None
        apply_ahead(self.scheduler, step, self.now())
        ahead = self.scheduler.schedule()                       # while step N runs: the next step, and its inputs
        self.num_preemptions += len(ahead.preempted)
        prepared = self.runner.prepare(ahead.chunks) if ahead.chunks else None
        landed = self._land(step)
        self._in_flight = launch_ready(self.runner, self._model_thread, ahead, prepared)
        return self._emit(*landed)

    def _land(self, step: InFlight) -> tuple[SchedulerOutput, dict, dict, dict[Hashable, str], float]:
        """A launched step (applied ahead) lands: wait for its logits, sample, abort the requests whose part failed,
        resolve the placeholders. Returns what `_emit` takes: (the step without the failed requests, sampled tokens,
        logprobs, failures, now)."""
        failed: dict[Hashable, str] = {}
        sampled, logprobs = {}, {}
        try:
            logits = step.wait()
        except Exception as err:                               # noqa: BLE001  (the whole step's requests fail)
            failed = {c.seq_id: f"{type(err).__name__}: {err}" for c in step.output.chunks}
        else:
            sampled, logprobs = self._sample(step, logits, failed)
        for request_id in failed:
            seq = self.scheduler.sequences.get(request_id)
            if seq is not None and not seq.is_finished:
                self.scheduler.abort(request_id)
        now = self.now()
        resolve(self.scheduler, step, {k: v for k, v in sampled.items() if k not in failed}, now)
        out = SchedulerOutput([c for c in step.output.chunks if c.seq_id not in failed], step.output.preempted)
        return out, sampled, logprobs, failed, now

    def _sample(self, step: InFlight, logits, failed: dict[Hashable, str]) -> tuple[dict, dict]:
        """The landed step's tokens (and logprobs) for the sequences still waiting for them; if sampling the batch
        raises, each chunk alone, the failing ones put in `failed`."""
        rows = [(row, c) for row, c in enumerate(step.output.chunks) if c.seq_id in step.samples and c.seq.pending]
        try:
            sampled = self.runner.sample([c for _, c in rows], logits[[row for row, _ in rows]], step.samples)
            return sampled, self.runner.last_logprobs
        except Exception:                                      # noqa: BLE001  (find whose it is)
            pass
        sampled, logprobs = {}, {}
        for row, chunk in rows:
            try:
                sampled.update(self.runner.sample([chunk], logits[row:row + 1], step.samples))
                logprobs.update(self.runner.last_logprobs)
            except Exception as err:                           # noqa: BLE001
                failed[chunk.seq_id] = f"{type(err).__name__}: {err}"
        return sampled, logprobs

    def _emit(self, out: SchedulerOutput, sampled: dict, logprobs: dict, failed: dict[Hashable, str],
              now: float) -> list[RequestOutput]:
        """The outputs of an executed step: each request's new tokens, finish reason and logprobs; the failed ones
        aborted with their error."""
        self.num_steps += 1
        self._last_batch = (len(out.chunks), out.num_batched_tokens)
        outputs = []
        for chunk in out.chunks:
            seq = chunk.seq
            t = self._tracked.get(seq.seq_id)
            if t is None:
                continue
            if not t.admitted:                            # its first chunk starts after the cached prefix
                t.admitted, t.num_cached_tokens = True, chunk.start
            if not (seq.seq_id in sampled or seq.is_finished):
                continue                                  # a prefill chunk that did not reach the end yet
            if seq.seq_id in logprobs:
                self._record_logprob(seq.seq_id, TokenLogprob(sampled[seq.seq_id], *logprobs[seq.seq_id]))
            new = seq.output_tokens[t.num_emitted:]
            t.num_emitted += len(new)
            reason = openai_finish_reason(seq.finish_reason) if seq.is_finished else None
            if seq.is_finished:
                self.scheduler.sequences.pop(seq.seq_id, None)   # the engine forgets finished requests (a server)
            outputs.append(self._output(seq.seq_id, new, reason, now))
        for request_id, error in failed.items():
            log.warning("request %r failed in an engine step (the others go on): %s", request_id, error)
            outputs.append(self.abort(request_id, error))
        return outputs

    def _execute(self, out: SchedulerOutput, failed: dict[Hashable, str]) -> tuple[dict, dict]:
        """Run the step: (sampled tokens, logprobs) by sequence id. If the batch fails, run its chunks one by one
        (each writes the same K/V it would have written in the batch) and put the failing ones in `failed`."""
        if not out.chunks:
            return {}, {}
        try:
            return self.runner.execute(out), self.runner.last_logprobs
        except Exception as err:                          # noqa: BLE001  (any failure: find whose it is)
            if len(out.chunks) == 1:
                failed[out.chunks[0].seq_id] = f"{type(err).__name__}: {err}"
                return {}, {}
        sampled, logprobs = {}, {}
        for chunk in out.chunks:
            try:
                sampled.update(self.runner.execute(SchedulerOutput([chunk])))
                logprobs.update(self.runner.last_logprobs)
            except Exception as err:                      # noqa: BLE001
                failed[chunk.seq_id] = f"{type(err).__name__}: {err}"
        return sampled, logprobs

    def close(self) -> None:
        """Stop the model's thread (async scheduling), after the step in flight, if any, has run."""
        if self._model_thread is not None:
            self._model_thread.close()
            self._model_thread = None

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._in_flight is not None

    def stats(self) -> EngineStats:
        pool = self.cache.manager.pool      # num_free counts cached blocks nobody uses (queued, or evictable: radix)
        sched = self.scheduler
        return EngineStats(len(sched.running), len(sched.waiting), pool.num_blocks, pool.num_blocks - pool.num_free,
                           getattr(sched, "hit_rate", 0.0), self.num_preemptions, self.num_steps, self.num_finished,
                           self.num_generated_tokens, *self._last_batch, getattr(sched, "lookup_tokens", 0),
                           getattr(sched, "hit_tokens", 0))
