"""The iteration-level scheduler (lab 03): which sequences run in the next model step, and how many tokens each.

Every step (Orca's iteration-level scheduling; the order is vLLM V0's chunked-prefill policy, `vllm/core/scheduler.py`
up to v0.10.2; vLLM V1 has no decode-first phase: it walks its running requests in queue order, then the waiting
ones, under one token budget; lab 03's section 7 compares them):

1. Running sequences first, decodes (one token each) before unfinished prefills, each group oldest first.
   A prefill gets min(tokens left, budget left): a long prompt is CHUNKED over several steps, each
   chunk starting where the previous one ended (positions continue). If the pool has no block for a
   sequence, the NEWEST running sequence is preempted by recomputation: its blocks are freed, its
   output kept, and it goes back to the FRONT of the queue, where its next prefill recomputes
   prompt + output. Evicting the newest protects the oldest, so the oldest unfinished request always
   advances and every request finishes (no starvation).
2. Then, if nobody was preempted, waiting sequences are admitted in arrival order (first come, first
   served, never skipping the head) while fewer than `max_num_seqs` run, budget is left and blocks fit.

At most `max_num_batched_tokens` tokens run per step. Blocks are reserved here (`BlockManager`), so after
`schedule()` the blocks in use are exactly those of the running sequences; `update()` applies the
sampled tokens and frees finished sequences at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar, Hashable, Mapping

from minigpt.cache.block_manager import BlockManager
from minigpt.cache.block_table import blocks_needed
from minigpt.engine.request import Request, Sequence, SequenceStatus

__all__ = ["SchedulerConfig", "ScheduledChunk", "SchedulerOutput", "Scheduler", "check_admissible"]


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True)
class SchedulerConfig:
    """max_num_seqs: sequences running at once; max_num_batched_tokens: tokens per model step (the budget)."""

    max_num_seqs: int = 8
    max_num_batched_tokens: int = 64
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        _positive_int("max_num_seqs", self.max_num_seqs)
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                             f"({self.max_num_seqs}): a full batch of decodes needs one token each")


@dataclass
class ScheduledChunk:
    """Work for one sequence in one step: `tokens` at positions start .. start + len(tokens) - 1,
    written to `slots`; `copies` are copy-on-write block copies to do first."""

    seq: Sequence
    start: int
    tokens: list[int]
    slots: list[int]
    copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def seq_id(self) -> Hashable:
        return self.seq.seq_id

    @property
    def samples(self) -> bool:
        """True if this chunk reaches the end of the sequence, so the step samples its next token."""
        return self.start + len(self.tokens) == self.seq.num_tokens

    @property
    def is_prefill(self) -> bool:
        return len(self.tokens) > 1 or self.start < len(self.seq.prompt)


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk]
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)


def check_admissible(request: Request, max_model_len: int, num_blocks: int, block_size: int,
                     config: SchedulerConfig) -> None:
    """Raise ValueError if the request can never run: longer than the context, than the whole pool, or (without
    chunked prefill) than one step's token budget. The sequence's K/V never exceeds prompt + max_new_tokens - 1."""
    total = len(request.prompt) + request.max_new_tokens
    if total > max_model_len:
        raise ValueError(f"request {request.request_id!r}: prompt ({len(request.prompt)} tokens) + max_new_tokens "
                         f"({request.max_new_tokens}) = {total} exceeds the context of {max_model_len} tokens")
    need = blocks_needed(total - 1, block_size)
    if need > num_blocks:
        raise ValueError(f"request {request.request_id!r}: needs up to {need} KV blocks but the pool has only "
                         f"{num_blocks}; it could never run")
    if not config.enable_chunked_prefill and total - 1 > config.max_num_batched_tokens:
        raise ValueError(f"request {request.request_id!r}: without chunked prefill its prefill (up to {total - 1} "
                         f"tokens after a preemption) must fit max_num_batched_tokens={config.max_num_batched_tokens}")


class Scheduler:
    """Continuous batching with chunked prefill and preemption by recomputation (see the module docstring)."""

    # A subclass that looks up cached prefixes on admission sets this (engine.prefix_scheduler, lab 08).
    supports_prefix_caching: ClassVar[bool] = False

    def __init__(self, manager: BlockManager, config: SchedulerConfig = SchedulerConfig(), *, max_model_len: int) -> None:
        if manager.prefix_cache is not None and not self.supports_prefix_caching:
            raise ValueError("this scheduler expects a BlockManager without prefix caching "
                             "(use minigpt.engine.prefix_scheduler.PrefixCachingScheduler)")
        self.manager = manager
        self.config = config
        self.max_model_len = _positive_int("max_model_len", max_model_len)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []          # in admission order: running[-1] is the newest
        self.sequences: dict[Hashable, Sequence] = {}

    # --- requests ---------------------------------------------------------------------------------

    def add_request(self, request: Request) -> Sequence:
        """Queue a request; ValueError (nothing changed) if its id is taken or it could never run."""
        if request.request_id in self.sequences:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        check_admissible(request, self.max_model_len, self.manager.pool.num_blocks, self.manager.block_size, self.config)
        seq = Sequence(request)
        self.sequences[request.request_id] = seq
        self.waiting.append(seq)
        return seq

    def abort(self, request_id: Hashable) -> None:
        """Stop a request now and free its blocks (ValueError for an unknown or already finished id)."""
        seq = self.sequences.get(request_id)
        if seq is None or seq.is_finished:
            raise ValueError(f"cannot abort {request_id!r}: no such unfinished request")
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._finish(seq, "abort", seq.token_times[-1] if seq.token_times else seq.arrival_time)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step ---------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        chunks: dict[Hashable, ScheduledChunk] = {}
        preempted: list[Sequence] = []
        for seq in sorted(self.running, key=lambda s: s.num_remaining > 1):     # decodes first (stable sort)
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:                         # preempted earlier in this loop
                continue
            n = min(seq.num_remaining, budget)
            while seq.status is SequenceStatus.RUNNING and self._blocks_for(seq, n) > self.manager.pool.num_free:
                victim = self.running[-1]
                if victim.seq_id in chunks:                                      # refund its reservation
                    budget += len(chunks.pop(victim.seq_id).tokens)
                self._preempt(victim)
                preempted.append(victim)
            if seq.status is SequenceStatus.RUNNING:
                chunks[seq.seq_id] = self._reserve(seq, n)
                budget -= n
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            chunk = self._admit(self.waiting[0], budget)
            if chunk is None:
                break
            chunks[chunk.seq_id] = chunk
            budget -= len(chunk.tokens)
        return SchedulerOutput(list(chunks.values()), preempted)

    def update(self, output: SchedulerOutput, sampled: Mapping[Hashable, int], now: float) -> list[Sequence]:
        """Apply one executed step: advance each chunk, append the sampled tokens (for chunks that sample),
        finish and free the sequences that stop. Returns the sequences finished in this step."""
        finished = []
        for chunk in output.chunks:
            seq = chunk.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue
            seq.num_computed = chunk.start + len(chunk.tokens)
            if seq.num_computed == seq.num_tokens:
                if seq.seq_id not in sampled:
                    raise ValueError(f"no sampled token for {seq.seq_id!r}, whose chunk reached its end")
                reason = seq.append_token(sampled[seq.seq_id], now)
                if reason is not None:
                    self._finish(seq, reason, now)
                    finished.append(seq)
        return finished

    # --- helpers ----------------------------------------------------------------------------------

    def _admit(self, seq: Sequence, budget: int) -> ScheduledChunk | None:
        """Move the head of the queue into the running batch with its first chunk (at most `budget` tokens),
        or return None (nothing changed) if it does not fit now."""
        n = seq.num_remaining
        if n > budget:
            if not self.config.enable_chunked_prefill:
                return None
            n = budget
        if blocks_needed(n, self.manager.block_size) > self.manager.pool.num_free:
            return None
        self.waiting.popleft()
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return self._reserve(seq, n)

    def _blocks_for(self, seq: Sequence, n: int) -> int:
        if seq.seq_id in self.manager.tables:
            return self.manager.blocks_for_append(seq.seq_id, n)
        return blocks_needed(n, self.manager.block_size)

    def _reserve(self, seq: Sequence, n: int) -> ScheduledChunk:
        start = seq.num_computed
        tokens = seq.token_slice(start, start + n)
        if seq.seq_id in self.manager.tables:
            r = self.manager.append_tokens(seq.seq_id, tokens)
        else:
            r = self.manager.add_sequence(seq.seq_id, tokens)
        return ScheduledChunk(seq, start, tokens, r.slots, r.copies)

    def _preempt(self, seq: Sequence) -> None:
        """Recomputation: free the blocks, keep the output, requeue at the front."""
        self.running.remove(seq)
        self.manager.free(seq.seq_id)
        seq.num_computed = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.PREEMPTED
        self.waiting.appendleft(seq)

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        if seq in self.running:
            self.running.remove(seq)
        if seq.seq_id in self.manager.tables:
            self.manager.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = now
