"""The engine on lab 13's radix tree (`EngineConfig(prefix_cache="radix")`, `minigpt.cache.radix_manager`): greedy
tokens and their log-probabilities equal lab 02's hash cache and no prefix cache on drawn multi-turn workloads (a pool small enough to evict and
preempt, chunked prefill, overlap scheduling); it finds at least the hash cache's hits on a conversation trace; no
block leaks (at the end every block is free or held by the tree alone); the manager's own contracts (matched blocks
never evicted for the rest of their request, admission counting only what eviction can free, uncomputed blocks
dropped on preemption, salts apart, copy-on-write, evictions told to on_evict, references that add up under drawn
operations); a bad config refused."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recorded_logprobs import assert_same_outputs

from minigpt.cache.block_pool import OutOfBlocks
from minigpt.cache.block_table import blocks_needed
from minigpt.cache.radix_manager import SALT_STRIDE, RadixBlockManager
from minigpt.config import ModelConfig
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.serving.engine import EngineConfig, LLMEngine
from minigpt.serving.trace import conversation_trace, trace_prompts
from minigpt.timing import fixed_threads

CONFIG = ModelConfig(vocab_size=64, max_seq_len=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)
CACHES = {"off": {"enable_prefix_caching": False}, "hash": {}, "radix": {"prefix_cache": "radix"}}


@pytest.fixture(scope="module")
def model() -> GPT:
    with torch.random.fork_rng():                 # GPT's init draws from the global RNG: restored after
        torch.manual_seed(0)
        return GPT(CONFIG).eval()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    with fixed_threads(1):
        yield


Workload = list[tuple[int, list[int], int]]        # (arrival step, prompt, max_tokens)


Outputs = list[list[tuple[int, float]]]           # per request: (token, its log-probability) per step


def serve(model: GPT, config: EngineConfig, workload: Workload) -> tuple[Outputs, LLMEngine]:
    """Each request added at the first step >= its arrival step, greedy; every request's tokens with their
    log-probabilities, and the engine."""
    engine = LLMEngine(model, config)
    tokens: dict[int, list[tuple[int, float]]] = {i: [] for i in range(len(workload))}
    queue = sorted(range(len(workload)), key=lambda i: workload[i][0])
    step = 0
    while queue or engine.has_unfinished():
        while queue and workload[queue[0]][0] <= step:
            i = queue.pop(0)
            engine.add_request(i, workload[i][1], max_tokens=workload[i][2], sampling=SamplingParams(logprobs=0))
        for out in engine.step():
            tokens[out.request_id] += [(t, lp.logprob) for t, lp in zip(out.new_token_ids, out.logprobs, strict=True)]
        step += 1
    engine.close()
    return [tokens[i] for i in range(len(workload))], engine


def assert_no_block_leaked(engine: LLMEngine) -> None:
    """Nothing runs: every block is in the free queue or cached, and a cached block is held by the cache alone."""
    manager = engine.cache.manager
    pool = manager.pool
    assert not manager.tables, f"sequences still hold blocks: {list(manager.tables)}"
    cached = [b for node in manager.tree.nodes() for b in node.blocks] if isinstance(manager, RadixBlockManager) else []
    assert len(set(cached)) == len(cached), f"a block sits twice in the tree: {sorted(cached)}"
    held = {b: pool.ref_counts[b] for b in cached if pool.ref_counts[b] != 1}
    assert not held, f"cached blocks should be held by the tree alone (ref_count 1), got {held}"
    lost = [b for b in range(pool.num_blocks) if not pool.is_free(b) and b not in set(cached)]
    assert not lost, f"blocks neither free nor cached: {lost}"
    assert engine.stats().num_blocks_used == 0, "cached blocks nobody uses should count as free"


@st.composite
def conversations(draw: st.DrawFn) -> tuple[int, int, int, Workload]:
    """(block_size, num_blocks, token budget, workload): sessions of turns under shared system prompts, each turn's
    prompt the last one plus an 'answer' and a question, turns arriving a few steps apart; the pool between the
    largest request's blocks and eight more (eviction, preemption), budgets from 4 tokens (chunked prefill)."""
    block_size = draw(st.sampled_from([2, 4, 8]))
    tokens = st.integers(0, CONFIG.vocab_size - 1)
    systems = [draw(st.lists(tokens, min_size=1, max_size=20)) for _ in range(draw(st.integers(1, 2)))]
    workload: Workload = []
    for _ in range(draw(st.integers(1, 4))):
        prompt, t = list(draw(st.sampled_from(systems))), draw(st.integers(0, 6))
        for _ in range(draw(st.integers(1, 3))):
            prompt = prompt + draw(st.lists(tokens, min_size=1, max_size=10))
            workload.append((t, prompt, draw(st.integers(1, 10))))
            prompt = prompt + draw(st.lists(tokens, max_size=8))
            t += draw(st.integers(0, 8))
    most = max(blocks_needed(len(p) + n - 1, block_size) for _, p, n in workload)
    return block_size, draw(st.integers(most, most + 8)), draw(st.integers(4, 32)), workload


