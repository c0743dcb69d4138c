"""The paged KV cache (minigpt.cache.block_pool / block_table / prefix_cache / block_manager / paged_attention /
paged, minigpt.engine.paged_generation): the allocator state machine with many examples, bad input, and
generation identical to lab 01's contiguous cache (tokens and their log-probabilities: this random model mostly
repeats its last token, so K/V read from the wrong block would leave the tokens as they were)."""

from __future__ import annotations

import pytest
import torch
from recorded_logprobs import assert_same_steps, record_sampling

from autograder.lab02 import run_state_machine
from minigpt.attention import naive_attention
from minigpt.cache.block_manager import BlockManager
from minigpt.cache.block_pool import BlockPool, OutOfBlocks
from minigpt.cache.block_table import BlockTable, slot_of
from minigpt.cache.paged import PagedKVCache
from minigpt.cache.paged_attention import gather_kv, paged_attention, paged_decode_attention
from minigpt.cache.prefix_cache import block_hashes, hash_block
from minigpt.config import ModelConfig
from minigpt.engine import cached_generation, paged_generation
from minigpt.engine.cached_generation import generate_kv_cache
from minigpt.engine.paged_generation import generate_paged, generate_paged_batch, paged_forward
from minigpt.model import GPT
from minigpt.sampling import SamplingParams
from minigpt.timing import fixed_threads

STATE_MACHINE_EXAMPLES = 300        # `make test`; the graded check runs autograder.lab02.GRADED_EXAMPLES

CFG = ModelConfig(vocab_size=256, max_seq_len=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)


@pytest.fixture(autouse=True)
def one_thread():
    with fixed_threads(1):
        yield


def manager(n, bs, prefix):
    return BlockManager(n, bs, enable_prefix_caching=prefix)


def test_state_machine_many_examples():
    assert run_state_machine(manager, max_examples=STATE_MACHINE_EXAMPLES, seed=1) >= STATE_MACHINE_EXAMPLES


def test_slot_mapping_formula():
    t = BlockTable(4, [7, 2, 5])
    assert [t.slot(p) for p in range(12)] == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21, 22, 23]
    with pytest.raises(ValueError, match="outside the block table"):
        slot_of([7, 2, 5], 12, 4)


@pytest.mark.parametrize("bad", [0, -1, 2.0, "16", True, None])
def test_block_size_must_be_positive_int(bad):
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        BlockPool(8, bad)


def test_out_of_blocks_leaves_everything_unchanged():
    m = BlockManager(3, 2, enable_prefix_caching=True)
    m.add_sequence("a", [1, 2, 3])
    m.fork("a", "b")
    before = (list(m.pool.ref_counts), m.pool.free_blocks(), {s: list(t.blocks) for s, t in m.tables.items()})
    with pytest.raises(OutOfBlocks, match="need 3 free block"):
        m.append_tokens("b", [4, 5, 6, 7])           # copy-on-write copy + 2 new blocks, only 1 free
    with pytest.raises(OutOfBlocks):
        m.add_sequence("c", [9] * 5)
    assert (list(m.pool.ref_counts), m.pool.free_blocks(), {s: list(t.blocks) for s, t in m.tables.items()}) == before
    assert "c" not in m.tables


def test_unknown_or_double_free_is_a_clear_error():
    m = BlockManager(4, 2)
    with pytest.raises(ValueError, match="unknown sequence 'x'"):
        m.free("x")
    m.add_sequence("a", [1, 2])
    m.free("a")
    with pytest.raises(ValueError, match="already freed"):
        m.free("a")
    pool = BlockPool(2, 2)
    (b,) = pool.allocate(1)
    pool.free(b)
    with pytest.raises(ValueError, match="double free"):
        pool.free(b)


def test_copy_on_write_copies_only_a_shared_partial_block():
    m = BlockManager(8, 4)
    m.add_sequence("a", [1, 2, 3, 4, 5, 6])
    m.fork("a", "b")
    assert m.table("b").blocks == m.table("a").blocks and m.pool.ref_counts[m.table("a").blocks[0]] == 2
    r = m.append_tokens("b", [9])
    old = m.table("a").blocks[1]
    assert r.copies == [(old, m.table("b").blocks[1])] and m.table("b").blocks[0] == m.table("a").blocks[0]
    assert r.slots == [m.table("b").blocks[1] * 4 + 2]
    assert m.append_tokens("a", [7]).copies == []     # a holds its block alone now: written in place


def test_block_allocated_only_at_a_boundary():
    m = BlockManager(8, 4)
    m.add_sequence("a", [1, 2, 3])
    assert len(m.table("a").blocks) == 1
    m.append_tokens("a", [4])
    assert len(m.table("a").blocks) == 1
    m.append_tokens("a", [5])
    assert len(m.table("a").blocks) == 2


def test_prefix_cache_hash_is_chained():
    assert block_hashes([1, 2, 3, 4, 5], 2) == [hash_block(None, [1, 2]), hash_block(hash_block(None, [1, 2]), [3, 4])]
    assert hash_block(None, [3, 4]) != hash_block(hash_block(None, [1, 2]), [3, 4])


