"""Continuous batching WITH prefix caching (lab 08): lab 03's scheduler, admitting from the cached prefix.

On admission, a sequence's tokens (prompt, plus output after a preemption) are looked up in the prefix
cache (`manager.cached_prefix_len`): by chained block hashes (lab 02), or down a radix tree with a
`cache.radix_manager.RadixBlockManager` (lab 13). The longest cached run of full blocks is reused, at most
(len - 1) // block_size blocks, because the last token must be computed for its logits. Then

    num_cached = cached blocks * block_size
    n          = min(len - num_cached, budget)           only UNCACHED tokens count against the budget
    manager.add_sequence(seq_id, tokens[:num_cached + n])  reuses the cached blocks, reserves n slots
    chunk      = tokens[num_cached : num_cached + n]     starting at position num_cached

A long uncached remainder is chunked over later steps as usual. If the pool cannot hold the chunk
(OutOfBlocks), admission stops for this step, exactly as without prefix caching.

With LoRA adapters (lab 08) the same tokens have different K/V under each adapter, so a request's chain of
block hashes is salted with its adapter (`request.adapter`, -1 = base model, unsalted): requests share cached
blocks only with requests of the same adapter (vLLM does the same with the LoRA id).

One subtlety: blocks are registered in the prefix cache when they are RESERVED full, and computed by the
step that follows. A sequence preempted in the same schedule() call as its reservation never computes
them, so on preemption the hashes of its not-yet-computed blocks are forgotten, or the radix tree drops them
(`manager.forget_uncomputed`: nobody may reuse garbage).
"""

from __future__ import annotations

from typing import ClassVar, Hashable

from minigpt.cache.block_pool import OutOfBlocks
from minigpt.engine.request import Sequence, SequenceStatus
from minigpt.engine.scheduler import ScheduledChunk, Scheduler

__all__ = ["PrefixCachingScheduler", "cached_prefix_len", "cache_salt"]


def cache_salt(seq: Sequence) -> Hashable | None:
    """The prefix-cache salt of a sequence: its LoRA adapter ("lora", a), or None for the base model."""
    adapter = getattr(seq.request, "adapter", -1)
    return None if adapter < 0 else ("lora", adapter)


def cached_prefix_len(manager: "object", tokens: list[int], salt: Hashable | None = None) -> int:
    """Tokens of `tokens` whose K/V the prefix cache holds: full cached blocks, at most (len - 1) // block_size
    (the manager's `cached_prefix_len`: chained hashes, or a radix tree's walk)."""
    return manager.cached_prefix_len(tokens, salt)


class PrefixCachingScheduler(Scheduler):
    """`Scheduler` over a BlockManager with prefix caching: admission skips the cached prefix."""

    supports_prefix_caching: ClassVar[bool] = True
    salts_by_adapter: ClassVar[bool] = True        # cached blocks are shared only within one LoRA adapter
    lookup_tokens = 0      # tokens looked up on admission (prompt, plus output after a preemption)
    hit_tokens = 0         # of which found in the prefix cache

    @property
    def hit_rate(self) -> float:
        """hit_tokens / lookup_tokens over all admissions so far (0 before the first)."""
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0

    def _admit(self, seq: Sequence, budget: int) -> ScheduledChunk | None:
        if self.manager.prefix_cache is None:
            return super()._admit(seq, budget)
        tokens = seq.tokens
        salt = cache_salt(seq)
        num_cached = cached_prefix_len(self.manager, tokens, salt)
        n = len(tokens) - num_cached
        if n > budget:
            if not self.config.enable_chunked_prefill:
                return None
            n = budget
        try:
            r = self.manager.add_sequence(seq.seq_id, tokens[:num_cached + n], salt=salt)
        except OutOfBlocks:
            return None
        assert r.num_cached == num_cached, (r.num_cached, num_cached)
        self.lookup_tokens += len(tokens)
        self.hit_tokens += num_cached
        self.waiting.popleft()
        seq.status = SequenceStatus.RUNNING
        seq.num_computed = num_cached
        self.running.append(seq)
        return ScheduledChunk(seq, num_cached, tokens[num_cached:num_cached + n], r.slots, r.copies)

    def _preempt(self, seq: Sequence) -> None:
        if self.manager.prefix_cache is not None and seq.seq_id in self.manager.tables:
            self.manager.forget_uncomputed(seq.seq_id, seq.num_computed)      # reserved but not computed yet
        super()._preempt(seq)