@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=conversations(), overlap=st.booleans())
def test_greedy_tokens_are_the_same_with_hash_radix_or_no_prefix_cache(model, case, overlap):
    block_size, num_blocks, budget, workload = case
    found = {}
    for name, how in CACHES.items():
        config = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=4,
                              max_num_batched_tokens=budget, async_scheduling=overlap, **how)
        found[name], engine = serve(model, config, workload)
        assert_no_block_leaked(engine)
    assert_same_outputs(found["hash"], found["off"], "the hash cache")
    assert_same_outputs(found["radix"], found["off"], "the radix cache")


def test_a_small_pool_makes_the_radix_engine_evict_and_preempt_and_tokens_stay_the_same(model):
    """The drawn cases above include such pools; this one is fixed, so that it surely evicts and preempts."""
    g = torch.Generator().manual_seed(3)
    system = torch.randint(0, 64, (24,), generator=g).tolist()
    workload = [(2 * i, system + torch.randint(0, 64, (int(n),), generator=g).tolist(), 12)
                for i, n in enumerate(torch.randint(1, 20, (10,), generator=g))]
    found = {}
    for name, how in CACHES.items():
        config = EngineConfig(num_blocks=24, block_size=4, max_num_seqs=4, max_num_batched_tokens=16, **how)
        found[name], engine = serve(model, config, workload)
        assert_no_block_leaked(engine)
        if name == "radix":
            s = engine.stats()
            assert engine.cache.manager.pool.evicted > 0 and s.num_preemptions > 0 and s.prefix_cache_hit_tokens > 0, \
                f"expected evictions, preemptions and hits, got {engine.cache.manager.pool.evicted}, " \
                f"{s.num_preemptions}, {s.prefix_cache_hit_tokens}"
    assert_same_outputs(found["radix"], found["off"], "the radix cache")
    assert_same_outputs(found["hash"], found["off"], "the hash cache")