def test_truncate_frees_surplus_blocks_and_forgets_a_partial_hash():
    m = BlockManager(6, 2, enable_prefix_caching=True)
    m.add_sequence("a", [1, 2, 3, 4, 5])
    used = m.pool.num_used
    m.truncate("a", 3)                                 # keeps blocks [1,2] [3,_]: one block freed
    assert m.pool.num_used == used - 1 and m.num_tokens("a") == 3
    assert not m.prefix_cache.is_cached(m.table("a").blocks[1])     # [3, 4] is no longer in that block
    r = m.append_tokens("a", [8])
    assert r.copies == [] and m.table("a").token_ids == [1, 2, 3, 8]
    m.add_sequence("b", [1, 2, 3, 4, 0])
    assert m.tables["b"].blocks[0] == m.table("a").blocks[0] and m.cached_tokens == 2
    with pytest.raises(ValueError, match="cannot truncate"):
        m.truncate("a", 9)


def test_paged_decode_matches_general_paged_attention_and_dense():
    g = torch.Generator().manual_seed(0)
    k_pool, v_pool = torch.randn(10, 4, 2, 8, generator=g), torch.randn(10, 4, 2, 8, generator=g)
    tables = torch.tensor([[3, 7, 1], [9, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([10, 2], dtype=torch.int32)
    q = torch.randn(2, 4, 8, generator=g)
    dec = paged_decode_attention(q, k_pool, v_pool, tables, lens)
    gen = paged_attention(q[:, :, None], k_pool, v_pool, tables, lens, torch.ones(2, dtype=torch.int32))[:, :, 0]
    torch.testing.assert_close(dec, gen)
    k, v = gather_kv(k_pool, tables), gather_kv(v_pool, tables)
    for b in range(2):
        want = naive_attention(q[b][None, :, None], k[b:b + 1, :, :lens[b]], v[b:b + 1, :, :lens[b]])[0, :, 0]
        torch.testing.assert_close(dec[b], want)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(CFG).eval()


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 255, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_generation_identical_to_contiguous_cache(model, block_size, monkeypatch):
    prompts = _prompts([1, 5, 16, 23])
    for sampling in (SamplingParams(), SamplingParams(temperature=1.0, top_k=50, seed=3)):
        sampled = record_sampling(monkeypatch, cached_generation, paged_generation)
        want = [generate_kv_cache(model, p, 10, sampling, stop_token_ids=()) for p in prompts]
        assert generate_paged(model, prompts[2], 10, sampling, stop_token_ids=(), block_size=block_size).tokens == want[2].tokens
        got = generate_paged_batch(model, prompts, 10, sampling, stop_token_ids=(), block_size=block_size)
        assert [g.tokens for g in got] == [w.tokens for w in want]
        assert [g.finish_reason for g in got] == [w.finish_reason for w in want]
        assert_same_steps(sampled[4:], [sampled[2]] + sampled[:4], "the paged cache")


def test_batch_with_early_stop_frees_blocks(model, monkeypatch):
    prompts = _prompts([4, 9])
    ref = generate_kv_cache(model, prompts[0], 10, stop_token_ids=())
    stop = ref.tokens[2]
    cache = PagedKVCache.for_model(model, num_blocks=16, block_size=4)
    sampled = record_sampling(monkeypatch, cached_generation, paged_generation)
    out = generate_paged_batch(model, prompts, 10, stop_token_ids=(stop,), cache=cache)
    assert out[0].tokens == generate_kv_cache(model, prompts[0], 10, stop_token_ids=(stop,)).tokens
    assert out[1].tokens == generate_kv_cache(model, prompts[1], 10, stop_token_ids=(stop,)).tokens
    assert_same_steps(sampled[:2], sampled[2:], "the paged cache")
    assert cache.manager.pool.num_free == 16 and not cache.manager.tables


def test_prefix_cache_hit_gives_the_same_logits(model):
    shared = _prompts([12], seed=4)[0]
    a, b = shared + [1, 2], shared + [3]
    with torch.inference_mode():
        cold = PagedKVCache.for_model(model, 32, 4)
        want = paged_forward(model, cold, cold.prepare([("b", b)]))
        warm = PagedKVCache.for_model(model, 32, 4, enable_prefix_caching=True)
        paged_forward(model, warm, warm.prepare([("a", a)]))
        warm.free("a")
        batch = warm.prepare([("b", b)])
        assert batch.num_cached == [12] and batch.tokens.shape == (1, 1)
        got = paged_forward(model, warm, batch)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_forked_siblings_continue_independently(model):
    """Parallel sampling: two siblings share the prompt blocks and diverge; each equals a cold run."""
    prompt = _prompts([6], seed=2)[0]
    with torch.inference_mode():
        cache = PagedKVCache.for_model(model, 16, 4)
        paged_forward(model, cache, cache.prepare([("p", prompt)]))
        cache.fork("p", "c")
        got = paged_forward(model, cache, cache.prepare([("p", [10]), ("c", [20])]))
        for row, tok in enumerate((10, 20)):
            cold = PagedKVCache.for_model(model, 16, 4)
            want = paged_forward(model, cold, cold.prepare([("x", prompt + [tok])]))
            torch.testing.assert_close(got[row], want[0], atol=1e-5, rtol=1e-4)


def test_write_past_table_and_empty_prompt_are_clear_errors(model):
    m = BlockManager(4, 2)
    with pytest.raises(ValueError, match="prompt is empty"):
        m.add_sequence("a", [])
    m.add_sequence("a", [1])
    with pytest.raises(ValueError, match="outside the block table"):
        m.table("a").slot(2)
    with pytest.raises(ValueError, match="already exists"):
        m.add_sequence("a", [1])
