"""Baselines for continuous batching (lab 03): sequential serving and static (or dynamic) batching.

* `run_sequential`: one request at a time, in arrival order, with lab 01's `generate_kv_cache`.
* `StaticBatchScheduler`: the scheduler interface of `Scheduler`, but request-level batching: wait for
  `batch_size` requests (static) or take whoever is waiting (dynamic, `wait_for_full=False`), prefill
  them together, decode until ALL of them end, and only then start the next batch. Finished sequences
  leave the computation at once (this baseline is generous: HF-style static batching keeps computing
  them as padding), but their slot stays empty until the slowest one ends. It reserves blocks for every
  sequence's prompt + max_new_tokens up front, as engines did before paging, so it never preempts.
  Run it with `ModelRunner(layout="padded")`: prompts padded to the longest, padding never attended.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Hashable, Mapping, Sequence

from minigpt.cache.block_manager import BlockManager
from minigpt.cache.paged import PagedKVCache
from minigpt.cache.block_table import blocks_needed
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.request import Request, Sequence as Seq, SequenceStatus
from minigpt.engine.runner import ModelRunner
from minigpt.engine.scheduler import ScheduledChunk, SchedulerConfig, SchedulerOutput, check_admissible
from minigpt.engine.serving_loop import ServeResult, serve
from minigpt.model import GPT

__all__ = ["run_sequential", "StaticBatchScheduler", "static_generate"]


def run_sequential(model: GPT, requests: Sequence[Request]) -> ServeResult:
    """Serve one request at a time (wall clock, idle time skipped as in `WallClock`). Only the first token time
    is not observed: `generate_kv_cache` returns all tokens at once, so every token is stamped at the end."""
    t0, skipped, sequences = time.perf_counter(), 0.0, []
    now = lambda: time.perf_counter() - t0 + skipped      # noqa: E731
    for req in sorted(requests, key=lambda r: r.arrival_time):
        skipped += max(0.0, req.arrival_time - now())
        seq = Seq(req)
        gen = generate_kv_cache(model, list(req.prompt), req.max_new_tokens, req.sampling,
                                stop_token_ids=req.stop_token_ids, stop_strings=req.stop_strings, tokenizer=req.tokenizer)
        end = now()
        seq.stop.tokens.extend(gen.tokens)
        seq.token_times = [end] * len(gen.tokens)
        seq.first_token_time, seq.finish_time, seq.finish_reason = end, end, gen.finish_reason
        seq.status = SequenceStatus.FINISHED
        sequences.append(seq)
    return ServeResult(sequences, [])


class StaticBatchScheduler:
    """Request-level batching with the `Scheduler` interface (add_request / schedule / update / has_unfinished)."""

    def __init__(self, manager: BlockManager, batch_size: int, *, max_model_len: int, wait_for_full: bool = True) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.manager, self.batch_size, self.max_model_len = manager, batch_size, max_model_len
        self.wait_for_full = wait_for_full
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []            # the current batch, unfinished members
        self.batch: list[Seq] = []              # the current batch, all members
        self.sequences: dict[Hashable, Seq] = {}
        self._arrivals_done = False

    def add_request(self, request: Request) -> Seq:
        if request.request_id in self.sequences:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        cfg = SchedulerConfig(1, self.max_model_len)
        check_admissible(request, self.max_model_len, self.manager.pool.num_blocks, self.manager.block_size, cfg)
        seq = Seq(request)
        self.sequences[request.request_id] = seq
        self.waiting.append(seq)
        return seq

    def end_of_arrivals(self) -> None:
        """No more requests will come: a static batch may start with fewer than batch_size."""
        self._arrivals_done = True

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _blocks_reserved(self, seq: Seq) -> int:
        return blocks_needed(len(seq.prompt) + seq.request.max_new_tokens - 1, self.manager.block_size)

    def schedule(self) -> SchedulerOutput:
        if not self.running:                    # the previous batch has ended: form the next one
            self.batch = []
            if len(self.waiting) < self.batch_size and self.wait_for_full and not self._arrivals_done:
                return SchedulerOutput([])
            budget = self.manager.pool.num_free
            while self.waiting and len(self.batch) < self.batch_size and self._blocks_reserved(self.waiting[0]) <= budget:
                seq = self.waiting.popleft()
                budget -= self._blocks_reserved(seq)
                seq.status = SequenceStatus.RUNNING
                self.batch.append(seq)
            self.running = list(self.batch)
        chunks = []
        for seq in self.running:
            start = seq.num_computed
            tokens = seq.token_slice(start, seq.num_tokens)
            r = (self.manager.append_tokens(seq.seq_id, tokens) if seq.seq_id in self.manager.tables
                 else self.manager.add_sequence(seq.seq_id, tokens))
            chunks.append(ScheduledChunk(seq, start, tokens, r.slots, r.copies))
        return SchedulerOutput(chunks)

    def update(self, output: SchedulerOutput, sampled: Mapping[Hashable, int], now: float) -> list[Seq]:
        finished = []
        for chunk in output.chunks:
            seq = chunk.seq
            seq.num_computed = chunk.start + len(chunk.tokens)
            reason = seq.append_token(sampled[seq.seq_id], now)
            if reason is not None:
                self.running.remove(seq)
                self.manager.free(seq.seq_id)
                seq.status, seq.finish_reason, seq.finish_time = SequenceStatus.FINISHED, reason, now
                finished.append(seq)
        return finished


def static_generate(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int], batch_size: int, *,
                    block_size: int = 16) -> list[list[int]]:
    """Static batching of `prompts` (all arrived at t = 0, stop tokens off): groups of `batch_size` in the padded
    layout, each group run until its longest answer ends. Returns each prompt's new tokens, in order."""
    reqs = [Request(i, p, n, stop_token_ids=()) for i, (p, n) in enumerate(zip(prompts, max_new_tokens))]
    num_blocks = sum(blocks_needed(len(r.prompt) + r.max_new_tokens, block_size) for r in reqs)
    cache = PagedKVCache.for_model(model, num_blocks, block_size)
    scheduler = StaticBatchScheduler(cache.manager, batch_size, max_model_len=model.config.max_seq_len)
    result = serve(reqs, scheduler, ModelRunner(model, cache, "padded").execute)
    return [list(s.output_tokens) for s in sorted(result.sequences, key=lambda s: s.seq_id)]
