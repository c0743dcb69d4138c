"""Replaying a trace against a bounded pool: with room for everything both caches hit what an ideal cache would;
with little room, a host tier brings evicted blocks back."""

import pytest

from minigpt.cache.trace_replay import replay_trace
from minigpt.serving.trace import TraceRecord, conversation_trace, shared_prefix_blocks


@pytest.mark.parametrize("cache", ["hash", "radix"])
def test_with_room_for_everything_the_hits_are_the_ideal_reuse(cache):
    records = conversation_trace(4, sessions=20)
    result = replay_trace(records, cache, pool_blocks=4096)
    assert result.refused == 0 and result.host_hits == 0
    assert result.gpu_hits == shared_prefix_blocks(records)
    assert result.gpu_hits + result.computed == result.blocks


@pytest.mark.parametrize("cache", ["hash", "radix"])
def test_a_host_tier_brings_back_what_a_small_pool_evicts(cache):
    records = [TraceRecord(0, 4, 1, (1, 2, 3, 4)), TraceRecord(100, 4, 1, (5, 6, 7, 8)),
               TraceRecord(200, 4, 1, (1, 2, 3, 4))]                  # the third repeats the first after eviction
    plain = replay_trace(records, cache, pool_blocks=4, ms_per_token=1)
    tiered = replay_trace(records, cache, pool_blocks=4, ms_per_token=1, host_blocks=8)
    assert (plain.gpu_hits, plain.host_hits, plain.computed) == (0, 0, 12)
    assert (tiered.gpu_hits, tiered.host_hits, tiered.computed) == (0, 4, 8)
    with pytest.raises(ValueError, match="cache"):
        replay_trace(records, "lru", 4)
