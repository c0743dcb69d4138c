"""Admission replayed step by step on a trace: with room for everything both orders hit what an ideal cache would;
longest prefix first admits the cached request first (and keeps its prefix cached) where arrival order does not;
the starvation bound holds a request's wait to max_wait steps; seeded runs repeat; bad arguments are refused."""

import pytest

from minigpt.cache.admission_replay import replay_admission
from minigpt.serving.trace import TraceRecord, conversation_trace, shared_prefix_blocks

FLAT = {"fixed_ms": 10.0, "prefill_ms_per_token": 0.0}       # every step 10 ms: step k starts at 10 k ms


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_with_room_for_everything_the_hits_are_the_ideal_reuse(policy):
    records = conversation_trace(4, sessions=20)
    result = replay_admission(records, policy, pool_blocks=10_000)
    assert result.hit_blocks == shared_prefix_blocks(records), \
        f"{policy}: {result.hit_blocks} blocks hit, the ideal cache {shared_prefix_blocks(records)}"
    assert result.blocks == sum(len(r.hash_ids) for r in records)
    assert result.output_tokens == sum(r.output_length for r in records)
    assert len(result.ttft_ms) == len(records) and min(result.ttft_ms) > 0


def test_longest_prefix_first_admits_the_cached_request_first_and_keeps_its_prefix():
    """Budget for one 4-block prompt a step, a pool of 6 blocks. A (4 blocks) runs in step 0 and leaves its prefix
    cached; B (shares nothing) and C (A's prefix and one block more) wait for step 1. Arrival order runs B, whose
    blocks evict 3 of A's 4; longest prefix first runs C on A's cached prefix, then B."""
    records = [TraceRecord(0, 64, 1, (1, 2, 3, 4)), TraceRecord(1, 64, 1, (5, 6, 7, 8)),
               TraceRecord(2, 80, 1, (1, 2, 3, 4, 9))]
    fcfs = replay_admission(records, "fcfs", pool_blocks=6, token_budget=80, **FLAT)
    lpm = replay_admission(records, "lpm", pool_blocks=6, token_budget=80, **FLAT)
    assert fcfs.waits == (0, 0, 1) and lpm.waits == (0, 1, 0), (fcfs.waits, lpm.waits)
    assert (fcfs.hit_blocks, lpm.hit_blocks) == (1, 4)
    assert lpm.ttft_ms == (10.0, 29.0, 18.0) and fcfs.ttft_ms == (10.0, 19.0, 28.0)


def _flood(steps: int) -> list[TraceRecord]:
    """P warms a 4-block prefix in step 0; L (4 blocks, shares nothing) then waits behind 4 requests a step that
    reuse P's prefix (16 tokens to compute each) for `steps` steps, with a budget of 80 tokens a step."""
    prefix = (1, 2, 3, 4)
    records = [TraceRecord(0, 64, 1, prefix), TraceRecord(0, 64, 1, (5, 6, 7, 8))]
    records += [TraceRecord(10 * step, 80, 1, prefix + (100 + 4 * step + k,))
                for step in range(1, steps + 1) for k in range(4)]
    return records


@pytest.mark.parametrize("max_wait", [1, 2, 3, 5])
def test_the_starvation_bound_holds_every_wait_to_max_wait_steps(max_wait):
    records = _flood(10)
    bounded = replay_admission(records, "lpm", pool_blocks=1000, token_budget=80, max_wait=max_wait, **FLAT)
    assert bounded.waits[1] == max_wait, f"L admitted after {bounded.waits[1]} steps, expected {max_wait}"
    assert bounded.max_wait <= max_wait, f"a request waited {bounded.max_wait} steps with max_wait={max_wait}"
    unbounded = replay_admission(records, "lpm", pool_blocks=1000, token_budget=80, max_wait=10**6, **FLAT)
    assert unbounded.waits[1] == 11, "without the bound L waits for the whole flood (10 steps after its first)"


def test_a_seeded_replay_repeats_itself():
    a = replay_admission(conversation_trace(7), "lpm", pool_blocks=128)
    assert a == replay_admission(conversation_trace(7), "lpm", pool_blocks=128)
    assert a != replay_admission(conversation_trace(8), "lpm", pool_blocks=128)


@pytest.mark.parametrize("kwargs, message", [
    ({"policy": "lru"}, "policy must be one of"),
    ({"pool_blocks": 0}, "pool_blocks must be a positive integer"),
    ({"token_budget": 32}, "never fits a token_budget of 32"),
    ({"block_size": 8}, "need 8 hash ids, it has 4"),
    ({"max_wait": -1}, "max_wait must be an int >= 0"),
    ({"fixed_ms": 0.0}, "fixed_ms > 0"),
    ({"pool_blocks": 4}, "holds 5 blocks, more than the pool's 4"),
    ({"records": []}, "no records"),
    ({"records": [TraceRecord(5, 16, 1, (1,)), TraceRecord(0, 16, 1, (2,))]}, "must not decrease"),
])
def test_bad_arguments_are_refused_before_anything_runs(kwargs, message):
    args = {"records": [TraceRecord(0, 64, 8, (1, 2, 3, 4))], "policy": "fcfs", "pool_blocks": 64, **kwargs}
    with pytest.raises(ValueError, match=message):
        replay_admission(args.pop("records"), args.pop("policy"), args.pop("pool_blocks"), **args)
