"""`TraceReplay`, the replay a request at a time: its steps add up to `replay_trace`'s result, and a request's
matched prefix is its own, never evicted to make room for the rest of that request."""

from __future__ import annotations

import pytest

from minigpt.cache.trace_replay import ReplayResult, TraceReplay, replay_trace
from minigpt.serving.trace import TraceRecord, conversation_trace


@pytest.mark.parametrize("cache", ["hash", "radix"])
@pytest.mark.parametrize(("pool_blocks", "host_blocks"), [(16, 0), (32, 64), (4096, 0)])
def test_the_steps_add_up_to_replay_traces_result(cache, pool_blocks, host_blocks):
    records = conversation_trace(2, sessions=16)
    replay = TraceReplay(cache, pool_blocks, host_blocks=host_blocks)
    outcomes = [replay.step(r) for r in records]
    summed = ReplayResult(cache, sum(len(r.hash_ids) for r in records), sum(o.gpu_hits for o in outcomes),
                          sum(o.host_hits for o in outcomes), sum(o.computed for o in outcomes),
                          sum(o.refused for o in outcomes))
    assert replay.result == summed == replay_trace(records, cache, pool_blocks, host_blocks=host_blocks)
    assert all(o.gpu_hits + o.host_hits + o.computed == (0 if o.refused else len(o.record.hash_ids))
               for o in outcomes)


@pytest.mark.parametrize("cache", ["hash", "radix"])
def test_a_request_whose_prefix_would_have_to_be_evicted_is_refused(cache):
    """The third request matches (1, 2) but needs two more blocks; one block is held by the first: 3 usable < 4.
    Evicting its own matched blocks (or counting them free while they wait in the queue) is not a way to fit it."""
    records = [TraceRecord(0, 1, 1000, (7,)), TraceRecord(10, 2, 1, (1, 2)), TraceRecord(100, 4, 1, (1, 2, 8, 9))]
    result = replay_trace(records, cache, pool_blocks=4)
    assert (result.gpu_hits, result.host_hits, result.computed, result.refused) == (0, 0, 3, 1), result


def test_a_refused_request_leaves_its_matched_blocks_to_the_tree():
    records = [TraceRecord(0, 1, 1000, (7,)), TraceRecord(10, 2, 1, (1, 2)), TraceRecord(100, 4, 1, (1, 2, 8, 9))]
    replay = TraceReplay("radix", 4)
    *_, last = [replay.step(r) for r in records]
    assert last.refused and (last.gpu_hits, last.computed) == (0, 0)
    held = {tokens: [replay.pool.ref_counts[b] for b in blocks] for tokens, blocks in
            ((n.tokens, n.blocks) for n in replay.tree.nodes())}
    assert held == {(7,): [2], (1, 2): [1, 1]}, \
        f"(1, 2): the tree's reference only; (7,): the tree's and its request's; got {held}"
    assert replay.pool.num_free == 1
