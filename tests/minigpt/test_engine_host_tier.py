"""The engine's host tier (`EngineConfig(prefix_cache="radix", host_tier_blocks=N)`, `minigpt.cache.host_tier`):
blocks the radix tree evicts are saved to host memory and loaded back for a later prompt. Greedy tokens and their
log-probabilities equal the
engine without a prefix cache on drawn multi-turn workloads (pools small enough to evict and preempt, chunked
prefill, overlap scheduling), so no restored block is read before it lands or holds another prefix's K/V; a fixed
workload surely restores; the manager's contracts (a restored run counted as cached, the copies queued in the order
decided, a restore's own keys never given up to make room for it, holes ending a run); a bad config refused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minigpt.cache.host_tier import HostTier
from minigpt.cache.paged import PagedKVCache
from minigpt.cache.radix_manager import RadixBlockManager
from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.tokenizer import EOT_ID
from tests.minigpt.recorded_logprobs import assert_same_outputs
from tests.minigpt.test_engine_radix import CACHES, assert_no_block_leaked, conversations, serve

from tests.minigpt.test_engine_radix import model, one_torch_thread  # noqa: F401  (fixtures)

HOST = {"prefix_cache": "radix", "host_tier_blocks": 64}


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=conversations(), overlap=st.booleans(), host_blocks=st.sampled_from([1, 3, 64]))
def test_greedy_tokens_are_the_same_with_a_host_tier(model, case, overlap, host_blocks):
    block_size, num_blocks, budget, workload = case
    found = {}
    for name, how in (("off", CACHES["off"]), ("host", {**HOST, "host_tier_blocks": host_blocks})):
        config = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=4,
                              max_num_batched_tokens=budget, async_scheduling=overlap, **how)
        found[name], engine = serve(model, config, workload)
        assert_no_block_leaked(engine)
    assert_same_outputs(found["host"], found["off"], "the host tier")


@pytest.mark.parametrize("overlap", [False, True])
def test_a_small_pool_restores_from_the_host_tier_and_tokens_stay_the_same(model, overlap):
    """Sessions of two turns whose second turn arrives after the pool has evicted the first turn's blocks: the
    radix tree alone recomputes them, the host tier loads them back."""
    g = torch.Generator().manual_seed(5)
    firsts = [torch.randint(0, 64, (22,), generator=g).tolist() for _ in range(4)]
    workload = [(3 * i, p, 4) for i, p in enumerate(firsts)]
    workload += [(12 + 3 * i, p + torch.randint(0, 64, (5,), generator=g).tolist(), 4) for i, p in enumerate(firsts)]
    found, engines = {}, {}
    for name, how in (("off", CACHES["off"]), ("radix", CACHES["radix"]), ("host", HOST)):
        config = EngineConfig(num_blocks=16, block_size=4, max_num_seqs=2, max_num_batched_tokens=32,
                              async_scheduling=overlap, **how)
        found[name], engines[name] = serve(model, config, workload)
        assert_no_block_leaked(engines[name])
    radix, host = engines["radix"].cache.manager, engines["host"].cache.manager
    assert host.pool.evicted > 0 and host.restored_tokens > 0, \
        f"expected evictions and restores, got {host.pool.evicted} evicted, {host.restored_tokens} tokens restored"
    assert host.cached_tokens > radix.cached_tokens, \
        f"the host tier should reuse more: {host.cached_tokens} cached tokens against the tree's {radix.cached_tokens}"
    assert_same_outputs(found["host"], found["off"], "the host tier")
    assert_same_outputs(found["radix"], found["off"], "the radix cache")


def test_a_restore_scheduled_ahead_survives_a_request_that_stops_when_the_step_before_lands():
    """Overlap scheduling: B's prompt is restored from the host tier while step N runs, in the step scheduled ahead
    with A's decode; A stops on its first token when N lands, so that step is made again without A, and the copies it
    was to run must go with the new one (or B's prefill reads blocks never loaded)."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=EOT_ID + 1, max_seq_len=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                            d_ff=64)).eval()
    p = list(range(100, 109))                         # 2 full blocks of 4, and one token
    greedy = SamplingParams(logprobs=0)
    found = {}
    for name, how in (("off", CACHES["off"]), ("host", HOST)):
        engine = LLMEngine(model, EngineConfig(num_blocks=8, block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
                                               async_scheduling=True, **how))
        outs: dict[str, list] = {}

        def step() -> None:
            for out in engine.step():
                outs.setdefault(out.request_id, []).extend(
                    (t, lp.logprob) for t, lp in zip(out.new_token_ids, out.logprobs, strict=True))
                if out.finished:
                    outs.setdefault(f"{out.request_id} finished", out.finish_reason)

        for rid, prompt in (("P", p), ("Q", list(range(200, 230)))):     # Q's 8 blocks evict P's to the host tier
            engine.add_request(rid, prompt, max_tokens=1, sampling=greedy)
            while engine.has_unfinished():
                step()
        engine.add_request("C", [1, 2, 3], max_tokens=8, sampling=greedy)
        step()
        engine.add_request("A", [7, EOT_ID], max_tokens=8, sampling=greedy)   # this model repeats its last token
        step()                                        # step N, with A's prefill, launched
        engine.add_request("B", p + [5, 6], max_tokens=4, sampling=greedy)
        while engine.has_unfinished():
            step()
        engine.close()
        assert outs["A finished"] == "stop" and not outs["A"], f"A should stop at once: {outs}"
        if name == "host":
            assert engine.cache.manager.restored_tokens == 8, engine.cache.manager.restored_tokens
        found[name] = [outs["B"], outs["C"]]
    assert_same_outputs(found["host"], found["off"], "the host tier (restore in a step made again)")


def test_a_bad_host_tier_config_is_refused():
    with pytest.raises(ValueError, match="prefix_cache='radix'"):
        EngineConfig(host_tier_blocks=8)
    with pytest.raises(ValueError, match="int >= 0"):
        EngineConfig(prefix_cache="radix", host_tier_blocks=-1)
    with pytest.raises(ValueError, match="not both"):
        RadixBlockManager(4, 2, on_evict=print, host=HostTier(2, n_layers=1, block_size=2, n_kv_heads=1, head_dim=1))


def test_the_server_refuses_a_host_tier_without_the_radix_tree(capsys):
    from minigpt.serving.__main__ import main

    assert main(["--host-tier-blocks", "8"]) == 2
    assert "prefix_cache='radix'" in capsys.readouterr().err


# --- the cache and the manager alone -------------------------------------------------------------------------------

def small_cache(num_blocks: int, host_blocks: int) -> PagedKVCache:
    return PagedKVCache(1, num_blocks, 2, 1, 1, enable_prefix_caching=True, prefix_cache="radix",
                        host_tier_blocks=host_blocks)


def fill(cache: PagedKVCache, seq_id: str, tokens: list[int]) -> None:
    """Reserve `tokens` for seq_id and write each token's value as its K and V (what a step would compute)."""
    batch = cache.prepare([(seq_id, tokens)])
    slots = batch.slots[batch.slots >= 0]
    values = batch.tokens[batch.slots >= 0].float()
    cache.k_pools[0].view(-1)[slots] = values
    cache.v_pools[0].view(-1)[slots] = -values


def test_an_evicted_prefix_comes_back_with_its_own_keys_and_values():
    cache = small_cache(3, 4)
    m = cache.manager
    fill(cache, "a", [1, 2, 3, 4, 5])                 # [1, 2] [3, 4] cached, [5] not
    m.free("a")
    fill(cache, "b", [7, 8, 9, 9, 9])                 # 3 blocks: [1, 2] [3, 4] evicted to the host tier
    assert m.pool.evicted == 2 and len(cache.host) == 2
    m.free("b")
    assert m.cached_prefix_len([1, 2, 3, 4, 6]) == 4, "the host tier's run should count as cached"
    batch = cache.prepare([("c", [1, 2, 3, 4, 6])])
    assert batch.num_cached == [4] and m.restored_tokens == 4
    blocks = m.table("c").blocks[:2]
    kv = cache.k_pools[0][blocks].flatten().tolist(), cache.v_pools[0][blocks].flatten().tolist()
    assert kv == ([1, 2, 3, 4], [-1, -2, -3, -4]), f"restored K/V {kv}: another block's content, or not loaded"
    assert m.tree.match([1, 2, 3, 4]) == blocks, "restored blocks should join the tree"


def test_copies_are_queued_until_the_step_takes_them_and_run_in_the_order_decided():
    host = HostTier(1, n_layers=1, block_size=2, n_kv_heads=1, head_dim=1)
    k, v = [torch.tensor([[[[1.]], [[2.]]], [[[3.]], [[4.]]]])], [torch.zeros(2, 2, 1, 1)]
    host.save((1, 2), 0)                               # block 0 -> slot 0
    host.restore([(1, 2)], [1])                        # slot 0 -> block 1
    host.save((3, 4), 1)                               # slot 0 given up: block 1 -> slot 0, after the load
    assert k[0][1].flatten().tolist() == [3., 4.], "a copy ran before a step took it"
    ops = host.take_ops()
    assert ops == [("save", 0, 0), ("load", 0, 1), ("save", 1, 0)] and host.take_ops() == []
    host.run(ops, k, v)
    assert k[0][1].flatten().tolist() == [1., 2.] and host.k[0].flatten().tolist() == [1., 2.]
    assert host.holds((3, 4)) and not host.holds((1, 2))


def test_a_restore_never_gives_up_its_own_keys_to_make_room():
    """A one-block host tier holding the key a prompt restores, and no free block: the eviction that makes room for
    the restored block would save over that key; that save is dropped instead. A later eviction may take the slot:
    its save is queued after the load, which reads the slot first."""
    cache = small_cache(2, 1)
    m = cache.manager
    fill(cache, "a", [1, 2, 3])
    m.free("a")
    fill(cache, "b", [5, 6, 7, 8])                    # [1, 2] evicted to the host tier; [5, 6] [7, 8] cached
    m.free("b")
    batch = cache.prepare([("c", [1, 2, 9])])          # restoring [1, 2] evicts [7, 8] (dropped), then [9] [5, 6]
    stats = cache.host.stats
    assert batch.num_cached == [2] and stats["dropped"] == 1 and stats["replaced"] == 1, (batch.num_cached, stats)
    assert cache.k_pools[0][m.table("c").blocks[0]].flatten().tolist() == [1., 2.]


def test_a_hole_ends_the_run_and_a_policy_can_refuse_to_load():
    host = HostTier(4, n_layers=1, block_size=2, n_kv_heads=1, head_dim=1)
    for key in [(1, 2), (1, 2, 3, 4, 5, 6)]:
        host.save(key, 0)
    assert host.run_from([(1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6)]) == [(1, 2)]
    host.worth_loading = lambda tokens: tokens >= 4
    assert host.run_from([(1, 2), (1, 2, 3, 4)]) == []