def test_the_radix_cache_hits_at_least_what_the_hash_cache_hits_on_a_conversation_trace(model):
    """A roomy pool (nothing evicted): both caches reuse every prefix computed before; the tree never less."""
    records = conversation_trace(1, sessions=8, turns=(2, 3), block_size=4, answer_tokens=(4, 12))
    corpus = torch.randint(0, 64, (5000,), generator=torch.Generator().manual_seed(1)).tolist()
    prompts = trace_prompts(records, 4, corpus)
    workload = [(r.timestamp // 100, p, max(1, min(r.output_length, 8))) for r, p in zip(records, prompts)]
    hits, tokens = {}, {}
    for name in ("hash", "radix"):
        config = EngineConfig(num_blocks=512, block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
                              **CACHES[name])
        tokens[name], engine = serve(model, config, workload)
        hits[name] = engine.stats().prefix_cache_hit_tokens
        assert_no_block_leaked(engine)
    assert hits["hash"] > 0 and hits["radix"] >= hits["hash"], f"hit tokens: {hits}"
    assert_same_outputs(tokens["radix"], tokens["hash"], "the radix cache")


@pytest.mark.parametrize("kwargs, words", [({"prefix_cache": "lru"}, "'hash'.*'radix'"),
                                           ({"prefix_cache": "radix", "enable_prefix_caching": False},
                                            "enable_prefix_caching=True")])
def test_a_bad_prefix_cache_config_is_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(**kwargs)


# --- the manager alone ---------------------------------------------------------------------------------------------

def test_a_matched_prefix_is_never_evicted_to_make_room_for_the_rest_of_its_request():
    m = RadixBlockManager(5, 2)
    m.add_sequence("a", [1, 2, 3, 4, 5, 6, 7])        # [1, 2] [3, 4] [5, 6] join the tree (one edge), [7] does not
    m.free("a")
    assert m.pool.num_free == 5 and m.pool.evictable() == 3
    r = m.add_sequence("b", [1, 2, 3, 4, 9, 9, 9, 9, 9])    # 2 cached + 3 new: 2 free, so one evicted
    assert r.num_cached == 4, f"expected the 4 cached tokens reused, got {r.num_cached}"
    assert m.pool.evicted == 1 and m.tree.match([1, 2, 3, 4, 5, 6]) == m.table("b").blocks[:2], \
        "the tree should have evicted [5, 6] and kept the two blocks b reuses"


def test_admission_counts_what_eviction_can_free_and_refuses_with_nothing_changed():
    m = RadixBlockManager(5, 2)
    m.add_sequence("a", [1, 2, 3, 4])
    m.add_sequence("b", [5, 6, 7])
    m.free("a")                                       # [1, 2] [3, 4] only the tree's; one block free

    def state():
        return list(m.pool.ref_counts), m.pool.free_blocks(), sorted(b for n in m.tree.nodes() for b in n.blocks)

    before = state()
    with pytest.raises(OutOfBlocks):                  # 1 cached + 3 new; [1, 2] is its own once matched: 2 to be had
        m.add_sequence("c", [1, 2, 8, 8, 8, 8, 8])
    assert state() == before, f"a refused admission changed the pool or the tree: {before} -> {state()}"
    r = m.add_sequence("c", [1, 2, 8, 8, 8])           # 1 cached + 2 new: the free block, and [3, 4] evicted
    assert r.num_cached == 2 and m.pool.evicted == 1 and m.pool.num_free == 0


def test_preemption_before_the_step_drops_the_blocks_it_never_computed():
    m = RadixBlockManager(8, 2)
    m.add_sequence("a", [1, 2, 3, 4, 5, 6])
    m.forget_uncomputed("a", 2)                       # only [1, 2] was computed
    assert m.tree.match([1, 2, 3, 4, 5, 6]) == m.table("a").blocks[:1], "uncomputed blocks stayed cached"
    m.free("a")
    assert m.pool.num_free == 8 and m.pool.evictable() == 1


def test_salts_keep_their_blocks_apart():
    m = RadixBlockManager(8, 2)
    m.add_sequence("base", [1, 2, 3, 4, 5])
    assert m.add_sequence("lora", [1, 2, 3, 4, 5], salt=("lora", 0)).num_cached == 0
    assert m.add_sequence("lora again", [1, 2, 3, 4, 5], salt=("lora", 0)).num_cached == 4
    assert m.add_sequence("base again", [1, 2, 3, 4, 5]).num_cached == 4


def test_a_cut_back_cached_block_and_a_forked_partial_block_are_copied_before_they_are_written():
    m = RadixBlockManager(8, 2)
    m.add_sequence("a", [1, 2, 3, 4, 5])
    cached = m.table("a").blocks[1]                   # [3, 4], in the tree
    m.truncate("a", 3)                                # speculative rollback into it
    r = m.append_tokens("a", [9])
    assert r.copies and r.copies[0][0] == cached, f"expected a copy of block {cached} first, got {r.copies}"
    assert m.tree.match([1, 2, 3, 4]) == [m.table("a").blocks[0], cached], "the tree's [3, 4] was overwritten"
    m.append_tokens("a", [6])
    m.fork("a", "b")
    partial = m.table("a").blocks[-1]
    assert m.append_tokens("b", [7]).copies == [(partial, m.table("b").blocks[-1])]
    m.free("a")
    m.free("b")
    assert m.pool.num_free == 8 and m.pool.evictable() == 4       # [1, 2] [3, 4] [3, 9] and b's [6, 7]


def test_eviction_tells_on_evict_each_block_with_its_salted_prefix():
    told = []
    m = RadixBlockManager(3, 2, on_evict=lambda key, block: told.append((key, block)))
    m.add_sequence("a", [1, 2, 3], salt="x")          # [1, 2] joins the tree under the first salt seen (k = 1)
    cached = m.table("a").blocks[0]
    m.free("a")
    m.add_sequence("b", [5, 6, 7, 8, 9])              # 3 blocks: the 2 free ones and [1, 2] evicted
    assert told == [((1 + SALT_STRIDE, 2 + SALT_STRIDE), cached)], told


def test_a_cached_block_with_a_held_block_below_it_is_not_evictable():
    """b computed [0, 1] in a block of its own (a's was cached first) and cached [2, 2] below a's: a's block, which
    only the tree holds now, cannot go while b holds the block below it."""
    m = RadixBlockManager(8, 2)
    m.add_sequence("a", [0])
    m.add_sequence("b", [0])
    m.append_tokens("a", [1])                         # a's [0, 1] is cached
    m.append_tokens("b", [1, 2, 2])                   # b's own [0, 1] is not; its [2, 2] hangs below a's
    m.free("a")
    assert m.pool.evictable() == 0 and m.pool.num_free == 5     # 3 used: a's [0, 1], b's [0, 1] and [2, 2]
    m.free("b")
    assert m.pool.evictable() == 2 and m.pool.num_free == 8


def evictable_by_peeling(m: RadixBlockManager) -> int:
    """What evicting everything frees, found another way: peel blocks only the tree holds off the ends of leaves
    until nothing changes."""
    nodes = m.tree.nodes()
    blocks = {n: list(n.blocks) for n in nodes}
    alive, freed, changed = set(nodes), 0, True
    while changed:
        changed = False
        for n in [n for n in nodes if n in alive and not any(c in alive for c in n.children.values())]:
            while blocks[n] and m.pool.ref_counts[blocks[n][-1]] == 1:
                blocks[n].pop()
                freed, changed = freed + 1, True
            if not blocks[n]:
                alive.discard(n)
                changed = True
    return freed


def snapshot(m: RadixBlockManager) -> tuple:
    tree = sorted((m.tree.prefix_of(n), tuple(n.blocks)) for n in m.tree.nodes())
    return (list(m.pool.ref_counts), m.pool.free_blocks(), tree,
            {s: (list(t.blocks), list(t.token_ids), list(m.hashes[s])) for s, t in m.tables.items()})


def assert_consistent(m: RadixBlockManager) -> None:
    """References: a block's ref_count is its holders (tables, and the tree once); free iff nobody holds it; the
    tree's edges whole blocks, no block twice; num_free the free queue plus what evicting everything frees."""
    pool, bs = m.pool, m.block_size
    cached = [b for n in m.tree.nodes() for b in n.blocks]
    assert len(set(cached)) == len(cached), f"a block twice in the tree: {sorted(cached)}"
    holders = Counter(b for t in m.tables.values() for b in t.blocks) + Counter(cached)
    assert pool.ref_counts == [holders[b] for b in range(pool.num_blocks)], (pool.ref_counts, holders)
    assert all(pool.is_free(b) == (holders[b] == 0) for b in range(pool.num_blocks))
    assert all(n.blocks and len(n.tokens) == len(n.blocks) * bs for n in m.tree.nodes())
    assert pool.evictable() == evictable_by_peeling(m)
    assert pool.num_free == len(pool.free_blocks()) + pool.evictable()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_drawn_operations_keep_references_and_the_tree_consistent(data):
    """Adds (salted or not), appends, forks, frees, rollbacks and preemptions drawn over three token values (prefixes
    shared often) on a 10-block pool: after each, the references add up; a refused one changed nothing."""
    m = RadixBlockManager(10, 2)
    tokens = st.lists(st.integers(0, 2), min_size=1, max_size=8)
    for n in range(data.draw(st.integers(1, 30))):
        seqs = sorted(m.tables)
        op = data.draw(st.sampled_from(["add", "add"] + (["append", "fork", "free", "truncate", "preempt"]
                                                          if seqs else [])))
        before = snapshot(m)
        try:
            if op == "add":
                m.add_sequence(n, data.draw(tokens), salt=data.draw(st.sampled_from([None, "x"])))
            elif op == "append":
                m.append_tokens(data.draw(st.sampled_from(seqs)), data.draw(tokens)[:3])
            elif op == "fork":
                m.fork(data.draw(st.sampled_from(seqs)), n)
            elif op == "free":
                m.free(data.draw(st.sampled_from(seqs)))
            else:
                seq = data.draw(st.sampled_from(seqs))
                cut = data.draw(st.integers(1, m.num_tokens(seq)))
                if op == "truncate":
                    m.truncate(seq, cut)
                else:
                    m.forget_uncomputed(seq, cut)
                    m.free(seq)
        except OutOfBlocks:
            assert snapshot(m) == before, f"a refused {op} changed the manager"
        assert_consistent(m)
